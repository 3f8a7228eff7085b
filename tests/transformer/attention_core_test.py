"""Tests for transformer.attention.

Its modules: transformer/_src/layers/attention_core.py, attention_params.py and
local_attention.py.

attention / hybrid / synthetic / local attention and AttentionParams against
numpy, on the 1-device mesh and 4-device meshes under several layouts.
"""

import inspect

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mesh_test_util as mtu
from tests import meshes
from transformer import attention as att

tf1 = tf.compat.v1

BATCH = mtf.Dimension("batch", 2)
LENGTH = mtf.Dimension("length", 8)
MEMORY = mtf.Dimension("memory_length", 8)
HEADS = mtf.Dimension("heads", 4)
D_KV = mtf.Dimension("d_kv", 4)
D_MODEL = mtf.Dimension("d_model", 8)
F32 = mtf.VariableDType(tf.float32)

_RNG = np.random.RandomState(7)


def _rand(*shape):
  return _RNG.randn(*shape).astype(np.float32)


def imp(mesh, value, dims, dtype=tf.float32):
  return mtf.import_tf_tensor(
    mesh, tf.constant(value, dtype=dtype), mtf.Shape(dims)
  )


def softmax(x, axis=-1):
  x = x - x.max(axis=axis, keepdims=True)
  e = np.exp(x)
  return e / e.sum(axis=axis, keepdims=True)


Q = _rand(2, 8, 4, 4)  # [batch, length, heads, d_kv]
K = _rand(2, 8, 4, 4)  # [batch, memory_length, heads, d_kv]
V = _rand(2, 8, 4, 4)
BIAS = np.where(_RNG.rand(8, 8) < 0.3, -1e9, 0.0).astype(np.float32)
BIAS[:, 0] = 0.0


def np_attention(q, k, v, bias=None, extra_logit=None):
  logits = np.einsum("blhd,bmhd->blhm", q, k)
  if bias is not None:
    logits = logits + bias
  if extra_logit is not None:
    m = np.maximum(logits.max(-1, keepdims=True), extra_logit)
    e = np.exp(logits - m)
    w = e / (e.sum(-1, keepdims=True) + np.exp(extra_logit - m))
  else:
    w = softmax(logits)
  return np.einsum("blhm,bmhd->blhd", w, v)


@meshes.parametrize(meshes.TRANSFORMER_ATTENTION, "mesh_layout")
def test_attention_matches_numpy(mesh_layout):
  def build(mesh):
    q = imp(mesh, Q, [BATCH, LENGTH, HEADS, D_KV])
    k = imp(mesh, K, [BATCH, MEMORY, HEADS, D_KV])
    v = imp(mesh, V, [BATCH, MEMORY, HEADS, D_KV])
    bias = imp(mesh, BIAS, [LENGTH, MEMORY])
    return [
      att.attention(q, k, v, MEMORY, D_KV, D_KV, bias=bias),
      att.attention(q, k, v, MEMORY, D_KV, D_KV, extra_logit=0.0),
    ]

  got = mtu.run_program(build, *mesh_layout)
  mtu.assert_all_close(
    got,
    [
      np_attention(Q, K, V, BIAS[:, None, :]),
      np_attention(Q, K, V, extra_logit=0.0),
    ],
  )


def test_attention_output_dims_and_value_dim():
  d_v = mtf.Dimension("d_v", 3)
  v = _rand(2, 8, 4, 3)

  def build(mesh):
    o = att.attention(
      imp(mesh, Q, [BATCH, LENGTH, HEADS, D_KV]),
      imp(mesh, K, [BATCH, MEMORY, HEADS, D_KV]),
      imp(mesh, v, [BATCH, MEMORY, HEADS, d_v]),
      MEMORY,
      D_KV,
      d_v,
    )
    assert o.shape == mtf.Shape([BATCH, LENGTH, HEADS, d_v])
    return [o]

  got = mtu.run_program(build, "all:4", "heads:all")
  mtu.assert_all_close(got, [np_attention(Q, K, v)])


