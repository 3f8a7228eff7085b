"""Reverse-mode differentiation of mtf graphs."""

from __future__ import annotations

from typing import List, Optional, Sequence

import tensorflow as tf

from mesh_tensorflow._src.graph import Operation
from mesh_tensorflow._src.graph import Tensor
from mesh_tensorflow._src.ops import io


def gradients(
  ys: Sequence[Tensor],
  xs: Sequence[Tensor],
  grad_ys=None,
  operations: Optional[Sequence[Operation]] = None,
) -> List[Optional[Tensor]]:
  """d(sum of ys · grad_ys)/d xs; None for xs that do not reach ys.

  Example:
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> x = converter.convert_np_array_to_mtf_tensor(
    ...     [1.0, 2.0, 3.0], ["n"], dtype=tf.float32)
    >>> w = mtf.get_variable(converter.mesh, "w", "n:3",
    ...                      initializer=tf.ones_initializer())
    >>> loss = mtf.reduce_sum(mtf.square(w * x))
    >>> [dw] = mtf.gradients([loss], [w])
    >>> converter.convert_mtf_tensor_to_np_array(dw)  # 2 * w * x**2
    array([ 2.,  8., 18.], dtype=float32)

  Args:
    ys: the mtf Tensors to differentiate (e.g. [loss]).
    xs: the mtf Tensors to differentiate with respect to.
    grad_ys: optional list with the gradient of each of ys; defaults to ones.
    operations: optional list of the operations to go through; defaults to all
      operations of the graph.

  Returns:
    a list with one entry per x: an mtf Tensor shaped like x, or None if x does
    not affect ys.
  """
  ys = list(ys)
  xs = list(xs)
  if not ys:
    raise ValueError("gradients needs at least one y")
  graph = ys[0].graph
  if operations is None:
    operations = graph.operations
  if grad_ys is None:
    grad_ys = [io.ones(y.mesh, y.shape, dtype=y.dtype) for y in ys]
  downstream = set(xs)
  for op in operations:
    if op.has_gradient and any(t in downstream for t in op.inputs):
      downstream.update(op.outputs)
  tensor_to_gradient = {}
  for y, dy in zip(ys, grad_ys):
    _accumulate(tensor_to_gradient, y, dy)
  with tf.compat.v1.variable_scope(graph.captured_variable_scope):
    for op in reversed(list(operations)):
      grad_outputs = [tensor_to_gradient.get(t) for t in op.outputs]
      if (
        not op.has_gradient
        or all(g is None for g in grad_outputs)
        or not any(t in downstream for t in op.inputs)
      ):
        continue
      # A sum of several gradients of one tensor is made in the scope of
      # the gradient that completes it, as the original made it: the order
      # in which TensorFlow's arithmetic optimiser adds up the terms of the
      # sums it merges follows the ops' names, and with it their rounding
      # (in bfloat16, a unit in the last place in about 15% of elements).
      with tf.compat.v1.variable_scope(op.name + "/gradients"):
        input_grads = op.gradient(grad_outputs)
        for t, g in zip(op.inputs, input_grads):
          if g is not None and t in downstream:
            _accumulate(tensor_to_gradient, t, g)
  return [tensor_to_gradient.get(x) for x in xs]


def _accumulate(table, tensor, grad):
  if tensor in table:
    table[tensor] = table[tensor] + grad
  else:
    table[tensor] = grad


__all__ = ["gradients"]
