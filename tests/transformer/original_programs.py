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

BASE_LAYERS = (
  f"{_T}make_layer_stack.layers = [@{_TL}SelfAttention, @{_TL}DenseReluDense]"
)

# name -> (gin bindings after DEFAULTS, program kind). The layer stack is
# make_layer_stack(). (The original's LocalSelfAttention fails on sequences
# this short: it calls attention() without a context.) Kinds: "lm" (logits,
# loss, gradients), "lm_decode" (greedy decode), "bitransformer" (logits,
# loss, gradients, greedy and beam decodes),
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
}

# Modules the programs use, imported by name (some are on demand).
MODULES = (
  "adaptive_softmax",
  "evolved_transformer",
  "fixup_layers",
  "memory_layers",
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
  rng = np.random.RandomState(sorted(PROGRAMS).index(name))
  graph = tf.Graph()
  try:
    with graph.as_default():
      return _run(mtf, tfm, kind, rng, graph)
  finally:
    gin.clear_config()


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
  if kind in ("lm", "adafactor", "adam"):
    model = _unitransformer(tfm, make_stack(tfm))
    logits, loss = model.call_simple(
      inputs=tfm.transformer.autoregressive_inputs(targets, sequence_id),
      targets=targets,
      compute_loss=True,
      mode="train",
      sequence_id=sequence_id,
    )
    outputs["logits"], outputs["loss"] = logits, loss
  elif kind == "bitransformer":
    model = tfm.transformer.Bitransformer(
      tfm.transformer.Unitransformer(
        layer_stack=make_stack(tfm),
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
    inputs = ids(_targets(rng))
    logits, loss = model.call_simple(
      inputs=inputs, targets=targets, compute_loss=True, mode="train"
    )
    outputs["logits"], outputs["loss"] = logits, loss
  elif kind == "lm_decode":
    model = _unitransformer(tfm, make_stack(tfm))
    prefix = _targets(rng)
    prefix[:, 2:] = 0
    outputs["greedy"] = model.sample_autoregressive(
      ids(prefix), temperature=0.0, never_end=True
    )
  else:
    raise ValueError(kind)

  variables = sorted(mtf_graph.trainable_variables, key=lambda v: v.name)
  if kind in ("lm", "bitransformer"):
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
  if kind == "bitransformer":
    decode_inputs = ids(_targets(rng))
    outputs["greedy"] = model.decode(decode_inputs, temperature=0.0)
    outputs["beam"] = model.decode(decode_inputs, beam_size=2, alpha=0.6)

  mesh_impl = mtf.placement_mesh_impl.PlacementMeshImpl(
    mtf.Shape([]), mtf.LayoutRules([]), [""]
  )
  lowering = mtf.Lowering(mtf_graph, {mesh: mesh_impl})
  tf_outputs = {k: lowering.export_to_tf_tensor(t) for k, t in outputs.items()}
  tf_updates = [lowering.lowered_operation(op) for op in updates]
  tf_values = {
    "value:" + v.name: lowering.export_to_tf_tensor(v.outputs[0])
    for v in variables
  }
  assigns = []
  for variable in variables:
    value = 0.3 * rng.randn(*variable.shape.to_integer_list)
    slices = lowering.variables[variable].laid_out_tensor.all_slices
    assigns.append(slices[0].assign(value.astype(np.float32)))
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
