"""The mixture-of-experts computation behind MoE1D and MoE2D.

A mixture-of-experts layer replaces the feed-forward block by `experts`
feed-forward networks (variables `wi` [experts, d_model, expert_hidden] and
`wo` [experts, expert_hidden, d_model]) and a router that sends each
position to a few of them (see moe_gating.py).

transformer_moe_layer_v1 reshapes the input [batch..., length, d_model] into
[outer_batch, groups, group, d_model] (groups carries the batch dim's name,
so it is split like the batch), routes each group with a dispatch tensor of
shape [outer_batch, groups, group, experts, expert_capacity], and gathers
the expert inputs with an einsum into [outer_batch, experts, groups,
expert_capacity, d_model]. Renaming the experts and groups dims there is
where a layout that splits "experts" over the batch's mesh axis turns into
an all-to-all. The experts' outputs come back the same way and are mixed by
the combine tensor. transformer_moe_layer_v2 does this on two levels
("expert_x" experts, each with "expert_y" experts). `route_to_experts` and
`combine_expert_outputs` are the two halves of the one-level routing, for
layers whose experts are not one feed-forward network each.
"""

from __future__ import annotations

import dataclasses
from typing import List, Optional, Tuple

from absl import logging

import mesh_tensorflow as mtf
from transformer._src.layers import moe_gating

__all__ = [
  "ExpertRouting",
  "combine_expert_outputs",
  "route_to_experts",
  "transformer_moe_layer_v1",
  "transformer_moe_layer_v2",
]


