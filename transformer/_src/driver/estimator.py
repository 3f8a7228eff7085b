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
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import time
from typing import Callable, Dict, Iterator, List, Optional

from absl import logging
import gin
import tensorflow as tf
from tensorflow.core.framework import summary_pb2
from tensorflow.core.protobuf import config_pb2
from tensorflow.core.protobuf import rewriter_config_pb2
from tensorflow.python.eager import context as eager_context  # pylint: disable=g-direct-tensorflow-import

import mesh_tensorflow as mtf
from transformer._src.data.delimited_lm import dynamic_text2self
from transformer._src.driver import checkpoints
from transformer._src.driver import evaluation
from transformer._src.driver import mesh_impl_choice
from transformer._src.driver import model_dir_lock
from transformer._src.driver.config import init_checkpoint_variable_mapping
from transformer._src.driver.config import serialize_num_microbatches
from transformer._src.driver.mesh_impl_choice import mesh_devices_for
from transformer._src.layers.context import ModeKeys
from transformer._src.models.unitransformer import Unitransformer
from transformer._src.models.unitransformer import autoregressive_inputs

__all__ = [
  "EmptyDatasetError",
  "Estimator",
  "all_finite",
  "eager_in_legacy_mode",
  "mesh_devices_for",
  "model_features",
]

MODEL_FEATURES = (
  "inputs",
  "inputs_position",
  "inputs_segmentation",
  "targets",
  "targets_position",
  "targets_segmentation",
  "targets_subsegmentation",
)

GLOBAL_STEP = "global_step"


def eager_in_legacy_mode(fn: Callable) -> Callable:
  """fn, run with eager execution also after TF2 behaviour was switched off.

  The driver is an eager program (it iterates datasets, compiles its steps
  with tf.function and reads results with .numpy()). A TF1 program that
  called `tf.compat.v1.disable_v2_behavior()` keeps its legacy switches (TF1
  shapes, control flow and variable kinds in its own graphs); only the
  driver's calls run eagerly, so they train, evaluate and decode exactly as
  under TF2 behaviour. Calls made while a function is being traced are left
  as they are.
  """

  @functools.wraps(fn)
  def wrapper(*args, **kwargs):
    if tf.executing_eagerly() or tf.inside_function():
      return fn(*args, **kwargs)
    with eager_context.eager_mode():
      return fn(*args, **kwargs)

  # gin reads parameters with inspect.getfullargspec, which does not follow
  # __wrapped__: without the signature it would see (*args, **kwargs), accept
  # bindings of any name and no longer enforce gin.REQUIRED.
  wrapper.__signature__ = inspect.signature(fn)
  return wrapper


# Grappler passes the driver's steps run without. On the models measured
# (the tiny Bitransformer of the driver's tests, placement and SIMD; a
# 2-layer Adafactor LM on 8 and 64 devices) they rewrite nothing that
# changes a value: losses and variables after three training steps are bit
# for bit those with the passes on. With the replica program of
# SimdMeshImpl inlined once per device, they cost about a third of the
# first run of a step. Arithmetic optimisation, constant folding and the
# second round of the passes, which do change the last bits, stay as
# configured; so do model pruning and the dependency optimiser, which
# change no value either but remove nodes every later step would run (at 64
# devices later steps took about 5% more CPU time without them).
_PASSES_OFF = (
  "layout_optimizer",
  "remapping",
  "loop_optimization",
  "implementation_selector",
  "shape_optimization",
  "function_optimization",
  "debug_stripper",
  "pin_to_host_optimization",
)
_STEP_CALL_OPTIONS = {}


def _step_call_options(options):
  """The call options `options` without the passes step_graph_rewrites skips."""
  key = (options.config_proto_serialized, options.executor_type)
  derived = _STEP_CALL_OPTIONS.get(key)
  if derived is None:
    config = config_pb2.ConfigProto()
    config.ParseFromString(options.config_proto_serialized)
    rewrites = config.graph_options.rewrite_options
    for name in _PASSES_OFF:
      setattr(rewrites, name, rewriter_config_pb2.RewriterConfig.OFF)
    rewrites.memory_optimization = rewriter_config_pb2.RewriterConfig.NO_MEM_OPT
    rewrites.disable_tfg_optimizer = True
    derived = eager_context.FunctionCallOptions(
      executor_type=options.executor_type, config_proto=config
    )
    _STEP_CALL_OPTIONS[key] = derived
  return derived


