"""Tests for transformer/fixup_layers.py.

Fixup layers output zeros at initialization (zero output projections) on
every mesh and layout; the gradients of the output projections are nonzero
and equal numpy's (from the exported inner weights); the inner projections
are scaled by num_blocks^-1/2; the scalar sublayers scale / shift and
create `fixup_scale` (1) / `fixup_bias` (0).
"""

import types

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mesh_test_util as mtu
from tests import meshes
from transformer import fixup_layers as fx
from transformer import transformer as transformer_lib
from transformer._src.layers.context import Context

tf1 = tf.compat.v1

B, L, M, D, FF = 4, 5, 3, 8, 16
BATCH = mtf.Dimension("batch", B)
LENGTH = mtf.Dimension("length", L)
MEMORY = mtf.Dimension("memory_length", M)
D_MODEL = mtf.Dimension("d_model", D)
F32 = mtf.VariableDType(tf.float32)

_RNG = np.random.RandomState(11)
X = _RNG.normal(size=(B, L, D)).astype(np.float32)
ENC = _RNG.normal(size=(B, M, D)).astype(np.float32)
G = _RNG.normal(size=(B, L, D)).astype(np.float32)  # d loss / d output


def _model():
  return types.SimpleNamespace(
      model_dim=D_MODEL, ensemble_dims=[], ensemble_dim=None,
      fully_autoregressive=True, autoregressive=True, layout=None,
      mesh_shape=None, max_length_dim=LENGTH)


def _imp(mesh, value, dims):
  return mtf.import_tf_tensor(mesh, tf.constant(value), mtf.Shape(dims))


def _context(mesh, mode="train"):
  pos = mtf.range(mesh, LENGTH, tf.int32)
  return Context(_model(), mesh, [BATCH], LENGTH, F32, mode=mode,
                 position=pos, read_priority=pos, write_priority=pos,
                 encoder_output=_imp(mesh, ENC, [BATCH, MEMORY, D_MODEL]),
                 losses=[])


def _softmax(x):
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _np_attention_context(x, mem, wq, wk, wv, heads, causal):
  """Concatenated heads before the output projection [B, L, heads*kv]."""
  kv = wq.shape[-1] // heads

  def split(t):
    return t.reshape(t.shape[:2] + (heads, kv))
  q, k, v = split(x @ wq), split(mem @ wk), split(mem @ wv)
  logits = np.einsum("bqhk,bmhk->bhqm", q, k)
  if causal:
    n = x.shape[1]
    logits = np.where(np.arange(n)[None, :] <= np.arange(n)[:, None], logits,
                      -1e9)
  o = np.einsum("bhqm,bmhk->bqhk", _softmax(logits), v)
  return o.reshape(o.shape[:2] + (heads * kv,))


LAYERS = {
    "drd": lambda: fx.DenseReluDense(hidden_size=FF, num_blocks=4),
    "gated": lambda: fx.DenseReluDense(hidden_size=FF,
                                       activation=["gelu", "linear"],
                                       num_blocks=4),
    "self": lambda: fx.SelfAttention(num_heads=2, key_value_size=4,
                                     num_blocks=4),
    "encdec": lambda: fx.EncDecAttention(num_heads=2, key_value_size=4,
                                         num_blocks=4),
}


