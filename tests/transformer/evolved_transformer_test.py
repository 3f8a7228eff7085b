"""Tests for transformer/evolved_transformer.py.

Every layer is compared with a numpy formulation computed from its own
exported (randomly initialised) variables, on the 1-device mesh and on
4-device meshes with layouts splitting batch, d_ff and heads. The decoder
blocks are checked for causality and for incremental decoding ("first_part"
then one "incremental" step per position) reproducing the full pass.
"""

import re
import types

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mesh_test_util as mtu
from tests import meshes
from transformer import evolved_transformer as et
from transformer._src.layers.context import Context

tf1 = tf.compat.v1

B, L, M, D = 4, 6, 4, 8
BATCH = mtf.Dimension("batch", B)
LENGTH = mtf.Dimension("length", L)
MEMORY = mtf.Dimension("memory_length", M)
D_MODEL = mtf.Dimension("d_model", D)
F32 = mtf.VariableDType(tf.float32)

_RNG = np.random.RandomState(7)
X = _RNG.normal(size=(B, L, D)).astype(np.float32)
ENC = _RNG.normal(size=(B, M, D)).astype(np.float32)
GARBAGE = _RNG.normal(size=(B, L, D)).astype(np.float32)
NEG = -1e9


def _model(autoregressive=True):
  return types.SimpleNamespace(
    model_dim=D_MODEL,
    ensemble_dims=[],
    ensemble_dim=None,
    fully_autoregressive=autoregressive,
    autoregressive=autoregressive,
    layout=None,
    mesh_shape=None,
    max_length_dim=LENGTH,
  )


def _imp(mesh, value, dims, dtype=tf.float32):
  return mtf.import_tf_tensor(
    mesh, tf.constant(value, dtype=dtype), mtf.Shape(dims)
  )


def _context(mesh, mode="eval", causal=True, encoder=False, **kwargs):
  pos = mtf.range(mesh, LENGTH, tf.int32)
  kwargs.setdefault("position", pos)
  if causal:
    kwargs.setdefault("read_priority", pos)
    kwargs.setdefault("write_priority", pos)
  if encoder:
    kwargs.setdefault(
      "encoder_output", _imp(mesh, ENC, [BATCH, MEMORY, D_MODEL])
    )
  return Context(
    _model(causal), mesh, [BATCH], LENGTH, F32, mode=mode, losses=[], **kwargs
  )


def _call(layer, ctx, x, scope):
  with tf1.variable_scope(scope):
    return layer.call(ctx, x)


# ----------------------------------------------------------------------------
# numpy references.


def _sigmoid(x):
  return 1.0 / (1.0 + np.exp(-x))


def _softmax(x):
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _shift(x, rel):
  """y[:, t] = x[:, t + rel], zeros outside the sequence."""
  y = np.zeros_like(x)
  n = x.shape[1]
  for t in range(n):
    if 0 <= t + rel < n:
      y[:, t] = x[:, t + rel]
  return y


def _sep_conv(x, v, prefix, lo, hi):
  acc = 0.0
  for i in range(hi - lo + 1):
    dw = prefix + "/depthwise_conv_hack/depthwise_dense_%d/" % i
    acc = acc + _shift(x, lo + i) * v[dw + "kernel"]
    if i == 0:
      acc = acc + v[dw + "bias"]
  pw = prefix + "/pointwise_dense/"
  return acc @ v[pw + "kernel"] + v[pw + "bias"]


def _layer_norm(x, v, prefix, eps=1e-6):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + eps) * v[prefix + "/layer_scale"] + v[
    prefix + "/layer_bias"
  ]


def _ln(x, v, prefix):
  ln = prefix + "/layer_prepostprocess/layer_norm/layer_norm_"
  return _layer_norm(
    x,
    {
      prefix + "/layer_scale": v[ln + "scale"],
      prefix + "/layer_bias": v[ln + "bias"],
    },
    prefix,
  )


def _pad(x, size):
  return np.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, size - x.shape[-1])])


