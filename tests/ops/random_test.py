"""Tests for mesh_tensorflow._src.ops.random: random_uniform/normal, dropout.

The central promise: random values are bitwise identical on every mesh and
layout (counter-based generator on global element indices), reproducible with
a seed, and fresh at every run of a compiled program without one.
"""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mesh_test_util as mtu
from tests import meshes

BATCH = mtf.Dimension("batch", 8)
HIDDEN = mtf.Dimension("hidden", 4)
LENGTH = mtf.Dimension("length", 6)
SHAPE = [BATCH, HIDDEN, LENGTH]


BIG_A = mtf.Dimension("a", 400)
BIG_B = mtf.Dimension("b", 250)  # 10**5 samples.


def _seeded_program(mesh):
  return [
    mtf.random_uniform(mesh, SHAPE, seed=1),
    mtf.random_uniform(
      mesh, SHAPE, minval=-2.0, maxval=3.0, seed=1, dtype=tf.float64
    ),
    mtf.random_uniform(mesh, SHAPE, dtype=tf.bfloat16, seed=2),
    mtf.random_uniform(mesh, SHAPE, maxval=5, dtype=tf.int32, seed=3),
    mtf.random_normal(mesh, SHAPE, seed=4),
    mtf.random_normal(
      mesh, SHAPE, mean=1.0, stddev=2.0, dtype=tf.bfloat16, seed=5
    ),
    mtf.RandomOperation(
      mesh, SHAPE, tf.random.truncated_normal, seed=6
    ).outputs[0],
    mtf.random_uniform(mesh, [HIDDEN], seed=7),
    mtf.random_normal(mesh, [], seed=8),
  ]


def _assert_all_equal(actual, expected, msg=""):
  assert len(actual) == len(expected)
  for i, (a, e) in enumerate(zip(actual, expected)):
    assert a.dtype == e.dtype, "%s output %d" % (msg, i)
    assert np.array_equal(a, e), "%s output %d differs" % (msg, i)


_REFERENCE = {}


def _reference_seeded():
  if "seeded" not in _REFERENCE:
    _REFERENCE["seeded"] = mtu.run_program(_seeded_program, "", "")
  return _REFERENCE["seeded"]


@meshes.parametrize(meshes.RANDOM_OPS)
def test_seeded_values_identical_on_every_layout(mesh_shape, layout):
  outs = mtu.run_program(_seeded_program, mesh_shape, layout)
  _assert_all_equal(outs, _reference_seeded(), "%s|%s" % (mesh_shape, layout))


@pytest.mark.parametrize("mode", ["function", "graph"])
def test_seeded_values_identical_across_modes(mode):
  outs = mtu.run_program(
    _seeded_program, "rows:2;cols:2", "batch:rows;length:cols", mode
  )
  _assert_all_equal(outs, _reference_seeded(), mode)


def test_seeded_values_identical_across_runs_and_differ_by_seed():
  def build(mesh):
    return [
      mtf.random_uniform(mesh, SHAPE, seed=11),
      mtf.random_uniform(mesh, SHAPE, seed=12),
    ]

  a1, b1 = mtu.run_program(build, "all:4", "batch:all")
  a2, b2 = mtu.run_program(build, "all:4", "hidden:all")
  assert np.array_equal(a1, a2) and np.array_equal(b1, b2)
  assert not np.any(a1 == b1)


def test_seeded_ops_with_different_names_differ():
  def build(mesh):
    return [
      mtf.random_uniform(mesh, SHAPE, seed=1),
      mtf.random_uniform(mesh, SHAPE, seed=1),
    ]  # name "random_1"

  a, b = mtu.run_program(build)
  assert not np.any(a == b)


@meshes.parametrize(meshes.RANDOM_OPS[2:6])
def test_unseeded_values_identical_on_every_layout_under_set_seed(
  mesh_shape, layout
):
  mtu.skip_under_tf1(
    "eager op seeds under tf.random.set_seed (a new tf.Graph draws "
    "its own op seeds)"
  )

  def build(mesh):
    return [
      mtf.random_uniform(mesh, SHAPE),
      mtf.random_normal(mesh, SHAPE),
      mtf.dropout(mtf.ones(mesh, SHAPE), True, keep_prob=0.5),
    ]

  mtu.skip_under_simd(
    "eager op seeds under tf.random.set_seed; in the SIMD "
    "tf.function the draw's op seed depends on its "
    "position in the traced graph"
  )
  tf.random.set_seed(1234)
  expected = mtu.run_program(build, "", "")
  tf.random.set_seed(1234)
  outs = mtu.run_program(build, mesh_shape, layout)
  _assert_all_equal(outs, expected)
  assert not np.array_equal(outs[0], _reference_seeded()[0])


