"""Behaviours of the original mesh_tensorflow (0.1.21, and earlier 0.1.x) that
code written for it relies on: instantiable MeshImpl, LaidOutTensor slices,
variable lifetime across models, dropout without is_training, legacy TF1 mode,
and the helpers the original has (corr, squared_relu, nd coordinates).
"""

import contextlib
import itertools
import json
import os
import subprocess
import sys
from unittest import mock

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import placement_mesh_impl
from mesh_tensorflow import simd_mesh_impl
from mesh_tensorflow._src.layers import core as layers_core
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


def test_einsum_tells_same_named_dims_apart_by_size():
  # [batch, d_model=3] x [d_model=3, d_model=2]: a kernel shrinking d_model,
  # which the original's Shape and einsum accept.
  rng = np.random.RandomState(2)
  x_value = rng.randn(4, 3).astype(np.float32)
  w_value = rng.randn(3, 2).astype(np.float32)

  def build(mesh):
    x = mtf.import_tf_tensor(mesh, tf.constant(x_value), "batch:4;d_model:3")
    w = mtf.import_tf_tensor(mesh, tf.constant(w_value), "d_model:3;d_model:2")
    y = mtf.einsum([x, w], output_shape="batch:4;d_model:2")
    loss = mtf.reduce_sum(y * y)
    dx, dw = mtf.gradients([loss], [x, w])
    return [y, dx, dw]

  y, dx, dw = mesh_test_util.run_program(build, "b:2", "batch:b")
  np.testing.assert_allclose(y, x_value @ w_value, rtol=1e-5)
  np.testing.assert_allclose(dx, 2 * y @ w_value.T, rtol=1e-5)
  np.testing.assert_allclose(dw, 2 * x_value.T @ y, rtol=1e-5)


def test_einsum_still_rejects_one_name_with_two_sizes_across_inputs():
  mesh = mtf.Mesh(mtf.Graph(), "mesh")
  x = mtf.zeros(mesh, "batch:4;d_model:3")
  with pytest.raises(ValueError, match="'d_model' has size 3"):
    mtf.einsum([x, mtf.zeros(mesh, "d_model:2")])


def test_patching_mtf_layers_reaches_dense():
  # The original's dense calls get_dense_kernel_weights through its module,
  # so patching mtf.layers replaces the kernel of every dense layer.
  x_value = np.arange(6, dtype=np.float32).reshape(2, 3)
  kernel_value = np.arange(12, dtype=np.float32).reshape(3, 4) / 10
  calls = []

  def fake_kernel(x, new_dims, reduced_dims, *unused_args, **unused_kwargs):
    calls.append(([d.name for d in reduced_dims], [d.name for d in new_dims]))
    return mtf.import_tf_tensor(
      x.mesh, tf.constant(kernel_value), reduced_dims + new_dims
    )

  def build(mesh):
    x = mtf.import_tf_tensor(mesh, tf.constant(x_value), "batch:2;d:3")
    with mock.patch.object(mtf.layers, "get_dense_kernel_weights", fake_kernel):
      y = mtf.layers.dense(x, mtf.Dimension("f", 4), x.shape.dims[1:])
    z = mtf.layers.dense(x, mtf.Dimension("f", 4), x.shape.dims[1:])
    return [y, z]

  y, z = _run(build)
  np.testing.assert_allclose(y, x_value @ kernel_value, rtol=1e-6)
  assert calls == [(["d"], ["f"])]
  assert not np.allclose(z, y)  # Unpatched again: a real, random kernel.
  assert (
    mtf.layers.get_dense_kernel_weights is layers_core.get_dense_kernel_weights
  )


# Variable names the original (0.1.21, run in a tf.compat.v1 graph) gives
# this program: an unnamed dense puts its kernel and its bias in two default
# scopes, and use_bias=False still takes the bias scope's name.
_ORIGINAL_DEFAULT_NAMES = [
  "dense/kernel",
  "dense/bias",
  "dense_1/kernel",
  "dense_2/bias",
  "dense_3/kernel",
  "dense_5/kernel",
  "dense_6/bias",
  "dense_relu_dense/wi/kernel",
  "dense_relu_dense/wo/kernel",
  "dense_relu_dense_1/wi/kernel",
  "dense_relu_dense_1/wo/kernel",
  "conv2d/kernel",
  "conv2d_1/kernel",
  "outer/dense/kernel",
  "outer/dense_1/bias",
]


def _default_named_layers(mesh):
  d, f = mtf.Dimension("d", 3), mtf.Dimension("f", 4)
  x = mtf.zeros(mesh, [mtf.Dimension("b", 2), d])
  mtf.layers.dense(x, [f], reduced_dims=[d], name="dense")
  mtf.layers.dense(x, [f], reduced_dims=[d])
  mtf.layers.dense(x, [f], reduced_dims=[d], use_bias=False)
  mtf.layers.dense(x, [f], reduced_dims=[d])
  for _ in range(2):
    mtf.layers.dense_relu_dense(x, f, is_training=False, dropout=0.0)
  image = mtf.zeros(mesh, "b:2;h:4;w:4;d:3")
  for _ in range(2):
    mtf.layers.conv2d(image, f)
  with tf.compat.v1.variable_scope("outer"):
    mtf.layers.dense(x, [f], reduced_dims=[d])


@pytest.mark.parametrize("fresh", ["mtf_graph", "tf_graph"])
def test_default_layer_names_are_the_originals_in_every_graph(fresh):
  names = []
  for _ in range(2):
    with contextlib.ExitStack() as stack:
      if fresh == "tf_graph":
        stack.enter_context(tf.Graph().as_default())
      else:
        stack.enter_context(mtf.variable_store(mtf.VariableStore()))
      graph = mtf.Graph()
      _default_named_layers(mtf.Mesh(graph, "mesh"))
      names.append([v.name for v in graph.all_variables])
  assert names[0] == names[1] == _ORIGINAL_DEFAULT_NAMES


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
