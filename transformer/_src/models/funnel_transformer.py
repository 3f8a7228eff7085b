"""Funnel-Transformer (Dai et al. 2020): a layer stack whose length shrinks.

`FunnelTransformerLayerStack` runs its layers in `n_blocks` blocks; before
every block but the first the sequence is pooled (windows of `pooling_size`
along "length", by mean or max), so block b sees length
L / pooling_size**b. When the first layer of a pooled block is a plain
`SelfAttention`, only its queries (and the residual) are pooled: it attends
from the pooled positions to the unpooled keys and values of the previous
block ("pool-query-only"), which is what shrinks the length. Other first
layers see an input pooled as a whole.

Within block b the first block_param_size[b] layers of the block (each
made of n_submodules TransformerLayers, e.g. SelfAttention +
DenseReluDense) are applied block_repeat_size[b] times with shared weights
(e.g. "B6-3x2-3x2": block_param_size [6, 3, 3], block_repeat_size [1, 2, 2]).

`BitransformerFunnel` is a Bitransformer whose encoder may pool: the
encoder output keeps the pooled length and the decoder attends to it, with
the encoder's sequence ids pooled (max) to match.

Pooling mixes neighbouring positions, so funnel stacks are for
non-autoregressive towers (encoders) in full-sequence modes.

Example (gin):
  encoder/make_layer_stack.layer_stack_cls = @FunnelTransformerLayerStack
  encoder/make_layer_stack.layers = [@SelfAttention, @DenseReluDense]
  encoder/make_layer_stack.num_layers = 6        # sum(block_param_size)
  FunnelTransformerLayerStack.n_blocks = 3
  FunnelTransformerLayerStack.block_param_size = [2, 2, 2]
  FunnelTransformerLayerStack.block_repeat_size = [1, 1, 1]
  make_bitransformer.bitransformer_cls = @BitransformerFunnel
"""

from __future__ import annotations

import copy
import functools
from typing import Optional, Sequence

import gin
import tensorflow as tf

import mesh_tensorflow as mtf
from transformer._src.layers import attention_core
from transformer._src.layers.attention_layers import SelfAttention
from transformer._src.models.bitransformer import Bitransformer
from transformer._src.layers.context import Context, ModeKeys, TransformerLayer
from transformer._src.models.layer_stack import LayerStack
from transformer._src.models.layer_stack import sublayer_mask_padding

__all__ = ["BitransformerFunnel", "FunnelTransformerLayerStack"]

_GIN_MODULE = "mesh_tensorflow.transformer.funnel_transformer"
_POOLING_FNS = {"mean": mtf.reduce_mean, "max": mtf.reduce_max}

tf1 = tf.compat.v1


def _check_int_list(name: str, value, n_blocks: int) -> list:
  if value is gin.REQUIRED:
    raise ValueError("FunnelTransformerLayerStack: parameter %r is required"
                     % name)
  value = list(value)
  if len(value) != n_blocks or any(
      not isinstance(v, int) or isinstance(v, bool) or v < 1 for v in value):
    raise ValueError("FunnelTransformerLayerStack: %s must be %d positive "
                     "ints (one per block), got %r" % (name, n_blocks, value))
  return value


def _pool_ids(ids, length_dim: mtf.Dimension, pool_size: int):
  """Max-pooled packed-sequence ids: a window is padding only if all of it is."""
  if not isinstance(ids, mtf.Tensor) or length_dim not in ids.shape.dims:
    return ids
  return mtf.pool_tensor_1d(ids, length_dim, mtf.reduce_max, pool_size)


