"""Tests for transformer/fixup_layers.py.

Fixup layers output zeros at initialization (zero output projections) on
every mesh and layout; the gradients of the output projections are nonzero
and equal numpy's (from the exported inner weights); the inner projections
have the Fixup-scaled Glorot / He variances; the scalar sublayers scale /
shift and create `fixup_scale_weight` (1) / `fixup_bias` (0).
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
    model_dim=D_MODEL,
    ensemble_dims=[],
    ensemble_dim=None,
    fully_autoregressive=True,
    autoregressive=True,
    layout=None,
    mesh_shape=None,
    max_length_dim=LENGTH,
  )


def _imp(mesh, value, dims):
  return mtf.import_tf_tensor(mesh, tf.constant(value), mtf.Shape(dims))


def _context(mesh, mode="train"):
  pos = mtf.range(mesh, LENGTH, tf.int32)
  return Context(
    _model(),
    mesh,
    [BATCH],
    LENGTH,
    F32,
    mode=mode,
    position=pos,
    read_priority=pos,
    write_priority=pos,
    encoder_output=_imp(mesh, ENC, [BATCH, MEMORY, D_MODEL]),
    losses=[],
  )


def _softmax(x):
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _np_attention_context(x, mem, wq, wk, wv, heads, causal, q_scale=1.0):
  """Concatenated heads before the output projection [B, L, heads*kv]."""
  kv = wq.shape[-1] // heads

  def split(t):
    return t.reshape(t.shape[:2] + (heads, kv))

  q, k, v = split(x @ wq * q_scale), split(mem @ wk), split(mem @ wv)
  logits = np.einsum("bqhk,bmhk->bhqm", q, k)
  if causal:
    n = x.shape[1]
    logits = np.where(
      np.arange(n)[None, :] <= np.arange(n)[:, None], logits, -1e9
    )
  o = np.einsum("bhqm,bmhk->bqhk", _softmax(logits), v)
  return o.reshape(o.shape[:2] + (heads * kv,))


LAYERS = {
  "drd": lambda: fx.DenseReluDenseFixup(hidden_size=FF, num_blocks=4),
  "gated": lambda: fx.DenseReluDenseFixup(
    hidden_size=FF,
    activation=["gelu", "linear"],
    num_blocks=4,
    default_init="glorot",
  ),
  "self": lambda: fx.SelfAttentionFixup(
    num_heads=2,
    key_value_size=4,
    num_blocks=4,
    fold_scaling_into_initializer=False,
  ),
}


@meshes.parametrize(meshes.FIXUP_LAYERS, "mesh_layout")
def test_zero_output_at_init_and_output_projection_gradients(mesh_layout):
  names = []
  wo_names = {
    "drd": "drd/wo/kernel",
    "gated": "gated/wo/kernel",
    "self": "self/o_fixup",
  }

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
    grads = mtf.gradients([loss], [var[wo_names[k]].outputs[0] for k in LAYERS])
    names[:] = [v.name for v in mesh.graph.all_variables]
    return outs + grads + [v.outputs[0] for v in mesh.graph.all_variables]

  results = mtu.run_program(build, *mesh_layout)
  n = len(LAYERS)
  outs, grads = results[:n], results[n : 2 * n]
  v = dict(zip(names, results[2 * n :]))
  assert sorted(n for n in v if n.startswith("drd/")) == [
    "drd/shift",
    "drd/wi/kernel",
    "drd/wo/kernel",
  ]
  assert sorted(n for n in v if n.startswith("self/")) == [
    "self/k_fixup",
    "self/o_fixup",
    "self/q_fixup",
    "self/v_fixup",
  ]
  for key, y in zip(LAYERS, outs):
    assert y.shape == X.shape
    np.testing.assert_array_equal(y, 0.0, err_msg=key)
    np.testing.assert_array_equal(v[wo_names[key]], 0.0, err_msg=key)
  assert v["drd/shift"].shape == (1,) and v["drd/shift"][0] == 0.0
  h = np.maximum(X @ v["drd/wi/kernel"], 0)
  gelu = lambda t: (
    0.5
    * t
    * (
      1
      + np.tanh(  # noqa: E731
        np.sqrt(2 / np.pi) * (t + 0.044715 * t**3)
      )
    )
  )
  h_gated = gelu(X @ v["gated/wi_0/kernel"]) * (X @ v["gated/wi_1/kernel"])
  ctx_self = _np_attention_context(
    X,
    X,
    v["self/q_fixup"],
    v["self/k_fixup"],
    v["self/v_fixup"],
    2,
    causal=True,
    q_scale=4**-0.5,
  )
  for key, hidden, grad in zip(LAYERS, (h, h_gated, ctx_self), grads):
    expected = np.einsum("blf,bld->fd", hidden, G)
    assert np.abs(grad).max() > 0, key
    np.testing.assert_allclose(
      grad, expected, rtol=2e-3, atol=2e-4, err_msg=key
    )


def test_initializer_variances():
  """He: Var = 2 s / fan_in; Glorot: Var = s / fan_avg (uniform draws).

  s = 1 / num_blocks for DenseReluDenseFixup, num_blocks^(-1/3) for
  attention.
  """
  blocks = 8

  def build(mesh):
    ctx = _context(mesh)
    d_model = mtf.Dimension("d_model", 64)
    big = _imp(mesh, np.zeros((B, L, 64), np.float32), [BATCH, LENGTH, d_model])
    ctx.model = types.SimpleNamespace(**dict(vars(_model()), model_dim=d_model))
    for init in ("he", "glorot"):
      with tf1.variable_scope("drd_" + init):
        fx.DenseReluDenseFixup(
          hidden_size=128, num_blocks=blocks, default_init=init
        ).call(ctx, big)
      with tf1.variable_scope("att_" + init):
        fx.SelfAttentionFixup(
          num_heads=4,
          key_value_size=16,
          num_blocks=blocks,
          default_init=init,
          fold_scaling_into_initializer=False,
        ).call(ctx, big)
    build.names = [v.name for v in mesh.graph.all_variables]
    return [v.outputs[0] for v in mesh.graph.all_variables]

  values = mtu.run_program(build)
  v = dict(zip(build.names, values))
  expected = {
    "drd_he/wi/kernel": 2.0 / blocks / 64,
    "drd_glorot/wi/kernel": 1.0 / blocks / ((64 + 128) / 2),
    "att_he/q_fixup": 2.0 * blocks ** (-1 / 3) / 64,
    "att_glorot/v_fixup": blocks ** (-1 / 3) / ((64 + 64) / 2),
  }
  for name, var in expected.items():
    assert abs(v[name].var() / var - 1) < 0.12, name
    limit = np.sqrt(3 * var)
    assert np.abs(v[name]).max() <= limit * (1 + 1e-6), name
  np.testing.assert_array_equal(v["att_he/o_fixup"], 0.0)
  np.testing.assert_array_equal(v["drd_glorot/wo/kernel"], 0.0)


def test_bad_initialization_arguments():
  with pytest.raises(ValueError, match="Unsupported default initialization"):
    fx.DenseReluDenseFixup(num_blocks=2, default_init="lecun")

  def build(mesh):
    layer = fx.SelfAttentionFixup(num_heads=2, key_value_size=4, num_blocks=2)
    return [layer.call(_context(mesh), _imp(mesh, X, [BATCH, LENGTH, D_MODEL]))]

  with pytest.raises(ValueError, match="fold_scaling_into_initializer"):
    mtu.run_program(build)


def test_enc_dec_attention_fixup_is_enc_dec_attention():
  def build(mesh):
    x = _imp(mesh, X, [BATCH, LENGTH, D_MODEL])
    layer = fx.EncDecAttentionFixup(num_heads=2, key_value_size=4)
    with tf1.variable_scope("encdec"):
      y = layer.call(_context(mesh), x)
    build.names = [v.name for v in mesh.graph.all_variables]
    return [y] + [v.outputs[0] for v in mesh.graph.all_variables]

  y, *values = mtu.run_program(build)
  v = dict(zip(build.names, values))
  assert sorted(v) == ["encdec/k", "encdec/o", "encdec/q", "encdec/v"]
  ctx = _np_attention_context(
    X, ENC, v["encdec/q"], v["encdec/k"], v["encdec/v"], 2, causal=False
  )
  np.testing.assert_allclose(
    y, ctx @ v["encdec/o"].reshape(8, D), rtol=1e-4, atol=1e-5
  )


def test_single_scalar_bias_and_dense_product_fixup():
  def build(mesh):
    x = _imp(mesh, X, [BATCH, LENGTH, D_MODEL])
    bias = fx.get_single_scalar_bias(x, "b")
    y = fx.dense_product_fixup(
      x,
      [D_MODEL],
      [mtf.Dimension("d_ff", FF)],
      tf1.constant_initializer(0.5),
      ["linear", "relu"],
      name="dp",
      use_bias=False,
    )
    return [bias, y]

  bias, y = mtu.run_program(build)
  np.testing.assert_array_equal(bias, [0.0])
  s = X.sum(-1, keepdims=True) * 0.5
  np.testing.assert_allclose(
    y, np.broadcast_to(s * np.maximum(s, 0), (B, L, FF)), rtol=1e-5
  )


def test_scalar_sublayers_scale_and_shift():
  def build(mesh):
    x = _imp(mesh, X, [BATCH, LENGTH, D_MODEL])
    g = _imp(mesh, G, [BATCH, LENGTH, D_MODEL])
    ctx = _context(mesh)
    scaled = fx.sublayer_fixup_scale(x, None, ctx)
    shifted = fx.sublayer_fixup_shift(x, None, ctx)
    var = mesh.graph.name_to_variable
    scale = var["fixup_scale_weight"].outputs[0]
    bias = var["fixup_bias"].outputs[0]
    loss = mtf.reduce_sum((scaled + shifted) * g)
    grads = mtf.gradients([loss], [scale, bias])
    return [scaled, shifted, scale, bias] + grads

  scaled, shifted, scale, bias, g_scale, g_bias = mtu.run_program(build)
  np.testing.assert_array_equal(scale, [1.0])
  np.testing.assert_array_equal(bias, [0.0])
  np.testing.assert_allclose(scaled, X)
  np.testing.assert_allclose(shifted, X)
  # d/ds sum(s x g) = sum(x g); d/db sum((x + b) g) = sum(g).
  np.testing.assert_allclose(g_scale, [np.sum(X * G)], rtol=1e-4)
  np.testing.assert_allclose(g_bias, [np.sum(G)], rtol=1e-4)


def test_layer_stack_with_fixup_sublayers_is_identity_at_init():
  layer = fx.DenseReluDenseFixup(hidden_size=FF, num_blocks=2)
  layer.set_name("layer_000")
  attention = fx.SelfAttentionFixup(
    num_heads=2,
    key_value_size=4,
    num_blocks=2,
    fold_scaling_into_initializer=False,
  )
  attention.set_name("layer_001")
  stack = transformer_lib.LayerStack(
    [layer, attention],
    sublayers_initial=[],
    sublayers_per_layer=[
      fx.sublayer_fixup_shift,
      transformer_lib.sublayer_call_layer,
      fx.sublayer_fixup_scale,
      transformer_lib.sublayer_residual,
    ],
    sublayers_final=[],
  )

  def build(mesh):
    with tf1.variable_scope("encoder"):
      y = stack.call(
        _context(mesh, mode="eval"), _imp(mesh, X, [BATCH, LENGTH, D_MODEL])
      )
    build.names = sorted(mesh.graph.name_to_variable)
    return [y]

  (y,) = mtu.run_program(build, "rows:2;cols:2", "batch:rows;heads:cols")
  np.testing.assert_allclose(y, X, rtol=1e-6)
  for name in (
    "encoder/layer_000/fixup_bias",
    "encoder/layer_000/fixup_scale_weight",
    "encoder/layer_000/DenseReluDenseFixup/wi/kernel",
    "encoder/layer_001/SelfAttentionFixup/o_fixup",
  ):
    assert name in build.names


def test_num_blocks_is_a_required_gin_parameter():
  with pytest.raises(Exception, match="num_blocks"):
    fx.DenseReluDenseFixup(hidden_size=FF)
  with gin.unlock_config():
    prefix = "mesh_tensorflow.transformer.fixup_layers."
    gin.parse_config(
      [
        prefix + "DenseReluDenseFixup.num_blocks = 6",
        prefix + "SelfAttentionFixup.num_blocks = 7",
        prefix + "EncDecAttentionFixup.num_heads = 2",
      ]
    )
  try:
    assert fx.SelfAttentionFixup().num_blocks == 7
    assert fx.EncDecAttentionFixup().num_heads == 2
    fx.DenseReluDenseFixup()
  finally:
    gin.clear_config()
  import mesh_tensorflow.transformer.fixup_layers as aliased  # pylint: disable=g-import-not-at-top

  assert aliased is fx
