"""Unitransformer: one transformer tower (LM, encoder or decoder).

Embeds ids (plus learned or sinusoid positions), runs a LayerStack, and
projects to vocabulary logits; training and evaluation go through
`call_simple` (logits and the loss). Decoding (`sample_autoregressive`,
`beam_search`) is inherited from UnitransformerDecoding
(unitransformer_decoding); the decoder inputs made from targets live in
decoder_inputs, the ensemble logit reducers in ensemble_logits.
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
from transformer._src.models.decoder_inputs import delimited_lm_inputs_mask
from transformer._src.models.ensemble_logits import reduce_ensemble_logits
from transformer._src.models.unitransformer_decoding import (
  UnitransformerDecoding,
)

tf1 = tf.compat.v1

__all__ = ["Unitransformer"]

_GIN_MODULE = "mesh_tensorflow.transformer.transformer"


def _round_up_to_multiple(n: int, divisor) -> int:
  if not divisor or divisor <= 1:
    return n
  return n + -n % divisor


@gin.configurable(module=_GIN_MODULE)
class Unitransformer(UnitransformerDecoding):
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
    >>> inputs = transformer.autoregressive_inputs(targets)  # [[0, 3, 5, 7]]
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
