"""Local (1-d and 2-d block) attention layers and their halo exchanges.

The sequence (or image) is cut into blocks along a "blocks" dimension, which
may be split across the mesh. Each query block attends to its own block plus
a halo of neighbouring positions; halos travel with mtf.shift along the blocks
dimension (a collective permute when that dimension is split) and are joined
with mtf.concat along the (never split) within-block dimension.

Example:
  With window 2, position p sees positions p - 1 and p: a change at position
  3 (the last of the first processor's half) reaches outputs 3 and 4.

  >>> converter = mtf.test_utils.NumpyConverter(
  ...     mesh_shape="all:2", layout="length:all", devices=["cpu:0", "cpu:1"])
  >>> mesh = converter.mesh
  >>> x = mtf.random_normal(mesh, "batch:1;length:8;d_model:4", seed=0)
  >>> def attend(x):
  ...   return mtf.layers.masked_local_attention_1d(
  ...       x, mtf.Dimension("d_kv", 2), mtf.Dimension("heads", 2),
  ...       is_training=False, window_size=2, length_per_split=4,
  ...       name="local")
  >>> y = converter.convert_mtf_tensor_to_np_array(attend(x))
  >>> at_3 = mtf.one_hot(mtf.constant(mesh, 3, dtype=tf.int32), x.shape.dims[1])
  >>> y_changed = converter.convert_mtf_tensor_to_np_array(attend(x + at_3))
  >>> np.any(y != y_changed, axis=(0, 2))  # which outputs changed
  array([False, False, False,  True,  True, False, False, False])
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import tensorflow as tf

from mesh_tensorflow._src.graph import Tensor
from mesh_tensorflow._src.layers import attention
from mesh_tensorflow._src.layers import attention_masks
from mesh_tensorflow._src.layers.attention import as_step_tensor
from mesh_tensorflow._src.layers.attention import check_cache
from mesh_tensorflow._src.layers.attention import check_heads_kv
from mesh_tensorflow._src.layers.attention import split_query
from mesh_tensorflow._src.layers.scope_util import layer_variable_scope
from mesh_tensorflow._src.ops import binary
from mesh_tensorflow._src.ops import einsum as einsum_lib
from mesh_tensorflow._src.ops import elementwise
from mesh_tensorflow._src.ops import reshape as reshape_lib
from mesh_tensorflow._src.ops import shift as shift_lib
from mesh_tensorflow._src.ops import tensor_ops
from mesh_tensorflow._src.ops.broadcast_binary import equal
from mesh_tensorflow._src.ops.broadcast_binary import greater
from mesh_tensorflow._src.ops.broadcast_binary import less_equal
from mesh_tensorflow._src.ops.broadcast_binary import logical_or
from mesh_tensorflow._src.ops.broadcast_binary import mod
from mesh_tensorflow._src.ops.gather import mtf_range
from mesh_tensorflow._src.shapes import Dimension
from mesh_tensorflow._src.shapes import Shape

tf1 = tf.compat.v1

__all__ = [
  "local_1d_halo_exchange",
  "local_2d_halo_exchange",
  "local_2d_self_attention_spatial_blocks",
  "local_self_attention_spatial_blocks",
  "masked_local_attention_1d",
  "masked_local_attention_1d_incremental",
]

_NEG_INF = -1e9


def _is_int(x) -> bool:
  return isinstance(x, int) and not isinstance(x, bool)


def _dim_of(x: Tensor, dim, what: str) -> Dimension:
  """The Dimension of x named like dim (a Dimension or name)."""
  name = dim if isinstance(dim, str) else getattr(dim, "name", None)
  if name is None or name not in x.shape.dimension_names:
    raise ValueError(
      "%s: dimension %r is not a dimension of %s"
      % (what, dim, x.shape.to_string)
    )
  return x.shape.get_dim_by_name(name)


def _halo(x: Tensor, blocks_dim, block_dim, left: int, right: int) -> Tensor:
  """Appends to every block `left` positions of the blocks before it and
  `right` positions of the blocks after it (zeros beyond the ends).

  x has a blocks dimension (which may be split across the mesh) and a
  within-block dimension of size B (not split); the result has the
  within-block dimension resized to left + B + right. Halos larger than B
  gather from several neighbouring blocks.
  """
  blocks_dim = _dim_of(x, blocks_dim, "halo exchange")
  block_dim = _dim_of(x, block_dim, "halo exchange")
  if blocks_dim == block_dim:
    raise ValueError(
      "halo exchange: blocks dimension and block dimension "
      "must differ, both are %s" % (blocks_dim,)
    )
  for side, size in (("left", left), ("right", right)):
    if not _is_int(size) or size < 0:
      raise ValueError(
        "halo exchange along %s: %s halo size must be a "
        "non-negative int, got %r" % (block_dim, side, size)
      )
  block = block_dim.size
  pieces = []
  n_full, rest = divmod(left, block)
  if rest:
    tail = tensor_ops.mtf_slice(x, block - rest, rest, block_dim.name)
    pieces.append(shift_lib.shift(tail, n_full + 1, blocks_dim, wrap=False))
  for k in range(n_full, 0, -1):
    pieces.append(shift_lib.shift(x, k, blocks_dim, wrap=False))
  pieces.append(x)
  n_full, rest = divmod(right, block)
  for k in range(1, n_full + 1):
    pieces.append(shift_lib.shift(x, -k, blocks_dim, wrap=False))
  if rest:
    head = tensor_ops.mtf_slice(x, 0, rest, block_dim.name)
    pieces.append(shift_lib.shift(head, -(n_full + 1), blocks_dim, wrap=False))
  if len(pieces) == 1:
    return x
  return tensor_ops.concat(pieces, block_dim.name)


def _pad_or_halo(
  x: Tensor, blocks_dim, block_dim: Dimension, halo_size: int, mask_right: bool
) -> Tensor:
  """Left (mask_right) or two-sided halo; zero padding if blocks_dim is None."""
  right = 0 if mask_right else halo_size
  if blocks_dim is None:
    block_dim = _dim_of(x, block_dim, "halo exchange")
    return tensor_ops.pad(x, [halo_size, right], block_dim.name)
  return _halo(x, blocks_dim, block_dim, halo_size, right)


def local_1d_halo_exchange(
  k: Tensor, v: Tensor, num_w_blocks, w_dim: Dimension, mask_right: bool
) -> Tuple[Tensor, Tensor]:
  """Halo exchange of keys and values for 1-d local block attention.

  Each block along w_dim receives the whole previous block (mask_right) or the
  previous and the next blocks, so w_dim grows to 2 or 3 times its size.
  With num_w_blocks None (a single block) the halo is zero padding.

  Args:
    k: keys with dims num_w_blocks (unless None) and w_dim.
    v: values, like k.
    num_w_blocks: the blocks Dimension (may be split on the mesh), or None.
    w_dim: the within-block Dimension (must not be split).
    mask_right: only a left halo.

  Returns:
    (k, v) with w_dim resized.
  """
  halo = w_dim.size
  return (
    _pad_or_halo(k, num_w_blocks, w_dim, halo, mask_right),
    _pad_or_halo(v, num_w_blocks, w_dim, halo, mask_right),
  )


def local_2d_halo_exchange(
  k: Tensor,
  v: Tensor,
  num_h_blocks,
  h_dim: Dimension,
  num_w_blocks,
  w_dim: Dimension,
  mask_right: bool,
) -> Tuple[Tensor, Tensor]:
  """Halo exchange of keys and values for 2-d local block attention.

  First along h (blocks num_h_blocks, halo h_dim.size), then along w (blocks
  num_w_blocks, halo w_dim.size), so corner blocks arrive too. mask_right
  gives top/left halos only (memory 2h x 2w), otherwise both sides (3h x 3w).
  A None blocks dimension means zero padding along that axis.

  Args:
    k: the keys, an mtf Tensor whose positions are laid out in blocks:
      num_h_blocks and num_w_blocks (when not None), then h_dim and w_dim.
    v: the values, laid out like k.
    num_h_blocks: the Dimension counting blocks along height, or None.
    h_dim: the Dimension of positions within a block along height (also the halo
      size).
    num_w_blocks: the Dimension counting blocks along width, or None.
    w_dim: the Dimension of positions within a block along width (also the halo
      size).
    mask_right: whether only the top and left halos are needed (masked
      attention).

  Returns:
    (k, v) with h_dim and w_dim resized.
  """
  for blocks_dim, block_dim in ((num_h_blocks, h_dim), (num_w_blocks, w_dim)):
    halo = block_dim.size
    if halo > 0:
      k = _pad_or_halo(k, blocks_dim, block_dim, halo, mask_right)
      v = _pad_or_halo(v, blocks_dim, block_dim, halo, mask_right)
  return k, v


def _get_params(
  mesh,
  heads,
  io_channels,
  kv_channels,
  master_dtype,
  slice_dtype,
  activation_dtype,
  params,
) -> List[Tensor]:
  if params is None:
    return attention.multihead_attention_vars(
      mesh,
      heads,
      io_channels,
      kv_channels,
      master_dtype,
      slice_dtype,
      activation_dtype,
    )
  params = list(params)
  expected = [heads, io_channels, kv_channels]
  if len(params) != 4:
    raise ValueError(
      "params must be a quadruple (wq, wk, wv, wo), got %d "
      "tensors" % len(params)
    )
  for name, w in zip("qkvo", params):
    if w.shape.dims != expected:
      raise ValueError(
        "params: w%s has shape %s, expected %s"
        % (name, w.shape.to_string, Shape(expected).to_string)
      )
  return params


def masked_local_attention_1d(
  x: Tensor,
  kv_channels: Dimension,
  heads: Dimension,
  is_training: bool,
  window_size: int = 128,
  master_dtype=tf.float32,
  slice_dtype=tf.float32,
  length_per_split: Optional[int] = None,
  return_kv: Optional[list] = None,
  params=None,
  name: Optional[str] = None,
) -> Tensor:
  """Causal local self-attention: position p sees positions (p - window, p].

  The length is cut into blocks of the largest divisor of length_per_split
  that is <= max(window_size, 128); the blocks dimension keeps the length's
  name, so it is split like the length. Keys/values of the previous
  window_size positions arrive by a left halo exchange. Positions before the
  start are zero keys/values and stay visible (as in the original), which is
  exactly what masked_local_attention_1d_incremental computes.
  Variables: "<scope>/qkvo" unless params is given.

  Args:
    x: [<batch_dims>, length, io_channels].
    kv_channels: Dimension of keys and values per head.
    heads: the heads Dimension.
    is_training: a Python bool (unused: no dropout here).
    window_size: positive int, the attention window.
    master_dtype: master dtype of the variable.
    slice_dtype: slice dtype of the variable.
    length_per_split: length per processor when the length is split (must
      divide the length); blocks then never straddle processors.
    return_kv: optional list; k and v ([<batch_dims>, heads, length,
      kv_channels]) are appended to it.
    params: optional (wq, wk, wv, wo), each [heads, io_channels, kv_channels].
    name: variable scope name (default "masked_local_attention_1d").

  Returns:
    a Tensor shaped like x.

  Raises:
    ValueError: on a bad window_size or length_per_split, or mismatched dims.
  """
  del is_training  # No dropout in this layer.
  batch_dims, length, io_channels = split_query(x, "masked_local_attention_1d")
  check_heads_kv(heads, kv_channels, x, "masked_local_attention_1d")
  if not _is_int(window_size) or window_size < 1:
    raise ValueError(
      "masked_local_attention_1d: window_size must be a "
      "positive int, got %r" % (window_size,)
    )
  if length_per_split is None:
    length_per_split = length.size
  if (
    not _is_int(length_per_split)
    or length_per_split < 1
    or length.size % length_per_split
  ):
    raise ValueError(
      "masked_local_attention_1d: length_per_split %r must be a positive "
      "int dividing the size of the length dimension %s"
      % (length_per_split, length)
    )
  for reserved in ("query_block_length", "memory_block_length"):
    if reserved in x.shape.dimension_names:
      raise ValueError(
        "masked_local_attention_1d: input %s must not have a "
        "dimension named %r" % (x.shape.to_string, reserved)
      )
  with layer_variable_scope(x.mesh.graph, name, "masked_local_attention_1d"):
    wq, wk, wv, wo = _get_params(
      x.mesh,
      heads,
      io_channels,
      kv_channels,
      master_dtype,
      slice_dtype,
      x.dtype,
      params,
    )
    qkv_shape = Shape(batch_dims + [heads, length, kv_channels])
    q = einsum_lib.einsum([x, wq], qkv_shape)
    k = einsum_lib.einsum([x, wk], qkv_shape)
    v = einsum_lib.einsum([x, wv], qkv_shape)
    if return_kv is not None:
      return_kv.extend([k, v])

    block_length = max(window_size, 128)
    while length_per_split % block_length:
      block_length -= 1
    query_block = Dimension("query_block_length", block_length)
    memory_block = Dimension("memory_block_length", block_length)
    num_blocks = Dimension(length.name, length.size // block_length)
    q = reshape_lib.reshape(
      q, batch_dims + [heads, num_blocks, query_block, kv_channels]
    )
    kv_shape = batch_dims + [heads, num_blocks, memory_block, kv_channels]
    k = _halo(
      reshape_lib.reshape(k, kv_shape), num_blocks, memory_block, window_size, 0
    )
    v = _halo(
      reshape_lib.reshape(v, kv_shape), num_blocks, memory_block, window_size, 0
    )
    # Memory position m of a block's padded memory is query position
    # m - window_size; query i sees memory (i, i + window_size].
    padded = k.shape.get_dim_by_name(memory_block.name)
    mpos = mtf_range(x.mesh, padded, tf.int32)
    qpos = mtf_range(x.mesh, query_block, tf.int32) + window_size
    mask_shape = Shape([query_block, padded])
    hidden = logical_or(
      greater(mpos, qpos, output_shape=mask_shape),
      less_equal(mpos, qpos - window_size, output_shape=mask_shape),
    )
    mask = elementwise.cast(hidden, x.dtype) * _NEG_INF
    o = attention.dot_product_attention(q, k, v, mask, False)
    o = reshape_lib.reshape(o, batch_dims + [heads, length, kv_channels])
    return einsum_lib.einsum([o, wo], Shape(batch_dims + [length, io_channels]))


def masked_local_attention_1d_incremental(
  x: Tensor,
  prev_k: Tensor,
  prev_v: Tensor,
  step_num,
  master_dtype=None,
  slice_dtype=None,
  params=None,
  name: Optional[str] = None,
) -> Tuple[Tensor, Tensor, Tensor]:
  """One decoding step of masked_local_attention_1d with a ring-buffer cache.

  The cache holds the last window_length keys/values; the new ones are
  written at slot step_num % window_length and the query attends to the whole
  buffer (unwritten slots are zero, like the zero pre-time positions of the
  full layer).

  Args:
    x: [batch..., io_channels], the input at step_num.
    prev_k: [batch..., heads, window_length, kv_channels].
    prev_v: like prev_k.
    step_num: scalar int32 mtf Tensor (or Python int).
    master_dtype: master dtype of the variable (None: float32).
    slice_dtype: slice dtype of the variable (None: master_dtype).
    params: optional (wq, wk, wv, wo), each [heads, io_channels, kv_channels].
    name: variable scope name (default "masked_local_attention_1d").

  Returns:
    (y [batch..., io_channels], new_k, new_v).

  Raises:
    ValueError: if the cache does not match x.
  """
  batch_dims = x.shape.dims[:-1]
  io_channels = x.shape.dims[-1]
  heads, window_length, kv_channels = check_cache(
    prev_k, prev_v, batch_dims, "masked_local_attention_1d_incremental"
  )
  step_num = as_step_tensor(x.mesh, step_num)
  with layer_variable_scope(x.mesh.graph, name, "masked_local_attention_1d"):
    wq, wk, wv, wo = _get_params(
      x.mesh,
      heads,
      io_channels,
      kv_channels,
      master_dtype,
      slice_dtype,
      x.dtype,
      params,
    )
    step_shape = Shape(batch_dims + [heads, kv_channels])
    q = einsum_lib.einsum([x, wq], step_shape)
    k = einsum_lib.einsum([x, wk], step_shape)
    v = einsum_lib.einsum([x, wv], step_shape)
    current = equal(
      mtf_range(x.mesh, window_length, dtype=tf.int32),
      mod(step_num, window_length.size),
    )
    k = binary.where(current, k, prev_k, output_shape=prev_k.shape)
    v = binary.where(current, v, prev_v, output_shape=prev_v.shape)
    o = attention.dot_product_attention(q, k, v, None, False)
    y = einsum_lib.einsum([o, wo], x.shape)
    return y, k, v


def _memory_name(query_dim: Dimension) -> str:
  return "memory_" + query_dim.name


def local_self_attention_spatial_blocks(
  query_antecedent: Tensor,
  kv_channels: Dimension,
  heads: Dimension,
  is_training: bool,
  memory_w_dim=None,
  mask_right: bool = False,
  master_dtype=tf.float32,
  slice_dtype=tf.float32,
  name: Optional[str] = None,
) -> Tensor:
  """Self-attention within 1-d blocks plus neighbouring blocks.

  A query sees its own block and the previous block (mask_right: causally
  within its own block) or the previous and the next block (zero keys/values
  beyond the ends). Variables: "<scope>/qkvo".

  Args:
    query_antecedent: [<batch_dims>, num_w_blocks, w_dim, io_channels]; the
      blocks dim may be split across the mesh (halo exchange communicates).
    kv_channels: Dimension of keys and values per head.
    heads: the heads Dimension.
    is_training: a Python bool (unused: no dropout here).
    memory_w_dim: ignored, as in the original: the memory block dim is
      always named "memory_" + w_dim.name (callers such as tensor2tensor's
      image transformer pass the query's own block dim here).
    mask_right: causal attention.
    master_dtype: master dtype of the variable.
    slice_dtype: slice dtype of the variable.
    name: variable scope name (default "multihead_attention").

  Returns:
    a Tensor shaped like query_antecedent.
  """
  del is_training
  if query_antecedent.shape.ndims < 3:
    raise ValueError(
      "local_self_attention_spatial_blocks: input must be "
      "[<batch_dims>, num_w_blocks, w_dim, io_channels], got %s"
      % query_antecedent.shape.to_string
    )
  check_heads_kv(
    heads, kv_channels, query_antecedent, "local_self_attention_spatial_blocks"
  )
  batch_dims = query_antecedent.shape.dims[:-3]
  num_w_blocks, w_dim, io_channels = query_antecedent.shape.dims[-3:]
  del memory_w_dim  # Ignored, as in the original.
  memory_name = _memory_name(w_dim)
  if memory_name in query_antecedent.shape.dimension_names:
    raise ValueError(
      "local_self_attention_spatial_blocks: memory dimension "
      "name %r is already used in %s"
      % (memory_name, query_antecedent.shape.to_string)
    )
  mesh = query_antecedent.mesh
  with layer_variable_scope(
    query_antecedent.mesh.graph, name, "multihead_attention"
  ):
    wq, wk, wv, wo = attention.multihead_attention_vars(
      mesh,
      heads,
      io_channels,
      kv_channels,
      master_dtype,
      slice_dtype,
      query_antecedent.dtype,
    )
    memory_antecedent = reshape_lib.rename_dimension(
      query_antecedent, w_dim.name, memory_name
    )
    mem_w = memory_antecedent.shape.get_dim_by_name(memory_name)
    q = einsum_lib.einsum(
      [query_antecedent, wq],
      Shape(batch_dims + [heads, num_w_blocks, w_dim, kv_channels]),
    )
    kv_shape = Shape(batch_dims + [heads, num_w_blocks, mem_w, kv_channels])
    k = einsum_lib.einsum([memory_antecedent, wk], kv_shape)
    v = einsum_lib.einsum([memory_antecedent, wv], kv_shape)
    k, v = local_1d_halo_exchange(k, v, num_w_blocks, mem_w, mask_right)
    mask = None
    if mask_right:
      mask = attention_masks.attention_bias_local_block(
        mesh, w_dim, mem_w, dtype=query_antecedent.dtype
      )
    o = attention.dot_product_attention(q, k, v, mask, False)
    return einsum_lib.einsum([o, wo], query_antecedent.shape)


def local_2d_self_attention_spatial_blocks(
  query_antecedent: Tensor,
  kv_channels: Dimension,
  heads: Dimension,
  is_training: bool,
  memory_h_dim=None,
  memory_w_dim=None,
  mask_right: bool = False,
  master_dtype=tf.float32,
  slice_dtype=tf.float32,
  name: Optional[str] = None,
) -> Tensor:
  """Self-attention within 2-d blocks plus neighbouring blocks.

  A query sees the 3h x 3w window of blocks around its own (zero keys/values
  beyond the image), or with mask_right the 2h x 2w window of the blocks
  above-left, above, left and its own, masked causally in raster order (see
  attention_bias_local_2d_block). The softmax runs jointly over both memory
  dims. Variables: "<scope>/qkvo".

  Args:
    query_antecedent: [<batch_dims>, num_h_blocks, num_w_blocks, h_dim,
      w_dim, io_channels]; the blocks dims may be split across the mesh.
    kv_channels: Dimension of keys and values per head.
    heads: the heads Dimension.
    is_training: a Python bool (unused: no dropout here).
    memory_h_dim: ignored, as in the original: the memory dims are always
      named "memory_" + h_dim.name and "memory_" + w_dim.name.
    memory_w_dim: ignored likewise.
    mask_right: causal (raster-order) attention.
    master_dtype: master dtype of the variable.
    slice_dtype: slice dtype of the variable.
    name: variable scope name (default "multihead_attention").

  Returns:
    a Tensor shaped like query_antecedent.
  """
  del is_training
  if query_antecedent.shape.ndims < 5:
    raise ValueError(
      "local_2d_self_attention_spatial_blocks: input must be [<batch_dims>, "
      "num_h_blocks, num_w_blocks, h_dim, w_dim, io_channels], got %s"
      % query_antecedent.shape.to_string
    )
  check_heads_kv(
    heads,
    kv_channels,
    query_antecedent,
    "local_2d_self_attention_spatial_blocks",
  )
  batch_dims = query_antecedent.shape.dims[:-5]
  num_h_blocks, num_w_blocks, h_dim, w_dim, io_channels = (
    query_antecedent.shape.dims[-5:]
  )
  del memory_h_dim, memory_w_dim  # Ignored, as in the original.
  mem_h_name = _memory_name(h_dim)
  mem_w_name = _memory_name(w_dim)
  combined_name = mem_h_name + "_" + mem_w_name
  names = query_antecedent.shape.dimension_names
  for n in (mem_h_name, mem_w_name, combined_name):
    if n in names:
      raise ValueError(
        "local_2d_self_attention_spatial_blocks: memory "
        "dimension name %r is already used in %s"
        % (n, query_antecedent.shape.to_string)
      )
  mesh = query_antecedent.mesh
  with layer_variable_scope(
    query_antecedent.mesh.graph, name, "multihead_attention"
  ):
    wq, wk, wv, wo = attention.multihead_attention_vars(
      mesh,
      heads,
      io_channels,
      kv_channels,
      master_dtype,
      slice_dtype,
      query_antecedent.dtype,
    )
    memory_antecedent = reshape_lib.rename_dimension(
      query_antecedent, h_dim.name, mem_h_name
    )
    memory_antecedent = reshape_lib.rename_dimension(
      memory_antecedent, w_dim.name, mem_w_name
    )
    mem_h = memory_antecedent.shape.get_dim_by_name(mem_h_name)
    mem_w = memory_antecedent.shape.get_dim_by_name(mem_w_name)
    blocks = [num_h_blocks, num_w_blocks]
    q = einsum_lib.einsum(
      [query_antecedent, wq],
      Shape(batch_dims + [heads] + blocks + [h_dim, w_dim, kv_channels]),
    )
    kv_shape = Shape(
      batch_dims + [heads] + blocks + [mem_h, mem_w, kv_channels]
    )
    k = einsum_lib.einsum([memory_antecedent, wk], kv_shape)
    v = einsum_lib.einsum([memory_antecedent, wv], kv_shape)
    k, v = local_2d_halo_exchange(
      k, v, num_h_blocks, mem_h, num_w_blocks, mem_w, mask_right
    )
    # One memory dim of (padded height x padded width) positions.
    padded_h = k.shape.get_dim_by_name(mem_h_name)
    padded_w = k.shape.get_dim_by_name(mem_w_name)
    memory = Dimension(combined_name, padded_h.size * padded_w.size)
    flat_shape = batch_dims + [heads] + blocks + [memory, kv_channels]
    k = reshape_lib.reshape(k, flat_shape)
    v = reshape_lib.reshape(v, flat_shape)
    mask = None
    if mask_right:
      mask = attention_masks.attention_bias_local_2d_block(
        mesh, h_dim, w_dim, mem_h, mem_w, dtype=query_antecedent.dtype
      )
      mask = reshape_lib.reshape(mask, [h_dim, w_dim, memory])
    o = attention.dot_product_attention(q, k, v, mask, False)
    return einsum_lib.einsum([o, wo], query_antecedent.shape)
