"""Encoder-decoder attention of mesh_tensorflow.transformer.transformer_layers.

`EncDecAttention` (attention to the encoder output) and
`TransparentEncDecAttention` (attention to a learned mix of encoder layers),
with the functions they are built from: `enc_dec_attention` (the attention
step, which records the encoder keys/values as a constant state in decoding
mode "first_part" and reads them back in "incremental"),
`enc_dec_attention_bias` (same packed sequence plus the optional relative
bias) and `relative_position_spans` (decoder-minus-encoder positions under a
span-filling objective). Research variants (attention_variants.py,
experts_attention.py) reuse these functions.
"""

from __future__ import annotations

from typing import List, Optional

import gin
import tensorflow as tf

import mesh_tensorflow as mtf
from transformer._src.layers import attention_core as attention
from transformer._src.layers.attention_bias import relative_position_bucket
from transformer._src.layers.attention_bias import to_bias
from transformer._src.layers.context import Context
from transformer._src.layers.self_attention import SelfAttention

__all__ = [
  "EncDecAttention",
  "TransparentEncDecAttention",
  "enc_dec_attention",
  "enc_dec_attention_bias",
  "relative_position_spans",
]

_GIN_MODULE = "mesh_tensorflow.transformer.transformer_layers"


@gin.configurable(module=_GIN_MODULE)
def relative_position_spans(
  context: Context, num_sentinels: int = gin.REQUIRED
) -> mtf.Tensor:
  """Relative positions (decoder - encoder) under a span-filling objective.

  The encoder inputs are a text with spans replaced by single sentinels, the
  decoder inputs (context.inputs) the dropped spans, each after its
  sentinel; sentinels are the last num_sentinels ids of the vocabulary
  (context.model.input_vocab_size_unpadded, else input_vocab_size or the
  size of input_vocab_dim). Each decoder token stands at the encoder
  position of its span's sentinel (the number of encoder tokens before that
  sentinel; a token before any sentinel stands at 0), and the result is
  that position minus each encoder position. Packed sequences are told
  apart by their sequence ids: encoder tokens of an earlier sequence (and
  the padding, id 0) count as before every span of a later one. While
  decoding one token at a time ("incremental" mode) the decoder token
  stands at 0, as if it preceded all sentinels.

  For example, the encoder "A B <S> E" and the decoder "<S> C D" put the
  decoder tokens at encoder position 2 (the sentinel's).

  Example (vocabulary of 16 ids, the sentinels are 14 and 15):
    >>> import types
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> encoder_inputs = converter.convert_np_array_to_mtf_tensor(
    ...     [[3, 4, 15, 6]], ["batch", "memory_length"])  # A B <S> E
    >>> inputs = converter.convert_np_array_to_mtf_tensor(
    ...     [[15, 7, 8]], ["batch", "length"])  # <S> C D
    >>> batch, length = inputs.shape.dims
    >>> context = Context(
    ...     types.SimpleNamespace(input_vocab_size=16), converter.mesh,
    ...     [batch], length, mtf.VariableDType(), mode="eval",
    ...     encoder_inputs=encoder_inputs, inputs=inputs)
    >>> relative = relative_position_spans(context, num_sentinels=2)
    >>> relative.shape
    Shape[batch=1, length=3, memory_length=4]
    >>> converter.convert_mtf_tensor_to_np_array(relative)[0]
    array([[ 2,  1,  0, -1],
           [ 2,  1,  0, -1],
           [ 2,  1,  0, -1]], dtype=int32)

  Args:
    context: the Context of the call (mesh, dims, mode, states...).
    num_sentinels: the number of sentinel ids (the last ids of the vocabulary).

  Returns:
    int Tensor [batch..., length, memory_length] ([batch..., memory_length]
    in "incremental" mode).

  Raises:
    ValueError: without encoder_inputs / inputs.
  """
  if context.encoder_inputs is None or context.inputs is None:
    raise ValueError(
      "relative_position_spans needs context.encoder_inputs and context.inputs"
    )
  model = context.model
  vocab_size = getattr(model, "input_vocab_size_unpadded", None)
  if not isinstance(vocab_size, int):
    vocab_size = getattr(model, "input_vocab_size", None)
  if not isinstance(vocab_size, int):
    vocab_size = model.input_vocab_dim.size
  enc = context.encoder_inputs
  if "memory_length" not in enc.shape.dimension_names:
    enc = mtf.rename_dimension(enc, context.length_dim.name, "memory_length")
  memory_dim = enc.shape.get_dim_by_name("memory_length")
  enc_pos = mtf.range(enc.mesh, memory_dim, tf.int32)
  dec = context.inputs
  length_dim = context.length_dim
  if length_dim not in dec.shape.dims:
    return mtf.negative(enc_pos)

  def span(ids, dim):  # The number of sentinels up to each token.
    sentinel = mtf.greater_equal(ids, vocab_size - num_sentinels)
    return mtf.cumsum(mtf.to_int32(sentinel), dim)

  enc_span = span(enc, memory_dim)
  dec_span = span(dec, length_dim)
  enc_sequence_id = context.encoder_sequence_id
  if enc_sequence_id is not None:
    if isinstance(enc_sequence_id, mtf.Tensor) and (
      "memory_length" not in enc_sequence_id.shape.dimension_names
    ):
      enc_sequence_id = mtf.rename_dimension(
        enc_sequence_id, length_dim.name, "memory_length"
      )
    # Spans of a later sequence come after every token of an earlier one.
    multiplier = max(memory_dim.size, length_dim.size)
    enc_span += enc_sequence_id * multiplier
    if context.sequence_id is not None:
      dec_span += context.sequence_id * multiplier
  dec_pos = mtf.reduce_sum(
    mtf.to_int32(mtf.less(enc_span, dec_span)), reduced_dim=memory_dim
  )
  return dec_pos - enc_pos


