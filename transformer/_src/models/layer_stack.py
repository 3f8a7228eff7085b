"""LayerStack: a transformer tower's layers with their sublayer recipe.

A stack runs `sublayers_initial` once, then for every layer the
`sublayers_per_layer` functions (by default: RMS norm, the layer itself,
dropout, residual), then `sublayers_final`. Each sublayer is a function
`(x, layer_stack, context) -> x` and may be configured with gin. The layer in
progress is `context.current_layer`, its input `context.current_layer_input`.

Variable scopes: every layer runs inside `tf.compat.v1.variable_scope(
layer.name or "")`; `sublayer_call_layer` adds the class name, so a layer's
variables are `<tower>/block_000/layer_000/SelfAttention/q` and its norm is
`<tower>/block_000/layer_000/rms_norm/scale` (legacy: `.../layer_norm/scale`).
"""

from __future__ import annotations

import math
from typing import Callable, List, Optional, Sequence

from absl import logging
import gin
import tensorflow as tf

import mesh_tensorflow as mtf
from transformer._src.layers.context import Context
from transformer._src.layers.context import TransformerLayer

tf1 = tf.compat.v1

__all__ = [
  "LayerStack",
  "ReversibleLayerStack",
  "make_layer_stack",
  "sublayer_annealed_dropout",
  "sublayer_call_layer",
  "sublayer_clip_activation_gradient",
  "sublayer_dropout",
  "sublayer_legacy_dropout",
  "sublayer_legacy_final_rms_norm",
  "sublayer_legacy_rms_norm",
  "sublayer_mask_padding",
  "sublayer_residual",
  "sublayer_rezero",
  "sublayer_rms_norm",
  "sublayer_rms_norm_subsampled",
  "sublayer_scale_norm",
  "sublayer_true_layer_norm",
]

_GIN_MODULE = "mesh_tensorflow.transformer.transformer"

Sublayer = Callable[[mtf.Tensor, "LayerStack", Context], mtf.Tensor]


# ----------------------------------------------------------------------------
# Sublayers.


def _ensemble_dims(context: Context) -> List[mtf.Dimension]:
  return list(getattr(context.model, "ensemble_dims", None) or [])


@gin.configurable(module=_GIN_MODULE)
def sublayer_mask_padding(
  x: mtf.Tensor, layer_stack, context: Context
) -> mtf.Tensor:
  """Zeroes padding positions (sequence_id == 0) so no value leaks from them.

  Args:
    x: the activations [batch..., length, d_model].
    layer_stack: the LayerStack running the sublayer.
    context: the Context of the call.

  Returns:
    The new activations, shaped as x.
  """
  del layer_stack
  if isinstance(context.sequence_id, mtf.Tensor):
    return x * mtf.cast(
      mtf.not_equal(context.sequence_id, 0), context.activation_dtype
    )
  return x


@gin.configurable(module=_GIN_MODULE)
def sublayer_call_layer(
  x: mtf.Tensor, layer_stack, context: Context
) -> mtf.Tensor:
  """Calls context.current_layer on x (padding masked first).

  Variables of the layer are created under `<layer name>/<ClassName>/`.

  Args:
    x: the activations [batch..., length, d_model].
    layer_stack: the LayerStack running the sublayer.
    context: the Context of the call.

  Returns:
    The new activations, shaped as x.
  """
  x = sublayer_mask_padding(x, layer_stack, context)
  layer = context.current_layer
  with tf1.variable_scope(layer.__class__.__name__):
    return layer.call(context, x)


def _rms_normalize(
  x: mtf.Tensor,
  context: Context,
  epsilon: float,
  variance_of: Optional[mtf.Tensor] = None,
) -> mtf.Tensor:
  model_dim = context.model.model_dim
  source = x if variance_of is None else variance_of
  reduced = [d for d in source.shape.dims if d.name == model_dim.name]
  if not reduced:
    raise ValueError(
      "rms norm: the input %s has no %r dimension"
      % (x.shape.to_string, model_dim.name)
    )
  variance = mtf.reduce_mean(mtf.square(source), reduced_dim=reduced[0])
  return x * mtf.rsqrt(variance + epsilon)


