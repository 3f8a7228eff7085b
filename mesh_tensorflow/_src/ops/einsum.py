"""einsum, matmul and transpose over named dimensions.

A contracted dimension that is split produces partial sums on each processor;
the result is a LazyAllreduceSum so later additions happen before the single
allreduce.
"""

from __future__ import annotations

import string
from typing import Dict, List, Optional, Sequence

import tensorflow as tf

from mesh_tensorflow._src import mesh_impl as mesh_impl_lib
from mesh_tensorflow._src.graph import Operation
from mesh_tensorflow._src.graph import Tensor
from mesh_tensorflow._src.laid_out import LazyAllreduceSum
from mesh_tensorflow._src.shapes import Dimension
from mesh_tensorflow._src.shapes import Shape
from mesh_tensorflow._src.shapes import convert_to_shape
from mesh_tensorflow._src.shapes import names_with_several_sizes


def _union_dim_list(
  shapes: Sequence[Shape],
  descriptions: Optional[Sequence[str]] = None,
  output_shape: Optional[Shape] = None,
) -> List[Dimension]:
  """Dimensions of all shapes in order of first appearance (sizes checked).

  Dimensions are told apart by name and size, as in the original. A name
  with two sizes is an error (a likely mistake) unless an input or
  output_shape itself has dimensions of both sizes under that name, as the
  kernel [d_model=6, d_model=2] of a dense layer shrinking d_model does.

  descriptions (default: the shapes' strings) name the inputs in errors.
  """
  if descriptions is None:
    descriptions = [shape.to_string for shape in shapes]
  several_sizes = names_with_several_sizes(list(shapes) + [output_shape])
  by_name: Dict[str, Dimension] = {}
  dims = []
  for shape, description in zip(shapes, descriptions):
    for d in shape.dims:
      if d in dims:
        continue
      seen = by_name.setdefault(d.name, d)
      if seen.size != d.size and d.name not in several_sizes:
        raise ValueError(
          "einsum: dimension %r has size %d in one input and %d "
          "in %s" % (d.name, seen.size, d.size, description)
        )
      dims.append(d)
  return dims


def _union_dims(xs: Sequence[Tensor]) -> List[Dimension]:
  """Dimensions of all inputs in order of first appearance (sizes checked)."""
  return _union_dim_list([x.shape for x in xs], [x.to_string for x in xs])


class EinsumOperation(Operation):
  """Multiplies the broadcast inputs and sums down to output_shape.

  Args:
    inputs: the mtf Tensors to multiply (broadcasting them together).
    output_shape: the Shape of the result; dims of the inputs that are not in it
      are summed over.
    name: an optional name for the operation.
  """

  def __init__(
    self, inputs: Sequence[Tensor], output_shape, name: Optional[str] = None
  ):
    inputs = list(inputs)
    if not inputs:
      raise ValueError("einsum needs at least one input")
    super().__init__(inputs, name=name or "einsum")
    self._outputs = [
      Tensor(self, convert_to_shape(output_shape), inputs[0].dtype)
    ]

  def gradient(
    self, grad_ys: Sequence[Optional[Tensor]]
  ) -> Sequence[Optional[Tensor]]:
    dy = grad_ys[0]
    xs = self.inputs
    return [
      einsum([dy] + xs[:i] + xs[i + 1 :], output_shape=x.shape)
      for i, x in enumerate(xs)
    ]

  def lower(self, lowering) -> None:
    xs = self.inputs
    lowering.set_tensor_lowering(
      self.outputs[0],
      lower_einsum(
        lowering,
        lowering.mesh_impl(self),
        [x.shape for x in xs],
        [lowering.tensors[x] for x in xs],
        xs[0].dtype,
        self.outputs[0].shape,
      ),
    )


