"""Tests for mesh_tensorflow.experimental.data_aug_lib.

Each transform against a numpy reference. The random transforms are checked
for the same random draws: the test sets the global seed, runs the
transform, sets the seed again and repeats the transform's draws (the same
random ops in the same order) to compute the expected output in numpy.
"""

import numpy as np
import pytest
import tensorflow as tf

from mesh_tensorflow.experimental import data_aug_lib

_RNG = np.random.RandomState(0)
VOLUME = _RNG.randn(4, 5, 6).astype(np.float32)


def _truncated_normal(mean, stddev):
  value = tf.random.normal([], mean=mean, stddev=stddev).numpy()
  return float(np.clip(value, mean - 2 * stddev, mean + 2 * stddev))


def _np_transform_2d(data, matrix, interpolation):
  """Projective transform of axes (0, 1) of data [h, w, c], zero outside."""
  a0, a1, a2, b0, b1, b2, c0, c1 = matrix
  height, width = data.shape[:2]
  out = np.zeros_like(data)

  def read(y, x):
    if 0 <= y < height and 0 <= x < width:
      return data[y, x]
    return np.zeros(data.shape[2:], data.dtype)

  for y in range(height):
    for x in range(width):
      k = c0 * x + c1 * y + 1.0
      in_x = (a0 * x + a1 * y + a2) / k
      in_y = (b0 * x + b1 * y + b2) / k
      if interpolation == "NEAREST":
        out[y, x] = read(int(np.round(in_y)), int(np.round(in_x)))
      else:
        y0, x0 = int(np.floor(in_y)), int(np.floor(in_x))
        dy, dx = in_y - y0, in_x - x0
        out[y, x] = (
          (1 - dy) * (1 - dx) * read(y0, x0)
          + (1 - dy) * dx * read(y0, x0 + 1)
          + dy * (1 - dx) * read(y0 + 1, x0)
          + dy * dx * read(y0 + 1, x0 + 1)
        )
  return out


def _np_on_axis(data, static_axis, fn):
  # As the original: the slices along static_axis are the channels of a 2-D
  # image whose rows and columns are the other axes, last axis first.
  perm = {0: (2, 1, 0), 1: (0, 2, 1), 2: (0, 1, 2)}[static_axis]
  return np.transpose(fn(np.transpose(data, perm)), perm)


@pytest.mark.parametrize("flip_axis", [0, 1, 2])
@pytest.mark.parametrize("as_tensor", [False, True], ids=["int", "tensor"])
def test_maybe_flip(flip_axis, as_tensor):
  label = VOLUME * 2
  axis = tf.constant(flip_axis) if as_tensor else flip_axis
  image, flipped_label = data_aug_lib.maybe_flip(VOLUME, label, axis, 0.9)
  np.testing.assert_array_equal(image, np.flip(VOLUME, flip_axis))
  np.testing.assert_array_equal(flipped_label, np.flip(label, flip_axis))
  image, _ = data_aug_lib.maybe_flip(VOLUME, label, axis, 0.1)
  np.testing.assert_array_equal(image, VOLUME)


@pytest.mark.parametrize("static_axis", [0, 1, 2])
def test_maybe_rot180_turns_the_other_two_axes(static_axis):
  image, label = data_aug_lib.maybe_rot180(
    VOLUME, -VOLUME, static_axis, tf.constant(2)
  )
  turned_axes = tuple(a for a in range(3) if a != static_axis)
  expected = np.rot90(VOLUME, 2, axes=turned_axes)
  np.testing.assert_array_equal(image, expected)
  np.testing.assert_array_equal(label, -expected)
  image, _ = data_aug_lib.maybe_rot180(VOLUME, VOLUME, static_axis, 0)
  np.testing.assert_array_equal(image, VOLUME)


