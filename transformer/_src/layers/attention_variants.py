"""Research variants of multi-head attention (transformer_layers).

TalkingHeads*Attention: separate heads dims for the q.k logits, for the
  softmax and for the values, with learned linear maps between them
  ("Talking-Heads Attention", Shazeer et al. 2020), optionally plus maps
  computed from the query / memory inputs (dynamic projections).
GeneralBilinear*Attention: logits x W_h m^T with a full bilinear form per
  head; keys and values are the memory itself (no k / v projections).
Branched*Attention: each head is projected to d_model separately, weighted
  (kappa), passed through a shared DenseReluDense, weighted again (alpha)
  and summed ("Weighted Transformer", Ahmed et al. 2017).
Synthesizer: attention with synthesized logits (attention.synthetic_attention).

All subclass SelfAttention / EncDecAttention (self_attention.py,
enc_dec_attention.py) and use their causality / packing / relative-position
biases (`compute_bias`, `enc_dec_attention_bias`) and decoding protocol:
self-attention records its memory (keys and values, renamed "memory_length")
in mode "first_part" and writes one position per "incremental" step;
encoder-decoder attention records its memory as a constant state.
"""

from __future__ import annotations

import functools
from typing import Callable, List, Optional, Sequence, Tuple

import gin
import tensorflow as tf

import mesh_tensorflow as mtf
from transformer._src.layers import attention_core as attention
from transformer._src.layers.context import Context
from transformer._src.layers.dense_layers import DenseReluDense
from transformer._src.layers.enc_dec_attention import EncDecAttention
from transformer._src.layers.enc_dec_attention import enc_dec_attention_bias
from transformer._src.layers.self_attention import SelfAttention

__all__ = [
  "BranchedEncDecAttention",
  "BranchedSelfAttention",
  "GeneralBilinearEncDecAttention",
  "GeneralBilinearSelfAttention",
  "Synthesizer",
  "TalkingHeadsEncDecAttention",
  "TalkingHeadsSelfAttention",
]

_GIN_MODULE = "mesh_tensorflow.transformer.transformer_layers"
tf1 = tf.compat.v1

_DYNAMIC_PROJECTIONS = ("x2l", "m2l", "x2w", "m2w")


def _to_dims(spec, what: str, layer: str) -> List[mtf.Dimension]:
  """(("heads", 12), ...) -> [Dimension("heads", 12), ...]."""
  try:
    dims = [mtf.convert_to_dimension(d) for d in spec]
  except (TypeError, ValueError) as e:
    raise ValueError(
      "%s: %s must be a sequence of (name, size) pairs, got %r"
      % (layer, what, spec)
    ) from e
  if len({d.name for d in dims}) != len(dims):
    raise ValueError(
      "%s: %s has repeated dimension names: %r" % (layer, what, spec)
    )
  return dims


def _ensemble_dims(context: Context) -> List[mtf.Dimension]:
  return list(getattr(context.model, "ensemble_dims", None) or [])


def _variance_scaling(scale: float) -> mtf.layers.VarianceScalingInitializer:
  """VarianceScalingInitializer(scale), or scale 1 under the unit-scaling
  convention (where us_einsum does the scaling).
  """
  return mtf.layers.VarianceScalingInitializer(
    1.0 if mtf.layers.unit_scaling_convention() else scale
  )


def _projection(
  context: Context,
  x: mtf.Tensor,
  name: str,
  reduced_dims,
  new_dims,
  expert_dims=(),
  kernel_initializer=None,
) -> mtf.Tensor:
  """A bias-free dense layer: variable `<name>/kernel` [ensemble...,
  expert_dims..., reduced_dims..., new_dims...], the names the original's
  talking-heads and general-bilinear layers give their projections.
  """
  return mtf.layers.dense(
    x,
    reduced_dims=list(reduced_dims),
    new_dims=list(new_dims),
    use_bias=False,
    activation=None,
    variable_dtype=context.variable_dtype,
    name=name,
    expert_dims=_ensemble_dims(context) + list(expert_dims),
    kernel_initializer=kernel_initializer,
  )


