"""Causal 1-D convolution layers and convolution-style local attention.

Every layer here mixes each position with a fixed window of the positions
before it (the current one included), so it can run in a decoder and decode
one position at a time. `Conv1D` holds the decoding protocol they share:
in mode "first_part" a layer records, as its one recurrent state, the
`filter_size` inputs just before `context.initial_position` (zeros before
the sequence start); in mode "incremental" it shifts the new input into
that window, records the window again and computes its output from it. The
output of incremental decoding therefore equals the full forward pass.

Layers:
  Conv1DLayer           causal convolution, d_model -> output_size channels.
  SeparableConv1DLayer  depthwise + pointwise convolution over relative
                        positions [min_relative_pos, max_relative_pos].
  Conv1DLocalAttn       multi-head attention restricted to the window.
  LightweightConv1DLocalAttn  window weights: a learned softmax-normalized
                        kernel per head (lightweight convolution).
  DynamicConv1DLocalAttn  window weights predicted from the current input
                        (dynamic convolution).
  LocalConvAttnBlock    gated linear unit followed by one of the three.
The last three follow "Pay Less Attention with Lightweight and Dynamic
Convolutions" (Wu et al., 2019).
"""

from __future__ import annotations

from typing import List

import gin
import tensorflow as tf

import mesh_tensorflow as mtf
from transformer._src.layers.context import Context, TransformerLayer
from transformer._src.layers.dense_layers import resolve_activation

__all__ = [
    "Conv1D", "Conv1DLayer", "SeparableConv1DLayer", "Conv1DLocalAttn",
    "LightweightConv1DLocalAttn", "DynamicConv1DLocalAttn",
    "LocalConvAttnBlock",
]

_GIN_MODULE = "mesh_tensorflow.transformer.transformer_layers"
tf1 = tf.compat.v1

# The window of past positions a local layer mixes (oldest first).
_WINDOW = "window"
_NEG = -1e9


def _check_positive_int(value, what: str, layer: str) -> int:
  if not isinstance(value, int) or isinstance(value, bool) or value < 1:
    raise ValueError("%s: %s must be a positive int, got %r"
                     % (layer, what, value))
  return value


