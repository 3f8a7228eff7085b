"""1-D convolution layers and convolution-based local attention.

`Conv1D` holds the decoding protocol these layers share: in mode
"first_part" a layer records, as its one recurrent state, the `filter_size`
inputs just before `context.initial_position` (zeros before the sequence
start); in mode "incremental" it shifts the new input into that window,
records the window again and computes its output from it.

Layers:
  Conv1DLayer           convolution d_model -> output_size channels ("SAME"
                        padding over the full sequence, so it also sees
                        later positions; decoding sees only earlier ones).
  SeparableConv1DLayer  depthwise + pointwise convolution over relative
                        positions [min_relative_pos, max_relative_pos].
  Conv1DLocalAttn       a separable convolution whose depthwise filter is
                        softmax-normalised over the filter width and tied
                        every num_unique_depth_filters channels; the
                        subclasses say where the filter comes from:
  LightweightConv1DLocalAttn  a learned filter (lightweight convolution).
  DynamicConv1DLocalAttn  a filter predicted from each position's input
                        (dynamic convolution).
  LocalConvAttnBlock    gated linear unit, one of the two, a projection.
The last four follow "Pay Less Attention with Lightweight and Dynamic
Convolutions" (Wu et al., 2019).
"""

from __future__ import annotations

from typing import List, Optional

import gin
import tensorflow as tf

import mesh_tensorflow as mtf
from transformer._src.layers.context import Context
from transformer._src.layers.context import TransformerLayer

__all__ = [
  "Conv1D",
  "Conv1DLayer",
  "SeparableConv1DLayer",
  "Conv1DLocalAttn",
  "LightweightConv1DLocalAttn",
  "DynamicConv1DLocalAttn",
  "LocalConvAttnBlock",
]

_GIN_MODULE = "mesh_tensorflow.transformer.transformer_layers"
tf1 = tf.compat.v1

# The variable scopes the original's layers get from mtf.layers' default
# names (the first use inside a layer's scope). Named explicitly so that
# every call of a layer (full pass, first_part, incremental steps) in one
# mtf graph shares the variables.
_CONV1D_SCOPE = "conv2d"
_SEPARABLE_SCOPE = "separable_conv1d"


def _check_positive_int(value, what: str, layer: str) -> int:
  if not isinstance(value, int) or isinstance(value, bool) or value < 1:
    raise ValueError(
      "%s: %s must be a positive int, got %r" % (layer, what, value)
    )
  return value


def _apply_activation(y: mtf.Tensor, activation, layer: str) -> mtf.Tensor:
  """Applies activation: "linear" (none), an mtf function name or callable."""
  if activation == "linear" or activation is None:
    return y
  if callable(activation):
    return activation(y)
  fn = getattr(mtf, activation, None)
  if not callable(fn):
    raise ValueError(
      "%s: unknown activation %r (expected 'linear', an mtf "
      "function name or a callable)" % (layer, activation)
    )
  return fn(y)


def _mask_padding(context, x: mtf.Tensor) -> mtf.Tensor:
  """x with the positions where context.inputs is 0 (padding) zeroed."""
  if context.inputs is None:
    return x
  return x * mtf.cast(
    mtf.not_equal(context.inputs, 0), context.activation_dtype
  )


