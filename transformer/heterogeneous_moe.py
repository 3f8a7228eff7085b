"""mesh_tensorflow.transformer.heterogeneous_moe: experts of varied depth.

A facade over transformer/_src/models/heterogeneous_moe.py.
"""

from transformer._src.models.heterogeneous_moe import HeterogeneousMoE1D
from transformer._src.models.heterogeneous_moe import (
  generate_heterogeneous_expert_masks,
)
from transformer._src.models.heterogeneous_moe import transformer_moe_layer_v1

__all__ = [
  "HeterogeneousMoE1D",
  "generate_heterogeneous_expert_masks",
  "transformer_moe_layer_v1",
]