def test_attention_logits_are_batches_of_length_by_memory_matrices():
  """The logits put the dims of both q and k first, so q . k, weights . v
  and their gradients are batched matmuls that never transpose them.
  """
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  q = imp(mesh, Q, [BATCH, LENGTH, HEADS, D_KV])
  k = imp(mesh, K, [BATCH, MEMORY, HEADS, D_KV])
  v = imp(mesh, V, [BATCH, MEMORY, HEADS, D_KV])
  o = att.attention(
    q, k, v, MEMORY, D_KV, D_KV, bias=imp(mesh, BIAS, [LENGTH, MEMORY])
  )
  mtf.gradients([mtf.reduce_sum(o)], [q, k, v])
  shapes = {
    op.outputs[0].shape.to_string
    for op in graph.operations
    if isinstance(op, mtf.EinsumOperation)
    and {LENGTH, MEMORY} <= set(op.outputs[0].shape.dims)
  }
  assert shapes == {mtf.Shape([BATCH, HEADS, LENGTH, MEMORY]).to_string}


def test_attention_multi_query():
  k = _rand(2, 8, 4)
  v = _rand(2, 8, 4)

  def build(mesh):
    return [
      att.attention(
        imp(mesh, Q, [BATCH, LENGTH, HEADS, D_KV]),
        imp(mesh, k, [BATCH, MEMORY, D_KV]),
        imp(mesh, v, [BATCH, MEMORY, D_KV]),
        MEMORY,
        D_KV,
        D_KV,
      )
    ]

  expected = np_attention(
    Q, np.repeat(k[:, :, None], 4, 2), np.repeat(v[:, :, None], 4, 2)
  )
  for mesh_layout in [("", ""), ("rows:2;cols:2", "batch:rows;heads:cols")]:
    mtu.assert_all_close(mtu.run_program(build, *mesh_layout), [expected])


def test_attention_dropout_only_in_training():
  class Ctx:
    train = False
    model = None

  def build(mesh):
    args = (
      imp(mesh, Q, [BATCH, LENGTH, HEADS, D_KV]),
      imp(mesh, K, [BATCH, MEMORY, HEADS, D_KV]),
      imp(mesh, V, [BATCH, MEMORY, HEADS, D_KV]),
      MEMORY,
      D_KV,
      D_KV,
    )
    ctx = Ctx()
    eval_out = att.attention(*args, dropout_rate=0.5, context=ctx)
    ctx_train = Ctx()
    ctx_train.train = True
    train_out = att.attention(
      *args,
      dropout_rate=0.5,
      context=ctx_train,
      dropout_broadcast_dims=[LENGTH],
    )
    return [eval_out, train_out]

  eval_out, train_out = mtu.run_program(build)
  np.testing.assert_allclose(eval_out, np_attention(Q, K, V), atol=1e-5)
  assert not np.allclose(train_out, eval_out, atol=1e-3)


def test_attention_rejects_memory_dim_in_q():
  def build(mesh):
    q = imp(mesh, Q, [BATCH, LENGTH, HEADS, D_KV])
    k = imp(mesh, K, [BATCH, LENGTH, HEADS, D_KV])
    return [att.attention(q, k, k, LENGTH, D_KV, D_KV)]

  with pytest.raises(ValueError, match="length"):
    mtu.run_program(build)


def test_attention_rejects_missing_key_dim():
  other = mtf.Dimension("d_other", 4)

  def build(mesh):
    q = imp(mesh, Q, [BATCH, LENGTH, HEADS, other])
    k = imp(mesh, K, [BATCH, MEMORY, HEADS, D_KV])
    return [att.attention(q, k, k, MEMORY, D_KV, D_KV)]

  with pytest.raises(ValueError, match="d_kv"):
    mtu.run_program(build)