class Conv1D(TransformerLayer):
  """Base of the convolution layers: incremental-decoding states.

  A subclass with a receptive field of the last `filter_size` positions
  calls `record_states_first_part_mode` in mode "first_part" and, in mode
  "incremental", `record_states_incremental_mode`, which returns the window
  [batch..., <length_dim_name>=filter_size, d_model] of its inputs at
  positions t - filter_size + 1 ... t (oldest first, the current input
  last) to compute the output at t from.
  """

  def record_states_first_part_mode(
    self,
    context: Context,
    x: mtf.Tensor,
    filter_size: int,
    length_dim_name: str = "length",
  ) -> None:
    """Records the inputs before context.initial_position as the state.

    With initial position i, the state holds x at positions
    i - filter_size ... i - 1, zeros where a position is negative.

    Args:
      context: a Context in mode "first_part".
      x: the layer input [batch..., length, d_model].
      filter_size: the number of positions kept.
      length_dim_name: name of the state's window dimension.
    """
    filter_size = _check_positive_int(
      filter_size, "filter_size", type(self).__name__
    )
    if context.initial_position is None:
      raise ValueError(
        "%s: mode 'first_part' needs context.initial_position"
        % type(self).__name__
      )
    length_dim = x.shape.dims[-2]
    tmp_dim = mtf.Dimension("_conv_state", filter_size)
    offsets = mtf.range(x.mesh, tmp_dim, tf.int32) - filter_size
    positions = context.initial_position + offsets  # [batch..., tmp]
    select = mtf.one_hot(positions, length_dim, dtype=x.dtype)
    state = mtf.einsum(
      [select, x],
      output_shape=mtf.Shape(x.shape.dims[:-2] + [tmp_dim] + x.shape.dims[-1:]),
    )
    context.record_new_states(
      [mtf.rename_dimension(state, tmp_dim.name, length_dim_name)]
    )

  def record_states_incremental_mode(
    self,
    context: Context,
    x: mtf.Tensor,
    filter_size: int,
    length_dim_name: str = "length",
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
    """
    filter_size = _check_positive_int(
      filter_size, "filter_size", type(self).__name__
    )
    filter_dim = mtf.Dimension(length_dim_name, filter_size)
    old_state = context.get_states(1)[0]
    if filter_dim not in old_state.shape.dims:
      raise ValueError(
        "%s: recorded state %s has no window dimension %s"
        % (type(self).__name__, old_state.shape.to_string, filter_dim)
      )
    last = mtf.constant(
      x.mesh,
      filter_size - 1,
      shape=mtf.Shape(x.shape.dims[:-1]),
      dtype=tf.int32,
    )
    window = self.update_state(
      old_state, x, last, filter_dim, dtype=context.activation_dtype
    )
    context.record_new_states([window])
    return window

  def update_state(
    self,
    old_state: mtf.Tensor,
    x: mtf.Tensor,
    position: mtf.Tensor,
    filter_dim: mtf.Dimension,
    dtype,
  ) -> mtf.Tensor:
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

  def _window_input(
    self, context, x: mtf.Tensor, filter_size: int
  ) -> mtf.Tensor:
    """Records the states of the mode; returns the input to convolve.

    Modes "first_part"/"incremental" record states; "incremental" returns
    the window of the last filter_size inputs (dimension "length"), every
    other mode x with its padding positions zeroed.
    """
    if context.mode == "incremental":
      return self.record_states_incremental_mode(context, x, filter_size)
    if context.mode == "first_part":
      self.record_states_first_part_mode(context, x, filter_size)
    return _mask_padding(context, x)


def _last_position(y: mtf.Tensor, filter_size: int) -> mtf.Tensor:
  """y's entry at the newest window slot, without the "length" dimension."""
  window_dim = mtf.Dimension("length", filter_size)
  last = mtf.mtf_slice(y, filter_size - 1, 1, window_dim.name)
  return mtf.reduce_sum(
    last, reduced_dim=last.shape.get_dim_by_name(window_dim.name)
  )


@gin.configurable(module=_GIN_MODULE)
class Conv1DLayer(Conv1D):
  """1-D convolution over length with d_model as channels.

  Full-sequence modes: y = act(conv(x * mask)) with "SAME" padding (position
  t sees t - (filter_size - 1) // 2 ... t + filter_size // 2), where mask
  zeroes the positions whose context.inputs is 0. Mode "incremental"
  convolves the window of the last filter_size inputs ("VALID"), i.e. the
  causal filter. Variable `conv2d/kernel` [fh=1, fw=filter_size,
  input_dim=d_model, d_model=output_size] (mtf.layers.conv1d, glorot
  uniform). Nothing stops information crossing packed-sequence boundaries.

  Example (in a one-layer language model):
    >>> from transformer import transformer
    >>> stack = transformer.make_layer_stack(
    ...     [(Conv1DLayer, {"filter_size": 3, "output_size": 8})],
    ...     num_layers=1)
    >>> lm = transformer.Unitransformer(
    ...     stack, d_model=8, input_vocab_size=16, output_vocab_size=16,
    ...     autoregressive=True, max_length=4, vocab_divisor=1)
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> ids = converter.convert_np_array_to_mtf_tensor(
    ...     [[3, 5, 7, 1]], ["batch", "length"])
    >>> logits, _ = lm.call_simple(ids, ids, compute_loss=False)
    >>> converter.convert_mtf_tensor_to_np_array(logits).shape
    (1, 4, 16)
    >>> prefix = "transformer/block_000/layer_000/Conv1DLayer/"
    >>> for v in converter.graph.all_variables:  # the layer's variables
    ...   if v.name.startswith(prefix):
    ...     print(v.name[len(prefix):], v.shape)
    conv2d/kernel Shape[fh=1, fw=3, input_dim=8, d_model=8]
  """

  def __init__(
    self, filter_size: int, output_size: int, activation: str = "linear"
  ):
    """Creates the layer.

    Args:
      filter_size: number of positions the filter spans.
      output_size: number of output channels.
      activation: "linear" (none), an mtf function name or a callable.
    """
    self._filter_size = filter_size
    self._output_size = output_size
    self._activation = activation

  def call(self, context, x: mtf.Tensor, losses=None) -> mtf.Tensor:
    """Convolves x [batch..., length, d_model] (or [batch..., d_model])."""
    del losses
    name = type(self).__name__
    filter_size = _check_positive_int(self._filter_size, "filter_size", name)
    output_size = _check_positive_int(self._output_size, "output_size", name)
    x = self._window_input(context, x, filter_size)
    model_dim = x.shape.dims[-1]
    x = mtf.replace_dimensions(
      x, model_dim, mtf.Dimension("input_dim", model_dim.size)
    )
    y = mtf.layers.conv1d(
      x,
      output_dim=mtf.Dimension(model_dim.name, output_size),
      filter_size=filter_size,
      padding="VALID" if context.mode == "incremental" else "SAME",
      filter_initializer=tf1.glorot_uniform_initializer(),
      name=_CONV1D_SCOPE,
    )
    if context.mode == "incremental":
      y = mtf.reduce_sum(y, reduced_dim=mtf.Dimension("length", 1))
    return _apply_activation(y, self._activation, name)

  @property
  def filter_size(self) -> int:
    """The number of positions the filter covers."""
    return self._filter_size


@gin.configurable(module=_GIN_MODULE)
class SeparableConv1DLayer(Conv1D):
  """Depthwise-separable 1-D convolution over relative positions.

  y[t] = act(pointwise(sum_r w_r * (x * mask)[t + r])) for r in
  [min_relative_pos, max_relative_pos], zeros outside the sequence, mask
  zeroing the positions whose context.inputs is 0 (mtf.layers.
  separable_conv1d). Variables:
  `separable_conv1d/depthwise_conv_hack/depthwise_dense_<i>/kernel`
  [d_model] (+ `bias` for i = 0) and
  `separable_conv1d/pointwise_dense/{kernel,bias}`. Decoding (modes
  "first_part"/"incremental") keeps the last filter_size inputs and is
  exact when max_relative_pos == 0.

  Example (a causal filter over 3 positions in a one-layer model):
    >>> from transformer import transformer
    >>> stack = transformer.make_layer_stack(
    ...     [(SeparableConv1DLayer,
    ...       {"min_relative_pos": -2, "max_relative_pos": 0,
    ...        "output_size": 8})], num_layers=1)
    >>> lm = transformer.Unitransformer(
    ...     stack, d_model=8, input_vocab_size=16, output_vocab_size=16,
    ...     autoregressive=True, max_length=4, vocab_divisor=1)
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> ids = converter.convert_np_array_to_mtf_tensor(
    ...     [[3, 5, 7, 1]], ["batch", "length"])
    >>> logits, _ = lm.call_simple(ids, ids, compute_loss=False)
    >>> converter.convert_mtf_tensor_to_np_array(logits).shape
    (1, 4, 16)
    >>> prefix = ("transformer/block_000/layer_000/SeparableConv1DLayer/"
    ...           "separable_conv1d/")
    >>> for v in converter.graph.all_variables:  # the layer's variables
    ...   if v.name.startswith(prefix):
    ...     print(v.name[len(prefix):], v.shape)
    depthwise_conv_hack/depthwise_dense_0/kernel Shape[d_model=8]
    depthwise_conv_hack/depthwise_dense_0/bias Shape[d_model=8]
    depthwise_conv_hack/depthwise_dense_1/kernel Shape[d_model=8]
    depthwise_conv_hack/depthwise_dense_2/kernel Shape[d_model=8]
    pointwise_dense/kernel Shape[_d_model=8, d_model=8]
    pointwise_dense/bias Shape[d_model=8]
  """

  def __init__(
    self,
    min_relative_pos: int,
    max_relative_pos: int,
    output_size: int,
    depthwise_filter_initializer_scale: float = 1.0,
    pointwise_filter_initializer_scale: float = 1.0,
    activation: str = "linear",
  ):
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
      depthwise_filter_initializer_scale
    )
    self._pointwise_filter_initializer_scale = (
      pointwise_filter_initializer_scale
    )
    self._activation = activation

  def call(
    self,
    context,
    x: mtf.Tensor,
    losses=None,
    all_kernel_wts: Optional[List[mtf.Tensor]] = None,
  ) -> mtf.Tensor:
    """Convolves x; all_kernel_wts replace the depthwise kernels if given.

    Args:
      context: a Context.
      x: [batch..., length, d_model], or [batch..., d_model] when decoding.
      losses: unused.
      all_kernel_wts: optional filter_size Tensors with the d_model dim
        (e.g. [d_model] or [batch..., length, d_model]), one per relative
        position, used as the depthwise filter.

    Returns:
      a Tensor like x with d_model of size output_size.
    """
    del losses
    name = type(self).__name__
    output_size = _check_positive_int(self._output_size, "output_size", name)
    filter_size = self.filter_size
    if filter_size < 1:
      raise ValueError(
        "%s: max_relative_pos %d < min_relative_pos %d"
        % (name, self._max_relative_pos, self._min_relative_pos)
      )
    x = self._window_input(context, x, filter_size)
    model_dim = x.shape.dims[-1]
    y = mtf.layers.separable_conv1d(
      x,
      output_dim=mtf.Dimension(model_dim.name, output_size),
      min_relative_pos=self._min_relative_pos,
      max_relative_pos=self._max_relative_pos,
      depthwise_filter_initializer_scale=(
        self._depthwise_filter_initializer_scale
      ),
      pointwise_filter_initializer_scale=(
        self._pointwise_filter_initializer_scale
      ),
      use_bias=True,
      kernel_depth_weights=all_kernel_wts,
      name=_SEPARABLE_SCOPE,
    )
    if context.mode == "incremental":
      y = _last_position(y, filter_size)
    return _apply_activation(y, self._activation, name)

  @property
  def filter_size(self) -> int:
    """The number of positions the filter covers (max - min relative position +
    1).
    """
    return self._max_relative_pos - self._min_relative_pos + 1