def test_random_flip_and_rotation_apply_to_image_and_label_alike():
  tf.random.set_seed(3)
  for _ in range(4):
    image, label = data_aug_lib.maybe_flip(VOLUME, VOLUME, 1)
    image, label = data_aug_lib.maybe_rot180(image, label, 2)
    np.testing.assert_array_equal(image, label)


@pytest.mark.parametrize("sampled_2d_slices", [False, True])
def test_projective_transform_same_draws(sampled_2d_slices):
  image = VOLUME
  label = np.round(np.abs(VOLUME)).astype(np.float32)
  reso, translate, transform = 5, 0.1, 0.05
  tf.random.set_seed(7)
  got_image, got_label = data_aug_lib.projective_transform(
    image, label, reso, translate, transform, sampled_2d_slices
  )
  tf.random.set_seed(7)
  for static_axis in (0, 1, 2):
    if sampled_2d_slices and static_axis != 2:
      continue
    matrix = [
      _truncated_normal(mean, stddev)
      for mean, stddev in [
        (1.0, transform),
        (0.0, transform),
        (0.0, translate * reso),
        (0.0, transform),
        (1.0, transform),
        (0.0, translate * reso),
        (0.0, transform),
        (0.0, transform),
      ]
    ]
    image = _np_on_axis(
      image, static_axis, lambda d, m=matrix: _np_transform_2d(d, m, "B")
    )
    label = _np_on_axis(
      label, static_axis, lambda d, m=matrix: _np_transform_2d(d, m, "NEAREST")
    )
  np.testing.assert_allclose(got_image, image, atol=1e-4)
  np.testing.assert_array_equal(got_label, label)


def test_negligible_ratios_change_nothing():
  image, label = data_aug_lib.projective_transform(VOLUME, VOLUME, 8, 0.0, 0.0)
  assert image is VOLUME and label is VOLUME
  assert data_aug_lib.maybe_add_noise(VOLUME, [4, 5, 6], 1, 2, 0.0, 1.0) is (
    VOLUME
  )
  assert data_aug_lib.intensity_shift(VOLUME, VOLUME, 0.0, 0.0) is VOLUME
  assert data_aug_lib.image_corruption(VOLUME, VOLUME, 8, 0.0, 0.0) is VOLUME


def _v1_resize(noise, size):
  return tf.compat.v1.image.resize_images(noise, size).numpy()


