"""The hyperparameters of the experimental U-Net, and their scopes.

mesh_tensorflow 0.1.21 read them from absl flags defined at import of its
unet module. Here they are an `Hparams` value (the same names and defaults)
taken from the innermost `hparams_scope`; `define_flags` and
`Hparams.from_flags` give entry points (model_executor) the original's
command-line flags.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Iterator, Optional

from absl import flags

from mesh_tensorflow._src.experimental import dataclass_flags
from mesh_tensorflow._src.layout import LayoutRules
from mesh_tensorflow._src.layout import convert_to_layout_rules

__all__ = ["Hparams", "define_flags", "get_layout", "hparams", "hparams_scope"]


@dataclasses.dataclass(frozen=True)
class Hparams(dataclass_flags.FlagSettings):
  """The U-Net's hyperparameters: the original's flags, names and defaults.

  Attributes:
    sampled_2d_slices: a 2-D model on image_c neighbouring z slices.
    ct_resolution: the size of each axis of the volumes.
    n_dataset_read_interleave: files read at once (training).
    n_dataset_processes: parallel parsing and augmentation calls.
    batch_size_train: the training batch size.
    batch_size_eval: the evaluation batch size.
    image_nx_block: the number of x blocks.
    image_ny_block: the number of y blocks.
    image_c: input channels (z slices of a 2-D model; 1 in 3-D).
    label_c: the number of classes (background, liver, lesion).
    pred_downsample: the downsampling factor of the saved predictions.
    output_ground_truth: also output the (downsampled) lesion label.
    n_base_filters: the filters of the first level (doubled per level).
    network_depth: the number of levels (pooling layers + 1).
    n_conv_per_block: convolutions per level.
    with_batch_norm: batch-normalize after each convolution.
    dropout_keep_p: the dropout keep probability.
    xen_liver_weight: the cross-entropy weight of liver voxels.
    xen_lesion_weight: the cross-entropy weight of lesion voxels.
    dice_loss_weight: the weight of the dice loss (from 0 to 1).
    dice_epsilon: added to the dice loss's denominators.
    image_translate_ratio: augmentation: translation stddev / resolution.
    image_transform_ratio: augmentation: stddev of the shear.
    image_noise_probability: augmentation: probability of noise.
    image_noise_ratio: augmentation: the largest noise stddev.
    image_corrupt_ratio_mean: augmentation: mean fraction blocked out.
    image_corrupt_ratio_stddev: augmentation: its stddev.
    per_class_intensity_scale: augmentation: stddev of intensity scales.
    per_class_intensity_shift: augmentation: mean change of the scales.
    mtf_dtype: the dtype of activations and variables.
    layout: the layout rules.
    train_file_pattern: training TFRecords (formatted with ct_resolution).
    eval_file_pattern: evaluation TFRecords (likewise).
  """

  sampled_2d_slices: bool = False
  ct_resolution: int = 128
  n_dataset_read_interleave: int = 16
  n_dataset_processes: int = 16
  batch_size_train: int = 32
  batch_size_eval: int = 32
  image_nx_block: int = 8
  image_ny_block: int = 8
  image_c: int = 1
  label_c: int = 3
  pred_downsample: int = 2
  output_ground_truth: bool = True
  n_base_filters: int = 32
  network_depth: int = 4
  n_conv_per_block: int = 2
  with_batch_norm: bool = True
  dropout_keep_p: float = 0.5
  xen_liver_weight: float = 8
  xen_lesion_weight: float = 16
  dice_loss_weight: float = 0.2
  dice_epsilon: float = 0.1
  image_translate_ratio: float = 0.0
  image_transform_ratio: float = 0.0
  image_noise_probability: float = 0.0
  image_noise_ratio: float = 0.0
  image_corrupt_ratio_mean: float = 0.0
  image_corrupt_ratio_stddev: float = 0.0
  per_class_intensity_scale: float = 0.0
  per_class_intensity_shift: float = 0.0
  mtf_dtype: str = "bfloat16"
  layout: str = "batch:cores, image_nx_block:rows, image_ny_block:columns"
  train_file_pattern: str = ""
  eval_file_pattern: str = ""


_FLAG_HELP = {
  "sampled_2d_slices": "Whether to build model on 2D CT slices instead of 3D.",
  "ct_resolution": "Resolution of CT images along depth, height and width.",
  "n_dataset_read_interleave": "The number of interleave processes.",
  "n_dataset_processes": "The number of data augmentation processes.",
  "batch_size_train": "Training batch size.",
  "batch_size_eval": "Evaluation batch size.",
  "image_nx_block": "The number of x blocks.",
  "image_ny_block": "The number of y blocks.",
  "image_c": "The number of input image channels (1 unless 2-D slices).",
  "label_c": "The number of output classes.",
  "pred_downsample": "Down-sampling factor of the output predictions.",
  "output_ground_truth": "Whether to output the ground truth in eval.",
  "n_base_filters": "The number of filters.",
  "network_depth": "The number of pooling layers.",
  "n_conv_per_block": "The number of conv layers between poolings.",
  "with_batch_norm": "Whether to use batch norm.",
  "dropout_keep_p": "Probability to keep activations.",
  "xen_liver_weight": "Cross-entropy weight of liver pixels.",
  "xen_lesion_weight": "Cross-entropy weight of lesion pixels.",
  "dice_loss_weight": "The weight of dice loss, from 0 to 1.",
  "dice_epsilon": "A small value that prevents 0 dividing.",
  "image_translate_ratio": "Translation of image and label (augmentation).",
  "image_transform_ratio": "Shear of image and label (augmentation).",
  "image_noise_probability": "Probability of adding noise (augmentation).",
  "image_noise_ratio": "How much random noise to add to CT images.",
  "image_corrupt_ratio_mean": "Mean fraction of non-liver area blocked out.",
  "image_corrupt_ratio_stddev": "Stddev of the blocked-out fraction.",
  "per_class_intensity_scale": "Scale of lesion/non-lesion intensities.",
  "per_class_intensity_shift": "Shift of lesion/non-lesion intensities.",
  "mtf_dtype": "dtype for MeshTensorflow.",
  "layout": "layout rules",
  "train_file_pattern": "Path to CT scan training data.",
  "eval_file_pattern": "Path to CT scan evaluation data.",
}


def define_flags(flag_values=flags.FLAGS) -> None:
  """Defines one absl flag per Hparams field (skipping defined names).

  Args:
    flag_values: the absl FlagValues to define them in.
  """
  dataclass_flags.define(Hparams, _FLAG_HELP, flag_values)


_SCOPES = threading.local()


def hparams() -> Hparams:
  """The Hparams of the innermost hparams_scope (default values outside).

  Returns:
    an Hparams.
  """
  stack = getattr(_SCOPES, "stack", None)
  return stack[-1] if stack else Hparams()


@contextlib.contextmanager
def hparams_scope(
  values: Optional[Hparams] = None, **overrides
) -> Iterator[Hparams]:
  """Sets the U-Net's hyperparameters inside the block.

  Example:
    >>> with hparams_scope(ct_resolution=32, image_nx_block=2) as hp:
    ...   with hparams_scope(batch_size_train=4):
    ...     inner = hparams()
    >>> inner.ct_resolution, inner.image_nx_block, inner.batch_size_train
    (32, 2, 4)
    >>> hp.batch_size_train, hparams().ct_resolution  # the outer; the default
    (32, 128)

  Args:
    values: the Hparams to start from (default: the current ones).
    **overrides: fields to change, e.g. ct_resolution=32.

  Yields:
    the Hparams in force.
  """
  current = dataclasses.replace(values or hparams(), **overrides)
  if not hasattr(_SCOPES, "stack"):
    _SCOPES.stack = []
  _SCOPES.stack.append(current)
  try:
    yield current
  finally:
    _SCOPES.stack.pop()


def get_layout() -> LayoutRules:
  """The layout rules of the current Hparams.

  Returns:
    a LayoutRules.
  """
  return convert_to_layout_rules(hparams().layout)
