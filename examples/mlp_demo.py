"""Trains a small MLP with data + model parallelism on a 2x2 virtual-CPU mesh.

The student is a 3-layer relu MLP (64 -> 256 -> 256 -> 16); it learns to imitate
a fixed random "teacher" network on synthetic inputs generated in-process. The
mesh is "rows:2;cols:2" with layout "batch:rows;hidden:cols": the batch is
split over rows (data parallel) and the hidden units over columns (model
parallel, Megatron style: the first layer's weights are split by output
column, the second by input row, whose partial sums are allreduced).

Each training step (build the mtf graph, lower it, SGD update) is one
tf.function; the variables live in an mtf.VariableStore created outside it.

Usage: python examples/mlp_demo.py [--steps 1000] [--learning_rate 0.1]
Exits with status 1 if the loss did not fall at least 2x.
"""

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top
from mesh_tensorflow import placement_mesh_impl  # pylint: disable=g-import-not-at-top

# Four virtual CPUs; this must happen before TensorFlow initialises.
DEVICES = mtf.utils.configure_virtual_cpus(4)

MESH_SHAPE = "rows:2;cols:2"
LAYOUT = "batch:rows;hidden:cols"

BATCH = mtf.Dimension("batch", 128)
D_IN = mtf.Dimension("d_in", 64)
HIDDEN = mtf.Dimension("hidden", 256)
D_MODEL = mtf.Dimension("d_model", 256)
D_OUT = mtf.Dimension("d_out", 16)


def teacher_data(num_examples, seed=0):
  """Inputs x ~ N(0, 1) and the outputs of a random 2-layer tanh network."""
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((num_examples, D_IN.size)).astype(np.float32)
  a = rng.standard_normal((D_IN.size, 32)) / np.sqrt(D_IN.size)
  b = rng.standard_normal((32, D_OUT.size)) / np.sqrt(32)
  y = (np.tanh(2.0 * x @ a) @ b).astype(np.float32)
  return x, y


def dense(x, name, in_dim, out_dim, activation=True):
  w = mtf.get_variable(
    x.mesh,
    name,
    [in_dim, out_dim],
    initializer=tf.random_normal_initializer(stddev=in_dim.size**-0.5),
  )
  b = mtf.get_variable(
    x.mesh, name + "_bias", [out_dim], initializer=tf.zeros_initializer()
  )
  y = mtf.einsum([x, w], output_shape=[BATCH, out_dim]) + b
  return mtf.relu(y) if activation else y


def make_train_step(learning_rate):
  """A tf.function (x, y) -> loss that also applies one SGD update."""
  mesh_impl = placement_mesh_impl.PlacementMeshImpl(MESH_SHAPE, LAYOUT, DEVICES)
  store = mtf.VariableStore()  # Outside the tf.function: variables persist.

  @tf.function(autograph=False)
  def train_step(x, y):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    with mtf.variable_store(store):
      h = mtf.import_tf_tensor(mesh, x, [BATCH, D_IN])
      target = mtf.import_tf_tensor(mesh, y, [BATCH, D_OUT])
      h = dense(h, "layer_0", D_IN, HIDDEN)  # split by output (hidden)
      h = dense(h, "layer_1", HIDDEN, D_MODEL)  # contracts hidden: allreduce
      h = dense(h, "layer_2", D_MODEL, D_OUT, activation=False)
      loss = mtf.reduce_mean(mtf.square(h - target))
      variables = graph.trainable_variables
      grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
      for v, g in zip(variables, grads):
        mtf.assign_sub(v, g * learning_rate)
    lowering = mtf.Lowering(graph, {mesh: mesh_impl})
    return lowering.export_to_tf_tensor(loss)

  return train_step


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--steps", type=int, default=1000)
  parser.add_argument("--learning_rate", type=float, default=0.1)
  parser.add_argument("--print_every", type=int, default=100)
  args = parser.parse_args()

  start = time.perf_counter()
  tf.random.set_seed(1)  # Reproducible initial weights.
  x_all, y_all = teacher_data(64 * BATCH.size)
  num_batches = x_all.shape[0] // BATCH.size
  train_step = make_train_step(args.learning_rate)
  first_loss = loss = None
  last_time, last_step = time.perf_counter(), 0
  for step in range(1, args.steps + 1):
    i = (step - 1) % num_batches * BATCH.size
    loss = float(
      train_step(
        tf.constant(x_all[i : i + BATCH.size]),
        tf.constant(y_all[i : i + BATCH.size]),
      )
    )
    if first_loss is None:
      first_loss = loss
      print(
        "step    1  loss %.5f  (tracing + first step: %.1f s)"
        % (loss, time.perf_counter() - start)
      )
      last_time, last_step = time.perf_counter(), 1
    if step % args.print_every == 0 or step == args.steps:
      now = time.perf_counter()
      print(
        "step %4d  loss %.5f  %6.1f steps/s"
        % (step, loss, (step - last_step) / (now - last_time))
      )
      last_time, last_step = now, step
  ratio = first_loss / loss
  print(
    "first loss %.5f, final loss %.5f, ratio %.1fx; wall time %.1f s"
    % (first_loss, loss, ratio, time.perf_counter() - start)
  )
  if not ratio >= 2.0:
    print("FAILED: the loss did not fall by at least 2x")
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