def lower_einsum(
  lowering,
  mesh_impl,
  input_shapes: Sequence[Shape],
  laid_out_inputs: Sequence,
  dtype: tf.DType,
  output_shape,
):
  """The einsum of laid-out inputs with the given shapes, as EinsumOperation.

  For operations whose lowering is an einsum of slices they make themselves
  (gather's one-hot einsum). A contracted split dimension gives a
  LazyAllreduceSum.

  Returns:
    a LaidOutTensor (or LazyAllreduceSum) of output_shape.
  """
  out_shape = convert_to_shape(output_shape)
  all_dims = _union_dim_list(input_shapes, output_shape=out_shape)
  letters = dict(zip(all_dims, string.ascii_letters))
  if len(all_dims) > len(string.ascii_letters):
    raise ValueError(
      "einsum over more than %d distinct dimensions" % len(string.ascii_letters)
    )
  inner_shape = Shape([d for d in out_shape.dims if d in letters])
  equation = "%s->%s" % (
    ",".join("".join(letters[d] for d in shape.dims) for shape in input_shapes),
    "".join(letters[d] for d in inner_shape.dims),
  )
  reduced_mesh_axes = sorted(
    set(
      mesh_impl.tensor_dimension_to_mesh_axis(d)
      for d in all_dims
      if d not in out_shape.dims
    )
    - {None}
  )

  if dtype.is_floating:

    def slice_fn(*slices):
      return mesh_impl.einsum(equation, *slices)
  else:
    union_shape = Shape(all_dims)
    union_slice_shape = mesh_impl.slice_shape(union_shape)

    def slice_fn(*slices):
      product = None
      for shape, s in zip(input_shapes, slices):
        s = mesh_impl_lib.broadcast_slice(
          s, shape, union_shape, union_slice_shape
        )
        product = s if product is None else product * s
      reduced_axes = [
        i for i, d in enumerate(all_dims) if d not in inner_shape.dims
      ]
      if reduced_axes:
        product = tf.reduce_sum(product, axis=reduced_axes)
      kept = [d for d in all_dims if d in inner_shape.dims]
      perm = [kept.index(d) for d in inner_shape.dims]
      if perm != sorted(perm):
        product = tf.transpose(product, perm)
      return product

  y = mesh_impl.slicewise(slice_fn, *laid_out_inputs)
  if inner_shape != out_shape:
    y = mesh_impl.broadcast_impl(y, inner_shape, out_shape)
  lowering.add_counter("einsum", mesh_impl.laid_out_size(Shape(all_dims)))
  lowering.add_counter("einsum_unique", Shape(all_dims).size)
  if reduced_mesh_axes:
    counter = "allreduce/%s/einsum_op" % reduced_mesh_axes
    y = LazyAllreduceSum(
      mesh_impl,
      y,
      reduced_mesh_axes,
      add_counter_fn=lambda: lowering.add_counter(
        counter, mesh_impl.laid_out_size(out_shape)
      ),
    )
  return y


def einsum(
  xs: Sequence[Tensor],
  output_shape=None,
  reduced_dims=None,
  name: Optional[str] = None,
) -> Tensor:
  """Einstein summation over named dimensions.

  Without output_shape and reduced_dims the output keeps the dimensions that
  occur in exactly one input. Output dimensions found in no input are
  broadcast after the contraction.

  Example:
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> x = converter.convert_np_array_to_mtf_tensor(
    ...     [[1, 2], [3, 4]], ["batch", "d_model"], dtype=tf.float32)
    >>> w = converter.convert_np_array_to_mtf_tensor(
    ...     [[1, 0, 1], [0, 1, 1]], ["d_model", "d_ff"], dtype=tf.float32)
    >>> batch, d_ff = x.shape.dims[0], w.shape.dims[1]
    >>> y = mtf.einsum([x, w], output_shape=[batch, d_ff])  # x @ w
    >>> y.shape
    Shape[batch=2, d_ff=3]
    >>> converter.convert_mtf_tensor_to_np_array(y)
    array([[1., 2., 3.],
           [3., 4., 7.]], dtype=float32)

  Args:
    xs: a list of mtf Tensors (usually two).
    output_shape: optional Shape of the result.
    reduced_dims: optional list of Dimensions to sum over; the output keeps the
      other input dims. Give at most one of output_shape and reduced_dims.
    name: an optional name for the operation.

  Returns:
    an mtf Tensor of shape `output_shape` and the dtype of the inputs.
  """
  xs = list(xs)
  if not xs:
    raise ValueError("einsum needs at least one input")
  for x in xs[1:]:
    if x.dtype != xs[0].dtype:
      raise ValueError(
        "einsum inputs must share a dtype: %s is %s, %s is %s"
        % (xs[0].name, xs[0].dtype.name, x.name, x.dtype.name)
      )
  output_shape = einsum_output_shape(
    [x.shape for x in xs],
    output_shape,
    reduced_dims,
    descriptions=[x.to_string for x in xs],
  )
  return EinsumOperation(xs, output_shape, name=name).outputs[0]


