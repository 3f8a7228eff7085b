"""Data augmentation of 3-D CT volumes (the LiTS liver-tumour task).

Random flips, 180-degree rotations, projective transforms, noise, intensity
shifts, corruption and synthetic lesions for a volume `image` [d, h, w] and
its `label` [d, h, w] (0 background, 1 liver, 2 lesion). Labels follow the
image through every geometric transform (nearest-neighbour interpolation).

Only TensorFlow 2 core ops are used (`tf.image`, `tf.random`, `tf.raw_ops`):
the projective transform is `ImageProjectiveTransformV3` with constant zero
fill (what the old contrib `transform` computed), the noise is upsampled by
`ResizeBilinear` without half-pixel centres (what v1 `resize_images` did) and
the percentile of the random masks takes the nearest rank. The random draws
happen in the same order as in mesh_tensorflow 0.1.21, and each transform
gives the same output for the same draws. Every function runs eagerly,
inside a `tf.function` or `tf.data` map, and in a `tf.compat.v1` graph.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence, Tuple, Union

import tensorflow as tf

__all__ = [
  "image_corruption",
  "intensity_shift",
  "maybe_add_noise",
  "maybe_flip",
  "maybe_gen_fake_data_based_on_real_data",
  "maybe_rot180",
  "projective_transform",
]

# Ratios at or below this are treated as zero (the transform is skipped).
_NEGLIGIBLE = 0.000001

TensorLike = Union[tf.Tensor, float, int]


def _truncated_normal(mean: TensorLike, stddev: TensorLike) -> tf.Tensor:
  """One normal draw clipped to mean +- 2 stddev."""
  value = tf.random.normal(shape=[], mean=mean, stddev=stddev)
  return tf.clip_by_value(value, mean - 2 * stddev, mean + 2 * stddev)


def _static_shape(shape) -> list:
  if isinstance(shape, tf.TensorShape):
    return shape.as_list()
  return [int(tf.compat.dimension_value(d)) for d in shape]


def _resize_bilinear_2d(x: tf.Tensor, size: Sequence[int]) -> tf.Tensor:
  """Resizes the first two axes of x [h, w, c] as v1 `resize_images` did."""
  resized = tf.raw_ops.ResizeBilinear(
    images=tf.expand_dims(x, 0),
    size=tf.constant(list(size), tf.int32),
    align_corners=False,
    half_pixel_centers=False,
  )
  return resized[0]


def _rand_noise(
  noise_mean: TensorLike, noise_dev: TensorLike, scale: int, shape
) -> tf.Tensor:
  """Normal noise of `shape`, drawn at 1/scale resolution and upsampled."""
  shape = _static_shape(shape)
  noise_shape = [max(size // scale, 1) for size in shape]
  noise = tf.random.normal(shape=noise_shape, mean=noise_mean, stddev=noise_dev)
  noise = tf.clip_by_value(
    noise, noise_mean - 2.0 * noise_dev, noise_mean + 2.0 * noise_dev
  )
  if scale != 1:
    noise = _resize_bilinear_2d(noise, [shape[0], shape[1]])
    noise = tf.transpose(noise, [0, 2, 1])
    noise = _resize_bilinear_2d(noise, [shape[0], shape[2]])
    noise = tf.transpose(noise, [0, 2, 1])
  return noise


def _transform_2d(
  data: tf.Tensor, proj_matrix: Sequence[TensorLike], interpolation: str
) -> tf.Tensor:
  """Projective transform of the first two axes of data [h, w, c].

  Output pixel (y, x) reads input ((a0 x + a1 y + a2) / k, (b0 x + b1 y + b2)
  / k) with k = c0 x + c1 y + 1; pixels from outside the input are zero.
  """
  transforms = tf.reshape(
    tf.cast(tf.stack(list(proj_matrix)), tf.float32), [1, 8]
  )
  output_shape = tf.shape(data)[:2]
  images = tf.expand_dims(data, 0)
  transformed = tf.raw_ops.ImageProjectiveTransformV3(
    images=images,
    transforms=transforms,
    output_shape=output_shape,
    fill_value=tf.zeros([], tf.float32),
    interpolation=interpolation,
    fill_mode="CONSTANT",
  )
  return tf.ensure_shape(transformed[0], data.shape)


def _projective_transform_on_axis(
  data: tf.Tensor, proj_matrix, static_axis: int, interpolation: str
) -> tf.Tensor:
  """Transforms every 2-D slice of data taken along `static_axis`."""
  # Moves static_axis last (the "channel" axis of the 2-D transform).
  perm = {0: [2, 1, 0], 1: [0, 2, 1], 2: [0, 1, 2]}[static_axis]
  data = tf.transpose(data, perm)
  data = _transform_2d(data, proj_matrix, interpolation)
  return tf.transpose(data, perm)


def projective_transform(
  image: tf.Tensor,
  label: tf.Tensor,
  reso: int,
  image_translate_ratio: float,
  image_transform_ratio: float,
  sampled_2d_slices: bool = False,
) -> Tuple[tf.Tensor, tf.Tensor]:
  """Random projective transforms of the slices along each axis.

  For each static axis (only axis 2 with sampled_2d_slices), draws a 3x3
  projective matrix near the identity (8 truncated normals: the linear part
  with stddev image_transform_ratio, the translation with stddev
  image_translate_ratio * reso) and applies it to every slice along that
  axis: bilinear for the image, nearest for the label, zero outside.

  Args:
    image: a float32 tf.Tensor [d, h, w] (or [h, w, c] 2-D slices).
    label: a float32 tf.Tensor of the same shape.
    reso: the resolution (size of a spatial axis), scales the translation.
    image_translate_ratio: stddev of the translation, relative to reso.
    image_transform_ratio: stddev of the linear and projective part.
    sampled_2d_slices: transform only the slices along axis 2.

  Returns:
    the transformed (image, label); the inputs unchanged when both ratios
    are negligible.
  """
  if (
    image_translate_ratio < _NEGLIGIBLE and image_transform_ratio < _NEGLIGIBLE
  ):
    return image, label
  for static_axis in (0, 1, 2):
    if sampled_2d_slices and static_axis != 2:
      continue
    a0 = _truncated_normal(1.0, image_transform_ratio)
    a1 = _truncated_normal(0.0, image_transform_ratio)
    a2 = _truncated_normal(0.0, image_translate_ratio * reso)
    b0 = _truncated_normal(0.0, image_transform_ratio)
    b1 = _truncated_normal(1.0, image_transform_ratio)
    b2 = _truncated_normal(0.0, image_translate_ratio * reso)
    c0 = _truncated_normal(0.0, image_transform_ratio)
    c1 = _truncated_normal(0.0, image_transform_ratio)
    proj_matrix = [a0, a1, a2, b0, b1, b2, c0, c1]
    image = _projective_transform_on_axis(
      image, proj_matrix, static_axis, "BILINEAR"
    )
    label = _projective_transform_on_axis(
      label, proj_matrix, static_axis, "NEAREST"
    )
  return image, label


def maybe_add_noise(
  image: tf.Tensor,
  noise_shape: Sequence[int],
  scale0: int,
  scale1: int,
  image_noise_probability: float,
  image_noise_ratio: float,
) -> tf.Tensor:
  """With probability image_noise_probability, adds noise at two scales.

  Each scale's noise has a stddev drawn uniformly from [0,
  image_noise_ratio), is drawn at 1/scale resolution and upsampled
  bilinearly to noise_shape.

  Args:
    image: a float32 tf.Tensor of shape noise_shape.
    noise_shape: the static shape of the noise (a list of 3 ints).
    scale0: the downsampling factor of the first noise.
    scale1: the downsampling factor of the second noise.
    image_noise_probability: the probability of adding the noise.
    image_noise_ratio: the largest stddev of each noise.

  Returns:
    the image, with noise or not; unchanged when the probability or the
    ratio is negligible.
  """
  if image_noise_probability < _NEGLIGIBLE or image_noise_ratio < _NEGLIGIBLE:
    return image
  noises = []
  for scale in (scale0, scale1):
    noise_ratio = tf.random.uniform(
      shape=[], minval=0.0, maxval=image_noise_ratio
    )
    noises.append(_rand_noise(0.0, noise_ratio, scale, noise_shape))
  skip_noise = tf.greater(tf.random.uniform([]), image_noise_probability)
  for noise in noises:
    image = tf.cond(
      skip_noise, lambda image=image: image, lambda i=image, n=noise: i + n
    )
  return image


def _percentile_nearest(x: tf.Tensor, q: tf.Tensor) -> tf.Tensor:
  """The q-th percentile of all of x, taking the nearest rank.

  Rank round((n - 1) * q / 100) (half to even) of the sorted values, the
  `interpolation="nearest"` percentile of numpy and tensorflow_probability.
  """
  flat = tf.sort(tf.reshape(x, [-1]))
  n = tf.size(flat)
  rank = tf.round(tf.cast(n - 1, tf.float64) * tf.cast(q, tf.float64) / 100.0)
  rank = tf.clip_by_value(tf.cast(rank, tf.int32), 0, n - 1)
  return tf.gather(flat, rank)


def _gen_rand_mask(
  ratio_mean: TensorLike,
  ratio_stddev: float,
  scale: int,
  shape,
  smoothness: int = 0,
) -> tf.Tensor:
  """A random boolean mask with (about) a random fraction of True values.

  The fraction is a normal draw around ratio_mean clipped to +-2 stddev
  (and to [0, 1]); the mask marks the values of a (smoothed) noise pattern
  below that percentile.
  """
  scale = max(scale, 1)
  ratio = tf.random.normal(shape=[], mean=ratio_mean, stddev=ratio_stddev)
  low_bound = tf.maximum(0.0, ratio_mean - 2 * ratio_stddev)
  up_bound = tf.minimum(1.0, ratio_mean + 2 * ratio_stddev)
  percentile_q = tf.cast(
    100.0 * tf.clip_by_value(ratio, low_bound, up_bound), tf.int32
  )
  pattern = _rand_noise(0.0, 1.0, scale, shape)
  if smoothness > 0:
    smoothness = int(smoothness) // 2 * 2 + 1
    pattern = _sum_filter_3d(pattern, smoothness)
  threshold = _percentile_nearest(pattern, percentile_q)
  return tf.less(pattern, threshold)


def _sum_filter_3d(volume: tf.Tensor, size: int) -> tf.Tensor:
  """Sum over a size^3 window around each voxel (zero padding)."""
  volume = volume[tf.newaxis, ..., tf.newaxis]
  summed = tf.nn.conv3d(
    volume,
    tf.ones([size, size, size, 1, 1], volume.dtype),
    strides=[1, 1, 1, 1, 1],
    padding="SAME",
  )
  return summed[0, ..., 0]


def maybe_gen_fake_data_based_on_real_data(
  image: tf.Tensor,
  label: tf.Tensor,
  reso: int,
  min_fake_lesion_ratio: float,
  gen_fake_probability: float,
) -> Tuple[tf.Tensor, tf.Tensor]:
  """With probability gen_fake_probability, replaces real lesions by fakes.

  The real lesion is filled with the mean liver intensity and a random
  blob-shaped region of the liver (a random fraction of it, at least
  min_fake_lesion_ratio) gets the lesion intensity instead; the label is
  rewritten to match. Nothing changes when the volume has no distinct liver
  and lesion intensities.

  Args:
    image: a float32 tf.Tensor [d, h, w] with static shape.
    label: a float32 tf.Tensor [d, h, w]: 0 background, 1 liver, 2 lesion.
    reso: the resolution; blobs and blurring work at reso // 32 voxels.
    min_fake_lesion_ratio: the smallest fraction of fake lesion in the
      liver.
    gen_fake_probability: the probability of making a fake.

  Returns:
    (image, label), changed or not.
  """
  gen_prob_indicator = tf.random.uniform(
    shape=[], minval=0.0, maxval=1.0, dtype=tf.float32
  )
  background_mask = tf.less(label, 0.5)
  lesion_mask = tf.greater(label, 1.5)
  liver_mask = tf.logical_not(tf.logical_or(background_mask, lesion_mask))

  liver_intensity = tf.boolean_mask(image, liver_mask)
  lesion_intensity = tf.boolean_mask(image, lesion_mask)
  intensity_diff = tf.reduce_mean(liver_intensity) - tf.reduce_mean(
    lesion_intensity
  )
  intensity_diff *= 1.15
  intensity_diff = tf.where(tf.math.is_nan(intensity_diff), 0.0, intensity_diff)

  lesion_liver_ratio = 0.0
  lesion_liver_ratio += tf.random.normal(shape=[], mean=0.01, stddev=0.01)
  lesion_liver_ratio += tf.random.normal(shape=[], mean=0.0, stddev=0.05)
  lesion_liver_ratio = tf.clip_by_value(
    lesion_liver_ratio, min_fake_lesion_ratio, min_fake_lesion_ratio + 0.20
  )

  block = reso // 32
  fake_lesion_mask = tf.logical_and(
    _gen_rand_mask(
      ratio_mean=lesion_liver_ratio,
      ratio_stddev=0.0,
      scale=block,
      shape=label.shape,
      smoothness=block,
    ),
    tf.logical_not(background_mask),
  )
  liver_mask = tf.logical_not(tf.logical_or(background_mask, fake_lesion_mask))

  def blur(mask):
    # The mean over a block^3 window (zero padding; the window is not
    # centred for even sizes, as tf.nn.conv3d's SAME padding places it).
    volume = tf.cast(mask, tf.float32)[tf.newaxis, ..., tf.newaxis]
    blurred = tf.nn.conv3d(
      volume,
      tf.ones([block] * 3 + [1, 1], tf.float32) / block**3,
      strides=[1, 1, 1, 1, 1],
      padding="SAME",
    )
    return tf.squeeze(blurred)

  lesion_mask_blur = blur(lesion_mask)
  fake_lesion_mask_blur = blur(fake_lesion_mask)

  # No fake when the intensities are not distinct (no liver or lesion).
  gen_prob_indicator = tf.where(
    tf.greater(intensity_diff, 0.0001), gen_prob_indicator, 0.0
  )
  make_fake = tf.greater(gen_prob_indicator, 1 - gen_fake_probability)
  image = tf.cond(
    make_fake,
    lambda: (
      image
      + intensity_diff * lesion_mask_blur
      - intensity_diff * fake_lesion_mask_blur
    ),
    lambda: image,
  )
  label = tf.cond(
    make_fake,
    lambda: (
      tf.cast(liver_mask, tf.float32) * 1
      + tf.cast(fake_lesion_mask, tf.float32) * 2
    ),
    lambda: label,
  )
  return image, label


def _per_axis(axis, fn: Callable[[int], tf.Tensor]) -> tf.Tensor:
  """fn(axis) for a Python int axis, else a switch over axes 0, 1, 2."""
  if isinstance(axis, int):
    return fn(axis)
  return tf.switch_case(
    tf.cast(axis, tf.int32), [lambda a=a: fn(a) for a in range(3)]
  )


def maybe_flip(
  image: tf.Tensor,
  label: tf.Tensor,
  flip_axis: Union[int, tf.Tensor],
  flip_indicator: Optional[TensorLike] = None,
) -> Tuple[tf.Tensor, tf.Tensor]:
  """Reverses image and label along flip_axis when flip_indicator > 0.5.

  Args:
    image: a tf.Tensor [d, h, w].
    label: a tf.Tensor [d, h, w].
    flip_axis: 0, 1 or 2 (an int or an int tensor).
    flip_indicator: a float in [0, 1); default: a uniform draw.

  Returns:
    (image, label), both flipped or both not.
  """
  if flip_indicator is None:
    flip_indicator = tf.random.uniform(shape=[])
  flip = tf.greater(flip_indicator, 0.5)

  def maybe_flip_one(data):
    return tf.cond(
      flip,
      lambda: _per_axis(flip_axis, lambda a: tf.reverse(data, [a])),
      lambda: data,
    )

  return maybe_flip_one(image), maybe_flip_one(label)


def maybe_rot180(
  image: tf.Tensor,
  label: tf.Tensor,
  static_axis: Union[int, tf.Tensor],
  rot180_k: Optional[Union[int, tf.Tensor]] = None,
) -> Tuple[tf.Tensor, tf.Tensor]:
  """Rotates image and label by rot180_k * 90 degrees around static_axis.

  The rotation turns the plane of the two other axes (as `tf.image.rot90`
  turns (height, width)); rot180_k 0 leaves the data alone.

  Args:
    image: a tf.Tensor [d, h, w].
    label: a tf.Tensor [d, h, w].
    static_axis: the axis of rotation, 0, 1 or 2 (int or int tensor).
    rot180_k: the number of quarter turns; default: 0 or 2 at random.

  Returns:
    (image, label), both rotated or both not.
  """
  if rot180_k is None:
    rot180_k = 2 * tf.random.uniform(
      shape=[], minval=0, maxval=2, dtype=tf.int32
    )
  rotate = tf.not_equal(rot180_k, 0)

  def rotate_around(data, axis):
    # Moves `axis` last, turns the first two axes, moves it back.
    perm = {0: [2, 1, 0], 1: [0, 2, 1], 2: [0, 1, 2]}[axis]
    data = tf.image.rot90(tf.transpose(data, perm), k=rot180_k)
    return tf.transpose(data, perm)

  def maybe_rotate_one(data):
    return tf.cond(
      rotate,
      lambda: _per_axis(static_axis, lambda a: rotate_around(data, a)),
      lambda: data,
    )

  return maybe_rotate_one(image), maybe_rotate_one(label)


def intensity_shift(
  image: tf.Tensor,
  label: tf.Tensor,
  per_class_intensity_scale: float,
  per_class_intensity_shift: float,
) -> tf.Tensor:
  """Scales the intensity of lesion and non-lesion voxels at random.

  Lesion voxels (label > 1.5) are multiplied by 1 + a truncated normal
  around +per_class_intensity_shift, then the others by 1 + one around
  -per_class_intensity_shift (stddev per_class_intensity_scale).

  Args:
    image: a float32 tf.Tensor.
    label: a float32 tf.Tensor of the same shape.
    per_class_intensity_scale: the stddev of the scale factors.
    per_class_intensity_shift: the mean of the scale factors' change.

  Returns:
    the image; unchanged when both parameters are negligible.
  """
  if (
    per_class_intensity_scale < _NEGLIGIBLE
    and per_class_intensity_shift < _NEGLIGIBLE
  ):
    return image
  lesion = tf.cast(tf.greater(label, 1.5), tf.float32)
  noise = _truncated_normal(
    per_class_intensity_shift, per_class_intensity_scale
  )
  image = image + noise * (image * lesion)
  not_lesion = tf.cast(tf.less(label, 1.5), tf.float32)
  noise = _truncated_normal(
    -per_class_intensity_shift, per_class_intensity_scale
  )
  return image + noise * (image * not_lesion)


def image_corruption(
  image: tf.Tensor,
  label: tf.Tensor,
  reso: int,
  image_corrupt_ratio_mean: float,
  image_corrupt_ratio_stddev: float,
) -> tf.Tensor:
  """Zeroes a random blob-shaped fraction of the non-lesion voxels.

  Args:
    image: a float32 tf.Tensor [d, h, w] with static shape.
    label: a float32 tf.Tensor of the same shape (lesion voxels, > 1.5, are
      kept).
    reso: the resolution; the blobs are reso // 3 voxels large.
    image_corrupt_ratio_mean: the mean fraction of voxels zeroed.
    image_corrupt_ratio_stddev: its stddev.

  Returns:
    the image; unchanged when both parameters are negligible.
  """
  if (
    image_corrupt_ratio_mean < _NEGLIGIBLE
    and image_corrupt_ratio_stddev < _NEGLIGIBLE
  ):
    return image
  keep_mask = _gen_rand_mask(
    1 - image_corrupt_ratio_mean,
    image_corrupt_ratio_stddev,
    reso // 3,
    image.shape,
  )
  keep_mask = tf.logical_or(tf.greater(label, 1.5), keep_mask)
  return image * tf.cast(keep_mask, tf.float32)
