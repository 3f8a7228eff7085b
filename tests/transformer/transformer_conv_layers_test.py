"""Tests for the causal convolution layers of conv_layers.py.

Each layer is checked against a numpy formulation computed from the layer's
own (randomly initialised, exported) variables; incremental decoding
("first_part" then one "incremental" step per position, in one mtf graph so
variables are shared) must reproduce the full forward pass; multi-device
runs must give the 1-device numbers.
"""

import types

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mesh_test_util as mtu
from tests import meshes
from transformer import transformer_layers
from transformer._src.layers import context as context_lib
from transformer._src.layers import conv_layers

tf1 = tf.compat.v1

B, L, D = 2, 6, 8
BATCH = mtf.Dimension("batch", B)
LENGTH = mtf.Dimension("length", L)
D_MODEL = mtf.Dimension("d_model", D)

_RNG = np.random.RandomState(3)
X = _RNG.normal(size=(B, L, D)).astype(np.float32)
INITIAL_POSITION = np.array([0, 2], np.int32)
NEG = -1e9


def _model():
  return types.SimpleNamespace(
      model_dim=D_MODEL, ensemble_dims=[], ensemble_dim=None,
      fully_autoregressive=True, autoregressive=True, layout=None,
      mesh_shape=None, max_length_dim=LENGTH)


def _context(mesh, mode="eval", **kwargs):
  return context_lib.Context(
      model=_model(), mesh=mesh, batch_dims=[BATCH], length_dim=LENGTH,
      variable_dtype=mtf.VariableDType(tf.float32), mode=mode, losses=[],
      **kwargs)


def _full(mesh, layer, x_np=X, **kwargs):
  x = mtf.import_tf_tensor(mesh, x_np, [BATCH, LENGTH, D_MODEL])
  return layer.call(_context(mesh, **kwargs), x)


def _decode(mesh, layer, x_np=X, initial_position=INITIAL_POSITION):
  """Full pass, first_part pass, then incremental steps at every position.

  Returns [full, first_part, step outputs stacked as [B, L, D] (zeros
  before initial_position)].
  """
  x = mtf.import_tf_tensor(mesh, x_np, [BATCH, LENGTH, D_MODEL])
  full = layer.call(_context(mesh), x)
  init = mtf.import_tf_tensor(mesh, initial_position, [BATCH])
  ctx = _context(mesh, mode="first_part", new_states=[],
                 initial_position=init, sequence_id=1)
  first = layer.call(ctx, x)
  states = ctx.new_states
  steps = []
  for t in range(L):
    pos = np.maximum(initial_position, t).astype(np.int32)
    x_t = mtf.import_tf_tensor(mesh, x_np[np.arange(B), pos],
                               [BATCH, D_MODEL])
    ctx = _context(mesh, mode="incremental", states=states, new_states=[],
                   position=mtf.import_tf_tensor(mesh, pos, [BATCH]))
    y_t = layer.call(ctx, x_t)
    assert y_t.shape == x_t.shape
    assert len(ctx.new_states) == len(states)
    # Step t only advances the sequences whose position is t.
    advance = mtf.import_tf_tensor(
        mesh, (pos == t).astype(np.float32), [BATCH])
    states = [advance * n + (1.0 - advance) * o
              for n, o in zip(ctx.new_states, states)]
    steps.append(y_t * advance)
  return [full, first, mtf.stack(steps, "length", axis=1)]


