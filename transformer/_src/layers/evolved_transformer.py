"""Layers of the Evolved Transformer (So, Liang and Le, 2019).

The Evolved Transformer (ET) replaces the first blocks of a transformer's
encoder and decoder cells with convolution branches and gated linear units.
Each of its new blocks is a TransformerLayer, so a LayerStack adds the
pre-norm, dropout and residual around it. A typical ET encoder cell is
[GatedLinearUnitLayer, EncoderConvolutionalLayer, SelfAttention,
DenseReluDense] and a decoder cell [DecoderAttentionLayer,
DecoderConvolutionalLayer, SelfAttention, EncDecAttention,
DenseReluDense(activation="swish")].

Layers:
  GatedLinearUnitLayer       (x W_0 + b_0) * sigmoid(x W_1 + b_1).
  EncoderConvolutionalLayer  relu 1x1 branch (4 d_model) + relu 3x1 conv
                             branch (d_model / 2), layer norm, separable
                             9x1 conv (d_model / 2), zero-padded to d_model.
  DecoderConvolutionalLayer  separable 11x1 relu branch (2 d_model) + 7x1
                             branch (d_model / 2), layer norm, separable
                             7x1 conv (d_model); all causal, so it decodes
                             incrementally.
  DecoderAttentionLayer      self-attention (2 x base heads) + attention to
                             the encoder output (base heads), summed.
Narrow branch outputs are zero-padded to the width of the wide branch before
the two are added. The convolutions do not stop at packed-sequence
boundaries.
"""

from __future__ import annotations

import gin
import tensorflow as tf

import mesh_tensorflow as mtf
from transformer._src.layers.context import Context
from transformer._src.layers.context import TransformerLayer
from transformer._src.layers.conv_layers import Conv1DLayer
from transformer._src.layers.conv_layers import SeparableConv1DLayer
from transformer._src.layers.enc_dec_attention import EncDecAttention
from transformer._src.layers.self_attention import SelfAttention

__all__ = [
  "DecoderAttentionLayer",
  "DecoderConvolutionalLayer",
  "EncoderConvolutionalLayer",
  "GatedLinearUnitLayer",
]

_GIN_MODULE = "mesh_tensorflow.transformer.evolved_transformer"
tf1 = tf.compat.v1


def _pad_channels_dim(x: mtf.Tensor, size: int) -> mtf.Tensor:
  """Zero-pads x's last (channel) dimension at its end to `size`."""
  channels = x.shape.dims[-1]
  if channels.size > size:
    raise ValueError(
      "Cannot pad to size of %d when the original size of %d "
      "is bigger" % (size, channels.size)
    )
  if channels.size == size:
    return x
  return mtf.pad(x, [0, size - channels.size], channels.name)


def _dropout(x: mtf.Tensor, context: Context, rate: float) -> mtf.Tensor:
  """Training-time dropout, the mask shared along the length dimension."""
  if not context.train or rate <= 0:
    return x
  return mtf.dropout(
    x,
    context.train,
    rate=rate,
    noise_shape=mtf.Shape(context.batch_dims + x.shape.dims[-1:]),
  )


@gin.configurable(module=_GIN_MODULE)
class GatedLinearUnitLayer(TransformerLayer):
  """Gated linear unit: (x W_0 + b_0) * sigmoid(x W_1 + b_1).

  Variables `glu_{0,1}/{kernel,bias}` ([ensemble..., d_model, d_model]).

  Example (in a one-layer language model):
    >>> from transformer import transformer
    >>> stack = transformer.make_layer_stack(
    ...     [GatedLinearUnitLayer], num_layers=1)
    >>> lm = transformer.Unitransformer(
    ...     stack, d_model=8, input_vocab_size=16, output_vocab_size=16,
    ...     autoregressive=True, max_length=4, vocab_divisor=1)
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> ids = converter.convert_np_array_to_mtf_tensor(
    ...     [[3, 5, 7, 1]], ["batch", "length"])
    >>> logits, _ = lm.call_simple(ids, ids, compute_loss=False)
    >>> converter.convert_mtf_tensor_to_np_array(logits).shape
    (1, 4, 16)
    >>> prefix = "transformer/block_000/layer_000/GatedLinearUnitLayer/"
    >>> for v in converter.graph.all_variables:  # the layer's variables
    ...   if v.name.startswith(prefix):
    ...     print(v.name[len(prefix):], v.shape)
    glu_0/kernel Shape[_d_model=8, d_model=8]
    glu_0/bias Shape[d_model=8]
    glu_1/kernel Shape[_d_model=8, d_model=8]
    glu_1/bias Shape[d_model=8]
  """

  def call(self, context: Context, x: mtf.Tensor, losses=None) -> mtf.Tensor:
    """Runs the layer on x [..., d_model]."""
    del losses
    return mtf.layers.dense_product(
      x,
      reduced_dims=x.shape.dims[-1:],
      new_dims=x.shape.dims[-1:],
      activation_functions=["linear", "sigmoid"],
      variable_dtype=context.variable_dtype,
      name="glu",
      expert_dims=context.model.ensemble_dims,
    )