@gin.configurable(module=_GIN_MODULE)
def enc_dec_attention_bias(
  layer: SelfAttention,
  context: Context,
  heads_dims: List[mtf.Dimension],
  relative_position_fn=relative_position_spans,
) -> Optional[mtf.Tensor]:
  """Bias of encoder-decoder attention: same packed sequence, plus the
  relative attention bias `enc_dec_relative_attention_bias` for
  relative_attention_type "bias"/"bias_shared".

  The decoder's sequence_id may be a Python int: while decoding, every query
  belongs to sequence 1, and the encoder positions of any other id (the
  padding, id 0) must stay invisible all the same.

  Args:
    layer: the encoder-decoder attention layer (its relative_attention_type and
      buckets).
    context: the Context of the call (mesh, dims, mode, states...).
    heads_dims: the query heads Dimensions.
    relative_position_fn: called as fn(context) for the decoder-minus-encoder
      positions [batch..., length, memory_length].

  Returns:
    A logit bias [batch..., (heads...,) length, memory_length], or None.
  """
  bias = None
  sequence_id = context.sequence_id
  if isinstance(context.encoder_sequence_id, mtf.Tensor) and (
    isinstance(sequence_id, mtf.Tensor) or sequence_id
  ):
    bias = to_bias(mtf.equal(sequence_id, context.encoder_sequence_id), context)
  if layer.relative_attention_type in ("bias", "bias_shared"):
    buckets_dim = mtf.Dimension("buckets", layer.relative_attention_num_buckets)
    ensemble_dims = list(getattr(context.model, "ensemble_dims", []) or [])
    values = mtf.get_variable(
      context.mesh,
      "enc_dec_relative_attention_bias",
      mtf.Shape(ensemble_dims + heads_dims + [buckets_dim]),
      initializer=None,
      dtype=context.variable_dtype,
    )
    bucket = relative_position_bucket(
      relative_position_fn(context),
      bidirectional=True,
      num_buckets=buckets_dim.size,
    )
    relative = mtf.cast(
      mtf.gather(values, bucket, buckets_dim), context.activation_dtype
    )
    bias = relative if bias is None else bias + relative
  elif layer.relative_attention_type is not None:
    raise ValueError(
      "%s: unsupported relative_attention_type %r for "
      "encoder-decoder attention"
      % (type(layer).__name__, layer.relative_attention_type)
    )
  return bias