@gin.configurable(module=_GIN_MODULE)
class Conv1DLocalAttn(SeparableConv1DLayer):
  """Separable convolution with a softmax-normalised, tied depthwise filter.

  For each relative position i, `get_kernel_wt` (defined by the subclasses)
  gives a filter over d_model / num_unique_depth_filters channels (dimension
  "repeated_kernel_dim"); it is repeated num_unique_depth_filters times
  along the channels (renamed "d_model"), the filter_size filters are
  softmax-normalised across the relative positions, and the result is the
  depthwise filter of SeparableConv1DLayer.call.
  """

  def __init__(
    self,
    min_relative_pos: int,
    max_relative_pos: int,
    output_size: int,
    depthwise_filter_initializer_scale: float = 1.0,
    pointwise_filter_initializer_scale: float = 1.0,
    activation: str = "linear",
    num_unique_depth_filters: int = 1,
  ):
    """Creates the layer.

    Args:
      min_relative_pos: inclusive smallest relative position.
      max_relative_pos: inclusive largest relative position.
      output_size: number of output channels; num_unique_depth_filters must
        divide it.
      depthwise_filter_initializer_scale: scale of the depthwise init.
      pointwise_filter_initializer_scale: scale of the pointwise init.
      activation: "linear" (none), an mtf function name or a callable.
      num_unique_depth_filters: how many times the unique filter repeats
        along the channels.
    """
    super().__init__(
      min_relative_pos,
      max_relative_pos,
      output_size,
      depthwise_filter_initializer_scale,
      pointwise_filter_initializer_scale,
      activation,
    )
    self._num_unique_depth_filters = num_unique_depth_filters
    if output_size % num_unique_depth_filters:
      raise ValueError(
        "%s: num_unique_depth_filters=%d must divide output_size=%d"
        % (type(self).__name__, num_unique_depth_filters, output_size)
      )

  def call(self, context, x: mtf.Tensor, losses=None) -> mtf.Tensor:
    """Builds the normalised depthwise filter and convolves x with it."""
    depth_dim = x.shape.dims[-1]
    scale = self._depthwise_filter_initializer_scale or 1.0
    filter_size = self.filter_size
    initializer = mtf.layers.VarianceScalingInitializer(
      scale=scale / filter_size
    )
    repeated_dim = mtf.Dimension(
      "repeated_kernel_dim", depth_dim.size // self._num_unique_depth_filters
    )
    kernels = []
    for i in range(filter_size):
      unique = self.get_kernel_wt(
        x,
        repeated_kernel_dim=[repeated_dim],
        kernel_initializer=initializer,
        i=i,
        context=context,
        variable_dtype=context.variable_dtype,
      )
      tiled = mtf.concat(
        [unique] * self._num_unique_depth_filters, repeated_dim.name
      )
      kernels.append(mtf.rename_dimension(tiled, repeated_dim.name, "d_model"))
    stacked = mtf.stack(kernels, "new_stack_dim")
    stack_dim = stacked.shape.dims[0]
    normalised = mtf.unstack(
      mtf.softmax(stacked, reduced_dim=stack_dim), stack_dim
    )
    return super().call(context, x, losses, normalised)


