"""Decoding entry points of utils (the original's names).

Decoding turns input strings or dataset examples into output strings with
the Estimator's compiled decode phase. The gin-configurable functions keep
the original utils.py signatures and gin module; their `estimator` is a
driver.Estimator. transformer/utils.py re-exports them. Scoring is in
scoring.py, the text inputs and outputs both use in decode_io.py.
"""

from __future__ import annotations

import os
from typing import (
  Any,
  Callable,
  Dict,
  List,
  Optional,
  Sequence,
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
from transformer._src.driver.config import get_step_from_checkpoint_path
from transformer._src.driver.config import inputs_vocabulary
from transformer._src.driver.config import targets_vocabulary
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
  "decode",
  "decode_examples",
  "decode_from_dataset",
  "decode_from_file",
  "decode_strings",
  "infer_model",
  "named_datasets",
  "text_metrics",
]


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
  ids = feature_rows(
    call_input_fn(input_fn, estimator), ["inputs"], {"inputs": length}
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
  check_required(
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
  rows = feature_rows(dataset, keys, estimator.sequence_length)
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
  check_required(
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
