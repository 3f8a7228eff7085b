"""Layers of the Evolved Transformer (So, Liang and Le, 2019).

The Evolved Transformer (ET) replaces the first blocks of a transformer's
encoder and decoder cells with convolution branches and gated linear units.
Here each of its new blocks is a TransformerLayer, so a LayerStack adds the
pre-norm, dropout and residual around it and `make_layer_stack` can mix them
with the standard layers. A typical ET encoder cell is
[GatedLinearUnitLayer, EncoderConvolutionalLayer, SelfAttention,
DenseReluDense] and a decoder cell [DecoderAttentionLayer,
DecoderConvolutionalLayer, SelfAttention, EncDecAttention,
DenseReluDense(activation="swish")].

Layers:
  GatedLinearUnitLayer       (x W_0) * sigmoid(x W_1); position-wise.
  EncoderConvolutionalLayer  wide 1x1 relu branch + narrow 3x1 relu conv,
                             layer norm, separable 9x1 conv (bidirectional:
                             encoders only, no incremental decoding).
  DecoderConvolutionalLayer  separable 11x1 relu (wide) + 7x1 (narrow)
                             causal convs, layer norm, separable 7x1 causal
                             conv; decodes incrementally.
  DecoderAttentionLayer      self-attention (2 x base heads) + attention to
                             the encoder output (base heads), summed;
                             decodes incrementally.

Narrow branch outputs are zero-padded to the width of the wide branch before
the two are added (as in the paper); the padding is an einsum with a 0/1
matrix, so the wide dimension ("d_ff") may be split over the mesh. Like the
original's convolution layers, the convolutions do not stop at packed
sequence boundaries.
"""

from __future__ import annotations

from typing import Optional

import gin
import tensorflow as tf

import mesh_tensorflow as mtf
from transformer._src.layers.attention_layers import EncDecAttention
from transformer._src.layers.attention_layers import SelfAttention
from transformer._src.layers.context import Context, TransformerLayer
from transformer._src.layers.conv_layers import Conv1D

__all__ = [
    "DecoderAttentionLayer",
    "DecoderConvolutionalLayer",
    "EncoderConvolutionalLayer",
    "GatedLinearUnitLayer",
]

_GIN_MODULE = "mesh_tensorflow.transformer.evolved_transformer"
tf1 = tf.compat.v1

# Name of the narrow (half-width) branch channel dimension; the wide branch
# uses "d_ff" so that layouts splitting the feed-forward dim split it too.
_NARROW = "d_half"
_WIDE = "d_ff"
_DECODING_MODES = ("first_part", "incremental")


def _ensemble_dims(context: Context):
  return list(getattr(context.model, "ensemble_dims", None) or [])


def _check_no_ensemble(context: Context, layer: str) -> None:
  if _ensemble_dims(context):
    raise ValueError("%s does not support ensembles (model ensemble dims %s)"
                     % (layer, _ensemble_dims(context)))


def _check_positive_int(value, what: str, layer: str) -> int:
  if not isinstance(value, int) or isinstance(value, bool) or value < 1:
    raise ValueError("%s: %s must be a positive int, got %r"
                     % (layer, what, value))
  return value


def _check_rate(rate, layer: str) -> float:
  if not 0.0 <= rate < 1.0:
    raise ValueError("%s: dropout_rate must be in [0, 1), got %r"
                     % (layer, rate))
  return rate


def _model_dim(x: mtf.Tensor, d_model: Optional[int],
               layer: str) -> mtf.Dimension:
  """The channel dim of x; d_model, when given, must be its size."""
  dim = x.shape.dims[-1]
  if d_model is not None and d_model != dim.size:
    raise ValueError("%s: d_model=%r but the input's last dimension is %s"
                     % (layer, d_model, dim))
  return dim


def _hidden_dims(model_dim: mtf.Dimension, ratio, layer: str):
  """(wide "d_ff" = ratio * d_model, narrow "d_half" = d_model // 2)."""
  wide = int(ratio * model_dim.size)
  narrow = model_dim.size // 2
  if narrow < 1 or wide < narrow:
    raise ValueError("%s: d_model %d with d_hidden_ratio %r gives a wide "
                     "branch of %d and a narrow one of %d channels; need "
                     "1 <= narrow <= wide"
                     % (layer, model_dim.size, ratio, wide, narrow))
  return mtf.Dimension(_WIDE, wide), mtf.Dimension(_NARROW, narrow)


