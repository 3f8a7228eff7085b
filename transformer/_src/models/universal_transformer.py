"""Universal Transformer (Dehghani et al. 2019): one block, applied recurrently.

`UTLayerStack` applies its layers (one "block", e.g. SelfAttention +
DenseReluDense) again and again with the same weights. Before every
recurrence step a timing signal may be added: the sinusoid position signal
and/or a per-step signal (learned or sinusoid). The recurrence is one of:

  "basic":   x <- T(P(x, step))                      for num_rec_steps steps
  "highway": s = P(x, step); t = T(s); x <- t * g + s * c
  "skip":    s = P(x, step); t = T(s); x <- t * g + x0 * c    (x0: UT input)
  "act":     adaptive computation time (act_type "basic"): every position
             halts once its summed halting probability exceeds
             1 - act_epsilon (or after act_max_steps steps); the output
             interpolates the step outputs with the update weights, and the
             ponder loss act_loss_weight * mean(steps + remainder) is
             appended to context.losses.

P is the timing signal, T the transition (the block, num_inrecurrence_layers
times), g = sigmoid(gate_ffn_layer(gates_inputs)) the transform gate and
c = 1 - g (couple_carry_transform_gates) or a second gate. Optionally
num_vanilla_transformer_layers ordinary (non-shared) passes of the block
run before and/or after the recurrence, and every layer's residual can be
gated (use_gated_transformer, gating_type "highway" or "gru").

ACT is unrolled to act_max_steps static steps: positions that halted get
update weight 0, so the result equals a dynamic halting loop, gradients
flow, and incremental decoding sees the same layer calls in every mode.

Variables: the block's layers and norms exactly as a legacy LayerStack
(`<layer name>/<ClassName>/...`, `<layer name>/layer_norm/scale`,
`final_layer_norm/scale`), created once and shared by all steps; the vanilla
passes under `vanilla_before_%03d/` / `vanilla_after_%03d/`; the UT's own
under `universal_transformer/` (`step_embedding`, `timing_concat/kernel`,
`act_halting/{kernel,bias}`, `transform_gate/...`, `carry_gate/...`) and the
residual gates under `<layer name>/gating/`.

The original's building blocks are methods too (get_timing_signal_1d,
add_position_timing_signal_func, add_step_timing_signal_func,
get_layer_timing_signal_learned_1d, vanilla_transformer_layer,
ffn_layer_multi_inputs, gating, act_layer); those with variables create them
in the caller's scope: `layer_embedding`, `dense*/{kernel,bias}` and the
`layer_prepostprocess/layer_norm/...` of the gates' input norms.
"""

from __future__ import annotations

import functools
import math
from typing import Dict, List, Optional, Sequence, Tuple, Union

import gin
import tensorflow as tf

import mesh_tensorflow as mtf
from transformer._src.layers.context import Context
from transformer._src.layers.context import TransformerLayer
from transformer._src.layers.embeddings import (
  sinusoid_positional_embedding_weights,
)
from transformer._src.models.layer_stack import LayerStack
from transformer._src.models.layer_stack import sublayer_mask_padding

__all__ = ["UTLayerStack"]

_GIN_MODULE = "mesh_tensorflow.transformer.universal_transformer"
_SCOPE = "universal_transformer"
_CHOICES = {
  "act_type": ("basic",),
  "recurrence_type": ("basic", "highway", "skip", "act"),
  "add_or_concat_timing_signal": ("add", "concat"),
  "step_timing_signal_type": ("learned", "sinusoid"),
  "gate_ffn_layer": ("dense", "dense_relu_dense"),
  "gating_type": ("highway", "gru"),
}
_BOOLS = (
  "add_position_timing_signal",
  "add_step_timing_signal",
  "mix_with_transformer_before_ut",
  "mix_with_transformer_after_ut",
  "use_gated_transformer",
)

tf1 = tf.compat.v1


def _ensemble_dims(context: Context):
  return list(getattr(context.model, "ensemble_dims", None) or [])


