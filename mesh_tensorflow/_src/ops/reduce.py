"""Reductions; a reduced split dimension costs an allreduce (lazy for SUM)."""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import tensorflow as tf

from mesh_tensorflow._src import graph_constants
from mesh_tensorflow._src import mesh_impl as mesh_impl_lib
from mesh_tensorflow._src.graph import Operation
from mesh_tensorflow._src.graph import Tensor
from mesh_tensorflow._src.laid_out import LazyAllreduceSum
from mesh_tensorflow._src.ops import broadcast_binary
from mesh_tensorflow._src.ops import elementwise
from mesh_tensorflow._src.shapes import Shape
from mesh_tensorflow._src.shapes import convert_to_shape

_LOCAL_REDUCTIONS = {
  "SUM": tf.reduce_sum,
  "MAX": tf.reduce_max,
  "MIN": tf.reduce_min,
}


def reduction_fn(reduction_fn_string: str) -> Callable[..., tf.Tensor]:
  """The per-slice TF reduction named by a string.

  Args:
    reduction_fn_string: "SUM", "MAX" or "MIN".

  Returns:
    tf.reduce_sum, tf.reduce_max or tf.reduce_min.

  Raises:
    ValueError: for any other string.
  """
  try:
    return _LOCAL_REDUCTIONS[reduction_fn_string]
  except KeyError:
    raise ValueError(
      "unknown reduction %r; expected SUM, MAX or MIN" % (reduction_fn_string,)
    ) from None


class ReduceOperation(Operation):
  """Reduces x to output_shape with SUM, MAX or MIN.

  Args:
    x: the mtf Tensor to reduce.
    output_shape: the Shape of the result: a subset of x's dims.
    reduction_fn_string: "SUM", "MAX" or "MIN".
    name: an optional name for the operation.
  """

  def __init__(
    self,
    x: Tensor,
    output_shape,
    reduction_fn_string: str,
    name: Optional[str] = None,
  ):
    super().__init__([x], name=name or "reduce")
    # Checked when lowered, not here: the original builds the op with any
    # string (its tests use "sum") and fails only on lowering.
    self._reduction_fn_string = reduction_fn_string
    self._outputs = [Tensor(self, convert_to_shape(output_shape), x.dtype)]

  @property
  def reduction_fn_string(self) -> str:
    """The name of the reduction, e.g. "SUM" or "MAX"."""
    return self._reduction_fn_string

  def gradient(
    self, grad_ys: Sequence[Optional[Tensor]]
  ) -> Sequence[Optional[Tensor]]:
    dy = grad_ys[0]
    x = self.inputs[0]
    if self._reduction_fn_string == "SUM":
      return [broadcast(dy, x.shape)]
    y = self.outputs[0]
    mask = elementwise.cast(broadcast_binary.equal(x, y), dy.dtype)
    return [dy * mask]

  def lower(self, lowering) -> None:
    mesh_impl = lowering.mesh_impl(self)
    x = self.inputs[0]
    out_shape = self.outputs[0].shape
    names = x.shape.dimension_names
    reduced_axes = [
      i for i, n in enumerate(names) if n not in out_shape.dimension_names
    ]
    kept = [n for n in names if n in out_shape.dimension_names]
    perm = [kept.index(n) for n in out_shape.dimension_names]
    fn = reduction_fn(self._reduction_fn_string)

    def local_reduce(t):
      if reduced_axes:
        t = fn(t, axis=graph_constants.constant(reduced_axes))
      if perm != sorted(perm):
        t = tf.transpose(t, graph_constants.constant(perm))
      return t

    laid_out_x = lowering.tensors[x]
    if self._reduction_fn_string == "SUM":
      y = mesh_impl.slicewise_delay_allreduce(local_reduce, laid_out_x)
    else:
      y = mesh_impl.slicewise(local_reduce, laid_out_x)
    mesh_axes = sorted(
      set(
        mesh_impl.tensor_dimension_to_mesh_axis(x.shape.dims[i])
        for i in reduced_axes
      )
      - {None}
    )
    if mesh_axes:
      counter = "allreduce/%s/reduce_op" % mesh_axes
      if self._reduction_fn_string == "SUM":
        if isinstance(y, LazyAllreduceSum):
          if set(mesh_axes) & set(y.mesh_axes):
            # An axis summed twice (the pending sum was broadcast over a dim
            # split on it): allreduce twice != once, so finish the first.
            y = y.to_laid_out_tensor()
          else:
            # Sums are linear: one allreduce over both (disjoint) sets of axes.
            mesh_axes = sorted(set(mesh_axes) | set(y.mesh_axes))
            y = y.laid_out_input
        y = LazyAllreduceSum(
          mesh_impl,
          y,
          mesh_axes,
          add_counter_fn=lambda: lowering.add_counter(
            counter, lowering.laid_out_size(self.outputs[0])
          ),
        )
      else:
        lowering.add_counter(counter, lowering.laid_out_size(self.outputs[0]))
        y = mesh_impl.allreduce(y, mesh_axes, self._reduction_fn_string)
    lowering.set_tensor_lowering(self.outputs[0], y)


