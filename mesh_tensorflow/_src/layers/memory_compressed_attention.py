"""Memory-compressed self-attention (the original's mtf.layers version).

Keys and values come from the input mean-pooled over groups of
compression_factor positions (`compress_mean`), so each query attends to
length / compression_factor memory slots; with mask_right a query sees only
the groups that end at or before it.
"""

from __future__ import annotations

import tensorflow as tf

from mesh_tensorflow._src.graph import Tensor
from mesh_tensorflow._src.layers import attention
from mesh_tensorflow._src.layers import attention_masks
from mesh_tensorflow._src.layers.attention_masks import NEG_INF
from mesh_tensorflow._src.layers.scope_util import layer_variable_scope
from mesh_tensorflow._src.ops import einsum as einsum_lib
from mesh_tensorflow._src.ops import elementwise
from mesh_tensorflow._src.ops import reduce as reduce_lib
from mesh_tensorflow._src.ops import reshape as reshape_lib
from mesh_tensorflow._src.ops.broadcast_binary import greater
from mesh_tensorflow._src.ops.gather import mtf_range
from mesh_tensorflow._src.shapes import Dimension
from mesh_tensorflow._src.shapes import Shape

__all__ = [
  "compress_mean",
  "multihead_self_attention_memory_compressed",
]


def compress_mean(x: Tensor, dim: Dimension, compression_factor: int) -> Tensor:
  """Means of consecutive groups of compression_factor positions along dim.

  The result keeps dim's name with size dim.size // compression_factor.

  Example:
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> x = converter.convert_np_array_to_mtf_tensor(
    ...     np.arange(8.0).reshape([1, 8, 1]), ["batch", "length", "d"],
    ...     dtype=tf.float32)
    >>> y = compress_mean(x, x.shape.dims[1], 2)
    >>> y.shape
    Shape[batch=1, length=4, d=1]
    >>> converter.convert_mtf_tensor_to_np_array(y)[0, :, 0]
    array([0.5, 2.5, 4.5, 6.5], dtype=float32)

  Args:
    x: an mtf Tensor.
    dim: the Dimension of x to compress.
    compression_factor: the number of consecutive positions averaged together;
      it divides dim.size.

  Returns:
    an mtf Tensor like x whose dim has size dim.size // compression_factor.

  Raises:
    ValueError: if dim is not in x or compression_factor does not divide it.
  """
  if dim not in x.shape.dims:
    raise ValueError(
      "compress_mean: dimension %s is not in %s" % (dim, x.shape.to_string)
    )
  if (
    isinstance(compression_factor, bool)
    or not isinstance(compression_factor, int)
    or compression_factor < 1
    or dim.size % compression_factor
  ):
    raise ValueError(
      "compress_mean: compression_factor %r must be a positive int dividing "
      "the size of dimension %s" % (compression_factor, dim)
    )
  dims = x.shape.dims
  pos = dims.index(dim)
  compressed_dim = Dimension(dim.name, dim.size // compression_factor)
  factor_dim = Dimension("compression_factor", compression_factor)
  if factor_dim.name in x.shape.dimension_names:
    raise ValueError(
      "compress_mean: %s already has a dimension named %r"
      % (x.shape.to_string, factor_dim.name)
    )
  x = reshape_lib.reshape(
    x, dims[:pos] + [compressed_dim, factor_dim] + dims[pos + 1 :]
  )
  return reduce_lib.reduce_mean(x, reduced_dim=factor_dim)


def multihead_self_attention_memory_compressed(
  x: Tensor,
  mask_right: bool,
  compression_factor: int,
  kv_channels: Dimension,
  heads: Dimension,
  is_training: bool,
  dropout: float = 0.0,
  dropout_broadcast_dims=None,
  master_dtype=tf.float32,
  slice_dtype=tf.float32,
  name: str = "multihead_attention",
) -> Tensor:
  """Self-attention to a memory mean-pooled by compression_factor.

  Keys and values come from compress_mean(x, length, compression_factor)
  (renamed to "memory_length"); the softmax has an extra logit 0. With
  mask_right, query position p sees memory slot m only if its group ends at or
  before p: m * compression_factor + compression_factor - 1 <= p.
  Variables: "<name>/qkvo".

  Args:
    x: [<batch_dims>, length, io_channels].
    mask_right: causal masking.
    compression_factor: positive int dividing the length.
    kv_channels: Dimension of keys and values per head.
    heads: the heads Dimension.
    is_training: a Python bool (dropout only when True).
    dropout: dropout rate on the attention weights.
    dropout_broadcast_dims: optional list of Dimensions.
    master_dtype: master dtype of the variable.
    slice_dtype: slice dtype of the variable.
    name: variable scope name.

  Returns:
    [<batch_dims>, length, io_channels].

  Raises:
    ValueError: on a bad compression_factor or dims.
  """
  batch_dims, length, io_channels = attention.split_query(
    x, "multihead_self_attention_memory_compressed"
  )
  attention.check_heads_kv(
    heads, kv_channels, x, "multihead_self_attention_memory_compressed"
  )
  if length.name == "memory_length":
    raise ValueError(
      "multihead_self_attention_memory_compressed: the length "
      "dimension must not be named 'memory_length'"
    )
  with layer_variable_scope(x.mesh.graph, name, "compressed_attention"):
    wq, wk, wv, wo = attention.multihead_attention_vars(
      x.mesh,
      heads,
      io_channels,
      kv_channels,
      master_dtype,
      slice_dtype,
      x.dtype,
    )
    memory_antecedent = compress_mean(x, length, compression_factor)
    memory_antecedent = attention_masks.rename_length_to_memory_length(
      memory_antecedent, length.name
    )
    memory_length = memory_antecedent.shape.dims[-2]
    q = attention.project_to_heads(
      x, wq, batch_dims, heads, length, kv_channels
    )
    k = attention.project_to_heads(
      memory_antecedent, wk, batch_dims, heads, memory_length, kv_channels
    )
    v = attention.project_to_heads(
      memory_antecedent, wv, batch_dims, heads, memory_length, kv_channels
    )
    mask = None
    if mask_right:
      query_pos = mtf_range(x.mesh, length, dtype=tf.int32)
      memory_pos = mtf_range(
        x.mesh, memory_length, dtype=tf.int32
      ) * compression_factor + (compression_factor - 1)
      mask = elementwise.cast(greater(memory_pos, query_pos), x.dtype) * NEG_INF
    o = attention.dot_product_attention(
      q,
      k,
      v,
      mask,
      is_training,
      dropout,
      dropout_broadcast_dims,
      extra_logit=0.0,
    )
    return einsum_lib.einsum([o, wo], Shape(batch_dims + [length, io_channels]))