@gin.configurable(module=_GIN_MODULE)
class EncoderConvolutionalLayer(TransformerLayer):
  """The ET encoder cell's convolution block.

  h = dropout(relu(x W)) [4 d_model]
      + pad(dropout(Conv1DLayer(3, d_model / 2, relu)(x)));
  y = pad(dropout(SeparableConv1DLayer(-4, 4, d_model / 2)(layer_norm(h))))
  to d_model. Variables `conv1x1/dense/kernel`, `conv3x1/conv2d/kernel`,
  `layer_prepostprocess/layer_norm/layer_norm_{scale,bias}` and
  `sep_conv9x1/separable_conv1d/...`.

  Example (in a one-layer model; d_model must match the model's):
    >>> from transformer import transformer
    >>> stack = transformer.make_layer_stack(
    ...     [(EncoderConvolutionalLayer,
    ...       {"d_model": 8, "dropout_rate": 0.1})], num_layers=1)
    >>> lm = transformer.Unitransformer(
    ...     stack, d_model=8, input_vocab_size=16, output_vocab_size=16,
    ...     autoregressive=True, max_length=4, vocab_divisor=1)
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> ids = converter.convert_np_array_to_mtf_tensor(
    ...     [[3, 5, 7, 1]], ["batch", "length"])
    >>> logits, _ = lm.call_simple(ids, ids, compute_loss=False)
    >>> converter.convert_mtf_tensor_to_np_array(logits).shape
    (1, 4, 16)
    >>> prefix = "transformer/block_000/layer_000/EncoderConvolutionalLayer/"
    >>> for v in converter.graph.all_variables:  # the layer's variables
    ...   if v.name.startswith(prefix) and "depthwise_conv_hack" not in v.name:
    ...     print(v.name[len(prefix):], [d.size for d in v.shape.dims])
    conv1x1/dense/kernel [8, 32]
    conv3x1/conv2d/kernel [1, 3, 8, 4]
    layer_prepostprocess/layer_norm/layer_norm_scale [32]
    layer_prepostprocess/layer_norm/layer_norm_bias [32]
    sep_conv9x1/separable_conv1d/pointwise_dense/kernel [32, 4]
    sep_conv9x1/separable_conv1d/pointwise_dense/bias [4]
  """

  def __init__(
    self,
    d_model: int,
    dropout_rate: float,
    initializer_scale: float = 1.0,
    norm_epsilon: float = 1e-6,
  ):
    """Creates the layer.

    Args:
      d_model: the model dimension's size.
      dropout_rate: training dropout on the branches and the output.
      initializer_scale: scale of the separable filters' initializers.
      norm_epsilon: epsilon of the layer norm.
    """
    self._dropout_rate = dropout_rate
    self._norm_epsilon = norm_epsilon
    self._conv3x1 = Conv1DLayer(
      filter_size=3, output_size=int(d_model / 2), activation="relu"
    )
    self._sep_conv9x1 = SeparableConv1DLayer(
      min_relative_pos=-4,
      max_relative_pos=4,
      output_size=int(d_model / 2),
      depthwise_filter_initializer_scale=initializer_scale,
      pointwise_filter_initializer_scale=initializer_scale,
    )

  def call(self, context: Context, x: mtf.Tensor, losses=None) -> mtf.Tensor:
    """Runs the block on x [batch..., length, d_model]."""
    model_dim = context.model.model_dim
    hidden_dim = mtf.Dimension(model_dim.name, 4 * model_dim.size)
    with tf1.variable_scope("conv1x1"):
      left = mtf.layers.dense(
        x,
        reduced_dims=x.shape.dims[-1:],
        new_dims=[hidden_dim],
        activation=mtf.relu,
        use_bias=False,
        variable_dtype=context.variable_dtype,
        name="dense",
      )
      left = _dropout(left, context, self._dropout_rate)
    with tf1.variable_scope("conv3x1"):
      right = self._conv3x1.call(context, x, losses)
      right = _dropout(right, context, self._dropout_rate)
      right = _pad_channels_dim(right, hidden_dim.size)
    hidden = mtf.layers.layer_norm(
      left + right, left.shape.dims[-1], epsilon=self._norm_epsilon
    )
    with tf1.variable_scope("sep_conv9x1"):
      output = self._sep_conv9x1.call(context, hidden, losses)
      output = _dropout(output, context, self._dropout_rate)
      return _pad_channels_dim(output, model_dim.size)


