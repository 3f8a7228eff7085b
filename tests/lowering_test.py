"""Tests for mesh_tensorflow._src.lowering and the placement MeshImpl checks."""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import placement_mesh_impl
from tests import mesh_test_util as mtu
from tests import meshes

tf1 = tf.compat.v1

A = mtf.Dimension("a", 4)
B = mtf.Dimension("b", 6)

_RNG = np.random.RandomState(6)
X = _RNG.randn(4, 6).astype(np.float32)


def _new_mesh(name="mesh"):
  graph = mtf.Graph()
  return graph, mtf.Mesh(graph, name)


def _impl(mesh_shape, layout):
  return mtu.mesh_impl_for(mesh_shape, layout)


# Counters.


def test_pretty_print_counters():
  counters = [
    ("allreduce/[0]/einsum_op", 8),
    ("einsum", 100),
    ("allreduce/[0]/reduce_op", 2),
    ("allreduce/[0, 1]/reduce_op", 4),
    ("einsum", 20),
  ]
  assert mtf.pretty_print_counters(counters).splitlines() == [
    "allreduce: 14",
    "allreduce/[0, 1]: 4",
    "allreduce/[0, 1]/reduce_op: 4",
    "allreduce/[0]: 10",
    "allreduce/[0]/einsum_op: 8",
    "allreduce/[0]/reduce_op: 2",
    "einsum: 120",
  ]
  assert mtf.pretty_print_counters([]) == ""


def test_lowering_counters():
  graph, mesh = _new_mesh()
  x = mtf.import_tf_tensor(mesh, X, [A, B])
  w = mtf.import_tf_tensor(mesh, X, [A, B])
  y = mtf.einsum([x, w], output_shape=[B])
  lowering = mtf.Lowering(graph, {mesh: _impl("all:4", "a:all")})
  counters = dict()
  for k, v in lowering.counters:
    counters[k] = counters.get(k, 0) + v
  # Laid-out sizes count every processor's slice; unique sizes do not.
  assert counters["output/ImportOperation"] == 2 * 24
  assert counters["output_unique/ImportOperation"] == 2 * 24
  assert counters["output/EinsumOperation"] == 6 * 4
  assert counters["output_unique/EinsumOperation"] == 6
  assert counters["einsum"] == 24
  assert counters["einsum_unique"] == 24
  assert not any(k.startswith("allreduce") for k in counters)
  lowering.export_to_tf_tensor(y)
  assert ("allreduce/[0]/einsum_op", 24) in lowering.counters
  lowering.add_counter("custom/key", 5)
  assert lowering.counters[-1] == ("custom/key", 5)
  assert "custom: 5" in mtf.pretty_print_counters(lowering.counters)


def test_laid_out_size():
  graph, mesh = _new_mesh()
  x = mtf.import_tf_tensor(mesh, X, [A, B])
  lowering = mtf.Lowering(graph, {mesh: _impl("rows:2;cols:2", "a:rows")})
  assert lowering.laid_out_size(x) == 2 * 6 * 4


# Export and lowered operations.


@meshes.parametrize(
  [
    ("", ""),
    ("all:4", "a:all"),
    ("rows:2;cols:2", "a:rows;b:cols"),
    ("rows:2;cols:2", "b:rows"),
  ]
)
def test_export_to_tf_tensor(mesh_shape, layout):
  graph, mesh = _new_mesh()
  x = mtf.import_tf_tensor(mesh, X, [A, B])
  y = mtf.reduce_sum(x, output_shape=[B])
  lowering = mtf.Lowering(graph, {mesh: _impl(mesh_shape, layout)})
  np.testing.assert_array_equal(lowering.export_to_tf_tensor(x).numpy(), X)
  np.testing.assert_allclose(
    lowering.export_to_tf_tensor(y).numpy(), X.sum(0), rtol=1e-5
  )
  np.testing.assert_allclose(
    lowering.lowered_operation(y).numpy(), X.sum(0), rtol=1e-5
  )


def test_lowered_operation():
  with mtf.variable_store(mtf.VariableStore()):
    graph, mesh = _new_mesh()
    v = mtf.get_variable(mesh, "v", [A, B]).operation
    assign = mtf.assign(v, mtf.zeros(mesh, [A, B]))
    z = mtf.exp(v.outputs[0])
    lowering = mtf.Lowering(graph, {mesh: _impl("all:4", "a:all")})
    assert lowering.lowered_operation(assign) is lowering.operations[assign]
    with pytest.raises(ValueError, match=z.operation.name):
      lowering.lowered_operation(z.operation)
    assert set(lowering.variables) == {v}
    assert lowering.graph is graph
    assert lowering.mesh_impl(mesh) is lowering.mesh_to_impl[mesh]
    assert lowering.mesh_impl(z) is lowering.mesh_impl(mesh)
    assert lowering.mesh_impl(z.operation) is lowering.mesh_impl(mesh)