def test_visibility_mask_to_attention_bias():
  vis = _RNG.rand(2, 8) < 0.5

  def build(mesh):
    visible = mtf.cast(
      imp(mesh, vis.astype(np.float32), [BATCH, LENGTH]), tf.bool
    )
    return [att.visibility_mask_to_attention_bias(visible, tf.float32)]

  (got,) = mtu.run_program(build)
  np.testing.assert_array_equal(got, np.where(vis, 0.0, -1e9))


# ----------------------------------------------------------------------------
# AttentionParams
# ----------------------------------------------------------------------------


def _params_vars(mesh, **kwargs):
  defaults = dict(query_heads_dims=[HEADS], memory_heads_dims=[HEADS])
  defaults.update(kwargs)
  with tf1.variable_scope("attn"):
    p = att.AttentionParams(
      mesh,
      D_MODEL,
      D_MODEL,
      D_MODEL,
      D_KV,
      D_KV,
      variable_dtype=F32,
      **defaults,
    )
  return p, {n: v.shape for n, v in mesh.graph.name_to_variable.items()}


@pytest.mark.parametrize(
  "kwargs,expected",
  [
    (
      {},
      {
        "attn/q": [8, 16],
        "attn/k": [8, 16],
        "attn/v": [8, 16],
        "attn/o": [16, 8],
      },
    ),
    (
      {"combine_dims": False},
      {
        "attn/q": [8, 4, 4],
        "attn/k": [8, 4, 4],
        "attn/v": [8, 4, 4],
        "attn/o": [4, 4, 8],
      },
    ),
    (
      {"shared_kv": True},
      {"attn/q": [8, 16], "attn/kv": [8, 16], "attn/o": [16, 8]},
    ),
    (
      {"memory_heads_dims": []},  # multi-query
      {
        "attn/q": [8, 16],
        "attn/k": [8, 4],
        "attn/v": [8, 4],
        "attn/o": [16, 8],
      },
    ),
    (
      {"query_heads_dims": [], "memory_heads_dims": []},
      {"attn/q": [8, 4], "attn/k": [8, 4], "attn/v": [8, 4], "attn/o": [4, 8]},
    ),
    (
      {"no_query": True},
      {"attn/k": [8, 16], "attn/v": [8, 16], "attn/o": [16, 8]},
    ),
    (
      {"ensemble_dim": mtf.Dimension("ensemble", 3)},
      {
        "attn/q": [3, 8, 16],
        "attn/k": [3, 8, 16],
        "attn/v": [3, 8, 16],
        "attn/o": [3, 16, 8],
      },
    ),
  ],
)
def test_attention_params_variables(kwargs, expected):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  with mtf.variable_store(mtf.VariableStore()):
    _, shapes = _params_vars(mesh, **kwargs)
  assert {n: s.to_integer_list for n, s in shapes.items()} == expected
  if not kwargs:
    assert [d.name for d in shapes["attn/q"].dims] == ["d_model", "heads"]
    assert [d.name for d in shapes["attn/o"].dims] == ["heads", "d_model"]
  if "memory_heads_dims" in kwargs and kwargs.get("query_heads_dims") is None:
    assert [d.name for d in shapes["attn/k"].dims] == ["d_model", "d_kv"]


def test_attention_params_shared_kv_needs_equal_dims():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  with pytest.raises(ValueError, match="shared_kv"):
    att.AttentionParams(
      mesh,
      D_MODEL,
      D_MODEL,
      D_MODEL,
      D_KV,
      mtf.Dimension("d_v", 2),
      [HEADS],
      [HEADS],
      F32,
      shared_kv=True,
      make_attention_vars=False,
    )


