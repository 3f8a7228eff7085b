"""graph_constants (constants shared per device while lowering) and the
replica sharing of PlacementMeshImpl.slicewise in graphs.
"""

import numpy as np
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import placement_mesh_impl
from mesh_tensorflow._src import graph_constants


def test_constant_is_shared_per_device_and_value():
  with tf.Graph().as_default():
    with tf.device("/cpu:0"):
      a = graph_constants.constant([2, 3])
      b = graph_constants.constant([2, 3])
      c = graph_constants.constant([3, 2])
      d = graph_constants.constant([2, 3], tf.int64)
    with tf.device("/cpu:1"):
      e = graph_constants.constant([2, 3])
    assert a is b
    assert len({id(a), id(c), id(d), id(e)}) == 4
    assert e.device.endswith("CPU:1")
    with tf.compat.v1.Session() as sess:
      np.testing.assert_array_equal(sess.run(a), [2, 3])
      assert sess.run(d).dtype == np.int64


def test_constant_ignores_control_dependencies_of_first_caller():
  with tf.Graph().as_default():
    gate = tf.no_op()
    with tf.control_dependencies([gate]):
      a = graph_constants.constant([1])
    assert not a.op.control_inputs


def test_not_shared_inside_v1_control_flow():
  with tf.Graph().as_default():
    outside = graph_constants.constant([4])

    def body(i):
      inside = graph_constants.constant([4])
      assert inside is not outside
      return i + inside[0]

    result = tf.compat.v1.while_loop(lambda i: i < 8, body, [0])
    with tf.compat.v1.Session() as sess:
      assert sess.run(result) == 8


def test_reshape_matches_tf_reshape_and_skips_no_ops():
  x = tf.reshape(tf.range(24.0), [2, 3, 4])
  np.testing.assert_array_equal(
    graph_constants.reshape(x, [6, 4]), tf.reshape(x, [6, 4])
  )
  assert graph_constants.reshape(x, [2, 3, 4]) is x


def test_eager_values_are_fresh():
  assert graph_constants.constant([1, 2]) is not graph_constants.constant(
    [1, 2]
  )


