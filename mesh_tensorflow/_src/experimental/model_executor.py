r"""Trains and evaluates the spatially partitioned U-Net: a TF2 loop.

mesh_tensorflow 0.1.21 drove this model with TF1 sessions, hooks and, on
TPU, infeed threads. Here each phase is a compiled `tf.function` step on a
PlacementMeshImpl over the local GPUs (else CPUs, e.g. virtual CPUs): the
input reader slices each batch, the U-Net is lowered inside the step, and
Adafactor updates the slices. Masters (full-size variables) are what the
checkpoints hold (name-based, as the original's Saver wrote them: the
variable store's masters and the global step, `model.ckpt-<n>` in
checkpoint_dir), so a run resumes from, and evaluates, the latest
checkpoint. Loss and metrics go to TensorBoard event
files in summary_dir; evaluation predictions to pred_output_dir.

`num_training_loops` times: `num_train_iterations_per_loop` training steps
(a checkpoint every `save_checkpoints_steps` and at the end of the phase),
then `num_eval_iterations_per_loop` evaluation steps whose predictions
unet_data.PostProcessor saves and scores.

`use_tpu` builds the original's TPU mesh (SimdMeshImpl over the TPU system's
device assignment) in MeshContext, but the loop itself runs only on local
devices here; TPU training of mtf models is the transformer driver's job
(`transformer.main --tpu`).

Command line (flags as in the original, plus the U-Net's):

  python -m mesh_tensorflow.experimental.model_executor --use_tpu=false \
      --mesh_shape='rows:2, columns:2' --checkpoint_dir=/tmp/unet ...
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any, Dict, List, Optional, Tuple

from absl import flags
from absl import logging
import numpy as np
import tensorflow as tf

from mesh_tensorflow._src.experimental import dataclass_flags
from mesh_tensorflow._src.experimental import input_reader
from mesh_tensorflow._src.experimental import unet
from mesh_tensorflow._src.experimental import unet_data
from mesh_tensorflow._src.experimental import unet_hparams
from mesh_tensorflow._src.graph import Graph
from mesh_tensorflow._src.graph import Mesh
from mesh_tensorflow._src.lowering import Lowering
from mesh_tensorflow._src.mesh_impls.placement import PlacementMeshImpl
from mesh_tensorflow._src.mesh_impls.simd import SimdMeshImpl
from mesh_tensorflow._src.ops import gradients as gradient_ops
from mesh_tensorflow._src.ops import io as io_ops
from mesh_tensorflow._src.optimizers import global_step as global_step_lib
from mesh_tensorflow._src.optimizers.adafactor import AdafactorOptimizer
from mesh_tensorflow._src.shapes import convert_to_shape
from mesh_tensorflow._src.topology_rank import topology_rank
from mesh_tensorflow._src.variable_placer import BalancedVariablePlacer
from mesh_tensorflow._src.variables import VariableStore
from mesh_tensorflow._src.variables import variable_store

__all__ = [
  "ExecutorOptions",
  "MeshContext",
  "define_flags",
  "main",
  "run",
  "train_and_eval",
]


@dataclasses.dataclass(frozen=True)
class ExecutorOptions(dataclass_flags.FlagSettings):
  """The loop's settings: the original's flags, names and defaults.

  Attributes:
    use_tpu: train on the TPU system (see the module docstring).
    lr: the learning rate.
    lr_drop_steps: the learning rate is multiplied by lr_drop_rate every
      lr_drop_steps steps.
    lr_drop_rate: see lr_drop_steps.
    num_train_iterations_per_loop: training steps per loop.
    num_eval_iterations_per_loop: evaluation steps per loop.
    num_training_loops: the number of (train, eval) loops.
    mesh_shape: the mesh shape, e.g. "rows:2, columns:2".
    master: the TPU name or address (TPU only).
    checkpoint_dir: checkpoints are saved and restored here ("": none).
    save_checkpoints_steps: steps between checkpoints.
    on_gcp: TPU hosts are this job's tasks, not "tpu_worker" ones.
    write_summary: write loss and metrics to summary_dir.
    summary_dir: the TensorBoard event directory.
    pred_output_dir: where evaluation predictions are saved.
  """

  use_tpu: bool = True
  lr: float = 0.003
  lr_drop_steps: float = 20000
  lr_drop_rate: float = 0.3
  num_train_iterations_per_loop: int = 500
  num_eval_iterations_per_loop: int = 2
  num_training_loops: int = 1000
  mesh_shape: str = "rows:4, columns:4, cores:2"
  master: str = ""
  checkpoint_dir: str = ""
  save_checkpoints_steps: int = 500
  on_gcp: bool = False
  write_summary: bool = True
  summary_dir: str = ""
  pred_output_dir: str = ""


_FLAG_HELP = {
  "use_tpu": "Use TPU or GPU.",
  "lr": "Learning rate.",
  "lr_drop_steps": "Learning rate drops for every `lr_drop_steps` steps.",
  "lr_drop_rate": "Learning rate drops by this amount.",
  "num_train_iterations_per_loop": "Number of training iterations per loop.",
  "num_eval_iterations_per_loop": "Number of eval iterations per loop.",
  "num_training_loops": "Number of training loops.",
  "mesh_shape": "mesh shape",
  "master": "Can be a headless master.",
  "checkpoint_dir": "Path to saved models.",
  "save_checkpoints_steps": "Frequency for saving models.",
  "on_gcp": "Assign true if running on google cloud.",
  "write_summary": "Whether to write summary.",
  "summary_dir": "Path to saved summaries.",
  "pred_output_dir": "Path to saved pred results.",
}


def define_flags(flag_values=flags.FLAGS) -> None:
  """Defines the loop's and the U-Net's flags (skipping defined names).

  Args:
    flag_values: the absl FlagValues to define them in.
  """
  dataclass_flags.define(ExecutorOptions, _FLAG_HELP, flag_values)
  unet_hparams.define_flags(flag_values)


def _local_devices(sess, device_type: str) -> List[str]:
  if sess is not None:
    names = [
      d.name for d in sess.list_devices() if d.device_type == device_type
    ]
  else:
    names = [d.name for d in tf.config.list_logical_devices(device_type)]
  return [n for n in names if "coordinator" not in n]


class MeshContext:
  """Creates the mtf graph, mesh and mesh implementation of each phase.

  Without TPU: a PlacementMeshImpl over the local GPUs, or the CPUs when
  there is no GPU (processor i on device i; one device for all when there
  are fewer devices than processors). With TPU: initializes the TPU system
  (through `sess`, or TF2's tf.tpu.experimental.initialize_tpu_system) and
  builds a SimdMeshImpl over its device assignment (never run here).

  Args:
    sess: a tf.compat.v1.Session to list devices (and initialize the TPU)
      with, or None under TF2 behaviour.
    use_tpu: use the TPU system.
    mesh_shape: the mesh shape (a string or mtf Shape).
    layout_rules: the layout rules.
  """

  def __init__(self, sess, use_tpu: bool, mesh_shape, layout_rules):
    self._use_tpu = use_tpu
    self._mesh_shape = convert_to_shape(mesh_shape)
    self._layout_rules = layout_rules
    self._d_assignment = None
    self._num_hosts = None
    self._num_cores = None
    self._cpu_devices = _local_devices(sess, "CPU")
    self._gpu_devices = _local_devices(sess, "GPU")
    if use_tpu:
      if sess is not None:
        topology = tf.tpu.experimental.Topology(
          serialized=sess.run(tf.compat.v1.tpu.initialize_system())
        )
      else:
        topology = tf.tpu.experimental.initialize_tpu_system()
      self._num_cores = int(np.prod(topology.mesh_shape))
      self._num_hosts = int(topology.num_tasks)
      self._d_assignment = tf.tpu.experimental.DeviceAssignment.build(
        topology,
        computation_shape=[1] * topology_rank(topology),
        num_replicas=self._num_cores,
      )
    self._mesh_impl = self._make_mesh_impl()

  def _processor_devices(self) -> List[str]:
    devices = self._gpu_devices or self._cpu_devices or ["/cpu:0"]
    size = self._mesh_shape.size
    return devices[:size] if len(devices) >= size else [devices[0]] * size

  def _make_mesh_impl(self):
    if self._use_tpu:
      return SimdMeshImpl(
        self._mesh_shape, self._layout_rules, None, self._d_assignment
      )
    return PlacementMeshImpl(
      self._mesh_shape, self._layout_rules, self._processor_devices()
    )

  def create_graph_mesh_and_mesh_impl(self) -> Tuple[Any, Any, Any]:
    """A new mtf Graph, a Mesh "my_mesh" on it, and a mesh implementation.

    On TPU the variables are placed on the hosts' CPUs (balanced, worker 0
    holding less, as it also caches the TPU programs).

    Returns:
      (graph, mesh, mesh_impl).
    """
    graph = Graph()
    placer = None
    if self._use_tpu:
      replica_cache_size = 300 * 1024 * 1024  # bytes per replica
      worker0_mem = replica_cache_size * 8 * self._num_hosts
      usage = [worker0_mem] + [0] * (self._num_hosts - 1)
      placer = BalancedVariablePlacer(self._cpu_devices, usage)
    mesh = Mesh(graph, "my_mesh", placer)
    return graph, mesh, self._make_mesh_impl()

  @property
  def device_assignment(self) -> Any:
    """The TPU device assignment (None without TPU)."""
    return self._d_assignment

  @property
  def num_hosts(self) -> Optional[int]:
    """The number of TPU hosts (None without TPU)."""
    return self._num_hosts

  @property
  def num_cores(self) -> Optional[int]:
    """The number of TPU cores (None without TPU)."""
    return self._num_cores

  @property
  def num_cores_per_host(self) -> int:
    """TPU cores per host."""
    return self._num_cores // self._num_hosts

  @property
  def mesh_impl(self) -> Any:
    """The mesh implementation."""
    return self._mesh_impl


def _write_scalars(writer, step: int, scalars: Dict[str, float]) -> None:
  with writer.as_default(step=step):
    for name, value in scalars.items():
      # tf.summary.scalar lives in tensorboard (not a dependency): write the
      # same record with the scalar plugin's metadata.
      metadata = tf.compat.v1.SummaryMetadata()
      metadata.plugin_data.plugin_name = "scalars"
      tf.summary.write(
        name, tf.constant(value, tf.float32), step=step, metadata=metadata
      )


class _Phase:
  """One compiled step of training or evaluation, and its input reader."""

  def __init__(self, mode: str, mesh_context: MeshContext, options, store):
    self.mode = mode
    self._mesh_context = mesh_context
    self._options = options
    self._store = store
    self.laid_out_variables = []
    self._copies = {}
    self.reader = input_reader.PlacementMeshImplInputReader(
      mesh_context.mesh_impl,
      unet_data.get_dataset_creator(mode),
      unet_data.get_input_mtf_shapes(mode),
      is_eval_mode=False,
    )
    self._hparams = unet_hparams.hparams()
    self.step = tf.function(self._step, autograph=False)

  def _step(self):
    with unet_hparams.hparams_scope(self._hparams), variable_store(self._store):
      return self.reader.gpu_placement(self._model_fn)

  def _model_fn(self, images, labels):
    global_step = global_step_lib.get_or_create_global_step()
    graph, mesh, mesh_impl = (
      self._mesh_context.create_graph_mesh_and_mesh_impl()
    )
    preds, loss, scalars, bn_update_ops = unet.unet_with_spatial_partition(
      mesh, mesh_impl, self.mode, images, labels
    )
    options = self._options
    outputs = {}
    if self.mode == "train":
      var_grads = gradient_ops.gradients(
        [loss], [v.outputs[0] for v in graph.trainable_variables]
      )
      lr = options.lr * tf.pow(
        options.lr_drop_rate,
        tf.floor(tf.cast(global_step, tf.float32) / options.lr_drop_steps),
      )
      update_ops = AdafactorOptimizer(learning_rate=lr).apply_grads(
        var_grads, graph.trainable_variables
      )
      lowering = Lowering(graph, {mesh: mesh_impl})
      tf_updates = [lowering.lowered_operation(op) for op in update_ops]
      tf_updates += [lowering.lowered_operation(op) for op in bn_update_ops]
      with tf.control_dependencies([u for u in tf_updates if u is not None]):
        outputs["global_step"] = global_step.assign_add(1)
      outputs["learning_rate"] = lr
    else:
      preds = [io_ops.anonymize(pred) for pred in preds]
      lowering = Lowering(graph, {mesh: mesh_impl})
      outputs["preds"] = [
        tf.cast(lowering.export_to_tf_tensor(p), tf.float32) for p in preds
      ]
      outputs["global_step"] = tf.identity(global_step)
    outputs["loss"] = tf.cast(lowering.export_to_tf_tensor(loss), tf.float32)
    outputs["scalars"] = {
      k: tf.cast(lowering.export_to_tf_tensor(v), tf.float32)
      for k, v in scalars.items()
    }
    self.laid_out_variables = list(lowering.variables.values())
    return outputs

  def copy(self, what: str) -> None:
    """Runs copy_master_to_slices or copy_slices_to_master of every variable."""
    if not self.laid_out_variables:
      return
    if what not in self._copies:  # compiled once per direction
      self._copies[what] = tf.function(
        functools.partial(_copy_all, self.laid_out_variables, what),
        autograph=False,
      )
    self._copies[what]()


def _copy_all(laid_out_variables, what: str) -> None:
  tf.group(*[getattr(v, what) for v in laid_out_variables])


def run(
  options: ExecutorOptions, hparams: Optional[unet_hparams.Hparams] = None
) -> Dict[str, List[float]]:
  """Runs the train/eval loops (see the module docstring).

  Args:
    options: the loop's settings.
    hparams: the U-Net's hyperparameters (default: the current ones).

  Returns:
    {"train_loss": the loss of every training step, "eval_loss": of every
    evaluation step, "dice_per_case", "dice_global": each eval phase's}.

  Raises:
    NotImplementedError: with use_tpu (see the module docstring).
  """
  if options.use_tpu:
    raise NotImplementedError(
      "model_executor runs on local devices (use_tpu=False); train mtf "
      "models on Cloud TPU with transformer.main --tpu"
    )
  with unet_hparams.hparams_scope(hparams):
    mesh_context = MeshContext(
      None, options.use_tpu, options.mesh_shape, unet_hparams.get_layout()
    )
    store = VariableStore()
    global_step = global_step_lib.get_or_create_global_step()
    train = _Phase("train", mesh_context, options, store)
    # Tracing creates the variables, so a checkpoint can be restored first.
    train.step.get_concrete_function()
    evaluate = None
    if options.num_eval_iterations_per_loop > 0:
      evaluate = _Phase("eval", mesh_context, options, store)
    # Name-based, as the original's Saver wrote: the masters under their mtf
    # names (conv_down_0_0/kernel, ..._slot_vr) and global_step.
    saver = tf.compat.v1.train.Saver(
      var_list={**store.masters, "global_step": global_step}, max_to_keep=5
    )
    latest = None
    if options.checkpoint_dir:
      latest = tf.train.latest_checkpoint(options.checkpoint_dir)
    if latest:
      saver.restore(None, latest)
      logging.info("restored %s", latest)
    else:
      global_step.assign(0)
    train.copy("copy_master_to_slices")
    writer = None
    if options.write_summary and options.summary_dir:
      writer = tf.summary.create_file_writer(options.summary_dir)
    history = {
      "train_loss": [],
      "eval_loss": [],
      "dice_per_case": [],
      "dice_global": [],
    }

    def save():
      if options.checkpoint_dir:
        train.copy("copy_slices_to_master")
        saver.save(
          None,
          os.path.join(options.checkpoint_dir, "model.ckpt"),
          global_step=int(global_step.numpy()),
        )

    for _ in range(options.num_training_loops):
      for i in range(options.num_train_iterations_per_loop):
        outputs = train.step()
        step = int(outputs["global_step"])
        loss = float(outputs["loss"])
        history["train_loss"].append(loss)
        logging.info("train step %d: loss %.5f", step, loss)
        if writer is not None:
          _write_scalars(
            writer,
            step,
            {
              "train_loss": loss,
              "train_learning_rate": float(outputs["learning_rate"]),
              **{"train_" + k: float(v) for k, v in outputs["scalars"].items()},
            },
          )
        last = i == options.num_train_iterations_per_loop - 1
        if last or step % options.save_checkpoints_steps == 0:
          save()
      if evaluate is None:
        continue
      post_processor = unet_data.PostProcessor()
      for _ in range(options.num_eval_iterations_per_loop):
        outputs = evaluate.step()
        loss = float(outputs["loss"])
        step = int(outputs["global_step"])
        history["eval_loss"].append(loss)
        if options.pred_output_dir:
          results = [p.numpy() for p in outputs["preds"]] + [loss, step]
          post_processor.record(results, options.pred_output_dir)
        if writer is not None:
          _write_scalars(
            writer,
            step,
            {
              "eval_loss": loss,
              **{"eval_" + k: float(v) for k, v in outputs["scalars"].items()},
            },
          )
      if options.pred_output_dir:
        dice_per_case, dice_global = post_processor.finish()
        history["dice_per_case"].append(dice_per_case)
        history["dice_global"].append(dice_global)
    if writer is not None:
      writer.flush()
    return history


def train_and_eval() -> None:
  """Trains and evaluates the U-Net as the parsed flags say (define_flags)."""
  logging.info("master: %r", flags.FLAGS.master)
  run(
    ExecutorOptions.from_flags(flags.FLAGS),
    unet_hparams.Hparams.from_flags(flags.FLAGS),
  )
  logging.info("finished.")


def main(_) -> None:
  """The entry point (absl.app.run(main) after define_flags()).

  Args:
    _: the command line left after flag parsing (unused).
  """
  train_and_eval()
