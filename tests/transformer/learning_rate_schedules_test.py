"""Tests for transformer.learning_rate_schedules against hand-written math.

Every schedule is checked at several steps with a Python step (Python float
result) and with a TF scalar step (float32 TF result equal to the Python one).
"""

import math

import gin
import numpy as np
import pytest
import tensorflow as tf

from transformer import learning_rate_schedules as lrs

STEPS = [0, 1, 500, 999, 5000, 9999, 10000, 40000, 89999, 95000, 100000]
TOTAL = 100000


def _both(fn, step, total=TOTAL, **kwargs):
  """(python result, TF result as float) for one step; checks the types."""
  py = fn(step, total, **kwargs)
  assert isinstance(py, float), (fn.__name__, type(py))
  tf_value = fn(tf.constant(step, tf.int64), total, **kwargs)
  assert tf.is_tensor(tf_value) and tf_value.dtype == tf.float32
  assert tf_value.shape == []
  return py, float(tf_value.numpy())


@pytest.mark.parametrize("step", STEPS)
def test_noam_matches_formula(step):
  expected = (
    1.0
    / math.sqrt(max(step, 10000))
    * 2.0
    * min(1.0, (TOTAL - step) / (TOTAL * 0.1))
  )
  py, t = _both(lrs.learning_rate_schedule_noam, step, multiplier=2.0)
  assert py == pytest.approx(expected, rel=1e-12)
  assert t == pytest.approx(expected, rel=1e-6)


def test_noam_offset_and_no_decay():
  # offset shifts the step; linear_decay_fraction=0 drops the tail factor.
  py = lrs.learning_rate_schedule_noam(
    50000, TOTAL, warmup_steps=100, linear_decay_fraction=0.0, offset=10000
  )
  assert py == pytest.approx(1.0 / math.sqrt(40000))
  py, t = _both(
    lrs.learning_rate_schedule_noam, 99000, warmup_steps=100, offset=5000
  )
  expected = 1.0 / math.sqrt(94000) * min(1.0, (TOTAL - 94000) / 10000)
  assert py == pytest.approx(expected)
  assert t == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("step", STEPS)
def test_linear_warmup_and_decay(step):
  py, t = _both(lrs.linear_warmup, step, steps_or_fraction=10000)
  assert py == pytest.approx(min(1.0, step / 10000))
  assert t == pytest.approx(py, rel=1e-6, abs=1e-7)
  # A fraction <= 1 is a fraction of the training steps.
  py, t = _both(lrs.linear_warmup, step, steps_or_fraction=0.05)
  assert py == pytest.approx(min(1.0, step / 5000))
  assert t == pytest.approx(py, rel=1e-6, abs=1e-7)
  py, t = _both(lrs.linear_decay, step, steps_or_fraction=0.1)
  assert py == pytest.approx(min(1.0, (TOTAL - step) / 10000))
  assert t == pytest.approx(py, rel=1e-6, abs=1e-7)
  py, t = _both(lrs.linear_decay, step, steps_or_fraction=20000)
  assert py == pytest.approx(min(1.0, (TOTAL - step) / 20000))
  assert t == pytest.approx(py, rel=1e-6, abs=1e-7)


@pytest.mark.parametrize("step", STEPS)
def test_truncated_rsqrt(step):
  py, t = _both(lrs.truncated_rsqrt, step, warmup_steps=500)
  assert py == pytest.approx(1.0 / math.sqrt(max(step, 500)))
  assert t == pytest.approx(py, rel=1e-6)


def test_constants():
  assert _both(lrs.constant, 7, value=0.5) == (0.5, 0.5)
  assert _both(lrs.constant, 7) == (1.0, 1.0)
  py, t = _both(lrs.constant_learning_rate, 123, learning_rate=0.01)
  assert py == 0.01 and t == pytest.approx(0.01)


@pytest.mark.parametrize("step", [0, 100, 200, 600, 999, 1000])
def test_linear_decay_learning_rate(step):
  expected = 0.1 * min(1.0, (1000 - step) / (1000 - 200))
  py, t = _both(lrs.linear_decay_learning_rate, step, total=1000, offset=200)
  assert py == pytest.approx(expected)
  assert t == pytest.approx(expected, rel=1e-6, abs=1e-8)


