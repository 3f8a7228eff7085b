"""Encoder-decoder models: Bitransformer and StudentTeacher distillation.

A Bitransformer is two Unitransformers: a non-autoregressive encoder whose
output (length renamed "memory_length") the autoregressive decoder attends
to. Parameters both towers share (the embedding and, when both use the same
learned table, the positional embedding) live under the scope "shared".
"""

from __future__ import annotations

from typing import Any, Optional, Union

import gin
import tensorflow as tf

import mesh_tensorflow as mtf
from transformer._src.layers.context import ModeKeys
from transformer._src.layers.embeddings import get_vocab_embedding_cls
from transformer._src.models.decoder_inputs import autoregressive_inputs
from transformer._src.models.layer_stack import make_layer_stack
from transformer._src.models.unitransformer import Unitransformer

tf1 = tf.compat.v1

__all__ = [
  "Bitransformer",
  "StudentTeacher",
  "make_bi_student_teacher",
  "make_bitransformer",
]

_GIN_MODULE = "mesh_tensorflow.transformer.transformer"


def _rename_length_to_memory_length(x: mtf.Tensor) -> mtf.Tensor:
  return mtf.layers.rename_length_to_memory_length(x)


@gin.configurable(module=_GIN_MODULE)
class Bitransformer:
  """An encoder and a decoder (both Unitransformers).

  Example (a tiny model configured by gin, as the gin files do):
    >>> _ = gin.parse_config('''
    ... encoder/make_layer_stack.layers = [@SelfAttention, @DenseReluDense]
    ... decoder/make_layer_stack.layers = [@SelfAttention, @EncDecAttention,
    ...                                    @DenseReluDense]
    ... make_layer_stack.num_layers = 1
    ... Unitransformer.d_model = 8
    ... Unitransformer.max_length = 4
    ... Unitransformer.vocab_divisor = 1
    ... SelfAttention.num_heads = 2
    ... SelfAttention.key_value_size = 4
    ... DenseReluDense.hidden_size = 16
    ... ''')
    >>> model = make_bitransformer(input_vocab_size=16, output_vocab_size=16)
    >>> gin.clear_config()
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> inputs = converter.convert_np_array_to_mtf_tensor(
    ...     [[3, 5, 7, 1]], ["batch", "length"])
    >>> targets = converter.convert_np_array_to_mtf_tensor(
    ...     [[7, 5, 3, 1]], ["batch", "length"])
    >>> logits, loss = model.call_simple(inputs, targets, compute_loss=True)
    >>> logits.shape, loss.shape
    (Shape[batch=1, length=4, vocab=16], Shape[])
    >>> ids = model.decode(inputs)  # greedy
    >>> converter.convert_mtf_tensor_to_np_array(ids).shape
    (1, 4)
  """

  def __init__(
    self,
    encoder: Unitransformer,
    decoder: Unitransformer,
    shared_embedding: bool = True,
  ):
    """Pairs an encoder and a decoder.

    Args:
      encoder: the encoder Unitransformer (not autoregressive, no softmax).
      decoder: the decoder Unitransformer (autoregressive).
      shared_embedding: the encoder and decoder share one embedding table (the
        vocabularies must have the same size).
    """
    self.encoder = encoder
    self.decoder = decoder
    self.shared_embedding = shared_embedding

  @property
  def output_vocab_dim(self) -> mtf.Dimension:
    """The decoder's output vocabulary Dimension."""
    return self.decoder.output_vocab_dim

  @property
  def z_loss(self) -> float:
    """The decoder's z_loss weight."""
    return self.decoder.z_loss

  def loss_denominator(
    self, targets: mtf.Tensor, num_microbatches: int
  ) -> float:
    """What the summed loss is divided by (the decoder's).

    Args:
      targets: the target ids [batch..., length].
      num_microbatches: the number of microbatches.

    Returns:
      The decoder's loss denominator (a float).
    """
    return self.decoder.loss_denominator(targets, num_microbatches)

  def _shared_params(self, mesh: mtf.Mesh, variable_dtype) -> dict:
    """Parameters shared by encoder and decoder (scope "shared")."""
    shared_params = {}
    if not self.shared_embedding:
      return shared_params
    encoder, decoder = self.encoder, self.decoder
    if (
      encoder.model_dim != decoder.model_dim
      or encoder.input_vocab_dim != decoder.input_vocab_dim
    ):
      raise ValueError(
        "Bitransformer: shared_embedding needs the same d_model and input "
        "vocabulary in encoder and decoder, got %s/%s and %s/%s"
        % (
          encoder.model_dim,
          encoder.input_vocab_dim,
          decoder.model_dim,
          decoder.input_vocab_dim,
        )
      )
    with tf1.variable_scope("shared"):
      shared_params["embedding"] = get_vocab_embedding_cls()(
        mesh,
        encoder.input_vocab_dim,
        encoder.model_dim,
        variable_dtype,
        name="embedding",
        ensemble_dim=encoder.ensemble_dim,
      )
      learned_positions = [
        t.positional_embedding and not t.sinusoid_positional_embedding
        for t in (encoder, decoder)
      ]
      if all(learned_positions) and (
        encoder.max_length_dim == decoder.max_length_dim
      ):
        shared_params["positional_embedding"] = mtf.layers.embedding_weights(
          mesh,
          encoder.max_length_dim,
          encoder.model_dim,
          variable_dtype,
          "positional_embedding",
          ensemble_dim=encoder.ensemble_dim,
        )
    return shared_params

  def call_simple(
    self,
    inputs: mtf.Tensor,
    targets: mtf.Tensor,
    compute_loss: bool,
    mode=ModeKeys.TRAIN,
    variable_dtype=mtf.VariableDType(tf.float32),
    encoder_sequence_id=None,
    decoder_sequence_id=None,
    decoder_subsequence_id=None,
    encoder_position=None,
    decoder_position=None,
    num_microbatches: int = 1,
  ):
    """Decoder logits (and loss) for inputs -> targets.

    Without sequence ids, padding is where the ids are 0
    (sequence_id = min(ids, 1)). The decoder reads the targets shifted right
    (autoregressive_inputs).

    Args:
      inputs: int input ids [batch..., length] (0: padding).
      targets: int target ids [batch..., length] (0: padding; negative ids are
        fed but left out of the loss).
      compute_loss: also compute the loss.
      mode: a ModeKeys value (dropout only in training).
      variable_dtype: the mtf.VariableDType of the variables.
      encoder_sequence_id: int packed-sequence ids of the inputs [batch...,
        length] (0: padding); default min(inputs, 1).
      decoder_sequence_id: likewise for the targets.
      decoder_subsequence_id: int ids of sub-sequences of the targets (e.g. a
        prefix and the rest), or None.
      encoder_position: int positions of the inputs [batch..., length] (default
        0..length-1; packed examples restart at 0).
      decoder_position: likewise for the targets.
      num_microbatches: the number of microbatches the batch's loss is divided
        over.

    Returns:
      (logits [batch..., length, vocab], loss or None).
    """
    if decoder_sequence_id is None:
      decoder_sequence_id = mtf.minimum(targets, 1)
    (
      encoder_output,
      encoder_sequence_id,
      encoder_inputs,
      shared_params,
      encoder_layer_outputs,
      encoder_loss,
    ) = self._encode(
      inputs,
      compute_loss,
      mode,
      variable_dtype,
      encoder_sequence_id,
      encoder_position,
      num_microbatches,
    )
    logits, loss = self.decoder.call_simple(
      autoregressive_inputs(targets, sequence_id=decoder_sequence_id),
      targets,
      compute_loss,
      mode=mode,
      variable_dtype=variable_dtype,
      sequence_id=decoder_sequence_id,
      subsequence_id=decoder_subsequence_id,
      encoder_output=encoder_output,
      encoder_sequence_id=encoder_sequence_id,
      encoder_inputs=encoder_inputs,
      position=decoder_position,
      shared_params=shared_params,
      encoder_layer_outputs=encoder_layer_outputs,
      num_microbatches=num_microbatches,
    )
    if loss is not None and encoder_loss is not None:
      loss += encoder_loss
    return logits, loss

  @gin.configurable(module="Bitransformer")
  def decode(
    self,
    inputs: mtf.Tensor,
    variable_dtype=mtf.VariableDType(tf.float32),
    beam_size: int = 1,
    alpha: float = 0.6,
    temperature=0.0,
    sampling_keep_top_k: int = -1,
    decode_length_multiplier: float = 1.5,
    decode_length_constant: int = 10,
    max_decode_length: Optional[int] = None,
  ) -> mtf.Tensor:
    """Decoded ids [batch..., length] for inputs [batch..., length].

    beam_size 1 samples (temperature 0 = greedy) over the inputs' length, or
    max_decode_length positions. Larger beams run beam search (temperature
    must be 0) for at most max_input_length * decode_length_multiplier +
    decode_length_constant steps.

    Args:
      inputs: int input ids [batch..., length] (0: padding).
      variable_dtype: the mtf.VariableDType of the variables.
      beam_size: the number of beams (1: sampling or greedy decoding).
      alpha: the GNMT length-penalty exponent of beam search.
      temperature: sampling temperature (0.0: greedy argmax).
      sampling_keep_top_k: -1, or sample only among the k largest logits.
      decode_length_multiplier: with beams: decode at most max input length *
        this + decode_length_constant steps.
      decode_length_constant: see decode_length_multiplier.
      max_decode_length: the number of positions to decode (None: the inputs'
        length).

    Returns:
      int ids [batch..., length] of the decoded targets.
    """
    return self._decode_encoded(
      inputs,
      self._encode(
        inputs, False, ModeKeys.PREDICT, variable_dtype, None, None, 1
      )[:5],
      variable_dtype,
      beam_size,
      alpha,
      temperature,
      sampling_keep_top_k,
      decode_length_multiplier,
      decode_length_constant,
      max_decode_length,
    )

  def _run_encoder(
    self,
    inputs: mtf.Tensor,
    compute_loss: bool,
    mode,
    variable_dtype,
    encoder_sequence_id,
    encoder_position,
    num_microbatches: int,
  ):
    """Runs the encoder tower: (output, sequence ids, shared params, layer
    outputs, loss), at the inputs' length (named "length").
    """
    if encoder_sequence_id is None:
      encoder_sequence_id = mtf.minimum(inputs, 1)
    encoder_layer_outputs = []
    shared_params = self._shared_params(inputs.mesh, variable_dtype)
    encoder_output, encoder_loss = self.encoder.call_simple(
      inputs,
      None,
      compute_loss,
      mode=mode,
      variable_dtype=variable_dtype,
      sequence_id=encoder_sequence_id,
      position=encoder_position,
      shared_params=shared_params,
      layer_outputs=encoder_layer_outputs,
      num_microbatches=num_microbatches,
    )
    return (
      encoder_output,
      encoder_sequence_id,
      shared_params,
      encoder_layer_outputs,
      encoder_loss,
    )

  def _encode(
    self,
    inputs: mtf.Tensor,
    compute_loss: bool,
    mode,
    variable_dtype,
    encoder_sequence_id,
    encoder_position,
    num_microbatches: int,
  ):
    """What the decoder needs from the encoder: (encoder output, its
    sequence ids, encoder ids, shared params, encoder layer outputs, encoder
    loss), with length renamed memory_length. Subclasses that change the
    encoder output's length (BitransformerFunnel) override this.
    """
    (
      encoder_output,
      encoder_sequence_id,
      shared_params,
      encoder_layer_outputs,
      encoder_loss,
    ) = self._run_encoder(
      inputs,
      compute_loss,
      mode,
      variable_dtype,
      encoder_sequence_id,
      encoder_position,
      num_microbatches,
    )
    encoder_output = _rename_length_to_memory_length(encoder_output)
    if isinstance(encoder_sequence_id, mtf.Tensor):
      encoder_sequence_id = _rename_length_to_memory_length(encoder_sequence_id)
    return (
      encoder_output,
      encoder_sequence_id,
      _rename_length_to_memory_length(inputs),
      shared_params,
      encoder_layer_outputs,
      encoder_loss,
    )

  def _decode_encoded(
    self,
    inputs,
    encoded,
    variable_dtype,
    beam_size,
    alpha,
    temperature,
    sampling_keep_top_k,
    decode_length_multiplier,
    decode_length_constant,
    max_decode_length,
  ) -> mtf.Tensor:
    """decode()'s second half: sampling or beam search from an encoding."""
    (
      encoder_output,
      encoder_sequence_id,
      encoder_inputs,
      shared_params,
      encoder_layer_outputs,
    ) = encoded
    name = type(self).__name__
    batch_dims = inputs.shape.dims[:-1]
    length_dim = inputs.shape.dims[-1]
    decode_length_dim = (
      length_dim
      if max_decode_length is None
      else mtf.Dimension(length_dim.name, max_decode_length)
    )
    if beam_size == 1:
      partial_sequences = mtf.zeros(
        inputs.mesh, mtf.Shape(batch_dims + [decode_length_dim]), dtype=tf.int32
      )
      return self.decoder.sample_autoregressive(
        partial_sequences,
        temperature=temperature,
        sampling_keep_top_k=sampling_keep_top_k,
        variable_dtype=variable_dtype,
        encoder_output=encoder_output,
        encoder_sequence_id=encoder_sequence_id,
        encoder_inputs=encoder_inputs,
        shared_params=shared_params,
        has_partial_sequences=False,
        encoder_layer_outputs=encoder_layer_outputs,
      )
    if temperature != 0:
      raise ValueError(
        "%s.decode: beam search (beam_size=%d) needs "
        "temperature 0, got %r" % (name, beam_size, temperature)
      )
    if sampling_keep_top_k != -1:
      raise ValueError(
        "%s.decode: beam search (beam_size=%d) does not sample; "
        "sampling_keep_top_k must be -1, got %r"
        % (name, beam_size, sampling_keep_top_k)
      )
    beam_dim = mtf.Dimension("beam", beam_size)
    partial_sequences = mtf.zeros(
      inputs.mesh,
      mtf.Shape(batch_dims + [beam_dim, decode_length_dim]),
      dtype=tf.int32,
    )
    input_length = mtf.reduce_sum(
      mtf.to_float(mtf.not_equal(inputs, 0)), reduced_dim=length_dim
    )
    max_input_length = mtf.reduce_max(input_length)
    decode_length = mtf.cast(
      max_input_length * decode_length_multiplier + decode_length_constant,
      tf.int32,
    )
    return self.decoder.beam_search(
      partial_sequences,
      decode_length,
      variable_dtype=variable_dtype,
      encoder_output=encoder_output,
      encoder_sequence_id=encoder_sequence_id,
      encoder_inputs=encoder_inputs,
      alpha=alpha,
      shared_params=shared_params,
      encoder_layer_outputs=encoder_layer_outputs,
    )


