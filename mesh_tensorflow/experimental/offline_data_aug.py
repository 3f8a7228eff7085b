"""mesh_tensorflow.experimental.offline_data_aug: augmented CT TFRecords.

Run `python -m mesh_tensorflow.experimental.offline_data_aug --help`.
"""
# pylint: disable=useless-import-alias

from mesh_tensorflow._src.experimental.offline_data_aug import (
  Options as Options,
)
from mesh_tensorflow._src.experimental.offline_data_aug import (
  apply_data_aug as apply_data_aug,
)
from mesh_tensorflow._src.experimental.offline_data_aug import (
  augment as augment,
)
from mesh_tensorflow._src.experimental.offline_data_aug import (
  define_flags as define_flags,
)
from mesh_tensorflow._src.experimental.offline_data_aug import main as main
from mesh_tensorflow._src.experimental.offline_data_aug import (
  save_to_tfrecord as save_to_tfrecord,
)
from mesh_tensorflow.experimental import data_aug_lib  # noqa: F401  (alias)

__all__ = [
  "Options",
  "apply_data_aug",
  "augment",
  "define_flags",
  "main",
  "save_to_tfrecord",
]

if __name__ == "__main__":
  from absl import app  # pylint: disable=g-import-not-at-top

  define_flags()
  app.run(main)
