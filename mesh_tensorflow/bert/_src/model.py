"""The BERT encoder on a mesh: its configuration, layers and output heads.

`BertModel` builds the encoder of "BERT: Pre-training of Deep Bidirectional
Transformers" from mtf ops: word, token-type and position embeddings, a stack
of blocks whose layers are self-attention, feed-forward or mixture-of-experts
layers, a pooler over the first token, and the pretraining heads (masked
language model and next-sentence prediction). Its variables carry the
original mesh_tensorflow.bert names (`bert/embeddings/word_embeddings`,
`bert/encoder/block_0/attention/query/kernel`, `cls/predictions/...`), so
checkpoints move between the two.
"""

from __future__ import annotations

import copy
import math
from typing import Any, Callable, Optional, Tuple, Union

import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.bert._src.config import BertConfig
from transformer import moe

__all__ = [
  "BertModel",
  "get_activation",
  "layer_norm",
  "relative_position_bucket",
]

_LAYER_TYPES = ("attention", "feedforward", "moe")


class BertModel:
  """The BERT encoder built on input_ids' mesh.

  Building it creates the variables (under `scope`, default "bert") and the
  outputs read by the getters; the heads (get_masked_lm_output,
  get_next_sentence_output) add their own variables when called.

  Args:
    config: a BertConfig (copied; dropout is turned off unless training).
    is_training: whether to apply dropout.
    input_ids: int mtf.Tensor [batch, seq] of word-piece ids.
    input_mask: optional int mtf.Tensor [batch, seq], 1 for real tokens and 0
      for padding (padding is not attended to).
    token_type_ids: optional int mtf.Tensor [batch, seq] of segment ids
      (default all 0).
    scope: the variable scope (default "bert").
    mesh_shape: the mtf.Shape of the mesh (for mixture-of-experts layers).
    layout: the mtf.LayoutRules (for mixture-of-experts layers).

  Raises:
    ValueError: if input_ids is not 2-dimensional or a block layer type is
      unknown.
  """

  def __init__(
    self,
    config: BertConfig,
    is_training: bool,
    input_ids: mtf.Tensor,
    input_mask: Optional[mtf.Tensor] = None,
    token_type_ids: Optional[mtf.Tensor] = None,
    scope: Optional[str] = None,
    mesh_shape="",
    layout="",
  ):
    self.config = copy.deepcopy(config)
    if not is_training:
      self.config.layer_output_dropout_prob = 0.0
      self.config.attention_probs_dropout_prob = 0.0
      self.config.feedforward_intermediate_dropout_prob = 0.0
    if input_ids.shape.ndims != 2:
      raise ValueError(
        "BertModel: input_ids must be [batch, seq], got %s" % input_ids.shape
      )
    self._seq_dim = input_ids.shape.dims[1]
    self._memory_seq_dim = mtf.Dimension("memory_seq", self._seq_dim.size)
    self._extra_losses = []
    mesh = input_ids.mesh
    if token_type_ids is None:
      token_type_ids = mtf.zeros(mesh, input_ids.shape, dtype=tf.int32)
    keep_prob = 1.0 - self.config.layer_output_dropout_prob

    with tf.compat.v1.variable_scope(
      scope or _unique_scope_name(mesh.graph, "bert")
    ):
      with tf.compat.v1.variable_scope("embeddings"):
        self._embed(mesh, input_ids, token_type_ids)
        self.embedding_output = mtf.dropout(
          self.normalize(self.embedding_output),
          is_training,
          keep_prob=keep_prob,
        )
      with tf.compat.v1.variable_scope("encoder"):
        attention_bias = self._attention_bias(mesh, input_mask)
        x = self.embedding_output
        self.all_encoder_layers = []
        for block_num in range(self.config.num_blocks):
          with tf.compat.v1.variable_scope("block_%d" % block_num):
            for layer_num, layer_type in enumerate(self.config.block_layers):
              x = self._residual_layer(
                x,
                _layer_scope_name(self.config.block_layers, layer_num),
                layer_type,
                attention_bias,
                input_mask,
                is_training,
                keep_prob,
                mesh_shape,
                layout,
              )
          self.all_encoder_layers.append(x)
      if self.config.residual_structure == "direct":
        x = self.normalize(x)
      self.sequence_output = x
      with tf.compat.v1.variable_scope("pooler"):
        # The hidden state of the first token stands for the whole sequence
        # (segment-level classification).
        first_token = mtf.gather(self.sequence_output, 0, self.seq_dim)
        self.pooled_output = mtf.layers.dense(
          first_token,
          reduced_dims=[self.model_dim],
          new_dims=[self.model_dim],
          activation=mtf.tanh,
          kernel_initializer=self.dense_initializer,
          use_bias=self.config.use_bias,
        )

  def _embed(self, mesh, input_ids, token_type_ids):
    """Sets embedding_table, word_embedding_output and embedding_output."""
    self.embedding_table = mtf.get_variable(
      mesh,
      "word_embeddings",
      mtf.Shape([self.vocab_dim, self.model_dim]),
      initializer=self.embedding_initializer,
    )
    self.word_embedding_output = mtf.gather(
      self.embedding_table, input_ids, self.vocab_dim
    )
    token_type_table = mtf.get_variable(
      mesh,
      "token_type_embeddings",
      mtf.Shape([self.token_type_vocab_dim, self.model_dim]),
      initializer=self.embedding_initializer,
    )
    output = self.word_embedding_output + mtf.gather(
      token_type_table, token_type_ids, self.token_type_vocab_dim
    )
    if self.config.position_signal == "embedding":
      position_table = mtf.get_variable(
        mesh,
        "position_embeddings",
        mtf.Shape([self.max_position_embeddings_dim, self.model_dim]),
        initializer=self.embedding_initializer,
      )
      positions_name = self.max_position_embeddings_dim.name
      output += mtf.rename_dimension(
        mtf.slice(position_table, 0, self.seq_dim.size, positions_name),
        positions_name,
        self.seq_dim.name,
      )
    self.embedding_output = output

  def _attention_bias(self, mesh, input_mask):
    """The additive attention bias: -10000 on padding, relative positions."""
    biases = []
    if input_mask is not None:
      memory_mask = mtf.replace_dimensions(
        input_mask, self.seq_dim, self.memory_seq_dim
      )
      biases.append((1.0 - mtf.to_float(memory_mask)) * -10000.0)
    if self.config.position_signal == "relative_attention_bias":
      buckets_dim = mtf.Dimension("buckets", 32)
      relative_position = mtf.range(
        mesh, self.memory_seq_dim, tf.int32
      ) - mtf.range(mesh, self.seq_dim, tf.int32)
      bucket = relative_position_bucket(
        relative_position, num_buckets=buckets_dim.size
      )
      bias_table = mtf.get_variable(
        mesh,
        "relative_attention_bias",
        [self.num_heads_dim, buckets_dim],
        initializer=tf.compat.v1.zeros_initializer(),
      )
      biases.append(mtf.gather(bias_table, bucket, buckets_dim))
    return mtf.add_n(biases) if biases else None

  def _residual_layer(
    self,
    x,
    name,
    layer_type,
    attention_bias,
    input_mask,
    is_training,
    keep_prob,
    mesh_shape,
    layout,
  ):
    """One layer of a block with its dropout, residual and normalization."""
    if layer_type not in _LAYER_TYPES:
      raise ValueError(
        "unknown layer type %r in block_layers %s (known: %s)"
        % (layer_type, self.config.block_layers, ", ".join(_LAYER_TYPES))
      )
    with tf.compat.v1.variable_scope(name):
      y = x
      if self.config.residual_structure == "direct":
        y = self.normalize(y)
      if layer_type == "attention":
        y = self.self_attention(y, attention_bias)
      elif layer_type == "feedforward":
        y = self.feedforward(y)
      else:
        y = self.moe(y, layout, mesh_shape, input_mask, is_training)
      output = x + mtf.dropout(y, is_training, keep_prob=keep_prob)
      if self.config.residual_structure == "original":
        output = self.normalize(output)
      return output

  def self_attention(
    self, x: mtf.Tensor, attention_bias: Optional[mtf.Tensor]
  ) -> mtf.Tensor:
    """Multi-head self-attention over seq with its output projection.

    Args:
      x: the layer input [batch, seq, hidden].
      attention_bias: None, or a float mtf.Tensor broadcastable to [batch,
        num_heads, seq, memory_seq] added to the attention logits (e.g.
        -10000 on padding).

    Returns:
      An mtf.Tensor of x's shape.
    """

    def project(inputs, name):
      return mtf.layers.dense(
        inputs,
        reduced_dims=[self.model_dim],
        new_dims=[self.num_heads_dim, self.size_per_head_dim],
        kernel_initializer=self.dense_initializer,
        name=name,
        use_bias=self.config.use_bias,
      )

    memory = mtf.replace_dimensions(x, self.seq_dim, self.memory_seq_dim)
    queries = project(x, "query")
    keys = project(memory, "key")
    values = project(memory, "value")
    logits = mtf.einsum([queries, keys], reduced_dims=[self.size_per_head_dim])
    logits *= self.size_per_head_dim.size**-0.5
    if attention_bias is not None:
      logits += attention_bias
    weights = mtf.softmax(logits, self.memory_seq_dim)
    # No dropout of the attention weights: the original's dropout call here
    # was inert (is_training was true only at a zero rate), and checkpoints
    # trained with it match this computation.
    output = mtf.einsum([weights, values], reduced_dims=[self.memory_seq_dim])
    output = mtf.layers.dense(
      output,
      reduced_dims=[self.num_heads_dim, self.size_per_head_dim],
      new_dims=[self.model_dim],
      kernel_initializer=self.dense_initializer,
      name="output",
      use_bias=self.config.use_bias,
    )
    return mtf.transpose(output, x.shape)

  def feedforward(self, x: mtf.Tensor) -> mtf.Tensor:
    """Two dense layers, hidden -> intermediate (activated) -> hidden.

    Args:
      x: the layer input [..., hidden].

    Returns:
      An mtf.Tensor of x's shape.
    """
    hidden = mtf.layers.dense(
      x,
      reduced_dims=[self.model_dim],
      new_dims=[self.feedforward_intermediate_dim],
      activation=get_activation(self.config.feedforward_intermediate_act),
      kernel_initializer=self.dense_initializer,
      name="dense_1",
      use_bias=self.config.use_bias,
    )
    return mtf.layers.dense(
      hidden,
      reduced_dims=[self.feedforward_intermediate_dim],
      new_dims=[self.model_dim],
      kernel_initializer=self.dense_initializer,
      name="dense_2",
      use_bias=self.config.use_bias,
    )

  def moe(
    self,
    x: mtf.Tensor,
    layout,
    mesh_shape,
    input_mask: Optional[mtf.Tensor],
    is_training: bool,
  ) -> mtf.Tensor:
    """A top-2 gated mixture-of-experts layer (transformer_moe_layer_v1).

    Its load-balancing loss is added to get_extra_loss().

    Args:
      x: the layer input [batch, seq, hidden].
      layout: the mtf.LayoutRules (or its string).
      mesh_shape: the mtf.Shape of the mesh (or its string).
      input_mask: None or the int [batch, seq] mask of real tokens.
      is_training: whether training (capacity and second-expert policy).

    Returns:
      An mtf.Tensor of x's shape.
    """
    hparams = moe.HParams(
      moe_gating="top_2",
      moe_num_experts=self.config.moe_num_experts,
      moe_loss_coef=1e-3,
      moe_hidden_size=self.config.moe_intermediate_size,
      moe_group_size=2048,
      moe_capacity_factor_train=1.25,
      moe_capacity_factor_eval=8.0,
      moe_use_second_place_loss=False,
      moe_second_policy_train="random",
      moe_second_policy_eval="random",
      moe_second_threshold_train=0.2,
      moe_second_threshold_eval=0.2,
    )
    nonpadding = None
    if input_mask is not None:
      nonpadding = mtf.cast(input_mask, tf.float32)
    output, loss = moe.transformer_moe_layer_v1(
      inputs=x,
      output_dim=self.model_dim,
      hparams=hparams,
      train=is_training,
      variable_dtype=mtf.VariableDType(tf.float32),
      layout=layout,
      mesh_shape=mesh_shape,
      nonpadding=nonpadding,
      activation=get_activation(self.config.feedforward_intermediate_act),
    )
    self._extra_losses.append(loss)
    return output

  def get_masked_lm_output(
    self,
    positions: mtf.Tensor,
    label_ids: mtf.Tensor,
    label_weights: mtf.Tensor,
  ) -> Tuple[mtf.Tensor, mtf.Tensor, mtf.Tensor]:
    """The masked-LM head: loss, per-prediction loss and logits.

    The hidden states at `positions` go through a dense + layer-norm
    transform and are scored against the word embeddings (tied weights) plus
    a per-word bias; the loss is the label_weights-weighted mean of the
    cross-entropies (z-loss 1e-4).

    Args:
      positions: int mtf.Tensor [batch, max_pred] of masked positions in seq.
      label_ids: int mtf.Tensor [batch, max_pred] of the original word ids.
      label_weights: float mtf.Tensor [batch, max_pred], 1 for real predictions
        and 0 for padding.

    Returns:
      (loss, per_example_loss [batch, max_pred], logits [batch, max_pred,
      vocab]).
    """
    hidden = mtf.gather(self.get_sequence_output(), positions, self.seq_dim)
    with tf.compat.v1.variable_scope("cls/predictions"):
      with tf.compat.v1.variable_scope("transform"):
        hidden = mtf.layers.dense(
          hidden,
          reduced_dims=[self.model_dim],
          new_dims=[self.model_dim],
          activation=get_activation(self.config.feedforward_intermediate_act),
          kernel_initializer=self.dense_initializer,
          use_bias=self.config.use_bias,
        )
        hidden = self.normalize(hidden)
      output_bias = mtf.get_variable(
        hidden.mesh,
        name="output_bias",
        shape=[self.vocab_dim],
        initializer=tf.compat.v1.zeros_initializer(),
      )
      logits = (
        mtf.einsum(
          [hidden, self.get_embedding_table()], reduced_dims=[self.model_dim]
        )
        + output_bias
      )
      per_example_loss = mtf.layers.softmax_cross_entropy_with_logits(
        logits, label_ids, self.vocab_dim, z_loss=1e-4
      )
      total = mtf.reduce_sum(label_weights * per_example_loss)
      count = mtf.reduce_sum(label_weights) + mtf.constant(
        hidden.mesh, 1e-5, dtype=tf.float32
      )
      loss = total / count
    return loss, per_example_loss, logits

  def get_next_sentence_output(
    self, labels: mtf.Tensor
  ) -> Tuple[mtf.Tensor, mtf.Tensor, mtf.Tensor]:
    """The next-sentence head: loss, per-example loss and logits.

    Label 0 means "sentence B follows sentence A", 1 "B is random".

    Args:
      labels: int mtf.Tensor [batch] of 0/1 labels.

    Returns:
      (mean loss, per_example_loss [batch], logits [batch, class]).
    """
    class_dim = mtf.Dimension("class", 2)
    logits = mtf.layers.dense(
      self.get_pooled_output(),
      reduced_dims=[self.model_dim],
      new_dims=[class_dim],
      kernel_initializer=self.dense_initializer,
      name="cls/seq_relationship",
      use_bias=self.config.use_bias,
    )
    per_example_loss = mtf.layers.softmax_cross_entropy_with_logits(
      logits, labels, class_dim, z_loss=1e-4
    )
    return mtf.reduce_mean(per_example_loss), per_example_loss, logits

  def get_pooled_output(self) -> mtf.Tensor:
    """The pooler's output [batch, hidden] (tanh-dense of the first token).

    Returns:
      The pooled output.
    """
    return self.pooled_output

  def get_sequence_output(self) -> mtf.Tensor:
    """The encoder's final hidden states [batch, seq, hidden].

    Returns:
      The sequence output.
    """
    return self.sequence_output

  def get_all_encoder_layers(self) -> list:
    """The output of each block, [batch, seq, hidden] each.

    Returns:
      A list of num_blocks mtf.Tensors.
    """
    return self.all_encoder_layers

  def get_word_embedding_output(self) -> mtf.Tensor:
    """The word-piece embeddings [batch, seq, hidden], before the others.

    Returns:
      The word embedding lookup, without position and token-type embeddings.
    """
    return self.word_embedding_output

  def get_embedding_output(self) -> mtf.Tensor:
    """The encoder's input [batch, seq, hidden].

    Returns:
      Word + token-type (+ position) embeddings, normalized and dropped out.
    """
    return self.embedding_output

  def normalize(self, x: mtf.Tensor) -> mtf.Tensor:
    """Layer normalization over hidden (centred and biased if use_bias).

    Args:
      x: an mtf.Tensor with the hidden dim.

    Returns:
      The normalized mtf.Tensor of x's shape.
    """
    return layer_norm(
      x,
      self.model_dim,
      subtract_mean=self.config.use_bias,
      use_bias=self.config.use_bias,
    )

  def get_embedding_table(self) -> mtf.Tensor:
    """The word embedding variable [vocab, hidden].

    Returns:
      The embedding table.
    """
    return self.embedding_table

  def get_extra_loss(self) -> mtf.Tensor:
    """The sum of the mixture-of-experts losses (0 without moe layers).

    Returns:
      A scalar mtf.Tensor, or 0.
    """
    return mtf.add_n(self._extra_losses)

  @property
  def vocab_dim(self) -> mtf.Dimension:
    """The "vocab", padded to a multiple of 128 so that it splits evenly."""
    n = self.config.vocab_size
    return mtf.Dimension("vocab", n + (-n % 128))

  @property
  def model_dim(self) -> mtf.Dimension:
    """The "hidden" of size d_model."""
    return mtf.Dimension("hidden", self.config.d_model)

  @property
  def token_type_vocab_dim(self) -> mtf.Dimension:
    """The "token_type_vocab" of size type_vocab_size."""
    return mtf.Dimension("token_type_vocab", self.config.type_vocab_size)

  @property
  def feedforward_intermediate_dim(self) -> mtf.Dimension:
    """The "intermediate" of size feedforward_intermediate_size."""
    return mtf.Dimension(
      "intermediate", self.config.feedforward_intermediate_size
    )

  @property
  def num_heads_dim(self) -> mtf.Dimension:
    """The "num_heads" of size attention_num_heads."""
    return mtf.Dimension("num_heads", self.config.attention_num_heads)

  @property
  def softmax_heads_dims(self) -> mtf.Dimension:
    """The heads dim of the attention softmax (num_heads_dim)."""
    return self.num_heads_dim

  @property
  def max_position_embeddings_dim(self) -> mtf.Dimension:
    """The "max_position_embeddings" of size max_position_embeddings."""
    return mtf.Dimension(
      "max_position_embeddings", self.config.max_position_embeddings
    )

  @property
  def seq_dim(self) -> mtf.Dimension:
    """The sequence dim of input_ids."""
    return self._seq_dim

  @property
  def memory_seq_dim(self) -> mtf.Dimension:
    """The "memory_seq": the attended-to positions, of seq_dim's size."""
    return self._memory_seq_dim

  @property
  def dense_initializer(self) -> Any:
    """Truncated normal(initializer_range), or variance scaling if unset."""
    if self.config.initializer_range:
      return tf.compat.v1.truncated_normal_initializer(
        stddev=self.config.initializer_range
      )
    return mtf.layers.VarianceScalingInitializer(scale=0.4)

  @property
  def embedding_initializer(self) -> Any:
    """dense_initializer, scaled for the [vocab, hidden] table if needed."""
    initializer = self.dense_initializer
    if isinstance(initializer, mtf.layers.DenseInitializer):
      # The table is also the masked-LM output matrix.
      return initializer(
        reduced_dims=[self.model_dim], new_dims=[self.vocab_dim]
      )
    return initializer

  @property
  def size_per_head_dim(self) -> mtf.Dimension:
    """The "attention_head": channels per head.

    Raises:
      ValueError: if attention_head_size is unset and attention_num_heads
        does not divide d_model.
    """
    size = self.config.attention_head_size
    if not size:
      if self.model_dim.size % self.num_heads_dim.size:
        raise ValueError(
          "The hidden size (%d) is not a multiple of the number of attention "
          "heads (%d)" % (self.model_dim.size, self.num_heads_dim.size)
        )
      size = self.model_dim.size // self.num_heads_dim.size
    return mtf.Dimension("attention_head", size)

  @property
  def key_dim(self) -> mtf.Dimension:
    """The "d_k" of size attention_key_head_size (ValueError if unset)."""
    return _required_dim(
      "d_k", self.config.attention_key_head_size, "key head size"
    )

  @property
  def key_heads_dims(self) -> mtf.Dimension:
    """The "key_heads" of size attention_num_key_heads (ValueError if unset)."""
    return _required_dim(
      "key_heads", self.config.attention_num_key_heads, "number of key heads"
    )

  @property
  def value_dim(self) -> mtf.Dimension:
    """The "d_v" of size attention_value_head_size (ValueError if unset)."""
    return _required_dim(
      "d_v", self.config.attention_value_head_size, "value head size"
    )

  @property
  def value_heads_dims(self) -> mtf.Dimension:
    """The "value_heads" of size attention_num_value_heads (ValueError if unset)."""
    return _required_dim(
      "value_heads",
      self.config.attention_num_value_heads,
      "number of value heads",
    )