@gin.configurable(module=_GIN_MODULE)
class LightweightConv1DLocalAttn(Conv1DLocalAttn):
  """Conv1DLocalAttn with a learned filter per relative position.

  Variables `lightwt_depthwise_dense_<i>/kernel` [repeated_kernel_dim]
  (plus the SeparableConv1DLayer biases and pointwise variables).
  """

  def get_kernel_wt(
    self,
    x: mtf.Tensor,
    repeated_kernel_dim: List[mtf.Dimension],
    kernel_initializer,
    i: int,
    context,
    variable_dtype: mtf.VariableDType,
    master_dtype=tf.float32,
    slice_dtype=tf.float32,
  ) -> mtf.Tensor:
    """The learned filter of relative position i [repeated_kernel_dim].

    Args:
      x: the layer input [batch..., length, d_model].
      context: the Context of the call (mesh, dims, mode, states...).
      variable_dtype: the mtf.VariableDType of the variables.
      repeated_kernel_dim: the dims the filter is repeated over (e.g. [heads]).
      kernel_initializer: the initializer of the filter variable.
      i: the relative position (index in the window).
      master_dtype: the dtype of the stored variable.
      slice_dtype: the dtype of its slices.

    Returns:
      The filter [repeated_kernel_dim].
    """
    del variable_dtype, master_dtype, slice_dtype
    return mtf.layers.get_dense_kernel_weights(
      x,
      new_dims=[],
      reduced_dims=[],
      expert_dims=repeated_kernel_dim,
      kernel_initializer=kernel_initializer,
      name="lightwt_depthwise_dense_%d" % i,
      variable_dtype=context.variable_dtype,
    )


