"""Heterogeneous mixture of experts: experts of different depth and width.

HeterogeneousMoE1D routes like MoE1D (transformer/_src/layers/
moe_layers.py) but each expert is a stack of `moe_num_layers` feed-forward
layers (`expert_layer_<i>/wi`, `expert_layer_<i>/wo`; layers after the first
are pre-normalised with sublayer_rms_norm and residual). A mask
[expert_hidden, num_expert_layers, experts] built from
`heterogeneous_mask_info` switches layers and hidden units of each expert
off, so experts differ in effective depth and width while sharing one set of
variables; without a mask every expert is the full stack.

The mask follows the original 0.1.21 to the letter, including what it does
with `width`: the hidden dim becomes max(width) units and the first
`width * expert_width` of them are kept, so with the usual expert widths
(>= max(width)) the width part keeps every unit and only `layers` varies.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Dict, List, Optional, Sequence

from absl import logging
import gin
import numpy as np
import tensorflow as tf

import mesh_tensorflow as mtf
from transformer._src.layers import moe_dispatch
from transformer._src.layers import moe_layers
from transformer._src.layers.context import Context
from transformer._src.models import layer_stack

__all__ = [
  "HeterogeneousMoE1D",
  "generate_heterogeneous_expert_masks",
  "transformer_moe_layer_v1",
]

_GIN_MODULE = "mesh_tensorflow.transformer.heterogeneous_moe"


@gin.configurable(module=_GIN_MODULE)
class HeterogeneousMoE1D(moe_layers.MoE1D):
  """A one-level mixture of experts whose experts differ in depth and width.

  Routing and the balancing loss are MoE1D's; the experts are masked layer
  stacks (see transformer_moe_layer_v1 of this module).

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
    z_loss: weight of the router z-loss (the squared log of the gate softmax's
      normalizer) added to the losses; None adds none.
    word_embed_mode: None, or how the router also sees the input word embeddings
      (the hparam moe_word_embed_mode).
    use_second_place_expert_prob: the hparam moe_use_second_place_expert_prob
      (top-2 gating: the probability of using the second expert), or None.
    use_second_place_expert_prob_temp: the temperature of that probability, or
      None.
    moe_num_layers: the number of feed-forward layers of each expert
      (overridden by the mask's depth when heterogeneous_mask_info is set).
    heterogeneous_mask_info: None (all experts alike), or a list of dicts
      {"percent_number": fraction (< 1) or count of experts, "layers": depth,
      "width": width multiplier}, one per kind of expert, in expert order;
      the last kind takes the experts left over.
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
    z_loss=None,
    word_embed_mode=None,
    use_second_place_expert_prob=None,
    use_second_place_expert_prob_temp=None,
    moe_num_layers=1,
    heterogeneous_mask_info=None,
    top_n_num_experts_per_token=3,
  ) -> None:
    super().__init__(
      num_experts=num_experts,
      loss_coef=loss_coef,
      hidden_size=hidden_size,
      group_size=group_size,
      capacity_factor_train=capacity_factor_train,
      capacity_factor_eval=capacity_factor_eval,
      use_second_place_loss=use_second_place_loss,
      second_policy_train=second_policy_train,
      second_policy_eval=second_policy_eval,
      second_threshold_train=second_threshold_train,
      second_threshold_eval=second_threshold_eval,
      dropout_rate=dropout_rate,
      activation=activation,
      moe_gating=moe_gating,
      min_expert_capacity=min_expert_capacity,
      switch_policy_train=switch_policy_train,
      switch_policy_eval=switch_policy_eval,
      switch_dropout=switch_dropout,
      switch_temperature=switch_temperature,
      switch_jitter=switch_jitter,
      ntlb_top_k=ntlb_top_k,
      output_dim=output_dim,
      z_loss=z_loss,
      word_embed_mode=word_embed_mode,
      use_second_place_expert_prob=use_second_place_expert_prob,
      use_second_place_expert_prob_temp=use_second_place_expert_prob_temp,
      top_n_num_experts_per_token=top_n_num_experts_per_token,
    )
    self._hparams.add_hparam("moe_num_layers", moe_num_layers)
    self._hparams.add_hparam(
      "moe_heterogeneous_mask_info", heterogeneous_mask_info
    )

  def call(self, context: Context, x: mtf.Tensor, losses=None):
    """Runs the experts on x ([batch..., (length,) d_model]).

    Args:
      context: the Context (its balancing loss goes to context.losses).
      x: the input.
      losses: unused.

    Returns:
      a Tensor of x's shape with the last dim replaced by the output dim.

    Raises:
      NotImplementedError: for an ensemble model, as the original.
    """
    if getattr(context.model, "ensemble_dim", None):
      raise NotImplementedError("MoE not yet implemented with ensembles")
    return super().call(context, x, losses)

  def mixture_function(self, context: Context) -> Callable[..., Any]:
    """This module's transformer_moe_layer_v1, given the Context.

    Args:
      context: the Context of the call (read by the layers after the first).

    Returns:
      a function with moe's transformer_moe_layer_v1's parameters and results.
    """
    return functools.partial(transformer_moe_layer_v1, context=context)


