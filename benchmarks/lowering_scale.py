"""Benchmark: graph build, lowering and tracing time against mesh size and depth.

One training step of a decoder-only LM (`transformer.Unitransformer` over
`make_layer_stack([SelfAttention, DenseReluDense])`, d_model 512, d_ff 2048, 8
heads of d_kv 64, vocabulary 8192, length 256, batch 16: --length and
--batch change these) with the Adafactor optimizer, on meshes of 1, 8 and 64
virtual CPUs:

  1 device    mesh "b:1;m:1"
  8 devices   mesh "b:2;m:4"
  64 devices  mesh "b:8;m:8"

all with layout "batch:b;heads:m;d_ff:m;vocab:m", and 6 or 24 layers. Nothing
is run: the figures are the CPU seconds of the process (the machine may be shared) to

  build   the mtf graph (model, loss, mtf.gradients, Adafactor updates),
  lower   mtf.Lowering (for SimdMeshImpl, the one trace of the replica
          program, called on every device),
  trace   the rest of tracing the step's tf.function (TensorFlow's own work:
          auto control dependencies, function graph finalisation),

the number of traces (a tf.function that creates variables is traced twice
on its first call) and the TF op count of the traced step (its graph plus the bodies of the
functions it calls). With --run, the step then runs once on zero inputs:
"first step" is that run's wall time (TensorFlow optimises and places the
graph then), "ready" the wall time from the start to its end, and "second
step" the wall time of a second run. Placement is PlacementMeshImpl; simd is SimdMeshImpl
with the collective backend (`mesh_impl.replicate`), whose lowering traces
the replica program.

Each (device count) runs in a subprocess of its own (the virtual CPUs must be
configured before TensorFlow starts). With --tf_mode v1 the step is built in
a tf.compat.v1 graph instead (no tracing); with the original mesh_tensorflow
package on PYTHONPATH this measures the original's placement lowering:

  PYTHONPATH=<original> python benchmarks/lowering_scale.py --worker 8
      --layers 6 --impls placement --tf_mode v1  (one line)

Usage: python benchmarks/lowering_scale.py [--devices 1,8,64] [--layers 6,24]
           [--impls placement,simd] [--run [--driver_rewrites]]
           [--batch 16] [--length 256]
"""

import argparse
import contextlib
import functools
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

MESHES = {1: "b:1;m:1", 8: "b:2;m:4", 64: "b:8;m:8"}
LAYOUT = "batch:b;heads:m;d_ff:m;vocab:m"
SIZES = dict(d_model=512, d_ff=2048, heads=8, d_kv=64, vocab=8192)
# The default batch size and length (--batch, --length).
BATCH, LENGTH = 16, 256


def _configure_devices(n):
  """n virtual CPUs (the project's helper, or tf.config for the original)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top

  helper = getattr(getattr(mtf, "utils", None), "configure_virtual_cpus", None)
  if helper is not None:
    return helper(n)
  cpu = tf.config.list_physical_devices("CPU")[0]
  tf.config.set_logical_device_configuration(
    cpu, [tf.config.LogicalDeviceConfiguration()] * n
  )
  return ["/cpu:%d" % i for i in range(n)]


def _build(mtf, transformer, transformer_layers, mesh, inputs, layers):
  """The training step's mtf graph: (loss, update operations)."""
  batch_size, length_size = inputs.shape.as_list()
  stack = transformer.make_layer_stack(
    [
      (
        transformer_layers.SelfAttention,
        {"num_heads": SIZES["heads"], "key_value_size": SIZES["d_kv"]},
      ),
      (transformer_layers.DenseReluDense, {"hidden_size": SIZES["d_ff"]}),
    ],
    # The sublayers of the original's defaults.gin, given explicitly: the
    # original has no defaults without gin.
    layer_stack_cls=functools.partial(
      transformer.LayerStack,
      sublayers_initial=[transformer.sublayer_dropout],
      sublayers_per_layer=[
        transformer.sublayer_rms_norm,
        transformer.sublayer_call_layer,
        transformer.sublayer_dropout,
        transformer.sublayer_residual,
      ],
      sublayers_final=[
        transformer.sublayer_rms_norm,
        transformer.sublayer_dropout,
      ],
    ),
    num_layers=layers,
  )
  model = transformer.Unitransformer(
    layer_stack=stack,
    d_model=SIZES["d_model"],
    input_vocab_size=SIZES["vocab"],
    output_vocab_size=SIZES["vocab"],
    autoregressive=True,
    max_length=length_size,
  )
  batch = mtf.Dimension("batch", batch_size)
  length = mtf.Dimension("length", length_size)
  ids = mtf.import_tf_tensor(mesh, inputs, mtf.Shape([batch, length]))
  _, loss = model.call_simple(ids, ids, compute_loss=True, mode="train")
  graph = mesh.graph
  variables = graph.trainable_variables
  grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
  updates = mtf.optimize.AdafactorOptimizer().apply_grads(grads, variables)
  return loss, updates