def np_glu(x, v, s):
  return (x @ v[s + "/glu_0/kernel"] + v[s + "/glu_0/bias"]) * _sigmoid(
    x @ v[s + "/glu_1/kernel"] + v[s + "/glu_1/bias"]
  )


def np_encoder_conv(x, v, s):
  left = np.maximum(x @ v[s + "/conv1x1/dense/kernel"], 0)
  kernel = v[s + "/conv3x1/conv2d/kernel"][0]  # [3, d, d / 2], "SAME"
  right = np.maximum(sum(_shift(x, f - 1) @ kernel[f] for f in range(3)), 0)
  h = _ln(left + _pad(right, left.shape[-1]), v, s)
  y = _sep_conv(h, v, s + "/sep_conv9x1/separable_conv1d", -4, 4)
  return _pad(y, x.shape[-1])


def np_decoder_conv(x, v, s):
  left = np.maximum(
    _sep_conv(x, v, s + "/sep_conv11x1/separable_conv1d", -10, 0), 0
  )
  right = _sep_conv(x, v, s + "/sep_conv7x1_1/separable_conv1d", -6, 0)
  h = _ln(left + _pad(right, left.shape[-1]), v, s)
  return _sep_conv(h, v, s + "/sep_conv7x1_2/separable_conv1d", -6, 0)


def np_mha(x, mem, v, s, heads, causal):
  kv = v[s + "/q"].shape[-1] // heads

  def split(t):
    return t.reshape(t.shape[:2] + (heads, kv))

  q, k, vv = (
    split(x @ v[s + "/q"]),
    split(mem @ v[s + "/k"]),
    split(mem @ v[s + "/v"]),
  )
  logits = np.einsum("bqhk,bmhk->bhqm", q, k)
  if causal:
    n = x.shape[1]
    logits = logits + np.where(
      np.arange(n)[None, :] <= np.arange(n)[:, None], 0.0, NEG
    )
  o = np.einsum("bhqm,bmhk->bqhk", _softmax(logits), vv)
  return o.reshape(o.shape[:2] + (heads * kv,)) @ v[s + "/o"]


def np_decoder_attention(x, enc, v, s, base_heads):
  y = np_mha(x, x, v, s + "/self_attention", 2 * base_heads, True)
  if enc is not None:
    y = y + np_mha(x, enc, v, s + "/enc_dec_attention", base_heads, False)
  return y


# ----------------------------------------------------------------------------
# Numbers on several meshes.


def _all_layers(mesh):
  x = _imp(mesh, X, [BATCH, LENGTH, D_MODEL])
  return [
    _call(et.GatedLinearUnitLayer(), _context(mesh), x, "glu"),
    _call(
      et.EncoderConvolutionalLayer(D, 0.0),
      _context(mesh, causal=False),
      x,
      "enc_conv",
    ),
    _call(
      et.DecoderConvolutionalLayer(D, 0.0, initializer_scale=2.0),
      _context(mesh),
      x,
      "dec_conv",
    ),
    _call(
      et.DecoderAttentionLayer(base_num_heads=2),
      _context(mesh, encoder=True),
      x,
      "dec_att",
    ),
  ]


@meshes.parametrize(meshes.EVOLVED_TRANSFORMER, "mesh_layout")
def test_layers_match_numpy_on_meshes(mesh_layout):
  outs, v = mtu.with_variables(_all_layers)(*mesh_layout)
  glu, enc_conv, dec_conv, dec_att = outs
  tol = dict(rtol=1e-4, atol=1e-5)
  np.testing.assert_allclose(glu, np_glu(X, v, "glu"), **tol)
  np.testing.assert_allclose(enc_conv, np_encoder_conv(X, v, "enc_conv"), **tol)
  np.testing.assert_allclose(dec_conv, np_decoder_conv(X, v, "dec_conv"), **tol)
  np.testing.assert_allclose(
    dec_att, np_decoder_attention(X, ENC, v, "dec_att", 2), **tol
  )


