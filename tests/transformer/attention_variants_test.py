"""Tests for the attention research variants (attention_variants.py).

Every layer is compared with a numpy formulation computed from its own
exported variables (or from pre-created known weights); talking heads with
identity head maps, and with identical heads dims, equal plain multi-head
attention and SelfAttention with the same weights; decoding ("first_part"
then "incremental" steps in one graph) reproduces the full causal pass.
"""

import contextlib
import types

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mesh_test_util as mtu
from tests import meshes
from transformer import transformer
from transformer import transformer_layers
from transformer._src.layers import attention_variants as av
from transformer._src.layers import context as context_lib
from transformer._src.layers import dense_layers
from transformer._src.layers import self_attention

tf1 = tf.compat.v1

B, L, D, M = 2, 5, 8, 4
BATCH = mtf.Dimension("batch", B)
LENGTH = mtf.Dimension("length", L)
D_MODEL = mtf.Dimension("d_model", D)
MEMORY = mtf.Dimension("memory_length", M)
NEG = -1e9

_RNG = np.random.RandomState(5)
X = _RNG.normal(size=(B, L, D)).astype(np.float32)
ENC = _RNG.normal(size=(B, M, D)).astype(np.float32)
CAUSAL = np.tril(np.ones((L, L), bool))


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


def _context(mesh, mode="eval", causal=False, **kwargs):
  if causal and mode != "incremental":
    pos = mtf.range(mesh, LENGTH, tf.int32)
    kwargs.update(read_priority=pos, write_priority=pos)
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


def _x(mesh, value=X):
  return mtf.import_tf_tensor(mesh, value, [BATCH, LENGTH, D_MODEL])


def _enc(mesh):
  return mtf.import_tf_tensor(mesh, ENC, [BATCH, MEMORY, D_MODEL])


def _make_vars(mesh, values):
  """Pre-creates variables {name: (dims, value)} with known values."""
  for name, (dims, value) in values.items():
    scope, _, var = name.rpartition("/")
    with tf1.variable_scope(scope) if scope else contextlib.nullcontext():
      mtf.get_variable(
        mesh, var, dims, initializer=tf1.constant_initializer(value)
      )


def _softmax(x):
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _mask(logits, visible):
  """logits [b, l, h, m]; visible None, [l, m] or broadcastable."""
  if visible is None:
    return logits
  if visible.ndim == 2:
    visible = visible[None, :, None, :]
  return np.where(visible, logits, NEG)


def _mha(x, m, wq, wk, wv, wo, visible=None):
  """Plain multi-head attention; w* [d, h, k], wo [h, k, d]."""
  q = np.einsum("bld,dhk->blhk", x, wq)
  k = np.einsum("bmd,dhk->bmhk", m, wk)
  v = np.einsum("bmd,dhk->bmhk", m, wv)
  w = _softmax(_mask(np.einsum("blhk,bmhk->blhm", q, k), visible))
  return np.einsum("blhm,bmhk,hkd->bld", w, v, wo)


def _weights(seed, shape, scale=0.5):
  return (
    np.random.RandomState(seed).normal(size=shape).astype(np.float32) * scale
  )


# ----------------------------------------------------------------------------
# Talking heads.


def _th_reference(
  x,
  m,
  v,
  pre="logits",
  post="weights",
  visible=None,
  dynamic=(),
):
  q = np.einsum("bld,dhk->blhk", x, v["q/kernel"])
  k = np.einsum("bmd,dhk->bmhk", m, v["k/kernel"])
  vv = np.einsum("bmd,dhk->bmhk", m, v["v/kernel"])
  logits = np.einsum("blhk,bmhk->blhm", q, k)

  def talk(t, scope, dx, dm):
    if scope + "/kernel" not in v:
      return t
    out = np.einsum("blhm,hs->blsm", t, v[scope + "/kernel"])
    # The dynamic maps of a scope are numbered in the order x, m.
    sources = [(x, "bld->blhs"), (m, "bmd->bmhs")]
    sources = [s for s, p in zip(sources, (dx, dm)) if p in dynamic]
    for i, (source, spec) in enumerate(sources):
      w = v["%s/%s_dynamic_%d/kernel" % (scope, scope, i)]
      inputs, projected = spec.split("->")
      proj = np.einsum("%s,dhs->%s" % (inputs, projected), source, w)
      out += np.einsum("blhm,%s->blsm" % projected, t, proj)
    return out

  logits = _mask(talk(logits, pre, "x2l", "m2l"), visible)
  w = talk(_softmax(logits), post, "x2w", "m2w")
  return np.einsum("blhm,bmhk,hkd->bld", w, vv, v["y/kernel"])