def _unique_scope_name(graph: mtf.Graph, default_name: str) -> str:
  """default_name, or default_name_<k> if its scope has variables in graph.

  tf.compat.v1.variable_scope's own default names are counted per process
  in eager mode and per tf.function trace, so a retraced model would get new
  variable names; counting the mtf graph's variables keeps them stable.
  """
  outer = tf.compat.v1.get_variable_scope().name
  names = [v.name for v in graph.all_variables]
  k = 0
  while True:
    candidate = default_name if k == 0 else "%s_%d" % (default_name, k)
    prefix = "%s/%s/" % (outer, candidate) if outer else candidate + "/"
    if not any(name.startswith(prefix) for name in names):
      return candidate
    k += 1


def _required_dim(name: str, size: Optional[int], what: str) -> mtf.Dimension:
  if size is None:
    raise ValueError("The %s is not defined." % what)
  return mtf.Dimension(name, size)


def _layer_scope_name(block_layers, layer_num: int) -> str:
  """The "attention", "feedforward", then "attention_1", ... for repeats."""
  layer_type = block_layers[layer_num]
  count = block_layers[:layer_num].count(layer_type)
  return "%s_%d" % (layer_type, count) if count else layer_type


_ACTIVATIONS = {"gelu": mtf.gelu, "relu": mtf.relu, "tanh": mtf.tanh}