class Conv1D(TransformerLayer):
  """Base of the causal convolution layers: incremental-decoding states.

  A subclass with a receptive field of the last `filter_size` positions
  calls `record_states_first_part_mode` in mode "first_part" and, in mode
  "incremental", `record_states_incremental_mode`, which returns the window
  [batch..., <length_dim_name>=filter_size, d_model] of its inputs at
  positions t - filter_size + 1 ... t (oldest first, the current input
  last) to compute the output at t from.
  """

  def record_states_first_part_mode(self, context: Context, x: mtf.Tensor,
                                    filter_size: int,
                                    length_dim_name: str = "length") -> None:
    """Records the inputs before context.initial_position as the state.

    With initial position i, the state holds x at positions
    i - filter_size ... i - 1, zeros where a position is negative.

    Args:
      context: a Context in mode "first_part".
      x: the layer input [batch..., length, d_model].
      filter_size: the number of positions kept.
      length_dim_name: name of the state's window dimension.

    Raises:
      ValueError: without context.initial_position.
    """
    filter_size = _check_positive_int(filter_size, "filter_size",
                                      type(self).__name__)
    if context.initial_position is None:
      raise ValueError("%s: mode 'first_part' needs context.initial_position"
                       % type(self).__name__)
    length_dim = x.shape.dims[-2]
    tmp_dim = mtf.Dimension("_conv_state", filter_size)
    offsets = mtf.range(x.mesh, tmp_dim, tf.int32) - filter_size
    positions = context.initial_position + offsets  # [batch..., tmp]
    select = mtf.one_hot(positions, length_dim, dtype=x.dtype)
    state = mtf.einsum([select, x], output_shape=mtf.Shape(
        x.shape.dims[:-2] + [tmp_dim] + x.shape.dims[-1:]))
    context.record_new_states(
        [mtf.rename_dimension(state, tmp_dim.name, length_dim_name)])

  def record_states_incremental_mode(self, context: Context, x: mtf.Tensor,
                                     filter_size: int,
                                     length_dim_name: str = "length"
                                     ) -> mtf.Tensor:
    """Shifts x into the window state; records and returns the new window.

    Args:
      context: a Context in mode "incremental".
      x: this step's input [batch..., d_model].
      filter_size: the window size (as in first_part mode).
      length_dim_name: name of the window dimension.

    Returns:
      the window [batch..., length_dim_name=filter_size, d_model]: inputs
      at positions t - filter_size + 1 ... t.

    Raises:
      ValueError: if a recorded state lacks the window dimension.
    """
    filter_size = _check_positive_int(filter_size, "filter_size",
                                      type(self).__name__)
    filter_dim = mtf.Dimension(length_dim_name, filter_size)
    old_state = context.get_states(1)[0]
    if filter_dim not in old_state.shape.dims:
      raise ValueError("%s: recorded state %s has no window dimension %s"
                       % (type(self).__name__, old_state.shape.to_string,
                          filter_dim))
    last = mtf.constant(x.mesh, filter_size - 1,
                        shape=mtf.Shape(x.shape.dims[:-1]), dtype=tf.int32)
    window = self.update_state(old_state, x, last, filter_dim,
                               dtype=context.activation_dtype)
    context.record_new_states([window])
    return window

  def update_state(self, old_state: mtf.Tensor, x: mtf.Tensor,
                   position: mtf.Tensor, filter_dim: mtf.Dimension,
                   dtype) -> mtf.Tensor:
    """Drops the oldest entry of the window and writes x at `position`.

    Args:
      old_state: [batch..., filter_dim, d_model].
      x: [batch..., d_model].
      position: int [batch...], where x goes in the shifted window
        (filter_dim.size - 1 for the newest slot).
      filter_dim: the window Dimension.
      dtype: the activation dtype (a tf dtype or an mtf.VariableDType).

    Returns:
      the new window, shaped like old_state.
    """
    if isinstance(dtype, mtf.VariableDType):
      dtype = dtype.activation_dtype
    shifted = mtf.shift(old_state, -1, filter_dim, wrap=False)
    return shifted + mtf.one_hot(position, filter_dim, dtype=dtype) * x

  def _window_input(self, context: Context, x: mtf.Tensor,
                    filter_size: int) -> mtf.Tensor:
    """Records states per mode; the input to convolve, with its length dim.

    Full modes: x itself; "incremental": the window of the last filter_size
    inputs (a length dim of size filter_size).
    """
    if context.mode == "incremental":
      return self.record_states_incremental_mode(
          context, x, filter_size, length_dim_name=context.length_dim.name)
    if context.mode == "first_part":
      self.record_states_first_part_mode(
          context, x, filter_size, length_dim_name=context.length_dim.name)
    return x


def _newest(y: mtf.Tensor, window_dim: mtf.Dimension) -> mtf.Tensor:
  """The last entry of y along window_dim, without that dimension."""
  last = mtf.mtf_slice(y, window_dim.size - 1, 1, window_dim.name)
  return mtf.reduce_sum(last, reduced_dim=last.shape.get_dim_by_name(
      window_dim.name))


@gin.configurable(module=_GIN_MODULE)
class Conv1DLayer(Conv1D):
  """Causal 1-D convolution over length, d_model channels in.

  y[t] = act(sum_{f < filter_size} x[t - filter_size + 1 + f] K[f]), with
  zeros before the sequence start. Variable `conv1d/kernel`
  [fh=1, fw=filter_size, d_model, output_size] (mtf.layers.conv1d). The
  output dim has the input channel dim's name and size output_size. Like
  the original, it does not stop information crossing packed-sequence
  boundaries.

  Example:
    Conv1DLayer(filter_size=3, output_size=512).call(context, x)
  """

  def __init__(self, filter_size: int, output_size: int,
               activation: str = "linear"):
    """Creates the layer.

    Args:
      filter_size: number of positions the filter spans (the current one
        and filter_size - 1 before it).
      output_size: number of output channels.
      activation: "linear" (none), an mtf function name or a callable.
    """
    self._filter_size = filter_size
    self._output_size = output_size
    self._activation = activation

  def call(self, context: Context, x: mtf.Tensor,
           losses=None) -> mtf.Tensor:
    del losses
    name = type(self).__name__
    filter_size = _check_positive_int(self._filter_size, "filter_size", name)
    output_size = _check_positive_int(self._output_size, "output_size", name)
    activation = resolve_activation(self._activation, name)
    channels = x.shape.dims[-1]
    length_name = context.length_dim.name
    x = self._window_input(context, x, filter_size)
    if context.mode != "incremental":
      # Causal: zero-pad filter_size - 1 positions on the left, then VALID.
      x = mtf.pad(x, [filter_size - 1, 0], length_name)
    out_tmp = mtf.Dimension("_conv_output", output_size)
    y = mtf.layers.conv1d(
        x, out_tmp, filter_size=filter_size, padding="VALID",
        filter_initializer=tf1.random_normal_initializer(
            stddev=(filter_size * channels.size) ** -0.5),
        variable_dtype=context.variable_dtype, name="conv1d")
    if context.mode == "incremental":
      y = mtf.reduce_sum(y, reduced_dim=y.shape.get_dim_by_name(length_name))
    y = mtf.rename_dimension(y, out_tmp.name, channels.name)
    return activation(y) if activation is not None else y


