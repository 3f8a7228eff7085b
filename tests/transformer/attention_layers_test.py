"""Tests for the attention layers of transformer_layers.

Their modules: transformer/_src/layers/self_attention.py, enc_dec_attention.py,
local_self_attention.py and attention_bias.py.

SelfAttention, EncDecAttention, LocalSelfAttention and
TransparentEncDecAttention against numpy multi-head attention (causality,
packed sequences, T5 relative-position buckets), incremental decoding
against the full causal forward, and the same numbers on the 1-device mesh
and 4-device meshes under several layouts. Variables are created under the
scopes a layer stack opens and checked by full name and shape.
"""

import inspect
import math

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mesh_test_util as mtu
from tests import meshes
from transformer import transformer_layers as tl
from transformer._src.layers import attention_bias
from transformer._src.layers.context import Context

tf1 = tf.compat.v1

B, L, M, DM = 2, 8, 5, 8
BATCH = mtf.Dimension("batch", B)
LENGTH = mtf.Dimension("length", L)
MEMORY = mtf.Dimension("memory_length", M)
D_MODEL = mtf.Dimension("d_model", DM)
F32 = mtf.VariableDType(tf.float32)
SCOPE = "decoder/block_000/layer_000/SelfAttention"

_RNG = np.random.RandomState(3)


def _rand(*shape):
  return _RNG.randn(*shape).astype(np.float32)


X = _rand(B, L, DM)
ENC = _rand(B, M, DM)
SEQ = np.array([[1, 1, 1, 2, 2, 2, 2, 0], [1, 1, 1, 1, 1, 1, 1, 1]], np.int32)
ENC_SEQ = np.array([[1, 1, 2, 2, 0], [1, 1, 1, 0, 0]], np.int32)


class StubModel:
  """The attributes layers read from context.model."""

  def __init__(self, fully_autoregressive=True, layout=None, mesh_shape=None):
    self.model_dim = D_MODEL
    self.ensemble_dims = []
    self.ensemble_dim = None
    self.fully_autoregressive = fully_autoregressive
    self.autoregressive = fully_autoregressive
    self.layout = layout
    self.mesh_shape = mesh_shape
    self.input_vocab_size = 100
    self.input_vocab_dim = mtf.Dimension("vocab", 128)


def imp(mesh, value, dims, dtype=tf.float32):
  return mtf.import_tf_tensor(
    mesh, tf.constant(value, dtype=dtype), mtf.Shape(dims)
  )


def make_context(
  mesh, mode="eval", causal=True, seq=None, model=None, **kwargs
):
  pos = mtf.range(mesh, LENGTH, tf.int32)
  kwargs.setdefault("position", pos)
  if causal:
    kwargs.setdefault("read_priority", pos)
    kwargs.setdefault("write_priority", pos)
  return Context(
    model or StubModel(causal),
    mesh,
    [BATCH],
    LENGTH,
    F32,
    mode=mode,
    sequence_id=(
      imp(mesh, seq, [BATCH, LENGTH], tf.int32) if seq is not None else None
    ),
    **kwargs,
  )


def var(mesh, name):
  return mesh.graph.name_to_variable[name].outputs[0]


def var_shapes(mesh):
  return {
    n: v.shape.to_integer_list for n, v in mesh.graph.name_to_variable.items()
  }


# ----------------------------------------------------------------------------
# numpy references
# ----------------------------------------------------------------------------


def softmax(x, axis=-1):
  x = x - x.max(axis=axis, keepdims=True)
  e = np.exp(x)
  return e / e.sum(axis=axis, keepdims=True)


def np_bucket(relative, bidirectional=True, num_buckets=32, max_distance=128):
  """T5 buckets, written with numpy."""
  n = -np.asarray(relative, np.int64)
  ret = np.zeros_like(n)
  if bidirectional:
    num_buckets //= 2
    ret += (n < 0) * num_buckets
    n = np.abs(n)
  else:
    n = np.maximum(n, 0)
  max_exact = num_buckets // 2
  with np.errstate(divide="ignore", invalid="ignore"):
    large = max_exact + (
      np.log(n.astype(np.float32) / np.float32(max_exact))
      / np.float32(math.log(max_distance / max_exact))
      * np.float32(num_buckets - max_exact)
    ).astype(np.int64)
  large = np.minimum(large, num_buckets - 1)
  return ret + np.where(n < max_exact, n, large)


def bias_from_visible(visible):
  return np.where(visible, 0.0, -1e9).astype(np.float32)