def get_activation(
  activation_string: Union[None, str, Callable[[mtf.Tensor], mtf.Tensor]],
) -> Optional[Callable[[mtf.Tensor], mtf.Tensor]]:
  """The mtf activation named by a string ("gelu" -> mtf.gelu).

  Args:
    activation_string: "gelu", "relu", "tanh", "linear" (no activation), an
      empty string or None (no activation), or a function (returned as is).

  Returns:
    An mtf activation function, or None for no activation.

  Raises:
    ValueError: for an unknown name.
  """
  if not isinstance(activation_string, str):
    return activation_string
  name = activation_string.lower()
  if not name or name == "linear":
    return None
  if name not in _ACTIVATIONS:
    raise ValueError("Unsupported activation: %s" % name)
  return _ACTIVATIONS[name]


def relative_position_bucket(
  relative_position: mtf.Tensor,
  bidirectional: bool = True,
  num_buckets: int = 32,
  max_distance: int = 128,
) -> mtf.Tensor:
  """Buckets of relative positions (memory - query) for the attention bias.

  Small distances get a bucket each; larger ones share logarithmically wider
  buckets up to max_distance, beyond which all share the last bucket. With
  bidirectional, half of the buckets are for positive distances.

  Args:
    relative_position: an int32 mtf.Tensor.
    bidirectional: whether memory positions after the query count apart.
    num_buckets: the number of buckets.
    max_distance: distances from this on share one bucket.

  Returns:
    An int32 mtf.Tensor of relative_position's shape, in [0, num_buckets).
  """
  bucket = 0
  distance = -relative_position
  if bidirectional:
    num_buckets //= 2
    bucket += mtf.to_int32(mtf.less(distance, 0)) * num_buckets
    distance = mtf.abs(distance)
  else:
    distance = mtf.maximum(distance, 0)
  max_exact = num_buckets // 2
  is_small = mtf.less(distance, max_exact)
  log_bucket = max_exact + mtf.to_int32(
    mtf.log(mtf.to_float(distance) / max_exact)
    / math.log(max_distance / max_exact)
    * (num_buckets - max_exact)
  )
  log_bucket = mtf.minimum(log_bucket, num_buckets - 1)
  return bucket + mtf.where(is_small, distance, log_bucket)


