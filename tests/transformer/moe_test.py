"""Tests for transformer.moe: gating, MoE1D / MoE2D, HParams.

Routing is checked against a numpy reference that assigns expert slots one
position at a time (a sequential formulation of the capacity rule); MoE1D
against a numpy mixture computed from the layer's own exported weights; and
the layer on 1 device against 4-device meshes with layouts that split the
experts (same seeded weights, same numbers).
"""

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mesh_test_util as mtu
from tests import meshes
from transformer import moe
from transformer._src.layers import moe_dispatch
from transformer._src.layers import moe_gating
from transformer._src.layers.context import Context

OUTER = mtf.Dimension("outer_batch", 1)
GROUPS = mtf.Dimension("batch", 2)
GROUP = mtf.Dimension("group", 8)
D_MODEL = mtf.Dimension("d_model", 8)
EXPERTS = mtf.Dimension("expert_unsplit", 4)
BATCH = mtf.Dimension("batch", 2)
LENGTH = mtf.Dimension("length", 8)

_RNG = np.random.RandomState(0)
# Inputs with a shared direction, so that the router prefers some experts
# and capacity overflows.
X_GATE = (_RNG.randn(1, 2, 8, 8) + 2.0 * _RNG.randn(8)).astype(np.float32)
X_LAYER = (_RNG.randn(2, 8, 8) + 1.0 * _RNG.randn(8)).astype(np.float32)
PADDING = np.ones((1, 2, 8), np.float32)
PADDING[0, 0, 5:] = 0.0
PADDING[0, 1, 7] = 0.0


class _Model:
  """Attribute-bag stand-in for the Unitransformer a layer reads."""

  def __init__(self, layout="", mesh_shape=""):
    self.model_dim = D_MODEL
    self.layout = layout
    self.mesh_shape = mesh_shape
    self.ensemble_dims = []
    self.ensemble_dim = None
    self.fully_autoregressive = False
    self.autoregressive = False


def _var(graph, suffix):
  for v in graph.all_variables:
    if v.name.endswith(suffix):
      return v.outputs[0]
  raise KeyError(
    "%s not in %s" % (suffix, [v.name for v in graph.all_variables])
  )


# ----------------------------------------------------------------------------
# numpy reference.


def _softmax(z):
  z = z - z.max(-1, keepdims=True)
  e = np.exp(z)
  return e / e.sum(-1, keepdims=True)


def _balance(first, probs, weight, num_experts):
  """mean_e(mean_t(probs*weight) * mean_t(onehot(first))) * E^2, one group."""
  mask = np.eye(num_experts)[first]
  return float(
    np.mean((probs * weight[:, None]).mean(0) * mask.mean(0)) * num_experts**2
  )