def _init_stds(fold=True, unit=False):
  d_model = mtf.Dimension("d_model", 64)
  heads = mtf.Dimension("heads", 4)
  d_kv = mtf.Dimension("d_kv", 32)

  def build(mesh):
    p = att.AttentionParams(
      mesh,
      d_model,
      d_model,
      d_model,
      d_kv,
      d_kv,
      [heads],
      [heads],
      F32,
      fold_scaling_into_initializer=fold,
    )
    return [p.wq, p.wk, p.wv, p.wo]

  if unit:
    with gin.config_scope(None):
      gin.bind_parameter(
        "mesh_tensorflow.layers.unit_scaling_convention.value", True
      )
      try:
        values = mtu.run_program(build)
      finally:
        gin.clear_config()
  else:
    values = mtu.run_program(build)
  return [float(np.std(v)) for v in values]


def test_attention_params_initializer_stddevs():
  q, k, v, o = _init_stds()
  np.testing.assert_allclose(
    [q, k, v, o],
    [64**-0.5 * 32**-0.5, 64**-0.5, 64**-0.5, 128**-0.5],
    rtol=0.05,
  )
  q_unfolded = _init_stds(fold=False)[0]
  np.testing.assert_allclose(q_unfolded, 64**-0.5, rtol=0.05)
  np.testing.assert_allclose(_init_stds(unit=True), [1.0] * 4, rtol=0.05)


