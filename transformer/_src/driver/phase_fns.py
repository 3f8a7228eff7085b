"""Compiled phase functions and their laid-out variables.

A `PhaseFn` is one compiled mtf computation of the driver (a training,
evaluation, decoding or scoring step) with the laid-out variables its trace
made. The driver copies the masters into a phase's slices and the trained
slices back (`copy_laid_out_variables`), and checks a step's values for inf
and nan (`all_finite` over the loss and `slice_values`).
"""

from __future__ import annotations

import functools
from typing import Callable, Dict, List

import tensorflow as tf

__all__ = [
  "PhaseFn",
  "all_finite",
  "copy_laid_out_variables",
  "slice_values",
]


class PhaseFn:
  """A compiled mtf computation plus the laid-out variables its trace made."""

  def __init__(self, fn: Callable):
    self.fn = fn
    self.laid_out_variables = None  # set while tracing
    self.slices_version = -1
    self.copy_fns = {}


def all_finite(tensors) -> tf.Tensor:
  """A scalar bool: whether every floating-point tensor is free of inf/nan.

  Args:
    tensors: tf.Tensors or tf.Variables; non-float ones are skipped.

  Returns:
    A scalar bool tf.Tensor (True for no float tensors).
  """
  flags = [
    tf.reduce_all(tf.math.is_finite(t)) for t in tensors if t.dtype.is_floating
  ]
  return tf.reduce_all(tf.stack(flags)) if flags else tf.constant(True)


def slice_values(laid_out_variables) -> List[tf.Tensor]:
  """The current values of the distinct slice variables (shared ones once)."""
  seen, values = set(), []
  for laid_out in laid_out_variables:
    for v in laid_out.laid_out_tensor.all_slices:
      if id(v) not in seen:
        seen.add(id(v))
        values.append(tf.convert_to_tensor(v))
  return values


def copy_laid_out_variables(
  laid_out_variables, what: str, compiled: Dict[str, Callable]
) -> None:
  """Runs `what` of every laid-out variable, as one compiled function.

  Args:
    laid_out_variables: the laid-out variables (None or empty: nothing to do).
    what: "copy_master_to_slices" or "copy_slices_to_master".
    compiled: the caller's cache {what: tf.function}, filled on first use.
  """
  if not laid_out_variables:
    return
  fn = compiled.get(what)
  if fn is None:
    # A partial, not a closure: TF keys its retracing warning on a
    # function's code, which every caller's copy would share.
    fn = tf.function(
      functools.partial(_copy_variables, laid_out_variables, what),
      autograph=False,
    )
    compiled[what] = fn
  fn()


def _copy_variables(laid_out_variables, what: str) -> None:
  tf.group(*[getattr(v, what) for v in laid_out_variables])
