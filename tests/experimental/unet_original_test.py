"""The experimental U-Net gives the original 0.1.21's numbers.

unet_programs.py builds unet_with_spatial_partition (2-d and 3-d, float32
and bfloat16) on one device and on a 2x2 mesh with the original's default
layout, and trains it as the
original's model_executor does (Adafactor, batch-norm updates);
data/unet_original.npz holds what the original computed
(data/make_unet_original.py). The initial values drawn under a graph seed
(batch_norm's moving mean included: the original draws it from a standard
normal) must be equal; in float32 the outputs, eval metrics, losses and
every variable after three steps must be the original's to float32
rounding, in bfloat16 the outputs bit for bit but for the odd element.
"""

import os

import numpy as np
import pytest

import mesh_tensorflow as mtf
from tests import original_package
from tests.experimental import unet_programs


@pytest.fixture(scope="module")
def reference():
  path = os.path.join(os.path.dirname(__file__), "data", "unet_original.npz")
  return original_package.recorded_outputs(path)


# bfloat16: the share of an output's elements that must equal the
# original's, the largest difference of the others (bfloat16 units), and
# that of the variables after training relative to their scale (the
# gradients of the convolutions sum in another order: a few bfloat16 units
# of the larger gradients).
BFLOAT16_EXACT_SHARE = 0.97
BFLOAT16_MAX_ULPS = 1
BFLOAT16_TRAINED_ATOL = 2.0**-6


def _bfloat16_ulps(got, expected):
  """|got - expected| in units of bfloat16's spacing at expected."""
  exponent = np.floor(np.log2(np.maximum(np.abs(expected), 1e-30)))
  return np.abs(got - expected) / 2.0 ** (exponent - 7)


def _assert_matches(name, key, got, expected):
  scale = max(1.0, float(np.abs(expected).max()))
  if key.startswith("init:"):
    np.testing.assert_array_equal(got, expected, err_msg=key)
  elif "bfloat16" in name and key.startswith("final:"):
    np.testing.assert_allclose(
      got, expected, atol=BFLOAT16_TRAINED_ATOL * scale, err_msg=key
    )
  elif "bfloat16" in name:
    assert np.mean(got == expected) >= BFLOAT16_EXACT_SHARE, key
    assert _bfloat16_ulps(got, expected).max() <= BFLOAT16_MAX_ULPS, key
  else:
    # Adafactor's second moments are squared gradients: twice their
    # rounding.
    rtol = 2e-5 if key.endswith("_slot_v") else 1e-5
    np.testing.assert_allclose(
      got, expected, rtol=rtol, atol=1e-6 * scale, err_msg=key
    )


@pytest.mark.parametrize("name", sorted(unet_programs.PROGRAMS))
def test_program_matches_original(reference, name):
  expected = reference.get(name, {})
  got = unet_programs.run_program(mtf, name)
  assert sorted(got) == sorted(expected)
  for key in sorted(expected):
    _assert_matches(name, key, got[key], expected[key])


def test_every_program_has_reference_numbers(reference):
  assert set(reference) == set(unet_programs.PROGRAMS)
