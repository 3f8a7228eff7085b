"""Building the driver Estimator and training it.

`get_estimator` turns the original's gin-configured arguments into a
driver.Estimator; `train_model` feeds it batches of fixed-length examples.
`filter_features` and `fixed_length_examples` prepare those examples (model
features only, truncated or zero-padded); the checkpoint evaluation
(checkpoint_evaluation.py) prepares its examples the same way.
transformer/utils.py re-exports the original's names.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Dict, Optional

from absl import logging
import tensorflow as tf

from transformer._src.driver import cluster as driver_cluster
from transformer._src.driver import cluster_spec
from transformer._src.driver import estimator as driver
from transformer._src.driver import model_fn as driver_model_fn
from transformer._src.driver.config import SequenceLength
from transformer._src.driver.config import Vocabularies
from transformer._src.driver.config import inputs_vocabulary
from transformer._src.driver.config import targets_vocabulary
from transformer._src.driver.mesh_impl_choice import resolve_mesh_impl
from transformer._src.driver.step_graphs import MODEL_FEATURES
from transformer._src.driver.step_graphs import feature_length
from transformer._src.models.builders import build_model

__all__ = [
  "filter_features",
  "fixed_length_examples",
  "get_estimator",
  "train_model",
]


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
  cluster_timeout: float = cluster_spec.DEFAULT_TIMEOUT_SECONDS,
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
      ops (cluster_checks.check_restarted_tasks, check_collectives).
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


def filter_features(ex):
  return {k: v for k, v in ex.items() if k in MODEL_FEATURES}


def _pad_to_length(ex, sequence_length):
  out = {}
  for k, v in ex.items():
    length = feature_length(sequence_length, k)
    v = tf.cast(v[:length], tf.int32)
    out[k] = tf.pad(v, [[0, length - tf.shape(v)[0]]])
    out[k].set_shape([length])
  return out


def fixed_length_examples(
  dataset: tf.data.Dataset, sequence_length
) -> tf.data.Dataset:
  """Model features only, each truncated / zero-padded to its length."""
  return dataset.map(filter_features).map(
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
    dataset = fixed_length_examples(dataset, estimator.sequence_length)
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
