"""Tests for mesh_tensorflow._src.ops.pool (non-overlapping max/avg pooling).

Values and gradients (mtf.gradients of sum(y * r)) are compared with
tf.nn.max_pool2d / avg_pool2d / max_pool3d / avg_pool3d under tf.GradientTape,
on the 1-device, "all:4" and 2x2 meshes with batch and channel dims split.
Spatial sizes that the window does not divide (VALID drops the tail) are
included. Spatial dims may not be split.
"""

import inspect

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mesh_test_util as mtu
from tests import meshes

B = mtf.Dimension("b", 4)
E = mtf.Dimension("e", 2)
D = mtf.Dimension("d", 4)
H = mtf.Dimension("h", 6)
W = mtf.Dimension("w", 5)
C = mtf.Dimension("c", 4)

_RNG = np.random.RandomState(1)

TF_POOLS = {
  "MAX_2D": tf.nn.max_pool2d,
  "AVG_2D": tf.nn.avg_pool2d,
  "MAX_3D": tf.nn.max_pool3d,
  "AVG_3D": tf.nn.avg_pool3d,
}


class Case:
  """One pooling: input dims, ksize, pool string and the tf.nn reference."""

  def __init__(self, dims, ksize, pool_fn_string):
    self.shape = mtf.Shape(dims)
    self.ksize, self.pool_fn_string = list(ksize), pool_fn_string
    n = len(ksize)
    # Distinct values: max pooling has no ties.
    size = self.shape.size
    self.x = (
      _RNG.permutation(size)
      .reshape(self.shape.to_integer_list)
      .astype(np.float32)
      / size
    )
    nb = len(dims) - n - 1
    lead = self.shape.to_integer_list[:nb]
    xt = tf.constant(self.x)
    with tf.GradientTape() as tape:
      tape.watch(xt)
      flat = tf.reshape(xt, [-1] + self.shape.to_integer_list[nb:])
      y = TF_POOLS[pool_fn_string](flat, ksize, ksize, "VALID")
      y = tf.reshape(y, lead + y.shape.as_list()[1:])
      self.r = _RNG.uniform(-1, 1, size=y.shape).astype(np.float32)
      loss = tf.reduce_sum(y * self.r)
    self.expected = [y.numpy(), tape.gradient(loss, xt).numpy()]
    self.y_shape = mtf.Shape(
      dims[:nb]
      + [
        mtf.Dimension(d.name, d.size // k)
        for d, k in zip(dims[nb : nb + n], ksize)
      ]
      + dims[-1:]
    )

  def build(self, mesh):
    x = mtf.import_tf_tensor(mesh, self.x, self.shape)
    r = mtf.import_tf_tensor(mesh, self.r, self.y_shape)
    y = mtf.PoolOperation(
      x, self.ksize, self.ksize, self.pool_fn_string
    ).outputs[0]
    assert y.shape == self.y_shape
    return [y] + mtf.gradients([mtf.reduce_sum(y * r)], [x])


CASES = {
  "max2d": Case([B, H, W, C], [2, 2], "MAX_2D"),  # w=5: tail dropped.
  "avg2d": Case([B, H, W, C], [3, 2], "AVG_2D"),
  "max2d_two_batch_dims": Case([E, B, H, W, C], [3, 1], "MAX_2D"),
  "max3d": Case([B, D, H, W, C], [2, 3, 2], "MAX_3D"),
  "avg3d": Case([B, D, H, W, C], [2, 2, 5], "AVG_3D"),
}


@meshes.parametrize(meshes.POOL_OPS)
def test_pool_values_and_gradients(mesh_shape, layout):
  names = sorted(CASES)

  def build(mesh):
    outs = []
    for name in names:
      outs += CASES[name].build(mesh)
    return outs

  out = mtu.run_program(build, mesh_shape, layout)
  for i, name in enumerate(names):
    mtu.assert_all_close(
      out[2 * i : 2 * i + 2],
      CASES[name].expected,
      rtol=1e-5,
      atol=1e-6,
      msg=name,
    )


@pytest.mark.parametrize("mode", mtu.MODES)
def test_pool_all_modes(mode):
  case = CASES["max3d"]
  out = mtu.run_program(case.build, "rows:2;cols:2", "b:rows;c:cols", mode)
  mtu.assert_all_close(out, case.expected, rtol=1e-5, atol=1e-6)


def test_max_pool_backprop_ties_share_gradient():
  x = np.ones([1, 2, 2, 1], np.float32)
  dy = np.full([1, 1, 1, 1], 3.0, np.float32)
  shape = mtf.Shape(
    [
      mtf.Dimension("b", 1),
      mtf.Dimension("h", 2),
      mtf.Dimension("w", 2),
      mtf.Dimension("c", 1),
    ]
  )

  def build(mesh):
    xx = mtf.import_tf_tensor(mesh, x, shape)
    y = mtf.PoolOperation(xx, [2, 2], [2, 2], "MAX_2D").outputs[0]
    g = mtf.import_tf_tensor(mesh, dy, y.shape)
    return [mtf.pool_backprop(xx, y, g, [2, 2], [2, 2], "MAX_2D")]

  np.testing.assert_array_equal(mtu.run_program(build)[0], 3 * x)


@pytest.mark.parametrize("layout,culprit", [("h:all", "h"), ("w:all", "w")])
def test_split_spatial_dim_raises(layout, culprit):
  shape = mtf.Shape([B, mtf.Dimension("h", 8), mtf.Dimension("w", 8), C])

  def build(mesh):
    x = mtf.zeros(mesh, shape)
    return [mtf.PoolOperation(x, [2, 2], [2, 2], "AVG_2D").outputs[0]]

  with pytest.raises(ValueError, match="dimension '%s'" % culprit):
    mtu.run_program(build, "all:4", layout)


def test_bad_arguments_raise_value_errors():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, [B, H, W, C])
  with pytest.raises(ValueError, match="strides \\[1, 2\\] must equal ksize"):
    mtf.PoolOperation(x, [2, 2], [1, 2], "MAX_2D")
  with pytest.raises(ValueError, match="unknown pool_fn_string 'MIN_2D'"):
    mtf.PoolOperation(x, [2, 2], [2, 2], "MIN_2D")
  with pytest.raises(ValueError, match="ksize must be 3 positive ints"):
    mtf.PoolOperation(x, [2, 2], [2, 2], "MAX_3D")
  with pytest.raises(ValueError, match="larger than dimension 'w'"):
    mtf.PoolOperation(x, [2, 6], [2, 6], "AVG_2D")
  y = mtf.PoolOperation(x, (2, 2), (2, 2), "MAX_2D").outputs[0]
  with pytest.raises(ValueError, match="must equal ksize"):
    mtf.pool_backprop(x, y, y, [2, 2], [3, 3], "MAX_2D")
  with pytest.raises(ValueError, match="unknown pool_fn_string"):
    mtf.pool_fn("MAX")


