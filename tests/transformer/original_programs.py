"""Transformer programs run identically against this package and the original.

Each program builds a small model with the original's public API only (so
the same code runs on mesh-tensorflow 0.1.21), sets every variable from a
RandomState in the order of sorted variable names, and returns numpy
outputs: variable names and shapes (checkpoint compatibility), logits, loss,
gradients, decodes, optimizer updates. `data/make_original_numbers.py`
ran them against the original and stored the results in
data/original_numbers.npz; original_numbers_test.py compares this package
with them.
"""

import json

import gin
import numpy as np
import tensorflow as tf

BATCH, LENGTH, D_MODEL, VOCAB = 2, 6, 8, 16


_T = "mesh_tensorflow.transformer.transformer."
_TL = "mesh_tensorflow.transformer.transformer_layers."
_VE = "mesh_tensorflow.transformer.vocab_embeddings."
_MOE = "mesh_tensorflow.transformer.moe."
_UT = "mesh_tensorflow.transformer.universal_transformer."
_F = (
  "mesh_tensorflow.transformer.funnel_transformer.FunnelTransformerLayerStack."
)

# The original's models/defaults.gin sublayers (its LayerStack needs them).
DEFAULTS = f"""
{_T}LayerStack.sublayers_initial = [@{_T}sublayer_dropout]
{_T}LayerStack.sublayers_per_layer = [
  @{_T}sublayer_rms_norm,
  @{_T}sublayer_call_layer,
  @{_T}sublayer_dropout,
  @{_T}sublayer_residual,
]
{_T}LayerStack.sublayers_final = [
  @{_T}sublayer_rms_norm,
  @{_T}sublayer_dropout,
]
{_TL}SelfAttention.num_heads = 2
{_TL}SelfAttention.key_value_size = 4
{_TL}EncDecAttention.num_heads = 2
{_TL}EncDecAttention.key_value_size = 4
{_TL}DenseReluDense.hidden_size = 12
{_T}make_layer_stack.num_layers = 2
"""

# UTLayerStack's required settings common to the universal transformer
# programs (which add the recurrence and step signal).
_UT_BINDINGS = f"""
{_T}make_layer_stack.layer_stack_cls = @{_UT}UTLayerStack
{_T}make_layer_stack.num_layers = 1
{_UT}UTLayerStack.num_vanilla_transformer_layers = 1
{_UT}UTLayerStack.act_max_steps = 2
{_UT}UTLayerStack.act_epsilon = 0.01
{_UT}UTLayerStack.num_rec_steps = 2
{_UT}UTLayerStack.num_inrecurrence_layers = 1
{_UT}UTLayerStack.position_start_index = None
{_UT}UTLayerStack.add_or_concat_timing_signal = "add"
{_UT}UTLayerStack.add_position_timing_signal = True
{_UT}UTLayerStack.mix_with_transformer_before_ut = True
{_UT}UTLayerStack.mix_with_transformer_after_ut = False
{_UT}UTLayerStack.gates_inputs = "i"
{_UT}UTLayerStack.gate_ffn_layer = "dense"
{_UT}UTLayerStack.use_gated_transformer = False
{_UT}UTLayerStack.gating_type = "highway"
"""

# The original's MoE layers read the model's mesh shape and layout.
_MOE_MESH = f"""
{_T}Unitransformer.mesh_shape = ""
{_T}Unitransformer.layout = ""
"""

_MOE1D = (
  _MOE_MESH
  + f"""{_T}make_layer_stack.layers = [@{_TL}SelfAttention, @{_MOE}MoE1D]
{_MOE}MoE1D.num_experts = 4
{_MOE}MoE1D.hidden_size = 12"""
)

_EXPERTS_ATTENTION = f"""
{_T}make_layer_stack.layers = [
  @{_TL}ExpertsSelfAttention, @{_TL}DenseReluDense]
{_TL}ExpertsSelfAttention.num_heads = 2
{_TL}ExpertsSelfAttention.key_value_size = 4
{_TL}ExpertsSelfAttention.shared_kv = True
{_TL}ExpertsSelfAttention.num_experts = 2
{_TL}ExpertsSelfAttention.hidden_size = 8
{_TL}ExpertsSelfAttention.switch_policy_train = "argmax"
{_TL}ExpertsSelfAttention.switch_policy_eval = "argmax"
"""

