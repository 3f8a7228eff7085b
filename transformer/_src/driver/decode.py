"""Decoding and scoring entry points of utils (the original's names).

Decoding turns input strings or dataset examples into output strings with
the Estimator's compiled decode phase; scoring computes the log-likelihood
of target sequences with its teacher-forced phase. The gin-configurable
functions keep the original utils.py signatures and gin module; their
`estimator` is a driver.Estimator. transformer/utils.py re-exports them.
"""

from __future__ import annotations

import inspect
import os
from typing import (
  Any,
  Callable,
  Dict,
  Iterable,
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
from transformer._src.driver.config import get_step_from_checkpoint_path
from transformer._src.driver.config import inputs_vocabulary
from transformer._src.driver.config import targets_vocabulary
from transformer._src.driver.estimator import Estimator
from transformer._src.driver.estimator import eager_in_legacy_mode

_GIN_MODULE = "mesh_tensorflow.transformer.utils"

__all__ = [
  "compute_log_likelihoods",
  "decode",
  "decode_examples",
  "decode_from_dataset",
  "decode_from_file",
  "decode_strings",
  "encode_delimited_lm",
  "encode_inputs",
  "get_inputs_from_file",
  "infer_model",
  "named_datasets",
  "save_scores",
  "save_scores_to_tfrecords",
  "score_from_dataset",
  "score_from_strings",
  "score_with_estimator",
  "score_with_estimator_lazy",
  "text_metrics",
  "write_lines_to_file",
]


def _required(what: str, **params) -> None:
  for name, value in params.items():
    if value is gin.REQUIRED:
      raise ValueError("%s: parameter %r is required" % (what, name))


# ----------------------------------------------------------------------------
# Files and encodings.


def get_inputs_from_file(
  input_filename: str, ignore_comments: bool = False
) -> List[str]:
  """Lines of input_filename (no trailing newline); '#' lines dropped if
  ignore_comments.

  Args:
    input_filename: a text file.
    ignore_comments: drop lines that start with "#".

  Returns:
    A list of strings, one per line, without the newline.
  """
  with tf.io.gfile.GFile(input_filename, "rb") as f:
    data = f.read()
  try:
    text = data.decode("utf-8")
  except UnicodeDecodeError as e:
    raise ValueError(
      "input file %s is not UTF-8 text: %s" % (input_filename, e)
    ) from e
  lines = text.split("\n")
  if lines and not lines[-1]:
    lines.pop()
  if ignore_comments:
    lines = [l for l in lines if not l.startswith("#")]
  return lines


def write_lines_to_file(lines: Iterable[Any], filename: str) -> None:
  """Writes lines (one per line) to filename, creating its directory.

  As the original, str() of each line is written with its newlines turned
  into spaces, so that one item stays one line.

  Args:
    lines: the lines (str() of each is written).
    filename: the output file; its directory is created.
  """
  directory = os.path.dirname(filename)
  if directory:
    tf.io.gfile.makedirs(directory)
  with tf.io.gfile.GFile(filename, "w") as f:
    # One write, even of nothing: GFile creates the file on its first write,
    # and no inputs must still give an (empty) output file.
    f.write("".join("%s\n" % str(line).replace("\n", " ") for line in lines))


def _fit(ids: List[int], length: int) -> List[int]:
  """ids truncated or zero-padded to length."""
  return ids[:length] + [0] * max(0, length - len(ids))


def _pad_to_batches(rows: List[List[int]], batch_size: int) -> np.ndarray:
  """rows plus copies of the first row up to a multiple of batch_size."""
  if rows:
    rows = rows + [rows[0]] * (-len(rows) % batch_size)
  return np.array(rows, dtype=np.int32)


def encode_inputs(
  inputs: Sequence[str],
  vocabulary: Vocabularies,
  model_type: str,
  batch_size: int,
  sequence_length: SequenceLength,
  eos_id: int = 1,
  unscored_prefix: Optional[Sequence[str]] = None,
) -> np.ndarray:
  """Encodes input strings for decoding or scoring.

  Each string is encoded with the inputs vocabulary; the line's
  unscored_prefix is encoded in front with negated ids (context the score
  skips); EOS ends
  the ids unless model_type is "lm" (an LM continues its input). Rows are
  truncated / zero-padded to sequence_length, and copies of the first row
  pad the list to a whole number of batches.

  Example:
    >>> from transformer import vocabulary
    >>> encode_inputs(["ab"], vocabulary.ByteVocabulary(), "bitransformer",
    ...               batch_size=2, sequence_length=4)
    array([[100, 101,   1,   0],
           [100, 101,   1,   0]], dtype=int32)

  Args:
    inputs: the input strings.
    vocabulary: a Vocabulary, or an (inputs, targets) pair of them.
    model_type: "bitransformer", "lm", "delimited_lm", "aligned" or
      "bi_student_teacher".
    batch_size: the number of sequences per batch.
    sequence_length: the length of each row in tokens (int).
    eos_id: the EOS id (1).
    unscored_prefix: one string per input, encoded in front of it with negated
      ids, which scoring skips (None: no prefixes). A single string is the
      prefix of every input.

  Returns:
    int32 array [ceil(n / batch_size) * batch_size, sequence_length].
  """
  vocab = inputs_vocabulary(vocabulary)
  rows = []
  if isinstance(unscored_prefix, str):
    unscored_prefix = [unscored_prefix] * len(inputs)
  for line_num, line in enumerate(inputs):
    ids = list(vocab.encode(line.strip()))
    if unscored_prefix:
      prefix = unscored_prefix[line_num].strip()
      ids = [-i for i in vocab.encode(prefix)] + ids
    if model_type != "lm":
      ids.append(eos_id)
    rows.append(_fit(ids, sequence_length))
  return _pad_to_batches(rows, batch_size)


def encode_delimited_lm(
  inputs: Sequence[str],
  targets: Sequence[str],
  vocabulary: Vocabularies,
  batch_size: int,
  sequence_length: SequenceLength,
  eos_id: int = 1,
  include_final_eos: bool = True,
) -> np.ndarray:
  """Encodes (input, target) string pairs as one delimited LM sequence.

  Each row is input ids, EOS, target ids (and a final EOS if
  include_final_eos), truncated / zero-padded to sequence_length; copies of
  the first row pad the list to a whole number of batches.

  Args:
    inputs: the input strings.
    targets: the target strings, one per input.
    vocabulary: a Vocabulary, or an (inputs, targets) pair of them.
    batch_size: the number of sequences per batch.
    sequence_length: the length of each row in tokens (int).
    eos_id: the EOS id (1).
    include_final_eos: append EOS after the target ids.

  Returns:
    int32 array [ceil(n / batch_size) * batch_size, sequence_length].

  Raises:
    ValueError: if inputs and targets differ in number.
  """
  if len(inputs) != len(targets):
    raise ValueError(
      "encode_delimited_lm: %d inputs but %d targets"
      % (len(inputs), len(targets))
    )
  rows = []
  for x, y in zip(inputs, targets):
    ids = (
      list(inputs_vocabulary(vocabulary).encode(x.strip()))
      + [eos_id]
      + list(targets_vocabulary(vocabulary).encode(y.strip()))
    )
    if include_final_eos:
      ids.append(eos_id)
    rows.append(_fit(ids, sequence_length))
  return _pad_to_batches(rows, batch_size)


def _call_input_fn(input_fn: Callable, estimator) -> tf.data.Dataset:
  """input_fn() or, for the original's input_fn(params), with batch_size."""
  if inspect.signature(input_fn).parameters:
    return input_fn({"batch_size": estimator.batch_size})
  return input_fn()


def _feature_rows(
  dataset: tf.data.Dataset, keys: Sequence[str], lengths: Dict[str, int]
) -> Dict[str, np.ndarray]:
  """{key: int32 [n, length]} from a dataset of examples or batches."""
  rows = {k: [] for k in keys}
  for element in dataset.as_numpy_iterator():
    for k in keys:
      if k not in element:
        raise ValueError(
          "the dataset has no %r feature (it has %s)" % (k, sorted(element))
        )
      value = np.asarray(element[k])
      for row in value if value.ndim == 2 else [value]:
        rows[k].append(_fit([int(i) for i in row], lengths[k]))
  return {
    k: np.array(v, np.int32).reshape([-1, lengths[k]]) for k, v in rows.items()
  }


# ----------------------------------------------------------------------------
# Decoding.


def _decode_ids_to_text(
  estimator,
  input_ids: np.ndarray,
  vocabulary,
  checkpoint_path=None,
  **decode_kwargs,
) -> List[str]:
  outputs = driver_eval.decode_ids(
    estimator, input_ids, checkpoint_path=checkpoint_path, **decode_kwargs
  )
  vocab = targets_vocabulary(vocabulary)
  return [vocab.decode([int(i) for i in row]) for row in outputs]


@eager_in_legacy_mode
def decode_strings(
  estimator,
  strings: Sequence[str],
  vocabulary=None,
  checkpoint_path=None,
  **decode_kwargs,
) -> List[str]:
  """Decoded output strings for input strings (greedy unless configured).

  Args:
    estimator: the driver.Estimator holding the model and its variables.
    strings: the input strings.
    vocabulary: a Vocabulary, or an (inputs, targets) pair of them. Default: the
      estimator's.
    checkpoint_path: the checkpoint to use (default: the latest in the
      model_dir).

  Returns:
    The decoded strings, one per input.
  """
  vocabulary = vocabulary or estimator.vocabulary
  ids = driver_eval.encode_strings(
    inputs_vocabulary(vocabulary), strings, estimator.sequence_length["inputs"]
  )
  return _decode_ids_to_text(
    estimator, ids, vocabulary, checkpoint_path, **decode_kwargs
  )


@gin.configurable(module=_GIN_MODULE)
@eager_in_legacy_mode
def decode(
  estimator: Estimator,
  input_fn: Callable[..., tf.data.Dataset],
  vocabulary: Vocabularies,
  checkpoint_path: Optional[str] = None,
) -> List[str]:
  """Decoded strings for the "inputs" of input_fn()'s examples or batches.

  Args:
    estimator: the driver.Estimator holding the model and its variables.
    input_fn: a function returning a tf.data.Dataset of examples or batches
      (dicts of int features); it may take a params dict with "batch_size".
    vocabulary: a Vocabulary, or an (inputs, targets) pair of them. Decodes the
      outputs with the targets vocabulary.
    checkpoint_path: the checkpoint to use (default: the latest in the
      model_dir).

  Returns:
    A list of decoded strings, one per example.
  """
  length = estimator.sequence_length["inputs"]
  ids = _feature_rows(
    _call_input_fn(input_fn, estimator), ["inputs"], {"inputs": length}
  )["inputs"]
  if not len(ids):  # pylint: disable=g-explicit-length-test
    return []
  return _decode_ids_to_text(estimator, ids, vocabulary, checkpoint_path)


def _checkpoint_step(estimator, checkpoint_path) -> int:
  if checkpoint_path is None:
    checkpoint_path = estimator.latest_checkpoint()
  if checkpoint_path is None:
    raise ValueError("no checkpoint in model_dir %r" % estimator.model_dir)
  return get_step_from_checkpoint_path(checkpoint_path)


@gin.configurable(module=_GIN_MODULE)
@eager_in_legacy_mode
def decode_from_file(
  estimator: Estimator,
  vocabulary: Vocabularies,
  model_type: str,
  batch_size: int,
  sequence_length: SequenceLength,
  checkpoint_path: Optional[str] = None,
  input_filename: str = gin.REQUIRED,
  output_filename: str = gin.REQUIRED,
  eos_id: int = 1,
  repeats: int = 1,
) -> List[str]:
  """Decodes each line of input_filename into `<output_filename>-<step>`.

  With repeats > 1 each input is decoded that many times (useful with
  sampling). Returns the decoded strings.

  Args:
    estimator: the driver.Estimator holding the model and its variables.
    vocabulary: a Vocabulary, or an (inputs, targets) pair of them.
    model_type: "bitransformer", "lm", "delimited_lm", "aligned" or
      "bi_student_teacher".
    batch_size: unused (the estimator's batch size is used).
    sequence_length: unused (the estimator's lengths are used).
    checkpoint_path: the checkpoint to use (default: the latest in the
      model_dir).
    input_filename: a text file with one input per line.
    output_filename: the decodes go to <output_filename>-<step>, one per line.
    eos_id: the EOS id (1).
    repeats: decode each input this many times (useful with sampling).

  Returns:
    The list of decoded strings (repeats per input).
  """
  del batch_size, sequence_length
  _required(
    "decode_from_file",
    input_filename=input_filename,
    output_filename=output_filename,
  )
  inputs = [
    s for s in get_inputs_from_file(input_filename) for _ in range(repeats)
  ]
  length = estimator.sequence_length["inputs"]
  ids = encode_inputs(inputs, vocabulary, model_type, 1, length, eos_id)
  decodes = _decode_ids_to_text(estimator, ids, vocabulary, checkpoint_path)
  out = "%s-%d" % (
    output_filename,
    _checkpoint_step(estimator, checkpoint_path),
  )
  write_lines_to_file(decodes, out)
  logging.info("decode_from_file: %d lines -> %s", len(decodes), out)
  return decodes


def named_datasets(
  dataset_fn, sequence_length, vocabulary, dataset_split, what: str
):
  """[(name, dataset, EvalDataset or None)] from a dataset function."""
  result = dataset_fn(
    sequence_length=sequence_length,
    vocabulary=vocabulary,
    dataset_split=dataset_split,
  )
  if isinstance(result, tf.data.Dataset):
    return [(what, result, None)]
  out = []
  for item in result:
    if isinstance(item, tf.data.Dataset):
      out.append(("%s_%d" % (what, len(out)), item, None))
    else:
      out.append((item.name, item.dataset_fn(), item))
  if not out:
    raise ValueError("%s: the dataset function returned no datasets" % what)
  return out


def decode_examples(
  estimator, dataset: tf.data.Dataset, vocabulary, checkpoint_path=None
) -> Dict[str, List[str]]:
  """{"inputs", "predictions"[, "targets"]} texts of a dataset's examples,
  predictions decoded greedily from the inputs.
  """
  keys = ["inputs"] + (["targets"] if "targets" in dataset.element_spec else [])
  rows = _feature_rows(dataset, keys, estimator.sequence_length)
  texts = {
    "predictions": _decode_ids_to_text(
      estimator, rows["inputs"], vocabulary, checkpoint_path
    )
  }
  for key, vocab in (
    ("inputs", inputs_vocabulary(vocabulary)),
    ("targets", targets_vocabulary(vocabulary)),
  ):
    if key in rows:
      texts[key] = [vocab.decode([int(i) for i in r]) for r in rows[key]]
  return texts


def text_metrics(
  eval_dataset, targets: List[str], predictions: List[str]
) -> Dict[str, float]:
  """An EvalDataset's metric_fns on postprocessed targets and predictions."""
  if eval_dataset is None or not eval_dataset.metric_fns:
    return {}
  postprocess = eval_dataset.postprocess_fn or (lambda s, **_: s)
  targets = [postprocess(t, example=None, is_target=True) for t in targets]
  predictions = [postprocess(p, example=None) for p in predictions]
  metrics = {}
  for metric_fn in eval_dataset.metric_fns:
    metrics.update(metric_fn(targets, predictions))
  return {k: float(v) for k, v in metrics.items()}


@gin.configurable(module=_GIN_MODULE)
@eager_in_legacy_mode
def decode_from_dataset(
  estimator: Estimator,
  vocabulary: Vocabularies,
  model_type: str,
  batch_size: int,
  sequence_length: SequenceLength,
  checkpoint_path: Optional[str] = None,
  infer_dataset_fn: Callable[..., Any] = gin.REQUIRED,
  dataset_split: str = "validation",
  decode_output_dir: str = gin.REQUIRED,
) -> Dict[str, List[str]]:
  """Decodes the inputs of every dataset infer_dataset_fn returns.

  infer_dataset_fn(sequence_length=, vocabulary=, dataset_split=) returns a
  dataset or a list of EvalDatasets of examples with "inputs" (and
  optionally "targets") ids. For each, `<decode_output_dir>/<name>_inputs`,
  `<name>_targets` and `<name>_predictions-<step>` get one line per example;
  an EvalDataset's metric_fns are computed on the postprocessed texts and
  printed. Returns {name: decoded strings}.

  Args:
    estimator: the driver.Estimator holding the model and its variables.
    vocabulary: a Vocabulary, or an (inputs, targets) pair of them.
    model_type: "bitransformer", "lm", "delimited_lm", "aligned" or
      "bi_student_teacher".
    batch_size: the number of sequences per batch.
    sequence_length: an int, or a {"inputs": n, "targets": m} dict: the feature
      lengths in tokens.
    checkpoint_path: the checkpoint to use (default: the latest in the
      model_dir).
    infer_dataset_fn: called as fn(sequence_length=, vocabulary=,
      dataset_split=); returns a dataset or a list of EvalDatasets of examples
      with "inputs" ids.
    dataset_split: the dataset split, e.g. "train" or "validation".
    decode_output_dir: the directory for the inputs, targets and predictions
      files.

  Returns:
    {dataset name: list of decoded strings}.
  """
  del model_type, batch_size
  _required(
    "decode_from_dataset",
    infer_dataset_fn=infer_dataset_fn,
    decode_output_dir=decode_output_dir,
  )
  step = _checkpoint_step(estimator, checkpoint_path)
  results = {}
  for name, dataset, eval_dataset in named_datasets(
    infer_dataset_fn,
    sequence_length,
    vocabulary,
    dataset_split,
    "decode_from_dataset",
  ):
    texts = decode_examples(estimator, dataset, vocabulary, checkpoint_path)
    base = os.path.join(decode_output_dir, name)
    write_lines_to_file(texts["inputs"], base + "_inputs")
    write_lines_to_file(
      texts["predictions"], "%s_predictions-%d" % (base, step)
    )
    if "targets" in texts:
      write_lines_to_file(texts["targets"], base + "_targets")
      metrics = text_metrics(
        eval_dataset, texts["targets"], texts["predictions"]
      )
      if metrics:
        print(
          "decode %s (step %d): %s"
          % (
            name,
            step,
            "  ".join("%s %.4f" % kv for kv in sorted(metrics.items())),
          ),
          flush=True,
        )
    results[name] = texts["predictions"]
  return results


@gin.configurable(module=_GIN_MODULE)
@eager_in_legacy_mode
def infer_model(
  estimator: Estimator,
  vocabulary: Vocabularies,
  sequence_length: SequenceLength,
  batch_size: int,
  model_type: str,
  model_dir: str,
  eval_checkpoint_step: CheckpointStep,
  checkpoint_paths: Optional[Sequence[str]] = None,
  decode_fn: Callable[..., Any] = decode_from_file,
) -> None:
  """Runs decode_fn for each checkpoint to evaluate.

  Args:
    estimator: the driver.Estimator holding the model and its variables.
    vocabulary: a Vocabulary, or an (inputs, targets) pair of them.
    sequence_length: an int, or a {"inputs": n, "targets": m} dict: the feature
      lengths in tokens.
    batch_size: the number of sequences per batch.
    model_type: "bitransformer", "lm", "delimited_lm", "aligned" or
      "bi_student_teacher".
    model_dir: the directory of the checkpoints.
    eval_checkpoint_step: which checkpoints to use: an int step, a list of
      steps, -1 (the latest), "all" or None (see get_checkpoint_iterator).
    checkpoint_paths: the checkpoints to decode with (default:
      get_checkpoint_iterator(eval_checkpoint_step, model_dir)).
    decode_fn: called as decode_fn(estimator, vocabulary, model_type,
      batch_size, sequence_length, checkpoint_path=path), e.g. decode_from_file.
  """
  if checkpoint_paths is None:
    # As eval_model: waiting for new checkpoints ends with the training's
    # last one.
    checkpoint_paths = get_checkpoint_iterator(
      eval_checkpoint_step, model_dir, last_step=estimator.total_train_steps
    )
  for path in checkpoint_paths:
    decode_fn(
      estimator,
      vocabulary,
      model_type,
      batch_size,
      sequence_length,
      checkpoint_path=path,
    )


# ----------------------------------------------------------------------------
# Scoring.


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
  dataset = _call_input_fn(input_fn, estimator)
  keys = [k for k in ("inputs", "targets") if k in dataset.element_spec]
  rows = _feature_rows(dataset, keys, lengths)
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
  dataset = _call_input_fn(input_fn, estimator)
  keys = [k for k in ("inputs", "targets") if k in dataset.element_spec]
  rows = _feature_rows(dataset, keys, lengths)
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
  _required(
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
  _required("score_from_dataset", score_postprocess_fn=score_postprocess_fn)
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
