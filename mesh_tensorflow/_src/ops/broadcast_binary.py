"""Binary operations with named-dimension broadcasting: the common machinery.

The output shape inference, the conversion of a Python scalar operand, the
BinaryOpWithBroadcasting operation, and the binary operations without a
gradient (comparisons, logical and/or, floordiv, mod). The differentiable
arithmetic built on them is in binary.py.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import tensorflow as tf

from mesh_tensorflow._src import graph_constants
from mesh_tensorflow._src import mesh_impl as mesh_impl_lib
from mesh_tensorflow._src.graph import Operation
from mesh_tensorflow._src.graph import Tensor
from mesh_tensorflow._src.ops import io
from mesh_tensorflow._src.shapes import Shape
from mesh_tensorflow._src.shapes import convert_to_shape
from mesh_tensorflow._src.shapes import is_subsequence
from mesh_tensorflow._src.shapes import names_with_several_sizes


def infer_binary_broadcast_shape(
  shape1: Shape, shape2: Shape, given_output_shape=None
) -> Shape:
  """Output shape of a broadcasting binary op.

  Example:
    >>> a, b, c = [mtf.Dimension(n, s) for n, s in zip("abc", [2, 3, 4])]
    >>> infer_binary_broadcast_shape(mtf.Shape([a, b]), mtf.Shape([b, c]))
    Shape[a=2, b=3, c=4]
    >>> infer_binary_broadcast_shape(mtf.Shape([b]), mtf.Shape([a, b]))
    Shape[a=2, b=3]

  Args:
    shape1: the first operand's Shape.
    shape2: the second operand's Shape.
    given_output_shape: an explicit output shape, or None.

  Returns:
    The given shape if any; else the longer shape if the other is a
    subsequence of it; else shape1's dims followed by shape2's new ones.

  Raises:
    ValueError: if the shapes give one name two sizes (and neither shape
      has that name twice itself).
  """
  if given_output_shape is not None:
    return convert_to_shape(given_output_shape)
  if is_subsequence(shape1.dims, shape2.dims):
    return shape2
  if is_subsequence(shape2.dims, shape1.dims):
    return shape1
  several_sizes = names_with_several_sizes([shape1, shape2])
  first_sizes = {d.name: d.size for d in shape1.dims}
  for d in shape2.dims:
    size = first_sizes.get(d.name, d.size)
    if size != d.size and d.name not in several_sizes:
      raise ValueError(
        "dimension %r has size %d in %s and %d in %s: cannot broadcast"
        % (d.name, size, shape1.to_string, d.size, shape2.to_string)
      )
  return Shape(shape1.dims + [d for d in shape2.dims if d not in shape1.dims])


def _check_broadcastable(inputs, output_shape: Shape, op_name: str) -> None:
  for x in inputs:
    for d in x.shape.dims:
      if d not in output_shape.dims:
        raise ValueError(
          "%s: input dimension %s of %s is not in the output shape %s"
          % (op_name, d, x.shape.to_string, output_shape.to_string)
        )


def binary_arguments_to_tensors(x1, x2) -> tuple[Tensor, Tensor]:
  """Converts a Python scalar argument to a 0-d Tensor of the other's dtype.

  Args:
    x1: an mtf Tensor or a Python scalar.
    x2: an mtf Tensor or a Python scalar.

  Returns:
    (x1, x2) as mtf Tensors; a Python scalar becomes a scalar Tensor on the
    other's mesh with its dtype.

  Raises:
    ValueError: if neither argument is an mtf Tensor, or their dtypes differ.
  """
  if not isinstance(x1, Tensor) and not isinstance(x2, Tensor):
    raise ValueError(
      "at least one of %r and %r must be an mtf Tensor" % (x1, x2)
    )
  if not isinstance(x1, Tensor):
    x1 = io.constant(x2.mesh, x1, shape=[], dtype=x2.dtype)
  elif not isinstance(x2, Tensor):
    x2 = io.constant(x1.mesh, x2, shape=[], dtype=x1.dtype)
  if x1.dtype != x2.dtype:
    raise ValueError(
      "binary operands have different dtypes: %s is %s, %s is %s"
      % (x1.name, x1.dtype.name, x2.name, x2.dtype.name)
    )
  return x1, x2


def expand_slice(x: tf.Tensor, old_shape: Shape, new_shape: Shape) -> tf.Tensor:
  """Transposes a slice to new_shape's dim order, with size-1 missing dims."""
  old_names = old_shape.dimension_names
  new_names = new_shape.dimension_names
  perm = [old_names.index(n) for n in new_names if n in old_names]
  if perm != sorted(perm):
    x = tf.transpose(x, perm)
  if len(perm) < len(new_names):
    sizes = iter(x.shape.as_list())
    x = graph_constants.reshape(
      x, [next(sizes) if n in old_names else 1 for n in new_names]
    )
  return x