def _write_position(
  context: Context,
  step: mtf.Tensor,
  old: mtf.Tensor,
  memory_length: mtf.Dimension,
) -> mtf.Tensor:
  """old [..., memory_length, ...] with this step's value at the position."""
  write = mtf.equal(
    mtf.range(context.mesh, memory_length, tf.int32), context.get_position()
  )
  return mtf.where(write, step, old, output_shape=old.shape)


def _self_attention_memory(
  layer: SelfAttention, context: Context, steps: Sequence[mtf.Tensor]
) -> Tuple[List[mtf.Tensor], mtf.Tensor]:
  """Memory tensors over "memory_length" and their positions.

  steps: this call's tensors with the length dim ([batch..., length, ...],
  or one position incrementally). Records / updates the decoding states.
  """
  memory_length = layer.memory_length(context)
  if context.mode == "incremental":
    olds = context.get_states(len(steps))
    memory = [
      _write_position(context, s, o, memory_length) for s, o in zip(steps, olds)
    ]
    context.record_new_states(memory)
    return memory, mtf.range(context.mesh, memory_length, tf.int32)
  memory = [layer.rename_length_to_memory_length(s, context) for s in steps]
  if context.mode == "first_part":
    context.record_new_states(memory)
  return memory, layer.rename_length_to_memory_length(
    context.get_position(), context
  )


def _encoder_memory(layer, context: Context, compute):
  """compute(encoder_output) -> tuple of tensors; cached as constant state."""
  if context.mode == "incremental":
    return context.get_constant_state()
  memory = context.encoder_output
  if memory is None:
    raise ValueError("%s needs context.encoder_output" % type(layer).__name__)
  if "memory_length" not in memory.shape.dimension_names:
    raise ValueError(
      "%s: encoder_output %s has no 'memory_length' dimension"
      % (type(layer).__name__, memory.shape.to_string)
    )
  values = tuple(compute(memory)) + (
    memory.shape.get_dim_by_name("memory_length"),
  )
  if context.mode == "first_part":
    context.record_constant_state(values)
  return values


def _dropout(layer, context: Context, weights: mtf.Tensor) -> mtf.Tensor:
  if not context.train or not layer.dropout_rate:
    return weights
  broadcast = [d for d in [context.length_dim] if d in weights.shape.dims]
  return mtf.dropout(
    weights,
    True,
    rate=layer.dropout_rate,
    noise_shape=weights.shape - broadcast,
  )


# ----------------------------------------------------------------------------
# Talking heads.