def np_mha(
  x, mem, wq, wk, wv, wo, num_heads, num_kv_heads, bias=None, keep_heads=False
):
  """x [b, l, d], mem [b, m, d]; combined kernels; bias [b|1, h|1, l, m]."""
  dkv = wq.shape[-1] // num_heads
  q = np.einsum("bld,dhk->blhk", x, wq.reshape(DM, num_heads, dkv))
  k = np.einsum("bmd,dhk->bmhk", mem, wk.reshape(DM, num_kv_heads, dkv))
  v = np.einsum("bmd,dhk->bmhk", mem, wv.reshape(DM, num_kv_heads, dkv))
  k = np.repeat(k, num_heads // num_kv_heads, axis=2)
  v = np.repeat(v, num_heads // num_kv_heads, axis=2)
  logits = np.einsum("blhk,bmhk->bhlm", q, k)
  if bias is not None:
    logits = logits + bias
  o = np.einsum("bhlm,bmhk->blhk", softmax(logits), v)
  wo = wo.reshape(num_heads, dkv, DM)
  if keep_heads:
    return np.einsum("blhk,hko->blho", o, wo)
  return np.einsum("blhk,hko->blo", o, wo)


def causal_seq_visible(seq=None, causal=True):
  visible = np.ones((B, 1, L, L), bool)
  if causal:
    visible &= (np.arange(L)[None, :] <= np.arange(L)[:, None])[None, None]
  if seq is not None:
    visible &= (seq[:, :, None] == seq[:, None, :])[:, None]
  return visible


# ----------------------------------------------------------------------------
# relative position buckets
# ----------------------------------------------------------------------------

# (memory - query, bidirectional) -> T5 bucket (32 buckets, max distance 128).
HAND_PICKED = [
  (0, True, 0),
  (-1, True, 1),
  (-7, True, 7),
  (-8, True, 8),
  (-12, True, 9),
  (-127, True, 15),
  (-128, True, 15),
  (-1000, True, 15),
  (1, True, 17),
  (7, True, 23),
  (12, True, 25),
  (1000, True, 31),
  (0, False, 0),
  (5, False, 0),
  (-5, False, 5),
  (-15, False, 15),
  (-16, False, 16),
  (-20, False, 17),
  (-127, False, 31),
  (-500, False, 31),
]


def test_relative_position_bucket_hand_picked():
  rel = np.array([r for r, _, _ in HAND_PICKED], np.int32)
  dim = mtf.Dimension("pairs", len(rel))

  def build(mesh):
    t = imp(mesh, rel, [dim], tf.int32)
    return [
      attention_bias.relative_position_bucket(t, True),
      attention_bias.relative_position_bucket(t, False),
    ]

  bi, uni = mtu.run_program(build)
  for i, (r, bidirectional, expected) in enumerate(HAND_PICKED):
    got = bi[i] if bidirectional else uni[i]
    assert got == expected, (r, bidirectional, got)
    assert np_bucket(r, bidirectional) == expected


def test_relative_position_bucket_matches_numpy_on_range():
  rel = np.arange(-300, 301, dtype=np.int32)
  dim = mtf.Dimension("pairs", len(rel))

  def build(mesh):
    t = imp(mesh, rel, [dim], tf.int32)
    return [
      attention_bias.relative_position_bucket(t, True, 32, 128),
      attention_bias.relative_position_bucket(t, False, 16, 64),
    ]

  bi, uni = mtu.run_program(build)
  np.testing.assert_array_equal(bi, np_bucket(rel, True, 32, 128))
  np.testing.assert_array_equal(uni, np_bucket(rel, False, 16, 64))


# ----------------------------------------------------------------------------
# SelfAttention forward
# ----------------------------------------------------------------------------


def run_self_attention(
  layer, mesh_layout, causal=True, seq=None, extra_vars=(), scope=SCOPE
):
  names = ["q", "k", "v", "o"] if not layer.shared_kv else ["q", "kv", "o"]

  def build(mesh):
    ctx = make_context(mesh, causal=causal, seq=seq)
    with tf1.variable_scope(scope):
      y = layer.call(ctx, imp(mesh, X, [BATCH, LENGTH, D_MODEL]))
    build.shapes = var_shapes(mesh)
    return [y] + [var(mesh, scope + "/" + n) for n in names + list(extra_vars)]

  outs = mtu.run_program(build, *mesh_layout)
  return outs[0], dict(zip(names + list(extra_vars), outs[1:])), build.shapes


@meshes.parametrize(meshes.ATTENTION_LAYERS, "mesh_layout")
def test_self_attention_causal_packed_relative_bias(mesh_layout):
  # 8 buckets: distances 4..7 fall in log buckets, which differ between
  # unidirectional (this causal layer) and bidirectional bucketing.
  layer = tl.SelfAttention(
    num_heads=4,
    key_value_size=4,
    relative_attention_type="bias",
    relative_attention_num_buckets=8,
  )
  y, w, shapes = run_self_attention(
    layer, mesh_layout, seq=SEQ, extra_vars=["relative_attention_bias"]
  )
  assert shapes == {
    SCOPE + "/q": [8, 16],
    SCOPE + "/k": [8, 16],
    SCOPE + "/v": [8, 16],
    SCOPE + "/o": [16, 8],
    SCOPE + "/relative_attention_bias": [4, 8],
  }
  rel = np.arange(L)[None, :] - np.arange(L)[:, None]
  rel_bias = w["relative_attention_bias"][:, np_bucket(rel, False, 8)]
  bias = bias_from_visible(causal_seq_visible(SEQ)) + rel_bias[None]
  expected = np_mha(X, X, w["q"], w["k"], w["v"], w["o"], 4, 4, bias)
  np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)


def test_self_attention_bidirectional_uses_bidirectional_buckets():
  layer = tl.SelfAttention(
    num_heads=2, key_value_size=4, relative_attention_type="bias"
  )
  y, w, _ = run_self_attention(
    layer,
    ("all:4", "d_model:all"),
    causal=False,
    extra_vars=["relative_attention_bias"],
  )
  rel = np.arange(L)[None, :] - np.arange(L)[:, None]
  bias = w["relative_attention_bias"][:, np_bucket(rel, True)][None]
  expected = np_mha(X, X, w["q"], w["k"], w["v"], w["o"], 2, 2, bias)
  np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
  "num_memory_heads,shared_kv", [(1, False), (2, False), (0, True)]
)
def test_self_attention_multi_query_grouped_shared_kv(
  num_memory_heads, shared_kv
):
  layer = tl.SelfAttention(
    num_heads=4,
    num_memory_heads=num_memory_heads,
    key_value_size=4,
    shared_kv=shared_kv,
  )
  y, w, shapes = run_self_attention(
    layer, ("rows:2;cols:2", "batch:rows;heads:cols"), seq=SEQ
  )
  kv_heads = {0: 4, 1: 1, 2: 2}[num_memory_heads]
  wk = w["kv"] if shared_kv else w["k"]
  wv = w["kv"] if shared_kv else w["v"]
  assert wk.shape == (8, kv_heads * 4)
  bias = bias_from_visible(causal_seq_visible(SEQ))
  expected = np_mha(X, X, w["q"], wk, wv, w["o"], 4, kv_heads, bias)
  np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)
  if shared_kv:
    assert SCOPE + "/k" not in shapes and SCOPE + "/kv" in shapes


def test_self_attention_single_head_and_uncombined_dims():
  for layer, shape in [
    (tl.SelfAttention(num_heads=1, key_value_size=4), [8, 4]),
    (
      tl.SelfAttention(num_heads=4, key_value_size=4, combine_dims=False),
      [8, 4, 4],
    ),
  ]:
    y, w, shapes = run_self_attention(layer, ("", ""))
    assert shapes[SCOPE + "/q"] == shape
    flat = {
      n: a.reshape(8, -1) if n != "o" else a.reshape(-1, 8)
      for n, a in w.items()
    }
    heads = layer.num_heads
    bias = bias_from_visible(causal_seq_visible())
    expected = np_mha(
      X, X, flat["q"], flat["k"], flat["v"], flat["o"], heads, heads, bias
    )
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)


