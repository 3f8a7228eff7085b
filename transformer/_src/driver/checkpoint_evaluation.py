"""Evaluating checkpoints with the driver Estimator.

`eval_model` decodes (and scores) the eval datasets at each checkpoint and
writes the metrics, targets and outputs the original wrote;
`perplexity_eval` computes teacher-forced metrics of the train and eval
datasets at each checkpoint; `evaluate_dataset` is their teacher-forced
step over one dataset. transformer/utils.py re-exports the original's
names.
"""

from __future__ import annotations

import functools
import os
import random
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from absl import logging
import tensorflow as tf

from transformer._src.data import packing
from transformer._src.driver import decode as driver_decode
from transformer._src.driver import decode_io
from transformer._src.driver import estimator as driver
from transformer._src.driver import eval_outputs
from transformer._src.driver import evaluation as driver_eval
from transformer._src.driver import scoring as driver_scoring
from transformer._src.driver.checkpoint_iterator import CheckpointStep
from transformer._src.driver.checkpoint_iterator import get_checkpoint_iterator
from transformer._src.driver.config import SequenceLength
from transformer._src.driver.config import Vocabularies
from transformer._src.driver.config import get_step_from_checkpoint_path
from transformer._src.driver.step_graphs import MODEL_FEATURES
from transformer._src.driver.train import filter_features
from transformer._src.driver.train import fixed_length_examples

__all__ = [
  "eval_model",
  "evaluate_dataset",
  "perplexity_eval",
]


def evaluate_dataset(
  estimator: driver.Estimator,
  dataset: tf.data.Dataset,
  sequence_length: SequenceLength,
  batch_size: int,
  checkpoint_path: Optional[str] = None,
  max_batches: Optional[int] = None,
) -> Dict[str, float]:
  """Teacher-forced metrics of examples in `dataset` (see driver_eval).

  Args:
    estimator: the driver.Estimator holding the model and its variables.
    dataset: a dataset of unbatched examples (dicts of int features).
    sequence_length: an int, or a {"inputs": n, "targets": m} dict: the feature
      lengths in tokens.
    batch_size: the number of sequences per batch.
    checkpoint_path: the checkpoint to use (default: the latest in the
      model_dir).
    max_batches: evaluate at most this many batches (None: all).

  Returns:
    {metric name: float} (see Estimator.evaluate).
  """
  dataset = fixed_length_examples(dataset, sequence_length).batch(batch_size)
  return driver_eval.evaluate(estimator, dataset, checkpoint_path, max_batches)


def _print_metrics(what: str, name: str, step: int, metrics) -> None:
  """One stdout line of a dataset's metrics at a checkpoint."""
  print(
    "%s %s (step %d): %s"
    % (
      what,
      name,
      step,
      "  ".join("%s %.4f" % kv for kv in sorted(metrics.items())),
    ),
    flush=True,
  )


