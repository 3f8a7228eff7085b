"""Tests for mesh_tensorflow._src.ops.io: constants, import and export."""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mesh_test_util as mtu
from tests import meshes

A = mtf.Dimension("a", 4)
B = mtf.Dimension("b", 8)


_RNG = np.random.RandomState(4)
X = _RNG.randn(4, 8).astype(np.float32)
XI = _RNG.randint(-100, 100, size=(4, 8)).astype(np.int32)


def _program(mesh):
  x = mtf.import_tf_tensor(mesh, X, [A, B])
  outs = [
    x,
    mtf.import_tf_tensor(mesh, tf.constant(XI), mtf.Shape([A, B])),
    mtf.import_tf_tensor(mesh, np.float32(3.5)),  # scalar
    mtf.import_tf_tensor(mesh, X[0], "b:8"),
    mtf.constant(mesh, 2.5, [A, B]),
    mtf.constant(mesh, 7, shape=[B, A], dtype=tf.int32),
    mtf.constant(mesh, X, shape=[A, B]),
    mtf.constant(mesh, XI.T, shape=[B, A], dtype=tf.int32),
    mtf.constant(mesh, 1.25),  # scalar
    mtf.constant(mesh, [1.0, 2.0, 3.0, 4.0], shape=[A]),
    mtf.constant(mesh, True, shape=[A], dtype=tf.bool),
    mtf.zeros(mesh, [A, B]),
    mtf.ones(mesh, [B], dtype=tf.int32),
    mtf.zeros_like(x),
    mtf.ones_like(mtf.to_int32(x)),
    mtf.import_fully_replicated(mesh, X, [A, B]),
    mtf.import_fully_replicated(mesh, tf.constant(X.T), [B, A]),
    mtf.anonymize(x),
    mtf.anonymize(mtf.constant(mesh, 3, shape=[A], dtype=tf.int32)),
  ]
  return outs


def _expected():
  return [
    X,
    XI,
    np.float32(3.5),
    X[0],
    np.full([4, 8], 2.5, np.float32),
    np.full([8, 4], 7, np.int32),
    X,
    XI.T,
    np.float32(1.25),
    np.array([1.0, 2.0, 3.0, 4.0], np.float32),
    np.ones([4], bool),
    np.zeros([4, 8], np.float32),
    np.ones([8], np.int32),
    np.zeros([4, 8], np.float32),
    np.ones([4, 8], np.int32),
    X,
    X.T,
    X,
    np.full([4], 3, np.int32),
  ]


def _check(got):
  want = _expected()
  assert len(got) == len(want)
  for i, (g, w) in enumerate(zip(got, want)):
    assert g.shape == np.shape(w), i
    assert g.dtype == np.asarray(w).dtype, (i, g.dtype)
    np.testing.assert_array_equal(g, w, err_msg="output %d" % i)


@meshes.parametrize(meshes.IO_OPS, "mesh_layout")
def test_constants_imports_exports(mesh_layout):
  _check(mtu.run_program(_program, *mesh_layout))


@pytest.mark.parametrize("mode", mtu.MODES)
def test_three_modes(mode):
  _check(mtu.run_program(_program, "rows:2;cols:2", "a:cols;b:rows", mode))


def test_shapes_dtypes_and_names():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.import_tf_tensor(mesh, X, [A, B], name="my_import")
  assert x.operation.name == "my_import"
  assert isinstance(x.operation, mtf.ImportOperation)
  assert x.dtype == tf.float32 and x.shape == mtf.Shape([A, B])
  assert mtf.import_tf_tensor(mesh, 1.0).shape == mtf.Shape([])
  c = mtf.constant(mesh, 0)
  assert isinstance(c.operation, mtf.Constant)
  assert c.shape == mtf.Shape([]) and c.dtype == tf.float32
  assert mtf.zeros(mesh, [A]).dtype == tf.float32
  assert mtf.ones_like(mtf.to_int32(x)).dtype == tf.int32
  assert mtf.zeros_like(x).shape == x.shape
  anon = mtf.anonymize(x)
  assert anon.shape.dimension_names == ["_anonymous_0", "_anonymous_1"]
  assert anon.shape.to_integer_list == [4, 8]
  replicated = mtf.import_fully_replicated(mesh, X, [A, B])
  assert replicated.shape == mtf.Shape([A, B])
  assert isinstance(replicated.operation, mtf.ReshapeOperation)
  # Constants and imports may be split anywhere.
  assert x.operation.splittable_dims == frozenset(["a", "b"])
  assert c.operation.splittable_dims == frozenset()
  assert mtf.ones(mesh, [A, B]).operation.splittable_dims == frozenset(
    ["a", "b"]
  )


