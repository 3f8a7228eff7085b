"""Writes moe_gating_original.npz: the original package's gating outputs.

Run with the original mesh-tensorflow 0.1.21 (and TF 2.21) first on
PYTHONPATH, from the repository root:

  PYTHONPATH=<original>:. python tests/transformer/data/make_moe_gating_original.py

Each gating case of tests/transformer/moe_gating_cases.py is stored as
`<index>_dispatch`, `<index>_combine` and `<index>_loss`, each layer case
as `layer<index>_output` and `layer<index>_loss`.
"""

import os

import numpy as np
import tensorflow as tf

tf.compat.v1.disable_v2_behavior()

import mesh_tensorflow as mtf  # noqa: E402
import mesh_tensorflow.transformer  # noqa: E402
from mesh_tensorflow.transformer import heterogeneous_moe  # noqa: E402, F401
from mesh_tensorflow.transformer import moe  # noqa: E402
from tests import original_package  # noqa: E402
from tests.transformer import moe_gating_cases  # noqa: E402


def main():
  original_package.require_original()
  arrays = {}
  for index in range(len(moe_gating_cases.CASES)):
    dispatch, combine, loss = moe_gating_cases.run_case(mtf, moe, index)
    arrays["%d_dispatch" % index] = dispatch
    arrays["%d_combine" % index] = combine
    arrays["%d_loss" % index] = loss
  for index in range(len(moe_gating_cases.LAYER_CASES)):
    output, loss = moe_gating_cases.run_layer_case(
      mtf, mesh_tensorflow.transformer, index
    )
    arrays["layer%d_output" % index] = output
    arrays["layer%d_loss" % index] = loss
  path = os.path.join(os.path.dirname(__file__), "moe_gating_original.npz")
  np.savez_compressed(path, **arrays)
  print("wrote %d arrays to %s" % (len(arrays), path))


if __name__ == "__main__":
  main()
