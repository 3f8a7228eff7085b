"""What evaluation writes, laid out as the original utils.py wrote it.

eval_model (modes "eval" / "score_eval") writes to ONE summary directory,
`eval_summary_dir` or `<model_dir>/<dataset_split>_eval`, with
"_<eval_dir_suffix>" appended if given: per EvalDataset `<name>_targets`
and `<name>_inputs` (once) and `<name>_<step>_predictions` (per checkpoint)
text files, and event records tagged `eval/<name>/<metric>` (or a metric
function's own tf.Summary). perplexity_eval writes what the original's
Estimator.evaluate(name=...) wrote: an event file in
`<model_dir>/eval_<name>` with the metrics (tags as named, e.g. "loss",
"neg_log_perplexity") and a "checkpoint_path" text tensor.

Event records are tf.compat.v1.Summary protos with simple_value scalars, as
the original's tf.summary.FileWriter wrote them, written through
tf.summary.experimental.write_raw_pb.
"""

from __future__ import annotations

import inspect
import os
from typing import Any, Callable, Dict, List, Sequence

from absl import logging
import numpy as np
import tensorflow as tf

from transformer._src.data import packing
from transformer._src.data.sources import EvalDataset
from transformer._src.driver.config import targets_vocabulary

__all__ = [
  "EvalExamples",
  "PERPLEXITY_METRICS",
  "cache_examples",
  "combined_input_fn",
  "eval_datasets_with_metrics",
  "eval_summary_dir",
  "perplexity_eval_name",
  "predictions_of",
  "summary_of",
  "text_summary",
  "write_summary",
]

# The tags of the original's perplexity eval (Estimator.evaluate wrote its
# loss and the model_fn's metrics; global_step is not written).
PERPLEXITY_METRICS = (
  "loss",
  "neg_log_perplexity",
  "token_accuracy",
  "sequence_accuracy",
  "mean_label",
  "num_eval_tokens",
  "max_targets_length",
)


def eval_summary_dir(
  eval_summary_dir_or_none, model_dir: str, dataset_split: str, suffix
) -> str:
  """The directory eval_model writes to (see the module docstring)."""
  path = eval_summary_dir_or_none or os.path.join(
    model_dir, "%s_eval" % dataset_split
  )
  if suffix is not None:
    path += "_%s" % suffix
  return path


def perplexity_eval_name(
  dataset_name: str, dataset_split: str, num_examples: int, suffix
) -> str:
  """The Estimator.evaluate name of a perplexity eval (its summaries go to
  `<model_dir>/eval_<name>`): the example count keeps runs comparable.
  """
  name = "%s_%s_%d" % (dataset_name, dataset_split, num_examples)
  if suffix is not None:
    name += "_%s" % suffix
  return name


def eval_datasets_with_metrics(eval_datasets) -> List[EvalDataset]:
  """The EvalDatasets (or plain tuples) that have metric_fns, as
  EvalDatasets; the others are logged as skipped.
  """
  kept = []
  for eval_dataset in eval_datasets:
    if isinstance(eval_dataset, tf.data.Dataset) or not eval_dataset[3]:
      name = getattr(eval_dataset, "name", "a dataset without metric_fns")
      logging.info("Skipping %s because metric_fns is empty", name)
      continue
    kept.append(EvalDataset(*eval_dataset))
  return kept


class EvalExamples:
  """One EvalDataset's examples as read once before evaluation.

  Attributes:
    examples: the examples (dicts of numpy values), unbatched.
    inputs: the "inputs_pretokenized" values (bytes, as read).
    targets: the "targets_pretokenized" texts through postprocess_fn(text,
      example=, is_target=True); without that feature, the "targets" ids
      decoded with the targets vocabulary stand in.
  """

  def __init__(self, examples, inputs, targets):
    self.examples = examples
    self.inputs = inputs
    self.targets = targets


