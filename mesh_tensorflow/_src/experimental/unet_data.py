"""The experimental U-Net's input pipeline, input shapes and eval output.

Volumes [ct_resolution]^3 are stored as blocks: the x axis as
(image_nx_block, image_sx_block), y as (image_ny_block, image_sy_block) and z
whole (image_sz_block); with sampled_2d_slices, image_c neighbouring z
slices are the channels of a 2-D image.
"""

from __future__ import annotations

import os
from typing import Callable, List, Sequence, Tuple

from absl import logging
import numpy as np
import tensorflow as tf

from mesh_tensorflow._src.experimental import ct_records
from mesh_tensorflow._src.experimental import data_aug_lib
from mesh_tensorflow._src.experimental.unet_hparams import Hparams
from mesh_tensorflow._src.experimental.unet_hparams import hparams
from mesh_tensorflow._src.shapes import Dimension
from mesh_tensorflow._src.shapes import Shape

__all__ = [
  "PostProcessor",
  "get_dataset_creator",
  "get_input_mtf_shapes",
  "input_dims",
]


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


def input_dims(dataset_str: str, hp: Hparams) -> Tuple[Dimension, ...]:
  """The dimensions of the inputs of a dataset.

  Args:
    dataset_str: "train" or "eval" (the batch size differs).
    hp: the hyperparameters.

  Returns:
    (batch, nx, ny, sx, sy, sz, image_c, label_c) Dimensions.

  Raises:
    ValueError: for another dataset_str.
  """
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
  batch, nx, ny, sx, sy, sz, image_c, label_c = input_dims(
    dataset_str, hparams()
  )
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

  def __init__(self) -> None:
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
