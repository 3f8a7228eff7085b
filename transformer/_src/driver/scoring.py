"""Scoring entry points of utils (the original's names).

Scoring computes the log-likelihood of target sequences with the
Estimator's teacher-forced phase, and saves the scores as text or
TFRecords. The gin-configurable functions keep the original utils.py
signatures and gin module; their `estimator` is a driver.Estimator.
transformer/utils.py re-exports them.
"""

from __future__ import annotations

from typing import (
  Any,
  Callable,
  Dict,
  List,
  Optional,
  Sequence,
  Union,
)

from absl import logging
import gin
import numpy as np
import tensorflow as tf

from transformer._src.driver import evaluation as driver_eval
from transformer._src.driver.checkpoint_iterator import CheckpointStep
from transformer._src.driver.checkpoint_iterator import get_checkpoint_iterator
from transformer._src.driver.config import SequenceLength
from transformer._src.driver.config import Vocabularies
from transformer._src.driver.config import clean_decodes
from transformer._src.driver.config import inputs_vocabulary
from transformer._src.driver.config import targets_vocabulary
from transformer._src.driver.decode import named_datasets
from transformer._src.driver.decode_io import call_input_fn
from transformer._src.driver.decode_io import check_required
from transformer._src.driver.decode_io import encode_inputs
from transformer._src.driver.decode_io import feature_rows
from transformer._src.driver.decode_io import get_inputs_from_file
from transformer._src.driver.decode_io import write_lines_to_file
from transformer._src.driver.estimator import Estimator
from transformer._src.driver.estimator import eager_in_legacy_mode

_GIN_MODULE = "mesh_tensorflow.transformer.utils"

__all__ = [
  "compute_log_likelihoods",
  "save_scores",
  "save_scores_to_tfrecords",
  "score_from_dataset",
  "score_from_strings",
  "score_with_estimator",
  "score_with_estimator_lazy",
]


@gin.configurable(module=_GIN_MODULE)
@eager_in_legacy_mode
def compute_log_likelihoods(
  estimator: Estimator,
  input_fn: Callable[..., tf.data.Dataset],
  checkpoint_path: Optional[str] = None,
) -> List[float]:
  """Log-likelihood of each example's "targets" (given its "inputs").

  input_fn() returns a dataset of examples or batches; the result has one
  float per example (sum over target ids > 0).

  Args:
    estimator: the driver.Estimator holding the model and its variables.
    input_fn: a function returning a tf.data.Dataset of examples or batches
      (dicts of int features); it may take a params dict with "batch_size".
    checkpoint_path: the checkpoint to use (default: the latest in the
      model_dir).

  Returns:
    A list of floats, one log-likelihood per example.
  """
  lengths = estimator.sequence_length
  dataset = call_input_fn(input_fn, estimator)
  keys = [k for k in ("inputs", "targets") if k in dataset.element_spec]
  rows = feature_rows(dataset, keys, lengths)
  return [
    float(s)
    for s in driver_eval.score_ids(
      estimator, rows.get("inputs"), rows["targets"], checkpoint_path
    )
  ]


def _add_example_text(results, vocabulary) -> None:
  """Adds "<key>_pretokenized" text of the positive ids of inputs/targets.

  Negative ids (marking contrastive negatives) and padding are left out of
  the text, as the original did.
  """
  vocabs = {
    "inputs": inputs_vocabulary(vocabulary),
    "targets": targets_vocabulary(vocabulary),
  }
  for result in results:
    for key, vocab in vocabs.items():
      if key in result and key + "_pretokenized" not in result:
        ids = [int(i) for i in np.asarray(result[key]).tolist() if i > 0]
        result[key + "_pretokenized"] = vocab.decode(ids)


def _unpadded_length(ids, pad_id: int = 0) -> int:
  """The number of ids before the first pad_id (all of them if none)."""
  ids = np.asarray(ids)
  pads = np.flatnonzero(ids == pad_id)
  return int(pads[0]) if pads.size else len(ids)


