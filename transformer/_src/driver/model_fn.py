"""tpu_estimator_model_fn: the original's model_fn, without an Estimator.

The original handed `tpu_estimator_model_fn(...)` to a TPUEstimator, which
TensorFlow removed. Here it returns a `ModelFn`: called as
`model_fn(features, labels, mode, params=None, config=None)` inside a
`tf.compat.v1` graph (or eagerly) it builds and lowers the mtf graph for
`mode` and returns a `ModelFnSpec` holding what an EstimatorSpec held
(loss, train_op, predictions, eval_metric_ops, hooks), so code that drove
the model_fn with its own Session loop keeps working. The driver's
`get_estimator` calls it too, so gin bindings of its parameters
(`outer_batch_size`, `init_variable_filter`, `model_info_file`, ...) reach
`utils.run`; `ModelFn.estimator` is the driver.Estimator it configured.
"""

from __future__ import annotations

from typing import Any, Dict, List, NamedTuple, Optional, Tuple

from absl import logging
import gin
import tensorflow as tf

import mesh_tensorflow as mtf
from transformer._src.driver import estimator as driver
from transformer._src.driver import evaluation as driver_eval
from transformer._src.driver.config import clean_decodes
from transformer._src.driver.config import get_variable_dtype
from transformer._src.driver.config import inputs_vocabulary
from transformer._src.driver.config import targets_vocabulary
from transformer._src.driver.step_graphs import model_features
from transformer._src.layers.context import ModeKeys

__all__ = [
  "ModelFn",
  "ModelFnSpec",
  "metric_max",
  "metric_sum",
  "tpu_estimator_model_fn",
]

_GIN_MODULE = "mesh_tensorflow.transformer.utils"
_tf1 = tf.compat.v1


def _metric_variable(name: Optional[str], default_name: str, values):
  """A float32 scalar local variable for a streaming metric."""
  with _tf1.variable_scope(name, default_name, [values]):
    return _tf1.get_variable(
      "accum",
      shape=[],
      dtype=tf.float32,
      trainable=False,
      collections=[
        _tf1.GraphKeys.LOCAL_VARIABLES,
        _tf1.GraphKeys.METRIC_VARIABLES,
      ],
      initializer=_tf1.zeros_initializer(),
    )


def metric_sum(
  values: tf.Tensor, name: Optional[str] = None, **kwargs
) -> Tuple[tf.Tensor, tf.Operation]:
  """A streaming sum of values: (total, update_op), as tf.metrics return.

  Extra keyword arguments (weights, ...) are accepted and ignored, as in
  the original.

  Args:
    values: a numeric tensor whose elements are added to the total.
    name: the name of the accumulator variable.

  Returns:
    A (total, update_op) pair, as tf.compat.v1.metrics functions return.
  """
  del kwargs
  accum = _metric_variable(name, "metric_sum", values)
  update_op = _tf1.assign_add(accum, tf.reduce_sum(tf.cast(values, tf.float32)))
  return accum, update_op


def metric_max(
  values: tf.Tensor, name: Optional[str] = None, **kwargs
) -> Tuple[tf.Tensor, tf.Operation]:
  """A streaming maximum of values: (max, update_op); starts at 0.

  Args:
    values: a numeric tensor whose largest element updates the maximum.
    name: the name of the accumulator variable.

  Returns:
    A (maximum, update_op) pair, as tf.compat.v1.metrics functions return.
  """
  del kwargs
  accum = _metric_variable(name, "metric_max", values)
  update_op = _tf1.assign(
    accum, tf.maximum(accum, tf.reduce_max(tf.cast(values, tf.float32)))
  )
  return accum, update_op


def _metric_ratio(numerator, denominator, name: str):
  """(sum(numerator) / sum(denominator), update_op) over all batches."""
  with _tf1.variable_scope(name):
    num, num_update = metric_sum(numerator, "numerator")
    den, den_update = metric_sum(denominator, "denominator")
  return (tf.math.divide_no_nan(num, den), tf.group(num_update, den_update))


class ModelFnSpec(NamedTuple):
  """What the model_fn built for one mode (an EstimatorSpec stand-in).

  Run `hooks` (MtfRestoreHook: copy masters to slices after variables are
  initialised or restored) and `saver_listener` (copy slices to masters
  before a checkpoint is saved) as the original's Estimator did.
  """

  mode: str
  loss: Optional[tf.Tensor]
  train_op: Optional[Any]
  predictions: Optional[Dict[str, tf.Tensor]]
  eval_metric_ops: Optional[Dict[str, Tuple[tf.Tensor, Any]]]
  hooks: List[Any]
  saver_listener: Optional[Any]
  lowering: mtf.Lowering