@gin.configurable(module=_GIN_MODULE)
class SeparableConv1DLayer(Conv1D):
  """Depthwise-separable 1-D convolution over relative positions.

  y[t] = act(pointwise(sum_r w_r * x[t + r])) for r in
  [min_relative_pos, max_relative_pos], zeros outside the sequence
  (the computation of mtf.layers.separable_conv1d). Variables:
  `separable_conv1d/depthwise_conv_hack/depthwise_dense_<i>/kernel`
  [d_model] (+ `bias` for i = 0) and
  `separable_conv1d/pointwise_dense/{kernel,bias}`. Causal (decodable) when
  max_relative_pos <= 0; modes "first_part"/"incremental" require it.

  Example:
    SeparableConv1DLayer(-2, 0, output_size=512).call(context, x)
  """

  def __init__(self, min_relative_pos: int, max_relative_pos: int,
               output_size: int,
               depthwise_filter_initializer_scale: float = 1.0,
               pointwise_filter_initializer_scale: float = 1.0,
               activation: str = "linear"):
    """Creates the layer.

    Args:
      min_relative_pos: inclusive smallest relative position (e.g. -2).
      max_relative_pos: inclusive largest relative position (e.g. 0).
      output_size: number of output channels.
      depthwise_filter_initializer_scale: scale of the depthwise init.
      pointwise_filter_initializer_scale: scale of the pointwise init.
      activation: "linear" (none), an mtf function name or a callable.
    """
    self._min_relative_pos = min_relative_pos
    self._max_relative_pos = max_relative_pos
    self._output_size = output_size
    self._depthwise_filter_initializer_scale = (
        depthwise_filter_initializer_scale)
    self._pointwise_filter_initializer_scale = (
        pointwise_filter_initializer_scale)
    self._activation = activation

  def call(self, context: Context, x: mtf.Tensor,
           losses=None) -> mtf.Tensor:
    del losses
    name = type(self).__name__
    lo, hi = self._min_relative_pos, self._max_relative_pos
    if hi < lo:
      raise ValueError("%s: max_relative_pos %d < min_relative_pos %d"
                       % (name, hi, lo))
    output_size = _check_positive_int(self._output_size, "output_size", name)
    activation = resolve_activation(self._activation, name)
    if context.mode in ("first_part", "incremental") and hi > 0:
      raise ValueError("%s: max_relative_pos %d > 0 sees future positions; "
                       "mode %r decodes causally" % (name, hi, context.mode))
    channels = x.shape.dims[-1]
    window = max(1, 1 - lo)
    x = self._window_input(context, x, window)
    y = self._separable_conv(context, x, mtf.Dimension(channels.name,
                                                       output_size))
    if context.mode == "incremental":
      y = _newest(y, y.shape.get_dim_by_name(context.length_dim.name))
    return activation(y) if activation is not None else y


  def _separable_conv(self, context: Context, x: mtf.Tensor,
                      output_dim: mtf.Dimension) -> mtf.Tensor:
    """mtf.layers.separable_conv1d's computation and variable names, with
    the context's variable_dtype (which that function does not take)."""
    lo, hi = self._min_relative_pos, self._max_relative_pos
    depth_dim, length_dim = x.shape.dims[-1], x.shape.dims[-2]
    kernel_size = hi - lo + 1
    depthwise = []
    with tf1.variable_scope("separable_conv1d"):
      with tf1.variable_scope("depthwise_conv_hack"):
        for i in range(kernel_size):
          shifted = mtf.shift(x, -(lo + i), length_dim, wrap=False)
          depthwise.append(mtf.layers.dense(
              shifted, new_dims=[], reduced_dims=[], expert_dims=[depth_dim],
              use_bias=(i == 0), variable_dtype=context.variable_dtype,
              kernel_initializer=mtf.layers.VarianceScalingInitializer(
                  scale=self._depthwise_filter_initializer_scale
                  / kernel_size),
              name="depthwise_dense_%d" % i))
      return mtf.layers.dense(
          mtf.add_n(depthwise), new_dims=[output_dim],
          reduced_dims=[depth_dim], use_bias=True,
          variable_dtype=context.variable_dtype,
          kernel_initializer=mtf.layers.VarianceScalingInitializer(
              scale=self._pointwise_filter_initializer_scale),
          name="pointwise_dense")


