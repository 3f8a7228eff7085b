"""Trains a small Bitransformer to reverse strings on a 2x2 virtual-CPU mesh.

The task ("mtf_reverse") is generated locally by a TFDS builder: inputs are
random strings of 4-12 letters, targets the same strings reversed. The model
(configs/demo/reverse.gin: 2+2 layers, d_model 128, 4 heads, byte
vocabulary) is split over a "rows:2;cols:2" mesh of virtual CPUs: the batch
over rows (data parallel), heads / d_ff / vocab over cols (model parallel).

Training runs in rounds; after each, exact-match accuracy on the 1000
held-out validation strings is measured (teacher forced) and training stops
at --target_accuracy. Then a few validation strings are decoded greedily,
a SavedModel is exported, and the locations of the checkpoints, TensorBoard
logs and SavedModel are printed.

Usage: python examples/transformer_demo.py [--model_dir DIR] [--max_steps N]
Exits with status 1 if the target accuracy was not reached.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Read when `transformer` is first imported (transformer/_src/quiet.py):
# TensorFlow is imported without its C++ start-up lines unless -v/--verbosity
# or MTF_VERBOSE=1 asks for them.
MTF_QUIET_STARTUP = True

from transformer._src import quiet  # pylint: disable=g-import-not-at-top

# isort: split
import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top

# Four virtual CPUs; this must happen before TensorFlow initialises.
mtf.utils.configure_virtual_cpus(4)

from transformer import dataset as dataset_lib  # pylint: disable=g-import-not-at-top
from transformer import utils  # pylint: disable=g-import-not-at-top
from transformer._src.data.offline import reverse  # pylint: disable=g-import-not-at-top


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--model_dir", default="/tmp/mtf_demo/model")
  parser.add_argument("--tfds_data_dir", default="/tmp/mtf_demo/tfds")
  parser.add_argument("--max_steps", type=int, default=3000)
  parser.add_argument("--eval_every", type=int, default=500)
  parser.add_argument("--target_accuracy", type=float, default=0.98)
  parser.add_argument("--gin_param", action="append", default=[])
  parser.add_argument(
    "-v",
    "--verbosity",
    type=int,
    default=-1,
    help="0 or more: also TensorFlow, TFDS and absl logs",
  )
  args = parser.parse_args()
  quiet.quiet_libraries(verbose=quiet.verbose_requested())
  start = time.perf_counter()

  utils.parse_gin_defaults_and_flags(
    gin_files=["demo/reverse.gin"],
    gin_params=[
      "dataset.untokenized_tfds_dataset.tfds_data_dir = %r" % args.tfds_data_dir
    ]
    + args.gin_param,
  )
  state = {}

  def train_and_evaluate(
    estimator,
    vocabulary,
    sequence_length,
    batch_size,
    train_dataset_fn,
    train_steps,
    ensemble_inputs,
    **kwargs,
  ):
    """run.train_model_fn: train in rounds, evaluate exact match after each."""
    del kwargs

    def validation():
      return dataset_lib.untokenized_tfds_dataset(
        sequence_length=sequence_length,
        vocabulary=vocabulary,
        dataset_split="validation",
        pack=False,
      )

    step = 0
    max_steps = min(args.max_steps, train_steps)
    while step < max_steps:
      target = min(step + args.eval_every, max_steps)
      result = utils.train_model(
        estimator,
        vocabulary,
        sequence_length,
        batch_size,
        train_dataset_fn,
        target,
        ensemble_inputs,
      )
      step = result.get("step", target)
      metrics = utils.evaluate_dataset(
        estimator, validation(), estimator.sequence_length, batch_size
      )
      state["accuracy"] = metrics["sequence_accuracy"]
      print(
        "step %d: validation loss %.4f, cross-entropy per token %.4f, "
        "token accuracy %.4f, exact match %.4f (%.0f s)"
        % (
          step,
          metrics["loss"],
          -metrics["neg_log_perplexity"],
          metrics["token_accuracy"],
          state["accuracy"],
          time.perf_counter() - start,
        ),
        flush=True,
      )
      if state["accuracy"] >= args.target_accuracy:
        break
    state["estimator"] = estimator
    state["vocabulary"] = vocabulary
    state["sequence_length"] = sequence_length

  utils.run(
    tpu_job_name=None,
    tpu=None,
    gcp_project=None,
    tpu_zone=None,
    model_dir=args.model_dir,
    train_model_fn=train_and_evaluate,
  )
  estimator = state["estimator"]
  accuracy = state["accuracy"]
  examples = reverse.reverse_examples("validation")[:8]
  decoded = utils.decode_strings(estimator, [x for x, _ in examples])
  print("\nGreedy decodes of held-out strings:")
  for (x, y), d in zip(examples, decoded):
    print("  %-14s -> %-14s %s" % (x, d, "ok" if d == y else "WRONG (%s)" % y))
  export_path = utils.export_model(
    estimator,
    os.path.join(args.model_dir, "export"),
    state["vocabulary"],
    state["sequence_length"],
    "bitransformer",
    batch_size=8,
  )
  print("\nCheckpoints:      %s" % estimator.latest_checkpoint())
  print("TensorBoard logs: tensorboard --logdir %s" % args.model_dir)
  print(
    "SavedModel:       %s\n  (tf.saved_model.load(path).signatures"
    "['serving_default'](inputs=tf.constant(['abc']))['outputs'])" % export_path
  )
  print(
    "Total time %.0f s; exact match %.4f (target %.2f)"
    % (time.perf_counter() - start, accuracy, args.target_accuracy)
  )
  return 0 if accuracy >= args.target_accuracy else 1


if __name__ == "__main__":
  sys.exit(main())
