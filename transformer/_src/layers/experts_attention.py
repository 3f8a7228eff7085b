"""Experts attention layers: ExpertsSelfAttention and ExpertsEncDecAttention.

Self-attention (and encoder-decoder attention) whose q / kv projections are
computed by a mixture-of-experts layer (see ExpertsAttentionParams). The
layers need shared_kv=True (the experts emit one shared key/value
projection). As in the original, the keys/values come from the layer's
input, not the memory, and keep its length dim: attention over
memory_length then gives each position (the softmax weights summing to
one) its own value, and the queries only matter while decoding one token at
a time, where the cached keys/values are attended. Variables under
`<layer>/<ClassName>/`: the MoE's router
(`switch_gating/kernel`, ...), `wi/kernel` [experts, d_model, expert_hidden],
`q_wo/kernel` and `k_wo/kernel` [experts, expert_hidden,
d_model(=heads*d_kv)] for expert_computation "qkv" (the original's names),
and the output kernel `o`. The MoE's balancing
loss is appended to context.losses.
"""

from __future__ import annotations

from typing import Optional

import gin

import mesh_tensorflow as mtf
from transformer._src.layers import moe_hparams
from transformer._src.layers.context import Context
from transformer._src.layers.enc_dec_attention import EncDecAttention
from transformer._src.layers.enc_dec_attention import enc_dec_attention_bias
from transformer._src.layers.experts_attention_params import (
  ExpertsAttentionParams,
)
from transformer._src.layers.self_attention import SelfAttention

__all__ = ["ExpertsEncDecAttention", "ExpertsSelfAttention"]

_GIN_MODULE = "mesh_tensorflow.transformer.transformer_layers"