@gin.configurable(module=_GIN_MODULE)
class StudentTeacher:
  """Distils a teacher model into a student (scopes "student"/"teacher").

  loss = (1 - f) * hard_loss + temperature**2 * f * soft_loss, where
  hard_loss is the student's own loss, soft_loss the cross-entropy of the
  student's logits / temperature against softmax(teacher logits /
  temperature) over positions with targets > 0, and f = fraction_soft once
  the global step exceeds distill_start_step (0 before). The teacher's
  variables are made untrainable; `initialize()` loads them (and optionally
  matching student weights) from teacher_checkpoint.
  """

  def __init__(
    self,
    student,
    teacher,
    temperature: Optional[float] = None,
    fraction_soft: Optional[float] = None,
    distill_start_step: int = 0,
    teacher_checkpoint: Optional[str] = None,
    initialize_student_weights: bool = False,
  ):
    """Pairs a student with a teacher.

    Args:
      student: the model trained (a Unitransformer or Bitransformer).
      teacher: the fixed model distilled from (same kind as the student).
      temperature: the softmax temperature of the teacher's soft targets
        (required when fraction_soft > 0).
      fraction_soft: the weight of the soft (distillation) loss; 1 -
        fraction_soft weighs the hard loss on the targets.
      distill_start_step: before this global step only the hard loss is used.
      teacher_checkpoint: the checkpoint of the trained teacher (see
        initialize).
      initialize_student_weights: also initialize the student from
        teacher_checkpoint (for the names it has).
    """
    self.student = student
    self.teacher = teacher
    self.temperature = temperature
    self.fraction_soft = fraction_soft
    self.distill_start_step = distill_start_step
    self.teacher_checkpoint = teacher_checkpoint
    self.initialize_student_weights = initialize_student_weights

  def call_simple(
    self,
    inputs: mtf.Tensor,
    targets: mtf.Tensor,
    compute_loss: bool,
    variable_dtype=mtf.VariableDType(tf.float32),
    num_microbatches: int = 1,
    **kargs,
  ):
    """(student logits, distillation loss), or the logits alone without loss.

    Args:
      inputs: int input ids [batch..., length] (for a Bitransformer student).
      targets: int target ids [batch..., length].
      compute_loss: compute the distillation loss (False: return the student's
        logits alone).
      variable_dtype: the mtf.VariableDType of the variables.
      num_microbatches: the number of microbatches the batch's loss is divided
        over.

    Returns:
      (student logits [batch..., length, vocab], loss), or the student's logits
      alone without compute_loss.
    """
    with tf1.variable_scope("student"):
      student_logits, hard_loss = self.student.call_simple(
        inputs,
        targets,
        compute_loss=True,
        variable_dtype=variable_dtype,
        num_microbatches=num_microbatches,
        **kargs,
      )
    if not compute_loss:
      return student_logits
    if self.fraction_soft == 0.0:
      # No teacher needed.
      return student_logits, hard_loss
    if self.temperature is None or self.fraction_soft is None:
      raise ValueError(
        "StudentTeacher: temperature (%r) and fraction_soft "
        "(%r) are required to distil" % (self.temperature, self.fraction_soft)
      )
    vocab_dim = self.student.output_vocab_dim
    if vocab_dim != self.teacher.output_vocab_dim:
      raise ValueError(
        "StudentTeacher: student vocabulary %s differs from "
        "the teacher's %s" % (vocab_dim, self.teacher.output_vocab_dim)
      )
    graph = inputs.mesh.graph
    with tf1.variable_scope("teacher"):
      teacher_logits, _ = self.teacher.call_simple(
        inputs,
        targets,
        compute_loss=True,
        variable_dtype=variable_dtype,
        num_microbatches=num_microbatches,
        **kargs,
      )
    graph.make_variables_untrainable(
      [v for v in graph.trainable_variables if v.name.startswith("teacher/")]
    )
    soft_targets = mtf.softmax(teacher_logits / self.temperature, vocab_dim)
    soft_loss = mtf.layers.softmax_cross_entropy_with_logits(
      student_logits / self.temperature,
      mtf.stop_gradient(soft_targets),
      vocab_dim,
      z_loss=self.student.z_loss,
    )
    weights = mtf.cast(mtf.greater(targets, 0), soft_loss.dtype)
    soft_loss = mtf.reduce_sum(
      soft_loss * weights
    ) / self.student.loss_denominator(targets, num_microbatches)
    fraction = self._current_fraction_soft(inputs.mesh, hard_loss.dtype)
    loss = (1.0 - fraction) * hard_loss + (
      self.temperature**2
    ) * fraction * soft_loss
    return student_logits, loss

  def _current_fraction_soft(self, mesh: mtf.Mesh, dtype):
    step = tf1.train.get_global_step()
    if step is None:
      if self.distill_start_step > 0:
        raise ValueError(
          "StudentTeacher: distill_start_step=%d needs a TF global step "
          "(tf.compat.v1.train.get_or_create_global_step())"
          % self.distill_start_step
        )
      return float(self.fraction_soft)
    fraction = tf.where(
      tf.greater(tf.cast(step, tf.int64), self.distill_start_step),
      tf.constant(self.fraction_soft, dtype),
      tf.constant(0.0, dtype),
    )
    return mtf.import_fully_replicated(
      mesh, fraction, mtf.Shape([]), name="fraction_soft"
    )

  def decode(self, *args: Any, **kargs: Any) -> Any:
    """The student's decode (under scope "student").

    Returns:
      The student's decoded ids [batch..., length].
    """
    with tf1.variable_scope("student"):
      return self.student.decode(*args, **kargs)

  def initialize(self) -> None:
    """Loads teacher (and maybe student) masters from teacher_checkpoint.

    The checkpoint holds the teacher trained alone, so `teacher/<name>` is
    read from `<name>` (likewise `student/<name>` with
    initialize_student_weights, for names the checkpoint has). Call it once
    the model was built (its variables exist in the store) and before the
    masters are copied to slices. The variables are those of
    mtf.get_default_variable_store() (choose one with
    `with mtf.variable_store(store):`).

    Raises:
      ValueError: no teacher_checkpoint, a teacher variable missing from the
        checkpoint, or a shape mismatch.
    """
    if not self.teacher_checkpoint:
      raise ValueError(
        "StudentTeacher.initialize: teacher_checkpoint is not set"
      )
    store = mtf.get_default_variable_store()
    reader = tf.train.load_checkpoint(self.teacher_checkpoint)
    shapes = reader.get_variable_to_shape_map()
    for name, var in sorted(store.masters.items()):
      for prefix, required in (("teacher/", True), ("student/", False)):
        if not name.startswith(prefix):
          continue
        if prefix == "student/" and not self.initialize_student_weights:
          continue
        source = name[len(prefix) :]
        if source not in shapes:
          if required:
            raise ValueError(
              "StudentTeacher.initialize: %r is not in the "
              "teacher checkpoint %s (for %r)"
              % (source, self.teacher_checkpoint, name)
            )
          continue
        if list(shapes[source]) != var.shape.as_list():
          raise ValueError(
            "StudentTeacher.initialize: %r has shape %s in the "
            "checkpoint but %r has %s"
            % (source, shapes[source], name, var.shape.as_list())
          )
        var.assign(tf.cast(reader.get_tensor(source), var.dtype))