@gin.configurable(module=_GIN_MODULE)
class TalkingHeadsSelfAttention(SelfAttention):
  """Talking-heads self-attention.

  logits[kh] = q[kh] . k[kh] over key_heads_dims; the logits are mapped
  linearly to softmax_heads_dims (variable `logits/kernel` [shared...,
  key-only heads..., softmax-only heads...]), the biases added, softmax
  over memory; the weights are mapped to value_heads_dims
  (`weights/kernel`) and combine v [value heads, d_v]. A heads Dimension
  present (same name and size) in both sides of a map is not mixed, so
  identical heads dims (the default) give plain multi-head attention with
  no map.

  dynamic_projections (self-attention only): a subset of "x2l", "m2l",
  "x2w", "m2w" adds to the pre-softmax ("l") / post-softmax ("w") map one
  computed from the query input x or the memory input m (variables
  `logits/logits_dynamic_<i>/kernel` and `weights/weights_dynamic_<i>/kernel`
  [d_model, shared..., from-only..., to-only...], variance
  dynamic_projections_init_scale / (d_model * from-only heads)), numbered
  in the order x, m.

  Variables, as the original names them (ensemble dims first): q/kernel,
  k/kernel [d_model, key heads..., d_k]; v/kernel [d_model, value heads...,
  d_v]; y/kernel [value heads..., d_v, d_model].

  Args:
    key_heads_dims: the heads dims of q and k, as (name, size) pairs.
    softmax_heads_dims: the heads dims of the softmax, as (name, size) pairs.
    value_heads_dims: the heads dims of v and the output, as (name, size) pairs.
    key_size: d_k, the per-head query/key channels.
    value_size: d_v, the per-head value channels.
    dynamic_projections: None or a subset of "x2l", "m2l", "x2w", "m2w" (see
      above).
    dynamic_projections_init_scale: the initial scale of the dynamic
      projections.

  Raises:
    ValueError: for an unknown dynamic projection.
  """

  def __init__(
    self,
    key_heads_dims=(("heads", 12),),
    softmax_heads_dims=(("heads", 12),),
    value_heads_dims=(("heads", 12),),
    key_size: int = 64,
    value_size: int = 64,
    dropout_rate: float = 0.0,
    relative_attention_type: Optional[str] = None,
    relative_attention_num_buckets: int = 32,
    dynamic_projections=None,
    dynamic_projections_init_scale: float = 1e-2,
  ):
    name = type(self).__name__
    self.key_heads_dims = _to_dims(key_heads_dims, "key_heads_dims", name)
    self.softmax_heads_dims = _to_dims(
      softmax_heads_dims, "softmax_heads_dims", name
    )
    self.value_heads_dims = _to_dims(value_heads_dims, "value_heads_dims", name)
    super().__init__(
      num_heads=max(1, mtf.Shape(self.softmax_heads_dims).size),
      key_value_size=key_size,
      dropout_rate=dropout_rate,
      relative_attention_type=relative_attention_type,
      relative_attention_num_buckets=relative_attention_num_buckets,
    )
    self.key_size = key_size
    self.value_size = value_size
    dynamic_projections = list(dynamic_projections or [])
    for p in dynamic_projections:
      if p not in _DYNAMIC_PROJECTIONS:
        raise ValueError(
          "%s: unknown dynamic projection %r; expected some of "
          "%s" % (name, p, list(_DYNAMIC_PROJECTIONS))
        )
    self.dynamic_projections = dynamic_projections
    self.dynamic_projections_init_scale = dynamic_projections_init_scale

  @property
  def key_dim(self) -> mtf.Dimension:
    """The per-head query/key channels Dimension ("d_k")."""
    return mtf.Dimension("d_k", self.key_size)

  @property
  def value_dim(self) -> mtf.Dimension:
    """The per-head value channels Dimension ("d_v")."""
    return mtf.Dimension("d_v", self.value_size)

  def compute_q(self, context: Context, x: mtf.Tensor) -> mtf.Tensor:
    """Queries [..., key heads..., d_k] (variable `q/kernel`; the
    1/sqrt(d_k) logit scaling is folded into its initializer).

    Args:
      context: the Context of the call (mesh, dims, mode, states...).
      x: the layer input [batch..., length, d_model].

    Returns:
      The queries [batch..., length, key heads..., d_k].
    """
    return _projection(
      context,
      x,
      "q",
      [context.model.model_dim],
      self.key_heads_dims + [self.key_dim],
      kernel_initializer=_variance_scaling(1.0 / self.key_size),
    )

  def compute_k(self, context: Context, x: mtf.Tensor) -> mtf.Tensor:
    """Keys [..., key heads..., d_k] (variable `k/kernel`).

    Args:
      context: the Context of the call (mesh, dims, mode, states...).
      x: the layer input [batch..., length, d_model].

    Returns:
      The keys [batch..., length, key heads..., d_k].
    """
    return _projection(
      context,
      x,
      "k",
      [context.model.model_dim],
      self.key_heads_dims + [self.key_dim],
    )

  def compute_v(self, context: Context, x: mtf.Tensor) -> mtf.Tensor:
    """Values [..., value heads..., d_v] (variable `v/kernel`).

    Args:
      context: the Context of the call (mesh, dims, mode, states...).
      x: the layer input [batch..., length, d_model].

    Returns:
      The values [batch..., length, value heads..., d_v].
    """
    return _projection(
      context,
      x,
      "v",
      [context.model.model_dim],
      self.value_heads_dims + [self.value_dim],
    )

  def compute_y(self, context: Context, u: mtf.Tensor) -> mtf.Tensor:
    """The output: u [..., value heads..., d_v] -> [..., d_model]
    (variable `y/kernel`).

    Args:
      context: the Context of the call (mesh, dims, mode, states...).
      u: the attention output [batch..., length, value heads..., d_v].

    Returns:
      The layer output [batch..., length, d_model].
    """
    return _projection(
      context,
      u,
      "y",
      self.value_heads_dims + [self.value_dim],
      [context.model.model_dim],
    )

  def talking_heads(
    self,
    context: Context,
    inp: mtf.Tensor,
    name: str,
    input_heads_dims,
    output_heads_dims,
    dynamic_projections_from=None,
  ) -> mtf.Tensor:
    """Maps inp's heads dims input_heads_dims -> output_heads_dims.

    A linear map (variable `<name>/kernel` [shared..., input-only...,
    output-only...]); each tensor in dynamic_projections_from ([...,
    d_model]) adds a map computed from it (variables
    `<name>/<name>_dynamic_<i>/kernel`). Identity when the heads dims are the
    same.

    Args:
      context: the Context.
      inp: [..., input heads..., memory_length].
      name: the variable scope ("logits" or "weights").
      input_heads_dims: inp's heads dims.
      output_heads_dims: the heads dims of the result.
      dynamic_projections_from: optional list of tensors [..., d_model].

    Returns:
      inp with output_heads_dims in place of input_heads_dims.
    """
    shared = [d for d in input_heads_dims if d in output_heads_dims]
    reduced = [d for d in input_heads_dims if d not in output_heads_dims]
    new = [d for d in output_heads_dims if d not in input_heads_dims]
    if not reduced and not new:
      return inp
    if not dynamic_projections_from:
      return _projection(context, inp, name, reduced, new, expert_dims=shared)
    with tf1.variable_scope(name):
      static_map = mtf.get_variable(
        inp.mesh,
        "kernel",
        _ensemble_dims(context) + shared + reduced + new,
        initializer=mtf.layers.VarianceScalingInitializer()(reduced, new),
        dtype=context.variable_dtype,
      )
      scale = self.dynamic_projections_init_scale / mtf.Shape(reduced).size
      maps = [
        _projection(
          context,
          source,
          "%s_dynamic_%d" % (name, i),
          [context.model.model_dim],
          shared + reduced + new,
          kernel_initializer=_variance_scaling(scale),
        )
        for i, source in enumerate(dynamic_projections_from)
      ]
      # The static map joins the first dynamic one: one einsum fewer than
      # adding it separately, and no [length, memory_length] sized sum of
      # maps.
      maps[0] += mtf.cast(static_map, maps[0].dtype)
      return mtf.add_n(
        [mtf.layers.us_einsum([inp, w], reduced_dims=reduced) for w in maps]
      )

  def _dynamic_sources(
    self, x: mtf.Tensor, m: Optional[mtf.Tensor], from_x: str, from_m: str
  ) -> List[mtf.Tensor]:
    return [
      t for p, t in ((from_x, x), (from_m, m)) if p in self.dynamic_projections
    ]

  def attention_internal(
    self,
    context: Context,
    x: mtf.Tensor,
    m: Optional[mtf.Tensor],
    q: mtf.Tensor,
    k: mtf.Tensor,
    v: mtf.Tensor,
    memory_length: mtf.Dimension,
    bias,
  ) -> mtf.Tensor:
    """Attention from q/k/v (x, m: the query and memory inputs, for the
    dynamic projections) to the layer output [..., d_model].

    Args:
      context: the Context of the call (mesh, dims, mode, states...).
      x: the layer input [batch..., length, d_model].
      m: the memory input [batch..., memory_length, d_model].
      q: the queries [batch..., length, key heads..., d_k].
      k: the keys [batch..., memory_length, key heads..., d_k].
      v: the values [batch..., memory_length, value heads..., d_v].
      memory_length: the memory length Dimension.
      bias: a logit bias, or None.

    Returns:
      The attention output [batch..., length, value heads..., d_v].
    """
    logits = mtf.layers.us_einsum([q, k], reduced_dims=[self.key_dim])
    logits = self.talking_heads(
      context,
      logits,
      "logits",
      self.key_heads_dims,
      self.softmax_heads_dims,
      self._dynamic_sources(x, m, "x2l", "m2l"),
    )
    if bias is not None:
      logits += mtf.cast(bias, logits.dtype)
    weights = _dropout(self, context, mtf.softmax(logits, memory_length))
    weights = self.talking_heads(
      context,
      weights,
      "weights",
      self.softmax_heads_dims,
      self.value_heads_dims,
      self._dynamic_sources(x, m, "x2w", "m2w"),
    )
    u = mtf.einsum([weights, v], reduced_dims=[memory_length])
    return self.compute_y(context, u)

  def call(self, context: Context, x: mtf.Tensor, losses=None) -> mtf.Tensor:
    del losses
    q = self.compute_q(context, x)
    k = self.compute_k(context, x)
    v = self.compute_v(context, x)
    use_m = any(p.startswith("m") for p in self.dynamic_projections)
    memory, memory_position = _self_attention_memory(
      self, context, [k, v, x] if use_m else [k, v]
    )
    k, v = memory[0], memory[1]
    m = memory[2] if use_m else None
    bias = self.compute_bias(
      context, memory_position, x, self.softmax_heads_dims, q
    )
    return self.attention_internal(
      context, x, m, q, k, v, self.memory_length(context), bias
    )


