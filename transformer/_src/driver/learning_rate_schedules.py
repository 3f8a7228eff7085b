"""Learning-rate schedules for the transformer driver (gin-configurable).

Every schedule is a function `(step, total_train_steps, ...) -> rate`. `step`
may be a Python number (the result is then computed with Python math, and is a
Python float when executing eagerly, or a float32 constant while building a
graph, so that a TF1 program can `session.run` it) or a TF scalar such as the
global step (the result is then a float32 TF scalar). Schedules compose with `product_learning_rate`, whose
factors are other schedules, e.g. in gin:

  run.learning_rate_schedule = @learning_rate_schedules.product_learning_rate
  product_learning_rate.factors = [@linear_warmup, @truncated_rsqrt]
"""

from __future__ import annotations

import math
from typing import Any, Sequence, Union

import gin
import numpy as np
import tensorflow as tf

__all__ = [
  "constant",
  "constant_learning_rate",
  "learning_rate_schedule_noam",
  "linear_decay",
  "linear_decay_learning_rate",
  "linear_warmup",
  "product_learning_rate",
  "slanted_triangular",
  "truncated_rsqrt",
]

_GIN_MODULE = "mesh_tensorflow.transformer.learning_rate_schedules"

Number = Union[int, float]
Step = Union[Number, tf.Tensor, tf.Variable]


def _is_tf(x) -> bool:
  return tf.is_tensor(x) or isinstance(x, tf.Variable)


def _float(x):
  """x as float32 if it is a TF value, else as a Python float."""
  if _is_tf(x):
    return tf.cast(x, tf.float32)
  return float(x)


def _minimum(a, b):
  if _is_tf(a) or _is_tf(b):
    return tf.minimum(_float(a), _float(b))
  return min(a, b)


def _maximum(a, b):
  if _is_tf(a) or _is_tf(b):
    return tf.maximum(_float(a), _float(b))
  return max(a, b)


def _rsqrt(x):
  if _is_tf(x):
    return tf.math.rsqrt(_float(x))
  return 1.0 / math.sqrt(x)


def _like_step(step, value):
  """value as float32 TF scalar when step (or value) is a TF value.

  While building a graph (TF1 graph mode or a tf.function), a Python result
  becomes a float32 constant too: graph programs fetch or feed the rate.
  """
  if _is_tf(value) or _is_tf(step) or not tf.executing_eagerly():
    return tf.cast(value, tf.float32)
  return float(value)


def _check_positive(value, what: str, schedule: str) -> None:
  if not _is_tf(value) and value <= 0:
    raise ValueError(
      "%s: %s must be positive, got %r" % (schedule, what, value)
    )


@gin.configurable(module=_GIN_MODULE)
def product_learning_rate(
  step: Step,
  total_train_steps: Number,
  factors: Sequence[Any] = gin.REQUIRED,
  offset: Number = 0,
):
  """The product of the factors: numbers, or schedules called on the offset steps.

  Each callable factor is called as `f(step - offset, total_train_steps -
  offset)`, so a fine-tuning run that starts at step `offset` sees a fresh
  schedule over its own steps.

  Example:
    >>> gin.bind_parameter("linear_warmup.steps_or_fraction", 1000)
    >>> product_learning_rate(500, 1000, factors=[0.5, linear_warmup])
    0.25
    >>> gin.clear_config()

    That is 0.5 times the warm-up factor 500 / 1000.

  Args:
    step: the current step.
    total_train_steps: the number of training steps.
    factors: a list of numbers and/or schedule functions.
    offset: subtracted from step and total_train_steps before calling factors.

  Returns:
    The learning rate (a float, or a float32 TF scalar for a TF step).

  Raises:
    ValueError: if a factor is neither a number nor a schedule function.
  """
  if callable(factors):
    factors = [factors]
  ret = 1.0
  for factor in factors:
    if callable(factor):
      ret *= factor(step - offset, total_train_steps - offset)
    elif isinstance(factor, (int, float, np.number)) or _is_tf(factor):
      ret *= factor
    else:
      raise ValueError(
        "product_learning_rate: factor %r is neither a number "
        "nor a schedule function" % (factor,)
      )
  return _like_step(step, ret)