@gin.configurable(module=_GIN_MODULE)
class DynamicConv1DLocalAttn(Conv1DLocalAttn):
  """Conv1DLocalAttn with filters predicted from each position's input.

  The filter of relative position i at position t is x[t] W_i + b_i
  (variables `dyn_conv_depthwise_dense_<i>/{kernel,bias}`, kernel
  [d_model, repeated_kernel_dim]).
  """

  def get_kernel_wt(
    self,
    x: mtf.Tensor,
    repeated_kernel_dim: List[mtf.Dimension],
    kernel_initializer,
    i: int,
    context,
    variable_dtype: mtf.VariableDType,
    master_dtype=tf.float32,
    slice_dtype=tf.float32,
  ) -> mtf.Tensor:
    """The filter of relative position i [..., repeated_kernel_dim].

    Args:
      x: the layer input [batch..., length, d_model].
      context: the Context of the call (mesh, dims, mode, states...).
      variable_dtype: the mtf.VariableDType of the variables.
      repeated_kernel_dim: the dims the filter is repeated over (e.g. [heads]).
      kernel_initializer: the initializer of the filter variable.
      i: the relative position (index in the window).
      master_dtype: the dtype of the stored variable.
      slice_dtype: the dtype of its slices.

    Returns:
      The filter [repeated_kernel_dim].
    """
    del variable_dtype, master_dtype, slice_dtype
    return mtf.layers.dense(
      x,
      new_dims=repeated_kernel_dim,
      reduced_dims=[context.model.model_dim],
      expert_dims=[],
      kernel_initializer=kernel_initializer,
      name="dyn_conv_depthwise_dense_%d" % i,
      variable_dtype=context.variable_dtype,
    )