BASE_LAYERS = (
  f"{_T}make_layer_stack.layers = [@{_TL}SelfAttention, @{_TL}DenseReluDense]"
)

# name -> (gin bindings after DEFAULTS, program kind). The layer stack is
# make_layer_stack(). (The original's LocalSelfAttention fails on sequences
# this short: it calls attention() without a context; its MoE2D is not
# gin-configurable and lacks an hparam.) Kinds: "lm" (logits, loss,
# gradients), "lm_layers" (also every layer's output), "lm_bfloat16_*" (an
# "lm" with bfloat16 activations / also bfloat16 variable slices),
# "lm_decode" (greedy decode), "lm_decode_partial" (greedy, max_steps and
# top-1 sampling decodes of prefixes of different lengths),
# "lm_decode_from_scratch", "lm_decode_bfloat16", "lm_beam" (beam search),
# "bitransformer" (logits, loss, gradients, greedy and beam decodes),
# "bitransformer_funnel" (the same with a funnel encoder),
# "bitransformer_train" (no decodes), "bitransformer_packed" (two examples
# per row), "bitransformer_decode" (decodes with max_decode_length),
# "adafactor" / "adam" (variables after two updates).
PROGRAMS = {
  "base_lm": (BASE_LAYERS, "lm"),
  "base_lm_decode": (BASE_LAYERS, "lm_decode"),
  "gated_gelu": (
    BASE_LAYERS
    + f"""
{_TL}DenseReluDense.activation = ["gelu", "linear"]""",
    "lm",
  ),
  "relative_attention_bias": (
    BASE_LAYERS
    + f"""
{_TL}SelfAttention.relative_attention_type = "bias_shared"
{_TL}SelfAttention.relative_attention_num_buckets = 4""",
    "lm",
  ),
  "relative_attention_contextual": (
    BASE_LAYERS
    + f"""
{_TL}SelfAttention.relative_attention_type = "contextual"
{_TL}SelfAttention.relative_attention_num_buckets = 4""",
    "lm",
  ),
  "multi_query_attention": (
    BASE_LAYERS
    + f"""
{_TL}SelfAttention.num_memory_heads = 1""",
    "lm",
  ),
  "shared_kv": (
    BASE_LAYERS
    + f"""
{_TL}SelfAttention.shared_kv = True""",
    "lm",
  ),
  "talking_heads": (
    f"""{_T}make_layer_stack.layers = [
  @{_TL}TalkingHeadsSelfAttention, @{_TL}GeneralBilinearSelfAttention]
{_TL}TalkingHeadsSelfAttention.key_heads_dims = [("key_heads", 2)]
{_TL}TalkingHeadsSelfAttention.softmax_heads_dims = [("heads", 3)]
{_TL}TalkingHeadsSelfAttention.value_heads_dims = [("value_heads", 2)]
{_TL}TalkingHeadsSelfAttention.key_size = 4
{_TL}TalkingHeadsSelfAttention.value_size = 4
{_TL}TalkingHeadsSelfAttention.dynamic_projections = ["x2l", "m2w"]
{_TL}GeneralBilinearSelfAttention.heads_dims = [("heads", 2)]""",
    "lm",
  ),
  "conv_layers": (
    f"""{_T}make_layer_stack.layers = [
  @{_TL}Conv1DLayer, @{_TL}SeparableConv1DLayer]
{_TL}Conv1DLayer.filter_size = 3
{_TL}Conv1DLayer.output_size = 8
{_TL}SeparableConv1DLayer.min_relative_pos = -2
{_TL}SeparableConv1DLayer.max_relative_pos = 0
{_TL}SeparableConv1DLayer.output_size = 8""",
    "lm",
  ),
  "memory_layer": (
    f"""{_T}make_layer_stack.layers = [
  @mesh_tensorflow.transformer.memory_layers.ProductKeyValueMemory]
mesh_tensorflow.transformer.memory_layers.ProductKeyValueMemory.key_size = 4
mesh_tensorflow.transformer.memory_layers.ProductKeyValueMemory.n_keys = 4
mesh_tensorflow.transformer.memory_layers.ProductKeyValueMemory.n_heads = 2
mesh_tensorflow.transformer.memory_layers.ProductKeyValueMemory.knn = 2""",
    "lm",
  ),
  "factorized_vocab": (
    BASE_LAYERS
    + f"""
{_T}get_vocab_embedding_cls.cls = @{_VE}FactorizedVocabEmbedding
{_VE}FactorizedVocabEmbedding.inner_dimension_size = 4""",
    "lm",
  ),
  "adaptive_vocab": (
    BASE_LAYERS
    + f"""
{_T}get_vocab_embedding_cls.cls = @{_VE}AdaptiveVocabEmbedding
{_VE}AdaptiveVocabEmbedding.clusters = [
  {{"token_count": 6, "embedding_size": 8}},
  {{"token_count": 10, "embedding_size": 4}},
]
{_T}Unitransformer.vocab_divisor = 1""",
    "lm",
  ),
  "fixup": (
    f"""{_T}make_layer_stack.layers = [
  @mesh_tensorflow.transformer.fixup_layers.SelfAttentionFixup,
  @mesh_tensorflow.transformer.fixup_layers.DenseReluDenseFixup]
mesh_tensorflow.transformer.fixup_layers.SelfAttentionFixup.num_heads = 2
mesh_tensorflow.transformer.fixup_layers.SelfAttentionFixup.key_value_size = 4
mesh_tensorflow.transformer.fixup_layers.SelfAttentionFixup.num_blocks = 2
mesh_tensorflow.transformer.fixup_layers.SelfAttentionFixup.fold_scaling_into_initializer = False
mesh_tensorflow.transformer.fixup_layers.DenseReluDenseFixup.hidden_size = 12
mesh_tensorflow.transformer.fixup_layers.DenseReluDenseFixup.num_blocks = 2""",
    "lm",
  ),
  "evolved_encoder_layers": (
    f"""{_T}make_layer_stack.layers = [
  @mesh_tensorflow.transformer.evolved_transformer.GatedLinearUnitLayer,
  @mesh_tensorflow.transformer.evolved_transformer.EncoderConvolutionalLayer]
mesh_tensorflow.transformer.evolved_transformer.EncoderConvolutionalLayer.d_model = 8
mesh_tensorflow.transformer.evolved_transformer.EncoderConvolutionalLayer.dropout_rate = 0.0""",
    "lm",
  ),
  "synthesizer": (
    f"""{_T}make_layer_stack.layers = [@{_TL}Synthesizer, @{_TL}DenseReluDense]
{_TL}Synthesizer.num_heads = 2
{_TL}Synthesizer.key_value_size = 4""",
    "lm",
  ),
  "branched_attention": (
    f"""{_T}make_layer_stack.layers = [@{_TL}BranchedSelfAttention]
{_TL}BranchedSelfAttention.num_heads = 2
{_TL}BranchedSelfAttention.key_value_size = 4""",
    "lm",
  ),
  "conv_local_attention": (
    f"""{_T}make_layer_stack.layers = [
  @{_TL}LightweightConv1DLocalAttn,
  @{_TL}DynamicConv1DLocalAttn]
{_TL}LightweightConv1DLocalAttn.min_relative_pos = -2
{_TL}LightweightConv1DLocalAttn.max_relative_pos = 0
{_TL}LightweightConv1DLocalAttn.output_size = 8
{_TL}DynamicConv1DLocalAttn.min_relative_pos = -2
{_TL}DynamicConv1DLocalAttn.max_relative_pos = 0
{_TL}DynamicConv1DLocalAttn.output_size = 8""",
    "lm",
  ),
  "parallel_layer": (
    f"""{_T}make_layer_stack.layers = [@{_TL}ParallelLayer]""",
    "lm",
  ),
  "unitransformer_options": (
    BASE_LAYERS
    + f"""
{_T}Unitransformer.shared_embedding_and_softmax_weights = True
{_T}Unitransformer.label_smoothing = 0.1
{_T}Unitransformer.z_loss = 1e-3
{_T}Unitransformer.sinusoid_positional_embedding = True""",
    "lm",
  ),
  "input_full_attention": (
    BASE_LAYERS
    + f"""
{_T}Unitransformer.input_full_attention = True
{_T}Unitransformer.loss_on_targets_only = True""",
    "lm",
  ),
  "reversible_stack": (
    BASE_LAYERS
    + f"""
{_T}make_layer_stack.layer_stack_cls = @{_T}ReversibleLayerStack""",
    "lm",
  ),
  "adaptive_softmax": (
    BASE_LAYERS
    + f"""
{_T}get_vocab_embedding_cls.cls = @mesh_tensorflow.transformer.adaptive_softmax.AdaptiveSoftmaxVocabEmbedding
mesh_tensorflow.transformer.adaptive_softmax.AdaptiveSoftmaxVocabEmbedding.clusters = [
  {{"token_count": 6, "embedding_size": 8, "length_projection_factor": 1}},
  {{"token_count": 10, "embedding_size": 4, "length_projection_factor": 0.5}},
]
{_T}Unitransformer.vocab_divisor = 1""",
    "lm",
  ),
  "bitransformer": (BASE_LAYERS, "bitransformer"),
  "adafactor": (BASE_LAYERS, "adafactor"),
  "adam": (BASE_LAYERS, "adam"),
  "moe1d_top_2": (
    _MOE1D
    + f"""
{_MOE}MoE1D.second_policy_train = "all"
{_MOE}MoE1D.second_policy_eval = "all\"""",
    "lm_layers",
  ),
  "moe1d_switch": (
    _MOE1D
    + f"""
{_MOE}MoE1D.moe_gating = "switch"
{_MOE}MoE1D.switch_policy_train = "argmax"
{_MOE}MoE1D.switch_policy_eval = "argmax"
{_MOE}MoE1D.z_loss = 1e-3""",
    "lm_layers",
  ),
  "universal_transformer": (
    BASE_LAYERS
    + _UT_BINDINGS
    + f"""
{_UT}UTLayerStack.recurrence_type = "basic"
{_UT}UTLayerStack.act_type = "basic"
{_UT}UTLayerStack.add_step_timing_signal = False
{_UT}UTLayerStack.step_timing_signal_type = "learned\"""",
    "lm_layers",
  ),
  "universal_transformer_act": (
    BASE_LAYERS
    + _UT_BINDINGS
    + f"""
{_UT}UTLayerStack.recurrence_type = "act"
{_UT}UTLayerStack.act_type = "basic"
{_UT}UTLayerStack.add_step_timing_signal = True
{_UT}UTLayerStack.step_timing_signal_type = "learned\"""",
    "lm_layers",
  ),
  "universal_transformer_highway": (
    BASE_LAYERS
    + _UT_BINDINGS
    + f"""
{_UT}UTLayerStack.recurrence_type = "highway"
{_UT}UTLayerStack.act_type = "basic"
{_UT}UTLayerStack.add_step_timing_signal = True
{_UT}UTLayerStack.step_timing_signal_type = "learned"
{_UT}UTLayerStack.couple_carry_transform_gates = False
{_UT}UTLayerStack.gates_inputs = "sti"
{_UT}UTLayerStack.use_gated_transformer = True""",
    "lm_layers",
  ),
  "universal_transformer_gru": (
    BASE_LAYERS
    + _UT_BINDINGS
    + f"""
{_UT}UTLayerStack.recurrence_type = "basic"
{_UT}UTLayerStack.act_type = "basic"
{_UT}UTLayerStack.add_step_timing_signal = True
{_UT}UTLayerStack.step_timing_signal_type = "learned"
{_UT}UTLayerStack.use_gated_transformer = True
{_UT}UTLayerStack.gating_type = "gru\"""",
    "lm_layers",
  ),
  "universal_transformer_act_accumulated": (
    BASE_LAYERS
    + _UT_BINDINGS
    + f"""
{_UT}UTLayerStack.recurrence_type = "act"
{_UT}UTLayerStack.act_type = "accumulated"
{_UT}UTLayerStack.act_max_steps = 3
{_UT}UTLayerStack.mix_with_transformer_before_ut = False
{_UT}UTLayerStack.mix_with_transformer_after_ut = True
{_UT}UTLayerStack.add_step_timing_signal = False
{_UT}UTLayerStack.step_timing_signal_type = "learned\"""",
    "lm_layers",
  ),
  "mixtape": (
    BASE_LAYERS
    + f"""
{_T}get_vocab_embedding_cls.cls = @{_VE}Mixtape
{_VE}Mixtape.gate_embedding_size = 4
{_VE}Mixtape.frequent_token_fraction = 0.25
{_T}Unitransformer.shared_embedding_and_softmax_weights = True""",
    "lm_layers",
  ),
  "experts_attention": (
    _MOE_MESH + _EXPERTS_ATTENTION,
    "lm_layers",
  ),
  "experts_attention_kv": (
    _MOE_MESH
    + _EXPERTS_ATTENTION
    + f"""
{_TL}ExpertsSelfAttention.expert_computation = "kv\"""",
    "lm_layers",
  ),
  "packed_bitransformer": (BASE_LAYERS, "bitransformer_packed"),
  "norms_and_attention_z_loss": (
    BASE_LAYERS
    + f"""
{_T}LayerStack.sublayers_per_layer = [
  @{_T}sublayer_true_layer_norm,
  @{_T}sublayer_call_layer,
  @{_T}sublayer_dropout,
  @{_T}sublayer_residual,
]
{_T}LayerStack.sublayers_final = [
  @{_T}sublayer_scale_norm,
  @{_T}sublayer_dropout,
]
{_TL}SelfAttention.z_loss_coeff = 1e-3
{_T}Unitransformer.loss_denominator = 7.0""",
    "lm_layers",
  ),
  "adafactor_factored": (
    BASE_LAYERS
    + """
mesh_tensorflow.optimize.AdafactorOptimizer.min_dim_size_to_factor = 4
mesh_tensorflow.optimize.AdafactorOptimizer.beta1 = 0.9
mesh_tensorflow.optimize.AdafactorOptimizer.decay_rate = 0.8
mesh_tensorflow.optimize.AdafactorOptimizer.clipping_threshold = 0.5
mesh_tensorflow.optimize.AdafactorOptimizer.exclude_from_parameter_scale = [
  "embedding"]""",
    "adafactor",
  ),
  "adam_weight_decay": (
    BASE_LAYERS
    + """
mesh_tensorflow.optimize.AdamWeightDecayOptimizer.weight_decay_rate = 0.1
mesh_tensorflow.optimize.AdamWeightDecayOptimizer.beta_1 = 0.8
mesh_tensorflow.optimize.AdamWeightDecayOptimizer.exclude_from_weight_decay = [
  "rms_norm"]""",
    "adam",
  ),
  "bfloat16_decode": (BASE_LAYERS, "lm_decode_bfloat16"),
  "bfloat16_activations": (BASE_LAYERS, "lm_bfloat16_activations"),
  "bfloat16_variables": (BASE_LAYERS, "lm_bfloat16_variables"),
  "partial_sequences_decode": (BASE_LAYERS, "lm_decode_partial"),
  "from_scratch_decode": (BASE_LAYERS, "lm_decode_from_scratch"),
  "unitransformer_beam": (BASE_LAYERS, "lm_beam"),
  "bitransformer_max_decode_length": (BASE_LAYERS, "bitransformer_decode"),
  "t5_style": (
    BASE_LAYERS
    + f"""
{_TL}DenseReluDense.activation = ["gelu", "linear"]
{_TL}SelfAttention.relative_attention_type = "bias_shared"
{_TL}SelfAttention.relative_attention_num_buckets = 4
{_T}Unitransformer.positional_embedding = False
{_T}Unitransformer.shared_embedding_and_softmax_weights = True
{_T}Bitransformer.shared_embedding = True""",
    "bitransformer",
  ),
  "enc_dec_relative_attention": (
    BASE_LAYERS
    + f"""
{_TL}EncDecAttention.relative_attention_type = "bias"
{_TL}EncDecAttention.relative_attention_num_buckets = 4
{_TL}EncDecAttention.z_loss_coeff = 1e-3
{_TL}EncDecAttention.num_memory_heads = 1
{_TL}relative_position_spans.num_sentinels = 2""",
    "bitransformer_train",
  ),
  "funnel_transformer": (
    BASE_LAYERS
    + f"""
{_F}n_blocks = 2
{_F}block_param_size = [1, 1]
{_F}block_repeat_size = [1, 1]
{_F}sublayers_initial = [@{_T}sublayer_dropout]
{_F}sublayers_per_layer = [
  @{_T}sublayer_rms_norm,
  @{_T}sublayer_call_layer,
  @{_T}sublayer_dropout,
  @{_T}sublayer_residual,
]
{_F}sublayers_final = [@{_T}sublayer_rms_norm, @{_T}sublayer_dropout]""",
    "bitransformer_funnel",
  ),
}