@gin.configurable(module=_GIN_MODULE)
class TalkingHeadsEncDecAttention(TalkingHeadsSelfAttention):
  """Talking-heads attention to context.encoder_output (same variables;
  relative bias as EncDecAttention; no dynamic projections).

  Raises:
    ValueError: if dynamic_projections are given (self-attention only).
  """

  def __init__(self, relative_attention_type: Optional[str] = None, **kwargs):
    super().__init__(relative_attention_type=relative_attention_type, **kwargs)
    if self.dynamic_projections:
      raise ValueError(
        "TalkingHeadsEncDecAttention: dynamic_projections are "
        "only supported in self-attention, got %r" % (self.dynamic_projections,)
      )

  def call(self, context: Context, x: mtf.Tensor, losses=None) -> mtf.Tensor:
    del losses
    q = self.compute_q(context, x)
    k, v, memory_length = _encoder_memory(
      self,
      context,
      lambda m: (self.compute_k(context, m), self.compute_v(context, m)),
    )
    bias = enc_dec_attention_bias(self, context, self.softmax_heads_dims)
    return self.attention_internal(
      context, x, None, q, k, v, memory_length, bias
    )


# ----------------------------------------------------------------------------
# General bilinear.


@gin.configurable(module=_GIN_MODULE)
class GeneralBilinearSelfAttention(SelfAttention):
  """Attention whose per-head logits are a general bilinear form x W_h m.

  Equivalent to multi-head attention with d_kv = d_model, with the (then
  redundant) k and v projections left out: keys and values are the memory
  inputs m. Variables: q [d_model (input), heads..., d_model] (initial
  stddev 1/d_model, the 1/sqrt(d_model) logit scaling folded in) and o
  [heads..., d_model (value), d_model].

  Args:
    heads_dims: the heads Dimensions as (name, size) pairs, e.g. (("heads",
      12),).
  """

  def __init__(
    self,
    heads_dims=(("heads", 12),),
    dropout_rate: float = 0.0,
    relative_attention_type: Optional[str] = None,
    relative_attention_num_buckets: int = 32,
  ):
    self.heads_dims = _to_dims(heads_dims, "heads_dims", type(self).__name__)
    super().__init__(
      num_heads=max(1, mtf.Shape(self.heads_dims).size),
      dropout_rate=dropout_rate,
      relative_attention_type=relative_attention_type,
      relative_attention_num_buckets=relative_attention_num_buckets,
    )

  def compute_q(self, context: Context, x: mtf.Tensor) -> mtf.Tensor:
    """x W_h: [..., heads..., d_model] (variable `q/kernel`
    [_d_model, heads..., d_model]).

    Args:
      context: the Context of the call (mesh, dims, mode, states...).
      x: the layer input [batch..., length, d_model].

    Returns:
      The projected queries.
    """
    model_dim = context.model.model_dim
    return _projection(
      context,
      x,
      "q",
      [model_dim],
      self.heads_dims + [model_dim],
      kernel_initializer=_variance_scaling(1.0 / model_dim.size),
    )

  def compute_y(self, context: Context, u: mtf.Tensor) -> mtf.Tensor:
    """The output: u [..., heads..., d_model] -> [..., d_model]
    (variable `y/kernel` [heads..., _d_model, d_model]).

    Args:
      context: the Context of the call (mesh, dims, mode, states...).
      u: the attention output per head.

    Returns:
      The layer output [batch..., length, d_model].
    """
    model_dim = context.model.model_dim
    return _projection(
      context,
      u,
      "y",
      self.heads_dims + [model_dim],
      [model_dim],
    )

  def attention_internal(
    self,
    context: Context,
    q: mtf.Tensor,
    m: mtf.Tensor,
    memory_length: mtf.Dimension,
    bias,
  ) -> mtf.Tensor:
    """Attention of queries q to the memory inputs m (keys and values).

    Args:
      context: the Context of the call (mesh, dims, mode, states...).
      q: the queries [batch..., length, heads, d_model].
      m: the memory [batch..., memory_length, d_model].
      memory_length: the memory length Dimension.
      bias: a logit bias, or None.

    Returns:
      The attention output [batch..., length, heads, d_model].
    """
    logits = mtf.layers.us_einsum(
      [q, m], reduced_dims=[context.model.model_dim]
    )
    if bias is not None:
      logits += mtf.cast(bias, logits.dtype)
    weights = _dropout(self, context, mtf.softmax(logits, memory_length))
    u = mtf.einsum([weights, m], reduced_dims=[memory_length])
    return self.compute_y(context, u)

  def call(self, context: Context, x: mtf.Tensor, losses=None) -> mtf.Tensor:
    del losses
    q = self.compute_q(context, x)
    (m,), memory_position = _self_attention_memory(self, context, [x])
    bias = self.compute_bias(context, memory_position, x, self.heads_dims, None)
    return self.attention_internal(
      context, q, m, self.memory_length(context), bias
    )