def np_route(
  logits,
  capacity,
  gating,
  policy="all",
  threshold=0.2,
  importance=None,
  second_place_loss=False,
  ntlb_top_k=4,
):
  """Sequential routing of one group: (combine [g, E, C], balance loss)."""
  g, num_experts = logits.shape
  probs = _softmax(logits.astype(np.float64))
  weight = np.ones(g) if importance is None else (importance == 1.0) * 1.0
  combine = np.zeros((g, num_experts, capacity))
  used = np.zeros(num_experts, int)

  def place(t, e, gate):
    if used[e] < capacity:
      combine[t, e, used[e]] += gate
      used[e] += 1
      return True
    return False

  order = np.argsort(-probs, axis=-1, kind="stable")
  first = order[:, 0]
  if gating == "top_2":
    second = order[:, 1]
    g1 = probs[np.arange(g), first] * weight
    g2 = probs[np.arange(g), second]
    g1, g2 = g1 / (g1 + g2 + 1e-9), g2 / (g1 + g2 + 1e-9)
    first_mask = np.eye(num_experts)[first] * weight[:, None]
    loss = float(
      np.mean((probs * weight[:, None]).mean(0) * first_mask.mean(0))
      * num_experts**2
    )
    if second_place_loss:
      rest = probs * (1 - first_mask)
      rest /= rest.sum(-1, keepdims=True) + 1e-9
      second_idx = np.argmax(rest, -1)
      loss += 0.5 * float(
        np.mean(rest.mean(0) * np.eye(num_experts)[second_idx].mean(0))
        * num_experts**2
      )
    for t in range(g):
      if weight[t]:
        place(t, first[t], g1[t])
    for t in range(g):
      use = {"all": True, "none": False, "threshold": g2[t] > threshold}[policy]
      if use and weight[t]:
        place(t, second[t], g2[t])
    return combine, loss
  if gating in ("switch", "switch_max"):
    # The mean router probability is over the whole group, weighted by the
    # real positions afterwards (the original's broadcast).
    mask = np.eye(num_experts)[first]
    loss = float(
      np.mean(probs.mean(0) * mask.mean(0)) * weight.mean() * num_experts**2
    )
    if gating == "switch":
      for t in range(g):
        if weight[t]:
          place(t, first[t], probs[t, first[t]])
      return combine, loss
    # switch_max: each expert keeps its `capacity` most confident takers.
    for e in range(num_experts):
      takers = [t for t in range(g) if weight[t] and first[t] == e]
      takers.sort(key=lambda t: -probs[t, e])
      for c, t in enumerate(takers[:capacity]):
        combine[t, e, c] = probs[t, e]
    return combine, loss
  if gating == "ntlb":
    loss = _balance(first, probs, weight, num_experts)
    placed = np.zeros(g, bool)
    for rank in range(min(ntlb_top_k, num_experts)):
      for t in range(g):
        e = order[t, rank]
        if weight[t] and not placed[t]:
          placed[t] = place(t, e, probs[t, e])
    return combine, loss
  if gating == "expert_selection":
    # Softmax over the group per expert, padding (importance 0) excluded;
    # a position's weights are divided by the experts that chose it.
    imp = np.ones(g) if importance is None else importance
    masked = logits.astype(np.float64) - 1e9 * (imp == 0.0)[:, None]
    over_group = np.exp(masked - masked.max(0, keepdims=True))
    over_group /= over_group.sum(0, keepdims=True)
    chosen = np.zeros((g, num_experts, capacity))
    for e in range(num_experts):
      best = np.argsort(-over_group[:, e], kind="stable")[:capacity]
      for c, t in enumerate(best):
        chosen[t, e, c] = 1.0
    times_chosen = np.maximum(chosen.sum(axis=(1, 2)), 1.0)
    combine = chosen * over_group[:, :, None] / times_chosen[:, None, None]
    mean_gate = over_group.mean(1) * weight
    loss = float(np.mean(mean_gate**2 * imp.sum()) * g)
    return combine, loss
  raise ValueError(gating)


# ----------------------------------------------------------------------------
# Gating functions.


def _hparams(**kwargs):
  defaults = dict(
    moe_second_policy_train="all",
    moe_second_policy_eval="all",
    moe_second_threshold_train=0.2,
    moe_second_threshold_eval=0.2,
    moe_use_second_place_loss=False,
    moe_switch_policy_train="argmax",
    moe_switch_policy_eval="argmax",
    moe_ntlb_top_k=4,
    moe_z_loss=None,
  )
  defaults.update(kwargs)
  return moe.HParams(**defaults)


