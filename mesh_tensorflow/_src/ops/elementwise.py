"""Elementwise (component-wise) operations; no communication.

The gradients use Tensor's arithmetic operators (dy * y), which binary.py
registers.
"""

from __future__ import annotations

from typing import Optional

import tensorflow as tf

from mesh_tensorflow._src.graph import Operation
from mesh_tensorflow._src.graph import Tensor
from mesh_tensorflow._src.ops import broadcast_binary
from mesh_tensorflow._src.ops.slicewise import cwise


def identity(x: Tensor, name: str = "identity") -> Tensor:
  """x, unchanged (with gradient dy).

  Args:
    x: a floating or integer mtf Tensor.
    name: an optional name for the operation.

  Returns:
    an mtf Tensor with the shape and dtype of `x`.
  """
  return cwise(tf.identity, [x], name=name, grad_function=lambda op, dy: [dy])


def sin(x: Tensor, name: str = "sin") -> Tensor:
  """Elementwise sine.

  Args:
    x: a floating mtf Tensor.
    name: an optional name for the operation.

  Returns:
    an mtf Tensor with the shape and dtype of `x`.
  """
  return cwise(
    tf.math.sin,
    [x],
    name=name,
    grad_function=lambda op, dy: [dy * cos(op.inputs[0])],
  )


def cos(x: Tensor, name: str = "cos") -> Tensor:
  """Elementwise cosine.

  Args:
    x: a floating mtf Tensor.
    name: an optional name for the operation.

  Returns:
    an mtf Tensor with the shape and dtype of `x`.
  """
  return cwise(
    tf.math.cos,
    [x],
    name=name,
    grad_function=lambda op, dy: [-dy * sin(op.inputs[0])],
  )


def square(x: Tensor, name: str = "square") -> Tensor:
  """Elementwise x * x.

  Args:
    x: a floating mtf Tensor.
    name: an optional name for the operation.

  Returns:
    an mtf Tensor with the shape and dtype of `x`.
  """
  return cwise(
    tf.math.square,
    [x],
    name=name,
    grad_function=lambda op, dy: [dy * op.inputs[0] * 2.0],
  )


def sqrt(x: Tensor, name: str = "sqrt") -> Tensor:
  """Elementwise square root; x must be non-negative.

  Args:
    x: a floating mtf Tensor.
    name: an optional name for the operation.

  Returns:
    an mtf Tensor with the shape and dtype of `x`.
  """
  return cwise(
    tf.math.sqrt,
    [x],
    name=name,
    grad_function=lambda op, dy: [dy * 0.5 / op.outputs[0]],
  )


def _rsqrt_grad(op, dy):
  y = op.outputs[0]
  return [dy * y * y * y * -0.5]


def rsqrt(x: Tensor, name: str = "rsqrt") -> Tensor:
  """Elementwise 1 / sqrt(x); x must be positive.

  Args:
    x: a floating mtf Tensor.
    name: an optional name for the operation.

  Returns:
    an mtf Tensor with the shape and dtype of `x`.
  """
  return cwise(tf.math.rsqrt, [x], name=name, grad_function=_rsqrt_grad)


def log(x: Tensor, name: str = "log") -> Tensor:
  """Elementwise natural logarithm; x must be positive.

  Args:
    x: a floating mtf Tensor.
    name: an optional name for the operation.

  Returns:
    an mtf Tensor with the shape and dtype of `x`.
  """
  return cwise(
    tf.math.log,
    [x],
    name=name,
    grad_function=lambda op, dy: [dy / op.inputs[0]],
  )


def exp(x: Tensor, name: str = "exp") -> Tensor:
  """Elementwise exponential.

  Args:
    x: a floating mtf Tensor.
    name: an optional name for the operation.

  Returns:
    an mtf Tensor with the shape and dtype of `x`.
  """
  return cwise(
    tf.math.exp,
    [x],
    name=name,
    grad_function=lambda op, dy: [dy * op.outputs[0]],
  )


def _sigmoid_grad(op, dy):
  # (y * (1 - y)) * dy: the original's association (bfloat16 rounds it).
  y = op.outputs[0]
  return [y * (1.0 - y) * dy]


def sigmoid(x: Tensor, name: str = "sigmoid") -> Tensor:
  """Elementwise logistic sigmoid 1 / (1 + exp(-x)).

  Args:
    x: a floating mtf Tensor.
    name: an optional name for the operation.

  Returns:
    an mtf Tensor with the shape and dtype of `x`.
  """
  return cwise(tf.math.sigmoid, [x], name=name, grad_function=_sigmoid_grad)


def _tanh_grad(op, dy):
  y = op.outputs[0]
  return [dy * (1.0 - square(y))]