def _count_ops(graph_def):
  return len(graph_def.node) + sum(
    len(f.node_def) for f in graph_def.library.function
  )


def _step_scope(driver_rewrites):
  """The context the step runs in: the driver's Grappler passes, or none."""
  if not driver_rewrites:
    return contextlib.nullcontext()
  from transformer._src.driver import estimator  # pylint: disable=g-import-not-at-top

  return estimator.step_graph_rewrites()


def measure(
  impl_name,
  num_devices,
  layers,
  tf_mode,
  devices,
  run=False,
  driver_rewrites=False,
  optimize_once=True,
  batch=BATCH,
  length=LENGTH,
  direct_calls=True,
):
  """{build, lower, trace, total, wall, traces, ops} of one configuration.

  Times are CPU seconds of this process (wall: wall-clock seconds of all).
  With run (tf2 mode only), also {first_step, ready, second_step}: the wall
  seconds of the first run of the step, from the start to its end and of
  the second run, and the CPU seconds of the two runs (*_cpu). With
  driver_rewrites the runs use the Grappler passes of the driver's steps
  (`step_graph_rewrites`), else TensorFlow's defaults. Without
  optimize_once, SimdMeshImpl inlines its replica program into the step once
  per device (`CollectiveBackend(optimize_once=False)`, the code before).
  Without direct_calls, it calls the optimised program with
  StatefulPartitionedCall (`CollectiveBackend(direct_calls=False)`). The
  step's input ids are [batch, length].
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow import placement_mesh_impl  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow.transformer import transformer  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow.transformer import transformer_layers  # pylint: disable=g-import-not-at-top

  mesh_shape = MESHES[num_devices]
  times = {"build": 0.0, "lower": 0.0, "traces": 0}

  def build(inputs):
    start = time.process_time()
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    loss, updates = _build(
      mtf, transformer, transformer_layers, mesh, inputs, layers
    )
    times["build"] += time.process_time() - start
    times["traces"] += 1
    return graph, mesh, loss, updates

  def lower(graph, mesh, mesh_impl, loss, updates):
    start = time.process_time()
    lowering = mtf.Lowering(graph, {mesh: mesh_impl})
    tf_loss = lowering.export_to_tf_tensor(loss)
    tf_updates = [lowering.lowered_operation(op) for op in updates]
    with tf.control_dependencies(tf_updates):
      tf_loss = tf.identity(tf_loss)
    times["lower"] += time.process_time() - start
    return tf_loss

  if impl_name == "placement":
    mesh_impl = placement_mesh_impl.PlacementMeshImpl(
      mesh_shape, LAYOUT, devices
    )
  else:
    from mesh_tensorflow import simd_mesh_impl  # pylint: disable=g-import-not-at-top

    backend = "collective"
    if not optimize_once or not direct_calls:
      from mesh_tensorflow._src.mesh_impls import simd_collective  # pylint: disable=g-import-not-at-top

      backend = simd_collective.CollectiveBackend(
        devices, optimize_once=optimize_once, direct_calls=direct_calls
      )
    mesh_impl = simd_mesh_impl.SimdMeshImpl(
      mesh_shape, LAYOUT, devices=devices, backend=backend
    )

  store = mtf.VariableStore() if hasattr(mtf, "VariableStore") else None
  start = time.process_time()
  wall_start = time.perf_counter()
  if tf_mode == "v1":
    tf_graph = tf.Graph()
    with tf_graph.as_default():
      inputs = tf.compat.v1.placeholder(tf.int32, [batch, length])
      graph, mesh, loss, updates = build(inputs)
      if impl_name == "placement":
        lower(graph, mesh, mesh_impl, loss, updates)
      else:
        mesh_impl.replicate(
          lambda: lower(graph, mesh, mesh_impl, loss, updates)
        )
    total = time.process_time() - start
    ops = _count_ops(tf_graph.as_graph_def())
  else:

    def tf2_step(inputs):
      graph, mesh, loss, updates = build(inputs)
      if impl_name == "placement":
        return lower(graph, mesh, mesh_impl, loss, updates)
      return mesh_impl.replicate(
        lambda: lower(graph, mesh, mesh_impl, loss, updates)
      )[0]

    fn = tf.function(tf2_step, autograph=False)
    spec = tf.TensorSpec([batch, length], tf.int32)
    if store is not None:
      with mtf.variable_store(store):
        concrete = fn.get_concrete_function(spec)
    else:
      concrete = fn.get_concrete_function(spec)
    total = time.process_time() - start
    ops = _count_ops(concrete.graph.as_graph_def())
  wall = time.perf_counter() - wall_start
  extra = {}
  if run and tf_mode != "v1":
    for name in ("first_step", "second_step"):
      step_start, cpu_start = time.perf_counter(), time.process_time()
      with _step_scope(driver_rewrites):
        concrete(tf.zeros([batch, length], tf.int32)).numpy()
      extra[name] = time.perf_counter() - step_start
      extra[name + "_cpu"] = time.process_time() - cpu_start
      if name == "first_step":
        extra["ready"] = time.perf_counter() - wall_start
  return dict(
    extra,
    build=times["build"],
    lower=times["lower"],
    trace=total - times["build"] - times["lower"],
    wall=wall,
    total=total,
    traces=times["traces"],
    ops=ops,
  )


def worker(args):
  """Measures every (impl, depth) of one device count; prints JSON lines."""
  devices = _configure_devices(args.worker)
  for impl_name in args.impls.split(","):
    for layers in [int(x) for x in args.layers.split(",")]:
      result = measure(
        impl_name,
        args.worker,
        layers,
        args.tf_mode,
        devices,
        args.run,
        args.driver_rewrites,
        not args.no_optimize_once,
        args.batch,
        args.length,
        not args.no_direct_calls,
      )
      result.update(
        impl=impl_name,
        devices=args.worker,
        layers=layers,
        batch=args.batch,
        length=args.length,
      )
      print("RESULT " + json.dumps(result), flush=True)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--devices", default="1,8,64")
  parser.add_argument("--layers", default="6,24")
  parser.add_argument("--impls", default="placement,simd")
  parser.add_argument("--tf_mode", default="tf2", choices=["tf2", "v1"])
  parser.add_argument(
    "--run", action="store_true", help="also run the first step (tf2)"
  )
  parser.add_argument(
    "--driver_rewrites",
    action="store_true",
    help="with --run: run the step with the driver's Grappler passes",
  )
  parser.add_argument(
    "--no_optimize_once",
    action="store_true",
    help="simd: inline the replica program once per device (as before)",
  )
  parser.add_argument(
    "--no_direct_calls",
    action="store_true",
    help="simd: call the optimised program with StatefulPartitionedCall",
  )
  parser.add_argument(
    "--batch", type=int, default=BATCH, help="batch size of the input ids"
  )
  parser.add_argument(
    "--length", type=int, default=LENGTH, help="length of the input ids"
  )
  parser.add_argument(
    "--worker", type=int, default=0, help="internal: one device count"
  )
  args = parser.parse_args(argv)
  if args.worker:
    worker(args)
    return
  results = []
  for n in [int(x) for x in args.devices.split(",")]:
    command = [
      sys.executable,
      os.path.abspath(__file__),
      "--worker=%d" % n,
      "--layers=" + args.layers,
      "--impls=" + args.impls,
      "--tf_mode=" + args.tf_mode,
      "--batch=%d" % args.batch,
      "--length=%d" % args.length,
    ]
    command += ["--run"] if args.run else []
    command += ["--driver_rewrites"] if args.driver_rewrites else []
    command += ["--no_optimize_once"] if args.no_optimize_once else []
    command += ["--no_direct_calls"] if args.no_direct_calls else []
    out = subprocess.run(
      command, check=True, stdout=subprocess.PIPE, text=True
    ).stdout
    for line in out.splitlines():
      if line.startswith("RESULT "):
        results.append(json.loads(line[len("RESULT ") :]))
        r = results[-1]
        print(
          "  measured %s %d devices %d layers: %.1f s (wall %.1f s%s)"
          % (
            r["impl"],
            r["devices"],
            r["layers"],
            r["total"],
            r["wall"],
            ", ready to run %.1f s" % r["ready"] if "ready" in r else "",
          ),
          flush=True,
        )
  print()
  print(
    "| impl | devices | layers | build s | lower s | trace s | total s "
    "| traces | TF ops | total / 1 device | wall s | first step s "
    "| second step s |"
  )
  print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
  base = {
    (r["impl"], r["layers"]): r["total"] for r in results if r["devices"] == 1
  }
  for r in results:
    one = base.get((r["impl"], r["layers"]))
    print(
      "| %s | %d | %d | %.2f | %.2f | %.2f | %.2f | %d | %d | %s | %.1f | %s "
      "| %s |"
      % (
        r["impl"],
        r["devices"],
        r["layers"],
        r["build"],
        r["lower"],
        r["trace"],
        r["total"],
        r["traces"],
        r["ops"],
        "%.2f" % (r["total"] / one) if one else "-",
        r["wall"],
        "%.1f" % r["first_step"] if "first_step" in r else "-",
        "%.1f" % r["second_step"] if "second_step" in r else "-",
      )
    )


if __name__ == "__main__":
  main()
