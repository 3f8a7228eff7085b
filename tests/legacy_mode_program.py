"""One training step of a small mtf model on a 2x2 mesh; prints its numbers.

Run as `python legacy_mode_program.py v1|v2`: "v1" first calls
tf.compat.v1.disable_v2_behavior() (the process-wide legacy TF1 mode) and runs
the step in a tf.compat.v1 graph and Session; "v2" runs it eagerly. It prints
one JSON object of named float lists, so a test can check that both modes give
the same numbers. The model touches the lowering paths that read slice shapes
(allsplit, top-k, fused softmax, allreduce) and an optimizer update.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

NUM_DEVICES = 4


def build_and_lower():
  """Builds the step; returns {name: tf.Tensor} and the copy-to-slices op."""
  import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow import placement_mesh_impl  # pylint: disable=g-import-not-at-top

  rng = np.random.RandomState(0)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  batch = mtf.Dimension("batch", 4)
  d_model = mtf.Dimension("d_model", 6)
  hidden = mtf.Dimension("hidden", 8)
  x = mtf.import_tf_tensor(
    mesh, tf.constant(rng.randn(4, 6).astype(np.float32)), [batch, d_model]
  )
  w_value = rng.randn(6, 8).astype(np.float32)
  h = mtf.layers.dense(
    x,
    hidden,
    reduced_dims=[d_model],
    use_bias=False,
    kernel_initializer=tf.constant_initializer(w_value),
    name="dense",
  )
  h = mtf.layers.layer_norm(h, hidden)
  probs = mtf.softmax(h, hidden)
  top_values, _ = mtf.top_k(h, hidden, mtf.Dimension("k", 3))
  # h is split [rows, cols]; moved is split [-, rows]: re-laying it out goes
  # through allconcat and allsplit.
  moved = mtf.reshape(
    h, [mtf.Dimension("batch2", 4), mtf.Dimension("hidden2", 8)]
  )
  loss = mtf.reduce_sum(mtf.square(probs)) + mtf.reduce_mean(moved)
  var_grads = mtf.gradients(
    [loss], [v.outputs[0] for v in graph.trainable_variables]
  )
  update_ops = mtf.optimize.SgdOptimizer(0.1).apply_grads(
    var_grads, graph.trainable_variables
  )
  mesh_impl = placement_mesh_impl.PlacementMeshImpl(
    "rows:2;cols:2",
    "batch:rows;hidden:cols;hidden2:rows",
    ["/cpu:%d" % i for i in range(NUM_DEVICES)],
  )
  lowering = mtf.Lowering(graph, {mesh: mesh_impl})
  outputs = {
    "loss": lowering.export_to_tf_tensor(loss),
    "probs": lowering.export_to_tf_tensor(probs),
    "top_values": lowering.export_to_tf_tensor(top_values),
    "moved": lowering.export_to_tf_tensor(moved),
  }
  updates = [lowering.lowered_operation(op) for op in update_ops]
  kernel = graph.trainable_variables[0]
  return lowering, outputs, updates, kernel


def run_v1():
  tf.compat.v1.disable_v2_behavior()
  with tf.Graph().as_default():
    lowering, outputs, updates, kernel = build_and_lower()
    config = tf.compat.v1.ConfigProto(device_count={"CPU": NUM_DEVICES})
    with tf.compat.v1.Session(config=config) as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      sess.run(lowering.copy_masters_to_slices())
      values, _ = sess.run([outputs, updates])
      sess.run(lowering.copy_slices_to_masters())
      values["kernel_after_step"] = sess.run(kernel.master)
  return values


def run_v2():
  tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0],
    [tf.config.LogicalDeviceConfiguration()] * NUM_DEVICES,
  )
  import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top

  with mtf.variable_store(mtf.VariableStore()):
    # Eagerly, lowering runs the step: outputs, then the updates.
    lowering, outputs, _, kernel = build_and_lower()
    values = {k: v.numpy() for k, v in outputs.items()}
    lowering.copy_slices_to_masters()
    values["kernel_after_step"] = kernel.master.numpy()
  return values


def main():
  mode = sys.argv[1]
  values = run_v1() if mode == "v1" else run_v2()
  print(
    json.dumps(
      {k: np.asarray(v, np.float64).ravel().tolist() for k, v in values.items()}
    )
  )


if __name__ == "__main__":
  main()