def _postprocess(eval_dataset: EvalDataset) -> Callable[..., Any]:
  return eval_dataset.postprocess_fn or (lambda value, **_: value)


def _text(value) -> str:
  return value.decode("utf-8") if isinstance(value, bytes) else value


def cache_examples(
  eval_dataset: EvalDataset, vocabulary, max_lengths: Dict[str, int]
) -> EvalExamples:
  """Reads eval_dataset.dataset_fn() once; raises max_lengths to the
  longest "inputs" / "targets" seen.
  """
  postprocess = _postprocess(eval_dataset)
  examples, inputs, targets = [], [], []
  for ex in eval_dataset.dataset_fn().as_numpy_iterator():
    for key in max_lengths:
      if key in ex:
        max_lengths[key] = max(max_lengths[key], len(ex[key]))
    examples.append(ex)
    if "inputs_pretokenized" in ex:
      inputs.append(ex["inputs_pretokenized"])
    if "targets_pretokenized" in ex:
      text = _text(ex["targets_pretokenized"])
    elif "targets" in ex:
      ids = [int(i) for i in np.asarray(ex["targets"]).reshape([-1])]
      text = targets_vocabulary(vocabulary).decode(ids)
    else:
      continue
    targets.append(postprocess(text, example=ex, is_target=True))
  return EvalExamples(examples, inputs, targets)


def predictions_of(
  eval_dataset: EvalDataset, outputs: Sequence[Any], cached: EvalExamples
) -> List[Any]:
  """postprocess_fn(output, example=) of each of the dataset's examples."""
  postprocess = _postprocess(eval_dataset)
  return [
    postprocess(output, example=ex)
    for output, ex in zip(outputs, cached.examples)
  ]


def _accepts(fn: Callable, name: str) -> bool:
  try:
    params = inspect.signature(fn).parameters.values()
  except (TypeError, ValueError):
    return True
  return any(p.name == name or p.kind == p.VAR_KEYWORD for p in params)


def combined_input_fn(
  eval_datasets: Sequence[EvalDataset],
  batch_size: int,
  sequence_length,
  model_features: Sequence[str],
) -> Callable[..., tf.data.Dataset]:
  """input_fn(params) of every dataset's examples, one after the other.

  Each dataset_fn is called with sequence_length= (when it takes it), its
  model features kept; the examples are batched and the last batch filled
  up with all-zero rows.
  """

  def input_fn(params=None):
    del params
    combined = None
    for eval_dataset in eval_datasets:
      fn = eval_dataset.dataset_fn
      ds = (
        fn(sequence_length=sequence_length)
        if _accepts(fn, "sequence_length")
        else fn()
      )
      ds = ds.map(
        lambda ex: {k: v for k, v in ex.items() if k in model_features}
      )
      combined = ds if combined is None else combined.concatenate(ds)
    combined = combined.batch(batch_size, drop_remainder=False)
    return packing.trim_and_pad_dataset(combined, batch_size)

  return input_fn


def summary_of(scalars: Dict[str, float]) -> tf.compat.v1.Summary:
  """A Summary of simple_value scalars, in the dict's order."""
  summary = tf.compat.v1.Summary()
  for tag, value in scalars.items():
    summary.value.add(tag=tag, simple_value=float(value))
  return summary


def text_summary(tag: str, text: str) -> tf.compat.v1.Summary:
  """A Summary holding `text` as a string tensor (no plugin metadata), as
  Estimator.evaluate wrote its "checkpoint_path".
  """
  summary = tf.compat.v1.Summary()
  summary.value.add(tag=tag, tensor=tf.make_tensor_proto(text, dtype=tf.string))
  return summary


def write_summary(writer, step: int, summary: tf.compat.v1.Summary) -> None:
  """Writes one Summary proto as an event of `step`, then flushes."""
  with writer.as_default():
    tf.summary.experimental.write_raw_pb(
      tf.constant(summary.SerializeToString()), step=step
    )
  writer.flush()