def test_ops_are_lowered_in_name_scopes():
  with tf.Graph().as_default():
    graph, mesh = _new_mesh()
    x = mtf.import_tf_tensor(mesh, X, [A, B])
    y = mtf.exp(x, name="my_exp")
    lowering = mtf.Lowering(graph, {mesh: _impl("all:4", "a:all")})
    for t in lowering.tensors[y].tensor_list:
      assert t.name.startswith("my_exp/"), t.name


def test_set_tensor_lowering_verifies_slice_shape():
  graph, mesh = _new_mesh()
  x = mtf.import_tf_tensor(mesh, X, [A, B])
  lowering = mtf.Lowering(graph, {mesh: _impl("all:4", "a:all")})
  impl = lowering.mesh_impl(mesh)
  wrong = impl.LaidOutTensor([tf.zeros([4, 6])] * 4)
  with pytest.raises(ValueError, match=r"\[1, 6\]"):
    lowering.set_tensor_lowering(x, wrong)
  right = impl.LaidOutTensor([tf.zeros([1, 6])] * 4)
  lowering.set_tensor_lowering(x, right)
  assert lowering.tensors[x] is right


def test_log_file(tmp_path):
  path = tmp_path / "sizes.txt"
  with mtf.variable_store(mtf.VariableStore()):
    graph, mesh = _new_mesh()
    mtf.get_variable(mesh, "w", [A, B])
    mtf.get_variable(mesh, "step", [], trainable=False)
    mtf.Lowering(graph, {mesh: _impl("all:4", "a:all")}, log_file=str(path))
  text = path.read_text()
  assert "Trainable Variables count: 1 total size: 24" in text
  assert "Untrainable Variables count: 1 total size: 1" in text
  assert "slice_size 6" in text


def test_copy_ops_in_graph_mode(monkeypatch):
  for sequence_mode in ("", "1"):
    monkeypatch.setenv("MTF_SEQUENCE_MODE", sequence_mode)
    with tf.Graph().as_default():
      graph, mesh = _new_mesh()
      mtf.get_variable(
        mesh, "w", [A, B], initializer=tf.constant_initializer(X)
      )
      mtf.get_variable(mesh, "u", [B], initializer=tf.ones_initializer())
      lowering = mtf.Lowering(
        graph, {mesh: _impl("all:4", "a:all")}, autostack=False
      )
      to_slices = lowering.copy_masters_to_slices()
      to_masters = lowering.copy_slices_to_masters()
      assert isinstance(to_slices, tf.Operation)
      assert isinstance(to_masters, tf.Operation)
      with tf1.Session() as sess:
        sess.run(tf1.global_variables_initializer())
        sess.run(tf1.local_variables_initializer())
        sess.run(to_slices)
        sess.run(to_masters)


# LazyAllreduceSum and friends.


def test_lazy_allreduce_sum_is_memoized_and_counts_once():
  impl = _impl("all:4", "a:all")
  laid_out = impl.LaidOutTensor([tf.constant([float(p)]) for p in range(4)])
  calls = []
  lazy = mtf.LazyAllreduceSum(
    impl, laid_out, [0], add_counter_fn=lambda: calls.append(1)
  )
  assert lazy.slice_shape == [1]
  assert lazy.mesh_axes == (0,)
  first = lazy.to_laid_out_tensor()
  assert lazy.to_laid_out_tensor() is first
  assert calls == [1]
  assert [t.numpy()[0] for t in first.tensor_list] == [6.0] * 4
  no_axes = mtf.LazyAllreduceSum(impl, laid_out, [])
  assert no_axes.to_laid_out_tensor() is laid_out


def test_compatible_lazy_allreduce_sums_and_conversion():
  impl = _impl("rows:2;cols:2", "")
  t = impl.LaidOutTensor([tf.zeros([2])] * 4)
  t3 = impl.LaidOutTensor([tf.zeros([3])] * 4)
  a = mtf.LazyAllreduceSum(impl, t, [0])
  b = mtf.LazyAllreduceSum(impl, t, [0])
  c = mtf.LazyAllreduceSum(impl, t, [1])
  d = mtf.LazyAllreduceSum(impl, t3, [0])
  assert mtf.compatible_lazy_allreduce_sums([a, b])
  assert not mtf.compatible_lazy_allreduce_sums([a, c])
  assert not mtf.compatible_lazy_allreduce_sums([a, d])
  assert not mtf.compatible_lazy_allreduce_sums([a, t])
  assert not mtf.compatible_lazy_allreduce_sums([])
  converted = mtf.convert_args_to_laid_out_tensors([a, t, 3])
  assert converted[1] is t and converted[2] == 3
  assert converted[0] is a.to_laid_out_tensor()


