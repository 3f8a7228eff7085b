"""mesh_tensorflow.transformer.universal_transformer: the Universal Transformer.

A facade over transformer/_src/models/universal_transformer.py.
"""
# pylint: disable=g-importing-member,useless-import-alias

from transformer._src.layers.context import Context as Context
from transformer._src.layers.context import TransformerLayer as TransformerLayer
from transformer._src.layers.embeddings import (
  sinusoid_positional_embedding_weights as sinusoid_positional_embedding_weights,
)
from transformer._src.models.layer_stack import LayerStack as LayerStack
from transformer._src.models.layer_stack import (
  sublayer_mask_padding as sublayer_mask_padding,
)
from transformer._src.models.universal_transformer import (
  UTLayerStack as UTLayerStack,
)

__all__ = [
  "UTLayerStack",
]
