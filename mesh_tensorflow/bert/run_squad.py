"""Fine-tuning BERT for SQuAD question answering on a mesh.

The original's script and flags, on the TF2 driver: --do_train fine-tunes
on --train_file from --init_checkpoint; --do_predict writes
predictions.json and nbest_predictions.json for --predict_file (and
null_odds.json with --version_2_with_negative).

Usage:

  python -m mesh_tensorflow.bert.run_squad --vocab_file=DIR/vocab.txt \
    --bert_config_file=DIR/bert_config.json --output_dir=/tmp/squad \
    --init_checkpoint=/tmp/bert --train_file=train-v1.1.json \
    --predict_file=dev-v1.1.json --do_train --do_predict \
    --mesh_shape=batch:2 --layout=batch:batch
"""

from __future__ import annotations

import os
import random
from typing import Any, Callable, Dict

from absl import app
from absl import flags
from absl import logging
import tensorflow as tf

from mesh_tensorflow.bert import tokenization
from mesh_tensorflow.bert._src import data
from mesh_tensorflow.bert._src import estimator
from mesh_tensorflow.bert._src import flag_util
from mesh_tensorflow.bert._src import model as bert_lib
from mesh_tensorflow.bert._src import run_util
from mesh_tensorflow.bert._src import squad
from mesh_tensorflow.bert._src import squad_answers
from mesh_tensorflow.bert._src import squad_features
from mesh_tensorflow.bert._src.squad_answers import RawResult
from mesh_tensorflow.bert._src.squad_features import FeatureWriter
from mesh_tensorflow.bert._src.squad_features import InputFeatures
from mesh_tensorflow.bert._src.squad_features import SquadExample
from mesh_tensorflow.bert._src.squad_features import (
  convert_examples_to_features,
)
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
      "output_dir",
      None,
      "Where the checkpoints, records and predictions are written.",
    ),
    ("string", "train_file", None, "SQuAD json for training."),
    ("string", "predict_file", None, "SQuAD json for predictions."),
    (
      "integer",
      "max_seq_length",
      384,
      "The padded length of the WordPiece inputs (question + window).",
    ),
    (
      "integer",
      "doc_stride",
      128,
      "Tokens between the starts of a long document's windows.",
    ),
    (
      "integer",
      "max_query_length",
      64,
      "Questions are cut to this many tokens.",
    ),
    ("bool", "do_predict", False, "Whether to predict --predict_file."),
    (
      "integer",
      "predict_batch_size",
      8,
      "Total batch size for predictions.",
    ),
    (
      "integer",
      "n_best_size",
      20,
      "Answers per question in nbest_predictions.json.",
    ),
    (
      "integer",
      "max_answer_length",
      30,
      "The longest answer in tokens (start and end are predicted apart).",
    ),
    (
      "bool",
      "verbose_logging",
      False,
      "Log every problem of mapping answers back to the text.",
    ),
    (
      "bool",
      "version_2_with_negative",
      False,
      "The SQuAD examples include unanswerable questions (SQuAD 2.0).",
    ),
    (
      "float",
      "null_score_diff_threshold",
      0.0,
      "Predict no answer when null score - best score exceeds this.",
    ),
  ],
  __name__,
)

__all__ = [
  "FeatureWriter",
  "InputFeatures",
  "RawResult",
  "SquadExample",
  "convert_examples_to_features",
  "create_model",
  "get_final_text",
  "input_fn_builder",
  "main",
  "model_fn_builder",
  "read_squad_examples",
  "validate_flags_or_throw",
  "write_predictions",
]


# The original's functions that read flags: --version_2_with_negative,
# --null_score_diff_threshold, --verbose_logging, --mesh_shape and --layout
# set the parameters of the same names.
read_squad_examples = flag_util.bind_flags(
  squad_features.read_squad_examples, ["version_2_with_negative"]
)
create_model = flag_util.bind_flags(
  squad.create_model, ["mesh_shape", "layout"]
)
write_predictions = flag_util.bind_flags(
  squad_answers.write_predictions,
  ["version_2_with_negative", "null_score_diff_threshold", "verbose_logging"],
)
get_final_text = flag_util.bind_flags(
  squad_answers.get_final_text, ["verbose_logging"]
)


def model_fn_builder(
  bert_config,
  init_checkpoint,
  learning_rate,
  num_train_steps,
  num_warmup_steps,
  use_tpu,
) -> estimator.TaskModel:
  """The SQuAD task a BertEstimator runs (TPUEstimator's model_fn).

  Args:
    bert_config: the BertConfig.
    init_checkpoint: a checkpoint whose model weights start the run.
    learning_rate: the peak learning rate.
    num_train_steps: the step at which the learning rate reaches 0 (None
      when only predicting).
    num_warmup_steps: the number of warmup steps.
    use_tpu: unused (the estimator's mesh implementation decides).

  Returns:
    A TaskModel (see squad.squad_model for its outputs).
  """
  del use_tpu
  return run_util.fine_tuning_task(
    squad.squad_model(bert_config, FLAGS.mesh_shape, FLAGS.layout),
    FLAGS,
    init_checkpoint,
    learning_rate,
    num_train_steps,
    num_warmup_steps,
  )


def input_fn_builder(
  input_file: str, seq_length: int, is_training: bool, drop_remainder: bool
) -> Callable[[Dict[str, Any]], tf.data.Dataset]:
  """input_fn(params) -> batches of a SQuAD TFRecord file.

  Args:
    input_file: the TFRecord file.
    seq_length: the padded length.
    is_training: read the answer positions; repeat and shuffle.
    drop_remainder: drop a last partial batch.

  Returns:
    input_fn(params) -> tf.data.Dataset, with params["batch_size"].
  """

  def input_fn(params):
    return data.record_dataset(
      input_file,
      squad_features.squad_feature_spec(seq_length, is_training),
      params["batch_size"],
      is_training,
      drop_remainder=drop_remainder,
    )

  return input_fn


