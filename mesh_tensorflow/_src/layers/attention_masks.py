"""Additive attention masks and biases: 0 where attention is allowed, -1e9
where it is not.

Masks from ids (padding, autoregressive order, segments) over [length,
memory_length] (`rename_length_to_memory_length` names the keys' length
dim) and the biases of local attention in 1-D and 2-D blocks, as the
original's mtf.layers made them; multihead attention adds them to its
logits. `NEG_INF` is the value of a disallowed position, `check_dim` the
argument check the attention layers share.
"""

from __future__ import annotations

from typing import Optional

import tensorflow as tf

from mesh_tensorflow._src.graph import Mesh
from mesh_tensorflow._src.graph import Tensor
from mesh_tensorflow._src.ops import elementwise
from mesh_tensorflow._src.ops import io
from mesh_tensorflow._src.ops import reshape as reshape_lib
from mesh_tensorflow._src.ops import tensor_ops
from mesh_tensorflow._src.ops.broadcast_binary import equal
from mesh_tensorflow._src.ops.broadcast_binary import greater
from mesh_tensorflow._src.ops.broadcast_binary import less
from mesh_tensorflow._src.ops.broadcast_binary import logical_and
from mesh_tensorflow._src.ops.broadcast_binary import logical_or
from mesh_tensorflow._src.ops.broadcast_binary import not_equal
from mesh_tensorflow._src.ops.gather import mtf_range
from mesh_tensorflow._src.shapes import Dimension
from mesh_tensorflow._src.shapes import Shape

__all__ = [
  "attention_bias_local_2d_block",
  "attention_bias_local_block",
  "attention_mask_autoregressive",
  "attention_mask_ignore_padding",
  "attention_mask_same_segment",
  "rename_length_to_memory_length",
]

NEG_INF = -1e9


def rename_length_to_memory_length(
  x: Tensor,
  length_name: str = "length",
  memory_length_name: str = "memory_length",
) -> Tensor:
  """Renames dimension length_name of x to memory_length_name.

  Args:
    x: an mtf Tensor.
    length_name: the name of the dimension to rename.
    memory_length_name: its new name.

  Returns:
    an mtf Tensor like x with the dimension renamed.
  """
  if length_name not in x.shape.dimension_names:
    raise ValueError(
      "rename_length_to_memory_length: %s has no dimension %r"
      % (x.shape.to_string, length_name)
    )
  return reshape_lib.rename_dimension(x, length_name, memory_length_name)


def check_dim(value, what: str) -> Dimension:
  """value, checked to be a Dimension.

  Args:
    value: the argument.
    what: its name, for the error.

  Returns:
    value.

  Raises:
    ValueError: if value is not an mtf.Dimension.
  """
  if not isinstance(value, Dimension):
    raise ValueError("%s must be a mtf.Dimension, got %r" % (what, value))
  return value


def attention_mask_ignore_padding(inputs: Tensor, dtype=tf.float32) -> Tensor:
  """Bias hiding padding (id 0) from attention: -1e9 where inputs == 0.

  Args:
    inputs: [..., length] integer ids.
    dtype: output dtype.

  Returns:
    [..., memory_length] (length renamed).
  """
  inputs = rename_length_to_memory_length(inputs)
  return elementwise.cast(equal(inputs, 0), dtype) * NEG_INF


def attention_mask_autoregressive(
  query_pos: Tensor, dtype=tf.float32
) -> Tensor:
  """Causal bias: -1e9 where memory position > query position.

  Args:
    query_pos: [..., length] positions (e.g. mtf.range(mesh, length, int32)).
    dtype: output dtype.

  Returns:
    [..., length, memory_length].
  """
  memory_pos = rename_length_to_memory_length(query_pos)
  return elementwise.cast(less(query_pos, memory_pos), dtype) * NEG_INF


def attention_mask_same_segment(
  query_segment: Tensor,
  memory_segment: Optional[Tensor] = None,
  dtype=tf.float32,
) -> Tensor:
  """Bias allowing attention only within a segment (packed examples).

  Args:
    query_segment: [..., length] segment ids.
    memory_segment: [..., length] segment ids of the memory (default
      query_segment); its "length" is renamed to "memory_length".
    dtype: output dtype.

  Returns:
    [..., length, memory_length]: -1e9 where the segment ids differ.
  """
  if memory_segment is None:
    memory_segment = query_segment
  memory_segment = rename_length_to_memory_length(memory_segment)
  return (
    elementwise.cast(not_equal(query_segment, memory_segment), dtype) * NEG_INF
  )


