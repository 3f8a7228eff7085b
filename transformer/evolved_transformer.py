"""mesh_tensorflow.transformer.evolved_transformer: Evolved Transformer layers.

A facade over transformer/_src/layers/evolved_transformer.py.
"""
# pylint: disable=g-importing-member,useless-import-alias

from transformer._src.layers.context import Context as Context
from transformer._src.layers.context import TransformerLayer as TransformerLayer
from transformer._src.layers.conv_layers import Conv1D as Conv1D
from transformer._src.layers.enc_dec_attention import (
  EncDecAttention as EncDecAttention,
)
from transformer._src.layers.evolved_transformer import (
  DecoderAttentionLayer as DecoderAttentionLayer,
)
from transformer._src.layers.evolved_transformer import (
  DecoderConvolutionalLayer as DecoderConvolutionalLayer,
)
from transformer._src.layers.evolved_transformer import (
  EncoderConvolutionalLayer as EncoderConvolutionalLayer,
)
from transformer._src.layers.evolved_transformer import (
  GatedLinearUnitLayer as GatedLinearUnitLayer,
)
from transformer._src.layers.self_attention import (
  SelfAttention as SelfAttention,
)

__all__ = [
  "DecoderAttentionLayer",
  "DecoderConvolutionalLayer",
  "EncoderConvolutionalLayer",
  "GatedLinearUnitLayer",
]