def _reduction_output_shape(
  x: Tensor, output_shape, reduced_dim, op_name: str
) -> Shape:
  if reduced_dim is not None:
    if reduced_dim not in x.shape.dims:
      raise ValueError(
        "%s: reduced_dim %s is not in %s"
        % (op_name, reduced_dim, x.shape.to_string)
      )
    if output_shape is None:
      return x.shape - reduced_dim
    output_shape = convert_to_shape(output_shape)
    # Both given: output_shape (in any order) must keep all dims but that one.
    if [d for d in x.shape.dims if d not in output_shape.dims] != [reduced_dim]:
      raise ValueError(
        "%s: output_shape %s disagrees with reduced_dim %s of %s"
        % (op_name, output_shape.to_string, reduced_dim, x.shape.to_string)
      )
  if output_shape is None:
    return Shape([])
  output_shape = convert_to_shape(output_shape)
  for d in output_shape.dims:
    if d not in x.shape.dims:
      raise ValueError(
        "%s: output dimension %s is not in the input shape %s"
        % (op_name, d, x.shape.to_string)
      )
  return output_shape


def _check_keywords(disable_positional_args, op_name):
  if disable_positional_args is not None:
    raise TypeError(
      "%s: pass output_shape / reduced_dim as keyword arguments" % op_name
    )


def _reduce(
  x,
  disable_positional_args,
  output_shape,
  reduced_dim,
  name,
  reduction_fn_string,
  op_name,
):
  _check_keywords(disable_positional_args, op_name)
  output_shape = _reduction_output_shape(x, output_shape, reduced_dim, op_name)
  if output_shape == x.shape:
    return x
  return ReduceOperation(
    x, output_shape, reduction_fn_string, name=name or op_name
  ).outputs[0]


def reduce_sum(
  x: Tensor,
  disable_positional_args=None,
  output_shape=None,
  reduced_dim=None,
  name: Optional[str] = None,
) -> Tensor:
  """Sum to output_shape (default: a scalar).

  Args:
    x: the mtf Tensor to reduce.
    disable_positional_args: must be None: forces output_shape and reduced_dim
      to be passed by keyword.
    output_shape: optional Shape of the result, a subset of x's dims (the others
      are reduced). Give at most one of output_shape and reduced_dim; with
      neither, every dim is reduced (a scalar).
    reduced_dim: a Dimension of x to reduce; the result has all dims of x but
      this one.
    name: an optional name for the operation.

  Returns:
    an mtf Tensor of shape `output_shape`: the sum over the reduced dims, with
    the dtype of x.
  """
  return _reduce(
    x,
    disable_positional_args,
    output_shape,
    reduced_dim,
    name,
    "SUM",
    "reduce_sum",
  )


def reduce_mean(
  x: Tensor,
  disable_positional_args=None,
  output_shape=None,
  reduced_dim=None,
  name: Optional[str] = None,
) -> Tensor:
  """The mean of x over the reduced dims.

  Args:
    x: the mtf Tensor to reduce.
    disable_positional_args: must be None: forces output_shape and reduced_dim
      to be passed by keyword.
    output_shape: optional Shape of the result, a subset of x's dims (the others
      are reduced). Give at most one of output_shape and reduced_dim; with
      neither, every dim is reduced (a scalar).
    reduced_dim: a Dimension of x to reduce; the result has all dims of x but
      this one.
    name: an optional name for the operation.

  Returns:
    an mtf Tensor of shape `output_shape`: the mean over the reduced dims, with
    the dtype of x.
  """
  _check_keywords(disable_positional_args, "reduce_mean")
  output_shape = _reduction_output_shape(
    x, output_shape, reduced_dim, "reduce_mean"
  )
  if output_shape == x.shape:
    return x
  total = reduce_sum(x, output_shape=output_shape, name=name or "reduce_mean")
  return total * (output_shape.size / x.shape.size)


def reduce_max(
  x: Tensor,
  disable_positional_args=None,
  output_shape=None,
  reduced_dim=None,
  name: Optional[str] = None,
) -> Tensor:
  """The maximum of x over the reduced dims.

  Args:
    x: the mtf Tensor to reduce.
    disable_positional_args: must be None: forces output_shape and reduced_dim
      to be passed by keyword.
    output_shape: optional Shape of the result, a subset of x's dims (the others
      are reduced). Give at most one of output_shape and reduced_dim; with
      neither, every dim is reduced (a scalar).
    reduced_dim: a Dimension of x to reduce; the result has all dims of x but
      this one.
    name: an optional name for the operation.

  Returns:
    an mtf Tensor of shape `output_shape`: the maximum over the reduced dims,
    with the dtype of x.
  """
  return _reduce(
    x,
    disable_positional_args,
    output_shape,
    reduced_dim,
    name,
    "MAX",
    "reduce_max",
  )