@gin.configurable(module=_GIN_MODULE)
def enc_dec_attention(
  self_attention_layer: SelfAttention,
  memory_antecedent: Optional[mtf.Tensor],
  context: Context,
  x: mtf.Tensor,
  losses,
  attention_fn=attention.attention,
  z_loss_coeff: Optional[float] = None,
) -> mtf.Tensor:
  """Attention from x to memory_antecedent [batch..., memory_length, d_model].

  In "first_part" mode the keys, values and memory length are recorded as
  one constant state; in "incremental" mode they are read back (and
  memory_antecedent is not used). z_loss_coeff: see attention.attention.

  Args:
    self_attention_layer: the attention layer (its heads, dims and dropout are
      used).
    memory_antecedent: the encoder output [batch..., memory_length, d_model].
    context: the Context of the call (mesh, dims, mode, states...).
    x: the decoder input [batch..., length, d_model].
    losses: a list to append auxiliary losses (scalar mtf.Tensors) to, or None.
    attention_fn: the attention function (default: attention.attention).
    z_loss_coeff: if set, the weight of a z-loss on the attention logits added
      to `losses`.

  Returns:
    The output [batch..., length, d_model].
  """
  layer = self_attention_layer
  params = layer.make_params(context)
  q = params.compute_q(x)
  if context.mode == "incremental":
    k, v, memory_length = context.get_constant_state()
  else:
    if memory_antecedent is None:
      raise ValueError(
        "%s needs an encoder output (memory_antecedent)" % type(layer).__name__
      )
    names = memory_antecedent.shape.dimension_names
    if "memory_length" not in names:
      raise ValueError(
        "%s: memory %s has no 'memory_length' dimension"
        % (type(layer).__name__, memory_antecedent.shape.to_string)
      )
    memory_length = memory_antecedent.shape.get_dim_by_name("memory_length")
    if layer.shared_kv:
      k = v = params.compute_kv(memory_antecedent)
    else:
      k = params.compute_k(memory_antecedent)
      v = params.compute_v(memory_antecedent)
    if context.mode == "first_part":
      context.record_constant_state((k, v, memory_length))
  bias = enc_dec_attention_bias(layer, context, params.query_heads_dims)
  kwargs = layer.attention_kwargs_from_context(context)
  if z_loss_coeff is not None:
    kwargs["z_loss_coeff"] = z_loss_coeff
  a = attention_fn(
    q,
    k,
    v,
    memory_length_dim=memory_length,
    key_dim=layer.kv_dim,
    value_dim=layer.kv_dim,
    bias=bias,
    context=context,
    **kwargs,
  )
  output = params.compute_output(
    a, output_shape=layer.expected_attention_output_shape(x, params)
  )
  return layer.layer_output_from_attention_output(context, output, losses)


@gin.configurable(module=_GIN_MODULE)
class EncDecAttention(SelfAttention):
  """Multi-head attention to context.encoder_output (same variables as
  SelfAttention; relative bias `enc_dec_relative_attention_bias`).
  """

  def __init__(self, relative_attention_type: Optional[str] = None, **kwargs):
    super().__init__(relative_attention_type=relative_attention_type, **kwargs)

  def _get_memory_antecedent(self, context: Context):
    return context.encoder_output

  def call(self, context: Context, x: mtf.Tensor, losses=None) -> mtf.Tensor:
    memory = (
      None
      if context.mode == "incremental"
      else self._get_memory_antecedent(context)
    )
    return enc_dec_attention(
      self,
      memory,
      context,
      x,
      losses,
      attention_fn=self.attention_fn,
      z_loss_coeff=self.z_loss_coeff,
    )