@gin.configurable(module=_GIN_MODULE)
def save_scores(
  results: List[Dict[str, Any]],
  vocabulary: Vocabularies,
  scores_filename: Optional[str] = None,
  save_example_text: bool = True,
) -> Any:
  """The scores (and example texts) of scored examples; maybe written.

  With scores_filename, writes scores_filename + ".scores" (one "%g" per
  line) and, with save_example_text, ".targets" (texts), ".lengths" (target
  ids before the first padding) and, if the examples have inputs,
  ".inputs".

  Args:
    results: one dict per example with "scores", "targets" ids and maybe
      "inputs" ids (and "<key>_pretokenized" texts).
    vocabulary: a vocabulary or (inputs, targets) vocabularies.
    scores_filename: the path prefix of the files, or None to write nothing.
    save_example_text: also return (and write) the example texts.

  Returns:
    scores; with save_example_text (scores, targets), or (scores, inputs,
    targets) when the examples have inputs.

  Raises:
    ValueError: if results is empty.
  """
  if not results:
    raise ValueError("No examples were scored.")
  scores = [float(r["scores"]) for r in results]
  if scores_filename is not None:
    write_lines_to_file(["%g" % s for s in scores], scores_filename + ".scores")
  if not save_example_text:
    return scores
  _add_example_text(results, vocabulary)
  targets = [r["targets_pretokenized"] for r in results]
  lengths = [_unpadded_length(r["targets"]) for r in results]
  if scores_filename is not None:
    write_lines_to_file(targets, scores_filename + ".targets")
    write_lines_to_file(lengths, scores_filename + ".lengths")
  if "inputs" not in results[0]:
    return scores, targets
  inputs = [r["inputs_pretokenized"] for r in results]
  if scores_filename is not None:
    write_lines_to_file(inputs, scores_filename + ".inputs")
  return scores, inputs, targets


@gin.configurable(module=_GIN_MODULE)
def save_scores_to_tfrecords(
  results: List[Dict[str, Any]],
  vocabulary: Vocabularies,
  scores_filename: str,
  shard_idx: int = 0,
  save_ids_only: bool = False,
) -> None:
  """Writes scored examples to scores_filename + "_<shard_idx>.tfrecord".

  Each record is a tf.train.Example with bytes features "input" (the inputs
  text, or the "targets_neg_pretokenized" text if present) and "target" and
  float feature "score".

  Args:
    results: one dict per example (see save_scores).
    vocabulary: a vocabulary or (inputs, targets) vocabularies.
    scores_filename: the path prefix of the file.
    shard_idx: the index of this shard of the results.
    save_ids_only: write only the first space-separated word of each input
      (an example id prepended to the inputs).
  """
  _add_example_text(results, vocabulary)
  path = "%s_%d.tfrecord" % (scores_filename, shard_idx)
  logging.info("Saving scores to %s", path)

  def feature(value):
    if isinstance(value, float):
      return tf.train.Feature(float_list=tf.train.FloatList(value=[value]))
    return tf.train.Feature(
      bytes_list=tf.train.BytesList(value=[value.encode("utf-8")])
    )

  with tf.io.TFRecordWriter(path) as writer:
    for r in results:
      text = r.get("targets_neg_pretokenized", r.get("inputs_pretokenized", ""))
      if save_ids_only:
        text = text.split(" ", 1)[0]
      example = tf.train.Example(
        features=tf.train.Features(
          feature={
            "input": feature(text),
            "target": feature(r["targets_pretokenized"]),
            "score": feature(float(r.get("scores", 0.0))),
          }
        )
      )
      writer.write(example.SerializeToString())


def _scoring_checkpoint(eval_checkpoint_step, model_dir) -> str:
  """The one checkpoint to score with (None / -1: the latest)."""
  if eval_checkpoint_step is None:
    eval_checkpoint_step = -1
  return list(get_checkpoint_iterator(eval_checkpoint_step, model_dir))[-1]


