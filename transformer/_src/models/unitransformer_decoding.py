"""Decoding with a Unitransformer: sampling and beam search.

`UnitransformerDecoding` is the part of Unitransformer that decodes: a
"first_part" pass over the prompt records each layer's states, then
"incremental" steps compute one position each, in an mtf.while_loop
(`sample_autoregressive`) or in mtf.beam_search (`beam_search`).
"""

from __future__ import annotations

from typing import Optional

import gin
import tensorflow as tf

import mesh_tensorflow as mtf
from transformer._src.layers.context import Context
from transformer._src.models.decoder_inputs import autoregressive_inputs

tf1 = tf.compat.v1

__all__ = ["UnitransformerDecoding"]


class UnitransformerDecoding:
  """The decoding methods of Unitransformer (its base class).

  They read the tower's settings (name, autoregressive,
  input_full_attention, output_vocab_dim, mesh_shape, layout) and run its
  forward pass, `_call_internal`, in "first_part" and "incremental" mode.
  """

  def _call_internal(
    self,
    context: Context,
    inputs: mtf.Tensor,
    targets: Optional[mtf.Tensor] = None,
  ):
    """The tower's forward pass: logits (Unitransformer defines it)."""
    raise NotImplementedError

  def _first_part_context(
    self,
    inputs,
    batch_dims,
    length_dim,
    variable_dtype,
    initial_position,
    sequence_id,
    read_priority,
    write_priority,
    encoder_output,
    encoder_sequence_id,
    encoder_inputs,
    shared_params,
    encoder_layer_outputs,
  ) -> Context:
    return Context(
      model=self,
      mesh=inputs.mesh,
      batch_dims=batch_dims,
      length_dim=length_dim,
      variable_dtype=variable_dtype,
      mode="first_part",
      position=mtf.range(inputs.mesh, length_dim, dtype=tf.int32),
      position_is_default=True,
      new_states=[],
      initial_position=initial_position,
      sequence_id=sequence_id,
      encoder_output=encoder_output,
      encoder_sequence_id=encoder_sequence_id,
      constant_states=[],
      shared_params=shared_params,
      encoder_layer_outputs=encoder_layer_outputs,
      write_priority=write_priority,
      read_priority=read_priority,
      inputs=inputs,
      encoder_inputs=encoder_inputs,
    )

  def _incremental_logits(
    self,
    ids,
    position,
    write_priority,
    states,
    constant_states,
    batch_dims,
    length_dim,
    variable_dtype,
    bos_id,
    sequence_id,
    encoder_output,
    encoder_sequence_id,
    encoder_inputs,
    shared_params,
    encoder_layer_outputs,
  ):
    """(logits [batch..., vocab], new states) for the token at `position`.

    position is int [batch...]; the input read there is ids[position - 1]
    (bos_id at position 0). It is also the query's read priority; the
    cached memory keeps the first part's write priorities [..., length], so
    slots after the current position stay invisible.
    """
    inputs_this_step = mtf.gather(ids, position - 1, length_dim)
    if bos_id:
      inputs_this_step += bos_id * mtf.to_int32(mtf.equal(position, 0))
    context = Context(
      model=self,
      mesh=ids.mesh,
      batch_dims=batch_dims,
      length_dim=length_dim,
      variable_dtype=variable_dtype,
      mode="incremental",
      position=position,
      states=list(states),
      new_states=[],
      sequence_id=sequence_id,
      encoder_output=encoder_output,
      encoder_sequence_id=encoder_sequence_id,
      constant_states=constant_states,
      shared_params=shared_params,
      encoder_layer_outputs=encoder_layer_outputs,
      write_priority=write_priority,
      read_priority=position,
      inputs=inputs_this_step,
      encoder_inputs=encoder_inputs,
    )
    with tf1.variable_scope(self.name, reuse=True):
      logits = self._call_internal(context, inputs_this_step)
    if len(context.new_states) != len(states):
      raise ValueError(
        "Unitransformer %r: the layers recorded %d states in incremental "
        "mode but %d in first_part mode"
        % (self.name, len(context.new_states), len(states))
      )
    return logits, context.new_states

  @gin.configurable(module="Unitransformer")
  def sample_autoregressive(
    self,
    partial_sequences: mtf.Tensor,
    stop_at_token: Optional[int] = 1,
    max_steps: Optional[int] = None,
    temperature=0.0,
    variable_dtype=mtf.VariableDType(tf.float32),
    encoder_output=None,
    encoder_sequence_id=None,
    encoder_inputs=None,
    shared_params=None,
    has_partial_sequences: bool = True,
    encoder_layer_outputs=None,
    never_end: bool = False,
    remove_partial_sequences: bool = False,
    sampling_keep_top_k: int = -1,
    bos_id: int = 0,
  ) -> mtf.Tensor:
    """Continues partial sequences one sampled token at a time.

    partial_sequences [batch..., length] hold each prompt followed by zeros;
    a row's decoding starts at position count(nonzero ids of the row).
    Rows stop after producing a new stop_at_token (or at the end, or after
    max_steps); the loop stops when every row has.

    Args:
      partial_sequences: int Tensor [batch..., length].
      stop_at_token: an id, or None to always fill the whole length.
      max_steps: optional cap on tokens generated per row.
      temperature: 0.0 = argmax; otherwise sample softmax(logits / t).
      variable_dtype: an mtf.VariableDType.
      encoder_output: the encoder's output [batch..., memory_length, d_model]
        for encoder-decoder attention (None for a language model).
      encoder_sequence_id: int packed-sequence ids of encoder_output
        [batch..., memory_length] (0: padding), or None.
      encoder_inputs: the encoder's input ids [batch..., memory_length], or
        None.
      shared_params: dict of variables shared between the encoder and decoder
        (e.g. the shared embedding), or None.
      encoder_layer_outputs: the encoder's per-layer outputs, for layers that
        attend to them, or None.
      has_partial_sequences: False when partial_sequences are all zeros
        (the prompt pass's states are then replaced by zeros).
      never_end: stop_at_token is never sampled.
      remove_partial_sequences: shift each row left past its prompt.
      sampling_keep_top_k: -1, or sample only among the k largest logits.
      bos_id: the input id read at position 0.

    Returns:
      int Tensor [batch..., length].

    Raises:
      ValueError: if the model is not autoregressive, or sampling_keep_top_k is
        neither -1 nor positive.
    """
    if not self.autoregressive:
      raise ValueError(
        "Unitransformer %r: sample_autoregressive needs an "
        "autoregressive model" % self.name
      )
    if sampling_keep_top_k != -1 and sampling_keep_top_k <= 0:
      raise ValueError(
        "sample_autoregressive: sampling_keep_top_k must be -1 "
        "or positive, got %r" % (sampling_keep_top_k,)
      )
    inputs = partial_sequences
    mesh = inputs.mesh
    batch_dims = inputs.shape.dims[:-1]
    length_dim = inputs.shape.dims[-1]
    length_range = mtf.range(mesh, length_dim, dtype=tf.int32)
    initial_position = mtf.reduce_sum(
      mtf.to_int32(mtf.not_equal(inputs, 0)), reduced_dim=length_dim
    )
    sequence_id = 1 if encoder_sequence_id is not None else None
    if self.input_full_attention:
      # The prompt (and the position reading its last token) attend fully
      # within themselves, as in call_simple.
      read_priority = write_priority = length_range * mtf.to_int32(
        mtf.greater(length_range, initial_position)
      )
    else:
      read_priority = write_priority = length_range
    context_first_part = self._first_part_context(
      inputs,
      batch_dims,
      length_dim,
      variable_dtype,
      initial_position,
      sequence_id,
      read_priority,
      write_priority,
      encoder_output,
      encoder_sequence_id,
      encoder_inputs,
      shared_params,
      encoder_layer_outputs,
    )
    shifted_inputs = autoregressive_inputs(inputs)
    if bos_id:
      shifted_inputs += bos_id * mtf.one_hot(
        mtf.constant(mesh, 0, dtype=tf.int32), length_dim, dtype=tf.int32
      )
    with tf1.variable_scope(self.name):
      self._call_internal(context_first_part, shifted_inputs)
    constant_states = context_first_part.constant_states
    if has_partial_sequences:
      initial_states = list(context_first_part.new_states)
      partial_eos_count = (
        mtf.reduce_sum(
          mtf.to_int32(mtf.equal(inputs, stop_at_token)), reduced_dim=length_dim
        )
        if stop_at_token is not None
        else None
      )
    else:
      initial_states = [
        mtf.zeros_like(t) for t in context_first_part.new_states
      ]
      partial_eos_count = 0

    def cond_fn(position, ids, *unused_states):
      is_done = mtf.greater_equal(position, length_dim.size)
      if max_steps:
        is_done = mtf.logical_or(
          is_done, mtf.greater_equal(position - initial_position, max_steps)
        )
      if stop_at_token is not None:
        eos_count = mtf.reduce_sum(
          mtf.to_int32(mtf.equal(ids, stop_at_token)), reduced_dim=length_dim
        )
        is_done = mtf.logical_or(
          is_done, mtf.greater(eos_count, partial_eos_count)
        )
      return mtf.logical_not(mtf.reduce_all(is_done))

    def body_fn(position, ids, *states):
      logits, new_states = self._incremental_logits(
        ids,
        position,
        write_priority,
        states,
        constant_states,
        batch_dims,
        length_dim,
        variable_dtype,
        bos_id,
        sequence_id,
        encoder_output,
        encoder_sequence_id,
        encoder_inputs,
        shared_params,
        encoder_layer_outputs,
      )
      if never_end and stop_at_token is not None:
        logits += mtf.one_hot(
          mtf.constant(mesh, stop_at_token, dtype=tf.int32),
          self.output_vocab_dim,
          on_value=-1e9,
          off_value=0.0,
          dtype=logits.dtype,
        )
      if sampling_keep_top_k != -1:
        kth_largest = mtf.nth_largest_element(
          logits, sampling_keep_top_k - 1, self.output_vocab_dim
        )
        logits = mtf.where(
          mtf.less(logits, kth_largest), mtf.ones_like(logits) * -1e6, logits
        )
      ids_this_step = mtf.sample_with_temperature(
        logits, self.output_vocab_dim, temperature
      )
      new_ids = ids + mtf.cast(ids_this_step, ids.dtype) * mtf.one_hot(
        position, length_dim, dtype=ids.dtype
      )
      return [position + 1, new_ids] + list(new_states)

    loop_inputs = [initial_position, inputs] + initial_states
    outputs = mtf.while_loop(cond_fn, body_fn, loop_inputs)[1]
    if has_partial_sequences and remove_partial_sequences:
      outputs = mtf.dynamic_shift(
        outputs, -initial_position, length_dim, wrap=False
      )
    return outputs

  @gin.configurable(module="Unitransformer")
  def beam_search(
    self,
    inputs: mtf.Tensor,
    decode_length,
    variable_dtype=mtf.VariableDType(tf.float32),
    encoder_output=None,
    encoder_sequence_id=None,
    encoder_inputs=None,
    alpha: float = 0.6,
    shared_params=None,
    encoder_layer_outputs=None,
    bos_id: int = 0,
  ) -> mtf.Tensor:
    """Beam search from scratch; returns the best beam [batch, length].

    Args:
      inputs: int zeros [batch, beam, length] (exactly one batch dim).
      decode_length: int scalar mtf Tensor (or int): at most this many steps.
      variable_dtype: an mtf.VariableDType.
      encoder_output: the encoder's output [batch..., memory_length, d_model]
        for encoder-decoder attention (None for a language model).
      encoder_sequence_id: int packed-sequence ids of encoder_output
        [batch..., memory_length] (0: padding), or None.
      encoder_inputs: the encoder's input ids [batch..., memory_length], or
        None.
      shared_params: dict of variables shared between the encoder and decoder
        (e.g. the shared embedding), or None.
      encoder_layer_outputs: the encoder's per-layer outputs, for layers that
        attend to them, or None.
      alpha: GNMT length-penalty exponent.
      bos_id: the input id read at position 0.

    Returns:
      The best beam's ids, int Tensor [batch, length].

    Raises:
      ValueError: if the model is not autoregressive.
      NotImplementedError: unless inputs are [batch, beam, length] (one batch
        dim).
    """
    if not self.autoregressive:
      raise ValueError(
        "Unitransformer %r: beam_search needs an autoregressive "
        "model" % self.name
      )
    if inputs.shape.ndims != 3:
      raise NotImplementedError(
        "beam_search supports exactly one batch dimension: inputs must be "
        "[batch, beam, length], got %s" % inputs.shape.to_string
      )
    if self.input_full_attention:
      raise NotImplementedError(
        "beam_search with input_full_attention (beam "
        "search from partial sequences)"
      )
    mesh = inputs.mesh
    batch_dims = inputs.shape.dims[:-2]
    beam_dim = inputs.shape.dims[-2]
    length_dim = inputs.shape.dims[-1]
    length_range = mtf.range(mesh, length_dim, dtype=tf.int32)
    initial_position = mtf.reduce_sum(
      mtf.to_int32(mtf.not_equal(inputs, 0)), reduced_dim=length_dim
    )
    sequence_id = 1 if encoder_sequence_id is not None else None
    context_first_part = self._first_part_context(
      inputs,
      batch_dims + [beam_dim],
      length_dim,
      variable_dtype,
      initial_position,
      sequence_id,
      length_range,
      length_range,
      encoder_output,
      encoder_sequence_id,
      encoder_inputs,
      shared_params,
      encoder_layer_outputs,
    )
    shifted_inputs = autoregressive_inputs(inputs)
    with tf1.variable_scope(self.name):
      self._call_internal(context_first_part, shifted_inputs)
    # No partial targets: the states start as zeros.
    initial_states = [mtf.zeros_like(t) for t in context_first_part.new_states]
    constant_states = context_first_part.constant_states
    state_batch_shape = mtf.Shape(batch_dims + [beam_dim])

    def logits_fn(step_num, ids, states):
      position = mtf.broadcast(step_num, state_batch_shape)
      logits, new_states = self._incremental_logits(
        ids,
        position,
        length_range,
        states,
        constant_states,
        batch_dims + [beam_dim],
        length_dim,
        variable_dtype,
        bos_id,
        sequence_id,
        encoder_output,
        encoder_sequence_id,
        encoder_inputs,
        shared_params,
        encoder_layer_outputs,
      )
      return mtf.to_float(logits), new_states

    beams, _ = mtf.beam_search.beam_search(
      logits_fn,
      inputs,
      alpha,
      states=initial_states,
      decode_length=decode_length,
      use_tpu=True,
      dtype=tf.float32,
      mesh_shape=self.mesh_shape,
      layout=self.layout,
    )
    return mtf.gather(beams, mtf.constant(mesh, 0, dtype=tf.int32), beam_dim)
