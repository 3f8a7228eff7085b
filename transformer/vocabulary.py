"""mesh_tensorflow.transformer.vocabulary: vocabularies (text <-> token ids).

A facade over transformer/_src/data/vocabulary.py.
"""
# pylint: disable=g-importing-member,useless-import-alias

from transformer._src.data.vocabulary import EOS_ID as EOS_ID
from transformer._src.data.vocabulary import PAD_ID as PAD_ID
from transformer._src.data.vocabulary import ByteVocabulary as ByteVocabulary
from transformer._src.data.vocabulary import TFDSVocabulary as TFDSVocabulary
from transformer._src.data.vocabulary import Vocabulary as Vocabulary
from transformer._src.data.vocabulary import (
  decode_tf_in_python as decode_tf_in_python,
)
from transformer._src.data.vocabulary import (
  encode_tf_in_python as encode_tf_in_python,
)
from transformer._src.data.vocabulary import (
  get_tfds_vocabulary as get_tfds_vocabulary,
)

__all__ = [
  "ByteVocabulary",
  "TFDSVocabulary",
  "Vocabulary",
  "get_tfds_vocabulary",
]
