"""mesh_tensorflow.transformer.adaptive_softmax: adaptive softmax vocab layer.

A facade over transformer/_src/layers/adaptive_softmax.py.
"""
# pylint: disable=g-importing-member,useless-import-alias

from transformer._src.layers.adaptive_softmax import (
  AdaptiveSoftmaxVocabEmbedding as AdaptiveSoftmaxVocabEmbedding,
)
from transformer._src.layers.adaptive_softmax import (
  adaptive_softmax_loss_fn as adaptive_softmax_loss_fn,
)
from transformer._src.layers.context import ModeKeys as ModeKeys

__all__ = [
  "AdaptiveSoftmaxVocabEmbedding",
  "adaptive_softmax_loss_fn",
]