@gin.configurable(module=_GIN_MODULE)
class TransparentEncDecAttention(EncDecAttention):
  """Encoder-decoder attention to a learned mixture of encoder layers.

  The encoder's layer outputs (context.encoder_layer_outputs: the input and
  each layer's output) are taken every layers_per_encoder_module layers
  (encoder_num_modules + 1 of them); decoder module m (layer index //
  layers_per_decoder_module) attends to sum_e softmax_e(w[e, m]) * output_e.
  Variable `w` [encoder_module_outputs, decoder_module_inputs], created once
  per call of the decoder (by its first such layer).

  Args:
    layers_per_encoder_module: the number of encoder layers per module (whose
      outputs are mixed).
    layers_per_decoder_module: the number of decoder layers per module (each has
      its own mix).
    encoder_num_modules: the number of encoder modules (their outputs plus the
      embedding are mixed).
    decoder_num_modules: the number of decoder modules.
  """

  def __init__(
    self,
    layers_per_encoder_module: int = gin.REQUIRED,
    layers_per_decoder_module: int = gin.REQUIRED,
    encoder_num_modules: int = gin.REQUIRED,
    decoder_num_modules: int = gin.REQUIRED,
    dropout_rate: float = 0.0,
    **kwargs,
  ):
    super().__init__(dropout_rate=dropout_rate, **kwargs)
    self.layers_per_encoder_module = layers_per_encoder_module
    self.layers_per_decoder_module = layers_per_decoder_module
    self.encoder_num_modules = encoder_num_modules
    self.decoder_num_modules = decoder_num_modules

  def _get_memory_antecedent(self, context: Context) -> mtf.Tensor:
    index = context.layer_index // self.layers_per_decoder_module
    inputs = self._get_decoder_inputs(context)
    if index >= len(inputs):
      raise ValueError(
        "TransparentEncDecAttention: layer index %d is in decoder module "
        "%d, but decoder_num_modules is %d"
        % (context.layer_index, index, self.decoder_num_modules)
      )
    return inputs[index]

  def _get_decoder_inputs(self, context: Context) -> List[mtf.Tensor]:
    """One mixed encoder output per decoder module (cached per call)."""
    key = (
      "transparent_decoder_inputs",
      self.layers_per_encoder_module,
      self.encoder_num_modules,
      self.decoder_num_modules,
    )
    if key in context.cache:
      return context.cache[key]
    outputs = context.encoder_layer_outputs
    if not outputs:
      raise ValueError(
        "TransparentEncDecAttention needs context.encoder_layer_outputs"
      )
    step = self.layers_per_encoder_module
    chosen = [outputs[0]] + list(outputs[step::step])
    if len(chosen) != self.encoder_num_modules + 1:
      raise ValueError(
        "TransparentEncDecAttention: %d encoder layer outputs with "
        "layers_per_encoder_module=%d give %d module outputs, expected "
        "encoder_num_modules + 1 = %d"
        % (len(outputs), step, len(chosen), self.encoder_num_modules + 1)
      )
    chosen = [
      t
      if "memory_length" in t.shape.dimension_names
      else mtf.rename_dimension(t, context.length_dim.name, "memory_length")
      for t in chosen
    ]
    enc_dim = mtf.Dimension(
      "encoder_module_outputs", self.encoder_num_modules + 1
    )
    dec_dim = mtf.Dimension("decoder_module_inputs", self.decoder_num_modules)
    stacked = mtf.stack(chosen, enc_dim.name, axis=0)
    stddev = (
      1.0 if mtf.layers.unit_scaling_convention() else (enc_dim.size**-0.5)
    )
    w = mtf.get_variable(
      context.mesh,
      "w",
      mtf.Shape([enc_dim, dec_dim]),
      initializer=tf.compat.v1.random_normal_initializer(stddev=stddev),
      dtype=context.variable_dtype,
    )
    if self.dropout_rate and context.train:
      w = mtf.dropout(w, True, rate=self.dropout_rate)
    weights = mtf.softmax(w, enc_dim)
    mixed = mtf.einsum([stacked, weights], reduced_dims=[enc_dim])
    inputs = mtf.unstack(mixed, dec_dim)
    context.cache[key] = inputs
    return inputs
