"""The TF2 driver behind utils.run: training, evaluation and checkpoints.

The original drove its models with TPUEstimator, which TensorFlow removed.
`Estimator` here plays that role for the transformer utils: it owns the mesh
implementation, the mtf.VariableStore (full-shape masters under the
original's names), the compiled step functions, and the model directory with
its checkpoints and TensorBoard summaries.

Every step function builds the mtf graph when it is traced (once per input
shape) and reuses the store's variables afterwards, so re-tracing creates no
variables. Training updates the per-device slices; before a checkpoint is
written the slices are copied to the masters (`copy_slices_to_masters`), and
after a restore the masters are copied to the slices, as the original's
MtfCheckpointSaverListener / MtfRestoreHook did.

This module owns the Estimator's state: its settings, the masters and
slices, checkpoints, the training loop and the cached phases. The mtf graphs
of its steps are built by its base StepGraphs (step_graphs); how the steps
execute is step_execution's, the compiled phases and their variable copies
phase_fns', and the progress lines and summaries train_progress'.
"""

from __future__ import annotations

import os
from typing import Callable, Dict, List, Optional

from absl import logging
import gin
import tensorflow as tf

import mesh_tensorflow as mtf
from transformer._src.driver import checkpoint_restore
from transformer._src.driver import checkpoints
from transformer._src.driver import evaluation
from transformer._src.driver import mesh_impl_choice
from transformer._src.driver import model_dir_lock
from transformer._src.driver.config import init_checkpoint_variable_mapping
from transformer._src.driver.mesh_impl_choice import mesh_devices_for
from transformer._src.driver.phase_fns import PhaseFn
from transformer._src.driver.phase_fns import all_finite
from transformer._src.driver.phase_fns import copy_laid_out_variables
from transformer._src.driver.phase_fns import slice_values
from transformer._src.driver.step_execution import driver_global_step
from transformer._src.driver.step_execution import eager_in_legacy_mode
from transformer._src.driver.step_execution import step_graph_rewrites
from transformer._src.driver.step_graphs import StepGraphs
from transformer._src.driver.train_progress import TrainProgress
from transformer._src.driver.train_progress import write_scalars

__all__ = [
  "EmptyDatasetError",
  "Estimator",
  "eager_in_legacy_mode",
  "mesh_devices_for",
]

GLOBAL_STEP = "global_step"


class EmptyDatasetError(ValueError):
  """The training dataset ended before the first step."""