def _unseeded_function(mesh_shape, layout):
  @tf.function(autograph=False)
  def fn():
    with mtf.variable_store(mtf.VariableStore()):
      graph = mtf.Graph()
      mesh = mtf.Mesh(graph, "mesh")
      outs = [
        mtf.random_uniform(mesh, SHAPE),
        mtf.random_uniform(mesh, SHAPE),
        mtf.dropout(mtf.ones(mesh, SHAPE), True, rate=0.5),
        mtf.random_uniform(mesh, SHAPE, seed=3),
      ]
      lowering = mtf.Lowering(
        graph, {mesh: mtu.mesh_impl_for(mesh_shape, layout)}
      )
      return [lowering.export_to_tf_tensor(t) for t in outs]

  return fn


def test_unseeded_values_change_at_every_call_of_a_function():
  fn = _unseeded_function("rows:2;cols:2", "batch:rows;hidden:cols")
  u1, v1, d1, s1 = [np.asarray(t) for t in fn()]
  u2, v2, d2, s2 = [np.asarray(t) for t in fn()]
  assert fn.experimental_get_tracing_count() == 1
  assert not np.any(u1 == v1)  # two ops in one program differ
  assert np.mean(u1 == u2) < 0.01
  assert not np.array_equal(d1, d2)
  assert np.array_equal(s1, s2)  # seeded ops are stateless


def _stats_program(mesh):
  shape = [BIG_A, BIG_B]
  return [
    mtf.random_uniform(mesh, shape),
    mtf.random_normal(mesh, shape),
    mtf.random_uniform(mesh, shape, minval=-3.0, maxval=5.0),
    mtf.random_normal(mesh, shape, mean=2.0, stddev=3.0),
    mtf.random_uniform(mesh, shape, dtype=tf.bfloat16),
    mtf.random_uniform(mesh, shape, minval=2, maxval=12, dtype=tf.int64),
    mtf.RandomOperation(
      mesh, shape, tf.random.truncated_normal, stddev=2.0
    ).outputs[0],
    mtf.random_normal(mesh, shape, dtype=tf.float64),
  ]


def test_statistics():
  tf.random.set_seed(0)
  u, n, u2, n2, ub, ui, tn, n64 = mtu.run_program(
    _stats_program, "rows:2;cols:2", "a:rows;b:cols"
  )
  assert u.dtype == np.float32 and u.shape == (400, 250)
  assert 0.0 <= u.min() and u.max() < 1.0
  assert abs(u.mean() - 0.5) < 0.005
  assert abs(u.var() - 1.0 / 12) < 0.002
  # Neighbouring elements (same and next row) are uncorrelated.
  assert abs(np.corrcoef(u[:, :-1].ravel(), u[:, 1:].ravel())[0, 1]) < 0.015
  assert abs(np.corrcoef(u[:-1].ravel(), u[1:].ravel())[0, 1]) < 0.015
  assert abs(np.corrcoef(u.ravel(), n.ravel())[0, 1]) < 0.015
  hist, _ = np.histogram(u, bins=10, range=(0.0, 1.0))
  assert np.all(np.abs(hist / u.size - 0.1) < 0.005)

  assert n.dtype == np.float32
  assert abs(n.mean()) < 0.015 and abs(n.std() - 1.0) < 0.015
  assert abs(np.mean(np.abs(n) < 1.0) - 0.6827) < 0.01
  assert np.abs(n).max() > 3.5

  assert -3.0 <= u2.min() and u2.max() < 5.0
  assert abs(u2.mean() - 1.0) < 0.05

  assert abs(n2.mean() - 2.0) < 0.05 and abs(n2.std() - 3.0) < 0.05

  assert ub.dtype == tf.bfloat16.as_numpy_dtype
  ub = ub.astype(np.float32)
  assert 0.0 <= ub.min() and ub.max() < 1.0
  assert abs(ub.mean() - 0.5) < 0.01

  assert ui.dtype == np.int64
  assert set(np.unique(ui)) == set(range(2, 12))
  counts = np.bincount(ui.ravel() - 2) / ui.size
  assert np.all(np.abs(counts - 0.1) < 0.005)

  assert tn.dtype == np.float32
  assert np.abs(tn).max() <= 4.0
  assert abs(tn.mean()) < 0.03
  assert abs(tn.std() - 2.0 * 0.8796) < 0.03

  assert n64.dtype == np.float64
  assert abs(n64.mean()) < 0.015 and abs(n64.std() - 1.0) < 0.015


def test_random_operation_properties_and_errors():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  u = mtf.random_uniform(mesh, SHAPE, dtype=tf.bfloat16, name="noise")
  op = u.operation
  assert isinstance(op, mtf.RandomOperation)
  assert op.name == "noise"
  assert u.dtype == tf.bfloat16 and u.shape == mtf.Shape(SHAPE)
  assert not op.has_gradient
  assert op.splittable_dims == frozenset(["batch", "hidden", "length"])
  with pytest.raises(ValueError, match="tf_fn"):
    mtf.RandomOperation(mesh, SHAPE, tf.random.gamma)
  with pytest.raises(TypeError, match="stddev"):
    mtf.random_uniform(mesh, SHAPE, stddev=2.0)
  with pytest.raises(TypeError, match="seed"):
    mtf.random_uniform(mesh, SHAPE, seed="abc")


