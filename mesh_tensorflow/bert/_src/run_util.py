"""What the BERT command-line drivers share: devices, estimator, results."""

from __future__ import annotations

from typing import Dict, List, Optional

from absl import flags
from absl import logging
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.bert._src import estimator

__all__ = [
  "COMMON_FLAGS",
  "FINE_TUNING_FLAGS",
  "TPU_FLAG_NAMES",
  "fine_tuning_task",
  "glob_files",
  "make_estimator",
  "write_results",
]


# The original's Cloud TPU flags. The TF2 driver runs the mesh on the local
# devices (SIMD over local TPU chips with --use_tpu); remote TPUs go through
# transformer.main's --tpu, so these are accepted and reported unused.
TPU_FLAG_NAMES = ("tpu_name", "tpu_zone", "gcp_project", "master")


# The flags (flag_util.define_flags specs) of every BERT script.
COMMON_FLAGS = [
  (
    "string",
    "bert_config_file",
    None,
    "The json config of the BERT model (its architecture).",
  ),
  (
    "string",
    "init_checkpoint",
    None,
    "Initial checkpoint (usually from a pre-trained BERT model).",
  ),
  ("integer", "train_batch_size", 32, "Total batch size for training."),
  ("float", "learning_rate", 5e-5, "The initial learning rate for Adam."),
  ("bool", "clip_gradients", True, "Apply gradient clipping."),
  ("string", "optimizer", "adam", "adam or adafactor."),
  (
    "integer",
    "save_checkpoints_steps",
    1000,
    "How often to save the model checkpoint.",
  ),
  (
    "integer",
    "iterations_per_loop",
    1000,
    "Steps per host loop on TPU (unused: each step is one call).",
  ),
  (
    "bool",
    "use_tpu",
    False,
    "Run SIMD over the local TPU chips (else placement on CPUs/GPUs).",
  ),
  ("string", "mesh_shape", "batch:8", "mesh shape"),
  (
    "string",
    "layout",
    "batch:batch,vocab:model,intermediate:model,num_heads:model,experts:batch",
    "layout rules",
  ),
  ("string", "tpu_name", None, "The Cloud TPU to use (unused here)."),
  ("string", "tpu_zone", None, "GCE zone of the Cloud TPU (unused here)."),
  (
    "string",
    "gcp_project",
    None,
    "Project of the Cloud TPU (unused here).",
  ),
  ("string", "master", None, "TensorFlow master URL (unused here)."),
]

# The flags that run_classifier and run_squad share.
FINE_TUNING_FLAGS = [
  (
    "string",
    "vocab_file",
    None,
    "The vocabulary file the BERT model was trained on.",
  ),
  (
    "string",
    "cached_train_file",
    None,
    "Prepared training records (skips converting the training set).",
  ),
  (
    "bool",
    "do_lower_case",
    True,
    "Lower-case the input (True for uncased models).",
  ),
  (
    "float",
    "max_optimized_variable_size",
    1e7,
    "Do not optimize variables larger than this.",
  ),
  ("bool", "do_train", False, "Whether to run training."),
  (
    "float",
    "num_train_epochs",
    3.0,
    "Total number of training epochs to perform.",
  ),
  (
    "float",
    "warmup_proportion",
    0.1,
    "Fraction of training with a linearly rising learning rate.",
  ),
]


def glob_files(patterns: Optional[str]) -> List[str]:
  """The files matching comma-separated glob patterns, in pattern order.

  Args:
    patterns: "a*.tfrecord,b.tfrecord" (None or "": none).

  Returns:
    The matching paths.
  """
  files = []
  for pattern in (patterns or "").split(","):
    if pattern:
      files.extend(tf.io.gfile.glob(pattern))
  return files


def _ensure_devices(mesh_shape: mtf.Shape) -> None:
  """Splits the CPU into mesh_shape.size devices if there are fewer."""
  if tf.config.list_physical_devices("GPU"):
    return
  try:
    mtf.utils.configure_virtual_cpus(max(1, mesh_shape.size))
  except RuntimeError as e:
    logging.warning("could not create %d CPU devices: %s", mesh_shape.size, e)


def make_estimator(
  task: estimator.TaskModel, flag_values: flags.FlagValues
) -> estimator.BertEstimator:
  """The BertEstimator that a BERT script's parsed flags describe.

  Reads --output_dir (the model directory), --mesh_shape, --layout,
  --train_batch_size, --save_checkpoints_steps and --use_tpu (SIMD over the
  local TPU chips, else placement), and warns about each Cloud TPU flag
  that is set (TPU_FLAG_NAMES: unused here). Without --use_tpu, on CPUs
  only, the CPU is split into as many devices as the mesh has processors
  (the original placed them all on one device).

  Args:
    task: the TaskModel.
    flag_values: the parsed flags of the script.

  Returns:
    The BertEstimator.
  """
  shape = mtf.convert_to_shape(flag_values.mesh_shape)
  for name in TPU_FLAG_NAMES:
    if name in flag_values and flag_values[name].value:
      logging.warning(
        "--%s is not used: the mesh runs on the local devices", name
      )
  if not flag_values.use_tpu:
    _ensure_devices(shape)
  return estimator.BertEstimator(
    task,
    flag_values.output_dir,
    shape,
    flag_values.layout,
    flag_values.train_batch_size,
    save_checkpoints_steps=flag_values.save_checkpoints_steps,
    mesh_impl="simd" if flag_values.use_tpu else "placement",
  )


def fine_tuning_task(
  build,
  flag_values: flags.FlagValues,
  init_checkpoint: Optional[str],
  learning_rate: float,
  num_train_steps: Optional[int],
  num_warmup_steps: Optional[int],
) -> estimator.TaskModel:
  """The TaskModel of a fine-tuning script (run_classifier, run_squad).

  The optimizer, clipping and largest trained variable come from
  --optimizer, --clip_gradients and --max_optimized_variable_size.

  Args:
    build: the task's build(mesh, features, is_training).
    flag_values: the parsed flags of the script.
    init_checkpoint: a checkpoint whose model weights start the run.
    learning_rate: the peak learning rate.
    num_train_steps: the step at which the learning rate reaches 0 (None
      when not training).
    num_warmup_steps: the number of warmup steps (None when not training).

  Returns:
    The TaskModel.
  """
  return estimator.TaskModel(
    build=build,
    learning_rate=learning_rate,
    num_train_steps=num_train_steps or 1,
    num_warmup_steps=num_warmup_steps or 0,
    init_checkpoint=init_checkpoint,
    optimizer=flag_values.optimizer,
    clip_gradients=flag_values.clip_gradients,
    max_optimized_variable_size=int(flag_values.max_optimized_variable_size),
  )


def write_results(path: str, results: Dict[str, object]) -> None:
  """Logs results and writes them to path as "key = value" lines (sorted).

  Args:
    path: the file to write.
    results: {name: value}.
  """
  with tf.io.gfile.GFile(path, "w") as f:
    logging.info("***** Eval results *****")
    for key in sorted(results):
      logging.info("  %s = %s", key, results[key])
      f.write("%s = %s\n" % (key, results[key]))
