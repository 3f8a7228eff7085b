"""mesh_tensorflow.transformer.vocab_embeddings: alternative vocab embeddings.

A facade over transformer/_src/layers/vocab_embeddings.py.
"""
# pylint: disable=g-importing-member,useless-import-alias

from transformer._src.layers.vocab_embeddings import (
  AdaptiveVocabEmbedding as AdaptiveVocabEmbedding,
)
from transformer._src.layers.vocab_embeddings import (
  FactorizedVocabEmbedding as FactorizedVocabEmbedding,
)
from transformer._src.layers.vocab_embeddings import Mixtape as Mixtape
from transformer._src.layers.vocab_embeddings import (
  MixtureOfSoftmaxes as MixtureOfSoftmaxes,
)
from transformer._src.layers.vocab_embeddings import (
  cluster_embedding as cluster_embedding,
)
from transformer._src.layers.vocab_embeddings import (
  cluster_ids_to_embedding as cluster_ids_to_embedding,
)

__all__ = [
  "AdaptiveVocabEmbedding",
  "FactorizedVocabEmbedding",
  "Mixtape",
  "MixtureOfSoftmaxes",
]