def _eval_metric_ops(xent, predictions, targets, weights):
  """The original's teacher-forced eval metrics as streaming metrics.

  weights (float 0/1) says where a target counts; a row counts where it
  has any such target, and is right where all of them are predicted.
  """
  correct = tf.cast(tf.equal(predictions, targets), tf.float32) * weights
  counted = tf.reduce_sum(weights, axis=-1)
  rows = tf.cast(counted > 0, tf.float32)
  all_right = tf.cast(
    tf.equal(tf.reduce_sum(correct, axis=-1), counted), tf.float32
  )
  return {
    "neg_log_perplexity": _metric_ratio(
      -xent * weights, weights, "neg_log_perplexity"
    ),
    "token_accuracy": _metric_ratio(correct, weights, "token_accuracy"),
    "sequence_accuracy": _metric_ratio(
      all_right * rows, rows, "sequence_accuracy"
    ),
    "mean_label": _metric_ratio(
      tf.cast(targets, tf.float32) * weights, weights, "mean_label"
    ),
    "num_eval_tokens": metric_sum(weights, "num_eval_tokens"),
    "max_targets_length": metric_max(counted, "max_targets_length"),
  }


class ModelFn:
  """model_fn(features, labels, mode, params=None, config=None) -> spec.

  One driver.Estimator per TF graph (the eager one is `self.estimator`):
  variables, the global step and the mesh live with the graph that uses
  them.
  """

  def __init__(
    self,
    estimator_kwargs: Dict[str, Any],
    score_in_predict_mode: bool,
    use_tpu: bool = False,
  ):
    self._kwargs = estimator_kwargs
    self.score_in_predict_mode = score_in_predict_mode
    self._use_tpu = use_tpu
    self._estimators: Dict[Any, driver.Estimator] = {}
    self.estimator = self._estimator_for_current_graph()

  def _estimator_for_current_graph(self) -> driver.Estimator:
    key = "eager" if tf.executing_eagerly() else _tf1.get_default_graph()
    est = self._estimators.get(key)
    if est is None:
      est = driver.Estimator(
        **self._kwargs, variables_in_current_graph=key != "eager"
      )
      self._estimators[key] = est
    return est

  def _maybe_detokenize(self, ids: tf.Tensor, vocabulary) -> tf.Tensor:
    """Rows of ids [batch, length] as texts [batch] where the vocabulary
    decodes in the graph (not on TPU), as the original's predictions; else
    the ids. Each row is decoded on its own, so vocabularies whose decode_tf
    takes one row serve too.
    """
    if self._use_tpu or not hasattr(vocabulary, "decode_tf"):
      return ids
    return tf.map_fn(
      vocabulary.decode_tf,
      ids,
      fn_output_signature=tf.TensorSpec([], tf.string),
    )

  def __call__(
    self, features, labels=None, mode=ModeKeys.TRAIN, params=None, config=None
  ) -> ModelFnSpec:
    del labels, params, config
    est = self._estimator_for_current_graph()
    predict_batch_size = features.get("predict_batch_size")
    features = model_features(features)
    if mode == ModeKeys.TRAIN:
      lowering, loss, updates, _ = est.build_train_graph(features)
      with tf.control_dependencies(updates + [loss]):
        train_op = est.global_step.assign_add(1)
      return ModelFnSpec(
        mode,
        loss,
        train_op,
        None,
        None,
        [mtf.MtfRestoreHook(lowering)],
        mtf.MtfCheckpointSaverListener(lowering),
        lowering,
      )
    if mode == ModeKeys.EVAL or (
      mode == ModeKeys.PREDICT and self.score_in_predict_mode
    ):
      lowering, loss, xent, predictions, targets, weights = (
        driver_eval.teacher_forced_graph(
          est, features, scoring=mode != ModeKeys.EVAL
        )
      )
      if mode == ModeKeys.EVAL:
        return ModelFnSpec(
          mode,
          loss,
          None,
          None,
          _eval_metric_ops(xent, predictions, targets, weights),
          [mtf.MtfRestoreHook(lowering)],
          None,
          lowering,
        )
      scores = -tf.reduce_sum(xent * weights, axis=-1)
      outputs = {
        "targets": self._maybe_detokenize(
          clean_decodes(targets), targets_vocabulary(est.vocabulary)
        ),
        "scores": scores,
      }
      return ModelFnSpec(
        mode,
        None,
        None,
        outputs,
        None,
        [mtf.MtfRestoreHook(lowering)],
        None,
        lowering,
      )
    if mode == ModeKeys.PREDICT:
      lowering, outputs = driver_eval.decode_graph(est, features["inputs"])
      predictions = {
        "inputs": self._maybe_detokenize(
          clean_decodes(features["inputs"]), inputs_vocabulary(est.vocabulary)
        ),
        "outputs": self._maybe_detokenize(
          outputs, targets_vocabulary(est.vocabulary)
        ),
      }
      if predict_batch_size is not None:
        predictions = {
          k: v[:predict_batch_size] for k, v in predictions.items()
        }
      return ModelFnSpec(
        mode,
        None,
        None,
        predictions,
        None,
        [mtf.MtfRestoreHook(lowering)],
        None,
        lowering,
      )
    raise ValueError(
      "model_fn: unknown mode %r; expected %r, %r or %r"
      % (mode, ModeKeys.TRAIN, ModeKeys.EVAL, ModeKeys.PREDICT)
    )


