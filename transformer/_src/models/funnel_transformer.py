"""Funnel-Transformer (Dai et al. 2020): a layer stack whose length shrinks.

`FunnelTransformerLayerStack` runs its layers in `n_blocks` blocks; in
every block but the first, the output of the block's first submodule (a
full-length layer, e.g. SelfAttention with its residual) is pooled (windows
of `pooling_size` along "length", by mean, max or min), so block b ends at
length L / pooling_size**b. The context then describes the pooled sequence:
positions 0..pooled_length-1 and each window's first sequence id.

Within block b each of the block_param_size[b] layers of the block (each
made of n_submodules TransformerLayers, e.g. SelfAttention +
DenseReluDense) is applied block_repeat_size[b] times in a row with shared
weights (e.g. "B6-3x2-3x2": block_param_size [6, 3, 3], block_repeat_size
[1, 2, 2]).

`BitransformerFunnel` is a Bitransformer whose encoder may pool: the
encoder output keeps the pooled length and the decoder attends to it, with
the encoder's sequence ids strided (each window's first id) to match.

Pooling mixes neighbouring positions, so funnel stacks are for
non-autoregressive towers (encoders) in full-sequence modes.

Example (gin; an encoder of 3 blocks pooling 8 positions down to 2):
  >>> from transformer import transformer
  >>> _ = gin.parse_config('''
  ... encoder/make_layer_stack.layer_stack_cls = @FunnelTransformerLayerStack
  ... encoder/make_layer_stack.layers = [@SelfAttention, @DenseReluDense]
  ... encoder/make_layer_stack.num_layers = 3  # sum(block_param_size)
  ... decoder/make_layer_stack.layers = [@SelfAttention, @EncDecAttention,
  ...                                    @DenseReluDense]
  ... decoder/make_layer_stack.num_layers = 1
  ... FunnelTransformerLayerStack.n_blocks = 3
  ... FunnelTransformerLayerStack.block_param_size = [1, 1, 1]
  ... FunnelTransformerLayerStack.block_repeat_size = [1, 1, 1]
  ... make_bitransformer.bitransformer_cls = @BitransformerFunnel
  ... Unitransformer.d_model = 8
  ... Unitransformer.max_length = 8
  ... Unitransformer.vocab_divisor = 1
  ... SelfAttention.num_heads = 2
  ... SelfAttention.key_value_size = 4
  ... DenseReluDense.hidden_size = 16
  ... ''')
  >>> model = transformer.make_bitransformer(input_vocab_size=16,
  ...                                        output_vocab_size=16)
  >>> gin.clear_config()
  >>> type(model).__name__, type(model.encoder.layer_stack).__name__
  ('BitransformerFunnel', 'FunnelTransformerLayerStack')
  >>> converter = mtf.test_utils.NumpyConverter()
  >>> inputs = converter.convert_np_array_to_mtf_tensor(
  ...     [[3, 5, 7, 9, 4, 4, 2, 1]], ["batch", "length"])
  >>> targets = converter.convert_np_array_to_mtf_tensor(
  ...     [[1, 2, 4, 4, 9, 7, 5, 3]], ["batch", "length"])
  >>> logits, loss = model.call_simple(inputs, targets, compute_loss=True)
  >>> converter.convert_mtf_tensor_to_np_array(logits).shape
  (1, 8, 16)

  The encoder alone (in a graph of its own) outputs 8 / 2 / 2 positions:
  >>> converter = mtf.test_utils.NumpyConverter()
  >>> inputs = converter.convert_np_array_to_mtf_tensor(
  ...     [[3, 5, 7, 9, 4, 4, 2, 1]], ["batch", "length"])
  >>> encoded, _ = model.encoder.call_simple(inputs, None, compute_loss=False)
  >>> encoded.shape
  Shape[batch=1, length=2, d_model=8]
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import gin
import tensorflow as tf

import mesh_tensorflow as mtf
from transformer._src.layers.context import Context
from transformer._src.layers.context import ModeKeys
from transformer._src.layers.context import TransformerLayer
from transformer._src.models.bitransformer import Bitransformer
from transformer._src.models.layer_stack import LayerStack
from transformer._src.models.layer_stack import sublayer_mask_padding

__all__ = ["BitransformerFunnel", "FunnelTransformerLayerStack"]

_GIN_MODULE = "mesh_tensorflow.transformer.funnel_transformer"
_POOLING_FNS = {
  "mean": mtf.reduce_mean,
  "max": mtf.reduce_max,
  "min": mtf.reduce_min,
}

tf1 = tf.compat.v1


def _check_int_list(name: str, value, n_blocks: int) -> list:
  if value is gin.REQUIRED:
    raise ValueError(
      "FunnelTransformerLayerStack: parameter %r is required" % name
    )
  value = list(value)
  if len(value) != n_blocks or any(
    not isinstance(v, int) or isinstance(v, bool) or v < 1 for v in value
  ):
    raise ValueError(
      "FunnelTransformerLayerStack: %s must be %d positive "
      "ints (one per block), got %r" % (name, n_blocks, value)
    )
  return value


@gin.configurable(module=_GIN_MODULE)
class FunnelTransformerLayerStack(LayerStack):
  """A LayerStack that pools the length between blocks (Funnel-Transformer).

  Variables are those of the layers and their sublayers under
  `funnel_block_<b>/param_idx_<j>/submodule_<s>/` (the stack renames its
  layers so; e.g. `.../submodule_000/SelfAttention/q`); pooling has no
  parameters.
  After `call`, the context's length_dim, sequence_id, subsequence_id,
  position and inputs describe the pooled sequence (the stack's output).

  Example (an encoder: 8 positions in, 4 out):
    >>> import functools
    >>> from transformer import transformer
    >>> from transformer.transformer_layers import DenseReluDense
    >>> from transformer.transformer_layers import SelfAttention
    >>> stack = transformer.make_layer_stack(
    ...     [(SelfAttention, {"num_heads": 2, "key_value_size": 4}),
    ...      (DenseReluDense, {"hidden_size": 16})], num_layers=2,
    ...     layer_stack_cls=functools.partial(
    ...         FunnelTransformerLayerStack, n_blocks=2,
    ...         block_param_size=[1, 1], block_repeat_size=[1, 1]))
    >>> encoder = transformer.Unitransformer(
    ...     stack, d_model=8, input_vocab_size=16, output_vocab_size=None,
    ...     autoregressive=False, max_length=8, vocab_divisor=1)
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> ids = converter.convert_np_array_to_mtf_tensor(
    ...     [[3, 5, 7, 1, 4, 4, 2, 1]], ["batch", "length"])
    >>> output, _ = encoder.call_simple(ids, None, compute_loss=False)
    >>> output.shape
    Shape[batch=1, length=4, d_model=8]
    >>> converter.convert_mtf_tensor_to_np_array(output).shape
    (1, 4, 8)
    >>> for v in converter.graph.all_variables:
    ...   if v.name.endswith("SelfAttention/q"):
    ...     print(v.name)
    transformer/funnel_block_000/param_idx_000/submodule_000/SelfAttention/q
    transformer/funnel_block_001/param_idx_000/submodule_000/SelfAttention/q
  """

  def __init__(
    self,
    layers: Sequence[TransformerLayer],
    n_blocks: int = gin.REQUIRED,
    block_param_size: Sequence[int] = gin.REQUIRED,
    block_repeat_size: Sequence[int] = gin.REQUIRED,
    pooling_size: int = 2,
    sublayers_initial=None,
    sublayers_per_layer=None,
    sublayers_final=None,
    pooling_type: str = "mean",
    n_submodules: int = 2,
  ):
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
      sublayers_initial: as in LayerStack (applied once before the layers).
      sublayers_per_layer: as in LayerStack (around each layer).
      sublayers_final: as in LayerStack (applied once after the layers).
      pooling_type: "mean", "max" or "min".
      n_submodules: TransformerLayers per layer (2: attention + feed-forward).

    Raises:
      ValueError: naming the parameter, for inconsistent sizes or an unknown
        pooling_type.
    """
    super().__init__(
      layers,
      sublayers_initial=sublayers_initial,
      sublayers_per_layer=sublayers_per_layer,
      sublayers_final=sublayers_final,
    )
    if n_blocks is gin.REQUIRED:
      raise ValueError(
        "FunnelTransformerLayerStack: parameter 'n_blocks' is required"
      )
    if not isinstance(n_blocks, int) or n_blocks < 1:
      raise ValueError(
        "FunnelTransformerLayerStack: n_blocks must be a "
        "positive int, got %r" % (n_blocks,)
      )
    self.n_blocks = n_blocks
    self.block_param_size = _check_int_list(
      "block_param_size", block_param_size, n_blocks
    )
    self.block_repeat_size = _check_int_list(
      "block_repeat_size", block_repeat_size, n_blocks
    )
    if not isinstance(pooling_size, int) or pooling_size < 1:
      raise ValueError(
        "FunnelTransformerLayerStack: pooling_size must be a "
        "positive int, got %r" % (pooling_size,)
      )
    self.pooling_size = pooling_size
    if pooling_type not in _POOLING_FNS:
      raise ValueError(
        "FunnelTransformerLayerStack: unknown pooling_type %r; "
        "expected one of %s" % (pooling_type, sorted(_POOLING_FNS))
      )
    self.pooling_type = pooling_type
    if not isinstance(n_submodules, int) or n_submodules < 1:
      raise ValueError(
        "FunnelTransformerLayerStack: n_submodules must be a "
        "positive int, got %r" % (n_submodules,)
      )
    self.n_submodules = n_submodules
    self._context = None
    expected = sum(self.block_param_size) * n_submodules
    if len(self._layers) != expected:
      raise ValueError(
        "FunnelTransformerLayerStack: got %d layers but block_param_size %s "
        "with n_submodules=%d needs %d"
        % (len(self._layers), self.block_param_size, n_submodules, expected)
      )

  @property
  def pooling_fn(self) -> Callable[..., Any]:
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
    return mtf.pool_tensor_1d(x, length_dim, self.pooling_fn, self.pooling_size)

  @property
  def context(self) -> Optional[Context]:
    """The context of the last call (its pooled length, ids, positions)."""
    return self._context

  def set_context(self, context: Context) -> None:
    """Remembers the context of the current call.

    Args:
      context: the Context of the call.
    """
    self._context = context

  def update_context(
    self, context: Context, x: mtf.Tensor, pool_dim_name: str
  ) -> None:
    """Switches context to the pooled sequence x.

    The positions become 0..pooled_length-1 (the first positions, so a
    pooled position counts windows), the sequence ids (and subsequence ids
    and inputs) keep each window's first entry and length_dim becomes x's
    pool_dim_name dimension.

    Args:
      context: the Context of the call.
      x: the activations [batch..., length, d_model].
      pool_dim_name: the name of the pooled length dimension.
    """
    length_dim = context.length_dim
    pooled_dim = x.shape.get_dim_by_name(pool_dim_name)
    context.position = mtf.slice(
      context.get_position(),
      begin=0,
      size=pooled_dim.size,
      slice_dim_name=pool_dim_name,
    )
    context.position_is_default = False
    for name in ("sequence_id", "subsequence_id", "inputs"):
      value = getattr(context, name)
      if isinstance(value, mtf.Tensor) and length_dim in value.shape.dims:
        setattr(
          context,
          name,
          mtf.stride_tensor_1d(value, length_dim, self.pooling_size),
        )
    context.length_dim = pooled_dim

  def call(self, context: Context, x: mtf.Tensor) -> mtf.Tensor:
    """Runs the blocks, pooling the output of each block's first submodule
    (all blocks but the first).

    Layer j of a block (its n_submodules TransformerLayers) is applied
    block_repeat_size times in a row, all under the variable scope
    funnel_block_<b>/param_idx_<j>/submodule_<s> (the layers are renamed
    to it), so the repeats share weights.

    Raises:
      ValueError: in decoding modes or with causal attention (pooling mixes
        positions), or if the length does not divide into pools.
    """
    if context.mode in ("first_part", "incremental"):
      raise ValueError(
        "FunnelTransformerLayerStack does not support mode %r "
        "(pooling mixes positions; use it in encoders)" % context.mode
      )
    if context.read_priority is not None or context.write_priority is not None:
      raise ValueError(
        "FunnelTransformerLayerStack: causal attention "
        "(context.read_priority) is not supported; pooling "
        "mixes positions, so use it in non-autoregressive "
        "towers"
      )
    if self.n_blocks > 1 and context.length_dim.size % self.total_pooling_size:
      raise ValueError(
        "FunnelTransformerLayerStack: dimension %s does not divide into "
        "pools of size %d (pooling_size %d, %d blocks)"
        % (
          context.length_dim,
          self.total_pooling_size,
          self.pooling_size,
          self.n_blocks,
        )
      )
    x = self._call_sublayers(self._sublayers_initial, x, context)
    self._record(context, x)
    num_calls = sum(
      p * r for p, r in zip(self.block_param_size, self.block_repeat_size)
    )
    num_calls *= self.n_submodules
    calls = 0
    start = 0
    for block in range(self.n_blocks):
      for param in range(self.block_param_size[block]):
        first = (start + param) * self.n_submodules
        for repeat in range(self.block_repeat_size[block]):
          for sub in range(self.n_submodules):
            layer = self._layers[first + sub]
            layer.set_name(
              "funnel_block_%03d/param_idx_%03d/submodule_%03d"
              % (block, param, sub)
            )
            with tf1.variable_scope(layer.name):
              x = self._layer_fn(x, layer, context)
            if block > 0 and param == 0 and repeat == 0 and sub == 0:
              x = self.pool(x, context.length_dim)
              self.update_context(context, x, context.length_dim.name)
            calls += 1
            if calls != num_calls:
              self._record(context, x)
            context.layer_index += 1
      start += self.block_param_size[block]
    x = self._call_sublayers(self._sublayers_final, x, context)
    x = sublayer_mask_padding(x, self, context)
    self._record(context, x)
    self.set_context(context)
    return x


def _pool_to_length(ids, length_dim: mtf.Dimension, pooled_dim: mtf.Dimension):
  """ids along length_dim strided to pooled_dim (each window's first id)."""
  if not isinstance(ids, mtf.Tensor) or pooled_dim.size == length_dim.size:
    return ids
  if length_dim.size % pooled_dim.size:
    raise ValueError(
      "BitransformerFunnel: the encoder output length %s does "
      "not divide the input length %s" % (pooled_dim, length_dim)
    )
  factor = length_dim.size // pooled_dim.size
  return mtf.stride_tensor_1d(ids, length_dim, factor)


@gin.configurable(module=_GIN_MODULE)
class BitransformerFunnel(Bitransformer):
  """A Bitransformer whose encoder output may be shorter than its inputs.

  The encoder (typically with a FunnelTransformerLayerStack) returns the
  pooled length; the decoder attends to it ("memory_length" = pooled
  length) with the encoder sequence ids and ids strided (each window's
  first entry) to that length.
  """

  def _encode(
    self,
    inputs: mtf.Tensor,
    compute_loss: bool,
    mode,
    variable_dtype,
    encoder_sequence_id,
    encoder_position,
    num_microbatches: int,
  ):
    """(encoder output, its sequence ids, encoder ids, shared params,
    encoder layer outputs, encoder loss), all at the pooled length.
    """
    (
      encoder_output,
      encoder_sequence_id,
      shared_params,
      encoder_layer_outputs,
      encoder_loss,
    ) = self._run_encoder(
      inputs,
      compute_loss,
      mode,
      variable_dtype,
      encoder_sequence_id,
      encoder_position,
      num_microbatches,
    )
    length_dim = inputs.shape.dims[-1]
    if length_dim.name not in encoder_output.shape.dimension_names:
      raise ValueError(
        "BitransformerFunnel: the encoder output %s has no %r "
        "dimension" % (encoder_output.shape.to_string, length_dim.name)
      )
    pooled_dim = encoder_output.shape.get_dim_by_name(length_dim.name)
    encoder_sequence_id = _pool_to_length(
      encoder_sequence_id, length_dim, pooled_dim
    )
    encoder_inputs = _pool_to_length(inputs, length_dim, pooled_dim)
    rename = mtf.layers.rename_length_to_memory_length
    encoder_output = rename(encoder_output, length_dim.name)
    if isinstance(encoder_sequence_id, mtf.Tensor):
      encoder_sequence_id = rename(encoder_sequence_id, length_dim.name)
    encoder_inputs = rename(encoder_inputs, length_dim.name)
    return (
      encoder_output,
      encoder_sequence_id,
      encoder_inputs,
      shared_params,
      encoder_layer_outputs,
      encoder_loss,
    )

  @gin.configurable(module="BitransformerFunnel")
  def decode(
    self,
    inputs: mtf.Tensor,
    variable_dtype=mtf.VariableDType(tf.float32),
    beam_size: int = 1,
    alpha: float = 0.6,
    temperature=0.0,
    sampling_keep_top_k: int = -1,
    decode_length_multiplier: float = 1.5,
    decode_length_constant: int = 10,
    max_decode_length: Optional[int] = None,
  ) -> mtf.Tensor:
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
      inputs,
      self._encode(
        inputs, False, ModeKeys.PREDICT, variable_dtype, None, None, 1
      )[:5],
      variable_dtype,
      beam_size,
      alpha,
      temperature,
      sampling_keep_top_k,
      decode_length_multiplier,
      decode_length_constant,
      max_decode_length,
    )
