"""Fine-tuning BERT for sentence(-pair) classification on a mesh.

The original's script and flags (tasks cola, mnli, mrpc, xnli), on the TF2
driver: --do_train fine-tunes from --init_checkpoint (its model weights; the
optimizer slots and step start afresh) for --num_train_epochs, --do_eval
writes eval_results.txt (eval_accuracy, eval_loss), --do_predict writes the
class probabilities of each test example to test_results.tsv.

Usage, with the offline demo data of mesh_tensorflow.bert.demo_data (a
generated set in the CoLA layout):

  python -m mesh_tensorflow.bert.run_classifier --task_name=cola \
    --data_dir=DIR/classifier --vocab_file=DIR/vocab.txt \
    --bert_config_file=DIR/bert_config.json --output_dir=/tmp/cls \
    --init_checkpoint=/tmp/bert --max_seq_length=32 --do_train --do_eval \
    --mesh_shape=batch:2 --layout=batch:batch --train_batch_size=16
"""

from __future__ import annotations

import os

from absl import app
from absl import flags
from absl import logging
import tensorflow as tf

from mesh_tensorflow.bert import tokenization
from mesh_tensorflow.bert._src import classifier
from mesh_tensorflow.bert._src import estimator
from mesh_tensorflow.bert._src import flag_util
from mesh_tensorflow.bert._src import model as bert_lib
from mesh_tensorflow.bert._src import run_util
from mesh_tensorflow.bert._src.classifier import ColaProcessor
from mesh_tensorflow.bert._src.classifier import DataProcessor
from mesh_tensorflow.bert._src.classifier import InputExample
from mesh_tensorflow.bert._src.classifier import InputFeatures
from mesh_tensorflow.bert._src.classifier import MnliProcessor
from mesh_tensorflow.bert._src.classifier import MrpcProcessor
from mesh_tensorflow.bert._src.classifier import PaddingInputExample
from mesh_tensorflow.bert._src.classifier import XnliProcessor
from mesh_tensorflow.bert._src.classifier import convert_examples_to_features
from mesh_tensorflow.bert._src.classifier import convert_single_example
from mesh_tensorflow.bert._src.classifier import create_model
from mesh_tensorflow.bert._src.classifier import (
  file_based_convert_examples_to_features,
)
from mesh_tensorflow.bert._src.classifier import file_based_input_fn_builder
from mesh_tensorflow.bert._src.classifier import input_fn_builder
from transformer import utils as transformer_utils

FLAGS = flags.FLAGS

# This script's flags, defined unless another module did; main() gives the
# flags not set on the command line these defaults.
FLAG_DEFAULTS = flag_util.define_flags(
  run_util.COMMON_FLAGS
  + run_util.FINE_TUNING_FLAGS
  + [
    (
      "string",
      "data_dir",
      None,
      "The task's data directory (its .tsv files).",
    ),
    ("string", "task_name", None, "The task: cola, mnli, mrpc or xnli."),
    (
      "string",
      "output_dir",
      None,
      "Where the checkpoints, records and results are written.",
    ),
    (
      "integer",
      "max_seq_length",
      128,
      "The padded length of the WordPiece inputs (longer ones are cut).",
    ),
    ("bool", "do_eval", False, "Whether to run eval on the dev set."),
    ("bool", "do_predict", False, "Whether to predict the test set."),
    ("integer", "eval_batch_size", 32, "Total batch size for eval."),
    ("integer", "predict_batch_size", 8, "Total batch size for predict."),
  ],
  __name__,
)

PROCESSORS = {
  "cola": ColaProcessor,
  "mnli": MnliProcessor,
  "mrpc": MrpcProcessor,
  "xnli": XnliProcessor,
}

__all__ = [
  "ColaProcessor",
  "DataProcessor",
  "InputExample",
  "InputFeatures",
  "MnliProcessor",
  "MrpcProcessor",
  "PaddingInputExample",
  "XnliProcessor",
  "convert_examples_to_features",
  "convert_single_example",
  "create_model",
  "file_based_convert_examples_to_features",
  "file_based_input_fn_builder",
  "input_fn_builder",
  "main",
  "model_fn_builder",
]


def model_fn_builder(
  bert_config,
  num_labels,
  init_checkpoint,
  learning_rate,
  num_train_steps,
  num_warmup_steps,
  use_tpu,
) -> estimator.TaskModel:
  """The classification task a BertEstimator runs (TPUEstimator's model_fn).

  The mesh, layout, optimizer, clipping and largest trained variable come
  from --mesh_shape, --layout, --optimizer, --clip_gradients and
  --max_optimized_variable_size.

  Args:
    bert_config: the BertConfig.
    num_labels: the number of labels.
    init_checkpoint: a checkpoint whose model weights start the run.
    learning_rate: the peak learning rate.
    num_train_steps: the step at which the learning rate reaches 0 (None
      when only evaluating or predicting).
    num_warmup_steps: the number of warmup steps.
    use_tpu: unused (the estimator's mesh implementation decides).

  Returns:
    A TaskModel (see classifier.classifier_model for its outputs).
  """
  del use_tpu
  return run_util.fine_tuning_task(
    classifier.classifier_model(
      bert_config, num_labels, FLAGS.mesh_shape, FLAGS.layout
    ),
    FLAGS,
    init_checkpoint,
    learning_rate,
    num_train_steps,
    num_warmup_steps,
  )


