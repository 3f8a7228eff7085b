"""one_hot, gather and range: index-driven ops over named dimensions.

`one_hot` and `mtf_range` are computed locally on every processor (a split
output dimension only shifts each processor's indices by its slice begin).

`gather` computes what the original's einsum against a one-hot matrix
computes, out-of-range indices giving zeros. How depends on the layout, known
at lowering time:
- `dim` not split (each processor holds all of it, e.g. an embedding whose
  vocabulary is not split): `tf.gather` per slice, and a scatter-add
  (`tf.scatter_nd`) per slice for the gradient. Dimensions
  that weights and indices share (say batch) are laid out alike, so the
  slices line up without communication; the gradient's partial sums over
  index dimensions that are split but absent from weights get the same lazy
  allreduce as the one-hot einsum's gradient.
- `dim` split (a vocabulary split over the mesh): the one-hot einsum, as in
  the original; its contraction over `dim` costs the einsum's allreduce.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import numpy as np
import tensorflow as tf

from mesh_tensorflow._src.graph import Mesh
from mesh_tensorflow._src.graph import Operation
from mesh_tensorflow._src.graph import Tensor
from mesh_tensorflow._src.laid_out import LazyAllreduceSum
from mesh_tensorflow._src.ops import einsum as einsum_lib
from mesh_tensorflow._src.ops import elementwise
from mesh_tensorflow._src.ops import io
from mesh_tensorflow._src.ops import reduce as reduce_lib
from mesh_tensorflow._src.shapes import Shape
from mesh_tensorflow._src.shapes import convert_to_dimension


class OneHotOperation(Operation):
  """indices -> one-hot tensor with `output_dim` appended; no communication.

  Args:
    indices: an integer mtf Tensor of indices into output_dim.
    output_dim: the Dimension appended to the shape (the depth of the encoding).
    on_value: the value at each index.
    off_value: the value elsewhere.
    dtype: the tf.DType of the result.
    name: an optional name for the operation.
  """

  def __init__(
    self,
    indices: Tensor,
    output_dim,
    on_value,
    off_value,
    dtype,
    name: Optional[str] = None,
  ):
    if not isinstance(indices, Tensor):
      raise TypeError(
        "one_hot indices must be an mtf Tensor, got %r" % (indices,)
      )
    if not indices.dtype.is_integer:
      raise ValueError(
        "one_hot indices %s must have an integer dtype, got %s"
        % (indices.name, indices.dtype.name)
      )
    output_dim = convert_to_dimension(output_dim)
    if output_dim.name in indices.shape.dimension_names:
      raise ValueError(
        "one_hot output dimension %s is already a dimension of "
        "indices %s" % (output_dim, indices.to_string)
      )
    super().__init__([indices], name=name or "one_hot")
    self._output_dim = output_dim
    self._on_value = on_value
    self._off_value = off_value
    self._dtype = tf.as_dtype(dtype)
    self._outputs = [
      Tensor(self, Shape(indices.shape.dims + [output_dim]), self._dtype)
    ]

  @property
  def has_gradient(self) -> bool:
    return False

  def lower(self, lowering) -> None:
    lowering.set_tensor_lowering(
      self.outputs[0],
      lower_one_hot(
        lowering.mesh_impl(self),
        lowering.tensors[self.inputs[0]],
        self.outputs[0].shape,
        self._on_value,
        self._off_value,
        self._dtype,
      ),
    )


def lower_one_hot(
  mesh_impl, laid_out_indices, output_shape: Shape, on_value, off_value, dtype
):
  """Laid-out one-hot slices along output_shape's last dim (may be split)."""
  depth = mesh_impl.slice_shape(output_shape)[-1]
  mesh_axis = mesh_impl.tensor_dimension_to_mesh_axis(output_shape.dims[-1])

  def one_hot_fn(indices_slice, pcoord):
    if isinstance(pcoord, int):
      if pcoord:
        indices_slice -= pcoord * depth
    else:
      indices_slice -= tf.cast(pcoord, indices_slice.dtype) * depth
    return tf.one_hot(
      indices_slice,
      depth,
      on_value=tf.cast(on_value, dtype),
      off_value=tf.cast(off_value, dtype),
      dtype=dtype,
    )

  pcoord = 0 if mesh_axis is None else mesh_impl.laid_out_pcoord(mesh_axis)
  return mesh_impl.slicewise(one_hot_fn, laid_out_indices, pcoord)


