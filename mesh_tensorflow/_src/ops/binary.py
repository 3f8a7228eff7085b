"""Differentiable binary arithmetic with named-dimension broadcasting.

add, sub, multiply, divide, minimum, maximum and where, built on the
broadcasting machinery of py. This module also registers the
functions behind Tensor's arithmetic operators (x + y, 1 - x, -x, ...).
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import numpy as np
import tensorflow as tf

from mesh_tensorflow._src import graph_constants
from mesh_tensorflow._src.graph import Operation
from mesh_tensorflow._src.graph import Tensor
from mesh_tensorflow._src.graph import register_tensor_operators
from mesh_tensorflow._src.ops import einsum as einsum_lib
from mesh_tensorflow._src.ops import elementwise
from mesh_tensorflow._src.ops import reduce
from mesh_tensorflow._src.ops.broadcast_binary import BinaryOpWithBroadcasting
from mesh_tensorflow._src.ops.broadcast_binary import (
  binary_arguments_to_tensors,
)
from mesh_tensorflow._src.ops.broadcast_binary import equal
from mesh_tensorflow._src.ops.broadcast_binary import floordiv
from mesh_tensorflow._src.ops.broadcast_binary import (
  infer_binary_broadcast_shape,
)
from mesh_tensorflow._src.ops.broadcast_binary import mod
from mesh_tensorflow._src.shapes import convert_to_shape


class AddOperation(BinaryOpWithBroadcasting):
  """x1 + x2 with broadcasting; lazy sums stay lazy.

  Args:
    x1: an mtf Tensor.
    x2: an mtf Tensor.
    output_shape: the Shape of the sum: the union of the dims of x1 and x2.
    name: an optional name for the operation.
  """

  def __init__(
    self, x1: Tensor, x2: Tensor, output_shape, name: Optional[str] = None
  ):
    super().__init__(tf.add, x1, x2, output_shape, x1.dtype, name=name or "add")

  def gradient(
    self, grad_ys: Sequence[Optional[Tensor]]
  ) -> Sequence[Optional[Tensor]]:
    dy = grad_ys[0]
    return [reduce.reduce_sum(dy, output_shape=x.shape) for x in self.inputs]

  def lower(self, lowering) -> None:
    mesh_impl = lowering.mesh_impl(self)
    x1, x2 = self.inputs
    lowering.set_tensor_lowering(
      self.outputs[0],
      mesh_impl.slicewise_delay_allreduce(
        self._slice_fn(mesh_impl), lowering.tensors[x1], lowering.tensors[x2]
      ),
    )


class MinMaxOperation(BinaryOpWithBroadcasting):
  """minimum/maximum; the gradient goes to every input equal to the output.

  Args:
    tf_fn: tf.minimum or tf.maximum.
    x1: an mtf Tensor.
    x2: an mtf Tensor of the dtype of x1.
    output_shape: the Shape of the result; it contains every dim of x1 and x2.
    name: an optional name for the operation.
  """

  def __init__(
    self,
    tf_fn: Callable,
    x1: Tensor,
    x2: Tensor,
    output_shape,
    name: Optional[str] = None,
  ):
    super().__init__(
      tf_fn, x1, x2, output_shape, x1.dtype, name=name or "min_max"
    )

  def gradient(
    self, grad_ys: Sequence[Optional[Tensor]]
  ) -> Sequence[Optional[Tensor]]:
    dy = grad_ys[0]
    y = self.outputs[0]
    return [
      reduce.reduce_sum(
        dy * elementwise.cast(equal(x, y), dy.dtype), output_shape=x.shape
      )
      for x in self.inputs
    ]


class ScalarAddOperation(Operation):
  """x + a Python scalar.

  Args:
    x: an mtf Tensor.
    scalar: a Python number added to every element.
    name: an optional name for the operation.
  """

  def __init__(self, x: Tensor, scalar, name: Optional[str] = None):
    super().__init__([x], name=name or "scalar_add")
    self._scalar = scalar
    self._outputs = [Tensor(self, x.shape, x.dtype)]

  def gradient(
    self, grad_ys: Sequence[Optional[Tensor]]
  ) -> Sequence[Optional[Tensor]]:
    return grad_ys

  def lower(self, lowering) -> None:
    scalar, dtype = self._scalar, self.outputs[0].dtype
    lowering.set_tensor_lowering(
      self.outputs[0],
      lowering.mesh_impl(self).slicewise(
        lambda t: t + _scalar_constant(scalar, dtype),
        lowering.tensors[self.inputs[0]],
      ),
    )


class ScalarMultiplyOperation(Operation):
  """x * a Python scalar; linear, so lazy sums stay lazy.

  Args:
    x: an mtf Tensor.
    scalar: a Python number multiplying every element.
    name: an optional name for the operation.
  """

  def __init__(self, x: Tensor, scalar, name: Optional[str] = None):
    super().__init__([x], name=name or "scalar_mul")
    self._scalar = scalar
    self._outputs = [Tensor(self, x.shape, x.dtype)]

  def gradient(
    self, grad_ys: Sequence[Optional[Tensor]]
  ) -> Sequence[Optional[Tensor]]:
    return [grad_ys[0] * self._scalar]

  def lower(self, lowering) -> None:
    scalar, dtype = self._scalar, self.outputs[0].dtype
    lowering.set_tensor_lowering(
      self.outputs[0],
      lowering.mesh_impl(self).slicewise_delay_allreduce(
        lambda t: t * _scalar_constant(scalar, dtype),
        lowering.tensors[self.inputs[0]],
      ),
    )


def _scalar_constant(scalar, dtype: tf.DType) -> tf.Tensor:
  """tf.cast(scalar, dtype), shared by the slices of one device if a number."""
  if not isinstance(scalar, (int, float, complex, np.number)):
    return tf.cast(scalar, dtype)
  return graph_constants.shared(
    ("scalar", type(scalar).__name__, repr(scalar), dtype.name),
    lambda: tf.cast(scalar, dtype),
  )


def add(x1, x2, output_shape=None, name: Optional[str] = None) -> Tensor:
  """x1 + x2; a Python scalar operand uses ScalarAddOperation.

  Args:
    x1: an mtf Tensor or a Python scalar.
    x2: an mtf Tensor or a Python scalar.
    output_shape: optional Shape of the result; defaults to the union of the
      input shapes (dims of x1 first, then new dims of x2). It must contain
      every dim of both inputs.
    name: an optional name for the operation.

  Returns:
    an mtf Tensor of shape `output_shape`: x1 + x2 (broadcast).
  """
  if (
    isinstance(x1, Tensor)
    and not isinstance(x2, Tensor)
    and (output_shape is None or convert_to_shape(output_shape) == x1.shape)
  ):
    return ScalarAddOperation(x1, x2, name=name).outputs[0]
  if (
    isinstance(x2, Tensor)
    and not isinstance(x1, Tensor)
    and (output_shape is None or convert_to_shape(output_shape) == x2.shape)
  ):
    return ScalarAddOperation(x2, x1, name=name).outputs[0]
  x1, x2 = binary_arguments_to_tensors(x1, x2)
  return AddOperation(
    x1,
    x2,
    infer_binary_broadcast_shape(x1.shape, x2.shape, output_shape),
    name=name,
  ).outputs[0]


def sub(x1, x2, output_shape=None, name: Optional[str] = None) -> Tensor:
  """x1 - x2, with broadcasting.

  Args:
    x1: an mtf Tensor or a Python scalar.
    x2: an mtf Tensor or a Python scalar.
    output_shape: optional Shape of the result; defaults to the union of the
      input shapes (dims of x1 first, then new dims of x2). It must contain
      every dim of both inputs.
    name: an optional name for the operation.

  Returns:
    an mtf Tensor of shape `output_shape`: x1 - x2.
  """
  if not isinstance(x2, Tensor):
    return add(x1, -x2, output_shape=output_shape, name=name)
  return add(
    x1, elementwise.negative(x2), output_shape=output_shape, name=name or "sub"
  )


def add_n(xs) -> Tensor:
  """The sum of a list of tensors.

  Args:
    xs: a list of mtf Tensors (their shapes are broadcast together).

  Returns:
    an mtf Tensor: xs[0] + xs[1] + ... (0 for an empty list).
  """
  xs = list(xs)
  if not xs:
    return 0
  total = xs[0]
  for x in xs[1:]:
    total = total + x
  return total


def multiply(x1, x2, output_shape=None, name: Optional[str] = None) -> Tensor:
  """x1 * x2: a scalar product, or an einsum to the broadcast shape.

  Args:
    x1: an mtf Tensor or a Python scalar.
    x2: an mtf Tensor or a Python scalar.
    output_shape: optional Shape of the result; defaults to the union of the
      input shapes (dims of x1 first, then new dims of x2). It must contain
      every dim of both inputs.
    name: an optional name for the operation.

  Returns:
    an mtf Tensor of shape `output_shape`: x1 * x2 (broadcast).
  """
  if (
    not isinstance(x2, Tensor)
    and isinstance(x1, Tensor)
    and (output_shape is None or convert_to_shape(output_shape) == x1.shape)
  ):
    return ScalarMultiplyOperation(x1, x2, name=name).outputs[0]
  if (
    not isinstance(x1, Tensor)
    and isinstance(x2, Tensor)
    and (output_shape is None or convert_to_shape(output_shape) == x2.shape)
  ):
    return ScalarMultiplyOperation(x2, x1, name=name).outputs[0]
  x1, x2 = binary_arguments_to_tensors(x1, x2)
  output_shape = infer_binary_broadcast_shape(x1.shape, x2.shape, output_shape)
  return einsum_lib.einsum([x1, x2], output_shape=output_shape, name=name)


def divide(x1, x2, output_shape=None, name: Optional[str] = None) -> Tensor:
  """x1 / x2, with broadcasting.

  Args:
    x1: an mtf Tensor or a Python scalar.
    x2: an mtf Tensor or a Python scalar.
    output_shape: optional Shape of the result; defaults to the union of the
      input shapes (dims of x1 first, then new dims of x2). It must contain
      every dim of both inputs.
    name: an optional name for the operation.

  Returns:
    an mtf Tensor of shape `output_shape`: x1 / x2.
  """
  if not isinstance(x2, Tensor):
    return multiply(x1, 1.0 / x2, output_shape=output_shape, name=name)
  x1, x2 = binary_arguments_to_tensors(x1, x2)
  return multiply(
    x1, elementwise.reciprocal(x2), output_shape=output_shape, name=name
  )


def _min_max(tf_fn, x1, x2, output_shape, name) -> Tensor:
  x1, x2 = binary_arguments_to_tensors(x1, x2)
  output_shape = infer_binary_broadcast_shape(x1.shape, x2.shape, output_shape)
  return MinMaxOperation(tf_fn, x1, x2, output_shape, name=name).outputs[0]


def minimum(x1, x2, output_shape=None, name: Optional[str] = None) -> Tensor:
  """Elementwise minimum of x1 and x2, with broadcasting.

  Args:
    x1: an mtf Tensor or a Python scalar.
    x2: an mtf Tensor or a Python scalar.
    output_shape: optional Shape of the result; defaults to the union of the
      input shapes (dims of x1 first, then new dims of x2). It must contain
      every dim of both inputs.
    name: an optional name for the operation.

  Returns:
    an mtf Tensor of shape `output_shape`; the gradient goes to the smaller
    input.
  """
  return _min_max(tf.minimum, x1, x2, output_shape, name or "minimum")


def maximum(x1, x2, output_shape=None, name: Optional[str] = None) -> Tensor:
  """Elementwise maximum of x1 and x2, with broadcasting.

  Args:
    x1: an mtf Tensor or a Python scalar.
    x2: an mtf Tensor or a Python scalar.
    output_shape: optional Shape of the result; defaults to the union of the
      input shapes (dims of x1 first, then new dims of x2). It must contain
      every dim of both inputs.
    name: an optional name for the operation.

  Returns:
    an mtf Tensor of shape `output_shape`; the gradient goes to the larger
    input.
  """
  return _min_max(tf.maximum, x1, x2, output_shape, name or "maximum")


def where(condition: Tensor, if_true, if_false, output_shape=None) -> Tensor:
  """cond * if_true + (1 - cond) * if_false (NaN/inf in either branch leak).

  Args:
    condition: a boolean mtf Tensor.
    if_true: an mtf Tensor or Python scalar: the value where condition is True.
    if_false: an mtf Tensor or Python scalar: the value where condition is
      False.
    output_shape: optional Shape of the result; defaults to the union of the
      input shapes (dims of x1 first, then new dims of x2). It must contain
      every dim of both inputs.

  Returns:
    an mtf Tensor of shape `output_shape`, with the dtype of `if_true` (of
    `if_false` if `if_true` is a Python scalar).
  """
  dtype = if_true.dtype if isinstance(if_true, Tensor) else if_false.dtype
  cond = elementwise.cast(condition, dtype)
  not_cond = elementwise.cast(elementwise.logical_not(condition), dtype)
  return add(
    multiply(if_true, cond),
    multiply(if_false, not_cond),
    output_shape=output_shape,
  )


register_tensor_operators(
  {
    "add": add,
    "sub": sub,
    "multiply": multiply,
    "divide": divide,
    "floordiv": floordiv,
    "mod": mod,
    "negative": elementwise.negative,
  }
)

__all__ = [
  "AddOperation",
  "MinMaxOperation",
  "ScalarAddOperation",
  "ScalarMultiplyOperation",
  "add",
  "add_n",
  "divide",
  "maximum",
  "minimum",
  "multiply",
  "sub",
  "where",
]