def _records(name, examples, label_list, tokenizer):
  path = os.path.join(FLAGS.output_dir, name)
  file_based_convert_examples_to_features(
    examples, label_list, FLAGS.max_seq_length, tokenizer, path
  )
  return path


# The original's scripts called tf.disable_v2_behavior() before main; the
# driver runs eagerly also then (see transformer.utils.eager_in_legacy_mode).
@transformer_utils.eager_in_legacy_mode
def main(_) -> None:
  """Fine-tunes, evaluates and/or predicts as --do_* say.

  Args:
    _: the command-line arguments left after the flags (unused).
  """
  flag_util.use_defaults(FLAG_DEFAULTS)
  flag_util.require_flags(
    (
      "data_dir",
      "task_name",
      "vocab_file",
      "bert_config_file",
      "output_dir",
    )
  )
  tokenization.validate_case_matches_checkpoint(
    FLAGS.do_lower_case, FLAGS.init_checkpoint
  )
  if not (FLAGS.do_train or FLAGS.do_eval or FLAGS.do_predict):
    raise ValueError(
      "At least one of `do_train`, `do_eval` or `do_predict' must be True."
    )
  bert_config = bert_lib.BertConfig.from_json_file(FLAGS.bert_config_file)
  if FLAGS.max_seq_length > bert_config.max_position_embeddings:
    raise ValueError(
      "Cannot use sequence length %d because the BERT model was only trained "
      "up to sequence length %d"
      % (FLAGS.max_seq_length, bert_config.max_position_embeddings)
    )
  tf.io.gfile.makedirs(FLAGS.output_dir)
  task_name = FLAGS.task_name.lower()
  if task_name not in PROCESSORS:
    raise ValueError("Task not found: %s" % task_name)
  processor = PROCESSORS[task_name]()
  label_list = processor.get_labels()
  tokenizer = tokenization.FullTokenizer(
    vocab_file=FLAGS.vocab_file, do_lower_case=FLAGS.do_lower_case
  )
  train_examples = num_train_steps = num_warmup_steps = None
  if FLAGS.do_train:
    train_examples = processor.get_train_examples(FLAGS.data_dir)
    num_train_steps = int(
      len(train_examples) / FLAGS.train_batch_size * FLAGS.num_train_epochs
    )
    num_warmup_steps = int(num_train_steps * FLAGS.warmup_proportion)
  task = model_fn_builder(
    bert_config=bert_config,
    num_labels=len(label_list),
    init_checkpoint=FLAGS.init_checkpoint,
    learning_rate=FLAGS.learning_rate,
    num_train_steps=num_train_steps,
    num_warmup_steps=num_warmup_steps,
    use_tpu=FLAGS.use_tpu,
  )
  est = run_util.make_estimator(task, FLAGS)
  if FLAGS.do_train:
    train_file = FLAGS.cached_train_file or _records(
      "train.tf_record", train_examples, label_list, tokenizer
    )
    logging.info(
      "Training on %d examples, batch size %d, %d steps",
      len(train_examples),
      FLAGS.train_batch_size,
      num_train_steps,
    )
    train_input_fn = file_based_input_fn_builder(
      train_file, FLAGS.max_seq_length, True, True
    )
    est.train(
      lambda: train_input_fn({"batch_size": FLAGS.train_batch_size}),
      max_steps=num_train_steps,
    )
  # The mesh needs whole batches: the last one is filled with padding
  # examples, which the metrics and predictions leave out.
  if FLAGS.do_eval:
    eval_examples = processor.get_dev_examples(FLAGS.data_dir)
    classifier.pad_to_batches(eval_examples, FLAGS.eval_batch_size)
    eval_file = _records("eval.tf_record", eval_examples, label_list, tokenizer)
    dataset = file_based_input_fn_builder(
      eval_file, FLAGS.max_seq_length, False, True
    )({"batch_size": FLAGS.eval_batch_size})
    result = classifier.classification_metrics(est.predict_batches(dataset))
    result["global_step"] = int(est.global_step.numpy())
    run_util.write_results(
      os.path.join(FLAGS.output_dir, "eval_results.txt"), result
    )
  if FLAGS.do_predict:
    predict_examples = processor.get_test_examples(FLAGS.data_dir)
    num_real = classifier.pad_to_batches(
      predict_examples, FLAGS.predict_batch_size
    )
    predict_file = _records(
      "predict.tf_record", predict_examples, label_list, tokenizer
    )
    dataset = file_based_input_fn_builder(
      predict_file, FLAGS.max_seq_length, False, True
    )({"batch_size": FLAGS.predict_batch_size})
    lines = []
    for batch in est.predict_batches(dataset):
      for probabilities in batch["probabilities"]:
        lines.append("\t".join(str(p) for p in probabilities) + "\n")
    with tf.io.gfile.GFile(
      os.path.join(FLAGS.output_dir, "test_results.tsv"), "w"
    ) as f:
      f.write("".join(lines[:num_real]))


if __name__ == "__main__":
  app.run(main)