def einsum_output_shape(
  input_shapes: Sequence[Shape],
  output_shape=None,
  reduced_dims=None,
  descriptions: Optional[Sequence[str]] = None,
) -> Shape:
  """The output Shape `einsum` gives inputs of these shapes (checked).

  Example:
    >>> b, v, d = Dimension("b", 2), Dimension("v", 5), Dimension("d", 3)
    >>> einsum_output_shape([Shape([b, v]), Shape([v, d])], reduced_dims=[v])
    Shape[b=2, d=3]

  Raises:
    ValueError: if sizes conflict, a reduced dim is in no input, or
      output_shape and reduced_dims disagree.
  """
  if output_shape is not None:
    output_shape = convert_to_shape(output_shape)
  input_dims = _union_dim_list(input_shapes, descriptions, output_shape)
  several_sizes = names_with_several_sizes(list(input_shapes) + [output_shape])
  by_name = {}
  for d in input_dims:
    by_name.setdefault(d.name, d)
  if reduced_dims is not None:
    reduced_dims = [
      d if isinstance(d, Dimension) else by_name.get(d, d) for d in reduced_dims
    ]
    for d in reduced_dims:
      if d not in input_dims:
        raise ValueError("einsum: reduced dimension %s is in no input" % (d,))
  if output_shape is None:
    if reduced_dims is None:
      counts = {}
      for shape in input_shapes:
        for d in shape.dims:
          counts[d] = counts.get(d, 0) + 1
      output_shape = Shape([d for d in input_dims if counts[d] == 1])
    else:
      output_shape = Shape([d for d in input_dims if d not in reduced_dims])
  else:
    for d in output_shape.dims:
      seen = by_name.get(d.name)
      if (
        seen is not None and d not in input_dims and d.name not in several_sizes
      ):
        raise ValueError(
          "einsum: output dimension %s conflicts with input "
          "dimension %s" % (d, seen)
        )
    if reduced_dims is not None:
      expected = set(input_dims) - set(reduced_dims)
      kept = {d for d in output_shape.dims if d in input_dims}
      if kept != expected:
        raise ValueError(
          "einsum: output_shape %s and reduced_dims %s disagree for inputs "
          "with dimensions %s"
          % (output_shape.to_string, reduced_dims, input_dims)
        )
  return output_shape


def matmul(
  a: Tensor,
  b: Tensor,
  output_shape=None,
  reduced_dims=None,
  name: Optional[str] = None,
) -> Tensor:
  """einsum([a, b], ...): contracts the dims a and b share.

  Args:
    a: an mtf Tensor.
    b: an mtf Tensor with the dtype of `a`.
    output_shape: optional Shape of the result; defaults to the dims that occur
      in exactly one of a and b.
    reduced_dims: optional list of Dimensions to sum over; the output keeps the
      other input dims. Give at most one of output_shape and reduced_dims.
    name: an optional name for the operation.

  Returns:
    an mtf Tensor of shape `output_shape`.
  """
  return einsum(
    [a, b], output_shape=output_shape, reduced_dims=reduced_dims, name=name
  )


def transpose(x: Tensor, new_shape, name: str = "transpose") -> Tensor:
  """Permutes dims of x to new_shape (same set of dimensions).

  Args:
    x: an mtf Tensor.
    new_shape: a Shape with the same dims as x, in the new order.
    name: an optional name for the operation.

  Returns:
    an mtf Tensor of shape `new_shape`.
  """
  new_shape = convert_to_shape(new_shape)
  if sorted(new_shape.dims) != sorted(x.shape.dims):
    raise ValueError(
      "transpose: %s is not a permutation of %s"
      % (new_shape.to_string, x.shape.to_string)
    )
  return einsum([x], output_shape=new_shape, name=name)


__all__ = ["EinsumOperation", "einsum", "matmul", "transpose"]
