"""Self-attention of mesh_tensorflow.transformer.transformer_layers.

`SelfAttention` (multi-head, multi-query or grouped-query self-attention with
optional T5 relative-position biases) and `attention_params`, which builds
the AttentionParams (q/k/v/o variables) of every attention layer. The other
attention layers (encoder-decoder attention in enc_dec_attention.py, local
self-attention in local_self_attention.py, the research variants) subclass
SelfAttention.

Every layer creates its variables under the scope the layer stack opens
(`<block>/<layer>/<ClassName>/q`, ...). Decoding: in mode "first_part" a layer
records the states its "incremental" calls need (self-attention: the keys and
values over the whole length, renamed "memory_length"); in mode "incremental"
x is one position [batch..., d_model] and the states are read back and
updated.

Subclasses (talking heads, experts attention, ...) override `make_params`,
`compute_bias`, `attention_kwargs_from_context`,
`expected_attention_output_shape` or `layer_output_from_attention_output`.
"""

from __future__ import annotations

from typing import Callable, List, Optional

import gin
import tensorflow as tf

import mesh_tensorflow as mtf
from transformer._src.layers import attention_core as attention
from transformer._src.layers import hyperprompts
from transformer._src.layers.attention_bias import relative_position_bucket
from transformer._src.layers.attention_bias import sequence_id_for_bias
from transformer._src.layers.attention_bias import to_bias
from transformer._src.layers.attention_params import AttentionParams
from transformer._src.layers.context import Context
from transformer._src.layers.context import TransformerLayer

__all__ = [
  "SelfAttention",
  "attention_params",
]

_GIN_MODULE = "mesh_tensorflow.transformer.transformer_layers"
_RELATIVE_ATTENTION_TYPES = (None, "bias", "bias_shared", "contextual")
_ATTENTION_FUNCS = (None, "hybrid")


