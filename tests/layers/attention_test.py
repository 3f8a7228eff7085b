"""Tests for mesh_tensorflow._src.layers.attention (mtf.layers attention API).

Dense multihead self- and encoder-decoder attention, memory-compressed
attention, the incremental (one decoding step) variants and the masks, against
the numpy/TF references of attention_reference.py: values with numpy,
gradients (inputs and weights) with tf.GradientTape. Every program runs on the
1-device mesh and on 4-device meshes under layouts that split batch, heads,
length, memory_length, d_model and d_kv, and must give the same numbers.
"""

import inspect

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mesh_test_util as mtu
from tests import meshes
from tests.layers import attention_reference as ref

tf1 = tf.compat.v1

BATCH = mtf.Dimension("batch", 4)
LENGTH = mtf.Dimension("length", 8)
MEMORY = mtf.Dimension("memory_length", 4)
D_MODEL = mtf.Dimension("d_model", 4)
HEADS = mtf.Dimension("heads", 4)
D_KV = mtf.Dimension("d_kv", 2)
QKVO = mtf.Dimension("qkvo", 4)

_RNG = np.random.RandomState(42)


def _rand(*shape, scale=1.0):
  return (_RNG.randn(*shape) * scale).astype(np.float32)


X = _rand(4, 8, 4)
MEM = _rand(4, 4, 4)
W_SELF = _rand(4, 4, 4, 2, scale=0.7)
W_ENCDEC = _rand(4, 4, 4, 2, scale=0.7)
W_COMP = _rand(4, 4, 4, 2, scale=0.7)
IDS = _RNG.randint(0, 3, size=(4, 8)).astype(np.int32)
IDS[:, 0] = 1  # Every query sees at least one non-padding position.
MEM_IDS = _RNG.randint(0, 3, size=(4, 4)).astype(np.int32)
MEM_IDS[:, 0] = 2
COTANGENTS = [_rand(4, 8, 4) for _ in range(4)]


def qkvo_variable(mesh, scope, value):
  """Creates "<scope>/qkvo" with a fixed value; layers then reuse it."""
  with tf1.variable_scope(scope):
    return mtf.get_variable(
      mesh,
      "qkvo",
      mtf.Shape([QKVO, HEADS, D_MODEL, D_KV]),
      initializer=tf1.constant_initializer(value),
    )


def import_(mesh, value, dims, dtype=tf.float32):
  return mtf.import_tf_tensor(
    mesh, tf.constant(value, dtype=dtype), mtf.Shape(dims)
  )


# ----------------------------------------------------------------------------
# References
# ----------------------------------------------------------------------------


def self_bias(ids):
  """[b, 1, l, m]: causal and no padding (ids == 0) in the memory."""
  causal = np.arange(8)[None, :] <= np.arange(8)[:, None]
  allowed = causal[None] & (ids[:, None, :] != 0)
  return ref.bias_from_allowed(allowed)[:, None]


def encdec_bias(mem_ids):
  return ref.bias_from_allowed(mem_ids != 0)[:, None, None, :]