@gin.configurable(module=_GIN_MODULE)
class GeneralBilinearEncDecAttention(GeneralBilinearSelfAttention):
  """General bilinear attention to context.encoder_output.

  Args:
    heads_dims: the heads Dimensions as (name, size) pairs, e.g. (("heads",
      12),); the other arguments are GeneralBilinearSelfAttention's.
  """

  def __init__(self, relative_attention_type: Optional[str] = None, **kwargs):
    super().__init__(relative_attention_type=relative_attention_type, **kwargs)

  def call(self, context: Context, x: mtf.Tensor, losses=None) -> mtf.Tensor:
    del losses
    q = self.compute_q(context, x)
    m, memory_length = _encoder_memory(self, context, lambda mem: (mem,))
    bias = enc_dec_attention_bias(self, context, self.heads_dims)
    return self.attention_internal(context, q, m, memory_length, bias)


# ----------------------------------------------------------------------------
# Branched attention.


class _BranchedMixin:
  """Per-head outputs, weighted, through a shared DenseReluDense, summed.

  Variables besides the attention's (kept per head: combine_dims=False,
  keep_query_heads_dims=True): `kappa` and `alpha` [heads] (uniform(0, 1)
  init) and the DenseReluDense variables `wi/kernel`, `wo/kernel` (hidden
  size as gin configures it). The output is
  sum_heads(alpha * DenseReluDense(kappa * attention_output)) with the raw
  kappa and alpha, as the original computes it: the original attaches the
  Weighted Transformer's simplex constraint to the TF variables, where mtf
  optimizers never apply it.
  """

  def _init_branched(self) -> None:
    if self.num_memory_heads != 0:
      raise ValueError(
        "%s: num_memory_heads must be 0 for branched "
        "attention, got %d" % (type(self).__name__, self.num_memory_heads)
      )
    if self.num_heads < 2:
      raise ValueError(
        "%s: branched attention needs num_heads >= 2, got %d"
        % (type(self).__name__, self.num_heads)
      )
    self.dense_layer = DenseReluDense()

  def layer_output_from_attention_output(
    self, context: Context, attention_output: mtf.Tensor, losses
  ) -> mtf.Tensor:
    heads_dim = mtf.Dimension("heads", self.num_heads)
    kappa, alpha = [
      mtf.get_variable(
        context.mesh,
        name,
        mtf.Shape([heads_dim]),
        initializer=tf1.random_uniform_initializer(minval=0.0, maxval=1.0),
        dtype=context.variable_dtype,
      )
      for name in ("kappa", "alpha")
    ]
    o = self.dense_layer.call(context, attention_output * kappa, losses)
    return mtf.reduce_sum(o * alpha, reduced_dim=heads_dim)