def test_lazy_laid_out_tensor_recomputes():
  impl = _impl("all:4", "")
  calls = []

  def fn():
    calls.append(1)
    return impl.LaidOutTensor([tf.zeros([2])] * 4)

  lazy = mtf.LazyLaidOutTensor(fn, [2])
  assert lazy.slice_shape == [2]
  lazy.to_laid_out_tensor()
  lazy.to_laid_out_tensor()
  assert len(calls) == 2


# Errors.


def test_mesh_missing_from_mesh_to_impl_raises():
  graph, mesh = _new_mesh("first")
  other = mtf.Mesh(graph, "second")
  mtf.zeros(mesh, [A])
  mtf.zeros(other, [A])
  with pytest.raises(ValueError, match="second"):
    mtf.Lowering(graph, {mesh: _impl("", "")})


def test_two_meshes_in_one_graph():
  graph, mesh = _new_mesh("first")
  other = mtf.Mesh(graph, "second")
  x = mtf.import_tf_tensor(mesh, X, [A, B])
  y = mtf.import_tf_tensor(other, X * 2, [A, B])
  lowering = mtf.Lowering(
    graph,
    {mesh: _impl("all:4", "a:all"), other: _impl("rows:2;cols:2", "b:cols")},
  )
  assert lowering.mesh_impl(x) is not lowering.mesh_impl(y)
  np.testing.assert_array_equal(lowering.export_to_tf_tensor(y).numpy(), 2 * X)


def test_placement_mesh_impl_wrong_number_of_devices_raises():
  with pytest.raises(ValueError, match="4 processors but 3 devices"):
    placement_mesh_impl.PlacementMeshImpl("rows:2;cols:2", "", mtu.DEVICES[:3])
  with pytest.raises(ValueError, match="1 processors but 2 devices"):
    placement_mesh_impl.PlacementMeshImpl("", "", mtu.DEVICES[:2])


def test_layout_that_does_not_divide_raises_naming_dims():
  graph, mesh = _new_mesh()
  mtf.import_tf_tensor(mesh, X, [A, B])
  with pytest.raises(ValueError, match="'b'.*'all'"):
    mtf.Lowering(graph, {mesh: _impl("all:4", "b:all")})
  with pytest.raises(ValueError, match="'b'.*'rows'"):
    _impl("rows:4;cols:1", "b:rows").slice_shape([A, B])


def test_two_tensor_dims_on_one_mesh_axis_raise():
  graph, mesh = _new_mesh()
  mtf.import_tf_tensor(mesh, X[:, :4], [A, mtf.Dimension("c", 4)])
  with pytest.raises(ValueError, match="'a'.*'c'.*'all'"):
    mtf.Lowering(graph, {mesh: _impl("all:4", "a:all;c:all")})


def test_layout_naming_absent_mesh_dims_is_ignored():
  graph, mesh = _new_mesh()
  x = mtf.import_tf_tensor(mesh, X, [A, B])
  lowering = mtf.Lowering(graph, {mesh: _impl("all:4", "a:model;b:rows")})
  assert lowering.mesh_impl(mesh).tensor_layout(x).is_fully_replicated
  np.testing.assert_array_equal(lowering.export_to_tf_tensor(x).numpy(), X)


def test_rules_naming_absent_mesh_dims_are_ignored_by_default():
  # Faithful to the original: "d_ff:model" on a mesh without "model" is a
  # no-op, so layouts written for big meshes work on small ones.
  impl = mtf.placement_mesh_impl.PlacementMeshImpl(
    "batch:2", "batch:batch;d_ff:model", ["/cpu:0", "/cpu:1"]
  )
  d_ff = mtf.Dimension("d_ff", 6)
  assert impl.tensor_dimension_to_mesh_axis(d_ff) is None
  assert impl.slice_shape([d_ff]) == [6]


def test_strict_layout_rules_names_the_unknown_mesh_dim():
  with pytest.raises(ValueError, match=r"\('batch', 'row'\).*'row'.*rows=2"):
    mtf.placement_mesh_impl.PlacementMeshImpl(
      "rows:2", "batch:row", ["/cpu:0", "/cpu:1"], strict_layout_rules=True
    )