# Each program's RandomState seed is its index here: the first programs in
# sorted order, later ones appended, so that adding a program leaves the
# weights (and the stored numbers) of the others unchanged.
SEED_ORDER = (
  "adafactor",
  "adam",
  "adaptive_softmax",
  "adaptive_vocab",
  "base_lm",
  "base_lm_decode",
  "bitransformer",
  "branched_attention",
  "conv_layers",
  "conv_local_attention",
  "evolved_encoder_layers",
  "factorized_vocab",
  "fixup",
  "gated_gelu",
  "input_full_attention",
  "memory_layer",
  "multi_query_attention",
  "parallel_layer",
  "relative_attention_bias",
  "relative_attention_contextual",
  "reversible_stack",
  "shared_kv",
  "synthesizer",
  "talking_heads",
  "unitransformer_options",
  "moe1d_top_2",
  "moe1d_switch",
  "universal_transformer",
  "universal_transformer_act",
  "mixtape",
  "bfloat16_activations",
  "bfloat16_variables",
  "partial_sequences_decode",
  "from_scratch_decode",
  "unitransformer_beam",
  "bitransformer_max_decode_length",
  "t5_style",
  "enc_dec_relative_attention",
  "funnel_transformer",
  "experts_attention",
  "experts_attention_kv",
  "packed_bitransformer",
  "norms_and_attention_z_loss",
  "adafactor_factored",
  "adam_weight_decay",
  "bfloat16_decode",
  "universal_transformer_highway",
  "universal_transformer_gru",
  "universal_transformer_act_accumulated",
)