def test_maybe_add_noise_same_draws():
  shape = [4, 8, 6]
  image = np.zeros(shape, np.float32)
  tf.random.set_seed(11)
  got = data_aug_lib.maybe_add_noise(image, shape, 1, 2, 1.0, 0.5)
  tf.random.set_seed(11)
  expected = image
  for scale in (1, 2):
    ratio = tf.random.uniform([], 0.0, 0.5).numpy()
    small = [max(s // scale, 1) for s in shape]
    noise = tf.random.normal(small, 0.0, ratio).numpy()
    noise = np.clip(noise, -2 * ratio, 2 * ratio)
    if scale != 1:
      # The original's upsampling: v1 resize_images on (d, h), then (d, w).
      noise = _v1_resize(noise, shape[:2]).transpose(0, 2, 1)
      noise = _v1_resize(noise, [shape[0], shape[2]]).transpose(0, 2, 1)
    expected = expected + noise
  np.testing.assert_allclose(got, expected, atol=1e-5)


def test_intensity_shift_same_draws():
  label = np.array([0.0, 1.0, 2.0, 2.0, 1.0, 0.0], np.float32).reshape(1, 2, 3)
  image = np.arange(1.0, 7.0, dtype=np.float32).reshape(1, 2, 3)
  tf.random.set_seed(5)
  got = data_aug_lib.intensity_shift(image, label, 0.1, 0.2)
  tf.random.set_seed(5)
  lesion_scale = 1 + _truncated_normal(0.2, 0.1)
  other_scale = 1 + _truncated_normal(-0.2, 0.1)
  expected = np.where(label > 1.5, image * lesion_scale, image * other_scale)
  np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_image_corruption_same_draws():
  shape = [4, 4, 4]
  image = _RNG.rand(*shape).astype(np.float32) + 1.0
  label = np.zeros(shape, np.float32)
  label[0, 0, :] = 2.0  # lesion voxels are always kept
  reso, mean, stddev = 4, 0.3, 0.1
  tf.random.set_seed(2)
  got = data_aug_lib.image_corruption(image, label, reso, mean, stddev)
  tf.random.set_seed(2)
  ratio = tf.random.normal([], 1 - mean, stddev).numpy()
  low, high = max(0.0, 1 - mean - 2 * stddev), min(1.0, 1 - mean + 2 * stddev)
  percentile_q = int(np.float32(100.0) * np.float32(np.clip(ratio, low, high)))
  pattern = np.clip(tf.random.normal(shape, 0.0, 1.0).numpy(), -2.0, 2.0)
  threshold = np.percentile(pattern, percentile_q, method="nearest")
  keep = (pattern < threshold) | (label > 1.5)
  np.testing.assert_array_equal(got, image * keep)
  assert 0 < np.sum(np.asarray(got) == 0) < image.size


def _liver_volume():
  label = np.zeros([6, 6, 6], np.float32)
  label[1:5, 1:5, 1:5] = 1.0
  label[2:4, 2:4, 2:3] = 2.0
  image = np.where(label == 2, 0.2, np.where(label == 1, 0.6, 0.0))
  return image.astype(np.float32), label


def test_gen_fake_data_moves_the_lesion():
  image, label = _liver_volume()
  tf.random.set_seed(0)
  got_image, got_label = data_aug_lib.maybe_gen_fake_data_based_on_real_data(
    image, label, reso=32, min_fake_lesion_ratio=0.3, gen_fake_probability=1.0
  )
  got_image, got_label = np.asarray(got_image), np.asarray(got_label)
  # The background stays; the fake lesion lies in the liver.
  np.testing.assert_array_equal(got_label[label == 0], 0.0)
  fake = got_label == 2
  assert fake.any() and not np.array_equal(fake, label == 2)
  # reso 32 blurs over 1 voxel: the real lesion gets the liver's intensity
  # and the fake one the lesion's, with a difference of 1.15 * (0.6 - 0.2).
  diff = 1.15 * (0.6 - 0.2)
  expected = image + diff * (label == 2) - diff * fake
  np.testing.assert_allclose(got_image, expected, atol=1e-6)


def test_gen_fake_data_without_lesion_changes_nothing():
  image, label = _liver_volume()
  label = np.minimum(label, 1.0)
  got_image, got_label = data_aug_lib.maybe_gen_fake_data_based_on_real_data(
    image, label, reso=64, min_fake_lesion_ratio=0.1, gen_fake_probability=1.0
  )
  np.testing.assert_array_equal(got_image, image)
  np.testing.assert_array_equal(got_label, label)


def test_runs_in_a_dataset_map():
  image, label = _liver_volume()

  def augment(image, label):
    for flip_axis in (0, 1, 2):
      image, label = data_aug_lib.maybe_flip(image, label, flip_axis)
    image, label = data_aug_lib.maybe_rot180(image, label, static_axis=2)
    image = data_aug_lib.intensity_shift(image, label, 0.1, 0.1)
    image = data_aug_lib.image_corruption(image, label, 6, 0.1, 0.05)
    image = data_aug_lib.maybe_add_noise(image, [6, 6, 6], 1, 4, 0.5, 0.1)
    image, label = data_aug_lib.projective_transform(
      image, label, 6, 0.05, 0.05
    )
    return data_aug_lib.maybe_gen_fake_data_based_on_real_data(
      image, label, 32, 0.05, 0.5
    )

  dataset = tf.data.Dataset.from_tensors((image, label)).repeat(2)
  for got_image, got_label in dataset.map(augment):
    assert got_image.shape == (6, 6, 6)
    assert set(np.unique(got_label)) <= {0.0, 1.0, 2.0}
