"""Tests for transformer.heterogeneous_moe.

The layer is checked against a numpy mixture of masked two-layer experts
computed from its own exported weights (capacity = group size, so nothing
is dropped and the combine weights are the renormalised top-2 gates), and
on 1 device against 4-device meshes that split the experts.
"""

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mesh_test_util as mtu
from tests import meshes
from transformer import heterogeneous_moe
from transformer._src.layers.context import Context
from transformer._src.models.heterogeneous_moe import heterogeneous_mask_array

BATCH = mtf.Dimension("batch", 2)
LENGTH = mtf.Dimension("length", 4)
D_MODEL = mtf.Dimension("d_model", 8)
NUM_EXPERTS = 4
X = np.random.RandomState(3).randn(2, 4, 8).astype(np.float32)
# Two kinds of expert: experts 0-1 one layer of one unit, experts 2-3 two
# layers of two units (hidden_size 1 is the unit a width multiplies).
MASK_INFO = [
  {"percent_number": 0.5, "layers": 1, "width": 1},
  {"percent_number": 0.5, "layers": 2, "width": 2},
]


class _Model:
  def __init__(self, layout="", mesh_shape=""):
    self.model_dim = D_MODEL
    self.layout = layout
    self.mesh_shape = mesh_shape
    self.ensemble_dims = []
    self.ensemble_dim = None


def _layer_kwargs(**overrides):
  kwargs = dict(
    num_experts=NUM_EXPERTS,
    hidden_size=1,
    group_size=4,  # 2 groups, also where a layout splits the batch in 2
    capacity_factor_eval=float(NUM_EXPERTS),  # capacity = group: no drops
    second_policy_eval="all",
    loss_coef=0.5,
    heterogeneous_mask_info=MASK_INFO,
  )
  kwargs.update(overrides)
  return kwargs


def _program(layer_kwargs, layout="", mesh_shape="", layers_out=None):
  def build(mesh):
    context = Context(
      _Model(layout, mesh_shape),
      mesh,
      [BATCH],
      LENGTH,
      mtf.VariableDType(),
      mode="eval",
      losses=[],
    )
    x = mtf.import_tf_tensor(mesh, X, [BATCH, LENGTH, D_MODEL])
    layer = heterogeneous_moe.HeterogeneousMoE1D(**layer_kwargs)
    with tf.compat.v1.variable_scope("moe"):
      y = layer.call(context, x)
    if layers_out is not None:
      layers_out.append(layer)
    variables = {v.name: v.outputs[0] for v in mesh.graph.all_variables}
    names = sorted(variables)
    return [y, context.losses[0]] + [variables[n] for n in names]

  return build


def _variable_names(layer_kwargs):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  with mtf.variable_store(mtf.VariableStore()):
    _program(layer_kwargs)(mesh)
  return sorted(v.name for v in graph.all_variables)


def _np_reference(weights, mask):
  """The layer's output from its weights: top-2 mixture of masked stacks."""
  gate = weights["moe/top_2_gating/kernel"]
  flat = X.reshape(-1, 8).astype(np.float64)
  logits = flat @ gate
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  order = np.argsort(-probs, -1)
  out = np.zeros_like(flat)
  for t in range(flat.shape[0]):
    first, second = order[t, :2]
    g1, g2 = probs[t, first], probs[t, second]
    for e, g in (
      (first, g1 / (g1 + g2 + 1e-9)),
      (second, g2 / (g1 + g2 + 1e-9)),
    ):
      h = np.maximum(flat[t] @ weights["moe/expert_layer_0/wi/kernel"][e], 0)
      y = (h * mask[:, 0, e]) @ weights["moe/expert_layer_0/wo/kernel"][e]
      scale = weights["moe/expert_layer_1/rms_norm/scale"]
      normed = y / np.sqrt(np.mean(y * y) + 1e-6) * scale
      h = np.maximum(normed @ weights["moe/expert_layer_1/wi/kernel"][e], 0)
      y = y + (h * mask[:, 1, e]) @ weights["moe/expert_layer_1/wo/kernel"][e]
      out[t] += g * y
  return out.reshape(X.shape)


def test_mask_array_kinds_layers_and_widths():
  mask = heterogeneous_mask_array(MASK_INFO, NUM_EXPERTS, expert_width=1)
  assert mask.shape == (2, 2, 4)  # [max width, max layers, experts]
  expected = np.zeros((2, 2, 4))
  expected[:1, :1, :2] = 1  # experts 0-1: one layer, one unit
  expected[:2, :2, 2:] = 1  # experts 2-3: two layers, two units
  np.testing.assert_array_equal(mask, expected)