def _pad_channels(x: mtf.Tensor, from_dim: mtf.Dimension,
                  to_dim: mtf.Dimension) -> mtf.Tensor:
  """Zero-pads channel dim from_dim (at the end) into to_dim.

  An einsum with the 0/1 matrix [from_dim, to_dim] (ones on the diagonal):
  unlike mtf.pad it works when to_dim is split over the mesh.
  """
  embed = mtf.one_hot(mtf.range(x.mesh, from_dim, tf.int32), to_dim,
                      dtype=x.dtype)
  return mtf.einsum([x, embed], output_shape=mtf.replace_dimensions(
      x.shape, from_dim, to_dim))


def _dropout(context: Context, x: mtf.Tensor, rate: float) -> mtf.Tensor:
  """Training-time dropout, the mask shared along the length dim."""
  if not context.train or rate <= 0.0:
    return x
  noise_shape = mtf.Shape([d for d in x.shape.dims
                           if d != context.length_dim])
  return mtf.dropout(x, True, rate=rate, noise_shape=noise_shape)


@gin.configurable(module=_GIN_MODULE)
class GatedLinearUnitLayer(TransformerLayer):
  """Gated linear unit: (x W_0) * sigmoid(x W_1), d_model -> d_model.

  The ET encoder cell's first block. Variables `glu_0/kernel` and
  `glu_1/kernel` [ensemble..., d_model, d_model]. Position-wise, so it works
  in every mode (incremental decoding included).

  Example:
    y = GatedLinearUnitLayer().call(context, x)  # x, y [batch, length, d]
  """

  def call(self, context: Context, x: mtf.Tensor,
           losses=None) -> mtf.Tensor:
    del losses
    model_dim = x.shape.dims[-1]
    return mtf.layers.dense_product(
        x, reduced_dims=[model_dim], new_dims=[model_dim],
        activation_functions=["linear", "sigmoid"], name="glu",
        use_bias=False, variable_dtype=context.variable_dtype,
        expert_dims=_ensemble_dims(context))


