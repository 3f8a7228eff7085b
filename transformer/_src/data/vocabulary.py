"""Vocabularies: text <-> integer ids, in Python and inside TF graphs.

Conventions shared by every vocabulary here: id 0 is padding and id 1 is
end-of-sequence (EOS); `encode` does not append EOS (the dataset code does).

- `TFDSVocabulary` wraps a tensorflow_datasets text encoder (whose own ids
  start at 1, 0 being padding) and shifts its ids up by one to make room for
  EOS; `get_tfds_vocabulary` takes the encoder from a TFDS dataset's info.
- `ByteVocabulary` needs no files or downloads: UTF-8 bytes shifted by 3
  (0 pad, 1 EOS, 2 unknown), for machines without network access.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

import gin
import numpy as np
import tensorflow as tf

__all__ = [
  "ByteVocabulary",
  "TFDSVocabulary",
  "Vocabulary",
  "get_tfds_vocabulary",
]

_GIN_MODULE = "mesh_tensorflow.transformer.vocabulary"

PAD_ID = 0
EOS_ID = 1


class Vocabulary:
  """Base class: encodes strings to lists of ids and decodes them back."""

  @property
  def vocab_size(self) -> int:
    """The number of ids (padding and EOS included)."""
    raise NotImplementedError

  @property
  def eos_id(self) -> int:
    """The id that ends a sequence (1; 0 is padding)."""
    return EOS_ID

  @property
  def unk_id(self) -> Optional[int]:
    """The id of unknown pieces, or None when every string is encodable."""
    return None

  def encode(self, s: str) -> List[int]:
    """A string -> a list of ids (no EOS appended).

    Args:
      s: the text (str, or bytes holding UTF-8).

    Returns:
      A list of int ids, one per token, without EOS.
    """
    raise NotImplementedError

  def decode(self, ids: Sequence[int]) -> str:
    """A list of ids -> a string.

    Args:
      ids: a sequence of int ids; decoding stops at the first EOS (1).

    Returns:
      The decoded text (str).
    """
    raise NotImplementedError

  def encode_tf(self, s: tf.Tensor) -> tf.Tensor:
    """A scalar tf.string -> a 1-D int32 tensor of ids.

    Args:
      s: a scalar tf.string tensor.

    Returns:
      A 1-D int32 tensor of ids (shape [num_tokens]), without EOS.
    """
    raise NotImplementedError

  def decode_tf(self, ids: tf.Tensor) -> tf.Tensor:
    """A 1-D integer tensor of ids -> a scalar tf.string.

    Args:
      ids: a 1-D integer tensor of ids (shape [length]); decoding stops at the
        first EOS.

    Returns:
      A scalar tf.string tensor holding the decoded text.
    """
    raise NotImplementedError


def encode_tf_in_python(vocab: Vocabulary, s: tf.Tensor) -> tf.Tensor:
  """vocab.encode of a scalar tf.string, run in Python (tf.py_function).

  For vocabularies whose encoder is Python code; a SavedModel cannot carry
  the result.
  """

  def fn(text):
    return np.asarray(vocab.encode(text.numpy()), dtype=np.int32)

  ids = tf.py_function(fn, [s], tf.int32)
  ids.set_shape([None])
  return ids


def decode_tf_in_python(vocab: Vocabulary, ids: tf.Tensor) -> tf.Tensor:
  """vocab.decode of 1-D ids as a scalar tf.string (tf.py_function)."""

  def fn(values):
    return vocab.decode(values.numpy()).encode("utf-8")

  text = tf.py_function(fn, [ids], tf.string)
  text.set_shape([])
  return text


def ids_before_eos(ids) -> List[int]:
  """The ids (as Python ints) up to, not including, the first EOS."""
  out = []
  for i in np.asarray(ids).reshape([-1]).tolist():
    if i == EOS_ID:
      break
    out.append(int(i))
  return out


def as_text(s) -> str:
  """`s` (str, bytes or a 0-d numpy array of either) as a str."""
  if isinstance(s, bytes):
    return s.decode("utf-8")
  if isinstance(s, np.ndarray) and s.ndim == 0:
    return as_text(s.item())
  if isinstance(s, str):
    return s
  raise ValueError("expected a string, got %r" % (s,))


class TFDSVocabulary(Vocabulary):
  """A tensorflow_datasets text encoder with ids shifted up by one.

  TFDS encoders reserve id 0 for padding; the shift also reserves id 1 for
  EOS, so TFDS id i is id i + 1 here.

  Example:
    >>> import tensorflow_datasets as tfds
    >>> encoder = tfds.deprecated.text.SubwordTextEncoder.build_from_corpus(
    ...     ["hello world"], target_vocab_size=300)
    >>> vocab = TFDSVocabulary(encoder)
    >>> ids = vocab.encode("hello world")
    >>> [i - 1 for i in ids] == encoder.encode("hello world")  # shifted by 1
    True
    >>> vocab.decode(ids + [1, 0])  # stops at EOS
    'hello world'
  """

  def __init__(self, tfds_encoder) -> None:
    """Wraps a TFDS text encoder.

    Args:
      tfds_encoder: a `tfds.deprecated.text` encoder (e.g. a SubwordTextEncoder)
        with `encode`, `decode` and `vocab_size`; its ids are shifted up by one
        here so that 0 stays padding and 1 is EOS.
    """
    self._tfds_encoder = tfds_encoder

  @property
  def tfds_encoder(self) -> Any:
    """The wrapped TFDS text encoder (its ids are one lower than ours)."""
    return self._tfds_encoder

  @property
  def vocab_size(self) -> int:
    return self._tfds_encoder.vocab_size + 1

  def encode(self, s: str) -> List[int]:
    return [i + 1 for i in self._tfds_encoder.encode(as_text(s))]

  def decode(self, ids: Sequence[int]) -> str:
    """Ids -> text; stops at the first EOS and drops padding ids."""
    return self._tfds_encoder.decode(
      [i - 1 for i in ids_before_eos(ids) if i != PAD_ID]
    )

  def encode_tf(self, s: tf.Tensor) -> tf.Tensor:
    """Scalar tf.string -> 1-D int32 ids (runs the encoder in Python)."""
    return encode_tf_in_python(self, s)

  def decode_tf(self, ids: tf.Tensor) -> tf.Tensor:
    """1-D integer ids -> scalar tf.string (runs the encoder in Python)."""
    return decode_tf_in_python(self, ids)


@gin.configurable(module=_GIN_MODULE)
def get_tfds_vocabulary(dataset_name: str = gin.REQUIRED) -> TFDSVocabulary:
  """The TFDSVocabulary of a TFDS dataset's target text feature.

  Reads `tfds.builder(dataset_name).info` (no download): the encoder of the
  targets' supervised key, which assumes the inputs (if any) use the same
  vocabulary. A dataset without supervised keys must have exactly one text
  feature with an encoder.

  For example, `get_tfds_vocabulary("lm1b/subwords32k")` wraps the subword
  encoder of lm1b's text. Datasets whose text has no encoder are refused.

  Example:
    >>> import transformer.dataset  # registers the offline datasets
    >>> get_tfds_vocabulary("mtf_reverse")
    Traceback (most recent call last):
    ...
    ValueError: get_tfds_vocabulary('mtf_reverse'): ...

  Args:
    dataset_name: the TFDS name with config, e.g. "lm1b/subwords32k".

  Returns:
    A TFDSVocabulary wrapping the dataset's target text encoder.

  Raises:
    ValueError: if the dataset has no text feature with an encoder.
  """
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  info = tfds.builder(dataset_name).info
  features = info.features
  if info.supervised_keys:
    key = info.supervised_keys[1]
    if isinstance(key, dict):
      raise ValueError(
        "get_tfds_vocabulary(%r): nested supervised keys %r "
        "are not supported" % (dataset_name, key)
      )
    encoder = getattr(features[key], "encoder", None)
    if encoder is None:
      raise ValueError(
        "get_tfds_vocabulary(%r): target feature %r has no "
        "text encoder" % (dataset_name, key)
      )
    return TFDSVocabulary(encoder)
  encoders = [(k, getattr(features[k], "encoder", None)) for k in features]
  encoders = [(k, e) for k, e in encoders if e is not None]
  if len(encoders) != 1:
    raise ValueError(
      "get_tfds_vocabulary(%r): dataset has no supervised keys and %d text "
      "features with an encoder (%s); need exactly one"
      % (dataset_name, len(encoders), [k for k, _ in encoders])
    )
  return TFDSVocabulary(encoders[0][1])


class ByteVocabulary(Vocabulary):
  """UTF-8 bytes as ids: byte b is id b + 3; 0 pad, 1 EOS, 2 unknown.

  Needs no vocabulary file, so it works offline. vocab_size is 259.

  Example:
    >>> vocab = ByteVocabulary()
    >>> vocab.encode("hi")  # UTF-8 bytes + 3
    [107, 108]
    >>> [b + 3 for b in "hi".encode("utf-8")]
    [107, 108]
    >>> vocab.decode([107, 108, 1, 0])  # stops at EOS
    'hi'
  """

  _OFFSET = 3

  @property
  def vocab_size(self) -> int:
    return 256 + self._OFFSET

  @property
  def unk_id(self) -> int:
    return 2

  def encode(self, s: str) -> List[int]:
    data = s if isinstance(s, bytes) else as_text(s).encode("utf-8")
    return [b + self._OFFSET for b in data]

  def decode(self, ids: Sequence[int]) -> str:
    """Ids -> text; stops at the first EOS, drops non-byte ids and bytes
    that are not valid UTF-8.
    """
    data = bytes(
      i - self._OFFSET
      for i in ids_before_eos(ids)
      if self._OFFSET <= i < self.vocab_size
    )
    return data.decode("utf-8", errors="ignore")

  def encode_tf(self, s: tf.Tensor) -> tf.Tensor:
    """Scalar tf.string -> 1-D int32 ids.

    Raises:
      ValueError: if `s` is not a scalar.
    """
    s = tf.convert_to_tensor(s, dtype=tf.string)
    if s.shape.rank not in (None, 0):
      raise ValueError(
        "ByteVocabulary.encode_tf: expected a scalar string, "
        "got shape %s" % s.shape
      )
    data = tf.io.decode_raw(s, tf.uint8)
    return tf.cast(data, tf.int32) + self._OFFSET

  def decode_tf(self, ids: tf.Tensor) -> tf.Tensor:
    """1-D integer ids -> scalar tf.string (same rules as decode).

    Raises:
      ValueError: if `ids` is not 1-D.
    """
    ids = tf.cast(tf.convert_to_tensor(ids), tf.int32)
    if ids.shape.rank not in (None, 1):
      raise ValueError(
        "ByteVocabulary.decode_tf: expected 1-D ids, got shape %s" % ids.shape
      )
    before_eos = tf.equal(
      tf.cumsum(tf.cast(tf.equal(ids, EOS_ID), tf.int32)), 0
    )
    keep = tf.logical_and(
      before_eos, tf.logical_and(ids >= self._OFFSET, ids < self.vocab_size)
    )
    byte_values = tf.boolean_mask(ids, keep) - self._OFFSET
    table = tf.constant([bytes([b]) for b in range(256)])
    data = tf.strings.reduce_join(tf.gather(table, byte_values))
    return tf.strings.unicode_transcode(
      data, input_encoding="UTF-8", output_encoding="UTF-8", errors="ignore"
    )
