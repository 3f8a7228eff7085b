"""Pins the transformer modules' public names and signatures (the original's).

Each module exports the original's names (also under the
mesh_tensorflow.transformer alias); key signatures keep its parameter order
and defaults; its gin selectors resolve.
"""

import importlib
import inspect

import gin
import pytest

import mesh_tensorflow.transformer  # noqa: F401  (installs the alias)

MODULE_NAMES = {
  "transformer": [
    "TransformerLayer",
    "Context",
    "LayerStack",
    "ReversibleLayerStack",
    "Unitransformer",
    "Bitransformer",
    "StudentTeacher",
    "make_layer_stack",
    "make_bitransformer",
    "make_bi_student_teacher",
    "shift_targets",
    "autoregressive_inputs",
    "delimited_lm_inputs_mask",
    "reduce_ensemble_logits",
    "reduce_ensemble_logits_select",
    "reduce_ensemble_logits_mean_prob",
    "reduce_ensemble_logits_mean_logit",
    "VocabEmbedding",
    "get_vocab_embedding_cls",
    "sinusoid_positional_embedding_weights",
    "sublayer_call_layer",
    "sublayer_mask_padding",
    "sublayer_rms_norm",
    "sublayer_legacy_rms_norm",
    "sublayer_legacy_final_rms_norm",
    "sublayer_rms_norm_subsampled",
    "sublayer_scale_norm",
    "sublayer_residual",
    "sublayer_dropout",
    "sublayer_annealed_dropout",
    "sublayer_clip_activation_gradient",
    "sublayer_legacy_dropout",
    "sublayer_rezero",
    "sublayer_true_layer_norm",
  ],
  "transformer_layers": [
    "DenseReluDense",
    "attention_params",
    "SelfAttention",
    "EncDecAttention",
    "enc_dec_attention",
    "enc_dec_attention_bias",
    "relative_position_spans",
    "LocalSelfAttention",
    "ExpertsSelfAttention",
    "ExpertsEncDecAttention",
    "Synthesizer",
    "TransparentEncDecAttention",
    "TalkingHeadsSelfAttention",
    "TalkingHeadsEncDecAttention",
    "GeneralBilinearSelfAttention",
    "GeneralBilinearEncDecAttention",
    "BranchedSelfAttention",
    "BranchedEncDecAttention",
    "Conv1D",
    "Conv1DLayer",
    "SeparableConv1DLayer",
    "Conv1DLocalAttn",
    "LightweightConv1DLocalAttn",
    "DynamicConv1DLocalAttn",
    "LocalConvAttnBlock",
    "ParallelLayer",
    "_relative_position_bucket",
  ],
  "attention": [
    "attention",
    "hybrid_attention",
    "synthetic_attention",
    "AttentionParams",
    "ExpertsAttentionParams",
    "attention_params_simple",
    "local_attention_1d",
    "visibility_mask_to_attention_bias",
    "maybe_reshape_attention_input_for_2d_sharding",
  ],
  "moe": [
    "MoE1D",
    "MoE2D",
    "transformer_moe_layer_v1",
    "transformer_moe_layer_v2",
    "set_default_moe_hparams",
    "HParams",
  ],
  "vocab_embeddings": [
    "FactorizedVocabEmbedding",
    "AdaptiveVocabEmbedding",
    "MixtureOfSoftmaxes",
    "Mixtape",
  ],
  "adaptive_softmax": [
    "AdaptiveSoftmaxVocabEmbedding",
    "adaptive_softmax_loss_fn",
  ],
  "learning_rate_schedules": [
    "product_learning_rate",
    "linear_decay",
    "linear_warmup",
    "truncated_rsqrt",
    "constant",
    "constant_learning_rate",
    "linear_decay_learning_rate",
    "learning_rate_schedule_noam",
    "slanted_triangular",
  ],
  "vocabulary": ["Vocabulary", "TFDSVocabulary", "get_tfds_vocabulary"],
  "t2t_vocabulary": ["T2tVocabulary", "get_t2t_vocabulary"],
}