class BinaryOpWithBroadcasting(Operation):
  """tf_fn(x1, x2) after aligning both slices to the output's dimensions.

  Args:
    tf_fn: a TF function of two tf.Tensors (e.g. tf.math.floormod).
    x1: an mtf Tensor.
    x2: an mtf Tensor.
    output_shape: the Shape of the result; it contains every dim of x1 and x2.
    output_dtype: the tf.DType of the result.
    name: an optional name for the operation.
  """

  def __init__(
    self,
    tf_fn: Callable,
    x1: Tensor,
    x2: Tensor,
    output_shape,
    output_dtype,
    name: Optional[str] = None,
  ):
    super().__init__([x1, x2], name=name or "binary_op")
    output_shape = convert_to_shape(output_shape)
    _check_broadcastable([x1, x2], output_shape, type(self).__name__)
    self._tf_fn = tf_fn
    self._outputs = [Tensor(self, output_shape, output_dtype)]

  def gradient(
    self, unused_grad_ys: Sequence[Optional[Tensor]]
  ) -> Sequence[Optional[Tensor]]:
    raise ValueError(
      "%s (%s) has no gradient" % (type(self).__name__, self.name)
    )

  def _slice_fn(self, mesh_impl) -> Callable:
    """tf_fn of two slices aligned to the output slice's dims.

    Missing dims become size 1 and tf_fn broadcasts them, so no broadcast
    operand is materialised; only if some output dim is in neither input is
    the first operand broadcast to the full slice shape.
    """
    x1, x2 = self.inputs
    out_shape = self.outputs[0].shape
    covered = set(x1.shape.dimension_names) | set(x2.shape.dimension_names)
    if covered >= set(out_shape.dimension_names):
      align_first = expand_slice
    else:
      slice_shape = mesh_impl.slice_shape(out_shape)

      def align_first(t, old, new):
        return mesh_impl_lib.broadcast_slice(t, old, new, slice_shape)

    tf_fn = self._tf_fn

    def fn(a, b):
      return tf_fn(
        align_first(a, x1.shape, out_shape),
        expand_slice(b, x2.shape, out_shape),
      )

    return fn

  def lower(self, lowering) -> None:
    mesh_impl = lowering.mesh_impl(self)
    x1, x2 = self.inputs
    lowering.set_tensor_lowering(
      self.outputs[0],
      mesh_impl.slicewise(
        self._slice_fn(mesh_impl), lowering.tensors[x1], lowering.tensors[x2]
      ),
    )


def binary_op_with_broadcasting(
  tf_fn: Callable, x1, x2, output_shape=None, output_dtype=None
) -> Tensor:
  """tf_fn(x1, x2) with the inputs broadcast to output_shape.

  Args:
    tf_fn: a TF function of two tf.Tensors, applied to corresponding slices (no
      gradient).
    x1: an mtf Tensor or a Python scalar.
    x2: an mtf Tensor or a Python scalar.
    output_shape: optional Shape of the result; defaults to the union of the
      input shapes (dims of x1 first, then new dims of x2). It must contain
      every dim of both inputs.
    output_dtype: the tf.DType of the result; defaults to the dtype of x1.

  Returns:
    an mtf Tensor of shape `output_shape`.
  """
  x1, x2 = binary_arguments_to_tensors(x1, x2)
  output_shape = infer_binary_broadcast_shape(x1.shape, x2.shape, output_shape)
  return BinaryOpWithBroadcasting(
    tf_fn, x1, x2, output_shape, output_dtype or x1.dtype
  ).outputs[0]


def _comparison(tf_fn: Callable) -> Callable[..., Tensor]:
  def op(x1, x2, output_shape=None) -> Tensor:
    return binary_op_with_broadcasting(
      tf_fn, x1, x2, output_shape=output_shape, output_dtype=tf.bool
    )

  op.__name__ = tf_fn.__name__
  op.__doc__ = (
    """Elementwise %s with broadcasting; tf.bool result, no gradient.

  Args:
    x1: an mtf Tensor or a Python scalar.
    x2: an mtf Tensor or a Python scalar.
    output_shape: optional Shape of the result; defaults to the union of the
      input shapes.

  Returns:
    a boolean mtf Tensor of shape `output_shape`.
  """
    % tf_fn.__name__
  )
  return op


less = _comparison(tf.math.less)
greater = _comparison(tf.math.greater)
less_equal = _comparison(tf.math.less_equal)
greater_equal = _comparison(tf.math.greater_equal)
equal = _comparison(tf.math.equal)
not_equal = _comparison(tf.math.not_equal)
logical_and = _comparison(tf.math.logical_and)
logical_or = _comparison(tf.math.logical_or)


def floordiv(x1, x2, output_shape=None) -> Tensor:
  """Elementwise floor(x1 / x2), with broadcasting (no gradient).

  Args:
    x1: an mtf Tensor or a Python scalar.
    x2: an mtf Tensor or a Python scalar.
    output_shape: optional Shape of the result; defaults to the union of the
      input shapes (dims of x1 first, then new dims of x2). It must contain
      every dim of both inputs.

  Returns:
    an mtf Tensor of shape `output_shape`.
  """
  dtype = x1.dtype if isinstance(x1, Tensor) else x2.dtype
  return binary_op_with_broadcasting(
    tf.math.floordiv, x1, x2, output_shape=output_shape, output_dtype=dtype
  )


def mod(x1, x2, output_shape=None) -> Tensor:
  """Elementwise x1 mod x2 (floor modulo), with broadcasting (no gradient).

  Args:
    x1: an mtf Tensor or a Python scalar.
    x2: an mtf Tensor or a Python scalar.
    output_shape: optional Shape of the result; defaults to the union of the
      input shapes (dims of x1 first, then new dims of x2). It must contain
      every dim of both inputs.

  Returns:
    an mtf Tensor of shape `output_shape`.
  """
  dtype = x1.dtype if isinstance(x1, Tensor) else x2.dtype
  return binary_op_with_broadcasting(
    tf.math.floormod, x1, x2, output_shape=output_shape, output_dtype=dtype
  )


__all__ = [
  "BinaryOpWithBroadcasting",
  "binary_arguments_to_tensors",
  "binary_op_with_broadcasting",
  "equal",
  "floordiv",
  "greater",
  "greater_equal",
  "less",
  "less_equal",
  "logical_and",
  "logical_or",
  "mod",
  "not_equal",
]