def _run_gating(gating, hparams, capacity, train=True, importance=None):
  tf.random.set_seed(5)  # fixed router weights: the inputs overflow experts

  def build(mesh):
    x = mtf.import_tf_tensor(mesh, X_GATE, [OUTER, GROUPS, GROUP, D_MODEL])
    imp = None
    if importance is not None:
      imp = mtf.import_tf_tensor(mesh, importance, [OUTER, GROUPS, GROUP])
    dispatch, combine, loss = moe_gating.compute_gating(
      gating,
      x,
      None,
      EXPERTS,
      mtf.Dimension("expert_capacity", capacity),
      hparams,
      train,
      mtf.VariableDType(),
      importance=imp,
    )
    kernel = _var(mesh.graph, "_gating/kernel")
    # switch_max and expert_selection order them [.., experts, capacity,
    # group]; compare everything as [.., group, experts, capacity].
    order = mtf.Shape(
      [
        OUTER,
        GROUPS,
        GROUP,
        EXPERTS,
        dispatch.shape.get_dim_by_name("expert_capacity"),
      ]
    )
    return [
      mtf.transpose(dispatch, order),
      mtf.transpose(combine, order),
      loss,
      kernel,
    ]

  return mtu.run_program(build)


def _reference(gating, kernel, capacity, importance=None, **kwargs):
  combines, losses = [], []
  for b in range(2):
    logits = X_GATE[0, b].astype(np.float64) @ kernel
    imp = None if importance is None else importance[0, b]
    c, l = np_route(logits, capacity, gating, importance=imp, **kwargs)
    combines.append(c)
    losses.append(l)
  return np.stack(combines)[None], float(np.mean(losses))


