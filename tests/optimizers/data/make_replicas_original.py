"""Writes replicas_original.npz: the original's numbers for replicas_program.

Runs tests/optimizers/replicas_program.py's training step on each of its
meshes with the original mesh-tensorflow 0.1.21, every read of a variable
ordered before the variable's updates (without that the original's numbers
vary from run to run). Run with the original first on PYTHONPATH, from the
repository root:

  PYTHONPATH=<original>:. python tests/optimizers/data/make_replicas_original.py

Stored per mesh shape: `<mesh>/losses`, `<mesh>/<name>|<pnum>` (the slice of
variable or slot <name> on processor <pnum>) and `<mesh>/unordered` (how many
reads the original leaves unordered with an update of the same variable).
"""

import os

import numpy as np

import mesh_tensorflow as mtf
from tests import original_package
from tests.optimizers import replicas_program


def main():
  original_package.require_original()
  arrays = {}
  for mesh_shape, layout in replicas_program.MESH_LAYOUTS:
    run = replicas_program.train(mtf, mesh_shape, layout, order_reads=True)
    arrays[mesh_shape + "/losses"] = np.array(run.losses)
    arrays[mesh_shape + "/unordered"] = np.array(len(run.unordered))
    for name, slices in run.slices.items():
      for pnum, value in enumerate(slices):
        arrays["%s/%s|%d" % (mesh_shape, name, pnum)] = value
    print(
      "%s: %d reads unordered with an update" % (mesh_shape, len(run.unordered))
    )
  path = os.path.join(os.path.dirname(__file__), "replicas_original.npz")
  np.savez_compressed(path, **arrays)
  print("wrote %d arrays to %s" % (len(arrays), path))


if __name__ == "__main__":
  main()