def compressed(xp, x, w, factor, mask_right):
  b, l, d = [int(n) for n in x.shape]  # TF1 shapes hold Dimensions.
  memory = xp.mean(xp.reshape(x, [b, l // factor, factor, d]), 2)
  bias = None
  if mask_right:
    ends = np.arange(l // factor) * factor + factor - 1
    bias = ref.bias_from_allowed(ends[None, :] <= np.arange(l)[:, None])
  return ref.mha(xp, x, memory, w, bias, extra_logit=0.0)


def reference_outputs(xp, x, mem, w_self, w_encdec, w_comp):
  return [
    ref.mha(xp, x, x, w_self, self_bias(IDS)),
    ref.mha(xp, x, mem, w_encdec, encdec_bias(MEM_IDS)),
    compressed(xp, x, w_comp, 2, True),
    compressed(xp, x, w_comp, 2, False),
  ]


def reference_gradients():
  def loss_terms(*args):
    outs = reference_outputs(ref.TF, *args)
    return tf.add_n([tf.reduce_sum(o * c) for o, c in zip(outs, COTANGENTS)])

  return ref.tape_gradients(loss_terms, [X, MEM, W_SELF, W_ENCDEC, W_COMP], 1.0)


# ----------------------------------------------------------------------------
# Signatures and variables
# ----------------------------------------------------------------------------

_E = inspect.Parameter.empty
SIGNATURES = {
  "multihead_attention_params": [
    ("mesh", _E),
    ("heads", _E),
    ("io_channels", _E),
    ("kv_channels", _E),
    ("variable_dtype", _E),
    ("combine", False),
  ],
  "multihead_attention_vars": [
    ("mesh", _E),
    ("heads", _E),
    ("io_channels", _E),
    ("kv_channels", _E),
    ("master_dtype", _E),
    ("slice_dtype", _E),
    ("activation_dtype", _E),
  ],
  "dot_product_attention": [
    ("q", _E),
    ("k", _E),
    ("v", _E),
    ("mask", _E),
    ("is_training", _E),
    ("dropout", 0.0),
    ("dropout_broadcast_dims", None),
    ("extra_logit", None),
  ],
  "multihead_attention": [
    ("query_antecedent", _E),
    ("memory_antecedent", _E),
    ("mask", _E),
    ("kv_channels", _E),
    ("heads", _E),
    ("is_training", _E),
    ("dropout", 0.0),
    ("dropout_broadcast_dims", None),
    ("master_dtype", tf.float32),
    ("slice_dtype", tf.float32),
    ("name", "multihead_attention"),
  ],
  "multihead_self_attention_incremental": [
    ("query_antecedent", _E),
    ("prev_k", _E),
    ("prev_v", _E),
    ("step_num", _E),
    ("master_dtype", _E),
    ("slice_dtype", _E),
    ("name", "multihead_attention"),
  ],
  "multihead_encdec_attention_incremental": [
    ("query_antecedent", _E),
    ("wq", _E),
    ("wo", _E),
    ("k", _E),
    ("v", _E),
    ("mask", _E),
    ("name", "multihead_attention"),
  ],
  "multihead_self_attention_memory_compressed": [
    ("x", _E),
    ("mask_right", _E),
    ("compression_factor", _E),
    ("kv_channels", _E),
    ("heads", _E),
    ("is_training", _E),
    ("dropout", 0.0),
    ("dropout_broadcast_dims", None),
    ("master_dtype", tf.float32),
    ("slice_dtype", tf.float32),
    ("name", "multihead_attention"),
  ],
  "compress_mean": [("x", _E), ("dim", _E), ("compression_factor", _E)],
  "rename_length_to_memory_length": [
    ("x", _E),
    ("length_name", "length"),
    ("memory_length_name", "memory_length"),
  ],
  "attention_mask_ignore_padding": [("inputs", _E), ("dtype", tf.float32)],
  "attention_mask_autoregressive": [("query_pos", _E), ("dtype", tf.float32)],
  "attention_mask_same_segment": [
    ("query_segment", _E),
    ("memory_segment", None),
    ("dtype", tf.float32),
  ],
  "attention_bias_local_block": [
    ("mesh", _E),
    ("block_length", _E),
    ("memory_length", _E),
    ("dtype", tf.int32),
  ],
  "attention_bias_local_2d_block": [
    ("mesh", _E),
    ("h_dim", _E),
    ("w_dim", _E),
    ("memory_h_dim", _E),
    ("memory_w_dim", _E),
    ("dtype", tf.int32),
  ],
}


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_signature(name):
  fn = getattr(mtf.layers, name)
  params = [
    (p.name, p.default) for p in inspect.signature(fn).parameters.values()
  ]
  assert params == SIGNATURES[name]
  assert mtf.layers.__dict__[name] is fn


def test_params_variable_names_shapes_and_init_scale():
  heads = mtf.Dimension("heads", 4)
  io = mtf.Dimension("d_model", 64)
  kv = mtf.Dimension("d_kv", 16)
  qk_std = 64**-0.5 * 16**-0.25
  expected_std = [qk_std, qk_std, 64**-0.5, (64 * 4) ** -0.5]
  graphs = []

  def build(mesh):
    graphs.append(mesh.graph)
    vdt = mtf.VariableDType(tf.float32)
    with tf1.variable_scope("sep"):
      sep = mtf.layers.multihead_attention_params(mesh, heads, io, kv, vdt)
    with tf1.variable_scope("comb"):
      comb = mtf.layers.multihead_attention_params(
        mesh, heads, io, kv, vdt, combine=True
      )
    with tf1.variable_scope("old"):
      old = mtf.layers.multihead_attention_vars(
        mesh, heads, io, kv, tf.bfloat16, tf.float32, tf.float32
      )
    return sep + comb + old

  out = mtu.run_program(build)
  variables = graphs[0].all_variables
  assert [v.name for v in variables] == [
    "sep/q",
    "sep/k",
    "sep/v",
    "sep/o",
    "comb/qkvo",
    "old/qkvo",
  ]
  for v in variables[:4]:
    assert v.shape == mtf.Shape([heads, io, kv])
  for v in variables[4:]:
    assert v.shape == mtf.Shape([QKVO, heads, io, kv])
  assert variables[5].master_dtype == tf.bfloat16
  assert variables[5].slice_dtype == tf.float32
  for i, arr in enumerate(out):
    assert arr.shape == (4, 64, 16)
    np.testing.assert_allclose(
      arr.std(), expected_std[i % 4], rtol=0.1, err_msg="output %d" % i
    )
    assert abs(arr.mean()) < 0.2 * expected_std[i % 4]


def test_layer_variable_names_and_dtypes():
  with mtf.variable_store(mtf.VariableStore()):
    _check_layer_variable_names_and_dtypes()


def _check_layer_variable_names_and_dtypes():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, [BATCH, LENGTH, D_MODEL], dtype=tf.bfloat16)
  y = mtf.layers.multihead_attention(
    x,
    None,
    None,
    D_KV,
    HEADS,
    False,
    master_dtype=tf.float32,
    slice_dtype=tf.bfloat16,
  )
  assert y.shape == x.shape and y.dtype == tf.bfloat16
  # The same default scope name reuses the variable (as the original did).
  mtf.layers.multihead_attention(x, None, None, D_KV, HEADS, False)
  with tf1.variable_scope("outer"):
    mtf.layers.multihead_self_attention_memory_compressed(
      x, True, 2, D_KV, HEADS, False, name="comp"
    )
  names = [v.name for v in graph.all_variables]
  assert names == ["multihead_attention/qkvo", "outer/comp/qkvo"]
  v = graph.all_variables[0]
  assert v.shape == mtf.Shape([QKVO, HEADS, D_MODEL, D_KV])
  assert (v.master_dtype, v.slice_dtype, v.activation_dtype) == (
    tf.float32,
    tf.bfloat16,
    tf.bfloat16,
  )


# ----------------------------------------------------------------------------
# Dense attention: values and gradients on every mesh
# ----------------------------------------------------------------------------


def build_dense(mesh):
  x = import_(mesh, X, [BATCH, LENGTH, D_MODEL])
  mem = import_(mesh, MEM, [BATCH, MEMORY, D_MODEL])
  ids = import_(mesh, IDS, [BATCH, LENGTH], tf.int32)
  mem_ids = import_(
    mesh, MEM_IDS, [BATCH, mtf.Dimension("length", 4)], tf.int32
  )
  weights = [
    qkvo_variable(mesh, s, w)
    for s, w in (("self", W_SELF), ("encdec", W_ENCDEC), ("comp", W_COMP))
  ]
  pos = mtf.range(mesh, LENGTH, tf.int32)
  self_mask = mtf.layers.attention_mask_autoregressive(
    pos
  ) + mtf.layers.attention_mask_ignore_padding(ids)
  outs = [
    mtf.layers.multihead_attention(
      x, None, self_mask, D_KV, HEADS, False, name="self"
    ),
    mtf.layers.multihead_attention(
      x,
      mem,
      mtf.layers.attention_mask_ignore_padding(mem_ids),
      D_KV,
      HEADS,
      True,
      name="encdec",
    ),
    mtf.layers.multihead_self_attention_memory_compressed(
      x, True, 2, D_KV, HEADS, False, name="comp"
    ),
    mtf.layers.multihead_self_attention_memory_compressed(
      x, False, 2, D_KV, HEADS, True, name="comp"
    ),
  ]
  loss = mtf.add_n(
    [
      mtf.reduce_sum(o * mtf.constant(mesh, c, o.shape))
      for o, c in zip(outs, COTANGENTS)
    ]
  )
  grads = mtf.gradients([loss], [x, mem] + weights)
  return outs + grads


_EXPECTED_DENSE = None


def expected_dense():
  global _EXPECTED_DENSE
  if _EXPECTED_DENSE is None:
    _EXPECTED_DENSE = (
      reference_outputs(ref.NP, X, MEM, W_SELF, W_ENCDEC, W_COMP)
      + reference_gradients()
    )
  return _EXPECTED_DENSE


_NAMES = [
  "self",
  "encdec",
  "compressed_causal",
  "compressed",
  "d_x",
  "d_mem",
  "d_w_self",
  "d_w_encdec",
  "d_w_comp",
]


@meshes.parametrize(meshes.ATTENTION)
def test_dense_attention_values_and_gradients(mesh_shape, layout):
  out = mtu.run_program(build_dense, mesh_shape, layout)
  for name, a, e in zip(_NAMES, out, expected_dense()):
    np.testing.assert_allclose(a, e, rtol=2e-4, atol=2e-5, err_msg=name)


def test_dense_attention_same_numbers_on_every_mesh():
  base = mtu.run_program(build_dense)
  for mesh_shape, layout in [
    ("all:4", "heads:all"),
    ("rows:2;cols:2", "length:rows;d_model:cols"),
  ]:
    out = mtu.run_program(build_dense, mesh_shape, layout)
    for name, a, b in zip(_NAMES, out, base):
      # Sums over split dims are added in another order: rounding error
      # scales with the largest summand, not with each (possibly tiny) entry.
      scale = max(1.0, float(np.abs(b).max()))
      np.testing.assert_allclose(
        a,
        b,
        rtol=1e-5,
        atol=1e-6 * scale,
        err_msg="%s on %s|%s" % (name, mesh_shape, layout),
      )


@pytest.mark.parametrize("mode", mtu.MODES)
def test_multihead_attention_all_modes(mode):
  def build(mesh):
    x = import_(mesh, X, [BATCH, LENGTH, D_MODEL])
    qkvo_variable(mesh, "self", W_SELF)
    ids = import_(mesh, IDS, [BATCH, LENGTH], tf.int32)
    mask = mtf.layers.attention_mask_autoregressive(
      mtf.range(mesh, LENGTH, tf.int32)
    ) + mtf.layers.attention_mask_ignore_padding(ids)
    return [
      mtf.layers.multihead_attention(
        x, None, mask, D_KV, HEADS, False, name="self"
      )
    ]

  out = mtu.run_program(build, "rows:2;cols:2", "batch:rows;heads:cols", mode)
  np.testing.assert_allclose(out[0], expected_dense()[0], rtol=2e-4, atol=2e-5)


# ----------------------------------------------------------------------------
# dot_product_attention
# ----------------------------------------------------------------------------


def test_dot_product_attention_extra_logit_and_mask():
  a, m, c, e = (
    mtf.Dimension("a", 3),
    mtf.Dimension("m", 6),
    mtf.Dimension("c", 2),
    mtf.Dimension("e", 4),
  )
  b = mtf.Dimension("b", 2)
  q_np, k_np, v_np = _rand(2, 3, 2), _rand(2, 6, 2), _rand(2, 6, 4)
  allowed = _RNG.rand(3, 6) < 0.6
  allowed[:, 0] = True
  bias = ref.bias_from_allowed(allowed)

  def build(mesh):
    q = import_(mesh, q_np, [b, a, c])
    k = import_(mesh, k_np, [b, m, c])
    v = import_(mesh, v_np, [b, m, e])
    mask = import_(mesh, bias, [a, m])
    return [
      mtf.layers.dot_product_attention(q, k, v, mask, False),
      mtf.layers.dot_product_attention(q, k, v, None, True, extra_logit=0.5),
      mtf.layers.dot_product_attention(q, k, v, mask, False, dropout=0.5),
    ]

  expected = [
    ref.attend(ref.NP, q_np, k_np, v_np, bias),
    ref.attend(ref.NP, q_np, k_np, v_np, None, extra_logit=0.5),
    ref.attend(ref.NP, q_np, k_np, v_np, bias),
  ]
  for mesh_shape, layout in [
    ("", ""),
    ("rows:2;cols:2", "b:rows;c:cols"),
    ("rows:2;cols:2", "m:rows;e:cols"),
  ]:
    mtu.assert_all_close(
      mtu.run_program(build, mesh_shape, layout),
      expected,
      rtol=1e-4,
      atol=1e-5,
      msg=layout,
    )


def test_dot_product_attention_dropout():
  bt, a, m, c = (
    mtf.Dimension("bt", 2),
    mtf.Dimension("a", 3),
    mtf.Dimension("m", 6),
    mtf.Dimension("c", 2),
  )
  vd = mtf.Dimension("vd", 6)
  q_np, k_np = _rand(2, 3, 2), _rand(2, 6, 2)
  eye = np.eye(6, dtype=np.float32)  # Output = the attention weights.

  def build(mesh):
    q = import_(mesh, q_np, [bt, a, c])
    k = import_(mesh, k_np, [bt, m, c])
    v = import_(mesh, eye, [m, vd])
    return [
      mtf.layers.dot_product_attention(
        q, k, v, None, True, dropout=0.5, dropout_broadcast_dims=[a]
      ),
      mtf.layers.dot_product_attention(q, k, v, None, False, dropout=0.5),
    ]

  weights = ref.NP.softmax(np.einsum("bac,bmc->bam", q_np, k_np))
  dropped, not_training = mtu.run_program(build)
  np.testing.assert_allclose(not_training, weights, rtol=1e-5, atol=1e-6)
  kept = dropped != 0
  np.testing.assert_allclose(dropped[kept], 2.0 * weights[kept], rtol=1e-5)
  # The dropout mask is shared along the broadcast dim "a".
  assert (kept == kept[:, :1, :]).all()
  assert 0 < kept.sum() < kept.size


# ----------------------------------------------------------------------------
# Incremental decoding
# ----------------------------------------------------------------------------


@meshes.parametrize(
  [
    ("", ""),
    ("rows:2;cols:2", "batch:rows;heads:cols"),
    ("rows:2;cols:2", "memory_length:rows;d_kv:cols"),
  ]
)
def test_self_attention_incremental_matches_full_causal(mesh_shape, layout):
  cache_len = mtf.Dimension("memory_length", 8)

  def build(mesh):
    x = import_(mesh, X, [BATCH, LENGTH, D_MODEL])
    qkvo_variable(mesh, "dec", W_SELF)
    causal = mtf.layers.attention_mask_autoregressive(
      mtf.range(mesh, LENGTH, tf.int32)
    )
    full = mtf.layers.multihead_attention(
      x, None, causal, D_KV, HEADS, False, name="dec"
    )
    k = mtf.zeros(mesh, [BATCH, HEADS, cache_len, D_KV])
    v = mtf.zeros(mesh, [BATCH, HEADS, cache_len, D_KV])
    ys = []
    for i in range(8):
      xi = import_(mesh, X[:, i], [BATCH, D_MODEL])
      step = mtf.constant(mesh, i, [], tf.int32) if i % 2 else i
      y, k, v = mtf.layers.multihead_self_attention_incremental(
        xi, k, v, step, tf.float32, tf.float32, name="dec"
      )
      ys.append(y)
    return [full, mtf.stack(ys, "length", axis=1), k, v]

  full, steps, k, v = mtu.run_program(build, mesh_shape, layout)
  expected = ref.mha(
    ref.NP, X, X, W_SELF, ref.bias_from_allowed(np.tril(np.ones((8, 8), bool)))
  )
  np.testing.assert_allclose(full, expected, rtol=2e-4, atol=2e-5)
  np.testing.assert_allclose(steps, full, rtol=2e-4, atol=2e-5)
  np.testing.assert_allclose(
    k, np.einsum("bld,hdc->bhlc", X, W_SELF[1]), rtol=1e-5, atol=1e-5
  )
  np.testing.assert_allclose(
    v, np.einsum("bld,hdc->bhlc", X, W_SELF[2]), rtol=1e-5, atol=1e-5
  )


@meshes.parametrize(
  [
    ("", ""),
    ("rows:2;cols:2", "batch:rows;heads:cols"),
    ("rows:2;cols:2", "memory_length:cols;d_model:rows"),
  ]
)
def test_encdec_attention_incremental(mesh_shape, layout):
  def build(mesh):
    x = import_(mesh, X, [BATCH, LENGTH, D_MODEL])
    mem = import_(mesh, MEM, [BATCH, MEMORY, D_MODEL])
    mem_ids = import_(
      mesh, MEM_IDS, [BATCH, mtf.Dimension("length", 4)], tf.int32
    )
    with tf1.variable_scope("ed"):
      for name, w in zip("qkvo", W_ENCDEC):
        mtf.get_variable(
          mesh,
          name,
          [HEADS, D_MODEL, D_KV],
          initializer=tf1.constant_initializer(w),
        )
      wq, wk, wv, wo = mtf.layers.multihead_attention_params(
        mesh, HEADS, D_MODEL, D_KV, mtf.VariableDType(tf.float32)
      )
    k = mtf.einsum([mem, wk], [BATCH, HEADS, MEMORY, D_KV])
    v = mtf.einsum([mem, wv], [BATCH, HEADS, MEMORY, D_KV])
    mask = mtf.layers.attention_mask_ignore_padding(mem_ids)
    whole = mtf.layers.multihead_encdec_attention_incremental(
      x, wq, wo, k, v, mask
    )
    step = mtf.layers.multihead_encdec_attention_incremental(
      import_(mesh, X[:, 5], [BATCH, D_MODEL]), wq, wo, k, v, mask, name="step"
    )
    return [whole, step]

  whole, step = mtu.run_program(build, mesh_shape, layout)
  expected = ref.mha(ref.NP, X, MEM, W_ENCDEC, encdec_bias(MEM_IDS))
  np.testing.assert_allclose(whole, expected, rtol=2e-4, atol=2e-5)
  np.testing.assert_allclose(step, expected[:, 5], rtol=2e-4, atol=2e-5)


# ----------------------------------------------------------------------------
# compress_mean and masks
# ----------------------------------------------------------------------------


def test_compress_mean_and_rename():
  def build(mesh):
    x = import_(mesh, X, [BATCH, LENGTH, D_MODEL])
    c = mtf.layers.compress_mean(x, LENGTH, 4)
    r = mtf.layers.rename_length_to_memory_length(c)
    r2 = mtf.layers.rename_length_to_memory_length(x, "d_model", "channels")
    assert c.shape == mtf.Shape([BATCH, mtf.Dimension("length", 2), D_MODEL])
    assert r.shape.dimension_names == ["batch", "memory_length", "d_model"]
    assert r2.shape.dimension_names == ["batch", "length", "channels"]
    g = mtf.gradients([mtf.reduce_sum(c * c)], [x])[0]
    return [c, r, g]

  expected_c = X.reshape(4, 2, 4, 4).mean(2)
  expected_g = np.repeat(2 * expected_c / 4, 4, axis=1)
  for mesh_shape, layout in [
    ("", ""),
    ("all:4", "batch:all"),
    ("rows:2;cols:2", "length:rows;d_model:cols"),
  ]:
    mtu.assert_all_close(
      mtu.run_program(build, mesh_shape, layout),
      [expected_c, expected_c, expected_g],
      atol=1e-6,
    )


def np_local_block_bias(block, dtype=np.float32):
  future = np.arange(block)[:, None] < np.arange(block)[None, :]
  return np.concatenate(
    [np.zeros((block, block)), future * -1e9], axis=1
  ).astype(dtype)


def np_local_2d_block_bias(h, w):
  """[h, w, 2h, 2w]: raster-order causal over the 2x2-block window."""
  out = np.zeros((h, w, 2 * h, 2 * w), np.float32)
  for i in range(h):
    for j in range(w):
      for r in range(2 * h):
        for c in range(2 * w):
          row, col = r - h, c - w  # Memory position relative to the block.
          if row > i or (row == i and col > j):
            out[i, j, r, c] = -1e9
  return out


def test_masks_match_numpy_definitions():
  seg = np.array(
    [
      [1, 1, 1, 2, 2, 3, 3, 3],
      [1, 2, 2, 2, 2, 2, 2, 2],
      [1, 1, 1, 1, 1, 1, 1, 1],
      [1, 2, 3, 4, 5, 6, 7, 8],
    ],
    np.int32,
  )
  mem_seg = seg[::-1].copy()
  qpos = np.tile(np.array([0, 1, 2, 0, 1, 2, 3, 4], np.int32), (4, 1))
  blk, mem = mtf.Dimension("blk", 3), mtf.Dimension("mem", 7)
  h, w = mtf.Dimension("h", 2), mtf.Dimension("w", 3)
  mh, mw = mtf.Dimension("mh", 2), mtf.Dimension("mw", 3)
  shapes = []

  def build(mesh):
    ids = import_(mesh, IDS, [BATCH, LENGTH], tf.int32)
    s = import_(mesh, seg, [BATCH, LENGTH], tf.int32)
    ms = import_(mesh, mem_seg, [BATCH, LENGTH], tf.int32)
    qp = import_(mesh, qpos, [BATCH, LENGTH], tf.int32)
    outs = [
      mtf.layers.attention_mask_ignore_padding(ids),
      mtf.layers.attention_mask_autoregressive(
        mtf.range(mesh, LENGTH, tf.int32)
      ),
      mtf.layers.attention_mask_autoregressive(qp),
      mtf.layers.attention_mask_same_segment(s),
      mtf.layers.attention_mask_same_segment(s, ms),
      mtf.layers.attention_bias_local_block(mesh, blk, mem),
      mtf.layers.attention_bias_local_2d_block(mesh, h, w, mh, mw),
      mtf.layers.attention_mask_ignore_padding(ids, dtype=tf.bfloat16),
    ]
    shapes[:] = [
      (o.shape.dimension_names, o.shape.to_integer_list, o.dtype) for o in outs
    ]
    return outs

  expected = [
    (IDS == 0) * -1e9,
    (np.arange(8)[:, None] < np.arange(8)[None, :]) * -1e9,
    (qpos[:, :, None] < qpos[:, None, :]) * -1e9,
    (seg[:, :, None] != seg[:, None, :]) * -1e9,
    (seg[:, :, None] != mem_seg[:, None, :]) * -1e9,
    np_local_block_bias(3),
    np_local_2d_block_bias(2, 3),
    (IDS == 0) * -1e9,
  ]
  for mesh_shape, layout in [
    ("", ""),
    ("rows:2;cols:2", "batch:rows;length:cols"),
    ("rows:2;cols:2", "memory_length:rows;mh:cols"),
  ]:
    out = mtu.run_program(build, mesh_shape, layout)
    for i, (a, e) in enumerate(zip(out, expected)):
      np.testing.assert_array_equal(
        a.astype(np.float32),
        np.asarray(e, np.float32).astype(a.dtype).astype(np.float32),
        err_msg="mask %d on %s" % (i, layout),
      )
  assert shapes == [
    (["batch", "memory_length"], [4, 8], tf.float32),
    (["length", "memory_length"], [8, 8], tf.float32),
    (["batch", "length", "memory_length"], [4, 8, 8], tf.float32),
    (["batch", "length", "memory_length"], [4, 8, 8], tf.float32),
    (["batch", "length", "memory_length"], [4, 8, 8], tf.float32),
    (["blk", "mem"], [3, 6], tf.float32),
    (["h", "w", "mh", "mw"], [2, 3, 4, 6], tf.float32),
    (["batch", "memory_length"], [4, 8], tf.bfloat16),
  ]


# ----------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------


def test_bad_inputs_raise_clear_errors():
  with mtf.variable_store(mtf.VariableStore()):
    _check_bad_inputs()


def _check_bad_inputs():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, [BATCH, LENGTH, D_MODEL])
  other_io = mtf.zeros(mesh, [BATCH, MEMORY, mtf.Dimension("d_model", 6)])
  other_batch = mtf.zeros(mesh, [mtf.Dimension("batch", 2), MEMORY, D_MODEL])
  layers = mtf.layers
  with pytest.raises(
    ValueError,
    match="memory channels .*d_model.*6.*must equal query io channels",
  ):
    layers.multihead_attention(x, other_io, None, D_KV, HEADS, False)
  with pytest.raises(ValueError, match="memory batch dims"):
    layers.multihead_attention(x, other_batch, None, D_KV, HEADS, False)
  with pytest.raises(ValueError, match="memory length dimension"):
    layers.multihead_attention(x, x, None, D_KV, HEADS, False)
  with pytest.raises(
    ValueError,
    match="heads dimension .*d_model.* is already a dimension of the input",
  ):
    layers.multihead_attention(
      x, None, None, D_KV, mtf.Dimension("d_model", 4), False
    )

  q = mtf.zeros(mesh, [BATCH, LENGTH, D_KV])
  k = mtf.zeros(mesh, [BATCH, MEMORY, D_KV])
  k_bad = mtf.zeros(mesh, [BATCH, MEMORY, mtf.Dimension("d_kv", 3)])
  v_bad = mtf.zeros(mesh, [BATCH, LENGTH, D_KV])
  with pytest.raises(ValueError, match="last dimension of k"):
    layers.dot_product_attention(q, k_bad, k, None, False)
  with pytest.raises(ValueError, match="v .*memory length dimension"):
    layers.dot_product_attention(q, k, v_bad, None, False)
  with pytest.raises(ValueError, match="mask dimension .*heads"):
    layers.dot_product_attention(q, k, k, mtf.zeros(mesh, [HEADS]), False)

  with pytest.raises(ValueError, match="compression_factor 3 .*length"):
    layers.compress_mean(x, LENGTH, 3)
  with pytest.raises(ValueError, match="compression_factor 3"):
    layers.multihead_self_attention_memory_compressed(
      x, True, 3, D_KV, HEADS, False, name="c3"
    )
  with pytest.raises(ValueError, match="not in"):
    layers.compress_mean(x, mtf.Dimension("nope", 8), 2)
  with pytest.raises(ValueError, match="no dimension 'length'"):
    layers.rename_length_to_memory_length(k)

  xi = mtf.zeros(mesh, [BATCH, D_MODEL])
  cache = mtf.zeros(mesh, [BATCH, HEADS, MEMORY, D_KV])
  bad_cache = mtf.zeros(mesh, [mtf.Dimension("batch", 2), HEADS, MEMORY, D_KV])
  with pytest.raises(ValueError, match="prev_k .*batch"):
    layers.multihead_self_attention_incremental(
      xi, bad_cache, bad_cache, 0, tf.float32, tf.float32
    )
  with pytest.raises(ValueError, match="same shape"):
    layers.multihead_self_attention_incremental(
      xi, cache, bad_cache, 0, tf.float32, tf.float32
    )
  with pytest.raises(ValueError, match="step_num"):
    layers.multihead_self_attention_incremental(
      xi, cache, cache, 1.5, tf.float32, tf.float32
    )
  wq = mtf.zeros(mesh, [HEADS, D_MODEL, D_KV])
  with pytest.raises(ValueError, match="wo has shape"):
    layers.multihead_encdec_attention_incremental(
      xi, wq, mtf.zeros(mesh, [HEADS, D_KV, D_MODEL]), cache, cache, None
    )
  with pytest.raises(ValueError, match="distinct"):
    layers.attention_bias_local_block(mesh, LENGTH, LENGTH)
  with pytest.raises(ValueError, match="distinct"):
    layers.attention_bias_local_2d_block(mesh, LENGTH, D_MODEL, LENGTH, HEADS)
  with pytest.raises(ValueError, match="distinct dimension names"):
    layers.multihead_attention_params(
      mesh, HEADS, HEADS, D_KV, mtf.VariableDType()
    )
