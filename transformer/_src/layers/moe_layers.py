"""Mixture-of-experts layers: MoE1D and MoE2D.

Each replaces the feed-forward block of a transformer layer by experts:
MoE1D routes every position to a few of `num_experts` feed-forward networks
(transformer_moe_layer_v1), MoE2D to experts on two levels
(transformer_moe_layer_v2). The layers turn their arguments into HParams
(moe_hparams.py), add a length dimension while decoding one position, and
call the MoE computation in moe_dispatch.py.
"""

from __future__ import annotations

from typing import Any, Callable

import gin

import mesh_tensorflow as mtf
from transformer._src.layers.context import Context
from transformer._src.layers.context import TransformerLayer
from transformer._src.layers.moe_dispatch import transformer_moe_layer_v1
from transformer._src.layers.moe_dispatch import transformer_moe_layer_v2
from transformer._src.layers.moe_hparams import HParams

__all__ = [
  "MoE1D",
  "MoE2D",
]

_GIN_MODULE = "mesh_tensorflow.transformer.moe"


def _with_length_dim(context: Context, x: mtf.Tensor):
  """x with a length dim of size 1 inserted if it has none (decoding)."""
  if context.length_dim is not None and context.length_dim in x.shape.dims:
    return x, None
  shape = x.shape
  one = mtf.Dimension("length", 1)
  return mtf.reshape(
    x, mtf.Shape(shape.dims[:-1] + [one] + shape.dims[-1:])
  ), shape


def _usable_nonpadding(nonpadding, x: mtf.Tensor):
  if isinstance(nonpadding, mtf.Tensor) and not set(
    nonpadding.shape.dims
  ) <= set(x.shape.dims[:-1]):
    return None
  return nonpadding