@gin.configurable(module=_GIN_MODULE)
def linear_decay(
  step: Step, total_train_steps: Number, steps_or_fraction: Number = 0.1
):
  """1.0, then linear decay to 0 over the last steps of training.

  Example:
    >>> linear_decay(950, 1000, steps_or_fraction=0.1)  # (1000 - 950) / 100
    0.5

  Args:
    step: the current step.
    total_train_steps: the number of training steps.
    steps_or_fraction: the length of the decay: a number of steps if > 1,
      else a fraction of total_train_steps.

  Returns:
    min(1, (total_train_steps - step) / decay_steps).
  """
  decay_steps = steps_or_fraction
  if steps_or_fraction <= 1:
    decay_steps = steps_or_fraction * total_train_steps
  _check_positive(
    decay_steps,
    "decay steps (steps_or_fraction=%r, "
    "total_train_steps=%r)" % (steps_or_fraction, total_train_steps),
    "linear_decay",
  )
  return _like_step(
    step, _minimum(1.0, (total_train_steps - _float(step)) / decay_steps)
  )


@gin.configurable(module=_GIN_MODULE)
def linear_warmup(
  step: Step, total_train_steps: Number, steps_or_fraction: Number = 10000
):
  """Linear warm-up from 0 to 1, then 1.

  Example:
    >>> linear_warmup(2500, 100000, steps_or_fraction=10000)
    0.25

  Args:
    step: the current step.
    total_train_steps: the number of training steps.
    steps_or_fraction: the warm-up length: a number of steps if > 1, else a
      fraction of total_train_steps.

  Returns:
    min(1, step / warmup_steps).
  """
  warmup_steps = steps_or_fraction
  if steps_or_fraction <= 1:
    warmup_steps = steps_or_fraction * total_train_steps
  _check_positive(
    warmup_steps,
    "warm-up steps (steps_or_fraction=%r, "
    "total_train_steps=%r)" % (steps_or_fraction, total_train_steps),
    "linear_warmup",
  )
  return _like_step(step, _minimum(1.0, _float(step) / warmup_steps))


@gin.configurable(module=_GIN_MODULE)
def truncated_rsqrt(
  step: Step, total_train_steps: Number, warmup_steps: Number = 10000
):
  """Inverse square root of the step, constant during warm-up.

  Example:
    >>> truncated_rsqrt(40000, 100000)  # 1 / sqrt(40000)
    0.005
    >>> print(truncated_rsqrt(tf.constant(100), 100000).numpy())  # warm-up
    0.01

  Args:
    step: the global step: an int, a numpy value or an int/float tensor.
    total_train_steps: unused.
    warmup_steps: the rate is constant (1/sqrt(warmup_steps)) up to this step.

  Returns:
    rsqrt(max(step, warmup_steps)).
  """
  del total_train_steps
  _check_positive(warmup_steps, "warmup_steps", "truncated_rsqrt")
  return _like_step(step, _rsqrt(_maximum(_float(step), float(warmup_steps))))


@gin.configurable(module=_GIN_MODULE)
def constant(step: Step, total_train_steps: Number, value: Number = 1.0):
  """The constant `value` (a factor for product_learning_rate).

  Example:
    >>> constant(7, 100, value=0.5)
    0.5

  Args:
    step: the global step: an int, a numpy value or an int/float tensor.
    total_train_steps: unused.
    value: the value returned.

  Returns:
    `value`, as a tensor if `step` is one.
  """
  del total_train_steps
  return _like_step(step, value)


@gin.configurable(module=_GIN_MODULE)
def constant_learning_rate(
  step: Step, total_train_steps: Number, learning_rate: Number = gin.REQUIRED
):
  """The constant `learning_rate`.

  Example:
    >>> constant_learning_rate(7, 100, learning_rate=0.01)
    0.01

  Args:
    step: the global step: an int, a numpy value or an int/float tensor.
    total_train_steps: unused.
    learning_rate: the learning rate.

  Returns:
    `learning_rate`, as a tensor if `step` is one.
  """
  del total_train_steps
  return _like_step(step, learning_rate)


@gin.configurable(module=_GIN_MODULE)
def linear_decay_learning_rate(
  step: Step,
  total_train_steps: Number,
  initial_lr: Number = 0.1,
  offset: Number = 0,
):
  """initial_lr until `offset`, then linear decay to 0 at total_train_steps.

  Example:
    >>> linear_decay_learning_rate(600, 1000, initial_lr=0.1, offset=200)
    0.05

  Args:
    step: the global step: an int, a numpy value or an int/float tensor.
    total_train_steps: the step at which the rate reaches 0.
    initial_lr: the rate until `offset`.
    offset: the step at which the decay starts.

  Returns:
    initial_lr * min(1, (total_train_steps - step) / (total_train_steps -
    offset)).
  """
  _check_positive(
    total_train_steps - offset,
    "total_train_steps - offset",
    "linear_decay_learning_rate",
  )
  return _like_step(
    step,
    initial_lr
    * _minimum(
      1.0, (total_train_steps - _float(step)) / (total_train_steps - offset)
    ),
  )


