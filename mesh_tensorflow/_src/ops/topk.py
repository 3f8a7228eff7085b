"""top_k, top_1, argmax, nth largest/smallest element and sampling.

Everything is built on one operation, TopKOperation: the k largest values of
`x` along `reduced_dim` (sorted, largest first) and their int32 indices along
a new last dimension `k_dim`. Ties resolve exactly as in tf.math.top_k: among
equal values the lowest index comes first, on every mesh and layout.

When `reduced_dim` is split over a mesh axis, each processor first finds the
top candidates of its own slice, turns their indices into global indices (by
adding its slice begin) and the candidates are allconcatenated over that mesh
axis, in processor-coordinate (hence global index) order; a final local
selection then gives the same answer everywhere. Two selection algorithms:

- k < 5: k rounds of "top-1": the maximum of the not-yet-taken elements and
  the lowest index holding it, one allconcat of one value and one index per
  processor per round (the original's choice for small k). Elements already
  taken are tracked with a mask, so there is no need for the original's
  "subtract 1e9" trick, which broke for values beyond +-1e9 and for -inf.
- k >= 5: tf.math.top_k on each slice, allconcat of the k (or fewer)
  candidates per processor, tf.math.top_k again.
An unsplit reduced_dim needs no communication: one tf.math.top_k per slice
(the same result as the rounds, with far fewer TF ops).

The gradient of the values scatters dy to the selected positions through a
one-hot matrix (einsum), so it is correct on any layout.
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf

from mesh_tensorflow._src.graph import Operation
from mesh_tensorflow._src.graph import Tensor
from mesh_tensorflow._src.ops import einsum as einsum_lib
from mesh_tensorflow._src.ops import elementwise
from mesh_tensorflow._src.ops import gather as gather_lib
from mesh_tensorflow._src.ops import random as random_lib
from mesh_tensorflow._src.ops import reshape as reshape_lib
from mesh_tensorflow._src.ops import tensor_ops
from mesh_tensorflow._src.ops.slicewise import check_splits_allowed
from mesh_tensorflow._src.shapes import Dimension
from mesh_tensorflow._src.shapes import convert_to_dimension
from mesh_tensorflow._src.shapes import list_product

# With a split reduced dim, k below this uses rounds of top-1 selections (the
# original's threshold).
_ROUNDS_MAX_K = 5
# Uniform samples for the Gumbel trick lie in [_TINY, 1): -log(-log(u)) stays
# finite.
_TINY = 1e-9


def _lowest_value(dtype: tf.DType):
  if dtype.is_floating:
    return -np.inf
  return dtype.min


def _check_reduced_dim(x: Tensor, reduced_dim, op_name: str) -> Dimension:
  if not isinstance(x, Tensor):
    raise TypeError("%s: x must be an mtf Tensor, got %r" % (op_name, x))
  reduced_dim = convert_to_dimension(reduced_dim)
  if reduced_dim not in x.shape.dims:
    raise ValueError(
      "%s: reduced_dim %s is not a dimension of x %s"
      % (op_name, reduced_dim, x.shape.to_string)
    )
  return reduced_dim


class TopKOperation(Operation):
  """The k largest values along reduced_dim and their int32 indices.

  Outputs have shape x.shape - reduced_dim + k_dim (k_dim last); k = k_dim.size.
  k_dim may not be split; reduced_dim may (see the module docstring).

  Example:
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> logits = converter.convert_np_array_to_mtf_tensor(
    ...     [[0.5, 2.0, -1.0, 3.0]], ["batch", "vocab"], dtype=tf.float32)
    >>> vocab = logits.shape.dims[1]
    >>> op = mtf.TopKOperation(logits, vocab, mtf.Dimension("k", 2))
    >>> values, indices = op.outputs
    >>> values.shape
    Shape[batch=1, k=2]
    >>> converter.convert_mtf_tensor_to_np_array(indices)
    array([[3, 1]], dtype=int32)

  Args:
    x: a floating or integer mtf Tensor.
    reduced_dim: the Dimension of x to take the top k along.
    k_dim: the Dimension of the outputs holding the k values, k = k_dim.size.
    name: an optional name for the operation.
  """

  def __init__(self, x: Tensor, reduced_dim, k_dim, name: Optional[str] = None):
    reduced_dim = _check_reduced_dim(x, reduced_dim, "top_k")
    k_dim = convert_to_dimension(k_dim)
    if k_dim is None:
      raise ValueError("top_k: k_dim must be a Dimension, got None")
    if k_dim.name in x.shape.dimension_names:
      raise ValueError(
        "top_k: k_dim %s has the name of a dimension of x %s"
        % (k_dim, x.shape.to_string)
      )
    if not 1 <= k_dim.size <= reduced_dim.size:
      raise ValueError(
        "top_k: k = k_dim.size must be in [1, reduced_dim.size]; got k_dim "
        "%s and reduced_dim %s" % (k_dim, reduced_dim)
      )
    if x.dtype == tf.bool or not (x.dtype.is_floating or x.dtype.is_integer):
      raise ValueError(
        "top_k: x %s must have a real number dtype, got %s"
        % (x.name, x.dtype.name)
      )
    super().__init__([x], name=name or "top_k")
    self._reduced_dim = reduced_dim
    self._k_dim = k_dim
    output_shape = x.shape - reduced_dim + k_dim
    self._outputs = [
      Tensor(self, output_shape, x.dtype, index=0),
      Tensor(self, output_shape, tf.int32, index=1),
    ]
    self._initialize_splittable_and_unsplittable_dims(
      "splittable", [k_dim.name]
    )

  @property
  def reduced_dim(self) -> Dimension:
    """The dimension of the input the top k are taken along."""
    return self._reduced_dim

  @property
  def k_dim(self) -> Dimension:
    """The dimension of the output holding the k largest values."""
    return self._k_dim

  def gradient(
    self, grad_ys: Sequence[Optional[Tensor]]
  ) -> Sequence[Optional[Tensor]]:
    dvalues = grad_ys[0]
    x = self.inputs[0]
    if dvalues is None:
      return [None]
    selection = gather_lib.one_hot(
      self.outputs[1], self._reduced_dim, dtype=dvalues.dtype
    )
    return [einsum_lib.einsum([dvalues, selection], output_shape=x.shape)]

  def lower(self, lowering) -> None:
    values_out, indices_out = self.outputs
    check_splits_allowed(
      self,
      lowering,
      self.outputs,
      [d.name for d in values_out.shape.dims if d != self._k_dim],
    )
    mesh_impl = lowering.mesh_impl(self)
    x = self.inputs[0]
    k = self._k_dim.size
    reduced_size = self._reduced_dim.size
    rank = x.shape.ndims
    reduced_axis = x.shape.dims.index(self._reduced_dim)
    perm = [a for a in range(rank) if a != reduced_axis] + [reduced_axis]

    def to_reduced_last(t):
      return tf.transpose(t, perm) if perm != sorted(perm) else t

    t = mesh_impl.slicewise(
      to_reduced_last, lowering.tensors[x].to_laid_out_tensor()
    )
    mesh_axis = mesh_impl.tensor_dimension_to_mesh_axis(self._reduced_dim)
    if mesh_axis is None:
      begins = 0
    else:
      # Global index of each processor's first element of reduced_dim.
      begins = mesh_impl.slicewise(
        lambda b: b[reduced_axis], mesh_impl.laid_out_slice_begin(x.shape)
      )
    if mesh_axis is not None and k < _ROUNDS_MAX_K:
      values, indices = self._lower_rounds(
        lowering, mesh_impl, mesh_axis, t, begins, k, reduced_size
      )
    else:
      values, indices = self._lower_sorted(
        lowering, mesh_impl, mesh_axis, t, begins, k
      )
    lowering.set_tensor_lowering(values_out, values)
    lowering.set_tensor_lowering(indices_out, indices)

  def _allconcat(self, lowering, mesh_impl, mesh_axis, values, indices):
    """Candidates of all processors along mesh_axis, in coordinate order."""
    lowering.add_counter(
      "allconcat/%d/top_k" % mesh_axis,
      2
      * mesh_impl.size
      * list_product(values.slice_shape)
      * mesh_impl.shape.dims[mesh_axis].size,
    )
    concat_axis = len(values.slice_shape) - 1
    return (
      mesh_impl.allconcat(values, mesh_axis, concat_axis),
      mesh_impl.allconcat(indices, mesh_axis, concat_axis),
    )

  def _lower_rounds(
    self, lowering, mesh_impl, mesh_axis, t, begins, k, reduced_size
  ):
    """k rounds of top-1 over a split dim, one allconcat per round."""
    taken = mesh_impl.slicewise(lambda s: tf.zeros(s.shape, tf.bool), t)
    values, indices = [], []
    for _ in range(k):
      best, index = mesh_impl.slicewise(
        lambda s, tk, b: _local_top1(s, tk, b, reduced_size), t, taken, begins
      )
      all_best, all_index = self._allconcat(
        lowering,
        mesh_impl,
        mesh_axis,
        mesh_impl.slicewise(lambda v: v[..., None], best),
        mesh_impl.slicewise(lambda i: i[..., None], index),
      )
      best, index = mesh_impl.slicewise(
        lambda v, i: _pick_best(v, i, reduced_size), all_best, all_index
      )
      values.append(best)
      indices.append(index)
      if len(values) < k:
        taken = mesh_impl.slicewise(_mark_taken, taken, index, begins)
    stack = lambda *ts: tf.stack(list(ts), axis=-1)
    return (
      mesh_impl.slicewise(stack, *values),
      mesh_impl.slicewise(stack, *indices),
    )

  def _lower_sorted(self, lowering, mesh_impl, mesh_axis, t, begins, k):
    """tf.math.top_k per slice, then (split dim) over all candidates."""

    def local_top_k(s, b):
      values, positions = tf.math.top_k(
        s, min(k, s.shape.as_list()[-1]), sorted=True
      )
      return values, positions + tf.cast(b, tf.int32)

    values, indices = mesh_impl.slicewise(local_top_k, t, begins)
    if mesh_axis is None:
      return values, indices
    values, indices = self._allconcat(
      lowering, mesh_impl, mesh_axis, values, indices
    )

    def global_top_k(all_values, all_indices):
      # Candidates come in processor-coordinate order, so equal values are
      # in global index order, and tf.math.top_k keeps the first of them.
      top_values, positions = tf.math.top_k(all_values, k, sorted=True)
      return top_values, tf.gather(
        all_indices, positions, batch_dims=all_values.shape.rank - 1
      )

    return mesh_impl.slicewise(global_top_k, values, indices)


def _local_top1(t: tf.Tensor, taken: tf.Tensor, offset, reduced_size: int):
  """Max of the untaken elements of a slice and its lowest global index."""
  shard = t.shape.as_list()[-1]
  available = tf.logical_not(taken)
  lowest = tf.constant(_lowest_value(t.dtype), dtype=t.dtype)
  best = tf.reduce_max(tf.where(available, t, lowest), axis=-1)
  is_best = tf.logical_and(available, tf.equal(t, best[..., None]))
  local = tf.reduce_min(
    tf.where(is_best, tf.range(shard, dtype=tf.int32), shard), axis=-1
  )
  # A slice with nothing left offers (lowest, reduced_size): it loses all ties.
  index = tf.where(
    local < shard, local + tf.cast(offset, tf.int32), reduced_size
  )
  return best, index


def _pick_best(values: tf.Tensor, indices: tf.Tensor, reduced_size: int):
  """Largest candidate value and, among equal ones, the lowest index."""
  best = tf.reduce_max(values, axis=-1)
  index = tf.reduce_min(
    tf.where(tf.equal(values, best[..., None]), indices, reduced_size), axis=-1
  )
  return best, index


def _mark_taken(taken: tf.Tensor, index: tf.Tensor, offset) -> tf.Tensor:
  positions = tf.range(taken.shape.as_list()[-1], dtype=tf.int32) + tf.cast(
    offset, tf.int32
  )
  return tf.logical_or(taken, tf.equal(positions, index[..., None]))


def top_k(
  x: Tensor, reduced_dim, k_dim, name: Optional[str] = None
) -> Tuple[Tensor, Tensor]:
  """Like tf.math.top_k along a named dimension.

  Args:
    x: a Tensor of a real number dtype.
    reduced_dim: the Dimension of x to select from.
    k_dim: a new Dimension; its size is k (1 <= k <= reduced_dim.size).
    name: optional operation name.

  Returns:
    (values, indices): shape x.shape - reduced_dim + k_dim, values of x's
    dtype sorted largest first, int32 indices into reduced_dim (the lowest
    index first among equal values).

  Raises:
    ValueError: if reduced_dim is not in x, k is out of range, or k_dim is
      already a dimension of x; at lowering, if k_dim is split.

  Example:
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> logits_np = np.array([[0.5, 2.0, -1.0, 3.0], [4.0, 1.0, 1.0, 0.0]])
    >>> logits = converter.convert_np_array_to_mtf_tensor(
    ...     logits_np, ["batch", "vocab"], dtype=tf.float32)
    >>> vocab = logits.shape.dims[1]
    >>> values, indices = mtf.top_k(logits, vocab, mtf.Dimension("k", 3))
    >>> values.shape
    Shape[batch=2, k=3]
    >>> converter.convert_mtf_tensor_to_np_array(values)
    array([[3. , 2. , 0.5],
           [4. , 1. , 1. ]], dtype=float32)
    >>> converter.convert_mtf_tensor_to_np_array(indices)  # ties: lowest first
    array([[3, 1, 0],
           [0, 1, 2]], dtype=int32)
    >>> np.array_equal(converter.convert_mtf_tensor_to_np_array(indices),
    ...                tf.math.top_k(logits_np, 3).indices)
    True
  """
  op = TopKOperation(x, reduced_dim, k_dim, name=name)
  return op.outputs[0], op.outputs[1]


_ONE = "_top_1"


def top_1(
  x: Tensor, reduced_dim, name: Optional[str] = None
) -> Tuple[Tensor, Tensor]:
  """(max, argmax) along reduced_dim; ties go to the lowest index.

  Example:
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> x = converter.convert_np_array_to_mtf_tensor(
    ...     [[0.5, 2.0, 2.0], [4.0, 1.0, 0.0]], ["batch", "vocab"],
    ...     dtype=tf.float32)
    >>> values, indices = mtf.top_1(x, x.shape.dims[1])
    >>> indices.shape
    Shape[batch=2]
    >>> converter.convert_mtf_tensor_to_np_array(values)
    array([2., 4.], dtype=float32)
    >>> converter.convert_mtf_tensor_to_np_array(indices)
    array([1, 0], dtype=int32)

  Args:
    x: an mtf Tensor.
    reduced_dim: the Dimension of x to reduce.
    name: an optional name for the operation.

  Returns:
    (values, indices): mtf Tensors with the dims of x but reduced_dim; values
    has x's dtype, indices are int32.
  """
  reduced_dim = _check_reduced_dim(x, reduced_dim, "top_1")
  one = Dimension(_ONE, 1)
  values, indices = top_k(x, reduced_dim, one, name=name or "top_1")
  return (
    reshape_lib.reshape(values, values.shape - one),
    reshape_lib.reshape(indices, indices.shape - one),
  )


def argmax(x: Tensor, reduced_dim, name: Optional[str] = None) -> Tensor:
  """int32 index of the maximum along reduced_dim (lowest index on ties).

  Args:
    x: an mtf Tensor.
    reduced_dim: the Dimension of x to reduce.
    name: an optional name for the operation.

  Returns:
    an int32 mtf Tensor with the dims of x but reduced_dim.
  """
  return top_1(x, reduced_dim, name=name or "argmax")[1]


def nth_largest_element(
  x: Tensor, n: int, reduced_dim, name: Optional[str] = None
) -> Tensor:
  """The n-th largest value along reduced_dim; n is zero-based (0 = max).

  Example:
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> x = converter.convert_np_array_to_mtf_tensor([3, 1, 2], ["d"],
    ...                                              dtype=tf.float32)
    >>> converter.convert_mtf_tensor_to_np_array(
    ...     mtf.nth_largest_element(x, 1, x.shape.dims[0]))
    array(2., dtype=float32)

  Args:
    x: an mtf Tensor.
    n: the zero-based rank (0 = largest).
    reduced_dim: the Dimension of x to reduce.
    name: an optional name for the operation.

  Returns:
    an mtf Tensor with the dims of x but reduced_dim, and x's dtype.
  """
  reduced_dim = _check_reduced_dim(x, reduced_dim, "nth_largest_element")
  if (
    not isinstance(n, (int, np.integer))
    or isinstance(n, bool)
    or not 0 <= n < reduced_dim.size
  ):
    raise ValueError(
      "nth_largest_element: n must be an int in [0, %d) for "
      "reduced_dim %s, got %r" % (reduced_dim.size, reduced_dim, n)
    )
  k_dim = Dimension("_nth_element", int(n) + 1)
  values, _ = top_k(x, reduced_dim, k_dim, name=name or "nth_largest_element")
  nth = tensor_ops.mtf_slice(values, int(n), 1, k_dim.name)
  return reshape_lib.reshape(nth, nth.shape - nth.shape.dims[-1])


def nth_smallest_element(
  x: Tensor, n: int, reduced_dim, name: Optional[str] = None
) -> Tensor:
  """The n-th smallest value along reduced_dim; n is zero-based (0 = min).

  Args:
    x: an mtf Tensor.
    n: the zero-based rank (0 = smallest).
    reduced_dim: the Dimension of x to reduce.
    name: an optional name for the operation.

  Returns:
    an mtf Tensor with the dims of x but reduced_dim, and x's dtype.
  """
  return elementwise.negative(
    nth_largest_element(
      elementwise.negative(x),
      n,
      reduced_dim,
      name=name or "nth_smallest_element",
    )
  )


def sample_with_temperature(
  logits: Tensor, dim, temperature=1.0, name: Optional[str] = None
) -> Tensor:
  """Samples int32 ids along dim from softmax(logits / temperature).

  Gumbel-max in float32: argmax(logits + temperature * g) with
  g = -log(-log(u)), u uniform in [1e-9, 1) from mtf.random_uniform, so the
  samples are the same on every mesh and layout. temperature 0 gives argmax.

  Args:
    logits: a Tensor.
    dim: the Dimension of logits to sample along (removed).
    temperature: a non-negative Python float, or a scalar float mtf Tensor.
    name: optional name prefix.

  Returns:
    an int32 Tensor of shape logits.shape - dim.

  Example:
    Temperature 0 is argmax; with temperature 1, sampling 4000 times picks
    each id about as often as its probability (0.1, 0.2, 0.7):

    >>> converter = mtf.test_utils.NumpyConverter()
    >>> logits = converter.convert_np_array_to_mtf_tensor(
    ...     np.log(np.tile([[0.1, 0.2, 0.7]], [4000, 1])), ["batch", "vocab"],
    ...     dtype=tf.float32)
    >>> vocab = logits.shape.dims[1]
    >>> ids = mtf.sample_with_temperature(logits, vocab, 0.0)
    >>> set(converter.convert_mtf_tensor_to_np_array(ids).tolist())
    {2}
    >>> ids = mtf.sample_with_temperature(logits, vocab, 1.0)
    >>> counts = np.bincount(converter.convert_mtf_tensor_to_np_array(ids))
    >>> np.allclose(counts / 4000, [0.1, 0.2, 0.7], atol=0.05)
    True
  """
  dim = _check_reduced_dim(logits, dim, "sample_with_temperature")
  name = name or "sample_with_temperature"
  if not isinstance(temperature, Tensor):
    if temperature < 0:
      raise ValueError(
        "sample_with_temperature: temperature must be >= 0, "
        "got %r" % (temperature,)
      )
    if temperature == 0:
      return argmax(logits, dim, name=name)
  u = random_lib.random_uniform(
    logits.mesh,
    logits.shape,
    minval=_TINY,
    maxval=1.0,
    dtype=tf.float32,
    name=name + "/uniform",
  )
  gumbel = elementwise.negative(
    elementwise.log(elementwise.negative(elementwise.log(u)))
  )
  if isinstance(temperature, Tensor):
    temperature = elementwise.cast(temperature, tf.float32)
  noisy = elementwise.cast(logits, tf.float32) + gumbel * temperature
  return argmax(noisy, dim, name=name)


__all__ = [
  "TopKOperation",
  "argmax",
  "nth_largest_element",
  "nth_smallest_element",
  "sample_with_temperature",
  "top_1",
  "top_k",
]
