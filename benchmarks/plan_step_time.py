"""Benchmark: the planner's estimated step time against the measured one.

For each layout of benchmarks/transformer_step.py (the same decoder-only LM,
SGD training step, PlacementMeshImpl on 4 virtual CPUs), the planner
(mesh_tensorflow.plan.plan_graph) estimates the step time on the
"this_machine" profile, and the step is timed. Each round first measures the
machine (the profile's matmul, memory and op-overhead probe), then times one
step of every layout, so both see the same load; the table gives the medians
over rounds and the ratio estimated / measured. The communication bytes the
planner counts are checked against the counters of the real lowering.

Usage: python benchmarks/plan_step_time.py [--rounds 3] [--layers 6]
           [--batch 16] [--length 256]
       python benchmarks/plan_step_time.py --smoke   # tiny, a minute
"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import tensorflow as tf  # noqa: E402  pylint: disable=g-import-not-at-top
import transformer_step as ts  # noqa: E402  pylint: disable=g-import-not-at-top

import mesh_tensorflow as mtf  # noqa: E402  pylint: disable=g-import-not-at-top
from mesh_tensorflow import plan as mtf_plan  # noqa: E402  pylint: disable=g-import-not-at-top


def build_step(sizes, mesh_shape, layout):
  """(graph, mesh, loss) of the LM's training step, in the current graph."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  batch = mtf.Dimension("batch", sizes.batch)
  length = mtf.Dimension("length", sizes.length)
  model = ts.make_lm(sizes, mesh_shape, layout)
  ids = mtf.import_tf_tensor(
    mesh, tf.zeros([sizes.batch, sizes.length], tf.int32), [batch, length]
  )
  _, loss = model.call_simple(ids, ids, compute_loss=True, mode="train")
  variables = graph.trainable_variables
  grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
  mtf.optimize.SgdOptimizer(ts.LEARNING_RATE).apply_grads(grads, variables)
  return graph, mesh, loss


def plan_config(sizes, mesh_shape, layout):
  """The plan of one layout, built shape-only."""
  with tf.Graph().as_default():
    with mtf.variable_store(mtf.VariableStore()):
      graph, _, loss = build_step(sizes, mesh_shape, layout)
      return mtf_plan.plan_graph(graph, mesh_shape, layout, exported=[loss])


def lowering_collective_bytes(sizes, mesh_shape, layout):
  """The real lowering's collective byte counters (PlacementMeshImpl)."""
  n = mtf.convert_to_shape(mesh_shape).size
  mesh_impl = ts.placement_mesh_impl.PlacementMeshImpl(
    mesh_shape, layout, ts.DEVICES[:n]
  )
  with tf.Graph().as_default():
    with mtf.variable_store(mtf.VariableStore()):
      graph, mesh, loss = build_step(sizes, mesh_shape, layout)
      lowering = mtf.Lowering(graph, {mesh: mesh_impl})
      lowering.export_to_tf_tensor(loss)
  return lowering.collective_bytes()


def main(argv):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--smoke", action="store_true")
  for name in ("layers", "batch", "length"):
    parser.add_argument("--" + name, type=int, default=None)
  args = parser.parse_args(argv)
  size = dict(ts.SMOKE_SIZE if args.smoke else ts.FULL_SIZE)
  for name in ("layers", "batch", "length"):
    if getattr(args, name) is not None:
      size[name] = getattr(args, name)
  sizes = ts.Sizes(**size)
  configs = ts.CONFIGS
  print("sizes: %s" % size)
  plans = {}
  for name, mesh_shape, layout in configs:
    plans[name] = plan_config(sizes, mesh_shape, layout)
    counted = lowering_collective_bytes(sizes, mesh_shape, layout)
    same = counted == plans[name].collective_total_bytes
    print(
      "%-8s planned collective bytes %s; lowering counters %s"
      % (name, plans[name].collective_total_bytes, "equal" if same else counted)
    )
    if not same:
      raise SystemExit("planner and lowering disagree for %s" % name)
  values = ts.reference_values(sizes)
  models = {
    name: ts.MtfLM(sizes, mesh_shape, layout, values)
    for name, mesh_shape, layout in configs
  }
  inputs, targets = ts.make_batch(sizes)
  for model in models.values():  # Trace and warm up.
    model.step(inputs, targets).numpy()
  measured = {name: [] for name, _, _ in configs}
  estimated = {name: [] for name, _, _ in configs}
  loads = []
  for _ in range(args.rounds):
    profile = mtf_plan.measure_this_machine()
    loads.append(os.getloadavg()[0])
    for name, _, _ in configs:
      start = time.perf_counter()
      models[name].step(inputs, targets).numpy()
      measured[name].append(time.perf_counter() - start)
      estimated[name].append(plans[name].step_time(profile).total)
  print(
    "machine: %d CPUs, load average %s during the rounds; last probe: "
    "float32 matmul %.1f GFLOP/s, memory %.1f GB/s, op overhead %.1f us"
    % (
      os.cpu_count(),
      ", ".join("%.1f" % x for x in loads),
      profile.peak_flops_f32 / 1e9,
      profile.hbm_bandwidth / 1e9,
      profile.op_overhead_seconds * 1e6,
    )
  )
  print(
    "%-8s %12s %12s %12s %12s %8s"
    % (
      "config",
      "GFLOP/dev",
      "comm MiB/dev",
      "estimated s",
      "measured s",
      "est/meas",
    )
  )
  for name, _, _ in configs:
    plan = plans[name]
    est = statistics.median(estimated[name])
    meas = statistics.median(measured[name])
    print(
      "%-8s %12.2f %12.2f %12.3f %12.3f %8.2f"
      % (
        name,
        plan.flops / 1e9,
        plan.communication_bytes / 2**20,
        est,
        meas,
        est / meas,
      )
    )


if __name__ == "__main__":
  main(sys.argv[1:])