def test_import_shape_mismatch_raises():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  with pytest.raises(ValueError, match=r"Shape\[a=4, b=6\]"):
    mtf.import_tf_tensor(mesh, X, [A, mtf.Dimension("b", 6)])
  with pytest.raises(ValueError):
    mtf.import_tf_tensor(mesh, X)  # shape None means a scalar
  with pytest.raises(ValueError):
    mtf.import_fully_replicated(mesh, X, [B, A])
  with pytest.raises(ValueError, match="does not match"):
    mtf.constant(mesh, X, shape=[B, A])


def test_constant_dtype_conversion():
  def build(mesh):
    return [
      mtf.constant(mesh, 2, shape=[A], dtype=tf.int32),
      mtf.constant(mesh, 1, shape=[A], dtype=tf.bfloat16),
      mtf.constant(mesh, X, shape=[A, B], dtype=tf.float64),
    ]

  got = mtu.run_program(build, "all:4", "a:all")
  np.testing.assert_array_equal(got[0], np.full([4], 2, np.int32))
  assert got[1].dtype.name == "bfloat16"
  np.testing.assert_array_equal(np.asarray(got[1], np.float32), np.ones([4]))
  assert got[2].dtype == np.float64
  np.testing.assert_array_equal(got[2], X.astype(np.float64))


@meshes.parametrize(meshes.IO_OPS, "mesh_layout")
def test_import_laid_out_tensor(mesh_layout):
  mesh_impl = mtu.mesh_impl_for(*mesh_layout)
  shape = mtf.Shape([A, B])
  slices = mesh_impl.make_slices(tf.constant(X), shape)
  laid_out = mesh_impl.LaidOutTensor.from_tensor_list(slices)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.import_laid_out_tensor(mesh, laid_out, shape)
  assert isinstance(x.operation, mtf.ImportLaidOutTensorOperation)
  assert x.operation.splittable_dims == frozenset()
  assert x.operation.unsplittable_dims == frozenset(["a", "b"])
  assert x.dtype == tf.float32
  y = x * 2.0
  lowering = mtf.Lowering(graph, {mesh: mesh_impl})
  assert lowering.tensors[x] is laid_out
  np.testing.assert_array_equal(lowering.export_to_tf_tensor(x).numpy(), X)
  np.testing.assert_array_equal(lowering.export_to_tf_tensor(y).numpy(), 2 * X)


def test_import_laid_out_tensor_wrong_slice_shape_raises():
  mesh_impl = mtu.mesh_impl_for("all:4", "a:all")
  full = mesh_impl.make_slices(tf.constant(X), mtf.Shape([A, B]))
  laid_out = mesh_impl.LaidOutTensor([tf.constant(X)] * 4)  # not sliced
  del full
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  mtf.import_laid_out_tensor(mesh, laid_out, [A, B])
  with pytest.raises(ValueError, match="slice shape"):
    mtf.Lowering(graph, {mesh: mesh_impl})


@meshes.parametrize(meshes.IO_OPS, "mesh_layout")
def test_export_of_every_layout(mesh_layout):
  # Export concatenates split dims and drops replicas, whatever the layout.
  value = np.arange(4 * 8 * 2, dtype=np.float32).reshape(4, 8, 2)
  c = mtf.Dimension("c", 2)

  def build(mesh):
    x = mtf.import_tf_tensor(mesh, value, [A, B, c])
    return [x, mtf.transpose(x, [c, B, A]), mtf.reduce_sum(x)]

  x, xt, total = mtu.run_program(build, *mesh_layout)
  np.testing.assert_array_equal(x, value)
  np.testing.assert_array_equal(xt, value.transpose(2, 1, 0))
  np.testing.assert_allclose(total, value.sum())


def test_gradient_with_respect_to_constants():
  def build(mesh):
    x = mtf.constant(mesh, X, shape=[A, B])
    y = mtf.import_fully_replicated(mesh, X, [A, B])
    loss = mtf.reduce_sum(x * y * 3.0)
    return mtf.gradients([loss], [x, y])

  dx, dy = mtu.run_program(build, "rows:2;cols:2", "a:rows;b:cols")
  np.testing.assert_allclose(dx, 3 * X, rtol=1e-6)
  np.testing.assert_allclose(dy, 3 * X, rtol=1e-6)
