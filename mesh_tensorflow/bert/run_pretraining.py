"""Masked-LM and next-sentence pretraining of BERT on a mesh.

The original's script and flags, on the TF2 driver: each training step is
one compiled tf.function over the mesh (--mesh_shape, --layout), and
checkpoints in --output_dir carry the original's variable names. Modes:
train_and_eval (train --steps_per_eval steps, evaluate, repeat up to
--num_train_steps), train, and eval (writes eval_results_<step>.txt).

Usage, with the offline demo data of mesh_tensorflow.bert.demo_data
(`python -m mesh_tensorflow.bert.demo_data DIR` writes it):

  python -m mesh_tensorflow.bert.run_pretraining \
    --bert_config_file=DIR/bert_config.json \
    --input_train_files=DIR/pretrain.tfrecord \
    --input_eval_files=DIR/pretrain.tfrecord --output_dir=/tmp/bert \
    --max_seq_length=32 --max_predictions_per_seq=5 --mesh_shape=batch:2 \
    --layout=batch:batch --train_batch_size=8 --num_train_steps=100
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Dict, Sequence

from absl import app
from absl import flags
from absl import logging
import tensorflow as tf

from mesh_tensorflow.bert._src import data
from mesh_tensorflow.bert._src import estimator
from mesh_tensorflow.bert._src import flag_util
from mesh_tensorflow.bert._src import model as bert_lib
from mesh_tensorflow.bert._src import pretraining
from mesh_tensorflow.bert._src import run_util
from transformer import utils as transformer_utils

FLAGS = flags.FLAGS

# This script's flags, defined unless another module did; main() gives the
# flags not set on the command line these defaults.
FLAG_DEFAULTS = flag_util.define_flags(
  run_util.COMMON_FLAGS
  + [
    (
      "string",
      "input_train_files",
      None,
      "Training tf.Example files (comma-separated globs).",
    ),
    (
      "string",
      "input_eval_files",
      None,
      "Evaluation tf.Example files (comma-separated globs).",
    ),
    (
      "string",
      "output_dir",
      None,
      "Where the checkpoints and eval results are written.",
    ),
    (
      "integer",
      "max_seq_length",
      128,
      "The padded length of the WordPiece inputs; must match the data.",
    ),
    (
      "integer",
      "max_predictions_per_seq",
      20,
      "Masked-LM predictions per sequence; must match the data.",
    ),
    ("string", "mode", "train_and_eval", "train_and_eval, train or eval."),
    ("integer", "eval_batch_size", 8, "Total batch size for eval."),
    ("integer", "num_train_steps", 100000, "Number of training steps."),
    ("integer", "num_warmup_steps", 10000, "Number of warmup steps."),
    (
      "integer",
      "steps_per_eval",
      5000,
      "Training steps between evaluations in train_and_eval mode.",
    ),
    ("integer", "max_eval_steps", 100, "Maximum number of eval steps."),
  ],
  __name__,
)

__all__ = ["input_fn_builder", "main", "model_fn_builder"]


def model_fn_builder(
  bert_config: bert_lib.BertConfig,
  init_checkpoint,
  learning_rate,
  num_train_steps,
  num_warmup_steps,
) -> estimator.TaskModel:
  """The pretraining task a BertEstimator runs (TPUEstimator's model_fn).

  The mesh, layout, optimizer and clipping come from --mesh_shape,
  --layout, --optimizer and --clip_gradients.

  Args:
    bert_config: the BertConfig.
    init_checkpoint: a checkpoint to start from (None: fresh weights).
    learning_rate: the peak learning rate.
    num_train_steps: the step at which the learning rate reaches 0.
    num_warmup_steps: the number of warmup steps.

  Returns:
    A TaskModel (see pretraining.pretraining_model for its outputs).
  """
  return estimator.TaskModel(
    build=pretraining.pretraining_model(
      bert_config, FLAGS.mesh_shape, FLAGS.layout
    ),
    learning_rate=learning_rate,
    num_train_steps=num_train_steps,
    num_warmup_steps=num_warmup_steps,
    init_checkpoint=init_checkpoint,
    optimizer=FLAGS.optimizer,
    clip_gradients=FLAGS.clip_gradients,
  )


def input_fn_builder(
  input_files: Sequence[str],
  max_seq_length: int,
  max_predictions_per_seq: int,
  is_training: bool,
  num_cpu_threads: int = 4,
) -> Callable[[Dict[str, Any]], tf.data.Dataset]:
  """input_fn(params) -> batches of pretraining records.

  Training repeats and shuffles the files and records; evaluation reads
  them in order, repeated (evaluation stops after a number of batches).

  Args:
    input_files: the TFRecord files.
    max_seq_length: the records' sequence length.
    max_predictions_per_seq: the records' masked-LM predictions.
    is_training: shuffle for training.
    num_cpu_threads: files read in parallel during training.

  Returns:
    input_fn(params) -> tf.data.Dataset, with params["batch_size"].
  """
  spec = data.pretraining_feature_spec(max_seq_length, max_predictions_per_seq)

  def input_fn(params):
    files = list(input_files)
    if is_training:
      dataset = tf.data.Dataset.from_tensor_slices(tf.constant(files))
      dataset = dataset.repeat().shuffle(buffer_size=len(files))
      dataset = dataset.interleave(
        tf.data.TFRecordDataset,
        cycle_length=min(num_cpu_threads, len(files)),
        deterministic=False,
      )
      dataset = dataset.shuffle(buffer_size=100)
    else:
      dataset = tf.data.TFRecordDataset(files).repeat()
    dataset = dataset.map(lambda record: data.decode_record(record, spec))
    return dataset.batch(params["batch_size"], drop_remainder=True)

  return input_fn


def _evaluate(est, eval_input_fn, current_step):
  batches = est.predict_batches(
    eval_input_fn({"batch_size": FLAGS.eval_batch_size}),
    max_batches=FLAGS.max_eval_steps,
  )
  result = pretraining.pretraining_metrics(batches)
  result["global_step"] = current_step
  run_util.write_results(
    os.path.join(FLAGS.output_dir, "eval_results_%d.txt" % current_step),
    result,
  )
  return result


# The original's scripts called tf.disable_v2_behavior() before main; the
# driver runs eagerly also then (see transformer.utils.eager_in_legacy_mode).
@transformer_utils.eager_in_legacy_mode
def main(_) -> None:
  """Pretrains and/or evaluates as --mode says.

  Args:
    _: the command-line arguments left after the flags (unused).
  """
  flag_util.use_defaults(FLAG_DEFAULTS)
  flag_util.require_flags(
    (
      "input_train_files",
      "input_eval_files",
      "bert_config_file",
      "output_dir",
    )
  )
  if FLAGS.mode not in ("train_and_eval", "train", "eval"):
    raise app.UsageError(
      "--mode must be train_and_eval, train or eval, not %r" % FLAGS.mode
    )
  bert_config = bert_lib.BertConfig.from_json_file(FLAGS.bert_config_file)
  tf.io.gfile.makedirs(FLAGS.output_dir)
  train_files = run_util.glob_files(FLAGS.input_train_files)
  eval_files = run_util.glob_files(FLAGS.input_eval_files)
  logging.info("Training files: %s", train_files)
  logging.info("Evaluation files: %s", eval_files)
  task = model_fn_builder(
    bert_config=bert_config,
    init_checkpoint=FLAGS.init_checkpoint,
    learning_rate=FLAGS.learning_rate,
    num_train_steps=FLAGS.num_train_steps,
    num_warmup_steps=FLAGS.num_warmup_steps,
  )
  est = run_util.make_estimator(task, FLAGS)
  train_input_fn = input_fn_builder(
    train_files, FLAGS.max_seq_length, FLAGS.max_predictions_per_seq, True
  )
  eval_input_fn = input_fn_builder(
    eval_files, FLAGS.max_seq_length, FLAGS.max_predictions_per_seq, False
  )
  if FLAGS.mode == "eval":
    checkpoint = est.latest_checkpoint()
    step = int(checkpoint.rsplit("-", 1)[-1]) if checkpoint else 0
    _evaluate(est, eval_input_fn, step)
    return
  current_step = 0
  if est.latest_checkpoint():
    current_step = int(est.latest_checkpoint().rsplit("-", 1)[-1])
  while current_step < FLAGS.num_train_steps:
    if FLAGS.mode == "train_and_eval":
      next_stop = min(
        current_step + FLAGS.steps_per_eval, FLAGS.num_train_steps
      )
    else:
      next_stop = FLAGS.num_train_steps
    start = time.time()
    est.train(
      lambda: train_input_fn({"batch_size": FLAGS.train_batch_size}),
      max_steps=next_stop,
    )
    current_step = next_stop
    logging.info(
      "Trained up to step %d in %d s", current_step, time.time() - start
    )
    if FLAGS.mode == "train_and_eval":
      _evaluate(est, eval_input_fn, current_step)


if __name__ == "__main__":
  app.run(main)