@contextlib.contextmanager
def step_graph_rewrites() -> Iterator[None]:
  """Runs the tf.functions called in it with fewer Grappler passes.

  The first call of a step makes TensorFlow optimise the step's whole graph,
  where SimdMeshImpl's replica program is inlined once per device: at 64
  devices that is most of the first step's time. The passes of _PASSES_OFF,
  the memory optimiser and the TFG (MLIR) shape inference change no value
  in the driver's steps and are skipped for the calls made in this context
  only (the function call options of this thread); the process's settings
  (e.g. arithmetic optimisation turned off for a cluster) apply as before.

  Yields:
    Nothing.
  """
  ctx = eager_context.context()
  saved = ctx.function_call_options
  ctx.function_call_options = _step_call_options(saved)
  try:
    yield
  finally:
    ctx.function_call_options = saved


def model_features(features: Dict[str, tf.Tensor]) -> Dict[str, tf.Tensor]:
  """The entries of a dataset element the model reads (int32)."""
  return {
    k: tf.cast(v, tf.int32) for k, v in features.items() if k in MODEL_FEATURES
  }


def feature_length(sequence_length, key: str) -> int:
  """The length of feature `key` ("inputs..." or "targets...")."""
  if isinstance(sequence_length, dict):
    base = "inputs" if key.startswith("inputs") else "targets"
    return int(sequence_length[base])
  return int(sequence_length)


class EmptyDatasetError(ValueError):
  """The training dataset ended before the first step."""


class _PhaseFn:
  """A compiled mtf computation plus the laid-out variables its trace made."""

  def __init__(self, fn: Callable):
    self.fn = fn
    self.laid_out_variables = None  # set while tracing
    self.slices_version = -1
    self.copy_fns = {}