def one_hot(
  indices: Tensor,
  output_dim,
  on_value=1.0,
  off_value=0.0,
  dtype=tf.float32,
  name: Optional[str] = None,
) -> Tensor:
  """One-hot encoding of integer `indices` along a new last dim `output_dim`.

  Example:
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> ids = converter.convert_np_array_to_mtf_tensor([2, 0], ["batch"])
    >>> y = mtf.one_hot(ids, mtf.Dimension("vocab", 3))
    >>> y
    Tensor[one_hot:0, Shape[batch=2, vocab=3], float32]
    >>> converter.convert_mtf_tensor_to_np_array(y)
    array([[0., 0., 1.],
           [1., 0., 0.]], dtype=float32)

  Args:
    indices: an integer mtf Tensor of indices into output_dim.
    output_dim: the Dimension appended to the shape (the depth of the encoding).
    on_value: the value at each index.
    off_value: the value elsewhere.
    dtype: the tf.DType of the result.
    name: an optional name for the operation.

  Returns:
    an mtf Tensor of shape indices.shape + output_dim; out-of-range indices give
    an all-off row.
  """
  return OneHotOperation(
    indices, output_dim, on_value, off_value, dtype, name=name
  ).outputs[0]


def _names(dims) -> List[str]:
  return [d.name for d in dims]


def _transpose_slice(x: tf.Tensor, from_dims, to_dims) -> tf.Tensor:
  """Reorders a slice's axes from from_dims' order to to_dims'."""
  from_names = _names(from_dims)
  perm = [from_names.index(n) for n in _names(to_dims)]
  if perm != sorted(perm):
    x = tf.transpose(x, perm)
  return x


class _GatherDims:
  """How one gather's dimensions line up in its slices.

  shared:        dims of both weights and indices (batch dims of the gather)
  indices_only:  dims of indices only
  weights_only:  dims of weights other than `dim` and the shared ones
  The gather of a slice is [shared..., indices_only..., weights_only...].
  """

  def __init__(self, weights_shape: Shape, indices_shape: Shape, dim):
    self.weights_shape = weights_shape
    self.indices_shape = indices_shape
    self.dim = dim
    self.shared = [d for d in indices_shape.dims if d in weights_shape.dims]
    self.indices_only = [
      d for d in indices_shape.dims if d not in weights_shape.dims
    ]
    self.weights_only = [
      d for d in weights_shape.dims if d != dim and d not in indices_shape.dims
    ]
    self.inner_shape_dims = self.shared + self.indices_only + self.weights_only

  def inner_shape(self, output_shape: Shape) -> Shape:
    """output_shape without the dims in neither input (broadcast after)."""
    names = set(_names(self.inner_shape_dims))
    return Shape([d for d in output_shape.dims if d.name in names])

  def valid_indices(self, ids: tf.Tensor, depth: int):
    """(ids clamped into [0, depth), mask of the ids that were in range)."""
    if ids.dtype not in (tf.int32, tf.int64):
      ids = tf.cast(ids, tf.int64)
    valid = tf.logical_and(ids >= 0, ids < depth)
    return tf.where(valid, ids, tf.zeros([], ids.dtype)), valid

  def gather_slice(
    self, w: tf.Tensor, ids: tf.Tensor, out_dims: Sequence
  ) -> tf.Tensor:
    """One slice's gather; out-of-range ids give zeros (as one_hot's)."""
    nshared = len(self.shared)
    w = _transpose_slice(
      w, self.weights_shape.dims, self.shared + [self.dim] + self.weights_only
    )
    ids = _transpose_slice(
      ids, self.indices_shape.dims, self.shared + self.indices_only
    )
    ids, valid = self.valid_indices(ids, self.dim.size)
    y = tf.gather(w, ids, axis=nshared, batch_dims=nshared)
    valid = tf.reshape(
      valid, valid.shape.as_list() + [1] * len(self.weights_only)
    )
    y = tf.where(valid, y, tf.zeros([], y.dtype))
    return _transpose_slice(y, self.inner_shape_dims, out_dims)

  def scatter_add_slice(
    self, dy: tf.Tensor, ids: tf.Tensor, dy_dims: Sequence
  ) -> tf.Tensor:
    """One slice's gradient: dy's rows summed into the rows ids name."""
    nshared = len(self.shared)
    depth = self.dim.size
    dy = _transpose_slice(dy, dy_dims, self.inner_shape_dims)
    ids = _transpose_slice(
      ids, self.indices_shape.dims, self.shared + self.indices_only
    )
    ids, valid = self.valid_indices(ids, depth)
    shared_sizes = ids.shape.as_list()[:nshared]
    row_shape = dy.shape.as_list()[len(ids.shape) :]
    num_batches = int(np.prod(shared_sizes, dtype=np.int64))
    if nshared:
      # One block of `depth` rows per position in the shared dims.
      offsets = tf.range(num_batches, dtype=ids.dtype) * depth
      ids += tf.reshape(offsets, shared_sizes + [1] * len(self.indices_only))
    # Out-of-range ids (clamped to row 0) add zeros. tf.scatter_nd sums
    # duplicates; unlike tf.math.unsorted_segment_sum it costs no more than
    # zeroing the result when there are many more rows than ids.
    valid = tf.reshape(valid, valid.shape.as_list() + [1] * len(row_shape))
    dy = tf.where(valid, dy, tf.zeros([], dy.dtype))
    sums = tf.scatter_nd(
      tf.reshape(ids, [-1, 1]),
      tf.reshape(dy, [-1] + row_shape),
      [num_batches * depth] + row_shape,
    )
    sums = tf.reshape(sums, shared_sizes + [depth] + row_shape)
    return _transpose_slice(
      sums,
      self.shared + [self.dim] + self.weights_only,
      self.weights_shape.dims,
    )