class Estimator(StepGraphs):
  """Trains, evaluates, decodes and exports one transformer model.

  The stand-in for the original's TPUEstimator: utils.get_estimator builds
  one, and utils.train_model / eval_model / infer_model / export_model take
  it as their `estimator` argument.

  Args:
    model_type: "bitransformer", "lm", "delimited_lm", "aligned" or
      "bi_student_teacher".
    transformer_model: the Unitransformer or Bitransformer (or StudentTeacher)
      to run.
    vocabulary: a Vocabulary, or an (inputs, targets) pair of them.
    model_dir: the directory of the checkpoints.
    mesh_shape: an mtf.Shape or a string like "batch:8;model:4": the mesh's
      dims.
    layout_rules: an mtf.LayoutRules or a string like "batch:batch,d_ff:model":
      which tensor dims split over which mesh dims.
    batch_size: the global number of sequences per training batch.
    sequence_length: an int, or a {"inputs": n, "targets": m} dict: the feature
      lengths in tokens.
    autostack: combine the model's variables into stacked variables (fewer,
      larger variables).
    keep_checkpoint_max: the number of recent checkpoints kept (None: keep all).
    save_checkpoints_steps: write a checkpoint every this many training steps.
    learning_rate_schedule: a float, a function of the step (a schedule of
      learning_rate_schedules with its other arguments bound), or None (the
      optimizer's own default rate).
    optimizer: an mtf.optimize.Optimizer class or factory (default:
      AdafactorOptimizer).
    variable_filter: a function of an mtf.Variable that says whether to train
      it (e.g. variable_filter_max_size); None trains every variable.
    init_checkpoint: a checkpoint to initialize the variables from when
      model_dir has none.
    init_variable_filter: a regular expression of the variable names to load
      from init_checkpoint ("": all).
    mesh_devices: the device names of the mesh's processors (default: the local
      CPUs/GPUs).
    variable_dtype: the mtf.VariableDType of the variables (default:
      get_variable_dtype() through gin).
    log_every_steps: log the loss every this many training steps.
    total_train_steps: the training length the learning-rate schedule assumes.
    outer_batch_size: split the batch into [outer_batch, batch / outer_batch]
      dims in training and evaluation.
    ensemble_inputs: for an ensemble model, the number of members, each fed its
      own batch (None: one input batch).
    predict_fn: a function replacing the default decoding in predict mode,
      called as predict_fn(model, features, variable_dtype).
    model_info_file: a file to write the model's variable names and shapes to
      (None: do not write).
    mesh_impl: the mesh implementation: "placement", "simd" (one program per
      processor; collectives over the local CPUs/GPUs) or "auto" (SIMD on
      TPU hosts, else placement). See mesh_impl_choice.
    variables_in_current_graph: make the global step in the current graph
      also in TF1 legacy mode, for a caller that builds and runs its own
      graph (default: eager there, as the driver runs eagerly).
    hierarchical_tiling_spec: a HierarchicalTiling spec placing the mesh's
      processors on a Cloud TPU's cores (the Cloud TPU driver reads it;
      None: the automatic placement).

  Raises:
    ValueError: if outer_batch_size does not divide batch_size, or for an
      unknown mesh_impl or a mesh larger than the devices.
  """

  def __init__(
    self,
    model_type: str,
    transformer_model,
    vocabulary,
    model_dir: str,
    mesh_shape,
    layout_rules,
    batch_size: int,
    sequence_length,
    *,
    autostack: bool = True,
    keep_checkpoint_max: Optional[int] = None,
    save_checkpoints_steps: int = 5000,
    learning_rate_schedule=None,
    optimizer=None,
    variable_filter=None,
    init_checkpoint: Optional[str] = None,
    init_variable_filter: str = "",
    mesh_devices=None,
    variable_dtype: Optional[mtf.VariableDType] = None,
    log_every_steps: int = 100,
    total_train_steps=None,
    outer_batch_size: int = 1,
    ensemble_inputs: Optional[int] = None,
    predict_fn: Optional[Callable] = None,
    model_info_file: Optional[str] = None,
    mesh_impl: str = "auto",
    variables_in_current_graph: bool = False,
    hierarchical_tiling_spec=None,
  ):
    self.model_type = model_type
    self.model = transformer_model
    self.vocabulary = vocabulary
    self.model_dir = model_dir
    self.mesh_shape = mtf.convert_to_shape(mesh_shape)
    self.layout_rules = mtf.convert_to_layout_rules(layout_rules)
    self.batch_size = int(batch_size)
    if isinstance(sequence_length, int):
      sequence_length = {"inputs": sequence_length, "targets": sequence_length}
    self.sequence_length = dict(sequence_length)
    self.autostack = autostack
    self.keep_checkpoint_max = keep_checkpoint_max
    self.save_checkpoints_steps = save_checkpoints_steps
    self.learning_rate_schedule = learning_rate_schedule
    self.optimizer = optimizer
    self.variable_filter = variable_filter
    self.init_checkpoint = init_checkpoint
    self.init_variable_filter = init_variable_filter
    self.variable_dtype = variable_dtype or mtf.VariableDType(tf.float32)
    self.log_every_steps = max(1, int(log_every_steps))
    self.total_train_steps = total_train_steps
    self.outer_batch_size = int(outer_batch_size or 1)
    if self.outer_batch_size < 1 or self.batch_size % self.outer_batch_size:
      raise ValueError(
        "outer_batch_size %r does not divide batch_size %d"
        % (outer_batch_size, self.batch_size)
      )
    self.ensemble_inputs = int(ensemble_inputs) if ensemble_inputs else None
    self.predict_fn = predict_fn
    self.model_info_file = model_info_file
    self.hierarchical_tiling_spec = hierarchical_tiling_spec
    self.mesh_impl = mesh_impl_choice.make_mesh_impl(
      mesh_impl, self.mesh_shape, self.layout_rules, mesh_devices
    )
    self.devices = self.mesh_impl.devices  # None for SIMD on TPU
    self.store = mtf.VariableStore()
    self.global_step = driver_global_step(variables_in_current_graph)
    self._train_fn: Optional[PhaseFn] = None
    self._phase_fns: Dict[str, PhaseFn] = {}
    self._masters_version = 0  # bumped when masters change
    self._masters_stale = False  # slices trained since the last sync
    self._restored_path: Optional[str] = None
    self._restore_later: Optional[str] = None

  def _build_train_fn(self) -> PhaseFn:
    phase = PhaseFn(None)

    @tf.function(autograph=False)
    def train_step(features):
      lowering, tf_loss, updates, tf_lr = self.build_train_graph(features)
      phase.laid_out_variables = list(lowering.variables.values())
      with tf.control_dependencies(updates + [tf_loss]):
        step = self.global_step.assign_add(1)
        finite = all_finite([tf_loss] + slice_values(phase.laid_out_variables))
      return {
        "loss": tf_loss,
        "learning_rate": tf_lr,
        "step": step,
        "tokens": self.count_tokens(features),
        "finite": finite,
      }

    phase.fn = train_step
    return phase

  # --------------------------------------------------------------------------
  # Masters <-> slices and checkpoints.

  def checkpoint_variables(self) -> Dict[str, tf.Variable]:
    """{original name: master tf.Variable} plus "global_step".

    Returns:
      {checkpoint name: master tf.Variable}, with "global_step".
    """
    variables = dict(self.store.masters)
    variables[GLOBAL_STEP] = self.global_step
    return variables

  def _sync_masters(self) -> None:
    """Copies trained slices into the masters (before save / other phases)."""
    if not self._masters_stale or self._train_fn is None:
      return
    self._copy(self._train_fn, "copy_slices_to_master")
    self._masters_stale = False
    self._masters_version += 1
    self._train_fn.slices_version = self._masters_version

  def _load_slices(self, phase: PhaseFn) -> None:
    """Copies the masters into a phase's slices if they are out of date."""
    if phase.slices_version != self._masters_version:
      self._copy(phase, "copy_master_to_slices")
      phase.slices_version = self._masters_version

  @staticmethod
  def _copy(phase: PhaseFn, what: str) -> None:
    """Runs copy_master_to_slices / copy_slices_to_master of a phase."""
    copy_laid_out_variables(phase.laid_out_variables, what, phase.copy_fns)

  def latest_checkpoint(self) -> Optional[str]:
    """The newest checkpoint of model_dir.

    Returns:
      The path of the newest checkpoint in model_dir, or None.
    """
    return checkpoints.latest_checkpoint(self.model_dir)

  @eager_in_legacy_mode
  def save(self) -> str:
    """Writes model.ckpt-<global step> to model_dir; returns its path.

    Returns:
      The path of the written checkpoint.
    """
    self._sync_masters()
    step = int(self.global_step.numpy())
    path = checkpoints.save(
      self.model_dir,
      step,
      self.checkpoint_variables(),
      keep_checkpoint_max=self.keep_checkpoint_max,
    )
    logging.info("Saved checkpoint %s", path)
    return path

  @eager_in_legacy_mode
  def restore(self, path: str) -> None:
    """Loads checkpoint `path` into the masters (then slices on next use).

    Args:
      path: a checkpoint path such as <model_dir>/model.ckpt-1000.
    """
    checkpoint_restore.restore(path, self.checkpoint_variables())
    self._masters_stale = False
    self._masters_version += 1
    self._restored_path = path
    logging.info(
      "Restored %s (global step %d)", path, int(self.global_step.numpy())
    )

  def initialize(self) -> None:
    """Restores the latest checkpoint of model_dir, else init_checkpoint.

    For training loops other than `train` (e.g. the TPU driver's); the
    variables must exist (a traced step created them).
    """
    self._initialize_from(None)

  def _initialize_from(self, checkpoint_path: Optional[str]) -> None:
    """Restores checkpoint_path, the latest checkpoint, or init_checkpoint."""
    path = checkpoint_path or self.latest_checkpoint()
    if path:
      self.restore(path)
      return
    self.global_step.assign(0)
    if self.init_checkpoint:
      # The global step is one of the checkpoint's variables, as it was in
      # the original's graph: training goes on from the pretrained step, so
      # train_steps counts from there (pretrained step + fine-tuning steps).
      checkpoint_restore.init_from_checkpoint(
        self.init_checkpoint,
        self.checkpoint_variables(),
        variable_filter=self.init_variable_filter or None,
        name_mapping=init_checkpoint_variable_mapping,
      )
      self._masters_version += 1
      logging.info("Initialised from init_checkpoint %s", self.init_checkpoint)

  # --------------------------------------------------------------------------
  # Training.

  @eager_in_legacy_mode
  def train(
    self,
    input_fn: Callable[[], tf.data.Dataset],
    max_steps: int,
    *,
    skip_seen_data: bool = False,
    seen_data_init_step: int = 0,
  ) -> Dict[str, float]:
    """Trains until the global step reaches max_steps; resumes if possible.

    Returns {"loss", "learning_rate", "step"} of the last step run.

    Args:
      input_fn: returns a dataset of training batches (dicts of int features
        [batch, length]).
      max_steps: the global step to stop at.
      skip_seen_data: skip the batches the steps since seen_data_init_step
        consumed, so a resumed run sees new data.
      seen_data_init_step: the step from which the consumed data is counted.

    Returns:
      {"loss", "learning_rate", "step"} of the last step run.

    Raises:
      FloatingPointError: if a step's loss or updated variables are not finite
        (before any checkpoint of them is written).
      ModelDirLockedError: if another trainer is writing model_dir.
      EmptyDatasetError: if the dataset ends before the first step.
    """
    tf.io.gfile.makedirs(self.model_dir)
    with model_dir_lock.ModelDirLock(self.model_dir):
      return self._train(
        input_fn, max_steps, skip_seen_data, seen_data_init_step
      )

  def _train(
    self, input_fn, max_steps, skip_seen_data, seen_data_init_step
  ) -> Dict[str, float]:
    """Estimator.train, with model_dir locked."""
    dataset = input_fn()
    if self._train_fn is None:
      self._train_fn = self._build_train_fn()
      # Trace now: creates every master and slice, so a checkpoint can be
      # restored into them before the first step.
      self._train_fn.fn.get_concrete_function(dataset.element_spec)
      with tf.io.gfile.GFile(
        os.path.join(self.model_dir, "operative_config.gin"), "w"
      ) as f:
        f.write(gin.operative_config_str())
      self._initialize_from(None)
      self._train_fn.slices_version = -1
    self._load_slices(self._train_fn)
    step = int(self.global_step.numpy())
    if step >= max_steps:
      logging.info(
        "Global step %d >= train steps %d: nothing to train", step, max_steps
      )
      if self.latest_checkpoint() is None:
        # The original's CheckpointSaverHook saved when its session started,
        # so fine-tuning for 0 steps from init_checkpoint left the
        # pretrained weights in model_dir, where eval and decode look.
        self.save()
      return {"step": step}
    if skip_seen_data and step > seen_data_init_step:
      dataset = dataset.skip(step - seen_data_init_step)
    writer = tf.summary.create_file_writer(self.model_dir)
    progress = TrainProgress(step, max_steps, self.log_every_steps)
    result = {}
    first_step = last_saved = step
    for features in dataset:
      with step_graph_rewrites():
        out = self._train_fn.fn(features)
      self._masters_stale = True
      step = int(out["step"].numpy())
      if not out["finite"].numpy():
        self._stop_non_finite(step, float(out["loss"].numpy()))
      progress.add_tokens(int(out["tokens"].numpy()))
      if progress.due(step) or step >= max_steps:
        result = {
          "loss": float(out["loss"].numpy()),
          "learning_rate": float(out["learning_rate"].numpy()),
          "step": step,
        }
        stats = progress.report(step, result["loss"], result["learning_rate"])
        write_scalars(
          writer,
          step,
          {
            "loss": result["loss"],
            "learning_rate": result["learning_rate"],
            "tokens_per_second": stats["tokens_per_second"],
            "steps_per_second": stats["steps_per_second"],
          },
        )
      if (
        self.save_checkpoints_steps
        and step % self.save_checkpoints_steps == 0
        and step < max_steps
      ):
        self.save()
        last_saved = step
      if step >= max_steps:
        break
    if step == first_step:
      raise EmptyDatasetError(
        "the training dataset has no batches: 0 of %d steps trained from "
        "step %d (an empty split, or fewer examples than one batch)"
        % (max_steps - step, step)
      )
    if step != last_saved:
      self.save()
    writer.close()
    return result

  def _stop_non_finite(self, step: int, loss: float) -> None:
    """Raises FloatingPointError for step's non-finite loss or variables.

    The trained slices are copied to the masters to name the non-finite
    variables by their checkpoint names; checkpoints.save refuses such
    masters, so a later save() in this process writes nothing either.
    """
    self._sync_masters()
    raise self.non_finite_error(step, loss)

  def non_finite_error(self, step: int, loss: float) -> FloatingPointError:
    """The error that stops training at a non-finite step.

    It names the masters holding inf or nan (copy the trained slices to the
    masters first) and the last checkpoint, from which to restart.

    Args:
      step: the global step whose loss or variables are not finite.
      loss: that step's loss.

    Returns:
      a FloatingPointError to raise.
    """
    bad = checkpoints.non_finite_names(self.checkpoint_variables())
    latest = self.latest_checkpoint()
    return FloatingPointError(
      "training diverged at step %d: loss %s; non-finite variables: %s. "
      "Nothing of this step was saved; the last checkpoint is %s (lower the "
      "learning rate and restart from it)"
      % (
        step,
        loss,
        _first_names(bad) if bad else "none (only the loss)",
        latest or "none",
      )
    )

  # --------------------------------------------------------------------------
  # Phases other than training (eval, decode, score) share this machinery.

  @eager_in_legacy_mode
  def prepare(self, checkpoint_path: Optional[str] = None) -> None:
    """Makes the masters current before eval / decode / export.

    With checkpoint_path None after training in this process the trained
    slices are synced to the masters; otherwise checkpoint_path (default: the
    latest in model_dir) is restored when the phase runs.

    Args:
      checkpoint_path: the checkpoint to restore (None: the trained variables,
        or the latest checkpoint).

    Raises:
      ValueError: no checkpoint_path and none in model_dir.
    """
    if checkpoint_path is None and self._train_fn is not None:
      self._sync_masters()
      self._restore_later = None
      return
    if checkpoint_path is None:
      checkpoint_path = self.latest_checkpoint()
      if checkpoint_path is None:
        raise ValueError(
          "no checkpoint in model_dir %r to evaluate, decode "
          "or export" % self.model_dir
        )
    self._restore_later = (
      None if checkpoint_path == self._restored_path else checkpoint_path
    )

  def phase_fn(self, name: str, build: Callable) -> PhaseFn:
    """A cached PhaseFn built by build(phase) -> tf.function.

    Args:
      name: the phase's cache key (e.g. "eval").
      build: called once as build(phase); returns the phase's tf.function.

    Returns:
      The cached PhaseFn.
    """
    phase = self._phase_fns.get(name)
    if phase is None:
      phase = PhaseFn(None)
      phase.fn = build(phase)
      self._phase_fns[name] = phase
    return phase

  @eager_in_legacy_mode
  def run_phase(self, phase: PhaseFn, *args):
    """Calls phase.fn(*args): traces, restores pending checkpoints, syncs.

    Args:
      phase: a PhaseFn from phase_fn.

    Returns:
      What phase.fn returns.
    """
    if phase.laid_out_variables is None:
      phase.fn.get_concrete_function(*args)
    pending = self._restore_later
    if pending:
      self._restore_later = None
      self.restore(pending)
    self._load_slices(phase)
    with step_graph_rewrites():
      return phase.fn(*args)

  @eager_in_legacy_mode
  def evaluate(
    self,
    dataset: tf.data.Dataset,
    checkpoint_path: Optional[str] = None,
    max_batches: Optional[int] = None,
  ) -> Dict[str, float]:
    """Teacher-forced metrics over `dataset` (batched dicts of features).

    Returns loss (the model's loss per batch, averaged over the batches, as
    the original's Estimator.evaluate reported it), neg_log_perplexity
    (minus the mean cross-entropy per target token), token_accuracy,
    sequence_accuracy (exact match of every target token of a row),
    mean_label, num_eval_tokens, max_targets_length and num_eval_sequences.

    Args:
      dataset: a dataset of batched dicts of int features [batch, length].
      checkpoint_path: the checkpoint to evaluate (default: the trained or
        latest variables).
      max_batches: evaluate at most this many batches (None: the whole dataset).

    Returns:
      {metric name: float}.
    """
    return evaluation.evaluate(self, dataset, checkpoint_path, max_batches)


def _first_names(names: List[str], shown: int = 5) -> str:
  text = ", ".join(names[:shown])
  return text + (", ... (%d in all)" % len(names) if len(names) > shown else "")