@gin.configurable(module=_GIN_MODULE)
def sublayer_rms_norm(
  x: mtf.Tensor,
  layer_stack,
  context: Context,
  epsilon: float = 1e-6,
  name: str = "rms_norm",
) -> mtf.Tensor:
  """RMS norm over d_model: x * rsqrt(mean(x^2) + epsilon) * scale.

  Variable `<name>/scale` [ensemble..., d_model], initialised to ones. No mean
  subtraction and no bias.

  Args:
    x: the activations [batch..., length, d_model].
    layer_stack: the LayerStack running the sublayer.
    context: the Context of the call.
    epsilon: added to the mean square.
    name: the variable scope of the scale.

  Returns:
    The new activations, shaped as x.
  """
  del layer_stack
  model_dim = context.model.model_dim
  with tf1.variable_scope(name):
    scale = mtf.get_variable(
      context.mesh,
      "scale",
      mtf.Shape(_ensemble_dims(context) + [model_dim]),
      initializer=tf1.ones_initializer(),
      dtype=context.variable_dtype,
    )
  return _rms_normalize(x, context, epsilon) * scale


@gin.configurable(module=_GIN_MODULE)
def sublayer_legacy_rms_norm(
  x: mtf.Tensor, layer_stack, context: Context
) -> mtf.Tensor:
  """RMS norm with the legacy scope "layer_norm" and layer_stack.norm_epsilon.

  Args:
    x: the activations [batch..., length, d_model].
    layer_stack: the LayerStack running the sublayer.
    context: the Context of the call.

  Returns:
    The new activations, shaped as x.
  """
  return sublayer_rms_norm(
    x, layer_stack, context, epsilon=layer_stack.norm_epsilon, name="layer_norm"
  )


@gin.configurable(module=_GIN_MODULE)
def sublayer_legacy_final_rms_norm(
  x: mtf.Tensor, layer_stack, context: Context
) -> mtf.Tensor:
  """The final RMS norm under the legacy scope "final_layer_norm".

  Args:
    x: the activations [batch..., length, d_model].
    layer_stack: the LayerStack running the sublayer.
    context: the Context of the call.

  Returns:
    The new activations, shaped as x.
  """
  return sublayer_rms_norm(
    x,
    layer_stack,
    context,
    epsilon=layer_stack.norm_epsilon,
    name="final_layer_norm",
  )


@gin.configurable(module=_GIN_MODULE)
def sublayer_rms_norm_subsampled(
  x: mtf.Tensor,
  layer_stack,
  context: Context,
  percentage: float = 100.0,
  epsilon: float = 1e-6,
) -> mtf.Tensor:
  """RMS norm whose variance uses only the first `percentage`% of d_model.

  Variable `layer_norm_subsampled/scale` [ensemble..., d_model].

  Args:
    x: the activations [batch..., length, d_model].
    layer_stack: the LayerStack running the sublayer.
    context: the Context of the call.
    percentage: the share of d_model, in (0, 100], whose mean square is used.
    epsilon: added to the mean square.

  Returns:
    The new activations, shaped as x.

  Raises:
    ValueError: if percentage is not in (0, 100].
  """
  del layer_stack
  if not 0.0 < percentage <= 100.0:
    raise ValueError(
      "sublayer_rms_norm_subsampled: percentage must be in "
      "(0, 100], got %r" % (percentage,)
    )
  model_dim = context.model.model_dim
  with tf1.variable_scope("layer_norm_subsampled"):
    scale = mtf.get_variable(
      context.mesh,
      "scale",
      mtf.Shape(_ensemble_dims(context) + [model_dim]),
      initializer=tf1.ones_initializer(),
      dtype=context.variable_dtype,
    )
  size = max(1, int(math.ceil(model_dim.size * percentage / 100.0)))
  subsampled = x
  if size < model_dim.size:
    subsampled = mtf.slice(x, 0, size, model_dim.name)
  return _rms_normalize(x, context, epsilon, variance_of=subsampled) * scale