@gin.configurable(module=_GIN_MODULE)
class EncoderConvolutionalLayer(TransformerLayer):
  """The ET encoder cell's convolution block (bidirectional).

  h = relu(x W) [d_ff = d_hidden_ratio * d_model]
      + pad(relu(conv3x1(x)) [d_model / 2]);
  y = pad(sepconv_{l_sep_size}x1(layer_norm(h)) [d_model / 2]) to d_model.
  Convolutions are centred ("SAME"): a filter of size k sees relative
  positions -(k-1)//2 .. k//2. Variables: `conv_1x1/kernel` [d_model, d_ff],
  `conv_3x1/kernel` [fh=1, fw=3, d_model, d_half],
  `layer_norm/layer_norm/layer_norm_{scale,bias}` [d_ff] and
  `sep_conv_<l_sep_size>x1/...` (mtf.layers.separable_conv1d). Sees future
  positions, so modes "first_part"/"incremental" raise NotImplementedError.

  Example:
    y = EncoderConvolutionalLayer(dropout_rate=0.1).call(context, x)
  """

  def __init__(self, d_model: Optional[int] = None,
               dropout_rate: float = 0.0, d_hidden_ratio: float = 4,
               norm_epsilon: float = 1e-6, l_sep_size: int = 9):
    """Creates the layer.

    Args:
      d_model: the input/output size; None takes it from the input (when
        given it must match).
      dropout_rate: training dropout on both branches.
      d_hidden_ratio: the wide branch has d_hidden_ratio * d_model channels.
      norm_epsilon: epsilon of the layer norm between the convolutions.
      l_sep_size: filter size of the separable convolution.
    """
    self.d_model = d_model
    self.dropout_rate = dropout_rate
    self.d_hidden_ratio = d_hidden_ratio
    self.norm_epsilon = norm_epsilon
    self.l_sep_size = l_sep_size

  def call(self, context: Context, x: mtf.Tensor,
           losses=None) -> mtf.Tensor:
    del losses
    name = type(self).__name__
    if context.mode in _DECODING_MODES:
      raise NotImplementedError(
          "%s is bidirectional (its convolutions see later positions) and "
          "cannot decode incrementally (mode %r); use it in encoders only"
          % (name, context.mode))
    _check_no_ensemble(context, name)
    rate = _check_rate(self.dropout_rate, name)
    sep_size = _check_positive_int(self.l_sep_size, "l_sep_size", name)
    model_dim = _model_dim(x, self.d_model, name)
    wide, narrow = _hidden_dims(model_dim, self.d_hidden_ratio, name)
    left = mtf.layers.dense(
        x, new_dims=[wide], reduced_dims=[model_dim], use_bias=False,
        activation=mtf.relu, variable_dtype=context.variable_dtype,
        name="conv_1x1")
    right = mtf.layers.conv1d(
        x, narrow, filter_size=3, padding="SAME",
        filter_initializer=tf1.random_normal_initializer(
            stddev=(3 * model_dim.size) ** -0.5),
        variable_dtype=context.variable_dtype, name="conv_3x1")
    right = mtf.relu(right)
    h = (_dropout(context, left, rate) +
         _pad_channels(_dropout(context, right, rate), narrow, wide))
    h = mtf.layers.layer_norm(h, wide, epsilon=self.norm_epsilon,
                              name="layer_norm")
    y = mtf.layers.separable_conv1d(
        h, narrow, min_relative_pos=-((sep_size - 1) // 2),
        max_relative_pos=sep_size // 2, name="sep_conv_%dx1" % sep_size)
    return _pad_channels(y, narrow, model_dim)


@gin.configurable(module=_GIN_MODULE)
class DecoderConvolutionalLayer(Conv1D):
  """The ET decoder cell's convolution block (causal).

  h = relu(sepconv_{l_sep_size}x1(x)) [d_ff = d_hidden_ratio * d_model]
      + pad(sepconv_{r_sep_size}x1(x) [d_model / 2]);
  y = sepconv_{r_sep_size}x1(layer_norm(h)) [d_model].
  Every convolution is causal: a filter of size k at position t sees
  positions t-k+1 .. t (zeros before the sequence start). Variables
  `sep_conv_<l>x1/...`, `sep_conv_<r>x1_1/...` (first layer),
  `layer_norm/layer_norm/layer_norm_{scale,bias}` [d_ff] and
  `sep_conv_<r>x1_2/...`. Incremental decoding keeps two windows (Conv1D
  protocol): the last max(l, r) inputs and the last r normalized hidden
  values, so the decoded outputs equal the full forward pass.

  Example:
    y = DecoderConvolutionalLayer(dropout_rate=0.1).call(context, x)
  """

  def __init__(self, d_model: Optional[int] = None,
               dropout_rate: float = 0.0, d_hidden_ratio: float = 2,
               norm_epsilon: float = 1e-6, l_sep_size: int = 11,
               r_sep_size: int = 7):
    """Creates the layer.

    Args:
      d_model: the input/output size; None takes it from the input (when
        given it must match).
      dropout_rate: training dropout on both branches.
      d_hidden_ratio: the wide branch has d_hidden_ratio * d_model channels.
      norm_epsilon: epsilon of the layer norm between the convolutions.
      l_sep_size: filter size of the wide (left) separable convolution.
      r_sep_size: filter size of the narrow (right) and the final separable
        convolutions.
    """
    self.d_model = d_model
    self.dropout_rate = dropout_rate
    self.d_hidden_ratio = d_hidden_ratio
    self.norm_epsilon = norm_epsilon
    self.l_sep_size = l_sep_size
    self.r_sep_size = r_sep_size

  def _causal_conv(self, context: Context, x: mtf.Tensor,
                   output_dim: mtf.Dimension, size: int,
                   name: str) -> mtf.Tensor:
    """Causal separable conv of x [..., length, c]; at the newest window
    slot only when decoding incrementally."""
    y = mtf.layers.separable_conv1d(x, output_dim, min_relative_pos=1 - size,
                                    max_relative_pos=0, name=name)
    if context.mode == "incremental":
      window = y.shape.dims[-2]
      last = mtf.mtf_slice(y, window.size - 1, 1, window.name)
      y = mtf.reduce_sum(last, reduced_dim=last.shape.dims[-2])
    return y

  def call(self, context: Context, x: mtf.Tensor,
           losses=None) -> mtf.Tensor:
    del losses
    name = type(self).__name__
    _check_no_ensemble(context, name)
    rate = _check_rate(self.dropout_rate, name)
    l_size = _check_positive_int(self.l_sep_size, "l_sep_size", name)
    r_size = _check_positive_int(self.r_sep_size, "r_sep_size", name)
    model_dim = _model_dim(x, self.d_model, name)
    wide, narrow = _hidden_dims(model_dim, self.d_hidden_ratio, name)
    # Both first convolutions read x: one window of the larger size.
    x_in = self._window_input(context, x, max(l_size, r_size))
    left = mtf.relu(self._causal_conv(context, x_in, wide, l_size,
                                      "sep_conv_%dx1" % l_size))
    right = self._causal_conv(context, x_in, narrow, r_size,
                              "sep_conv_%dx1_1" % r_size)
    h = (_dropout(context, left, rate) +
         _pad_channels(_dropout(context, right, rate), narrow, wide))
    h = mtf.layers.layer_norm(h, wide, epsilon=self.norm_epsilon,
                              name="layer_norm")
    h_in = self._window_input(context, h, r_size)
    return self._causal_conv(context, h_in, model_dim, r_size,
                             "sep_conv_%dx1_2" % r_size)


@gin.configurable(module=_GIN_MODULE)
class DecoderAttentionLayer(TransformerLayer):
  """The ET decoder cell's first block: two attention branches, summed.

  y = SelfAttention(2 * base_num_heads)(x)
      + EncDecAttention(base_num_heads)(x, encoder output).
  Without an encoder output (a decoder-only model) only the self-attention
  branch runs. Variables of the branches under `self_attention/` and
  `enc_dec_attention/` (q, k, v, o as SelfAttention). Decodes
  incrementally: the self-attention records its keys/values as states, the
  encoder-decoder attention its keys/values as a constant state.

  Example:
    y = DecoderAttentionLayer(base_num_heads=8).call(context, x)
  """

  def __init__(self, base_num_heads: int = 8,
               key_value_size: Optional[int] = None,
               dropout_rate: float = 0.0):
    """Creates the layer.

    Args:
      base_num_heads: heads of the encoder-decoder branch; the
        self-attention branch has twice as many.
      key_value_size: per-head size "d_kv" of both branches; None gives
        d_model // heads per branch (the paper's choice).
      dropout_rate: attention dropout of both branches in training.
    """
    self.base_num_heads = base_num_heads
    self.key_value_size = key_value_size
    self.dropout_rate = dropout_rate

  def _kv_size(self, model_dim: mtf.Dimension, num_heads: int) -> int:
    if self.key_value_size is not None:
      return _check_positive_int(self.key_value_size, "key_value_size",
                                 type(self).__name__)
    if model_dim.size < num_heads:
      raise ValueError("%s: d_model %d is smaller than the %d heads; give "
                       "key_value_size" % (type(self).__name__,
                                           model_dim.size, num_heads))
    return model_dim.size // num_heads

  def call(self, context: Context, x: mtf.Tensor,
           losses=None) -> mtf.Tensor:
    name = type(self).__name__
    heads = _check_positive_int(self.base_num_heads, "base_num_heads", name)
    _check_rate(self.dropout_rate, name)
    model_dim = x.shape.dims[-1]
    self_heads = 2 * heads
    self_attention = SelfAttention(
        num_heads=self_heads, key_value_size=self._kv_size(model_dim,
                                                           self_heads),
        dropout_rate=self.dropout_rate)
    with tf1.variable_scope("self_attention"):
      y = self_attention.call(context, x, losses)
    if context.encoder_output is None:
      return y
    enc_dec_attention = EncDecAttention(
        num_heads=heads, key_value_size=self._kv_size(model_dim, heads),
        dropout_rate=self.dropout_rate)
    with tf1.variable_scope("enc_dec_attention"):
      return y + enc_dec_attention.call(context, x, losses)
