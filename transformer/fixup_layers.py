"""mesh_tensorflow.transformer.fixup_layers: Fixup-initialized layers.

A facade over transformer/_src/layers/fixup_layers.py.
"""
# pylint: disable=g-importing-member,useless-import-alias

from transformer._src.layers.context import Context as Context
from transformer._src.layers.fixup_layers import (
  AttentionParamsFixup as AttentionParamsFixup,
)
from transformer._src.layers.fixup_layers import (
  DenseReluDenseFixup as DenseReluDenseFixup,
)
from transformer._src.layers.fixup_layers import (
  EncDecAttentionFixup as EncDecAttentionFixup,
)
from transformer._src.layers.fixup_layers import (
  SelfAttentionFixup as SelfAttentionFixup,
)
from transformer._src.layers.fixup_layers import (
  dense_product_fixup as dense_product_fixup,
)
from transformer._src.layers.fixup_layers import (
  get_single_scalar_bias as get_single_scalar_bias,
)
from transformer._src.layers.fixup_layers import (
  sublayer_fixup_scale as sublayer_fixup_scale,
)
from transformer._src.layers.fixup_layers import (
  sublayer_fixup_shift as sublayer_fixup_shift,
)

__all__ = [
  "AttentionParamsFixup",
  "DenseReluDenseFixup",
  "EncDecAttentionFixup",
  "SelfAttentionFixup",
  "dense_product_fixup",
  "get_single_scalar_bias",
  "sublayer_fixup_scale",
  "sublayer_fixup_shift",
]
