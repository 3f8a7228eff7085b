"""Tests for mesh_tensorflow._src.layers.conv (mtf.layers conv and pooling).

Each layer's output and its gradients w.r.t. the input and the kernel are
compared with tf.nn.* (tf.GradientTape) evaluated on the input and on the
kernel value the program exported. The *_with_blocks layers run on images
stored as blocks whose block dims are split across the mesh (so the halo
exchange communicates) and must equal the plain layer on the unblocked image.
"""

import inspect

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mesh_test_util as mtu
from tests import meshes

B = mtf.Dimension("b", 2)
C = mtf.Dimension("c", 4)
O = mtf.Dimension("o", 4)

_RNG = np.random.RandomState(3)


def _rand(*shape):
  return _RNG.uniform(-1.0, 1.0, size=shape).astype(np.float32)


def _dims(**sizes):
  return [mtf.Dimension(k, v) for k, v in sizes.items()]


def _last_kernel(mesh):
  return mesh.graph.trainable_variables[-1].outputs[0]


def _tf_reference(fn, x, k, r):
  """fn(x, k) and the gradients of sum(fn(x, k) * r) w.r.t. x and k."""
  xt, kt = tf.constant(x), tf.constant(k)
  with tf.GradientTape() as tape:
    tape.watch([xt, kt])
    y = fn(xt, kt)
    loss = tf.reduce_sum(y * r)
  gx, gk = tape.gradient(loss, [xt, kt])
  return [y.numpy(), gx.numpy(), gk.numpy()]


def _conv_tf(n, strides, padding):
  conv = tf.nn.conv2d if n == 2 else tf.nn.conv3d
  return lambda x, k: conv(x, k, [1] + list(strides) + [1], padding)


def _conv_transpose_tf(n, strides, padding):
  def fn(x, k):
    shape = x.shape.as_list()
    out = (
      [shape[0]] + [s * t for s, t in zip(shape[1:-1], strides)] + [k.shape[-2]]
    )
    op = tf.nn.conv2d_transpose if n == 2 else tf.nn.conv3d_transpose
    return op(x, k, out, [1] + list(strides) + [1], padding)

  return fn


class LayerCase:
  """A layer applied to x (shape dims); reference fn(x, kernel) in TF."""

  def __init__(self, dims, layer_fn, tf_fn, has_kernel=True):
    self.shape = mtf.Shape(dims)
    self.x = _rand(*self.shape.to_integer_list)
    self.layer_fn, self.tf_fn, self.has_kernel = layer_fn, tf_fn, has_kernel
    self.r = None

  def build(self, mesh):
    x = mtf.import_tf_tensor(mesh, self.x, self.shape)
    y = self.layer_fn(x)
    if self.r is None:
      self.r = _rand(*y.shape.to_integer_list)
    loss = mtf.reduce_sum(y * mtf.import_tf_tensor(mesh, self.r, y.shape))
    if not self.has_kernel:
      return [y] + mtf.gradients([loss], [x])
    kernel = _last_kernel(mesh)
    return [y, kernel] + mtf.gradients([loss], [x, kernel])

  def check(self, out, msg):
    if not self.has_kernel:
      xt = tf.constant(self.x)
      with tf.GradientTape() as tape:
        tape.watch(xt)
        y = self.tf_fn(xt)
        loss = tf.reduce_sum(y * self.r)
      expected = [y.numpy(), tape.gradient(loss, xt).numpy()]
      mtu.assert_all_close(out, expected, rtol=1e-4, atol=1e-4, msg=msg)
      return
    y, kernel, gx, gk = out
    expected = _tf_reference(self.tf_fn, self.x, kernel, self.r)
    mtu.assert_all_close([y, gx, gk], expected, rtol=1e-4, atol=1e-4, msg=msg)


def _pool_tf(fn, ksize):
  return lambda x: fn(x, ksize, ksize, "VALID")


def _conv1d_tf(x, k):
  y = tf.nn.conv2d(x[:, None], k, [1, 1, 2, 1], "SAME")
  return y[:, 0]