def _check_decoding(full, first, steps):
  np.testing.assert_allclose(first, full, rtol=1e-5, atol=1e-5)
  mask = (np.arange(L)[None, :] >= INITIAL_POSITION[:, None])[..., None]
  np.testing.assert_allclose(steps, full * mask, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------
# numpy references.


def _causal_window(x, k):
  """[B, L, D] -> [B, L, k, D]: slot i holds x[t - k + 1 + i] (0 before 0)."""
  padded = np.pad(x, [(0, 0), (k - 1, 0), (0, 0)])
  return np.stack([padded[:, i:i + L] for i in range(k)], axis=2)


def _softmax(x):
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _visible(k, sequence_id=None):
  """[B?, L, k]: slot i of position t is a real, same-sequence position."""
  t = np.arange(L)[:, None]
  vis = (t - (k - 1 - np.arange(k))[None, :]) >= 0
  if sequence_id is None:
    return vis[None]
  sid_w = _causal_window(sequence_id[..., None].astype(np.float32), k)[..., 0]
  return vis[None] & (sid_w == sequence_id[..., None])


# ----------------------------------------------------------------------------
# Conv1DLayer.


@pytest.mark.parametrize("activation,fn", [("linear", lambda y: y),
                                           ("relu", lambda y: np.maximum(y, 0))])
def test_conv1d_layer_is_numpy_causal_conv(activation, fn):
  layer = conv_layers.Conv1DLayer(filter_size=3, output_size=D,
                                  activation=activation)
  x2 = X.copy()
  x2[:, -1] += 1.0
  (y, y2), v = mtu.with_variables(lambda mesh: [_full(mesh, layer),
                                        _full(mesh, layer, x2)])()
  assert list(v) == ["conv1d/kernel"]
  kernel = v["conv1d/kernel"]
  assert kernel.shape == (1, 3, D, D)
  expected = np.einsum("blkd,kde->ble", _causal_window(X, 3), kernel[0])
  np.testing.assert_allclose(y, fn(expected), rtol=1e-5, atol=1e-5)
  # Causality: changing the last position changes nothing before it.
  np.testing.assert_allclose(y2[:, :-1], y[:, :-1], rtol=1e-6, atol=1e-6)
  assert not np.allclose(y2[:, -1], y[:, -1])


def test_conv1d_layer_output_size():
  layer = conv_layers.Conv1DLayer(filter_size=2, output_size=5)
  (y,), v = mtu.with_variables(lambda mesh: [_full(mesh, layer)])()
  assert y.shape == (B, L, 5)
  expected = np.einsum("blkd,kde->ble", _causal_window(X, 2),
                       v["conv1d/kernel"][0])
  np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)


def test_conv1d_layer_incremental_equals_full():
  layer = conv_layers.Conv1DLayer(filter_size=3, output_size=D)
  outs, v = mtu.with_variables(lambda mesh: _decode(mesh, layer))()
  assert list(v) == ["conv1d/kernel"]  # All passes share the variable.
  _check_decoding(*outs)


def test_conv1d_states_and_update_state():
  """first_part records x[i - k .. i - 1]; update_state shifts x in."""
  layer = conv_layers.Conv1DLayer(filter_size=3, output_size=D)

  def build(mesh):
    x = mtf.import_tf_tensor(mesh, X, [BATCH, LENGTH, D_MODEL])
    init = mtf.import_tf_tensor(mesh, np.array([1, 4], np.int32), [BATCH])
    ctx = _context(mesh, mode="first_part", new_states=[],
                   initial_position=init)
    layer.record_states_first_part_mode(ctx, x, 3)
    (state,) = ctx.new_states
    filter_dim = mtf.Dimension("length", 3)
    assert state.shape == mtf.Shape([BATCH, filter_dim, D_MODEL])
    x_new = mtf.import_tf_tensor(mesh, X[:, 0], [BATCH, D_MODEL])
    pos = mtf.constant(mesh, 1, shape=[BATCH], dtype=tf.int32)
    updated = layer.update_state(state, x_new, pos, filter_dim, tf.float32)
    return [state, updated]

  state, updated = mtu.run_program(build)
  expected = np.zeros((B, 3, D), np.float32)
  expected[0, 2] = X[0, 0]               # initial position 1: [0, 0, x0]
  expected[1] = X[1, 1:4]                # initial position 4: [x1, x2, x3]
  np.testing.assert_allclose(state, expected)
  shifted = np.concatenate([expected[:, 1:], np.zeros((B, 1, D))], axis=1)
  shifted[:, 1] += X[:, 0]
  np.testing.assert_allclose(updated, shifted)


