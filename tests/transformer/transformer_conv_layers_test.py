"""Tests for the convolution layers of conv_layers.py.

Each layer is checked against a numpy formulation computed from the layer's
own (randomly initialised, exported) variables; incremental decoding
("first_part" then one "incremental" step per position, in one mtf graph so
variables are shared) must reproduce the causal computation; multi-device
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


def _context(mesh, mode="eval", **kwargs):
  return context_lib.Context(
    model=_model(),
    mesh=mesh,
    batch_dims=[BATCH],
    length_dim=LENGTH,
    variable_dtype=mtf.VariableDType(tf.float32),
    mode=mode,
    losses=[],
    **kwargs,
  )


def _call(layer, context, x):
  """layer.call in the variable scope "layer", as in a model."""
  with tf1.variable_scope("layer"):
    return layer.call(context, x)


def _with_variables(build_fn):
  """Runs build_fn; returns its outputs and the variables under "layer/"."""
  outs, v = mtu.with_variables(build_fn)()
  return outs, {
    n[len("layer/") :]: a for n, a in v.items() if n.startswith("layer/")
  }


def _full(mesh, layer, x_np=X, **kwargs):
  x = mtf.import_tf_tensor(mesh, x_np, [BATCH, LENGTH, D_MODEL])
  return _call(layer, _context(mesh, **kwargs), x)


def _decode(mesh, layer, x_np=X, initial_position=INITIAL_POSITION):
  """Full pass, first_part pass, then incremental steps at every position.

  Returns [full, first_part, step outputs stacked as [B, L, D] (zeros
  before initial_position)].
  """
  x = mtf.import_tf_tensor(mesh, x_np, [BATCH, LENGTH, D_MODEL])
  full = _call(layer, _context(mesh), x)
  init = mtf.import_tf_tensor(mesh, initial_position, [BATCH])
  ctx = _context(
    mesh, mode="first_part", new_states=[], initial_position=init, sequence_id=1
  )
  first = _call(layer, ctx, x)
  states = ctx.new_states
  steps = []
  for t in range(L):
    pos = np.maximum(initial_position, t).astype(np.int32)
    x_t = mtf.import_tf_tensor(mesh, x_np[np.arange(B), pos], [BATCH, D_MODEL])
    ctx = _context(
      mesh,
      mode="incremental",
      states=states,
      new_states=[],
      position=mtf.import_tf_tensor(mesh, pos, [BATCH]),
    )
    y_t = _call(layer, ctx, x_t)
    assert y_t.shape == x_t.shape
    assert len(ctx.new_states) == len(states)
    # Step t only advances the sequences whose position is t.
    advance = mtf.import_tf_tensor(mesh, (pos == t).astype(np.float32), [BATCH])
    states = [
      advance * n + (1.0 - advance) * o for n, o in zip(ctx.new_states, states)
    ]
    steps.append(y_t * advance)
  return [full, first, mtf.stack(steps, "length", axis=1)]


def _check_decoding(full, first, steps, causal=None):
  """first_part == full pass; steps == the causal result (default: full)."""
  causal = full if causal is None else causal
  np.testing.assert_allclose(first, full, rtol=1e-5, atol=1e-5)
  mask = (np.arange(L)[None, :] >= INITIAL_POSITION[:, None])[..., None]
  np.testing.assert_allclose(steps, causal * mask, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------
# numpy references.


def _causal_window(x, k):
  """[B, L, D] -> [B, L, k, D]: slot i holds x[t - k + 1 + i] (0 before 0)."""
  padded = np.pad(x, [(0, 0), (k - 1, 0), (0, 0)])
  return np.stack([padded[:, i : i + L] for i in range(k)], axis=2)


def _same_window(x, k):
  """[B, L, D] -> [B, L, k, D], "SAME" padding.

  Slot i holds x[t - (k - 1) // 2 + i] (0 outside the sequence).
  """
  left = (k - 1) // 2
  padded = np.pad(x, [(0, 0), (left, k - 1 - left), (0, 0)])
  return np.stack([padded[:, i : i + L] for i in range(k)], axis=2)


def _softmax(x, axis=-1):
  e = np.exp(x - x.max(axis, keepdims=True))
  return e / e.sum(axis, keepdims=True)


def _sigmoid(x):
  return 1.0 / (1.0 + np.exp(-x))


_DEPTHWISE = "separable_conv1d/depthwise_conv_hack/depthwise_dense_%d/"


def _separable_reference(x, v, lo, hi, kernels=None):
  """mtf.layers.separable_conv1d on x; kernels[i] default to the variables."""
  if kernels is None:
    kernels = [v[_DEPTHWISE % i + "kernel"] for i in range(hi - lo + 1)]
  off = max(0, -lo)
  padded = np.pad(x, [(0, 0), (off, max(0, hi)), (0, 0)])
  depthwise = v[_DEPTHWISE % 0 + "bias"]
  for i, r in enumerate(range(lo, hi + 1)):
    depthwise = depthwise + padded[:, off + r : off + r + L] * kernels[i]
  return (
    depthwise @ v["separable_conv1d/pointwise_dense/kernel"]
    + v["separable_conv1d/pointwise_dense/bias"]
  )


def _lightweight_kernels(x, v, k, unique):
  del x
  stacked = np.stack(
    [
      np.tile(v["lightwt_depthwise_dense_%d/kernel" % i], unique)
      for i in range(k)
    ]
  )
  return list(_softmax(stacked, axis=0))


def _dynamic_kernels(x, v, k, unique):
  stacked = np.stack(
    [
      np.tile(
        x @ v["dyn_conv_depthwise_dense_%d/kernel" % i]
        + v["dyn_conv_depthwise_dense_%d/bias" % i],
        [1, 1, unique],
      )
      for i in range(k)
    ]
  )
  return list(_softmax(stacked, axis=0))


# ----------------------------------------------------------------------------
# Conv1DLayer.


@pytest.mark.parametrize(
  "activation,fn",
  [("linear", lambda y: y), ("relu", lambda y: np.maximum(y, 0))],
)
def test_conv1d_layer_is_numpy_same_conv(activation, fn):
  layer = conv_layers.Conv1DLayer(
    filter_size=3, output_size=5, activation=activation
  )
  (y,), v = _with_variables(lambda mesh: [_full(mesh, layer)])
  assert list(v) == ["conv2d/kernel"]
  kernel = v["conv2d/kernel"]
  assert kernel.shape == (1, 3, D, 5)
  assert layer.filter_size == 3
  expected = np.einsum("blkd,kde->ble", _same_window(X, 3), kernel[0])
  np.testing.assert_allclose(y, fn(expected), rtol=1e-5, atol=1e-5)


def test_conv1d_layer_masks_padding_inputs():
  """Positions whose context.inputs is 0 are zeroed before convolving."""
  inputs = np.array([[3, 4, 5, 0, 0, 0], [1, 2, 3, 4, 5, 6]], np.int32)
  layer = conv_layers.Conv1DLayer(filter_size=2, output_size=D)

  def build(mesh):
    ids = mtf.import_tf_tensor(mesh, inputs, [BATCH, LENGTH])
    return [_full(mesh, layer, inputs=ids)]

  (y,), v = _with_variables(build)
  masked = X * (inputs != 0)[..., None]
  expected = np.einsum(
    "blkd,kde->ble", _same_window(masked, 2), v["conv2d/kernel"][0]
  )
  np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)


def test_conv1d_layer_incremental_is_causal_conv():
  layer = conv_layers.Conv1DLayer(filter_size=3, output_size=D)
  outs, v = _with_variables(lambda mesh: _decode(mesh, layer))
  assert list(v) == ["conv2d/kernel"]  # All passes share the variable.
  causal = np.einsum(
    "blkd,kde->ble", _causal_window(X, 3), v["conv2d/kernel"][0]
  )
  _check_decoding(*outs, causal=causal)


def test_conv1d_states_and_update_state():
  """first_part records x[i - k .. i - 1]; update_state shifts x in."""
  layer = conv_layers.Conv1DLayer(filter_size=3, output_size=D)

  def build(mesh):
    x = mtf.import_tf_tensor(mesh, X, [BATCH, LENGTH, D_MODEL])
    init = mtf.import_tf_tensor(mesh, np.array([1, 4], np.int32), [BATCH])
    ctx = _context(
      mesh, mode="first_part", new_states=[], initial_position=init
    )
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
  expected[0, 2] = X[0, 0]  # initial position 1: [0, 0, x0]
  expected[1] = X[1, 1:4]  # initial position 4: [x1, x2, x3]
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


@pytest.mark.parametrize("lo,hi", [(-2, 0), (-1, 1), (-3, -1)])
def test_separable_conv1d_layer_matches_numpy(lo, hi):
  layer = conv_layers.SeparableConv1DLayer(
    lo, hi, output_size=D, activation="tanh"
  )
  (y,), v = _with_variables(lambda mesh: [_full(mesh, layer)])
  k = hi - lo + 1
  assert layer.filter_size == k
  assert sorted(v) == sorted(
    [_DEPTHWISE % i + "kernel" for i in range(k)]
    + [
      _DEPTHWISE % 0 + "bias",
      "separable_conv1d/pointwise_dense/kernel",
      "separable_conv1d/pointwise_dense/bias",
    ]
  )
  np.testing.assert_allclose(
    y, np.tanh(_separable_reference(X, v, lo, hi)), rtol=1e-5, atol=1e-5
  )


def test_separable_conv1d_layer_incremental_equals_full():
  layer = conv_layers.SeparableConv1DLayer(-2, 0, output_size=D)
  outs, v = _with_variables(lambda mesh: _decode(mesh, layer))
  assert len(v) == 3 + 3
  _check_decoding(*outs)


def test_separable_conv1d_layer_given_kernels():
  """all_kernel_wts replace the depthwise variables."""
  kernels = _RNG.normal(size=(3, D)).astype(np.float32)
  layer = conv_layers.SeparableConv1DLayer(-1, 1, output_size=D)

  def build(mesh):
    x = mtf.import_tf_tensor(mesh, X, [BATCH, LENGTH, D_MODEL])
    wts = [mtf.import_tf_tensor(mesh, w, [D_MODEL]) for w in kernels]
    with tf1.variable_scope("layer"):
      return [layer.call(_context(mesh), x, all_kernel_wts=wts)]

  (y,), v = _with_variables(build)
  assert _DEPTHWISE % 0 + "kernel" not in v
  np.testing.assert_allclose(
    y,
    _separable_reference(X, v, -1, 1, kernels=list(kernels)),
    rtol=1e-5,
    atol=1e-5,
  )


# ----------------------------------------------------------------------------
# Lightweight and dynamic convolution.


CONV_ATTN_CASES = [
  (
    conv_layers.LightweightConv1DLocalAttn,
    _lightweight_kernels,
    "lightwt_depthwise_dense_%d/kernel",
  ),
  (
    conv_layers.DynamicConv1DLocalAttn,
    _dynamic_kernels,
    "dyn_conv_depthwise_dense_%d/kernel",
  ),
]
_CONV_ATTN_IDS = [c[0].__name__ for c in CONV_ATTN_CASES]


@pytest.mark.parametrize("unique", [1, 2])
@pytest.mark.parametrize(
  "cls,kernels_fn,var_name", CONV_ATTN_CASES, ids=_CONV_ATTN_IDS
)
def test_conv_local_attn_matches_numpy(cls, kernels_fn, var_name, unique):
  layer = cls(-1, 1, output_size=D, num_unique_depth_filters=unique)
  (y,), v = _with_variables(lambda mesh: [_full(mesh, layer)])
  assert v[var_name % 2].shape[-1] == D // unique
  expected = _separable_reference(
    X, v, -1, 1, kernels=kernels_fn(X, v, 3, unique)
  )
  np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
  "cls,kernels_fn,var_name", CONV_ATTN_CASES, ids=_CONV_ATTN_IDS
)
def test_conv_local_attn_incremental_equals_full(cls, kernels_fn, var_name):
  del kernels_fn, var_name
  layer = cls(-2, 0, output_size=D, num_unique_depth_filters=2)
  outs, _ = _with_variables(lambda mesh: _decode(mesh, layer))
  _check_decoding(*outs)


def test_conv_local_attn_unique_filters_must_divide_output_size():
  with pytest.raises(ValueError, match="num_unique_depth_filters=3"):
    conv_layers.LightweightConv1DLocalAttn(
      -1, 0, output_size=8, num_unique_depth_filters=3
    )


# ----------------------------------------------------------------------------
# LocalConvAttnBlock.


def _block_reference(x, v, kernels_fn, lo, hi):
  h = (
    x @ v["local_conv_inp_0/kernel"] + v["local_conv_inp_0/bias"]
  ) * _sigmoid(x @ v["local_conv_inp_1/kernel"] + v["local_conv_inp_1/bias"])
  inner = _separable_reference(
    h, v, lo, hi, kernels=kernels_fn(h, v, hi - lo + 1, 1)
  )
  return (
    inner @ v["local_conv_attn_op_projection/kernel"]
    + v["local_conv_attn_op_projection/bias"]
  )


@pytest.mark.parametrize(
  "attention_type,kernels_fn",
  [
    ("lightweight_conv", _lightweight_kernels),
    ("dynamic_conv", _dynamic_kernels),
  ],
)
def test_local_conv_attn_block(attention_type, kernels_fn):
  layer = conv_layers.LocalConvAttnBlock(
    -2,
    0,
    output_size=D,
    num_unique_depth_filters=2,
    attention_type=attention_type,
  )
  outs, v = _with_variables(lambda mesh: _decode(mesh, layer))
  _check_decoding(*outs)
  np.testing.assert_allclose(
    outs[0], _block_reference(X, v, kernels_fn, -2, 0), rtol=1e-5, atol=1e-5
  )


def test_local_conv_attn_block_unknown_type():
  with pytest.raises(NotImplementedError, match="attention_type 'fft'"):
    conv_layers.LocalConvAttnBlock(-1, 0, D, attention_type="fft")


# ----------------------------------------------------------------------------
# Meshes and layouts.


def _mesh_program(mesh):
  x = mtf.import_tf_tensor(mesh, X, [BATCH, LENGTH, D_MODEL])
  outs = []
  layers = [
    conv_layers.Conv1DLayer(3, D),
    conv_layers.SeparableConv1DLayer(-2, 0, D),
    conv_layers.LocalConvAttnBlock(-2, 0, D, attention_type="dynamic_conv"),
  ]
  for i, layer in enumerate(layers):
    with tf1.variable_scope("layer_%d" % i):
      outs.append(layer.call(_context(mesh), x))
  return outs


def _scoped(v, prefix):
  return {n[len(prefix) :]: a for n, a in v.items() if n.startswith(prefix)}


@meshes.parametrize(meshes.TRANSFORMER_CONV_LAYERS)
def test_meshes_and_layouts(mesh_shape, layout):
  # Each run draws its own initial values: check every layer against numpy
  # computed from the variables this run exported.
  outs, v = mtu.with_variables(_mesh_program)(
    mesh_shape, layout, mode="function"
  )
  conv = np.einsum(
    "blkd,kde->ble", _same_window(X, 3), v["layer_0/conv2d/kernel"][0]
  )
  np.testing.assert_allclose(outs[0], conv, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(
    outs[1],
    _separable_reference(X, _scoped(v, "layer_1/"), -2, 0),
    rtol=1e-5,
    atol=1e-5,
  )
  np.testing.assert_allclose(
    outs[2],
    _block_reference(X, _scoped(v, "layer_2/"), _dynamic_kernels, -2, 0),
    rtol=1e-5,
    atol=1e-5,
  )


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
      ".output_size = 8\n"
      "mesh_tensorflow.transformer.transformer_layers.LocalConvAttnBlock"
      ".min_relative_pos = -3\n"
      "mesh_tensorflow.transformer.transformer_layers.LocalConvAttnBlock"
      ".max_relative_pos = 0\n"
      "mesh_tensorflow.transformer.transformer_layers.LocalConvAttnBlock"
      ".output_size = 8"
    )
    # pylint: disable=no-value-for-parameter
    layer = conv_layers.Conv1DLayer()
    block = conv_layers.LocalConvAttnBlock()
    # pylint: enable=no-value-for-parameter
  finally:
    gin.clear_config()
  assert layer.filter_size == 4
  assert block.conv_local_attn_layer.filter_size == 4