@gin.configurable(module=_GIN_MODULE)
class ExpertsSelfAttention(SelfAttention):
  """Self-attention whose projections are computed by experts.

  Example (gin; a one-layer language model):
    >>> from transformer import transformer
    >>> _ = gin.parse_config('''
    ... ExpertsSelfAttention.num_experts = 4
    ... ExpertsSelfAttention.shared_kv = True
    ... ExpertsSelfAttention.hidden_size = 4
    ... ExpertsSelfAttention.num_heads = 2
    ... ExpertsSelfAttention.key_value_size = 4
    ... make_layer_stack.layers = [@ExpertsSelfAttention]
    ... make_layer_stack.num_layers = 1
    ... ''')
    >>> lm = transformer.Unitransformer(
    ...     transformer.make_layer_stack(), d_model=8, input_vocab_size=16,
    ...     output_vocab_size=16, autoregressive=True, max_length=4,
    ...     vocab_divisor=1)
    >>> gin.clear_config()
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> ids = converter.convert_np_array_to_mtf_tensor(
    ...     [[3, 5, 7, 1]], ["batch", "length"])
    >>> logits, loss = lm.call_simple(ids, ids, compute_loss=True)
    >>> converter.convert_mtf_tensor_to_np_array(logits).shape
    (1, 4, 16)
    >>> for v in converter.graph.all_variables:
    ...   if "/ExpertsSelfAttention/" in v.name:
    ...     print(v.name.split("/ExpertsSelfAttention/")[-1], v.shape)
    o Shape[heads=8, d_model=8]
    switch_gating/kernel Shape[d_model=8, expert_unsplit=4]
    wi/kernel Shape[experts=4, d_model=8, expert_hidden=4]
    q_wo/kernel Shape[experts=4, expert_hidden=4, d_model=8]
    k_wo/kernel Shape[experts=4, expert_hidden=4, d_model=8]

  Args:
    num_experts: the number of experts.
    loss_coef: the weight of the load-balancing loss added to the model's
      losses.
    group_size: the number of tokens routed together (per group, capacity is
      computed and balanced).
    capacity_factor_train: expert capacity in training, as a multiple of the
      tokens per expert for perfect balance.
    capacity_factor_eval: expert capacity outside training, likewise.
    moe_gating: the routing: "top_2", "switch" (top-1), "ntlb",
      "switch_max" or "expert_selection" (see moe_gating.py).
    min_expert_capacity: the smallest capacity of an expert, in tokens.
    switch_policy_train: the switch gate's noise policy in training:
      "input_jitter", "argmax", "sample" or "input_dropout".
    switch_policy_eval: the same outside training.
    switch_dropout: the dropout rate of the "input_dropout" policy.
    switch_temperature: the softmax temperature of the "sample" policy.
    switch_jitter: the multiplicative noise range of the "input_jitter" policy.
    ntlb_top_k: the number of experts per token of "ntlb" gating.
    hidden_size: the size of each expert's hidden layer.
    use_experts_attention: the MoE hparam moe_use_experts_attention: the
      experts output the attention projections (keep True here).
    activation: the experts' hidden activation (e.g. "relu").
    z_loss: weight of the router z-loss (the squared log of the gate softmax's
      normalizer) added to the losses; None adds none.
    expert_computation: which projections the experts compute: "qkv" (q, k and
      v), "q" (queries only) or "kv" (keys and values only).
  """

  def __init__(
    self,
    num_experts=16,
    loss_coef=1e-2,
    group_size=1024,
    capacity_factor_train=1.25,
    capacity_factor_eval=2.0,
    moe_gating="switch",
    min_expert_capacity=4,
    switch_policy_train="input_jitter",
    switch_policy_eval="input_jitter",
    switch_dropout=0.0,
    switch_temperature=1.0,
    switch_jitter=1e-2,
    ntlb_top_k=4,
    hidden_size=3072,
    activation="relu",
    z_loss=None,
    expert_computation="qkv",
    **kwargs,
  ) -> None:
    super().__init__(**kwargs)
    self.expert_computation = expert_computation
    self._hparams = moe_hparams.HParams(
      moe_gating=moe_gating,
      num_experts=num_experts,
      loss_coef=loss_coef,
      group_size=group_size,
      min_expert_capacity=min_expert_capacity,
      capacity_factor_train=capacity_factor_train,
      capacity_factor_eval=capacity_factor_eval,
      switch_policy_train=switch_policy_train,
      switch_policy_eval=switch_policy_eval,
      switch_dropout=switch_dropout,
      switch_temperature=switch_temperature,
      switch_jitter=switch_jitter,
      ntlb_top_k=ntlb_top_k,
      hidden_size=hidden_size,
      use_experts_attention=True,
      activation=activation,
      z_loss=z_loss,
    )

  def _heads_dims(self):
    """(query heads dims, memory heads dims) as SelfAttention's params."""
    if self.num_heads == 1:
      return None, None
    if self.num_memory_heads == 0:
      heads = [mtf.Dimension("heads", self.num_heads)]
      return heads, heads
    if self.num_memory_heads == 1:
      return [mtf.Dimension("heads", self.num_heads)], None
    if self.num_heads % self.num_memory_heads != 0:
      raise ValueError(
        "%s: num_memory_heads %d must divide num_heads %d"
        % (type(self).__name__, self.num_memory_heads, self.num_heads)
      )
    memory = [mtf.Dimension("heads", self.num_memory_heads)]
    return memory + [
      mtf.Dimension("query_heads", self.num_heads // self.num_memory_heads)
    ], memory

  def call(self, context: Context, x: mtf.Tensor, losses=None) -> mtf.Tensor:
    """x: [batch..., length, d_model] ([batch..., d_model] incrementally)."""
    if context.mode == "incremental" or self._prompt_kind() is not None:
      return super().call(context, x, losses)
    params = self.make_params(context)
    q = params.compute_q(x)
    if context.mode == "first_part":
      kv = params.compute_kv(x)
      context.record_new_states(
        [self.rename_length_to_memory_length(kv, context)]
      )
    memory_position = self.rename_length_to_memory_length(
      context.get_position(), context
    )
    bias = self.compute_bias(
      context, memory_position, x, params.query_heads_dims, q
    )
    return self.attend_own_values(
      context, params, x, q, self.memory_length(context), bias, losses
    )

  def attend_own_values(
    self,
    context: Context,
    params: ExpertsAttentionParams,
    x: mtf.Tensor,
    q: mtf.Tensor,
    memory_length: mtf.Dimension,
    bias: Optional[mtf.Tensor],
    losses,
  ) -> mtf.Tensor:
    """The original's attention with keys/values that keep x's length dim.

    The q . kv logits have no memory_length dim, so the softmax over it sees
    only the bias; each position gets its own value times the summed
    weights.

    Args:
      context: the Context of the call.
      params: the layer's ExpertsAttentionParams (compute_q already called).
      x: the layer input [batch..., length, d_model].
      q: the queries.
      memory_length: the memory length Dimension of the softmax.
      bias: the attention logits bias, or None.
      losses: a list for auxiliary losses, or None.

    Returns:
      The layer output [batch..., length, d_model].
    """
    kv = params.compute_kv(x)
    logits = mtf.einsum([q, kv], reduced_dims=[self.kv_dim])
    if bias is not None:
      logits += mtf.cast(bias, logits.dtype)
    if memory_length not in logits.shape.dims:
      # No mask (the original fails here): uniform weights.
      logits = mtf.broadcast(logits, logits.shape + [memory_length])
    weights = mtf.softmax(logits, memory_length)
    kwargs = self.attention_kwargs_from_context(context)
    rate = kwargs.get("dropout_rate", 0.0)
    if context.train and rate > 0.0:
      broadcast = kwargs.get("dropout_broadcast_dims") or []
      weights = mtf.dropout(
        weights,
        context.train,
        rate=rate,
        noise_shape=weights.shape - broadcast,
      )
    o = mtf.einsum([weights, kv], output_shape=q.shape)
    output = params.compute_output(
      o, output_shape=self.expected_attention_output_shape(x, params)
    )
    return self.layer_output_from_attention_output(context, output, losses)

  def make_params(self, context: Context) -> ExpertsAttentionParams:
    query_heads_dims, memory_heads_dims = self._heads_dims()
    model_dim = context.model.model_dim
    return ExpertsAttentionParams(
      context.mesh,
      query_input_dim=model_dim,
      memory_input_dim=model_dim,
      output_dim=model_dim,
      key_dim=self.kv_dim,
      value_dim=self.kv_dim,
      query_heads_dims=query_heads_dims,
      memory_heads_dims=memory_heads_dims,
      variable_dtype=context.variable_dtype,
      shared_kv=self.shared_kv,
      no_query=False,
      ensemble_dim=getattr(context.model, "ensemble_dim", None),
      combine_dims=self.combine_dims,
      keep_query_heads_dims=self.keep_query_heads_dims,
      fold_scaling_into_initializer=self.fold_scaling_into_initializer,
      context=context,
      experts_hparams=self._hparams,
      expert_computation=self.expert_computation,
    )


@gin.configurable(module=_GIN_MODULE)
class ExpertsEncDecAttention(ExpertsSelfAttention, EncDecAttention):
  """Encoder-decoder attention whose projections are computed by experts.

  As in the original, the keys/values come from the decoder input (see
  ExpertsSelfAttention), so the output is each position's own value unless
  no encoder position is visible to it; the encoder output only sets the
  memory length and, through the sequence ids, the mask. While decoding,
  the cached keys/values are those of the encoder output (by the experts).
  """

  def __init__(self, relative_attention_type: Optional[str] = None, **kwargs):
    super().__init__(relative_attention_type=relative_attention_type, **kwargs)

  def call(self, context: Context, x: mtf.Tensor, losses=None) -> mtf.Tensor:
    """x: [batch..., length, d_model] ([batch..., d_model] incrementally)."""
    if context.mode == "incremental":
      return EncDecAttention.call(self, context, x, losses)
    memory = self._get_memory_antecedent(context)
    params = self.make_params(context)
    q = params.compute_q(x)
    memory_length = memory.shape.get_dim_by_name("memory_length")
    if context.mode == "first_part":
      kv = params.compute_memory_kv(memory)
      context.record_constant_state((kv, kv, memory_length))
    bias = enc_dec_attention_bias(self, context, params.query_heads_dims)
    return self.attend_own_values(
      context, params, x, q, memory_length, bias, losses
    )
