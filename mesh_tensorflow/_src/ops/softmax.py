"""Softmax and log-sum-exp over a named dimension."""

from __future__ import annotations

from typing import Optional, Sequence

import tensorflow as tf

from mesh_tensorflow._src import graph_constants
from mesh_tensorflow._src.graph import Operation
from mesh_tensorflow._src.graph import Tensor
from mesh_tensorflow._src.ops import binary
from mesh_tensorflow._src.ops import einsum as einsum_lib
from mesh_tensorflow._src.ops import elementwise
from mesh_tensorflow._src.ops import reduce
from mesh_tensorflow._src.shapes import convert_to_dimension


def reduce_logsumexp(
  x: Tensor, reduced_dim, extra_logit=None, name: Optional[str] = None
) -> Tensor:
  """log(sum(exp(x))) over reduced_dim, computed stably.

  extra_logit acts as one more logit of that value in the sum.

  Args:
    x: a floating mtf Tensor.
    reduced_dim: the Dimension of x to normalise over.
    extra_logit: optional Python float or scalar mtf Tensor: one more logit with
      this value, included in the normaliser.
    name: an optional name for the operation.

  Returns:
    an mtf Tensor with the dims of x but reduced_dim.
  """
  del name
  reduced_shape = x.shape - reduced_dim
  max_logit = reduce.reduce_max(
    elementwise.stop_gradient(x), output_shape=reduced_shape
  )
  if extra_logit is not None:
    if isinstance(extra_logit, Tensor):
      extra_logit = elementwise.stop_gradient(extra_logit)
    max_logit = binary.maximum(max_logit, extra_logit)
  total = reduce.reduce_sum(
    elementwise.exp(x - max_logit), output_shape=reduced_shape
  )
  if extra_logit is not None:
    total += elementwise.exp(extra_logit - max_logit)
  return elementwise.log(total) + max_logit


def log_softmax(
  x: Tensor, reduced_dim, extra_logit=None, name: Optional[str] = None
) -> Tensor:
  """x - reduce_logsumexp(x, reduced_dim): log-probabilities along reduced_dim.

  Args:
    x: a floating mtf Tensor of logits.
    reduced_dim: the Dimension of x to normalise over.
    extra_logit: optional Python float or scalar mtf Tensor: one more logit with
      this value, included in the normaliser.
    name: an optional name for the operation.

  Returns:
    an mtf Tensor with the shape and dtype of x.
  """
  del name
  return x - reduce_logsumexp(x, reduced_dim, extra_logit=extra_logit)


class SoftmaxOperation(Operation):
  """exp(x) / sum(exp(x)) over reduced_dim as one operation.

  Lowers to tf.nn.softmax per slice when reduced_dim is the last dim and not
  split (one fused kernel and one output buffer, where exp(log_softmax(x))
  took eight elementwise ops and as many temporaries), else to the max, exp
  and sum of each slice, with a MAX and a SUM allreduce if reduced_dim is
  split. The gradient is y * (dy - sum(dy * y)).

  Args:
    x: a floating mtf Tensor of logits.
    reduced_dim: the Dimension of x to normalise over.
    name: an optional name for the operation.
  """

  def __init__(self, x: Tensor, reduced_dim, name: Optional[str] = None):
    super().__init__([x], name=name or "softmax")
    self._reduced_dim = reduced_dim
    self._outputs = [Tensor(self, x.shape, x.dtype)]

  def gradient(
    self, grad_ys: Sequence[Optional[Tensor]]
  ) -> Sequence[Optional[Tensor]]:
    dy = grad_ys[0]
    y = self.outputs[0]
    dot = einsum_lib.einsum([dy, y], output_shape=y.shape - self._reduced_dim)
    return [(dy - dot) * y]

  def lower(self, lowering) -> None:
    mesh_impl = lowering.mesh_impl(self)
    x = self.inputs[0]
    axis = x.shape.dims.index(self._reduced_dim)
    mesh_axis = mesh_impl.tensor_dimension_to_mesh_axis(self._reduced_dim)
    mesh_axes = [] if mesh_axis is None else [mesh_axis]
    laid_out_x = lowering.tensors[x]
    if not mesh_axes and axis == x.shape.ndims - 1:
      y = mesh_impl.slicewise(_softmax_last_axis, laid_out_x)
    else:
      # tf.nn.softmax would transpose a slice whose axis is not the last.
      if mesh_axes:
        lowering.add_counter(
          "allreduce/%s/softmax_op" % mesh_axes,
          2 * mesh_impl.laid_out_size(x.shape - self._reduced_dim),
        )
      max_x = mesh_impl.allreduce(
        mesh_impl.slicewise(
          lambda t: tf.reduce_max(t, axis=axis, keepdims=True), laid_out_x
        ),
        mesh_axes,
        "MAX",
      )
      exp_x = mesh_impl.slicewise(lambda t, m: tf.exp(t - m), laid_out_x, max_x)
      sum_exp = mesh_impl.allreduce(
        mesh_impl.slicewise(
          lambda e: tf.reduce_sum(e, axis=axis, keepdims=True), exp_x
        ),
        mesh_axes,
        "SUM",
      )
      y = mesh_impl.slicewise(lambda e, total: e / total, exp_x, sum_exp)
    lowering.set_tensor_lowering(self.outputs[0], y)


def _softmax_last_axis(t: tf.Tensor) -> tf.Tensor:
  """tf.nn.softmax over the last axis of a slice of any rank.

  The slice is viewed as a matrix first: TF's oneDNN CPU softmax kernel
  rejects inputs of more than 5 dims ("Input dims must be <= 5").
  """
  if t.shape.ndims <= 2:
    return tf.nn.softmax(t)
  shape = t.shape.as_list()
  rows = graph_constants.reshape(t, [-1, shape[-1]])
  return graph_constants.reshape(tf.nn.softmax(rows), shape)


def softmax(
  x: Tensor, reduced_dim, extra_logit=None, name: Optional[str] = None
) -> Tensor:
  """exp(x) / sum(exp(x)) over reduced_dim (plus exp(extra_logit) if given).

  Example:
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> logits = converter.convert_np_array_to_mtf_tensor(
    ...     [0, 0, np.log(2)], ["memory_length"], dtype=tf.float32)
    >>> weights = mtf.softmax(logits, logits.shape.dims[0])  # logits' shape
    >>> converter.convert_mtf_tensor_to_np_array(weights)
    array([0.25, 0.25, 0.5 ], dtype=float32)

  Args:
    x: a floating mtf Tensor of logits.
    reduced_dim: the Dimension of x to normalise over.
    extra_logit: optional Python float or scalar mtf Tensor: one more logit with
      this value, included in the normaliser.
    name: an optional name for the operation.

  Returns:
    an mtf Tensor with the shape and dtype of x; it sums to 1 along reduced_dim
    (less with extra_logit).
  """
  if extra_logit is not None or x.dtype != tf.float32:
    # Outside float32 (bfloat16 activations) the fused kernel rounds its
    # result and gradient differently from exp(log_softmax(x)), the original's
    # op sequence, by several ulps; there the original's sequence is kept.
    return elementwise.exp(log_softmax(x, reduced_dim, extra_logit=extra_logit))
  reduced_dim = convert_to_dimension(reduced_dim)
  if reduced_dim not in x.shape.dims:
    raise ValueError(
      "softmax: reduced_dim %s is not in %s" % (reduced_dim, x.shape.to_string)
    )
  return SoftmaxOperation(x, reduced_dim, name=name).outputs[0]


__all__ = ["SoftmaxOperation", "log_softmax", "reduce_logsumexp", "softmax"]