@gin.configurable(module=_GIN_MODULE)
def sublayer_scale_norm(
  x: mtf.Tensor,
  layer_stack,
  context: Context,
  epsilon: float = 1e-6,
  name: str = "scale_norm",
) -> mtf.Tensor:
  """ScaleNorm: RMS norm with one learned scalar (per ensemble member).

  Variable `<name>/scale` of shape [ensemble...] (a scalar), ones.

  Args:
    x: the activations [batch..., length, d_model].
    layer_stack: the LayerStack running the sublayer.
    context: the Context of the call.
    epsilon: added to the mean square.
    name: the variable scope of the scale.

  Returns:
    The new activations, shaped as x.
  """
  del layer_stack
  with tf1.variable_scope(name):
    scale = mtf.get_variable(
      context.mesh,
      "scale",
      mtf.Shape(_ensemble_dims(context)),
      initializer=tf1.ones_initializer(),
      dtype=context.variable_dtype,
    )
  return _rms_normalize(x, context, epsilon) * scale


@gin.configurable(module=_GIN_MODULE)
def sublayer_residual(
  x: mtf.Tensor, layer_stack, context: Context
) -> mtf.Tensor:
  """Adds the layer's input: x + context.current_layer_input.

  Args:
    x: the activations [batch..., length, d_model].
    layer_stack: the LayerStack running the sublayer.
    context: the Context of the call.

  Returns:
    The new activations, shaped as x.
  """
  del layer_stack
  return x + context.current_layer_input


def _dropout_noise_shape(x: mtf.Tensor, context: Context) -> mtf.Shape:
  # Broadcast over length: one mask per (example, channel).
  return mtf.Shape([d for d in x.shape.dims if d != context.length_dim])


@gin.configurable(module=_GIN_MODULE)
def sublayer_dropout(
  x: mtf.Tensor, layer_stack, context: Context, dropout_rate: float = 0.0
) -> mtf.Tensor:
  """Dropout in training, with the mask broadcast over the length dim.

  Args:
    x: the activations [batch..., length, d_model].
    layer_stack: the LayerStack running the sublayer.
    context: the Context of the call.
    dropout_rate: the dropout rate (training only).

  Returns:
    The new activations, shaped as x.
  """
  del layer_stack
  if context.train and dropout_rate > 0:
    return mtf.dropout(
      x,
      context.train,
      rate=dropout_rate,
      noise_shape=_dropout_noise_shape(x, context),
    )
  return x


@gin.configurable(module=_GIN_MODULE)
def sublayer_legacy_dropout(
  x: mtf.Tensor, layer_stack, context: Context
) -> mtf.Tensor:
  """Dropout at layer_stack.dropout_rate (legacy mode).

  Args:
    x: the activations [batch..., length, d_model].
    layer_stack: the LayerStack running the sublayer.
    context: the Context of the call.

  Returns:
    The new activations, shaped as x.
  """
  return sublayer_dropout(
    x, layer_stack, context, dropout_rate=layer_stack.dropout_rate
  )


@gin.configurable(module=_GIN_MODULE)
def sublayer_annealed_dropout(
  x: mtf.Tensor,
  layer_stack,
  context: Context,
  init_dropout_rate: float = 0.0,
  start_step: Optional[int] = None,
  end_step: Optional[int] = None,
) -> mtf.Tensor:
  """Dropout whose rate falls linearly to 0 between start_step and end_step.

  Args:
    x: the activations [batch..., length, d_model].
    layer_stack: the LayerStack running the sublayer.
    context: the Context of the call.
    init_dropout_rate: the rate up to start_step (0: no dropout).
    start_step: the global step at which the rate starts falling (required with
      a rate).
    end_step: the global step from which the rate is 0 (required with a rate).

  Returns:
    The new activations, shaped as x.

  Raises:
    ValueError: without start_step and end_step when init_dropout_rate > 0.
  """
  del layer_stack
  if context.train and init_dropout_rate > 0:
    if start_step is None or end_step is None:
      raise ValueError(
        "sublayer_annealed_dropout: start_step and end_step "
        "are required when init_dropout_rate > 0"
      )
    return mtf.layers.annealed_dropout(
      x,
      context.train,
      start_step,
      end_step,
      init_rate=init_dropout_rate,
      noise_shape=_dropout_noise_shape(x, context),
    )
  return x