LAYER_CASES = {
  "conv2d": LayerCase(
    [B] + _dims(h=6, w=4) + [C],
    lambda x: mtf.layers.conv2d(x, O),
    _conv_tf(2, (1, 1), "SAME"),
  ),
  "conv2d_valid_strided": LayerCase(
    [B] + _dims(h=6, w=4) + [C],
    lambda x: mtf.layers.conv2d(
      x, O, filter_size=(3, 2), strides=(2, 1), padding="VALID"
    ),
    _conv_tf(2, (2, 1), "VALID"),
  ),
  "conv3d": LayerCase(
    [B] + _dims(d=4, h=3, w=4) + [C],
    lambda x: mtf.layers.conv3d(x, O),
    _conv_tf(3, (1, 1, 1), "SAME"),
  ),
  "conv2d_transpose": LayerCase(
    [B] + _dims(h=3, w=4) + [C],
    lambda x: mtf.layers.conv2d_transpose(x, O),
    _conv_transpose_tf(2, (2, 2), "SAME"),
  ),
  "conv2d_transpose_3x3": LayerCase(
    [B] + _dims(h=3, w=4) + [C],
    lambda x: mtf.layers.conv2d_transpose(x, O, filter_size=(3, 3)),
    _conv_transpose_tf(2, (2, 2), "SAME"),
  ),
  "conv3d_transpose": LayerCase(
    [B] + _dims(d=2, h=3, w=2) + [C],
    lambda x: mtf.layers.conv3d_transpose(x, O, padding="VALID"),
    _conv_transpose_tf(3, (2, 2, 2), "VALID"),
  ),
  "conv1d": LayerCase(
    [B] + _dims(length=8) + [C],
    lambda x: mtf.layers.conv1d(x, O, filter_size=3, stride=2),
    _conv1d_tf,
  ),
  "max_pool2d": LayerCase(
    [B] + _dims(h=6, w=4) + [C],
    lambda x: mtf.layers.max_pool2d(x),
    _pool_tf(tf.nn.max_pool2d, (2, 2)),
    has_kernel=False,
  ),
  "avg_pool2d": LayerCase(
    [B] + _dims(h=6, w=4) + [C],
    lambda x: mtf.layers.avg_pool2d(x, ksize=(3, 1)),
    _pool_tf(tf.nn.avg_pool2d, (3, 1)),
    has_kernel=False,
  ),
  "max_pool3d": LayerCase(
    [B] + _dims(d=4, h=2, w=4) + [C],
    lambda x: mtf.layers.max_pool3d(x),
    _pool_tf(tf.nn.max_pool3d, (2, 2, 2)),
    has_kernel=False,
  ),
  "avg_pool3d": LayerCase(
    [B] + _dims(d=4, h=2, w=4) + [C],
    lambda x: mtf.layers.avg_pool3d(x, ksize=(1, 2, 4)),
    _pool_tf(tf.nn.avg_pool3d, (1, 2, 4)),
    has_kernel=False,
  ),
}


def _run_cases(cases, mesh_shape, layout, mode="eager"):
  names = sorted(cases)
  counts = []

  def build(mesh):
    outs = []
    counts.clear()
    for name in names:
      with tf.compat.v1.variable_scope(name):
        o = cases[name].build(mesh)
      counts.append(len(o))
      outs += o
    return outs

  out = mtu.run_program(build, mesh_shape, layout, mode)
  start = 0
  for name, count in zip(names, counts):
    cases[name].check(
      out[start : start + count], "%s on %s|%s" % (name, mesh_shape, layout)
    )
    start += count


@meshes.parametrize(meshes.CONV_LAYERS)
def test_conv_and_pool_layers(mesh_shape, layout):
  _run_cases(LAYER_CASES, mesh_shape, layout)


# ----------------------------------------------------------- with blocks
# 2-D image h=8 (4 blocks of 2), w=6 (2 blocks of 3); 3-D d=4 (2 blocks of
# 2), h=4 (4 blocks of 1), w=3.
HB, WB, DB = (
  mtf.Dimension("hb", 4),
  mtf.Dimension("wb", 2),
  mtf.Dimension("db", 2),
)
HB3 = HB  # 3-D: h=4 is 4 blocks of 1.


