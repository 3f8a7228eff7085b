"""utils.run: the driver's one entry point for every run mode.

`run` builds the model and Estimator from the original's gin-configured
arguments and dispatches on `mode` (RUN_MODES) to training
(train.py), checkpoint evaluation (checkpoint_evaluation.py), decoding,
scoring and export. It keeps the original utils.py name, parameters and gin
module ("mesh_tensorflow.transformer.utils"); its `estimator` is a
driver.Estimator instead of a TPUEstimator. transformer/utils.py re-exports
it.
"""

from __future__ import annotations

import functools
import os
from typing import Any, Callable, Optional, Sequence, Tuple, Union

from absl import logging
import gin
import tensorflow as tf

import mesh_tensorflow as mtf
from transformer._src.driver import cluster_failures
from transformer._src.driver import cluster_spec
from transformer._src.driver import decode as driver_decode
from transformer._src.driver import estimator as driver
from transformer._src.driver import export as driver_export
from transformer._src.driver import learning_rate_schedules
from transformer._src.driver import scoring as driver_scoring
from transformer._src.driver import tpu as driver_tpu
from transformer._src.driver.checkpoint_evaluation import eval_model
from transformer._src.driver.checkpoint_evaluation import perplexity_eval
from transformer._src.driver.checkpoint_iterator import CheckpointStep
from transformer._src.driver.checkpoint_iterator import get_checkpoint_iterator
from transformer._src.driver.config import SequenceLength
from transformer._src.driver.config import Vocabularies
from transformer._src.driver.config import auto_train_steps
from transformer._src.driver.config import compute_batch_size
from transformer._src.driver.train import get_estimator
from transformer._src.driver.train import train_model

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
@cluster_failures.names_unavailable_tasks
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
  cluster: cluster_spec.ClusterLike = None,
  cluster_timeout: float = cluster_spec.DEFAULT_TIMEOUT_SECONDS,
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
    tpu_connection.TpuConnectionError: if the TPU cannot be reached.
    TaskUnavailableError: a task of the cluster was lost or stalled.
  """
  del stall_timeout  # cluster_failures.names_unavailable_tasks uses it
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