@gin.configurable(module=_GIN_MODULE)
class UTLayerStack(LayerStack):
  """A Universal Transformer: the layers form one block applied recurrently.

  gin REQUIRED parameters (17): act_type, recurrence_type, act_max_steps,
  act_epsilon, num_rec_steps, num_inrecurrence_layers, position_start_index,
  add_or_concat_timing_signal, step_timing_signal_type,
  add_position_timing_signal, add_step_timing_signal,
  mix_with_transformer_before_ut, mix_with_transformer_after_ut,
  gates_inputs, gate_ffn_layer, use_gated_transformer, gating_type.

  Example (3 recurrent steps of one attention + feed-forward block):
    >>> _ = gin.parse_config('''
    ... UTLayerStack.act_type = "basic"
    ... UTLayerStack.recurrence_type = "basic"
    ... UTLayerStack.act_max_steps = 4
    ... UTLayerStack.act_epsilon = 0.01
    ... UTLayerStack.num_rec_steps = 3
    ... UTLayerStack.num_inrecurrence_layers = 1
    ... UTLayerStack.position_start_index = 0
    ... UTLayerStack.add_or_concat_timing_signal = "add"
    ... UTLayerStack.step_timing_signal_type = "learned"
    ... UTLayerStack.add_position_timing_signal = True
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
    >>> for v in converter.graph.all_variables:  # one q for the 3 steps
    ...   if "step" in v.name or "SelfAttention/q" in v.name:
    ...     print(v.name[len("transformer/"):], v.shape)
    universal_transformer/step_embedding Shape[ut_steps=3, d_model=8]
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
    position_start_index: int = gin.REQUIRED,
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
    *,
    act_loss_weight: float = 0.01,
    act_halting_bias_init: float = 1.0,
  ):
    """Creates the stack.

    Args:
      layers: the TransformerLayers of the recurrent block.
      dropout_rate: dropout after the embedding, every layer and the final
        norm (legacy LayerStack sublayers).
      norm_epsilon: epsilon of the RMS norms.
      num_vanilla_transformer_layers: ordinary passes of the block (own
        weights) before/after the recurrence when mixing.
      couple_carry_transform_gates: highway/skip carry gate = 1 - transform.
      act_type: the ACT variant: "basic".
      recurrence_type: "basic", "highway", "skip" or "act".
      act_max_steps: ACT: the most steps a position takes.
      act_epsilon: ACT: a position halts at summed probability > 1 - eps.
      num_rec_steps: recurrence steps (all types but "act").
      num_inrecurrence_layers: passes of the block per recurrence step.
      position_start_index: offset added to positions in the position
        timing signal.
      add_or_concat_timing_signal: "add" the signal, or "concat" it and
        project back to d_model (`timing_concat/kernel`).
      step_timing_signal_type: "learned" (`step_embedding`) or "sinusoid".
      add_position_timing_signal: add the position signal every step.
      add_step_timing_signal: add the step signal every step.
      mix_with_transformer_before_ut: vanilla passes before the recurrence.
      mix_with_transformer_after_ut: vanilla passes after the recurrence.
      gates_inputs: what highway/skip gates read, letters of "ist" (i: the
        UT input, s: the step's input state, t: the transformed state).
      gate_ffn_layer: the gate network, "dense" or "dense_relu_dense".
      use_gated_transformer: gate each layer's residual connection.
      gating_type: that gate, "highway" (g*y + (1-g)*x) or "gru".
      act_loss_weight: weight of the ACT ponder loss.
      act_halting_bias_init: initial bias of the halting unit.

    Raises:
      ValueError: naming the parameter, if one is missing or invalid.
    """
    super().__init__(
      layers, dropout_rate=dropout_rate, norm_epsilon=norm_epsilon
    )
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
      if name in _BOOLS and not isinstance(value, bool):
        raise ValueError(
          "UTLayerStack: %s must be a bool, got %r" % (name, value)
        )
    if position_start_index is None:  # The original's "no offset".
      position_start_index = given["position_start_index"] = 0
    for name, value, minimum in (
      ("act_max_steps", act_max_steps, 1),
      ("num_rec_steps", num_rec_steps, 1),
      ("num_inrecurrence_layers", num_inrecurrence_layers, 1),
      ("position_start_index", position_start_index, 0),
      ("num_vanilla_transformer_layers", num_vanilla_transformer_layers, 0),
    ):
      if (
        not isinstance(value, int) or isinstance(value, bool) or value < minimum
      ):
        raise ValueError(
          "UTLayerStack: %s must be an int >= %d, got %r"
          % (name, minimum, value)
        )
    if not 0.0 < act_epsilon < 1.0:
      raise ValueError(
        "UTLayerStack: act_epsilon must be in (0, 1), got %r" % (act_epsilon,)
      )
    if (
      not isinstance(gates_inputs, str)
      or not gates_inputs
      or set(gates_inputs) - set("ist")
    ):
      raise ValueError(
        "UTLayerStack: gates_inputs must be letters of 'ist', "
        "got %r" % (gates_inputs,)
      )
    for name, value in given.items():
      setattr(self, name, value)
    self.num_vanilla_transformer_layers = num_vanilla_transformer_layers
    self.couple_carry_transform_gates = couple_carry_transform_gates
    self.act_loss_weight = act_loss_weight
    self.act_halting_bias_init = act_halting_bias_init
    if use_gated_transformer:
      self._sublayers_per_layer[-1] = self._sublayer_gated_residual

  # -- timing signals --------------------------------------------------------

  @property
  def num_steps(self) -> int:
    """Recurrence steps: act_max_steps for ACT, else num_rec_steps."""
    if self.recurrence_type == "act":
      return self.act_max_steps
    return self.num_rec_steps

  def position_timing_signal(self, context: Context) -> mtf.Tensor:
    """Sinusoid signal of (position + position_start_index), [pos..., d_model].

    Args:
      context: the Context of the call.

    Returns:
      The signal [batch..., length, d_model].
    """
    table_dim = mtf.Dimension(
      "ut_positions", context.length_dim.size + self.position_start_index
    )
    table = sinusoid_positional_embedding_weights(
      context.mesh, table_dim, context.model.model_dim, context.activation_dtype
    )
    return mtf.gather(
      table, context.get_position() + self.position_start_index, table_dim
    )

  def step_timing_signal(self, context: Context, step: int) -> mtf.Tensor:
    """The signal of recurrence step `step`, [ensemble..., d_model].

    Args:
      context: the Context of the call.
      step: the recurrence step (0-based).

    Returns:
      The signal [ensemble..., d_model].
    """
    model_dim = context.model.model_dim
    steps_dim = mtf.Dimension("ut_steps", self.num_steps)
    if self.step_timing_signal_type == "learned":
      table = mtf.get_variable(
        context.mesh,
        "step_embedding",
        mtf.Shape(_ensemble_dims(context) + [steps_dim, model_dim]),
        initializer=tf1.random_normal_initializer(stddev=model_dim.size**-0.5),
        dtype=context.variable_dtype,
      )
    else:
      table = sinusoid_positional_embedding_weights(
        context.mesh, steps_dim, model_dim, context.activation_dtype
      )
    return mtf.gather(
      table, mtf.constant(context.mesh, step, dtype=tf.int32), steps_dim
    )

  def step_preprocess(
    self, context: Context, x: mtf.Tensor, step: int
  ) -> mtf.Tensor:
    """x plus (or concatenated with) this step's timing signals.

    Args:
      context: the Context of the call.
      x: the activations [batch..., length, d_model].
      step: the recurrence step (0-based).

    Returns:
      x with the signals added (or concatenated along d_model).
    """
    with tf1.variable_scope(_SCOPE):
      signals = []
      if self.add_position_timing_signal:
        signals.append(self.position_timing_signal(context))
      if self.add_step_timing_signal:
        signals.append(self.step_timing_signal(context, step))
      if not signals:
        return x
      signal = signals[0] if len(signals) == 1 else signals[0] + signals[1]
      if self.add_or_concat_timing_signal == "add":
        return x + mtf.cast(signal, x.dtype)
      model_dim = context.model.model_dim
      signal = mtf.broadcast(mtf.cast(signal, x.dtype), x.shape)
      concat_dim = mtf.Dimension("ut_timing_concat", 2 * model_dim.size)
      both = mtf.rename_dimension(
        mtf.concat([x, signal], model_dim.name), model_dim.name, concat_dim.name
      )
      return mtf.layers.dense(
        both,
        [model_dim],
        reduced_dims=[concat_dim],
        use_bias=False,
        expert_dims=_ensemble_dims(context),
        variable_dtype=context.variable_dtype,
        name="timing_concat",
      )

  # -- the block -------------------------------------------------------------

  def _run_block(self, context: Context, x: mtf.Tensor) -> mtf.Tensor:
    for layer in self._layers:
      with tf1.variable_scope(layer.name or ""):
        x = self._layer_fn(x, layer, context)
      self._record(context, x)
      context.layer_index += 1
    return x

  def transition(self, context: Context, x: mtf.Tensor) -> mtf.Tensor:
    """The block applied num_inrecurrence_layers times (shared weights).

    Args:
      context: the Context of the call.
      x: the activations [batch..., length, d_model].

    Returns:
      The output, shaped as x.
    """
    for _ in range(self.num_inrecurrence_layers):
      x = self._run_block(context, x)
    return x

  def ut_step(self, context: Context, x: mtf.Tensor, step: int) -> mtf.Tensor:
    """One "basic" recurrence step: transition(step_preprocess(x)).

    Args:
      context: the Context of the call.
      x: the activations [batch..., length, d_model].
      step: the recurrence step (0-based).

    Returns:
      The output, shaped as x.
    """
    return self.transition(context, self.step_preprocess(context, x, step))

  def _dense(
    self,
    context: Context,
    x: mtf.Tensor,
    name: str,
    reduced_dim: mtf.Dimension,
    new_dim: mtf.Dimension,
  ) -> mtf.Tensor:
    return mtf.layers.dense(
      x,
      [new_dim],
      reduced_dims=[reduced_dim],
      use_bias=False,
      expert_dims=_ensemble_dims(context),
      variable_dtype=context.variable_dtype,
      name=name,
    )

  def _gate(
    self,
    context: Context,
    inputs: Dict[str, mtf.Tensor],
    name: str,
    bias_init: float,
  ) -> mtf.Tensor:
    """sigmoid(gate_ffn_layer(inputs[c] for c in gates_inputs) + bias)."""
    model_dim = context.model.model_dim
    with tf1.variable_scope(name):
      bias = mtf.get_variable(
        context.mesh,
        "bias",
        mtf.Shape(_ensemble_dims(context) + [model_dim]),
        initializer=tf1.constant_initializer(bias_init),
        dtype=context.variable_dtype,
      )
      hidden_dim = (
        None
        if self.gate_ffn_layer == "dense"
        else mtf.Dimension("ut_gate_hidden", model_dim.size)
      )
      terms = [
        self._dense(
          context, inputs[c], "w_" + c, model_dim, hidden_dim or model_dim
        )
        for c in self.gates_inputs
      ]
      logits = terms[0] if len(terms) == 1 else mtf.add_n(terms)
      if hidden_dim is not None:
        logits = self._dense(
          context, mtf.relu(logits), "wo", hidden_dim, model_dim
        )
      return mtf.sigmoid(logits + bias)

  def ut_highway(
    self,
    context: Context,
    layer_inputs: Union[mtf.Tensor, Sequence[mtf.Tensor]],
    mask: Optional[mtf.Tensor],
    *,
    skip: bool = False,
  ) -> mtf.Tensor:
    """Highway (or, with skip, skip-to-input) gated recurrence.

    Args:
      context: the Context of the call.
      layer_inputs: the activations [batch..., length, d_model], or the
        original's (state, inputs, memory) triple, whose first element is the
        initial state and second the recurrence input the gates read.
      mask: unused (the layers mask padding themselves); kept for the
        original's signature.
      skip: gate between the step's output and the recurrence's input
        (skip-to-input) instead of the previous state (highway).

    Returns:
      The output, shaped as the state.
    """
    del mask
    if isinstance(layer_inputs, mtf.Tensor):
      x = ut_input = layer_inputs
    else:
      x, ut_input = layer_inputs[0], layer_inputs[1]
    for step in range(self.num_rec_steps):
      state = self.step_preprocess(context, x, step)
      transformed = self.transition(context, state)
      gate_inputs = {"i": ut_input, "s": state, "t": transformed}
      with tf1.variable_scope(_SCOPE):
        transform = self._gate(context, gate_inputs, "transform_gate", -1.0)
        if self.couple_carry_transform_gates:
          carry = 1.0 - transform
        else:
          carry = self._gate(context, gate_inputs, "carry_gate", 1.0)
      x = transformed * transform + (ut_input if skip else state) * carry
    return x

  def ut_basic(
    self, context: Context, x: mtf.Tensor, mask: Optional[mtf.Tensor]
  ) -> mtf.Tensor:
    """The "basic" recurrence: num_rec_steps ut_steps.

    Args:
      context: the Context of the call.
      x: the activations [batch..., length, d_model].
      mask: unused (the layers mask padding themselves); kept for the
        original's signature.

    Returns:
      The output, shaped as x.
    """
    del mask
    for step in range(self.num_rec_steps):
      x = self.ut_step(context, x, step)
    return x

  def _halting_probability(
    self, context: Context, state: mtf.Tensor
  ) -> mtf.Tensor:
    model_dim = context.model.model_dim
    with tf1.variable_scope(_SCOPE + "/act_halting"):
      kernel = mtf.get_variable(
        context.mesh,
        "kernel",
        mtf.Shape(_ensemble_dims(context) + [model_dim]),
        initializer=tf1.random_normal_initializer(stddev=model_dim.size**-0.5),
        dtype=context.variable_dtype,
      )
      bias = mtf.get_variable(
        context.mesh,
        "bias",
        mtf.Shape(_ensemble_dims(context)),
        initializer=tf1.constant_initializer(self.act_halting_bias_init),
        dtype=context.variable_dtype,
      )
    return mtf.sigmoid(
      mtf.einsum([state, kernel], reduced_dims=[model_dim]) + bias
    )

  def ut_act(
    self, context: Context, x: mtf.Tensor
  ) -> Tuple[mtf.Tensor, mtf.Tensor, mtf.Tensor]:
    """ACT ("basic"): (output, ponder steps, remainders).

    Steps and remainders are [batch..., length]; every position takes
    between 1 and act_max_steps steps. Appends the ponder loss to
    context.losses (when it is not None).

    Args:
      context: the Context of the call.
      x: the activations [batch..., length, d_model].

    Returns:
      (output [batch..., length, d_model], ponder steps [batch..., length],
      remainders [batch..., length]).
    """
    model_dim = context.model.model_dim
    dtype = x.dtype
    position_shape = mtf.Shape([d for d in x.shape.dims if d != model_dim])
    zeros = mtf.zeros(context.mesh, position_shape, dtype=dtype)
    halting, remainders, n_updates, halted = zeros, zeros, zeros, zeros
    output = mtf.zeros_like(x)
    threshold = 1.0 - self.act_epsilon
    state = x
    for step in range(self.act_max_steps):
      state = self.step_preprocess(context, state, step)
      p = mtf.cast(self._halting_probability(context, state), dtype)
      running = 1.0 - halted
      if step == self.act_max_steps - 1:
        new_halted = running  # Out of steps: everyone still running halts.
      else:
        new_halted = (
          mtf.cast(mtf.greater(halting + p * running, threshold), dtype)
          * running
        )
      still_running = running - new_halted
      halting += p * still_running
      remainder = new_halted * (1.0 - halting)
      remainders += remainder
      update = p * still_running + remainder
      n_updates += running
      halted += new_halted
      transformed = self.transition(context, state)
      output = transformed * update + output * (1.0 - update)
      state = transformed
    if context.losses is not None:
      ponder = n_updates + remainders
      nonpadding = context.nonpadding
      if isinstance(nonpadding, mtf.Tensor):
        ponder_mean = mtf.reduce_sum(ponder * nonpadding) / mtf.maximum(
          mtf.reduce_sum(nonpadding), 1.0
        )
      else:
        ponder_mean = mtf.reduce_mean(ponder)
      context.losses.append(ponder_mean * self.act_loss_weight)
    return output, n_updates, remainders

  # -- the original's building blocks ----------------------------------------

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
    position = mtf.cast(context.get_position() + start_index, dtype)
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
    self, context: Context, x: mtf.Tensor, step: int
  ) -> mtf.Tensor:
    """x with the position (horizontal) timing signal added or concatenated.

    Positions start at position_start_index.

    Args:
      context: the Context of the call.
      x: the activations [batch..., length, d_model].
      step: the recurrence step (unused: the start index is fixed).

    Returns:
      x plus the signal, or x concatenated with it along d_model ("concat").
    """
    del step
    signal = self.get_timing_signal_1d(
      context,
      context.length_dim,
      context.model.model_dim,
      start_index=self.position_start_index,
    )
    return self._add_or_concat(x, signal)

  def get_layer_timing_signal_learned_1d(
    self,
    context: Context,
    channels: mtf.Dimension,
    layer: int,
    num_layers: int,
  ) -> mtf.Tensor:
    """The learned embedding of layer (step) `layer`: the vertical signal.

    Variable `layer_embedding` [layer: num_layers, channels], initialised
    N(0, channels^-1/2), is scaled by channels^1/2.

    Args:
      context: the Context of the call.
      channels: the signal Dimension.
      layer: the layer (recurrence step) index.
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

  def add_step_timing_signal_func(
    self, context: Context, x: mtf.Tensor, step: int
  ) -> mtf.Tensor:
    """x with the step (vertical) timing signal added or concatenated.

    The signal is learned (get_layer_timing_signal_learned_1d over num_steps
    steps) or the sinusoid of the step (step_timing_signal).

    Args:
      context: the Context of the call.
      x: the activations [batch..., length, d_model].
      step: the recurrence step (0-based).

    Returns:
      x plus the signal, or x concatenated with it along d_model ("concat").
    """
    if self.step_timing_signal_type == "learned":
      signal = self.get_layer_timing_signal_learned_1d(
        context, x.shape.dims[-1], step, self.num_steps
      )
    else:
      signal = self.step_timing_signal(context, step)
    return self._add_or_concat(x, signal)

  def vanilla_transformer_layer(
    self, context: Context, x: mtf.Tensor, mask: Optional[mtf.Tensor]
  ) -> mtf.Tensor:
    """One pass of the block: every layer with its norm and residual.

    Residuals are gated when use_gated_transformer is set.

    Args:
      context: the Context of the call.
      x: the activations [batch..., length, d_model].
      mask: unused (the layers mask padding themselves); kept for the
        original's signature.

    Returns:
      The output, shaped as x.
    """
    del mask
    return self._run_block(context, x)

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

    "dense" is activation(dense(inputs) + bias); "dense_relu_dense" is
    activation(dense(relu(dense(inputs)))) with a d_model-sized hidden
    layer (the original's version of it read an attribute it never set).

    Args:
      context: the Context of the call.
      mask: optional padding mask [batch..., length], applied before norms.
      inputs_list: the inputs [batch..., length, d_model] (not modified).
      ffn_layer_type: "dense" or "dense_relu_dense".
      kernel_initializer: optional kernel initializer ("dense").
      activation: optional function applied to the output.
      preprocess: layer-norm every input first.
      postprocess: layer-norm the output.

    Returns:
      The output [batch..., length, d_model].

    Raises:
      ValueError: for no inputs or an unknown ffn_layer_type.
    """
    if not inputs_list:
      raise ValueError("ffn_layer_multi_inputs: need at least one input")
    model_dim = context.model.model_dim

    def norm(t):
      if mask is not None:
        t *= mask
      return mtf.layers.layer_norm(t, model_dim, epsilon=self.norm_epsilon)

    inputs_list = list(inputs_list)
    if preprocess:
      inputs_list = [norm(t) for t in inputs_list]
    ffn_inputs = (
      inputs_list[0]
      if len(inputs_list) == 1
      else mtf.concat(inputs_list, model_dim.name)
    )
    reduced = [d for d in ffn_inputs.shape.dims if d.name == model_dim.name]
    dense = functools.partial(
      mtf.layers.dense,
      variable_dtype=context.variable_dtype,
      expert_dims=_ensemble_dims(context),
    )
    if ffn_layer_type == "dense":
      output = dense(
        ffn_inputs,
        [model_dim],
        reduced_dims=reduced,
        activation=activation,
        kernel_initializer=kernel_initializer,
      )
    elif ffn_layer_type == "dense_relu_dense":
      hidden_dim = mtf.Dimension("ut_ffn_hidden", model_dim.size)
      hidden = dense(
        ffn_inputs, [hidden_dim], reduced_dims=reduced, activation=mtf.relu
      )
      output = dense(
        hidden, [model_dim], reduced_dims=[hidden_dim], activation=activation
      )
    else:
      raise ValueError("Unknown ffn_layer type: %s" % ffn_layer_type)
    return norm(output) if postprocess else output

  def gating(
    self,
    context: Context,
    x: mtf.Tensor,
    transformed_x: mtf.Tensor,
    mask: Optional[mtf.Tensor],
  ) -> mtf.Tensor:
    """Combines a layer's input and output through learned sigmoid gates.

    "highway": x * carry + transformed_x * transform, both gates
    sigmoid(ffn(norm(x))). "gru": update u and reset r gates
    sigmoid(ffn(norm(x), norm(transformed_x))), candidate
    c = sigmoid(ffn(norm(r * x), norm(transformed_x))), output
    (1 - u) * transformed_x + u * c. The ffn is gate_ffn_layer.

    Args:
      context: the Context of the call.
      x: the layer input [batch..., length, d_model].
      transformed_x: the layer output, shaped as x.
      mask: optional padding mask [batch..., length].

    Returns:
      The gated output, shaped as x.
    """

    def gate(inputs):
      return self.ffn_layer_multi_inputs(
        context,
        mask,
        inputs,
        ffn_layer_type=self.gate_ffn_layer,
        activation=mtf.sigmoid,
        preprocess=True,
      )

    if self.gating_type == "highway":
      transform, carry = gate([x]), gate([x])
      return x * carry + transformed_x * transform
    update = gate([x, transformed_x])
    reset = gate([x, transformed_x])
    candidate = gate([reset * x, transformed_x])
    return (1.0 - update) * transformed_x + update * candidate

  def act_layer(
    self, context: Context, x: mtf.Tensor, mask: Optional[mtf.Tensor]
  ) -> mtf.Tensor:
    """The ACT recurrence's output (see ut_act).

    Args:
      context: the Context of the call.
      x: the activations [batch..., length, d_model].
      mask: unused (the layers mask padding themselves); kept for the
        original's signature.

    Returns:
      The output, shaped as x.
    """
    del mask
    output, _, _ = self.ut_act(context, x)
    return output

  # -- gated residuals -------------------------------------------------------

  def _sublayer_gated_residual(
    self, x: mtf.Tensor, layer_stack, context: Context
  ) -> mtf.Tensor:
    """Gated replacement of sublayer_residual (variables `gating/...`)."""
    del layer_stack
    residual = context.current_layer_input
    model_dim = context.model.model_dim
    with tf1.variable_scope("gating"):

      def bias(name, value):
        return mtf.get_variable(
          context.mesh,
          name,
          mtf.Shape(_ensemble_dims(context) + [model_dim]),
          initializer=tf1.constant_initializer(value),
          dtype=context.variable_dtype,
        )

      def linear(t, name):
        return self._dense(context, t, name, model_dim, model_dim)

      if self.gating_type == "highway":
        g = mtf.sigmoid(linear(residual, "w_gate") + bias("b_gate", 1.0))
        return g * x + (1.0 - g) * residual
      # GRU-type gating (Parisotto et al. 2019).
      r = mtf.sigmoid(linear(x, "w_r") + linear(residual, "u_r"))
      z = mtf.sigmoid(
        linear(x, "w_z") + linear(residual, "u_z") - bias("b_z", 2.0)
      )
      h = mtf.tanh(linear(x, "w_h") + linear(r * residual, "u_h"))
      return (1.0 - z) * residual + z * h

  # -- the stack -------------------------------------------------------------

  def _vanilla(self, context: Context, x: mtf.Tensor, where: str) -> mtf.Tensor:
    for i in range(self.num_vanilla_transformer_layers):
      with tf1.variable_scope("vanilla_%s_%03d" % (where, i)):
        x = self._run_block(context, x)
    return x

  def call(self, context: Context, x: mtf.Tensor) -> mtf.Tensor:
    """Initial sublayers, [vanilla passes], recurrence, [vanilla], final.

    context.layer_outputs gets the stack input, every layer output but the
    last and the final output (as LayerStack).
    """
    x = self._call_sublayers(self._sublayers_initial, x, context)
    self._record(context, x)
    num_recorded = (
      len(context.layer_outputs) if context.layer_outputs is not None else 0
    )
    if self.mix_with_transformer_before_ut:
      x = self._vanilla(context, x, "before")
    if self.recurrence_type == "basic":
      x = self.ut_basic(context, x, None)
    elif self.recurrence_type in ("highway", "skip"):
      x = self.ut_highway(context, x, None, skip=self.recurrence_type == "skip")
    else:
      x = self.act_layer(context, x, None)
    if self.mix_with_transformer_after_ut:
      x = self._vanilla(context, x, "after")
    if (
      context.layer_outputs is not None
      and len(context.layer_outputs) > num_recorded
    ):
      context.layer_outputs.pop()
    x = self._call_sublayers(self._sublayers_final, x, context)
    x = sublayer_mask_padding(x, self, context)
    self._record(context, x)
    return x