@gin.configurable(module=_GIN_MODULE)
def make_bitransformer(
  input_vocab_size=gin.REQUIRED,
  output_vocab_size=gin.REQUIRED,
  layout=None,
  mesh_shape=None,
  encoder_name: str = "encoder",
  decoder_name: str = "decoder",
  bitransformer_cls=Bitransformer,
):
  """An encoder-decoder configured by the gin scopes "encoder"/"decoder".

  Example (gin):
    >>> _ = gin.parse_config('''
    ... encoder/make_layer_stack.layers = [@SelfAttention, @DenseReluDense]
    ... decoder/make_layer_stack.layers = [@SelfAttention, @EncDecAttention,
    ...                                    @DenseReluDense]
    ... make_layer_stack.num_layers = 1
    ... Unitransformer.max_length = 4
    ... ''')
    >>> model = make_bitransformer(input_vocab_size=16, output_vocab_size=16)
    >>> gin.clear_config()
    >>> [layer.name for layer in model.encoder.layer_stack.layers]
    ['block_000/layer_000', 'block_000/layer_001']
    >>> [type(layer).__name__ for layer in model.decoder.layer_stack.layers]
    ['SelfAttention', 'EncDecAttention', 'DenseReluDense']
    >>> model.encoder.autoregressive, model.decoder.autoregressive
    (False, True)

  Args:
    input_vocab_size: the input vocabulary size (padded up to a multiple of
      vocab_divisor).
    output_vocab_size: the output vocabulary size (likewise).
    layout: the layout rules (string or mtf.LayoutRules), used by layers that
      depend on the layout (e.g. MoE).
    mesh_shape: the mesh shape (string or mtf.Shape), likewise.
    encoder_name: the encoder's gin scope and variable scope.
    decoder_name: the decoder's gin scope and variable scope.
    bitransformer_cls: the class built (Bitransformer or a subclass such as
      BitransformerFunnel).

  Returns:
    A bitransformer_cls instance.
  """
  for param, value in (
    ("input_vocab_size", input_vocab_size),
    ("output_vocab_size", output_vocab_size),
  ):
    if value is gin.REQUIRED:
      raise ValueError("make_bitransformer: parameter %r is required" % param)
  with gin.config_scope("encoder"):
    encoder = Unitransformer(
      layer_stack=make_layer_stack(),
      input_vocab_size=input_vocab_size,
      output_vocab_size=None,
      autoregressive=False,
      name=encoder_name,
      layout=layout,
      mesh_shape=mesh_shape,
    )
  with gin.config_scope("decoder"):
    decoder = Unitransformer(
      layer_stack=make_layer_stack(),
      input_vocab_size=output_vocab_size,
      output_vocab_size=output_vocab_size,
      autoregressive=True,
      name=decoder_name,
      layout=layout,
      mesh_shape=mesh_shape,
    )
  return bitransformer_cls(encoder, decoder)