TH_DIMS = dict(
  key_heads_dims=(("kh", 2),),
  softmax_heads_dims=(("sh", 3),),
  value_heads_dims=(("vh", 2),),
  key_size=4,
  value_size=4,
)


def test_talking_heads_matches_numpy_and_variable_shapes():
  layer = av.TalkingHeadsSelfAttention(**TH_DIMS)
  (y,), v = mtu.with_variables(
    lambda mesh: [layer.call(_context(mesh), _x(mesh))]
  )()
  assert {n: a.shape for n, a in v.items()} == {
    "q/kernel": (D, 2, 4),
    "k/kernel": (D, 2, 4),
    "v/kernel": (D, 2, 4),
    "y/kernel": (2, 4, D),
    "logits/kernel": (2, 3),
    "weights/kernel": (3, 2),
  }
  np.testing.assert_allclose(y, _th_reference(X, X, v), rtol=1e-5, atol=1e-5)


def test_talking_heads_identity_mixing_is_plain_attention():
  wq, wk, wv = (_weights(s, (D, 2, 4)) for s in (1, 2, 3))
  wo = _weights(4, (2, 4, D))
  kh, sh, vh = (mtf.Dimension(n, 2) for n in ("kh", "sh", "heads"))
  dk = mtf.Dimension("d_k", 4)
  dv = mtf.Dimension("d_v", 4)
  eye = np.eye(2, dtype=np.float32)

  def build(mesh):
    _make_vars(
      mesh,
      {
        "q/kernel": ([D_MODEL, kh, dk], wq),
        "k/kernel": ([D_MODEL, kh, dk], wk),
        "v/kernel": ([D_MODEL, vh, dv], wv),
        "y/kernel": ([vh, dv, D_MODEL], wo),
        "logits/kernel": ([kh, sh], eye),
        "weights/kernel": ([sh, vh], eye),
      },
    )
    layer = av.TalkingHeadsSelfAttention(
      key_heads_dims=(("kh", 2),),
      softmax_heads_dims=(("sh", 2),),
      value_heads_dims=(("heads", 2),),
      key_size=4,
      value_size=4,
    )
    return [layer.call(_context(mesh, causal=True), _x(mesh))]

  (y,), v = mtu.with_variables(build)()
  assert len(v) == 6
  np.testing.assert_allclose(
    y, _mha(X, X, wq, wk, wv, wo, CAUSAL), rtol=1e-5, atol=1e-5
  )