@driver.eager_in_legacy_mode
def eval_model(
  estimator: Union[driver.Estimator, Callable[[], driver.Estimator]],
  vocabulary: Vocabularies,
  sequence_length: Optional[SequenceLength],
  batch_size: int,
  dataset_split: str,
  model_dir: str,
  eval_dataset_fn: Callable[..., Any],
  eval_summary_dir: Optional[str],
  eval_checkpoint_step: CheckpointStep,
  eval_with_score: bool = False,
  output_eval_examples: bool = True,
  eval_dir_suffix: Optional[str] = None,
  score_with_estimator_fn: Callable = driver_scoring.score_with_estimator,
  *,
  max_batches: Optional[int] = None,
) -> Optional[Dict[str, Dict[str, float]]]:
  """Evaluates checkpoints by the metric_fns of EvalDatasets, as the original.

  eval_dataset_fn(sequence_length=, vocabulary=, dataset_split=) returns
  EvalDatasets; those without metric_fns are skipped (none left: logged,
  nothing written, None returned). Each dataset_fn() is read once: its
  "targets_pretokenized" texts through postprocess_fn(text, example=,
  is_target=True) are the targets ("targets" ids decoded stand in if there
  are none). Then, for each checkpoint get_checkpoint_iterator names, the
  datasets' examples, one after the other in batches of batch_size, are
  decoded (`decode`; with eval_with_score scored by
  score_with_estimator_fn instead, the scores being the predictions); each
  output goes through postprocess_fn(output, example=) and each metric_fn
  gets (targets, predictions).

  Written to one directory, eval_summary_dir or
  `<model_dir>/<dataset_split>_eval`, plus "_<eval_dir_suffix>" if given:
  TensorBoard events with a scalar `eval/<dataset name>/<metric>` per
  metric at the checkpoint's step (a metric_fn returning a tf.Summary has
  it written as it is) and, with output_eval_examples, the text files
  `<name>_targets` and `<name>_inputs` (the "inputs_pretokenized" values
  as read, e.g. b'...') once, and `<name>_<step>_predictions` per
  checkpoint, one line per example (newlines in a line become spaces).

  With sequence_length None the lengths are those of the longest inputs
  and targets of the examples, and `estimator` must be a callable taking
  sequence_length= (run passes one); a callable estimator is called once,
  before the first checkpoint.

  Args:
    estimator: a driver.Estimator, or a callable returning one.
    vocabulary: a Vocabulary, or an (inputs, targets) pair of them.
    sequence_length: an int or a {"inputs": n, "targets": m} dict: the feature
      lengths in tokens; None: computed from the examples.
    batch_size: the number of examples per batch.
    dataset_split: the dataset split, e.g. "validation".
    model_dir: the directory of the checkpoints.
    eval_dataset_fn: called as fn(sequence_length=, vocabulary=,
      dataset_split=); returns a list of EvalDatasets.
    eval_summary_dir: the directory for the summaries and text files
      (default: <model_dir>/<dataset_split>_eval).
    eval_checkpoint_step: which checkpoints to use: an int step, a list of
      steps, -1 (the latest), "all" or None (see get_checkpoint_iterator).
    eval_with_score: score the targets instead of decoding.
    output_eval_examples: write the inputs, targets and predictions files.
    eval_dir_suffix: appended as "_<suffix>" to the summary directory.
    score_with_estimator_fn: the scoring function used with eval_with_score,
      called as fn(estimator, input_fn, step, model_dir, vocabulary,
      num_examples=); the first item of what it returns is the scores.
    max_batches: decode (or score) only the examples of the first this many
      batches; the metrics see those examples only (None: all).

  Returns:
    {dataset name: {metric name: value}} of the last checkpoint (metric_fns
    returning a tf.Summary left out); None when no dataset has metric_fns.

  Raises:
    ValueError: without eval_dataset_fn, or with sequence_length None and an
      estimator that is not callable.
  """
  if eval_dataset_fn is None:
    raise ValueError("Must provide eval_dataset_fn through gin for eval.")
  if sequence_length is None and not callable(estimator):
    raise ValueError(
      "A callable must be passed for the estimator when automatically "
      "computing the sequence length."
    )
  if isinstance(sequence_length, int):
    sequence_length = {"inputs": sequence_length, "targets": sequence_length}
  eval_datasets = eval_outputs.eval_datasets_with_metrics(
    eval_dataset_fn(
      sequence_length=sequence_length,
      vocabulary=vocabulary,
      dataset_split=dataset_split,
    )
  )
  if not eval_datasets:
    logging.info(
      "All provided EvalDatasets have metric_fns=[]; eval is not possible."
    )
    return None
  summary_dir = eval_outputs.eval_summary_dir(
    eval_summary_dir, model_dir, dataset_split, eval_dir_suffix
  )
  writer = tf.summary.create_file_writer(summary_dir)
  logging.info("Caching evaluation examples.")
  max_lengths = {"inputs": 0, "targets": 0}
  cached = {}
  for eval_dataset in eval_datasets:
    cached[eval_dataset.name] = eval_outputs.cache_examples(
      eval_dataset, vocabulary, max_lengths
    )
    if output_eval_examples:
      for kind in ("targets", "inputs"):
        decode_io.write_lines_to_file(
          getattr(cached[eval_dataset.name], kind),
          os.path.join(summary_dir, "%s_%s" % (eval_dataset.name, kind)),
        )
  if sequence_length is None:
    logging.info("Setting sequence lengths to %s", max_lengths)
    sequence_length = max_lengths
    estimator = functools.partial(estimator, sequence_length=sequence_length)
  elif any(v < max_lengths.get(k, 0) for k, v in sequence_length.items()):
    logging.warning(
      "Given sequence lengths are insufficient for some evaluation inputs "
      "or targets; they will be truncated. Got: %s, max lengths: %s",
      sequence_length,
      max_lengths,
    )
  elif any(v > max_lengths.get(k, v) for k, v in sequence_length.items()):
    logging.warning(
      "Given sequence lengths are longer than necessary for some evaluation "
      "inputs or targets. Got: %s, max lengths: %s",
      sequence_length,
      max_lengths,
    )
  if callable(estimator):
    estimator = estimator()
  input_fn = eval_outputs.combined_input_fn(
    eval_datasets, batch_size, sequence_length, MODEL_FEATURES
  )
  if max_batches is not None:
    full_input_fn = input_fn
    input_fn = lambda params=None: full_input_fn(params).take(max_batches)
  num_examples = sum(len(c.examples) for c in cached.values())
  results = {}
  for path in get_checkpoint_iterator(
    eval_checkpoint_step, model_dir, last_step=estimator.total_train_steps
  ):
    logging.info("Checkpoint path %s", path)
    step = get_step_from_checkpoint_path(path)
    if eval_with_score:
      outputs = list(
        score_with_estimator_fn(
          estimator,
          input_fn,
          step,
          model_dir,
          vocabulary,
          num_examples=num_examples,
        )[0]
      )
    else:
      outputs = [
        d.decode("utf-8") if isinstance(d, bytes) else d
        for d in driver_decode.decode(estimator, input_fn, vocabulary, path)
      ]
    for eval_dataset in eval_datasets:
      name = eval_dataset.name
      size = len(cached[name].examples)
      predictions = eval_outputs.predictions_of(
        eval_dataset, outputs[:size], cached[name]
      )
      del outputs[:size]
      if output_eval_examples:
        decode_io.write_lines_to_file(
          predictions,
          os.path.join(summary_dir, "%s_%d_predictions" % (name, step)),
        )
      targets = cached[name].targets[: len(predictions)]
      metrics = {}
      for metric_fn in eval_dataset.metric_fns:
        result = metric_fn(targets, predictions)
        if isinstance(result, tf.compat.v1.Summary):
          logging.info("Precomputed summary at step %d", step)
          eval_outputs.write_summary(writer, step, result)
          continue
        scalars = {}
        for metric, value in result.items():
          tag = "eval/%s/%s" % (name, metric)
          logging.info("%s at step %d: %.3f", tag, step, value)
          scalars[tag] = value
          metrics[metric] = float(value)
        eval_outputs.write_summary(
          writer, step, eval_outputs.summary_of(scalars)
        )
      results[name] = metrics
      _print_metrics("eval", name, step, metrics)
    expected_pad = -num_examples % batch_size
    if max_batches is None and outputs and len(outputs) != expected_pad:
      raise ValueError(
        "%d padded outputs, %d expected." % (len(outputs), expected_pad)
      )
  writer.close()
  return results