@gin.configurable(module=_GIN_MODULE)
def sublayer_clip_activation_gradient(
  x: mtf.Tensor, layer_stack, context: Context, rms_norm: float = 1.0
) -> mtf.Tensor:
  """Identity whose gradient is clipped to RMS norm <= rms_norm.

  Args:
    x: the activations [batch..., length, d_model].
    layer_stack: the LayerStack running the sublayer.
    context: the Context of the call.
    rms_norm: the largest RMS norm of the gradient.

  Returns:
    The new activations, shaped as x.
  """
  del layer_stack, context
  return mtf.layers.clip_activation_gradient(x, rms_norm)


@gin.configurable(module=_GIN_MODULE)
def sublayer_rezero(
  x: mtf.Tensor, layer_stack, context: Context, initial_value: float = 0.0
) -> mtf.Tensor:
  """ReZero: x times the scalar variable `rezero_weight` (initial_value).

  Args:
    x: the activations [batch..., length, d_model].
    layer_stack: the LayerStack running the sublayer.
    context: the Context of the call.
    initial_value: the initial value of the scalar.

  Returns:
    The new activations, shaped as x.
  """
  del layer_stack
  weight = mtf.get_variable(
    context.mesh,
    "rezero_weight",
    mtf.Shape(_ensemble_dims(context)),
    initializer=tf1.constant_initializer(initial_value),
    dtype=context.variable_dtype,
  )
  return x * weight


@gin.configurable(module=_GIN_MODULE)
def sublayer_true_layer_norm(
  x: mtf.Tensor, layer_stack, context: Context, epsilon: float = 1e-6
) -> mtf.Tensor:
  """Standard layer norm (mean and variance, scale and bias) over d_model.

  Variables `true_layer_norm/layer_prepostprocess/layer_norm/layer_norm_
  {scale,bias}` (mtf.layers.layer_norm's default scope, inside
  `true_layer_norm`), as the original's checkpoints.

  Args:
    x: the activations [batch..., length, d_model].
    layer_stack: the LayerStack running the sublayer.
    context: the Context of the call.
    epsilon: added to the variance.

  Returns:
    The new activations, shaped as x.
  """
  del layer_stack
  with tf1.variable_scope("true_layer_norm"):
    return mtf.layers.layer_norm(x, context.model.model_dim, epsilon=epsilon)


# ----------------------------------------------------------------------------
# Rematerialisation.


def _recompute_grad(
  fn: Callable[[mtf.Tensor], mtf.Tensor], x: mtf.Tensor, context: Context
) -> mtf.Tensor:
  """fn(x) under mtf.recompute_grad; aux losses fn appends to context.losses
  become outputs of the recomputed block (so they stay differentiable).
  """
  losses = context.losses

  def fn_and_losses(x):
    num_losses = len(losses) if losses is not None else 0
    y = fn(x)
    if losses is None:
      return [y]
    new_losses = losses[num_losses:]
    del losses[num_losses:]
    return [y] + new_losses

  outputs = mtf.recompute_grad(fn_and_losses, [x])
  if losses is not None:
    losses.extend(outputs[1:])
  return outputs[0]


# ----------------------------------------------------------------------------
# Layer stacks.


