"""Blocked local attention of mesh_tensorflow.transformer.attention.

`local_attention_1d` attends to a window of `radius` positions without the
length^2 cost: the length is cut into blocks that keep the length dimension's
name (so they are split over the mesh like it), each block receives a halo of
keys/values from its neighbours, and `attention` runs per block under a
visibility bias. LocalSelfAttention uses it for long sequences.
"""

from __future__ import annotations

from typing import Optional

import tensorflow as tf

import mesh_tensorflow as mtf
from transformer._src.layers.attention_core import attention
from transformer._src.layers.attention_core import (
  visibility_mask_to_attention_bias,
)

__all__ = ["local_attention_1d"]


def _block_length(length_per_split: int, radius: int) -> int:
  """The largest divisor of length_per_split that is <= max(radius, 128)."""
  block = min(max(radius, 128), length_per_split)
  while length_per_split % block:
    block -= 1
  return block


def local_attention_1d(
  q: mtf.Tensor,
  k: mtf.Tensor,
  v: Optional[mtf.Tensor],
  length_dim: mtf.Dimension,
  key_dim: mtf.Dimension,
  value_dim: mtf.Dimension,
  fully_autoregressive: bool = True,
  length_dim_num_splits: int = 1,
  radius: int = 128,
  sequence_id=1,
  write_priority=None,
  read_priority=None,
  attention_kwargs=None,
) -> mtf.Tensor:
  """Attention to the positions within `radius` (blocked, no length^2 cost).

  Query position i sees memory position j iff -radius < j - i <= 0
  (fully_autoregressive) or |j - i| < radius, j is in the sequence, both
  have the same sequence_id, and read_priority[i] >= write_priority[j]. The
  length is cut into blocks (the largest divisor of the per-split length
  that is <= max(radius, 128)); the blocks dimension keeps length_dim's name,
  so it is split like length_dim, and each block receives a halo of `radius`
  keys/values from its neighbours (mtf.halo_exchange).

  Args:
    q: [..., length_dim, ..., key_dim] (heads etc. allowed).
    k: like q, with the same length_dim (not renamed).
    v: like k with value_dim, or None to use k as the values.
    length_dim: the sequence Dimension of q, k and v.
    key_dim: channels of q and k.
    value_dim: channels of v.
    fully_autoregressive: only look left.
    length_dim_num_splits: how many ways length_dim is split on the mesh.
    radius: window radius (positions).
    sequence_id: int Tensor [..., length_dim] of packed-sequence ids, or an
      int (all positions in one sequence).
    write_priority: optional int Tensor [..., length_dim].
    read_priority: optional int Tensor [..., length_dim].
    attention_kwargs: more keyword arguments for `attention`.

  Returns:
    q's dims with key_dim replaced by value_dim.

  Raises:
    ValueError: if length_dim is not in q or length_dim_num_splits does not
      divide it.
  """
  if length_dim not in q.shape.dims or length_dim not in k.shape.dims:
    raise ValueError(
      "local_attention_1d: length dimension %s must be in q %s "
      "and k %s" % (length_dim, q.shape.to_string, k.shape.to_string)
    )
  if radius < 1:
    raise ValueError(
      "local_attention_1d: radius must be >= 1, got %r" % (radius,)
    )
  if length_dim_num_splits < 1 or length_dim.size % length_dim_num_splits:
    raise ValueError(
      "local_attention_1d: length_dim_num_splits %r does not divide the "
      "length dimension %s" % (length_dim_num_splits, length_dim)
    )
  mesh = q.mesh
  block = _block_length(length_dim.size // length_dim_num_splits, radius)
  num_blocks = mtf.Dimension(length_dim.name, length_dim.size // block)
  query_block = mtf.Dimension("query_block_length", block)
  memory_block = mtf.Dimension("memory_block_length", block)
  right = 0 if fully_autoregressive else radius
  padded_memory_block = mtf.Dimension(
    "memory_block_length", block + radius + right
  )

  def to_query_blocks(x):
    return mtf.replace_dimensions(x, length_dim, [num_blocks, query_block])

  def to_memory_blocks(x):
    x = mtf.replace_dimensions(x, length_dim, [num_blocks, memory_block])
    if right:
      return mtf.halo_exchange(x, num_blocks, memory_block, radius)
    return mtf.left_halo_exchange(x, num_blocks, memory_block, radius)

  q = to_query_blocks(q)
  k = to_memory_blocks(k)
  v = k if v is None else to_memory_blocks(v)

  # Positions: query nb*B + i; memory (with halo) nb*B + j - radius.
  query_pos = mtf.range(mesh, num_blocks, tf.int32) * block + mtf.range(
    mesh, query_block, tf.int32
  )
  memory_pos = (
    mtf.range(mesh, num_blocks, tf.int32) * block
    + mtf.range(mesh, padded_memory_block, tf.int32)
    - radius
  )
  relative = memory_pos - query_pos
  visible = mtf.logical_and(
    mtf.greater(relative, -radius),
    mtf.less_equal(relative, 0 if fully_autoregressive else radius - 1),
  )
  visible = mtf.logical_and(visible, mtf.greater_equal(memory_pos, 0))
  visible = mtf.logical_and(visible, mtf.less(memory_pos, length_dim.size))
  if isinstance(sequence_id, mtf.Tensor) and length_dim in sequence_id.shape:
    visible = mtf.logical_and(
      visible,
      mtf.equal(to_query_blocks(sequence_id), to_memory_blocks(sequence_id)),
    )
  if read_priority is not None or write_priority is not None:
    if read_priority is None or write_priority is None:
      raise ValueError(
        "local_attention_1d: give both read_priority and "
        "write_priority, or neither"
      )
    visible = mtf.logical_and(
      visible,
      mtf.greater_equal(
        to_query_blocks(read_priority), to_memory_blocks(write_priority)
      ),
    )
  bias = visibility_mask_to_attention_bias(visible, q.dtype)
  o = attention(
    q,
    k,
    v,
    padded_memory_block,
    key_dim,
    value_dim,
    bias,
    **(attention_kwargs or {}),
  )
  return mtf.replace_dimensions(o, [num_blocks, query_block], length_dim)