@gin.configurable(module=_GIN_MODULE)
def make_bi_student_teacher(
  input_vocab_size: int = gin.REQUIRED,
  output_vocab_size: int = gin.REQUIRED,
  layout: Union[None, str, mtf.LayoutRules] = None,
  mesh_shape: Union[None, str, mtf.Shape] = None,
) -> StudentTeacher:
  """A StudentTeacher of two Bitransformers (gin scopes "student"/"teacher").

  Args:
    input_vocab_size: the input vocabulary size (padded up to a multiple of
      vocab_divisor).
    output_vocab_size: the output vocabulary size (likewise).
    layout: the layout rules (string or mtf.LayoutRules), used by layers that
      depend on the layout (e.g. MoE).
    mesh_shape: the mesh shape (string or mtf.Shape), likewise.

  Returns:
    A StudentTeacher.
  """
  with gin.config_scope("student"):
    student = make_bitransformer(
      input_vocab_size=input_vocab_size,
      output_vocab_size=output_vocab_size,
      layout=layout,
      mesh_shape=mesh_shape,
    )
  with gin.config_scope("teacher"):
    teacher = make_bitransformer(
      input_vocab_size=input_vocab_size,
      output_vocab_size=output_vocab_size,
      layout=layout,
      mesh_shape=mesh_shape,
    )
  return StudentTeacher(student=student, teacher=teacher)
