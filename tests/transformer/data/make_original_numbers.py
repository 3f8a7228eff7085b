"""Writes original_numbers.npz: the original package's transformer numbers.

Run with the original mesh-tensorflow 0.1.21 (and TF 2.21) first on
PYTHONPATH, from the repository root:

  PYTHONPATH=<original>:. python tests/transformer/data/make_original_numbers.py

Output `<key>` of program `<name>` of tests/transformer/original_programs.py
is stored as `<name>/<key>`; a program the original cannot run is stored as
`<name>/error` (its message). Programs already in the file keep their
stored numbers: only the programs missing from it are run (delete the file
to recompute everything).
"""

import os
import traceback

import numpy as np
import tensorflow as tf

tf.compat.v1.disable_v2_behavior()

import mesh_tensorflow as mtf  # noqa: E402
import mesh_tensorflow.transformer as tfm  # noqa: E402
from tests import original_package  # noqa: E402
from tests.transformer import original_programs  # noqa: E402


def main():
  original_package.require_original()
  path = os.path.join(os.path.dirname(__file__), "original_numbers.npz")
  arrays = {}
  if os.path.exists(path):
    with np.load(path) as stored:
      arrays = dict(stored)
  done = {key.split("/")[0] for key in arrays}
  for name in sorted(set(original_programs.PROGRAMS) - done):
    try:
      results = original_programs.run_program(mtf, tfm, name)
    except Exception:  # pylint: disable=broad-except
      arrays[name + "/error"] = np.array(traceback.format_exc(limit=3))
      print("%s: the original fails" % name)
      continue
    for key, value in results.items():
      arrays["%s/%s" % (name, key)] = value
    print("%s: %d outputs" % (name, len(results)))
  np.savez_compressed(path, **arrays)
  print("wrote %d arrays to %s" % (len(arrays), path))


if __name__ == "__main__":
  main()
