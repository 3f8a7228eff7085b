"""Elementwise (component-wise) operations; no communication.

The gradients use Tensor's arithmetic operators (dy * y), which binary.py
registers.
"""

from __future__ import annotations

from typing import Optional

import tensorflow as tf

from mesh_tensorflow._src.graph import Operation, Tensor
from mesh_tensorflow._src.ops import broadcast_binary
from mesh_tensorflow._src.ops.slicewise import cwise


def identity(x: Tensor, name: str = "identity") -> Tensor:
  return cwise(tf.identity, [x], name=name, grad_function=lambda op, dy: [dy])


def sin(x: Tensor, name: str = "sin") -> Tensor:
  return cwise(tf.math.sin, [x], name=name,
               grad_function=lambda op, dy: [dy * cos(op.inputs[0])])


def cos(x: Tensor, name: str = "cos") -> Tensor:
  return cwise(tf.math.cos, [x], name=name,
               grad_function=lambda op, dy: [-dy * sin(op.inputs[0])])


def square(x: Tensor, name: str = "square") -> Tensor:
  return cwise(tf.math.square, [x], name=name,
               grad_function=lambda op, dy: [dy * op.inputs[0] * 2.0])


def sqrt(x: Tensor, name: str = "sqrt") -> Tensor:
  return cwise(tf.math.sqrt, [x], name=name,
               grad_function=lambda op, dy: [dy * reciprocal(op.outputs[0]) * 0.5])


def _rsqrt_grad(op, dy):
  y = op.outputs[0]
  return [dy * y * y * y * -0.5]


def rsqrt(x: Tensor, name: str = "rsqrt") -> Tensor:
  return cwise(tf.math.rsqrt, [x], name=name, grad_function=_rsqrt_grad)


def log(x: Tensor, name: str = "log") -> Tensor:
  return cwise(tf.math.log, [x], name=name,
               grad_function=lambda op, dy: [dy * reciprocal(op.inputs[0])])


def exp(x: Tensor, name: str = "exp") -> Tensor:
  return cwise(tf.math.exp, [x], name=name,
               grad_function=lambda op, dy: [dy * op.outputs[0]])


def _sigmoid_grad(op, dy):
  y = op.outputs[0]
  return [dy * y * (1.0 - y)]


def sigmoid(x: Tensor, name: str = "sigmoid") -> Tensor:
  return cwise(tf.math.sigmoid, [x], name=name, grad_function=_sigmoid_grad)


def _tanh_grad(op, dy):
  y = op.outputs[0]
  return [dy * (1.0 - square(y))]


def tanh(x: Tensor, name: str = "tanh") -> Tensor:
  return cwise(tf.math.tanh, [x], name=name, grad_function=_tanh_grad)


def negative(x: Tensor, name: str = "negative") -> Tensor:
  return cwise(tf.math.negative, [x], name=name,
               grad_function=lambda op, dy: [negative(dy)])


def logical_not(x: Tensor, name: str = "logical_not") -> Tensor:
  return cwise(tf.math.logical_not, [x], name=name)


def reciprocal(x: Tensor, name: str = "reciprocal") -> Tensor:
  return cwise(tf.math.reciprocal, [x], name=name,
               grad_function=lambda op, dy: [negative(dy * square(op.outputs[0]))])


def _relu_grad(op, dy):
  # One fused TF op (dy where x > 0, else 0), as tf.nn.relu's own gradient.
  return [cwise(lambda x, g: tf.raw_ops.ReluGrad(gradients=g, features=x),
                [op.inputs[0], dy], name="relu_grad",
                grad_function=lambda grad_op, ddy: [
                    None, _relu_grad(op, ddy)[0]])]


def relu(x: Tensor, name: str = "relu") -> Tensor:
  return cwise(tf.nn.relu, [x], name=name, grad_function=_relu_grad)


def squared_relu(x: Tensor) -> Tensor:
  """relu(x) ** 2 (the activation of "Primer", 2021)."""
  return square(relu(x))


def leaky_relu(x: Tensor, alpha: float = 0.2, name: str = "leaky_relu") -> Tensor:
  def grad_fn(op, dy):
    positive = cast(broadcast_binary.greater(op.inputs[0], 0), dy.dtype)
    return [dy * (positive + (1.0 - positive) * alpha)]
  return cwise(lambda t: tf.nn.leaky_relu(t, alpha=alpha), [x], name=name,
               grad_function=grad_fn)


def sign(x: Tensor, name: str = "sign") -> Tensor:
  return cwise(tf.math.sign, [x], name=name, grad_function=0)


def elu(x: Tensor, *, name: str = "elu") -> Tensor:
  return cwise(tf.nn.elu, [x], name=name)


def selu(x: Tensor, *, name: str = "selu") -> Tensor:
  return cwise(tf.nn.selu, [x], name=name)


def softplus(x: Tensor, *, name: str = "softplus") -> Tensor:
  return cwise(tf.math.softplus, [x], name=name)


def swish(x: Tensor) -> Tensor:
  """x * sigmoid(x)."""
  return x * sigmoid(x)


def gelu(x: Tensor) -> Tensor:
  """Gaussian error linear unit, tanh approximation."""
  cdf = 0.5 * (1.0 + tanh((0.7978845608028654 * (x + 0.044715 * x * x * x))))
  return x * cdf


def mtf_abs(x: Tensor) -> Tensor:
  """|x| as x * sign(x) (gradient: sign(x))."""
  return x * stop_gradient(sign(x))


def mtf_pow(x: Tensor, y) -> Tensor:
  """x ** y as exp(log(x) * y); x must be positive."""
  return exp(log(x) * y)


def cast(x: Tensor, dtype, name: str = "cast") -> Tensor:
  """Casts to dtype; the gradient is cast back to x's dtype."""
  dtype = tf.as_dtype(dtype)
  if x.dtype == dtype:
    return x
  return cwise(lambda t: tf.cast(t, dtype), [x], output_dtype=dtype, name=name,
               grad_function=lambda op, dy: [cast(dy, op.inputs[0].dtype)])


def to_float(x: Tensor, name: str = "to_float") -> Tensor:
  return cast(x, tf.float32, name=name)


def to_bfloat16(x: Tensor, name: str = "to_bfloat16") -> Tensor:
  return cast(x, tf.bfloat16, name=name)


def to_int32(x: Tensor, name: str = "to_int32") -> Tensor:
  return cast(x, tf.int32, name=name)


class StopGradient(Operation):
  """Identity with no gradient."""

  def __init__(self, x: Tensor, name: Optional[str] = None):
    super().__init__([x], name=name or "stop_gradient")
    self._outputs = [Tensor(self, x.shape, x.dtype)]

  @property
  def has_gradient(self) -> bool:
    return False

  def lower(self, lowering):
    lowering.set_tensor_lowering(self.outputs[0],
                                 lowering.tensors[self.inputs[0]])


def stop_gradient(x: Tensor) -> Tensor:
  return StopGradient(x).outputs[0]


__all__ = [
    "StopGradient", "cast", "cos", "elu", "exp", "gelu", "identity",
    "leaky_relu", "log", "logical_not", "mtf_abs", "mtf_pow", "negative",
    "reciprocal", "relu", "rsqrt", "selu", "sigmoid", "sign", "sin", "softplus",
    "sqrt", "square", "squared_relu", "stop_gradient", "swish", "tanh",
    "to_bfloat16", "to_float", "to_int32",
]
