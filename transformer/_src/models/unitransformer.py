"""Unitransformer: one transformer tower (LM, encoder or decoder).

Embeds ids (plus learned or sinusoid positions), runs a LayerStack, and
projects to vocabulary logits. Training/eval go through `call_simple`;
decoding through `sample_autoregressive` (a "first_part" pass over the prompt
that records per-layer states, then an mtf.while_loop of "incremental" one
position steps) or `beam_search`. Also here: the helpers that turn targets
into autoregressive inputs, and the ensemble logit reducers.
"""

from __future__ import annotations

from typing import Callable, List, Optional

from absl import logging
import gin
import tensorflow as tf

import mesh_tensorflow as mtf
from transformer._src.layers.context import Context
from transformer._src.layers.context import ModeKeys
from transformer._src.layers.embeddings import get_vocab_embedding_cls
from transformer._src.layers.embeddings import (
  sinusoid_positional_embedding_weights,
)

tf1 = tf.compat.v1

__all__ = [
  "Unitransformer",
  "autoregressive_inputs",
  "delimited_lm_inputs_mask",
  "reduce_ensemble_logits",
  "reduce_ensemble_logits_mean_logit",
  "reduce_ensemble_logits_mean_prob",
  "reduce_ensemble_logits_select",
  "shift_targets",
]

_GIN_MODULE = "mesh_tensorflow.transformer.transformer"


# ----------------------------------------------------------------------------
# Targets -> inputs.


@gin.configurable(module=_GIN_MODULE)
def shift_targets(
  targets: mtf.Tensor, bos_id: int = 0, eos_id: int = 1
) -> mtf.Tensor:
  """Deprecated (use autoregressive_inputs): targets shifted right by one.

  The EOS shifted in from a previous packed sequence becomes 0; with bos_id,
  a 0 in front of a nonzero target becomes bos_id.

  Args:
    targets: int target ids [batch..., length].
    bos_id: the id put in front of each sequence (0: none).
    eos_id: the EOS id (an EOS shifted in from the previous packed sequence
      becomes 0).

  Returns:
    int ids shaped as targets.
  """
  length_dim = targets.shape.dims[-1]
  shifted = mtf.shift(targets, offset=1, dim=length_dim, wrap=False)
  shifted *= mtf.to_int32(mtf.not_equal(shifted, eos_id))
  if bos_id:
    shifted += (
      mtf.to_int32(
        mtf.logical_and(mtf.equal(shifted, 0), mtf.not_equal(targets, 0))
      )
      * bos_id
    )
  return shifted


def autoregressive_inputs(targets: mtf.Tensor, sequence_id=None) -> mtf.Tensor:
  """Decoder inputs from targets: shifted right by one along length.

  Packed sequences (sequence_id a Tensor) start with 0; negative target ids
  (masked from the loss) are fed as their absolute value.

  Example (two packed sequences):
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> targets = converter.convert_np_array_to_mtf_tensor(
    ...     [[5, 6, 1, 7, 1]], ["batch", "length"])
    >>> sequence_id = converter.convert_np_array_to_mtf_tensor(
    ...     [[1, 1, 1, 2, 2]], ["batch", "length"])
    >>> inputs = autoregressive_inputs(targets, sequence_id)
    >>> converter.convert_mtf_tensor_to_np_array(inputs)
    array([[0, 5, 6, 0, 7]], dtype=int32)

  Args:
    targets: int target ids [batch..., length].
    sequence_id: int packed-sequence ids [batch..., length], or None for
      unpacked targets.

  Returns:
    int inputs, shaped as targets.
  """
  length_dim = targets.shape.dims[-1]
  inputs = mtf.shift(targets, offset=1, dim=length_dim, wrap=False)
  if isinstance(sequence_id, mtf.Tensor):
    inputs *= mtf.to_int32(
      mtf.equal(
        sequence_id,
        mtf.shift(sequence_id, offset=1, dim=length_dim, wrap=False),
      )
    )
  return mtf.abs(inputs)