@gin.configurable(module=_GIN_MODULE, denylist=["predict_fn"])
def tpu_estimator_model_fn(
  model_type,
  transformer_model,
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
  learning_rate_schedule=None,
  optimizer=None,
  outer_batch_size=1,
  tpu_summaries=False,
  predict_fn=None,
  score_in_predict_mode=False,
  variable_filter=None,
  init_checkpoint=None,
  init_variable_filter="",
  ensemble_inputs=None,
  mesh_devices=None,
  model_info_file=None,
  hierarchical_tiling_spec=None,
  weight_decay_checkpoint=None,
  *,
  mesh_impl: str = "auto",
) -> ModelFn:
  """The model_fn of a transformer on a mesh (see ModelFn).

  utils.run's `tpu` decides where the model runs: use_tpu only keeps
  predictions as ids (off TPU, as the original's, they are text where the
  vocabulary decodes in the graph) and tpu_summaries is logged;
  hierarchical_tiling_spec places the mesh on a Cloud TPU when utils.run
  runs there.

  Args:
    model_type: "bitransformer", "lm", "delimited_lm", "aligned" or
      "bi_student_teacher".
    transformer_model: the Unitransformer or Bitransformer (or StudentTeacher)
      to run.
    vocabulary: a Vocabulary, or an (inputs, targets) pair of them.
    model_dir: the directory of the checkpoints and summaries.
    use_tpu: whether the model_fn's predictions stay ids (TPUs are not driven
      from here).
    mesh_shape: an mtf.Shape or a string like "batch:8;model:4": the mesh's
      dims.
    layout_rules: an mtf.LayoutRules or a string like "batch:batch,d_ff:model":
      which tensor dims split over which mesh dims.
    batch_size: the global number of sequences per batch.
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
    outer_batch_size: split the batch into [outer_batch, batch / outer_batch]
      dims in training and evaluation.
    tpu_summaries: accepted for the original's signature (TPU summaries are not
      written).
    predict_fn: a function replacing the default decoding in predict mode,
      called as predict_fn(model, features, variable_dtype).
    score_in_predict_mode: make predict mode score the given targets instead of
      decoding.
    variable_filter: a function of an mtf.Variable that says whether to train
      it (e.g. variable_filter_max_size); None trains every variable.
    init_checkpoint: a checkpoint to initialize the variables from when
      model_dir has none.
    init_variable_filter: a regular expression of the variable names to load
      from init_checkpoint ("": all).
    ensemble_inputs: for an ensemble model, the number of members, each fed its
      own batch (None: one input batch).
    mesh_devices: the device names of the mesh's processors (default: the local
      CPUs/GPUs).
    model_info_file: a file to write the model's variable names and shapes to
      (None: do not write).
    hierarchical_tiling_spec: a HierarchicalTiling spec mapping the mesh's
      processors onto a Cloud TPU's cores when utils.run runs with `tpu`
      (used, as in the original, on TPU topologies with z == 1; None: the
      automatic mapping). Unused off TPU.
    weight_decay_checkpoint: a checkpoint directory to decay the weights
      towards. Accepted and logged: the original documents it as a
      Google-internal option and its released code does not use it either.
    mesh_impl: "placement", "simd" or "auto" (SIMD on TPU hosts, else
      placement): the mesh implementation of the driver.Estimator.

  Returns:
    A ModelFn: callable as model_fn(features, labels, mode, params).
  """
  if tpu_summaries:
    logging.warning(
      "tpu_estimator_model_fn: tpu_summaries is ignored; utils.run's tpu "
      "parameter decides where the model runs"
    )
  if weight_decay_checkpoint is not None:
    logging.warning(
      "tpu_estimator_model_fn: weight_decay_checkpoint=%r is ignored, as in "
      "the original's released code",
      weight_decay_checkpoint,
    )
  kwargs = dict(
    model_type=model_type,
    transformer_model=transformer_model,
    vocabulary=vocabulary,
    model_dir=model_dir,
    mesh_shape=mesh_shape,
    layout_rules=layout_rules,
    batch_size=batch_size,
    sequence_length=sequence_length,
    autostack=autostack,
    keep_checkpoint_max=keep_checkpoint_max,
    save_checkpoints_steps=save_checkpoints_steps,
    learning_rate_schedule=learning_rate_schedule,
    optimizer=optimizer,
    variable_filter=variable_filter,
    init_checkpoint=init_checkpoint,
    init_variable_filter=init_variable_filter,
    mesh_devices=mesh_devices,
    variable_dtype=get_variable_dtype(),
    outer_batch_size=outer_batch_size,
    ensemble_inputs=ensemble_inputs,
    predict_fn=predict_fn,
    model_info_file=model_info_file,
    mesh_impl=mesh_impl,
    hierarchical_tiling_spec=hierarchical_tiling_spec,
  )
  return ModelFn(kwargs, score_in_predict_mode, use_tpu=bool(use_tpu))