def _perplexity_eval_datasets(
  eval_dataset_fn,
  train_dataset_fn,
  sequence_length,
  vocabulary,
  dataset_split,
) -> List[Tuple[str, Callable[[], tf.data.Dataset]]]:
  """(name, dataset_fn) pairs of perplexity_eval, as the original chose them."""
  if eval_dataset_fn is None:
    if train_dataset_fn is None:
      raise ValueError(
        "for perplexity_eval, "
        "must provide one of eval_dataset_fn and train_dataset_fn"
      )
    logging.warning("Using train_dataset_fn for perplexity eval")
    return [
      (
        "eval",
        functools.partial(
          train_dataset_fn,
          sequence_length=sequence_length,
          vocabulary=vocabulary,
          dataset_split=dataset_split,
        ),
      )
    ]
  result = eval_dataset_fn(
    sequence_length=sequence_length,
    vocabulary=vocabulary,
    dataset_split=dataset_split,
  )
  if isinstance(result, tf.data.Dataset):
    return [("eval", lambda: result)]
  return [
    ("eval_%d" % i, lambda ds=item: ds)
    if isinstance(item, tf.data.Dataset)
    else (item.name, item.dataset_fn)
    for i, item in enumerate(result)
  ]


@driver.eager_in_legacy_mode
def perplexity_eval(
  estimator: driver.Estimator,
  vocabulary: Vocabularies,
  sequence_length: SequenceLength,
  batch_size: int,
  dataset_split: str,
  model_dir: str,
  eval_dataset_fn: Optional[Callable[..., Any]],
  train_dataset_fn: Optional[Callable[..., tf.data.Dataset]],
  eval_checkpoint_step: CheckpointStep,
  perplexity_eval_steps: int,
  eval_dir_suffix: Optional[str] = None,
) -> Dict[str, Dict[str, float]]:
  """run's "perplexity_eval" mode: teacher-forced metrics of each dataset.

  The datasets are eval_dataset_fn's EvalDatasets (all of them, metric_fns
  or not) or, without one, train_dataset_fn's examples named "eval". For
  each checkpoint and dataset, after seeding TensorFlow's and Python's
  random generators with 12345 as the original did, exactly
  perplexity_eval_steps batches of batch_size are evaluated: the dataset's
  examples, then all-zero examples (which count only in the "loss"
  average, as zero). The original's Estimator.evaluate(name=N) with N =
  `<name>_<split>_<batch_size * perplexity_eval_steps>` (+
  "_<eval_dir_suffix>") wrote to `<model_dir>/eval_<N>`; so does this:
  scalars loss, neg_log_perplexity, token_accuracy, sequence_accuracy,
  mean_label, num_eval_tokens and max_targets_length, and the
  checkpoint_path as a text tensor, at the checkpoint's step.

  Args:
    estimator: the driver.Estimator holding the model and its variables.
    vocabulary: a Vocabulary, or an (inputs, targets) pair of them.
    sequence_length: a {"inputs": n, "targets": m} dict: the feature lengths.
    batch_size: the number of examples per batch.
    dataset_split: the dataset split, e.g. "validation".
    model_dir: the directory of the checkpoints (and of the eval_* dirs).
    eval_dataset_fn: called as fn(sequence_length=, vocabulary=,
      dataset_split=); returns a list of EvalDatasets (None: use
      train_dataset_fn).
    train_dataset_fn: called as fn(sequence_length=, vocabulary=,
      dataset_split=); returns a dataset of examples.
    eval_checkpoint_step: which checkpoints to use: an int step, a list of
      steps, -1 (the latest), "all" or None (see get_checkpoint_iterator).
    perplexity_eval_steps: the number of batches evaluated per dataset.
    eval_dir_suffix: appended as "_<suffix>" to each evaluation name.

  Returns:
    {dataset name: {metric name: value}} of the last checkpoint.

  Raises:
    ValueError: with neither eval_dataset_fn nor train_dataset_fn.
  """
  datasets = _perplexity_eval_datasets(
    eval_dataset_fn,
    train_dataset_fn,
    sequence_length,
    vocabulary,
    dataset_split,
  )
  results = {}
  for path in get_checkpoint_iterator(
    eval_checkpoint_step, model_dir, last_step=estimator.total_train_steps
  ):
    step = get_step_from_checkpoint_path(path)
    for name, dataset_fn in datasets:
      tf.random.set_seed(12345)
      random.seed(12345)
      metrics = evaluate_dataset(
        estimator,
        packing.pad_dataset_with_zeroed_out_examples(
          dataset_fn().map(filter_features)
        ),
        estimator.sequence_length,
        batch_size,
        path,
        perplexity_eval_steps,
      )
      written = {k: metrics[k] for k in eval_outputs.PERPLEXITY_METRICS}
      logging.info(
        "Saving dict for global step %d: %s",
        step,
        ", ".join("%s = %s" % kv for kv in sorted(written.items())),
      )
      eval_dir = os.path.join(
        model_dir,
        "eval_"
        + eval_outputs.perplexity_eval_name(
          name,
          dataset_split,
          batch_size * perplexity_eval_steps,
          eval_dir_suffix,
        ),
      )
      writer = tf.summary.create_file_writer(eval_dir)
      eval_outputs.write_summary(writer, step, eval_outputs.summary_of(written))
      eval_outputs.write_summary(
        writer, step, eval_outputs.text_summary("checkpoint_path", path)
      )
      writer.close()
      results[name] = metrics
      _print_metrics("perplexity_eval", name, step, metrics)
  return results
