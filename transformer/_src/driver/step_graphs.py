"""The mtf graphs of the driver's steps: features in, logits, loss, updates.

`StepGraphs` is the part of the Estimator that builds and lowers mtf graphs:
the batch dims and imported features of a batch, the features a model type
reads, the model's logits and loss, and a whole training step (gradients,
learning rate, optimizer updates). `model_features` and `feature_length`
select and size a dataset element's model features.
"""

from __future__ import annotations

import os
from typing import Callable, Dict, List, Optional

from absl import logging
import tensorflow as tf

import mesh_tensorflow as mtf
from transformer._src.data.delimited_lm import dynamic_text2self
from transformer._src.driver import mesh_impl_choice
from transformer._src.driver.config import serialize_num_microbatches
from transformer._src.layers.context import ModeKeys
from transformer._src.models.decoder_inputs import autoregressive_inputs
from transformer._src.models.unitransformer import Unitransformer

__all__ = [
  "MODEL_FEATURES",
  "StepGraphs",
  "feature_length",
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


class StepGraphs:
  """Builds and lowers the mtf graphs of an Estimator's steps.

  A base of Estimator: its methods read the estimator's settings (model,
  model_type, mesh_impl, mesh_shape, layout_rules, store, batch_size,
  sequence_length, outer_batch_size, ensemble_inputs, variable_dtype,
  learning_rate_schedule, optimizer, variable_filter, autostack,
  model_info_file and global_step), which Estimator.__init__ sets.
  """

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