# Modules the programs use, imported by name (some are on demand).
MODULES = (
  "adaptive_softmax",
  "evolved_transformer",
  "fixup_layers",
  "funnel_transformer",
  "memory_layers",
  "moe",
  "universal_transformer",
  "vocab_embeddings",
)


def _import_modules(tfm):
  import importlib  # pylint: disable=g-import-not-at-top

  for name in MODULES:
    importlib.import_module(tfm.__name__ + "." + name)


def _unitransformer(tfm, layer_stack, name="transformer", **kwargs):
  return tfm.transformer.Unitransformer(
    layer_stack=layer_stack,
    d_model=D_MODEL,
    input_vocab_size=VOCAB,
    output_vocab_size=VOCAB,
    autoregressive=kwargs.pop("autoregressive", True),
    max_length=LENGTH,
    name=name,
    **kwargs,
  )


def _targets(rng):
  targets = rng.randint(2, VOCAB, size=(BATCH, LENGTH)).astype(np.int32)
  targets[1, -2:] = 0  # padding at the end of the second sequence
  return targets


def run_program(mtf, tfm, name):
  """Runs PROGRAMS[name]; returns {output name: numpy array}.

  Args:
    mtf: the mesh_tensorflow package under test.
    tfm: its transformer package (mesh_tensorflow.transformer).
    name: the program.
  """
  _import_modules(tfm)
  bindings, kind = PROGRAMS[name]
  gin.clear_config()
  with gin.unlock_config():
    gin.parse_config(DEFAULTS + bindings)
  rng = np.random.RandomState(SEED_ORDER.index(name))
  graph = tf.Graph()
  try:
    with graph.as_default():
      return _run(mtf, tfm, kind, rng, graph)
  finally:
    gin.clear_config()


