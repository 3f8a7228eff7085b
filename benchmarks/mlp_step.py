"""Benchmark: one SGD step of an MLP, plain TF2 versus mtf on several layouts.

The model is 4 dense layers that alternate 1024 -> 4096 -> 1024 -> 4096 -> 1024
(d_model=1024, hidden=4096), relu after every layer but the last, a
mean-squared-error loss against a fixed random target, batch 256, float32 and
plain SGD (w -= lr * grad). The configurations are

  tf        plain TF2 (tf.Variable + GradientTape) in one tf.function
  tf_dp4    reference: plain TF2 with the batch split over 4 devices by hand
  mtf_1     mtf on a 1-processor mesh
  mtf_dp4   mesh "all:4", layout "batch:all"         (4-way data parallel)
  mtf_mp4   mesh "all:4", layout "hidden:all"        (4-way model parallel)
  mtf_2x2   mesh "rows:2;cols:2", "batch:rows;hidden:cols"
  simd_dp4, simd_mp4, simd_2x2: the same meshes and layouts on SimdMeshImpl
            (collective backend: one replica program per virtual CPU, TF
            collective ops, run with mesh_impl.replicate)

all in one process on 8 virtual CPUs, each step one compiled tf.function. All
start from the same weights; the first (warm-up) step checks that their losses
agree. Then the configurations run round-robin for several rounds and the
table gives each one's median step time and its ratio to plain TF. The
virtual CPUs share the machine's cores, so parallel layouts cannot be faster
than one device: the ratio measures mtf's overhead plus the cost of the
smaller per-device matmuls, which tf_dp4 shows without mtf.

Usage: python benchmarks/mlp_step.py [--rounds 10] [--steps_per_round 3]
           [--intra_op_threads N] [--inter_op_threads N] [--only mtf_1,...]
"""

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top
from mesh_tensorflow import placement_mesh_impl  # pylint: disable=g-import-not-at-top
from mesh_tensorflow import simd_mesh_impl  # pylint: disable=g-import-not-at-top

NUM_VIRTUAL_CPUS = 8
DEVICES = mtf.utils.configure_virtual_cpus(NUM_VIRTUAL_CPUS)

BATCH, D_MODEL, HIDDEN = 256, 1024, 4096
LEARNING_RATE = 0.01

CONFIGS = [  # name, mesh shape, layout
  ("mtf_1", "", ""),
  ("mtf_dp4", "all:4", "batch:all"),
  ("mtf_mp4", "all:4", "hidden:all"),
  ("mtf_2x2", "rows:2;cols:2", "batch:rows;hidden:cols"),
  ("simd_dp4", "all:4", "batch:all"),
  ("simd_mp4", "all:4", "hidden:all"),
  ("simd_2x2", "rows:2;cols:2", "batch:rows;hidden:cols"),
]


def layer_sizes():
  return [
    (D_MODEL, HIDDEN),
    (HIDDEN, D_MODEL),
    (D_MODEL, HIDDEN),
    (HIDDEN, D_MODEL),
  ]


def make_weights_and_data(seed=0):
  rng = np.random.default_rng(seed)
  weights = [
    (rng.standard_normal(s) / np.sqrt(s[0])).astype(np.float32)
    for s in layer_sizes()
  ]
  x = rng.standard_normal((BATCH, D_MODEL)).astype(np.float32)
  y = rng.standard_normal((BATCH, D_MODEL)).astype(np.float32)
  return weights, x, y


class PlainTF:
  """The reference: tf.Variables, GradientTape, assign_sub."""

  def __init__(self, weights):
    self.ws = [tf.Variable(w) for w in weights]
    self.step = tf.function(self._step, autograph=False)

  def _step(self, x, y):
    with tf.GradientTape() as tape:
      h = x
      for i, w in enumerate(self.ws):
        h = tf.matmul(h, w)
        if i < len(self.ws) - 1:
          h = tf.nn.relu(h)
      loss = tf.reduce_mean(tf.square(h - y))
    grads = tape.gradient(loss, self.ws)
    for w, g in zip(self.ws, grads):
      w.assign_sub(LEARNING_RATE * g)
    return loss


class PlainTFDataParallel(PlainTF):
  """Reference for mtf_dp4: plain TF, batch split over devices by hand.

  Each device runs forward and backward on its quarter of the batch with the
  shared weights; the gradients are summed with add_n and applied once.
  """

  def __init__(self, weights, num_devices):
    super().__init__(weights)
    self.num_devices = num_devices

  def _step(self, x, y):
    n = self.num_devices
    losses, grads = [], []
    for device, xi, yi in zip(DEVICES, tf.split(x, n), tf.split(y, n)):
      with tf.device(device), tf.GradientTape() as tape:
        h = xi
        for i, w in enumerate(self.ws):
          h = tf.matmul(h, w)
          if i < len(self.ws) - 1:
            h = tf.nn.relu(h)
        losses.append(tf.reduce_mean(tf.square(h - yi)) / n)
      grads.append(tape.gradient(losses[-1], self.ws))
    for w, gs in zip(self.ws, zip(*grads)):
      w.assign_sub(LEARNING_RATE * tf.add_n(list(gs)))
    return tf.add_n(losses)


