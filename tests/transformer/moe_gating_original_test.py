"""MoE gating and layers give the original 0.1.21's numbers.

Gating functions: the same dispatch, combine and loss; MoE1D and
HeterogeneousMoE1D: the same output and loss for the same weights.

The reference outputs were written by running the very same cases
(moe_gating_cases.py) against the original package
(data/make_moe_gating_original.py).
"""

import os

import numpy as np
import pytest

import mesh_tensorflow as mtf
from tests.transformer import moe_gating_cases
import transformer
from transformer import heterogeneous_moe  # noqa: F401 (a layer of the cases)
from transformer import moe

_REFERENCE = os.path.join(
  os.path.dirname(__file__), "data", "moe_gating_original.npz"
)


@pytest.fixture(scope="module")
def reference():
  with np.load(_REFERENCE) as arrays:
    return dict(arrays)


@pytest.mark.parametrize(
  "index",
  range(len(moe_gating_cases.CASES)),
  ids=[
    "%d-%s" % (i, gating)
    for i, (gating, _) in enumerate(moe_gating_cases.CASES)
  ],
)
def test_gating_matches_original(reference, index):
  dispatch, combine, loss = moe_gating_cases.run_case(mtf, moe, index)
  np.testing.assert_array_equal(dispatch, reference["%d_dispatch" % index])
  np.testing.assert_allclose(
    combine, reference["%d_combine" % index], rtol=1e-5, atol=1e-6
  )
  np.testing.assert_allclose(
    loss, reference["%d_loss" % index], rtol=1e-5, atol=1e-6
  )
  # Something is routed: the comparison is not between empty tensors.
  assert dispatch.sum() > 0


@pytest.mark.parametrize(
  "index",
  range(len(moe_gating_cases.LAYER_CASES)),
  ids=[
    "%d-%s-%s" % (i, case[1], case[2].get("moe_gating", "top_2"))
    for i, case in enumerate(moe_gating_cases.LAYER_CASES)
  ],
)
def test_layer_matches_original(reference, index):
  output, loss = moe_gating_cases.run_layer_case(mtf, transformer, index)
  np.testing.assert_allclose(
    output, reference["layer%d_output" % index], rtol=1e-5, atol=1e-5
  )
  np.testing.assert_allclose(
    loss, reference["layer%d_loss" % index], rtol=1e-5, atol=1e-6
  )
  assert np.abs(output).max() > 0


def test_reference_holds_every_case(reference):
  assert len(reference) == 3 * len(moe_gating_cases.CASES) + 2 * len(
    moe_gating_cases.LAYER_CASES
  )
