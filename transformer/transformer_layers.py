"""mesh_tensorflow.transformer.transformer_layers: the layers of a LayerStack.

A facade over transformer/_src/layers/: attention layers (self_attention.py,
enc_dec_attention.py, local_self_attention.py and their shared biases in
attention_bias.py), research attention variants (attention_variants.py),
feed-forward (dense_layers.py), convolutions (conv_layers.py) and experts
attention (experts_attention.py).
"""
# pylint: disable=g-importing-member,useless-import-alias

from transformer._src.layers.attention_bias import (
  relative_position_bucket as _relative_position_bucket,
)
from transformer._src.layers.attention_variants import (
  BranchedEncDecAttention as BranchedEncDecAttention,
)
from transformer._src.layers.attention_variants import (
  BranchedSelfAttention as BranchedSelfAttention,
)
from transformer._src.layers.attention_variants import (
  GeneralBilinearEncDecAttention as GeneralBilinearEncDecAttention,
)
from transformer._src.layers.attention_variants import (
  GeneralBilinearSelfAttention as GeneralBilinearSelfAttention,
)
from transformer._src.layers.attention_variants import (
  Synthesizer as Synthesizer,
)
from transformer._src.layers.attention_variants import (
  TalkingHeadsEncDecAttention as TalkingHeadsEncDecAttention,
)
from transformer._src.layers.attention_variants import (
  TalkingHeadsSelfAttention as TalkingHeadsSelfAttention,
)
from transformer._src.layers.conv_layers import Conv1D as Conv1D
from transformer._src.layers.conv_layers import Conv1DLayer as Conv1DLayer
from transformer._src.layers.conv_layers import (
  Conv1DLocalAttn as Conv1DLocalAttn,
)
from transformer._src.layers.conv_layers import (
  DynamicConv1DLocalAttn as DynamicConv1DLocalAttn,
)
from transformer._src.layers.conv_layers import (
  LightweightConv1DLocalAttn as LightweightConv1DLocalAttn,
)
from transformer._src.layers.conv_layers import (
  LocalConvAttnBlock as LocalConvAttnBlock,
)
from transformer._src.layers.conv_layers import (
  SeparableConv1DLayer as SeparableConv1DLayer,
)
from transformer._src.layers.dense_layers import (
  DenseReluDense as DenseReluDense,
)
from transformer._src.layers.dense_layers import ParallelLayer as ParallelLayer
from transformer._src.layers.enc_dec_attention import (
  EncDecAttention as EncDecAttention,
)
from transformer._src.layers.enc_dec_attention import (
  TransparentEncDecAttention as TransparentEncDecAttention,
)
from transformer._src.layers.enc_dec_attention import (
  enc_dec_attention as enc_dec_attention,
)
from transformer._src.layers.enc_dec_attention import (
  enc_dec_attention_bias as enc_dec_attention_bias,
)
from transformer._src.layers.enc_dec_attention import (
  relative_position_spans as relative_position_spans,
)
from transformer._src.layers.experts_attention import (
  ExpertsEncDecAttention as ExpertsEncDecAttention,
)
from transformer._src.layers.experts_attention import (
  ExpertsSelfAttention as ExpertsSelfAttention,
)
from transformer._src.layers.local_self_attention import (
  LocalSelfAttention as LocalSelfAttention,
)
from transformer._src.layers.self_attention import (
  SelfAttention as SelfAttention,
)
from transformer._src.layers.self_attention import (
  attention_params as attention_params,
)

__all__ = [
  "BranchedEncDecAttention",
  "BranchedSelfAttention",
  "Conv1D",
  "Conv1DLayer",
  "Conv1DLocalAttn",
  "DenseReluDense",
  "DynamicConv1DLocalAttn",
  "EncDecAttention",
  "ExpertsEncDecAttention",
  "ExpertsSelfAttention",
  "GeneralBilinearEncDecAttention",
  "GeneralBilinearSelfAttention",
  "LightweightConv1DLocalAttn",
  "LocalConvAttnBlock",
  "LocalSelfAttention",
  "ParallelLayer",
  "SelfAttention",
  "SeparableConv1DLayer",
  "Synthesizer",
  "TalkingHeadsEncDecAttention",
  "TalkingHeadsSelfAttention",
  "TransparentEncDecAttention",
  "attention_params",
  "enc_dec_attention",
  "enc_dec_attention_bias",
  "relative_position_spans",
]