@gin.configurable(module=_GIN_MODULE)
class DecoderAttentionLayer(TransformerLayer):
  """Self-attention (2 x base heads) plus encoder-decoder attention, summed.

  Variables under `self_attention/` and `enc_dec_attention/` (those of
  SelfAttention / EncDecAttention, default sizes otherwise).
  """

  def __init__(self, base_num_heads: int):
    """Creates the layer.

    Args:
      base_num_heads: heads of the encoder-decoder attention (the
        self-attention has twice as many).
    """
    self._self_attention = SelfAttention(num_heads=2 * base_num_heads)
    self._enc_dec_attention = EncDecAttention(num_heads=base_num_heads)

  def call(self, context: Context, x: mtf.Tensor, losses=None) -> mtf.Tensor:
    """Runs both attentions on x and sums them."""
    with tf1.variable_scope("self_attention"):
      left = self._self_attention.call(context, x, losses)
    with tf1.variable_scope("enc_dec_attention"):
      right = self._enc_dec_attention.call(context, x, losses)
    return left + right


@gin.configurable(module=_GIN_MODULE)
class DecoderConvolutionalLayer(TransformerLayer):
  """The ET decoder cell's convolution block (causal).

  h = dropout(SeparableConv1DLayer(-10, 0, 2 d_model, relu)(x))
      + pad(dropout(SeparableConv1DLayer(-6, 0, d_model / 2)(x)));
  y = dropout(SeparableConv1DLayer(-6, 0, d_model)(layer_norm(h))).
  Variables under `sep_conv11x1/`, `sep_conv7x1_1/`, `sep_conv7x1_2/` and
  `layer_prepostprocess/layer_norm/`. Decodes incrementally (one state
  per convolution).

  Example (in a one-layer language model):
    >>> from transformer import transformer
    >>> stack = transformer.make_layer_stack(
    ...     [(DecoderConvolutionalLayer,
    ...       {"d_model": 8, "dropout_rate": 0.1})], num_layers=1)
    >>> lm = transformer.Unitransformer(
    ...     stack, d_model=8, input_vocab_size=16, output_vocab_size=16,
    ...     autoregressive=True, max_length=4, vocab_divisor=1)
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> ids = converter.convert_np_array_to_mtf_tensor(
    ...     [[3, 5, 7, 1]], ["batch", "length"])
    >>> logits, _ = lm.call_simple(ids, ids, compute_loss=False)
    >>> converter.convert_mtf_tensor_to_np_array(logits).shape
    (1, 4, 16)
    >>> prefix = "transformer/block_000/layer_000/DecoderConvolutionalLayer/"
    >>> for v in converter.graph.all_variables:  # the layer's variables
    ...   if v.name.startswith(prefix) and "depthwise_conv_hack" not in v.name:
    ...     print(v.name[len(prefix):], [d.size for d in v.shape.dims])
    sep_conv11x1/separable_conv1d/pointwise_dense/kernel [8, 16]
    sep_conv11x1/separable_conv1d/pointwise_dense/bias [16]
    sep_conv7x1_1/separable_conv1d/pointwise_dense/kernel [8, 4]
    sep_conv7x1_1/separable_conv1d/pointwise_dense/bias [4]
    layer_prepostprocess/layer_norm/layer_norm_scale [16]
    layer_prepostprocess/layer_norm/layer_norm_bias [16]
    sep_conv7x1_2/separable_conv1d/pointwise_dense/kernel [16, 8]
    sep_conv7x1_2/separable_conv1d/pointwise_dense/bias [8]
  """

  def __init__(
    self,
    d_model: int,
    dropout_rate: float,
    initializer_scale: float = 1.0,
    norm_epsilon: float = 1e-6,
  ):
    """Creates the layer.

    Args:
      d_model: the model dimension's size.
      dropout_rate: training dropout on the branches and the output.
      initializer_scale: scale of the separable filters' initializers.
      norm_epsilon: epsilon of the layer norm.
    """
    self._d_model = d_model
    self._dropout_rate = dropout_rate
    self._norm_epsilon = norm_epsilon

    def separable(lo, output_size, activation="linear"):
      return SeparableConv1DLayer(
        min_relative_pos=lo,
        max_relative_pos=0,
        output_size=output_size,
        depthwise_filter_initializer_scale=initializer_scale,
        pointwise_filter_initializer_scale=initializer_scale,
        activation=activation,
      )

    self._sep_conv11x1 = separable(-10, int(2 * d_model), "relu")
    self._sep_conv7x1_1 = separable(-6, int(d_model / 2))
    self._sep_conv7x1_2 = separable(-6, d_model)

  def call(self, context: Context, x: mtf.Tensor, losses=None) -> mtf.Tensor:
    """Runs the block on x ([batch..., d_model] when decoding)."""
    with tf1.variable_scope("sep_conv11x1"):
      left = self._sep_conv11x1.call(context, x, losses)
      left = _dropout(left, context, self._dropout_rate)
    with tf1.variable_scope("sep_conv7x1_1"):
      right = self._sep_conv7x1_1.call(context, x, losses)
      right = _dropout(right, context, self._dropout_rate)
      right = _pad_channels_dim(right, left.shape.dims[-1].size)
    hidden = mtf.layers.layer_norm(
      left + right, left.shape.dims[-1], epsilon=self._norm_epsilon
    )
    with tf1.variable_scope("sep_conv7x1_2"):
      output = self._sep_conv7x1_2.call(context, hidden, losses)
      return _dropout(output, context, self._dropout_rate)