def layer_norm(
  x: mtf.Tensor,
  dim: mtf.Dimension,
  epsilon: float = 1e-6,
  subtract_mean: bool = True,
  use_scale: bool = True,
  use_bias: bool = True,
  name: Optional[str] = None,
) -> mtf.Tensor:
  """Layer normalization of x over dim, with variables "scale" and "bias".

  Args:
    x: an mtf.Tensor with dim.
    dim: the mtf.Dimension to normalize over.
    epsilon: added to the variance.
    subtract_mean: whether to centre x first (else only rescale by the root
      mean square).
    use_scale: whether to multiply by a learned scale (initially 1).
    use_bias: whether to add a learned bias (initially 0).
    name: the variable scope (default "layer_norm").

  Returns:
    An mtf.Tensor of x's shape.
  """
  with tf.compat.v1.variable_scope(
    name or _unique_scope_name(x.mesh.graph, "layer_norm")
  ):
    if subtract_mean:
      x -= mtf.reduce_mean(x, reduced_dim=dim)
    variance = mtf.reduce_mean(mtf.square(x), reduced_dim=dim)
    x *= mtf.rsqrt(variance + epsilon)
    if use_scale:
      x *= mtf.get_variable(
        x.mesh,
        "scale",
        mtf.Shape([dim]),
        initializer=tf.compat.v1.ones_initializer(),
        activation_dtype=x.dtype,
      )
    if use_bias:
      x += mtf.get_variable(
        x.mesh,
        "bias",
        mtf.Shape([dim]),
        initializer=tf.compat.v1.zeros_initializer(),
        activation_dtype=x.dtype,
      )
    return x
