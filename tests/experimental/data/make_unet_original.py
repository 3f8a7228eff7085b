"""Writes unet_original.npz: the original package's experimental U-Net numbers.

Run with the original mesh-tensorflow 0.1.21 (and TF 2.21) first on
PYTHONPATH, from the repository root:

  PYTHONPATH=<original>:. python tests/experimental/data/make_unet_original.py

The original's data_aug_lib (which its unet module imports) imports
tensorflow_probability and tensorflow.contrib for augmentations the
programs never run; where they are missing (TF 2 has no contrib), empty
modules stand in for them.

It runs every program of tests/experimental/unet_programs.py (tf.compat.v1
graphs and Sessions) and stores output `<key>` of program `<name>` as
`<name>/<key>`.
"""

import importlib
import os
import sys
import types

import mesh_tensorflow as mtf

sys.path.append(os.getcwd())
from tests import original_package  # noqa: E402
from tests.experimental import unet_programs  # noqa: E402


def _stand_in_for_augmentation_imports():
  for name in ("tensorflow_probability", "tensorflow.contrib.image"):
    try:
      importlib.import_module(name)
    except ImportError:
      parent = None
      for part in name.split("."):
        path = part if parent is None else parent.__name__ + "." + part
        module = sys.modules.get(path) or types.ModuleType(path)
        sys.modules[path] = module
        if parent is not None and not hasattr(parent, part):
          setattr(parent, part, module)
        parent = module


def main():
  original_package.require_original()
  _stand_in_for_augmentation_imports()
  original_package.record_outputs(
    os.path.join(os.path.dirname(__file__), "unet_original.npz"),
    sorted(unet_programs.PROGRAMS),
    lambda name: unet_programs.run_program(mtf, name),
  )


if __name__ == "__main__":
  main()
