"""T2tVocabulary: a tensor2tensor subword vocabulary file as a Vocabulary.

tensor2tensor is an optional dependency (it is not installed with this
package): it is imported the first time the vocabulary is used, not when the
object is made, so gin files naming a T2T vocabulary parse without it.

tensor2tensor's SubwordTextEncoder reserves id 0 for padding and id 1 for EOS,
the same convention as `transformer.vocabulary`, so its ids are used as they
are (no shift).

With tensor2tensor installed, `vocab.decode(vocab.encode("Hallo Welt"))` of
the vocabulary below gives back "Hallo Welt".

Example:
  >>> vocab = get_t2t_vocabulary(
  ...     "/data/t2t", "vocab.translate_ende_wmt32k.32768.subwords")
  >>> vocab.filepath  # not read yet
  '/data/t2t/vocab.translate_ende_wmt32k.32768.subwords'
"""

from __future__ import annotations

import os
import threading
from typing import Any, List, Sequence

import gin
import tensorflow as tf

from transformer._src.data import vocabulary
from transformer._src.data.vocabulary import as_text
from transformer._src.data.vocabulary import ids_before_eos

__all__ = ["T2tVocabulary", "get_t2t_vocabulary"]

_GIN_MODULE = "mesh_tensorflow.transformer.t2t_vocabulary"


class T2tVocabulary(vocabulary.Vocabulary):
  """A tensor2tensor `SubwordTextEncoder` read from `filepath`, lazily.

  The encoder (and tensor2tensor) is loaded on first use of `vocab_size`,
  `encode`, `decode`, `encode_tf` or `decode_tf`.

  Example:
    >>> import tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "vocab.lm1b.en.32768")
    >>> vocab = T2tVocabulary(path)  # the file need not exist yet
    >>> vocab.filepath == path
    True

    `vocab.vocab_size` (or encoding, decoding) would load the file now.
  """

  def __init__(self, filepath: str):
    """Remembers the file; the encoder is loaded on first use.

    Args:
      filepath: path of a tensor2tensor SubwordTextEncoder vocabulary file (one
        quoted subtoken per line).
    """
    self._filepath = filepath
    self._encoder = None
    self._lock = threading.Lock()

  @property
  def filepath(self) -> str:
    """Path of the subword vocabulary file."""
    return self._filepath

  @property
  def subword_text_encoder(self) -> Any:
    """The tensor2tensor SubwordTextEncoder (loaded on first access).

    Raises:
      ImportError: tensor2tensor is not installed.
    """
    with self._lock:
      if self._encoder is None:
        try:
          # pylint: disable=g-import-not-at-top
          from tensor2tensor.data_generators import text_encoder
          # pylint: enable=g-import-not-at-top
        except ImportError as e:
          raise ImportError(
            "T2tVocabulary needs the tensor2tensor package to read the "
            "vocabulary file %r, and it cannot be imported (%s). Install "
            "tensor2tensor yourself (it is not a dependency of this "
            "package), or use a TFDS vocabulary "
            "(vocabulary.get_tfds_vocabulary)." % (self._filepath, e)
          ) from e
        self._encoder = text_encoder.SubwordTextEncoder(self._filepath)
      return self._encoder

  @property
  def vocab_size(self) -> int:
    return self.subword_text_encoder.vocab_size

  def encode(self, s: str) -> List[int]:
    """A string -> a list of ids (no EOS appended)."""
    return list(self.subword_text_encoder.encode(as_text(s)))

  def decode(self, ids: Sequence[int]) -> str:
    """Ids -> text; stops at the first EOS and drops padding ids."""
    kept = [i for i in ids_before_eos(ids) if i != vocabulary.PAD_ID]
    return self.subword_text_encoder.decode(kept)

  def encode_tf(self, s: tf.Tensor) -> tf.Tensor:
    """Scalar tf.string -> 1-D int32 ids (runs the encoder in Python)."""
    return vocabulary.encode_tf_in_python(self, s)

  def decode_tf(self, ids: tf.Tensor) -> tf.Tensor:
    """1-D integer ids -> scalar tf.string (runs the encoder in Python)."""
    return vocabulary.decode_tf_in_python(self, ids)


@gin.configurable(module=_GIN_MODULE)
def get_t2t_vocabulary(
  data_dir: str = gin.REQUIRED, vocabulary_filename: str = gin.REQUIRED
) -> T2tVocabulary:
  """`T2tVocabulary(os.path.join(data_dir, vocabulary_filename))`.

  Nothing is read until the vocabulary is used.

  In gin: `utils.run.vocabulary = @t2t_vocabulary.get_t2t_vocabulary()`.

  Example (gin):
    >>> _ = gin.parse_config('''
    ... get_t2t_vocabulary.data_dir = "/data/t2t"
    ... get_t2t_vocabulary.vocabulary_filename = "vocab.lm1b.en.32768"
    ... ''')
    >>> vocab = get_t2t_vocabulary()
    >>> gin.clear_config()
    >>> vocab.filepath
    '/data/t2t/vocab.lm1b.en.32768'

  Args:
    data_dir: the directory holding the t2t-datagen output (the T2T_DATA_DIR
      macro in the problems/t2t_*.gin files).
    vocabulary_filename: the vocabulary file's name inside `data_dir`, e.g.
      "vocab.lm1b.en.32768".

  Returns:
    A T2tVocabulary reading that file lazily.

  Raises:
    ValueError: an argument is missing (gin passes `gin.REQUIRED` on when a
      file binds it to a `%gin.REQUIRED` macro such as T2T_DATA_DIR that was
      never set).
  """
  for name, value in (
    ("data_dir", data_dir),
    ("vocabulary_filename", vocabulary_filename),
  ):
    if value is gin.REQUIRED or value is None:
      raise ValueError(
        "get_t2t_vocabulary: %s is required; bind "
        "t2t_vocabulary.get_t2t_vocabulary.%s (the problems/t2t_*.gin "
        "files take it from the macro T2T_DATA_DIR, e.g. "
        "--gin_param=\"T2T_DATA_DIR = '/path/to/t2t_data'\")" % (name, name)
      )
  return T2tVocabulary(os.path.join(data_dir, vocabulary_filename))