_ATTENTION_TYPES = {
  "lightweight_conv": LightweightConv1DLocalAttn,
  "dynamic_conv": DynamicConv1DLocalAttn,
}


@gin.configurable(module=_GIN_MODULE)
class LocalConvAttnBlock(TransformerLayer):
  """Gated linear unit, lightweight or dynamic convolution, projection.

  h = (x W_0 + b_0) * sigmoid(x W_1 + b_1) (variables
  `local_conv_inp_{0,1}/{kernel,bias}`), then the attention_type layer
  ("lightweight_conv": LightweightConv1DLocalAttn, "dynamic_conv":
  DynamicConv1DLocalAttn) and a dense projection d_model -> d_model
  (`local_conv_attn_op_projection/{kernel,bias}`).
  As in the original, the inner layer always uses num_unique_depth_filters
  = 1: the argument is accepted and not used.
  """

  def __init__(
    self,
    min_relative_pos: int,
    max_relative_pos: int,
    output_size: int,
    depthwise_filter_initializer_scale: float = 1.0,
    pointwise_filter_initializer_scale: float = 1.0,
    activation: str = "linear",
    num_unique_depth_filters: int = 1,
    attention_type: str = "lightweight_conv",
  ):
    """Creates the block.

    Args:
      min_relative_pos: inclusive smallest relative position.
      max_relative_pos: inclusive largest relative position.
      output_size: output channels of the inner layer.
      depthwise_filter_initializer_scale: scale of the depthwise init.
      pointwise_filter_initializer_scale: scale of the pointwise init.
      activation: activation of the inner layer.
      num_unique_depth_filters: accepted for compatibility; not used.
      attention_type: "lightweight_conv" or "dynamic_conv".

    Raises:
      NotImplementedError: for another attention_type.
    """
    del num_unique_depth_filters
    cls = _ATTENTION_TYPES.get(attention_type)
    if cls is None:
      raise NotImplementedError(
        "LocalConvAttnBlock: attention_type %r not implemented; expected "
        "one of %s" % (attention_type, sorted(_ATTENTION_TYPES))
      )
    self.conv_local_attn_layer = cls(
      min_relative_pos,
      max_relative_pos,
      output_size,
      depthwise_filter_initializer_scale,
      pointwise_filter_initializer_scale,
      activation,
    )

  def call(self, context, x: mtf.Tensor, losses=None) -> mtf.Tensor:
    """Runs the block on x [batch..., length, d_model]."""
    model_dim = context.model.model_dim
    gated = mtf.layers.dense_product(
      x,
      reduced_dims=[model_dim],
      new_dims=[model_dim],
      activation_functions=["linear", "sigmoid"],
      variable_dtype=context.variable_dtype,
      name="local_conv_inp",
    )
    h = self.conv_local_attn_layer.call(context, gated, losses)
    return mtf.layers.dense(
      h,
      reduced_dims=[model_dim],
      new_dims=[model_dim],
      activation=None,
      variable_dtype=context.variable_dtype,
      name="local_conv_attn_op_projection",
    )