@gin.configurable(module=_GIN_MODULE)
def learning_rate_schedule_noam(
  step: Step,
  total_train_steps: Number,
  warmup_steps: Number = 10000,
  linear_decay_fraction: Number = 0.1,
  multiplier: Number = 1.0,
  offset: Number = 0,
):
  """Noam's schedule: flat warm-up, rsqrt decay, then a linear tail to 0.

    rsqrt(max(s, warmup_steps)) * multiplier
      * min(1, (total_train_steps - s) / (total_train_steps *
                                          linear_decay_fraction))

  with s = step - offset (the tail factor is left out when
  linear_decay_fraction is 0).

  Example:
    >>> learning_rate_schedule_noam(40000, 1000000)  # 1 / sqrt(40000)
    0.005
    >>> rate = learning_rate_schedule_noam(950000, 1000000)  # the linear tail
    >>> math.isclose(rate, 950000**-0.5 * (1000000 - 950000) / 100000)
    True

  Args:
    step: the current step.
    total_train_steps: the number of training steps.
    warmup_steps: steps with the constant rate rsqrt(warmup_steps).
    linear_decay_fraction: fraction of training with the linear tail decay.
    multiplier: scales the rate.
    offset: the step at which the schedule starts (for fine-tuning).

  Returns:
    The learning rate.
  """
  _check_positive(warmup_steps, "warmup_steps", "learning_rate_schedule_noam")
  train_steps = float(total_train_steps)
  step_num = _float(step) - offset
  learning_rate = _rsqrt(_maximum(step_num, float(warmup_steps))) * multiplier
  if linear_decay_fraction > 0:
    learning_rate *= _minimum(
      1.0, (train_steps - step_num) / (train_steps * linear_decay_fraction)
    )
  return _like_step(step, learning_rate)


@gin.configurable(module=_GIN_MODULE)
def slanted_triangular(
  step: Step,
  total_train_steps: Number,
  cut_fraction: float = 0.1,
  ratio: Number = 32,
  max_learning_rate: float = 0.01,
  start_step: Number = 0,
):
  """ULMFiT's slanted triangular rate: short linear rise, long linear fall.

  With T = total_train_steps - start_step, t = step - start_step and
  cut = floor(T * cut_fraction):
    p = t / cut                                        if t < cut
    p = 1 - (t - cut) / (cut * (1 / cut_fraction - 1))  otherwise
    rate = max_learning_rate * (1 + p * (ratio - 1)) / ratio
  The rate rises from max_learning_rate / ratio to max_learning_rate at
  t = cut and falls back to max_learning_rate / ratio at t = T.

  Example:
    >>> slanted_triangular(100, 1000)  # the peak
    0.01
    >>> slanted_triangular(0, 1000)  # max_learning_rate / ratio
    0.0003125

  Args:
    step: the current step.
    total_train_steps: the number of training steps.
    cut_fraction: fraction of the steps with a rising rate.
    ratio: how much smaller the lowest rate is than the highest.
    max_learning_rate: the highest rate.
    start_step: the step at which the schedule starts.

  Returns:
    The learning rate.

  Raises:
    ValueError: if cut_fraction of total_train_steps leaves no warm-up step
      (need 0 < cut_fraction < 1).
  """
  train_steps = float(total_train_steps) - start_step
  cut = math.floor(train_steps * cut_fraction)
  if cut < 1 or not 0 < cut_fraction < 1:
    raise ValueError(
      "slanted_triangular: cut_fraction=%r of %r training steps leaves no "
      "warm-up step; need 0 < cut_fraction < 1 and total_train_steps * "
      "cut_fraction >= 1" % (cut_fraction, train_steps)
    )
  step_num = _float(step) - start_step
  decay_length = cut * (1.0 / cut_fraction - 1.0)
  if _is_tf(step_num):
    p = tf.where(
      step_num < cut, step_num / cut, 1.0 - (step_num - cut) / decay_length
    )
  elif step_num < cut:
    p = step_num / cut
  else:
    p = 1.0 - (step_num - cut) / decay_length
  return _like_step(step, max_learning_rate * (1 + p * (ratio - 1)) / ratio)
