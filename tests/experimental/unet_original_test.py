"""The experimental U-Net gives the original 0.1.21's numbers.

unet_programs.py builds unet_with_spatial_partition on one device and on a
2x2 mesh with the original's default layout, and trains it as the
original's model_executor does (Adafactor, batch-norm updates);
data/unet_original.npz holds what the original computed
(data/make_unet_original.py). The initial values drawn under a graph seed
(batch_norm's moving mean included: the original draws it from a standard
normal), outputs, eval metrics, losses and every variable after three steps
must be the original's.
"""

import os

import numpy as np
import pytest

import mesh_tensorflow as mtf
from tests.experimental import unet_programs


@pytest.fixture(scope="module")
def reference():
  path = os.path.join(os.path.dirname(__file__), "data", "unet_original.npz")
  with np.load(path) as arrays:
    return dict(arrays)


def _outputs(reference, name):
  prefix = name + "/"
  return {
    k[len(prefix) :]: v for k, v in reference.items() if k.startswith(prefix)
  }


@pytest.mark.parametrize("name", sorted(unet_programs.PROGRAMS))
def test_program_matches_original(reference, name):
  expected = _outputs(reference, name)
  got = unet_programs.run_program(mtf, name)
  assert sorted(got) == sorted(expected)
  for key in sorted(expected):
    if key.startswith("init:"):
      np.testing.assert_array_equal(got[key], expected[key], err_msg=key)
      continue
    # Adafactor's second moments are squared gradients: twice their
    # rounding.
    rtol = 2e-5 if key.endswith("_slot_v") else 1e-5
    scale = max(1.0, float(np.abs(expected[key]).max()))
    np.testing.assert_allclose(
      got[key], expected[key], rtol=rtol, atol=1e-6 * scale, err_msg=key
    )


def test_every_program_has_reference_numbers(reference):
  names = {key.split("/")[0] for key in reference}
  assert names == set(unet_programs.PROGRAMS)