def test_self_attention_bias_shared_lives_in_first_layer():
  scopes = [
    "decoder/block_000/layer_000/SelfAttention",
    "decoder/block_001/layer_000/SelfAttention",
  ]
  layer = tl.SelfAttention(
    num_heads=2, key_value_size=4, relative_attention_type="bias_shared"
  )

  def build(mesh):
    ctx = make_context(mesh)
    x = imp(mesh, X, [BATCH, LENGTH, D_MODEL])
    ys = []
    for scope in scopes:
      with tf1.variable_scope(scope):
        ys.append(layer.call(ctx, x))
    build.shapes = var_shapes(mesh)
    return (
      ys
      + [var(mesh, s + "/" + n) for s in scopes for n in ("q", "k", "v", "o")]
      + [var(mesh, scopes[0] + "/relative_attention_bias")]
    )

  outs = mtu.run_program(build, "rows:2;cols:2", "batch:rows;heads:cols")
  assert scopes[0] + "/relative_attention_bias" in build.shapes
  assert scopes[1] + "/relative_attention_bias" not in build.shapes
  rel = np.arange(L)[None, :] - np.arange(L)[:, None]
  bias = (
    bias_from_visible(causal_seq_visible())
    + outs[-1][:, np_bucket(rel, False)][None]
  )
  for i in range(2):
    wq, wk, wv, wo = outs[2 + 4 * i : 6 + 4 * i]
    np.testing.assert_allclose(
      outs[i], np_mha(X, X, wq, wk, wv, wo, 2, 2, bias), rtol=1e-5, atol=1e-5
    )


def test_self_attention_contextual_relative_attention():
  layer = tl.SelfAttention(
    num_heads=2, key_value_size=4, relative_attention_type="contextual"
  )
  ak = "relative_attention_ak/kernel"
  y, w, shapes = run_self_attention(
    layer, ("rows:2;cols:2", "batch:rows;heads:cols"), extra_vars=[ak]
  )
  assert shapes[SCOPE + "/" + ak] == [2, 4, 32]
  q = np.einsum("bld,dhk->blhk", X, w["q"].reshape(8, 2, 4))
  values = np.einsum("blhk,hkn->blhn", q, w[ak])
  rel = np.arange(L)[None, :] - np.arange(L)[:, None]
  bucket = np_bucket(rel, False)
  rel_bias = np.take_along_axis(
    values, np.broadcast_to(bucket[None, :, None, :], (B, L, 2, L)), -1
  )
  bias = bias_from_visible(causal_seq_visible()) + np.transpose(
    rel_bias, (0, 2, 1, 3)
  )
  expected = np_mha(X, X, w["q"], w["k"], w["v"], w["o"], 2, 2, bias)
  np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)


def test_self_attention_hybrid_attention_func():
  layer = tl.SelfAttention(
    num_heads=2, key_value_size=4, attention_func="hybrid"
  )
  y, w, shapes = run_self_attention(layer, ("", ""), causal=False)
  assert shapes[SCOPE + "/doubly_coeff"] == []
  d = 4
  q = np.einsum("bld,dhk->bhlk", X, w["q"].reshape(8, 2, d))
  k = np.einsum("bld,dhk->bhlk", X, w["k"].reshape(8, 2, d))
  v = np.einsum("bld,dhk->bhlk", X, w["v"].reshape(8, 2, d))
  logits = np.einsum("bhlk,bhmk->bhlm", q, k)
  weights = 0.5 * softmax(np.log(softmax(logits, 2)), 3) + 0.5 * softmax(
    logits, 3
  )
  o = np.einsum("bhlm,bhmk->blhk", weights, v)
  expected = np.einsum("blhk,hko->blo", o, w["o"].reshape(2, d, 8))
  np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)


def test_self_attention_keep_query_heads_dims():
  layer = tl.SelfAttention(
    num_heads=2, key_value_size=4, keep_query_heads_dims=True
  )
  y, w, _ = run_self_attention(layer, ("", ""))
  assert y.shape == (B, L, 2, DM)
  expected = np_mha(
    X,
    X,
    w["q"],
    w["k"],
    w["v"],
    w["o"],
    2,
    2,
    bias_from_visible(causal_seq_visible()),
    keep_heads=True,
  )
  np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)


def test_self_attention_properties_and_kwargs():
  layer = tl.SelfAttention(
    num_heads=2,
    key_value_size=16,
    dropout_rate=0.1,
    attention_kwargs={"extra_logit": 0.0},
  )
  assert layer.kv_dim == mtf.Dimension("d_kv", 16)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  train = Context(StubModel(), mesh, [BATCH], LENGTH, F32, mode="train")
  kwargs = layer.attention_kwargs_from_context(train)
  assert kwargs == {
    "extra_logit": 0.0,
    "dropout_rate": 0.1,
    "dropout_broadcast_dims": [LENGTH],
  }
  evaluation = Context(StubModel(), mesh, [BATCH], LENGTH, F32, mode="eval")
  assert layer.attention_kwargs_from_context(evaluation)["dropout_rate"] == 0
  assert layer.memory_length(train) == mtf.Dimension("memory_length", L)
  assert layer.min_relative_position(train) is None
  assert layer.max_relative_position(train) is None
  assert (
    layer.attention_fn is tl.SelfAttention(attention_func=None).attention_fn
  )
  local = tl.LocalSelfAttention(radius=3)
  assert local.min_relative_position(train) == -2
  assert local.max_relative_position(train) == 0
  assert local.window_dim == mtf.Dimension("window", 3)


# ----------------------------------------------------------------------------
# Incremental decoding
# ----------------------------------------------------------------------------

GARBAGE = _rand(B, L, DM)


def prompt(prefix):
  """What the "first_part" pass sees: the prefix, then padding-like garbage
  (decoding overwrites those positions).
  """
  return np.where(np.arange(L)[None, :, None] < prefix, X, GARBAGE)