def test_variable_names_and_shapes():
  _, v = mtu.with_variables(_all_layers)()
  shapes = {n: x.shape for n, x in v.items()}
  sep = "/separable_conv1d/pointwise_dense/kernel"
  assert shapes["glu/glu_0/kernel"] == (D, D)
  assert shapes["glu/glu_1/bias"] == (D,)
  assert shapes["enc_conv/conv1x1/dense/kernel"] == (D, 4 * D)
  assert shapes["enc_conv/conv3x1/conv2d/kernel"] == (1, 3, D, D // 2)
  assert shapes[
    "enc_conv/layer_prepostprocess/layer_norm/layer_norm_scale"
  ] == (4 * D,)
  assert shapes["enc_conv/sep_conv9x1" + sep] == (4 * D, D // 2)
  assert shapes["dec_conv/sep_conv11x1" + sep] == (D, 2 * D)
  assert shapes["dec_conv/sep_conv7x1_1" + sep] == (D, D // 2)
  assert shapes["dec_conv/sep_conv7x1_2" + sep] == (2 * D, D)
  assert (
    "dec_conv/sep_conv11x1/separable_conv1d/depthwise_conv_hack/"
    "depthwise_dense_10/kernel"
  ) in v
  # Self-attention: 4 heads, enc-dec: 2 heads, of SelfAttention's default
  # key_value_size 128.
  assert shapes["dec_att/self_attention/q"] == (D, 4 * 128)
  assert shapes["dec_att/enc_dec_attention/o"] == (2 * 128, D)


# ----------------------------------------------------------------------------
# Causality and incremental decoding.


@pytest.mark.parametrize(
  "make_layer",
  [
    lambda: et.DecoderConvolutionalLayer(D, 0.0),
    lambda: et.DecoderAttentionLayer(base_num_heads=2),
    lambda: et.GatedLinearUnitLayer(),
  ],
  ids=["conv", "attention", "glu"],
)
def test_decoder_blocks_are_causal(make_layer):
  layer = make_layer()

  def build(mesh):
    outs = []
    for t in range(L):
      x2 = X.copy()
      x2[:, t + 1 :] = GARBAGE[:, t + 1 :]
      outs.append(
        _call(
          layer,
          _context(mesh, encoder=True),
          _imp(mesh, x2, [BATCH, LENGTH, D_MODEL]),
          "layer",
        )
      )
    return outs

  outs = mtu.run_program(build)
  full = outs[-1]
  for t, y in enumerate(outs):
    np.testing.assert_allclose(
      y[:, : t + 1],
      full[:, : t + 1],
      rtol=1e-5,
      atol=1e-5,
      err_msg="position %d" % t,
    )
    if t < L - 1:  # Later outputs do see the changed inputs.
      assert not np.allclose(y[:, t + 1 :], full[:, t + 1 :])


def test_encoder_conv_sees_both_directions():
  layer = et.EncoderConvolutionalLayer(D, 0.0)

  def build(mesh):
    x2 = X.copy()
    x2[:, -1] += 1.0
    return [
      _call(
        layer,
        _context(mesh, causal=False),
        _imp(mesh, x, [BATCH, LENGTH, D_MODEL]),
        "enc",
      )
      for x in (X, x2)
    ]

  y, y2 = mtu.run_program(build)
  assert not np.allclose(y[:, -2], y2[:, -2])


def _prompt(prefix):
  return np.where(np.arange(L)[None, :, None] < prefix, X, GARBAGE)


def _decode_program(layer, mesh, prefix, encoder):
  """Full causal pass, a "first_part" pass and incremental steps."""
  scope = "decoder/block_000/layer_000/" + type(layer).__name__
  x = _imp(mesh, X, [BATCH, LENGTH, D_MODEL])
  y_full = _call(layer, _context(mesh, encoder=encoder), x, scope)
  first = _context(
    mesh,
    mode="first_part",
    encoder=encoder,
    new_states=[],
    constant_states=[],
    initial_position=mtf.constant(mesh, prefix, [BATCH], tf.int32),
  )
  y_first = _call(
    layer, first, _imp(mesh, _prompt(prefix), [BATCH, LENGTH, D_MODEL]), scope
  )
  states = first.new_states
  steps = []
  for p in range(prefix, L):
    pos = mtf.constant(mesh, p, [BATCH], tf.int32)
    inc = _context(
      mesh,
      mode="incremental",
      encoder=encoder,
      position=pos,
      states=states,
      new_states=[],
      constant_states=first.constant_states,
      read_priority=pos,
      write_priority=mtf.range(mesh, LENGTH, tf.int32),
    )
    steps.append(
      _call(layer, inc, _imp(mesh, X[:, p], [BATCH, D_MODEL]), scope)
    )
    assert len(inc.new_states) == len(states)
    states = inc.new_states
  return [y_full, y_first] + steps


@pytest.mark.parametrize(
  "kind,prefix,mesh_layout",
  [
    ("conv", 1, ("", "")),
    ("conv", 3, ("rows:2;cols:2", "batch:rows")),
    ("attention", 2, ("rows:2;cols:2", "batch:rows;heads:cols")),
    ("glu", 2, ("", "")),
  ],
  ids=str,
)
def test_incremental_decoding_matches_full_pass(kind, prefix, mesh_layout):
  layer, encoder = {
    "conv": (et.DecoderConvolutionalLayer(D, 0.0), False),
    "attention": (et.DecoderAttentionLayer(base_num_heads=2), True),
    "glu": (et.GatedLinearUnitLayer(), False),
  }[kind]
  outs = mtu.run_program(
    lambda mesh: _decode_program(layer, mesh, prefix, encoder), *mesh_layout
  )
  y_full, y_first, steps = outs[0], outs[1], outs[2:]
  np.testing.assert_allclose(
    y_first[:, :prefix], y_full[:, :prefix], rtol=1e-5, atol=1e-5
  )
  assert len(steps) == L - prefix
  for i, y in enumerate(steps):
    np.testing.assert_allclose(
      y,
      y_full[:, prefix + i],
      rtol=1e-5,
      atol=1e-5,
      err_msg="position %d" % (prefix + i),
    )


# ----------------------------------------------------------------------------
# Training: gradients, dropout, errors, gin.


def test_gradients_are_nonzero():
  def build(mesh):
    x = _imp(mesh, X, [BATCH, LENGTH, D_MODEL])
    ctx = _context(mesh, mode="train", encoder=True)
    y = x
    for i, layer in enumerate(
      [
        et.GatedLinearUnitLayer(),
        et.EncoderConvolutionalLayer(D, 0.0),
        et.DecoderConvolutionalLayer(D, 0.0),
        et.DecoderAttentionLayer(base_num_heads=2),
      ]
    ):
      y = y + _call(layer, ctx, y, "layer_%d" % i)
    loss = mtf.reduce_sum(mtf.square(y))
    variables = [v.outputs[0] for v in mesh.graph.trainable_variables]
    build.names = [v.name for v in mesh.graph.trainable_variables]
    return mtf.gradients([loss], variables)

  grads = mtu.run_program(build)
  assert len(grads) == len(build.names) > 20
  for name, g in zip(build.names, grads):
    tap = re.search(r"sep_conv(\d+)x1.*depthwise_dense_(\d+)/kernel", name)
    if tap and int(tap.group(2)) < int(tap.group(1)) - L:
      continue  # Taps further back than the sequence see only zeros.
    assert np.abs(g).max() > 0, name


def test_dropout_only_in_training():
  layer = et.DecoderConvolutionalLayer(D, dropout_rate=0.5)

  def build(mesh):
    x = _imp(mesh, X, [BATCH, LENGTH, D_MODEL])
    return [
      _call(layer, _context(mesh, mode=m), x, "c")
      for m in ("eval", "eval", "train")
    ]

  a, b, c = mtu.run_program(build)
  np.testing.assert_allclose(a, b)
  assert not np.allclose(a, c)


def test_pad_channels_rejects_narrowing():
  def build(mesh):
    layer = et.EncoderConvolutionalLayer(4 * D, 0.0)  # Wider than x.
    return [
      _call(
        layer,
        _context(mesh, causal=False),
        _imp(mesh, X, [BATCH, LENGTH, D_MODEL]),
        "bad",
      )
    ]

  with pytest.raises(ValueError, match="Cannot pad to size"):
    mtu.run_program(build)


def test_gin_configurable_under_evolved_transformer_module():
  prefix = "mesh_tensorflow.transformer.evolved_transformer."
  with gin.unlock_config():
    gin.parse_config(
      [
        prefix + "DecoderConvolutionalLayer.d_model = 8",
        prefix + "DecoderConvolutionalLayer.dropout_rate = 0.25",
        prefix + "DecoderAttentionLayer.base_num_heads = 3",
      ]
    )
  try:
    # pylint: disable=no-value-for-parameter
    conv = et.DecoderConvolutionalLayer()
    att = et.DecoderAttentionLayer()
    # pylint: enable=no-value-for-parameter
  finally:
    gin.clear_config()
  # pylint: disable=protected-access
  assert conv._dropout_rate == 0.25
  assert att._enc_dec_attention.num_heads == 3
  # pylint: enable=protected-access
  import mesh_tensorflow.transformer.evolved_transformer as aliased  # pylint: disable=g-import-not-at-top

  assert aliased is et


@pytest.mark.parametrize("mode", ["function", "graph"])
def test_decoding_in_tf_function_and_v1_graph(mode):
  layer = et.DecoderConvolutionalLayer(D, 0.0)
  outs = mtu.run_program(
    lambda mesh: _decode_program(layer, mesh, 2, False),
    "all:4",
    "batch:all",
    mode=mode,
  )
  y_full, steps = outs[0], outs[2:]
  for i, y in enumerate(steps):
    np.testing.assert_allclose(y, y_full[:, 2 + i], rtol=1e-5, atol=1e-5)


def _greedy_vs_teacher_forcing(layers, compare=True):
  """Greedy sample_autoregressive of a tiny LM made of `layers`.

  The prompt must be kept; with compare, the sampled ids must be the argmax
  of a teacher-forced pass over them.
  """
  from transformer import transformer  # pylint: disable=g-import-not-at-top

  vocab = 13
  prompt = np.zeros((B, L), np.int32)
  for row, n in enumerate([2, 0, 3, 1]):
    prompt[row, :n] = np.random.RandomState(row).randint(2, vocab, size=n)

  def build(mesh):
    stack = transformer.make_layer_stack(layers, num_layers=1)
    lm = transformer.Unitransformer(
      stack,
      d_model=D,
      input_vocab_size=vocab,
      output_vocab_size=vocab,
      autoregressive=True,
      max_length=L,
      vocab_divisor=8,
    )
    partial = mtf.import_fully_replicated(
      mesh, tf.constant(prompt), mtf.Shape([BATCH, LENGTH])
    )
    ids = lm.sample_autoregressive(partial, stop_at_token=None)
    logits, _ = lm.call_simple(
      transformer.autoregressive_inputs(ids), None, False, mode="infer"
    )
    return [ids, logits]

  ids, logits = mtu.run_program(build, "rows:2;cols:2", "batch:rows")
  for b, n in enumerate((prompt != 0).sum(-1)):
    np.testing.assert_array_equal(ids[b, :n], prompt[b, :n])
    if compare:
      np.testing.assert_array_equal(
        ids[b, n:], logits[b, n:].argmax(-1), err_msg="row %d" % b
      )
  assert ((ids >= 0) & (ids < 16)).all()  # vocab padded to 16


def test_greedy_sampling_with_glu_matches_teacher_forcing():
  _greedy_vs_teacher_forcing([et.GatedLinearUnitLayer])


def test_greedy_sampling_with_decoder_conv():
  """The conv block's decode states run in a real LM's decode loop.

  Not compared with teacher forcing: as in the original, the full pass
  zeroes the positions whose input id is 0 (the first position of an
  autoregressive decoder) before convolving; incremental steps do not.
  """
  _greedy_vs_teacher_forcing(
    [
      (
        et.DecoderConvolutionalLayer,
        "conv",
        {"d_model": D, "dropout_rate": 0.0},
      ),
      et.GatedLinearUnitLayer,
    ],
    compare=False,
  )