# Variable dtypes (master, slice, activation) of the bfloat16 programs.
_BFLOAT16_KINDS = {
  "lm_bfloat16_activations": ("float32", "float32", "bfloat16"),
  "lm_bfloat16_variables": ("float32", "bfloat16", "bfloat16"),
}
# Kinds that train a language model: logits, loss and gradients.
_LM_KINDS = ("lm", "lm_layers", "adafactor", "adam") + tuple(_BFLOAT16_KINDS)


def _bitransformer(tfm, kind):
  """The encoder-decoder of the bitransformer kinds."""
  encoder_stack = tfm.transformer.make_layer_stack()
  model_cls = tfm.transformer.Bitransformer
  if kind == "bitransformer_funnel":
    funnel = tfm.funnel_transformer
    encoder_stack = tfm.transformer.make_layer_stack(
      layer_stack_cls=funnel.FunnelTransformerLayerStack
    )
    model_cls = funnel.BitransformerFunnel
  return model_cls(
    tfm.transformer.Unitransformer(
      layer_stack=encoder_stack,
      d_model=D_MODEL,
      input_vocab_size=VOCAB,
      output_vocab_size=None,
      autoregressive=False,
      max_length=LENGTH,
      name="encoder",
    ),
    _unitransformer(
      tfm,
      tfm.transformer.make_layer_stack(
        layers=[
          tfm.transformer_layers.SelfAttention,
          tfm.transformer_layers.EncDecAttention,
          tfm.transformer_layers.DenseReluDense,
        ]
      ),
      name="decoder",
    ),
  )


