"""Benchmark: the driver's training step on PlacementMeshImpl and on SIMD.

The transformer driver (`transformer/_src/driver`, `Estimator.train`) trains
the decoder-only LM of benchmarks/transformer_step.py (gin defaults, 6
layers, d_model 512, d_ff 2048, 8 heads of d_kv 64, vocabulary 8192, length
256, batch 16, float32, Adafactor, dropout 0) on one mesh and layout,

  mesh "rows:2;cols:2", layout "batch:rows;heads:cols;d_ff:cols;vocab:cols"

over 4 virtual CPUs, once with `mesh_impl="placement"` and once with
`mesh_impl="simd"` (SimdMeshImpl, collective backend), in one process. The
input is a `tf.data` generator that stamps the time at which the driver asks
for each batch, so the figures are the driver's own:

  build       from the train() call to the first batch asked for: building,
              lowering and tracing the step (and creating the variables)
  first step  the first step's run (TensorFlow's graph optimisation and
              placement happen there)
  step        median over the rounds of the later steps

The two estimators take turns for several rounds (each round a few steps of
each), so both see the same machine load; the SIMD/placement ratios are
printed with the figures. The machine may be shared: ratios measured in one
run are the figures to compare, not absolute times across runs.

Usage: python benchmarks/driver_mesh_impl.py [--rounds 3] [--steps 3]
           [--layers 6] [--batch 16] [--length 256]
       python benchmarks/driver_mesh_impl.py --smoke   # tiny, a minute
"""

import argparse
import os
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import logging as absl_logging  # pylint: disable=g-import-not-at-top
import gin  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top

DEVICES = mtf.utils.configure_virtual_cpus(4)

from transformer import utils  # pylint: disable=g-import-not-at-top
from transformer._src.driver import estimator as driver  # pylint: disable=g-import-not-at-top

MESH = "rows:2;cols:2"
LAYOUT = "batch:rows;heads:cols;d_ff:cols;vocab:cols"
IMPLS = ("placement", "simd")


def _configure(args) -> None:
  gin.clear_config()
  gin.parse_config_files_and_bindings(
    [os.path.join(utils.config_dir(), "defaults.gin")],
    """
num_layers = %d
d_model = %d
d_ff = %d
num_heads = %d
d_kv = %d
dropout_rate = 0.0
transformer.Unitransformer.max_length = %d
"""
    % (
      args.layers,
      args.d_model,
      args.d_ff,
      args.heads,
      args.d_kv,
      args.length,
    ),
    finalize_config=False,
  )


class _StampedInput:
  """An input_fn of random token batches that stamps when each is asked for."""

  def __init__(self, args, seed: int):
    self._args = args
    self._rng = np.random.RandomState(seed)
    self.stamps = []

  def _batches(self):
    args = self._args
    while True:
      self.stamps.append((time.perf_counter(), time.process_time()))
      ids = self._rng.randint(2, args.vocab, size=(args.batch, args.length))
      yield {"targets": ids.astype(np.int32)}

  def __call__(self) -> tf.data.Dataset:
    args = self._args
    spec = {"targets": tf.TensorSpec([args.batch, args.length], tf.int32)}
    dataset = tf.data.Dataset.from_generator(
      self._batches, output_signature=spec
    )
    options = tf.data.Options()
    # No batch is made ahead of the driver's request.
    options.autotune.enabled = False
    options.experimental_optimization.inject_prefetch = False
    return dataset.with_options(options)


def _estimator(args, mesh_impl: str, model_dir: str) -> driver.Estimator:
  _configure(args)
  model = utils.build_model(
    "lm",
    input_vocab_size=args.vocab,
    output_vocab_size=args.vocab,
    layout_rules=LAYOUT,
    mesh_shape=MESH,
  )
  return driver.Estimator(
    "lm",
    model,
    None,
    model_dir,
    MESH,
    LAYOUT,
    args.batch,
    args.length,
    save_checkpoints_steps=0,
    log_every_steps=10**6,
    variable_dtype=utils.get_variable_dtype(
      master_dtype="float32", activation_dtype="float32"
    ),
    mesh_impl=mesh_impl,
  )


def _train(est, input_fn: _StampedInput, steps: int):
  """Runs `steps` more steps.

  Returns:
    (wall, CPU) seconds to the first batch, and the [wall, CPU] seconds of
    each step but the last (a step ends when the next batch is asked for).
  """
  input_fn.stamps.clear()
  start = np.array([time.perf_counter(), time.process_time()])
  est.train(input_fn, int(est.global_step.numpy()) + steps)
  stamps = np.array(input_fn.stamps[:steps])
  return stamps[0] - start, list(np.diff(stamps, axis=0))


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--steps", type=int, default=3, help="steps per round")
  parser.add_argument("--layers", type=int, default=6)
  parser.add_argument("--batch", type=int, default=16)
  parser.add_argument("--length", type=int, default=256)
  parser.add_argument("--smoke", action="store_true", help="a tiny model")
  args = parser.parse_args(argv)
  args.d_model, args.d_ff, args.heads, args.d_kv, args.vocab = (
    512,
    2048,
    8,
    64,
    8192,
  )
  if args.smoke:
    args.layers, args.batch, args.length, args.rounds = 2, 8, 16, 2
    args.d_model, args.d_ff, args.heads, args.d_kv, args.vocab = (
      32,
      64,
      4,
      8,
      256,
    )
  absl_logging.set_verbosity(absl_logging.WARNING)
  tmp = tempfile.mkdtemp(prefix="driver_mesh_impl_")
  estimators, inputs, figures = {}, {}, {}
  for i, name in enumerate(IMPLS):
    tf.random.set_seed(1)
    estimators[name] = _estimator(args, name, os.path.join(tmp, name))
    inputs[name] = _StampedInput(args, seed=i)
    # Build, then the first step and one more (the second step's end is
    # when the driver asks for a third batch).
    build, steps = _train(estimators[name], inputs[name], 3)
    figures[name] = {"build": build, "first": steps[0], "steps": steps[1:]}
    print(
      "%-9s build %.1f s (CPU %.1f s), first step %.2f s (CPU %.2f s)"
      % (name, build[0], build[1], steps[0][0], steps[0][1]),
      flush=True,
    )
  for r in range(args.rounds):
    for name in IMPLS:
      _, steps = _train(estimators[name], inputs[name], args.steps + 1)
      figures[name]["steps"].extend(steps)
    print("round %d done" % (r + 1), flush=True)
  print()
  print(
    "%d layers, batch %d, length %d, mesh %s, layout %s; load average %s"
    % (
      args.layers,
      args.batch,
      args.length,
      MESH,
      LAYOUT,
      " ".join("%.1f" % x for x in os.getloadavg()),
    )
  )
  print("wall seconds (CPU seconds of the process in parentheses):")
  print("| | build | first step | step (median) |")
  print("|---|---|---|---|")
  for name in IMPLS:
    f = figures[name]
    f["step"] = np.median(np.array(f["steps"]), axis=0)
    print(
      "| %s | %.1f (%.1f) | %.2f (%.2f) | %.3f (%.3f) |"
      % (name, *f["build"], *f["first"], *f["step"])
    )
  p, s = figures["placement"], figures["simd"]
  print(
    "| simd / placement | %.2f (%.2f) | %.2f (%.2f) | %.2f (%.2f) |"
    % (
      *(s["build"] / p["build"]),
      *(s["first"] / p["first"]),
      *(s["step"] / p["step"]),
    )
  )
  print("(%d step samples each)" % len(p["steps"]))


if __name__ == "__main__":
  main()