def _bias_dtype(dtype) -> tf.DType:
  """The float dtype of a local-block bias (float32 for integer dtypes)."""
  dtype = tf.as_dtype(dtype)
  return dtype if dtype.is_floating else tf.float32


def attention_bias_local_block(
  mesh: Mesh, block_length: Dimension, memory_length: Dimension, dtype=tf.int32
) -> Tensor:
  """Causal bias for 1-d local block attention with a left halo.

  The memory of a query block is [previous block, current block], so the
  result has shape [block_length, Dimension(memory_length.name, 2 *
  block_length.size)]: the previous block is fully visible and in the current
  block memory position j is hidden (-1e9) from query position i iff j > i.
  (memory_length only supplies the name.)

  Args:
    mesh: a Mesh.
    block_length: the query block Dimension.
    memory_length: a Dimension whose name the memory dimension takes.
    dtype: bias dtype; integer dtypes (the default) give float32.

  Returns:
    a Tensor [block_length, memory_length(2 * block_length.size)].
  """
  check_dim(block_length, "block_length")
  check_dim(memory_length, "memory_length")
  if memory_length.name == block_length.name:
    raise ValueError(
      "attention_bias_local_block: block_length and "
      "memory_length need distinct names, both are %r" % (memory_length.name,)
    )
  out_dtype = _bias_dtype(dtype)
  memory_block = Dimension(memory_length.name, block_length.size)
  visible = io.zeros(mesh, [block_length, memory_block], dtype=out_dtype)
  future = (
    elementwise.cast(
      less(
        mtf_range(mesh, block_length, dtype=tf.int32),
        mtf_range(mesh, memory_block, dtype=tf.int32),
        output_shape=Shape([block_length, memory_block]),
      ),
      out_dtype,
    )
    * NEG_INF
  )
  return tensor_ops.concat([visible, future], memory_block.name)


def attention_bias_local_2d_block(
  mesh: Mesh,
  h_dim: Dimension,
  w_dim: Dimension,
  memory_h_dim: Dimension,
  memory_w_dim: Dimension,
  dtype=tf.int32,
) -> Tensor:
  """Causal (raster-order) bias for 2-d local block attention (top/left halo).

  The memory of an [h, w] query block is the 2h x 2w window made of the
  blocks above-left, above, left and the block itself (query block at rows
  [h, 2h), columns [w, 2w) of the window). Memory (r, c) is visible from
  query (i, j) iff it precedes or equals it in raster order of the image:
  r - h < i, or r - h == i and c - w <= j. So the blocks above are fully
  visible, the block to the left up to the query's row, and the query's own
  block causally.

  Args:
    mesh: a Mesh.
    h_dim: query block height Dimension.
    w_dim: query block width Dimension.
    memory_h_dim: Dimension whose name the memory height dimension takes.
    memory_w_dim: Dimension whose name the memory width dimension takes.
    dtype: bias dtype; integer dtypes (the default) give float32.

  Returns:
    a Tensor [h_dim, w_dim, memory_h(2 * h), memory_w(2 * w)], -1e9 where
    attention is disallowed.
  """
  for what, d in (
    ("h_dim", h_dim),
    ("w_dim", w_dim),
    ("memory_h_dim", memory_h_dim),
    ("memory_w_dim", memory_w_dim),
  ):
    check_dim(d, what)
  names = [h_dim.name, w_dim.name, memory_h_dim.name, memory_w_dim.name]
  if len(set(names)) != 4:
    raise ValueError(
      "attention_bias_local_2d_block: dimension names must be "
      "distinct, got %s" % names
    )
  out_dtype = _bias_dtype(dtype)
  mem_h = Dimension(memory_h_dim.name, 2 * h_dim.size)
  mem_w = Dimension(memory_w_dim.name, 2 * w_dim.size)
  qi = mtf_range(mesh, h_dim, dtype=tf.int32)
  qj = mtf_range(mesh, w_dim, dtype=tf.int32)
  r = mtf_range(mesh, mem_h, dtype=tf.int32) - h_dim.size
  c = mtf_range(mesh, mem_w, dtype=tf.int32) - w_dim.size
  out_shape = Shape([h_dim, w_dim, mem_h, mem_w])
  later_row = greater(r, qi, output_shape=Shape([h_dim, mem_h]))
  same_row = equal(r, qi, output_shape=Shape([h_dim, mem_h]))
  later_col = greater(c, qj, output_shape=Shape([w_dim, mem_w]))
  hidden = logical_or(
    later_row,
    logical_and(same_row, later_col, output_shape=out_shape),
    output_shape=out_shape,
  )
  return elementwise.cast(hidden, out_dtype) * NEG_INF