def decode_program(
  layer, mesh, scope, encoder=False, causal=True, prefix=1, task_prompts=False
):
  """Full causal pass, a "first_part" pass and incremental steps (with
  task_prompts: decoder prompts of tasks TASK_ID from PROMPTS).
  """
  x = imp(mesh, X, [BATCH, LENGTH, D_MODEL])
  extra = {}
  task_id = None
  if task_prompts:
    task_id = imp(mesh, TASK_ID, [BATCH, LENGTH], tf.int32)
    extra["shared_params"] = {
      "decoder": {
        "prompts": imp(
          mesh,
          PROMPTS,
          [TASK_NUM, mtf.Dimension("memory_length", PROMPT_LENGTH), D_MODEL],
        )
      }
    }

  def with_task(ctx):
    if task_id is not None:
      ctx.cache["task-id"] = task_id
    return ctx

  if encoder:
    extra = dict(
      encoder_output=imp(mesh, ENC, [BATCH, MEMORY, D_MODEL]),
      encoder_sequence_id=imp(mesh, ENC_SEQ, [BATCH, MEMORY], tf.int32),
    )
  seq = np.ones((B, L), np.int32) if encoder else None
  full_ctx = with_task(make_context(mesh, mode="eval", seq=seq, **extra))
  with tf1.variable_scope(scope):
    y_full = layer.call(full_ctx, x)
  first = with_task(
    make_context(
      mesh,
      mode="first_part",
      seq=seq,
      new_states=[],
      constant_states=[],
      initial_position=mtf.constant(mesh, prefix, [BATCH], tf.int32),
      **extra,
    )
  )
  with tf1.variable_scope(scope):
    y_first = layer.call(
      first, imp(mesh, prompt(prefix), [BATCH, LENGTH, D_MODEL])
    )
  states = first.new_states
  steps = []
  for p in range(prefix, L):
    pos = mtf.constant(mesh, p, [BATCH], tf.int32)
    inc = Context(
      StubModel(causal),
      mesh,
      [BATCH],
      LENGTH,
      F32,
      mode="incremental",
      position=pos,
      states=states,
      new_states=[],
      constant_states=first.constant_states,
      read_priority=pos,
      write_priority=mtf.range(mesh, LENGTH, tf.int32),
      sequence_id=(
        mtf.constant(mesh, 1, [BATCH], tf.int32) if encoder else None
      ),
      encoder_sequence_id=extra.get("encoder_sequence_id"),
      shared_params=extra.get("shared_params"),
    )
    with_task(inc)
    with tf1.variable_scope(scope):
      steps.append(layer.call(inc, imp(mesh, X[:, p], [BATCH, D_MODEL])))
    assert len(inc.new_states) == len(states)
    states = inc.new_states
  return [y_full, y_first] + steps


@meshes.parametrize(meshes.ATTENTION_DECODING, "mesh_layout")
@pytest.mark.parametrize(
  "kind",
  [
    "self",
    "self_shared_kv_rel",
    "encdec",
    "local",
    "local_long_prefix",
    "self_task_prompts",
  ],
)
def test_incremental_decoding_matches_full_forward(kind, mesh_layout):
  local_scope = "decoder/block_000/layer_000/LocalSelfAttention"
  layer, scope, encoder, prefix = {
    "self": (tl.SelfAttention(num_heads=2, key_value_size=4), SCOPE, False, 3),
    "self_shared_kv_rel": (
      tl.SelfAttention(
        num_heads=2,
        num_memory_heads=1,
        key_value_size=4,
        shared_kv=True,
        relative_attention_type="bias",
      ),
      SCOPE,
      False,
      1,
    ),
    "encdec": (
      tl.EncDecAttention(num_heads=2, key_value_size=4),
      "decoder/block_000/layer_001/EncDecAttention",
      True,
      2,
    ),
    "local": (
      tl.LocalSelfAttention(radius=3, num_heads=2, key_value_size=4),
      local_scope,
      False,
      1,
    ),
    "local_long_prefix": (
      tl.LocalSelfAttention(radius=2, num_heads=2, key_value_size=4),
      local_scope,
      False,
      4,
    ),
    "self_task_prompts": (
      tl.SelfAttention(
        num_heads=2,
        key_value_size=4,
        relative_attention_type="bias",
        hyperprompt_length_decoder=PROMPT_LENGTH,
        hyperprompt_hidden_dim=PREFIX_HIDDEN,
        hyperprompt_task_num=TASKS,
      ),
      SCOPE,
      False,
      2,
    ),
  }[kind]
  outs = mtu.run_program(
    lambda mesh: decode_program(
      layer,
      mesh,
      scope,
      encoder,
      prefix=prefix,
      task_prompts=kind == "self_task_prompts",
    ),
    *mesh_layout,
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


@pytest.mark.parametrize("mode", ["function", "graph"])
def test_incremental_decoding_in_tf_function_and_v1_graph(mode):
  layer = tl.SelfAttention(
    num_heads=2, key_value_size=4, relative_attention_type="bias"
  )
  outs = mtu.run_program(
    lambda mesh: decode_program(layer, mesh, SCOPE, prefix=5),
    "rows:2;cols:2",
    "batch:rows;heads:cols",
    mode=mode,
  )
  y_full, y_first, steps = outs[0], outs[1], outs[2:]
  np.testing.assert_allclose(
    y_first[:, :5], y_full[:, :5], rtol=1e-5, atol=1e-5
  )
  for i, y in enumerate(steps):
    np.testing.assert_allclose(y, y_full[:, 5 + i], rtol=1e-5, atol=1e-5)


def test_self_attention_ensemble():
  ensemble = mtf.Dimension("ensemble", 2)
  x = _rand(2, B, L, DM)
  layer = tl.SelfAttention(
    num_heads=2, key_value_size=4, relative_attention_type="bias"
  )

  def build(mesh):
    model = StubModel()
    model.ensemble_dim = ensemble
    model.ensemble_dims = [ensemble]
    ctx = make_context(mesh, model=model)
    with tf1.variable_scope(SCOPE):
      y = layer.call(ctx, imp(mesh, x, [ensemble, BATCH, LENGTH, D_MODEL]))
    build.shapes = var_shapes(mesh)
    return [y] + [
      var(mesh, SCOPE + "/" + n)
      for n in ("q", "k", "v", "o", "relative_attention_bias")
    ]

  y, wq, wk, wv, wo, rb = mtu.run_program(build, "all:4", "d_model:all")
  assert build.shapes[SCOPE + "/q"] == [2, 8, 8]
  assert build.shapes[SCOPE + "/relative_attention_bias"] == [2, 2, 32]
  rel = np.arange(L)[None, :] - np.arange(L)[:, None]
  for e in range(2):
    bias = (
      bias_from_visible(causal_seq_visible())
      + rb[e][:, np_bucket(rel, False)][None]
    )
    np.testing.assert_allclose(
      y[e],
      np_mha(x[e], x[e], wq[e], wk[e], wv[e], wo[e], 2, 2, bias),
      rtol=1e-5,
      atol=1e-5,
    )


# ----------------------------------------------------------------------------
# EncDecAttention
# ----------------------------------------------------------------------------


@meshes.parametrize(meshes.ATTENTION_LAYERS, "mesh_layout")
def test_enc_dec_attention_matches_numpy(mesh_layout):
  layer = tl.EncDecAttention(num_heads=4, key_value_size=4)
  scope = "decoder/block_000/layer_001/EncDecAttention"

  def build(mesh):
    ctx = make_context(
      mesh,
      seq=SEQ,
      encoder_output=imp(mesh, ENC, [BATCH, MEMORY, D_MODEL]),
      encoder_sequence_id=imp(mesh, ENC_SEQ, [BATCH, MEMORY], tf.int32),
    )
    with tf1.variable_scope(scope):
      y = layer.call(ctx, imp(mesh, X, [BATCH, LENGTH, D_MODEL]))
    build.shapes = var_shapes(mesh)
    return [y] + [var(mesh, scope + "/" + n) for n in "qkvo"]

  y, wq, wk, wv, wo = mtu.run_program(build, *mesh_layout)
  assert sorted(build.shapes) == sorted(scope + "/" + n for n in "qkvo")
  visible = (SEQ[:, :, None] == ENC_SEQ[:, None, :])[:, None]
  expected = np_mha(X, ENC, wq, wk, wv, wo, 4, 4, bias_from_visible(visible))
  rows = SEQ != 0  # Padding queries see no memory.
  np.testing.assert_allclose(y[rows], expected[rows], rtol=1e-5, atol=1e-5)


def np_relative_spans(enc_ids, dec_ids, first_sentinel, enc_seq, dec_seq):
  """The original's span positions: each decoder token stands at its
  sentinel's encoder position (later packed sequences after earlier ones);
  returns that minus the encoder positions [length, memory_length].
  """
  multiplier = max(len(enc_ids), len(dec_ids))
  enc_span = np.cumsum(enc_ids >= first_sentinel) + enc_seq * multiplier
  dec_span = np.cumsum(dec_ids >= first_sentinel) + dec_seq * multiplier
  dec_pos = (enc_span[None, :] < dec_span[:, None]).sum(axis=1)
  return dec_pos[:, None] - np.arange(len(enc_ids))[None, :]


def test_relative_position_spans_example():
  # Encoder A B <S1> E <S2> G; decoder inputs (shifted targets)
  # BOS <S1> C D <S2> F. Sentinels: ids >= 90. Row 1 packs two sequences.
  enc_ids = np.array([[5, 6, 99, 7, 98, 8]] * 2, np.int32)
  dec_ids = np.array([[0, 99, 10, 11, 98, 12]] * 2, np.int32)
  enc_seq = np.array([[1, 1, 1, 1, 1, 1], [1, 1, 2, 2, 2, 0]], np.int32)
  dec_seq = np.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 2, 2, 0]], np.int32)
  enc_dim = mtf.Dimension("memory_length", 6)
  dec_dim = mtf.Dimension("length", 6)

  def build(mesh):
    ctx = Context(
      StubModel(),
      mesh,
      [BATCH],
      dec_dim,
      F32,
      inputs=imp(mesh, dec_ids, [BATCH, dec_dim], tf.int32),
      encoder_inputs=imp(mesh, enc_ids, [BATCH, enc_dim], tf.int32),
      sequence_id=imp(mesh, dec_seq, [BATCH, dec_dim], tf.int32),
      encoder_sequence_id=imp(mesh, enc_seq, [BATCH, enc_dim], tf.int32),
    )
    return [tl.relative_position_spans(ctx, num_sentinels=10)]

  (got,) = mtu.run_program(
    build, "rows:2;cols:2", "memory_length:rows;length:cols"
  )
  # Row 0: the decoder tokens of span 1 stand at 2, of span 2 at 4.
  np.testing.assert_array_equal(
    got[0], np.array([0, 2, 2, 2, 4, 4])[:, None] - np.arange(6)[None, :]
  )
  for row in range(2):
    np.testing.assert_array_equal(
      got[row],
      np_relative_spans(
        enc_ids[row], dec_ids[row], 90, enc_seq[row], dec_seq[row]
      ),
    )


