"""Behaviours of the original mesh_tensorflow (0.1.21, and earlier 0.1.x) that
code written for it relies on: instantiable MeshImpl, LaidOutTensor slices,
variable lifetime across models, dropout without is_training, legacy TF1 mode,
and the helpers the original has (corr, squared_relu, nd coordinates).
"""

import itertools
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import placement_mesh_impl
from mesh_tensorflow import simd_mesh_impl
from tests import mesh_test_util

TF1_ENV = mesh_test_util.TF1_ENV
eager_only = pytest.mark.skipif(
  TF1_ENV, reason="eager execution (MTF_TEST_TF_MODE=v1 has none)"
)


# ------------------------------------------------------------------ MeshImpl
def test_mesh_impl_base_class_is_instantiable():
  mesh_impl = mtf.MeshImpl(
    "batch:2;model:4", [("batch", "batch"), ("d_ff", "model")]
  )
  assert mesh_impl.size == 8
  layout = mesh_impl.tensor_layout(
    mtf.Shape([("batch", 16), ("len", 3), ("d_ff", 8)])
  )
  assert layout == mtf.TensorLayout([0, None, 1])
  assert mesh_impl.slice_shape("batch:16;len:3;d_ff:8") == [8, 3, 2]
  for call in (
    lambda: mesh_impl.laid_out_pnum(),
    lambda: mesh_impl.slicewise(tf.identity, None),
    lambda: mesh_impl.allreduce(None, [0], "SUM"),
    lambda: mesh_impl.import_tf_tensor(None, None),
  ):
    with pytest.raises(NotImplementedError):
      call()


def test_tensor_layout_is_built_without_a_mesh():
  layout = mtf.TensorLayout([1, None, 0])
  assert layout.tensor_axis_to_mesh_axis == (1, None, 0)
  assert layout.mesh_axis_to_tensor_axis(1) == (2,)
  assert repr(layout) == "TensorLayout(1, None, 0)"


@pytest.mark.parametrize(
  "laid_out_tensor_class",
  [
    placement_mesh_impl.PlacementMeshImpl.LaidOutTensor,
    simd_mesh_impl.SimdMeshImpl.LaidOutTensor,
  ],
)
def test_laid_out_tensor_all_slices(laid_out_tensor_class):
  slices = [tf.constant([1.0, 2.0])]
  laid_out = laid_out_tensor_class(slices)
  assert laid_out.all_slices == slices
  assert laid_out.tensor_list == slices
  assert laid_out.slice_shape == [2]


def test_import_laid_out_tensor_needs_only_a_tensor_list():
  class TensorListOnly:  # The minimum the original asks of a laid-out tensor.
    def __init__(self, tensor_list):
      self.tensor_list = tensor_list

  mesh = mtf.Mesh(mtf.Graph(), "mesh")
  op = mtf.ImportLaidOutTensorOperation(
    mesh, TensorListOnly([tf.constant([1], tf.int32)]), "a:1"
  )
  assert op.outputs[0].dtype == tf.int32


def test_reduce_operation_checks_its_reduction_when_lowered():
  mesh = mtf.Mesh(mtf.Graph(), "mesh")
  x = mtf.ones(mesh, "a:2;b:3")
  op = mtf.ReduceOperation(x, mtf.Shape([]), "sum")  # Builds, as the original.
  lowering_error = None
  try:
    mtf.Lowering(mesh.graph, {mesh: mesh_test_util.mesh_impl_for("", "")})
  except ValueError as e:
    lowering_error = e
  assert "sum" in str(lowering_error)
  assert op.splittable_dims == frozenset(["a", "b"])


# ---------------------------------------------------------- variable lifetime
def _model(mesh, units):
  x = mtf.ones(mesh, "batch:2;io:3")
  return mtf.layers.dense(
    x,
    mtf.Dimension("out", units),
    reduced_dims=[x.shape.dims[-1]],
    name="layer",
  )