@gin.configurable(module=_GIN_MODULE)
class LayerStack(TransformerLayer):
  """A stack of layers with initial, per-layer and final sublayers.

  Default recipe (pre-norm residual):
    initial:   [sublayer_dropout]
    per layer: [sublayer_rms_norm, sublayer_call_layer, sublayer_dropout,
                sublayer_residual]
    final:     [sublayer_rms_norm, sublayer_dropout]
  Legacy mode (dropout_rate and norm_epsilon both given, old gin configs)
  forces the same recipe with the legacy sublayers, whose variables are named
  `layer_norm/scale` and `final_layer_norm/scale`.

  Example (the stack of a tiny language model):
    >>> from transformer import transformer
    >>> from transformer.transformer_layers import DenseReluDense
    >>> from transformer.transformer_layers import SelfAttention
    >>> stack = LayerStack([SelfAttention(num_heads=2, key_value_size=4),
    ...                     DenseReluDense(hidden_size=16)])
    >>> lm = transformer.Unitransformer(
    ...     stack, d_model=8, input_vocab_size=16, output_vocab_size=16,
    ...     autoregressive=True, max_length=4, vocab_divisor=1)
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> ids = converter.convert_np_array_to_mtf_tensor(
    ...     [[3, 5, 7, 1]], ["batch", "length"])
    >>> logits, _ = lm.call_simple(ids, ids, compute_loss=False)
    >>> converter.convert_mtf_tensor_to_np_array(logits).shape
    (1, 4, 16)
  """

  def __init__(
    self,
    layers: Sequence[TransformerLayer],
    sublayers_initial: Optional[Sequence[Sublayer]] = None,
    sublayers_per_layer: Optional[Sequence[Sublayer]] = None,
    sublayers_final: Optional[Sequence[Sublayer]] = None,
    dropout_rate: Optional[float] = None,
    norm_epsilon: Optional[float] = None,
    recompute_grads: bool = False,
  ):
    """Stores the layers and sublayers.

    Args:
      layers: the TransformerLayers, in order.
      sublayers_initial: sublayer functions (x, layer_stack, context) -> x
        applied to the stack's input (default: dropout).
      sublayers_per_layer: sublayer functions applied around each layer
        (default: rms_norm, call_layer, dropout, residual).
      sublayers_final: sublayer functions applied to the last layer's output
        (default: rms_norm, dropout).
      dropout_rate: legacy mode: the dropout rate of the default legacy
        sublayers (given together with norm_epsilon; None: the sublayer lists
        decide).
      norm_epsilon: legacy mode: the epsilon of the legacy RMS norms (given
        together with dropout_rate).
      recompute_grads: recompute each layer's activations in the backward pass
        instead of storing them (less memory).

    Raises:
      ValueError: only one of dropout_rate and norm_epsilon is given.
    """
    self._layers = list(layers)
    self._recompute_grads = recompute_grads
    self._dropout_rate = dropout_rate
    self._norm_epsilon = norm_epsilon
    if (dropout_rate is None) != (norm_epsilon is None):
      raise ValueError(
        "LayerStack: dropout_rate (%r) and norm_epsilon (%r) must both be "
        "given (legacy mode) or both be None" % (dropout_rate, norm_epsilon)
      )
    if dropout_rate is not None:
      if any(
        s is not None
        for s in (sublayers_initial, sublayers_per_layer, sublayers_final)
      ):
        logging.warning(
          "LayerStack legacy mode (dropout_rate, norm_epsilon) "
          "ignores the given sublayers"
        )
      self._sublayers_initial = [sublayer_legacy_dropout]
      self._sublayers_per_layer = [
        sublayer_legacy_rms_norm,
        sublayer_call_layer,
        sublayer_legacy_dropout,
        sublayer_residual,
      ]
      self._sublayers_final = [
        sublayer_legacy_final_rms_norm,
        sublayer_legacy_dropout,
      ]
    else:
      self._sublayers_initial = list(
        [sublayer_dropout] if sublayers_initial is None else sublayers_initial
      )
      self._sublayers_per_layer = list(
        [
          sublayer_rms_norm,
          sublayer_call_layer,
          sublayer_dropout,
          sublayer_residual,
        ]
        if sublayers_per_layer is None
        else sublayers_per_layer
      )
      self._sublayers_final = list(
        [sublayer_rms_norm, sublayer_dropout]
        if sublayers_final is None
        else sublayers_final
      )

  @property
  def layers(self) -> List[TransformerLayer]:
    """The list of layers."""
    return self._layers

  @property
  def num_layers(self) -> int:
    """The number of layers."""
    return len(self._layers)

  @property
  def dropout_rate(self) -> Optional[float]:
    """The legacy dropout rate, or None."""
    return self._dropout_rate

  @property
  def norm_epsilon(self) -> Optional[float]:
    """The legacy RMS-norm epsilon, or None."""
    return self._norm_epsilon

  @property
  def recompute_grads(self) -> bool:
    """Whether activations are recomputed in the backward pass."""
    return self._recompute_grads

  @property
  def sublayers_initial(self) -> List[Sublayer]:
    """The initial sublayer functions (a copy)."""
    return list(self._sublayers_initial)

  @property
  def sublayers_per_layer(self) -> List[Sublayer]:
    """The per-layer sublayer functions (a copy)."""
    return list(self._sublayers_per_layer)

  @property
  def sublayers_final(self) -> List[Sublayer]:
    """The final sublayer functions (a copy)."""
    return list(self._sublayers_final)

  def _call_sublayers(
    self, sublayers, x: mtf.Tensor, context: Context
  ) -> mtf.Tensor:
    for sublayer in sublayers:
      x = sublayer(x, self, context)
    return x

  def _layer_fn(
    self, x: mtf.Tensor, layer: TransformerLayer, context: Context
  ) -> mtf.Tensor:
    context.current_layer = layer
    context.current_layer_input = x
    y = self._call_sublayers(self._sublayers_per_layer, x, context)
    if y.shape != x.shape:
      raise ValueError(
        "layer %s (%s) returned shape %s for an input of shape %s"
        % (
          layer.name,
          type(layer).__name__,
          y.shape.to_string,
          x.shape.to_string,
        )
      )
    return y

  @staticmethod
  def _record(context: Context, x: mtf.Tensor) -> None:
    if context.layer_outputs is not None:
      context.layer_outputs.append(x)

  def call(self, context: Context, x: mtf.Tensor) -> mtf.Tensor:
    """Runs the stack; appends the activations to context.layer_outputs.

    layer_outputs gets the input of the first layer, the output of every
    layer but the last, and the stack's final output.
    """
    x = self._call_sublayers(self._sublayers_initial, x, context)
    self._record(context, x)
    for lnum, layer in enumerate(self._layers):
      with tf1.variable_scope(layer.name or ""):
        if self._recompute_grads:

          def fn(x, layer=layer):
            return self._layer_fn(x, layer, context)

          x = _recompute_grad(fn, x, context)
        else:
          x = self._layer_fn(x, layer, context)
      if lnum != len(self._layers) - 1:
        self._record(context, x)
      context.layer_index += 1
    x = self._call_sublayers(self._sublayers_final, x, context)
    x = sublayer_mask_padding(x, self, context)
    self._record(context, x)
    return x