def attention_params(
  context: Context,
  kv_dim: mtf.Dimension,
  num_heads: int,
  num_memory_heads: int = 0,
  shared_kv: bool = False,
  no_query: bool = False,
  combine_dims: bool = True,
  keep_query_heads_dims: bool = False,
  fold_scaling_into_initializer: bool = True,
) -> AttentionParams:
  """AttentionParams for a layer with num_heads query heads over d_model.

  Heads dims: num_heads == 1 -> none; num_memory_heads == 0 -> "heads" for
  queries and memory; == 1 -> multi-query ("heads" queries, one key/value
  head); > 1 -> memory "heads" (num_memory_heads) and queries [heads,
  query_heads (num_heads // num_memory_heads)].

  Args:
    context: the Context of the call (mesh, dims, mode, states...).
    kv_dim: the per-head key/value channels Dimension.
    num_heads: the number of query heads.
    num_memory_heads: the number of key/value heads (0: as many as num_heads;
      otherwise it must divide num_heads, and groups of query heads share a
      key/value head).
    shared_kv: use one projection for keys and values (k = v).
    no_query: make no query projection.
    combine_dims: compute the projections with the heads and channel dims
      combined into one (a faster einsum on TPUs; same results).
    keep_query_heads_dims: keep the query heads dims in the output instead of
      reducing them in the output projection.
    fold_scaling_into_initializer: scale the query projection's initializer by
      d_kv**-0.5 instead of multiplying the logits.

  Returns:
    An AttentionParams.

  Raises:
    ValueError: if num_memory_heads does not divide num_heads.
  """
  if num_heads == 1:
    query_heads_dims, memory_heads_dims = [], []
  elif num_memory_heads == 0:
    query_heads_dims = [mtf.Dimension("heads", num_heads)]
    memory_heads_dims = query_heads_dims
  elif num_memory_heads == 1:
    query_heads_dims = [mtf.Dimension("heads", num_heads)]
    memory_heads_dims = []
  else:
    if num_heads % num_memory_heads:
      raise ValueError(
        "num_memory_heads (%d) must divide num_heads (%d)"
        % (num_memory_heads, num_heads)
      )
    memory_heads_dims = [mtf.Dimension("heads", num_memory_heads)]
    query_heads_dims = memory_heads_dims + [
      mtf.Dimension("query_heads", num_heads // num_memory_heads)
    ]
  model = context.model
  return AttentionParams(
    context.mesh,
    query_input_dim=model.model_dim,
    memory_input_dim=model.model_dim,
    output_dim=model.model_dim,
    key_dim=kv_dim,
    value_dim=kv_dim,
    query_heads_dims=query_heads_dims,
    memory_heads_dims=memory_heads_dims,
    variable_dtype=context.variable_dtype,
    shared_kv=shared_kv,
    no_query=no_query,
    ensemble_dim=getattr(model, "ensemble_dim", None),
    combine_dims=combine_dims,
    keep_query_heads_dims=keep_query_heads_dims,
    fold_scaling_into_initializer=fold_scaling_into_initializer,
  )


@gin.configurable(module=_GIN_MODULE)
class SelfAttention(TransformerLayer):
  """Multi-head self-attention.

  Variables: q, k, v (or kv), o (see AttentionParams), plus
  relative_attention_bias [ensemble..., heads..., buckets] ("bias"; with
  "bias_shared" only in the first layer of the tower that needs it) or
  relative_attention_ak/kernel ("contextual").

  Example (in a one-layer language model):
    >>> from transformer import transformer
    >>> stack = transformer.make_layer_stack(
    ...     [(SelfAttention, {"num_heads": 2, "key_value_size": 4})],
    ...     num_layers=1)
    >>> lm = transformer.Unitransformer(
    ...     stack, d_model=8, input_vocab_size=16, output_vocab_size=16,
    ...     autoregressive=True, max_length=4, vocab_divisor=1)
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> ids = converter.convert_np_array_to_mtf_tensor(
    ...     [[3, 5, 7, 1]], ["batch", "length"])
    >>> logits, _ = lm.call_simple(ids, ids, compute_loss=False)
    >>> converter.convert_mtf_tensor_to_np_array(logits).shape
    (1, 4, 16)
    >>> prefix = "transformer/block_000/layer_000/SelfAttention/"
    >>> for v in converter.graph.all_variables:  # the layer's variables
    ...   if v.name.startswith(prefix):
    ...     print(v.name[len(prefix):], v.shape)
    q Shape[d_model=8, heads=8]
    k Shape[d_model=8, heads=8]
    v Shape[d_model=8, heads=8]
    o Shape[heads=8, d_model=8]
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
    fold_scaling_into_initializer: bool = True,
    z_loss_coeff: Optional[float] = None,
    use_hyperprompt: bool = False,
    hyperprompt_mtlshare: bool = False,
    hyperprompt_length_encoder: Optional[int] = None,
    hyperprompt_length_decoder: Optional[int] = None,
    hyperprompt_hidden_dim: Optional[int] = None,
    hyperprompt_task_num: int = 8,
  ):
    """Args after fold_scaling_into_initializer (the others as the original).

    Args:
      z_loss_coeff: if set, a z-loss on the attention logits (see
        attention.attention) is added to the training losses.
      use_hyperprompt: prompts from a hypernetwork (HyperPrompt) instead of
        per-layer projections (MTL-Prompt); see hyperprompts.py.
      hyperprompt_mtlshare: MTL-Prompt: one projection network for all tasks.
      hyperprompt_length_encoder: number of task prompts prepended to the
        keys/values in the "encoder" tower (None: no prompts).
      hyperprompt_length_decoder: the same in the "decoder" tower.
      hyperprompt_hidden_dim: hidden size of the prompt projections.
      hyperprompt_task_num: number of tasks.
      num_heads: the number of query heads.
      num_memory_heads: the number of key/value heads (0: as many as num_heads;
        otherwise it must divide num_heads, and groups of query heads share a
        key/value head).
      key_value_size: the size of the per-head key and value channels (d_kv).
      shared_kv: use one projection for keys and values (k = v).
      dropout_rate: the dropout rate of the attention weights (training only).
      attention_kwargs: extra keyword arguments for the attention function (e.g.
        {"extra_logit": 0.0}).
      relative_attention_type: None, "bias" (a learned logit bias per
        relative-position bucket and head), "bias_shared" (one such bias shared
        by the layers of the stack), "contextual" (learned per-bucket vectors
        dotted with the queries) or "rpr_T5"-style variants the layer supports.
      relative_attention_num_buckets: the number of relative-position buckets
        (log-spaced beyond half of them).
      attention_func: None (softmax attention), "hybrid" (hybrid_attention) or
        "synthetic" (synthetic_attention).
      combine_dims: compute the projections with the heads and channel dims
        combined into one (a faster einsum on TPUs; same results).
      keep_query_heads_dims: keep the query heads dims in the output instead of
        reducing them in the output projection.
      fold_scaling_into_initializer: scale the query projection's initializer by
        d_kv**-0.5 instead of multiplying the logits.
    """
    if relative_attention_type not in _RELATIVE_ATTENTION_TYPES:
      raise ValueError(
        "%s: unknown relative_attention_type %r; expected one of %s"
        % (
          type(self).__name__,
          relative_attention_type,
          list(_RELATIVE_ATTENTION_TYPES),
        )
      )
    if attention_func not in _ATTENTION_FUNCS:
      raise ValueError(
        "%s: unknown attention_func %r; expected one of %s"
        % (type(self).__name__, attention_func, list(_ATTENTION_FUNCS))
      )
    self.num_heads = num_heads
    self.num_memory_heads = num_memory_heads
    self.key_value_size = key_value_size
    self.shared_kv = shared_kv
    self.dropout_rate = dropout_rate
    self.attention_kwargs = attention_kwargs or {}
    self.relative_attention_type = relative_attention_type
    self.relative_attention_num_buckets = relative_attention_num_buckets
    self.attention_func = attention_func
    self.combine_dims = combine_dims
    self.keep_query_heads_dims = keep_query_heads_dims
    self.fold_scaling_into_initializer = fold_scaling_into_initializer
    self.z_loss_coeff = z_loss_coeff
    self.use_hyperprompt = use_hyperprompt
    self.hyperprompt_mtlshare = hyperprompt_mtlshare
    self.hyperprompt_length_encoder = hyperprompt_length_encoder
    self.hyperprompt_length_decoder = hyperprompt_length_decoder
    self.hyperprompt_hidden_dim = hyperprompt_hidden_dim
    self.hyperprompt_task_num = hyperprompt_task_num

  # -- hooks for subclasses -------------------------------------------------

  def layer_output_from_attention_output(
    self, context: Context, attention_output: mtf.Tensor, losses
  ) -> mtf.Tensor:
    """The layer output (identity here; subclasses may post-process).

    Args:
      context: the Context of the call (mesh, dims, mode, states...).
      attention_output: the attention's output, shaped as
        expected_attention_output_shape.
      losses: a list to append auxiliary losses (scalar mtf.Tensors) to, or
        None.

    Returns:
      The layer output (here `attention_output` itself).
    """
    del context, losses
    return attention_output

  def expected_attention_output_shape(
    self, x: mtf.Tensor, params: AttentionParams
  ) -> mtf.Shape:
    """x's shape, with the query heads dims kept if keep_query_heads_dims.

    Args:
      x: the layer input [batch..., length, d_model].
      params: the layer's AttentionParams.

    Returns:
      An mtf.Shape.
    """
    if self.keep_query_heads_dims:
      return mtf.Shape(
        x.shape.dims[:-1] + params.query_heads_dims + x.shape.dims[-1:]
      )
    return x.shape

  def attention_kwargs_from_context(self, context: Context) -> dict:
    """Keyword arguments for attention_fn: dropout (training only) etc.

    Args:
      context: the Context of the call (mesh, dims, mode, states...).

    Returns:
      A dict of keyword arguments.
    """
    kwargs = dict(self.attention_kwargs or {})
    kwargs["dropout_rate"] = self.dropout_rate if context.train else 0.0
    kwargs.setdefault("dropout_broadcast_dims", [context.length_dim])
    return kwargs

  def make_params(self, context: Context) -> AttentionParams:
    """The layer's AttentionParams.

    Args:
      context: the Context of the call (mesh, dims, mode, states...).

    Returns:
      The layer's AttentionParams (variables q, k, v, o).
    """
    return attention_params(
      context=context,
      kv_dim=self.kv_dim,
      num_heads=self.num_heads,
      num_memory_heads=self.num_memory_heads,
      shared_kv=self.shared_kv,
      combine_dims=self.combine_dims,
      keep_query_heads_dims=self.keep_query_heads_dims,
      fold_scaling_into_initializer=self.fold_scaling_into_initializer,
    )

  # -- the layer ------------------------------------------------------------

  def _keys_and_values(self, params, x):
    if self.shared_kv:
      kv = params.compute_kv(x)
      return kv, kv
    return params.compute_k(x), params.compute_v(x)

  def _write_kv_states(
    self, context: Context, write: mtf.Tensor, k: mtf.Tensor, v: mtf.Tensor
  ):
    """Incremental mode: the cached k/v states with this step's k/v written
    where `write` is true; records them as the layer's new states.
    """
    if self.shared_kv:
      (prev_kv,) = context.get_states(1)
      k = v = mtf.where(write, k, prev_kv, output_shape=prev_kv.shape)
      context.record_new_states([k])
    else:
      prev_k, prev_v = context.get_states(2)
      k = mtf.where(write, k, prev_k, output_shape=prev_k.shape)
      v = mtf.where(write, v, prev_v, output_shape=prev_v.shape)
      context.record_new_states([k, v])
    return k, v

  def call(self, context: Context, x: mtf.Tensor, losses=None) -> mtf.Tensor:
    """x: [batch..., length, d_model] ([batch..., d_model] incrementally)."""
    params = self.make_params(context)
    q = params.compute_q(x)
    memory_length = self.memory_length(context)
    k, v = self._keys_and_values(params, x)
    if context.mode == "incremental":
      write = mtf.equal(
        mtf.range(context.mesh, memory_length, tf.int32), context.get_position()
      )
      k, v = self._write_kv_states(context, write, k, v)
      memory_position = mtf.range(context.mesh, memory_length, tf.int32)
    else:
      k = self.rename_length_to_memory_length(k, context)
      v = (
        k if self.shared_kv else self.rename_length_to_memory_length(v, context)
      )
      if context.mode == "first_part":
        context.record_new_states([k] if self.shared_kv else [k, v])
      memory_position = self.rename_length_to_memory_length(
        context.get_position(), context
      )
    use_prompt_kv = self._prompt_kind()
    if use_prompt_kv is not None:
      k, v, memory_position, memory_length = (
        hyperprompts.concat_hyper_prompts_kv(
          k,
          v,
          use_prompt_kv.split("_")[0],
          self.use_hyperprompt,
          memory_length,
          self.hyperprompt_task_num,
          self.num_heads,
          self.hyperprompt_hidden_dim,
          self.kv_dim,
          context,
          self.hyperprompt_mtlshare,
          self.dropout_rate,
          prompt_length=self._prompt_length(use_prompt_kv),
        )
      )
    bias = self.compute_bias(
      context,
      memory_position,
      x,
      params.query_heads_dims,
      q,
      use_prompt_kv=use_prompt_kv,
    )
    kwargs = self.attention_kwargs_from_context(context)
    if self.z_loss_coeff is not None:
      kwargs["z_loss_coeff"] = self.z_loss_coeff
    o = self.attention_fn(
      q,
      k,
      v,
      context=context,
      memory_length_dim=memory_length,
      key_dim=self.kv_dim,
      value_dim=self.kv_dim,
      bias=bias,
      **kwargs,
    )
    output = params.compute_output(
      o, output_shape=self.expected_attention_output_shape(x, params)
    )
    return self.layer_output_from_attention_output(context, output, losses)

  def _prompt_kind(self) -> Optional[str]:
    """The state key of the task prompts this layer prepends, if any.

    Returns:
      "encoder_prompts" or "decoder_prompts" if this layer's tower (the outer
      variable scope) has a prompt length, else None.
    """
    tower = tf.compat.v1.get_variable_scope().name.split("/")[0]
    if tower == "encoder" and self.hyperprompt_length_encoder:
      return "encoder_prompts"
    if tower == "decoder" and self.hyperprompt_length_decoder:
      return "decoder_prompts"
    return None

  def _prompt_length(self, use_prompt_kv: Optional[str]) -> int:
    if use_prompt_kv == "encoder_prompts":
      return self.hyperprompt_length_encoder
    if use_prompt_kv == "decoder_prompts":
      return self.hyperprompt_length_decoder
    return 0

  def compute_bias(
    self,
    context: Context,
    memory_position: mtf.Tensor,
    x: mtf.Tensor,
    heads_dims: List[mtf.Dimension],
    q: mtf.Tensor,
    use_prompt_kv: Optional[str] = None,
  ) -> Optional[mtf.Tensor]:
    """Sum of the logit biases: relative-position window limits, causality
    (read/write priority), packed sequences, relative attention; None if
    there are none.

    use_prompt_kv ("encoder_prompts"/"decoder_prompts") says that the memory
    starts with that tower's task prompts: relative positions are shifted by
    the prompt length, and the prompts are visible to every query (all
    priorities and sequence ids).

    Args:
      context: the Context of the call (mesh, dims, mode, states...).
      memory_position: int positions of the memory [batch..., memory_length].
      x: the layer input (unused here).
      heads_dims: the query heads Dimensions (the relative attention bias has
        them).
      q: the queries [batch..., length, heads..., d_k] (for "contextual"
        relative attention).
      use_prompt_kv: the kind of prompt keys/values prepended to the memory
        (None: no prompt).

    Returns:
      A logit bias [batch..., heads..., length, memory_length] (or
      broadcastable), or None.
    """
    prompt_length = self._prompt_length(use_prompt_kv)
    biases = []
    relative_position = memory_position - context.get_position()
    if prompt_length:
      relative_position -= prompt_length
    min_rp = self.min_relative_position(context)
    max_rp = self.max_relative_position(context)
    if min_rp is not None:
      biases.append(
        to_bias(mtf.greater_equal(relative_position, min_rp), context)
      )
    if max_rp is not None:
      biases.append(to_bias(mtf.less_equal(relative_position, max_rp), context))
    if (context.read_priority is None) != (context.write_priority is None):
      raise ValueError(
        "%s: context.read_priority and write_priority must be "
        "given together" % type(self).__name__
      )
    if context.read_priority is not None:
      write_priority = context.write_priority
      if context.length_dim in write_priority.shape.dims:
        write_priority = self.rename_length_to_memory_length(
          write_priority, context
        )
      if prompt_length and "memory_length" in (
        write_priority.shape.dimension_names
      ):
        # The prompts' write priority -1 is below every read priority.
        prompt_dim = mtf.Dimension("memory_length", prompt_length)
        prompt_priority = (
          mtf.zeros(
            x.mesh,
            mtf.Shape(
              [
                prompt_dim if d.name == "memory_length" else d
                for d in write_priority.shape.dims
              ]
            ),
            dtype=write_priority.dtype,
          )
          - 1
        )
        write_priority = mtf.concat(
          [prompt_priority, write_priority], "memory_length"
        )
      biases.append(
        to_bias(
          mtf.greater_equal(context.read_priority, write_priority), context
        )
      )
    sequence_id = sequence_id_for_bias(context)
    if (
      prompt_length
      and sequence_id is not None
      and context.mode != "incremental"
      and context.length_dim in sequence_id.shape.dims
    ):
      # Prompts are visible to every query; tokens within their sequence.
      memory_ids = self.rename_length_to_memory_length(sequence_id, context)
      prompt_dim = mtf.Dimension("memory_length", prompt_length)
      prompt_ids = (
        mtf.zeros(
          x.mesh,
          mtf.Shape(
            [
              prompt_dim if d.name == "memory_length" else d
              for d in memory_ids.shape.dims
            ]
          ),
          dtype=sequence_id.dtype,
        )
        - 1
      )
      memory_ids = mtf.concat([prompt_ids, memory_ids], "memory_length")
      biases.append(
        to_bias(
          mtf.logical_or(
            mtf.equal(sequence_id, memory_ids),
            mtf.less(memory_position, prompt_length),
          ),
          context,
        )
      )
    elif (
      sequence_id is not None
      and context.mode != "incremental"
      and context.length_dim in sequence_id.shape.dims
    ):
      biases.append(
        to_bias(
          mtf.equal(
            sequence_id,
            self.rename_length_to_memory_length(sequence_id, context),
          ),
          context,
        )
      )
    if self.relative_attention_type is not None:
      biases.append(
        self._relative_attention_bias(
          context, relative_position, heads_dims, q, min_rp, max_rp
        )
      )
    if not biases:
      return None
    return biases[0] if len(biases) == 1 else mtf.add_n(biases)

  def _relative_attention_bias(
    self, context, relative_position, heads_dims, q, min_rp, max_rp
  ) -> mtf.Tensor:
    buckets_dim = mtf.Dimension("buckets", self.relative_attention_num_buckets)
    bucket = relative_position_bucket(
      relative_position,
      bidirectional=not context.model.fully_autoregressive,
      num_buckets=buckets_dim.size,
    )
    ensemble_dims = list(getattr(context.model, "ensemble_dims", []) or [])
    if self.relative_attention_type in ("bias", "bias_shared"):
      values = None
      cache_key = None
      if self.relative_attention_type == "bias_shared":
        cache_key = (
          "self_attention_bias",
          min_rp,
          max_rp,
          tuple(heads_dims),
          buckets_dim,
        )
        values = context.cache.get(cache_key)
      if values is None:
        # No initializer, as the original: TF's default glorot_uniform.
        values = mtf.get_variable(
          context.mesh,
          "relative_attention_bias",
          mtf.Shape(ensemble_dims + heads_dims + [buckets_dim]),
          initializer=None,
          dtype=context.variable_dtype,
        )
        if cache_key is not None:
          context.cache[cache_key] = values
    elif self.relative_attention_type == "contextual":
      values = mtf.layers.dense(
        q,
        reduced_dims=[self.kv_dim],
        new_dims=[buckets_dim],
        expert_dims=ensemble_dims + heads_dims,
        use_bias=False,
        variable_dtype=context.variable_dtype,
        name="relative_attention_ak",
      )
    else:
      raise ValueError(
        "unknown relative_attention_type %r" % (self.relative_attention_type,)
      )
    return mtf.cast(
      mtf.gather(values, bucket, buckets_dim), context.activation_dtype
    )

  # -- dimensions and properties --------------------------------------------

  @property
  def kv_dim(self) -> mtf.Dimension:
    """The per-head key/value channels Dimension ("d_kv", key_value_size)."""
    return mtf.Dimension("d_kv", self.key_value_size)

  def memory_length(self, context: Context) -> mtf.Dimension:
    """The memory length Dimension of self-attention.

    Args:
      context: the Context of the call (mesh, dims, mode, states...).

    Returns:
      The memory length Dimension ("memory_length", of the query length's size;
      incrementally the whole decode length).
    """
    return mtf.Dimension("memory_length", context.length_dim.size)

  def rename_length_to_memory_length(
    self, x: mtf.Tensor, context: Context
  ) -> mtf.Tensor:
    """Renames x's length dim to the memory length dim.

    Args:
      x: a tensor with the length dim [batch..., length, ...].
      context: the Context of the call (mesh, dims, mode, states...).

    Returns:
      x with its length dim renamed "memory_length".
    """
    return mtf.replace_dimensions(
      x, context.length_dim, self.memory_length(context)
    )

  def min_relative_position(self, context: Context) -> Optional[int]:
    """Smallest visible memory - query position (None: unlimited).

    Args:
      context: the Context of the call (mesh, dims, mode, states...).
    """
    del context
    return None

  def max_relative_position(self, context: Context) -> Optional[int]:
    """Largest visible memory - query position (None: unlimited).

    Args:
      context: the Context of the call (mesh, dims, mode, states...).
    """
    del context
    return None

  @property
  def attention_fn(self) -> Callable[..., mtf.Tensor]:
    """The attention function attention_func names."""
    if self.attention_func == "hybrid":
      return attention.hybrid_attention
    return attention.attention