@eager_only
def test_a_new_eager_mtf_graph_gets_new_variables():
  first = mtf.Mesh(mtf.Graph(), "mesh")
  _model(first, 4)
  second = mtf.Mesh(mtf.Graph(), "mesh")
  _model(second, 5)  # Same names, other shapes: a different model.
  kernels = [g.graph.all_variables[0] for g in (first, second)]
  assert kernels[0].master.shape == [3, 4]
  assert kernels[1].master.shape == [3, 5]
  assert kernels[0].store is not kernels[1].store
  assert mtf.get_default_variable_store() is kernels[1].store


def test_a_new_tf_graph_gets_new_variables():
  shapes = []
  for units in (4, 5):
    with tf.Graph().as_default():
      mesh = mtf.Mesh(mtf.Graph(), "mesh")
      _model(mesh, units)
      shapes.append(mesh.graph.all_variables[0].master.shape.as_list())
  assert shapes == [[3, 4], [3, 5]]


def test_mtf_graphs_in_one_tf_graph_share_variables():
  with tf.Graph().as_default():
    kernels = []
    for _ in range(2):
      mesh = mtf.Mesh(mtf.Graph(), "mesh")
      _model(mesh, 4)
      kernels.append(mesh.graph.all_variables[0].master)
    assert kernels[0] is kernels[1]
    assert len(tf.compat.v1.global_variables()) == 2  # kernel and bias


@eager_only
def test_retracing_a_tf_function_reuses_its_variables():
  masters = []

  @tf.function(autograph=False)
  def step(scale):
    mesh = mtf.Mesh(mtf.Graph(), "mesh")
    y = _model(mesh, 4)
    masters.append(mesh.graph.all_variables[0].master)
    lowering = mtf.Lowering(
      mesh.graph, {mesh: mesh_test_util.mesh_impl_for("", "")}
    )
    return lowering.export_to_tf_tensor(y) * scale

  first = step(tf.constant(1.0))
  second = step(tf.constant([2.0]))  # Another input shape: a retrace.
  # tf.function traces twice on a first call that creates variables, and
  # once more for the new input shape: every trace found the same master.
  assert len(masters) >= 3
  assert all(m is masters[0] for m in masters)
  np.testing.assert_allclose(second.numpy(), 2 * first.numpy(), rtol=1e-6)

  @tf.function(autograph=False)
  def other_model():
    mesh = mtf.Mesh(mtf.Graph(), "mesh")
    _model(mesh, 5)  # Same names as step's, another shape: its own store.
    return mesh.graph.all_variables[0].master.shape.as_list()

  assert other_model() == [3, 5]


@eager_only
def test_an_explicit_store_is_shared_across_mtf_graphs():
  store = mtf.VariableStore()
  kernels = []
  for _ in range(2):
    with mtf.variable_store(store):
      mesh = mtf.Mesh(mtf.Graph(), "mesh")
      _model(mesh, 4)
      kernels.append(mesh.graph.all_variables[0].master)
  assert kernels[0] is kernels[1]
  assert sorted(store.masters) == ["layer/bias", "layer/kernel"]


# ------------------------------------------------------------------- dropout
@pytest.mark.parametrize(
  "call, keep_fraction",
  [
    (lambda x: mtf.dropout(x, rate=0.75), 0.25),  # 0.1.18 keyword call
    (lambda x: mtf.dropout(x, 0.25), 0.25),  # 0.1.18 keep_prob
    (lambda x: mtf.dropout(x, True, rate=0.75), 0.25),
    (lambda x: mtf.dropout(x, False, rate=0.75), 1.0),
  ],
)
def test_dropout_without_is_training_drops_as_0_1_18(call, keep_fraction):
  def build(mesh):
    return [call(mtf.ones(mesh, "batch:4;d:1000"))]

  (y,) = mesh_test_util.run_program(build)
  kept = y != 0
  assert abs(kept.mean() - keep_fraction) < 0.03
  np.testing.assert_allclose(y[kept], 1.0 / keep_fraction, rtol=1e-6)


