"""Tests for mesh_tensorflow._src.layers.local_attention.

Local attention is checked against dense attention over a zero-padded memory
with an explicit numpy "allowed" matrix (which positions each query sees):
masked_local_attention_1d (query p sees (p - window, p]), 1-d blocks
(own block plus the previous, and the next unless mask_right) and 2-d blocks
(3x3 block window, or 2x2 with raster-order causality). Values use numpy,
gradients tf.GradientTape. Layouts split batch, heads, d_kv and the blocks
dimensions, so the halo exchanges communicate; all meshes must agree.
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

BATCH = mtf.Dimension("batch", 2)
LENGTH = mtf.Dimension("length", 16)
D_MODEL = mtf.Dimension("d_model", 4)
HEADS = mtf.Dimension("heads", 2)
D_KV = mtf.Dimension("d_kv", 2)
QKVO = mtf.Dimension("qkvo", 4)

_RNG = np.random.RandomState(7)


def _rand(*shape, scale=1.0):
  return (_RNG.randn(*shape) * scale).astype(np.float32)


X = _rand(2, 16, 4)
COT = _rand(2, 16, 4)
W = [_rand(4, 2, 4, 2, scale=0.7) for _ in range(8)]


def import_(mesh, value, dims, dtype=tf.float32):
  return mtf.import_tf_tensor(
    mesh, tf.constant(value, dtype=dtype), mtf.Shape(dims)
  )


def qkvo_variable(mesh, scope, value):
  with tf1.variable_scope(scope):
    return mtf.get_variable(
      mesh,
      "qkvo",
      mtf.Shape([QKVO, HEADS, D_MODEL, D_KV]),
      initializer=tf1.constant_initializer(value),
    )


def split_factor(layout, mesh_shape, dim_name):
  rules = dict(p.split(":") for p in layout.split(";") if p)
  if dim_name not in rules:
    return 1
  mesh = dict(
    (k, int(v)) for k, v in (p.split(":") for p in mesh_shape.split(";") if p)
  )
  return mesh[rules[dim_name]]


# ----------------------------------------------------------------------------
# numpy definitions of the attention windows
# ----------------------------------------------------------------------------


def allowed_masked_local(length, window):
  """[l, window + l]: query p sees j in (p - window, p]; j = column - window."""
  p = np.arange(length)[:, None]
  j = np.arange(window + length)[None, :] - window
  return (j > p - window) & (j <= p)


def allowed_blocks_1d(length, block, mask_right):
  """[l, block + l (+ block)]: own and previous (and next) block."""
  pad_after = 0 if mask_right else block
  p = np.arange(length)[:, None]
  j = np.arange(block + length + pad_after)[None, :] - block
  offset = j // block - p // block
  if mask_right:
    return ((offset == -1) | (offset == 0)) & (j <= p)
  return np.abs(offset) <= 1


def allowed_blocks_2d(rows, cols, h, w, mask_right):
  """[rows*cols, padded_rows*padded_cols] for 2-d blocks of h x w."""
  pr, pc = (h, w) if mask_right else (2 * h, 2 * w)
  r = np.arange(rows)[:, None, None, None]
  c = np.arange(cols)[None, :, None, None]
  mr = np.arange(rows + pr)[None, None, :, None] - h
  mc = np.arange(cols + pc)[None, None, None, :] - w
  dr = mr // h - r // h
  dc = mc // w - c // w
  if mask_right:
    in_window = (dr >= -1) & (dr <= 0) & (dc >= -1) & (dc <= 0)
    causal = (mr < r) | ((mr == r) & (mc <= c))
    allowed = in_window & causal
  else:
    allowed = (np.abs(dr) <= 1) & (np.abs(dc) <= 1)
  return allowed.reshape(rows * cols, (rows + pr) * (cols + pc))


def blocks_1d_reference(xp, x_seq, w, block, mask_right):
  return ref.padded_local_attention(
    xp,
    x_seq,
    w,
    allowed_blocks_1d(int(x_seq.shape[1]), block, mask_right),
    block,
    0 if mask_right else block,
  )


def blocks_2d_reference(xp, image, w, h, wd, mask_right):
  """image [b, rows, cols, d] -> [b, rows, cols, d]."""
  b, rows, cols, d = [int(n) for n in image.shape]  # TF1: Dimensions.
  after_h, after_w = (0, 0) if mask_right else (h, wd)
  flat = xp.reshape(image, [b, rows * cols, d])
  q = xp.einsum("bld,hdc->bhlc", flat, w[0])

  def memory(wm):
    m = xp.einsum("brsd,hdc->bhrsc", image, wm)
    m = xp.pad(xp.pad(m, 2, h, after_h), 3, wd, after_w)
    return xp.reshape(m, [b, m.shape[1], -1, m.shape[-1]])

  bias = ref.bias_from_allowed(allowed_blocks_2d(rows, cols, h, wd, mask_right))
  o = ref.attend(xp, q, memory(w[1]), memory(w[2]), bias)
  return xp.reshape(xp.einsum("bhlc,hdc->bld", o, w[3]), [b, rows, cols, d])


def test_window_definitions():
  # masked local, window 2: query 3 sees positions 2 and 3.
  a = allowed_masked_local(5, 2)
  assert np.flatnonzero(a[3]).tolist() == [4, 5]
  # 1-d blocks of 2, causal: query 3 (block 1) sees 0..3.
  a = allowed_blocks_1d(6, 2, True)
  assert (np.flatnonzero(a[3]) - 2).tolist() == [0, 1, 2, 3]
  a = allowed_blocks_1d(6, 2, False)
  assert (np.flatnonzero(a[2]) - 2).tolist() == [0, 1, 2, 3, 4, 5]
  # 2-d: 2x2 blocks on a 4x4 image, causal: query (2, 3) sees rows 0-1 of
  # cols 0-3 (blocks above) and row 2 up to col 3.
  a = allowed_blocks_2d(4, 4, 2, 2, True).reshape(4, 4, 6, 6)
  seen = [(r - 2, c - 2) for r, c in zip(*np.nonzero(a[2, 3]))]
  assert seen == [(r, c) for r in (0, 1) for c in range(4)] + [
    (2, c) for c in range(4)
  ]


# ----------------------------------------------------------------------------
# Signatures and variables
# ----------------------------------------------------------------------------

_E = inspect.Parameter.empty
SIGNATURES = {
  "masked_local_attention_1d": [
    ("x", _E),
    ("kv_channels", _E),
    ("heads", _E),
    ("is_training", _E),
    ("window_size", 128),
    ("master_dtype", tf.float32),
    ("slice_dtype", tf.float32),
    ("length_per_split", None),
    ("return_kv", None),
    ("params", None),
    ("name", None),
  ],
  "masked_local_attention_1d_incremental": [
    ("x", _E),
    ("prev_k", _E),
    ("prev_v", _E),
    ("step_num", _E),
    ("master_dtype", None),
    ("slice_dtype", None),
    ("params", None),
    ("name", None),
  ],
  "local_self_attention_spatial_blocks": [
    ("query_antecedent", _E),
    ("kv_channels", _E),
    ("heads", _E),
    ("is_training", _E),
    ("memory_w_dim", None),
    ("mask_right", False),
    ("master_dtype", tf.float32),
    ("slice_dtype", tf.float32),
    ("name", None),
  ],
  "local_2d_self_attention_spatial_blocks": [
    ("query_antecedent", _E),
    ("kv_channels", _E),
    ("heads", _E),
    ("is_training", _E),
    ("memory_h_dim", None),
    ("memory_w_dim", None),
    ("mask_right", False),
    ("master_dtype", tf.float32),
    ("slice_dtype", tf.float32),
    ("name", None),
  ],
  "local_1d_halo_exchange": [
    ("k", _E),
    ("v", _E),
    ("num_w_blocks", _E),
    ("w_dim", _E),
    ("mask_right", _E),
  ],
  "local_2d_halo_exchange": [
    ("k", _E),
    ("v", _E),
    ("num_h_blocks", _E),
    ("h_dim", _E),
    ("num_w_blocks", _E),
    ("w_dim", _E),
    ("mask_right", _E),
  ],
}


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_signature(name):
  fn = getattr(mtf.layers, name)
  params = [
    (p.name, p.default) for p in inspect.signature(fn).parameters.values()
  ]
  assert params == SIGNATURES[name]


def test_variable_names_shapes_and_return_kv():
  with mtf.variable_store(mtf.VariableStore()):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    x = mtf.zeros(mesh, [BATCH, LENGTH, D_MODEL])
    kv = []
    y = mtf.layers.masked_local_attention_1d(
      x,
      D_KV,
      HEADS,
      True,
      window_size=4,
      return_kv=kv,
      name="loc",
      master_dtype=tf.bfloat16,
    )
    assert y.shape == x.shape
    assert [t.shape for t in kv] == [
      mtf.Shape([BATCH, HEADS, LENGTH, D_KV])
    ] * 2
    params = mtf.layers.multihead_attention_params(
      mesh, HEADS, D_MODEL, D_KV, mtf.VariableDType(), combine=False
    )
    with tf1.variable_scope("p"):
      mtf.layers.masked_local_attention_1d(x, D_KV, HEADS, True, params=params)
    with tf1.variable_scope("s"):
      xb = mtf.zeros(
        mesh, [BATCH, mtf.Dimension("nb", 4), mtf.Dimension("w", 4), D_MODEL]
      )
      mtf.layers.local_self_attention_spatial_blocks(xb, D_KV, HEADS, True)
      x2 = mtf.zeros(
        mesh,
        [
          BATCH,
          mtf.Dimension("nh", 2),
          mtf.Dimension("nw", 2),
          mtf.Dimension("h", 2),
          mtf.Dimension("w", 2),
          D_MODEL,
        ],
      )
      mtf.layers.local_2d_self_attention_spatial_blocks(
        x2, D_KV, HEADS, True, mask_right=True, name="two_d"
      )
    names = [v.name for v in graph.all_variables]
    assert names[:5] == ["loc/qkvo", "q", "k", "v", "o"]
    assert names[5] == "s/multihead_attention/qkvo"
    assert names[6] == "s/two_d/qkvo"
    assert len(names) == 7
    assert graph.all_variables[0].shape == mtf.Shape(
      [QKVO, HEADS, D_MODEL, D_KV]
    )
    assert graph.all_variables[0].master_dtype == tf.bfloat16


# ----------------------------------------------------------------------------
# masked_local_attention_1d
# ----------------------------------------------------------------------------

# (window_size, length_per_split); the block is length_per_split (or 16).
LOCAL_CASES = [(3, None), (128, None), (3, 4), (6, 4), (16, 2), (5, 8)]


def local_cases(mesh_shape, layout):
  split = split_factor(layout, mesh_shape, "length")
  return [
    (w, lps) for w, lps in LOCAL_CASES if (16 // (lps or 16)) % split == 0
  ]


def masked_local_reference(xp, x, w, window):
  return ref.padded_local_attention(
    xp, x, w, allowed_masked_local(16, window), window, 0
  )


@meshes.parametrize(meshes.LOCAL_ATTENTION)
def test_masked_local_attention_1d_values_and_gradients(mesh_shape, layout):
  cases = local_cases(mesh_shape, layout)

  def build(mesh):
    x = import_(mesh, X, [BATCH, LENGTH, D_MODEL])
    cot = import_(mesh, COT, [BATCH, LENGTH, D_MODEL])
    outs, ws = [], []
    for i, (window, lps) in enumerate(cases):
      ws.append(qkvo_variable(mesh, "loc%d" % i, W[i]))
      outs.append(
        mtf.layers.masked_local_attention_1d(
          x,
          D_KV,
          HEADS,
          True,
          window_size=window,
          length_per_split=lps,
          name="loc%d" % i,
        )
      )
    grads = [
      mtf.gradients([mtf.reduce_sum(y * cot)], [x, w]) for y, w in zip(outs, ws)
    ]
    # The params path gives the same as the variable path.
    params = mtf.unstack(ws[0], QKVO)
    outs.append(
      mtf.layers.masked_local_attention_1d(
        x,
        D_KV,
        HEADS,
        False,
        window_size=cases[0][0],
        length_per_split=cases[0][1],
        params=params,
      )
    )
    return outs + [g for pair in grads for g in pair]

  out = mtu.run_program(build, mesh_shape, layout)
  n = len(cases)
  for i, (window, lps) in enumerate(cases):
    msg = "window=%d length_per_split=%s" % (window, lps)
    np.testing.assert_allclose(
      out[i],
      masked_local_reference(ref.NP, X, W[i], window),
      rtol=2e-4,
      atol=2e-5,
      err_msg=msg,
    )
    expected_grads = ref.tape_gradients(
      lambda x, w, window=window: masked_local_reference(ref.TF, x, w, window),
      [X, W[i]],
      COT,
    )
    for j, name in enumerate(["d_x", "d_w"]):
      np.testing.assert_allclose(
        out[n + 1 + 2 * i + j],
        expected_grads[j],
        rtol=2e-4,
        atol=2e-5,
        err_msg="%s %s" % (name, msg),
      )
  np.testing.assert_allclose(out[n], out[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", mtu.MODES)
def test_masked_local_attention_1d_all_modes(mode):
  def build(mesh):
    x = import_(mesh, X, [BATCH, LENGTH, D_MODEL])
    qkvo_variable(mesh, "loc", W[0])
    return [
      mtf.layers.masked_local_attention_1d(
        x, D_KV, HEADS, True, window_size=6, length_per_split=4, name="loc"
      )
    ]

  out = mtu.run_program(build, "rows:2;cols:2", "length:rows;heads:cols", mode)
  np.testing.assert_allclose(
    out[0], masked_local_reference(ref.NP, X, W[0], 6), rtol=2e-4, atol=2e-5
  )


@meshes.parametrize(
  [
    ("", ""),
    ("rows:2;cols:2", "batch:rows;heads:cols"),
    ("rows:2;cols:2", "window:rows;d_kv:cols"),
  ]
)
def test_masked_local_attention_1d_incremental_matches_full(mesh_shape, layout):
  window = mtf.Dimension("window", 4)

  def build(mesh):
    x = import_(mesh, X, [BATCH, LENGTH, D_MODEL])
    qkvo_variable(mesh, "loc", W[1])
    full = mtf.layers.masked_local_attention_1d(
      x, D_KV, HEADS, False, window_size=4, length_per_split=8, name="loc"
    )
    k = mtf.zeros(mesh, [BATCH, HEADS, window, D_KV])
    v = mtf.zeros(mesh, [BATCH, HEADS, window, D_KV])
    ys = []
    for i in range(16):
      xi = import_(mesh, X[:, i], [BATCH, D_MODEL])
      step = mtf.constant(mesh, i, [], tf.int32) if i % 2 else i
      y, k, v = mtf.layers.masked_local_attention_1d_incremental(
        xi, k, v, step, name="loc"
      )
      ys.append(y)
    return [full, mtf.stack(ys, "length", axis=1), k]

  full, steps, k = mtu.run_program(build, mesh_shape, layout)
  np.testing.assert_allclose(
    full, masked_local_reference(ref.NP, X, W[1], 4), rtol=2e-4, atol=2e-5
  )
  np.testing.assert_allclose(steps, full, rtol=2e-4, atol=2e-5)
  # The ring buffer holds positions 12..15 in slots 0..3.
  np.testing.assert_allclose(
    k, np.einsum("bld,hdc->bhlc", X[:, 12:], W[1][1]), rtol=1e-5, atol=1e-5
  )


# ----------------------------------------------------------------------------
# Spatial blocks
# ----------------------------------------------------------------------------

NB, WB = mtf.Dimension("nb", 4), mtf.Dimension("w", 4)
NH, NW = mtf.Dimension("nh", 2), mtf.Dimension("nw", 2)
HB, WB2 = mtf.Dimension("h", 2), mtf.Dimension("wd", 4)
# A 4 x 8 image in 2 x 2 blocks of 2 x 4.
IMAGE = _rand(2, 4, 8, 4)
IMAGE_COT = _rand(2, 4, 8, 4)


def to_blocks_2d(image):
  return image.reshape(2, 2, 2, 2, 4, 4).transpose(0, 1, 3, 2, 4, 5)


def from_blocks_2d(blocks):
  return blocks.transpose(0, 1, 3, 2, 4, 5).reshape(2, 4, 8, 4)


@meshes.parametrize(meshes.SPATIAL_ATTENTION)
def test_spatial_block_attention_values_and_gradients(mesh_shape, layout):
  x_blocks = X.reshape(2, 4, 4, 4)
  cot_blocks = COT.reshape(2, 4, 4, 4)
  image_blocks = to_blocks_2d(IMAGE)
  cot_2d = to_blocks_2d(IMAGE_COT)

  def build(mesh):
    x = import_(mesh, x_blocks, [BATCH, NB, WB, D_MODEL])
    img = import_(mesh, image_blocks, [BATCH, NH, NW, HB, WB2, D_MODEL])
    outs, inputs, cots, ws = [], [], [], []
    for i, mask_right in enumerate([False, True]):
      ws.append(qkvo_variable(mesh, "one_d_%d" % i, W[i]))
      outs.append(
        mtf.layers.local_self_attention_spatial_blocks(
          x,
          D_KV,
          HEADS,
          True,
          mask_right=mask_right,
          memory_w_dim=mtf.Dimension("mem_w", 4) if i else None,
          name="one_d_%d" % i,
        )
      )
      inputs.append(x)
      cots.append(cot_blocks)
    for i, mask_right in enumerate([False, True]):
      ws.append(qkvo_variable(mesh, "two_d_%d" % i, W[2 + i]))
      outs.append(
        mtf.layers.local_2d_self_attention_spatial_blocks(
          img, D_KV, HEADS, True, mask_right=mask_right, name="two_d_%d" % i
        )
      )
      inputs.append(img)
      cots.append(cot_2d)
    grads = []
    for y, inp, c, w in zip(outs, inputs, cots, ws):
      loss = mtf.reduce_sum(y * mtf.constant(mesh, c, y.shape))
      grads += mtf.gradients([loss], [inp, w])
    return outs + grads

  out = mtu.run_program(build, mesh_shape, layout)

  def ref_1d(xp, x, w, mask_right):
    return blocks_1d_reference(xp, x, w, 4, mask_right)

  def ref_2d(xp, image, w, mask_right):
    return blocks_2d_reference(xp, image, w, 2, 4, mask_right)

  for i, mask_right in enumerate([False, True]):
    msg = "1-d mask_right=%s" % mask_right
    np.testing.assert_allclose(
      out[i].reshape(2, 16, 4),
      ref_1d(ref.NP, X, W[i], mask_right),
      rtol=2e-4,
      atol=2e-5,
      err_msg=msg,
    )
    gx, gw = ref.tape_gradients(
      lambda x, w, m=mask_right: ref_1d(ref.TF, x, w, m), [X, W[i]], COT
    )
    np.testing.assert_allclose(
      out[4 + 2 * i].reshape(2, 16, 4),
      gx,
      rtol=2e-4,
      atol=2e-5,
      err_msg="d_x " + msg,
    )
    np.testing.assert_allclose(
      out[5 + 2 * i], gw, rtol=2e-4, atol=2e-5, err_msg="d_w " + msg
    )
  for i, mask_right in enumerate([False, True]):
    msg = "2-d mask_right=%s" % mask_right
    np.testing.assert_allclose(
      from_blocks_2d(out[2 + i]),
      ref_2d(ref.NP, IMAGE, W[2 + i], mask_right),
      rtol=2e-4,
      atol=2e-5,
      err_msg=msg,
    )
    gx, gw = ref.tape_gradients(
      lambda x, w, m=mask_right: ref_2d(ref.TF, x, w, m),
      [IMAGE, W[2 + i]],
      IMAGE_COT,
    )
    np.testing.assert_allclose(
      from_blocks_2d(out[8 + 2 * i]),
      gx,
      rtol=2e-4,
      atol=2e-5,
      err_msg="d_x " + msg,
    )
    np.testing.assert_allclose(
      out[9 + 2 * i], gw, rtol=2e-4, atol=2e-5, err_msg="d_w " + msg
    )


def test_spatial_memory_dims_are_ignored_like_the_original():
  """The memory_*_dim arguments do not name anything, as in the original.

  tensor2tensor's image transformer passes the query's own block dims as
  memory_w_dim (and memory_h_dim / memory_w_dim for the 2-d layer); the
  original ignored them and always named the memory dims "memory_" + the
  query dim's name, so those calls run and give the default results.
  """
  x_blocks = X.reshape(2, 4, 4, 4)
  image_blocks = to_blocks_2d(IMAGE)

  def build(mesh):
    x = import_(mesh, x_blocks, [BATCH, NB, WB, D_MODEL])
    img = import_(mesh, image_blocks, [BATCH, NH, NW, HB, WB2, D_MODEL])
    qkvo_variable(mesh, "one_d", W[0])
    qkvo_variable(mesh, "two_d", W[1])
    outs = []
    for memory_dims in [{}, {"memory_w_dim": WB}]:
      with tf1.variable_scope("", reuse=True):
        outs.append(
          mtf.layers.local_self_attention_spatial_blocks(
            x, D_KV, HEADS, True, mask_right=True, name="one_d", **memory_dims
          )
        )
    for memory_dims in [{}, {"memory_h_dim": NH, "memory_w_dim": NW}]:
      with tf1.variable_scope("", reuse=True):
        outs.append(
          mtf.layers.local_2d_self_attention_spatial_blocks(
            img, D_KV, HEADS, True, name="two_d", **memory_dims
          )
        )
    return outs

  out = mtu.run_program(build, "", "")
  expected_1d = blocks_1d_reference(ref.NP, X, W[0], 4, True)
  expected_2d = blocks_2d_reference(ref.NP, IMAGE, W[1], 2, 4, False)
  for i in range(2):
    np.testing.assert_allclose(
      out[i].reshape(2, 16, 4), expected_1d, rtol=2e-4, atol=2e-5
    )
    np.testing.assert_allclose(
      from_blocks_2d(out[2 + i]), expected_2d, rtol=2e-4, atol=2e-5
    )


# ----------------------------------------------------------------------------
# Halo exchanges
# ----------------------------------------------------------------------------


def np_halo_1d(k, mask_right):
  """k [nb, w, c] -> [nb, 2w or 3w, c]: previous (and next) block attached."""
  nb, w, c = k.shape
  seq = np.pad(k.reshape(nb * w, c), [(w, w), (0, 0)])
  size = 2 * w if mask_right else 3 * w
  return np.stack([seq[b * w : b * w + size] for b in range(nb)])


def np_halo_2d(k, mask_right):
  """k [nh, nw, h, w, c] -> [nh, nw, 2h|3h, 2w|3w, c]."""
  nh, nw, h, w, c = k.shape
  image = k.transpose(0, 2, 1, 3, 4).reshape(nh * h, nw * w, c)
  image = np.pad(image, [(h, h), (w, w), (0, 0)])
  sh, sw = (2 * h, 2 * w) if mask_right else (3 * h, 3 * w)
  return np.stack(
    [
      np.stack(
        [image[i * h : i * h + sh, j * w : j * w + sw] for j in range(nw)]
      )
      for i in range(nh)
    ]
  )


@pytest.mark.parametrize("mode", mtu.MODES)
@meshes.parametrize(
  [
    ("", ""),
    ("all:4", "nb:all;nw:all"),
    ("rows:2;cols:2", "nb:rows;nh:rows;nw:cols"),
    ("rows:2;cols:2", "c:rows;nb:cols;nh:cols"),
  ]
)
def test_halo_exchanges(mesh_shape, layout, mode):
  if mode != "eager" and mesh_shape != "rows:2;cols:2":
    pytest.skip("modes are covered on one mesh")
  nb, w, c = (
    mtf.Dimension("nb", 4),
    mtf.Dimension("w", 3),
    mtf.Dimension("c", 2),
  )
  nh, nw, h = (
    mtf.Dimension("nh", 2),
    mtf.Dimension("nw", 4),
    mtf.Dimension("h", 2),
  )
  w2 = mtf.Dimension("w", 2)
  k1, v1 = _rand(4, 3, 2), _rand(4, 3, 2)
  k2, v2 = _rand(2, 4, 2, 2, 2), _rand(2, 4, 2, 2, 2)

  def build(mesh):
    a = import_(mesh, k1, [nb, w, c])
    b = import_(mesh, v1, [nb, w, c])
    a2 = import_(mesh, k2, [nh, nw, h, w2, c])
    b2 = import_(mesh, v2, [nh, nw, h, w2, c])
    outs = []
    for mask_right in (False, True):
      outs += mtf.layers.local_1d_halo_exchange(a, b, nb, w, mask_right)
      outs += mtf.layers.local_1d_halo_exchange(a, b, None, w, mask_right)
      outs += mtf.layers.local_2d_halo_exchange(
        a2, b2, nh, h, nw, w2, mask_right
      )
    return outs

  out = mtu.run_program(build, mesh_shape, layout, mode)
  i = 0
  for mask_right in (False, True):
    after = 0 if mask_right else 3
    expected = [
      np_halo_1d(k1, mask_right),
      np_halo_1d(v1, mask_right),
      np.pad(k1, [(0, 0), (3, after), (0, 0)]),
      np.pad(v1, [(0, 0), (3, after), (0, 0)]),
      np_halo_2d(k2, mask_right),
      np_halo_2d(v2, mask_right),
    ]
    for e in expected:
      np.testing.assert_array_equal(out[i], e, err_msg="output %d" % i)
      i += 1


# ----------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------


def test_bad_inputs_raise_clear_errors():
  with mtf.variable_store(mtf.VariableStore()):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    x = mtf.zeros(mesh, [BATCH, LENGTH, D_MODEL])
    layers = mtf.layers
    with pytest.raises(ValueError, match="window_size must be a positive"):
      layers.masked_local_attention_1d(x, D_KV, HEADS, True, window_size=0)
    with pytest.raises(
      ValueError,
      match="length_per_split 3 must be a positive int dividing .*length",
    ):
      layers.masked_local_attention_1d(x, D_KV, HEADS, True, length_per_split=3)
    bad = [mtf.zeros(mesh, [HEADS, D_MODEL, D_KV])] * 3 + [
      mtf.zeros(mesh, [HEADS, D_KV, D_MODEL])
    ]
    with pytest.raises(ValueError, match="params: wo has shape"):
      layers.masked_local_attention_1d(x, D_KV, HEADS, True, params=bad)
    with pytest.raises(ValueError, match="quadruple"):
      layers.masked_local_attention_1d(x, D_KV, HEADS, True, params=bad[:3])
    cache = mtf.zeros(mesh, [BATCH, HEADS, mtf.Dimension("window", 4), D_KV])
    with pytest.raises(ValueError, match="prev_k"):
      layers.masked_local_attention_1d_incremental(
        mtf.zeros(mesh, [mtf.Dimension("batch", 3), D_MODEL]), cache, cache, 0
      )
    with pytest.raises(ValueError, match="num_w_blocks, w_dim, io_channels"):
      layers.local_self_attention_spatial_blocks(
        mtf.zeros(mesh, [D_MODEL]), D_KV, HEADS, True
      )
    with pytest.raises(ValueError, match="num_h_blocks"):
      layers.local_2d_self_attention_spatial_blocks(x, D_KV, HEADS, True)
    with pytest.raises(ValueError, match="'nb' is not a dimension"):
      layers.local_1d_halo_exchange(x, x, "nb", LENGTH, True)
    with pytest.raises(ValueError, match="must differ"):
      layers.local_1d_halo_exchange(x, x, LENGTH, LENGTH, True)

  # The default block (the whole length) cannot be split over 4 processors.
  def build(mesh):
    x = import_(mesh, X, [BATCH, LENGTH, D_MODEL])
    return [
      mtf.layers.masked_local_attention_1d(x, D_KV, HEADS, True, window_size=4)
    ]

  with pytest.raises(ValueError, match="'length' \\(size 1\\) does not divide"):
    mtu.run_program(build, "all:4", "length:all")


def test_split_blocks_dimension_communicates():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  nb, w, c = (
    mtf.Dimension("nb", 4),
    mtf.Dimension("w", 3),
    mtf.Dimension("c", 2),
  )
  k = mtf.import_tf_tensor(mesh, _rand(4, 3, 2), mtf.Shape([nb, w, c]))
  mtf.layers.local_1d_halo_exchange(k, k, nb, w, False)
  counters = {}
  for layout, expect_shift in (("nb:all", True), ("", False)):
    lowering = mtf.Lowering(graph, {mesh: mtu.mesh_impl_for("all:4", layout)})
    counters = dict(lowering.counters)
    has_shift = any(key.startswith("shift") for key in counters)
    assert has_shift == expect_shift, (layout, counters)
