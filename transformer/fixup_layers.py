"""mesh_tensorflow.transformer.fixup_layers: Fixup-initialized layers.

A facade over transformer/_src/layers/fixup_layers.py.
"""
# pylint: disable=g-importing-member,useless-import-alias

from transformer._src.layers.fixup_layers import DenseReluDense as DenseReluDense
from transformer._src.layers.fixup_layers import EncDecAttention as EncDecAttention
from transformer._src.layers.fixup_layers import SelfAttention as SelfAttention
from transformer._src.layers.fixup_layers import fixup_scale_factor as fixup_scale_factor
from transformer._src.layers.fixup_layers import sublayer_fixup_scale as sublayer_fixup_scale
from transformer._src.layers.fixup_layers import sublayer_fixup_shift as sublayer_fixup_shift
from transformer._src.layers.context import Context as Context

__all__ = [
    "DenseReluDense",
    "EncDecAttention",
    "SelfAttention",
    "fixup_scale_factor",
    "sublayer_fixup_scale",
    "sublayer_fixup_shift",
]