@meshes.parametrize(meshes.FIXUP_LAYERS, "mesh_layout")
def test_zero_output_at_init_and_output_projection_gradients(mesh_layout):
  names = []
  wo_names = {"drd": "drd/wo/kernel", "gated": "gated/wo/kernel",
              "self": "self/o", "encdec": "encdec/o"}

  def build(mesh):
    x = _imp(mesh, X, [BATCH, LENGTH, D_MODEL])
    g = _imp(mesh, G, [BATCH, LENGTH, D_MODEL])
    ctx = _context(mesh)
    outs = []
    for key in LAYERS:
      with tf1.variable_scope(key):
        outs.append(LAYERS[key]().call(ctx, x))
    loss = mtf.reduce_sum(mtf.add_n([y * g for y in outs]))
    var = mesh.graph.name_to_variable
    grads = mtf.gradients([loss], [var[wo_names[k]].outputs[0]
                                   for k in LAYERS])
    names[:] = [v.name for v in mesh.graph.all_variables]
    return outs + grads + [v.outputs[0] for v in mesh.graph.all_variables]
  results = mtu.run_program(build, *mesh_layout)
  n = len(LAYERS)
  outs, grads = results[:n], results[n:2 * n]
  v = dict(zip(names, results[2 * n:]))
  for key, y in zip(LAYERS, outs):
    assert y.shape == X.shape
    np.testing.assert_array_equal(y, 0.0, err_msg=key)
    np.testing.assert_array_equal(v[wo_names[key]], 0.0, err_msg=key)
  h = np.maximum(X @ v["drd/wi/kernel"], 0)
  gelu = lambda t: 0.5 * t * (1 + np.tanh(  # noqa: E731
      np.sqrt(2 / np.pi) * (t + 0.044715 * t ** 3)))
  h_gated = gelu(X @ v["gated/wi_0/kernel"]) * (X @ v["gated/wi_1/kernel"])
  ctx_self = _np_attention_context(X, X, v["self/q"], v["self/k"],
                                   v["self/v"], 2, causal=True)
  ctx_encdec = _np_attention_context(X, ENC, v["encdec/q"], v["encdec/k"],
                                     v["encdec/v"], 2, causal=False)
  for key, hidden, grad in zip(LAYERS, (h, h_gated, ctx_self, ctx_encdec),
                               grads):
    expected = np.einsum("blf,bld->fd", hidden, G)
    assert np.abs(grad).max() > 0, key
    np.testing.assert_allclose(grad, expected, rtol=2e-3, atol=2e-4,
                               err_msg=key)


def test_inner_projections_scaled_by_num_blocks():
  def build(mesh):
    ctx = _context(mesh)
    d_model = mtf.Dimension("d_model", 64)
    big = _imp(mesh, np.zeros((B, L, 64), np.float32),
               [BATCH, LENGTH, d_model])
    ctx.model = types.SimpleNamespace(**dict(vars(_model()),
                                             model_dim=d_model))
    for blocks in (1, 16):
      with tf1.variable_scope("drd_%d" % blocks):
        fx.DenseReluDense(hidden_size=64, num_blocks=blocks).call(ctx, big)
      with tf1.variable_scope("att_%d" % blocks):
        fx.SelfAttention(num_heads=4, key_value_size=16,
                         num_blocks=blocks).call(ctx, big)
    build.names = [v.name for v in mesh.graph.all_variables]
    return [v.outputs[0] for v in mesh.graph.all_variables]
  values = mtu.run_program(build)
  v = dict(zip(build.names, values))
  ratio = lambda name: (v[name % 1].std() /  # noqa: E731
                        v[name % 16].std())
  assert 3.4 < ratio("drd_%d/wi/kernel") < 4.7
  assert 3.4 < ratio("att_%d/v") < 4.7
  assert 0.85 < ratio("att_%d/q") < 1.18
  assert 0.85 < ratio("att_%d/k") < 1.18
  # Unscaled: the usual initializers.
  assert abs(v["att_1/v"].std() / 64 ** -0.5 - 1) < 0.15
  np.testing.assert_array_equal(v["drd_16/wo/kernel"], 0.0)


def test_fixup_scale_factor():
  assert fx.fixup_scale_factor(16) == pytest.approx(0.25)
  assert fx.fixup_scale_factor(16, 3) == pytest.approx(0.5)
  assert fx.fixup_scale_factor(1) == 1.0
  with pytest.raises(ValueError, match="num_blocks"):
    fx.fixup_scale_factor(0)
  with pytest.raises(ValueError, match="branch_depth"):
    fx.fixup_scale_factor(4, 1)


