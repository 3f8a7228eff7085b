"""SimdMeshImpl's replica program is optimised by Grappler once, not per device.

The collective backend hands the shared trace of the replica program to
Grappler once (mesh_impls/optimize_once.py) and calls that optimised copy on
every device, not inlined and with Grappler off for the calls. The step's
graph must call that copy (not the trace, which TensorFlow would inline and
optimise once per device), and training must give the values of the
inlined calls (CollectiveBackend(optimize_once=False)). Where it can, the
copy is called directly (an op of its own type, with oneDNN's renames made
in advance), else with StatefulPartitionedCall (direct_calls=False); both
give the same values.
"""

import numpy as np
import tensorflow as tf
from tensorflow.core.protobuf import config_pb2
from tensorflow.python.util import _pywrap_util_port  # pylint: disable=g-direct-tensorflow-import

import mesh_tensorflow as mtf
from mesh_tensorflow import simd_mesh_impl
from mesh_tensorflow._src.mesh_impls import optimize_once
from mesh_tensorflow._src.mesh_impls import simd_collective

DEVICES = ["/cpu:%d" % i for i in range(8)]
MESH_SHAPE, LAYOUT = "rows:2;cols:4", "batch:rows;hidden:cols"
BATCH = mtf.Dimension("batch", 8)
D_IN = mtf.Dimension("d_in", 4)
HIDDEN = mtf.Dimension("hidden", 16)
STEPS = 3


def _train(optimize, direct=True):
  """(step's concrete function, [loss of each step], [variable values])."""
  mesh_impl = simd_mesh_impl.SimdMeshImpl(
    MESH_SHAPE,
    LAYOUT,
    backend=simd_collective.CollectiveBackend(
      DEVICES, optimize_once=optimize, direct_calls=direct
    ),
  )
  store = mtf.VariableStore()

  def step(inputs):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    x = mtf.import_tf_tensor(mesh, inputs, [BATCH, D_IN])
    w1 = mtf.get_variable(
      mesh,
      "w1",
      [D_IN, HIDDEN],
      initializer=tf.random_normal_initializer(seed=1),
    )
    w2 = mtf.get_variable(
      mesh, "w2", [HIDDEN], initializer=tf.random_normal_initializer(seed=2)
    )
    h = mtf.relu(mtf.einsum([x, w1], output_shape=[BATCH, HIDDEN]))
    y = mtf.reduce_sum(h * w2, reduced_dim=HIDDEN)
    loss = mtf.reduce_mean(mtf.square(y - 1.0))
    variables = graph.trainable_variables
    grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
    updates = mtf.optimize.AdafactorOptimizer().apply_grads(grads, variables)

    def lower():
      lowering = mtf.Lowering(graph, {mesh: mesh_impl})
      tf_loss = lowering.export_to_tf_tensor(loss)
      with tf.control_dependencies(
        [lowering.lowered_operation(op) for op in updates]
      ):
        return tf.identity(tf_loss)

    return mesh_impl.replicate(lower)[0]

  inputs = tf.reshape(tf.sin(tf.range(32.0)), [8, 4])
  with mtf.variable_store(store):
    concrete = tf.function(step, autograph=False).get_concrete_function(
      tf.TensorSpec([8, 4], tf.float32)
    )
  losses = [float(concrete(inputs)) for _ in range(STEPS)]
  return concrete, losses, [v.numpy() for v in store.variables]


def test_calls_run_the_copy_optimised_once_with_grappler_off():
  concrete, _, _ = _train(optimize=True, direct=False)
  graph_def = concrete.graph.as_graph_def()
  calls = [n for n in graph_def.node if n.op == "StatefulPartitionedCall"]
  assert len(calls) == 8
  (name,) = {c.attr["f"].func.name for c in calls}
  assert name.endswith(optimize_once.SUFFIX)
  for call in calls:
    config = config_pb2.ConfigProto()
    config.ParseFromString(call.attr["config_proto"].s)
    assert config.graph_options.rewrite_options.disable_meta_optimizer
  # The step's graph holds the optimised copy only, marked not to be
  # inlined (TensorFlow would otherwise optimise it once per device).
  (function,) = graph_def.library.function
  assert function.signature.name == name
  assert function.attr["_noinline"].b
  assert function.attr["_nospecialize"].b
  inlined, _, _ = _train(optimize=False)
  (original,) = inlined.graph.as_graph_def().library.function
  assert "_noinline" not in original.attr
  # Grappler ran over the copy: it is smaller than the trace.
  assert len(function.node_def) < len(original.node_def)


