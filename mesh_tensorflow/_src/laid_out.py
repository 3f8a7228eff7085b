"""Laid-out tensor values: what a MeshImpl computes on and returns.

A laid-out tensor is a backend's per-processor representation of an mtf
Tensor. Besides the backends' own types there are two lazy forms: a
LazyAllreduceSum (a SUM allreduce postponed until its result is needed, so
that linear operations happen before the one allreduce) and a
LazyLaidOutTensor (recomputed on each use). Operations, MeshImpl and Lowering
all build on these, so they live below all three.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence


class LazyAllreduceSum:
  """A SUM allreduce that is only performed when its result is needed.

  Args:
    mesh_impl: the MeshImpl that will perform the allreduce.
    laid_out_input: the LaidOutTensor of partial sums.
    mesh_axes: the mesh axes to sum over.
    add_counter_fn: optional function called when the allreduce is performed (to
      count communication).
  """

  def __init__(
    self,
    mesh_impl,
    laid_out_input,
    mesh_axes,
    add_counter_fn: Optional[Callable[[], None]] = None,
  ):
    self.mesh_impl = mesh_impl
    self.laid_out_input = laid_out_input
    self.mesh_axes = tuple(mesh_axes)
    self.add_counter_fn = add_counter_fn
    self._reduced = None

  def to_laid_out_tensor(self) -> Any:
    """Performs the allreduce (once) and returns its result.

    Returns:
      the summed LaidOutTensor.
    """
    if self._reduced is None:
      if not self.mesh_axes:
        self._reduced = self.laid_out_input
      else:
        if self.add_counter_fn is not None:
          self.add_counter_fn()
        self._reduced = self.mesh_impl.allreduce(
          self.laid_out_input, self.mesh_axes, "SUM"
        )
    return self._reduced

  @property
  def slice_shape(self) -> List[int]:
    """The shape of each processor's slice (a list of ints)."""
    return self.laid_out_input.slice_shape


class LazyLaidOutTensor:
  """A laid-out tensor computed (again) on each to_laid_out_tensor() call.

  Args:
    to_laid_out_tensor_fn: a function of no arguments computing the
      LaidOutTensor.
    slice_shape: the shape of each slice (a list of ints).
  """

  def __init__(self, to_laid_out_tensor_fn: Callable, slice_shape):
    self._fn = to_laid_out_tensor_fn
    self._slice_shape = slice_shape

  def to_laid_out_tensor(self) -> Any:
    """Computes the laid-out tensor.

    Returns:
      the LaidOutTensor to_laid_out_tensor_fn returns.
    """
    return self._fn()

  @property
  def slice_shape(self) -> List[int]:
    """The shape of each processor's slice (a list of ints)."""
    return self._slice_shape


def compatible_lazy_allreduce_sums(xs: Sequence) -> bool:
  """True iff xs are LazyAllreduceSums over the same axes and slice shape.

  Args:
    xs: a list of laid-out values.

  Returns:
    a bool.
  """
  if not xs or not all(isinstance(x, LazyAllreduceSum) for x in xs):
    return False
  first = xs[0]
  return all(
    x.mesh_axes == first.mesh_axes
    and list(x.slice_shape) == list(first.slice_shape)
    for x in xs[1:]
  )


def to_laid_out_tensor(value):
  """value, with a lazy form (LazyAllreduceSum, ...) turned into its result."""
  if hasattr(value, "to_laid_out_tensor"):
    return value.to_laid_out_tensor()
  return value


def convert_args_to_laid_out_tensors(xs: Sequence) -> list:
  """Performs pending lazy computations of the arguments.

  Args:
    xs: a list of LaidOutTensors, lazy laid-out tensors or other values.

  Returns:
    a list like xs, lazy values replaced by their LaidOutTensors.
  """
  return [to_laid_out_tensor(x) for x in xs]


__all__ = [
  "LazyAllreduceSum",
  "LazyLaidOutTensor",
  "compatible_lazy_allreduce_sums",
  "convert_args_to_laid_out_tensors",
  "to_laid_out_tensor",
]
