"""mesh_tensorflow.experimental.model_executor: the U-Net's train/eval loop.

Run `python -m mesh_tensorflow.experimental.model_executor --help`.
"""
# pylint: disable=useless-import-alias

import mesh_tensorflow as mtf  # noqa: F401  (the original's module aliases)
from mesh_tensorflow._src.experimental.model_executor import (
  ExecutorOptions as ExecutorOptions,
)
from mesh_tensorflow._src.experimental.model_executor import (
  MeshContext as MeshContext,
)
from mesh_tensorflow._src.experimental.model_executor import (
  define_flags as define_flags,
)
from mesh_tensorflow._src.experimental.model_executor import main as main
from mesh_tensorflow._src.experimental.model_executor import run as run
from mesh_tensorflow._src.experimental.model_executor import (
  train_and_eval as train_and_eval,
)
from mesh_tensorflow.experimental import input_reader  # noqa: F401
from mesh_tensorflow.experimental import unet  # noqa: F401

__all__ = [
  "ExecutorOptions",
  "MeshContext",
  "define_flags",
  "main",
  "run",
  "train_and_eval",
]

if __name__ == "__main__":
  from absl import app  # pylint: disable=g-import-not-at-top

  define_flags()
  app.run(main)
