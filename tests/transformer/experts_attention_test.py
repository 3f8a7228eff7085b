"""Tests for the experts attention layers and ExpertsAttentionParams.

The layer outputs are compared with numpy: switch routing ("argmax") and
the experts' projections computed from the layer's own exported weights;
and across meshes whose layouts split the experts. As in the original, the
keys/values come from the layer input and keep its length dim, so each
position's attention output is its own value (and the encoder output of
encoder-decoder attention is not used): see also the experts_attention
programs of original_numbers_test.py.
"""

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mesh_test_util as mtu
from tests import meshes
from transformer import attention
from transformer import moe
from transformer import transformer_layers
from transformer._src.layers.context import Context

BATCH = mtf.Dimension("batch", 2)
LENGTH = mtf.Dimension("length", 8)
MEMORY = mtf.Dimension("memory_length", 4)
D_MODEL = mtf.Dimension("d_model", 8)
HEADS, D_KV = 2, 4

_RNG = np.random.RandomState(1)
X = (_RNG.randn(2, 8, 8) + _RNG.randn(8)).astype(np.float32)
ENC = _RNG.randn(2, 4, 8).astype(np.float32)

MOE_KWARGS = dict(
  num_experts=4,
  hidden_size=16,
  group_size=8,
  capacity_factor_train=1.0,
  min_expert_capacity=1,
  switch_policy_train="argmax",
  loss_coef=0.5,
)


class _Model:
  def __init__(self, layout="", mesh_shape=""):
    self.model_dim = D_MODEL
    self.layout = layout
    self.mesh_shape = mesh_shape
    self.ensemble_dims = []
    self.ensemble_dim = None
    self.fully_autoregressive = False
    self.autoregressive = False


def _program(layer_cls, layer_kwargs, layout="", mesh_shape="", names=None):
  def build(mesh):
    context = Context(
      _Model(layout, mesh_shape),
      mesh,
      [BATCH],
      LENGTH,
      mtf.VariableDType(),
      mode="train",
      losses=[],
    )
    x = mtf.import_tf_tensor(mesh, X, [BATCH, LENGTH, D_MODEL])
    context.encoder_output = mtf.import_tf_tensor(
      mesh, ENC, [BATCH, MEMORY, D_MODEL]
    )
    with tf.compat.v1.variable_scope(layer_cls.__name__):
      y = layer_cls(**layer_kwargs).call(context, x)
    variables = {v.name.split("/", 1)[1]: v for v in mesh.graph.all_variables}
    if names is not None:
      names[:] = sorted((k, v.shape.to_string) for k, v in variables.items())
    loss = mtf.add_n(context.losses)
    return [y, loss] + [variables[k].outputs[0] for k in sorted(variables)]

  return build


# ----------------------------------------------------------------------------
# numpy reference.


def _softmax(z, axis=-1):
  z = z - z.max(axis, keepdims=True)
  e = np.exp(z)
  return e / e.sum(axis, keepdims=True)


def np_switch_experts(x, gate_w, wi, wos, capacity, group_size=8):
  """Switch-routed experts (argmax); one output per kernel in wos, + loss."""
  flat = x.reshape(-1, x.shape[-1]).astype(np.float64)
  outs = [np.zeros((flat.shape[0], wo.shape[-1])) for wo in wos]
  losses = []
  num_experts = gate_w.shape[-1]
  for start in range(0, flat.shape[0], group_size):
    xs = flat[start : start + group_size]
    probs = _softmax(xs @ gate_w)
    first = np.argmax(probs, -1)
    losses.append(
      np.mean(probs.mean(0) * np.eye(num_experts)[first].mean(0))
      * num_experts**2
    )
    used = np.zeros(num_experts, int)
    for t, e in enumerate(first):
      if used[e] < capacity:
        used[e] += 1
        hidden = np.maximum(xs[t] @ wi[e], 0.0)
        for out, wo in zip(outs, wos):
          out[start + t] = probs[t, e] * (hidden @ wo[e])
  shape = x.shape[:-1]
  return [o.reshape(shape + (o.shape[-1],)) for o in outs], np.mean(losses)


def np_own_value_attention(kv, wo):
  """The original's experts attention: each position's own value kv [b, l,
  h*d] (the softmax weights sum to one), projected by wo [h*d, d_model].
  """
  return kv @ wo


def _self_attention_kwargs(**extra):
  kwargs = dict(
    MOE_KWARGS,
    num_heads=HEADS,
    key_value_size=D_KV,
    shared_kv=True,
    moe_gating="switch",
  )
  kwargs.update(extra)
  return kwargs


def _expected_self_attention(outs):
  y, loss, kv_w, o_w, q_w, gate_w, wi = outs
  (_, kv), moe_loss = np_switch_experts(X, gate_w, wi, [q_w, kv_w], 2)
  return np_own_value_attention(kv, o_w), 0.5 * moe_loss


