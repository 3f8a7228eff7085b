"""Learning-rate schedules for optimizers with per-variable alternative rates.

`AdafactorWithMultiLRSchedule` and `AdamWithMultiLRSchedule` give variables
whose names match a regex their own schedule. A schedule is a list of factor
functions `f(step, total_train_steps)` multiplied together
(`product_learning_rate`), or None for "the optimizer's own learning rate".
"""

from __future__ import annotations

import re
from typing import Any, List, Optional, Sequence

import gin
import tensorflow as tf

from mesh_tensorflow._src.optimizers.global_step import step_num


@gin.configurable(module="mesh_tensorflow.optimize")
def product_learning_rate(
  step,
  total_train_steps: int,
  factors: Sequence[Any] = gin.REQUIRED,
  offset: int = 0,
):
  """The product of `f(step - offset, total_train_steps)` over `factors`.

  Args:
    step: the current step (a scalar tf.Tensor or number).
    total_train_steps: the number of training steps.
    factors: callables `(step, total_train_steps) -> scalar`; a plain number
      is taken as a constant factor.
    offset: subtracted from `step` before calling the factors.

  Returns:
    The learning rate (1.0 for an empty list of factors).

  Example:
    >>> product_learning_rate(10, 1000, factors=[lambda s, t: 0.1, 2.0])
    0.2
    >>> linear_decay = lambda step, total: 1.0 - step / total
    >>> product_learning_rate(110, 1000, factors=[linear_decay], offset=10)
    0.9
  """
  if callable(factors):
    factors = [factors]
  ret = 1.0
  for factor in factors:
    if callable(factor):
      ret *= factor(step - offset, total_train_steps)
    else:
      ret *= factor
  return ret


@gin.configurable(module="mesh_tensorflow.optimize")
def compute_lr_for_step(
  schedules: Sequence[Any], learning_rate, train_steps: int = 524288
) -> list:
  """The learning rate of each schedule at the current global step.

  Args:
    schedules: a list whose entries are None (use `learning_rate`) or a list of
      factor functions for `product_learning_rate`.
    learning_rate: the optimizer's own learning rate.
    train_steps: total_train_steps passed to the factor functions.

  Returns:
    A list aligned with `schedules` of learning rates (float32 tf scalars for
    scheduled entries; factors receive the global step as a float32 scalar).
  """
  rates = []
  step = None
  for schedule in schedules:
    if schedule is None:
      rates.append(learning_rate)
      continue
    if step is None:
      step = step_num()
    rate = product_learning_rate(step, train_steps, factors=schedule)
    rates.append(tf.cast(rate, tf.float32))
  return rates


class MultiLRScheduleMixin:
  """Selects a learning rate per variable by the first matching regex."""

  def _init_multi_lr(
    self,
    variable_search: Optional[Sequence[str]],
    alt_lr_schedules: Optional[Sequence[Any]],
  ) -> None:
    if isinstance(variable_search, str):
      variable_search = [variable_search]
    self._variable_search = list(variable_search or [])
    self._alt_lr_schedules = list(alt_lr_schedules or [])
    if len(self._variable_search) != len(self._alt_lr_schedules):
      raise ValueError(
        "%s: variable_search has %d regexes but alt_lr_schedules has %d "
        "schedules; they must correspond one to one"
        % (
          type(self).__name__,
          len(self._variable_search),
          len(self._alt_lr_schedules),
        )
      )
    for pattern in self._variable_search:
      try:
        re.compile(pattern)
      except re.error as e:
        raise ValueError(
          "%s: bad variable_search regex %r: %s"
          % (type(self).__name__, pattern, e)
        ) from None

  @property
  def variable_search(self) -> List[str]:
    """A dict {schedule name: regexp}: variables whose name matches use it."""
    return list(self._variable_search)

  @property
  def alt_lr_schedules(self) -> list:
    """A dict {schedule name: learning rate schedule}."""
    return list(self._alt_lr_schedules)

  def _select_learning_rate(self, var_name: str, base_learning_rate):
    """The alternative rate of the first regex matching var_name, else base."""
    for i, pattern in enumerate(self._variable_search):
      if re.search(pattern, var_name) is not None:
        rates = self._cached(  # pylint: disable=no-member
          "alt_lr_schedules",
          lambda: compute_lr_for_step(
            self._alt_lr_schedules, base_learning_rate
          ),
        )
        return rates[i]
    return base_learning_rate


__all__ = [
  "MultiLRScheduleMixin",
  "compute_lr_for_step",
  "product_learning_rate",
]