def test_conv1d_layer_bad_arguments():
  def build(layer, mode="eval"):
    def fn(mesh):
      return [_full(mesh, layer, mode=mode)]
    return fn

  with pytest.raises(ValueError, match="Conv1DLayer: filter_size"):
    mtu.run_program(build(conv_layers.Conv1DLayer(0, D)))
  with pytest.raises(ValueError, match="Conv1DLayer: unknown activation"):
    mtu.run_program(build(conv_layers.Conv1DLayer(2, D, activation="x")))
  with pytest.raises(ValueError, match="initial_position"):
    mtu.run_program(build(conv_layers.Conv1DLayer(2, D), mode="first_part"))


# ----------------------------------------------------------------------------
# SeparableConv1DLayer.


def _separable_reference(x, v, lo, hi):
  prefix = "separable_conv1d/depthwise_conv_hack/depthwise_dense_%d/"
  padded = np.pad(x, [(0, 0), (max(0, -lo), max(0, hi)), (0, 0)])
  off = max(0, -lo)
  depthwise = v[prefix % 0 + "bias"]
  for i, r in enumerate(range(lo, hi + 1)):
    depthwise = depthwise + padded[:, off + r:off + r + L] * v[
        prefix % i + "kernel"]
  return (depthwise @ v["separable_conv1d/pointwise_dense/kernel"]
          + v["separable_conv1d/pointwise_dense/bias"])


