"""The Universal Transformer's timing signals: position and step.

`UTTimingSignals` is the part of UTLayerStack that makes the signals a
recurrence step adds to (or concatenates with) its input: the horizontal
(position) sinusoid of the tensor2tensor timing signal, and the vertical
(step) signal, the learned `layer_embedding` [layer: num_steps, d_model] or
a sinusoid of the step. `step_preprocess` gives a step's input.
"""

from __future__ import annotations

import math
from typing import Union

import tensorflow as tf

import mesh_tensorflow as mtf
from transformer._src.layers.context import Context

__all__ = ["UTTimingSignals"]

tf1 = tf.compat.v1


class UTTimingSignals:
  """The timing-signal methods of UTLayerStack (its base class).

  They read the stack's settings: add_or_concat_timing_signal,
  position_start_index, step_timing_signal_type, add_step_timing_signal,
  add_position_timing_signal and num_steps.
  """

  def get_timing_signal_1d(
    self,
    context: Context,
    length: mtf.Dimension,
    channels: mtf.Dimension,
    min_timescale: float = 1.0,
    max_timescale: float = 1.0e4,
    start_index: Union[int, mtf.Tensor] = 0,
  ) -> mtf.Tensor:
    """Sinusoids of geometric timescales at positions + start_index.

    The first channels/2 channels are sin(position / timescale), the rest
    cos(position / timescale), with timescales from min_timescale to
    max_timescale (the tensor2tensor timing signal).

    Args:
      context: the Context of the call (positions: context.get_position()).
      length: the sequence Dimension (the positions carry it).
      channels: the signal Dimension; its size must be even.
      min_timescale: the shortest timescale.
      max_timescale: the longest timescale.
      start_index: an int (or int Tensor) added to every position.

    Returns:
      The signal [position dims..., channels] in the activation dtype.

    Raises:
      NotImplementedError: for an odd channels size.
    """
    del length
    position = mtf.cast(
      context.get_position() + start_index, context.activation_dtype
    )
    return self._sinusoids(
      context, position, channels, min_timescale, max_timescale
    )

  def _sinusoids(
    self,
    context: Context,
    position: mtf.Tensor,
    channels: mtf.Dimension,
    min_timescale: float = 1.0,
    max_timescale: float = 1.0e4,
  ) -> mtf.Tensor:
    if channels.size % 2:
      raise NotImplementedError("Odd channel size not implemented.")
    dtype = context.activation_dtype
    half_dim = mtf.Dimension(channels.name, channels.size // 2)
    increment = math.log(float(max_timescale) / float(min_timescale)) / max(
      half_dim.size - 1, 1
    )
    inv_timescales = min_timescale * mtf.exp(
      mtf.mtf_range(context.mesh, half_dim, dtype) * -increment
    )
    scaled_time = position * inv_timescales
    return mtf.concat(
      [mtf.sin(scaled_time), mtf.cos(scaled_time)], channels.name
    )

  def _add_or_concat(self, x: mtf.Tensor, signal: mtf.Tensor) -> mtf.Tensor:
    signal = mtf.cast(signal, x.dtype)
    if self.add_or_concat_timing_signal == "add":
      return x + signal
    last_dim = x.shape.dims[-1]
    return mtf.concat([x, mtf.broadcast(signal, x.shape)], last_dim.name)

  def add_position_timing_signal_func(
    self, context: Context, x: mtf.Tensor, step: Union[int, mtf.Tensor]
  ) -> mtf.Tensor:
    """x with the position (horizontal) timing signal added or concatenated.

    Positions start at 0 (position_start_index None or 0), at a random
    offset below the length ("random") or at length * step / num_steps
    ("step").

    Args:
      context: the Context of the call.
      x: the activations [batch, length, d_model].
      step: the recurrence step.

    Returns:
      x plus the signal, or x concatenated with it along d_model ("concat").
    """
    index = self.position_start_index or 0
    length_size = x.shape.dims[1].size
    if index == "random":
      index = mtf.random_uniform(
        context.mesh, [], maxval=length_size, dtype=tf.int32
      )
    elif index == "step" and isinstance(step, mtf.Tensor):
      index = mtf.cast(
        mtf.cast(step, tf.float32) * (length_size / self.num_steps),
        tf.int32,
      )
    elif index == "step":
      index = length_size * step // self.num_steps
    signal = self.get_timing_signal_1d(
      context, context.length_dim, context.model.model_dim, start_index=index
    )
    return self._add_or_concat(x, signal)

  def get_layer_timing_signal_learned_1d(
    self,
    context: Context,
    channels: mtf.Dimension,
    layer: Union[int, mtf.Tensor],
    num_layers: int,
  ) -> mtf.Tensor:
    """The learned embedding of layer (step) `layer`: the vertical signal.

    Variable `layer_embedding` [layer: num_layers, channels], initialised
    N(0, channels^-1/2), is scaled by channels^1/2; a layer past the end
    gives zeros.

    Args:
      context: the Context of the call.
      channels: the signal Dimension.
      layer: the layer (recurrence step) index, an int or int32 scalar.
      num_layers: how many layers the embedding holds.

    Returns:
      The signal [channels].
    """
    layer_dim = mtf.Dimension("layer", num_layers)
    embedding = mtf.get_variable(
      context.mesh,
      "layer_embedding",
      mtf.Shape([layer_dim, channels]),
      initializer=tf1.random_normal_initializer(0.0, channels.size**-0.5),
      dtype=context.variable_dtype,
    )
    if not isinstance(layer, mtf.Tensor):
      layer = mtf.constant(context.mesh, layer, dtype=tf.int32)
    return mtf.gather(embedding * (channels.size**0.5), layer, layer_dim)

  def get_layer_timing_signal_sinusoid_1d(
    self,
    context: Context,
    channels: mtf.Dimension,
    layer: Union[int, mtf.Tensor],
    num_layers: int,
  ) -> mtf.Tensor:
    """The sinusoid timing signal of position `layer`: the vertical signal.

    Args:
      context: the Context of the call.
      channels: the signal Dimension (even size).
      layer: the layer (recurrence step) index, an int or int32 scalar.
      num_layers: the number of layers (the signal does not depend on it).

    Returns:
      The signal [channels].
    """
    del num_layers
    if isinstance(layer, mtf.Tensor):
      position = mtf.cast(layer, context.activation_dtype)
    else:
      position = mtf.constant(
        context.mesh, float(layer), dtype=context.activation_dtype
      )
    return self._sinusoids(context, position, channels)

  def add_step_timing_signal_func(
    self, context: Context, x: mtf.Tensor, step: Union[int, mtf.Tensor]
  ) -> mtf.Tensor:
    """x with the step (vertical) timing signal added or concatenated.

    Args:
      context: the Context of the call.
      x: the activations [batch..., length, d_model].
      step: the recurrence step (0-based).

    Returns:
      x plus the signal, or x concatenated with it along d_model ("concat").
    """
    channels = x.shape.dims[-1]
    if self.step_timing_signal_type == "learned":
      signal_fn = self.get_layer_timing_signal_learned_1d
    else:
      signal_fn = self.get_layer_timing_signal_sinusoid_1d
    signal = signal_fn(context, channels, step, self.num_steps)
    return self._add_or_concat(x, signal)

  def step_preprocess(
    self, context: Context, x: mtf.Tensor, step: Union[int, mtf.Tensor]
  ) -> mtf.Tensor:
    """The input of a recurrence step: x with the step signal.

    With "concat", a dense layer (`dense/kernel`, no bias) maps the
    concatenation back to x's last dimension.

    Args:
      context: the Context of the call.
      x: the activations [batch..., length, d_model].
      step: the recurrence step (0-based).

    Returns:
      The step's input.
    """
    channels = x.shape.dims[-1]
    if self.add_step_timing_signal:
      x = self.add_step_timing_signal_func(context, x, step)
    if self.add_or_concat_timing_signal == "concat" and (
      self.add_position_timing_signal or self.add_step_timing_signal
    ):
      x = mtf.layers.dense(
        x,
        [channels],
        reduced_dims=x.shape.dims[-1:],
        use_bias=False,
        variable_dtype=context.variable_dtype,
      )
    return x
