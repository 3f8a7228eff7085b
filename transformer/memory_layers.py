"""mesh_tensorflow.transformer.memory_layers: product-key memory layers.

A facade over transformer/_src/layers/memory_layers.py.
"""
# pylint: disable=g-importing-member,useless-import-alias

from transformer._src.layers.context import Context as Context
from transformer._src.layers.context import TransformerLayer as TransformerLayer
from transformer._src.layers.memory_layers import (
  ProductKeyValueMemory as ProductKeyValueMemory,
)

__all__ = [
  "ProductKeyValueMemory",
]
