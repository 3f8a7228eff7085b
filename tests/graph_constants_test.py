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
