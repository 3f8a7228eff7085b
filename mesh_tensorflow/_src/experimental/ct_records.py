"""The tf.Example format of CT volumes in the U-Net's TFRecord files.

A record holds two float32 volumes, flattened to raw bytes: the CT image
("image/ct_image") and its label ("image/label": 0 background, 1 liver, 2
lesion). The files are GZIP-compressed.
"""

from __future__ import annotations

from typing import Tuple

import numpy as np
import tensorflow as tf

__all__ = ["decode_example", "encode_example"]

_IMAGE = "image/ct_image"
_LABEL = "image/label"


def encode_example(image: np.ndarray, label: np.ndarray) -> bytes:
  """A serialized tf.Example of one (image, label) pair.

  Args:
    image: a numpy array (stored as float32).
    label: a numpy array (stored as float32).

  Returns:
    the serialized tf.Example.
  """

  def float_bytes(array):
    data = np.asarray(array, np.float32).reshape([-1]).tobytes()
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[data]))

  features = {_IMAGE: float_bytes(image), _LABEL: float_bytes(label)}
  example = tf.train.Example(features=tf.train.Features(feature=features))
  return example.SerializeToString()


def decode_example(serialized: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
  """The flat float32 (image, label) of a serialized tf.Example.

  Args:
    serialized: a scalar string tensor (a record).

  Returns:
    (image, label), 1-D float32 tensors.
  """
  features = tf.io.parse_single_example(
    serialized,
    {
      _IMAGE: tf.io.FixedLenFeature([], tf.string),
      _LABEL: tf.io.FixedLenFeature([], tf.string),
    },
  )
  return (
    tf.io.decode_raw(features[_IMAGE], tf.float32),
    tf.io.decode_raw(features[_LABEL], tf.float32),
  )