VARIABLES_QKV = [
  ("k_wo/kernel", "Shape[experts=4, expert_hidden=16, d_model=8]"),
  ("o", "Shape[heads=8, d_model=8]"),
  ("q_wo/kernel", "Shape[experts=4, expert_hidden=16, d_model=8]"),
  ("switch_gating/kernel", "Shape[d_model=8, expert_unsplit=4]"),
  ("wi/kernel", "Shape[experts=4, d_model=8, expert_hidden=16]"),
]


def test_experts_self_attention_matches_numpy():
  names = []
  outs = mtu.run_program(
    _program(
      transformer_layers.ExpertsSelfAttention,
      _self_attention_kwargs(),
      names=names,
    )
  )
  assert names == VARIABLES_QKV
  expected, expected_loss = _expected_self_attention(outs)
  np.testing.assert_allclose(outs[0], expected, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(outs[1], expected_loss, rtol=1e-5)
  assert np.abs(outs[0]).sum() > 0


def test_experts_self_attention_same_on_meshes_that_split_experts():
  results = []
  for mesh_shape, layout in meshes.MOE:
    tf.random.set_seed(99)
    results.append(
      mtu.run_program(
        _program(
          transformer_layers.ExpertsSelfAttention,
          _self_attention_kwargs(),
          layout,
          mesh_shape,
        ),
        mesh_shape,
        layout,
        mode="function",
      )
    )
  expected, expected_loss = _expected_self_attention(results[0])
  np.testing.assert_allclose(results[0][0], expected, rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(results[0][1], expected_loss, rtol=1e-5)
  for (mesh_shape, layout), result in zip(meshes.MOE[1:], results[1:]):
    mtu.assert_all_close(
      result, results[0], msg=meshes.mesh_layout_id(mesh_shape, layout)
    )


def test_experts_enc_dec_attention_kv_by_experts_matches_numpy():
  names = []
  outs = mtu.run_program(
    _program(
      transformer_layers.ExpertsEncDecAttention,
      _self_attention_kwargs(expert_computation="kv"),
      names=names,
    )
  )
  assert names == [
    ("o", "Shape[heads=8, d_model=8]"),
    ("q", "Shape[d_model=8, heads=8]"),
    ("switch_gating/kernel", "Shape[d_model=8, expert_unsplit=4]"),
    ("wi/kernel", "Shape[experts=4, d_model=8, expert_hidden=16]"),
    ("wo/kernel", "Shape[experts=4, expert_hidden=16, d_model=8]"),
  ]
  y, loss, o_w, q_w, gate_w, wi, wo = outs
  # The experts run on the decoder input (not the encoder output).
  (kv,), moe_loss = np_switch_experts(X, gate_w, wi, [wo], 2)
  np.testing.assert_allclose(
    y, np_own_value_attention(kv, o_w), rtol=1e-4, atol=1e-5
  )
  np.testing.assert_allclose(loss, 0.5 * moe_loss, rtol=1e-5)


def test_experts_enc_dec_attention_qkv_runs_experts_on_the_decoder_input():
  outs = mtu.run_program(
    _program(
      transformer_layers.ExpertsEncDecAttention, _self_attention_kwargs()
    )
  )
  y, loss, kv_w, o_w, q_w, gate_w, wi = outs
  (_, kv), moe_loss = np_switch_experts(X, gate_w, wi, [q_w, kv_w], 2)
  np.testing.assert_allclose(
    y, np_own_value_attention(kv, o_w), rtol=1e-4, atol=1e-5
  )
  # One MoE call: one loss.
  np.testing.assert_allclose(loss, 0.5 * moe_loss, rtol=1e-5)


@pytest.mark.parametrize(
  "kwargs,match",
  [
    (dict(shared_kv=False), "shared_kv must be True"),
    (dict(expert_computation="qk"), "unknown expert_computation 'qk'"),
  ],
)
def test_bad_configuration_raises(kwargs, match):
  with pytest.raises(ValueError, match=match):
    mtu.run_program(
      _program(
        transformer_layers.ExpertsSelfAttention,
        _self_attention_kwargs(**kwargs),
      )
    )


def test_registration_and_exports():
  assert issubclass(attention.ExpertsAttentionParams, attention.AttentionParams)
  assert issubclass(
    transformer_layers.ExpertsSelfAttention, transformer_layers.SelfAttention
  )
  assert issubclass(
    transformer_layers.ExpertsEncDecAttention,
    transformer_layers.EncDecAttention,
  )
  assert "ExpertsAttentionParams" in attention.__all__
  assert {"ExpertsSelfAttention", "ExpertsEncDecAttention"} <= set(
    transformer_layers.__all__
  )
  with gin.unlock_config():
    gin.parse_config(
      "mesh_tensorflow.transformer.transformer_layers."
      "ExpertsSelfAttention.num_experts = 3"
    )
  try:
    layer = transformer_layers.ExpertsSelfAttention()
    assert layer._hparams.num_experts == 3
    assert layer._hparams.moe_gating == "switch"
    assert layer._hparams.hidden_size == 3072
  finally:
    gin.clear_config()
  assert isinstance(layer._hparams, moe.HParams)