# ----------------------------------------------------------------------------
# Convolution-style local attention.


def _window_from_sequence(x: mtf.Tensor, length_dim: mtf.Dimension,
                          window_dim: mtf.Dimension) -> mtf.Tensor:
  """[..., length, ...] -> [..., length, window, ...]: slot i = x[t - k + 1 + i]."""
  k = window_dim.size
  shifted = [mtf.shift(x, k - 1 - i, length_dim, wrap=False)
             for i in range(k)]
  axis = x.shape.dims.index(length_dim) + 1
  return mtf.stack(shifted, window_dim.name, axis=axis)


@gin.configurable(module=_GIN_MODULE)
class Conv1DLocalAttn(Conv1D):
  """Causal multi-head attention over a window of the last positions.

  Position t attends to positions t - kernel_size + 1 ... t (those before
  the sequence start or in another packed sequence are masked). The
  attention weights come from `window_weights`; this class uses softmax of
  query-key dot products, subclasses replace it with convolution kernels.
  Variables: `q`, `k`, `v`, `o`, each [heads, d_model, d_kv] (as
  mtf.layers.multihead_attention_params; subclasses make no q and k).
  Decoding keeps the window of the layer's inputs (Conv1D protocol).

  Example:
    Conv1DLocalAttn(kernel_size=4, num_heads=8).call(context, x)
  """

  def __init__(self, kernel_size: int = 3, num_heads: int = 8,
               key_value_size: int = 128, dropout_rate: float = 0.0):
    """Creates the layer.

    Args:
      kernel_size: the window size (current position included).
      num_heads: number of heads (dimension "heads").
      key_value_size: size of the per-head dimension "d_kv".
      dropout_rate: dropout on the window weights in training.
    """
    self.kernel_size = kernel_size
    self.num_heads = num_heads
    self.key_value_size = key_value_size
    self.dropout_rate = dropout_rate

  # Subclasses without query/key projections set this to False.
  uses_query_key = True

  @property
  def heads_dim(self) -> mtf.Dimension:
    """The heads Dimension ("heads", num_heads)."""
    return mtf.Dimension("heads", self.num_heads)

  @property
  def kv_dim(self) -> mtf.Dimension:
    """The per-head channels Dimension ("d_kv", d_model / num_heads)."""
    return mtf.Dimension("d_kv", self.key_value_size)

  def window_weights(self, context: Context, x: mtf.Tensor,
                     x_window: mtf.Tensor, bias: mtf.Tensor,
                     window_dim: mtf.Dimension,
                     params: List[mtf.Tensor]) -> mtf.Tensor:
    """Normalized weights [batch..., (length,) heads, window].

    Args:
      context: the Context.
      x: the layer input at the query positions [batch..., (length,) d_model].
      x_window: the inputs in each query's window
        [batch..., (length,) window, d_model].
      bias: 0 where a window slot is visible, -1e9 where not
        ([(batch...,) (length,) window]).
      window_dim: the window Dimension.
      params: [q, k, v, o] weights (q and k None when not uses_query_key).

    Returns:
      Normalized weights [batch..., (length,) heads, window].
    """
    wq, wk = params[0], params[1]
    q =  mtf.einsum([x, wq], output_shape=mtf.Shape(
        x.shape.dims[:-1] + [self.heads_dim, self.kv_dim]))
    k = mtf.einsum([x_window, wk], output_shape=mtf.Shape(
        x_window.shape.dims[:-1] + [self.heads_dim, self.kv_dim]))
    logits = mtf.einsum([q, k], reduced_dims=[self.kv_dim])
    return mtf.softmax(logits + bias, window_dim)

  def _params(self, context: Context, model_dim: mtf.Dimension):
    wq, wk, wv, wo = (None, None, None, None)
    if self.uses_query_key:
      wq, wk, wv, wo = mtf.layers.multihead_attention_params(
          context.mesh, self.heads_dim, model_dim, self.kv_dim,
          context.variable_dtype)
    else:
      stddevs = (model_dim.size ** -0.5,
                 (model_dim.size * self.num_heads) ** -0.5)
      wv, wo = [mtf.get_variable(
          context.mesh, n, mtf.Shape([self.heads_dim, model_dim,
                                      self.kv_dim]),
          initializer=tf1.random_normal_initializer(stddev=s),
          dtype=context.variable_dtype) for n, s in zip(("v", "o"), stddevs)]
    cast = lambda w: None if w is None else mtf.cast(  # noqa: E731
        w, context.activation_dtype)
    return [cast(w) for w in (wq, wk, wv, wo)]

  def _visibility_bias(self, context: Context, x: mtf.Tensor,
                       window_dim: mtf.Dimension) -> mtf.Tensor:
    """0 where a window slot is a real earlier position, -1e9 where not."""
    k = window_dim.size
    back = (k - 1) - mtf.range(x.mesh, window_dim, tf.int32)  # [window]
    if context.mode == "incremental":
      if context.position is None:
        raise ValueError("%s: mode 'incremental' needs context.position"
                         % type(self).__name__)
      visible = mtf.greater_equal(context.position, back)
    else:
      length_dim = context.length_dim
      visible = mtf.greater_equal(
          mtf.range(x.mesh, length_dim, tf.int32), back)
      sequence_id = context.sequence_id
      if isinstance(sequence_id, mtf.Tensor):
        same = mtf.equal(sequence_id, _window_from_sequence(
            sequence_id, length_dim, window_dim))
        visible = mtf.logical_and(visible, same)
    return mtf.cast(mtf.logical_not(visible), context.activation_dtype) * _NEG

  def call(self, context: Context, x: mtf.Tensor,
           losses=None) -> mtf.Tensor:
    del losses
    name = type(self).__name__
    k = _check_positive_int(self.kernel_size, "kernel_size", name)
    _check_positive_int(self.num_heads, "num_heads", name)
    _check_positive_int(self.key_value_size, "key_value_size", name)
    if not 0.0 <= self.dropout_rate < 1.0:
      raise ValueError("%s: dropout_rate must be in [0, 1), got %r"
                       % (name, self.dropout_rate))
    model_dim = x.shape.dims[-1]
    window_dim = mtf.Dimension(_WINDOW, k)
    window = self._window_input(context, x, k)
    if context.mode == "incremental":
      x_window = mtf.rename_dimension(window, context.length_dim.name,
                                      _WINDOW)
    else:
      x_window = _window_from_sequence(x, context.length_dim, window_dim)
    params = self._params(context, model_dim)
    bias = self._visibility_bias(context, x, window_dim)
    weights = self.window_weights(context, x, x_window, bias, window_dim,
                                  params)
    if context.train and self.dropout_rate > 0.0:
      weights = mtf.dropout(weights, context.train,
                            keep_prob=1.0 - self.dropout_rate)
    v = mtf.einsum([x_window, params[2]], output_shape=mtf.Shape(
        x_window.shape.dims[:-1] + [self.heads_dim, self.kv_dim]))
    o = mtf.einsum([weights, v], reduced_dims=[window_dim])
    return mtf.einsum([o, params[3]], output_shape=x.shape)