def test_mask_array_last_kind_takes_the_rest_and_counts():
  info = [
    {"percent_number": 0.3, "layers": 1, "width": 1},  # int(1.2) = 1
    {"percent_number": 2, "layers": 3, "width": 1},  # a count >= 1
    {"percent_number": 0.1, "layers": 2, "width": 1},  # takes the last 3
  ]
  mask = heterogeneous_mask_array(info, 6, expert_width=4)
  np.testing.assert_array_equal(mask[0].sum(0), [1, 3, 3, 2, 2, 2])


def test_mask_array_width_is_multiplied_by_expert_width():
  # As the original: the hidden dim has max(width) units and width *
  # expert_width of them are kept, so with expert_width >= max(width) every
  # unit is kept.
  info = [
    {"percent_number": 0.5, "layers": 1, "width": 1},
    {"percent_number": 0.5, "layers": 1, "width": 2},
  ]
  np.testing.assert_array_equal(
    heterogeneous_mask_array(info, 2, expert_width=4), np.ones((2, 1, 2))
  )


@pytest.mark.parametrize(
  "info,match",
  [
    ([], "empty"),
    ([{"percent_number": 3, "layers": 1, "width": 1}] * 3, "more than the 4"),
  ],
)
def test_mask_array_rejects_bad_info(info, match):
  with pytest.raises(ValueError, match=match):
    heterogeneous_mask_array(info, 4, expert_width=1)


def test_layer_matches_numpy_mixture_of_masked_stacks():
  names = _variable_names(_layer_kwargs())
  assert names == [
    "moe/expert_layer_0/wi/kernel",
    "moe/expert_layer_0/wo/kernel",
    "moe/expert_layer_1/rms_norm/scale",
    "moe/expert_layer_1/wi/kernel",
    "moe/expert_layer_1/wo/kernel",
    "moe/top_2_gating/kernel",
  ]
  tf.random.set_seed(11)
  layers = []
  y, loss, *values = mtu.run_program(
    _program(_layer_kwargs(), layers_out=layers)
  )
  weights = dict(zip(names, values))
  # The mask overrides the depth and width, written back into the hparams.
  hparams = layers[0]._hparams
  assert (hparams.moe_num_layers, hparams.moe_hidden_size) == (2, 2)
  assert weights["moe/expert_layer_0/wi/kernel"].shape == (4, 8, 2)
  mask = heterogeneous_mask_array(MASK_INFO, NUM_EXPERTS, expert_width=1)
  np.testing.assert_allclose(y, _np_reference(weights, mask), atol=1e-5)
  assert loss > 0
  # The mask matters: the same weights without it give other outputs.
  unmasked = _np_reference(weights, np.ones_like(mask))
  assert np.abs(unmasked - y).max() > 1e-3


def test_without_mask_every_expert_is_the_full_stack():
  kwargs = _layer_kwargs(
    heterogeneous_mask_info=None, moe_num_layers=2, hidden_size=3
  )
  names = _variable_names(kwargs)
  tf.random.set_seed(12)
  y, _, *values = mtu.run_program(_program(kwargs))
  weights = dict(zip(names, values))
  assert weights["moe/expert_layer_1/wi/kernel"].shape == (4, 8, 3)
  np.testing.assert_allclose(
    y, _np_reference(weights, np.ones((3, 2, NUM_EXPERTS))), atol=1e-5
  )


@pytest.mark.parametrize(
  "mesh_shape,layout", meshes.MOE, ids=meshes.ids(meshes.MOE)
)
def test_same_numbers_on_meshes_that_split_experts(mesh_shape, layout):
  results = []
  for shape, rules in [("", ""), (mesh_shape, layout)]:
    tf.random.set_seed(13)
    results.append(
      mtu.run_program(
        _program(_layer_kwargs(), rules, shape), shape, rules, mode="function"
      )
    )
  mtu.assert_all_close(results[1], results[0], msg=layout)


def test_several_layers_need_the_context():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, [BATCH, LENGTH, D_MODEL])
  layer = heterogeneous_moe.HeterogeneousMoE1D(**_layer_kwargs())
  with mtf.variable_store(mtf.VariableStore()):
    with pytest.raises(ValueError, match="need the Context"):
      heterogeneous_moe.transformer_moe_layer_v1(
        x, D_MODEL, layer._hparams, False, mtf.VariableDType()
      )


def test_gin_configurable_under_the_original_module():
  with gin.unlock_config():
    gin.parse_config(
      "import mesh_tensorflow.transformer.heterogeneous_moe\n"
      "mesh_tensorflow.transformer.heterogeneous_moe.HeterogeneousMoE1D"
      ".moe_num_layers = 3\n"
      "HeterogeneousMoE1D.num_experts = 8\n"
    )
  try:
    layer = heterogeneous_moe.HeterogeneousMoE1D()
    assert layer._hparams.moe_num_layers == 3
    assert layer._hparams.moe_num_experts == 8
    assert layer._hparams.moe_top_n_num_experts_per_token == 3
  finally:
    gin.clear_config()
