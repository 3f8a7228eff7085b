"""utils.run and the driver entry points (train / eval / infer / score).

The gin-configurable functions here keep the original utils.py names,
parameters and gin module ("mesh_tensorflow.transformer.utils"); their
`estimator` argument is a driver.Estimator instead of a TPUEstimator.
transformer/utils.py re-exports them.
"""

from __future__ import annotations

import functools
import os
import random
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from absl import logging
import gin
import tensorflow as tf

import mesh_tensorflow as mtf
from transformer._src.data import packing
from transformer._src.driver import cluster as driver_cluster
from transformer._src.driver import decode as driver_decode
from transformer._src.driver import decode_io
from transformer._src.driver import estimator as driver
from transformer._src.driver import eval_outputs
from transformer._src.driver import evaluation as driver_eval
from transformer._src.driver import export as driver_export
from transformer._src.driver import learning_rate_schedules
from transformer._src.driver import model_fn as driver_model_fn
from transformer._src.driver import scoring as driver_scoring
from transformer._src.driver import tpu as driver_tpu
from transformer._src.driver.checkpoint_iterator import CheckpointStep
from transformer._src.driver.checkpoint_iterator import get_checkpoint_iterator
from transformer._src.driver.config import SequenceLength
from transformer._src.driver.config import Vocabularies
from transformer._src.driver.config import auto_train_steps
from transformer._src.driver.config import compute_batch_size
from transformer._src.driver.config import get_step_from_checkpoint_path
from transformer._src.driver.config import inputs_vocabulary
from transformer._src.driver.config import targets_vocabulary
from transformer._src.driver.mesh_impl_choice import resolve_mesh_impl
from transformer._src.models.builders import build_model

_GIN_MODULE = "mesh_tensorflow.transformer.utils"

RUN_MODES = (
  "train",
  "eval",
  "score_eval",
  "perplexity_eval",
  "infer",
  "score_from_dataset",
  "score_from_strings",
  "export_score",
  "export_infer",
  "export",
)