def test_scalar_sublayers_scale_and_shift():
  def build(mesh):
    x = _imp(mesh, X, [BATCH, LENGTH, D_MODEL])
    g = _imp(mesh, G, [BATCH, LENGTH, D_MODEL])
    ctx = _context(mesh)
    scaled = fx.sublayer_fixup_scale(x, None, ctx)
    shifted = fx.sublayer_fixup_shift(x, None, ctx)
    shifted2 = fx.sublayer_fixup_shift(x * 2.0, None, ctx, name="other_bias")
    var = mesh.graph.name_to_variable
    scale, bias = var["fixup_scale"].outputs[0], var["fixup_bias"].outputs[0]
    loss = mtf.reduce_sum((scaled + shifted + shifted2) * g)
    grads = mtf.gradients([loss], [scale, bias,
                                   var["other_bias"].outputs[0]])
    return [scaled, shifted, shifted2, scale, bias] + grads
  scaled, shifted, shifted2, scale, bias, g_scale, g_bias, g_other = (
      mtu.run_program(build))
  assert scale.shape == () and bias.shape == ()
  assert scale == 1.0 and bias == 0.0
  np.testing.assert_allclose(scaled, X)
  np.testing.assert_allclose(shifted, X)
  np.testing.assert_allclose(shifted2, 2 * X)
  # d/ds sum(s x g) = sum(x g); d/db sum((x + b) g) = sum(g).
  np.testing.assert_allclose(g_scale, np.sum(X * G), rtol=1e-4)
  np.testing.assert_allclose(g_bias, np.sum(G), rtol=1e-4)
  np.testing.assert_allclose(g_other, np.sum(G), rtol=1e-4)


def test_layer_stack_with_fixup_sublayers_is_identity_at_init():
  layer = fx.DenseReluDense(hidden_size=FF, num_blocks=2)
  layer.set_name("layer_000")
  attention = fx.SelfAttention(num_heads=2, key_value_size=4, num_blocks=2)
  attention.set_name("layer_001")
  stack = transformer_lib.LayerStack(
      [layer, attention], sublayers_initial=[],
      sublayers_per_layer=[fx.sublayer_fixup_shift,
                           transformer_lib.sublayer_call_layer,
                           fx.sublayer_fixup_scale,
                           transformer_lib.sublayer_residual],
      sublayers_final=[])

  def build(mesh):
    with tf1.variable_scope("encoder"):
      y = stack.call(_context(mesh, mode="eval"),
                     _imp(mesh, X, [BATCH, LENGTH, D_MODEL]))
    build.names = sorted(mesh.graph.name_to_variable)
    return [y]
  y, = mtu.run_program(build, "rows:2;cols:2", "batch:rows;heads:cols")
  np.testing.assert_allclose(y, X, rtol=1e-6)
  for name in ("encoder/layer_000/fixup_bias", "encoder/layer_000/fixup_scale",
               "encoder/layer_000/DenseReluDense/wi/kernel",
               "encoder/layer_001/SelfAttention/o"):
    assert name in build.names


def test_num_blocks_is_a_required_gin_parameter():
  with pytest.raises(Exception, match="num_blocks"):
    fx.DenseReluDense(hidden_size=FF)
  with gin.unlock_config():
    gin.parse_config("""
        mesh_tensorflow.transformer.fixup_layers.DenseReluDense.num_blocks = 6
        mesh_tensorflow.transformer.fixup_layers.SelfAttention.num_blocks = 7
        mesh_tensorflow.transformer.fixup_layers.EncDecAttention.num_blocks = 8
        mesh_tensorflow.transformer.fixup_layers.sublayer_fixup_shift.name = "b"
    """)
  try:
    assert fx.DenseReluDense().num_blocks == 6
    assert fx.SelfAttention().num_blocks == 7
    assert fx.EncDecAttention(num_heads=2).num_blocks == 8
    assert fx.EncDecAttention(num_heads=2).num_heads == 2
  finally:
    gin.clear_config()
  import mesh_tensorflow.transformer.fixup_layers as aliased  # pylint: disable=g-import-not-at-top
  assert aliased is fx