def transformer_moe_layer_v1(
  inputs: mtf.Tensor,
  output_dim: mtf.Dimension,
  hparams,
  train: bool,
  variable_dtype,
  layout=None,
  mesh_shape=None,
  nonpadding=None,
  activation=mtf.relu,
  num_microbatches: Optional[int] = None,
  token_embeddings: Optional[mtf.Tensor] = None,
  context: Optional[Context] = None,
):
  """A one-level mixture of experts whose experts are masked layer stacks.

  Routing, capacity and the balancing loss are those of moe's
  transformer_moe_layer_v1. Each expert then runs hparams.moe_num_layers
  layers: h = activation(x @ wi) (dropout moe_dropout_rate), times the
  layer's slice of the heterogeneous mask, then h @ wo; layers after the
  first take sublayer_rms_norm of their input and add it back (residual),
  and all but the last pass through sublayer_dropout. With
  hparams.moe_heterogeneous_mask_info set, the mask's shape overrides
  hparams.moe_num_layers and hparams.moe_hidden_size (written back into
  hparams, as the original does).

  Args:
    inputs: [batch..., length, d_model].
    output_dim: the output Dimension (d_model for a Transformer).
    hparams: the layer's HParams (MoE1D's plus moe_num_layers and
      moe_heterogeneous_mask_info).
    train: training mode.
    variable_dtype: an mtf.VariableDType.
    layout: the model's layout rules (groups must split like the batch).
    mesh_shape: the mesh shape.
    nonpadding: None, 1 or a float Tensor over the batch/length dims.
    activation: the experts' hidden activation (function, name or list).
    num_microbatches: the balancing loss is divided by it.
    token_embeddings: the input embeddings for moe_word_embed_mode.
    context: the Context (needed for more than one layer: the norms and
      dropouts between layers read it).

  Returns:
    (output [batch..., length, output_dim], loss * moe_loss_coef).

  Raises:
    ValueError: with several layers but no context, or for an unknown gating.
  """
  routing = moe_dispatch.route_to_experts(
    inputs,
    hparams,
    train,
    variable_dtype,
    layout=layout,
    mesh_shape=mesh_shape,
    nonpadding=nonpadding,
    num_microbatches=num_microbatches,
    token_embeddings=token_embeddings,
  )
  experts_dim = routing.experts_dim
  mask = None
  mask_info = getattr(hparams, "moe_heterogeneous_mask_info", None)
  if mask_info is not None:
    logging.info("moe_heterogeneous_mask_info: %s", mask_info)
    mask = generate_heterogeneous_expert_masks(
      mask_info,
      hparams.moe_num_experts,
      experts_dim,
      mesh=inputs.mesh,
      expert_width=hparams.moe_hidden_size,
    )
    hparams.moe_num_layers = mask.shape[1].size
    hparams.moe_hidden_size = mask.shape[0].size
  num_layers = getattr(hparams, "moe_num_layers", 1)
  if num_layers > 1 and context is None:
    raise ValueError(
      "heterogeneous mixture of experts: %d expert layers need the Context"
      " (their rms norms and dropouts read it)" % num_layers
    )
  hidden_dim = mtf.Dimension("expert_hidden", hparams.moe_hidden_size)
  dropout_rate = getattr(hparams, "moe_dropout_rate", 0.0)

  expert_inputs = routing.expert_inputs
  for layer in range(num_layers):
    with tf.compat.v1.variable_scope("expert_layer_%d" % layer):
      residual = 0.0
      if layer > 0:
        residual = expert_inputs
        expert_inputs = layer_stack.sublayer_rms_norm(
          expert_inputs, None, context
        )
      h = mtf.layers.dense_product(
        expert_inputs,
        reduced_dims=expert_inputs.shape.dims[-1:],
        new_dims=[hidden_dim],
        expert_dims=[experts_dim],
        activation_functions=activation,
        use_bias=False,
        variable_dtype=variable_dtype,
        name="wi",
      )
      if dropout_rate:
        h = mtf.dropout(h, train, keep_prob=1.0 - dropout_rate)
      if mask is not None:
        layer_mask = mtf.slice(mask, layer, 1, "num_expert_layers")
        layer_mask = mtf.reshape(
          layer_mask, [layer_mask.shape[0], layer_mask.shape[-1]]
        )
        h *= mtf.cast(layer_mask, h.dtype)
      expert_output = mtf.layers.dense(
        h,
        output_dim,
        expert_dims=[experts_dim],
        use_bias=False,
        reduced_dims=h.shape.dims[-1:],
        variable_dtype=variable_dtype,
        name="wo",
      )
      if layer < num_layers - 1:
        expert_output = layer_stack.sublayer_dropout(
          expert_output, None, context
        )
      expert_output += residual
      expert_inputs = expert_output
  output = moe_dispatch.combine_expert_outputs(routing, expert_output)
  return output, routing.loss * hparams.moe_loss_coef