def tanh(x: Tensor, name: str = "tanh") -> Tensor:
  """Elementwise hyperbolic tangent.

  Args:
    x: a floating mtf Tensor.
    name: an optional name for the operation.

  Returns:
    an mtf Tensor with the shape and dtype of `x`.
  """
  return cwise(tf.math.tanh, [x], name=name, grad_function=_tanh_grad)


def negative(x: Tensor, name: str = "negative") -> Tensor:
  """Elementwise -x.

  Args:
    x: a floating or integer mtf Tensor.
    name: an optional name for the operation.

  Returns:
    an mtf Tensor with the shape and dtype of `x`.
  """
  return cwise(
    tf.math.negative,
    [x],
    name=name,
    grad_function=lambda op, dy: [negative(dy)],
  )


def logical_not(x: Tensor, name: str = "logical_not") -> Tensor:
  """Elementwise logical negation (no gradient).

  Args:
    x: a boolean mtf Tensor.
    name: an optional name for the operation.

  Returns:
    an mtf Tensor with the shape and dtype of `x`.
  """
  return cwise(tf.math.logical_not, [x], name=name)


def reciprocal(x: Tensor, name: str = "reciprocal") -> Tensor:
  """Elementwise 1 / x.

  Args:
    x: a floating mtf Tensor.
    name: an optional name for the operation.

  Returns:
    an mtf Tensor with the shape and dtype of `x`.
  """
  return cwise(
    tf.math.reciprocal,
    [x],
    name=name,
    grad_function=lambda op, dy: [negative(dy * square(op.outputs[0]))],
  )


def _relu_grad(op, dy):
  # One fused TF op (dy where x > 0, else 0), as tf.nn.relu's own gradient.
  return [
    cwise(
      lambda x, g: tf.raw_ops.ReluGrad(gradients=g, features=x),
      [op.inputs[0], dy],
      name="relu_grad",
      grad_function=lambda grad_op, ddy: [None, _relu_grad(op, ddy)[0]],
    )
  ]


def relu(x: Tensor, name: str = "relu") -> Tensor:
  """Elementwise max(x, 0).

  Args:
    x: a floating mtf Tensor.
    name: an optional name for the operation.

  Returns:
    an mtf Tensor with the shape and dtype of `x`.
  """
  return cwise(tf.nn.relu, [x], name=name, grad_function=_relu_grad)


def squared_relu(x: Tensor) -> Tensor:
  """relu(x) ** 2 (the activation of "Primer", 2021).

  Args:
    x: a floating mtf Tensor.

  Returns:
    an mtf Tensor with the shape and dtype of `x`.
  """
  return square(relu(x))


def leaky_relu(
  x: Tensor, alpha: float = 0.2, name: str = "leaky_relu"
) -> Tensor:
  """Elementwise x if x > 0 else alpha * x.

  Args:
    x: a floating mtf Tensor.
    alpha: the slope for negative x.
    name: an optional name for the operation.

  Returns:
    an mtf Tensor with the shape and dtype of `x`.
  """

  def grad_fn(op, dy):
    positive = cast(broadcast_binary.greater(op.inputs[0], 0), dy.dtype)
    return [dy * (positive + (1.0 - positive) * alpha)]

  return cwise(
    lambda t: tf.nn.leaky_relu(t, alpha=alpha),
    [x],
    name=name,
    grad_function=grad_fn,
  )


def sign(x: Tensor, name: str = "sign") -> Tensor:
  """Elementwise sign: -1, 0 or 1 (zero gradient).

  Args:
    x: a floating or integer mtf Tensor.
    name: an optional name for the operation.

  Returns:
    an mtf Tensor with the shape and dtype of `x`.
  """
  return cwise(tf.math.sign, [x], name=name, grad_function=0)


def elu(x: Tensor, *, name: str = "elu") -> Tensor:
  """Elementwise exponential linear unit (no gradient defined).

  Args:
    x: a floating mtf Tensor.
    name: an optional name for the operation.

  Returns:
    an mtf Tensor with the shape and dtype of `x`.
  """
  return cwise(tf.nn.elu, [x], name=name)


def selu(x: Tensor, *, name: str = "selu") -> Tensor:
  """Elementwise scaled exponential linear unit (no gradient defined).

  Args:
    x: a floating mtf Tensor.
    name: an optional name for the operation.

  Returns:
    an mtf Tensor with the shape and dtype of `x`.
  """
  return cwise(tf.nn.selu, [x], name=name)


def softplus(x: Tensor, *, name: str = "softplus") -> Tensor:
  """Elementwise log(1 + exp(x)) (no gradient defined).

  Args:
    x: a floating mtf Tensor.
    name: an optional name for the operation.

  Returns:
    an mtf Tensor with the shape and dtype of `x`.
  """
  return cwise(tf.math.softplus, [x], name=name)