@gin.configurable(module=_GIN_MODULE)
class MoE1D(TransformerLayer):
  """Mixture of experts layer (one level), a drop-in for DenseReluDense.

  Appends its balancing loss (times loss_coef) to context.losses.

  Args:
    num_experts: the number of experts.
    loss_coef: the weight of the load-balancing loss added to the model's
      losses.
    hidden_size: the size of each expert's hidden layer.
    group_size: the number of tokens routed together (per group, capacity is
      computed and balanced).
    capacity_factor_train: expert capacity in training, as a multiple of the
      tokens per expert for perfect balance.
    capacity_factor_eval: expert capacity outside training, likewise.
    use_second_place_loss: also balance the second-choice experts (top-2
      gating).
    second_policy_train: how top-2 gating uses the second expert in training:
      "all", "none", "threshold" or "random".
    second_policy_eval: the same outside training.
    second_threshold_train: the gate threshold of the "threshold" policy in
      training.
    second_threshold_eval: the same outside training.
    dropout_rate: the dropout rate of the experts' hidden layer (training only).
    activation: the experts' hidden activation: a name such as "relu" or a
      function.
    moe_gating: the routing: "top_2", "top_n", "switch" (top-1),
      "switch_max", "ntlb" or "expert_selection".
    min_expert_capacity: the smallest capacity of an expert, in tokens.
    switch_policy_train: the switch gate's noise policy in training:
      "input_jitter", "argmax", "sample" or "input_dropout".
    switch_policy_eval: the same outside training.
    switch_dropout: the dropout rate of the "input_dropout" policy.
    switch_temperature: the softmax temperature of the "sample" policy.
    switch_jitter: the multiplicative noise range of the "input_jitter" policy.
    ntlb_top_k: the number of experts per token of "ntlb" gating.
    output_dim: the output Dimension (None: the input's model dim).
    use_experts_attention: whether the experts compute attention projections
      (ExpertsAttentionParams) instead of a feed-forward layer.
    z_loss: weight of the router z-loss (the squared log of the gate softmax's
      normalizer) added to the losses; None adds none.
    word_embed_mode: None, or how the router also sees the input word embeddings
      (the hparam moe_word_embed_mode).
    use_second_place_expert_prob: the hparam moe_use_second_place_expert_prob
      (top-2 gating: the probability of using the second expert), or None.
    use_second_place_expert_prob_temp: the temperature of that probability, or
      None.
    top_n_num_experts_per_token: the number of experts per token of top-n
      gating.
  """

  def __init__(
    self,
    num_experts=16,
    loss_coef=1e-2,
    hidden_size=4096,
    group_size=1024,
    capacity_factor_train=1.25,
    capacity_factor_eval=2.0,
    use_second_place_loss=False,
    second_policy_train="random",
    second_policy_eval="random",
    second_threshold_train=0.2,
    second_threshold_eval=0.2,
    dropout_rate=0.0,
    activation="relu",
    moe_gating="top_2",
    min_expert_capacity=4,
    switch_policy_train="input_jitter",
    switch_policy_eval="input_jitter",
    switch_dropout=0.1,
    switch_temperature=1.0,
    switch_jitter=1e-2,
    ntlb_top_k=4,
    output_dim=None,
    use_experts_attention=False,
    z_loss=None,
    word_embed_mode=None,
    use_second_place_expert_prob=None,
    use_second_place_expert_prob_temp=None,
    top_n_num_experts_per_token=3,
  ) -> None:
    if output_dim is not None and not isinstance(output_dim, mtf.Dimension):
      output_dim = mtf.convert_to_dimension(output_dim)
    self._hparams = HParams(
      moe_gating=moe_gating,
      moe_num_experts=num_experts,
      moe_loss_coef=loss_coef,
      moe_hidden_size=hidden_size,
      moe_group_size=group_size,
      moe_min_expert_capacity=min_expert_capacity,
      moe_capacity_factor_train=capacity_factor_train,
      moe_capacity_factor_eval=capacity_factor_eval,
      moe_use_second_place_loss=use_second_place_loss,
      moe_second_policy_train=second_policy_train,
      moe_second_policy_eval=second_policy_eval,
      moe_second_threshold_train=second_threshold_train,
      moe_second_threshold_eval=second_threshold_eval,
      moe_dropout_rate=dropout_rate,
      moe_switch_policy_train=switch_policy_train,
      moe_switch_policy_eval=switch_policy_eval,
      moe_switch_dropout=switch_dropout,
      moe_switch_temperature=switch_temperature,
      moe_switch_jitter=switch_jitter,
      moe_output_dim=output_dim,
      moe_ntlb_top_k=ntlb_top_k,
      moe_use_experts_attention=use_experts_attention,
      moe_z_loss=z_loss,
      moe_word_embed_mode=word_embed_mode,
      moe_use_second_place_expert_prob=use_second_place_expert_prob,
      moe_use_second_place_expert_prob_temp=(use_second_place_expert_prob_temp),
      moe_top_n_num_experts_per_token=top_n_num_experts_per_token,
    )
    self._activation = activation

  def call(self, context: Context, x: mtf.Tensor, losses=None):
    """Runs the experts on x ([batch..., (length,) d_model]).

    Args:
      context: the Context (model.layout / mesh_shape / model_dim, mode,
        nonpadding, losses, num_microbatches are read).
      x: the input.
      losses: unused (the loss goes to context.losses).

    Returns:
      a Tensor of x's shape with the last dim replaced by the output dim,
      or [q, kv] when use_experts_attention.
    """
    del losses
    return self.run_experts(context, x)

  def run_experts(
    self, context: Context, x: mtf.Tensor, use_enc_nonpadding: bool = False
  ):
    """`call`, optionally with the encoder's padding mask.

    Args:
      context: the Context.
      x: the input.
      use_enc_nonpadding: take the padding mask from
        context.encoder_sequence_id (x is the encoder output).

    Returns:
      as `call`.
    """
    x, orig_shape = _with_length_dim(context, x)
    output_dim = self._hparams.moe_output_dim
    if output_dim is None:
      output_dim = context.model.model_dim
    if use_enc_nonpadding:
      seq = context.encoder_sequence_id
      nonpadding = (
        mtf.cast(mtf.not_equal(seq, 0), context.activation_dtype)
        if isinstance(seq, mtf.Tensor)
        else seq
      )
    else:
      nonpadding = context.nonpadding
    y, loss = self.mixture_function(context)(
      x,
      output_dim,
      self._hparams,
      context.train,
      context.variable_dtype,
      layout=getattr(context.model, "layout", None),
      mesh_shape=getattr(context.model, "mesh_shape", None),
      nonpadding=_usable_nonpadding(nonpadding, x),
      activation=self._activation,
      num_microbatches=context.num_microbatches,
      token_embeddings=self._token_embeddings(context, x),
    )
    if context.losses is not None:
      context.losses.append(loss)
    if orig_shape is not None:
      out_shape = lambda t: mtf.Shape(orig_shape.dims[:-1] + t.shape.dims[-1:])
      if isinstance(y, list):
        y = [mtf.reshape(t, out_shape(t)) for t in y]
      else:
        y = mtf.reshape(y, out_shape(y))
    return y

  def mixture_function(self, context: Context) -> Callable[..., Any]:
    """The function computing the mixture; subclasses change the experts.

    Args:
      context: the Context of the call.

    Returns:
      a function with transformer_moe_layer_v1's parameters and results.
    """
    del context
    return transformer_moe_layer_v1

  def _token_embeddings(self, context: Context, x: mtf.Tensor):
    """context.input_embeddings shaped as x, if the router uses them."""
    if self._hparams.moe_word_embed_mode is None:
      return None
    embeddings = getattr(context, "input_embeddings", None)
    if not isinstance(embeddings, mtf.Tensor):
      raise ValueError("MoE1D: word_embed_mode needs context.input_embeddings")
    return mtf.reshape(embeddings, x.shape)