def heterogeneous_mask_array(
  mask_info: Sequence[Dict[str, float]], num_experts: int, expert_width: int
) -> np.ndarray:
  """The heterogeneous mask as numpy: [max width, max layers, num_experts].

  Kind i of mask_info covers the next int(num_experts * percent_number)
  experts (or int(percent_number) when it is >= 1; the last kind takes the
  rest); its experts keep layers [:layers] and hidden units
  [:width * expert_width].

  Args:
    mask_info: the list of {"percent_number", "layers", "width"} dicts.
    num_experts: the number of experts.
    expert_width: the default expert hidden size.

  Returns:
    the 0/1 mask (float64).

  Raises:
    ValueError: if mask_info is empty or its kinds need more experts than
      num_experts.

  Example:
    >>> mask = heterogeneous_mask_array(
    ...     [{"percent_number": 0.5, "layers": 1, "width": 1},
    ...      {"percent_number": 0.5, "layers": 2, "width": 1}],
    ...     num_experts=4, expert_width=8)
    >>> mask.shape
    (1, 2, 4)
    >>> mask[0].astype(int).tolist()  # [layer][expert]
    [[1, 1, 1, 1], [0, 0, 1, 1]]
  """
  if not mask_info:
    raise ValueError("heterogeneous_mask_info is empty")
  max_layers = max(kind["layers"] for kind in mask_info)
  max_width = max(kind["width"] for kind in mask_info)
  columns: List[np.ndarray] = []
  assigned = 0
  for index, kind in enumerate(mask_info):
    fraction = kind["percent_number"]
    count = int(num_experts * fraction) if fraction < 1.0 else int(fraction)
    if index == len(mask_info) - 1 and count != num_experts - assigned:
      logging.info(
        "heterogeneous mask: the last kind of expert takes the %d experts"
        " left, not %d",
        num_experts - assigned,
        count,
      )
      count = num_experts - assigned
    if count < 0 or assigned + count > num_experts:
      raise ValueError(
        "heterogeneous_mask_info %r needs more than the %d experts"
        % (list(mask_info), num_experts)
      )
    kind_mask = np.zeros([int(max_width), int(max_layers), count])
    kind_mask[: kind["width"] * expert_width, : kind["layers"], :] = 1
    columns.append(kind_mask)
    assigned += count
  return np.concatenate(columns, axis=2)


def generate_heterogeneous_expert_masks(
  mask_info: Sequence[Dict[str, Any]],
  num_experts: int,
  experts_dim: mtf.Dimension,
  mesh: mtf.Mesh,
  expert_width: int,
) -> mtf.Tensor:
  """The heterogeneous expert mask as an mtf Tensor.

  Args:
    mask_info: the list of {"percent_number", "layers", "width"} dicts
      (see heterogeneous_mask_array).
    num_experts: the number of experts.
    experts_dim: the experts Dimension (may be split over the mesh).
    mesh: the mtf.Mesh.
    expert_width: the default expert hidden size.

  Returns:
    a float64 Tensor [expert_hidden, num_expert_layers, experts].
  """
  mask = heterogeneous_mask_array(mask_info, num_experts, expert_width)
  logging.info("heterogeneous mask: %s", mask)
  width_dim = mtf.Dimension("expert_hidden", mask.shape[0])
  layers_dim = mtf.Dimension("num_expert_layers", mask.shape[1])
  return mtf.import_tf_tensor(
    mesh,
    tf_tensor=tf.convert_to_tensor(mask),
    shape=[width_dim, layers_dim, experts_dim],
  )