@pytest.mark.parametrize("step", [0, 50, 99, 100, 101, 550, 1000])
def test_slanted_triangular(step):
  # T=1000, cut=100: rises 1/32 -> 1 of max until 100, falls back by 1000.
  cut = 100
  p = step / cut if step < cut else 1 - (step - cut) / (cut * (1 / 0.1 - 1))
  expected = 0.01 * (1 + p * 31) / 32
  py, t = _both(lrs.slanted_triangular, step, total=1000)
  assert py == pytest.approx(expected)
  assert t == pytest.approx(expected, rel=1e-6)


def test_slanted_triangular_landmarks_and_start_step():
  assert lrs.slanted_triangular(0, 1000) == pytest.approx(0.01 / 32)
  assert lrs.slanted_triangular(100, 1000) == pytest.approx(0.01)
  assert lrs.slanted_triangular(1000, 1000) == pytest.approx(0.01 / 32)
  # start_step shifts both the step and the schedule's length.
  assert lrs.slanted_triangular(600, 1500, start_step=500) == pytest.approx(
    lrs.slanted_triangular(100, 1000)
  )
  with pytest.raises(ValueError, match="cut_fraction"):
    lrs.slanted_triangular(5, 5, cut_fraction=0.1)


def test_product_learning_rate_numbers_functions_and_offset():
  seen = []

  def factor(step, total):
    seen.append((step, total))
    return 0.5

  py = lrs.product_learning_rate(1500, 3000, factors=[factor, 0.2], offset=1000)
  assert py == pytest.approx(0.1)
  assert seen == [(500, 2000)]
  py, t = _both(
    lrs.product_learning_rate,
    40000,
    factors=[lrs.linear_warmup, lrs.truncated_rsqrt],
  )
  expected = 1.0 * 1.0 / math.sqrt(40000)
  assert py == pytest.approx(expected)
  assert t == pytest.approx(expected, rel=1e-6)
  # Only numbers: still a TF scalar for a TF step.
  py, t = _both(lrs.product_learning_rate, 3, factors=[0.5, 4])
  assert (py, t) == (2.0, 2.0)
  with pytest.raises(ValueError, match="factor"):
    lrs.product_learning_rate(1, 10, factors=["fast"])


def test_tf_step_inside_tf_function_and_variable():
  step = tf.Variable(2500, dtype=tf.int64)

  @tf.function
  def rate():
    return lrs.product_learning_rate(
      step, 100000, factors=[lrs.linear_warmup, lrs.truncated_rsqrt]
    )

  np.testing.assert_allclose(rate().numpy(), 0.25 / 100.0, rtol=1e-6)
  step.assign(20000)
  np.testing.assert_allclose(rate().numpy(), 1.0 / math.sqrt(20000), rtol=1e-6)


def test_invalid_arguments_name_the_schedule():
  with pytest.raises(ValueError, match="linear_warmup"):
    lrs.linear_warmup(1, 0, steps_or_fraction=0.5)
  with pytest.raises(ValueError, match="truncated_rsqrt"):
    lrs.truncated_rsqrt(1, 10, warmup_steps=0)
  with pytest.raises(ValueError, match="linear_decay_learning_rate"):
    lrs.linear_decay_learning_rate(1, 10, offset=10)


def test_gin_registration_under_original_module():
  gin.clear_config()
  try:
    gin.parse_config("""
        import transformer.learning_rate_schedules
        mesh_tensorflow.transformer.learning_rate_schedules.product_learning_rate.factors = [
            @mesh_tensorflow.transformer.learning_rate_schedules.linear_warmup,
            @mesh_tensorflow.transformer.learning_rate_schedules.constant]
        mesh_tensorflow.transformer.learning_rate_schedules.linear_warmup.steps_or_fraction = 100
        mesh_tensorflow.transformer.learning_rate_schedules.constant.value = 3.0
        learning_rate_schedule_noam.warmup_steps = 4
        constant_learning_rate.learning_rate = 0.25
        slanted_triangular.max_learning_rate = 1.0
    """)
    assert lrs.product_learning_rate(50, 1000) == pytest.approx(1.5)
    assert lrs.learning_rate_schedule_noam(
      0, 1000, linear_decay_fraction=0.0
    ) == pytest.approx(0.5)
    assert lrs.constant_learning_rate(3, 10) == 0.25
    assert lrs.slanted_triangular(100, 1000) == pytest.approx(1.0)
  finally:
    gin.clear_config()
  # REQUIRED parameters must be given.
  with pytest.raises(Exception, match="learning_rate"):
    lrs.constant_learning_rate(3, 10)