def delimited_lm_inputs_mask(ids: mtf.Tensor, eos_id: int = 1) -> mtf.Tensor:
  """Boolean mask of the "inputs" parts of delimited LM sequences.

  ids hold packed [inputs, EOS, targets, EOS, inputs, EOS, ...]: a position is
  in an inputs part when an even number of EOS precede it.

  Args:
    ids: int ids [batch..., length] of delimited LM sequences.
    eos_id: the EOS id that delimits the parts.

  Returns:
    A boolean Tensor shaped as ids.
  """
  length_dim = ids.shape.dims[-1]
  eos_before = mtf.cumsum(
    mtf.to_int32(mtf.equal(ids, eos_id)), length_dim, exclusive=True
  )
  return mtf.equal(mtf.mod(eos_before, 2), 0)


# ----------------------------------------------------------------------------
# Ensembles.


@gin.configurable(module=_GIN_MODULE)
def reduce_ensemble_logits_select(
  logits: mtf.Tensor,
  ensemble_dim: mtf.Dimension,
  vocab_dim: mtf.Dimension,
  model_id: int = 0,
) -> mtf.Tensor:
  """The logits of ensemble member model_id.

  Args:
    logits: the members' logits [ensemble, batch..., length, vocab].
    ensemble_dim: the ensemble Dimension (reduced).
    vocab_dim: the vocabulary Dimension (unused).
    model_id: the index of the member whose logits are returned.

  Returns:
    Logits [batch..., length, vocab].
  """
  del vocab_dim
  return mtf.gather(logits, model_id, ensemble_dim)


@gin.configurable(module=_GIN_MODULE)
def reduce_ensemble_logits_mean_prob(
  logits: mtf.Tensor, ensemble_dim: mtf.Dimension, vocab_dim: mtf.Dimension
) -> mtf.Tensor:
  """log of the members' mean probability (floored at 1e-20).

  Args:
    logits: the members' logits [ensemble, batch..., length, vocab].
    ensemble_dim: the ensemble Dimension (reduced).
    vocab_dim: the vocabulary Dimension.

  Returns:
    Log-probabilities [batch..., length, vocab].
  """
  probs = mtf.softmax(logits, reduced_dim=vocab_dim)
  probs = mtf.reduce_mean(probs, reduced_dim=ensemble_dim)
  return mtf.log(mtf.maximum(probs, 1e-20))


@gin.configurable(module=_GIN_MODULE)
def reduce_ensemble_logits_mean_logit(
  logits: mtf.Tensor, ensemble_dim: mtf.Dimension, vocab_dim: mtf.Dimension
) -> mtf.Tensor:
  """The members' mean logit.

  Args:
    logits: the members' logits [ensemble, batch..., length, vocab].
    ensemble_dim: the ensemble Dimension (reduced).
    vocab_dim: the vocabulary Dimension (unused).

  Returns:
    Logits [batch..., length, vocab].
  """
  del vocab_dim
  return mtf.reduce_mean(logits, reduced_dim=ensemble_dim)


@gin.configurable(module=_GIN_MODULE)
def reduce_ensemble_logits(
  logits: mtf.Tensor,
  ensemble_dim: mtf.Dimension,
  vocab_dim: mtf.Dimension,
  reduce_fn=reduce_ensemble_logits_mean_prob,
) -> mtf.Tensor:
  """Combines [ensemble, ..., vocab] logits into [..., vocab] by reduce_fn.

  Args:
    logits: the members' logits [ensemble, batch..., length, vocab].
    ensemble_dim: the ensemble Dimension (reduced).
    vocab_dim: the vocabulary Dimension.
    reduce_fn: called as reduce_fn(logits, ensemble_dim, vocab_dim), e.g.
      reduce_ensemble_logits_mean_prob.

  Returns:
    Logits [batch..., length, vocab].
  """
  return reduce_fn(logits, ensemble_dim, vocab_dim)


# ----------------------------------------------------------------------------
# The tower.


def _round_up_to_multiple(n: int, divisor) -> int:
  if not divisor or divisor <= 1:
    return n
  return n + -n % divisor