@meshes.parametrize(meshes.ATTENTION_LAYERS, "mesh_layout")
@pytest.mark.parametrize(
  "variant", ["combined", "separate", "unfolded", "multi_query"]
)
def test_attention_params_compute_matches_numpy(variant, mesh_layout):
  x = _rand(2, 8, 8)
  kwargs = {
    "combined": {},
    "separate": {"combine_dims": False},
    "unfolded": {"fold_scaling_into_initializer": False},
    "multi_query": {"memory_heads_dims": []},
  }[variant]

  def build(mesh):
    xt = imp(mesh, x, [BATCH, LENGTH, D_MODEL])
    p, _ = _params_vars(mesh, **kwargs)
    q, k, v = p.compute_q(xt), p.compute_k(xt), p.compute_v(xt)
    out = p.compute_output(q)  # q has o's dims: [.., heads, d_kv].
    return [q, k, v, out, p.wq, p.wk, p.wv, p.wo]

  q, k, v, out, wq, wk, wv, wo = mtu.run_program(build, *mesh_layout)
  heads_k = 1 if variant == "multi_query" else 4
  wq = wq.reshape(8, 4, 4)
  expected_q = np.einsum("bld,dhk->blhk", x, wq)
  if variant == "unfolded":
    expected_q = expected_q / 2.0  # d_kv ** -0.5
  np.testing.assert_allclose(q, expected_q, rtol=1e-5, atol=1e-5)
  expected_k = np.einsum("bld,dhk->blhk", x, wk.reshape(8, heads_k, 4))
  expected_v = np.einsum("bld,dhk->blhk", x, wv.reshape(8, heads_k, 4))
  if variant == "multi_query":
    expected_k, expected_v = expected_k[:, :, 0], expected_v[:, :, 0]
  np.testing.assert_allclose(k, expected_k, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(v, expected_v, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(
    out,
    np.einsum("blhk,hko->blo", q, wo.reshape(4, 4, 8)),
    rtol=1e-5,
    atol=1e-5,
  )


def test_attention_params_compute_output_keeps_heads():
  x = _rand(2, 8, 8)

  def build(mesh):
    xt = imp(mesh, x, [BATCH, LENGTH, D_MODEL])
    p, _ = _params_vars(mesh, keep_query_heads_dims=True)
    q = p.compute_q(xt)
    out = p.compute_output(q, output_shape=[BATCH, LENGTH, HEADS, D_MODEL])
    return [q, out, p.wo]

  q, out, wo = mtu.run_program(build, "all:4", "heads:all")
  np.testing.assert_allclose(
    out,
    np.einsum("blhk,hko->blho", q, wo.reshape(4, 4, 8)),
    rtol=1e-5,
    atol=1e-5,
  )


def test_attention_params_simple():
  def build(mesh):
    p = att.attention_params_simple(mesh, D_MODEL, D_KV, HEADS, F32)
    assert p.q_dims == [HEADS, D_KV] and p.o_dims == [HEADS, D_KV]
    assert p.k_dims == [HEADS, D_KV] and p.v_dims == [HEADS, D_KV]
    return [p.wq, p.wo]

  wq, wo = mtu.run_program(build)
  assert wq.shape == (8, 16) and wo.shape == (16, 8)


# ----------------------------------------------------------------------------
# hybrid, synthetic, 2-d sharding
# ----------------------------------------------------------------------------


class _Ctx:
  """Minimal context: mesh, variable dtype, mode, train, model."""

  def __init__(self, mesh, mode="eval", model=None, position=None):
    self.mesh = mesh
    self.variable_dtype = F32
    self.mode = mode
    self.train = mode == "train"
    self.model = model
    self.position = position


def test_hybrid_attention_matches_numpy():
  def build(mesh):
    q = imp(mesh, Q, [BATCH, LENGTH, HEADS, D_KV])
    k = imp(mesh, K, [BATCH, MEMORY, HEADS, D_KV])
    v = imp(mesh, V, [BATCH, MEMORY, HEADS, D_KV])
    bias = imp(mesh, BIAS, [LENGTH, MEMORY])
    return [
      att.hybrid_attention(q, k, v, _Ctx(mesh), MEMORY, D_KV, D_KV, bias=bias)
    ]

  logits = np.einsum("blhd,bmhd->blhm", Q, K) + BIAS[:, None, :]
  upper = softmax(logits, -1)
  with np.errstate(divide="ignore"):
    lower = np.log(softmax(logits, 1))
  weights = 0.5 * softmax(lower, -1) + 0.5 * upper
  expected = np.einsum("blhm,bmhd->blhd", weights, V)
  for mesh_layout in [("", ""), ("rows:2;cols:2", "batch:rows;heads:cols")]:
    mtu.assert_all_close(
      mtu.run_program(build, *mesh_layout), [expected], atol=1e-4
    )


def test_synthetic_attention_random_plus_alpha():
  def build(mesh):
    q = imp(mesh, Q, [BATCH, LENGTH, HEADS, D_KV])
    k = imp(mesh, K, [BATCH, MEMORY, HEADS, D_KV])
    v = imp(mesh, V, [BATCH, MEMORY, HEADS, D_KV])
    o = att.synthetic_attention(
      q, k, v, MEMORY, D_KV, D_KV, max_length=10, context=_Ctx(mesh)
    )
    r = mesh.graph.name_to_variable["R"].outputs[0]
    assert r.shape.to_integer_list == [10, 4, 10]
    return [o, r]

  o, r = mtu.run_program(build, "all:4", "heads:all")
  logits = 0.5 * np.einsum("blhd,bmhd->blhm", Q, K) + 0.5 * r[:8, :, :8][None]
  expected = np.einsum("blhm,bmhd->blhd", softmax(logits), V)
  np.testing.assert_allclose(o, expected, rtol=1e-5, atol=1e-5)


def test_synthetic_attention_rejects_unknown_mode():
  def build(mesh):
    q = imp(mesh, Q, [BATCH, LENGTH, HEADS, D_KV])
    k = imp(mesh, K, [BATCH, MEMORY, HEADS, D_KV])
    return [
      att.synthetic_attention(
        q, k, k, MEMORY, D_KV, D_KV, synthesize_mode="bogus", context=_Ctx(mesh)
      )
    ]

  with pytest.raises(ValueError, match="bogus"):
    mtu.run_program(build)


class _Model:
  def __init__(self, layout, mesh_shape):
    self.layout = layout
    self.mesh_shape = mesh_shape


def test_2d_sharding_reshape_keeps_values():
  def build(mesh):
    q = imp(mesh, Q, [BATCH, LENGTH, HEADS, D_KV])
    k = imp(mesh, K, [BATCH, MEMORY, HEADS, D_KV])
    v = imp(mesh, V, [BATCH, MEMORY, HEADS, D_KV])
    none = att.maybe_reshape_attention_input_for_2d_sharding(
      None, q, k, v, None, [D_KV]
    )
    assert none[0] is q and none[1] is k and none[2] is v
    ctx = _Ctx(mesh, model=_Model("batch:rows;d_kv:cols", "rows:2;cols:2"))
    q2, k2, _, _ = att.maybe_reshape_attention_input_for_2d_sharding(
      ctx, q, k, v, None, [D_KV]
    )
    assert "d_kv" not in q2.shape.dimension_names
    assert "d_kv" not in k2.shape.dimension_names
    o = att.attention(q, k, v, MEMORY, D_KV, D_KV, context=ctx)
    assert o.shape == q.shape
    return [o]

  got = mtu.run_program(build, "rows:2;cols:2", "batch:rows;d_kv:cols")
  mtu.assert_all_close(got, [np_attention(Q, K, V)])


# ----------------------------------------------------------------------------
# local_attention_1d
# ----------------------------------------------------------------------------


def np_local_mask(
  length, radius, autoregressive, seq=None, read=None, write=None
):
  rel = np.arange(length)[None, :] - np.arange(length)[:, None]
  visible = (rel > -radius) & (rel <= (0 if autoregressive else radius - 1))
  visible = np.broadcast_to(visible, (2, length, length))
  if seq is not None:
    visible = visible & (seq[:, :, None] == seq[:, None, :])
  if read is not None:
    visible = visible & (read[:, :, None] >= write[:, None, :])
  return np.where(visible, 0.0, -1e9).astype(np.float32)


@pytest.mark.parametrize(
  "radius,autoregressive,packed,mesh_layout",
  [
    (3, True, True, ("", "")),
    (3, True, False, ("", "")),
    (3, False, True, ("all:4", "length:all")),
    (70, False, True, ("all:4", "length:all")),
    (70, False, False, ("all:4", "length:all")),
    (5, True, False, ("rows:2;cols:2", "length:rows;heads:cols")),
  ],
)
def test_local_attention_1d_matches_windowed_full_attention(
  radius, autoregressive, packed, mesh_layout
):
  n = 256
  length = mtf.Dimension("length", n)
  heads = mtf.Dimension("heads", 2)
  q, k, v = _rand(2, n, 2, 4), _rand(2, n, 2, 4), _rand(2, n, 2, 4)
  seq = np.repeat(np.array([[1] * 100 + [2] * 156, [1] * 256]), 1, 0)
  seq = seq.astype(np.int32)
  read = np.tile(np.arange(n, dtype=np.int32) // 3, (2, 1))
  write = np.tile(np.arange(n, dtype=np.int32) // 2, (2, 1))
  splits = (
    mtf.tensor_dim_to_mesh_dim_size(mesh_layout[1], mesh_layout[0], length)
    if mesh_layout[0]
    else 1
  )

  def build(mesh):
    dims = [BATCH, length, heads, D_KV]
    return [
      att.local_attention_1d(
        imp(mesh, q, dims),
        imp(mesh, k, dims),
        imp(mesh, v, dims),
        length,
        D_KV,
        D_KV,
        fully_autoregressive=autoregressive,
        length_dim_num_splits=splits,
        radius=radius,
        sequence_id=(
          imp(mesh, seq, [BATCH, length], tf.int32) if packed else 1
        ),
        read_priority=(
          imp(mesh, read, [BATCH, length], tf.int32) if packed else None
        ),
        write_priority=(
          imp(mesh, write, [BATCH, length], tf.int32) if packed else None
        ),
      )
    ]

  (got,) = mtu.run_program(build, *mesh_layout)
  if packed:
    bias = np_local_mask(n, radius, autoregressive, seq, read, write)
  else:
    bias = np_local_mask(n, radius, autoregressive)
  expected = np_attention(q, k, v, bias[:, :, None, :])
  # Rows without any visible memory are not compared (0/0 in both).
  has_memory = (bias > -1).any(-1)
  np.testing.assert_allclose(
    got[has_memory], expected[has_memory], rtol=1e-5, atol=1e-5
  )


def test_local_attention_1d_rejects_bad_splits():
  length = mtf.Dimension("length", 6)

  def build(mesh):
    q = imp(mesh, Q[:, :6], [BATCH, length, HEADS, D_KV])
    return [
      att.local_attention_1d(
        q, q, q, length, D_KV, D_KV, length_dim_num_splits=4
      )
    ]

  with pytest.raises(ValueError, match="length_dim_num_splits"):
    mtu.run_program(build)


# ----------------------------------------------------------------------------
# Signatures
# ----------------------------------------------------------------------------

_E = inspect.Parameter.empty
SIGNATURES = {
  "attention": [
    ("q", _E),
    ("k", _E),
    ("v", _E),
    ("memory_length_dim", _E),
    ("key_dim", _E),
    ("value_dim", _E),
    ("bias", None),
    ("dropout_rate", 0.0),
    ("dropout_broadcast_dims", None),
    ("extra_logit", None),
    ("context", None),
    ("float32_logits", True),
    ("z_loss_coeff", None),
  ],
  "hybrid_attention": [
    ("q", _E),
    ("k", _E),
    ("v", _E),
    ("context", _E),
    ("memory_length_dim", _E),
    ("key_dim", _E),
    ("value_dim", _E),
    ("bias", None),
    ("dropout_rate", 0.0),
    ("dropout_broadcast_dims", None),
    ("extra_logit", None),
  ],
  "AttentionParams": [
    ("mesh", _E),
    ("query_input_dim", _E),
    ("memory_input_dim", _E),
    ("output_dim", _E),
    ("key_dim", _E),
    ("value_dim", _E),
    ("query_heads_dims", _E),
    ("memory_heads_dims", _E),
    ("variable_dtype", _E),
    ("shared_kv", False),
    ("no_query", False),
    ("combine_dims", True),
    ("ensemble_dim", None),
    ("keep_query_heads_dims", False),
    ("fold_scaling_into_initializer", True),
    ("make_attention_vars", True),
  ],
  "attention_params_simple": [
    ("mesh", _E),
    ("io_dim", _E),
    ("kv_dim", _E),
    ("heads_dim", _E),
    ("variable_dtype", _E),
  ],
  "local_attention_1d": [
    ("q", _E),
    ("k", _E),
    ("v", _E),
    ("length_dim", _E),
    ("key_dim", _E),
    ("value_dim", _E),
    ("fully_autoregressive", True),
    ("length_dim_num_splits", 1),
    ("radius", 128),
    ("sequence_id", 1),
    ("write_priority", None),
    ("read_priority", None),
    ("attention_kwargs", None),
  ],
  "visibility_mask_to_attention_bias": [("visible", _E), ("dtype", _E)],
  "maybe_reshape_attention_input_for_2d_sharding": [
    ("context", _E),
    ("q", _E),
    ("k", _E),
    ("v", _E),
    ("bias", _E),
    ("unsplittable_dims", _E),
  ],
}


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_signature(name):
  fn = getattr(att, name)
  params = list(inspect.signature(fn).parameters.values())
  if params and params[0].name == "self":
    params = params[1:]
  assert [(p.name, p.default) for p in params] == SIGNATURES[name]


def test_synthetic_attention_signature_tail():
  params = inspect.signature(att.synthetic_attention).parameters
  assert list(params)[-5:] == [
    "synthesize",
    "synthesize_mode",
    "factorized_dim",
    "max_length",
    "context",
  ]
  assert params["synthesize_mode"].default == "random_plus_alpha"


def test_mesh_tensorflow_alias_is_same_module():
  # pylint: disable-next=g-import-not-at-top
  from mesh_tensorflow.transformer import attention as alias

  assert alias.attention is att.attention