def test_enc_dec_relative_attention_bias_with_spans():
  enc_ids = np.array([[5, 6, 99, 7, 0]] * 2, np.int32)
  dec_ids = np.array([[0, 99, 10, 11, 0, 0, 0, 0]] * 2, np.int32)
  layer = tl.EncDecAttention(
    num_heads=2, key_value_size=4, relative_attention_type="bias"
  )
  scope = "decoder/block_000/layer_001/EncDecAttention"
  gin.bind_parameter(
    "mesh_tensorflow.transformer.transformer_layers."
    "relative_position_spans.num_sentinels",
    10,
  )
  try:

    def build(mesh):
      ctx = make_context(
        mesh,
        encoder_output=imp(mesh, ENC, [BATCH, MEMORY, D_MODEL]),
        inputs=imp(mesh, dec_ids, [BATCH, LENGTH], tf.int32),
        encoder_inputs=imp(mesh, enc_ids, [BATCH, MEMORY], tf.int32),
      )
      with tf1.variable_scope(scope):
        y = layer.call(ctx, imp(mesh, X, [BATCH, LENGTH, D_MODEL]))
      return [y] + [
        var(mesh, scope + "/" + n)
        for n in ("q", "k", "v", "o", "enc_dec_relative_attention_bias")
      ]

    y, wq, wk, wv, wo, rb = mtu.run_program(
      build, "rows:2;cols:2", "batch:rows;heads:cols"
    )
  finally:
    gin.clear_config()
  assert rb.shape == (2, 32)
  # The decoder tokens from <S> on stand at the sentinel's position, 2.
  relative = np.array([0, 2, 2, 2, 2, 2, 2, 2])[:, None] - np.arange(5)
  np.testing.assert_array_equal(
    relative, np_relative_spans(enc_ids[0], dec_ids[0], 90, 0, 0)
  )
  bucket = np_bucket(relative, True)
  expected = np_mha(X, ENC, wq, wk, wv, wo, 2, 2, rb[:, bucket][None])
  np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)