class Estimator:
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
    self.global_step = _global_step(variables_in_current_graph)
    self._train_fn: Optional[_PhaseFn] = None
    self._phase_fns: Dict[str, _PhaseFn] = {}
    self._masters_version = 0  # bumped when masters change
    self._masters_stale = False  # slices trained since the last sync
    self._restored_path: Optional[str] = None
    self._restore_later: Optional[str] = None

  # --------------------------------------------------------------------------
  # Building mtf graphs.

  def batch_dims(
    self, batch_size: Optional[int] = None, training: bool = True
  ) -> List[mtf.Dimension]:
    """The leading dims of a feature, as the original's model_fn made them.

    [ensemble] when ensemble_inputs (each member gets its own examples), then
    [outer_batch, batch / outer_batch] in training and evaluation when
    outer_batch_size > 1, else [batch].

    Args:
      batch_size: the batch size (default: the estimator's).
      training: whether for training or evaluation (the only modes with an outer
        batch dim).

    Returns:
      A list of mtf.Dimensions.

    Raises:
      ValueError: if outer_batch_size does not divide the batch size.
    """
    batch_size = batch_size or self.batch_size
    dims = []
    if self.ensemble_inputs:
      dims.append(mtf.Dimension("ensemble", self.ensemble_inputs))
    if training and self.outer_batch_size > 1:
      if batch_size % self.outer_batch_size:
        raise ValueError(
          "outer_batch_size %d does not divide the batch of %d"
          % (self.outer_batch_size, batch_size)
        )
      dims += [
        mtf.Dimension("outer_batch", self.outer_batch_size),
        mtf.Dimension("batch", batch_size // self.outer_batch_size),
      ]
    else:
      dims.append(mtf.Dimension("batch", batch_size))
    return dims

  def import_features(
    self, mesh: mtf.Mesh, features, batch_size=None, training: bool = True
  ):
    """mtf Tensors [batch dims..., length] of int features [ensemble?,
    batch, length].

    Args:
      mesh: the mtf.Mesh to import onto.
      features: {feature name: int tensor [ensemble?, batch, length]}.
      batch_size: the batch size (default: the estimator's).
      training: whether the batch dims are the training ones (see batch_dims).

    Returns:
      {feature name: int mtf.Tensor [batch dims..., length]}.
    """
    batch_dims = self.batch_dims(batch_size, training)
    mtf_features = {}
    for key, x in sorted(features.items()):
      length_dim = mtf.Dimension(
        "length", feature_length(self.sequence_length, key)
      )
      shape = mtf.Shape(batch_dims + [length_dim])
      x = tf.reshape(tf.cast(x, tf.int32), shape.to_integer_list)
      mtf_features[key] = mtf.import_fully_replicated(mesh, x, shape, name=key)
    return mtf_features

  def joined_features(self, mtf_features, mode: str):
    """The features as the model reads them.

    As the original's model_fn, a "delimited_lm" reads each example's
    inputs and targets joined into its targets (inputs, then targets:
    dynamic_text2self), so training, evaluating and scoring it on text2text
    data uses both; scoring also takes rows already joined (targets only).
    Scoring an "lm" on examples with inputs joins them too (their tokens
    are then scored as well). Other features are read unchanged.

    Args:
      mtf_features: {feature name: int mtf.Tensor [batch dims..., length]}.
      mode: "train", "eval" or "score".

    Returns:
      The features the model reads.

    Raises:
      ValueError: if a "delimited_lm" gets no "inputs" outside scoring.
    """
    if self.model_type == "lm" and mode == "score" and "inputs" in mtf_features:
      logging.warning(
        "Scoring of lm models will include loss from the 'inputs'."
      )
      return dynamic_text2self(mtf_features)
    if self.model_type != "delimited_lm":
      return mtf_features
    if "inputs" in mtf_features:
      return dynamic_text2self(mtf_features)
    if mode != "score":
      raise ValueError(
        "mode=%s model_type=delimited_lm should have feature inputs\n"
        'A common mistake is that model_type="delimited_lm" should be used '
        "with tasks that produce inputs and targets, while "
        'model_type="lm" should be used with tasks that produce targets '
        "only." % mode
      )
    return mtf_features

  def logits_and_loss(self, mtf_features, mode: str, num_microbatches: int = 1):
    """(logits, loss) of the model, as the original's model_fn computed.

    Args:
      mtf_features: {feature name: int mtf.Tensor [batch dims..., length]}, with
        "targets" and optionally "inputs" and their _segmentation and _position
        features.
      mode: "train" or "eval" (dropout only in training).
      num_microbatches: the number of microbatches the loss is divided over.

    Returns:
      A (logits, loss) pair: logits [batch dims..., length, vocab] and the
      scalar loss.

    Raises:
      ValueError: if a model with an encoder gets no "inputs" feature.
    """
    model = self.model
    targets = mtf_features["targets"]
    if isinstance(model, Unitransformer):
      position_kwargs = dict(
        sequence_id=mtf_features.get("targets_segmentation"),
        position=mtf_features.get("targets_position"),
      )
    else:
      position_kwargs = dict(
        encoder_sequence_id=mtf_features.get("inputs_segmentation"),
        decoder_sequence_id=mtf_features.get("targets_segmentation"),
        decoder_subsequence_id=mtf_features.get("targets_subsegmentation"),
        encoder_position=mtf_features.get("inputs_position"),
        decoder_position=mtf_features.get("targets_position"),
      )
    if self.model_type in ("lm", "delimited_lm"):
      inputs = autoregressive_inputs(
        targets, sequence_id=position_kwargs["sequence_id"]
      )
    elif "inputs" in mtf_features:
      inputs = mtf_features["inputs"]
    else:
      raise ValueError(
        "model_type %r needs an 'inputs' feature; the dataset "
        "has %s" % (self.model_type, sorted(mtf_features))
      )
    return model.call_simple(
      inputs=inputs,
      targets=targets,
      compute_loss=True,
      mode=mode,
      variable_dtype=self.variable_dtype,
      num_microbatches=num_microbatches,
      **position_kwargs,
    )

  def _learning_rate(self) -> tf.Tensor:
    schedule = self.learning_rate_schedule
    if schedule is None:
      return tf.constant(0.0)  # the optimizer's own default rate is used
    if callable(schedule):
      return tf.cast(schedule(step=self.global_step.read_value()), tf.float32)
    return tf.constant(float(schedule), tf.float32)

  def _make_optimizer(self, learning_rate):
    optimizer = self.optimizer
    if optimizer is None:
      optimizer = mtf.optimize.AdafactorOptimizer
    if isinstance(optimizer, mtf.optimize.Optimizer):
      return optimizer
    if self.learning_rate_schedule is None:
      return optimizer()
    return optimizer(learning_rate=learning_rate)

  def lower_on_mesh(self, build: Callable, *args):
    """build(*args) (builds and lowers an mtf graph) on the estimator's mesh.

    Once for placement; for SIMD traced once and run by every replica (see
    mesh_impl_choice.lower_on_mesh).

    Args:
      build: a function lowering an mtf graph on self.mesh_impl.
      *args: passed to build.

    Returns:
      What build returns (the first replica's, for SIMD).
    """
    return mesh_impl_choice.lower_on_mesh(self.mesh_impl, build, *args)

  def build_train_graph(self, features: Dict[str, tf.Tensor]):
    """Builds and lowers one training step over tf `features`.

    Returns (lowering, loss, updates, learning_rate): the float32 loss, the
    lowered variable updates (the global step is not incremented) and the
    learning-rate tensor.

    Args:
      features: {feature name: int tensor [ensemble?, batch, length]}.

    Returns:
      A (lowering, loss, updates, learning_rate) tuple.
    """
    return self.lower_on_mesh(self.lower_train_step, features)

  def lower_train_step(self, features: Dict[str, tf.Tensor]):
    """build_train_graph for one replica, in the caller's replica context.

    For SIMD, the caller runs this once per replica itself (as the Cloud TPU
    loop does under tpu.replicate); build_train_graph does that for it.

    Args:
      features: {feature name: int tensor [ensemble?, batch, length]}.

    Returns:
      A (lowering, loss, updates, learning_rate) tuple.
    """
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    with mtf.variable_store(self.store):
      mtf_features = self.joined_features(
        self.import_features(mesh, features), ModeKeys.TRAIN
      )
      batch_dim = self.batch_dims()[-1]
      num_microbatches = self._num_microbatches(batch_dim)
      if num_microbatches > 1:

        def serialized_fn(microbatch_features):
          return {
            "loss": self.logits_and_loss(
              microbatch_features, ModeKeys.TRAIN, num_microbatches
            )[1]
          }

        var_grads, loss_dict = mtf.serialize_training_step(
          mtf_features, serialized_fn, batch_dim, num_microbatches
        )
        loss = loss_dict["loss"]
      else:
        _, loss = self.logits_and_loss(mtf_features, ModeKeys.TRAIN)
        var_grads = mtf.gradients(
          [loss], [v.outputs[0] for v in graph.trainable_variables]
        )
      tf_lr = self._learning_rate()
      lr = mtf.import_fully_replicated(
        mesh, tf_lr, mtf.Shape([]), name="learning_rate"
      )
      variables = graph.trainable_variables
      if self.variable_filter is not None:
        keep = [i for i, v in enumerate(variables) if self.variable_filter(v)]
        variables = [variables[i] for i in keep]
        var_grads = [var_grads[i] for i in keep]
      self._make_optimizer(lr).apply_grads(var_grads, variables)
    self._write_model_info(graph)
    lowering = mtf.Lowering(
      graph, {mesh: self.mesh_impl}, autostack=self.autostack
    )
    tf_loss = tf.cast(lowering.export_to_tf_tensor(loss), tf.float32)
    updates = [
      lowering.lowered_operation(op)
      for op in graph.operations
      if isinstance(op, mtf.Assign)
    ]
    return lowering, tf_loss, updates, tf_lr

  def count_tokens(self, features: Dict[str, tf.Tensor]) -> tf.Tensor:
    """The non-padding tokens of a training batch, for tokens_per_second.

    Args:
      features: the batch ({feature name: int tensor}).

    Returns:
      An int64 scalar: the nonzero "inputs" and "targets" ids.
    """
    counts = [
      tf.reduce_sum(tf.cast(features[k] > 0, tf.int64))
      for k in ("inputs", "targets")
      if k in features
    ]
    return tf.add_n(counts) if counts else tf.constant(0, tf.int64)

  def _build_train_fn(self) -> _PhaseFn:
    phase = _PhaseFn(None)

    @tf.function(autograph=False)
    def train_step(features):
      lowering, tf_loss, updates, tf_lr = self.build_train_graph(features)
      phase.laid_out_variables = list(lowering.variables.values())
      with tf.control_dependencies(updates + [tf_loss]):
        step = self.global_step.assign_add(1)
        finite = all_finite([tf_loss] + _slices(phase.laid_out_variables))
      return {
        "loss": tf_loss,
        "learning_rate": tf_lr,
        "step": step,
        "tokens": self.count_tokens(features),
        "finite": finite,
      }

    phase.fn = train_step
    return phase

  def _write_model_info(self, graph: mtf.Graph) -> None:
    """Writes each variable's name, shape and size to model_info_file."""
    if not self.model_info_file:
      return
    lines, total = [], 0
    for v in graph.all_variables:
      total += v.shape.size
      lines.append(
        "%s %s %d%s"
        % (
          v.name,
          v.shape.to_string,
          v.shape.size,
          "" if v.trainable else " (not trained)",
        )
      )
    lines.append(
      "total parameters %d in %d variables" % (total, len(graph.all_variables))
    )
    directory = os.path.dirname(self.model_info_file)
    if directory:
      tf.io.gfile.makedirs(directory)
    with tf.io.gfile.GFile(self.model_info_file, "w") as f:
      f.write("\n".join(lines) + "\n")

  def _num_microbatches(self, batch_dim):
    return serialize_num_microbatches(
      batch_dim, self.sequence_length, self.mesh_shape, self.layout_rules
    )

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

  def _load_slices(self, phase: _PhaseFn) -> None:
    """Copies the masters into a phase's slices if they are out of date."""
    if phase.slices_version != self._masters_version:
      self._copy(phase, "copy_master_to_slices")
      phase.slices_version = self._masters_version

  @staticmethod
  def _copy(phase: _PhaseFn, what: str) -> None:
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
    checkpoints.restore(path, self.checkpoint_variables())
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
      checkpoints.init_from_checkpoint(
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
    progress = _Progress(step, max_steps, self.log_every_steps)
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

  def phase_fn(self, name: str, build: Callable) -> _PhaseFn:
    """A cached _PhaseFn built by build(phase) -> tf.function.

    Args:
      name: the phase's cache key (e.g. "eval").
      build: called once as build(phase); returns the phase's tf.function.

    Returns:
      The cached _PhaseFn.
    """
    phase = self._phase_fns.get(name)
    if phase is None:
      phase = _PhaseFn(None)
      phase.fn = build(phase)
      self._phase_fns[name] = phase
    return phase

  @eager_in_legacy_mode
  def run_phase(self, phase: _PhaseFn, *args):
    """Calls phase.fn(*args): traces, restores pending checkpoints, syncs.

    Args:
      phase: a _PhaseFn from phase_fn.

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


def all_finite(tensors) -> tf.Tensor:
  """A scalar bool: whether every floating-point tensor is free of inf/nan.

  Args:
    tensors: tf.Tensors or tf.Variables; non-float ones are skipped.

  Returns:
    A scalar bool tf.Tensor (True for no float tensors).
  """
  flags = [
    tf.reduce_all(tf.math.is_finite(t)) for t in tensors if t.dtype.is_floating
  ]
  return tf.reduce_all(tf.stack(flags)) if flags else tf.constant(True)


def _first_names(names: List[str], shown: int = 5) -> str:
  text = ", ".join(names[:shown])
  return text + (", ... (%d in all)" % len(names) if len(names) > shown else "")


def _slices(laid_out_variables) -> List[tf.Tensor]:
  """The current values of the distinct slice variables (shared ones once)."""
  seen, values = set(), []
  for laid_out in laid_out_variables:
    for v in laid_out.laid_out_tensor.all_slices:
      if id(v) not in seen:
        seen.add(id(v))
        values.append(tf.convert_to_tensor(v))
  return values


def copy_laid_out_variables(
  laid_out_variables, what: str, compiled: Dict[str, Callable]
) -> None:
  """Runs `what` of every laid-out variable, as one compiled function.

  Args:
    laid_out_variables: the laid-out variables (None or empty: nothing to do).
    what: "copy_master_to_slices" or "copy_slices_to_master".
    compiled: the caller's cache {what: tf.function}, filled on first use.
  """
  if not laid_out_variables:
    return
  fn = compiled.get(what)
  if fn is None:
    # A partial, not a closure: TF keys its retracing warning on a
    # function's code, which every caller's copy would share.
    fn = tf.function(
      functools.partial(_copy_variables, laid_out_variables, what),
      autograph=False,
    )
    compiled[what] = fn
  fn()


def _copy_variables(laid_out_variables, what: str) -> None:
  tf.group(*[getattr(v, what) for v in laid_out_variables])


def write_scalars(writer, step: int, scalars: Dict[str, float]) -> None:
  """TensorBoard scalar summaries, written without the tensorboard package.

  tf.summary.scalar lives in tensorboard, which is not a dependency; the
  core tf.summary.write with the scalar plugin's metadata writes the same
  event records.
  """
  metadata = summary_pb2.SummaryMetadata()
  metadata.plugin_data.plugin_name = "scalars"
  with writer.as_default(step=step):
    for name, value in scalars.items():
      tf.summary.write(
        name, tf.constant(value, tf.float32), step=step, metadata=metadata
      )
  writer.flush()


class _Progress:
  """Progress lines: step, loss, learning rate, steps/s, tokens/s, ETA."""

  def __init__(self, step: int, max_steps: int, every: int):
    self.max_steps = max_steps
    self.every = every
    self.last_step = step
    self.last_time = time.perf_counter()
    self.tokens = 0

  def add_tokens(self, n: int) -> None:
    self.tokens += n

  def due(self, step: int) -> bool:
    return step % self.every == 0

  def report(self, step: int, loss: float, lr: float) -> Dict[str, float]:
    now = time.perf_counter()
    seconds = max(now - self.last_time, 1e-9)
    steps_per_second = (step - self.last_step) / seconds
    tokens_per_second = self.tokens / seconds
    remaining = max(self.max_steps - step, 0)
    eta = remaining / steps_per_second if steps_per_second > 0 else 0.0
    line = (
      "step %d/%d  loss %.4f  lr %.3g  %.2f steps/s  %.0f tokens/s  "
      "ETA %s"
      % (
        step,
        self.max_steps,
        loss,
        lr,
        steps_per_second,
        tokens_per_second,
        _format_seconds(eta),
      )
    )
    # One line on stdout (not also logged: absl would print it twice).
    print(line, flush=True)
    self.last_step, self.last_time, self.tokens = step, now, 0
    return {
      "steps_per_second": steps_per_second,
      "tokens_per_second": tokens_per_second,
    }


def _format_seconds(seconds: float) -> str:
  seconds = int(round(seconds))
  hours, rest = divmod(seconds, 3600)
  minutes, seconds = divmod(rest, 60)
  if hours:
    return "%dh%02dm%02ds" % (hours, minutes, seconds)
  return "%dm%02ds" % (minutes, seconds)


def _global_step(in_current_graph: bool) -> tf.Variable:
  """The Estimator's global step: eager, except where a graph is wanted.

  After `tf.compat.v1.disable_v2_behavior()` the driver still runs eagerly
  (see eager_in_legacy_mode), so an Estimator made while a TF1 program's
  graph is the default keeps an eager resource variable (a ref variable in
  that graph could not be trained by the driver's tf.functions). A caller
  that builds and runs its own graph (tpu_estimator_model_fn in a Session)
  asks for the current graph's global step; under TF2 behaviour a tf.Graph
  made by the caller is its choice and is honoured too. A global step this
  function creates in a legacy graph is a resource variable, as the
  original's TPUEstimator created it, so that a TPU program built in that
  graph can read it.
  """
  legacy = not tf.__internal__.tf2.enabled()
  if legacy and not in_current_graph and not tf.inside_function():
    with eager_context.eager_mode():
      return mtf.optimize.get_or_create_global_step()
  if legacy and not tf.executing_eagerly() and not tf.inside_function():
    graph = tf.compat.v1.get_default_graph()
    if tf.compat.v1.train.get_global_step(graph) is None:
      # A resource variable, as TPUEstimator made it (legacy mode's default is
      # a ref variable, which a TPU computation cannot read).
      scope = tf.compat.v1.VariableScope(reuse=None, name="", use_resource=True)
      with tf.compat.v1.variable_scope(scope, auxiliary_name_scope=False):
        tf.compat.v1.train.create_global_step(graph)
  return mtf.optimize.get_or_create_global_step()