@driver.eager_in_legacy_mode
def get_estimator(
  model_type,
  vocabulary,
  mesh_shape,
  layout_rules,
  model_dir,
  batch_size,
  sequence_length,
  autostack,
  learning_rate_schedule,
  keep_checkpoint_max,
  save_checkpoints_steps,
  optimizer,
  predict_fn,
  variable_filter,
  ensemble_inputs,
  use_tpu,
  tpu_job_name,
  iterations_per_loop,
  cluster,
  init_checkpoint=None,
  mesh_devices=None,
  score_in_predict_mode=False,
  *,
  log_every_steps: int = 100,
  total_train_steps=None,
  mesh_impl: str = "auto",
  cluster_timeout: float = driver_cluster.DEFAULT_TIMEOUT_SECONDS,
) -> driver.Estimator:
  """A driver.Estimator for the model (the TPUEstimator's replacement).

  Built through the gin-configurable tpu_estimator_model_fn, so its gin
  bindings apply. tpu_job_name / iterations_per_loop are accepted for the
  original's signature; TPUs are not driven from here. With a cluster (the
  `cluster` argument, else TF_CONFIG) the process connects to its tasks and
  the mesh defaults to the "worker" job's devices (driver/cluster.py).
  On a cluster, Grappler's arithmetic optimizer is turned off for the
  process (cluster.disable_placement_dependent_rewrites): its rewrites depend
  on how the ops map to tasks. A one-process run keeps TensorFlow's default,
  as the original did, so its bfloat16 numbers are the original's; to get a
  cluster run's very values in one process, turn the optimizer off there too
  (transformer.main --same_rounding_as_cluster).

  Args:
    model_type: "bitransformer", "lm", "delimited_lm", "aligned" or
      "bi_student_teacher".
    vocabulary: a Vocabulary, or an (inputs, targets) pair of them.
    mesh_shape: an mtf.Shape or a string like "batch:8;model:4": the mesh's
      dims.
    layout_rules: an mtf.LayoutRules or a string like "batch:batch,d_ff:model":
      which tensor dims split over which mesh dims.
    model_dir: the directory of the checkpoints.
    batch_size: the global number of sequences per batch.
    sequence_length: an int, or a {"inputs": n, "targets": m} dict: the feature
      lengths in tokens.
    autostack: combine the model's variables into stacked variables (fewer,
      larger variables).
    learning_rate_schedule: a float, a function of the step (a schedule of
      learning_rate_schedules with its other arguments bound), or None (the
      optimizer's own default rate).
    keep_checkpoint_max: the number of recent checkpoints kept (None: keep all).
    save_checkpoints_steps: write a checkpoint every this many training steps.
    optimizer: an mtf.optimize.Optimizer class or factory (default:
      AdafactorOptimizer).
    predict_fn: a function replacing the default decoding in predict mode,
      called as predict_fn(model, features, variable_dtype).
    variable_filter: a function of an mtf.Variable that says whether to train
      it (e.g. variable_filter_max_size); None trains every variable.
    ensemble_inputs: for an ensemble model, the number of members, each fed its
      own batch (None: one input batch).
    use_tpu: accepted for the original's signature; TPUs are not driven from
      here.
    tpu_job_name: accepted for the original's signature (TPUs are not driven
      from here).
    iterations_per_loop: accepted for the original's signature (steps per TPU
      loop).
    cluster: the cluster whose "worker" tasks hold the mesh: a
      tf.distribute.cluster_resolver resolver, a tf.train.ClusterSpec, a
      {job: [addresses]} dict or a "host:port,host:port" string of the worker
      tasks; None reads TF_CONFIG (no TF_CONFIG: local devices only).
    init_checkpoint: a checkpoint to initialize the variables from when
      model_dir has none.
    mesh_devices: the device names of the mesh's processors (default: the local
      CPUs/GPUs).
    score_in_predict_mode: make predict mode score the given targets instead of
      decoding.
    log_every_steps: log the loss every this many training steps.
    total_train_steps: the training length the learning-rate schedule assumes.
    mesh_impl: "placement", "simd" or "auto" (SIMD on TPU hosts, else
      placement): how the mesh runs (see mesh_impl_choice).
    cluster_timeout: seconds to wait for the cluster's tasks to answer.

  Returns:
    A driver.Estimator.

  Raises:
    ValueError: without a vocabulary, or a mesh larger than the cluster.
    TaskUnavailableError: a task of the cluster does not answer, or (SIMD)
      keeps a restarted task's former incarnation or cannot run collective
      ops (cluster.check_restarted_tasks, cluster.check_collectives).
  """
  del tpu_job_name, iterations_per_loop
  if vocabulary is None:
    raise ValueError(
      "run.vocabulary is required (e.g. "
      "run.vocabulary = @vocabulary.ByteVocabulary())"
    )
  connected = driver_cluster.connect(
    cluster,
    timeout=cluster_timeout,
    collectives=resolve_mesh_impl(mesh_impl) == "simd",
  )
  if connected is not None:
    driver_cluster.disable_placement_dependent_rewrites()
  if connected is not None and not mesh_devices:
    mesh_devices = connected.mesh_devices(mesh_shape)
  model = build_model(
    model_type=model_type,
    input_vocab_size=inputs_vocabulary(vocabulary).vocab_size,
    output_vocab_size=targets_vocabulary(vocabulary).vocab_size,
    layout_rules=layout_rules,
    mesh_shape=mesh_shape,
  )
  model_fn = driver_model_fn.tpu_estimator_model_fn(
    model_type,
    model,
    vocabulary,
    model_dir,
    use_tpu,
    mesh_shape,
    layout_rules,
    batch_size,
    sequence_length,
    autostack,
    keep_checkpoint_max,
    save_checkpoints_steps,
    learning_rate_schedule=learning_rate_schedule,
    optimizer=optimizer,
    predict_fn=predict_fn,
    score_in_predict_mode=score_in_predict_mode,
    variable_filter=variable_filter,
    init_checkpoint=init_checkpoint,
    ensemble_inputs=ensemble_inputs,
    mesh_devices=mesh_devices,
    mesh_impl=mesh_impl,
  )
  estimator = model_fn.estimator
  estimator.log_every_steps = max(1, int(log_every_steps))
  estimator.total_train_steps = total_train_steps
  return estimator