def test_transparent_enc_dec_attention():
  layer = tl.TransparentEncDecAttention(
    layers_per_encoder_module=2,
    layers_per_decoder_module=1,
    encoder_num_modules=2,
    decoder_num_modules=2,
    num_heads=2,
    key_value_size=4,
  )
  enc_len = mtf.Dimension("length", M)
  enc_outputs = [_rand(B, M, DM) for _ in range(5)]
  scope = "decoder/block_001/layer_001/TransparentEncDecAttention"

  def build(mesh):
    ctx = make_context(
      mesh,
      encoder_layer_outputs=[
        imp(mesh, e, [BATCH, enc_len, D_MODEL]) for e in enc_outputs
      ],
    )
    ctx.layer_index = 1
    with tf1.variable_scope(scope):
      y = layer.call(ctx, imp(mesh, X, [BATCH, LENGTH, D_MODEL]))
    return [y] + [var(mesh, scope + "/" + n) for n in ("q", "k", "v", "o", "w")]

  y, wq, wk, wv, wo, w = mtu.run_program(build, "all:4", "d_model:all")
  assert w.shape == (3, 2)
  chosen = np.stack([enc_outputs[0], enc_outputs[2], enc_outputs[4]])
  mixed = np.einsum("ebmd,e->bmd", chosen, softmax(w, 0)[:, 1])
  expected = np_mha(X, mixed, wq, wk, wv, wo, 2, 2)
  np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)


def test_transparent_enc_dec_attention_requires_sizes():
  # gin reports unbound REQUIRED arguments (as a RuntimeError).
  with pytest.raises(RuntimeError, match="layers_per_encoder_module"):
    tl.TransparentEncDecAttention()


# ----------------------------------------------------------------------------
# LocalSelfAttention
# ----------------------------------------------------------------------------


def window_visible(length, radius, autoregressive):
  rel = np.arange(length)[None, :] - np.arange(length)[:, None]
  return (rel > -radius) & (rel <= (0 if autoregressive else radius - 1))


@meshes.parametrize(meshes.ATTENTION_LAYERS, "mesh_layout")
def test_local_self_attention_short_equals_windowed_attention(mesh_layout):
  layer = tl.LocalSelfAttention(radius=3, num_heads=4, key_value_size=4)
  scope = "encoder/block_000/layer_000/LocalSelfAttention"
  y, w, _ = run_self_attention(
    layer, mesh_layout, causal=False, seq=SEQ, scope=scope
  )
  visible = causal_seq_visible(SEQ, causal=False) & window_visible(L, 3, False)
  expected = np_mha(
    X, X, w["q"], w["k"], w["v"], w["o"], 4, 4, bias_from_visible(visible)
  )
  np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
  "autoregressive,mesh_layout",
  [(True, ("", "")), (False, ("all:4", "length:all"))],
)
def test_local_self_attention_long_uses_blocks(autoregressive, mesh_layout):
  n = 264  # > max(256, 4 * radius): local_attention_1d.
  length = mtf.Dimension("length", n)
  x = _rand(1, n, DM)
  batch = mtf.Dimension("batch", 1)
  layer = tl.LocalSelfAttention(radius=4, num_heads=2, key_value_size=4)
  scope = "decoder/block_000/layer_000/LocalSelfAttention"

  def build(mesh):
    pos = mtf.range(mesh, length, tf.int32)
    model = StubModel(
      autoregressive,
      layout=mesh_layout[1] or None,
      mesh_shape=mesh_layout[0] or None,
    )
    ctx = Context(
      model,
      mesh,
      [batch],
      length,
      F32,
      mode="eval",
      position=pos,
      read_priority=pos if autoregressive else None,
      write_priority=pos if autoregressive else None,
    )
    with tf1.variable_scope(scope):
      y = layer.call(ctx, imp(mesh, x, [batch, length, D_MODEL]))
    ops = [type(op).__name__ for op in mesh.graph.operations]
    build.halo = any("Shift" in name for name in ops)
    return [y] + [var(mesh, scope + "/" + v) for v in "qkvo"]

  y, wq, wk, wv, wo = mtu.run_program(build, *mesh_layout)
  assert build.halo  # The blocked path exchanged halos.
  visible = window_visible(n, 4, autoregressive)
  dkv = 4
  q = np.einsum("bld,dhk->blhk", x, wq.reshape(DM, 2, dkv))
  k = np.einsum("bld,dhk->blhk", x, wk.reshape(DM, 2, dkv))
  v = np.einsum("bld,dhk->blhk", x, wv.reshape(DM, 2, dkv))
  logits = np.einsum("blhk,bmhk->bhlm", q, k) + bias_from_visible(visible)
  o = np.einsum("bhlm,bmhk->blhk", softmax(logits), v)
  expected = np.einsum("blhk,hko->blo", o, wo.reshape(2, dkv, DM))
  np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------
# Errors, gin, signatures
# ----------------------------------------------------------------------------


def test_unknown_relative_attention_type_is_named():
  with pytest.raises(ValueError, match="bogus_type"):
    tl.SelfAttention(relative_attention_type="bogus_type")
  with pytest.raises(ValueError, match="bogus_type"):
    tl.EncDecAttention(relative_attention_type="bogus_type")


def test_unknown_attention_func_is_named():
  with pytest.raises(ValueError, match="softmax_plus"):
    tl.SelfAttention(attention_func="softmax_plus")


def test_heads_not_dividing_mesh_names_the_dimension():
  layer = tl.SelfAttention(num_heads=3, key_value_size=4)
  with pytest.raises(ValueError, match="'heads'"):
    run_self_attention(layer, ("all:4", "heads:all"))


def test_num_memory_heads_must_divide_num_heads():
  layer = tl.SelfAttention(num_heads=4, num_memory_heads=3, key_value_size=4)
  with pytest.raises(ValueError, match="num_memory_heads"):
    run_self_attention(layer, ("", ""))


def test_gin_configurable_under_original_module():
  module = "mesh_tensorflow.transformer.transformer_layers"
  gin.parse_config(
    [
      "%s.SelfAttention.num_heads = 3" % module,
      "%s.LocalSelfAttention.radius = 7" % module,
    ]
  )
  try:
    assert tl.SelfAttention().num_heads == 3
    assert tl.LocalSelfAttention().radius == 7
  finally:
    gin.clear_config()


