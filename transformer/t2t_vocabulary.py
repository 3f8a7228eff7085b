"""mesh_tensorflow.transformer.t2t_vocabulary: Tensor2Tensor subword vocabularies.

A facade over transformer/_src/data/t2t_vocabulary.py.
"""
# pylint: disable=g-importing-member,useless-import-alias

from transformer._src.data.t2t_vocabulary import T2tVocabulary as T2tVocabulary
from transformer._src.data.t2t_vocabulary import (
  get_t2t_vocabulary as get_t2t_vocabulary,
)

__all__ = [
  "T2tVocabulary",
  "get_t2t_vocabulary",
]