def _lower_replicated_program(mesh_impl):
  """y = (x * 2 + 1) summed over a dim no mesh axis splits; x replicated."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  rows, cols = mtf.Dimension("rows", 4), mtf.Dimension("cols", 6)
  x = mtf.import_tf_tensor(
    mesh, tf.reshape(tf.range(24.0), [4, 6]), mtf.Shape([rows, cols])
  )
  y = mtf.reduce_sum(x * 2.0 + 1.0, reduced_dim=cols)
  lowering = mtf.Lowering(graph, {mesh: mesh_impl})
  return lowering.export_to_tf_tensor(y), lowering


def test_lowered_program_agrees_in_graph_and_eagerly():
  expected = (np.arange(24.0).reshape(4, 6) * 2 + 1).sum(axis=1)
  mesh_impl = placement_mesh_impl.PlacementMeshImpl(
    "all:4", "", ["/cpu:%d" % i for i in range(4)]
  )
  with tf.Graph().as_default():
    y, _ = _lower_replicated_program(mesh_impl)
    with tf.compat.v1.Session() as sess:
      np.testing.assert_allclose(sess.run(y), expected)
  eager_y, _ = _lower_replicated_program(mesh_impl)
  np.testing.assert_allclose(eager_y, expected)


def test_shared_slices_compute_once_in_graphs():
  mesh_impl = placement_mesh_impl.PlacementMeshImpl(
    "all:4", "", ["/cpu:%d" % i for i in range(4)]
  )
  with tf.Graph().as_default() as graph:
    x = tf.constant([1.0, 2.0])
    laid_out = placement_mesh_impl.LaidOutTensor([x] * 4)
    y = mesh_impl.slicewise(lambda t: t * 3.0, laid_out)
    assert all(t is y.tensor_list[0] for t in y.tensor_list)
    assert len([op for op in graph.get_operations() if op.type == "Mul"]) == 1
    # Stateful slice functions still run once per processor.
    z = mesh_impl.slicewise(
      lambda t: t + tf.random.uniform([2], seed=1), laid_out
    )
    assert len({id(t) for t in z.tensor_list}) == 4
    with tf.compat.v1.Session() as sess:
      np.testing.assert_allclose(sess.run(y.tensor_list[3]), [3.0, 6.0])


def test_sharing_survives_a_preceding_stateful_op():
  # A variable assignment built just before must not count as the slice
  # function's own stateful op.
  mesh_impl = placement_mesh_impl.PlacementMeshImpl(
    "all:4", "", ["/cpu:%d" % i for i in range(4)]
  )
  with tf.Graph().as_default() as graph:
    v = tf.Variable([0.0, 0.0])
    x = v.assign([1.0, 2.0])
    laid_out = placement_mesh_impl.LaidOutTensor([x] * 4)
    y = mesh_impl.slicewise(lambda t: t * 3.0, laid_out)
    assert all(t is y.tensor_list[0] for t in y.tensor_list)
    assert len([op for op in graph.get_operations() if op.type == "Mul"]) == 1


def test_shared_constants_of_several_devices_count_as_one_value():
  mesh_impl = placement_mesh_impl.PlacementMeshImpl(
    "all:4", "", ["/cpu:%d" % i for i in range(4)]
  )
  with tf.Graph().as_default() as graph:
    per_device = mesh_impl.slicewise(
      lambda _: graph_constants.constant([5, 7]), mesh_impl.laid_out_pnum()
    )
    assert len({id(t) for t in per_device.tensor_list}) == 4
    keys = graph_constants.value_keys(graph)
    assert len({keys[id(t)] for t in per_device.tensor_list}) == 1
    y = mesh_impl.slicewise(lambda t: t * 2, per_device)
    assert all(t is y.tensor_list[0] for t in y.tensor_list)
    with tf.compat.v1.Session() as sess:
      np.testing.assert_array_equal(sess.run(y.tensor_list[2]), [10, 14])


def test_replicated_groups_share_one_collective():
  # rows x cols mesh; the slices are equal along rows, so both row groups
  # reduce the same tensors over cols: one reduction serves both.
  devices = ["/cpu:%d" % i for i in range(4)]
  mesh_impl = placement_mesh_impl.PlacementMeshImpl(
    "rows:2;cols:2", "", devices
  )
  with tf.Graph().as_default() as graph:
    a, b = tf.constant([1.0, 2.0]), tf.constant([10.0, 20.0])
    laid_out = placement_mesh_impl.LaidOutTensor([a, b, a, b])
    summed = mesh_impl.allreduce(laid_out, [1], "SUM")
    assert len({id(t) for t in summed.tensor_list}) == 1
    sums = [
      op for op in graph.get_operations() if op.type in ("AddV2", "AddN", "Sum")
    ]
    assert len(sums) == 1
    with tf.compat.v1.Session() as sess:
      for t in summed.tensor_list:
        np.testing.assert_allclose(sess.run(t), [11.0, 22.0])


def test_reshape_reuses_an_identical_reshape_in_graphs():
  with tf.Graph().as_default() as graph:
    x = tf.reshape(tf.range(24.0), [2, 3, 4])
    a = graph_constants.reshape(x, [6, 4])
    assert graph_constants.reshape(x, [6, 4]) is a
    assert graph_constants.reshape(x, [4, 6]) is not a
    with tf.device("/cpu:1"):
      assert graph_constants.reshape(x, [6, 4]) is not a
    with tf.control_dependencies([tf.no_op()]):
      gated = graph_constants.reshape(x, [6, 4])
    assert gated is not a and gated.op.control_inputs
    # x's own reshape, then [6, 4], [4, 6], on cpu:1 and under the gate.
    reshapes = [op for op in graph.get_operations() if op.type == "Reshape"]
    assert len(reshapes) == 5
    with tf.compat.v1.Session() as sess:
      np.testing.assert_array_equal(sess.run(a), np.arange(24.0).reshape(6, 4))