@gin.configurable(module=_GIN_MODULE)
class LightweightConv1DLocalAttn(Conv1DLocalAttn):
  """Lightweight convolution: one learned window kernel per head.

  The weights of head h are softmax over the visible window slots of the
  variable `lightweight_kernel` [heads, window=kernel_size] (the same for
  every position and every channel of the head); values `v` and output `o`
  as Conv1DLocalAttn.
  """

  uses_query_key = False

  def window_weights(self, context, x, x_window, bias, window_dim, params):
    """Softmax-normalized learned kernel weights per head and window position.

    Returns:
      Normalized weights [batch..., (length,) heads, window].
    """
    kernel = mtf.get_variable(
        context.mesh, "lightweight_kernel",
        mtf.Shape([self.heads_dim, window_dim]),
        initializer=tf1.random_normal_initializer(stddev=1.0),
        dtype=context.variable_dtype)
    kernel = mtf.cast(kernel, context.activation_dtype)
    return mtf.softmax(kernel + bias, window_dim)


@gin.configurable(module=_GIN_MODULE)
class DynamicConv1DLocalAttn(Conv1DLocalAttn):
  """Dynamic convolution: window kernels predicted from the current input.

  The weights of head h at position t are softmax over the visible window
  slots of x[t] W, W = variable `dynamic_kernel` [d_model, heads,
  window=kernel_size]; values `v` and output `o` as Conv1DLocalAttn.
  """

  uses_query_key = False

  def window_weights(self, context, x, x_window, bias, window_dim, params):
    """Softmax-normalized weights per position, head and window position,
    computed from x.

    Returns:
      Normalized weights [batch..., (length,) heads, window].
    """
    model_dim = x.shape.dims[-1]
    w = mtf.get_variable(
        context.mesh, "dynamic_kernel",
        mtf.Shape([model_dim, self.heads_dim, window_dim]),
        initializer=tf1.random_normal_initializer(
            stddev=model_dim.size ** -0.5),
        dtype=context.variable_dtype)
    logits = mtf.einsum([x, mtf.cast(w, context.activation_dtype)],
                        reduced_dims=[model_dim])
    return mtf.softmax(logits + bias, window_dim)