@gin.configurable(module=_GIN_MODULE)
class FunnelTransformerLayerStack(LayerStack):
  """A LayerStack that pools the length between blocks (Funnel-Transformer).

  Variables are those of the layers (`<layer name>/<ClassName>/...`) and of
  the sublayers, exactly as in LayerStack; pooling has no parameters.
  After `call`, the context's length_dim, sequence_id, subsequence_id,
  position and inputs describe the pooled sequence (the stack's output).

  Example:
    stack = make_layer_stack([SelfAttention, DenseReluDense], num_layers=4,
                             layer_stack_cls=functools.partial(
                                 FunnelTransformerLayerStack, n_blocks=2,
                                 block_param_size=[2, 2],
                                 block_repeat_size=[1, 1]))
    y = stack.call(context, x)   # x [batch, 8, d_model] -> y [batch, 4, ...]
  """

  def __init__(self, layers: Sequence[TransformerLayer],
               n_blocks: int = gin.REQUIRED,
               block_param_size: Sequence[int] = gin.REQUIRED,
               block_repeat_size: Sequence[int] = gin.REQUIRED,
               pooling_size: int = 2, sublayers_initial=None,
               sublayers_per_layer=None, sublayers_final=None,
               pooling_type: str = "mean", n_submodules: int = 2):
    """Creates the stack.

    Args:
      layers: sum(block_param_size) * n_submodules TransformerLayers, in
        order (e.g. from make_layer_stack with
        num_layers=sum(block_param_size)).
      n_blocks: number of blocks; the length is pooled n_blocks - 1 times.
      block_param_size: per block, the number of (multi-submodule) layers
        with their own weights.
      block_repeat_size: per block, how often its layers are applied.
      pooling_size: the pooling window (and stride) along "length".
      sublayers_initial, sublayers_per_layer, sublayers_final: as in
        LayerStack.
      pooling_type: "mean" or "max".
      n_submodules: TransformerLayers per layer (2: attention + feed-forward).

    Raises:
      ValueError: naming the parameter, for inconsistent sizes or an unknown
        pooling_type.
    """
    super().__init__(layers, sublayers_initial=sublayers_initial,
                     sublayers_per_layer=sublayers_per_layer,
                     sublayers_final=sublayers_final)
    if n_blocks is gin.REQUIRED:
      raise ValueError("FunnelTransformerLayerStack: parameter 'n_blocks' is "
                       "required")
    if not isinstance(n_blocks, int) or n_blocks < 1:
      raise ValueError("FunnelTransformerLayerStack: n_blocks must be a "
                       "positive int, got %r" % (n_blocks,))
    self.n_blocks = n_blocks
    self.block_param_size = _check_int_list("block_param_size",
                                            block_param_size, n_blocks)
    self.block_repeat_size = _check_int_list("block_repeat_size",
                                             block_repeat_size, n_blocks)
    if not isinstance(pooling_size, int) or pooling_size < 1:
      raise ValueError("FunnelTransformerLayerStack: pooling_size must be a "
                       "positive int, got %r" % (pooling_size,))
    self.pooling_size = pooling_size
    if pooling_type not in _POOLING_FNS:
      raise ValueError("FunnelTransformerLayerStack: unknown pooling_type %r; "
                       "expected one of %s"
                       % (pooling_type, sorted(_POOLING_FNS)))
    self.pooling_type = pooling_type
    if not isinstance(n_submodules, int) or n_submodules < 1:
      raise ValueError("FunnelTransformerLayerStack: n_submodules must be a "
                       "positive int, got %r" % (n_submodules,))
    self.n_submodules = n_submodules
    expected = sum(self.block_param_size) * n_submodules
    if len(self._layers) != expected:
      raise ValueError(
          "FunnelTransformerLayerStack: got %d layers but block_param_size %s "
          "with n_submodules=%d needs %d"
          % (len(self._layers), self.block_param_size, n_submodules,
             expected))

  @property
  def pooling_fn(self):
    """The reduction of pooling_type (mtf.reduce_mean or mtf.reduce_max)."""
    return _POOLING_FNS[self.pooling_type]

  @property
  def total_pooling_size(self) -> int:
    """How much shorter the output is than the input."""
    return self.pooling_size ** (self.n_blocks - 1)

  def pool(self, x: mtf.Tensor, length_dim: mtf.Dimension) -> mtf.Tensor:
    """x pooled (pooling_type) in windows of pooling_size along length_dim.

    Args:
      x: a tensor with `length_dim` (e.g. [batch..., length, d_model]).
      length_dim: the Dimension pooled.

    Returns:
      x with length_dim shrunk by a factor of pooling_size.
    """
    return mtf.pool_tensor_1d(x, length_dim, self.pooling_fn,
                              self.pooling_size)

  def _pool_context(self, context: Context) -> None:
    """Switches context to the pooled sequence (positions: window starts)."""
    length_dim = context.length_dim
    position = context.get_position()
    if length_dim in position.shape.dims:
      position = mtf.stride_tensor_1d(position, length_dim, self.pooling_size)
    context.position = position
    context.position_is_default = False
    context.sequence_id = _pool_ids(context.sequence_id, length_dim,
                                    self.pooling_size)
    context.subsequence_id = _pool_ids(context.subsequence_id, length_dim,
                                       self.pooling_size)
    if (isinstance(context.inputs, mtf.Tensor) and
        length_dim in context.inputs.shape.dims):
      context.inputs = mtf.stride_tensor_1d(context.inputs, length_dim,
                                            self.pooling_size)
    context.length_dim = mtf.Dimension(length_dim.name,
                                       length_dim.size // self.pooling_size)

  def _check_poolable(self, context: Context, x: mtf.Tensor) -> None:
    length_dim = context.length_dim
    if length_dim not in x.shape.dims:
      raise ValueError("FunnelTransformerLayerStack: the input %s lacks the "
                       "length dimension %s" % (x.shape.to_string, length_dim))
    if length_dim.size % self.pooling_size:
      raise ValueError(
          "FunnelTransformerLayerStack: dimension %s does not divide into "
          "pools of size %d" % (length_dim, self.pooling_size))

  def _pooled_query_attention(self, layer: SelfAttention, context: Context,
                              x: mtf.Tensor) -> mtf.Tensor:
    """layer's attention from pooled queries to unpooled keys and values.

    Called in place of layer.call by sublayer_call_layer (same variable
    scope and names); switches context to the pooled sequence, including
    the residual input.
    """
    memory = layer.rename_length_to_memory_length(x, context)
    memory_dim = memory.shape.get_dim_by_name("memory_length")
    memory_position = layer.rename_length_to_memory_length(
        context.get_position(), context)
    sequence_id = context.subsequence_id
    if not isinstance(sequence_id, mtf.Tensor):
      sequence_id = context.sequence_id
    memory_sequence_id = None
    if (isinstance(sequence_id, mtf.Tensor) and
        context.length_dim in sequence_id.shape.dims):
      memory_sequence_id = layer.rename_length_to_memory_length(sequence_id,
                                                                context)
    length_dim = context.length_dim
    query_input = self.pool(x, length_dim)
    context.current_layer_input = self.pool(context.current_layer_input,
                                            length_dim)
    self._pool_context(context)

    params = layer.make_params(context)
    q = params.compute_q(query_input)
    if layer.shared_kv:
      k = v = params.compute_kv(memory)
    else:
      k, v = params.compute_k(memory), params.compute_v(memory)
    # Packed-sequence masking is done below (query and memory lengths
    # differ); the layer adds relative-position and window biases.
    bias_context = copy.copy(context)
    bias_context.sequence_id = None
    bias_context.subsequence_id = None
    biases = []
    bias = layer.compute_bias(bias_context, memory_position, query_input,
                              params.query_heads_dims, q)
    if bias is not None:
      biases.append(bias)
    if memory_sequence_id is not None:
      query_sequence_id = context.subsequence_id
      if not isinstance(query_sequence_id, mtf.Tensor):
        query_sequence_id = context.sequence_id
      biases.append(attention_core.visibility_mask_to_attention_bias(
          mtf.equal(query_sequence_id, memory_sequence_id),
          context.activation_dtype))
    bias = (None if not biases else
            biases[0] if len(biases) == 1 else mtf.add_n(biases))
    o = layer.attention_fn(
        q, k, v, context=context, memory_length_dim=memory_dim,
        key_dim=layer.kv_dim, value_dim=layer.kv_dim, bias=bias,
        **layer.attention_kwargs_from_context(context))
    output = params.compute_output(
        o, output_shape=layer.expected_attention_output_shape(query_input,
                                                              params))
    return layer.layer_output_from_attention_output(context, output, None)

  def _pooling_layer_fn(self, x: mtf.Tensor, layer: TransformerLayer,
                        context: Context) -> mtf.Tensor:
    """The first layer of a pooled block: returns a pooled output."""
    self._check_poolable(context, x)
    length_dim = context.length_dim
    if type(layer).call is SelfAttention.call:
      # A shallow copy whose call pools the queries; the class name (and so
      # the variable scope) stays the layer's.
      proxy = copy.copy(layer)
      proxy.call = functools.partial(self._pooled_query_attention, layer)
      context.current_layer = proxy
      context.current_layer_input = x
      y = self._call_sublayers(self._sublayers_per_layer, x, context)
      if context.length_dim == length_dim:
        raise ValueError(
            "FunnelTransformerLayerStack: sublayers_per_layer never called "
            "layer %s (sublayer_call_layer), so nothing was pooled"
            % layer.name)
    else:
      x = self.pool(x, length_dim)
      self._pool_context(context)
      context.current_layer = layer
      context.current_layer_input = x
      y = self._call_sublayers(self._sublayers_per_layer, x, context)
    expected = mtf.Shape([context.length_dim if d == length_dim else d
                          for d in x.shape.dims])
    if y.shape != expected:
      raise ValueError(
          "layer %s (%s) returned shape %s; the pooled shape is %s"
          % (layer.name, type(layer).__name__, y.shape.to_string,
             expected.to_string))
    return y

  def call(self, context: Context, x: mtf.Tensor) -> mtf.Tensor:
    """Runs the blocks, pooling before every block but the first.

    Raises:
      ValueError: in decoding modes or with causal attention (pooling mixes
        positions), or if the length does not divide into pools.
    """
    if context.mode in ("first_part", "incremental"):
      raise ValueError("FunnelTransformerLayerStack does not support mode %r "
                       "(pooling mixes positions; use it in encoders)"
                       % context.mode)
    if context.read_priority is not None or context.write_priority is not None:
      raise ValueError("FunnelTransformerLayerStack: causal attention "
                       "(context.read_priority) is not supported; pooling "
                       "mixes positions, so use it in non-autoregressive "
                       "towers")
    if self.n_blocks > 1 and context.length_dim.size % self.total_pooling_size:
      raise ValueError(
          "FunnelTransformerLayerStack: dimension %s does not divide into "
          "pools of size %d (pooling_size %d, %d blocks)"
          % (context.length_dim, self.total_pooling_size, self.pooling_size,
             self.n_blocks))
    x = self._call_sublayers(self._sublayers_initial, x, context)
    self._record(context, x)
    num_calls = sum(p * r for p, r in zip(self.block_param_size,
                                          self.block_repeat_size))
    num_calls *= self.n_submodules
    calls = 0
    start = 0
    for block in range(self.n_blocks):
      block_layers = self._layers[
          start * self.n_submodules:
          (start + self.block_param_size[block]) * self.n_submodules]
      start += self.block_param_size[block]
      for repeat in range(self.block_repeat_size[block]):
        for index, layer in enumerate(block_layers):
          with tf1.variable_scope(layer.name or ""):
            if block > 0 and repeat == 0 and index == 0:
              x = self._pooling_layer_fn(x, layer, context)
            else:
              x = self._layer_fn(x, layer, context)
          calls += 1
          if calls != num_calls:
            self._record(context, x)
          context.layer_index += 1
    x = self._call_sublayers(self._sublayers_final, x, context)
    x = sublayer_mask_padding(x, self, context)
    self._record(context, x)
    return x


def _pool_to_length(ids, length_dim: mtf.Dimension,
                    pooled_dim: mtf.Dimension, kind: str):
  """ids along length_dim reduced to pooled_dim (max pool or stride)."""
  if not isinstance(ids, mtf.Tensor) or pooled_dim.size == length_dim.size:
    return ids
  if length_dim.size % pooled_dim.size:
    raise ValueError("BitransformerFunnel: the encoder output length %s does "
                     "not divide the input length %s" % (pooled_dim,
                                                         length_dim))
  factor = length_dim.size // pooled_dim.size
  if kind == "max":
    return mtf.pool_tensor_1d(ids, length_dim, mtf.reduce_max, factor)
  return mtf.stride_tensor_1d(ids, length_dim, factor)


@gin.configurable(module=_GIN_MODULE)
class BitransformerFunnel(Bitransformer):
  """A Bitransformer whose encoder output may be shorter than its inputs.

  The encoder (typically with a FunnelTransformerLayerStack) returns the
  pooled length; the decoder attends to it ("memory_length" = pooled
  length) with the encoder sequence ids max-pooled to that length and the
  encoder ids strided (window starts) for layers that read them.
  """

  def _encode(self, inputs: mtf.Tensor, compute_loss: bool, mode,
              variable_dtype, encoder_sequence_id, encoder_position,
              num_microbatches: int):
    """(encoder output, its sequence ids, encoder ids, shared params,
    encoder layer outputs, encoder loss), all at the pooled length."""
    (encoder_output, encoder_sequence_id, shared_params,
     encoder_layer_outputs, encoder_loss) = self._run_encoder(
         inputs, compute_loss, mode, variable_dtype, encoder_sequence_id,
         encoder_position, num_microbatches)
    length_dim = inputs.shape.dims[-1]
    if length_dim.name not in encoder_output.shape.dimension_names:
      raise ValueError("BitransformerFunnel: the encoder output %s has no %r "
                       "dimension" % (encoder_output.shape.to_string,
                                      length_dim.name))
    pooled_dim = encoder_output.shape.get_dim_by_name(length_dim.name)
    encoder_sequence_id = _pool_to_length(encoder_sequence_id, length_dim,
                                          pooled_dim, "max")
    encoder_inputs = _pool_to_length(inputs, length_dim, pooled_dim, "stride")
    rename = mtf.layers.rename_length_to_memory_length
    encoder_output = rename(encoder_output, length_dim.name)
    if isinstance(encoder_sequence_id, mtf.Tensor):
      encoder_sequence_id = rename(encoder_sequence_id, length_dim.name)
    encoder_inputs = rename(encoder_inputs, length_dim.name)
    return (encoder_output, encoder_sequence_id, encoder_inputs,
            shared_params, encoder_layer_outputs, encoder_loss)

  @gin.configurable(module="BitransformerFunnel")
  def decode(self, inputs: mtf.Tensor,
             variable_dtype=mtf.VariableDType(tf.float32),
             beam_size: int = 1, alpha: float = 0.6, temperature=0.0,
             sampling_keep_top_k: int = -1,
             decode_length_multiplier: float = 1.5,
             decode_length_constant: int = 10,
             max_decode_length: Optional[int] = None) -> mtf.Tensor:
    """As Bitransformer.decode, with a pooled encoder output.

    Args:
      inputs: int input ids [batch..., length] (0: padding).
      variable_dtype: the mtf.VariableDType of the variables.
      beam_size: the number of beams (1: sampling or greedy decoding).
      alpha: the GNMT length-penalty exponent of beam search.
      temperature: sampling temperature (0.0: greedy argmax).
      sampling_keep_top_k: -1, or sample only among the k largest logits.
      decode_length_multiplier: with beams: decode at most max input length *
        this + decode_length_constant steps.
      decode_length_constant: see decode_length_multiplier.
      max_decode_length: the number of positions to decode (None: the inputs'
        length).

    Returns:
      int ids [batch..., length] of the decoded targets.
    """
    return self._decode_encoded(
        inputs, self._encode(inputs, False, ModeKeys.PREDICT, variable_dtype,
                             None, None, 1)[:5],
        variable_dtype, beam_size, alpha, temperature, sampling_keep_top_k,
        decode_length_multiplier, decode_length_constant, max_decode_length)