def test_pool_fn_and_operation_properties():
  assert mtf.pool_fn("MAX_2D") is tf.nn.max_pool2d
  assert mtf.pool_fn("AVG_2D") is tf.nn.avg_pool2d
  assert mtf.pool_fn("MAX_3D") is tf.nn.max_pool3d
  assert mtf.pool_fn("AVG_3D") is tf.nn.avg_pool3d
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, [B, H, W, C])
  op = mtf.PoolOperation(x, [2, 2], [2, 2], "MAX_2D")
  assert op.name == "pool"
  assert op.unsplittable_dims == {"h", "w"}
  assert op.splittable_dims == {"b", "c"}
  assert op.outputs[0].shape == mtf.Shape(
    [B, mtf.Dimension("h", 3), mtf.Dimension("w", 2), C]
  )
  back = mtf.pool_backprop(
    x, op.outputs[0], op.outputs[0], [2, 2], [2, 2], "MAX_2D"
  )
  assert isinstance(back.operation, mtf.PoolBackPropOperation)
  assert back.shape == x.shape


def test_signatures():
  def params(fn):
    return [
      (p.name, p.default) for p in inspect.signature(fn).parameters.values()
    ]

  empty = inspect.Parameter.empty
  assert params(mtf.PoolOperation.__init__) == [
    ("self", empty),
    ("x", empty),
    ("ksize", empty),
    ("strides", empty),
    ("pool_fn_string", empty),
    ("name", None),
  ]
  assert params(mtf.PoolBackPropOperation.__init__) == [
    ("self", empty),
    ("x", empty),
    ("y", empty),
    ("dy", empty),
    ("ksize", empty),
    ("strides", empty),
    ("pool_fn_string", empty),
    ("name", None),
  ]
  assert params(mtf.pool_backprop) == [
    ("x", empty),
    ("y", empty),
    ("dy", empty),
    ("ksize", empty),
    ("strides", empty),
    ("pool_fn_string", empty),
    ("name", None),
  ]
  assert params(mtf.pool_fn) == [("pool_fn_string", empty)]
