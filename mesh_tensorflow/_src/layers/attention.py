"""Multihead attention layers (the original's `mtf.layers` attention API).

Dense dot-product attention, multihead attention with q/k/v/o weights of shape
[heads, io_channels, kv_channels] and its one-step (incremental) decoding
variants. The additive masks (0 where attention is allowed, -1e9 where it is
not) are in attention_masks.py, memory-compressed self-attention in
memory_compressed_attention.py. Everything is built from mtf ops, so any
layout works: batch and heads split for free; splitting io/kv channels makes
the contractions allreduce; the length dims may be split as well.

Example:
  Causal self-attention: changing the input at the last position changes
  only the output at the last position.

  >>> converter = mtf.test_utils.NumpyConverter()
  >>> mesh = converter.mesh
  >>> x = mtf.random_normal(mesh, "batch:2;length:3;d_model:4", seed=0)
  >>> length = x.shape.dims[1]
  >>> mask = mtf.layers.attention_mask_autoregressive(
  ...     mtf.range(mesh, length, tf.int32))
  >>> converter.convert_mtf_tensor_to_np_array(mask) == 0  # may attend
  array([[ True, False, False],
         [ True,  True, False],
         [ True,  True,  True]])
  >>> def attend(x):
  ...   return mtf.layers.multihead_attention(
  ...       x, None, mask, mtf.Dimension("d_kv", 2), mtf.Dimension("heads", 2),
  ...       is_training=False, name="att")
  >>> last = mtf.one_hot(mtf.constant(mesh, 2, dtype=tf.int32), length)
  >>> y = converter.convert_mtf_tensor_to_np_array(attend(x))
  >>> y_changed = converter.convert_mtf_tensor_to_np_array(attend(x + last))
  >>> np.allclose(y[:, :2], y_changed[:, :2]), np.allclose(y, y_changed)
  (True, False)
  >>> [(v.name, v.shape) for v in converter.graph.trainable_variables]
  [('att/qkvo', Shape[qkvo=4, heads=2, d_model=4, d_kv=2])]
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import tensorflow as tf

from mesh_tensorflow._src.graph import Mesh
from mesh_tensorflow._src.graph import Tensor
from mesh_tensorflow._src.layers import attention_masks
from mesh_tensorflow._src.layers.attention_masks import NEG_INF
from mesh_tensorflow._src.layers.attention_masks import check_dim
from mesh_tensorflow._src.layers.scope_util import layer_variable_scope
from mesh_tensorflow._src.ops import binary
from mesh_tensorflow._src.ops import einsum as einsum_lib
from mesh_tensorflow._src.ops import elementwise
from mesh_tensorflow._src.ops import gather as gather_lib
from mesh_tensorflow._src.ops import io
from mesh_tensorflow._src.ops import random as random_lib
from mesh_tensorflow._src.ops import softmax as softmax_lib
from mesh_tensorflow._src.ops import tensor_ops
from mesh_tensorflow._src.ops.broadcast_binary import greater
from mesh_tensorflow._src.ops.gather import mtf_range
from mesh_tensorflow._src.shapes import Dimension
from mesh_tensorflow._src.shapes import Shape
from mesh_tensorflow._src.variables import VariableDType
from mesh_tensorflow._src.variables import get_variable

tf1 = tf.compat.v1

__all__ = [
  "dot_product_attention",
  "multihead_attention",
  "multihead_attention_params",
  "multihead_attention_vars",
  "multihead_encdec_attention_incremental",
  "multihead_self_attention_incremental",
]


# ----------------------------------------------------------------------------
# Parameters
# ----------------------------------------------------------------------------


def _init_stddevs(
  heads: Dimension, io_channels: Dimension, kv_channels: Dimension
) -> Tuple[float, float, float, float]:
  """Initializer stddevs of (q, k, v, o).

  The 1/sqrt(d_kv) logit scaling of scaled dot-product attention is folded
  into q and k (d_kv^-1/4 each), so dot_product_attention does not scale.
  """
  qk = (io_channels.size**-0.5) * (kv_channels.size**-0.25)
  v = io_channels.size**-0.5
  o = (io_channels.size * heads.size) ** -0.5  # As in the original.
  return qk, qk, v, o


def multihead_attention_params(
  mesh: Mesh,
  heads: Dimension,
  io_channels: Dimension,
  kv_channels: Dimension,
  variable_dtype: VariableDType,
  combine: bool = False,
) -> List[Tensor]:
  """Creates the q, k, v, o weights of multihead attention.

  Variables (relative to the current variable scope): with combine=False four
  variables "q", "k", "v", "o", each [heads, io_channels, kv_channels]; with
  combine=True one variable "qkvo" of shape [qkvo=4, heads, io_channels,
  kv_channels], unstacked into the four. Initial values are normal with
  stddev io^-1/2 * kv^-1/4 (q, k), io^-1/2 (v) and (io * heads)^-1/2 (o).

  Args:
    mesh: a Mesh.
    heads: the heads Dimension.
    io_channels: the input/output channels Dimension.
    kv_channels: the key/value channels Dimension.
    variable_dtype: a mtf.VariableDType.
    combine: create one stacked variable instead of four.

  Returns:
    [wq, wk, wv, wo], each a Tensor of shape [heads, io_channels, kv_channels].

  Example:
    >>> mesh = mtf.Mesh(mtf.Graph(), "my_mesh")
    >>> heads, d_model = mtf.Dimension("heads", 2), mtf.Dimension("d_model", 4)
    >>> d_kv = mtf.Dimension("d_kv", 3)
    >>> with tf.compat.v1.variable_scope("attention"):
    ...   wq, wk, wv, wo = multihead_attention_params(
    ...       mesh, heads, d_model, d_kv, mtf.VariableDType(tf.float32))
    >>> wq
    Tensor[attention/q:0, Shape[heads=2, d_model=4, d_kv=3], float32]
    >>> [v.name for v in mesh.graph.trainable_variables]
    ['attention/q', 'attention/k', 'attention/v', 'attention/o']
  """
  heads = check_dim(heads, "heads")
  io_channels = check_dim(io_channels, "io_channels")
  kv_channels = check_dim(kv_channels, "kv_channels")
  if len({heads.name, io_channels.name, kv_channels.name}) != 3:
    raise ValueError(
      "multihead attention weights need distinct dimension names, got "
      "heads=%s, io_channels=%s, kv_channels=%s"
      % (heads, io_channels, kv_channels)
    )
  stddevs = _init_stddevs(heads, io_channels, kv_channels)
  if combine:
    qkvo = Dimension("qkvo", 4)

    def qkvo_initializer(
      shape, dtype=None, partition_info=None, verify_shape=None
    ):
      del partition_info, verify_shape
      dtype = tf.as_dtype(dtype or tf.float32)
      scale = tf.reshape(tf.constant(stddevs, dtype=dtype), [4, 1, 1, 1])
      return tf1.random_normal(shape, dtype=dtype) * scale

    var = get_variable(
      mesh,
      "qkvo",
      Shape([qkvo, heads, io_channels, kv_channels]),
      initializer=qkvo_initializer,
      dtype=variable_dtype,
    )
    return list(tensor_ops.unstack(var, qkvo))
  return [
    get_variable(
      mesh,
      name,
      Shape([heads, io_channels, kv_channels]),
      initializer=tf1.random_normal_initializer(stddev=stddev),
      dtype=variable_dtype,
    )
    for name, stddev in zip(["q", "k", "v", "o"], stddevs)
  ]


def multihead_attention_vars(
  mesh: Mesh,
  heads: Dimension,
  io_channels: Dimension,
  kv_channels: Dimension,
  master_dtype,
  slice_dtype,
  activation_dtype,
) -> List[Tensor]:
  """Deprecated: multihead_attention_params(..., combine=True).

  Creates one variable "qkvo" [qkvo=4, heads, io_channels, kv_channels] and
  returns [wq, wk, wv, wo]. None dtypes default to float32.

  Args:
    mesh: the mtf Mesh.
    heads: the heads Dimension.
    io_channels: the Dimension of the layer's input and output (e.g. d_model).
    kv_channels: the Dimension of each head's keys and values.
    master_dtype: the master dtype of the variable (None: float32).
    slice_dtype: its slice dtype (None: float32).
    activation_dtype: its activation dtype (None: float32).

  Returns:
    [wq, wk, wv, wo]: four mtf Tensors of shape [heads, io_channels,
    kv_channels].
  """
  master_dtype = master_dtype or tf.float32
  return multihead_attention_params(
    mesh,
    heads,
    io_channels,
    kv_channels,
    VariableDType(
      master_dtype,
      slice_dtype or master_dtype,
      activation_dtype or master_dtype,
    ),
    combine=True,
  )


# ----------------------------------------------------------------------------
# Dot-product attention
# ----------------------------------------------------------------------------


def _check_qkv(q: Tensor, k: Tensor, v: Tensor) -> None:
  """ValueError unless q [..., depth_k], k [..., length_kv, depth_k] and
  v [..., length_kv, depth_v] fit together.
  """
  for name, t in (("q", q), ("k", k), ("v", v)):
    if t.shape.ndims < (1 if name == "q" else 2):
      raise ValueError(
        "dot_product_attention: %s has too few dimensions: %s"
        % (name, t.shape.to_string)
      )
  depth_k = q.shape.dims[-1]
  length_kv = k.shape.dims[-2]
  if k.shape.dims[-1] != depth_k:
    raise ValueError(
      "dot_product_attention: the last dimension of k (%s) must equal the "
      "last (depth) dimension of q (%s)" % (k.shape.dims[-1], depth_k)
    )
  if length_kv in q.shape.dims:
    raise ValueError(
      "dot_product_attention: the memory length dimension %s of k must not "
      "be a dimension of q %s (rename it, e.g. to memory_length)"
      % (length_kv, q.shape.to_string)
    )
  if v.shape.ndims < 2 or v.shape.dims[-2] != length_kv:
    raise ValueError(
      "dot_product_attention: v %s must have the memory length dimension %s "
      "of k in second-to-last position" % (v.shape.to_string, length_kv)
    )


def dot_product_attention(
  q: Tensor,
  k: Tensor,
  v: Tensor,
  mask: Optional[Tensor],
  is_training: bool,
  dropout: float = 0.0,
  dropout_broadcast_dims=None,
  extra_logit=None,
) -> Tensor:
  """Dot-product attention (no 1/sqrt(depth) scaling; fold it into q).

  weights = softmax over length_kv of (q . k + mask); output = weights . v.

  Example:
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> mesh = converter.mesh
    >>> q = mtf.random_normal(mesh, "batch:1;heads:2;length:3;d_kv:4", seed=1)
    >>> kv_shape = "batch:1;heads:2;memory_length:5;d_kv:4"
    >>> k = mtf.random_normal(mesh, kv_shape, seed=2)
    >>> v = mtf.random_normal(mesh, kv_shape, seed=3)
    >>> o = dot_product_attention(q, k, v, None, is_training=False)
    >>> o.shape
    Shape[batch=1, heads=2, length=3, d_kv=4]
    >>> q_np, k_np, v_np, o_np = [
    ...     converter.convert_mtf_tensor_to_np_array(t) for t in (q, k, v, o)]
    >>> weights = tf.nn.softmax(np.einsum("bhqd,bhkd->bhqk", q_np, k_np))
    >>> np.allclose(o_np, np.einsum("bhqk,bhkd->bhqd", weights, v_np),
    ...             atol=1e-5)
    True

  Args:
    q: [..., length_q, depth_k] (leading dims typically [batch, heads]).
    k: [..., length_kv, depth_k]; length_kv is k's second-to-last dim.
    v: [..., length_kv, depth_v].
    mask: optional additive bias (0 allowed, -1e9 disallowed) whose dims are
      a subset of the logits dims q.dims[:-1] + [length_kv].
    is_training: a Python bool; dropout applies only when True.
    dropout: dropout rate on the attention weights.
    dropout_broadcast_dims: optional dims along which the dropout mask is
      shared.
    extra_logit: optional scalar (or Tensor): an extra logit of that value in
      the softmax denominator (attention may then sum to less than one).

  Returns:
    [..., length_q, depth_v], i.e. q.dims[:-1] + [depth_v].

  Raises:
    ValueError: if the shapes of q, k, v or mask do not fit together.
  """
  _check_qkv(q, k, v)
  length_kv = k.shape.dims[-2]
  logits_shape = Shape(q.shape.dims[:-1] + [length_kv])
  logits = einsum_lib.einsum([q, k], logits_shape)
  if mask is not None:
    for d in mask.shape.dims:
      if d not in logits_shape.dims:
        raise ValueError(
          "dot_product_attention: mask dimension %s is not a dimension of "
          "the attention logits %s" % (d, logits_shape.to_string)
        )
    if mask.dtype != logits.dtype:
      mask = elementwise.cast(mask, logits.dtype)
    logits = binary.add(logits, mask, output_shape=logits_shape)
  weights = softmax_lib.softmax(logits, length_kv, extra_logit=extra_logit)
  if dropout != 0.0:
    weights = random_lib.dropout(
      weights,
      is_training,
      keep_prob=1.0 - dropout,
      noise_shape=weights.shape - (dropout_broadcast_dims or []),
    )
  depth_v = v.shape.dims[-1]
  return einsum_lib.einsum([weights, v], Shape(q.shape.dims[:-1] + [depth_v]))


def split_query(query_antecedent: Tensor, what: str):
  if query_antecedent.shape.ndims < 2:
    raise ValueError(
      "%s: input must be [<batch_dims>, length, io_channels], "
      "got %s" % (what, query_antecedent.shape.to_string)
    )
  batch_dims = query_antecedent.shape.dims[:-2]
  length, io_channels = query_antecedent.shape.dims[-2:]
  return batch_dims, length, io_channels


def check_heads_kv(heads, kv_channels, x: Tensor, what: str) -> None:
  check_dim(heads, "heads")
  check_dim(kv_channels, "kv_channels")
  for role, d in (("heads", heads), ("kv_channels", kv_channels)):
    if d.name in x.shape.dimension_names:
      raise ValueError(
        "%s: %s dimension %s is already a dimension of the "
        "input %s" % (what, role, d, x.shape.to_string)
      )


def project_to_heads(
  x: Tensor,
  weights: Tensor,
  batch_dims: List[Dimension],
  heads: Dimension,
  length: Dimension,
  kv_channels: Dimension,
) -> Tensor:
  """x [batch..., length, io_channels] -> [batch..., heads, length, kv]."""
  return einsum_lib.einsum(
    [x, weights], Shape(batch_dims + [heads, length, kv_channels])
  )


def multihead_attention(
  query_antecedent: Tensor,
  memory_antecedent: Optional[Tensor],
  mask: Optional[Tensor],
  kv_channels: Dimension,
  heads: Dimension,
  is_training: bool,
  dropout: float = 0.0,
  dropout_broadcast_dims=None,
  master_dtype=tf.float32,
  slice_dtype=tf.float32,
  name: str = "multihead_attention",
) -> Tensor:
  """Multihead attention with input/output projections.

  Variables: "<name>/qkvo" [qkvo=4, heads, io_channels, kv_channels] (query and
  memory must therefore have the same io_channels).

  Args:
    query_antecedent: [<batch_dims>, query_length, io_channels].
    memory_antecedent: [<batch_dims>, memory_length, io_channels], or None for
      self-attention (query_length renamed to "memory_length").
    mask: optional additive bias over (a subset of) [<batch_dims>, heads,
      query_length, memory_length], e.g. attention_mask_autoregressive().
    kv_channels: Dimension of keys and values per head.
    heads: the heads Dimension.
    is_training: a Python bool (dropout only when True).
    dropout: dropout rate on the attention weights.
    dropout_broadcast_dims: optional list of Dimensions.
    master_dtype: master dtype of the variable.
    slice_dtype: slice dtype of the variable.
    name: variable scope name.

  Returns:
    [<batch_dims>, query_length, io_channels].

  Raises:
    ValueError: if memory and query batch dims or io channels differ.
  """
  batch_dims, query_length, io_channels = split_query(
    query_antecedent, "multihead_attention"
  )
  check_heads_kv(heads, kv_channels, query_antecedent, "multihead_attention")
  if memory_antecedent is None:
    memory_antecedent = attention_masks.rename_length_to_memory_length(
      query_antecedent, query_length.name
    )
  if memory_antecedent.shape.ndims < 2:
    raise ValueError(
      "multihead_attention: memory_antecedent must be "
      "[<batch_dims>, memory_length, io_channels], got %s"
      % memory_antecedent.shape.to_string
    )
  memory_batch_dims = memory_antecedent.shape.dims[:-2]
  memory_length, memory_channels = memory_antecedent.shape.dims[-2:]
  if memory_batch_dims != batch_dims:
    raise ValueError(
      "multihead_attention: memory batch dims %s must equal query batch "
      "dims %s"
      % (Shape(memory_batch_dims).to_string, Shape(batch_dims).to_string)
    )
  if memory_channels != io_channels:
    raise ValueError(
      "multihead_attention: memory channels %s must equal query io channels "
      "%s" % (memory_channels, io_channels)
    )
  if memory_length == query_length:
    raise ValueError(
      "multihead_attention: memory length dimension %s must differ from the "
      "query length dimension (rename it, e.g. with "
      "rename_length_to_memory_length)" % (memory_length,)
    )
  with layer_variable_scope(
    query_antecedent.mesh.graph, name, "multihead_attention"
  ):
    wq, wk, wv, wo = multihead_attention_vars(
      query_antecedent.mesh,
      heads,
      io_channels,
      kv_channels,
      master_dtype,
      slice_dtype,
      query_antecedent.dtype,
    )
    q = project_to_heads(
      query_antecedent, wq, batch_dims, heads, query_length, kv_channels
    )
    k = project_to_heads(
      memory_antecedent, wk, batch_dims, heads, memory_length, kv_channels
    )
    v = project_to_heads(
      memory_antecedent, wv, batch_dims, heads, memory_length, kv_channels
    )
    o = dot_product_attention(
      q, k, v, mask, is_training, dropout, dropout_broadcast_dims
    )
    return einsum_lib.einsum(
      [o, wo], Shape(batch_dims + [query_length, io_channels])
    )


def as_step_tensor(mesh: Mesh, step_num) -> Tensor:
  """step_num as a scalar int32 mtf Tensor (Python ints are accepted)."""
  if isinstance(step_num, Tensor):
    if step_num.shape.ndims != 0 or not step_num.dtype.is_integer:
      raise ValueError(
        "step_num must be a scalar integer Tensor, got %s %s"
        % (step_num.shape.to_string, step_num.dtype.name)
      )
    return step_num
  if isinstance(step_num, bool) or not isinstance(step_num, int):
    raise ValueError(
      "step_num must be a scalar int32 mtf Tensor or a Python "
      "int, got %r" % (step_num,)
    )
  return io.constant(mesh, step_num, shape=[], dtype=tf.int32)


def check_cache(prev_k: Tensor, prev_v: Tensor, batch_dims, what: str):
  """(heads, memory_length, kv_channels) of a [batch..., heads, memory_length,
  kv_channels] cache; ValueError if prev_k/prev_v do not match the query.
  """
  if prev_k.shape != prev_v.shape:
    raise ValueError(
      "%s: prev_k %s and prev_v %s must have the same shape"
      % (what, prev_k.shape.to_string, prev_v.shape.to_string)
    )
  if prev_k.shape.ndims != len(batch_dims) + 3 or prev_k.shape.dims[
    :-3
  ] != list(batch_dims):
    raise ValueError(
      "%s: prev_k %s must be [<batch dims of the query> %s, heads, "
      "memory_length, kv_channels]"
      % (what, prev_k.shape.to_string, Shape(batch_dims).to_string)
    )
  return prev_k.shape.dims[-3:]


def multihead_self_attention_incremental(
  query_antecedent: Tensor,
  prev_k: Tensor,
  prev_v: Tensor,
  step_num,
  master_dtype,
  slice_dtype,
  name: str = "multihead_attention",
) -> Tuple[Tensor, Tensor, Tensor]:
  """One decoding step of causal self-attention with a key/value cache.

  Uses the same variables as multihead_attention(name=name). The new key and
  value are written at position step_num of the cache; the query attends to
  cache positions <= step_num.

  Args:
    query_antecedent: [batch..., io_channels] (the input at step_num).
    prev_k: [batch..., heads, memory_length, kv_channels].
    prev_v: [batch..., heads, memory_length, kv_channels].
    step_num: scalar int32 mtf Tensor (or Python int).
    master_dtype: master dtype of the variable.
    slice_dtype: slice dtype of the variable.
    name: variable scope name.

  Returns:
    (y [batch..., io_channels], new_k, new_v) with new_k/new_v like prev_k.

  Raises:
    ValueError: if the cache does not match the query.
  """
  batch_dims = query_antecedent.shape.dims[:-1]
  io_channels = query_antecedent.shape.dims[-1]
  heads, memory_length, kv_channels = check_cache(
    prev_k, prev_v, batch_dims, "multihead_self_attention_incremental"
  )
  mesh = query_antecedent.mesh
  step_num = as_step_tensor(mesh, step_num)
  with layer_variable_scope(
    query_antecedent.mesh.graph, name, "multihead_attention"
  ):
    wq, wk, wv, wo = multihead_attention_vars(
      mesh,
      heads,
      io_channels,
      kv_channels,
      master_dtype,
      slice_dtype,
      query_antecedent.dtype,
    )
    step_shape = Shape(batch_dims + [heads, kv_channels])
    q = einsum_lib.einsum([query_antecedent, wq], step_shape)
    k = einsum_lib.einsum([query_antecedent, wk], step_shape)
    v = einsum_lib.einsum([query_antecedent, wv], step_shape)
    write = gather_lib.one_hot(step_num, memory_length, dtype=prev_k.dtype)
    k = prev_k + binary.multiply(k, write, output_shape=prev_k.shape)
    v = prev_v + binary.multiply(v, write, output_shape=prev_v.shape)
    future = greater(mtf_range(mesh, memory_length, dtype=tf.int32), step_num)
    mask = elementwise.cast(future, q.dtype) * NEG_INF
    o = dot_product_attention(q, k, v, mask, False)
    y = einsum_lib.einsum([o, wo], query_antecedent.shape)
    return y, k, v


def multihead_encdec_attention_incremental(
  query_antecedent: Tensor,
  wq: Tensor,
  wo: Tensor,
  k: Tensor,
  v: Tensor,
  mask: Optional[Tensor],
  name: str = "multihead_attention",
) -> Tensor:
  """One decoding step of attention over precomputed encoder keys/values.

  Args:
    query_antecedent: query_dims + [io_channels].
    wq: [heads, io_channels, kv_channels].
    wo: [heads, io_channels, kv_channels].
    k: memory_dims + [heads, memory_length, kv_channels] (memory_dims a subset
      of query_dims).
    v: like k.
    mask: optional additive bias (see attention_mask_ignore_padding()).
    name: name scope (no variables are created).

  Returns:
    a Tensor shaped like query_antecedent.

  Raises:
    ValueError: if the weights do not match k or the query.
  """
  if k.shape.ndims < 3:
    raise ValueError(
      "multihead_encdec_attention_incremental: k must be "
      "memory_dims + [heads, memory_length, kv_channels], got "
      "%s" % k.shape.to_string
    )
  heads, _, kv_channels = k.shape.dims[-3:]
  io_channels = query_antecedent.shape.dims[-1]
  for w_name, w in (("wq", wq), ("wo", wo)):
    if w.shape.dims != [heads, io_channels, kv_channels]:
      raise ValueError(
        "multihead_encdec_attention_incremental: %s has shape %s, expected "
        "%s"
        % (
          w_name,
          w.shape.to_string,
          Shape([heads, io_channels, kv_channels]).to_string,
        )
      )
  query_dims = query_antecedent.shape.dims[:-1]
  with layer_variable_scope(
    query_antecedent.mesh.graph, name, "multihead_attention"
  ):
    q = einsum_lib.einsum(
      [query_antecedent, wq], Shape(query_dims + [heads, kv_channels])
    )
    o = dot_product_attention(q, k, v, mask, False)
    return einsum_lib.einsum([o, wo], query_antecedent.shape)