@pytest.mark.parametrize("module_name", sorted(MODULE_NAMES))
def test_names_and_alias(module_name):
  module = importlib.import_module("transformer." + module_name)
  aliased = importlib.import_module(
    "mesh_tensorflow.transformer." + module_name
  )
  assert aliased is module
  missing = [n for n in MODULE_NAMES[module_name] if not hasattr(module, n)]
  assert not missing, "%s lacks %s" % (module_name, missing)


def _params(fn):
  fn = getattr(fn, "__wrapped__", fn)
  if inspect.isclass(fn):
    fn = fn.__init__
  params = inspect.signature(fn).parameters.values()
  return [(p.name, p.default) for p in params if p.name != "self"]


def test_t2t_vocabulary_signatures():
  from transformer import t2t_vocabulary  # pylint: disable=g-import-not-at-top

  req = gin.REQUIRED
  assert _params(t2t_vocabulary.T2tVocabulary) == [
    ("filepath", inspect.Parameter.empty)
  ]
  assert _params(t2t_vocabulary.get_t2t_vocabulary) == [
    ("data_dir", req),
    ("vocabulary_filename", req),
  ]


def test_signatures():
  from transformer import moe  # pylint: disable=g-import-not-at-top
  from transformer import transformer  # pylint: disable=g-import-not-at-top
  from transformer import transformer_layers  # pylint: disable=g-import-not-at-top

  req = gin.REQUIRED
  unitransformer = _params(transformer.Unitransformer)
  assert unitransformer[:8] == [
    ("layer_stack", inspect.Parameter.empty),
    ("d_model", 1024),
    ("input_vocab_size", req),
    ("output_vocab_size", req),
    ("autoregressive", req),
    ("max_length", req),
    ("shared_embedding_and_softmax_weights", False),
    ("label_smoothing", 0.0),
  ]
  assert [n for n, _ in unitransformer[8:]] == [
    "z_loss",
    "name",
    "layout",
    "mesh_shape",
    "vocab_divisor",
    "ensemble",
    "loss_fn",
    "positional_embedding",
    "sinusoid_positional_embedding",
    "input_full_attention",
    "loss_on_targets_only",
    "loss_denominator",
    "token_dropout_rate",
  ]
  assert _params(transformer.make_layer_stack) == [
    ("layers", req),
    ("layer_stack_cls", transformer.LayerStack),
    ("num_layers", 6),
    ("block_scope", True),
  ]
  assert [n for n, _ in _params(transformer.make_bitransformer)] == [
    "input_vocab_size",
    "output_vocab_size",
    "layout",
    "mesh_shape",
    "encoder_name",
    "decoder_name",
    "bitransformer_cls",
  ]
  assert _params(transformer.Bitransformer) == [
    ("encoder", inspect.Parameter.empty),
    ("decoder", inspect.Parameter.empty),
    ("shared_embedding", True),
  ]
  assert [n for n, _ in _params(transformer.Context)][:5] == [
    "model",
    "mesh",
    "batch_dims",
    "length_dim",
    "variable_dtype",
  ]
  assert _params(transformer_layers.DenseReluDense) == [
    ("hidden_size", 4096),
    ("dropout_rate", 0.0),
    ("activation", "relu"),
    ("use_bias", False),
  ]
  assert _params(transformer_layers.SelfAttention)[:6] == [
    ("num_heads", 8),
    ("num_memory_heads", 0),
    ("key_value_size", 128),
    ("shared_kv", False),
    ("dropout_rate", 0.0),
    ("attention_kwargs", None),
  ]
  assert _params(moe.MoE1D)[:4] == [
    ("num_experts", 16),
    ("loss_coef", 1e-2),
    ("hidden_size", 4096),
    ("group_size", 1024),
  ]


@pytest.mark.parametrize(
  "selector",
  [
    "mesh_tensorflow.transformer.transformer.make_layer_stack.num_layers",
    "mesh_tensorflow.transformer.transformer_layers.SelfAttention.num_heads",
    "mesh_tensorflow.transformer.moe.MoE1D.num_experts",
    "Unitransformer.sample_autoregressive.temperature",
    "Bitransformer.decode.beam_size",
  ],
)
def test_original_gin_selectors_resolve(selector):
  gin.clear_config()
  try:
    gin.bind_parameter(selector, 3)
    assert gin.query_parameter(selector) == 3
  finally:
    gin.clear_config()