@gin.configurable(module=_GIN_MODULE)
@eager_in_legacy_mode
def score_with_estimator(
  estimator: Estimator,
  input_fn: Callable[..., tf.data.Dataset],
  eval_checkpoint_step: CheckpointStep,
  model_dir: str,
  vocabulary: Vocabularies,
  score_postprocess_fn: Callable[..., Any] = save_scores,
  num_examples: Optional[int] = None,
) -> Any:
  """Scores input_fn()'s examples with one checkpoint; post-processes them.

  Returns score_postprocess_fn(results, vocabulary), where results is a list
  of {"targets", "scores"} per example (the first num_examples), as the
  original's scoring predictions: "targets" are the ids the model read (for
  a "delimited_lm" fed inputs, its inputs and targets joined), every id
  after the first EOS zeroed.

  Args:
    estimator: the driver.Estimator holding the model and its variables.
    input_fn: a function returning a tf.data.Dataset of examples or batches
      (dicts of int features); it may take a params dict with "batch_size".
    eval_checkpoint_step: which checkpoints to use: an int step, a list of
      steps, -1 (the latest), "all" or None (see get_checkpoint_iterator).
    model_dir: the directory of the checkpoints.
    vocabulary: a Vocabulary, or an (inputs, targets) pair of them.
    score_postprocess_fn: called as fn(results, vocabulary) on the list of
      {"targets", "scores"} dicts; its value is returned (save_scores writes
      the scores to files).
    num_examples: keep only the first this many examples (None: all).

  Returns:
    What score_postprocess_fn returns.
  """
  lengths = estimator.sequence_length
  dataset = call_input_fn(input_fn, estimator)
  keys = [k for k in ("inputs", "targets") if k in dataset.element_spec]
  rows = feature_rows(dataset, keys, lengths)
  path = _scoring_checkpoint(eval_checkpoint_step, model_dir)
  scores, targets = driver_eval.scores_and_targets(
    estimator, rows.get("inputs"), rows["targets"], path
  )
  targets = clean_decodes(targets).numpy()
  results = [
    {"targets": row, "scores": float(score)}
    for row, score in zip(targets[:num_examples], scores[:num_examples])
  ]
  return score_postprocess_fn(results, vocabulary)


@gin.configurable(module=_GIN_MODULE)
@eager_in_legacy_mode
def score_with_estimator_lazy(
  estimator: Estimator,
  input_fn: Callable[..., tf.data.Dataset],
  eval_checkpoint_step: CheckpointStep,
  model_dir: str,
  vocabulary: Vocabularies,
  score_postprocess_fn: Callable[..., Any] = save_scores_to_tfrecords,
  num_examples: Optional[int] = None,
  num_examples_per_shard: int = 100000,
) -> None:
  """score_with_estimator, post-processed in shards of examples.

  score_postprocess_fn(results, vocabulary, shard_idx=i) is called on each
  num_examples_per_shard examples (the last shard may be smaller), so large
  scoring runs write one file per shard.

  Args:
    estimator: the driver.Estimator holding the model and its variables.
    input_fn: returns the dataset of examples to score.
    eval_checkpoint_step: which checkpoint to score with (None or -1: the
      latest).
    model_dir: the directory of the checkpoints.
    vocabulary: a Vocabulary, or an (inputs, targets) pair of them.
    score_postprocess_fn: called as fn(results, vocabulary, shard_idx=i) on
      each shard of {"targets", "scores"} dicts (default: write tfrecords).
    num_examples: how many examples to score (None: the whole dataset).
    num_examples_per_shard: examples per shard (<= 0 or None: one shard).
  """
  results = score_with_estimator(
    estimator,
    input_fn,
    eval_checkpoint_step,
    model_dir,
    vocabulary,
    lambda results, vocabulary: results,
    num_examples=num_examples,
  )
  shard = (
    num_examples_per_shard
    if num_examples_per_shard and num_examples_per_shard > 0
    else max(len(results), 1)
  )
  for shard_idx, start in enumerate(range(0, len(results), shard)):
    score_postprocess_fn(
      results[start : start + shard], vocabulary, shard_idx=shard_idx
    )