def _lower_one_hot_einsum(
  lowering,
  mesh_impl,
  indices: Tensor,
  laid_out_indices,
  dim,
  other: Tensor,
  laid_out_other,
  output_shape: Shape,
  other_first: bool = False,
):
  """einsum(one_hot(indices, dim), other) -> output_shape, laid out.

  The original's gather (other = weights) and its gradient (other = dy,
  other_first: the original's einsum gradient puts dy first, and below
  float32 the operand order changes the rounding): each processor makes the
  one-hot slice of its part of `dim`; contracting a split `dim` costs the
  einsum's allreduce.
  """
  one_hot_shape = Shape(indices.shape.dims + [dim])
  one_hots = lower_one_hot(
    mesh_impl, laid_out_indices, one_hot_shape, 1, 0, other.dtype
  )
  shapes = [one_hot_shape, other.shape]
  slices = [one_hots, laid_out_other]
  if other_first:
    shapes.reverse()
    slices.reverse()
  return einsum_lib.lower_einsum(
    lowering, mesh_impl, shapes, slices, other.dtype, output_shape
  )


def _rounds_like_einsum(dtype) -> bool:
  """Whether a gradient of this dtype is taken as the original's einsum.

  Below float32 every sum rounds, so only the original's op (the one-hot
  einsum, contracting the index dims and any broadcast dims at once) gives
  its numbers; a scatter-add rounds the repeated ids' sums differently.
  """
  return tf.as_dtype(dtype).size < 4


class GatherOperation(Operation):
  """weights[..., indices, ...] along `dim` (see the module docstring).

  Lowers to tf.gather per slice when the layout does not split `dim`, else to
  the one-hot einsum. Its gradient is a ScatterAddOperation.
  """

  def __init__(
    self,
    weights: Tensor,
    indices: Tensor,
    dim,
    output_shape,
    name: Optional[str] = None,
  ):
    super().__init__([weights, indices], name=name or "gather")
    self._dim = dim
    self._dims = _GatherDims(weights.shape, indices.shape, dim)
    self._outputs = [Tensor(self, output_shape, weights.dtype)]

  def gradient(
    self, grad_ys: Sequence[Optional[Tensor]]
  ) -> Sequence[Optional[Tensor]]:
    dy = grad_ys[0]
    weights, indices = self.inputs
    inner_shape = self._dims.inner_shape(dy.shape)
    if inner_shape != dy.shape and not _rounds_like_einsum(dy.dtype):
      # Broadcast output dims: sum them first.
      dy = reduce_lib.reduce_sum(dy, output_shape=inner_shape)
    return [
      ScatterAddOperation(dy, indices, self._dim, weights.shape).outputs[0],
      None,
    ]

  def lower(self, lowering) -> None:
    mesh_impl = lowering.mesh_impl(self)
    weights, indices = self.inputs
    out_shape = self.outputs[0].shape
    laid_out_weights = lowering.tensors[weights]
    laid_out_indices = lowering.tensors[indices]
    if mesh_impl.tensor_dimension_to_mesh_axis(self._dim) is not None:
      y = _lower_one_hot_einsum(
        lowering,
        mesh_impl,
        indices,
        laid_out_indices,
        self._dim,
        weights,
        laid_out_weights,
        out_shape,
      )
    else:
      dims = self._dims
      inner_shape = dims.inner_shape(out_shape)
      y = mesh_impl.slicewise(
        lambda w, ids: dims.gather_slice(w, ids, inner_shape.dims),
        laid_out_weights,
        laid_out_indices,
      )
      if inner_shape != out_shape:
        y = mesh_impl.broadcast_impl(y, inner_shape, out_shape)
      lowering.add_counter("gather", mesh_impl.laid_out_size(out_shape))
    lowering.set_tensor_lowering(self.outputs[0], y)


