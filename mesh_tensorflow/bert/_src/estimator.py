"""The TF2 driver of the BERT tasks, on the transformer driver's Estimator.

The original ran pretraining and fine-tuning with TPUEstimator model_fns.
`BertEstimator` keeps the transformer Estimator's machinery (variable store
with the original checkpoint names, one compiled tf.function per phase,
checkpoints, init_checkpoint, TensorBoard scalars, placement or SIMD mesh)
and swaps in a task's mtf graph (a `TaskModel`) and BERT's optimizer
(create_optimizer) for the update.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Dict, Iterator, Optional, Sequence

import numpy as np
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.bert._src import optimization
from transformer import utils as transformer_utils

__all__ = [
  "BertEstimator",
  "NOT_FROM_INIT_CHECKPOINT",
  "TaskModel",
  "import_feature",
]

# The checkpoint names a fine-tuning run takes from its init_checkpoint: not
# the optimizer's slots nor the global step (a regex over checkpoint names).
NOT_FROM_INIT_CHECKPOINT = r"^(?!.*(global_step|adam_|slot_))"


@dataclasses.dataclass(frozen=True)
class TaskModel:
  """A BERT task's mtf graph and its training settings.

  What a run_* module's model_fn_builder returns, in place of the original's
  TPUEstimator model_fn; a BertEstimator runs it.

  Attributes:
    build: build(mesh, features, is_training) -> {"loss": scalar mtf.Tensor,
      optionally "objective": the scalar training minimizes instead (e.g.
      with the mixture-of-experts loss), and name: mtf.Tensor for every
      output that evaluation and prediction export}.
    learning_rate: the peak learning rate (create_optimizer's init_lr).
    num_train_steps: the step at which the learning rate reaches 0.
    num_warmup_steps: the number of linear warmup steps.
    init_checkpoint: a checkpoint (e.g. of pretraining) whose model weights
      initialize a new run (not its optimizer slots nor its global step).
    optimizer: "adam" or "adafactor".
    clip_gradients: clip the gradients to global norm 1.
    max_optimized_variable_size: train only variables of at most this many
      elements (None: all).
  """

  build: Callable[[mtf.Mesh, Dict[str, tf.Tensor], bool], Dict]
  learning_rate: Optional[float]
  num_train_steps: int
  num_warmup_steps: int = 0
  init_checkpoint: Optional[str] = None
  optimizer: str = "adam"
  clip_gradients: bool = True
  max_optimized_variable_size: Optional[int] = None


def import_feature(
  mesh: mtf.Mesh, tensor: tf.Tensor, dims: Sequence[mtf.Dimension], name: str
) -> mtf.Tensor:
  """A tf feature as an mtf.Tensor with the given dims (no communication).

  Args:
    mesh: the mtf.Mesh.
    tensor: the tf.Tensor (its size must match the dims').
    dims: the mtf.Dimensions of the result.
    name: the operation's name.

  Returns:
    The mtf.Tensor.
  """
  shape = mtf.Shape(list(dims))
  tensor = tf.reshape(tensor, shape.to_integer_list)
  return mtf.import_fully_replicated(mesh, tensor, shape, name=name)


class BertEstimator(transformer_utils.Estimator):
  """Trains, evaluates and predicts one BERT task on a mesh.

  Args:
    task: the TaskModel to run.
    model_dir: the directory of checkpoints and summaries.
    mesh_shape: an mtf.Shape or its string ("batch:8").
    layout_rules: an mtf.LayoutRules or its string.
    batch_size: the training batch size.
    save_checkpoints_steps: write a checkpoint every this many steps.
    keep_checkpoint_max: the number of checkpoints kept (None: all).
    log_every_steps: log and summarize the loss every this many steps.
    mesh_impl: "placement", "simd" or "auto".
    mesh_devices: the devices of the mesh (default: the local CPUs/GPUs).
  """

  def __init__(
    self,
    task: TaskModel,
    model_dir: str,
    mesh_shape,
    layout_rules,
    batch_size: int,
    *,
    save_checkpoints_steps: int = 1000,
    keep_checkpoint_max: Optional[int] = 10,
    log_every_steps: int = 100,
    mesh_impl: str = "auto",
    mesh_devices=None,
  ):
    super().__init__(
      "bert",
      None,
      None,
      model_dir,
      mesh_shape,
      layout_rules,
      batch_size,
      {},
      autostack=False,
      keep_checkpoint_max=keep_checkpoint_max,
      save_checkpoints_steps=save_checkpoints_steps,
      init_checkpoint=task.init_checkpoint,
      init_variable_filter=NOT_FROM_INIT_CHECKPOINT,
      mesh_devices=mesh_devices,
      log_every_steps=log_every_steps,
      total_train_steps=task.num_train_steps,
      mesh_impl=mesh_impl,
    )
    self.task = task

  def count_tokens(self, features: Dict[str, tf.Tensor]) -> tf.Tensor:
    """The real (unpadded) tokens of a batch: the sum of its input_mask.

    Args:
      features: the batch.

    Returns:
      An int64 scalar.
    """
    return tf.reduce_sum(tf.cast(features["input_mask"], tf.int64))

  def lower_train_step(self, features: Dict[str, tf.Tensor]):
    """Builds and lowers one training step of the task over a tf batch.

    Args:
      features: {feature name: tf.Tensor [batch, ...]}.

    Returns:
      A (lowering, loss, updates, learning_rate) tuple: the float32 loss,
      the lowered variable updates (the global step is not incremented) and
      the learning rate.
    """
    task = self.task
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "bert_mesh")
    # create_optimizer's learning rate reads the graph's global step.
    tf_graph = tf.compat.v1.get_default_graph()
    if not tf_graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_STEP):
      tf_graph.add_to_collection(
        tf.compat.v1.GraphKeys.GLOBAL_STEP, self.global_step
      )
    with mtf.variable_store(self.store):
      outputs = task.build(mesh, features, True)
      objective = outputs.get("objective", outputs["loss"])
      learning_rate, update_ops = optimization.create_optimizer(
        objective,
        task.learning_rate,
        task.num_train_steps,
        task.num_warmup_steps,
        max_optimized_variable_size=task.max_optimized_variable_size,
        optimizer=task.optimizer,
        clip_gradients=task.clip_gradients,
      )
    lowering = mtf.Lowering(graph, {mesh: self.mesh_impl})
    tf_loss = tf.cast(lowering.export_to_tf_tensor(outputs["loss"]), tf.float32)
    updates = [lowering.lowered_operation(op) for op in update_ops]
    if learning_rate is None:
      learning_rate = tf.constant(0.0)
    return lowering, tf_loss, updates, learning_rate

  def _lower_outputs(self, features):
    """Builds the task in inference mode; exports its outputs."""
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "bert_mesh")
    with mtf.variable_store(self.store):
      outputs = self.task.build(mesh, features, False)
    outputs.pop("objective", None)
    lowering = mtf.Lowering(graph, {mesh: self.mesh_impl})
    exported = {
      name: lowering.export_to_tf_tensor(tensor)
      for name, tensor in outputs.items()
    }
    return lowering, exported

  def _build_outputs_fn(self, phase):
    @tf.function(autograph=False)
    def outputs_fn(features):
      lowering, exported = self.lower_on_mesh(self._lower_outputs, features)
      phase.laid_out_variables = list(lowering.variables.values())
      return exported

    return outputs_fn

  def predict_batches(
    self,
    dataset: tf.data.Dataset,
    checkpoint_path: Optional[str] = None,
    max_batches: Optional[int] = None,
  ) -> Iterator[Dict[str, np.ndarray]]:
    """The model's outputs (no dropout) on each batch, with its features.

    Args:
      dataset: batches of features; every batch must have the same size.
      checkpoint_path: the checkpoint to run (default: the variables trained
        in this process, else the latest checkpoint of model_dir).
      max_batches: stop after this many batches (None: the whole dataset).

    Yields:
      {output or feature name: numpy array} per batch; outputs take
      precedence over features of the same name.
    """
    self.prepare(checkpoint_path)
    phase = self.phase_fn("outputs", self._build_outputs_fn)
    for index, features in enumerate(dataset):
      if max_batches is not None and index >= max_batches:
        return
      outputs = self.run_phase(phase, features)
      result = {name: t.numpy() for name, t in features.items()}
      result.update({name: t.numpy() for name, t in outputs.items()})
      yield result