_E = inspect.Parameter.empty
SIGNATURES = {
  "SelfAttention": [
    ("num_heads", 8),
    ("num_memory_heads", 0),
    ("key_value_size", 128),
    ("shared_kv", False),
    ("dropout_rate", 0.0),
    ("attention_kwargs", None),
    ("relative_attention_type", None),
    ("relative_attention_num_buckets", 32),
    ("attention_func", None),
    ("combine_dims", True),
    ("keep_query_heads_dims", False),
    ("fold_scaling_into_initializer", True),
    ("z_loss_coeff", None),
    ("use_hyperprompt", False),
    ("hyperprompt_mtlshare", False),
    ("hyperprompt_length_encoder", None),
    ("hyperprompt_length_decoder", None),
    ("hyperprompt_hidden_dim", None),
    ("hyperprompt_task_num", 8),
  ],
  "LocalSelfAttention": [
    ("radius", 128),
    ("num_heads", 8),
    ("num_memory_heads", 0),
    ("key_value_size", 128),
    ("shared_kv", False),
    ("dropout_rate", 0.0),
    ("attention_kwargs", None),
  ],
  "attention_params": [
    ("context", _E),
    ("kv_dim", _E),
    ("num_heads", _E),
    ("num_memory_heads", 0),
    ("shared_kv", False),
    ("no_query", False),
    ("combine_dims", True),
    ("keep_query_heads_dims", False),
    ("fold_scaling_into_initializer", True),
  ],
  "enc_dec_attention": [
    ("self_attention_layer", _E),
    ("memory_antecedent", _E),
    ("context", _E),
    ("x", _E),
    ("losses", _E),
    ("attention_fn", None),
    ("z_loss_coeff", None),
  ],
  "enc_dec_attention_bias": [
    ("layer", _E),
    ("context", _E),
    ("heads_dims", _E),
    ("relative_position_fn", None),
  ],
}


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_signature(name):
  fn = getattr(tl, name)
  if inspect.isclass(fn):
    fn = fn.__init__
  params = [
    p for p in inspect.signature(fn).parameters.values() if p.name != "self"
  ]
  got = [
    (
      p.name,
      None if p.name in ("attention_fn", "relative_position_fn") else p.default,
    )
    for p in params
  ]
  assert got == SIGNATURES[name]


def test_method_names_for_subclasses():
  for name in [
    "make_params",
    "compute_bias",
    "memory_length",
    "rename_length_to_memory_length",
    "min_relative_position",
    "max_relative_position",
    "attention_kwargs_from_context",
    "expected_attention_output_shape",
    "layer_output_from_attention_output",
    "kv_dim",
    "attention_fn",
    "call",
  ]:
    assert hasattr(tl.SelfAttention, name), name
  assert issubclass(tl.EncDecAttention, tl.SelfAttention)
  assert issubclass(tl.LocalSelfAttention, tl.SelfAttention)
  assert issubclass(tl.TransparentEncDecAttention, tl.EncDecAttention)


# ----------------------------------------------------------------------------
# attention z-loss and task prompts
# ----------------------------------------------------------------------------


def test_self_attention_z_loss_matches_numpy():
  layer = tl.SelfAttention(num_heads=2, key_value_size=4, z_loss_coeff=0.5)
  mesh_layout = (meshes.ONE_DEVICE, "")

  def build(mesh):
    ctx = make_context(mesh, mode="train", causal=False, seq=SEQ, losses=[])
    with tf1.variable_scope(SCOPE):
      layer.call(ctx, imp(mesh, X, [BATCH, LENGTH, D_MODEL]))
    assert len(ctx.losses) == 1
    return [ctx.losses[0]] + [var(mesh, SCOPE + "/" + n) for n in "qk"]

  z_loss, wq, wk = mtu.run_program(build, *mesh_layout)
  q = np.einsum("bld,dhk->blhk", X, wq.reshape(DM, 2, 4))
  k = np.einsum("bmd,dhk->bmhk", X, wk.reshape(DM, 2, 4))
  logits = np.einsum("blhk,bmhk->bhlm", q, k)
  logits = logits + bias_from_visible(causal_seq_visible(SEQ, causal=False))
  peak = logits.max(-1, keepdims=True)
  log_z = np.log(np.exp(logits - peak).sum(-1)) + peak[..., 0]
  expected = 0.5 * np.mean(log_z**2 * (SEQ != 0)[:, None, :])
  np.testing.assert_allclose(z_loss, expected, rtol=1e-4)


def test_self_attention_without_z_loss_adds_no_loss():
  layer = tl.SelfAttention(num_heads=2, key_value_size=4)

  def build(mesh):
    ctx = make_context(mesh, mode="train", causal=False, losses=[])
    with tf1.variable_scope(SCOPE):
      y = layer.call(ctx, imp(mesh, X, [BATCH, LENGTH, D_MODEL]))
    assert not ctx.losses
    return [y]

  mtu.run_program(build, *(meshes.ONE_DEVICE, ""))


PROMPT_LENGTH, TASKS, PREFIX_HIDDEN = 3, 2, 4
TASK_ID = np.array([[1] * L, [0] * L], np.int32)
PROMPTS = _rand(TASKS, PROMPT_LENGTH, DM)


TASK_NUM = mtf.Dimension("task_num", TASKS)
PREFIX_HIDDEN_DIM = mtf.Dimension("prefix_hidden", PREFIX_HIDDEN)
_TASK_EMB, _TASK_HIDDEN, _TASK_FINAL = (
  mtf.Dimension("task_emb", 3),
  mtf.Dimension("task_hidden", 4),
  mtf.Dimension("task_final", 3),
)
# HyperPrompt's shared parameters: name -> (dims, value).
HYPERNET = {
  "task_raw_embedding": ([TASK_NUM, _TASK_EMB], _rand(TASKS, 3)),
  "layer_embedding": (
    [mtf.Dimension("layers", 2), mtf.Dimension("task_emb", 2)],
    _rand(2, 2),
  ),
  "task_projector_layer_one": (
    [mtf.Dimension("task_emb", 5), _TASK_HIDDEN],
    _rand(5, 4),
  ),
  "task_projector_layer_two": ([_TASK_HIDDEN, _TASK_FINAL], _rand(4, 3)),
}
for _kind in "kv":
  HYPERNET["hypernet_w_%s_up" % _kind] = (
    [_TASK_FINAL, D_MODEL, PREFIX_HIDDEN_DIM],
    _rand(3, DM, PREFIX_HIDDEN),
  )
  HYPERNET["hypernet_w_%s_down" % _kind] = (
    [
      _TASK_FINAL,
      PREFIX_HIDDEN_DIM,
      mtf.Dimension("heads", 2),
      mtf.Dimension("d_kv", 4),
    ],
    _rand(3, PREFIX_HIDDEN, 2, 4),
  )


