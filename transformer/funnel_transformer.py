"""mesh_tensorflow.transformer.funnel_transformer: the Funnel-Transformer.

A facade over transformer/_src/models/funnel_transformer.py.
"""
# pylint: disable=g-importing-member,useless-import-alias

from transformer._src.layers.context import Context as Context
from transformer._src.layers.context import ModeKeys as ModeKeys
from transformer._src.layers.context import TransformerLayer as TransformerLayer
from transformer._src.layers.self_attention import (
  SelfAttention as SelfAttention,
)
from transformer._src.models.bitransformer import Bitransformer as Bitransformer
from transformer._src.models.funnel_transformer import (
  BitransformerFunnel as BitransformerFunnel,
)
from transformer._src.models.funnel_transformer import (
  FunnelTransformerLayerStack as FunnelTransformerLayerStack,
)
from transformer._src.models.layer_stack import LayerStack as LayerStack
from transformer._src.models.layer_stack import (
  sublayer_mask_padding as sublayer_mask_padding,
)

__all__ = [
  "BitransformerFunnel",
  "FunnelTransformerLayerStack",
]
