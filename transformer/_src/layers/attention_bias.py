"""The attention-bias pieces the attention layers of transformer_layers share.

`to_bias` turns a visibility mask into an additive logit bias,
`sequence_id_for_bias` picks the packed-sequence ids that limit attention, and
`relative_position_bucket` is the T5 bucketing of relative positions. They
sit apart from the layers because self-attention, local self-attention and
encoder-decoder attention (separate modules) all build their biases from
them.
"""

from __future__ import annotations

import math

import mesh_tensorflow as mtf
from transformer._src.layers import attention_core as attention
from transformer._src.layers.context import Context

__all__ = [
  "relative_position_bucket",
  "sequence_id_for_bias",
  "to_bias",
]


def relative_position_bucket(
  relative_position: mtf.Tensor,
  bidirectional: bool = True,
  num_buckets: int = 32,
  max_distance: int = 128,
) -> mtf.Tensor:
  """T5 relative-position buckets of (memory position - query position).

  With bidirectional, half the buckets are for memory after the query. Of
  the rest, half are exact distances 0..n/2-1; larger distances get
  logarithmically wider buckets up to max_distance, and all larger ones the
  last bucket. Unidirectional: memory after the query falls in bucket 0.

  Example (bidirectional, 32 buckets, max_distance 128):
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> relative = converter.convert_np_array_to_mtf_tensor(
    ...     [-1, 1, -12, -1000, 1000], ["pairs"])
    >>> converter.convert_mtf_tensor_to_np_array(
    ...     relative_position_bucket(relative))
    array([ 1, 17,  9, 15, 31], dtype=int32)
  """
  distance = -relative_position  # > 0: memory before the query.
  bucket = 0
  if bidirectional:
    num_buckets //= 2
    bucket = mtf.to_int32(mtf.less(distance, 0)) * num_buckets
    distance = mtf.abs(distance)
  else:
    distance = mtf.maximum(distance, 0)
  max_exact = num_buckets // 2
  is_small = mtf.less(distance, max_exact)
  # log(d / max_exact) / log(max_distance / max_exact) of the log buckets;
  # d is clamped to >= 1 where the exact bucket is used anyway.
  scaled = (
    mtf.log(mtf.to_float(mtf.maximum(distance, 1)) / max_exact)
    / (math.log(max_distance / max_exact))
    * (num_buckets - max_exact)
  )
  large = mtf.minimum(max_exact + mtf.to_int32(scaled), num_buckets - 1)
  return bucket + mtf.where(is_small, distance, large)


def sequence_id_for_bias(context: Context):
  """The packed-sequence ids that limit attention (subsequence ids first)."""
  if isinstance(context.subsequence_id, mtf.Tensor):
    return context.subsequence_id
  if isinstance(context.sequence_id, mtf.Tensor):
    return context.sequence_id
  return None


def to_bias(visible: mtf.Tensor, context: Context) -> mtf.Tensor:
  return attention.visibility_mask_to_attention_bias(
    visible, context.activation_dtype
  )
