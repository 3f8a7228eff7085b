"""mesh_tensorflow.transformer.attention: attention math and parameters.

A facade over transformer/_src/layers/attention_core.py (the attention math),
attention_params.py (the projection variables), local_attention.py (blocked
local attention) and experts_attention_params.py.
"""
# pylint: disable=g-importing-member,useless-import-alias

from transformer._src.layers.attention_core import attention as attention
from transformer._src.layers.attention_core import (
  hybrid_attention as hybrid_attention,
)
from transformer._src.layers.attention_core import (
  maybe_reshape_attention_input_for_2d_sharding as maybe_reshape_attention_input_for_2d_sharding,
)
from transformer._src.layers.attention_core import (
  synthetic_attention as synthetic_attention,
)
from transformer._src.layers.attention_core import (
  visibility_mask_to_attention_bias as visibility_mask_to_attention_bias,
)
from transformer._src.layers.attention_params import (
  AttentionParams as AttentionParams,
)
from transformer._src.layers.attention_params import (
  attention_params_simple as attention_params_simple,
)
from transformer._src.layers.experts_attention_params import (
  ExpertsAttentionParams as ExpertsAttentionParams,
)
from transformer._src.layers.hyperprompts import (
  concat_hyper_prompts_kv as concat_hyper_prompts_kv,
)
from transformer._src.layers.hyperprompts import (
  make_params_hyperprompt as make_params_hyperprompt,
)
from transformer._src.layers.hyperprompts import (
  make_params_mtlprompt as make_params_mtlprompt,
)
from transformer._src.layers.local_attention import (
  local_attention_1d as local_attention_1d,
)

__all__ = [
  "AttentionParams",
  "ExpertsAttentionParams",
  "attention",
  "attention_params_simple",
  "concat_hyper_prompts_kv",
  "hybrid_attention",
  "local_attention_1d",
  "make_params_hyperprompt",
  "make_params_mtlprompt",
  "maybe_reshape_attention_input_for_2d_sharding",
  "synthetic_attention",
  "visibility_mask_to_attention_bias",
]