@pytest.mark.parametrize("lo,hi", [(-2, 0), (-1, 1), (-3, -1)])
def test_separable_conv1d_layer_matches_numpy(lo, hi):
  layer = conv_layers.SeparableConv1DLayer(lo, hi, output_size=D,
                                           activation="tanh")
  (y,), v = mtu.with_variables(lambda mesh: [_full(mesh, layer)])()
  k = hi - lo + 1
  assert sorted(v) == sorted(
      ["separable_conv1d/depthwise_conv_hack/depthwise_dense_%d/kernel" % i
       for i in range(k)] +
      ["separable_conv1d/depthwise_conv_hack/depthwise_dense_0/bias",
       "separable_conv1d/pointwise_dense/kernel",
       "separable_conv1d/pointwise_dense/bias"])
  np.testing.assert_allclose(y, np.tanh(_separable_reference(X, v, lo, hi)),
                             rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("lo,hi", [(-2, 0), (-3, -1)])
def test_separable_conv1d_layer_incremental_equals_full(lo, hi):
  layer = conv_layers.SeparableConv1DLayer(lo, hi, output_size=D)
  outs, v = mtu.with_variables(lambda mesh: _decode(mesh, layer))()
  assert len(v) == (hi - lo + 1) + 3
  _check_decoding(*outs)


def test_separable_conv1d_layer_rejects_future_when_decoding():
  layer = conv_layers.SeparableConv1DLayer(-1, 1, output_size=D)
  with pytest.raises(ValueError, match="max_relative_pos 1 > 0"):
    mtu.run_program(lambda mesh: _decode(mesh, layer))


# ----------------------------------------------------------------------------
# Convolution-style local attention.


def _v_o(x_w, x, v, weights):
  """weights [B, L, H, k] -> output via values/output projections."""
  val = np.einsum("blkd,hde->blkhe", x_w, v["v"])
  out = np.einsum("blhk,blkhe->blhe", weights, val)
  return np.einsum("blhe,hde->bld", out, v["o"])


def _local_attn_reference(x, v, k, sequence_id=None):
  x_w = _causal_window(x, k)
  q = np.einsum("bld,hde->blhe", x, v["q"])
  kk = np.einsum("blkd,hde->blkhe", x_w, v["k"])
  logits = np.einsum("blhe,blkhe->blhk", q, kk)
  vis = _visible(k, sequence_id)[:, :, None, :]
  return _v_o(x_w, x, v, _softmax(np.where(vis, logits, NEG)))


def _lightweight_reference(x, v, k):
  x_w = _causal_window(x, k)
  logits = np.broadcast_to(v["lightweight_kernel"][None, None],
                           (B, L) + v["lightweight_kernel"].shape)
  vis = _visible(k)[:, :, None, :]
  return _v_o(x_w, x, v, _softmax(np.where(vis, logits, NEG)))


def _dynamic_reference(x, v, k):
  x_w = _causal_window(x, k)
  logits = np.einsum("bld,dhk->blhk", x, v["dynamic_kernel"])
  vis = _visible(k)[:, :, None, :]
  return _v_o(x_w, x, v, _softmax(np.where(vis, logits, NEG)))


ATTN_CASES = [
    (conv_layers.Conv1DLocalAttn, _local_attn_reference, ["q", "k", "v", "o"]),
    (conv_layers.LightweightConv1DLocalAttn, _lightweight_reference,
     ["v", "o", "lightweight_kernel"]),
    (conv_layers.DynamicConv1DLocalAttn, _dynamic_reference,
     ["v", "o", "dynamic_kernel"]),
]
_ATTN_IDS = [c[0].__name__ for c in ATTN_CASES]


def _attn_layer(cls, **kwargs):
  return cls(kernel_size=3, num_heads=2, key_value_size=4, **kwargs)


@pytest.mark.parametrize("cls,reference,var_names", ATTN_CASES,
                         ids=_ATTN_IDS)
def test_local_conv_attention_matches_numpy(cls, reference, var_names):
  layer = _attn_layer(cls)
  (y,), v = mtu.with_variables(lambda mesh: [_full(mesh, layer)])()
  assert sorted(v) == sorted(var_names)
  np.testing.assert_allclose(y, reference(X, v, 3), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cls,reference,var_names", ATTN_CASES,
                         ids=_ATTN_IDS)
def test_local_conv_attention_incremental_equals_full(cls, reference,
                                                      var_names):
  del reference, var_names
  outs, _ = mtu.with_variables(lambda mesh: _decode(mesh, _attn_layer(cls)))()
  _check_decoding(*outs)


def test_local_attention_masks_other_packed_sequences():
  sequence_id = np.array([[1, 1, 1, 2, 2, 2], [1, 1, 2, 2, 2, 0]], np.int32)
  layer = _attn_layer(conv_layers.Conv1DLocalAttn)

  def build(mesh):
    sid = mtf.import_tf_tensor(mesh, sequence_id, [BATCH, LENGTH])
    return [_full(mesh, layer, sequence_id=sid)]

  (y,), v = mtu.with_variables(build)()
  np.testing.assert_allclose(y, _local_attn_reference(X, v, 3, sequence_id),
                             rtol=1e-5, atol=1e-5)
  # Without the mask the answer differs (the test can fail).
  assert not np.allclose(y, _local_attn_reference(X, v, 3))


def test_local_conv_attention_dropout_only_in_training():
  layer = _attn_layer(conv_layers.LightweightConv1DLocalAttn,
                      dropout_rate=0.5)
  (y_eval, y_train), _ = mtu.with_variables(lambda mesh: [
      _full(mesh, layer), _full(mesh, layer, mode="train")])()
  assert not np.allclose(y_eval, y_train)
  (y_eval2,), v = mtu.with_variables(lambda mesh: [_full(mesh, layer)])()
  np.testing.assert_allclose(y_eval2, _lightweight_reference(X, v, 3),
                             rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------
# LocalConvAttnBlock.


@pytest.mark.parametrize("attention_type,cls,reference", [
    ("lightweight_conv", "LightweightConv1DLocalAttn", _lightweight_reference),
    ("dynamic_conv", "DynamicConv1DLocalAttn", _dynamic_reference),
    ("local_attention", "Conv1DLocalAttn", _local_attn_reference),
])
def test_local_conv_attn_block(attention_type, cls, reference):
  layer = conv_layers.LocalConvAttnBlock(
      kernel_size=3, num_heads=2, key_value_size=4,
      attention_type=attention_type)
  outs, v = mtu.with_variables(lambda mesh: _decode(mesh, layer))()
  _check_decoding(*outs)
  h = (X @ v["glu_0/kernel"]) * (1.0 / (1.0 + np.exp(-(X @ v["glu_1/kernel"]))))
  inner = {n[len(cls) + 1:]: a for n, a in v.items() if n.startswith(cls)}
  assert len(inner) == len(v) - 2
  np.testing.assert_allclose(outs[0], reference(h, inner, 3), rtol=1e-5,
                             atol=1e-5)


def test_local_conv_attn_block_unknown_type():
  layer = conv_layers.LocalConvAttnBlock(attention_type="fft")
  with pytest.raises(ValueError, match="attention_type 'fft'"):
    mtu.run_program(lambda mesh: [_full(mesh, layer)])


# ----------------------------------------------------------------------------
# Meshes and layouts.


def _mesh_program(mesh):
  x = mtf.import_tf_tensor(mesh, X, [BATCH, LENGTH, D_MODEL])
  outs = []
  layers = [conv_layers.Conv1DLayer(3, D),
            conv_layers.SeparableConv1DLayer(-2, 0, D),
            conv_layers.LocalConvAttnBlock(3, 4, 4,
                                           attention_type="dynamic_conv"),
            conv_layers.Conv1DLocalAttn(3, 4, 4)]
  for i, layer in enumerate(layers):
    with tf1.variable_scope("layer_%d" % i):
      outs.append(layer.call(_context(mesh), x))
  return outs


@meshes.parametrize(meshes.TRANSFORMER_CONV_LAYERS)
def test_meshes_and_layouts(mesh_shape, layout):
  # Each run draws its own initial values: check every layer against numpy
  # computed from the variables this run exported.
  outs, v = mtu.with_variables(_mesh_program)(mesh_shape, layout, mode="function")
  conv = np.einsum("blkd,kde->ble", _causal_window(X, 3),
                   v["layer_0/conv1d/kernel"][0])
  np.testing.assert_allclose(outs[0], conv, rtol=1e-5, atol=1e-5)
  sep = {n[len("layer_1/"):]: a for n, a in v.items()
         if n.startswith("layer_1/")}
  np.testing.assert_allclose(outs[1], _separable_reference(X, sep, -2, 0),
                             rtol=1e-5, atol=1e-5)
  block = {n[len("layer_2/"):]: a for n, a in v.items()
           if n.startswith("layer_2/")}
  h = (X @ block["glu_0/kernel"]) * (
      1.0 / (1.0 + np.exp(-(X @ block["glu_1/kernel"]))))
  inner = {n[len("DynamicConv1DLocalAttn/"):]: a for n, a in block.items()
           if n.startswith("DynamicConv1DLocalAttn/")}
  np.testing.assert_allclose(outs[2], _dynamic_reference(h, inner, 3),
                             rtol=1e-5, atol=1e-5)
  attn = {n[len("layer_3/"):]: a for n, a in v.items()
          if n.startswith("layer_3/")}
  np.testing.assert_allclose(outs[3], _local_attn_reference(X, attn, 3),
                             rtol=1e-5, atol=1e-5)


def test_exports_and_gin():
  for name in conv_layers.__all__:
    assert getattr(transformer_layers, name) is getattr(conv_layers, name)
  import gin  # pylint: disable=g-import-not-at-top
  gin.clear_config()
  try:
    gin.parse_config(
        "mesh_tensorflow.transformer.transformer_layers.Conv1DLayer"
        ".filter_size = 4\n"
        "mesh_tensorflow.transformer.transformer_layers.Conv1DLayer"
        ".output_size = 8")
    layer = conv_layers.Conv1DLayer()  # pylint: disable=no-value-for-parameter
  finally:
    gin.clear_config()
  assert (layer._filter_size, layer._output_size) == (4, 8)  # pylint: disable=protected-access