def test_random_ops_have_no_gradient_path():
  def build(mesh):
    x = mtf.import_tf_tensor(mesh, np.ones((8, 4, 6), np.float32), SHAPE)
    y = x * mtf.random_normal(mesh, SHAPE, seed=1)
    [dx] = mtf.gradients([y], [x])
    return [dx, y]

  dx, y = mtu.run_program(build, "all:4", "batch:all")
  np.testing.assert_array_equal(dx, y)


# ------------------------------------------------------------------ dropout


@pytest.mark.parametrize("keep_prob", [0.3, 0.9])
def test_dropout_keep_fraction_and_scaling(keep_prob):
  x_np = (
    np.random.RandomState(1).uniform(0.5, 1.5, (400, 250)).astype(np.float32)
  )

  def build(mesh):
    x = mtf.import_tf_tensor(mesh, x_np, [BIG_A, BIG_B])
    y = mtf.dropout(x, True, keep_prob=keep_prob)
    [dx] = mtf.gradients([y], [x])
    return [y, dx]

  tf.random.set_seed(3)
  y, dx = mtu.run_program(build, "all:4", "a:all")
  kept = y != 0
  assert abs(kept.mean() - keep_prob) < 0.01
  np.testing.assert_allclose(y[kept], x_np[kept] / keep_prob, rtol=1e-6)
  # Gradient = the scaled mask.
  np.testing.assert_allclose(dx, kept / np.float32(keep_prob), rtol=1e-6)


def test_dropout_rate_and_identity_cases():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.ones(mesh, SHAPE)
  assert mtf.dropout(x, False, rate=0.5) is x
  assert mtf.dropout(x, True, keep_prob=1.0) is x
  assert mtf.dropout(x, True, rate=0.0) is x
  with pytest.raises(ValueError, match="exactly one"):
    mtf.dropout(x, True, keep_prob=0.5, rate=0.5)
  with pytest.raises(ValueError, match="exactly one"):
    mtf.dropout(x, True)
  with pytest.raises(ValueError, match="foo"):
    mtf.dropout(x, True, rate=0.5, noise_shape=[BATCH, ("foo", 3)])


@meshes.parametrize(meshes.RANDOM_OPS[::2])
def test_dropout_noise_shape_broadcasts(mesh_shape, layout):
  def build(mesh):
    x = mtf.ones(mesh, SHAPE)
    xi = mtf.ones(mesh, SHAPE, dtype=tf.int32)
    return [
      mtf.dropout(x, True, rate=0.5, noise_shape=[LENGTH, BATCH]),
      mtf.dropout(xi, True, keep_prob=0.5),
    ]

  tf.random.set_seed(5)
  y, yi = mtu.run_program(build, mesh_shape, layout)
  assert set(np.unique(y)) == {0.0, 2.0}
  # Constant along the dim missing from noise_shape.
  np.testing.assert_array_equal(y, np.broadcast_to(y[:, :1, :], y.shape))
  assert 0 < np.count_nonzero(y[:, 0, :]) < 48
  # Integers are masked, not rescaled.
  assert yi.dtype == np.int32 and set(np.unique(yi)) == {0, 1}


def test_dropout_bfloat16():
  def build(mesh):
    x = mtf.ones(mesh, [BIG_A, BIG_B], dtype=tf.bfloat16)
    return [mtf.dropout(x, True, rate=0.2)]

  tf.random.set_seed(9)
  [y] = mtu.run_program(build, "all:4", "a:all")
  assert y.dtype == tf.bfloat16.as_numpy_dtype
  y = y.astype(np.float32)
  assert abs(np.mean(y != 0) - 0.8) < 0.01
  assert set(np.unique(y)) == {0.0, float(tf.cast(1.25, tf.bfloat16))}


class _TensorPnumMeshImpl(mtf.placement_mesh_impl.PlacementMeshImpl):
  """Processor numbers as int tensors, as a SIMD backend provides them."""

  def laid_out_pnum(self):
    return self.LaidOutTensor([tf.constant(p) for p in range(self.size)])


def test_tensor_slice_begins_give_the_same_values():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  outs = _seeded_program(mesh)
  impl = _TensorPnumMeshImpl(
    "rows:2;cols:2", "batch:rows;length:cols", mtu.DEVICES[:4]
  )
  lowering = mtf.Lowering(graph, {mesh: impl})
  _assert_all_equal(
    [np.asarray(lowering.export_to_tf_tensor(t)) for t in outs],
    _reference_seeded(),
  )
