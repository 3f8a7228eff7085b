"""Benchmark: scoring and decoding at 1 and at N batches per host call.

The driver's scoring (`evaluation.score_ids`, the teacher-forced program)
and greedy decoding (`evaluation.decode_ids`) of a small Bitransformer
(1+1 layers, d_model 64, vocabulary 64, length 16, batch 8, float32) over
--batches batches, on mesh "all:2" (heads, d_ff and vocab split) of 2
virtual CPUs, with:

  placement   PlacementMeshImpl: N batches per call run in a host
              tf.while_loop (the loop of the TPU path, here on CPU)
  simd        SimdMeshImpl, collective backend: the N batches of a call are
              unrolled (its collectives cannot run in a while loop)

each at 1 batch per host call (the one-batch phases) and at --per_call
batches per call (evaluation.batch_loop_graph). Every variant runs once to
trace and warm up, then --rounds timed rounds, the variants taking turns so
they share the machine's load; the figure is the median batches/s. The
outputs of each variant are checked against placement at 1 batch per call
(scores to 1e-5, decodes equal).

On a TPU a host call also pays the host-to-TPU round trip and its infeed,
which batching calls amortises; on CPU a call costs only the tf.function
dispatch and the copies of its inputs and outputs, so these figures show
what the loop costs or saves on CPU, not TPU speed-ups.

Usage: python benchmarks/batches_per_call.py [--batches 12] [--per_call 4]
           [--rounds 3]
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

DEVICES = mtf.utils.configure_virtual_cpus(2)

from transformer import utils  # pylint: disable=g-import-not-at-top
from transformer._src.driver import estimator as driver  # pylint: disable=g-import-not-at-top
from transformer._src.driver import evaluation  # pylint: disable=g-import-not-at-top

MESH = ("all:2", "heads:all,d_ff:all,vocab:all")
VOCAB, LENGTH, BATCH = 64, 16, 8


def _estimator(model_dir: str, mesh_impl: str) -> driver.Estimator:
  gin.clear_config()
  gin.parse_config_files_and_bindings(
    [os.path.join(utils.config_dir(), "defaults.gin")],
    "num_layers = 1\nd_model = 64\nd_ff = 128\nnum_heads = 4\nd_kv = 16\n"
    "dropout_rate = 0.0\n",
    finalize_config=False,
  )
  model = utils.build_model(
    "bitransformer",
    input_vocab_size=VOCAB,
    output_vocab_size=VOCAB,
    layout_rules=MESH[1],
    mesh_shape=MESH[0],
  )
  return driver.Estimator(
    "bitransformer",
    model,
    None,
    model_dir,
    MESH[0],
    MESH[1],
    BATCH,
    LENGTH,
    variable_dtype=utils.get_variable_dtype(
      master_dtype="float32", activation_dtype="float32"
    ),
    mesh_impl=mesh_impl,
    mesh_devices=DEVICES,
  )


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--batches", type=int, default=12)
  parser.add_argument("--per_call", type=int, default=4)
  parser.add_argument("--rounds", type=int, default=3)
  args = parser.parse_args()
  absl_logging.set_verbosity(absl_logging.WARNING)
  model_dir = tempfile.mkdtemp()
  rng = np.random.RandomState(0)
  n = args.batches * BATCH
  inputs = rng.randint(2, VOCAB, size=(n, LENGTH)).astype(np.int32)
  targets = rng.randint(2, VOCAB, size=(n, LENGTH)).astype(np.int32)
  # The initial weights (a step-0 checkpoint every variant restores).
  start = _estimator(model_dir, "placement")
  start.train(
    lambda: tf.data.Dataset.from_tensors(
      {"inputs": inputs[:BATCH], "targets": targets[:BATCH]}
    ).repeat(),
    0,
  )
  start.save()
  variants = {}
  for impl in ("placement", "simd"):
    for per_call in (1, args.per_call):
      est = _estimator(model_dir, impl)
      est.batches_per_call = per_call
      variants["%s, %d per call" % (impl, per_call)] = est
  programs = {
    "score": lambda est: evaluation.score_ids(est, inputs, targets),
    "decode": lambda est: np.stack(evaluation.decode_ids(est, inputs)),
  }
  reference = {}
  times = {(v, p): [] for v in variants for p in programs}
  for est in variants.values():  # trace, warm up, check
    for program, run in programs.items():
      out = run(est)
      want = reference.setdefault(program, out)
      if program == "score":
        np.testing.assert_allclose(out, want, rtol=1e-5)
      else:
        np.testing.assert_array_equal(out, want)
  for _ in range(args.rounds):
    for name, est in variants.items():
      for program, run in programs.items():
        begin = time.perf_counter()
        run(est)
        times[(name, program)].append(time.perf_counter() - begin)
  print(
    "%d batches of %d x %d, mesh %s, median of %d rounds; outputs equal to "
    "placement's at 1 per call"
    % (args.batches, BATCH, LENGTH, MESH[0], args.rounds)
  )
  print("| variant | host calls | score batches/s | decode batches/s |")
  print("|---|---:|---:|---:|")
  for name, est in variants.items():
    calls = -(-args.batches // est.batches_per_call)
    rates = [
      args.batches / float(np.median(times[(name, program)]))
      for program in programs
    ]
    print("| %s | %d | %.1f | %.1f |" % ((name, calls) + tuple(rates)))


if __name__ == "__main__":
  main()