def _block2d(x, nw=2):
  b, hh, ww, c = x.shape
  x = x.reshape(b, 4, hh // 4, nw, ww // nw, c)
  return x.transpose(0, 1, 3, 2, 4, 5)


def _unblock2d(x):
  b, nh, nw, bh, bw, c = x.shape
  return x.transpose(0, 1, 3, 2, 4, 5).reshape(b, nh * bh, nw * bw, c)


def _block3d(x):
  b, dd, hh, ww, c = x.shape
  x = x.reshape(b, 2, dd // 2, 4, hh // 4, ww, c)
  return x.transpose(0, 1, 3, 2, 4, 5, 6)


def _unblock3d(x):
  b, nd, nh, bd, bh, ww, c = x.shape
  return x.transpose(0, 1, 3, 2, 4, 5, 6).reshape(b, nd * bd, nh * bh, ww, c)


class BlocksCase:
  """A *_with_blocks layer vs the plain TF op on the unblocked image."""

  def __init__(self, n, layer_fn, tf_fn, w_blocks=WB):
    self.n, self.layer_fn, self.tf_fn = n, layer_fn, tf_fn
    if n == 2:
      self.full = _rand(2, 8, 6, 4)
      self.shape = mtf.Shape(
        [B, HB, w_blocks] + _dims(h=2, w=6 // w_blocks.size) + [C]
      )
      self.block = lambda x: _block2d(x, w_blocks.size)
      self.unblock = _unblock2d
    else:
      self.full = _rand(2, 4, 4, 3, 4)
      self.shape = mtf.Shape([B, DB, HB3] + _dims(d=2, h=1, w=3) + [C])
      self.block, self.unblock = _block3d, _unblock3d
    self.r = None

  def build(self, mesh):
    x = mtf.import_tf_tensor(mesh, self.block(self.full), self.shape)
    y = self.layer_fn(x)
    if self.r is None:
      self.r = _rand(*y.shape.to_integer_list)
    loss = mtf.reduce_sum(y * mtf.import_tf_tensor(mesh, self.r, y.shape))
    kernel = _last_kernel(mesh)
    return [y, kernel] + mtf.gradients([loss], [x, kernel])

  def check(self, out, msg):
    y, kernel, gx, gk = out
    expected = _tf_reference(
      self.tf_fn, self.full, kernel, self.unblock(self.r)
    )
    mtu.assert_all_close(
      [self.unblock(y), self.unblock(gx), gk],
      expected,
      rtol=1e-4,
      atol=1e-4,
      msg=msg,
    )


BLOCK_CASES = {
  "conv2d_3x3": BlocksCase(
    2,
    lambda x: mtf.layers.conv2d_with_blocks(
      x, O, h_blocks_dim=HB, w_blocks_dim=WB
    ),
    _conv_tf(2, (1, 1), "SAME"),
  ),
  # Halo 2 on h (a whole block of 2), 3 on h (more than a block).
  "conv2d_5x3": BlocksCase(
    2,
    lambda x: mtf.layers.conv2d_with_blocks(
      x, O, filter_size=(5, 3), h_blocks_dim=HB, w_blocks_dim=WB
    ),
    _conv_tf(2, (1, 1), "SAME"),
  ),
  "conv2d_7x5_h_blocks_only": BlocksCase(
    2,
    lambda x: mtf.layers.conv2d_with_blocks(
      x, O, filter_size=(7, 5), h_blocks_dim=HB
    ),
    _conv_tf(2, (1, 1), "SAME"),
    w_blocks=mtf.Dimension("wb1", 1),
  ),
  "conv2d_strided": BlocksCase(
    2,
    lambda x: mtf.layers.conv2d_with_blocks(
      x, O, filter_size=(3, 5), strides=(2, 3), h_blocks_dim=HB, w_blocks_dim=WB
    ),
    _conv_tf(2, (2, 3), "SAME"),
  ),
  "conv3d": BlocksCase(
    3,
    lambda x: mtf.layers.conv3d_with_blocks(
      x, O, filter_size=(3, 5, 3), d_blocks_dim=DB, h_blocks_dim=HB3
    ),
    _conv_tf(3, (1, 1, 1), "SAME"),
  ),
  "conv2d_transpose_2x2": BlocksCase(
    2,
    lambda x: mtf.layers.conv2d_transpose_with_blocks(
      x, O, h_blocks_dim=HB, w_blocks_dim=WB
    ),
    _conv_transpose_tf(2, (2, 2), "SAME"),
  ),
  "conv2d_transpose_4x3": BlocksCase(
    2,
    lambda x: mtf.layers.conv2d_transpose_with_blocks(
      x, O, filter_size=(4, 3), h_blocks_dim=HB, w_blocks_dim=WB
    ),
    _conv_transpose_tf(2, (2, 2), "SAME"),
  ),
  "conv3d_transpose_4": BlocksCase(
    3,
    lambda x: mtf.layers.conv3d_transpose_with_blocks(
      x, O, filter_size=(4, 4, 2), d_blocks_dim=DB, h_blocks_dim=HB3
    ),
    _conv_transpose_tf(3, (2, 2, 2), "SAME"),
  ),
}


@meshes.parametrize(meshes.BLOCKED_CONV_LAYERS)
def test_conv_with_blocks_matches_unblocked_conv(mesh_shape, layout):
  _run_cases(BLOCK_CASES, mesh_shape, layout)


@pytest.mark.parametrize("mode", mtu.MODES)
def test_conv2d_with_blocks_all_modes(mode):
  cases = {k: BLOCK_CASES[k] for k in ("conv2d_5x3",)}
  _run_cases(cases, "rows:2;cols:2", "hb:rows;wb:cols", mode)


def test_halo_exchange_communicates_in_conv2d_with_blocks():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  with mtf.variable_store(mtf.VariableStore()):
    x = mtf.zeros(mesh, BLOCK_CASES["conv2d_3x3"].shape)
    mtf.layers.conv2d_with_blocks(x, O, h_blocks_dim=HB, w_blocks_dim=WB)
    lowering = mtf.Lowering(
      graph, {mesh: mtu.mesh_impl_for("rows:2;cols:2", "hb:rows;wb:cols")}
    )
  assert any(k.startswith("shift[") for k, _ in lowering.counters)


# -------------------------------------------------------------- separable
def test_separable_conv1d():
  length, depth = mtf.Dimension("length", 6), C
  x_np = _rand(2, 6, 4)
  weights = [_rand(4) for _ in range(3)]

  def build(mesh):
    x = mtf.import_tf_tensor(mesh, x_np, mtf.Shape([B, length, depth]))
    y1 = mtf.layers.separable_conv1d(
      x, O, min_relative_pos=-2, max_relative_pos=1, name="sep"
    )
    kdw = [mtf.import_tf_tensor(mesh, w, mtf.Shape([depth])) for w in weights]
    y2 = mtf.layers.separable_conv1d(
      x, O, kernel_depth_weights=kdw, use_bias=False
    )
    num_variables = len(mesh.graph.name_to_variable)
    # Called again under the same name: reuses every variable.
    y1_again = mtf.layers.separable_conv1d(
      x, O, min_relative_pos=-2, max_relative_pos=1, name="sep"
    )
    assert len(mesh.graph.name_to_variable) == num_variables
    del y1_again
    names = sorted(mesh.graph.name_to_variable)
    return [y1, y2] + [mesh.graph.name_to_variable[n].outputs[0] for n in names]

  graph_names = []

  def build_and_record(mesh):
    out = build(mesh)
    graph_names[:] = sorted(mesh.graph.name_to_variable)
    return out

  out = mtu.run_program(build_and_record, "rows:2;cols:2", "b:rows;o:cols")
  v = dict(zip(graph_names, out[2:]))
  assert graph_names == [
    "sep/depthwise_conv_hack/depthwise_dense_0/bias",
    "sep/depthwise_conv_hack/depthwise_dense_0/kernel",
    "sep/depthwise_conv_hack/depthwise_dense_1/kernel",
    "sep/depthwise_conv_hack/depthwise_dense_2/kernel",
    "sep/depthwise_conv_hack/depthwise_dense_3/kernel",
    "sep/pointwise_dense/bias",
    "sep/pointwise_dense/kernel",
    "separable_conv1d/pointwise_dense/kernel",
  ]

  def np_shift(x, offset):  # y[i] = x[i - offset], zeros outside.
    y = np.zeros_like(x)
    for i in range(x.shape[1]):
      if 0 <= i - offset < x.shape[1]:
        y[:, i] = x[:, i - offset]
    return y

  pre = "sep/depthwise_conv_hack/depthwise_dense_%d/"
  depthwise = sum(
    np_shift(x_np, -rel) * v[pre % i + "kernel"]
    for i, rel in enumerate(range(-2, 2))
  )
  depthwise = depthwise + v[pre % 0 + "bias"]
  expected1 = (
    depthwise @ v["sep/pointwise_dense/kernel"] + v["sep/pointwise_dense/bias"]
  )
  np.testing.assert_allclose(out[0], expected1, rtol=1e-4, atol=1e-4)
  depthwise2 = sum(
    np_shift(x_np, -rel) * weights[i] for i, rel in enumerate(range(-1, 2))
  )
  np.testing.assert_allclose(
    out[1],
    depthwise2 @ v["separable_conv1d/pointwise_dense/kernel"],
    rtol=1e-4,
    atol=1e-4,
  )


# ----------------------------------------------------- names and errors
def test_variable_names_and_shapes():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  with mtf.variable_store(mtf.VariableStore()):
    x2 = mtf.zeros(mesh, [B] + _dims(h=4, w=4) + [C])
    x3 = mtf.zeros(mesh, [B] + _dims(d=4, h=4, w=4) + [C])
    mtf.layers.conv2d(x2, O)
    mtf.layers.conv2d(x2, O, filter_size=(1, 3))
    mtf.layers.conv2d(x2, O, name="mine")
    mtf.layers.conv3d(x3, O)
    mtf.layers.conv2d_transpose(x2, O)
    mtf.layers.conv3d_transpose(x3, O)
    with tf.compat.v1.variable_scope("outer"):
      mtf.layers.conv1d(
        mtf.zeros(mesh, [B, mtf.Dimension("length", 4), C]), O, filter_size=5
      )
  shapes = {
    name: v.shape.dimension_names + [str(v.shape.to_integer_list)]
    for name, v in graph.name_to_variable.items()
  }
  assert shapes == {
    "conv2d/kernel": ["fh", "fw", "c", "o", "[3, 3, 4, 4]"],
    "conv2d_1/kernel": ["fh", "fw", "c", "o", "[1, 3, 4, 4]"],
    "mine/kernel": ["fh", "fw", "c", "o", "[3, 3, 4, 4]"],
    "conv3d/kernel": ["fd", "fh", "fw", "c", "o", "[3, 3, 3, 4, 4]"],
    "conv2d_transpose/kernel": ["fh", "fw", "o", "c", "[2, 2, 4, 4]"],
    "conv3d_transpose/kernel": ["fd", "fh", "fw", "o", "c", "[2, 2, 2, 4, 4]"],
    "outer/conv2d/kernel": ["fh", "fw", "c", "o", "[1, 5, 4, 4]"],
  }


def test_conv1d_output_shape_and_pool_identity():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  with mtf.variable_store(mtf.VariableStore()):
    x = mtf.zeros(mesh, [B, mtf.Dimension("length", 8), C])
    y = mtf.layers.conv1d(x, O, stride=2)
    assert y.shape == mtf.Shape([B, mtf.Dimension("length", 4), O])
    img = mtf.zeros(mesh, [B] + _dims(h=4, w=4) + [C])
    assert mtf.layers.max_pool2d(img, ksize=(1, 1)) is img
    assert (
      mtf.layers.avg_pool3d(
        x3 := mtf.zeros(mesh, [B] + _dims(d=2, h=2, w=2) + [C]), ksize=[1, 1, 1]
      )
      is x3
    )
    pooled = mtf.layers.max_pool2d(img)
    assert pooled.operation.name == "max_pool2d"
    assert pooled.shape == mtf.Shape([B] + _dims(h=2, w=2) + [C])


def test_split_spatial_dim_of_plain_conv_layer_raises():
  def build(mesh):
    x = mtf.zeros(mesh, [B] + _dims(h=4, w=4) + [C])
    return [mtf.layers.conv2d(x, O)]

  with pytest.raises(ValueError, match="dimension 'h'"):
    mtu.run_program(build, "all:4", "h:all")


def test_bad_arguments():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  with mtf.variable_store(mtf.VariableStore()):
    x = mtf.zeros(mesh, BLOCK_CASES["conv2d_3x3"].shape)
    with pytest.raises(
      ValueError, match="filter sizes must be odd, got 2 for filter dim 'fw'"
    ):
      mtf.layers.conv2d_with_blocks(
        x, O, filter_size=(3, 2), h_blocks_dim=HB, w_blocks_dim=WB
      )
    x3 = mtf.zeros(mesh, BLOCK_CASES["conv3d"].shape)
    with pytest.raises(ValueError, match="filter sizes must be odd"):
      mtf.layers.conv3d_with_blocks(
        x3, O, filter_size=(4, 3, 3), d_blocks_dim=DB
      )
    with pytest.raises(NotImplementedError, match="padding=SAME"):
      mtf.layers.conv2d_with_blocks(x, O, padding="VALID", h_blocks_dim=HB)
    with pytest.raises(NotImplementedError, match="padding=SAME"):
      mtf.layers.conv2d_transpose_with_blocks(
        x, O, padding="VALID", h_blocks_dim=HB
      )
    with pytest.raises(ValueError, match="padding must be 'SAME' or 'VALID'"):
      mtf.layers.conv2d_with_blocks(x, O, padding="same", h_blocks_dim=HB)
    with pytest.raises(ValueError, match="multiple of its stride"):
      mtf.layers.conv2d_with_blocks(x, O, strides=(1, 2), w_blocks_dim=WB)
    img = mtf.zeros(mesh, [B] + _dims(h=4, w=4) + [C])
    with pytest.raises(ValueError, match="padding must be 'SAME' or 'VALID'"):
      mtf.layers.conv2d(img, O, padding="FULL")
    with pytest.raises(
      ValueError, match="'fh' \\(size 5\\) is larger than input dimension 'h'"
    ):
      mtf.layers.conv2d(img, O, filter_size=(5, 1), padding="VALID")
    with pytest.raises(ValueError, match="filter_size must be 2"):
      mtf.layers.conv2d(img, O, filter_size=(3, 3, 3))
    with pytest.raises(ValueError, match="ksize must be 2 positive ints"):
      mtf.layers.max_pool2d(img, ksize=(2,))
    with pytest.raises(ValueError, match="larger than dimension 'h'"):
      mtf.layers.avg_pool2d(img, ksize=(8, 1))


def test_signatures():
  def params(fn):
    return [
      (p.name, p.default) for p in inspect.signature(fn).parameters.values()
    ]

  empty = inspect.Parameter.empty
  assert params(mtf.layers.conv1d) == [
    ("x", empty),
    ("output_dim", empty),
    ("filter_size", 3),
    ("stride", 1),
    ("kw_args", empty),
  ]
  assert params(mtf.layers.separable_conv1d) == [
    ("x", empty),
    ("output_dim", empty),
    ("min_relative_pos", -1),
    ("max_relative_pos", 1),
    ("depthwise_filter_initializer_scale", 1.0),
    ("pointwise_filter_initializer_scale", 1.0),
    ("name", None),
    ("use_bias", True),
    ("kernel_depth_weights", None),
  ]
  tail = [
    ("filter_initializer", None),
    ("variable_dtype", None),
    ("name", None),
  ]
  for fn, fs, st in [
    (mtf.layers.conv2d, (3, 3), (1, 1)),
    (mtf.layers.conv3d, (3, 3, 3), (1, 1, 1)),
    (mtf.layers.conv2d_transpose, (2, 2), (2, 2)),
    (mtf.layers.conv3d_transpose, (2, 2, 2), (2, 2, 2)),
  ]:
    assert (
      params(fn)
      == [
        ("x", empty),
        ("output_dim", empty),
        ("filter_size", fs),
        ("strides", st),
        ("padding", "SAME"),
      ]
      + tail
    ), fn.__name__
  for fn, fs, st, blocks in [
    (mtf.layers.conv2d_with_blocks, (3, 3), (1, 1), ("h", "w")),
    (mtf.layers.conv3d_with_blocks, (3, 3, 3), (1, 1, 1), ("d", "h")),
    (mtf.layers.conv2d_transpose_with_blocks, (2, 2), (2, 2), ("h", "w")),
    (mtf.layers.conv3d_transpose_with_blocks, (2, 2, 2), (2, 2, 2), ("d", "h")),
  ]:
    assert (
      params(fn)
      == [
        ("x", empty),
        ("output_dim", empty),
        ("filter_size", fs),
        ("strides", st),
        ("padding", "SAME"),
        ("%s_blocks_dim" % blocks[0], None),
        ("%s_blocks_dim" % blocks[1], None),
      ]
      + tail
    ), fn.__name__
  for fn, ks, name in [
    (mtf.layers.max_pool2d, (2, 2), "max_pool2d"),
    (mtf.layers.max_pool3d, (2, 2, 2), "max_pool3d"),
    (mtf.layers.avg_pool2d, (2, 2), "avg_pool2d"),
    (mtf.layers.avg_pool3d, (2, 2, 2), "avg_pool3d"),
  ]:
    assert params(fn) == [("x", empty), ("ksize", ks), ("name", name)]
