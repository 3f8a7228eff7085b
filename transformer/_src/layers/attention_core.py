"""Attention math of mesh_tensorflow.transformer.attention.

The functions here take already-projected queries, keys and values (named mtf
Tensors) and return the attended values: `attention` (softmax attention),
`hybrid_attention` (a learned mix with doubly-normalised attention) and
`synthetic_attention` (Synthesizer logits), plus the visibility-mask bias and
the 2-d sharding reshape they use. `AttentionParams` (attention_params.py)
owns the q, k, v (or kv) and o projection variables of a layer, and
`local_attention_1d` (local_attention.py) is blocked attention to a window of
radius positions built on `attention`.

Dimension conventions: the key/value positions are a "memory_length"
dimension distinct from the query "length"; the contraction dims are
`key_dim` (q . k) and `value_dim` (the output channels). The 1/sqrt(d_kv)
scaling of dot-product attention is folded into the q initializer by default,
so `attention` does not scale the logits.

Example (self-attention with 2 heads, checked against numpy):
  >>> converter = mtf.test_utils.NumpyConverter()
  >>> x_np = np.random.RandomState(0).randn(1, 3, 8).astype(np.float32)
  >>> x = converter.convert_np_array_to_mtf_tensor(
  ...     x_np, ["batch", "length", "d_model"], dtype=tf.float32)
  >>> batch, length, d_model = x.shape.dims
  >>> memory_length = mtf.Dimension("memory_length", 3)
  >>> d_kv, heads = mtf.Dimension("d_kv", 4), mtf.Dimension("heads", 2)
  >>> from transformer.attention import AttentionParams
  >>> params = AttentionParams(converter.mesh, d_model, d_model, d_model,
  ...                          d_kv, d_kv, [heads], [heads],
  ...                          mtf.VariableDType())
  >>> q = params.compute_q(x)
  >>> k = mtf.replace_dimensions(params.compute_k(x), length, memory_length)
  >>> v = mtf.replace_dimensions(params.compute_v(x), length, memory_length)
  >>> o = attention(q, k, v, memory_length, d_kv, d_kv)
  >>> q.shape
  Shape[batch=1, length=3, heads=2, d_kv=4]
  >>> o.shape
  Shape[batch=1, length=3, heads=2, d_kv=4]
  >>> y = params.compute_output(o, output_shape=x.shape)
  >>> lowering, y_tf = converter.convert_mtf_tensor_to_tf_tensor(y)
  >>> wq, wk, wv, wo = [lowering.export_to_tf_tensor(w).numpy()
  ...                   for w in (params.wq, params.wk, params.wv, params.wo)]
  >>> wq.shape, wo.shape  # heads and d_kv combined into one dim
  ((8, 8), (8, 8))
  >>> q_np, k_np, v_np = [(x_np @ w).reshape(1, 3, 2, 4) for w in (wq, wk, wv)]
  >>> logits = np.einsum("bqhd,bkhd->bhqk", q_np, k_np)
  >>> weights = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
  >>> o_np = np.einsum("bhqk,bkhd->bqhd", weights, v_np).reshape(1, 3, 8)
  >>> np.allclose(y_tf.numpy(), o_np @ wo, atol=1e-5)
  True
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import gin
import tensorflow as tf

import mesh_tensorflow as mtf

tf1 = tf.compat.v1

__all__ = [
  "attention",
  "hybrid_attention",
  "maybe_reshape_attention_input_for_2d_sharding",
  "synthetic_attention",
  "us_einsum",
  "visibility_mask_to_attention_bias",
]

_GIN_MODULE = "mesh_tensorflow.transformer.attention"
_NEG_INF = -1e9


def us_einsum(xs, *args, **kwargs) -> mtf.Tensor:
  """mtf.layers.us_einsum: the einsum of the attention math and projections.

  It is mtf.einsum, scaled by 1/sqrt(contracted size) under the
  unit-scaling convention.
  """
  return mtf.layers.us_einsum(xs, *args, **kwargs)


def _is_training(context) -> bool:
  """Dropout is on unless a context says we are not training."""
  return True if context is None else bool(context.train)


def _attention_dropout(
  weights: mtf.Tensor, dropout_rate: float, dropout_broadcast_dims, context
) -> mtf.Tensor:
  if not dropout_rate or not _is_training(context):
    return weights
  broadcast = [
    d for d in (dropout_broadcast_dims or []) if d in weights.shape.dims
  ]
  return mtf.dropout(
    weights, True, rate=dropout_rate, noise_shape=weights.shape - broadcast
  )


def _check_attention_dims(
  q: mtf.Tensor,
  k: mtf.Tensor,
  v: mtf.Tensor,
  memory_length_dim: mtf.Dimension,
  key_dim: mtf.Dimension,
  value_dim: mtf.Dimension,
  what: str,
) -> None:
  for name, t, needed in (
    ("q", q, [key_dim]),
    ("k", k, [memory_length_dim, key_dim]),
    ("v", v, [memory_length_dim, value_dim]),
  ):
    for d in needed:
      if d not in t.shape.dims:
        raise ValueError(
          "%s: %s %s has no dimension %s" % (what, name, t.shape.to_string, d)
        )
  if memory_length_dim in q.shape.dims:
    raise ValueError(
      "%s: the memory length dimension %s must not be a dimension of q %s "
      "(rename the key/value length, e.g. to 'memory_length')"
      % (what, memory_length_dim, q.shape.to_string)
    )


def _logits_shape(
  q: mtf.Tensor, k: mtf.Tensor, key_dim: mtf.Dimension
) -> mtf.Shape:
  """The q . k logits' dims: those of both first, then q's, then k's.

  [batch, length, heads, d_kv] . [batch, memory_length, heads, d_kv]
    -> [batch, heads, length, memory_length]
  With the dims of both leading, the slices of the logits and weights are
  batches of [length, memory_length] matrices: q . k, weights . v and their
  gradients are batched matmuls that never copy them. The einsum's default
  order, [batch, length, heads, memory_length], made tf.einsum transpose the
  logits, the weights or their gradients in every one of those products
  (on CPU ~10% of the op time of benchmarks/transformer_step.py's training
  step). Layouts are by name, so what is split is unchanged.
  """
  shared = [d for d in q.shape.dims if d in k.shape.dims and d != key_dim]
  q_only = [d for d in q.shape.dims if d not in k.shape.dims]
  k_only = [d for d in k.shape.dims if d not in q.shape.dims]
  return mtf.Shape(shared + q_only + k_only)


def _add_bias(logits: mtf.Tensor, bias: Optional[mtf.Tensor]) -> mtf.Tensor:
  if bias is None:
    return logits
  return logits + mtf.cast(bias, logits.dtype)


def _add_attention_z_loss(
  logits: mtf.Tensor,
  memory_length_dim: mtf.Dimension,
  z_loss_coeff: float,
  context,
  dtype,
) -> None:
  """Appends the attention z-loss (see `attention`) to context.losses.

  The mean is divided by the number of microbatches, so that accumulated
  gradients match a single large batch.
  """
  z_loss = mtf.square(mtf.reduce_logsumexp(logits, memory_length_dim))
  if isinstance(context.nonpadding, mtf.Tensor):
    z_loss *= mtf.cast(context.nonpadding, z_loss.dtype)
  z_loss = mtf.reduce_mean(z_loss)
  if context.num_microbatches and context.num_microbatches > 1:
    z_loss /= context.num_microbatches
  mtf.scalar_summary("attention_z_loss", z_loss)
  context.losses.append(mtf.cast(z_loss * z_loss_coeff, dtype))


@gin.configurable(module=_GIN_MODULE)
def attention(
  q: mtf.Tensor,
  k: mtf.Tensor,
  v: mtf.Tensor,
  memory_length_dim: mtf.Dimension,
  key_dim: mtf.Dimension,
  value_dim: mtf.Dimension,
  bias: Optional[mtf.Tensor] = None,
  dropout_rate: float = 0.0,
  dropout_broadcast_dims=None,
  extra_logit=None,
  context=None,
  float32_logits: bool = True,
  z_loss_coeff: Optional[float] = None,
) -> mtf.Tensor:
  """Softmax dot-product attention (no 1/sqrt(d_kv) logit scaling).

  logits = q . k (contracting key_dim) + bias; weights = softmax over
  memory_length_dim; output = weights . v.

  Args:
    q: [query dims..., key_dim].
    k: [memory dims..., memory_length_dim, key_dim].
    v: [memory dims..., memory_length_dim, value_dim].
    memory_length_dim: the key/value position Dimension.
    key_dim: channels of q and k.
    value_dim: channels of v and of the output.
    bias: optional additive logits bias (e.g. -1e9 where not visible),
      broadcastable to the logits.
    dropout_rate: dropout on the attention weights (training only).
    dropout_broadcast_dims: Dimensions along which the dropout mask is shared.
    extra_logit: optional extra logit in the softmax denominator.
    context: optional transformer Context (train flag, 2-d sharding).
    float32_logits: compute the logits and softmax in float32.
    z_loss_coeff: if set (and training), appends to context.losses
      z_loss_coeff * mean(logsumexp(logits over memory)^2 * nonpadding), which
      keeps the logits near zero and so stabilizes training.

  Returns:
    q's dims with key_dim replaced by value_dim.

  Raises:
    ValueError: if q, k, v lack the named dimensions.
  """
  _check_attention_dims(
    q, k, v, memory_length_dim, key_dim, value_dim, "attention"
  )
  output_shape = mtf.Shape(
    [value_dim if d == key_dim else d for d in q.shape.dims]
  )
  q, k, v, bias = maybe_reshape_attention_input_for_2d_sharding(
    context, q, k, v, bias, [key_dim, value_dim]
  )
  key_dim = _renamed(key_dim, q)
  value_dim = _renamed(value_dim, v)
  if float32_logits:
    q = mtf.cast(q, tf.float32)
    k = mtf.cast(k, tf.float32)
  logits = us_einsum([q, k], output_shape=_logits_shape(q, k, key_dim))
  logits = _add_bias(logits, bias)
  if z_loss_coeff is not None and context is not None and context.train:
    _add_attention_z_loss(
      logits, memory_length_dim, z_loss_coeff, context, v.dtype
    )
  weights = mtf.softmax(logits, memory_length_dim, extra_logit=extra_logit)
  weights = mtf.cast(weights, v.dtype)
  weights = _attention_dropout(
    weights, dropout_rate, dropout_broadcast_dims, context
  )
  outputs = mtf.einsum(
    [weights, v],
    mtf.Shape([value_dim if d == key_dim else d for d in q.shape.dims]),
  )
  if outputs.shape != output_shape:
    outputs = mtf.reshape(outputs, output_shape)
  return outputs


@gin.configurable(module=_GIN_MODULE)
def hybrid_attention(
  q: mtf.Tensor,
  k: mtf.Tensor,
  v: mtf.Tensor,
  context,
  memory_length_dim: mtf.Dimension,
  key_dim: mtf.Dimension,
  value_dim: mtf.Dimension,
  bias: Optional[mtf.Tensor] = None,
  dropout_rate: float = 0.0,
  dropout_broadcast_dims=None,
  extra_logit=None,
) -> mtf.Tensor:
  """A learned mix of softmax attention and doubly-normalised attention.

  Doubly-normalised weights normalise the logits first over the queries (a
  log-softmax over the query length, which must be named "length" and have
  the size of memory_length_dim) and then over the memory. The mixing weight
  is the scalar variable `doubly_coeff` (initially 0.5, clipped to [0, 1]).

  Args:
    q: queries [batch..., length, heads..., d_k]; the query length dim must be
      named "length" and have the memory length's size.
    k: keys [batch..., memory_length, heads..., d_k].
    v: values [batch..., memory_length, heads..., d_v].
    context: the Context (required: the mixing variable is created on its mesh).
    memory_length_dim: the memory length Dimension.
    key_dim: the key channels Dimension (contracted).
    value_dim: the value channels Dimension.
    bias: a logit bias broadcastable to the logits (e.g. -1e9 where not
      visible), or None.
    dropout_rate: the dropout rate of the attention weights.
    dropout_broadcast_dims: dims the dropout mask is shared over.
    extra_logit: a logit for an implicit extra memory position of value 0 (None:
      none).

  Returns:
    q's dims with key_dim replaced by value_dim.

  Raises:
    ValueError: if q has no query "length" dimension of the memory's size.
  """
  _check_attention_dims(
    q, k, v, memory_length_dim, key_dim, value_dim, "hybrid_attention"
  )
  if context is None:
    raise ValueError(
      "hybrid_attention needs a context (it creates the "
      "variable 'doubly_coeff')"
    )
  query_length_dim = mtf.Dimension("length", memory_length_dim.size)
  if query_length_dim not in q.shape.dims:
    raise ValueError(
      "hybrid_attention: q %s needs a query dimension %s matching the "
      "memory dimension %s"
      % (q.shape.to_string, query_length_dim, memory_length_dim)
    )
  logits = us_einsum([q, k], reduced_dims=[key_dim])
  logits = _add_bias(logits, bias)
  coeff = mtf.get_variable(
    context.mesh,
    "doubly_coeff",
    [],
    initializer=tf1.constant_initializer(0.5),
    dtype=context.variable_dtype,
  )
  coeff = mtf.maximum(mtf.minimum(coeff, 1.0), 0.0)
  upper = mtf.softmax(logits, memory_length_dim, extra_logit=extra_logit)
  lower_log = mtf.log_softmax(logits, query_length_dim, extra_logit=extra_logit)
  doubly = mtf.softmax(lower_log, memory_length_dim, extra_logit=extra_logit)
  weights = coeff * doubly + (1.0 - coeff) * upper
  weights = _attention_dropout(
    weights, dropout_rate, dropout_broadcast_dims, context
  )
  outputs_shape = mtf.Shape(
    [value_dim if d == key_dim else d for d in q.shape.dims]
  )
  return mtf.einsum([weights, v], outputs_shape)


_SYNTHESIZE_MODES = (
  "random",
  "factorized",
  "dense",
  "dense_minus",
  "random_plus",
  "random_plus_alpha",
)


def _slice_to(x: mtf.Tensor, name: str, size: int) -> mtf.Tensor:
  if x.shape.get_dim_by_name(name).size == size:
    return x
  return mtf.slice(x, 0, size, name)


def _synthetic_table(
  context,
  q: mtf.Tensor,
  memory_length_dim,
  heads_dims,
  max_length: int,
  name: str,
) -> mtf.Tensor:
  """Variable `name` [length, heads..., memory_length] cut to the query."""
  if context is None:
    raise ValueError(
      "synthetic_attention needs a context (it creates the variable %r)" % name
    )
  if memory_length_dim.size > max_length:
    raise ValueError(
      "synthetic_attention: memory dimension %s is longer than max_length "
      "%d" % (memory_length_dim, max_length)
    )
  shape = mtf.Shape(
    [mtf.Dimension("length", max_length)]
    + heads_dims
    + [mtf.Dimension(memory_length_dim.name, max_length)]
  )
  r = mtf.get_variable(
    context.mesh, name, shape, initializer=None, dtype=context.variable_dtype
  )
  r = _slice_to(r, memory_length_dim.name, memory_length_dim.size)
  table_length = r.shape.get_dim_by_name("length")
  if context.mode == "incremental":
    return mtf.gather(r, context.position, table_length)
  length_dim = q.shape.get_dim_by_name("length")
  return _slice_to(r, "length", length_dim.size)


@gin.configurable(module=_GIN_MODULE)
def synthetic_attention(
  q: mtf.Tensor,
  k: mtf.Tensor,
  v: mtf.Tensor,
  memory_length_dim: mtf.Dimension,
  key_dim: mtf.Dimension,
  value_dim: mtf.Dimension,
  bias: Optional[mtf.Tensor] = None,
  dropout_rate: float = 0.0,
  dropout_broadcast_dims=None,
  extra_logit=None,
  synthesize: bool = True,
  synthesize_mode: str = "random_plus_alpha",
  factorized_dim: int = 16,
  max_length: int = 512,
  context=None,
) -> mtf.Tensor:
  """Attention with synthesized logits (Synthesizer, arXiv:2005.00743).

  synthesize_mode:
    "random": logits are a learned table `R` [length, heads, memory_length]
      (max_length positions each way, cut to the sequence);
    "factorized": `R` = einsum of `R1` and `R2` [factorized_dim, heads,
      max_length];
    "dense" / "dense_minus": logits = dense(relu(q)) to max_length memory
      positions (variable `pi/kernel`), no key;
    "random_plus": q . k + `R`;
    "random_plus_alpha": (1 - a) q . k + a `R`, a = sigmoid(`alpha`) learned
      (initially 0.5).
  With synthesize=False this is plain softmax attention.

  Args:
    q: queries [batch..., length, heads..., d_k].
    k: keys [batch..., memory_length, heads..., d_k].
    v: values [batch..., memory_length, heads..., d_v].
    memory_length_dim: the memory length Dimension.
    key_dim: the key channels Dimension.
    value_dim: the value channels Dimension.
    bias: a logit bias broadcastable to the logits, or None.
    dropout_rate: the dropout rate of the attention weights.
    dropout_broadcast_dims: dims the dropout mask is shared over.
    extra_logit: a logit for an implicit extra memory position of value 0 (None:
      none).
    synthesize: synthesize the logits (False: plain softmax attention).
    synthesize_mode: "random", "factorized", "dense", "dense_minus",
      "random_plus" or "random_plus_alpha" (see above).
    factorized_dim: the inner size of the "factorized" table.
    max_length: the largest sequence length the synthesized tables cover.
    context: the Context (required when synthesizing: the variables are created
      on its mesh).

  Returns:
    q's dims with key_dim replaced by value_dim.

  Raises:
    ValueError: for an unknown synthesize_mode (named) or missing context.
  """
  _check_attention_dims(
    q, k, v, memory_length_dim, key_dim, value_dim, "synthetic_attention"
  )
  if synthesize and synthesize_mode not in _SYNTHESIZE_MODES:
    raise ValueError(
      "synthetic_attention: unknown synthesize_mode %r; "
      "expected one of %s" % (synthesize_mode, list(_SYNTHESIZE_MODES))
    )
  heads_dims = [d for d in v.shape.dims if d.name == "heads"]
  if not synthesize or synthesize_mode in ("random_plus", "random_plus_alpha"):
    logits = us_einsum([q, k], reduced_dims=[key_dim])
  if synthesize:
    if synthesize_mode in ("random", "random_plus", "random_plus_alpha"):
      r = _synthetic_table(
        context, q, memory_length_dim, heads_dims, max_length, "R"
      )
      if synthesize_mode == "random":
        logits = r
      elif synthesize_mode == "random_plus":
        logits = logits + r
      else:
        alpha = mtf.get_variable(
          context.mesh,
          "alpha",
          mtf.Shape([mtf.Dimension("alpha", 1)]),
          initializer=tf1.zeros_initializer(),
          dtype=context.variable_dtype,
        )
        alpha = mtf.sigmoid(mtf.reduce_sum(alpha))
        logits = (1.0 - alpha) * logits + alpha * r
    elif synthesize_mode == "factorized":
      if context is None:
        raise ValueError(
          "synthetic_attention: mode 'factorized' needs a context"
        )
      tmp = mtf.Dimension("tmp", factorized_dim)
      shape = mtf.Shape(
        [tmp] + heads_dims + [mtf.Dimension("memory_length", max_length)]
      )
      r1 = mtf.get_variable(
        context.mesh,
        "R1",
        shape,
        initializer=None,
        dtype=context.variable_dtype,
      )
      r2 = mtf.get_variable(
        context.mesh,
        "R2",
        shape,
        initializer=None,
        dtype=context.variable_dtype,
      )
      r2 = mtf.rename_dimension(r2, "memory_length", "length")
      r = mtf.einsum([r1, r2], reduced_dims=[tmp])
      r = _slice_to(r, memory_length_dim.name, memory_length_dim.size)
      if context.mode == "incremental":
        r = mtf.gather(r, context.position, r.shape.get_dim_by_name("length"))
      else:
        r = _slice_to(r, "length", q.shape.get_dim_by_name("length").size)
      logits = r
    else:  # dense, dense_minus
      tmp = mtf.Dimension(memory_length_dim.name, max_length)
      logits = mtf.layers.dense(
        mtf.relu(q),
        [tmp],
        reduced_dims=[key_dim],
        use_bias=False,
        name="pi",
        variable_dtype=None if context is None else context.variable_dtype,
      )
      logits = _slice_to(logits, memory_length_dim.name, memory_length_dim.size)
  logits = _add_bias(logits, bias)
  weights = mtf.softmax(logits, memory_length_dim, extra_logit=extra_logit)
  weights = mtf.cast(weights, v.dtype)
  weights = _attention_dropout(
    weights, dropout_rate, dropout_broadcast_dims, context
  )
  query_dims = [d for d in q.shape.dims if d != key_dim]
  outputs_shape = mtf.Shape(
    query_dims + [d for d in heads_dims if d not in query_dims] + [value_dim]
  )
  return mtf.einsum([weights, v], outputs_shape)


def visibility_mask_to_attention_bias(visible: mtf.Tensor, dtype) -> mtf.Tensor:
  """0 where visible, -1e9 where not: an additive attention-logits bias.

  Example (a causal mask):
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> query_pos = mtf.range(converter.mesh, mtf.Dimension("length", 3),
    ...                       tf.int32)
    >>> memory_pos = mtf.range(converter.mesh,
    ...                        mtf.Dimension("memory_length", 3), tf.int32)
    >>> bias = visibility_mask_to_attention_bias(
    ...     mtf.greater_equal(query_pos, memory_pos), tf.float32)
    >>> converter.convert_mtf_tensor_to_np_array(bias) + 0.0  # no -0.0
    array([[ 0.e+00, -1.e+09, -1.e+09],
           [ 0.e+00,  0.e+00, -1.e+09],
           [ 0.e+00,  0.e+00,  0.e+00]], dtype=float32)

  Args:
    visible: a boolean mtf.Tensor: True where the query may attend to the memory
      position.
    dtype: the dtype of the bias.

  Returns:
    A bias of `visible`'s shape: 0 where visible, -1e9 where not.
  """
  return mtf.cast(mtf.logical_not(visible), dtype) * _NEG_INF


def _renamed(dim: mtf.Dimension, t: mtf.Tensor) -> mtf.Dimension:
  """dim, or its "_unsplit" renaming if t carries that instead."""
  if dim in t.shape.dims:
    return dim
  return mtf.Dimension(_unsplit_name(dim.name), dim.size)


def _unsplit_name(name: str) -> str:
  return name + "_unsplit"


def maybe_reshape_attention_input_for_2d_sharding(
  context,
  q: mtf.Tensor,
  k: mtf.Tensor,
  v: mtf.Tensor,
  bias: Optional[mtf.Tensor],
  unsplittable_dims: Sequence[mtf.Dimension],
) -> Tuple[mtf.Tensor, mtf.Tensor, mtf.Tensor, Optional[mtf.Tensor]]:
  """Keeps the attention channel dims whole under 2-d model sharding.

  With a 2-d layout that splits the per-head channels (e.g. "d_kv:model"),
  the logits contraction would need an allreduce of every [query, memory]
  score. When the model's layout (context.model.layout and .mesh_shape)
  splits one of `unsplittable_dims`, that dimension is renamed to
  "<name>_unsplit" in q, k and v (a dimension no layout rule names, so it is
  gathered once and the scores are computed locally). Without a context,
  layout or mesh shape, or when nothing is split, the inputs are returned
  unchanged. `attention` renames the output back.

  Args:
    context: the Context (its model's layout and mesh_shape are read), or None.
    q: queries [batch..., length, heads..., d_k].
    k: keys [batch..., memory_length, heads..., d_k].
    v: values [batch..., memory_length, heads..., d_v].
    bias: the logit bias, or None (returned as is).
    unsplittable_dims: the dims that must stay whole (e.g. the key and value
      channel dims).

  Returns:
    (q, k, v, bias).
  """
  unchanged = (q, k, v, bias)
  if context is None or getattr(context, "model", None) is None:
    return unchanged
  layout = getattr(context.model, "layout", None)
  mesh_shape = getattr(context.model, "mesh_shape", None)
  if not layout or not mesh_shape:
    return unchanged
  mesh_shape = mtf.convert_to_shape(mesh_shape)
  if mesh_shape.size <= 1:
    return unchanged
  layout_rules = mtf.convert_to_layout_rules(layout)
  split = [
    d
    for d in unsplittable_dims
    if mtf.tensor_dim_to_mesh_dim_size(layout_rules, mesh_shape, d) > 1
  ]
  if not split:
    return unchanged

  def unsplit(t):
    for d in split:
      if d in t.shape.dims:
        t = mtf.rename_dimension(t, d.name, _unsplit_name(d.name))
    return t

  return unsplit(q), unsplit(k), unsplit(v), bias
