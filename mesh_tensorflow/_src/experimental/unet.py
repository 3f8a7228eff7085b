"""A 3-D U-Net whose spatial dimensions are split over the mesh.

Volumes [ct_resolution]^3 are stored as blocks: the x axis as
(image_nx_block, image_sx_block), y as (image_ny_block, image_sy_block) and z
whole (image_sz_block). Layout rules split the block dimensions over mesh
axes (by default `image_nx_block:rows, image_ny_block:columns`, and the batch
over `cores`); the blocked convolutions exchange halos between neighbouring
blocks, so the network computes the same function on every mesh. With
`sampled_2d_slices` the network is 2-D, on image_c neighbouring z slices.

Hyperparameters: mesh_tensorflow 0.1.21 read them from absl flags defined at
import. Here they are an `Hparams` value (the same names and defaults)
taken from the innermost `hparams_scope`; `define_flags` and
`Hparams.from_flags` give entry points (model_executor) the original's
command-line flags.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
from typing import Callable, Iterator, List, Optional, Sequence, Tuple

from absl import flags
from absl import logging
import numpy as np
import tensorflow as tf

from mesh_tensorflow._src.experimental import ct_records
from mesh_tensorflow._src.experimental import data_aug_lib
from mesh_tensorflow._src.experimental import dataclass_flags
from mesh_tensorflow._src.graph import Tensor
from mesh_tensorflow._src.layers import conv as conv_layers
from mesh_tensorflow._src.layers import losses
from mesh_tensorflow._src.layers import norms
from mesh_tensorflow._src.layout import LayoutRules
from mesh_tensorflow._src.layout import convert_to_layout_rules
from mesh_tensorflow._src.ops import broadcast_binary
from mesh_tensorflow._src.ops import einsum as einsum_ops
from mesh_tensorflow._src.ops import elementwise
from mesh_tensorflow._src.ops import io as io_ops
from mesh_tensorflow._src.ops import random as random_ops
from mesh_tensorflow._src.ops import reduce as reduce_ops
from mesh_tensorflow._src.ops import softmax as softmax_ops
from mesh_tensorflow._src.ops import tensor_ops
from mesh_tensorflow._src.ops import topk
from mesh_tensorflow._src.shapes import Dimension
from mesh_tensorflow._src.shapes import Shape
from mesh_tensorflow._src.variables import VariableDType

__all__ = [
  "Hparams",
  "PostProcessor",
  "conv_with_spatial_partition",
  "deconv_with_spatial_partition",
  "define_flags",
  "get_dataset_creator",
  "get_input_mtf_shapes",
  "get_layout",
  "hparams",
  "hparams_scope",
  "unet_with_spatial_partition",
]


@dataclasses.dataclass(frozen=True)
class Hparams:
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

  @classmethod
  def from_flags(cls, flag_values=flags.FLAGS) -> "Hparams":
    """The hyperparameters set by parsed flags (see define_flags).

    Args:
      flag_values: parsed absl FlagValues holding the flags of define_flags.

    Returns:
      an Hparams.
    """
    return dataclass_flags.values_from(cls, flag_values)


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
    ...   image_shape, label_shape = get_input_mtf_shapes("train")
    >>> image_shape.to_integer_list  # batch, nx, sx, ny, sy, sz, channels
    [32, 2, 16, 8, 4, 32, 1]
    >>> hp.ct_resolution, hparams().ct_resolution  # back to the default
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


def _blocked_spatial_dims(hp: Hparams) -> List[int]:
  dims = [
    hp.image_nx_block,
    hp.ct_resolution // hp.image_nx_block,
    hp.image_ny_block,
    hp.ct_resolution // hp.image_ny_block,
  ]
  if not hp.sampled_2d_slices:
    dims.append(hp.ct_resolution)
  return dims


def _to_blocks(image, label, hp: Hparams):
  """Reshapes image and label to blocks, one-hot labels, casts to mtf_dtype."""
  blocks = _blocked_spatial_dims(hp)
  image = tf.reshape(image, blocks + [hp.image_c])
  label = tf.reshape(label, blocks)
  label = tf.one_hot(tf.cast(label, tf.int32), hp.label_c)
  dtype = tf.as_dtype(hp.mtf_dtype)
  return tf.cast(image, dtype), tf.cast(label, dtype)


def get_dataset_creator(dataset_str: str) -> Callable[[], tf.data.Dataset]:
  """A function creating the unbatched (image, label) dataset.

  Reads GZIP TFRecords of tf.Examples with float32 bytes features
  "image/ct_image" and "image/label" (volumes of ct_resolution^3, as
  offline_data_aug writes them) from train_file_pattern or
  eval_file_pattern. Training data is shuffled, interleaved and augmented
  (flips, rotation and the Hparams' augmentations); eval intensities are
  mapped to [0, 1] as x / 1024 + 0.5. Images come as [blocks..., image_c]
  and labels one-hot [blocks..., label_c], both of mtf_dtype.

  Args:
    dataset_str: "train" or "eval".

  Returns:
    a function of no arguments returning a tf.data.Dataset.

  Raises:
    ValueError: for another dataset_str.
  """
  if dataset_str not in ("train", "eval"):
    raise ValueError(
      "dataset_str must be 'train' or 'eval', got %r" % (dataset_str,)
    )
  hp = hparams()
  is_train = dataset_str == "train"
  pattern = hp.train_file_pattern if is_train else hp.eval_file_pattern
  pattern = pattern.format(hp.ct_resolution)
  reso = hp.ct_resolution

  def stacked_2d_slices(image_3d, label_3d):
    """Every run of image_c z slices and the label of its centre slice."""
    images, labels = [], []
    for begin in range(reso - hp.image_c + 1):
      image = image_3d[:, :, begin : begin + hp.image_c]
      centre = begin + hp.image_c // 2
      label = label_3d[:, :, centre : centre + 1]
      image, label = _to_blocks(image, label, hp)
      images.append(image)
      labels.append(label)
    return tf.stack(images), tf.stack(labels)

  def parse(serialized):
    image, label = ct_records.decode_example(serialized)
    if not is_train:  # The training set is already preprocessed.
      image = tf.clip_by_value(image / 1024.0 + 0.5, 0, 1)
    image = tf.reshape(image, [reso] * 3)
    label = tf.reshape(label, [reso] * 3)
    if hp.sampled_2d_slices:
      noise_shape = [reso, reso, hp.image_c]
    else:
      noise_shape = [reso] * 3
    if not is_train and hp.sampled_2d_slices:
      return stacked_2d_slices(image, label)
    if hp.sampled_2d_slices:
      begin = tf.random.uniform(
        [], minval=0, maxval=reso - hp.image_c + 1, dtype=tf.int32
      )
      image = tf.slice(image, [0, 0, begin], [reso, reso, hp.image_c])
      label = tf.slice(label, [0, 0, begin], [reso, reso, hp.image_c])
    if is_train:
      for flip_axis in (0, 1, 2):
        image, label = data_aug_lib.maybe_flip(image, label, flip_axis)
      image, label = data_aug_lib.maybe_rot180(image, label, static_axis=2)
      image = data_aug_lib.intensity_shift(
        image, label, hp.per_class_intensity_scale, hp.per_class_intensity_shift
      )
      image = data_aug_lib.image_corruption(
        image,
        label,
        reso,
        hp.image_corrupt_ratio_mean,
        hp.image_corrupt_ratio_stddev,
      )
      image = data_aug_lib.maybe_add_noise(
        image,
        noise_shape,
        1,
        4,
        hp.image_noise_probability,
        hp.image_noise_ratio,
      )
      image, label = data_aug_lib.projective_transform(
        image,
        label,
        reso,
        hp.image_translate_ratio,
        hp.image_transform_ratio,
        hp.sampled_2d_slices,
      )
    if hp.sampled_2d_slices:  # The label of the centre slice only.
      centre = hp.image_c // 2
      label = label[:, :, centre : centre + 1]
    return _to_blocks(image, label, hp)

  def dataset_creator():
    files = tf.data.Dataset.list_files(pattern, shuffle=is_train).repeat()
    dataset = files.interleave(
      lambda name: tf.data.TFRecordDataset(
        name, compression_type="GZIP"
      ).prefetch(1),
      cycle_length=hp.n_dataset_read_interleave if is_train else 1,
      num_parallel_calls=tf.data.AUTOTUNE,
      deterministic=not is_train,
    )
    if is_train:
      dataset = dataset.shuffle(hp.n_dataset_processes).map(
        parse, num_parallel_calls=hp.n_dataset_processes
      )
    else:
      dataset = dataset.map(parse)
    if not is_train and hp.sampled_2d_slices:
      dataset = dataset.unbatch()  # The slices of one scan, one by one.
    return dataset

  return dataset_creator


def _dims(dataset_str: str, hp: Hparams):
  """batch, nx, ny, sx, sy, sz, image_c and label_c dimensions."""
  if dataset_str not in ("train", "eval"):
    raise ValueError(
      "dataset_str must be 'train' or 'eval', got %r" % (dataset_str,)
    )
  batch_size = (
    hp.batch_size_train if dataset_str == "train" else (hp.batch_size_eval)
  )
  return (
    Dimension("batch", batch_size),
    Dimension("image_nx_block", hp.image_nx_block),
    Dimension("image_ny_block", hp.image_ny_block),
    Dimension("image_sx_block", hp.ct_resolution // hp.image_nx_block),
    Dimension("image_sy_block", hp.ct_resolution // hp.image_ny_block),
    Dimension("image_sz_block", hp.ct_resolution),
    Dimension("image_c", hp.image_c),
    Dimension("label_c", hp.label_c),
  )


def get_input_mtf_shapes(dataset_str: str) -> List[Shape]:
  """The mtf Shapes of the (image, label) batches of a dataset.

  Args:
    dataset_str: "train" or "eval" (the batch size differs).

  Returns:
    [image shape, label shape]: [batch, image_nx_block, image_sx_block,
    image_ny_block, image_sy_block, (image_sz_block,) image_c or label_c].
  """
  batch, nx, ny, sx, sy, sz, image_c, label_c = _dims(dataset_str, hparams())
  dims = [batch, nx, sx, ny, sy]
  if not hparams().sampled_2d_slices:
    dims.append(sz)
  return [Shape(dims + [image_c]), Shape(dims + [label_c])]


class PostProcessor:
  """Saves evaluation predictions and accumulates the lesion dice score.

  record() takes what one eval step returns (the predictions of
  unet_with_spatial_partition, then loss and global step) and writes the
  predicted liver and lesion probabilities (and labels) as .npy files;
  finish() logs the dice per case and overall.
  """

  def __init__(self):
    self._area_int = []
    self._area_sum = []
    self._instance_i = 0

  def _save(self, pred_output_dir, name, global_step, index, array) -> None:
    path = os.path.join(
      pred_output_dir, "%s_%s_%d.npy" % (name, global_step, index)
    )
    with tf.io.gfile.GFile(path, "wb") as f:
      np.save(f, array)

  def record(self, results: Sequence, pred_output_dir: str) -> None:
    """Saves one eval step's predictions and keeps its dice terms.

    Args:
      results: numpy values: pred_liver, pred_lesion, (label, if
        output_ground_truth,) intersect, area_sum, loss, global_step.
      pred_output_dir: directory for the .npy files (created if needed).
    """
    hp = hparams()
    if hp.output_ground_truth:
      pred_liver, pred_lesion, label, area_int, area_sum, _, global_step = (
        results
      )
    else:
      pred_liver, pred_lesion, area_int, area_sum, _, global_step = results
      label = None
    tf.io.gfile.makedirs(pred_output_dir)
    outputs = [("pred_liver", pred_liver), ("pred_lesion", pred_lesion)]
    if label is not None:
      outputs.append(("label", label))
    if hp.sampled_2d_slices:
      for name, array in outputs:
        self._save(pred_output_dir, name, global_step, self._instance_i, array)
      self._instance_i += 1
    else:
      count = 0
      for name, array in outputs:
        cubes = self._reshape_to_cubes(array)
        for i, cube in enumerate(cubes):
          self._save(
            pred_output_dir, name, global_step, self._instance_i + i, cube
          )
        count = len(cubes)
      self._instance_i += count
    self._area_int.append(np.asarray(area_int))
    self._area_sum.append(np.asarray(area_sum))

  def finish(self) -> Tuple[float, float]:
    """Logs the lesion dice per case (mean) and global; returns them.

    Returns:
      (dice_per_case, dice_global).
    """
    hp = hparams()
    area_int = np.concatenate(self._area_int)
    area_sum = np.concatenate(self._area_sum)
    if hp.sampled_2d_slices:  # Sum the slices of each scan.
      per_scan = hp.ct_resolution - hp.image_c + 1
      if area_int.size % per_scan:
        raise ValueError(
          "%d slice results do not make whole scans of %d slices"
          % (area_int.size, per_scan)
        )
      area_int = area_int.reshape([-1, per_scan]).sum(axis=1)
      area_sum = area_sum.reshape([-1, per_scan]).sum(axis=1)
    dice_per_case = float((2 * area_int / (area_sum + 0.001)).mean())
    dice_global = float(2 * area_int.sum() / (area_sum.sum() + 0.001))
    logging.info(
      "dice_per_case: %s, dice_global: %s", dice_per_case, dice_global
    )
    return dice_per_case, dice_global

  def _reshape_to_cubes(self, data):
    hp = hparams()
    reso = hp.ct_resolution // hp.pred_downsample
    data = np.transpose(data, (0, 1, 3, 2, 4, 5))
    return np.reshape(data, (data.shape[0], reso, reso, reso))


def _blocked_conv(
  x,
  sampled_2d_slices,
  nx_dim,
  ny_dim,
  out_dim,
  size,
  stride,
  variable_dtype,
  name,
  transpose=False,
):
  """A size^n filter, stride^n (transposed) conv over x/y-blocked images."""
  if sampled_2d_slices:
    layer = (
      conv_layers.conv2d_transpose_with_blocks
      if transpose
      else conv_layers.conv2d_with_blocks
    )
    blocks = {"h_blocks_dim": nx_dim, "w_blocks_dim": ny_dim}
    n = 2
  else:
    layer = (
      conv_layers.conv3d_transpose_with_blocks
      if transpose
      else conv_layers.conv3d_with_blocks
    )
    blocks = {"d_blocks_dim": nx_dim, "h_blocks_dim": ny_dim}
    n = 3
  return layer(
    x,
    out_dim,
    filter_size=(size,) * n,
    strides=(stride,) * n,
    padding="SAME",
    variable_dtype=variable_dtype,
    name=name,
    **blocks,
  )


def conv_with_spatial_partition(
  x: Tensor,
  sampled_2d_slices: bool,
  image_nx_dim: Dimension,
  image_ny_dim: Dimension,
  n_filters: int,
  keep_p: float,
  with_batch_norm: bool,
  is_training: bool,
  odim_name: str,
  variable_dtype: VariableDType,
  name: str,
) -> Tuple[Tensor, list]:
  """A 3x3(x3) blocked convolution, batch norm, leaky ReLU and dropout.

  Args:
    x: the input [batch, nx, ny, sx, sy, (sz,) channels].
    sampled_2d_slices: 2-D (conv2d) instead of 3-D.
    image_nx_dim: the x blocks dimension.
    image_ny_dim: the y blocks dimension.
    n_filters: the number of output channels.
    keep_p: the dropout keep probability.
    with_batch_norm: whether to batch-normalize.
    is_training: training (dropout, batch statistics) or not.
    odim_name: the name of the output channels dimension.
    variable_dtype: the variables' VariableDType.
    name: the variable scope.

  Returns:
    (output, batch norm update ops).
  """
  out_dim = Dimension(odim_name, n_filters)
  x = _blocked_conv(
    x,
    sampled_2d_slices,
    image_nx_dim,
    image_ny_dim,
    out_dim,
    3,
    1,
    variable_dtype,
    name,
  )
  bn_update_ops = []
  if with_batch_norm:
    x, bn_update_ops = norms.batch_norm(
      x,
      is_training,
      momentum=0.90,
      epsilon=0.000001,
      dims_idx_start=0,
      dims_idx_end=-1,
      name=name,
    )
  x = elementwise.leaky_relu(x, 0.1)
  x = random_ops.dropout(x, is_training, keep_p)
  return x, bn_update_ops


def deconv_with_spatial_partition(
  x: Tensor,
  sampled_2d_slices: bool,
  image_nx_dim: Dimension,
  image_ny_dim: Dimension,
  n_filters: int,
  keep_p: float,
  is_training: bool,
  odim_name: str,
  variable_dtype: VariableDType,
  name: str,
) -> Tensor:
  """A 2x2(x2) stride-2 blocked transposed convolution and dropout.

  Args:
    x: the input [batch, nx, ny, sx, sy, (sz,) channels].
    sampled_2d_slices: 2-D instead of 3-D.
    image_nx_dim: the x blocks dimension.
    image_ny_dim: the y blocks dimension.
    n_filters: the number of output channels.
    keep_p: the dropout keep probability.
    is_training: training (dropout) or not.
    odim_name: the name of the output channels dimension.
    variable_dtype: the variables' VariableDType.
    name: the variable scope.

  Returns:
    the output, each spatial size doubled.
  """
  out_dim = Dimension(odim_name, n_filters)
  x = _blocked_conv(
    x,
    sampled_2d_slices,
    image_nx_dim,
    image_ny_dim,
    out_dim,
    2,
    2,
    variable_dtype,
    name,
    transpose=True,
  )
  return random_ops.dropout(x, is_training, keep_p)


def unet_with_spatial_partition(
  mesh, mesh_impl, dataset_str: str, images, labels
) -> Tuple[List[Tensor], Tensor, dict, list]:
  """Builds the U-Net on laid-out input batches: predictions, loss, metrics.

  The loss mixes a weighted cross-entropy (liver and lesion voxels weighted
  xen_liver_weight and xen_lesion_weight) and a soft dice loss of the lesion
  class (weight dice_loss_weight).

  Args:
    mesh: the mtf Mesh.
    mesh_impl: its mesh implementation (PlacementMeshImpl or SimdMeshImpl).
    dataset_str: "train" or "eval" (batch size; training mode).
    images: the laid-out image batch: a list of per-processor slices (a
      PlacementMeshImpl's) or a one-element list (a SimdMeshImpl replica's),
      of shape get_input_mtf_shapes(dataset_str)[0].
    labels: the laid-out one-hot labels, likewise.

  Returns:
    (preds, loss, eval_metrics, bn_update_ops): preds are the downsampled
    liver and lesion probabilities [batch, nx, ny, sx', sy', (sz')], the
    downsampled lesion label if output_ground_truth, and the lesion
    intersection and area sum per example; loss a scalar; eval_metrics a
    dict of scalars; bn_update_ops the batch norm update operations.
  """
  hp = hparams()
  is_training = dataset_str == "train"
  (
    batch_dim,
    nx_dim,
    ny_dim,
    sx_dim,
    sy_dim,
    sz_dim,
    image_c_dim,
    label_c_dim,
  ) = _dims(dataset_str, hp)
  images_shape, labels_shape = get_input_mtf_shapes(dataset_str)
  dtype = tf.as_dtype(hp.mtf_dtype)
  variable_dtype = VariableDType(dtype, dtype, dtype)

  x = io_ops.import_laid_out_tensor(
    mesh, mesh_impl.LaidOutTensor(images), images_shape
  )
  x = elementwise.cast(x, dtype)
  t = io_ops.import_laid_out_tensor(
    mesh, mesh_impl.LaidOutTensor(labels), labels_shape
  )
  t = elementwise.cast(t, dtype)

  # Blocks first: [batch, nx, ny, sx, sy, (sz,) channels].
  spatial = [sx_dim, sy_dim] + ([] if hp.sampled_2d_slices else [sz_dim])
  x = einsum_ops.transpose(
    x, [batch_dim, nx_dim, ny_dim] + spatial + [image_c_dim]
  )
  t = einsum_ops.transpose(
    t, [batch_dim, nx_dim, ny_dim] + spatial + [label_c_dim]
  )

  def pool(op):
    return {
      ("max", True): conv_layers.max_pool2d,
      ("max", False): conv_layers.max_pool3d,
      ("avg", True): conv_layers.avg_pool2d,
      ("avg", False): conv_layers.avg_pool3d,
    }[op, hp.sampled_2d_slices]

  levels = []
  all_bn_update_ops = []
  for depth in range(hp.network_depth):
    for n_conv in range(hp.n_conv_per_block):
      first = depth == 0 and n_conv == 0  # No dropout in the first layer.
      x, bn_update_ops = conv_with_spatial_partition(
        x,
        hp.sampled_2d_slices,
        nx_dim,
        ny_dim,
        hp.n_base_filters * 2**depth,
        1.0 if first else hp.dropout_keep_p,
        hp.with_batch_norm,
        is_training,
        "conv_%d_%d" % (depth, n_conv),
        variable_dtype,
        "conv_down_%d_%d" % (depth, n_conv),
      )
      all_bn_update_ops.extend(bn_update_ops)
    levels.append(x)
    if depth < hp.network_depth - 1:
      x = pool("max")(x, ksize=(2,) * len(spatial))

  for depth in reversed(range(hp.network_depth - 1)):
    channels_name = "conv_%d_%d" % (depth, hp.n_conv_per_block - 1)
    x = deconv_with_spatial_partition(
      x,
      hp.sampled_2d_slices,
      nx_dim,
      ny_dim,
      hp.n_base_filters * 2**depth,
      hp.dropout_keep_p,
      is_training,
      channels_name,
      variable_dtype,
      "deconv_%d_0" % depth,
    )
    x = tensor_ops.concat([x, levels[depth]], concat_dim_name=channels_name)
    for n_conv in range(hp.n_conv_per_block):
      x, bn_update_ops = conv_with_spatial_partition(
        x,
        hp.sampled_2d_slices,
        nx_dim,
        ny_dim,
        hp.n_base_filters * 2**depth,
        hp.dropout_keep_p,
        hp.with_batch_norm,
        is_training,
        "conv_%d_%d" % (depth, n_conv),
        variable_dtype,
        "conv_up_%d_%d" % (depth, n_conv),
      )
      all_bn_update_ops.extend(bn_update_ops)

  # The last layer: a 1x1(x1) convolution to the classes, no dropout.
  y = _blocked_conv(
    x,
    hp.sampled_2d_slices,
    nx_dim,
    ny_dim,
    label_c_dim,
    1,
    1,
    variable_dtype,
    "final_conv_%d" % hp.label_c,
  )

  def scalar(value, scalar_dtype=dtype):
    # An mtf constant: no CPU-side constants on TPU.
    return io_ops.constant(mesh, value, shape=[], dtype=scalar_dtype)

  def is_class(t, k):
    return elementwise.cast(
      broadcast_binary.equal(t, scalar(k, tf.int32)), dtype
    )

  argmax_t = topk.argmax(t, label_c_dim)
  liver_t = is_class(argmax_t, 1)
  lesion_t = is_class(argmax_t, 2)
  argmax_y = topk.argmax(y, label_c_dim)
  lesion_y = is_class(argmax_y, 2)

  lesion_pred_ratio = reduce_ops.reduce_mean(lesion_y)
  lesion_label_ratio = reduce_ops.reduce_mean(lesion_t)
  accuracy = reduce_ops.reduce_mean(
    elementwise.cast(broadcast_binary.equal(argmax_y, argmax_t), dtype)
  )

  # Cross-entropy, liver and lesion voxels weighted up.
  pixel_loss = losses.softmax_cross_entropy_with_logits(y, t, label_c_dim)
  pixel_weight = (
    scalar(1)
    + liver_t * scalar(hp.xen_liver_weight - 1)
    + lesion_t * scalar(hp.xen_lesion_weight - hp.xen_liver_weight)
  )
  loss_xen = reduce_ops.reduce_mean(pixel_loss * pixel_weight)

  # Soft dice loss of the lesion class, per case and global.
  y_prob = softmax_ops.softmax(y, reduced_dim=label_c_dim)
  one_class = Dimension("label_c", 1)
  lesion_prob = reduce_ops.reduce_sum(
    tensor_ops.mtf_slice(y_prob, 2, 1, "label_c"), reduced_dim=one_class
  )
  per_case = Shape([batch_dim])
  prob_intersect = reduce_ops.reduce_sum(
    lesion_prob * lesion_t, output_shape=per_case
  )
  prob_area_sum = reduce_ops.reduce_sum(
    lesion_prob + lesion_t, output_shape=per_case
  )
  loss_dice_per_case = reduce_ops.reduce_mean(
    scalar(-2) * prob_intersect / (prob_area_sum + scalar(hp.dice_epsilon))
  )
  loss_dice_global = (
    scalar(-2)
    * reduce_ops.reduce_sum(prob_intersect)
    / (reduce_ops.reduce_sum(prob_area_sum) + scalar(hp.dice_epsilon))
  )
  loss_dice = (loss_dice_per_case + loss_dice_global) * scalar(0.5)
  loss = (
    scalar(hp.dice_loss_weight) * loss_dice
    + scalar(1 - hp.dice_loss_weight) * loss_xen
  )

  intersect = reduce_ops.reduce_sum(lesion_y * lesion_t, output_shape=per_case)
  area_sum = reduce_ops.reduce_sum(lesion_y + lesion_t, output_shape=per_case)
  dice_per_case = reduce_ops.reduce_mean(
    scalar(2) * intersect / (area_sum + scalar(0.000001))
  )
  dice_global = (
    scalar(2)
    * reduce_ops.reduce_sum(intersect)
    / (reduce_ops.reduce_sum(area_sum) + scalar(0.000001))
  )
  eval_metrics = {
    "lesion_pred_ratio": lesion_pred_ratio,
    "lesion_label_ratio": lesion_label_ratio,
    "accuracy_of_all_classes": accuracy,
    "lesion_dice_per_case": dice_per_case,
    "lesion_dice_global": dice_global,
    "loss_xen": loss_xen,
    "loss_dice": loss_dice,
    "loss_dice_per_case": loss_dice_per_case,
    "loss_dice_global": loss_dice_global,
  }

  ksize = (hp.pred_downsample,) * len(spatial)
  y_prob_downsampled = pool("avg")(y_prob, ksize=ksize)
  preds = [
    reduce_ops.reduce_sum(
      tensor_ops.mtf_slice(y_prob_downsampled, k, 1, "label_c"),
      reduced_dim=one_class,
    )
    for k in (1, 2)  # liver, lesion
  ]
  if hp.output_ground_truth:
    lesion_gt = tensor_ops.mtf_slice(t, 2, 1, "label_c")
    preds.append(
      reduce_ops.reduce_sum(
        pool("avg")(lesion_gt, ksize=ksize), reduced_dim=one_class
      )
    )
  preds.extend([intersect, area_sum])
  return preds, loss, eval_metrics, all_bn_update_ops