class MtfMLP:
  """The same step in mtf; the graph is built and lowered in the tf.function."""

  def __init__(self, mesh_shape, layout, weights, simd=False):
    n = mtf.convert_to_shape(mesh_shape).size
    if simd:
      self.mesh_impl = simd_mesh_impl.SimdMeshImpl(
        mesh_shape, layout, devices=DEVICES[:n]
      )
    else:
      self.mesh_impl = placement_mesh_impl.PlacementMeshImpl(
        mesh_shape, layout, DEVICES[:n]
      )
    self.simd = simd
    self.store = mtf.VariableStore()
    self.weights = weights
    self.step = tf.function(
      self._replicated_step if simd else self._step, autograph=False
    )

  def _replicated_step(self, x, y):
    """SIMD: the step is one replica's program, run on every processor."""
    return self.mesh_impl.replicate(self._step, x, y)[0]

  def _step(self, x, y):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    batch = mtf.Dimension("batch", BATCH)
    dims = {
      D_MODEL: mtf.Dimension("d_model", D_MODEL),
      HIDDEN: mtf.Dimension("hidden", HIDDEN),
    }
    with mtf.variable_store(self.store):
      h = mtf.import_tf_tensor(mesh, x, [batch, dims[D_MODEL]])
      target = mtf.import_tf_tensor(mesh, y, [batch, dims[D_MODEL]])
      for i, ((d_in, d_out), w0) in enumerate(zip(layer_sizes(), self.weights)):
        w = mtf.get_variable(
          mesh, "w%d" % i, [dims[d_in], dims[d_out]], initializer=w0
        )
        h = mtf.einsum([h, w], output_shape=[batch, dims[d_out]])
        if i < len(self.weights) - 1:
          h = mtf.relu(h)
      loss = mtf.reduce_mean(mtf.square(h - target))
      variables = graph.trainable_variables
      grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
      for v, g in zip(variables, grads):
        mtf.assign_sub(v, g * LEARNING_RATE)
    lowering = mtf.Lowering(graph, {mesh: self.mesh_impl})
    return lowering.export_to_tf_tensor(loss)


def time_steps(step, x, y, n):
  """(wall seconds, process CPU seconds) per step, averaged over n steps."""
  start, start_cpu = time.perf_counter(), time.process_time()
  for _ in range(n):
    loss = step(x, y)
  loss.numpy()  # Waits for the last step.
  return (
    (time.perf_counter() - start) / n,
    (time.process_time() - start_cpu) / n,
  )


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--rounds", type=int, default=10)
  parser.add_argument("--steps_per_round", type=int, default=3)
  parser.add_argument(
    "--intra_op_threads", type=int, default=0, help="0: TensorFlow's default"
  )
  parser.add_argument(
    "--inter_op_threads", type=int, default=0, help="0: TensorFlow's default"
  )
  parser.add_argument(
    "--only", default="", help="comma-separated config names (default: all)"
  )
  args = parser.parse_args()
  if args.intra_op_threads:
    tf.config.threading.set_intra_op_parallelism_threads(args.intra_op_threads)
  if args.inter_op_threads:
    tf.config.threading.set_inter_op_parallelism_threads(args.inter_op_threads)

  weights, x_np, y_np = make_weights_and_data()
  x, y = tf.constant(x_np), tf.constant(y_np)
  models = {"tf": PlainTF(weights), "tf_dp4": PlainTFDataParallel(weights, 4)}
  for name, mesh_shape, layout in CONFIGS:
    models[name] = MtfMLP(
      mesh_shape, layout, weights, simd=name.startswith("simd")
    )
  if args.only:
    keep = set(args.only.split(",")) | {"tf"}
    models = {k: v for k, v in models.items() if k in keep}

  # Warm-up (tracing) step from identical weights: the losses must agree.
  first_loss = {}
  for name, model in models.items():
    start = time.perf_counter()
    first_loss[name] = float(model.step(x, y))
    print(
      "%-8s first step (trace + run) %6.2f s, loss %.6f"
      % (name, time.perf_counter() - start, first_loss[name])
    )
  ref = first_loss["tf"]
  max_rel = max(abs(v - ref) / abs(ref) for v in first_loss.values())
  print("max relative difference of first-step losses vs tf: %.2e" % max_rel)
  for model in models.values():  # A second untimed step each.
    model.step(x, y).numpy()

  times = {name: [] for name in models}
  cpu_times = {name: [] for name in models}
  for _ in range(args.rounds):
    for name, model in models.items():
      wall, cpu = time_steps(model.step, x, y, args.steps_per_round)
      times[name].append(wall)
      cpu_times[name].append(cpu)

  print()
  print(
    "%-8s %14s %8s %14s %8s"
    % ("config", "median step ms", "vs tf", "median cpu ms", "vs tf")
  )
  base = statistics.median(times["tf"])
  base_cpu = statistics.median(cpu_times["tf"])
  worst = 0.0
  for name in models:
    median = statistics.median(times[name])
    median_cpu = statistics.median(cpu_times[name])
    if name.startswith("mtf") or name.startswith("simd"):
      worst = max(worst, median / base)
    print(
      "%-8s %14.1f %8.3f %14.1f %8.3f"
      % (
        name,
        1e3 * median,
        median / base,
        1e3 * median_cpu,
        median_cpu / base_cpu,
      )
    )
  print(
    "worst mtf ratio: %.3f (rounds=%d, steps per round=%d)"
    % (worst, args.rounds, args.steps_per_round)
  )
  if "mtf_dp4" in times and "tf_dp4" in times:
    print(
      "mtf_dp4 / tf_dp4 (same split, by hand): %.3f"
      % (
        statistics.median(times["mtf_dp4"]) / statistics.median(times["tf_dp4"])
      )
    )
  if max_rel > 1e-4:
    print("ERROR: losses disagree")
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