# ------------------------------------------------------- helpers and layers
def _run(build):
  return mesh_test_util.run_program(build, mode="graph")


def test_corr_matches_numpy():
  values = np.random.RandomState(1).randn(3, 5, 4).astype(np.float32)

  def build(mesh):
    x = mtf.import_tf_tensor(mesh, tf.constant(values), "a:3;b:5;c:4")
    return [mtf.layers.corr(x, mtf.Dimension("c", 4))]

  (got,) = _run(build)
  want = np.corrcoef(values.reshape(-1, 4), rowvar=False)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_squared_relu_matches_numpy():
  values = np.linspace(-2, 2, 9).astype(np.float32)

  def build(mesh):
    return [
      mtf.squared_relu(mtf.import_tf_tensor(mesh, tf.constant(values), "n:9"))
    ]

  (got,) = _run(build)
  np.testing.assert_allclose(got, np.maximum(values, 0) ** 2, rtol=1e-6)


def test_dense_with_a_new_dim_named_like_the_reduced_one():
  values = np.arange(6, dtype=np.float32).reshape(2, 3)
  kernel = np.arange(24, dtype=np.float32).reshape(3, 8) / 10

  def build(mesh):
    x = mtf.import_tf_tensor(mesh, tf.constant(values), "batch:2;channels:3")
    return [
      mtf.layers.dense(
        x,
        mtf.Dimension("channels", 8),
        reduced_dims=[x.shape.dims[1]],
        use_bias=False,
        kernel_initializer=tf.constant_initializer(kernel),
      )
    ]

  (got,) = _run(build)
  np.testing.assert_allclose(got, values @ kernel, rtol=1e-6)


class _FakeTopology:
  mesh_shape = [2, 2, 1, 1]


class _FakeDeviceAssignment:
  """Replicas on a 2x2 chip grid, numbered in an arbitrary order."""

  topology = _FakeTopology()
  _coords = [(1, 0, 0, 0), (0, 0, 0, 0), (1, 1, 0, 0), (0, 1, 0, 0)]
  num_replicas = len(_coords)

  def coordinates(self, replica, logical_core):
    assert logical_core == 0
    return self._coords[replica]


def test_nd_coordinate_helpers_match_brute_force():
  assignment = _FakeDeviceAssignment()
  for pnum in range(4):
    assert mtf.pnum_to_processor_coordinates_nd([2, 2], pnum, assignment) == (
      list(assignment.coordinates(pnum, 0))
    )
  physical = [list(c) for c in itertools.product(range(2), range(2))]
  physical = [[y, x] for x, y in physical]  # x fastest, as the hardware ids
  got = mtf.processor_coordinates_to_pnum_map_nd([2, 2], physical, assignment)
  for coord, replica in zip(physical, got):
    assert list(assignment.coordinates(replica, 0))[:2] == coord


# ------------------------------------------------------------ legacy TF1 mode
@pytest.mark.skipif(mesh_test_util.SIMD_ENV, reason="runs PlacementMeshImpl")
def test_legacy_tf1_mode_gives_the_numbers_of_tf2_mode():
  program = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "legacy_mode_program.py"
  )
  results = {}
  for mode in ("v1", "v2"):
    completed = subprocess.run(
      [sys.executable, program, mode],
      capture_output=True,
      text=True,
      timeout=600,
      check=False,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    results[mode] = json.loads(completed.stdout.strip().splitlines()[-1])
  assert sorted(results["v1"]) == sorted(results["v2"])
  for name in results["v1"]:
    np.testing.assert_allclose(
      results["v1"][name],
      results["v2"][name],
      rtol=1e-5,
      atol=1e-6,
      err_msg=name,
    )
  # The step changed the kernel, so the comparison covers the update too.
  rng = np.random.RandomState(0)  # The program's draws: x, then the kernel.
  rng.randn(4, 6)
  initial_kernel = rng.randn(6, 8).ravel()
  assert (
    np.abs(np.array(results["v1"]["kernel_after_step"]) - initial_kernel).max()
    > 1e-3
  )