@gin.configurable(module=_GIN_MODULE)
class Unitransformer:
  """A transformer tower: embeddings, a LayerStack and the softmax.

  Variables (under `<name>/`): `embedding` [vocab, d_model] (unless shared),
  `positional_embedding` [max_length, d_model] (learned positions),
  `logits/kernel` [d_model, vocab] (unless the softmax shares the embedding),
  and the layers'.

  Example (a one-layer language model; the loss checked against numpy):
    >>> from transformer import transformer
    >>> from transformer.transformer_layers import DenseReluDense
    >>> from transformer.transformer_layers import SelfAttention
    >>> lm = Unitransformer(
    ...     transformer.make_layer_stack([SelfAttention, DenseReluDense],
    ...                                  num_layers=1),
    ...     d_model=8, input_vocab_size=16, output_vocab_size=16,
    ...     autoregressive=True, max_length=4, vocab_divisor=1)
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> targets = converter.convert_np_array_to_mtf_tensor(
    ...     [[3, 5, 7, 1]], ["batch", "length"])
    >>> inputs = autoregressive_inputs(targets)  # [[0, 3, 5, 7]]
    >>> logits, loss = lm.call_simple(inputs, targets, compute_loss=True,
    ...                               mode="eval")
    >>> logits.shape, loss.shape
    (Shape[batch=1, length=4, vocab=16], Shape[])
    >>> lowering, loss_tf = converter.convert_mtf_tensor_to_tf_tensor(loss)
    >>> logits_np = lowering.export_to_tf_tensor(logits).numpy()[0]
    >>> log_p = logits_np - np.log(np.exp(logits_np).sum(-1, keepdims=True))
    >>> cross_entropy = -log_p[np.arange(4), [3, 5, 7, 1]]
    >>> np.allclose(loss_tf.numpy(), cross_entropy.mean())  # per token
    True
  """

  def __init__(
    self,
    layer_stack,
    d_model: int = 1024,
    input_vocab_size=gin.REQUIRED,
    output_vocab_size=gin.REQUIRED,
    autoregressive=gin.REQUIRED,
    max_length=gin.REQUIRED,
    shared_embedding_and_softmax_weights: bool = False,
    label_smoothing: float = 0.0,
    z_loss: float = 1e-4,
    name: str = "transformer",
    layout=None,
    mesh_shape=None,
    vocab_divisor: Optional[int] = 128,
    ensemble=None,
    loss_fn: Optional[Callable] = None,
    positional_embedding: bool = True,
    sinusoid_positional_embedding: bool = False,
    input_full_attention: bool = False,
    loss_on_targets_only: bool = False,
    loss_denominator=None,
    token_dropout_rate: float = 0.0,
  ):
    """Creates the tower's dims (variables are created when it is called).

    Args:
      layer_stack: the LayerStack of the tower.
      d_model: the model dimension.
      input_vocab_size: the input vocabulary size (padded up to a multiple of
        vocab_divisor).
      output_vocab_size: the output vocabulary size (likewise).
      autoregressive: whether position i sees only positions <= i (a decoder or
        language model).
      max_length: the number of positions of the positional embedding.
      shared_embedding_and_softmax_weights: use the embedding table as the
        softmax weights (the vocabularies must match).
      label_smoothing: the label-smoothing amount of the loss.
      z_loss: the weight of the auxiliary loss z_loss * log(Z)^2 (Z the softmax
        normalizer) that keeps the logits from drifting.
      name: the variable scope of the tower.
      layout: the layout rules (string or mtf.LayoutRules), used by layers that
        depend on the layout.
      mesh_shape: the mesh shape (string or mtf.Shape), likewise.
      vocab_divisor: the vocabulary sizes are rounded up to a multiple of this
        (None: not rounded).
      ensemble: the number of ensemble members (one set of variables each), or
        None.
      loss_fn: called as loss_fn(model, context, logits, targets,
        output_vocab_dim) to compute the loss (None: cross-entropy).
      positional_embedding: add a positional embedding to the input embeddings.
      sinusoid_positional_embedding: use the fixed sinusoid table instead of a
        learned one.
      input_full_attention: with autoregressive: the inputs part of a delimited
        sequence attends to itself fully (a prefix LM).
      loss_on_targets_only: with input_full_attention: leave the inputs part out
        of the loss.
      loss_denominator: a fixed number to divide the summed loss by (None: see
        loss_denominator).
      token_dropout_rate: the rate at which input tokens are replaced by 0 in
        training.

    Raises:
      ValueError: a required argument is missing, an autoregressive tower has no
        output_vocab_size, or shared embeddings have different vocabulary sizes.
    """
    for param, value in (
      ("input_vocab_size", input_vocab_size),
      ("output_vocab_size", output_vocab_size),
      ("autoregressive", autoregressive),
      ("max_length", max_length),
    ):
      if value is gin.REQUIRED:
        raise ValueError(
          "Unitransformer %r: parameter %r is required" % (name, param)
        )
    self.layer_stack = layer_stack
    self.model_dim = mtf.Dimension("d_model", d_model)
    self.input_vocab_size_unpadded = input_vocab_size
    self.input_vocab_dim = mtf.Dimension(
      "vocab", _round_up_to_multiple(input_vocab_size, vocab_divisor)
    )
    if output_vocab_size:
      self.output_vocab_size_unpadded = output_vocab_size
      self.output_vocab_dim = mtf.Dimension(
        "vocab", _round_up_to_multiple(output_vocab_size, vocab_divisor)
      )
    else:
      self.output_vocab_size_unpadded = None
      self.output_vocab_dim = None
      if autoregressive:
        raise ValueError(
          "Unitransformer %r: an autoregressive tower needs "
          "output_vocab_size" % name
        )
    self.autoregressive = autoregressive
    self.max_length_dim = mtf.Dimension("max_length", max_length)
    if (
      shared_embedding_and_softmax_weights
      and self.output_vocab_dim is not None
      and self.output_vocab_dim != self.input_vocab_dim
    ):
      raise ValueError(
        "Unitransformer %r: shared_embedding_and_softmax_weights needs equal "
        "input and output vocabularies, got %s and %s"
        % (name, self.input_vocab_dim, self.output_vocab_dim)
      )
    self.shared_embedding_and_softmax_weights = (
      shared_embedding_and_softmax_weights
    )
    self.label_smoothing = label_smoothing
    self.z_loss = z_loss
    self.name = name
    self.layout = layout
    self.mesh_shape = mesh_shape
    self.ensemble_dim = (
      mtf.Dimension("ensemble", ensemble) if ensemble else None
    )
    self.loss_fn = loss_fn
    self.positional_embedding = positional_embedding
    self.sinusoid_positional_embedding = sinusoid_positional_embedding
    if input_full_attention and not autoregressive:
      raise ValueError(
        "Unitransformer %r: input_full_attention only applies "
        "to autoregressive models" % name
      )
    self.input_full_attention = input_full_attention
    self.loss_on_targets_only = loss_on_targets_only
    self._loss_denominator = loss_denominator
    if not 0.0 <= token_dropout_rate < 1.0:
      raise ValueError(
        "Unitransformer %r: token_dropout_rate must be in "
        "[0, 1), got %r" % (name, token_dropout_rate)
      )
    self.token_dropout_rate = token_dropout_rate

  @property
  def fully_autoregressive(self) -> bool:
    """Whether every position sees only earlier positions (autoregressive and
    not input_full_attention).
    """
    return bool(self.autoregressive) and not self.input_full_attention

  @property
  def ensemble_dims(self) -> List[mtf.Dimension]:
    """[ensemble_dim], or [] without an ensemble."""
    return [self.ensemble_dim] if self.ensemble_dim else []

  @property
  def _uses_positions(self) -> bool:
    return bool(self.positional_embedding or self.sinusoid_positional_embedding)

  def loss_denominator(
    self, targets: mtf.Tensor, num_microbatches: int
  ) -> float:
    """What the summed loss is divided by.

    The configured loss_denominator, else the number of target tokens
    (padding included) times num_microbatches, divided by the ensemble size.

    Args:
      targets: the target ids [batch..., length].
      num_microbatches: the number of microbatches.

    Returns:
      A float.
    """
    if self._loss_denominator is not None:
      return float(self._loss_denominator)
    denominator = float(targets.shape.size) * num_microbatches
    if self.ensemble_dim:
      # Each member's gradient should not shrink with the ensemble size.
      denominator /= self.ensemble_dim.size
    return float(denominator)

  # --------------------------------------------------------------------------

  def _positional_embedding(self, context: Context, x: mtf.Tensor):
    mesh = x.mesh
    if self.sinusoid_positional_embedding:
      table = sinusoid_positional_embedding_weights(
        mesh,
        self.max_length_dim,
        self.model_dim,
        context.variable_dtype.activation_dtype,
      )
    elif "positional_embedding" in (context.shared_params or {}):
      table = context.shared_params["positional_embedding"]
    else:
      table = mtf.layers.embedding_weights(
        mesh,
        self.max_length_dim,
        self.model_dim,
        context.variable_dtype,
        "positional_embedding",
        ensemble_dim=self.ensemble_dim,
      )
    if (
      context.length_dim is not None
      and context.length_dim.size > self.max_length_dim.size
    ):
      message = (
        "Unitransformer %r: length dimension %s is longer than the "
        "positional embedding table %s"
        % (self.name, context.length_dim, self.max_length_dim)
      )
      if context.position_is_default:
        raise ValueError(message)
      logging.warning(
        "%s; fine for packed shorter sequences, later positions get zeros",
        message,
      )
    if context.position_is_default and context.length_dim in x.shape.dims:
      pos_emb = mtf.rename_dimension(
        mtf.slice(table, 0, context.length_dim.size, self.max_length_dim.name),
        self.max_length_dim.name,
        context.length_dim.name,
      )
    else:
      pos_emb = mtf.gather(table, context.position, self.max_length_dim)
    return pos_emb

  def _call_internal(
    self,
    context: Context,
    inputs: mtf.Tensor,
    targets: Optional[mtf.Tensor] = None,
  ):
    """Embeds inputs, runs the stack, returns logits (or hidden states)."""
    mesh = inputs.mesh
    broadcast_ensemble = bool(
      self.ensemble_dim and self.ensemble_dim not in inputs.shape.dims
    )
    if broadcast_ensemble:
      # Every member sees the same examples.
      inputs = mtf.broadcast(inputs, [self.ensemble_dim] + inputs.shape.dims)
      if targets is not None:
        targets = mtf.broadcast(
          targets, [self.ensemble_dim] + targets.shape.dims
        )
    if self.token_dropout_rate and context.train:
      # Dropped tokens become id 0.
      inputs = mtf.dropout(
        inputs,
        context.train,
        rate=self.token_dropout_rate,
        noise_shape=inputs.shape,
      )
    shared = context.shared_params or {}
    if "embedding" in shared:
      vocab_embedding = shared["embedding"]
    else:
      vocab_embedding = get_vocab_embedding_cls()(
        mesh,
        self.input_vocab_dim,
        self.model_dim,
        context.variable_dtype,
        name="embedding",
        ensemble_dim=self.ensemble_dim,
      )
    x = vocab_embedding.ids_to_embedding(inputs, context)
    context.input_embeddings = x
    if self._uses_positions:
      pos_emb = self._positional_embedding(context, x)
      x += pos_emb
    x = self.layer_stack.call(context, x)
    if self.output_vocab_dim is None:
      return x
    if self.shared_embedding_and_softmax_weights:
      logits = vocab_embedding.hidden_to_logits(x, context)
    else:
      logits = mtf.layers.dense(
        x,
        self.output_vocab_dim,
        use_bias=False,
        variable_dtype=context.variable_dtype,
        reduced_dims=[self.model_dim],
        expert_dims=self.ensemble_dims,
        name="logits",
      )
    if targets is not None and context.losses is not None:
      context.losses.append(
        self._compute_loss(context, logits, targets, self.output_vocab_dim)
      )
    if broadcast_ensemble:
      logits = reduce_ensemble_logits(
        logits, self.ensemble_dim, self.output_vocab_dim
      )
    return logits

  def _compute_loss(
    self,
    context: Context,
    logits: mtf.Tensor,
    targets: mtf.Tensor,
    output_vocab_dim: mtf.Dimension,
  ) -> mtf.Tensor:
    """Label-smoothed softmax cross-entropy over positions with targets > 0."""
    if self.loss_fn:
      return self.loss_fn(self, context, logits, targets, output_vocab_dim)
    if self.label_smoothing:
      off_value = self.label_smoothing / output_vocab_dim.size
      on_value = 1.0 - self.label_smoothing + off_value
      loss_targets = mtf.one_hot(
        mtf.maximum(targets, 0),
        output_vocab_dim,
        dtype=context.activation_dtype,
        on_value=on_value,
        off_value=off_value,
      )
    else:
      # The same loss as their one-hots, as hard targets: a gather of the
      # target logits instead of a [..., vocab]-sized one-hot product.
      loss_targets = mtf.maximum(targets, 0)
    loss = mtf.layers.softmax_cross_entropy_with_logits(
      logits,
      loss_targets,
      output_vocab_dim,
      z_loss=self.z_loss if context.train else 0.0,
    )
    weights = mtf.cast(mtf.greater(targets, 0), context.activation_dtype)
    if self.loss_on_targets_only:
      weights *= mtf.cast(
        mtf.logical_not(delimited_lm_inputs_mask(targets)),
        context.activation_dtype,
      )
    return mtf.reduce_sum(loss * weights) / self.loss_denominator(
      targets, context.num_microbatches
    )

  # --------------------------------------------------------------------------

  def call_simple(
    self,
    inputs: mtf.Tensor,
    targets: Optional[mtf.Tensor],
    compute_loss: bool,
    mode=ModeKeys.TRAIN,
    variable_dtype=mtf.VariableDType(tf.float32),
    sequence_id=None,
    subsequence_id=None,
    position=None,
    encoder_output=None,
    encoder_sequence_id=None,
    encoder_inputs=None,
    shared_params=None,
    layer_outputs=None,
    encoder_layer_outputs=None,
    num_microbatches: int = 1,
  ):
    """Logits (or hidden states) and the loss for a batch.

    Args:
      inputs: int Tensor [batch..., length].
      targets: int Tensor [batch..., length] or None (ids <= 0 are not
        scored).
      compute_loss: return the loss (cross-entropy plus layers' aux losses).
      mode: a ModeKeys value (z_loss applies in TRAIN only).
      variable_dtype: an mtf.VariableDType.
      sequence_id: packed-sequence ids (0 = padding), or None.
      subsequence_id: optional sub-sequence ids.
      position: optional int positions [batch..., length].
      encoder_output: decoder towers: the encoder output (memory_length).
      encoder_sequence_id: its sequence ids.
      encoder_inputs: the encoder's ids.
      shared_params: dict of parameters shared between towers.
      layer_outputs: optional list the stack appends its activations to.
      encoder_layer_outputs: the encoder's activations.
      num_microbatches: scales the loss denominator.

    Returns:
      (logits [batch..., length, vocab] or hidden states, loss or None).

    Raises:
      ValueError: with input_full_attention but no targets.
    """
    batch_dims = inputs.shape.dims[:-1]
    length_dim = inputs.shape.dims[-1]
    mesh = inputs.mesh
    length_range = mtf.range(mesh, length_dim, dtype=tf.int32)
    if not self._uses_positions:
      # Nothing reads absolute positions: relative attention sees the same
      # differences with the tensor index, which is cheaper.
      position = None
    position_is_default = position is None
    if position is None:
      position = length_range
    if self.input_full_attention:
      if targets is None:
        raise ValueError(
          "Unitransformer %r: input_full_attention needs the "
          "targets (to find the inputs part)" % self.name
        )
      # Each sequence's inputs part (and the position reading its final EOS)
      # attends fully within itself; later positions see only the past.
      region = delimited_lm_inputs_mask(targets)
      region = mtf.logical_or(
        region, mtf.shift(region, offset=1, dim=length_dim, wrap=False)
      )
      read_priority = write_priority = length_range * mtf.to_int32(
        mtf.logical_not(region)
      )
    elif self.autoregressive:
      read_priority = write_priority = length_range
    else:
      read_priority = write_priority = None
    context = Context(
      model=self,
      mesh=mesh,
      batch_dims=batch_dims,
      length_dim=length_dim,
      variable_dtype=variable_dtype,
      mode=mode,
      losses=[] if compute_loss else None,
      sequence_id=sequence_id,
      subsequence_id=subsequence_id,
      position=position,
      position_is_default=position_is_default,
      encoder_output=encoder_output,
      encoder_sequence_id=encoder_sequence_id,
      shared_params=shared_params,
      layer_outputs=layer_outputs,
      encoder_layer_outputs=encoder_layer_outputs,
      write_priority=write_priority,
      read_priority=read_priority,
      inputs=inputs,
      encoder_inputs=encoder_inputs,
      num_microbatches=num_microbatches,
    )
    with tf1.variable_scope(self.name):
      logits = self._call_internal(context, inputs, targets)
    loss = mtf.add_n(context.losses) if compute_loss else None
    if isinstance(loss, int):  # No loss term at all (e.g. an encoder).
      loss = None
    return logits, loss

  # --------------------------------------------------------------------------
  # Decoding.

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
