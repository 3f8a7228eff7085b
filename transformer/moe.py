"""mesh_tensorflow.transformer.moe: mixture-of-experts layers (facade).

The code lives in transformer/_src/layers/: moe_layers.py (the layers),
moe_hparams.py (HParams), moe_dispatch.py (the MoE computation) and
moe_gating.py (routing). The original's private gating
helpers stay importable under their old names (`_top_2_gating`, ...).
"""

from transformer._src.layers.moe_dispatch import _split_into_groups
from transformer._src.layers.moe_dispatch import transformer_moe_layer_v1
from transformer._src.layers.moe_dispatch import transformer_moe_layer_v2
from transformer._src.layers.moe_gating import (
  expert_selection_gating as _expert_selection_gating,
)
from transformer._src.layers.moe_gating import ntlb_gating as _ntlb_gating
from transformer._src.layers.moe_gating import router_z_loss as _router_z_loss
from transformer._src.layers.moe_gating import switch_gating as _switch_gating
from transformer._src.layers.moe_gating import (
  switch_max_gating as _switch_max_gating,
)
from transformer._src.layers.moe_gating import top_2_gating as _top_2_gating
from transformer._src.layers.moe_gating import top_n_gating as _top_n_gating
from transformer._src.layers.moe_hparams import HParams
from transformer._src.layers.moe_hparams import set_default_moe_hparams
from transformer._src.layers.moe_layers import MoE1D
from transformer._src.layers.moe_layers import MoE2D

__all__ = [
  "HParams",
  "MoE1D",
  "MoE2D",
  "set_default_moe_hparams",
  "transformer_moe_layer_v1",
  "transformer_moe_layer_v2",
]