@gin.configurable(module=_GIN_MODULE)
class ReversibleLayerStack(LayerStack):
  """A LayerStack as a reversible residual network (RevNet).

  Two residual streams start equal to the (initial-sublayer) input:
  x1 = x2 = x. Layer i computes f_i = its per-layer sublayers (which should
  then omit sublayer_residual, e.g. [sublayer_rms_norm, sublayer_call_layer,
  sublayer_dropout]) and updates
      (x1, x2) <- (x2, x1 + f_i(x2))
  (mtf.layers.reversible_half_residual_and_swap). The stack's output is
  x1 + x2, passed through the final sublayers (padding positions are not
  zeroed, unlike LayerStack; context.layer_outputs gets the stack's input
  once per layer but the last, as in the original). With recompute_grads, the
  backward pass reconstructs each layer's inputs from its outputs instead
  of storing activations.
  """

  def call(self, context: Context, x: mtf.Tensor) -> mtf.Tensor:
    x = self._call_sublayers(self._sublayers_initial, x, context)
    self._record(context, x)
    x1, x1_backwards, x2, x2_backwards = x, None, x, None
    for lnum, layer in enumerate(self._layers):
      with tf1.variable_scope(layer.name or ""):

        def fn(y, layer=layer):
          context.current_layer = layer
          context.current_layer_input = y
          return self._call_sublayers(self._sublayers_per_layer, y, context)

        x1, x1_backwards, x2, x2_backwards = (
          mtf.layers.reversible_half_residual_and_swap(
            x1,
            x1_backwards,
            x2,
            x2_backwards,
            fn,
            recompute_grads=self._recompute_grads,
          )
        )
      if lnum != len(self._layers) - 1:
        # As the original: the stack's input again, not the layer's output.
        self._record(context, x)
      context.layer_index += 1
    x = x1 + x2
    # Unlike LayerStack, the original leaves padding positions unmasked.
    x = self._call_sublayers(self._sublayers_final, x, context)
    self._record(context, x)
    return x