def validate_flags_or_throw(bert_config: bert_lib.BertConfig) -> None:
  """Raises ValueError for inconsistent flags.

  Args:
    bert_config: the BertConfig (its max_position_embeddings).

  Raises:
    ValueError: neither --do_train nor --do_predict, a missing input file,
      a too long --max_seq_length or one too short for the question.
  """
  tokenization.validate_case_matches_checkpoint(
    FLAGS.do_lower_case, FLAGS.init_checkpoint
  )
  if not FLAGS.do_train and not FLAGS.do_predict:
    raise ValueError("At least one of `do_train` or `do_predict` must be True.")
  if FLAGS.do_train and not FLAGS.train_file:
    raise ValueError(
      "If `do_train` is True, then `train_file` must be specified."
    )
  if FLAGS.do_predict and not FLAGS.predict_file:
    raise ValueError(
      "If `do_predict` is True, then `predict_file` must be specified."
    )
  if FLAGS.max_seq_length > bert_config.max_position_embeddings:
    raise ValueError(
      "Cannot use sequence length %d because the BERT model was only trained "
      "up to sequence length %d"
      % (FLAGS.max_seq_length, bert_config.max_position_embeddings)
    )
  if FLAGS.max_seq_length <= FLAGS.max_query_length + 3:
    raise ValueError(
      "The max_seq_length (%d) must be greater than max_query_length (%d) + 3"
      % (FLAGS.max_seq_length, FLAGS.max_query_length)
    )


def _write_features(name, examples, tokenizer, is_training, keep=None):
  writer = FeatureWriter(os.path.join(FLAGS.output_dir, name), is_training)

  def output_fn(feature):
    writer.process_feature(feature)
    if keep is not None:
      keep.append(feature)

  convert_examples_to_features(
    examples,
    tokenizer,
    FLAGS.max_seq_length,
    FLAGS.doc_stride,
    FLAGS.max_query_length,
    is_training,
    output_fn,
  )
  return writer


# The original's scripts called tf.disable_v2_behavior() before main; the
# driver runs eagerly also then (see transformer.utils.eager_in_legacy_mode).
@transformer_utils.eager_in_legacy_mode
def main(_) -> None:
  """Fine-tunes and/or predicts as --do_train / --do_predict say.

  Args:
    _: the command-line arguments left after the flags (unused).
  """
  flag_util.use_defaults(FLAG_DEFAULTS)
  flag_util.require_flags(("vocab_file", "bert_config_file", "output_dir"))
  bert_config = bert_lib.BertConfig.from_json_file(FLAGS.bert_config_file)
  validate_flags_or_throw(bert_config)
  tf.io.gfile.makedirs(FLAGS.output_dir)
  tokenizer = tokenization.FullTokenizer(
    vocab_file=FLAGS.vocab_file, do_lower_case=FLAGS.do_lower_case
  )
  train_examples = num_train_steps = num_warmup_steps = None
  if FLAGS.do_train:
    train_examples = read_squad_examples(FLAGS.train_file, is_training=True)
    num_train_steps = int(
      len(train_examples) / FLAGS.train_batch_size * FLAGS.num_train_epochs
    )
    num_warmup_steps = int(num_train_steps * FLAGS.warmup_proportion)
    random.Random(12345).shuffle(train_examples)
  task = model_fn_builder(
    bert_config=bert_config,
    init_checkpoint=FLAGS.init_checkpoint,
    learning_rate=FLAGS.learning_rate,
    num_train_steps=num_train_steps,
    num_warmup_steps=num_warmup_steps,
    use_tpu=FLAGS.use_tpu,
  )
  est = run_util.make_estimator(task, FLAGS)
  if FLAGS.do_train:
    train_file = FLAGS.cached_train_file
    if not train_file:
      writer = _write_features(
        "train.tf_record", train_examples, tokenizer, True
      )
      writer.close()
      train_file = writer.filename
    train_input_fn = input_fn_builder(
      train_file, FLAGS.max_seq_length, True, True
    )
    est.train(
      lambda: train_input_fn({"batch_size": FLAGS.train_batch_size}),
      max_steps=num_train_steps,
    )
  if FLAGS.do_predict:
    eval_examples = read_squad_examples(FLAGS.predict_file, is_training=False)
    eval_features = []
    writer = _write_features(
      "eval.tf_record", eval_examples, tokenizer, False, eval_features
    )
    # Whole batches for the mesh: padding features answer no question.
    next_id = squad_features.FIRST_UNIQUE_ID + len(eval_features)
    for i in range(-len(eval_features) % FLAGS.predict_batch_size):
      writer.process_feature(
        squad_features.padding_feature(next_id + i, FLAGS.max_seq_length)
      )
    writer.close()
    logging.info(
      "Predicting %d examples (%d features)",
      len(eval_examples),
      len(eval_features),
    )
    dataset = input_fn_builder(
      writer.filename, FLAGS.max_seq_length, False, True
    )({"batch_size": FLAGS.predict_batch_size})
    results = squad_answers.squad_results(est.predict_batches(dataset))
    write_predictions(
      eval_examples,
      eval_features,
      results,
      FLAGS.n_best_size,
      FLAGS.max_answer_length,
      FLAGS.do_lower_case,
      os.path.join(FLAGS.output_dir, "predictions.json"),
      os.path.join(FLAGS.output_dir, "nbest_predictions.json"),
      os.path.join(FLAGS.output_dir, "null_odds.json"),
    )


if __name__ == "__main__":
  app.run(main)