class ScatterAddOperation(Operation):
  """The gradient of GatherOperation: sums dy's rows into weights_shape.

  When `dim` is not split: a scatter-add per slice, then (lazily) the
  allreduce over the mesh axes splitting the dims of indices that weights
  lack, the axes over which the one-hot einsum's gradient contracts. When
  `dim` is split: that one-hot einsum.
  """

  def __init__(
    self,
    dy: Tensor,
    indices: Tensor,
    dim,
    weights_shape: Shape,
    name: Optional[str] = None,
  ):
    super().__init__([dy, indices], name=name or "scatter_add")
    self._dim = dim
    self._dims = _GatherDims(weights_shape, indices.shape, dim)
    self._outputs = [Tensor(self, weights_shape, dy.dtype)]

  def gradient(
    self, grad_ys: Sequence[Optional[Tensor]]
  ) -> Sequence[Optional[Tensor]]:
    dy, indices = self.inputs
    return [
      GatherOperation(grad_ys[0], indices, self._dim, dy.shape).outputs[0],
      None,
    ]

  def lower(self, lowering) -> None:
    mesh_impl = lowering.mesh_impl(self)
    dy, indices = self.inputs
    weights_shape = self.outputs[0].shape
    laid_out_dy = lowering.tensors[dy]
    laid_out_indices = lowering.tensors[indices]
    if mesh_impl.tensor_dimension_to_mesh_axis(
      self._dim
    ) is not None or _rounds_like_einsum(dy.dtype):
      y = _lower_one_hot_einsum(
        lowering,
        mesh_impl,
        indices,
        laid_out_indices,
        self._dim,
        dy,
        laid_out_dy,
        weights_shape,
        other_first=True,
      )
    else:
      dims = self._dims
      y = mesh_impl.slicewise(
        lambda g, ids: dims.scatter_add_slice(g, ids, dy.shape.dims),
        laid_out_dy,
        laid_out_indices,
      )
      lowering.add_counter("scatter_add", mesh_impl.laid_out_size(dy.shape))
      reduced_mesh_axes = sorted(
        set(
          mesh_impl.tensor_dimension_to_mesh_axis(d) for d in dims.indices_only
        )
        - {None}
      )
      if reduced_mesh_axes:
        counter = "allreduce/%s/scatter_add_op" % reduced_mesh_axes
        y = LazyAllreduceSum(
          mesh_impl,
          y,
          reduced_mesh_axes,
          add_counter_fn=lambda: lowering.add_counter(
            counter, mesh_impl.laid_out_size(weights_shape)
          ),
        )
    lowering.set_tensor_lowering(self.outputs[0], y)