def reduce_min(
  x: Tensor,
  disable_positional_args=None,
  output_shape=None,
  reduced_dim=None,
  name: Optional[str] = None,
) -> Tensor:
  """The minimum of x over the reduced dims.

  Args:
    x: the mtf Tensor to reduce.
    disable_positional_args: must be None: forces output_shape and reduced_dim
      to be passed by keyword.
    output_shape: optional Shape of the result, a subset of x's dims (the others
      are reduced). Give at most one of output_shape and reduced_dim; with
      neither, every dim is reduced (a scalar).
    reduced_dim: a Dimension of x to reduce; the result has all dims of x but
      this one.
    name: an optional name for the operation.

  Returns:
    an mtf Tensor of shape `output_shape`: the minimum over the reduced dims,
    with the dtype of x.
  """
  return _reduce(
    x,
    disable_positional_args,
    output_shape,
    reduced_dim,
    name,
    "MIN",
    "reduce_min",
  )


def reduce_all(
  x: Tensor,
  disable_positional_args=None,
  output_shape=None,
  reduced_dim=None,
  name: Optional[str] = None,
) -> Tensor:
  """The logical and of x over the reduced dims.

  Args:
    x: the mtf Tensor to reduce (boolean).
    disable_positional_args: must be None: forces output_shape and reduced_dim
      to be passed by keyword.
    output_shape: optional Shape of the result, a subset of x's dims (the others
      are reduced). Give at most one of output_shape and reduced_dim; with
      neither, every dim is reduced (a scalar).
    reduced_dim: a Dimension of x to reduce; the result has all dims of x but
      this one.
    name: an optional name for the operation.

  Returns:
    an mtf Tensor of shape `output_shape`: the logical and over the reduced dims
    (boolean).
  """
  _check_keywords(disable_positional_args, "reduce_all")
  return elementwise.cast(
    reduce_min(
      elementwise.to_float(x),
      output_shape=output_shape,
      reduced_dim=reduced_dim,
      name=name,
    ),
    tf.bool,
  )


def reduce_any(
  x: Tensor,
  disable_positional_args=None,
  output_shape=None,
  reduced_dim=None,
  name: Optional[str] = None,
) -> Tensor:
  """The logical or of x over the reduced dims.

  Args:
    x: the mtf Tensor to reduce (boolean).
    disable_positional_args: must be None: forces output_shape and reduced_dim
      to be passed by keyword.
    output_shape: optional Shape of the result, a subset of x's dims (the others
      are reduced). Give at most one of output_shape and reduced_dim; with
      neither, every dim is reduced (a scalar).
    reduced_dim: a Dimension of x to reduce; the result has all dims of x but
      this one.
    name: an optional name for the operation.

  Returns:
    an mtf Tensor of shape `output_shape`: the logical or over the reduced dims
    (boolean).
  """
  _check_keywords(disable_positional_args, "reduce_any")
  return elementwise.cast(
    reduce_max(
      elementwise.to_float(x),
      output_shape=output_shape,
      reduced_dim=reduced_dim,
      name=name,
    ),
    tf.bool,
  )


class BroadcastOperation(Operation):
  """Broadcasts x to a shape containing all its dims; no communication.

  Args:
    x: the mtf Tensor to broadcast.
    output_shape: the Shape of the result; it contains every dim of x.
    name: an optional name for the operation.
  """

  def __init__(
    self, x: Tensor, output_shape: Shape, name: Optional[str] = None
  ):
    super().__init__([x], name=name or "broadcast")
    self._outputs = [Tensor(self, output_shape, x.dtype)]

  def gradient(
    self, grad_ys: Sequence[Optional[Tensor]]
  ) -> Sequence[Optional[Tensor]]:
    return [reduce_sum(grad_ys[0], output_shape=self.inputs[0].shape)]

  def lower(self, lowering) -> None:
    mesh_impl = lowering.mesh_impl(self)
    old_shape = self.inputs[0].shape
    new_shape = self.outputs[0].shape
    slice_shape = mesh_impl.slice_shape(new_shape)
    lowering.set_tensor_lowering(
      self.outputs[0],
      mesh_impl.slicewise_delay_allreduce(
        lambda t: mesh_impl_lib.broadcast_slice(
          t, old_shape, new_shape, slice_shape
        ),
        lowering.tensors[self.inputs[0]],
      ),
    )


def broadcast(x: Tensor, new_shape) -> Tensor:
  """x repeated along the new dims of new_shape (and transposed to its order).

  Args:
    x: an mtf Tensor.
    new_shape: the Shape of the result (or anything convert_to_shape accepts);
      it contains every dim of x.

  Returns:
    an mtf Tensor of shape `new_shape` (x itself if the shapes are equal).
  """
  new_shape = convert_to_shape(new_shape)
  if new_shape == x.shape:
    return x
  for d in x.shape.dims:
    if d not in new_shape.dims:
      raise ValueError(
        "cannot broadcast %s to %s: %s is missing"
        % (x.shape.to_string, new_shape.to_string, d)
      )
  return BroadcastOperation(x, new_shape).outputs[0]


__all__ = [
  "BroadcastOperation",
  "ReduceOperation",
  "broadcast",
  "reduce_all",
  "reduce_any",
  "reduce_max",
  "reduce_mean",
  "reduce_min",
  "reduce_sum",
  "reduction_fn",
]