def _filter_features(ex):
  return {k: v for k, v in ex.items() if k in driver.MODEL_FEATURES}


def _pad_to_length(ex, sequence_length):
  out = {}
  for k, v in ex.items():
    length = driver.feature_length(sequence_length, k)
    v = tf.cast(v[:length], tf.int32)
    out[k] = tf.pad(v, [[0, length - tf.shape(v)[0]]])
    out[k].set_shape([length])
  return out


def _examples(dataset: tf.data.Dataset, sequence_length) -> tf.data.Dataset:
  """Model features only, each truncated / zero-padded to its length."""
  return dataset.map(_filter_features).map(
    functools.partial(_pad_to_length, sequence_length=sequence_length)
  )


@driver.eager_in_legacy_mode
def train_model(
  estimator: driver.Estimator,
  vocabulary: Vocabularies,
  sequence_length: SequenceLength,
  batch_size: int,
  train_dataset_fn: Callable[..., tf.data.Dataset],
  train_steps: int,
  ensemble_inputs: Optional[int],
  dataset_split: str = "train",
  skip_seen_data: bool = False,
  seen_data_init_step: int = 0,
  checkpoint_input_pipeline: bool = False,
) -> Dict[str, Any]:
  """Trains until the global step is train_steps (resuming from model_dir).

  train_dataset_fn(sequence_length=, vocabulary=, dataset_split=) returns
  examples (dicts of int features, packed or padded to sequence_length).
  With ensemble_inputs N, each step feeds N batches, one per ensemble
  member ([N, batch, length]). skip_seen_data skips the batches the steps
  since seen_data_init_step consumed, so a resumed run sees new data.

  Args:
    estimator: the driver.Estimator holding the model and its variables.
    vocabulary: a Vocabulary, or an (inputs, targets) pair of them.
    sequence_length: an int, or a {"inputs": n, "targets": m} dict: the feature
      lengths in tokens.
    batch_size: the number of sequences per batch.
    train_dataset_fn: called as fn(sequence_length=, vocabulary=,
      dataset_split=); returns a dataset of examples (dicts of int features,
      packed or padded).
    train_steps: the global step to train up to, or a function (batch_size,
      sequence_length) -> steps such as auto_train_steps.
    ensemble_inputs: for an ensemble model, the number of members, each fed its
      own batch (None: one input batch).
    dataset_split: the dataset split, e.g. "train" or "validation".
    skip_seen_data: skip the batches the steps since seen_data_init_step
      consumed, so a resumed run sees new data.
    seen_data_init_step: the step from which the consumed data is counted.
    checkpoint_input_pipeline: accepted for the original's signature; not
      supported (logs a warning).

  Returns:
    {"loss", "learning_rate", "step"} of the last step run.
  """
  if checkpoint_input_pipeline:
    logging.warning(
      "checkpoint_input_pipeline is not supported; use "
      "skip_seen_data to resume the input where it stopped"
    )

  def input_fn():
    dataset = train_dataset_fn(
      sequence_length=sequence_length,
      vocabulary=vocabulary,
      dataset_split=dataset_split,
    )
    dataset = _examples(dataset, estimator.sequence_length)
    dataset = dataset.repeat().batch(batch_size, drop_remainder=True)
    if ensemble_inputs:
      dataset = dataset.batch(ensemble_inputs, drop_remainder=True)
    return dataset.prefetch(tf.data.AUTOTUNE)

  try:
    return estimator.train(
      input_fn,
      train_steps,
      skip_seen_data=skip_seen_data,
      seen_data_init_step=seen_data_init_step,
    )
  except driver.EmptyDatasetError as e:
    raise driver.EmptyDatasetError(
      "dataset_split %r of train_dataset_fn: %s" % (dataset_split, e)
    ) from e


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
  dataset = _examples(dataset, sequence_length).batch(batch_size)
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
    eval_datasets, batch_size, sequence_length, driver.MODEL_FEATURES
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
          dataset_fn().map(_filter_features)
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