def gather(weights: Tensor, indices, dim, output_shape=None) -> Tensor:
  """weights[..., indices, ...] along `dim`: einsum(one_hot(indices), w).

  The result is that einsum's (out-of-range indices give zeros); it is
  computed with tf.gather when the layout does not split `dim` (see the
  module docstring).

  Args:
    weights: the tensor to gather from; must have dimension `dim`.
    indices: an integer mtf Tensor, or a Python int (a scalar index).
    dim: the dimension of weights that is indexed (and removed).
    output_shape: optional output shape; default is the dims of indices
      followed by the dims of weights other than `dim`.

  Returns:
    a Tensor of weights' dtype.

  Example:
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> embedding_np = np.arange(8.0, dtype=np.float32).reshape([4, 2])
    >>> embedding = converter.convert_np_array_to_mtf_tensor(
    ...     embedding_np, ["vocab", "d_model"], dtype=tf.float32)
    >>> ids = converter.convert_np_array_to_mtf_tensor(
    ...     [[3, 0, 1]], ["batch", "length"])
    >>> y = mtf.gather(embedding, ids, embedding.shape.dims[0])
    >>> y.shape
    Shape[batch=1, length=3, d_model=2]
    >>> converter.convert_mtf_tensor_to_np_array(y)
    array([[[6., 7.],
            [0., 1.],
            [2., 3.]]], dtype=float32)
  """
  dim = convert_to_dimension(dim)
  if dim not in weights.shape.dims:
    raise ValueError(
      "gather: dimension %s is not a dimension of weights %s"
      % (dim, weights.to_string)
    )
  if not isinstance(indices, Tensor):
    if np.ndim(indices) != 0:
      raise ValueError(
        "gather: indices must be an mtf Tensor or a Python "
        "int, got %r" % (indices,)
      )
    indices = io.constant(weights.mesh, int(indices), shape=[], dtype=tf.int32)
  if not indices.dtype.is_integer:
    raise ValueError(
      "gather: indices %s must have an integer dtype, got %s"
      % (indices.name, indices.dtype.name)
    )
  if dim.name in indices.shape.dimension_names:
    raise ValueError(
      "gather: dimension %s is already a dimension of indices "
      "%s" % (dim, indices.to_string)
    )
  if weights.dtype == tf.bool:
    return elementwise.cast(
      gather(elementwise.to_float(weights), indices, dim, output_shape), tf.bool
    )
  one_hot_shape = Shape(indices.shape.dims + [dim])
  output_shape = einsum_lib.einsum_output_shape(
    [one_hot_shape, weights.shape],
    output_shape,
    reduced_dims=[dim],
    descriptions=["one_hot(%s)" % indices.to_string, weights.to_string],
  )
  return GatherOperation(weights, indices, dim, output_shape).outputs[0]


class RangeOperation(Operation):
  """The 1-D tensor [0, 1, ..., dim.size - 1]; each processor makes its part.

  Args:
    mesh: the mtf Mesh.
    dim: the Dimension (or its name and size) of the result.
    dtype: the tf.DType of the result.
    name: an optional name for the operation.
  """

  def __init__(self, mesh: Mesh, dim, dtype, name: Optional[str] = None):
    super().__init__([], mesh, name=name or "range")
    dim = convert_to_dimension(dim)
    self._dim = dim
    self._outputs = [Tensor(self, Shape([dim]), dtype)]

  def lower(self, lowering) -> None:
    mesh_impl = lowering.mesh_impl(self)
    out = self.outputs[0]
    size = mesh_impl.slice_shape(out.shape)[0]
    dtype = out.dtype
    # tf.range has no kernels for bfloat16/float16: count in int64, then cast.
    compute_dtype = dtype if dtype in (tf.int32, tf.int64) else tf.int64

    def range_fn(begin):
      start = begin[0]
      if isinstance(start, int):
        values = tf.range(start, start + size, dtype=compute_dtype)
      else:
        values = tf.range(size, dtype=compute_dtype) + tf.cast(
          start, compute_dtype
        )
      return tf.cast(values, dtype)

    lowering.set_tensor_lowering(
      out,
      mesh_impl.slicewise(range_fn, mesh_impl.laid_out_slice_begin(out.shape)),
    )


def mtf_range(mesh: Mesh, dim, dtype, name: Optional[str] = None) -> Tensor:
  """[0, dim.size) along `dim` (also exported as `mtf.range`).

  Example:
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> x = mtf.range(converter.mesh, mtf.Dimension("length", 5), tf.int32)
    >>> x.shape
    Shape[length=5]
    >>> converter.convert_mtf_tensor_to_np_array(x)
    array([0, 1, 2, 3, 4], dtype=int32)

  Args:
    mesh: the mtf Mesh.
    dim: the Dimension (or its name and size) of the result.
    dtype: the tf.DType of the result.
    name: an optional name for the operation.

  Returns:
    a 1-D mtf Tensor of shape [dim].
  """
  return RangeOperation(mesh, dim, dtype, name=name).outputs[0]


__all__ = [
  "OneHotOperation",
  "RangeOperation",
  "gather",
  "mtf_range",
  "one_hot",
]