class MoE2D(TransformerLayer):
  """Two-level mixture of experts (expert_x groups of expert_y experts).

  Args:
    expert_x: the number of experts of MoE2D's first (outer) level.
    expert_y: the number of experts of MoE2D's second (inner) level.
    loss_coef: the weight of the load-balancing loss added to the model's
      losses.
    hidden_size: the size of each expert's hidden layer.
    group_size: the number of tokens routed together (per group, capacity is
      computed and balanced).
    capacity_factor_train: expert capacity in training, as a multiple of the
      tokens per expert for perfect balance.
    capacity_factor_eval: expert capacity outside training, likewise.
    capacity_factor_second_level: expert capacity of the second (inner) level of
      MoE2D.
    use_second_place_loss: also balance the second-choice experts (top-2
      gating).
    second_policy_train: how top-2 gating uses the second expert in training:
      "all", "none", "threshold" or "random".
    second_policy_eval: the same outside training.
    second_threshold_train: the gate threshold of the "threshold" policy in
      training.
    second_threshold_eval: the same outside training.
  """

  def __init__(
    self,
    expert_x=8,
    expert_y=8,
    loss_coef=1e-2,
    hidden_size=4096,
    group_size=1024,
    capacity_factor_train=1.25,
    capacity_factor_eval=2.0,
    capacity_factor_second_level=1.0,
    use_second_place_loss=False,
    second_policy_train="random",
    second_policy_eval="random",
    second_threshold_train=0.2,
    second_threshold_eval=0.2,
  ) -> None:
    self._hparams = HParams(
      moe_gating="top_2",
      moe_num_experts=[expert_x, expert_y],
      moe_loss_coef=loss_coef,
      moe_hidden_size=hidden_size,
      moe_group_size=group_size,
      moe_min_expert_capacity=4,
      moe_capacity_factor_train=capacity_factor_train,
      moe_capacity_factor_eval=capacity_factor_eval,
      moe_capacity_factor_second_level=capacity_factor_second_level,
      moe_use_second_place_loss=use_second_place_loss,
      moe_second_policy_train=second_policy_train,
      moe_second_policy_eval=second_policy_eval,
      moe_second_threshold_train=second_threshold_train,
      moe_second_threshold_eval=second_threshold_eval,
    )

  def call(self, context: Context, x: mtf.Tensor, losses=None):
    """Runs the two-level experts; appends the loss to context.losses."""
    del losses
    x, orig_shape = _with_length_dim(context, x)
    y, loss = transformer_moe_layer_v2(
      x,
      context.model.model_dim,
      self._hparams,
      context.train,
      context.variable_dtype,
      layout=getattr(context.model, "layout", None),
      mesh_shape=getattr(context.model, "mesh_shape", None),
      nonpadding=_usable_nonpadding(context.nonpadding, x),
      num_microbatches=context.num_microbatches,
    )
    if context.losses is not None:
      context.losses.append(loss)
    if orig_shape is not None:
      y = mtf.reshape(y, orig_shape)
    return y