def _resolve_learning_rate_schedule(schedule, total_train_steps):
  if isinstance(schedule, (list, tuple)):
    schedule = functools.partial(
      learning_rate_schedules.product_learning_rate, factors=list(schedule)
    )
  if callable(schedule):
    schedule = functools.partial(schedule, total_train_steps=total_train_steps)
  return schedule


@gin.configurable(module=_GIN_MODULE)
@driver.eager_in_legacy_mode
@driver_cluster.names_unavailable_tasks
def run(
  tpu_job_name: Optional[str],
  tpu: Optional[str],
  gcp_project: Optional[str],
  tpu_zone: Optional[str],
  model_dir: str,
  model_type: str = "bitransformer",
  vocabulary: Optional[Vocabularies] = None,
  train_dataset_fn: Optional[Callable[..., tf.data.Dataset]] = None,
  eval_dataset_fn: Optional[Callable[..., Any]] = None,
  dataset_split: str = "train",
  autostack: bool = True,
  eval_checkpoint_step: CheckpointStep = None,
  export_checkpoint_step: Optional[int] = None,
  export_path: str = "",
  mode: str = "train",
  iterations_per_loop: int = 100,
  save_checkpoints_steps: int = 5000,
  keep_checkpoint_max: Optional[int] = None,
  eval_summary_dir: Optional[str] = None,
  batch_size: Union[int, Tuple[str, int]] = ("tokens_per_replica", 2048),
  train_steps: Union[int, Callable[..., int]] = auto_train_steps,
  total_run_steps: Optional[int] = None,
  sequence_length: Optional[SequenceLength] = None,
  mesh_shape: Union[mtf.Shape, str] = gin.REQUIRED,
  mesh_devices: Optional[Sequence[str]] = None,
  layout_rules: Union[mtf.LayoutRules, str] = gin.REQUIRED,
  learning_rate_schedule: Union[None, float, Callable[..., Any]] = None,
  optimizer: Optional[Callable[..., mtf.optimize.Optimizer]] = None,
  predict_fn: Optional[Callable[..., Any]] = None,
  variable_filter: Optional[Callable[[mtf.Variable], bool]] = None,
  perplexity_eval_steps: int = 100,
  init_checkpoint: Optional[str] = None,
  ensemble_inputs: Optional[int] = None,
  train_model_fn: Callable[..., Any] = train_model,
  skip_seen_data: bool = False,
  seen_data_init_step: int = 0,
  output_eval_examples: bool = True,
  checkpoint_input_pipeline: bool = False,
  eval_dir_suffix: Optional[str] = None,
  *,
  mesh_impl: str = "auto",
  cluster: driver_cluster.ClusterLike = None,
  cluster_timeout: float = driver_cluster.DEFAULT_TIMEOUT_SECONDS,
  stall_timeout: Optional[float] = None,
) -> Any:
  """Runs `mode` as configured by gin; returns the mode's result.

  Modes: "train" (train_model_fn up to total_run_steps or train_steps),
  "eval" / "score_eval" (eval_model: the metric_fns of EvalDatasets on
  decodes, or on scores; written to <model_dir>/<dataset_split>_eval),
  "perplexity_eval" (perplexity_eval: teacher-forced metrics over
  perplexity_eval_steps batches, written to
  <model_dir>/eval_<name>_<split>_<examples>), "infer" (infer_model),
  "score_from_strings", "score_from_dataset", "export_infer" / "export_score"
  (a SavedModel; "export" is the deprecated alias of "export_infer").
  With `tpu` set, the modes run on that Cloud TPU (driver/tpu.py):
  tpu / tpu_zone / gcp_project / tpu_job_name find it, the mesh is mapped
  onto its topology (tpu_estimator_model_fn.hierarchical_tiling_spec, if
  bound, places the processors) and every program runs as
  tf.compat.v1.tpu.replicate over its cores: training iterations_per_loop
  steps per host call, evaluation, scoring and decoding one batch per call.
  The checkpoints are the CPU ones. The export modes write the same CPU
  SavedModel as without a TPU (the original exported for CPU too) and do
  not contact the TPU.
  With a cluster (`cluster`, else TF_CONFIG) the mesh spans the devices of
  its "worker" tasks (see get_estimator); a task lost mid-run, or one that
  stops answering for stall_timeout seconds (a stopped or hung process),
  raises TaskUnavailableError naming it and the intact latest checkpoint,
  from which a new run resumes.

  Args:
    tpu_job_name: the job name of the TPU workers (None: "worker").
    tpu: the Cloud TPU to run on: its name, "local" (a TPU VM's own
      chips) or a grpc:// address; None or "" runs on local CPUs/GPUs.
    gcp_project: the GCP project of a named TPU (None: the VM's).
    tpu_zone: the zone of a named TPU (None: the VM's).
    model_dir: the directory for checkpoints, summaries and outputs.
    model_type: "bitransformer", "lm", "delimited_lm", "aligned" or
      "bi_student_teacher".
    vocabulary: a Vocabulary, or an (inputs, targets) pair of them. Required.
    train_dataset_fn: called as fn(sequence_length=, vocabulary=,
      dataset_split=); returns a dataset of examples (dicts of int features,
      packed or padded).
    eval_dataset_fn: called as fn(sequence_length=, vocabulary=,
      dataset_split=); returns a list of EvalDatasets (or one dataset).
    dataset_split: the split the training (or other mode's) dataset is read
      from.
    autostack: combine the model's variables into stacked variables (fewer,
      larger variables).
    eval_checkpoint_step: which checkpoints to use: an int step, a list of
      steps, -1 (the latest), "all" or None (see get_checkpoint_iterator).
    export_checkpoint_step: the step of the checkpoint to export (None: the
      latest).
    export_path: the directory for the SavedModel in "export" mode.
    mode: what to do: "train", "eval", "score_eval", "perplexity_eval", "infer",
      "score_from_strings", "score_from_dataset", "export", "export_infer" or
      "export_score".
    iterations_per_loop: training steps per host call on TPU.
    save_checkpoints_steps: write a checkpoint every this many training steps.
    keep_checkpoint_max: the number of recent checkpoints kept (None: keep all).
    eval_summary_dir: the directory of "eval" / "score_eval" summaries and
      text files (default: <model_dir>/<dataset_split>_eval).
    batch_size: an int, or a (method, value) pair for compute_batch_size such as
      ("tokens_per_replica", 2048).
    train_steps: the global step to train up to, or a function (batch_size,
      sequence_length) -> steps such as auto_train_steps.
    total_run_steps: the training length the learning-rate schedule assumes
      (default: train_steps).
    sequence_length: an int, or a {"inputs": n, "targets": m} dict: the feature
      lengths in tokens. Required, except in "eval" and "score_eval" mode,
      where None means the longest eval example's lengths.
    mesh_shape: an mtf.Shape or a string like "batch:8;model:4": the mesh's
      dims.
    mesh_devices: the device names of the mesh's processors (default: the local
      CPUs/GPUs).
    layout_rules: an mtf.LayoutRules or a string like "batch:batch,d_ff:model":
      which tensor dims split over which mesh dims.
    learning_rate_schedule: a float, a function of the step (a schedule of
      learning_rate_schedules with its other arguments bound), or None (the
      optimizer's own default rate).
    optimizer: an mtf.optimize.Optimizer class or factory (default:
      AdafactorOptimizer).
    predict_fn: a function replacing the default decoding in predict mode,
      called as predict_fn(model, features, variable_dtype).
    variable_filter: a function of an mtf.Variable that says whether to train
      it (e.g. variable_filter_max_size); None trains every variable.
    perplexity_eval_steps: the number of batches "perplexity_eval" mode
      evaluates.
    init_checkpoint: a checkpoint to initialize the variables from when
      model_dir has none.
    ensemble_inputs: for an ensemble model, the number of members, each fed its
      own batch (None: one input batch).
    train_model_fn: the training function, called like train_model.
    skip_seen_data: skip the batches the steps since seen_data_init_step
      consumed, so a resumed run sees new data.
    seen_data_init_step: the step from which the consumed data is counted.
    output_eval_examples: write <name>_inputs, <name>_targets and
      <name>_<step>_predictions text files to the eval summary directory.
    checkpoint_input_pipeline: accepted for the original's signature; not
      supported (logs a warning).
    eval_dir_suffix: appended as "_<suffix>" to the eval summary directory
      ("eval", "score_eval") or evaluation name ("perplexity_eval").
    mesh_impl: "placement", "simd" or "auto" (the default: SIMD on TPU
      hosts, else placement): how the mesh runs; flag --mesh_impl.
    cluster: the cluster of worker tasks to run the mesh on (see
      get_estimator; None: TF_CONFIG if set, else this process's devices).
    cluster_timeout: seconds to wait for the cluster's tasks to answer.
    stall_timeout: seconds a task of the cluster may go without answering
      the trainer's health checks (one a second) during the run before the
      run stops with TaskUnavailableError naming it (None: cluster_timeout;
      0: never); flag --stall_timeout.

  Returns:
    What the mode's function returns (e.g. the training metrics or the decodes).

  Raises:
    ValueError: an unknown mode, a missing required parameter, or a mesh
      that does not fit the TPU.
    driver_tpu.TpuConnectionError: if the TPU cannot be reached.
    TaskUnavailableError: a task of the cluster was lost or stalled.
  """
  del stall_timeout  # driver_cluster.names_unavailable_tasks uses it
  if mode not in RUN_MODES:
    raise ValueError(
      "run: unknown mode %r; expected one of %s" % (mode, list(RUN_MODES))
    )
  for name, value in (
    ("mesh_shape", mesh_shape),
    ("layout_rules", layout_rules),
  ):
    if value is gin.REQUIRED:
      raise ValueError("run: parameter %r is required" % name)
  if sequence_length is None and mode not in ("eval", "score_eval"):
    raise ValueError("`sequence_length` must be specified in '%s' mode." % mode)
  if isinstance(sequence_length, int):
    sequence_length = {"inputs": sequence_length, "targets": sequence_length}
  if isinstance(batch_size, (tuple, list)):
    batch_size = compute_batch_size(
      sequence_length, mesh_shape, layout_rules, batch_size
    )
  if train_steps is None:
    train_steps = auto_train_steps
  if callable(train_steps):
    train_steps = train_steps(batch_size, sequence_length)
  if mode == "train" and (total_run_steps or train_steps) <= 0:
    raise ValueError(
      "run: train_steps must be > 0 to train, got %r"
      % (total_run_steps or train_steps)
    )
  learning_rate_schedule = _resolve_learning_rate_schedule(
    learning_rate_schedule, train_steps
  )
  if mode == "train" and dataset_split != "train":
    raise ValueError('mode=="train" requires dataset_split=="train"')
  if mode != "train":
    ensemble_inputs = None  # as the original: only training feeds members
  tpu_setup = None
  exporting = mode in ("export", "export_infer", "export_score")
  if tpu and exporting:
    # As the original's TPUEstimator (export_to_tpu=False): the SavedModel
    # is a CPU graph, built from the checkpoint without the TPU.
    logging.info(
      "mode %r with tpu=%r: exporting a CPU SavedModel; the TPU is not used",
      mode,
      tpu,
    )
    if not mesh_devices:
      mesh_devices = ["/cpu:0"] * mtf.convert_to_shape(mesh_shape).size
    mesh_impl = "placement"  # the export builds its own one-device program
  elif tpu:
    tpu_setup = driver_tpu.setup_tpu(
      tpu, tpu_zone, gcp_project, tpu_job_name, mesh_shape
    )
    mesh_devices = tpu_setup.mesh_devices

  def estimator_fn(sequence_length=sequence_length):
    estimator = get_estimator(
      model_type,
      vocabulary,
      mesh_shape,
      layout_rules,
      model_dir,
      batch_size,
      sequence_length,
      autostack,
      learning_rate_schedule,
      keep_checkpoint_max,
      save_checkpoints_steps,
      optimizer,
      predict_fn,
      variable_filter,
      ensemble_inputs,
      False,
      None,
      iterations_per_loop,
      cluster,
      init_checkpoint=init_checkpoint,
      mesh_devices=mesh_devices,
      score_in_predict_mode="score" in mode,
      total_train_steps=train_steps,
      mesh_impl=mesh_impl,
      cluster_timeout=cluster_timeout,
    )
    if tpu_setup is not None:
      estimator = driver_tpu.TpuEstimator(
        estimator, tpu_setup, iterations_per_loop
      )
    return estimator

  if mode in ("eval", "score_eval"):
    # As the original: the estimator is built inside eval_model, with the
    # examples' own lengths when sequence_length is None.
    return eval_model(
      estimator_fn,
      vocabulary,
      sequence_length,
      batch_size,
      dataset_split,
      model_dir,
      eval_dataset_fn,
      eval_summary_dir,
      eval_checkpoint_step,
      eval_with_score=(mode == "score_eval"),
      output_eval_examples=output_eval_examples,
      eval_dir_suffix=eval_dir_suffix,
    )
  estimator = estimator_fn()
  if mode == "train":
    if train_dataset_fn is None:
      raise ValueError("mode 'train' needs run.train_dataset_fn")
    return train_model_fn(
      estimator,
      vocabulary,
      sequence_length,
      batch_size,
      train_dataset_fn,
      total_run_steps or train_steps,
      ensemble_inputs,
      dataset_split=dataset_split,
      skip_seen_data=skip_seen_data,
      seen_data_init_step=seen_data_init_step,
      checkpoint_input_pipeline=checkpoint_input_pipeline,
    )
  if mode == "perplexity_eval":
    return perplexity_eval(
      estimator,
      vocabulary,
      sequence_length,
      batch_size,
      dataset_split,
      model_dir,
      eval_dataset_fn,
      train_dataset_fn,
      eval_checkpoint_step,
      perplexity_eval_steps,
      eval_dir_suffix,
    )
  if mode == "infer":
    return driver_decode.infer_model(
      estimator,
      vocabulary,
      sequence_length,
      batch_size,
      model_type,
      model_dir,
      eval_checkpoint_step,
    )
  if mode == "score_from_strings":
    return driver_scoring.score_from_strings(
      estimator,
      vocabulary,
      model_type,
      batch_size,
      sequence_length,
      model_dir,
      eval_checkpoint_step,
    )
  if mode == "score_from_dataset":
    return driver_scoring.score_from_dataset(
      estimator,
      vocabulary,
      batch_size,
      sequence_length,
      model_dir,
      eval_checkpoint_step,
      dataset_split,
    )
  if mode in ("export", "export_infer", "export_score"):
    if mode == "export":
      logging.warning("mode 'export' is deprecated; use 'export_infer'")
    checkpoint_path = (
      None
      if export_checkpoint_step is None
      else get_checkpoint_iterator(export_checkpoint_step, model_dir)[-1]
    )
    return driver_export.export_model(
      estimator,
      export_path or os.path.join(model_dir, "export"),
      vocabulary,
      sequence_length,
      model_type,
      eval_with_score=(mode == "export_score"),
      checkpoint_path=checkpoint_path,
    )
  raise AssertionError("unreachable: mode %r" % mode)