def _arrays_input_fn(arrays: Dict[str, np.ndarray]):
  arrays = {k: v for k, v in arrays.items() if v is not None}
  return lambda: tf.data.Dataset.from_tensor_slices(arrays)


@gin.configurable(module=_GIN_MODULE)
@eager_in_legacy_mode
def score_from_strings(
  estimator: Estimator,
  vocabulary: Vocabularies,
  model_type: str,
  batch_size: int,
  sequence_length: SequenceLength,
  model_dir: str,
  eval_checkpoint_step: CheckpointStep,
  inputs: Union[str, Sequence[str]] = gin.REQUIRED,
  targets: Union[str, Sequence[str]] = gin.REQUIRED,
  score_postprocess_fn: Callable[..., Any] = gin.REQUIRED,
  eos_id: int = 1,
  score_eos: bool = True,
  score_with_estimator_fn: Callable[..., Any] = score_with_estimator,
) -> Any:
  """Log-likelihoods of targets given inputs (lists of strings or files).

  As the original: inputs may be None (targets only), or fewer than the
  targets (each input then has len(targets) / len(inputs) targets, one
  after the other), or there may be one target for every input. An "lm"
  reads each input as an unscored prefix of its target; a "delimited_lm"
  reads them joined, its target scored. Strings are encoded with
  encode_inputs (an "lm"'s without EOS). Returns
  score_postprocess_fn(results, vocabulary) (save_scores: the scores and
  the model's target texts).

  Args:
    estimator: the driver.Estimator holding the model and its variables.
    vocabulary: a Vocabulary, or an (inputs, targets) pair of them.
    model_type: "bitransformer", "lm", "delimited_lm", "aligned" or
      "bi_student_teacher".
    batch_size: unused (the estimator's batch size is used).
    sequence_length: unused (the estimator's lengths are used).
    model_dir: the directory of the checkpoints.
    eval_checkpoint_step: which checkpoints to use: an int step, a list of
      steps, -1 (the latest), "all" or None (see get_checkpoint_iterator).
    inputs: a list of input strings, the name of a file with one per line, or
      None.
    targets: a list of target strings, or the name of a file with one per line.
    score_postprocess_fn: called as fn(results, vocabulary) on the list of
      {"targets", "scores"} dicts; its value is returned (save_scores writes
      the scores to files).
    eos_id: the EOS id (1).
    score_eos: include the final EOS in each target's score.
    score_with_estimator_fn: the scoring function, called as
      score_with_estimator(estimator, input_fn, eval_checkpoint_step,
      model_dir, vocabulary, score_postprocess_fn).

  Returns:
    What score_postprocess_fn returns.

  Raises:
    ValueError: if a required argument is missing, or the numbers of inputs
      and targets do not fit together.
  """
  del batch_size, sequence_length
  check_required(
    "score_from_strings",
    inputs=inputs,
    targets=targets,
    score_postprocess_fn=score_postprocess_fn,
  )
  if isinstance(inputs, str):
    inputs = get_inputs_from_file(inputs)
  if isinstance(targets, str):
    targets = get_inputs_from_file(targets)
  has_inputs = inputs is not None
  if has_inputs and len(inputs) < len(targets):
    # n targets per input, one after the other.
    if len(targets) % len(inputs):
      raise ValueError(
        "score_from_strings: the number of inputs (%d) must divide the "
        "number of targets (%d)" % (len(inputs), len(targets))
      )
    repeats = len(targets) // len(inputs)
    inputs = [inputs[i // repeats] for i in range(len(targets))]
  elif has_inputs and len(targets) < len(inputs):
    if len(targets) != 1:
      raise ValueError(
        "score_from_strings: %d inputs but %d targets; with fewer targets "
        "than inputs give one target, scored after every input"
        % (len(inputs), len(targets))
      )
    targets = list(targets) * len(inputs)
  lengths = estimator.sequence_length
  target_eos = eos_id if score_eos else 0

  def encode(strings, length, eos, prefix=None):
    return encode_inputs(
      strings, vocabulary, model_type, 1, length, eos, unscored_prefix=prefix
    )

  input_ids = None
  if has_inputs and model_type == "lm":
    # An LM reads each input as an unscored prefix of its target.
    target_ids = encode(targets, lengths["targets"], target_eos, inputs)
  else:
    if has_inputs:
      input_ids = encode(inputs, lengths["inputs"], eos_id)
    target_ids = encode(targets, lengths["targets"], target_eos)
  return score_with_estimator_fn(
    estimator,
    _arrays_input_fn({"inputs": input_ids, "targets": target_ids}),
    eval_checkpoint_step,
    model_dir,
    vocabulary,
    score_postprocess_fn,
    num_examples=len(targets),
  )


@gin.configurable(module=_GIN_MODULE)
@eager_in_legacy_mode
def score_from_dataset(
  estimator: Estimator,
  vocabulary: Vocabularies,
  batch_size: int,
  sequence_length: SequenceLength,
  model_dir: str,
  eval_checkpoint_step: CheckpointStep,
  dataset_split: str,
  score_dataset_fn: Optional[Callable[..., Any]] = None,
  score_postprocess_fn: Callable[..., Any] = gin.REQUIRED,
  score_with_estimator_fn: Callable[..., Any] = score_with_estimator,
) -> Any:
  """Log-likelihoods of the examples of score_dataset_fn's one dataset.

  score_dataset_fn(sequence_length=, vocabulary=, dataset_split=) returns a
  dataset, or a list with one EvalDataset, of examples with "targets" (and
  "inputs") ids. Returns score_postprocess_fn(results, vocabulary).

  Args:
    estimator: the driver.Estimator holding the model and its variables.
    vocabulary: a Vocabulary, or an (inputs, targets) pair of them.
    batch_size: unused (the estimator's batch size is used).
    sequence_length: an int, or a {"inputs": n, "targets": m} dict: the feature
      lengths in tokens.
    model_dir: the directory of the checkpoints.
    eval_checkpoint_step: which checkpoints to use: an int step, a list of
      steps, -1 (the latest), "all" or None (see get_checkpoint_iterator).
    dataset_split: the dataset split, e.g. "train" or "validation".
    score_dataset_fn: called as fn(sequence_length=, vocabulary=,
      dataset_split=); returns a dataset, or a list with one EvalDataset, of
      examples with "targets" (and "inputs") ids.
    score_postprocess_fn: called as fn(results, vocabulary) on the list of
      {"targets", "scores"} dicts; its value is returned (save_scores writes
      the scores to files).
    score_with_estimator_fn: the scoring function, called as
      score_with_estimator(estimator, input_fn, eval_checkpoint_step,
      model_dir, vocabulary, score_postprocess_fn).

  Returns:
    What score_postprocess_fn returns.

  Raises:
    ValueError: without score_dataset_fn or score_postprocess_fn, or if
      score_dataset_fn gives more than one dataset.
  """
  del batch_size
  check_required(
    "score_from_dataset", score_postprocess_fn=score_postprocess_fn
  )
  if score_dataset_fn is None:
    raise ValueError("score_from_dataset: score_dataset_fn is required")
  datasets = named_datasets(
    score_dataset_fn,
    sequence_length,
    vocabulary,
    dataset_split,
    "score_from_dataset",
  )
  if len(datasets) != 1:
    raise ValueError(
      "score_from_dataset: scores one dataset, got %d (%s)"
      % (len(datasets), [name for name, _, _ in datasets])
    )
  dataset = datasets[0][1]
  return score_with_estimator_fn(
    estimator,
    lambda: dataset,
    eval_checkpoint_step,
    model_dir,
    vocabulary,
    score_postprocess_fn,
  )