def _split_into_groups(
  n: int, max_group_size: int, mesh_dim_size: int
) -> Tuple[int, int]:
  """n = num_groups * group_size, group_size <= max_group_size as large as
  possible, with num_groups a multiple of mesh_dim_size.

  Raises:
    ValueError: if n is not a multiple of mesh_dim_size.
  """
  if n % mesh_dim_size != 0:
    raise ValueError(
      "mixture of experts: %d positions per batch do not divide"
      " into a multiple of the batch's mesh split %d" % (n, mesh_dim_size)
    )
  num_groups = max(1, -(-n // max(1, max_group_size)))
  while num_groups % mesh_dim_size != 0 or n % num_groups != 0:
    num_groups += 1
  group_size = n // num_groups
  logging.info(
    "_split_into_groups(n=%d, max_group_size=%d, mesh_dim_size=%d)"
    " = (num_groups=%d, group_size=%d)",
    n,
    max_group_size,
    mesh_dim_size,
    num_groups,
    group_size,
  )
  return num_groups, group_size


def _mesh_split(layout, mesh_shape, dim: mtf.Dimension) -> int:
  if layout is None or mesh_shape is None:
    return 1
  return mtf.tensor_dim_to_mesh_dim_size(layout, mesh_shape, dim)


def _expert_capacity(
  group_size: int,
  capacity_factor: float,
  num_experts: int,
  min_expert_capacity: int,
) -> int:
  capacity = min(group_size, int((group_size * capacity_factor) / num_experts))
  return max(capacity, min_expert_capacity)


def _broadcast_nonpadding(
  nonpadding, inputs: mtf.Tensor, dims: List[mtf.Dimension]
):
  """nonpadding (None, a number or a Tensor) as a Tensor of shape dims."""
  if nonpadding is None:
    return None
  if isinstance(nonpadding, mtf.Tensor):
    extra = [d for d in nonpadding.shape.dims if d not in dims]
    if extra:
      raise ValueError(
        "mixture of experts: nonpadding %s has dimensions %s "
        "that the input %s lacks" % (nonpadding.shape, extra, inputs.shape)
      )
    nonpadding = mtf.cast(nonpadding, inputs.dtype)
  return mtf.zeros(inputs.mesh, dims, dtype=inputs.dtype) + nonpadding


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
):
  """Mixture of experts, one level.

  Args:
    inputs: [batch..., length, d_model] (a leading "outer_batch" dim is kept
      as the outer batch).
    output_dim: the output Dimension (usually d_model).
    hparams: an HParams with the moe_* hyperparameters of MoE1D.
    train: training mode (capacity factor, gating policies, dropout).
    variable_dtype: an mtf.VariableDType.
    layout, mesh_shape: used only to make the number of groups a multiple of
      the batch dim's mesh split.
    nonpadding: None, 1 or a float Tensor over the batch/length dims.
    activation: activation of the experts' hidden layer (callable, name or
      list of them for a gated unit).
    num_microbatches: the balancing loss is divided by it.
    token_embeddings: the input token embeddings, inputs' shape; used by
      the router when hparams.moe_word_embed_mode is set (see
      `moe_gating.gate_inputs_with_token_embeddings`).
    layout: the model's layout rules (string or mtf.LayoutRules), used to choose
      the expert and batch splits.
    mesh_shape: the mesh shape (string or mtf.Shape).

  Returns:
    (output [batch..., length, output_dim], loss * moe_loss_coef). With
    hparams.moe_use_experts_attention the output is a list [q, kv] of two
    projections (variables `q`, `kv` instead of `wo`).

  Raises:
    ValueError: on an unknown gating or a batch that does not split.
  """
  routing = route_to_experts(
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
  hidden_dim = mtf.Dimension("expert_hidden", hparams.moe_hidden_size)
  h = mtf.layers.dense_product(
    routing.expert_inputs,
    reduced_dims=routing.expert_inputs.shape.dims[-1:],
    new_dims=[hidden_dim],
    expert_dims=[experts_dim],
    activation_functions=activation,
    use_bias=False,
    variable_dtype=variable_dtype,
    name="wi",
  )
  dropout_rate = getattr(hparams, "moe_dropout_rate", 0.0)
  if dropout_rate:
    h = mtf.dropout(h, train, keep_prob=1.0 - dropout_rate)

  def compute_output(hidden: mtf.Tensor, layer_name: str) -> mtf.Tensor:
    expert_output = mtf.layers.dense(
      hidden,
      output_dim,
      expert_dims=[experts_dim],
      use_bias=False,
      reduced_dims=hidden.shape.dims[-1:],
      variable_dtype=variable_dtype,
      name=layer_name,
    )
    return combine_expert_outputs(routing, expert_output)

  loss = routing.loss * hparams.moe_loss_coef
  if getattr(hparams, "moe_use_experts_attention", False):
    # q and the shared kv come from the same hidden layer.
    return [compute_output(h, "q_wo"), compute_output(h, "k_wo")], loss
  return compute_output(h, "wo"), loss


@dataclasses.dataclass(frozen=True)
class ExpertRouting:
  """The positions of a batch sent to the experts, and how to bring them back.

  Attributes:
    expert_inputs: [outer_batch, experts, batch_unsplit, expert_capacity,
      d_model]: the positions each expert got ("experts" is named so that a
      layout can split it; "batch_unsplit" is the groups).
    combine_tensor: [outer_batch, groups, group, experts_unsplit,
      expert_capacity] (any order): the weight of each expert slot in each
      position's output.
    loss: the gating's balancing loss (before moe_loss_coef).
    batch_and_length_dims: the input's dims before d_model.
    moe_input_dims: [outer_batch, groups, group, d_model].
    experts_dim: "experts", the experts dim the expert weights carry.
    experts_dim_unsplit: "expert_unsplit", the same size.
    expert_capacity_dim: "expert_capacity".
  """

  expert_inputs: mtf.Tensor
  combine_tensor: mtf.Tensor
  loss: mtf.Tensor
  batch_and_length_dims: List[mtf.Dimension]
  moe_input_dims: List[mtf.Dimension]
  experts_dim: mtf.Dimension
  experts_dim_unsplit: mtf.Dimension
  expert_capacity_dim: mtf.Dimension


def route_to_experts(
  inputs: mtf.Tensor,
  hparams,
  train: bool,
  variable_dtype,
  layout=None,
  mesh_shape=None,
  nonpadding=None,
  num_microbatches: Optional[int] = None,
  token_embeddings: Optional[mtf.Tensor] = None,
) -> ExpertRouting:
  """Groups the positions, routes them (hparams.moe_gating) and gathers each
  expert's inputs: the first half of a one-level mixture of experts.

  Args:
    inputs: [batch..., length, d_model] (a leading "outer_batch" dim is kept
      as the outer batch).
    hparams: an HParams with the moe_* hyperparameters of MoE1D.
    train: training mode (capacity factor, gating policies).
    variable_dtype: an mtf.VariableDType.
    layout: the model's layout rules, used only to make the number of groups
      a multiple of the batch dim's mesh split.
    mesh_shape: the mesh shape (string or mtf.Shape).
    nonpadding: None, 1 or a float Tensor over the batch/length dims.
    num_microbatches: the balancing loss is divided by it.
    token_embeddings: the input token embeddings, inputs' shape, for
      hparams.moe_word_embed_mode.

  Returns:
    an ExpertRouting; `combine_expert_outputs` brings the experts' outputs
    back to the positions.

  Raises:
    ValueError: on an unknown gating or a batch that does not split.
  """
  experts_dim = mtf.Dimension("experts", hparams.moe_num_experts)
  experts_dim_unsplit = mtf.Dimension("expert_unsplit", experts_dim.size)
  batch_and_length_dims = inputs.shape.dims[:-1]
  input_dim = inputs.shape.dims[-1]
  if not batch_and_length_dims:
    raise ValueError(
      "mixture of experts: input %s needs batch/length "
      "dimensions before %s" % (inputs.shape, input_dim)
    )
  if len(batch_and_length_dims) >= 3 and (
    batch_and_length_dims[0].name == "outer_batch"
  ):
    outer_batch_dim = batch_and_length_dims[0]
    inner_dims = batch_and_length_dims[1:]
  else:
    outer_batch_dim = mtf.Dimension("outer_batch", 1)
    inner_dims = batch_and_length_dims
  orig_batch_dim = inner_dims[0]
  n = mtf.Shape(inner_dims).size
  num_groups, group_size = _split_into_groups(
    n, hparams.moe_group_size, _mesh_split(layout, mesh_shape, orig_batch_dim)
  )
  group_size_dim = mtf.Dimension("group", group_size)
  num_groups_dim = mtf.Dimension(orig_batch_dim.name, num_groups)
  batch_dim_unsplit = mtf.Dimension("batch_unsplit", num_groups)
  moe_input_dims = [outer_batch_dim, num_groups_dim, group_size_dim, input_dim]
  inputs = mtf.reshape(inputs, moe_input_dims)

  capacity_factor = (
    hparams.moe_capacity_factor_train
    if train
    else hparams.moe_capacity_factor_eval
  )
  expert_capacity = _expert_capacity(
    group_size,
    capacity_factor,
    experts_dim.size,
    getattr(hparams, "moe_min_expert_capacity", 4),
  )
  logging.info("expert_capacity: %d", expert_capacity)
  expert_capacity_dim = mtf.Dimension("expert_capacity", expert_capacity)

  importance = _broadcast_nonpadding(nonpadding, inputs, batch_and_length_dims)
  if importance is not None:
    importance = mtf.reshape(importance, moe_input_dims[:-1])

  if getattr(hparams, "moe_word_embed_mode", None) is not None:
    token_embeddings = mtf.cast(
      mtf.reshape(token_embeddings, moe_input_dims), inputs.dtype
    )
  dispatch_tensor, combine_tensor, loss = moe_gating.compute_gating(
    hparams.moe_gating,
    inputs,
    None,
    experts_dim_unsplit,
    expert_capacity_dim,
    hparams,
    train,
    variable_dtype,
    importance=importance,
    num_microbatches=num_microbatches,
    token_embeddings=token_embeddings,
  )

  # [outer_batch, experts, groups, capacity, d_model]: experts first, so the
  # rename below is an all-to-all when experts and groups share a mesh axis.
  expert_inputs = mtf.einsum(
    [inputs, dispatch_tensor],
    mtf.Shape(
      [
        outer_batch_dim,
        experts_dim_unsplit,
        num_groups_dim,
        expert_capacity_dim,
        input_dim,
      ]
    ),
  )
  # Renaming d_model first turns a model-parallel d_model into a cheap slice
  # before the all-to-all (no effect otherwise).
  d_model_split_dim = mtf.Dimension("d_model_split", input_dim.size)
  for model_dim in (d_model_split_dim, input_dim):
    expert_inputs = mtf.reshape(
      expert_inputs,
      mtf.Shape(
        [
          outer_batch_dim,
          experts_dim,
          batch_dim_unsplit,
          expert_capacity_dim,
          model_dim,
        ]
      ),
    )
  return ExpertRouting(
    expert_inputs=expert_inputs,
    combine_tensor=combine_tensor,
    loss=loss,
    batch_and_length_dims=batch_and_length_dims,
    moe_input_dims=moe_input_dims,
    experts_dim=experts_dim,
    experts_dim_unsplit=experts_dim_unsplit,
    expert_capacity_dim=expert_capacity_dim,
  )


def combine_expert_outputs(
  routing: ExpertRouting, expert_output: mtf.Tensor
) -> mtf.Tensor:
  """The experts' outputs mixed back into the positions they came from.

  Args:
    routing: the ExpertRouting of `route_to_experts`.
    expert_output: [outer_batch, experts, batch_unsplit, expert_capacity,
      output_dim].

  Returns:
    [batch..., length, output_dim].
  """
  output_dim = expert_output.shape.dims[-1]
  outer_batch_dim, num_groups_dim = routing.moe_input_dims[:2]
  output_split_dim = mtf.Dimension("d_model_split", output_dim.size)
  # Split over experts -> split over batch (the reverse all-to-all).
  for model_dim in (output_split_dim, output_dim):
    expert_output = mtf.reshape(
      expert_output,
      mtf.Shape(
        [
          outer_batch_dim,
          routing.experts_dim_unsplit,
          num_groups_dim,
          routing.expert_capacity_dim,
          model_dim,
        ]
      ),
    )
  output = mtf.einsum(
    [expert_output, routing.combine_tensor],
    mtf.Shape(routing.moe_input_dims[:-1] + [output_dim]),
  )
  return mtf.reshape(output, routing.batch_and_length_dims + [output_dim])


def transformer_moe_layer_v2(
  inputs: mtf.Tensor,
  output_dim: mtf.Dimension,
  hparams,
  train: bool,
  variable_dtype,
  layout=None,
  mesh_shape=None,
  nonpadding=None,
  num_microbatches: Optional[int] = None,
):
  """Two-level mixture of experts (top_2 gating on both levels).

  Each position goes to up to two of hparams.moe_num_experts[0] outer
  experts ("expert_x"), each a mixture of moe_num_experts[1] inner experts
  ("expert_y") with variables `wi` [expert_y, expert_x, d_model,
  expert_hidden] and `wo`. Gating variables: `outer_gating/kernel`,
  `inner_gating/kernel` [expert_x, d_model, expert_y_unsplit].

  Dims: input [a0, b1, l, m] -> [a0, g1, s, m] (g1 = groups named like the
  batch, s = "group_size_x"); outer dispatch [a0, g1, s, x, c]; expert input
  [x1, a0, g, c, m] -> [x1, h0, t, m] (h0 named like the outer batch,
  t = "group_size_y"); inner dispatch [x1, h0, t, y, d]; expert input
  [y0, x1, h, d, m]; then everything in reverse.

  Args:
    inputs: the input [batch..., length, d_model].
    output_dim: the output Dimension (d_model).
    hparams: the HParams of the mixture (see set_default_moe_hparams).
    train: whether training (capacity factor, dropout, noise).
    variable_dtype: the mtf.VariableDType.
    layout: the model's layout rules (used to choose the two levels' splits).
    mesh_shape: the mesh shape.
    nonpadding: a float mask [batch..., length] of real tokens (None: all),
      which the balancing loss weighs by.
    num_microbatches: the number of microbatches the losses are divided over.

  Returns:
    (output of shape inputs minus d_model plus output_dim,
     (outer loss + inner loss) * moe_loss_coef).

  Raises:
    ValueError: if moe_num_experts is not a pair or the gating is not top_2.
  """
  if hparams.moe_gating != "top_2":
    raise ValueError(
      "transformer_moe_layer_v2: unknown moe_gating %r "
      "(only 'top_2' is supported)" % (hparams.moe_gating,)
    )
  if len(hparams.moe_num_experts) != 2:
    raise ValueError(
      "transformer_moe_layer_v2: moe_num_experts must be a pair"
      " [expert_x, expert_y], got %r" % (hparams.moe_num_experts,)
    )
  orig_shape = inputs.shape
  if len(orig_shape.dims) == 3:
    inputs = mtf.reshape(
      inputs, [mtf.Dimension("outer_batch", 1)] + orig_shape.dims
    )
  elif len(orig_shape.dims) != 4:
    raise ValueError(
      "transformer_moe_layer_v2: input %s must be [batch, "
      "length, d_model] or [outer_batch, batch, length, "
      "d_model]" % (orig_shape,)
    )
  a0, b1, l, m = inputs.shape.dims
  min_capacity = getattr(hparams, "moe_min_expert_capacity", 4)
  hidden_dim = mtf.Dimension("expert_hidden", hparams.moe_hidden_size)
  x1 = mtf.Dimension("expert_x", hparams.moe_num_experts[0])
  y0 = mtf.Dimension("expert_y", hparams.moe_num_experts[1])
  x = mtf.Dimension("expert_x_unsplit", x1.size)
  y = mtf.Dimension("expert_y_unsplit", y0.size)

  num_groups, group_size = _split_into_groups(
    b1.size * l.size,
    hparams.moe_group_size,
    _mesh_split(layout, mesh_shape, b1),
  )
  g1 = mtf.Dimension(b1.name, num_groups)
  g = mtf.Dimension(b1.name + "_unsplit", num_groups)
  s = mtf.Dimension("group_size_x", group_size)
  capacity_factor = (
    hparams.moe_capacity_factor_train
    if train
    else hparams.moe_capacity_factor_eval
  )
  c = mtf.Dimension(
    "expert_capacity_x",
    _expert_capacity(s.size, capacity_factor, x.size, min_capacity),
  )

  num_groups, group_size = _split_into_groups(
    a0.size * g.size * c.size,
    hparams.moe_group_size,
    _mesh_split(layout, mesh_shape, a0),
  )
  t = mtf.Dimension("group_size_y", group_size)
  h0 = mtf.Dimension(a0.name, num_groups)
  h = mtf.Dimension(a0.name + "_unsplit", num_groups)
  d = mtf.Dimension(
    "expert_capacity_y",
    _expert_capacity(
      t.size, hparams.moe_capacity_factor_second_level, y.size, min_capacity
    ),
  )

  inputs = mtf.reshape(inputs, [a0, g1, s, m])
  importance = _broadcast_nonpadding(
    nonpadding, inputs, [a0, b1, l] if len(orig_shape.dims) == 4 else [b1, l]
  )
  if importance is not None:
    importance = mtf.reshape(importance, [a0, g1, s])

  dispatch_x, combine_x, loss_outer = moe_gating.top_2_gating(
    inputs,
    None,
    x,
    c,
    hparams,
    train,
    variable_dtype,
    importance=importance,
    name="outer_gating",
    num_microbatches=num_microbatches,
  )
  expert_inputs_x = mtf.einsum([inputs, dispatch_x], [x, a0, g1, c, m])

  # Importance for the inner gating: 1.0 for a first-choice outer expert,
  # 0.5 for a second choice, 0.0 for an empty slot.
  importance = mtf.reduce_sum(combine_x, output_shape=[x, a0, g1, c])
  importance = 0.5 * (
    mtf.to_float(mtf.greater(importance, 0.5))
    + mtf.to_float(mtf.greater(importance, 0.0))
  )

  expert_inputs_x = mtf.reshape(expert_inputs_x, mtf.Shape([x1, a0, g, c, m]))
  importance = mtf.reshape(importance, [x1, a0, g, c])
  inputs_y = mtf.reshape(expert_inputs_x, [x1, h0, t, m])
  importance = mtf.reshape(importance, [x1, h0, t])

  dispatch_y, combine_y, loss_inner = moe_gating.top_2_gating(
    inputs_y,
    [x1],
    y,
    d,
    hparams,
    train,
    variable_dtype,
    importance=importance,
    name="inner_gating",
    num_microbatches=num_microbatches,
  )
  expert_inputs_y = mtf.einsum([inputs_y, dispatch_y], [y, x1, h0, d, m])
  expert_inputs_y = mtf.reshape(expert_inputs_y, mtf.Shape([y0, x1, h, d, m]))

  hidden = mtf.layers.dense(
    expert_inputs_y,
    hidden_dim,
    expert_dims=[y0, x1],
    reduced_dims=expert_inputs_y.shape.dims[-1:],
    activation=mtf.relu,
    use_bias=False,
    variable_dtype=variable_dtype,
    name="wi",
  )
  expert_output = mtf.layers.dense(
    hidden,
    output_dim,
    expert_dims=[y0, x1],
    reduced_dims=hidden.shape.dims[-1:],
    use_bias=False,
    variable_dtype=variable_dtype,
    name="wo",
  )

  n = output_dim
  expert_output = mtf.reshape(expert_output, mtf.Shape([y, x1, h0, d, n]))
  output_y = mtf.einsum([expert_output, combine_y], [x1, h0, t, n])
  output = mtf.reshape(output_y, [x1, a0, g, c, n])
  expert_output_x = mtf.reshape(output, mtf.Shape([x, a0, g1, c, n]))
  output_x = mtf.einsum([expert_output_x, combine_x], [a0, g1, s, n])
  output = mtf.reshape(output_x, orig_shape.dims[:-1] + [n])
  return output, (loss_outer + loss_inner) * hparams.moe_loss_coef