def _check_routing(dispatch, combine, expected_combine, capacity):
  np.testing.assert_allclose(combine, expected_combine, rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(dispatch, (combine > 0).astype(np.float32))
  # No expert slot holds two positions; no expert gets more than capacity.
  assert dispatch.sum(axis=2).max() <= 1.0
  assert dispatch.sum(axis=(2, 4)).max() <= capacity


@pytest.mark.parametrize("policy", ["all", "none", "threshold"])
def test_top_2_gating_matches_numpy(policy):
  capacity = 2
  hparams = _hparams(
    moe_second_policy_train=policy, moe_second_threshold_train=0.3
  )
  dispatch, combine, loss, kernel = _run_gating("top_2", hparams, capacity)
  expected, expected_loss = _reference(
    "top_2", kernel, capacity, policy=policy, threshold=0.3
  )
  _check_routing(dispatch, combine, expected, capacity)
  np.testing.assert_allclose(loss, expected_loss, rtol=1e-5)
  # The test inputs overflow some expert: a position lost its first choice.
  logits = np.einsum("obgd,de->obge", X_GATE, kernel)
  first = np.argmax(logits, -1)
  got_first = np.take_along_axis(dispatch.sum(-1), first[..., None], -1)
  assert (got_first == 0).any(), "test inputs should overflow an expert"


def test_top_2_gating_eval_policy_and_second_place_loss():
  capacity = 4
  hparams = _hparams(
    moe_second_policy_train="all",
    moe_second_policy_eval="none",
    moe_use_second_place_loss=True,
  )
  dispatch, combine, loss, kernel = _run_gating(
    "top_2", hparams, capacity, train=False
  )
  expected, expected_loss = _reference(
    "top_2", kernel, capacity, policy="none", second_place_loss=True
  )
  _check_routing(dispatch, combine, expected, capacity)
  np.testing.assert_allclose(loss, expected_loss, rtol=1e-5)
  # Policy "none": each position at most one expert.
  assert dispatch.sum(axis=(3, 4)).max() == 1.0


@pytest.mark.parametrize(
  "gating", ["switch", "switch_max", "ntlb", "expert_selection"]
)
def test_single_choice_gatings_match_numpy(gating):
  capacity = 2
  dispatch, combine, loss, kernel = _run_gating(gating, _hparams(), capacity)
  expected, expected_loss = _reference(gating, kernel, capacity)
  _check_routing(dispatch, combine, expected, capacity)
  np.testing.assert_allclose(loss, expected_loss, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(
  "gating", ["top_2", "switch", "ntlb", "expert_selection"]
)
def test_padding_is_never_dispatched(gating):
  capacity = 3
  dispatch, combine, loss, kernel = _run_gating(
    gating, _hparams(), capacity, importance=PADDING
  )
  expected, expected_loss = _reference(
    gating, kernel, capacity, importance=PADDING
  )
  _check_routing(dispatch, combine, expected, capacity)
  np.testing.assert_allclose(loss, expected_loss, rtol=1e-5, atol=1e-7)
  assert dispatch[PADDING == 0].sum() == 0


def test_router_z_loss_added_in_training_only():
  z = 1e-2
  hparams = _hparams(moe_z_loss=z)
  _, _, loss_train, kernel = _run_gating("switch", hparams, 2, train=True)
  _, _, loss_eval, kernel_eval = _run_gating("switch", hparams, 2, train=False)
  logits = np.einsum("obgd,de->obge", X_GATE.astype(np.float64), kernel)
  lse = np.log(np.exp(logits).sum(-1))
  _, balance = _reference("switch", kernel, 2)
  np.testing.assert_allclose(
    loss_train, balance + z * np.mean(lse**2), rtol=1e-5
  )
  _, balance_eval = _reference("switch", kernel_eval, 2)
  np.testing.assert_allclose(loss_eval, balance_eval, rtol=1e-5)


def test_sample_policy_routes_to_one_expert():
  hparams = _hparams(moe_switch_policy_train="sample")
  dispatch, combine, _, _ = _run_gating("switch", hparams, 8)
  # Capacity 8 = group: nothing dropped, exactly one expert per position.
  np.testing.assert_array_equal(dispatch.sum(axis=(3, 4)), 1.0)
  assert (combine.sum(axis=(3, 4)) > 0).all()


@pytest.mark.parametrize(
  "gating,hparam",
  [
    ("top_2", dict(moe_second_policy_train="sometimes")),
    ("switch", dict(moe_switch_policy_train="greedy")),
    ("bogus", {}),
  ],
)
def test_unknown_gating_or_policy_raises(gating, hparam):
  with pytest.raises(ValueError, match="sometimes|greedy|bogus"):
    _run_gating(gating, _hparams(**hparam), 2)


# ----------------------------------------------------------------------------
# MoE1D.


def _moe1d_program(
  layer_kwargs,
  layout="",
  mesh_shape="",
  mode="train",
  x_value=X_LAYER,
  dims=(BATCH, LENGTH, D_MODEL),
  length_dim=LENGTH,
):
  def build(mesh):
    context = Context(
      _Model(layout, mesh_shape),
      mesh,
      [BATCH],
      length_dim,
      mtf.VariableDType(),
      mode=mode,
      losses=[],
    )
    x = mtf.import_tf_tensor(mesh, x_value, list(dims))
    with tf.compat.v1.variable_scope("moe_layer"):
      y = moe.MoE1D(**layer_kwargs).call(context, x)
    graph = mesh.graph
    gate_kernel = [v for v in graph.all_variables if "_gating/" in v.name][0]
    return [
      y,
      context.losses[0],
      gate_kernel.outputs[0],
      _var(graph, "moe_layer/wi/kernel"),
      _var(graph, "moe_layer/wo/kernel"),
    ]

  return build


def np_moe1d(x, gate_w, wi, wo, group_size, capacity, gating, **kwargs):
  flat = x.reshape(-1, x.shape[-1]).astype(np.float64)
  out = np.zeros((flat.shape[0], wo.shape[-1]))
  losses = []
  for start in range(0, flat.shape[0], group_size):
    xs = flat[start : start + group_size]
    combine, loss = np_route(xs @ gate_w, capacity, gating, **kwargs)
    losses.append(loss)
    for e in range(wi.shape[0]):
      expert_out = np.maximum(xs @ wi[e], 0.0) @ wo[e]
      out[start : start + group_size] += (
        combine[:, e, :].sum(-1)[:, None] * expert_out
      )
  return out.reshape(x.shape[:-1] + (wo.shape[-1],)), float(np.mean(losses))


LAYER_KWARGS = {
  "top_2": dict(
    num_experts=4,
    hidden_size=16,
    group_size=8,
    capacity_factor_train=1.0,
    min_expert_capacity=1,
    second_policy_train="all",
    loss_coef=0.5,
  ),
  "switch": dict(
    num_experts=4,
    hidden_size=16,
    group_size=8,
    capacity_factor_train=1.0,
    min_expert_capacity=1,
    moe_gating="switch",
    switch_policy_train="argmax",
    loss_coef=0.5,
  ),
}


@pytest.mark.parametrize("gating", ["top_2", "switch"])
def test_moe1d_matches_numpy_mixture(gating):
  y, loss, gate_w, wi, wo = mtu.run_program(
    _moe1d_program(LAYER_KWARGS[gating])
  )
  # capacity = max(min(8, int(8 * 1.0 / 4)), 1) = 2
  expected, expected_loss = np_moe1d(X_LAYER, gate_w, wi, wo, 8, 2, gating)
  np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(loss, 0.5 * expected_loss, rtol=1e-5)
  # Dropped positions (no room at any chosen expert) output exactly zero.
  dropped = np.all(expected == 0, axis=-1)
  assert dropped.any(), "test inputs should drop a position"
  np.testing.assert_array_equal(y[dropped], 0.0)


def test_moe1d_variables_and_capacity_in_eval():
  kwargs = dict(
    LAYER_KWARGS["top_2"], capacity_factor_eval=2.0, second_policy_eval="all"
  )
  build = _moe1d_program(kwargs, mode="eval")
  names = {}

  def build_and_record(mesh):
    outs = build(mesh)
    names.update({v.name: v.shape.to_string for v in mesh.graph.all_variables})
    return outs

  y, loss, gate_w, wi, wo = mtu.run_program(build_and_record)
  assert names == {
    "moe_layer/top_2_gating/kernel": "Shape[d_model=8, expert_unsplit=4]",
    "moe_layer/wi/kernel": "Shape[experts=4, d_model=8, expert_hidden=16]",
    "moe_layer/wo/kernel": "Shape[experts=4, expert_hidden=16, d_model=8]",
  }
  # Eval capacity: int(8 * 2.0 / 4) = 4.
  expected, expected_loss = np_moe1d(X_LAYER, gate_w, wi, wo, 8, 4, "top_2")
  np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(loss, 0.5 * expected_loss, rtol=1e-5)


def test_moe1d_incremental_input_without_length():
  # Decoding: x is [batch, d_model]; the layer treats the batch as one group.
  x = X_LAYER[:, 0, :]
  kwargs = dict(LAYER_KWARGS["switch"], group_size=2)
  y, loss, gate_w, wi, wo = mtu.run_program(
    _moe1d_program(kwargs, x_value=x, dims=(BATCH, D_MODEL))
  )
  assert y.shape == (2, 8)
  # capacity = max(min(2, int(2 * 1.0 / 4)), 1) = 1
  expected, _ = np_moe1d(x, gate_w, wi, wo, 2, 1, "switch")
  np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-5)


def test_moe1d_keeps_a_leading_outer_batch_dim():
  x = X_LAYER.reshape(2, 2, 4, 8)
  dims = (
    mtf.Dimension("outer_batch", 2),
    BATCH,
    mtf.Dimension("length", 4),
    D_MODEL,
  )
  kwargs = dict(LAYER_KWARGS["top_2"], group_size=4)
  y, loss, gate_w, wi, wo = mtu.run_program(
    _moe1d_program(kwargs, x_value=x, dims=dims, length_dim=dims[2])
  )
  # Groups of 4 positions in row-major order; capacity max(min(4, 1), 1).
  expected, expected_loss = np_moe1d(x, gate_w, wi, wo, 4, 1, "top_2")
  np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(loss, 0.5 * expected_loss, rtol=1e-5)


@pytest.mark.parametrize("gating", ["top_2", "switch"])
def test_moe1d_same_on_meshes_that_split_experts(gating):
  results = []
  for mesh_shape, layout in meshes.MOE:
    tf.random.set_seed(1234)  # same initial weights on every mesh
    results.append(
      mtu.run_program(
        _moe1d_program(LAYER_KWARGS[gating], layout, mesh_shape),
        mesh_shape,
        layout,
        mode="function",
      )
    )
  y, loss, gate_w, wi, wo = results[0]
  expected, expected_loss = np_moe1d(X_LAYER, gate_w, wi, wo, 8, 2, gating)
  np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(loss, 0.5 * expected_loss, rtol=1e-5)
  for (mesh_shape, layout), result in zip(meshes.MOE[1:], results[1:]):
    mtu.assert_all_close(
      result, results[0], msg=meshes.mesh_layout_id(mesh_shape, layout)
    )


@pytest.mark.parametrize(
  "kwargs",
  [
    dict(num_experts=4, hidden_size=16, group_size=8),  # top_2, "random"
    dict(
      num_experts=4,
      hidden_size=16,
      group_size=8,
      moe_gating="switch",
      dropout_rate=0.1,
    ),  # "input_jitter" and expert dropout
  ],
  ids=["top_2_random", "switch_jitter_dropout"],
)
def test_random_policies_same_on_meshes(kwargs):
  results = []
  for mesh_shape, layout in meshes.MOE_2X2:
    tf.random.set_seed(4321)
    results.append(
      mtu.run_program(
        _moe1d_program(kwargs, layout, mesh_shape),
        mesh_shape,
        layout,
        mode="function",
      )
    )
  assert np.isfinite(results[0][0]).all() and results[0][1] > 0
  mtu.assert_all_close(results[1], results[0], msg=meshes.MOE_2X2[1][1])


def test_moe1d_gradients_same_on_meshes():
  def build_grads(layout, mesh_shape):
    def build(mesh):
      y, loss = _moe1d_program(LAYER_KWARGS["top_2"], layout, mesh_shape)(mesh)[
        :2
      ]
      variables = [v.outputs[0] for v in mesh.graph.trainable_variables]
      return mtf.gradients([mtf.reduce_sum(y * y) + loss], variables)

    return build

  results = []
  for mesh_shape, layout in meshes.MOE_2X2:
    tf.random.set_seed(55)
    results.append(
      mtu.run_program(
        build_grads(layout, mesh_shape), mesh_shape, layout, mode="function"
      )
    )
  assert all(np.abs(g).sum() > 0 for g in results[0])
  for (mesh_shape, layout), result in zip(meshes.MOE_2X2[1:], results[1:]):
    mtu.assert_all_close(
      result,
      results[0],
      rtol=1e-4,
      atol=1e-5,
      msg=meshes.mesh_layout_id(mesh_shape, layout),
    )


def test_moe1d_is_gin_configurable_under_original_module():
  with gin.unlock_config():
    gin.parse_config("mesh_tensorflow.transformer.moe.MoE1D.num_experts = 3")
  try:
    assert moe.MoE1D()._hparams.moe_num_experts == 3
  finally:
    gin.clear_config()
  assert moe.MoE1D()._hparams.moe_num_experts == 16
  with pytest.raises(ValueError):
    gin.parse_config("mesh_tensorflow.transformer.moe.MoE2D.expert_x = 3")


# ----------------------------------------------------------------------------
# MoE2D / transformer_moe_layer_v2.


X_2D = _RNG.randn(2, 2, 4, 8).astype(np.float32)
OUTER2 = mtf.Dimension("outer_batch", 2)
LENGTH4 = mtf.Dimension("length", 4)


def _moe2d_program(layout="", mesh_shape=""):
  def build(mesh):
    context = Context(
      _Model(layout, mesh_shape),
      mesh,
      [OUTER2, BATCH],
      LENGTH4,
      mtf.VariableDType(),
      mode="train",
      losses=[],
    )
    x = mtf.import_tf_tensor(mesh, X_2D, [OUTER2, BATCH, LENGTH4, D_MODEL])
    layer = moe.MoE2D(
      expert_x=2,
      expert_y=2,
      hidden_size=8,
      group_size=4,
      second_policy_train="all",
      loss_coef=1.0,
    )
    y = layer.call(context, x)
    names = sorted(
      (v.name, v.shape.to_string) for v in mesh.graph.all_variables
    )
    return [y, context.losses[0]], names

  return build


def test_moe2d_variables_and_same_on_meshes():
  results = []
  for mesh_shape, layout in [
    ("", ""),
    (
      "rows:2;cols:2",
      "batch:rows;expert_x:rows;outer_batch:cols;expert_y:cols",
    ),
  ]:
    names = []

    def build(mesh, mesh_shape=mesh_shape, layout=layout, names=names):
      outs, var_names = _moe2d_program(layout, mesh_shape)(mesh)
      names[:] = var_names
      return outs

    tf.random.set_seed(77)
    results.append(mtu.run_program(build, mesh_shape, layout, mode="function"))
  assert names == [
    ("inner_gating/kernel", "Shape[expert_x=2, d_model=8, expert_y_unsplit=2]"),
    ("outer_gating/kernel", "Shape[d_model=8, expert_x_unsplit=2]"),
    ("wi/kernel", "Shape[expert_y=2, expert_x=2, d_model=8, expert_hidden=8]"),
    ("wo/kernel", "Shape[expert_y=2, expert_x=2, expert_hidden=8, d_model=8]"),
  ]
  y, loss = results[0]
  assert y.shape == X_2D.shape and np.isfinite(y).all() and np.abs(y).sum() > 0
  assert loss > 0
  mtu.assert_all_close(results[1], results[0], msg="2x2 mesh")


# ----------------------------------------------------------------------------
# Helpers.


@pytest.mark.parametrize(
  "n,max_group,split,expected",
  [
    (16, 8, 1, (2, 8)),
    (16, 8, 4, (4, 4)),
    (24, 8, 4, (4, 6)),
    (6, 1024, 2, (2, 3)),
    (12, 5, 1, (3, 4)),
  ],
)
def test_split_into_groups(n, max_group, split, expected):
  assert moe_dispatch._split_into_groups(n, max_group, split) == expected


def test_split_into_groups_rejects_indivisible_batch():
  with pytest.raises(ValueError, match="mesh split 4"):
    moe_dispatch._split_into_groups(6, 8, 4)


def test_hparams():
  hparams = moe.HParams(a=1)
  hparams.add_hparam("b", "x")
  assert hparams.values() == {"a": 1, "b": "x"}
  hparams.set_hparam("a", 2)
  assert hparams.a == 2
  hparams.add_hparam("a", 3)  # overwrites, as the original
  assert hparams.a == 3
  with pytest.raises(ValueError, match="unknown hyperparameter 'c'"):
    hparams.set_hparam("c", 3)
  moe.set_default_moe_hparams(hparams)
  assert hparams.moe_num_experts == 16 and hparams.moe_loss_coef == 1e-2
  assert hparams.moe_gating == "top_2"
  assert hparams.moe_capacity_factor_train == 1.25
  assert hparams.moe_second_policy_eval == "random"
  assert "moe_group_size" in hparams.values()


def test_hparams_add_hparam_overwrites_like_the_original():
  hparams = moe.HParams()
  moe.set_default_moe_hparams(hparams)
  hparams.add_hparam(k="moe_gating", v="switch")
  assert hparams.moe_gating == "switch"


def test_gate_inputs_with_token_embeddings_modes():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  dims = [mtf.Dimension("group", 2), mtf.Dimension("d_model", 3)]
  a = np.arange(6, dtype=np.float32).reshape(2, 3)
  b = np.ones((2, 3), np.float32)
  x = mtf.import_tf_tensor(mesh, tf.constant(a), mtf.Shape(dims))
  e = mtf.import_tf_tensor(mesh, tf.constant(b), mtf.Shape(dims))
  outs = {
    mode: moe_gating.gate_inputs_with_token_embeddings(x, e, mode)
    for mode in ("concat", "add_stop_grad", "embed_only")
  }
  lowering = mtf.Lowering(
    graph,
    {
      mesh: mtf.placement_mesh_impl.PlacementMeshImpl(
        mtf.Shape([]), mtf.convert_to_layout_rules([]), [""]
      )
    },
  )
  got = {m: lowering.export_to_tf_tensor(t).numpy() for m, t in outs.items()}
  np.testing.assert_allclose(got["concat"], np.concatenate([a, b], -1))
  np.testing.assert_allclose(got["add_stop_grad"], a + b)
  np.testing.assert_allclose(got["embed_only"], b)
  with pytest.raises(ValueError):
    moe_gating.gate_inputs_with_token_embeddings(x, e, "multiply")


@pytest.mark.parametrize("temperature", [None, 1.0])
def test_second_place_expert_prob_one_never_uses_the_top_expert(temperature):
  hparams = _hparams(
    moe_use_second_place_expert_prob=1.0,
    moe_use_second_place_expert_prob_temp=temperature,
  )
  dispatch, _, _, kernel = _run_gating("switch", hparams, 8)
  chosen = dispatch.sum(axis=-1).argmax(-1)[0]  # [groups, group]
  np.testing.assert_array_equal(dispatch.sum(axis=(3, 4)), 1.0)
  logits = X_GATE[0].astype(np.float64) @ kernel  # [groups, group, e]
  ranking = np.argsort(-logits, axis=-1)
  assert (chosen != ranking[..., 0]).all()
  if temperature is None:
    np.testing.assert_array_equal(chosen, ranking[..., 1])


def test_second_place_expert_prob_off_in_eval():
  hparams = _hparams(moe_use_second_place_expert_prob=1.0)
  dispatch, _, _, kernel = _run_gating("switch", hparams, 8, train=False)
  chosen = dispatch.sum(axis=-1).argmax(-1)[0]
  logits = X_GATE[0].astype(np.float64) @ kernel
  np.testing.assert_array_equal(chosen, logits.argmax(-1))


def test_top_n_gating_with_two_experts_is_top_2():
  hparams = _hparams(moe_top_n_num_experts_per_token=2)
  top_n = _run_gating("top_n", hparams, 2)
  top_2 = _run_gating("top_2", hparams, 2)
  for got, expected in zip(top_n[:3], top_2[:3]):
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)


def test_top_n_second_place_loss_needs_three_places():
  # The original balances the third choices for the "second place" loss.
  hparams = _hparams(
    moe_top_n_num_experts_per_token=2, moe_use_second_place_loss=True
  )
  with pytest.raises(ValueError, match="moe_top_n_num_experts_per_token"):
    _run_gating("top_n", hparams, 2)


def test_top_n_gating_routes_to_the_n_best_experts():
  capacity = 8  # a whole group: nothing dropped
  dispatch, combine, _, kernel = _run_gating("top_n", _hparams(), capacity)
  probs = _softmax(X_GATE[0].astype(np.float64) @ kernel)
  best = np.argsort(-probs, axis=-1)[..., :3]
  expected = np.zeros_like(probs)
  np.put_along_axis(
    expected, best, np.take_along_axis(probs, best, -1), axis=-1
  )
  expected /= expected.sum(-1, keepdims=True)
  np.testing.assert_allclose(combine.sum(-1)[0], expected, rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(dispatch.sum(axis=(3, 4)), 3.0)