def _float32(tensor):
  """bfloat16 outputs as float32 (numpy files have no bfloat16)."""
  if tensor.dtype == tf.bfloat16:
    return tf.cast(tensor, tf.float32)
  return tensor


def _run(mtf, tfm, kind, rng, graph):
  def make_stack(tfm):
    return tfm.transformer.make_layer_stack()

  mtf_graph = mtf.Graph()
  mesh = mtf.Mesh(mtf_graph, "mesh")
  batch_dim = mtf.Dimension("batch", BATCH)
  length_dim = mtf.Dimension("length", LENGTH)

  def ids(values):
    return mtf.import_tf_tensor(
      mesh, tf.constant(values), mtf.Shape([batch_dim, length_dim])
    )

  target_values = _targets(rng)
  targets = ids(target_values)
  # Packed-style ids: 1 on the tokens, 0 on the padding.
  sequence_id = ids((target_values != 0).astype(np.int32))
  outputs = {}
  updates = []
  if kind in _LM_KINDS:
    model = _unitransformer(tfm, make_stack(tfm))
    kwargs = {}
    if kind in _BFLOAT16_KINDS:
      kwargs["variable_dtype"] = mtf.VariableDType(
        *[tf.as_dtype(d) for d in _BFLOAT16_KINDS[kind]]
      )
    layer_outputs = []
    logits, loss = model.call_simple(
      inputs=tfm.transformer.autoregressive_inputs(targets, sequence_id),
      targets=targets,
      compute_loss=True,
      mode="train",
      sequence_id=sequence_id,
      layer_outputs=layer_outputs,
      **kwargs,
    )
    outputs["logits"], outputs["loss"] = logits, loss
    if kind == "lm_layers":
      for i, layer_output in enumerate(layer_outputs):
        outputs["layer_output_%d" % i] = layer_output
  elif kind in ("bitransformer", "bitransformer_funnel", "bitransformer_train"):
    model = _bitransformer(tfm, kind)
    inputs = ids(_targets(rng))
    logits, loss = model.call_simple(
      inputs=inputs, targets=targets, compute_loss=True, mode="train"
    )
    outputs["logits"], outputs["loss"] = logits, loss
  elif kind == "bitransformer_packed":
    # Two examples packed in each row (the second row's end is padding).
    model = _bitransformer(tfm, kind)
    packed_sequence_id = np.array([[1, 1, 1, 2, 2, 2], [1, 1, 2, 2, 0, 0]])
    packed_position = np.array([[0, 1, 2, 0, 1, 2], [0, 1, 0, 1, 0, 0]])
    inputs = _targets(rng) * (packed_sequence_id != 0)
    logits, loss = model.call_simple(
      inputs=ids(inputs.astype(np.int32)),
      targets=ids((target_values * (packed_sequence_id != 0)).astype(np.int32)),
      compute_loss=True,
      mode="train",
      encoder_sequence_id=ids(packed_sequence_id.astype(np.int32)),
      decoder_sequence_id=ids(packed_sequence_id.astype(np.int32)),
      encoder_position=ids(packed_position.astype(np.int32)),
      decoder_position=ids(packed_position.astype(np.int32)),
    )
    outputs["logits"], outputs["loss"] = logits, loss
  elif kind == "bitransformer_decode":
    model = _bitransformer(tfm, kind)
    decode_inputs = ids(_targets(rng))
    outputs["greedy"] = model.decode(
      decode_inputs, temperature=0.0, max_decode_length=4
    )
    outputs["beam"] = model.decode(
      decode_inputs, beam_size=2, alpha=0.6, max_decode_length=4
    )
    # Sampling from the single most likely token is deterministic.
    outputs["top_1_sampling"] = model.decode(
      decode_inputs, temperature=1.0, sampling_keep_top_k=1
    )
  elif kind == "lm_decode":
    model = _unitransformer(tfm, make_stack(tfm))
    prefix = _targets(rng)
    prefix[:, 2:] = 0
    outputs["greedy"] = model.sample_autoregressive(
      ids(prefix), temperature=0.0, never_end=True
    )
  elif kind == "lm_decode_partial":
    model = _unitransformer(tfm, make_stack(tfm))
    prefix = _targets(rng)
    prefix[0, 3:] = 0
    prefix[1, 1:] = 0
    outputs["greedy"] = model.sample_autoregressive(
      ids(prefix), temperature=0.0
    )
    outputs["greedy_max_steps"] = model.sample_autoregressive(
      ids(prefix), temperature=0.0, max_steps=2, remove_partial_sequences=True
    )
    outputs["top_1_sampling"] = model.sample_autoregressive(
      ids(prefix), temperature=1.0, sampling_keep_top_k=1, never_end=True
    )
  elif kind == "lm_decode_bfloat16":
    model = _unitransformer(tfm, make_stack(tfm))
    prefix = _targets(rng)
    prefix[:, 3:] = 0
    outputs["greedy"] = model.sample_autoregressive(
      ids(prefix),
      temperature=0.0,
      never_end=True,
      variable_dtype=mtf.VariableDType(tf.float32, tf.float32, tf.bfloat16),
    )
  elif kind == "lm_decode_from_scratch":
    model = _unitransformer(tfm, make_stack(tfm))
    outputs["greedy"] = model.sample_autoregressive(
      ids(np.zeros((BATCH, LENGTH), np.int32)),
      temperature=0.0,
      has_partial_sequences=False,
      never_end=True,
    )
  elif kind == "lm_beam":
    model = _unitransformer(tfm, make_stack(tfm))
    beam_dim = mtf.Dimension("beam", 2)
    outputs["beam"] = model.beam_search(
      mtf.zeros(mesh, mtf.Shape([batch_dim, beam_dim, length_dim]), tf.int32),
      decode_length=mtf.constant(mesh, LENGTH, dtype=tf.int32),
    )
  else:
    raise ValueError(kind)

  variables = sorted(mtf_graph.trainable_variables, key=lambda v: v.name)
  if kind not in ("adafactor", "adam") and "loss" in outputs:
    grads = mtf.gradients([outputs["loss"]], [v.outputs[0] for v in variables])
    for variable, grad in zip(variables, grads):
      outputs["grad:" + variable.name] = grad
  if kind in ("adafactor", "adam"):
    # Fixed gradients: updates computed from the model's own gradients
    # would race with the variables' writes inside one session run.
    grads = [
      mtf.import_tf_tensor(
        mesh,
        tf.constant(rng.randn(*v.shape.to_integer_list).astype(np.float32)),
        v.shape,
      )
      for v in variables
    ]
    if kind == "adafactor":
      optimizer = mtf.optimize.AdafactorOptimizer()
    elif kind == "adam":
      optimizer = mtf.optimize.AdamWeightDecayOptimizer(learning_rate=0.01)
    updates = optimizer.apply_grads(grads, variables)
  if kind in ("bitransformer", "bitransformer_funnel"):
    decode_inputs = ids(_targets(rng))
    outputs["greedy"] = model.decode(decode_inputs, temperature=0.0)
    outputs["beam"] = model.decode(decode_inputs, beam_size=2, alpha=0.6)

  mesh_impl = mtf.placement_mesh_impl.PlacementMeshImpl(
    mtf.Shape([]), mtf.LayoutRules([]), [""]
  )
  lowering = mtf.Lowering(mtf_graph, {mesh: mesh_impl})
  tf_outputs = {
    k: _float32(lowering.export_to_tf_tensor(t)) for k, t in outputs.items()
  }
  tf_updates = [lowering.lowered_operation(op) for op in updates]
  tf_values = {
    "value:" + v.name: lowering.export_to_tf_tensor(v.outputs[0])
    for v in variables
  }
  assigns = []
  for variable in variables:
    value = 0.3 * rng.randn(*variable.shape.to_integer_list)
    slices = lowering.variables[variable].laid_out_tensor.all_slices
    assigns.append(slices[0].assign(tf.cast(value, slices[0].dtype.base_dtype)))
  with tf.compat.v1.Session(graph=graph) as session:
    session.run(tf.compat.v1.global_variables_initializer())
    session.run(assigns)
    results = session.run(tf_outputs)
    if tf_updates:
      for _ in range(2):
        session.run(tf_updates)
      results.update(session.run(tf_values))
  results["variables"] = np.array(
    json.dumps([[v.name, v.shape.to_integer_list] for v in variables])
  )
  return {k: np.asarray(v) for k, v in results.items()}
