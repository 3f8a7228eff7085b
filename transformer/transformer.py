"""mesh_tensorflow.transformer.transformer: models, layer stacks, Context.

A facade: the code lives in transformer/_src/ (context.py, layer_stack.py,
embeddings.py, unitransformer.py, bitransformer.py).
"""
# pylint: disable=g-importing-member,useless-import-alias

from transformer._src.layers.context import Context as Context
from transformer._src.layers.context import ModeKeys as ModeKeys
from transformer._src.layers.context import TransformerLayer as TransformerLayer
from transformer._src.layers.embeddings import VocabEmbedding as VocabEmbedding
from transformer._src.layers.embeddings import (
  get_vocab_embedding_cls as get_vocab_embedding_cls,
)
from transformer._src.layers.embeddings import (
  sinusoid_positional_embedding_weights as sinusoid_positional_embedding_weights,
)
from transformer._src.models.bitransformer import Bitransformer as Bitransformer
from transformer._src.models.bitransformer import (
  StudentTeacher as StudentTeacher,
)
from transformer._src.models.bitransformer import (
  make_bi_student_teacher as make_bi_student_teacher,
)
from transformer._src.models.bitransformer import (
  make_bitransformer as make_bitransformer,
)
from transformer._src.models.decoder_inputs import (
  autoregressive_inputs as autoregressive_inputs,
)
from transformer._src.models.decoder_inputs import (
  delimited_lm_inputs_mask as delimited_lm_inputs_mask,
)
from transformer._src.models.decoder_inputs import (
  shift_targets as shift_targets,
)
from transformer._src.models.ensemble_logits import (
  reduce_ensemble_logits as reduce_ensemble_logits,
)
from transformer._src.models.ensemble_logits import (
  reduce_ensemble_logits_mean_logit as reduce_ensemble_logits_mean_logit,
)
from transformer._src.models.ensemble_logits import (
  reduce_ensemble_logits_mean_prob as reduce_ensemble_logits_mean_prob,
)
from transformer._src.models.ensemble_logits import (
  reduce_ensemble_logits_select as reduce_ensemble_logits_select,
)
from transformer._src.models.layer_stack import LayerStack as LayerStack
from transformer._src.models.layer_stack import (
  ReversibleLayerStack as ReversibleLayerStack,
)
from transformer._src.models.layer_stack import (
  make_layer_stack as make_layer_stack,
)
from transformer._src.models.layer_stack import (
  sublayer_annealed_dropout as sublayer_annealed_dropout,
)
from transformer._src.models.layer_stack import (
  sublayer_call_layer as sublayer_call_layer,
)
from transformer._src.models.layer_stack import (
  sublayer_clip_activation_gradient as sublayer_clip_activation_gradient,
)
from transformer._src.models.layer_stack import (
  sublayer_dropout as sublayer_dropout,
)
from transformer._src.models.layer_stack import (
  sublayer_legacy_dropout as sublayer_legacy_dropout,
)
from transformer._src.models.layer_stack import (
  sublayer_legacy_final_rms_norm as sublayer_legacy_final_rms_norm,
)
from transformer._src.models.layer_stack import (
  sublayer_legacy_rms_norm as sublayer_legacy_rms_norm,
)
from transformer._src.models.layer_stack import (
  sublayer_mask_padding as sublayer_mask_padding,
)
from transformer._src.models.layer_stack import (
  sublayer_residual as sublayer_residual,
)
from transformer._src.models.layer_stack import (
  sublayer_rezero as sublayer_rezero,
)
from transformer._src.models.layer_stack import (
  sublayer_rms_norm as sublayer_rms_norm,
)
from transformer._src.models.layer_stack import (
  sublayer_rms_norm_subsampled as sublayer_rms_norm_subsampled,
)
from transformer._src.models.layer_stack import (
  sublayer_scale_norm as sublayer_scale_norm,
)
from transformer._src.models.layer_stack import (
  sublayer_true_layer_norm as sublayer_true_layer_norm,
)
from transformer._src.models.unitransformer import (
  Unitransformer as Unitransformer,
)

__all__ = [
  "Bitransformer",
  "Context",
  "LayerStack",
  "ModeKeys",
  "ReversibleLayerStack",
  "StudentTeacher",
  "TransformerLayer",
  "Unitransformer",
  "VocabEmbedding",
  "autoregressive_inputs",
  "delimited_lm_inputs_mask",
  "get_vocab_embedding_cls",
  "make_bi_student_teacher",
  "make_bitransformer",
  "make_layer_stack",
  "reduce_ensemble_logits",
  "reduce_ensemble_logits_mean_logit",
  "reduce_ensemble_logits_mean_prob",
  "reduce_ensemble_logits_select",
  "shift_targets",
  "sinusoid_positional_embedding_weights",
  "sublayer_annealed_dropout",
  "sublayer_call_layer",
  "sublayer_clip_activation_gradient",
  "sublayer_dropout",
  "sublayer_legacy_dropout",
  "sublayer_legacy_final_rms_norm",
  "sublayer_legacy_rms_norm",
  "sublayer_mask_padding",
  "sublayer_residual",
  "sublayer_rezero",
  "sublayer_rms_norm",
  "sublayer_rms_norm_subsampled",
  "sublayer_scale_norm",
  "sublayer_true_layer_norm",
]
