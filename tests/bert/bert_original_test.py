"""The BERT programs give the original 0.1.21's numbers.

bert_programs.py builds a tiny BERT pretraining model and run_classifier's
classifier with the original's public API, on one device and on a 2x2 mesh
with run_pretraining's default layout, and trains them with
bert.optimization.create_optimizer (Adam with weight decay, Adafactor);
data/bert_original.npz holds what the original computed
(data/make_bert_original.py).

- Initial values drawn under a graph seed: equal.
- Outputs, losses and learning rates: float32 rounding (the two packages
  lower einsums and softmaxes to different TF kernels).
- After the first step (Adam's is at learning rate 0, so its slots hold the
  clipped gradients; Adafactor's slots hold squared gradients): float32
  rounding too.
- After three steps: within 0.1% of each variable's scale. Adam and
  Adafactor divide every update by the gradient's running RMS, so where a
  gradient nearly cancels (the attention keys', whose mean over the
  sequence the softmax removes) the rounding grows by the second step.
- The attention key biases: their gradient is only rounding (the softmax
  cancels a bias that adds the same number to all of a query's logits), so
  they and their slots must merely stay near 0 in both.
"""

import os

import numpy as np
import pytest

import mesh_tensorflow as mtf
from tests import original_package
from tests.bert import bert_programs

# Largest difference after three steps, relative to the variable's scale.
TRAINED_ATOL = 1e-3
# Largest value of a key bias (or its slots) after three steps: under Adam,
# a gradient that did not cancel would move it by the learning rate (0.09
# a step).
KEY_BIAS_ATOL = 1e-3


@pytest.fixture(scope="module")
def reference():
  path = os.path.join(os.path.dirname(__file__), "data", "bert_original.npz")
  return original_package.recorded_outputs(path)


def _assert_matches(key, got, expected):
  scale = max(1.0, float(np.abs(expected).max()))
  if key.startswith("init:"):
    np.testing.assert_array_equal(got, expected, err_msg=key)
  elif "attention/key/bias" in key:
    np.testing.assert_allclose(got, 0.0, atol=KEY_BIAS_ATOL, err_msg=key)
    np.testing.assert_allclose(expected, 0.0, atol=KEY_BIAS_ATOL, err_msg=key)
  elif key.startswith("final:"):
    np.testing.assert_allclose(
      got, expected, rtol=1e-5, atol=TRAINED_ATOL * scale, err_msg=key
    )
  else:
    np.testing.assert_allclose(
      got, expected, rtol=1e-5, atol=1e-5 * scale, err_msg=key
    )


@pytest.mark.parametrize(
  "name",
  [
    pytest.param(name, marks=[pytest.mark.slow] if "2x2" in name else [])
    for name in sorted(bert_programs.PROGRAMS)
  ],
)
def test_program_matches_original(reference, name):
  expected = reference.get(name, {})
  got = bert_programs.run_program(mtf, name)
  assert sorted(got) == sorted(expected)
  for key in sorted(expected):
    _assert_matches(key, got[key], expected[key])


def test_every_program_has_reference_numbers(reference):
  assert set(reference) == set(bert_programs.PROGRAMS)