@gin.configurable(module=_GIN_MODULE)
class BranchedSelfAttention(_BranchedMixin, SelfAttention):
  """Branched (weighted-transformer) self-attention; see _BranchedMixin.

  Takes SelfAttention's arguments except combine_dims and
  keep_query_heads_dims (forced to False / True).
  """

  def __init__(self, **kwargs) -> None:
    super().__init__(combine_dims=False, keep_query_heads_dims=True, **kwargs)
    self._init_branched()


@gin.configurable(module=_GIN_MODULE)
class BranchedEncDecAttention(_BranchedMixin, EncDecAttention):
  """Branched (weighted-transformer) attention to the encoder output."""

  def __init__(self, relative_attention_type: Optional[str] = None, **kwargs):
    super().__init__(
      relative_attention_type=relative_attention_type,
      combine_dims=False,
      keep_query_heads_dims=True,
      **kwargs,
    )
    self._init_branched()


# ----------------------------------------------------------------------------
# Synthesizer.


@gin.configurable(module=_GIN_MODULE)
class Synthesizer(SelfAttention):
  """Multi-head Synthesizer (arXiv:2005.00743): SelfAttention whose logits
  come from attention.synthetic_attention with `synthesize_mode` ("random",
  "factorized", "dense", "dense_minus", "random_plus" or
  "random_plus_alpha"); its other arguments (max_length, factorized_dim)
  are configured on synthetic_attention through gin. Variables: those of
  SelfAttention (q, k, v, o) plus the synthesizer's (R, alpha, ...).

  Args:
    synthesize_mode: how the logits are synthesized: "random", "factorized",
      "dense", "dense_minus", "random_plus" or "random_plus_alpha" (see
      attention.synthetic_attention).
  """

  def __init__(
    self,
    num_heads: int = 8,
    num_memory_heads: int = 0,
    key_value_size: int = 128,
    shared_kv: bool = False,
    dropout_rate: float = 0.0,
    attention_kwargs=None,
    relative_attention_type: Optional[str] = None,
    relative_attention_num_buckets: int = 32,
    attention_func: Optional[str] = None,
    combine_dims: bool = True,
    keep_query_heads_dims: bool = False,
    synthesize_mode: str = "random_plus_alpha",
    fold_scaling_into_initializer: bool = True,
    **kwargs,
  ):
    super().__init__(
      **kwargs,
      num_heads=num_heads,
      num_memory_heads=num_memory_heads,
      key_value_size=key_value_size,
      shared_kv=shared_kv,
      dropout_rate=dropout_rate,
      attention_kwargs=attention_kwargs,
      relative_attention_type=relative_attention_type,
      relative_attention_num_buckets=relative_attention_num_buckets,
      attention_func=attention_func,
      combine_dims=combine_dims,
      keep_query_heads_dims=keep_query_heads_dims,
      fold_scaling_into_initializer=fold_scaling_into_initializer,
    )
    self.synthesize_mode = synthesize_mode

  @property
  def attention_fn(self) -> Callable[..., mtf.Tensor]:
    """synthetic_attention with this layer's synthesize_mode."""
    return functools.partial(
      attention.synthetic_attention,
      synthesize=True,
      synthesize_mode=self.synthesize_mode,
    )
