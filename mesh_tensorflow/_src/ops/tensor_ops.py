"""Shape manipulation along one dimension: concat, split, stack, slice, pad.

Each operation works on a single named dimension ("the operated dim") and is
purely local: every processor transforms its own slice. The operated dim must
therefore not be split across the mesh (ValueError at lowering, naming it);
every other dimension may be split freely.

Example:
  >>> converter = mtf.test_utils.NumpyConverter()
  >>> a = converter.convert_np_array_to_mtf_tensor([[1, 2, 3]], ["b", "length"])
  >>> b = converter.convert_np_array_to_mtf_tensor([[4, 5]], ["b", "length"])
  >>> y = mtf.concat([a, b], "length")  # length sizes add up
  >>> y.shape
  Shape[b=1, length=5]
  >>> converter.convert_mtf_tensor_to_np_array(y)
  array([[1, 2, 3, 4, 5]], dtype=int32)
  >>> a2, b2 = mtf.split(y, y.shape.get_dim_by_name("length"), [3, 2])
  >>> converter.convert_mtf_tensor_to_np_array(b2)
  array([[4, 5]], dtype=int32)
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple, Union

import tensorflow as tf

from mesh_tensorflow._src.graph import Operation
from mesh_tensorflow._src.graph import Tensor
from mesh_tensorflow._src.laid_out import to_laid_out_tensor
from mesh_tensorflow._src.ops import io
from mesh_tensorflow._src.ops.slicewise import check_splits_allowed
from mesh_tensorflow._src.shapes import Dimension
from mesh_tensorflow._src.shapes import Shape
from mesh_tensorflow._src.shapes import convert_to_dimension

DimLike = Union[Dimension, str, Tuple[str, int]]


def _is_int(x) -> bool:
  return isinstance(x, int) and not isinstance(x, bool)


def _dim_name(dim: DimLike) -> str:
  return dim if isinstance(dim, str) else convert_to_dimension(dim).name


def find_axis(x: Tensor, dim: DimLike, op_name: str) -> Tuple[int, Dimension]:
  """(tensor axis, Dimension) of `dim` (a Dimension or a name) in x.

  Raises:
    ValueError: if x has no such dimension, or it has another size.
  """
  name = _dim_name(dim)
  names = x.shape.dimension_names
  if name not in names:
    raise ValueError(
      "%s: dimension %r is not in %s (tensor %s)"
      % (op_name, name, x.shape.to_string, x.name)
    )
  axis = names.index(name)
  actual = x.shape.dims[axis]
  if not isinstance(dim, str) and convert_to_dimension(dim) != actual:
    raise ValueError(
      "%s: dimension %s does not match %s of %s"
      % (op_name, convert_to_dimension(dim), actual, x.shape.to_string)
    )
  return axis, actual


def _check_not_split(
  op: Operation, lowering, tensors: Sequence[Tensor], dim_name: str
) -> None:
  """ValueError (naming dim_name) if the operated dim is split on the mesh."""
  others = set()
  for t in tensors:
    others.update(n for n in t.shape.dimension_names if n != dim_name)
  check_splits_allowed(op, lowering, tensors, others)


def _lowered_inputs(op: Operation, lowering) -> list:
  return [lowering.tensors[x] for x in op.inputs]


class ConcatOperation(Operation):
  """Concatenates tensors along `concat_dim_name`.

  All inputs must have the same dims (same names, order and sizes) except for
  the size of the concatenated dim; the output's size there is the sum.

  Args:
    xs: a list of mtf Tensors with the same dims (names, order, sizes) except
      for the size of the concatenated dim.
    concat_dim_name: the name of the dimension to concatenate along; it must not
      be split across the mesh.
    name: an optional name for the operation.
  """

  def __init__(
    self, xs: Sequence[Tensor], concat_dim_name: str, name: Optional[str] = None
  ):
    xs = list(xs)
    if not xs:
      raise ValueError("concat needs at least one tensor")
    super().__init__(xs, name=name or "concat")
    self._concat_dim_name = concat_dim_name
    self._axis, _ = find_axis(xs[0], concat_dim_name, "concat")
    reference = xs[0].shape.resize_dimension(concat_dim_name, 0)
    for i, x in enumerate(xs[1:], 1):
      if x.dtype != xs[0].dtype:
        raise ValueError(
          "concat: tensor %d has dtype %s but tensor 0 has %s"
          % (i, x.dtype.name, xs[0].dtype.name)
        )
      if concat_dim_name not in x.shape.dimension_names:
        raise ValueError(
          "concat: tensor %d (%s) has no dimension %r"
          % (i, x.shape.to_string, concat_dim_name)
        )
      other = x.shape.resize_dimension(concat_dim_name, 0)
      if other != reference:
        raise ValueError(
          "concat along %r: tensor %d has shape %s, incompatible with tensor "
          "0's %s (%s); only dimension %r may differ in size"
          % (
            concat_dim_name,
            i,
            x.shape.to_string,
            xs[0].shape.to_string,
            _first_difference(reference, other),
            concat_dim_name,
          )
        )
    self._input_sizes = [x.shape.dims[self._axis].size for x in xs]
    self._outputs = [
      Tensor(
        self,
        xs[0].shape.resize_dimension(concat_dim_name, sum(self._input_sizes)),
        xs[0].dtype,
      )
    ]
    self._initialize_splittable_and_unsplittable_dims(
      "splittable", [concat_dim_name]
    )

  def gradient(
    self, grad_ys: Sequence[Optional[Tensor]]
  ) -> Sequence[Optional[Tensor]]:
    dy = grad_ys[0]
    return split(
      dy, self.outputs[0].shape.dims[self._axis], list(self._input_sizes)
    )

  def lower(self, lowering) -> None:
    _check_not_split(
      self, lowering, self._inputs + self._outputs, self._concat_dim_name
    )
    mesh_impl = lowering.mesh_impl(self)
    axis = self._axis
    y = mesh_impl.slicewise_delay_allreduce(
      lambda *slices: tf.concat(list(slices), axis=axis),
      *_lowered_inputs(self, lowering),
    )
    lowering.set_tensor_lowering(self.outputs[0], y)


def _first_difference(a: Shape, b: Shape) -> str:
  """Human-readable first mismatch between two shapes."""
  if a.dimension_names != b.dimension_names:
    return "dimension names %s vs %s" % (a.dimension_names, b.dimension_names)
  for da, db in zip(a.dims, b.dims):
    if da.size != db.size:
      return "dimension %r has size %d vs %d" % (da.name, da.size, db.size)
  return "shapes differ"


def concat(
  xs: Sequence[Tensor], concat_dim_name: str, name: Optional[str] = None
) -> Tensor:
  """Concatenates xs along the dimension named concat_dim_name.

  Example:
    >>> mesh = mtf.Mesh(mtf.Graph(), "mesh")
    >>> a = mtf.zeros(mesh, "a:2;n:3")
    >>> b = mtf.zeros(mesh, "a:2;n:5")
    >>> mtf.concat([a, b], "n").shape
    Shape[a=2, n=8]

  Args:
    xs: a list of mtf Tensors with the same dims (names, order, sizes) except
      for the size of the concatenated dim.
    concat_dim_name: the name of the dimension to concatenate along; it must not
      be split across the mesh.
    name: an optional name for the operation.

  Returns:
    an mtf Tensor like xs[0], whose concatenated dim has the sum of the inputs'
    sizes.

  Raises:
    ValueError: if the shapes differ elsewhere; at lowering, if the
      concatenated dimension is split across the mesh.
  """
  return ConcatOperation(xs, concat_dim_name, name=name).outputs[0]


class SplitOperation(Operation):
  """Splits x along split_dim into pieces; the inverse of ConcatOperation.

  Args:
    x: the mtf Tensor to split.
    split_dim: the Dimension (or its name) to split along.
    num_or_size_splits: the number of equal pieces, or a list of piece sizes
      summing to the dimension's size.
    name: an optional name for the operation.
  """

  def __init__(
    self,
    x: Tensor,
    split_dim: DimLike,
    num_or_size_splits,
    name: Optional[str] = None,
  ):
    super().__init__([x], name=name or "split")
    self._axis, self._split_dim = find_axis(x, split_dim, "split")
    size = self._split_dim.size
    if isinstance(num_or_size_splits, (list, tuple)):
      sizes = list(num_or_size_splits)
      if not sizes or not all(_is_int(s) and s >= 0 for s in sizes):
        raise ValueError(
          "split of dimension %r: size_splits must be a non-empty list of "
          "non-negative ints, got %r" % (self._split_dim.name, sizes)
        )
      if sum(sizes) != size:
        raise ValueError(
          "split of dimension %r (size %d): size_splits %r sum to %d"
          % (self._split_dim.name, size, sizes, sum(sizes))
        )
    elif _is_int(num_or_size_splits):
      num = num_or_size_splits
      if num <= 0 or size % num:
        raise ValueError(
          "split of dimension %r (size %d) into %d equal pieces: %d does "
          "not divide %d" % (self._split_dim.name, size, num, num, size)
        )
      sizes = [size // num] * num
    else:
      raise ValueError(
        "split of dimension %r: num_or_size_splits must be an int or a list "
        "of ints, got %r" % (self._split_dim.name, num_or_size_splits)
      )
    self._output_sizes = sizes
    self._outputs = [
      Tensor(
        self,
        x.shape.resize_dimension(self._split_dim.name, s),
        x.dtype,
        index=i,
      )
      for i, s in enumerate(sizes)
    ]
    self._initialize_splittable_and_unsplittable_dims(
      "splittable", [self._split_dim.name]
    )

  def gradient(
    self, grad_ys: Sequence[Optional[Tensor]]
  ) -> Sequence[Optional[Tensor]]:
    grads = [
      io.zeros_like(y) if dy is None else dy
      for y, dy in zip(self._outputs, grad_ys)
    ]
    return [concat(grads, self._split_dim.name)]

  def lower(self, lowering) -> None:
    _check_not_split(self, lowering, self._inputs, self._split_dim.name)
    mesh_impl = lowering.mesh_impl(self)
    axis, sizes = self._axis, self._output_sizes
    values = mesh_impl.slicewise(
      lambda t: tuple(tf.split(t, sizes, axis=axis)),
      to_laid_out_tensor(lowering.tensors[self.inputs[0]]),
    )
    for output, value in zip(self._outputs, values):
      lowering.set_tensor_lowering(output, value)


def split(
  x: Tensor, split_dim: DimLike, num_or_size_splits, name: Optional[str] = None
) -> List[Tensor]:
  """Splits x along split_dim.

  Example:
    >>> x = mtf.zeros(mtf.Mesh(mtf.Graph(), "mesh"), "a:2;n:8")
    >>> [piece.shape for piece in mtf.split(x, "n", 2)]
    [Shape[a=2, n=4], Shape[a=2, n=4]]
    >>> [piece.shape for piece in mtf.split(x, "n", [3, 5])]
    [Shape[a=2, n=3], Shape[a=2, n=5]]

  Args:
    x: the tensor.
    split_dim: a Dimension of x (or its name).
    num_or_size_splits: an int (equal pieces; must divide the size) or a list
      of piece sizes summing to the size.
    name: optional op name.

  Returns:
    a list of Tensors.
  """
  return SplitOperation(x, split_dim, num_or_size_splits, name=name).outputs


def _normalize_stack_axis(axis: int, ndims: int, dim_name: str) -> int:
  if not _is_int(axis):
    raise ValueError(
      "stack along %r: axis must be an int, got %r" % (dim_name, axis)
    )
  if axis < 0:
    axis += ndims + 1
  if not 0 <= axis <= ndims:
    raise ValueError(
      "stack along %r: axis %d out of range for %d-d inputs"
      % (dim_name, axis, ndims)
    )
  return axis


class StackOperation(Operation):
  """Stacks equal-shape tensors along a new dimension of size len(xs).

  Args:
    xs: a non-empty list of mtf Tensors of one shape and dtype.
    dim_name: the name of the new dimension (of size len(xs)).
    axis: where the new dimension goes among the output's dims; negative counts
      from the end (-1: last).
    name: an optional name for the operation.
  """

  def __init__(
    self,
    xs: Sequence[Tensor],
    dim_name: str,
    axis: int,
    name: Optional[str] = None,
  ):
    xs = list(xs)
    if not xs:
      raise ValueError("stack along %r needs at least one tensor" % dim_name)
    super().__init__(xs, name=name or "stack")
    input_shape = xs[0].shape
    for i, x in enumerate(xs[1:], 1):
      if x.shape != input_shape or x.dtype != xs[0].dtype:
        raise ValueError(
          "stack along %r: tensor %d is %s %s but tensor 0 is %s %s"
          % (
            dim_name,
            i,
            x.shape.to_string,
            x.dtype.name,
            input_shape.to_string,
            xs[0].dtype.name,
          )
        )
    if dim_name in input_shape.dimension_names:
      raise ValueError(
        "stack: new dimension %r is already in %s"
        % (dim_name, input_shape.to_string)
      )
    self._axis = _normalize_stack_axis(axis, input_shape.ndims, dim_name)
    self._new_dim = Dimension(dim_name, len(xs))
    dims = input_shape.dims
    self._outputs = [
      Tensor(
        self,
        Shape(dims[: self._axis] + [self._new_dim] + dims[self._axis :]),
        xs[0].dtype,
      )
    ]
    self._initialize_splittable_and_unsplittable_dims("splittable", [dim_name])

  def gradient(
    self, grad_ys: Sequence[Optional[Tensor]]
  ) -> Sequence[Optional[Tensor]]:
    return unstack(grad_ys[0], self._new_dim)

  def lower(self, lowering) -> None:
    _check_not_split(self, lowering, self._outputs, self._new_dim.name)
    mesh_impl = lowering.mesh_impl(self)
    axis = self._axis
    y = mesh_impl.slicewise_delay_allreduce(
      lambda *slices: tf.stack(list(slices), axis=axis),
      *_lowered_inputs(self, lowering),
    )
    lowering.set_tensor_lowering(self.outputs[0], y)


def stack(
  xs: Sequence[Tensor], dim_name: str, axis: int = 0, name: Optional[str] = None
) -> Tensor:
  """Stacks xs along a new dimension `dim_name` of size len(xs).

  Example:
    >>> x = mtf.zeros(mtf.Mesh(mtf.Graph(), "mesh"), "a:2;b:3")
    >>> mtf.stack([x, x, x], "s", axis=1).shape
    Shape[a=2, s=3, b=3]
    >>> mtf.stack([x, x, x], "s", axis=-1).shape
    Shape[a=2, b=3, s=3]

  Args:
    xs: a non-empty list of mtf Tensors of one shape and dtype.
    dim_name: the name of the new dimension (of size len(xs)).
    axis: where the new dimension goes among the output's dims; negative counts
      from the end (-1: last).
    name: an optional name for the operation.

  Returns:
    an mtf Tensor with the dims of xs[0] plus the new one.
  """
  return StackOperation(xs, dim_name, axis, name=name).outputs[0]


class UnstackOperation(Operation):
  """Splits x along `dim` into dim.size tensors without that dimension.

  Args:
    x: the mtf Tensor to unstack.
    dim: the Dimension (or its name) of x to unstack along.
    name: an optional name for the operation.
  """

  def __init__(self, x: Tensor, dim: DimLike, name: Optional[str] = None):
    super().__init__([x], name=name or "unstack")
    self._axis, self._dim = find_axis(x, dim, "unstack")
    output_shape = x.shape - self._dim
    self._outputs = [
      Tensor(self, output_shape, x.dtype, index=i)
      for i in range(self._dim.size)
    ]
    self._initialize_splittable_and_unsplittable_dims(
      "splittable", [self._dim.name]
    )

  def gradient(
    self, grad_ys: Sequence[Optional[Tensor]]
  ) -> Sequence[Optional[Tensor]]:
    grads = [
      io.zeros_like(y) if dy is None else dy
      for y, dy in zip(self._outputs, grad_ys)
    ]
    return [stack(grads, self._dim.name, self._axis)]

  def lower(self, lowering) -> None:
    _check_not_split(self, lowering, self._inputs, self._dim.name)
    mesh_impl = lowering.mesh_impl(self)
    axis = self._axis
    values = mesh_impl.slicewise(
      lambda t: tuple(tf.unstack(t, axis=axis)),
      to_laid_out_tensor(lowering.tensors[self.inputs[0]]),
    )
    for output, value in zip(self._outputs, values):
      lowering.set_tensor_lowering(output, value)


def unstack(
  x: Tensor, dim: DimLike, name: Optional[str] = None
) -> List[Tensor]:
  """Unstacks x along dim: [a=2, n=3] along n -> three tensors [a=2].

  Args:
    x: the mtf Tensor to unstack.
    dim: the Dimension (or its name) of x to unstack along.
    name: an optional name for the operation.

  Returns:
    a list of dim.size mtf Tensors with the dims of x but `dim`.
  """
  return UnstackOperation(x, dim, name=name).outputs


class SliceOperation(Operation):
  """Keeps positions [begin, begin + size) of one dimension (same name).

  Args:
    x: the mtf Tensor to slice.
    begin: the first position kept.
    size: the number of positions kept.
    slice_dim_name: the name of the dimension to slice; it must not be split
      across the mesh.
    name: an optional name for the operation.
  """

  def __init__(
    self,
    x: Tensor,
    begin: int,
    size: int,
    slice_dim_name: str,
    name: Optional[str] = None,
  ):
    super().__init__([x], name=name or "slice")
    self._axis, input_dim = find_axis(x, slice_dim_name, "slice")
    if not (
      _is_int(begin)
      and _is_int(size)
      and begin >= 0
      and size >= 0
      and begin + size <= input_dim.size
    ):
      raise ValueError(
        "slice of dimension %r (size %d): begin=%r, size=%r is out of range"
        % (slice_dim_name, input_dim.size, begin, size)
      )
    self._begin = begin
    self._slice_dim = Dimension(slice_dim_name, size)
    self._outputs = [
      Tensor(self, x.shape.resize_dimension(slice_dim_name, size), x.dtype)
    ]
    self._initialize_splittable_and_unsplittable_dims(
      "splittable", [slice_dim_name]
    )

  def gradient(
    self, grad_ys: Sequence[Optional[Tensor]]
  ) -> Sequence[Optional[Tensor]]:
    full = self.inputs[0].shape.dims[self._axis].size
    after = full - self._begin - self._slice_dim.size
    return [pad(grad_ys[0], [self._begin, after], self._slice_dim.name)]

  def lower(self, lowering) -> None:
    _check_not_split(self, lowering, self._inputs, self._slice_dim.name)
    mesh_impl = lowering.mesh_impl(self)
    ndims = self.inputs[0].shape.ndims
    begin = [0] * ndims
    begin[self._axis] = self._begin
    sizes = [-1] * ndims
    sizes[self._axis] = self._slice_dim.size
    y = mesh_impl.slicewise_delay_allreduce(
      lambda t: tf.slice(t, begin, sizes), lowering.tensors[self.inputs[0]]
    )
    lowering.set_tensor_lowering(self.outputs[0], y)


def mtf_slice(
  x: Tensor,
  begin: int,
  size: int,
  slice_dim_name: str,
  name: Optional[str] = None,
) -> Tensor:
  """Slice of one dimension; the output dimension keeps its name.

  Example:
    >>> x = mtf.zeros(mtf.Mesh(mtf.Graph(), "mesh"), "a:2;n:8")
    >>> mtf.mtf_slice(x, 2, 3, "n").shape  # positions 2, 3 and 4
    Shape[a=2, n=3]

  Args:
    x: the mtf Tensor to slice.
    begin: the first position kept.
    size: the number of positions kept.
    slice_dim_name: the name of the dimension to slice; it must not be split
      across the mesh.
    name: an optional name for the operation.

  Returns:
    an mtf Tensor like x whose sliced dimension has size `size`.

  Raises:
    ValueError: if [begin, begin + size) is not inside the dimension; at
      lowering, if the dimension is split across the mesh.
  """
  return SliceOperation(x, begin, size, slice_dim_name, name=name).outputs[0]


class PadOperation(Operation):
  """Pads one dimension with zeros: paddings = [before, after].

  Args:
    x: the mtf Tensor to pad.
    paddings: [before, after]: the numbers of zeros to add at each end.
    pad_dim_name: the name of the dimension to pad; it must not be split across
      the mesh.
    name: an optional name for the operation.
  """

  def __init__(
    self,
    x: Tensor,
    paddings: Sequence[int],
    pad_dim_name: str,
    name: Optional[str] = None,
  ):
    super().__init__([x], name=name or "pad")
    self._axis, input_dim = find_axis(x, pad_dim_name, "pad")
    paddings = list(paddings)
    if len(paddings) != 2 or not all(_is_int(p) and p >= 0 for p in paddings):
      raise ValueError(
        "pad of dimension %r: paddings must be [before, after] with "
        "non-negative ints, got %r" % (pad_dim_name, paddings)
      )
    self._paddings = paddings
    self._output_dim = Dimension(pad_dim_name, input_dim.size + sum(paddings))
    self._outputs = [
      Tensor(
        self,
        x.shape.resize_dimension(pad_dim_name, self._output_dim.size),
        x.dtype,
      )
    ]
    self._initialize_splittable_and_unsplittable_dims(
      "splittable", [pad_dim_name]
    )

  def gradient(
    self, grad_ys: Sequence[Optional[Tensor]]
  ) -> Sequence[Optional[Tensor]]:
    size = self.inputs[0].shape.dims[self._axis].size
    return [
      mtf_slice(grad_ys[0], self._paddings[0], size, self._output_dim.name)
    ]

  def lower(self, lowering) -> None:
    _check_not_split(self, lowering, self._outputs, self._output_dim.name)
    mesh_impl = lowering.mesh_impl(self)
    paddings = [[0, 0] for _ in range(self.inputs[0].shape.ndims)]
    paddings[self._axis] = list(self._paddings)
    y = mesh_impl.slicewise_delay_allreduce(
      lambda t: tf.pad(t, paddings), lowering.tensors[self.inputs[0]]
    )
    lowering.set_tensor_lowering(self.outputs[0], y)


def pad(
  x: Tensor, paddings: Sequence[int], dim_name: str, name: Optional[str] = None
) -> Tensor:
  """Zero-pads dimension dim_name: [a=2, n=3], [1, 2] -> [a=2, n=6].

  Args:
    x: the mtf Tensor to pad.
    paddings: [before, after]: the numbers of zeros to add at each end.
    dim_name: the name of the dimension to pad; it must not be split across the
      mesh.
    name: an optional name for the operation.

  Returns:
    an mtf Tensor like x whose padded dimension is before + after longer.
  """
  return PadOperation(x, paddings, dim_name, name=name).outputs[0]


__all__ = [
  "ConcatOperation",
  "PadOperation",
  "SliceOperation",
  "SplitOperation",
  "StackOperation",
  "UnstackOperation",
  "concat",
  "mtf_slice",
  "pad",
  "split",
  "stack",
  "unstack",
]