@gin.configurable(module=_GIN_MODULE)
def make_layer_stack(
  layers=gin.REQUIRED,
  layer_stack_cls=LayerStack,
  num_layers: int = 6,
  block_scope: bool = True,
):
  """num_layers blocks of `layers`, as a layer_stack_cls.

  Each entry of `layers` is a TransformerLayer class, or a list/tuple
  (class, name) / (class, kwargs) / (class, name, kwargs). Layer names are
  `block_%03d/<name or layer_%03d>` (index within the block) with
  block_scope, else `<name or layer_%03d>` (index in the whole stack).

  Example:
    >>> from transformer.transformer_layers import DenseReluDense
    >>> from transformer.transformer_layers import SelfAttention
    >>> stack = make_layer_stack(
    ...     [SelfAttention, (DenseReluDense, "ffn", {"hidden_size": 16})],
    ...     num_layers=2)
    >>> for layer in stack.layers:
    ...   print(layer.name, type(layer).__name__)
    block_000/layer_000 SelfAttention
    block_000/ffn DenseReluDense
    block_001/layer_000 SelfAttention
    block_001/ffn DenseReluDense
    >>> stack.layers[1].hidden_size
    16

  Args:
    layers: the layers of one block (see above).
    layer_stack_cls: the class built (LayerStack or a subclass).
    num_layers: the number of blocks.
    block_scope: name the layers block_%03d/<name> (see above).

  Returns:
    A layer_stack_cls of num_layers * len(layers) layers.

  Raises:
    ValueError: if `layers` is not given.
  """
  if layers is gin.REQUIRED or layers is None:
    raise ValueError("make_layer_stack: parameter 'layers' is required")
  stack = []
  for block in range(num_layers):
    for n, entry in enumerate(layers):
      cls, name, kwargs = _parse_layer_entry(entry)
      if block_scope:
        full_name = "block_%03d/%s" % (block, name or "layer_%03d" % n)
      else:
        full_name = name or "layer_%03d" % len(stack)
      layer = cls(**kwargs)
      layer.set_name(full_name)
      stack.append(layer)
  return layer_stack_cls(stack)


def _parse_layer_entry(entry):
  """(class, name or None, kwargs dict) of one make_layer_stack entry."""
  if not isinstance(entry, (list, tuple)):
    return entry, None, {}
  if not entry or len(entry) > 3:
    raise ValueError(
      "make_layer_stack: a layer entry must be a class or "
      "(class, [name], [kwargs]), got %r" % (entry,)
    )
  cls, name, kwargs = entry[0], None, {}
  for item in entry[1:]:
    if isinstance(item, str):
      name = item
    elif isinstance(item, dict):
      kwargs = item
    elif item is not None:
      raise ValueError(
        "make_layer_stack: in layer entry %r, %r is neither a "
        "name string nor a kwargs dict" % (entry, item)
      )
  return cls, name, kwargs