def test_talking_heads_same_dims_equals_self_attention():
  """No head maps: the same numbers as SelfAttention with these weights."""
  wq, wk, wv = (_weights(s, (D, 2, 4)) for s in (5, 6, 7))
  wo = _weights(8, (2, 4, D))
  heads = mtf.Dimension("heads", 2)

  def build(mesh):
    kv = {"th": mtf.Dimension("d_k", 4), "sa": mtf.Dimension("d_kv", 4)}
    # The original's names: dense kernels q, k, v, y in talking heads;
    # q, k, v, o in SelfAttention.
    names = {"th": ("q/kernel", "k/kernel", "v/kernel", "y/kernel")}
    names["sa"] = ("q", "k", "v", "o")
    for scope in ("th", "sa"):
      dk = kv[scope]
      dv = mtf.Dimension("d_v", 4) if scope == "th" else dk
      q, k, v, o = (scope + "/" + n for n in names[scope])
      _make_vars(
        mesh,
        {
          q: ([D_MODEL, heads, dk], wq),
          k: ([D_MODEL, heads, dk], wk),
          v: ([D_MODEL, heads, dv], wv),
          o: ([heads, dv, D_MODEL], wo),
        },
      )
    th = av.TalkingHeadsSelfAttention(
      key_heads_dims=(("heads", 2),),
      softmax_heads_dims=(("heads", 2),),
      value_heads_dims=(("heads", 2),),
      key_size=4,
      value_size=4,
    )
    sa = self_attention.SelfAttention(
      num_heads=2, key_value_size=4, combine_dims=False
    )
    outs = []
    for scope, layer in (("th", th), ("sa", sa)):
      with tf1.variable_scope(scope):
        outs.append(layer.call(_context(mesh, causal=True), _x(mesh)))
    return outs

  (y_th, y_sa), v = mtu.with_variables(build)()
  assert len(v) == 8
  np.testing.assert_allclose(y_th, y_sa, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(
    y_th, _mha(X, X, wq, wk, wv, wo, CAUSAL), rtol=1e-5, atol=1e-5
  )


def test_talking_heads_dynamic_projections():
  dynamic = ["x2l", "m2l", "x2w", "m2w"]
  layer = av.TalkingHeadsSelfAttention(
    dynamic_projections=dynamic, dynamic_projections_init_scale=1.0, **TH_DIMS
  )
  (y,), v = mtu.with_variables(
    lambda mesh: [layer.call(_context(mesh, causal=True), _x(mesh))]
  )()
  for i in (0, 1):  # from x, from m
    assert v["logits/logits_dynamic_%d/kernel" % i].shape == (D, 2, 3)
    assert v["weights/weights_dynamic_%d/kernel" % i].shape == (D, 3, 2)
  np.testing.assert_allclose(
    y,
    _th_reference(X, X, v, visible=CAUSAL, dynamic=dynamic),
    rtol=1e-5,
    atol=1e-5,
  )
  assert not np.allclose(y, _th_reference(X, X, v, visible=CAUSAL))


def test_talking_heads_bad_arguments():
  with pytest.raises(ValueError, match="unknown dynamic projection 'x2y'"):
    av.TalkingHeadsSelfAttention(dynamic_projections=["x2y"])
  with pytest.raises(ValueError, match="only supported in self-attention"):
    av.TalkingHeadsEncDecAttention(dynamic_projections=["x2l"])
  with pytest.raises(ValueError, match="key_heads_dims"):
    av.TalkingHeadsSelfAttention(key_heads_dims=(("a", 2), ("a", 3)))


def test_talking_heads_enc_dec():
  layer = av.TalkingHeadsEncDecAttention(**TH_DIMS)
  (y,), v = mtu.with_variables(
    lambda mesh: [
      layer.call(_context(mesh, encoder_output=_enc(mesh)), _x(mesh))
    ]
  )()
  np.testing.assert_allclose(y, _th_reference(X, ENC, v), rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------
# General bilinear.


def _bilinear_reference(x, m, v, visible=None):
  q = np.einsum("bli,ihd->blhd", x, v["q/kernel"])
  w = _softmax(_mask(np.einsum("blhd,bmd->blhm", q, m), visible))
  return np.einsum("blhm,bmi,hid->bld", w, m, v["y/kernel"])


def test_general_bilinear_self_and_enc_dec():
  heads = (("heads", 3),)
  sa = av.GeneralBilinearSelfAttention(heads_dims=heads)
  ed = av.GeneralBilinearEncDecAttention(heads_dims=heads)

  def build(mesh):
    outs = []
    with tf1.variable_scope("self"):
      outs.append(sa.call(_context(mesh, causal=True), _x(mesh)))
    with tf1.variable_scope("encdec"):
      outs.append(ed.call(_context(mesh, encoder_output=_enc(mesh)), _x(mesh)))
    return outs

  (y_sa, y_ed), v = mtu.with_variables(build)()
  sv = {n[5:]: a for n, a in v.items() if n.startswith("self/")}
  ev = {n[7:]: a for n, a in v.items() if n.startswith("encdec/")}
  assert {n: a.shape for n, a in sv.items()} == {
    "q/kernel": (D, 3, D),
    "y/kernel": (3, D, D),
  }
  np.testing.assert_allclose(
    y_sa, _bilinear_reference(X, X, sv, CAUSAL), rtol=1e-5, atol=1e-5
  )
  np.testing.assert_allclose(
    y_ed, _bilinear_reference(X, ENC, ev), rtol=1e-5, atol=1e-5
  )


# ----------------------------------------------------------------------------
# Branched.


def _branched_reference(x, m, v, visible=None):
  q = np.einsum("bld,dhk->blhk", x, v["q"])
  k = np.einsum("bmd,dhk->bmhk", m, v["k"])
  vv = np.einsum("bmd,dhk->bmhk", m, v["v"])
  w = _softmax(_mask(np.einsum("blhk,bmhk->blhm", q, k), visible))
  per_head = np.einsum("blhm,bmhk,hkd->blhd", w, vv, v["o"])
  # The raw kappa and alpha, as the original (its simplex constraint sits on
  # the TF variables, where mtf optimizers never apply it).
  h = np.maximum((per_head * v["kappa"][:, None]) @ v["wi/kernel"], 0)
  return np.einsum("blhd,h->bld", h @ v["wo/kernel"], v["alpha"])


def test_branched_self_and_enc_dec():
  gin.clear_config()
  gin.parse_config(
    "mesh_tensorflow.transformer.transformer_layers."
    "DenseReluDense.hidden_size = 6"
  )
  try:
    sa = av.BranchedSelfAttention(num_heads=2, key_value_size=4)
    ed = av.BranchedEncDecAttention(num_heads=2, key_value_size=4)
  finally:
    gin.clear_config()

  def build(mesh):
    outs = []
    with tf1.variable_scope("self"):
      outs.append(sa.call(_context(mesh, causal=True), _x(mesh)))
    with tf1.variable_scope("encdec"):
      outs.append(ed.call(_context(mesh, encoder_output=_enc(mesh)), _x(mesh)))
    return outs

  (y_sa, y_ed), v = mtu.with_variables(build)()
  sv = {n[5:]: a for n, a in v.items() if n.startswith("self/")}
  ev = {n[7:]: a for n, a in v.items() if n.startswith("encdec/")}
  assert {n: a.shape for n, a in sv.items()} == {
    "q": (D, 2, 4),
    "k": (D, 2, 4),
    "v": (D, 2, 4),
    "o": (2, 4, D),
    "kappa": (2,),
    "alpha": (2,),
    "wi/kernel": (D, 6),
    "wo/kernel": (6, D),
  }
  np.testing.assert_allclose(
    y_sa, _branched_reference(X, X, sv, CAUSAL), rtol=1e-5, atol=1e-5
  )
  np.testing.assert_allclose(
    y_ed, _branched_reference(X, ENC, ev), rtol=1e-5, atol=1e-5
  )
  with pytest.raises(ValueError, match="num_memory_heads"):
    av.BranchedSelfAttention(num_heads=4, num_memory_heads=2)


# ----------------------------------------------------------------------------
# Synthesizer.


def test_synthesizer_random_plus_alpha():
  gin.clear_config()
  gin.parse_config(
    "mesh_tensorflow.transformer.attention.synthetic_attention.max_length = 8"
  )
  try:
    layer = av.Synthesizer(num_heads=2, key_value_size=4)
    (y,), v = mtu.with_variables(
      lambda mesh: [layer.call(_context(mesh, causal=True), _x(mesh))]
    )()
  finally:
    gin.clear_config()
  assert v["R"].shape == (8, 2, 8)
  split = lambda w: w.reshape(D, 2, 4)  # noqa: E731  combined heads dims
  q = np.einsum("bld,dhk->blhk", X, split(v["q"]))
  k = np.einsum("bmd,dhk->bmhk", X, split(v["k"]))
  vv = np.einsum("bmd,dhk->bmhk", X, split(v["v"]))
  r = v["R"][:L, :, :L].transpose(1, 0, 2)  # [heads, length, memory]
  a = 1.0 / (1.0 + np.exp(-v["alpha"].sum()))
  logits = (1 - a) * np.einsum("blhk,bmhk->blhm", q, k) + a * r.transpose(
    1, 0, 2
  )[None]
  w = _softmax(_mask(logits, CAUSAL[None, :, None, :]))
  expected = np.einsum("blhm,bmhk->blhk", w, vv).reshape(B, L, 8) @ v["o"]
  np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------
# Decoding.


START = 2  # First decoded position: earlier keys come from "first_part".


def _decode_self(mesh, layer, initial_position=(START, START)):
  x = _x(mesh)
  full = layer.call(_context(mesh, causal=True), x)
  init = mtf.import_tf_tensor(
    mesh, np.array(initial_position, np.int32), [BATCH]
  )
  ctx = _context(
    mesh, mode="first_part", causal=True, new_states=[], initial_position=init
  )
  layer.call(ctx, x)
  states = ctx.new_states
  steps = []
  for t in range(START, L):
    pos = np.full([B], t, np.int32)
    position = mtf.import_tf_tensor(mesh, pos, [BATCH])
    ctx = _context(
      mesh,
      mode="incremental",
      states=states,
      new_states=[],
      position=position,
      read_priority=position,
      write_priority=mtf.range(mesh, LENGTH, tf.int32),
    )
    steps.append(
      layer.call(ctx, mtf.import_tf_tensor(mesh, X[:, t], [BATCH, D_MODEL]))
    )
    states = ctx.new_states
  return [full, mtf.stack(steps, "length", axis=1)]


def _decode_enc_dec(mesh, layer):
  full = layer.call(_context(mesh, encoder_output=_enc(mesh)), _x(mesh))
  ctx = _context(
    mesh,
    mode="first_part",
    new_states=[],
    constant_states=[],
    encoder_output=_enc(mesh),
    initial_position=mtf.zeros(mesh, [BATCH], tf.int32),
  )
  layer.call(ctx, _x(mesh))
  constant_states = ctx.constant_states
  assert len(constant_states) == 1
  steps = []
  for t in range(L):
    ctx = _context(
      mesh,
      mode="incremental",
      states=[],
      new_states=[],
      constant_states=constant_states,
      position=mtf.constant(mesh, t, [BATCH], tf.int32),
    )
    steps.append(
      layer.call(ctx, mtf.import_tf_tensor(mesh, X[:, t], [BATCH, D_MODEL]))
    )
  return [full, mtf.stack(steps, "length", axis=1)]


def _branched(cls):
  layer = cls(num_heads=2, key_value_size=4)
  layer.dense_layer.hidden_size = 6
  return layer


SELF_LAYERS = {
  "talking_heads": lambda: av.TalkingHeadsSelfAttention(**TH_DIMS),
  "talking_heads_dynamic": lambda: av.TalkingHeadsSelfAttention(
    dynamic_projections=["x2l", "m2l", "x2w", "m2w"],
    dynamic_projections_init_scale=1.0,
    **TH_DIMS,
  ),
  "general_bilinear": lambda: av.GeneralBilinearSelfAttention(
    heads_dims=(("heads", 2),)
  ),
  "branched": lambda: _branched(av.BranchedSelfAttention),
  "synthesizer_dense": lambda: av.Synthesizer(
    num_heads=2, key_value_size=4, synthesize_mode="dense"
  ),
}
ENC_DEC_LAYERS = {
  "talking_heads": lambda: av.TalkingHeadsEncDecAttention(**TH_DIMS),
  "general_bilinear": lambda: av.GeneralBilinearEncDecAttention(
    heads_dims=(("heads", 2),)
  ),
  "branched": lambda: _branched(av.BranchedEncDecAttention),
}


@pytest.mark.parametrize("name", sorted(SELF_LAYERS))
def test_self_attention_incremental_equals_full(name):
  gin.clear_config()
  gin.parse_config(
    "mesh_tensorflow.transformer.attention.synthetic_attention.max_length = 8"
  )
  try:
    layer = SELF_LAYERS[name]()
    (full, steps), _ = mtu.with_variables(
      lambda mesh: _decode_self(mesh, layer)
    )()
  finally:
    gin.clear_config()
  np.testing.assert_allclose(steps, full[:, START:], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", sorted(ENC_DEC_LAYERS))
def test_enc_dec_incremental_equals_full(name):
  layer = ENC_DEC_LAYERS[name]()
  (full, steps), _ = mtu.with_variables(
    lambda mesh: _decode_enc_dec(mesh, layer)
  )()
  np.testing.assert_allclose(steps, full, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------
# Meshes and layouts.


def _mesh_program(mesh):
  layers = [
    av.TalkingHeadsSelfAttention(
      key_heads_dims=(("kh", 4),),
      softmax_heads_dims=(("sh", 2),),
      value_heads_dims=(("vh", 4),),
      key_size=4,
      value_size=4,
      dynamic_projections=["x2l", "m2w"],
      dynamic_projections_init_scale=1.0,
    ),
    av.GeneralBilinearSelfAttention(heads_dims=(("heads", 2),)),
  ]
  outs = []
  for i, layer in enumerate(layers):
    with tf1.variable_scope("layer_%d" % i):
      outs.append(layer.call(_context(mesh, causal=True), _x(mesh)))
  return outs


@meshes.parametrize(meshes.ATTENTION_VARIANTS)
def test_meshes_and_layouts(mesh_shape, layout):
  outs, v = mtu.with_variables(_mesh_program)(
    mesh_shape, layout, mode="function"
  )
  th = {n[8:]: a for n, a in v.items() if n.startswith("layer_0/")}
  gb = {n[8:]: a for n, a in v.items() if n.startswith("layer_1/")}
  np.testing.assert_allclose(
    outs[0],
    _th_reference(X, X, th, visible=CAUSAL, dynamic=["x2l", "m2w"]),
    rtol=1e-5,
    atol=1e-5,
  )
  np.testing.assert_allclose(
    outs[1], _bilinear_reference(X, X, gb, CAUSAL), rtol=1e-5, atol=1e-5
  )


def test_exports_and_parallel_layer_default():
  for name in av.__all__:
    assert getattr(transformer_layers, name) is getattr(av, name)
  gin.clear_config()
  gin.parse_config("""
      mesh_tensorflow.transformer.transformer_layers.DenseReluDense.hidden_size = 6
      mesh_tensorflow.transformer.transformer_layers.SelfAttention.num_heads = 2
      mesh_tensorflow.transformer.transformer_layers.SelfAttention.key_value_size = 4
  """)
  try:
    parallel = dense_layers.ParallelLayer()
    ffn = dense_layers.DenseReluDense()
    attn = self_attention.SelfAttention()
  finally:
    gin.clear_config()
  assert [type(l).__name__ for l in parallel.layer_classes] == [
    "DenseReluDense",
    "SelfAttention",
  ]

  def build(mesh):
    y = parallel.call(_context(mesh, causal=True), _x(mesh))
    with tf1.variable_scope("parallel_layer_0"):
      a = ffn.call(_context(mesh), _x(mesh))
    with tf1.variable_scope("parallel_layer_1"):
      b = attn.call(_context(mesh, causal=True), _x(mesh))
    return [y, (a + b) * 2**-0.5]  # the original scales by 1/sqrt(n)

  (y, expected), v = mtu.with_variables(build)()
  assert sorted(v) == [
    "parallel_layer_0/wi/kernel",
    "parallel_layer_0/wo/kernel",
    "parallel_layer_1/k",
    "parallel_layer_1/o",
    "parallel_layer_1/q",
    "parallel_layer_1/v",
  ]
  np.testing.assert_allclose(y, expected, rtol=1e-6, atol=1e-6)


def test_talking_heads_steps_are_public_methods():
  """compute_q/k/v, talking_heads (with a dynamic map from x) and
  attention_internal compose to the layer's numpy reference.
  """
  layer = av.TalkingHeadsSelfAttention(**TH_DIMS)
  kh, sh = mtf.Dimension("kh", 2), mtf.Dimension("sh", 3)

  def build(mesh):
    ctx, x = _context(mesh), _x(mesh)
    q = layer.compute_q(ctx, x)
    k = mtf.rename_dimension(layer.compute_k(ctx, x), "length", "memory_length")
    v = mtf.rename_dimension(layer.compute_v(ctx, x), "length", "memory_length")
    memory = mtf.Dimension("memory_length", L)
    y = layer.attention_internal(ctx, x, None, q, k, v, memory, None)
    logits = mtf.einsum([q, k], reduced_dims=[layer.key_dim])
    mixed = layer.talking_heads(
      ctx, logits, "extra", [kh], [sh], dynamic_projections_from=[x]
    )
    order = lambda heads: mtf.Shape([BATCH, LENGTH, heads, memory])
    return [
      y,
      mtf.transpose(logits, order(kh)),
      mtf.transpose(mixed, order(sh)),
    ]

  (y, logits, mixed), v = mtu.with_variables(build)()
  np.testing.assert_allclose(y, _th_reference(X, X, v), rtol=1e-5, atol=1e-5)
  static, from_x = v["extra/kernel"], v["extra/extra_dynamic_0/kernel"]
  assert static.shape == (2, 3) and from_x.shape == (D, 2, 3)
  dynamic = np.einsum("bld,dhs->blhs", X, from_x)
  expected = np.einsum("blhm,hs->blsm", logits, static) + np.einsum(
    "blhm,blhs->blsm", logits, dynamic
  )
  np.testing.assert_allclose(mixed, expected, rtol=1e-4, atol=1e-4)


def test_general_bilinear_steps_are_public_methods():
  layer = av.GeneralBilinearSelfAttention(heads_dims=(("heads", 2),))

  def build(mesh):
    ctx, x = _context(mesh), _x(mesh)
    m = mtf.rename_dimension(x, "length", "memory_length")
    return [
      layer.attention_internal(
        ctx, layer.compute_q(ctx, x), m, mtf.Dimension("memory_length", L), None
      )
    ]

  (y,), v = mtu.with_variables(build)()
  np.testing.assert_allclose(
    y, _bilinear_reference(X, X, v), rtol=1e-4, atol=1e-5
  )


# Variables (name: shape) the original 0.1.21 gives these layers, each in a
# one-layer Unitransformer under its own variable scope (the model's own
# embeddings and output layer left out).
_ORIGINAL_VARIABLES = {
  "plain/transformer//TalkingHeadsSelfAttention/" + name: shape
  for name, shape in [
    ("q/kernel", "d_model=8, kh=2, d_k=4"),
    ("k/kernel", "d_model=8, kh=2, d_k=4"),
    ("v/kernel", "d_model=8, vh=2, d_v=4"),
    ("logits/kernel", "kh=2, sh=3"),
    ("weights/kernel", "sh=3, vh=2"),
    ("y/kernel", "vh=2, d_v=4, d_model=8"),
  ]
}
_ORIGINAL_VARIABLES.update(
  {
    "dynamic/transformer//TalkingHeadsSelfAttention/" + name: shape
    for name, shape in [
      ("q/kernel", "d_model=8, kh=2, d_k=4"),
      ("k/kernel", "d_model=8, kh=2, d_k=4"),
      ("v/kernel", "d_model=8, vh=2, d_v=4"),
      ("logits/kernel", "kh=2, sh=3"),
      ("logits/logits_dynamic_0/kernel", "d_model=8, kh=2, sh=3"),
      ("weights/kernel", "sh=3, vh=2"),
      ("weights/weights_dynamic_0/kernel", "d_model=8, sh=3, vh=2"),
      ("weights/weights_dynamic_1/kernel", "d_model=8, sh=3, vh=2"),
      ("y/kernel", "vh=2, d_v=4, d_model=8"),
    ]
  }
)
_ORIGINAL_VARIABLES.update(
  {
    "bilinear/transformer//GeneralBilinearSelfAttention/q/kernel": (
      "_d_model=8, heads=2, d_model=8"
    ),
    "bilinear/transformer//GeneralBilinearSelfAttention/y/kernel": (
      "heads=2, _d_model=8, d_model=8"
    ),
  }
)


def test_variable_names_are_the_originals():
  layers = {
    "plain": av.TalkingHeadsSelfAttention(**TH_DIMS),
    "dynamic": av.TalkingHeadsSelfAttention(
      dynamic_projections=["m2l", "x2w", "m2w"], **TH_DIMS
    ),
    "bilinear": av.GeneralBilinearSelfAttention(heads_dims=(("heads", 2),)),
  }
  with tf.Graph().as_default():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    ids = mtf.zeros(mesh, "batch:2;length:6", dtype=tf.int32)
    for scope, layer in layers.items():
      with tf1.variable_scope(scope):
        stack = transformer.LayerStack(
          [layer],
          sublayers_initial=[],
          sublayers_per_layer=[transformer.sublayer_call_layer],
          sublayers_final=[],
        )
        model = transformer.Unitransformer(
          layer_stack=stack,
          d_model=D,
          input_vocab_size=10,
          output_vocab_size=10,
          autoregressive=True,
          max_length=6,
        )
        model.call_simple(ids, ids, compute_loss=True, mode="train")
    found = {
      v.name: v.shape.to_string[6:-1]
      for v in graph.all_variables
      if "Attention/" in v.name
    }
  assert found == _ORIGINAL_VARIABLES
