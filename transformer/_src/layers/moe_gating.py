"""Gating functions of the mixture-of-experts layers (moe.py).

A gating function decides, for every position of a group, which experts it
is sent to and with what weight. Inputs are [outer_batch, groups, group,
d_model] ("groups" carries the name of the batch dim). Every function returns

  dispatch_tensor: [outer_batch, groups, group, experts, expert_capacity],
    1.0 where a position is sent to slot c of expert e, else 0.0;
  combine_tensor: the same shape, holding the gate weight instead of 1.0;
  loss: a scalar auxiliary load-balancing loss (before moe_loss_coef).

Each expert receives at most expert_capacity positions per group; a position
that does not fit (its slot would be >= capacity) is dropped for that expert
and contributes zero to the layer's output. Slots are given in order of
position within the group. The gates themselves are computed in float32.

Gating kinds (hparams.moe_gating):
  "top_2": the two best experts, gates renormalised over the pair; the
    second expert is kept per moe_second_policy_{train,eval}: "all", "none",
    "threshold" (gate_2 > threshold) or "random" (with probability
    min(1, gate_2 / threshold)).
  "switch": one expert per position. moe_switch_policy_{train,eval}:
    "input_jitter" (multiplicative jitter of the inputs in training),
    "input_dropout" (dropout of the inputs in training), "argmax" (plain
    argmax) or "sample" (sample the expert from the router softmax at
    moe_switch_temperature).
  "ntlb": "no token left behind": each position tries its top
    moe_ntlb_top_k experts in order and goes to the first with room left.
  "switch_max": one expert per position, chosen by the gate relative to the
    largest gate that expert gets in the group (spreads positions over
    experts); weight = the router probability.
  "expert_selection": every expert picks its expert_capacity best positions
    of the group by a softmax over the group (its loss pushes the experts'
    mean probability per position towards uniform; see
    expert_selection_gating). Its dispatch and combine tensors are ordered
    [outer_batch, groups, experts, expert_capacity, group].
  "top_n": the n best experts (see top_n_gating).

Every gating takes token_embeddings: with hparams.moe_word_embed_mode the
router also sees the input word embeddings (gate_inputs_with_token_embeddings),
mixed in after the switch policies' input jitter or dropout.

Load-balancing loss (top_2, switch, ntlb, switch_max): with m the one-hot
first choice and p the router softmax, both averaged over the group,
loss = mean_over(outer, groups, experts)(mean_g(p) * mean_g(m)) * experts**2
(1.0 when perfectly balanced). moe_z_loss (training only) adds
z_loss * mean over positions of logsumexp(router logits)**2.
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import tensorflow as tf

import mesh_tensorflow as mtf

__all__ = [
  "top_2_gating",
  "top_n_gating",
  "switch_gating",
  "ntlb_gating",
  "switch_max_gating",
  "expert_selection_gating",
  "router_z_loss",
  "gate_inputs_with_token_embeddings",
  "compute_gating",
]

GatingResult = Tuple[mtf.Tensor, mtf.Tensor, mtf.Tensor]

_SECOND_POLICIES = ("all", "none", "threshold", "random")
_SWITCH_POLICIES = ("input_jitter", "input_dropout", "argmax", "sample")


def _hparam(hparams, name: str, default):
  return getattr(hparams, name, default)


def _use_non_top_expert(
  logits: mtf.Tensor, experts_dim: mtf.Dimension, prob: float, temperature
) -> mtf.Tensor:
  """With probability `prob` per position, hides the top expert's logit.

  The second-best expert then wins; with a temperature, one of the other
  experts is sampled from softmax(logits / temperature) instead and every
  other logit is hidden.
  """
  _, top = mtf.top_1(logits, reduced_dim=experts_dim)
  hidden = logits - 1e9 * mtf.one_hot(top, experts_dim, dtype=logits.dtype)
  if temperature is not None:
    sampled = mtf.sample_with_temperature(
      hidden, experts_dim, temperature=temperature
    )
    hidden += -1e9 * (
      1.0 - mtf.one_hot(sampled, experts_dim, dtype=logits.dtype)
    )
  switch = mtf.cast(
    mtf.less(mtf.random_uniform(logits.mesh, logits.shape.dims[:-1]), prob),
    logits.dtype,
  )
  return switch * hidden + (1.0 - switch) * logits


def _router(
  inputs: mtf.Tensor,
  experts_dim: mtf.Dimension,
  outer_expert_dims,
  variable_dtype,
  name: str,
  hparams=None,
  train: bool = False,
):
  """Router logits (dense `<name>/kernel`, no bias) and float32 softmax.

  Given hparams with moe_use_second_place_expert_prob, training sometimes
  routes to a non-top expert (see _use_non_top_expert).
  """
  logits = mtf.layers.dense(
    inputs,
    experts_dim,
    reduced_dims=inputs.shape.dims[-1:],
    use_bias=False,
    expert_dims=outer_expert_dims,
    variable_dtype=variable_dtype,
    name=name,
  )
  prob = _hparam(hparams, "moe_use_second_place_expert_prob", None)
  if prob is not None and train:
    logits = _use_non_top_expert(
      logits,
      experts_dim,
      prob,
      _hparam(hparams, "moe_use_second_place_expert_prob_temp", None),
    )
  gates = mtf.to_float(mtf.softmax(logits, reduced_dim=experts_dim))
  return logits, gates


def _balance_loss(
  first_choice_mask: mtf.Tensor,
  gates: mtf.Tensor,
  group_dim: mtf.Dimension,
  experts_dim: mtf.Dimension,
) -> mtf.Tensor:
  """mean(mean_g(gates) * mean_g(first-choice mask)) * experts**2."""
  density = mtf.reduce_mean(first_choice_mask, reduced_dim=group_dim)
  density_proxy = mtf.reduce_mean(gates, reduced_dim=group_dim)
  return mtf.reduce_mean(density_proxy * density) * float(
    experts_dim.size * experts_dim.size
  )


def router_z_loss(
  logits: mtf.Tensor,
  experts_dim: mtf.Dimension,
  num_microbatches: Optional[int] = None,
  importance: Optional[mtf.Tensor] = None,
) -> mtf.Tensor:
  """Mean over (important) positions of logsumexp(logits)**2.

  Penalises large router logits (ST-MoE's router z-loss); positions whose
  importance is not 1.0 are left out.
  """
  log_z = mtf.reduce_logsumexp(mtf.to_float(logits), experts_dim)
  z_loss = mtf.square(log_z)
  if importance is not None:
    weight = mtf.to_float(mtf.equal(importance, 1.0))
    z_loss *= weight
    denominator = mtf.reduce_sum(weight)
  else:
    denominator = float(z_loss.shape.size)
  z_loss = mtf.reduce_sum(z_loss) / (denominator + 1e-6)
  if num_microbatches and num_microbatches > 1:
    z_loss /= float(num_microbatches)
  return z_loss


def _finish_loss(
  loss, logits, experts_dim, hparams, train, importance, num_microbatches
):
  if num_microbatches and num_microbatches > 1:
    loss /= float(num_microbatches)
  z_coef = _hparam(hparams, "moe_z_loss", None)
  if train and z_coef is not None:
    loss += z_coef * router_z_loss(
      logits, experts_dim, num_microbatches, importance
    )
  return loss


def _slot(
  mask: mtf.Tensor,
  group_dim: mtf.Dimension,
  already_used: Optional[mtf.Tensor],
  capacity: float,
):
  """Assigns slots to the positions of a one-hot [.., group, experts] mask.

  Returns (kept mask, slot index per position [.., group] as float, count of
  kept positions per expert [.., experts]).
  """
  position = mtf.cumsum(mask, group_dim, exclusive=True)
  if already_used is not None:
    position += already_used
  position *= mask
  kept = mask * mtf.to_float(mtf.less(position, capacity))
  experts_dim = mask.shape.dims[-1]
  slot = mtf.reduce_sum(position, reduced_dim=experts_dim)
  count = mtf.reduce_sum(kept, reduced_dim=group_dim)
  return kept, slot, count


def _combine_term(
  gate: mtf.Tensor,
  kept: mtf.Tensor,
  slot: mtf.Tensor,
  expert_capacity_dim: mtf.Dimension,
) -> mtf.Tensor:
  """gate * kept one-hot expert * one-hot slot: [.., group, experts, cap]."""
  kept_flat = mtf.reduce_sum(kept, reduced_dim=kept.shape.dims[-1])
  return (
    (gate * kept_flat)
    * kept
    * mtf.one_hot(mtf.to_int32(slot), expert_capacity_dim, dtype=tf.float32)
  )


def _finish(
  combine: mtf.Tensor, loss: mtf.Tensor, inputs: mtf.Tensor
) -> GatingResult:
  combine = mtf.cast(combine, inputs.dtype)
  dispatch = mtf.cast(mtf.cast(combine, tf.bool), inputs.dtype)
  return dispatch, combine, mtf.cast(loss, inputs.dtype)


def _apply_second_policy(
  mask: mtf.Tensor, gate: mtf.Tensor, hparams, train: bool, gating: str
) -> mtf.Tensor:
  """Keeps a lower-place expert choice per moe_second_policy_{train,eval}:
  "all", "none", "threshold" (gate above the threshold) or "random"
  (with probability gate / threshold).
  """
  if train:
    policy = _hparam(hparams, "moe_second_policy_train", "random")
    threshold = _hparam(hparams, "moe_second_threshold_train", 0.2)
  else:
    policy = _hparam(hparams, "moe_second_policy_eval", "random")
    threshold = _hparam(hparams, "moe_second_threshold_eval", 0.2)
  if policy == "all":
    return mask
  if policy == "none":
    return mtf.zeros_like(mask)
  if policy == "threshold":
    return mask * mtf.to_float(mtf.greater(gate, threshold))
  if policy == "random":
    uniform = mtf.random_uniform(gate.mesh, gate.shape, dtype=tf.float32)
    return mask * mtf.to_float(mtf.less(uniform, gate / max(threshold, 1e-9)))
  raise ValueError(
    "%s gating: unknown second-expert policy %r "
    "(moe_second_policy_%s); expected one of %s"
    % (gating, policy, "train" if train else "eval", list(_SECOND_POLICIES))
  )


def top_2_gating(
  inputs: mtf.Tensor,
  outer_expert_dims,
  experts_dim: mtf.Dimension,
  expert_capacity_dim: mtf.Dimension,
  hparams,
  train: bool,
  variable_dtype,
  importance: Optional[mtf.Tensor] = None,
  name: str = "top_2_gating",
  num_microbatches: Optional[int] = None,
  token_embeddings: Optional[mtf.Tensor] = None,
) -> GatingResult:
  """Top-2 gating: dispatch, combine and the load-balancing loss.

  importance (optional, [outer, groups, group]): 1.0 positions get a first
  and (policy permitting) a second expert, positions with 0 < importance < 1
  only a second-place slot (their best expert), 0.0 positions none.
  """
  group_dim = inputs.shape.dims[-2]
  logits, gates = _router(
    _gate_inputs(inputs, hparams, train, token_embeddings),
    experts_dim,
    outer_expert_dims,
    variable_dtype,
    name,
  )
  capacity = float(expert_capacity_dim.size)

  gate_1, index_1 = mtf.top_1(gates, experts_dim)
  mask_1 = mtf.one_hot(index_1, experts_dim, dtype=tf.float32)
  density_proxy = gates
  if importance is not None:
    full = mtf.to_float(mtf.equal(importance, 1.0))
    mask_1 *= full
    gate_1 *= full
    density_proxy *= full
  without_top_1 = gates * (1.0 - mask_1)
  gate_2, index_2 = mtf.top_1(without_top_1, experts_dim)
  mask_2 = mtf.one_hot(index_2, experts_dim, dtype=tf.float32)
  if importance is not None:
    mask_2 *= mtf.to_float(mtf.greater(importance, 0.0))
  denominator = gate_1 + gate_2 + 1e-9
  gate_1 /= denominator
  gate_2 /= denominator

  loss = _balance_loss(mask_1, density_proxy, group_dim, experts_dim)
  if _hparam(hparams, "moe_use_second_place_loss", False):
    # The same loss for the second place, the gates renormalised without
    # the first choice standing in for the second-place density.
    normalized = without_top_1 / (
      mtf.reduce_sum(without_top_1, reduced_dim=experts_dim) + 1e-9
    )
    loss += 0.5 * _balance_loss(mask_2, normalized, group_dim, experts_dim)

  mask_2 = _apply_second_policy(mask_2, gate_2, hparams, train, "top_2")

  kept_1, slot_1, count_1 = _slot(mask_1, group_dim, None, capacity)
  kept_2, slot_2, _ = _slot(mask_2, group_dim, count_1, capacity)
  combine = _combine_term(
    gate_1, kept_1, slot_1, expert_capacity_dim
  ) + _combine_term(gate_2, kept_2, slot_2, expert_capacity_dim)
  loss = _finish_loss(
    loss, logits, experts_dim, hparams, train, importance, num_microbatches
  )
  return _finish(combine, loss, inputs)


def _switch_policy(hparams, train: bool) -> str:
  if train:
    policy = _hparam(hparams, "moe_switch_policy_train", "input_jitter")
  else:
    policy = _hparam(hparams, "moe_switch_policy_eval", "input_jitter")
  if policy not in _SWITCH_POLICIES:
    raise ValueError(
      "switch gating: unknown policy %r (moe_switch_policy_%s);"
      " expected one of %s"
      % (policy, "train" if train else "eval", list(_SWITCH_POLICIES))
    )
  return policy


def _perturb_inputs(
  inputs: mtf.Tensor, policy: str, hparams, train: bool
) -> mtf.Tensor:
  if train and policy == "input_dropout":
    return mtf.dropout(
      inputs, True, keep_prob=1.0 - _hparam(hparams, "moe_switch_dropout", 0.1)
    )
  if train and policy == "input_jitter":
    return mtf.layers.multiplicative_jitter(
      inputs, _hparam(hparams, "moe_switch_jitter", 1e-2)
    )
  return inputs


def gate_inputs_with_token_embeddings(
  gate_inputs: mtf.Tensor, token_embeddings: mtf.Tensor, mode: str
) -> mtf.Tensor:
  """The router's inputs with the token embeddings mixed in.

  Args:
    gate_inputs: [..., d_model] the layer inputs.
    token_embeddings: the same shape, the input token embeddings.
    mode: "concat" (along d_model, doubling it), "add", either with
      "_stop_grad" (no gradient into the embeddings), or "embed_only".

  Returns:
    the router inputs (float32).

  Raises:
    ValueError: on an unknown mode.
  """
  gate_inputs = mtf.to_float(gate_inputs)
  token_embeddings = mtf.to_float(token_embeddings)
  if mode.endswith("_stop_grad"):
    token_embeddings = mtf.stop_gradient(token_embeddings)
    mode = mode[: -len("_stop_grad")]
  if mode == "concat":
    return mtf.concat(
      [gate_inputs, token_embeddings], gate_inputs.shape.dims[-1].name
    )
  if mode == "add":
    return gate_inputs + token_embeddings
  if mode == "embed_only":
    return token_embeddings
  raise ValueError("unknown moe_word_embed_mode %r" % (mode,))


def _gate_inputs(
  inputs: mtf.Tensor,
  hparams,
  train: bool,
  token_embeddings: Optional[mtf.Tensor],
  policy: Optional[str] = None,
) -> mtf.Tensor:
  """The router's input: float32 inputs, perturbed per the switch policy,
  then mixed with the token embeddings per moe_word_embed_mode.

  The perturbation comes first, so jitter and dropout never touch the
  embeddings (the original's order).
  """
  gate_inputs = mtf.to_float(inputs)
  if policy is not None:
    gate_inputs = _perturb_inputs(gate_inputs, policy, hparams, train)
  mode = _hparam(hparams, "moe_word_embed_mode", None)
  if mode is not None:
    if token_embeddings is None:
      raise ValueError(
        "moe_word_embed_mode=%r needs the token embeddings (a Context with"
        " input_embeddings)" % (mode,)
      )
    gate_inputs = gate_inputs_with_token_embeddings(
      gate_inputs, token_embeddings, mode
    )
  return gate_inputs


def _mask_unimportant(importance, *tensors):
  if importance is None:
    return tensors
  full = mtf.to_float(mtf.equal(importance, 1.0))
  return tuple(t * full for t in tensors)


def _switch_choice(
  inputs,
  outer_expert_dims,
  experts_dim,
  hparams,
  train,
  variable_dtype,
  importance,
  name,
  num_microbatches,
  token_embeddings,
):
  """The router, one expert per position and the balancing loss of switch
  and switch_max gating.

  The expert is the router's argmax, or a sample at moe_switch_temperature
  under the "sample" policy. The density counts every first choice,
  padding included; the mean router probability of each expert is taken
  over the whole group and then weighted by the positions of importance 1
  (so the loss is mean(proxy * density) * experts**2 times the fraction of
  real positions), as the original computes it. Padding is never
  dispatched.

  Returns:
    (gate [.., group], index [.., group], one-hot mask [.., group, experts],
    loss).
  """
  group_dim = inputs.shape.dims[-2]
  policy = _switch_policy(hparams, train)
  logits, gates = _router(
    _gate_inputs(inputs, hparams, train, token_embeddings, policy),
    experts_dim,
    outer_expert_dims,
    variable_dtype,
    name,
    hparams,
    train,
  )
  if policy == "sample":
    index = mtf.sample_with_temperature(
      logits,
      experts_dim,
      temperature=_hparam(hparams, "moe_switch_temperature", 1.0),
    )
    gate = mtf.reduce_sum(
      gates * mtf.one_hot(index, experts_dim, dtype=tf.float32),
      reduced_dim=experts_dim,
    )
  else:
    gate, index = mtf.top_1(gates, experts_dim)
  mask = mtf.one_hot(index, experts_dim, dtype=tf.float32)
  density = mtf.reduce_mean(mask, reduced_dim=group_dim)
  density_proxy = mtf.reduce_mean(gates, reduced_dim=group_dim)
  if importance is not None:
    real = mtf.to_float(mtf.equal(importance, 1.0))
    mask *= real
    gate *= real
    density_proxy *= real
  loss = mtf.reduce_mean(density_proxy * density) * float(
    experts_dim.size * experts_dim.size
  )
  loss = _finish_loss(
    loss, logits, experts_dim, hparams, train, importance, num_microbatches
  )
  return gate, index, mask, loss


def switch_gating(
  inputs: mtf.Tensor,
  outer_expert_dims,
  experts_dim: mtf.Dimension,
  expert_capacity_dim: mtf.Dimension,
  hparams,
  train: bool,
  variable_dtype,
  importance: Optional[mtf.Tensor] = None,
  name: str = "switch_gating",
  num_microbatches: Optional[int] = None,
  token_embeddings: Optional[mtf.Tensor] = None,
) -> GatingResult:
  """Switch (top-1) gating: dispatch, combine and the load-balancing loss.

  Slots go to the positions in group order; a position that does not fit
  its expert's capacity is dropped.
  """
  group_dim = inputs.shape.dims[-2]
  gate, _, mask, loss = _switch_choice(
    inputs,
    outer_expert_dims,
    experts_dim,
    hparams,
    train,
    variable_dtype,
    importance,
    name,
    num_microbatches,
    token_embeddings,
  )
  kept, slot, _ = _slot(mask, group_dim, None, float(expert_capacity_dim.size))
  combine = _combine_term(gate, kept, slot, expert_capacity_dim)
  return _finish(combine, loss, inputs)


def switch_max_gating(
  inputs: mtf.Tensor,
  outer_expert_dims,
  experts_dim: mtf.Dimension,
  expert_capacity_dim: mtf.Dimension,
  hparams,
  train: bool,
  variable_dtype,
  importance: Optional[mtf.Tensor] = None,
  name: str = "switch_max_gating",
  num_microbatches: Optional[int] = None,
  token_embeddings: Optional[mtf.Tensor] = None,
) -> GatingResult:
  """Switch gating where an over-full expert keeps its most confident
  positions.

  Each position chooses one expert as switch gating does; each expert then
  takes the expert_capacity positions that chose it with the highest router
  probability (instead of the first ones in group order). Slots of an
  expert with fewer takers stay empty.

  Returns:
    (dispatch, combine) of shape [outer_batch, groups, experts,
    expert_capacity, group] and the loss.

  Raises:
    ValueError: if expert_capacity exceeds the group size.
  """
  group_dim = inputs.shape.dims[-2]
  if expert_capacity_dim.size > group_dim.size:
    raise ValueError(
      "switch_max gating: expert_capacity %d exceeds the group size %d"
      " (lower min_expert_capacity or raise group_size)"
      % (expert_capacity_dim.size, group_dim.size)
    )
  gate, _, mask, loss = _switch_choice(
    inputs,
    outer_expert_dims,
    experts_dim,
    hparams,
    train,
    variable_dtype,
    importance,
    name,
    num_microbatches,
    token_embeddings,
  )
  best_gate, best_position = mtf.top_k(
    mask * gate, reduced_dim=group_dim, k_dim=expert_capacity_dim
  )
  combine = mtf.one_hot(best_position, group_dim, dtype=tf.float32) * best_gate
  return _finish(combine, loss, inputs)


def ntlb_gating(
  inputs: mtf.Tensor,
  outer_expert_dims,
  experts_dim: mtf.Dimension,
  expert_capacity_dim: mtf.Dimension,
  hparams,
  train: bool,
  variable_dtype,
  importance: Optional[mtf.Tensor] = None,
  name: str = "ntlb_gating",
  num_microbatches: Optional[int] = None,
  token_embeddings: Optional[mtf.Tensor] = None,
) -> GatingResult:
  """No-token-left-behind gating: the first of the top-k experts with room.

  Rank r (r = 0..moe_ntlb_top_k-1) is tried for the positions not yet
  placed, after all positions of rank r-1 (slots continue after the ones
  already taken). The weight is the router probability of the expert used.
  """
  group_dim = inputs.shape.dims[-2]
  policy = _switch_policy(hparams, train)
  inputs_for_router = _gate_inputs(
    inputs, hparams, train, token_embeddings, policy
  )
  logits, gates = _router(
    inputs_for_router,
    experts_dim,
    outer_expert_dims,
    variable_dtype,
    name,
    hparams,
    train,
  )
  top_k = max(
    1, min(int(_hparam(hparams, "moe_ntlb_top_k", 4)), experts_dim.size)
  )
  capacity = float(expert_capacity_dim.size)
  remaining = gates
  unplaced = None
  used = None
  combine = None
  loss = None
  for rank in range(top_k):
    gate, index = mtf.top_1(remaining, experts_dim)
    choice = mtf.one_hot(index, experts_dim, dtype=tf.float32)
    remaining *= 1.0 - choice
    if rank == 0:
      density = mtf.reduce_mean(choice, reduced_dim=group_dim)
      (proxy_gates,) = _mask_unimportant(importance, gates)
      density_proxy = mtf.reduce_mean(proxy_gates, reduced_dim=group_dim)
      loss = mtf.reduce_mean(density_proxy * density) * float(
        experts_dim.size * experts_dim.size
      )
      choice, gate = _mask_unimportant(importance, choice, gate)
    else:
      choice *= unplaced
    kept, slot, count = _slot(choice, group_dim, used, capacity)
    term = _combine_term(gate, kept, slot, expert_capacity_dim)
    placed = mtf.reduce_sum(kept, reduced_dim=experts_dim)
    if rank == 0:
      combine, used, unplaced = term, count, 1.0 - placed
      if importance is not None:
        unplaced *= mtf.to_float(mtf.equal(importance, 1.0))
    else:
      combine += term
      used += count
      unplaced *= 1.0 - placed
  loss = _finish_loss(
    loss, logits, experts_dim, hparams, train, importance, num_microbatches
  )
  return _finish(combine, loss, inputs)


def expert_selection_gating(
  inputs: mtf.Tensor,
  outer_expert_dims,
  experts_dim: mtf.Dimension,
  group_size_dim: mtf.Dimension,
  expert_capacity_dim: mtf.Dimension,
  hparams,
  train: bool,
  variable_dtype,
  importance: Optional[mtf.Tensor] = None,
  name: str = "expert_selection_gating",
  num_microbatches: Optional[int] = None,
  normalize_by_num_experts_routed: bool = True,
  token_embeddings: Optional[mtf.Tensor] = None,
) -> GatingResult:
  """Experts choose positions: each takes its capacity best of the group.

  The router's softmax runs over the group (not over the experts), so each
  expert has a distribution over the group's positions; padding
  (importance 0) gets logit -1e9. Expert e takes the expert_capacity
  positions it scores highest, weighted by their probability; with
  normalize_by_num_experts_routed a position's weights are divided by the
  number of experts that took it. Loss: with a_g the mean over experts of
  the probabilities of position g (0 unless importance is 1) and T the
  number of positions of importance > 0 (their importance summed),
  mean(a_g**2 * T) * group size, plus the optional z-loss.

  Args:
    inputs: [outer_batch, groups, group, d_model].
    outer_expert_dims: None, or dims of an outer level of experts.
    experts_dim: the (unsplit) experts dimension.
    group_size_dim: the group dimension of inputs.
    expert_capacity_dim: the positions each expert takes per group.
    hparams: the HParams (switch policies, z-loss, word-embedding mode).
    train: training mode (input perturbation, z-loss).
    variable_dtype: the router kernel's mtf.VariableDType.
    importance: None or [outer_batch, groups, group]: 1 for real positions,
      0 for padding.
    name: the router's variable scope.
    num_microbatches: the loss is divided by it.
    normalize_by_num_experts_routed: divide each position's weights by the
      number of experts that chose it.
    token_embeddings: the token embeddings mixed into the router's input
      (moe_word_embed_mode), inputs' shape.

  Returns:
    (dispatch, combine) of shape [outer_batch, groups, experts,
    expert_capacity, group] and the loss (inputs' dtype).

  Raises:
    ValueError: if expert_capacity exceeds the group size.
  """
  if expert_capacity_dim.size > group_size_dim.size:
    raise ValueError(
      "expert_selection gating: expert_capacity %d exceeds the group size %d"
      " (lower min_expert_capacity or raise group_size)"
      % (expert_capacity_dim.size, group_size_dim.size)
    )
  policy = _switch_policy(hparams, train)
  logits, _ = _router(
    _gate_inputs(inputs, hparams, train, token_embeddings, policy),
    experts_dim,
    outer_expert_dims,
    variable_dtype,
    name,
  )
  if importance is not None:
    logits += mtf.cast(mtf.equal(importance, 0.0), logits.dtype) * -1e9
  gates = mtf.softmax(logits, reduced_dim=group_size_dim)
  # [.., experts, capacity]: the chosen positions and their probabilities.
  gate, index = mtf.top_k(
    gates, reduced_dim=group_size_dim, k_dim=expert_capacity_dim
  )
  dispatch = mtf.one_hot(index, group_size_dim, dtype=gates.dtype)
  combine = dispatch * gate
  if normalize_by_num_experts_routed:
    times_chosen = mtf.reduce_sum(
      dispatch, output_shape=dispatch.shape[:2] + [group_size_dim]
    )
    combine /= mtf.maximum(times_chosen, 1.0)

  mean_gate = mtf.reduce_mean(gates, reduced_dim=experts_dim)
  if importance is None:
    real_positions = float(group_size_dim.size)
  else:
    mean_gate *= mtf.cast(mtf.equal(importance, 1.0), gates.dtype)
    real_positions = mtf.cast(
      mtf.reduce_sum(importance, reduced_dim=group_size_dim), gates.dtype
    )
  loss = mtf.reduce_mean(mean_gate * mean_gate * real_positions) * float(
    group_size_dim.size
  )
  loss = _finish_loss(
    loss, logits, experts_dim, hparams, train, importance, num_microbatches
  )
  combine = mtf.cast(combine, inputs.dtype)
  dispatch = mtf.cast(mtf.cast(dispatch, tf.bool), inputs.dtype)
  return dispatch, combine, mtf.cast(loss, inputs.dtype)


def top_n_gating(
  inputs: mtf.Tensor,
  outer_expert_dims,
  experts_dim: mtf.Dimension,
  expert_capacity_dim: mtf.Dimension,
  hparams,
  train: bool,
  variable_dtype,
  importance: Optional[mtf.Tensor] = None,
  name: str = "top_n_gating",
  num_microbatches: Optional[int] = None,
  token_embeddings: Optional[mtf.Tensor] = None,
) -> GatingResult:
  """Top-n gating: each position goes to its n best experts
  (n = hparams.moe_top_n_num_experts_per_token, default 3).

  Gates are renormalised over the n choices; choices after the first follow
  the second-expert policy; slots are filled choice by choice (all first
  choices, then all second choices, ...). Positions with importance 0 are
  not dispatched; the balancing loss counts first choices of importance-1
  positions. With moe_use_second_place_loss it adds half the same loss
  computed, as the original does, from the third choices against the gates
  left after removing the first two (renormalised), so it needs n >= 3.

  Raises:
    ValueError: if moe_use_second_place_loss is set and n < 3.
  """
  group_dim = inputs.shape.dims[-2]
  logits, gates = _router(
    _gate_inputs(inputs, hparams, train, token_embeddings),
    experts_dim,
    outer_expert_dims,
    variable_dtype,
    name,
  )
  density_proxy = gates
  dispatched = None
  if importance is not None:
    density_proxy *= mtf.to_float(mtf.equal(importance, 1.0))
    dispatched = mtf.to_float(mtf.greater(importance, 0.0))
  num_places = int(_hparam(hparams, "moe_top_n_num_experts_per_token", 3))
  second_place_loss = _hparam(hparams, "moe_use_second_place_loss", False)
  if second_place_loss and num_places < 3:
    raise ValueError(
      "top_n gating: moe_use_second_place_loss needs"
      " moe_top_n_num_experts_per_token >= 3 (it balances the third choices),"
      " got %d" % num_places
    )
  remaining = gates
  choices = []  # (gate, one-hot mask) per place
  without_top_2 = None
  for place in range(num_places):
    gate, index = mtf.top_1(remaining, experts_dim)
    mask = mtf.one_hot(index, experts_dim, dtype=tf.float32)
    if dispatched is not None:
      mask *= dispatched
      gate *= dispatched
    remaining *= 1.0 - mask
    if place == 1:
      without_top_2 = remaining
    choices.append((gate, mask))
  if len(choices) > 1:
    denominator = mtf.add_n([g for g, _ in choices]) + 1e-9
    choices = [(g / denominator, m) for g, m in choices]

  loss = _balance_loss(choices[0][1], density_proxy, group_dim, experts_dim)
  if second_place_loss:
    normalized = without_top_2 / (
      mtf.reduce_sum(without_top_2, reduced_dim=experts_dim) + 1e-9
    )
    loss += 0.5 * _balance_loss(
      choices[2][1], normalized, group_dim, experts_dim
    )
  loss = _finish_loss(
    loss, logits, experts_dim, hparams, train, importance, num_microbatches
  )

  capacity = float(expert_capacity_dim.size)
  used = None
  terms = []
  for place, (gate, mask) in enumerate(choices):
    if place:
      mask = _apply_second_policy(mask, gate, hparams, train, "top_n")
    kept, slot, count = _slot(mask, group_dim, used, capacity)
    used = count if used is None else used + count
    terms.append(_combine_term(gate, kept, slot, expert_capacity_dim))
  return _finish(mtf.add_n(terms), loss, inputs)


_GATINGS = {
  "top_2": top_2_gating,
  "switch": switch_gating,
  "ntlb": ntlb_gating,
  "switch_max": switch_max_gating,
  "expert_selection": expert_selection_gating,
  "top_n": top_n_gating,
}


def compute_gating(
  moe_gating: str,
  inputs: mtf.Tensor,
  outer_expert_dims: Optional[Sequence[mtf.Dimension]],
  experts_dim: mtf.Dimension,
  expert_capacity_dim: mtf.Dimension,
  hparams,
  train: bool,
  variable_dtype,
  importance: Optional[mtf.Tensor] = None,
  num_microbatches: Optional[int] = None,
  name: Optional[str] = None,
  token_embeddings: Optional[mtf.Tensor] = None,
) -> GatingResult:
  """Dispatches to the gating function named `moe_gating`.

  Raises:
    ValueError: for an unknown gating name.
  """
  if moe_gating not in _GATINGS:
    raise ValueError(
      "unknown moe_gating %r; expected one of %s"
      % (moe_gating, sorted(_GATINGS))
    )
  kwargs = {} if name is None else {"name": name}
  if moe_gating == "expert_selection":
    kwargs["group_size_dim"] = inputs.shape.dims[-2]
  return _GATINGS[moe_gating](
    inputs=inputs,
    outer_expert_dims=outer_expert_dims,
    experts_dim=experts_dim,
    expert_capacity_dim=expert_capacity_dim,
    hparams=hparams,
    train=train,
    variable_dtype=variable_dtype,
    importance=importance,
    num_microbatches=num_microbatches,
    token_embeddings=token_embeddings,
    **kwargs,
  )