_ATTENTION_TYPES = {
    "lightweight_conv": LightweightConv1DLocalAttn,
    "dynamic_conv": DynamicConv1DLocalAttn,
    "local_attention": Conv1DLocalAttn,
}


@gin.configurable(module=_GIN_MODULE)
class LocalConvAttnBlock(TransformerLayer):
  """Gated linear unit, then a convolution-style local attention layer.

  h = (x W_0) * sigmoid(x W_1) (variables `glu_0/kernel`, `glu_1/kernel`
  [d_model, d_model]), then the layer chosen by attention_type:
  "lightweight_conv" (LightweightConv1DLocalAttn), "dynamic_conv"
  (DynamicConv1DLocalAttn) or "local_attention" (Conv1DLocalAttn), whose
  variables live under its class name. Decodes incrementally (the inner
  layer keeps the window of GLU outputs).
  """

  def __init__(self, kernel_size: int = 3, num_heads: int = 8,
               key_value_size: int = 128, dropout_rate: float = 0.0,
               attention_type: str = "lightweight_conv"):
    """Creates the block.

    Args:
      kernel_size: window size of the inner layer.
      num_heads: number of heads.
      key_value_size: per-head size "d_kv".
      dropout_rate: dropout on the window weights in training.
      attention_type: "lightweight_conv", "dynamic_conv" or
        "local_attention".
    """
    self.kernel_size = kernel_size
    self.num_heads = num_heads
    self.key_value_size = key_value_size
    self.dropout_rate = dropout_rate
    self.attention_type = attention_type

  def call(self, context: Context, x: mtf.Tensor,
           losses=None) -> mtf.Tensor:
    del losses
    cls = _ATTENTION_TYPES.get(self.attention_type)
    if cls is None:
      raise ValueError("LocalConvAttnBlock: unknown attention_type %r; "
                       "expected one of %s"
                       % (self.attention_type, sorted(_ATTENTION_TYPES)))
    model_dim = x.shape.dims[-1]
    h = mtf.layers.dense_product(
        x, reduced_dims=[model_dim], new_dims=[model_dim],
        activation_functions=["linear", "sigmoid"], name="glu",
        use_bias=False, variable_dtype=context.variable_dtype)
    inner = cls(kernel_size=self.kernel_size, num_heads=self.num_heads,
                key_value_size=self.key_value_size,
                dropout_rate=self.dropout_rate)
    with tf1.variable_scope(cls.__name__):
      return inner.call(context, h)