def swish(x: Tensor) -> Tensor:
  """x * sigmoid(x).

  Args:
    x: a floating mtf Tensor.

  Returns:
    an mtf Tensor with the shape and dtype of `x`.
  """
  return x * sigmoid(x)


def gelu(x: Tensor) -> Tensor:
  """Gaussian error linear unit, tanh approximation.

  Args:
    x: a floating mtf Tensor.

  Returns:
    an mtf Tensor with the shape and dtype of `x`.
  """
  cdf = 0.5 * (1.0 + tanh((0.7978845608028654 * (x + 0.044715 * x * x * x))))
  return x * cdf


def mtf_abs(x: Tensor) -> Tensor:
  """|x| as x * sign(x) (gradient: sign(x)).

  Args:
    x: a floating mtf Tensor.

  Returns:
    an mtf Tensor with the shape and dtype of `x`: |x|.
  """
  return x * stop_gradient(sign(x))


def mtf_pow(x: Tensor, y) -> Tensor:
  """x ** y as exp(log(x) * y); x must be positive.

  Args:
    x: a floating mtf Tensor with positive values.
    y: the exponent: an mtf Tensor or a Python scalar.

  Returns:
    an mtf Tensor: x ** y, its shape the union of the shapes of `x` and `y`.
  """
  return exp(log(x) * y)


def cast(x: Tensor, dtype, name: str = "cast") -> Tensor:
  """Casts to dtype; the gradient is cast back to x's dtype.

  Args:
    x: an mtf Tensor.
    dtype: the tf.DType to cast to.
    name: an optional name for the operation.

  Returns:
    an mtf Tensor with the shape of `x` and dtype `dtype` (`x` itself if it
    already has that dtype).
  """
  dtype = tf.as_dtype(dtype)
  if x.dtype == dtype:
    return x
  return cwise(
    lambda t: tf.cast(t, dtype),
    [x],
    output_dtype=dtype,
    name=name,
    grad_function=lambda op, dy: [cast(dy, op.inputs[0].dtype)],
  )


def to_float(x: Tensor, name: str = "to_float") -> Tensor:
  """Casts x to tf.float32 (see cast).

  Args:
    x: an mtf Tensor.
    name: an optional name for the operation.

  Returns:
    an mtf Tensor with the shape of `x` and dtype tf.float32.
  """
  return cast(x, tf.float32, name=name)


def to_bfloat16(x: Tensor, name: str = "to_bfloat16") -> Tensor:
  """Casts x to tf.bfloat16 (see cast).

  Args:
    x: an mtf Tensor.
    name: an optional name for the operation.

  Returns:
    an mtf Tensor with the shape of `x` and dtype tf.bfloat16.
  """
  return cast(x, tf.bfloat16, name=name)


def to_int32(x: Tensor, name: str = "to_int32") -> Tensor:
  """Casts x to tf.int32 (see cast).

  Args:
    x: an mtf Tensor.
    name: an optional name for the operation.

  Returns:
    an mtf Tensor with the shape of `x` and dtype tf.int32.
  """
  return cast(x, tf.int32, name=name)


class StopGradient(Operation):
  """Identity with no gradient.

  Args:
    x: the mtf Tensor to pass through.
    name: an optional name for the operation.
  """

  def __init__(self, x: Tensor, name: Optional[str] = None):
    super().__init__([x], name=name or "stop_gradient")
    self._outputs = [Tensor(self, x.shape, x.dtype)]

  @property
  def has_gradient(self) -> bool:
    return False

  def lower(self, lowering) -> None:
    lowering.set_tensor_lowering(
      self.outputs[0], lowering.tensors[self.inputs[0]]
    )


def stop_gradient(x: Tensor) -> Tensor:
  """x, as a tensor through which no gradient flows.

  Args:
    x: an mtf Tensor.

  Returns:
    an mtf Tensor equal to `x`; gradients with respect to it are not propagated
    to `x`.
  """
  return StopGradient(x).outputs[0]


__all__ = [
  "StopGradient",
  "cast",
  "cos",
  "elu",
  "exp",
  "gelu",
  "identity",
  "leaky_relu",
  "log",
  "logical_not",
  "mtf_abs",
  "mtf_pow",
  "negative",
  "reciprocal",
  "relu",
  "rsqrt",
  "selu",
  "sigmoid",
  "sign",
  "sin",
  "softplus",
  "sqrt",
  "square",
  "squared_relu",
  "stop_gradient",
  "swish",
  "tanh",
  "to_bfloat16",
  "to_float",
  "to_int32",
]
