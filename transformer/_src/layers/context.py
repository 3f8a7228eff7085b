"""Context and TransformerLayer: what every transformer layer is called with.

A `Context` is the bag of per-call state a layer stack threads through its
layers: the model, mesh, batch/length dims, mode, positions, packed-sequence
ids, incremental-decoding states, auxiliary losses and the encoder output.
A `TransformerLayer` is one layer; it creates its variables inside `call`.
"""

from __future__ import annotations

import json
from typing import Any, List, Optional

import mesh_tensorflow as mtf

__all__ = ["Context", "ModeKeys", "TransformerLayer"]


class ModeKeys:
  """The mode strings of the original (tf.estimator.ModeKeys' values).

  Besides these, layers see "first_part" (decoding: run the prefix, record
  states), "incremental" (decoding: one position from states) and "score".
  """

  TRAIN = "train"
  EVAL = "eval"
  PREDICT = "infer"


class TransformerLayer:
  """A layer of a LayerStack: `call(context, x)` returns a tensor shaped x.

  Variables are created inside `call`, under the scope the stack opens
  (`<block>/<layer>/<ClassName>/`).
  """

  def call(self, context: "Context", x: mtf.Tensor) -> mtf.Tensor:
    """Applies the layer.

    Args:
      context: the Context of the call (mesh, dims, mode, states...).
      x: the layer input [batch..., length, d_model].
      losses: (subclasses that take it) a list to append auxiliary losses
        (scalar mtf.Tensors) to, or None.

    Returns:
      The output, shaped as x.
    """
    raise NotImplementedError(
      "%s must implement call(context, x)" % type(self).__name__
    )

  def to_json(self) -> str:
    """The layer's class and constructor-visible attributes, as JSON.

    Returns:
      A JSON string: {"class": name, attribute: value...}.
    """

    def encode(value):
      if isinstance(value, TransformerLayer):
        return json.loads(value.to_json())
      if isinstance(value, mtf.Dimension):
        return {"name": value.name, "size": value.size}
      if isinstance(value, (list, tuple)):
        return [encode(v) for v in value]
      if isinstance(value, dict):
        return {str(k): encode(v) for k, v in value.items()}
      if value is None or isinstance(value, (bool, int, float, str)):
        return value
      return repr(value)

    attrs = {
      k: encode(v)
      for k, v in sorted(vars(self).items())
      if not k.startswith("_")
    }
    return json.dumps(
      {"class": type(self).__name__, "attributes": attrs}, sort_keys=True
    )

  def set_name(self, name: Optional[str]) -> None:
    """Sets the layer's name (the scope of its variables).

    Args:
      name: the name, or None.
    """
    self._name = name

  @property
  def name(self) -> Optional[str]:
    """The layer's name, or None."""
    return getattr(self, "_name", None)


