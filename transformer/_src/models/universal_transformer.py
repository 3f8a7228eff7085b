"""Universal Transformer layer stack, as mesh-tensorflow 0.1.21 builds it.

`UTLayerStack` runs its layers (one "block", e.g. SelfAttention +
DenseReluDense) num_vanilla_transformer_layers times before and/or after a
recurrence, then a final layer norm. Every pass of the block, vanilla or
recurrent, uses the same variables: the block's layers live under their own
names (`<layer name>/<ClassName>/...`) and each layer's input norm is a
true layer norm (`<layer name>/layer_prepostprocess/layer_norm/
layer_norm_{scale,bias}`); the final norm is `layer_prepostprocess/
layer_norm/...` in the stack's scope. With a sequence id, the input of every
norm (not the final one) and the stack's output are multiplied by the
padding mask. The recurrence is one of:

  "basic":   x <- block(step_signal(x, step))              num_rec_steps times
  "highway": s = step_signal(x, step); t = block(s);
             x <- s * carry + t * transform                num_rec_steps times
  "act":     adaptive computation time, act_max_steps + 1 steps (below).

The step signal (add_step_timing_signal) is the learned `layer_embedding`
[layer: num_steps, d_model] (N(0, d^-1/2), times d^1/2) or a sinusoid of the
step, added or concatenated; with "concat" a dense layer without bias
(new `dense*/kernel` at every step) projects the result back to d_model. The position signal is
never added by the recurrence (add_position_timing_signal_func computes it
when called directly).

ACT (act_type "basic", per position; "global" halts whole sequences with the
mean probability; "random" draws the probability; "accumulated" adds the
weighted states): at every step the halting probability p is
sigmoid(dense(state)) (`sigmoid_activation_for_pondering/dense/kernel`,
`.../dense_1/bias`, shared by the steps); positions still running whose sum
would pass 1 - act_epsilon halt and get the remainder as update weight,
others get p; the output is the update-weighted running mix of the
transformed states. A position's halting sum only stops the recurrence
weights, not the steps: all act_max_steps + 1 steps run, and the learned
step signal of step act_max_steps is zero (past the end of
`layer_embedding`).

Gates are ffn_layer_multi_inputs: a sigmoid dense layer with bias over the
layer-normed gate inputs concatenated along d_model; the normed inputs
replace the caller's list entries, so a second gate on the same list
normalises them again. The highway recurrence's gates get new variables at
every step (`dense/kernel`, `dense_1/bias`, `dense_2/kernel`, ...); a gated
residual's (use_gated_transformer) are `<layer name>/<ClassName>/dense*`,
shared by all passes, as the halting unit's.

The timing signals are UTTimingSignals' (ut_timing_signals), a base of
UTLayerStack; this module owns the stack: the block, its gates, the
recurrences and ACT.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple, Union

import gin
import tensorflow as tf

import mesh_tensorflow as mtf
from transformer._src.layers.context import Context
from transformer._src.layers.context import TransformerLayer
from transformer._src.models.ut_timing_signals import UTTimingSignals

__all__ = ["UTLayerStack"]

_GIN_MODULE = "mesh_tensorflow.transformer.universal_transformer"
_CHOICES = {
  "act_type": ("basic", "global", "random", "accumulated"),
  "recurrence_type": ("basic", "highway", "act"),
  "add_or_concat_timing_signal": ("add", "concat"),
  "step_timing_signal_type": ("learned", "sinusoid"),
  "gate_ffn_layer": ("dense", "dense_relu_dense"),
  "gating_type": ("highway", "gru"),
}

tf1 = tf.compat.v1


def _ensemble_dims(context: Context) -> List[mtf.Dimension]:
  return list(getattr(context.model, "ensemble_dims", None) or [])


def _record(context: Context, x: mtf.Tensor) -> None:
  if context.layer_outputs is not None:
    context.layer_outputs.append(x)


def _masked(x: mtf.Tensor, mask: Optional[mtf.Tensor]) -> mtf.Tensor:
  return x if mask is None else x * mask


def _dense_in_scopes(
  context: Context,
  x: mtf.Tensor,
  new_dim: mtf.Dimension,
  scope_index: int,
  expert_dims: Sequence[mtf.Dimension],
  activation=None,
  kernel_initializer=None,
) -> mtf.Tensor:
  """activation(x W + b) over x's last dim, as the scope_index-th dense layer.

  The kernel and the bias are in their own scopes, `dense_<2k>/kernel` and
  `dense_<2k+1>/bias` for scope_index k (`dense` for 0): the names the
  scope_index-th dense layer with default scopes gets in a freshly entered
  scope, so that calls in a scope entered again share the variables.
  """

  def scope(i):
    return "dense" if i == 0 else "dense_%d" % i

  reduced_dim = x.shape.dims[-1]
  if reduced_dim == new_dim:
    renamed = mtf.Dimension("_" + reduced_dim.name, reduced_dim.size)
    x = mtf.rename_dimension(x, reduced_dim.name, renamed.name)
    reduced_dim = renamed
  expert_dims = list(expert_dims)
  kernel = mtf.layers.get_dense_kernel_weights(
    x,
    [new_dim],
    [reduced_dim],
    expert_dims,
    kernel_initializer,
    name=scope(2 * scope_index),
    variable_dtype=context.variable_dtype,
  )
  with tf1.variable_scope(scope(2 * scope_index + 1)):
    bias = mtf.get_variable(
      context.mesh,
      "bias",
      mtf.Shape(expert_dims + [new_dim]),
      initializer=tf1.zeros_initializer(),
      dtype=context.variable_dtype,
    )
  kept = [d for d in x.shape.dims if d != reduced_dim]
  y = mtf.einsum([x, kernel], mtf.Shape(kept + [new_dim])) + bias
  return y if activation is None else activation(y)


@gin.configurable(module=_GIN_MODULE)
class UTLayerStack(UTTimingSignals, TransformerLayer):
  """A Universal Transformer: the layers form one block applied recurrently.

  gin REQUIRED parameters (17): act_type, recurrence_type, act_max_steps,
  act_epsilon, num_rec_steps, num_inrecurrence_layers, position_start_index,
  add_or_concat_timing_signal, step_timing_signal_type,
  add_position_timing_signal, add_step_timing_signal,
  mix_with_transformer_before_ut, mix_with_transformer_after_ut,
  gates_inputs, gate_ffn_layer, use_gated_transformer, gating_type.

  Example (2 recurrent steps of one attention + feed-forward block):
    >>> _ = gin.parse_config('''
    ... UTLayerStack.act_type = "basic"
    ... UTLayerStack.recurrence_type = "basic"
    ... UTLayerStack.act_max_steps = 4
    ... UTLayerStack.act_epsilon = 0.01
    ... UTLayerStack.num_rec_steps = 2
    ... UTLayerStack.num_inrecurrence_layers = 1
    ... UTLayerStack.position_start_index = None
    ... UTLayerStack.add_or_concat_timing_signal = "add"
    ... UTLayerStack.step_timing_signal_type = "learned"
    ... UTLayerStack.add_position_timing_signal = False
    ... UTLayerStack.add_step_timing_signal = True
    ... UTLayerStack.mix_with_transformer_before_ut = False
    ... UTLayerStack.mix_with_transformer_after_ut = False
    ... UTLayerStack.gates_inputs = "i"
    ... UTLayerStack.gate_ffn_layer = "dense"
    ... UTLayerStack.use_gated_transformer = False
    ... UTLayerStack.gating_type = "highway"
    ... ''')
    >>> from transformer import transformer
    >>> from transformer.transformer_layers import DenseReluDense
    >>> from transformer.transformer_layers import SelfAttention
    >>> block = transformer.make_layer_stack(
    ...     [(SelfAttention, {"num_heads": 2, "key_value_size": 4}),
    ...      (DenseReluDense, {"hidden_size": 16})], num_layers=1)
    >>> stack = UTLayerStack(block.layers)
    >>> gin.clear_config()
    >>> lm = transformer.Unitransformer(
    ...     stack, d_model=8, input_vocab_size=16, output_vocab_size=16,
    ...     autoregressive=True, max_length=4, vocab_divisor=1)
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> ids = converter.convert_np_array_to_mtf_tensor(
    ...     [[3, 5, 7, 1]], ["batch", "length"])
    >>> logits, _ = lm.call_simple(ids, ids, compute_loss=False)
    >>> converter.convert_mtf_tensor_to_np_array(logits).shape
    (1, 4, 16)
    >>> for v in converter.graph.all_variables:  # one q for both steps
    ...   if "layer_embedding" in v.name or "SelfAttention/q" in v.name:
    ...     print(v.name[len("transformer/"):], v.shape)
    layer_embedding Shape[layer=2, d_model=8]
    block_000/layer_000/SelfAttention/q Shape[d_model=8, heads=8]
  """

  def __init__(
    self,
    layers: Sequence[TransformerLayer],
    dropout_rate: float = 0.0,
    norm_epsilon: float = 1e-6,
    num_vanilla_transformer_layers: int = 2,
    couple_carry_transform_gates: bool = True,
    act_type: str = gin.REQUIRED,
    recurrence_type: str = gin.REQUIRED,
    act_max_steps: int = gin.REQUIRED,
    act_epsilon: float = gin.REQUIRED,
    num_rec_steps: int = gin.REQUIRED,
    num_inrecurrence_layers: int = gin.REQUIRED,
    position_start_index: Optional[Union[int, str]] = gin.REQUIRED,
    add_or_concat_timing_signal: str = gin.REQUIRED,
    step_timing_signal_type: str = gin.REQUIRED,
    add_position_timing_signal: bool = gin.REQUIRED,
    add_step_timing_signal: bool = gin.REQUIRED,
    mix_with_transformer_before_ut: bool = gin.REQUIRED,
    mix_with_transformer_after_ut: bool = gin.REQUIRED,
    gates_inputs: str = gin.REQUIRED,
    gate_ffn_layer: str = gin.REQUIRED,
    use_gated_transformer: bool = gin.REQUIRED,
    gating_type: str = gin.REQUIRED,
  ):
    """Creates the stack.

    Args:
      layers: the TransformerLayers of the block.
      dropout_rate: dropout of the stack's input, every layer's output and
        the final output (training only).
      norm_epsilon: epsilon of the layer norms.
      num_vanilla_transformer_layers: passes of the block before/after the
        recurrence when mixing.
      couple_carry_transform_gates: highway carry gate = 1 - transform gate
        (else a second gate).
      act_type: the ACT variant: "basic", "global", "random" or
        "accumulated".
      recurrence_type: "basic", "highway" or "act".
      act_max_steps: ACT runs act_max_steps + 1 steps; the learned step
        signal has act_max_steps entries.
      act_epsilon: ACT: a position halts at summed probability > 1 - eps.
      num_rec_steps: recurrence steps ("basic" and "highway").
      num_inrecurrence_layers: passes of the block per recurrence step.
      position_start_index: offset of the positions in
        add_position_timing_signal_func: None (0), "random" or "step".
      add_or_concat_timing_signal: "add" the step signal, or "concat" it.
      step_timing_signal_type: "learned" (`layer_embedding`) or "sinusoid".
      add_position_timing_signal: with "concat", project the concatenation
        back to d_model.
      add_step_timing_signal: add the step signal at every step.
      mix_with_transformer_before_ut: vanilla passes before the recurrence.
      mix_with_transformer_after_ut: vanilla passes after the recurrence.
      gates_inputs: what highway gates read, letters of "ist" (s: the
        step's input state, t: the transformed state, i: the recurrence
        input), in that order.
      gate_ffn_layer: the gate network, "dense" or "dense_relu_dense".
      use_gated_transformer: gate each layer's output with its input.
      gating_type: that gate, "highway" or "gru".

    Raises:
      ValueError: naming the parameter, if one is missing or invalid.
    """
    given = dict(
      act_type=act_type,
      recurrence_type=recurrence_type,
      act_max_steps=act_max_steps,
      act_epsilon=act_epsilon,
      num_rec_steps=num_rec_steps,
      num_inrecurrence_layers=num_inrecurrence_layers,
      position_start_index=position_start_index,
      add_or_concat_timing_signal=add_or_concat_timing_signal,
      step_timing_signal_type=step_timing_signal_type,
      add_position_timing_signal=add_position_timing_signal,
      add_step_timing_signal=add_step_timing_signal,
      mix_with_transformer_before_ut=mix_with_transformer_before_ut,
      mix_with_transformer_after_ut=mix_with_transformer_after_ut,
      gates_inputs=gates_inputs,
      gate_ffn_layer=gate_ffn_layer,
      use_gated_transformer=use_gated_transformer,
      gating_type=gating_type,
    )
    for name, value in given.items():
      if value is gin.REQUIRED:
        raise ValueError("UTLayerStack: parameter %r is required" % name)
      if name in _CHOICES and value not in _CHOICES[name]:
        raise ValueError(
          "UTLayerStack: unknown %s %r; expected one of %s"
          % (name, value, list(_CHOICES[name]))
        )
      setattr(self, name, value)
    if position_start_index not in (None, 0, "random", "step"):
      if not isinstance(position_start_index, int):
        raise ValueError(
          "UTLayerStack: position_start_index must be None, an int, "
          "'random' or 'step', got %r" % (position_start_index,)
        )
    self._layers = list(layers)
    self._dropout_rate = dropout_rate
    self._norm_epsilon = norm_epsilon
    self.num_vanilla_transformer_layers = num_vanilla_transformer_layers
    self.couple_carry_transform_gates = couple_carry_transform_gates

  @property
  def layers(self) -> List[TransformerLayer]:
    """The layers of the block."""
    return self._layers

  @property
  def num_layers(self) -> int:
    """The number of layers of the block."""
    return len(self._layers)

  @property
  def num_steps(self) -> int:
    """Steps of the step signal: act_max_steps for ACT, else num_rec_steps."""
    if self.recurrence_type == "act":
      return self.act_max_steps
    return self.num_rec_steps

  # -- norms and dropout -----------------------------------------------------

  def _layer_norm(self, context: Context, x: mtf.Tensor) -> mtf.Tensor:
    return mtf.layers.layer_norm(
      x, context.model.model_dim, epsilon=self._norm_epsilon
    )

  def _dropout(self, context: Context, x: mtf.Tensor) -> mtf.Tensor:
    if not (context.train and self._dropout_rate > 0):
      return x
    return mtf.dropout(
      x,
      context.train,
      rate=self._dropout_rate,
      noise_shape=mtf.Shape(context.batch_dims + [context.model.model_dim]),
    )

  # -- the block and its gates -----------------------------------------------

  def vanilla_transformer_layer(
    self, context: Context, x: mtf.Tensor, mask: Optional[mtf.Tensor]
  ) -> mtf.Tensor:
    """One pass of the block: x + dropout(layer(layer_norm(x * mask))).

    Every pass uses the same variables; with use_gated_transformer the
    layer's output is gated with its input first. Every layer output but
    the block's last goes to context.layer_outputs.

    Args:
      context: the Context of the call.
      x: the activations [batch..., length, d_model].
      mask: the padding mask [batch..., length], or None.

    Returns:
      The output, shaped as x.

    Raises:
      ValueError: if a layer changes the shape.
    """
    for lnum, layer in enumerate(self._layers):
      with tf1.variable_scope(layer.name or ""):
        norm_x = self._layer_norm(context, _masked(x, mask))
        context.current_layer = layer
        context.current_layer_input = x
        with tf1.variable_scope(type(layer).__name__):
          y = layer.call(context, norm_x)
          if y.shape != x.shape:
            raise ValueError(
              "layer %s (%s) returned shape %s for an input of shape %s"
              % (layer.name, type(layer).__name__, y.shape, x.shape)
            )
          if self.use_gated_transformer:
            y = self.gating(context, x, y, mask)
        x += self._dropout(context, y)
      if lnum != len(self._layers) - 1:
        _record(context, x)
      context.layer_index += 1
    return x

  def _transition(
    self, context: Context, x: mtf.Tensor, mask: Optional[mtf.Tensor]
  ) -> mtf.Tensor:
    for _ in range(self.num_inrecurrence_layers):
      x = self.vanilla_transformer_layer(context, x, mask)
    return x

  def ffn_layer_multi_inputs(
    self,
    context: Context,
    mask: Optional[mtf.Tensor],
    inputs_list: List[mtf.Tensor],
    ffn_layer_type: str = "dense",
    kernel_initializer=None,
    activation=None,
    preprocess: bool = False,
    postprocess: bool = False,
  ) -> mtf.Tensor:
    """A feed-forward layer over several inputs concatenated along d_model.

    "dense" is activation(dense(inputs) + bias) (new default-named `dense*`
    variables at every call); "dense_relu_dense" is
    mtf.layers.dense_relu_dense with a d_model-sized hidden layer (no
    activation).

    Args:
      context: the Context of the call.
      mask: the padding mask [batch..., length] applied before the norms,
        or None.
      inputs_list: the inputs [batch..., length, d_model]; with preprocess
        its entries are replaced by their layer norms.
      ffn_layer_type: "dense" or "dense_relu_dense".
      kernel_initializer: optional kernel initializer ("dense").
      activation: optional function applied to the "dense" output.
      preprocess: layer-norm every input first.
      postprocess: layer-norm the output.

    Returns:
      The output [batch..., length, d_model].

    Raises:
      ValueError: for no inputs or an unknown ffn_layer_type.
    """
    return self._ffn(
      context,
      mask,
      inputs_list,
      ffn_layer_type,
      kernel_initializer,
      activation,
      preprocess,
      postprocess,
    )

  def _ffn(
    self,
    context: Context,
    mask: Optional[mtf.Tensor],
    inputs_list: List[mtf.Tensor],
    ffn_layer_type: str,
    kernel_initializer,
    activation,
    preprocess: bool,
    postprocess: bool,
    scope_index: Optional[int] = None,
  ) -> mtf.Tensor:
    """ffn_layer_multi_inputs; "dense" as _dense_in_scopes if scope_index."""
    if not inputs_list:
      raise ValueError("ffn_layer_multi_inputs: need at least one input")
    model_dim = context.model.model_dim
    if preprocess:
      for i, inputs in enumerate(inputs_list):
        inputs_list[i] = self._layer_norm(context, _masked(inputs, mask))
    ffn_inputs = inputs_list[0]
    if len(inputs_list) > 1:
      ffn_inputs = mtf.concat(inputs_list, model_dim.name)
    if ffn_layer_type == "dense" and scope_index is not None:
      output = _dense_in_scopes(
        context,
        ffn_inputs,
        model_dim,
        scope_index,
        _ensemble_dims(context),
        activation,
        kernel_initializer,
      )
    elif ffn_layer_type == "dense":
      output = mtf.layers.dense(
        ffn_inputs,
        [model_dim],
        reduced_dims=[ffn_inputs.shape.dims[-1]],
        activation=activation,
        use_bias=True,
        variable_dtype=context.variable_dtype,
        expert_dims=_ensemble_dims(context),
        kernel_initializer=kernel_initializer,
      )
    elif ffn_layer_type == "dense_relu_dense":
      output = mtf.layers.dense_relu_dense(
        ffn_inputs, hidden_channels=model_dim, is_training=context.train
      )
    else:
      raise ValueError("Unknown ffn_layer type: %s" % ffn_layer_type)
    if postprocess:
      output = self._layer_norm(context, _masked(output, mask))
    return output

  def _gate(
    self,
    context: Context,
    mask: Optional[mtf.Tensor],
    inputs_list: List[mtf.Tensor],
    scope_index: Optional[int] = None,
  ) -> mtf.Tensor:
    return self._ffn(
      context,
      mask,
      inputs_list,
      self.gate_ffn_layer,
      None,
      mtf.sigmoid,
      True,
      False,
      scope_index,
    )

  def gating(
    self,
    context: Context,
    x: mtf.Tensor,
    transformed_x: mtf.Tensor,
    mask: Optional[mtf.Tensor],
  ) -> mtf.Tensor:
    """Combines a layer's input and output through learned sigmoid gates.

    The gates' variables are `dense/kernel`, `dense_1/bias`, ... in the
    current scope (the same at every call).

    "highway": x * carry + transformed_x * transform, the transform gate
    reading norm(x) and the carry gate norm(norm(x)). "gru": update gate
    u on [norm(x), norm(transformed_x)], reset gate r on those normed again,
    candidate c on [norm(r * x), norm(transformed_x)]; the output is
    (1 - u) * transformed_x + u * c.

    Args:
      context: the Context of the call.
      x: the layer input [batch..., length, d_model].
      transformed_x: the layer output, shaped as x.
      mask: the padding mask [batch..., length], or None.

    Returns:
      The gated output, shaped as x.
    """
    if self.gating_type == "highway":
      gate_inputs = [x]
      transform = self._gate(context, mask, gate_inputs, 0)
      carry = self._gate(context, mask, gate_inputs, 1)
      return x * carry + transformed_x * transform
    gate_inputs = [x, transformed_x]
    update = self._gate(context, mask, gate_inputs, 0)
    reset = self._gate(context, mask, gate_inputs, 1)
    candidate = self._gate(context, mask, [reset * x, transformed_x], 2)
    return (1.0 - update) * transformed_x + update * candidate

  # -- the recurrences -------------------------------------------------------

  def ut_basic(
    self, context: Context, x: mtf.Tensor, mask: Optional[mtf.Tensor]
  ) -> mtf.Tensor:
    """The "basic" recurrence: num_rec_steps passes with the step signal.

    Args:
      context: the Context of the call.
      x: the activations [batch..., length, d_model].
      mask: the padding mask [batch..., length], or None.

    Returns:
      The output, shaped as x.
    """
    for step in range(self.num_rec_steps):
      x = self._transition(
        context, self.step_preprocess(context, x, step), mask
      )
    return x

  def ut_highway(
    self,
    context: Context,
    layer_inputs: Tuple[mtf.Tensor, mtf.Tensor, mtf.Tensor],
    mask: Optional[mtf.Tensor],
  ) -> mtf.Tensor:
    """The highway recurrence: state * carry + transformed * transform.

    Args:
      context: the Context of the call.
      layer_inputs: (state, inputs, memory): the initial state, the
        recurrence input the gates read ("i") and an unused memory.
      mask: the padding mask [batch..., length], or None.

    Returns:
      The output, shaped as the state.
    """
    state, inputs = layer_inputs[0], layer_inputs[1]
    for step in range(self.num_rec_steps):
      transformed = self._transition(
        context, self.step_preprocess(context, state, step), mask
      )
      named = {"s": state, "t": transformed, "i": inputs}
      gate_inputs = [named[c] for c in "sti" if c in self.gates_inputs]
      transform = self._gate(context, mask, gate_inputs)
      if self.couple_carry_transform_gates:
        carry = 1.0 - transform
      else:
        carry = self._gate(context, mask, gate_inputs)
      mtf.scalar_summary(
        "highway_transform_gate_layer", mtf.reduce_mean(transform)
      )
      mtf.scalar_summary("highway_carry_gate_layer", mtf.reduce_mean(carry))
      state = state * carry + transformed * transform
    return state

  def _halting_probability(
    self, context: Context, state: mtf.Tensor, update_shape: mtf.Shape
  ) -> mtf.Tensor:
    """Each position's (or sequence's) halting probability of a step."""
    if self.act_type == "random":
      return mtf.random_uniform(
        context.mesh, update_shape, dtype=context.activation_dtype
      )
    # One unit for all steps (`dense/kernel`, `dense_1/bias`).
    last_dim = state.shape.dims[-1]
    with tf1.variable_scope("sigmoid_activation_for_pondering"):
      p = _dense_in_scopes(
        context,
        state,
        mtf.Dimension(last_dim.name, 1),
        0,
        [],
        mtf.sigmoid,
      )
    p = mtf.reshape(p, p.shape.dims[:-1])
    if self.act_type == "global":
      p = mtf.reduce_mean(p, reduced_dim=p.shape.dims[1])
    return p

  def act_layer(
    self, context: Context, x: mtf.Tensor, mask: Optional[mtf.Tensor]
  ) -> mtf.Tensor:
    """The ACT recurrence: act_max_steps + 1 update-weighted steps.

    The halting probabilities, remainders and step counts have x's shape
    (without its last dimension for act_type "global"); the mean step count
    is the summary `ponder_times`.

    Args:
      context: the Context of the call.
      x: the activations [batch..., length, d_model].
      mask: the padding mask [batch..., length], or None.

    Returns:
      The output, shaped as x.
    """
    dtype = context.activation_dtype
    dims = x.shape.dims
    update_shape = mtf.Shape(dims[:2] if self.act_type == "global" else dims)
    halting = mtf.zeros(context.mesh, update_shape, dtype=dtype)
    remainders = mtf.zeros(context.mesh, update_shape, dtype=dtype)
    n_updates = mtf.zeros(context.mesh, update_shape, dtype=dtype)
    output = mtf.zeros_like(x)
    threshold = 1.0 - self.act_epsilon
    step = mtf.constant(context.mesh, 0, dtype=tf.int32)
    state = x
    for _ in range(self.act_max_steps + 1):
      state = self.step_preprocess(context, state, step)
      p = self._halting_probability(context, state, update_shape)
      running = mtf.cast(mtf.less(halting, 1.0), dtype)
      proposed = halting + p * running
      new_halted = mtf.cast(mtf.greater(proposed, threshold), dtype) * running
      running = mtf.cast(mtf.less_equal(proposed, threshold), dtype) * running
      halting += p * running
      remainders += new_halted * (1.0 - halting)
      halting += new_halted * remainders
      n_updates += running + new_halted
      update_weights = p * running + new_halted * remainders
      state = self._transition(context, state, mask)
      if self.act_type == "accumulated":
        output = state * update_weights + output
      else:
        output = state * update_weights + output * (1.0 - update_weights)
      step += 1
    mtf.scalar_summary("ponder_times", mtf.reduce_mean(n_updates))
    return output

  # -- the stack -------------------------------------------------------------

  def call(self, context: Context, x: mtf.Tensor) -> mtf.Tensor:
    """Dropout, [vanilla passes], recurrence, [vanilla], final norm, dropout.

    context.layer_outputs gets the stack input, every layer output but a
    block's last, and the final output.
    """
    mask = None
    if isinstance(context.sequence_id, mtf.Tensor):
      mask = mtf.cast(
        mtf.not_equal(context.sequence_id, 0), context.activation_dtype
      )
    x = self._dropout(context, x)
    _record(context, x)
    if self.mix_with_transformer_before_ut:
      for _ in range(self.num_vanilla_transformer_layers):
        x = self.vanilla_transformer_layer(context, x, mask)
    if self.recurrence_type == "act":
      x = self.act_layer(context, x, mask)
    elif self.recurrence_type == "basic":
      x = self.ut_basic(context, x, mask)
    else:
      x = self.ut_highway(context, (x, x, x), mask)
    if self.mix_with_transformer_after_ut:
      for _ in range(self.num_vanilla_transformer_layers):
        x = self.vanilla_transformer_layer(context, x, mask)
    x = self._dropout(context, self._layer_norm(context, x))
    x = _masked(x, mask)
    _record(context, x)
    return x