def np_layer_norm(x):
  x = x - x.mean(-1, keepdims=True)
  return x / np.sqrt((x**2).mean(-1, keepdims=True) + 1e-6)


def run_prompted_layer(
  scope, prompted=True, use_hyperprompt=False, causal=False, seq=None
):
  """Task-prompted SelfAttention in the encoder tower (MTL-Prompt with
  per-task networks, or HyperPrompt).
  """
  layer = tl.SelfAttention(
    num_heads=2,
    key_value_size=4,
    hyperprompt_length_encoder=PROMPT_LENGTH,
    hyperprompt_length_decoder=PROMPT_LENGTH,
    hyperprompt_hidden_dim=PREFIX_HIDDEN,
    hyperprompt_task_num=TASKS,
    use_hyperprompt=use_hyperprompt,
  )
  task_num = TASK_NUM
  prompt_dim = mtf.Dimension("memory_length", PROMPT_LENGTH)
  names = ["q", "k", "v", "o"] + [
    "prompt/w_%s_%s" % (kind, side)
    for kind in "kv"
    for side in ("up", "down")
    if prompted and not use_hyperprompt
  ]

  def build(mesh):
    shared = {"prompts": imp(mesh, PROMPTS, [task_num, prompt_dim, D_MODEL])}
    if use_hyperprompt:
      shared.update(
        {
          name: imp(mesh, value, dims)
          for name, (dims, value) in HYPERNET.items()
        }
      )
    ctx = make_context(
      mesh, causal=causal, seq=seq, shared_params={scope.split("/")[0]: shared}
    )
    ctx.cache["task-id"] = imp(mesh, TASK_ID, [BATCH, LENGTH], tf.int32)
    with tf1.variable_scope(scope):
      y = layer.call(ctx, imp(mesh, X, [BATCH, LENGTH, D_MODEL]))
    build.shapes = var_shapes(mesh)
    return [y] + [var(mesh, scope + "/" + n) for n in names]

  outs = mtu.run_program(build, *(meshes.ONE_DEVICE, ""))
  return outs[0], dict(zip(names, outs[1:])), build.shapes


def test_mtl_prompts_are_prepended_per_task():
  scope = "encoder/layer_001/SelfAttention"
  y, w, shapes = run_prompted_layer(scope)
  assert shapes[scope + "/prompt/w_k_up"] == [TASKS, DM, PREFIX_HIDDEN]
  assert shapes[scope + "/prompt/w_v_down"] == [TASKS, PREFIX_HIDDEN, 2, 4]
  check_prompted_attention(
    y,
    w,
    lambda kind: (w["prompt/w_%s_up" % kind], w["prompt/w_%s_down" % kind]),
  )


def check_prompted_attention(y, w, task_networks, visible=None):
  """y against numpy; task_networks(kind) -> per-task (up, down) kernels;
  visible [b|1, 1, l, l]: which tokens each query sees (prompts: all).
  """
  # Layer-norm scales start at 1 and biases at 0.
  norm = np_layer_norm(PROMPTS)

  def prompt_kv(kind):
    up, down = task_networks(kind)
    hidden = np.maximum(np.einsum("tpd,tdh->tph", norm, up), 0)
    per_task = np.einsum("tph,thnk->tpnk", hidden, down)
    return per_task[TASK_ID[:, 0]]  # [b, p, heads, d_kv]

  q = np.einsum("bld,dhk->blhk", X, w["q"].reshape(DM, 2, 4))
  k = np.einsum("bmd,dhk->bmhk", X, w["k"].reshape(DM, 2, 4))
  v = np.einsum("bmd,dhk->bmhk", X, w["v"].reshape(DM, 2, 4))
  k = np.concatenate([prompt_kv("k"), k], axis=1)
  v = np.concatenate([prompt_kv("v"), v], axis=1)
  logits = np.einsum("blhk,bmhk->bhlm", q, k)
  if visible is not None:
    visible = np.broadcast_to(visible, (B, 1, L, L))
    logits = logits + bias_from_visible(
      np.concatenate([np.ones((B, 1, L, PROMPT_LENGTH), bool), visible], -1)
    )
  weights = softmax(logits)
  o = np.einsum("bhlm,bmhk->blhk", weights, v)
  expected = np.einsum("blhk,hko->blo", o, w["o"].reshape(2, 4, DM))
  np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-5)


def test_decoder_prompts_with_causal_packed_tokens():
  scope = "decoder/layer_000/SelfAttention"
  y, w, _ = run_prompted_layer(scope, causal=True, seq=SEQ)
  check_prompted_attention(
    y,
    w,
    lambda kind: (w["prompt/w_%s_up" % kind], w["prompt/w_%s_down" % kind]),
    visible=causal_seq_visible(SEQ),
  )


def test_prompts_only_in_their_tower():
  # A layer outside the encoder and decoder towers is plain attention.
  scope = "other/layer_001/SelfAttention"
  y, w, shapes = run_prompted_layer(scope, prompted=False)
  assert not any("prompt" in name for name in shapes)
  expected = np_mha(X, X, w["q"], w["k"], w["v"], w["o"], 2, 2)
  np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-5)


def test_hyperprompt_networks_come_from_the_hypernetwork():
  y, w, shapes = run_prompted_layer(
    "encoder/layer_001/SelfAttention", use_hyperprompt=True
  )
  assert not any("prompt/w_" in name for name in shapes)
  value = {name: v for name, (_, v) in HYPERNET.items()}
  # Layer 1's embedding next to each task's embedding.
  task_and_layer = np.concatenate(
    [
      value["task_raw_embedding"],
      np.repeat(value["layer_embedding"][1:], TASKS, 0),
    ],
    -1,
  )
  hidden = np.maximum(task_and_layer @ value["task_projector_layer_one"], 0)
  embedding = np_layer_norm(hidden @ value["task_projector_layer_two"])

  def networks(kind):
    return (
      np.einsum("tf,fdh->tdh", embedding, value["hypernet_w_%s_up" % kind]),
      np.einsum("tf,fhnk->thnk", embedding, value["hypernet_w_%s_down" % kind]),
    )

  check_prompted_attention(y, w, networks)