class Context:
  """Per-call state of a transformer tower (a plain attribute bag).

  Incremental decoding: in mode "first_part" layers append their recurrent
  states with `record_new_states` (and states that stay fixed, such as the
  encoder's keys, with `record_constant_state`); in mode "incremental" they
  read them back in the same order with `get_states(n)` and
  `get_constant_state()`. Visibility in attention: query a sees memory b iff
  read_priority[a] >= write_priority[b].
  """

  def __init__(
    self,
    model,
    mesh,
    batch_dims,
    length_dim,
    variable_dtype,
    beam_dim=None,
    mode=ModeKeys.TRAIN,
    position=None,
    position_is_default=False,
    sequence_id=None,
    subsequence_id=None,
    states=None,
    new_states=None,
    losses=None,
    initial_position=None,
    layer_outputs=None,
    encoder_output=None,
    encoder_sequence_id=None,
    constant_states=None,
    shared_params=None,
    encoder_layer_outputs=None,
    write_priority=None,
    read_priority=None,
    inputs=None,
    encoder_inputs=None,
    num_microbatches=1,
  ) -> None:
    """Stores every argument as the attribute of the same name.

    Args:
      model: the Unitransformer (or compatible) being called.
      mesh: the mtf.Mesh.
      batch_dims: list of batch Dimensions.
      length_dim: the sequence Dimension.
      variable_dtype: an mtf.VariableDType.
      beam_dim: the beam Dimension when decoding with beams.
      mode: a ModeKeys value, "first_part", "incremental" or "score".
      position: int Tensor [batch..., length] or, incrementally, [batch...].
      position_is_default: True when position is mtf.range over length.
      sequence_id: packed-sequence ids (0 = padding), the int 1 (no padding)
        or None.
      subsequence_id: ids of sub-sequences (e.g. prefix vs. targets).
      states: incremental mode: the states recorded in "first_part" mode.
      new_states: list the layers append their new states to.
      losses: list the layers append auxiliary losses to.
      initial_position: first position decoded ("first_part" mode).
      layer_outputs: list the stack appends each layer's output to.
      encoder_output: the encoder's output (length dim "memory_length").
      encoder_sequence_id: sequence ids of encoder_output.
      constant_states: states recorded once in "first_part" mode.
      shared_params: dict of parameters shared between towers.
      encoder_layer_outputs: the encoder's per-layer outputs.
      write_priority: int Tensor [batch..., memory_length]: a memory position
        is visible to queries whose read priority is at least its own.
      read_priority: int Tensor [batch..., length] of the queries.
      inputs: the tower's input ids.
      encoder_inputs: the encoder's input ids.
      num_microbatches: gradient-accumulation microbatches per step.
    """
    self.model = model
    self.mesh = mesh
    self.batch_dims = batch_dims
    self.length_dim = length_dim
    self.variable_dtype = variable_dtype
    self.beam_dim = beam_dim
    self.mode = mode
    self.position = position
    self.position_is_default = position_is_default
    self.sequence_id = sequence_id
    self.subsequence_id = subsequence_id
    self.states = states
    self.new_states = new_states
    self.losses = losses
    self.initial_position = initial_position
    self.layer_outputs = [] if layer_outputs is None else layer_outputs
    self.encoder_output = encoder_output
    self.encoder_sequence_id = encoder_sequence_id
    self.constant_states = constant_states
    self.next_constant_state = 0
    self.shared_params = shared_params
    self.encoder_layer_outputs = encoder_layer_outputs
    self.write_priority = write_priority
    self.read_priority = read_priority
    self.inputs = inputs
    self.encoder_inputs = encoder_inputs
    self.num_microbatches = num_microbatches
    self.layer_index = 0
    # Shared between the layers of one call, e.g. a relative-attention bias
    # created by the first layer that needs it.
    self.cache = {}
    self.current_layer = None
    self.current_layer_input = None
    # The token embeddings (before positional embeddings) of the input,
    # set by the model; MoE routers may use them (word_embed_mode).
    self.input_embeddings = None

  @property
  def train(self) -> bool:
    """Whether the mode is training (dropout and noise on)."""
    return self.mode == ModeKeys.TRAIN

  @property
  def activation_dtype(self) -> Any:
    """The activations' dtype (variable_dtype.activation_dtype)."""
    return self.variable_dtype.activation_dtype

  @property
  def encoder_length_dim(self) -> mtf.Dimension:
    """The "memory_length" dimension of encoder_output.

    Raises:
      ValueError: without encoder_output, or if it has no "memory_length"
        dimension.
    """
    if self.encoder_output is None:
      raise ValueError("this context has no encoder_output")
    for dim in self.encoder_output.shape.dims:
      if dim.name == "memory_length":
        return dim
    raise ValueError(
      "encoder_output %s has no 'memory_length' dimension"
      % self.encoder_output.shape
    )

  @property
  def nonpadding(self) -> Any:
    """None (unknown), 1 (no padding) or a float mask: sequence_id != 0.

    Raises:
      ValueError: if sequence_id is an int other than 1.
    """
    if self.sequence_id is None:
      return None
    if isinstance(self.sequence_id, int):
      if self.sequence_id != 1:
        raise ValueError(
          "an int sequence_id must be 1 (no padding), got %d" % self.sequence_id
        )
      return 1
    return mtf.cast(mtf.not_equal(self.sequence_id, 0), self.activation_dtype)

  def get_states(self, n: int) -> List[Any]:
    """The next n recurrent states (those recorded by this layer, in order).

    Args:
      n: the number of states to read.

    Returns:
      A list of the next n states.

    Raises:
      ValueError: if fewer than n states are left.
    """
    start = len(self.new_states)
    if self.states is None or start + n > len(self.states):
      raise ValueError(
        "layer asked for %d states at index %d but %s were recorded"
        % (n, start, "none" if self.states is None else len(self.states))
      )
    return self.states[start : start + n]

  def record_new_states(self, new_states: List[Any]) -> None:
    """Appends the states a layer passes to incremental decoding.

    Args:
      new_states: the list of mtf.Tensors, read back in the same order with
        get_states.
    """
    self.new_states.extend(new_states)

  def record_constant_state(self, s) -> None:
    """Records a state that stays fixed during incremental decoding.

    Args:
      s: the state (e.g. the encoder's keys), read back with get_constant_state.
    """
    self.constant_states.append(s)

  def get_constant_state(self) -> Any:
    """Reads the next state recorded with record_constant_state.

    Returns:
      The next constant state recorded in "first_part" mode.

    Raises:
      ValueError: if no constant state is left.
    """
    if self.constant_states is None or self.next_constant_state >= len(
      self.constant_states
    ):
      raise ValueError(
        "no constant state left at index %d" % self.next_constant_state
      )
    state = self.constant_states[self.next_constant_state]
    self.next_constant_state += 1
    return state

  def get_position(self) -> mtf.Tensor:
    """position, or 0..length-1 along length_dim when none was given.

    Returns:
      int positions [batch..., length] (or [batch...] incrementally).
    """
    if self.position is not None:
      return self.position
    return mtf.range(self.mesh, self.length_dim, "int32")