def test_direct_calls_run_the_copy_with_onednn_renames_made():
  concrete, _, _ = _train(optimize=True)
  graph_def = concrete.graph.as_graph_def()
  (function,) = graph_def.library.function
  name = function.signature.name
  assert name.endswith(optimize_once.SUFFIX)
  assert function.attr["_noinline"].b
  assert not [n for n in graph_def.node if "PartitionedCall" in n.op]
  calls = [n for n in graph_def.node if n.op == name]
  assert len(calls) == 8
  for call in calls:
    # Only private attributes: a direct call runs no Grappler. Its shapes
    # are the trace's, not inferred over the body when the call is made.
    assert all(key.startswith("_") for key in call.attr)
    assert call.attr["_disable_call_shape_inference"].b
  ops = {n.op for n in function.node_def}
  assert not ops & {"MatMul", "Einsum", "Softmax"} or not (
    _pywrap_util_port.IsMklEnabled()
  )
  renamed = [n for n in function.node_def if n.op.startswith("_Mkl")]
  if _pywrap_util_port.IsMklEnabled():
    assert renamed
    for node in renamed:
      assert node.attr["_kernel"].s == b"MklNameChangeOp"
      assert node.attr["T"].type == tf.float32.as_datatype_enum
  else:
    assert not renamed


def test_training_gives_the_values_of_the_inlined_calls():
  _, losses, values = _train(optimize=True)
  _, partitioned_losses, partitioned_values = _train(
    optimize=True, direct=False
  )
  _, inlined_losses, inlined_values = _train(optimize=False)
  assert losses == inlined_losses
  assert partitioned_losses == inlined_losses
  assert len(values) == len(inlined_values) == len(partitioned_values)
  for value, partitioned, inlined in zip(
    values, partitioned_values, inlined_values
  ):
    np.testing.assert_array_equal(value, inlined)
    np.testing.assert_array_equal(partitioned, inlined)


def test_an_op_the_layout_pass_may_change_keeps_partitioned_calls():
  backend = simd_collective.CollectiveBackend(DEVICES[:4])
  w = tf.Variable([1.0, 2.0, 3.0])

  def program():
    x = tf.cast(backend.replica_pnum(), tf.float32) + w
    # Cumsum: an op oneDNN's layout pass was not seen to leave unchanged.
    return backend.allreduce_sum(tf.math.cumsum(x), [[0, 1, 2, 3]])

  run = tf.function(lambda: backend.replicate(program, (), [0, 1, 2, 3]))
  outputs = run()
  expected = np.cumsum(np.array([1.0, 2.0, 3.0]) * 4 + 6.0)
  for out in outputs:
    np.testing.assert_array_equal(out.numpy(), expected)
  graph_def = run.get_concrete_function().graph.as_graph_def()
  calls = [n for n in graph_def.node if n.op == "StatefulPartitionedCall"]
  assert len(calls) == 4
  (name,) = {c.attr["f"].func.name for c in calls}
  assert name.endswith(optimize_once.SUFFIX)


def test_not_optimised_while_a_tape_records():
  backend = simd_collective.CollectiveBackend(DEVICES[:4])
  w = tf.Variable(3.0)

  @tf.function(autograph=False)
  def run():
    with tf.GradientTape() as tape:
      outputs = backend.replicate(
        lambda: tf.cast(backend.replica_pnum(), tf.float32) * w * w,
        (),
        [0, 1, 2, 3],
      )
      total = tf.add_n(outputs)
    return total, tape.gradient(total, w)

  total, grad = run()
  assert float(total) == 6 * 9.0
  assert float(grad) == 6 * 2 * 3.0
  names = [
    f.signature.name
    for f in run.get_concrete_function().graph.as_graph_def().library.function
  ]
  assert not any(n.endswith(optimize_once.SUFFIX) for n in names)
