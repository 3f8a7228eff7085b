"""Mixtures of softmaxes: output layers that break the softmax bottleneck.

Two drop-in replacements for the transformer's VocabEmbedding, registered in
gin as `vocab_embeddings.<Class>` like the others (vocab_embeddings imports
them): MixtureOfSoftmaxes, whose output distribution is a mixture of several
softmaxes, and Mixtape, which mixes several logit vectors with per-token
sigmoid-tree gates, cheaper than a mixture of softmaxes. Variable names are
listed in each class's docstring.
"""

from __future__ import annotations

from typing import Optional

import gin
import tensorflow as tf

import mesh_tensorflow as mtf
from transformer._src.layers.embeddings import ensemble_list
from transformer._src.layers.embeddings import scale_hidden

__all__ = ["Mixtape", "MixtureOfSoftmaxes"]

_GIN_MODULE = "mesh_tensorflow.transformer.vocab_embeddings"

tf1 = tf.compat.v1


@gin.configurable(module=_GIN_MODULE)
class MixtureOfSoftmaxes:
  """Output distribution as a mixture of num_softmaxes softmaxes.

  p(token) = sum_k prior_k * softmax(tanh(h W_k) E)_token, with prior =
  softmax(h M) over the components; hidden_to_logits returns log p (a
  log-probability is a valid logit: its softmax is p itself). Input
  embeddings are a plain lookup in E.

  Variables: `<name>_embedding_weights` E [vocab, d_model],
  `<name>_mixture_weights` M [softmax_components, d_model],
  `<name>_context_weights` W [softmax_components, _<d_model>_copy, d_model].

  Example:
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> vocab_dim = mtf.Dimension("vocab", 16)
    >>> d_model = mtf.Dimension("d_model", 8)
    >>> emb = MixtureOfSoftmaxes(
    ...     converter.mesh, vocab_dim, d_model, mtf.VariableDType(),
    ...     "embedding", None, num_softmaxes=3)
    >>> ids = converter.convert_np_array_to_mtf_tensor(
    ...     [[3, 5, 7, 1]], ["batch", "length"])
    >>> x = emb.ids_to_embedding(ids, None)  # the context is not used
    >>> logits = emb.hidden_to_logits(x, None)
    >>> x.shape, logits.shape
    (Shape[batch=1, length=4, d_model=8], Shape[batch=1, length=4, vocab=16])
    >>> log_p = converter.convert_mtf_tensor_to_np_array(logits)
    >>> np.allclose(np.exp(log_p).sum(axis=-1), 1.0)  # log-probabilities
    True

  Args:
    mesh: the mtf.Mesh the variables live on.
    vocab_dim: the vocabulary Dimension.
    output_dim: the output Dimension (None: the input's model dim).
    variable_dtype: the mtf.VariableDType of the variables.
    name: the name (scope) of the variables, e.g. "embedding" or "softmax".
    ensemble_dim: an ensemble Dimension (one table per member) or None.
    num_softmaxes: the number of softmaxes mixed.

  Raises:
    ValueError: if num_softmaxes is not a positive int.
  """

  def __init__(
    self,
    mesh: mtf.Mesh,
    vocab_dim: mtf.Dimension,
    output_dim: mtf.Dimension,
    variable_dtype,
    name: str,
    ensemble_dim: Optional[mtf.Dimension],
    num_softmaxes: int = gin.REQUIRED,
  ):
    if not isinstance(num_softmaxes, int) or num_softmaxes < 1:
      raise ValueError(
        "MixtureOfSoftmaxes %r: num_softmaxes must be a "
        "positive int, got %r" % (name, num_softmaxes)
      )
    self._vocab_dim = mtf.convert_to_dimension(vocab_dim)
    self._output_dim = mtf.convert_to_dimension(output_dim)
    self._copy_output_dim = mtf.Dimension(
      "_%s_copy" % self._output_dim.name, self._output_dim.size
    )
    self._components_dim = mtf.Dimension("softmax_components", num_softmaxes)
    ensemble = ensemble_list(ensemble_dim)
    self._embedding_weights = mtf.layers.embedding_weights(
      mesh,
      self._vocab_dim,
      self._output_dim,
      variable_dtype,
      name="%s_embedding_weights" % name,
      ensemble_dim=ensemble,
    )
    self._mixture_weights = mtf.layers.embedding_weights(
      mesh,
      self._components_dim,
      self._output_dim,
      variable_dtype,
      name="%s_mixture_weights" % name,
      ensemble_dim=ensemble,
    )
    self._context_weights = mtf.layers.embedding_weights(
      mesh,
      self._copy_output_dim,
      self._output_dim,
      variable_dtype,
      name="%s_context_weights" % name,
      ensemble_dim=ensemble + [self._components_dim],
    )

  def ids_to_embedding(self, ids: mtf.Tensor, context) -> mtf.Tensor:
    """Looks the ids up in the embedding table.

    Args:
      ids: int token ids [batch..., length].
      context: the Context of the call (unused).

    Returns:
      The embeddings [batch..., length, d_model].
    """
    del context
    return mtf.gather(self._embedding_weights, ids, self._vocab_dim)

  def hidden_to_logits(self, hidden: mtf.Tensor, context) -> mtf.Tensor:
    """log of the mixture of softmaxes, [..., vocab].

    Taking the log of a mixture can lose precision in low-precision
    activations; use float32 activations if training is unstable.

    Args:
      hidden: the hidden states [batch..., length, d_model].
      context: the Context of the call (mesh, dims, mode, states...).

    Returns:
      The logits [batch..., length, vocab].
    """
    del context
    hidden = scale_hidden(hidden, self._output_dim)
    prior_logits = mtf.einsum(
      [hidden, self._mixture_weights], reduced_dims=[self._output_dim]
    )
    contexts = mtf.tanh(
      mtf.einsum(
        [
          mtf.rename_dimension(
            hidden, self._output_dim.name, self._copy_output_dim.name
          ),
          self._context_weights,
        ],
        reduced_dims=[self._copy_output_dim],
      )
    )
    component_logits = mtf.einsum(
      [contexts, self._embedding_weights], reduced_dims=[self._output_dim]
    )
    log_priors = mtf.log_softmax(prior_logits, reduced_dim=self._components_dim)
    log_probs = mtf.log_softmax(component_logits, reduced_dim=self._vocab_dim)
    return mtf.reduce_logsumexp(
      log_priors + log_probs, reduced_dim=self._components_dim
    )


@gin.configurable(module=_GIN_MODULE)
class Mixtape:
  """Mixtape output layer: logits mixed by per-token sigmoid-tree gates.

  Four context vectors c_k = tanh(h W_k + b_k) give four logit vectors
  c_k E; token x's logit is sum_k pi_{k,x} (c_k E)_x. The gate priors pi
  come from three gate logits through a sigmoid tree
  (pi = [g1 g2, g1 (1-g2), (1-g1) g3, (1-g1)(1-g3)], g = sigmoid(logits)).
  Frequent tokens (the first frequent_token_fraction of the vocabulary) have
  their own gate logits u_x . tanh(h P_j + p_j) + h . q_j + r_{x,j}; the
  other tokens share h . q_j. With extra_ids > 0 the first extra_ids logits
  are then moved to the end of the vocab dim (the original's arrangement for
  sentinels: logit j belongs to row (j + extra_ids) mod vocab of E). With
  dropout_rate, dropout (shared over the length dim) is applied to the
  component logits c_k E and to tanh(h P_j + p_j) in training; with
  noise_std_dev, Gaussian noise is added to the gate logits in training.

  Variables: `<name>_embedding_weights` E [vocab, d_model],
  `<name>_context_weights` W [gates=4, _<d_model>_copy, d_model],
  `<name>_context_weights_bias` b [gates=4, d_model],
  `<name>_prior_weights` P [gates=3, gate_embedding, d_model],
  `<name>_prior_weights_bias` p [gates=3, gate_embedding],
  `<name>_prior_vocab_vector` u [vocab=frequent, gate_embedding],
  `<name>_prior_gates_vector` q [gates=3, d_model],
  `<name>_prior_bias` r [vocab=frequent, gates=3].
  The frequent and rare parts of the vocabulary keep vocab_dim's name; the
  logits are assembled with split/concat, so vocab must not be split over
  the mesh.

  Example (the shared embedding and softmax of a tiny model, set by gin):
    >>> from transformer import transformer
    >>> gin.bind_parameter("get_vocab_embedding_cls.cls", Mixtape)
    >>> gin.bind_parameter("Mixtape.gate_embedding_size", 2)
    >>> gin.bind_parameter("Mixtape.frequent_token_fraction", 0.25)
    >>> lm = transformer.Unitransformer(
    ...     transformer.LayerStack([]), d_model=8, input_vocab_size=16,
    ...     output_vocab_size=16, autoregressive=True, max_length=4,
    ...     vocab_divisor=1, shared_embedding_and_softmax_weights=True)
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> ids = converter.convert_np_array_to_mtf_tensor(
    ...     [[3, 5, 7, 1]], ["batch", "length"])
    >>> logits, _ = lm.call_simple(ids, ids, compute_loss=False)
    >>> gin.clear_config()
    >>> converter.convert_mtf_tensor_to_np_array(logits).shape
    (1, 4, 16)
    >>> for v in converter.graph.all_variables:
    ...   if "embedding_" in v.name:
    ...     print(v.name[len("transformer/"):], v.shape)
    embedding_embedding_weights Shape[vocab=16, d_model=8]
    embedding_context_weights Shape[gates=4, _d_model_copy=8, d_model=8]
    embedding_context_weights_bias Shape[gates=4, d_model=8]
    embedding_prior_weights Shape[gates=3, gate_embedding=2, d_model=8]
    embedding_prior_weights_bias Shape[gates=3, gate_embedding=2]
    embedding_prior_vocab_vector Shape[vocab=4, gate_embedding=2]
    embedding_prior_gates_vector Shape[gates=3, d_model=8]
    embedding_prior_bias Shape[vocab=4, gates=3]

  Args:
    mesh: the mtf.Mesh the variables live on.
    vocab_dim: the vocabulary Dimension.
    output_dim: the output Dimension (None: the input's model dim).
    variable_dtype: the mtf.VariableDType of the variables.
    name: the name (scope) of the variables, e.g. "embedding" or "softmax".
    ensemble_dim: an ensemble Dimension (one table per member) or None.
    extra_ids: the number of ids at the end of the vocabulary (e.g.
      sentinels) treated as frequent tokens (moved to the front).
    dropout_rate: the dropout rate of the context vectors c (training only).
    gate_embedding_size: the size of the gate embeddings of the frequent tokens.
    frequent_token_fraction: the fraction of the vocabulary (the lowest ids)
      with their own gates; the rest share one.
    noise_std_dev: the stddev of the noise added to the gate logits in training.

  Raises:
    ValueError: if frequent_token_fraction leaves no frequent or no rare token,
      extra_ids is not in [0, vocab size), gate_embedding_size is not a positive
      int, or dropout_rate is not in [0, 1).
  """

  def __init__(
    self,
    mesh: mtf.Mesh,
    vocab_dim: mtf.Dimension,
    output_dim: mtf.Dimension,
    variable_dtype,
    name: str,
    ensemble_dim: Optional[mtf.Dimension],
    extra_ids: int = 0,
    dropout_rate: float = 0.0,
    gate_embedding_size: int = gin.REQUIRED,
    frequent_token_fraction: float = 0.1,
    noise_std_dev: float = 0.0,
  ):
    owner = "Mixtape %r" % name
    self._vocab_dim = mtf.convert_to_dimension(vocab_dim)
    self._output_dim = mtf.convert_to_dimension(output_dim)
    vocab_size = self._vocab_dim.size
    num_frequent = int(frequent_token_fraction * vocab_size)
    if not 0 < num_frequent < vocab_size:
      raise ValueError(
        "%s: frequent_token_fraction=%r of vocab dimension %r (size %d) "
        "gives %d frequent tokens; need at least one frequent and one rare "
        "token"
        % (
          owner,
          frequent_token_fraction,
          self._vocab_dim.name,
          vocab_size,
          num_frequent,
        )
      )
    if not isinstance(extra_ids, int) or not 0 <= extra_ids < vocab_size:
      raise ValueError(
        "%s: extra_ids must be an int in [0, %d), got %r"
        % (owner, vocab_size, extra_ids)
      )
    if not isinstance(gate_embedding_size, int) or gate_embedding_size < 1:
      raise ValueError(
        "%s: gate_embedding_size must be a positive int, got "
        "%r" % (owner, gate_embedding_size)
      )
    if not 0.0 <= dropout_rate < 1.0:
      raise ValueError(
        "%s: dropout_rate must be in [0, 1), got %r" % (owner, dropout_rate)
      )
    self._mesh = mesh
    self._extra_ids = extra_ids
    self._dropout_rate = dropout_rate
    self._noise_std_dev = noise_std_dev
    self._frequent_vocab_dim = mtf.Dimension(self._vocab_dim.name, num_frequent)
    self._rare_vocab_dim = mtf.Dimension(
      self._vocab_dim.name, vocab_size - num_frequent
    )
    self._copy_output_dim = mtf.Dimension(
      "_%s_copy" % self._output_dim.name, self._output_dim.size
    )
    self._pre_gates_dim = mtf.Dimension("gates", 3)
    self._gates_dim = mtf.Dimension("gates", 4)
    self._gate_embedding_dim = mtf.Dimension(
      "gate_embedding", gate_embedding_size
    )
    ensemble = ensemble_list(ensemble_dim)

    def variable(suffix, dims, initializer):
      return mtf.get_variable(
        mesh,
        "%s_%s" % (name, suffix),
        mtf.Shape(ensemble + dims),
        dtype=variable_dtype,
        initializer=initializer,
      )

    self._embedding_weights = mtf.layers.embedding_weights(
      mesh,
      self._vocab_dim,
      self._output_dim,
      variable_dtype,
      name="%s_embedding_weights" % name,
      ensemble_dim=ensemble,
    )
    self._context_weights = mtf.layers.embedding_weights(
      mesh,
      self._copy_output_dim,
      self._output_dim,
      variable_dtype,
      name="%s_context_weights" % name,
      ensemble_dim=ensemble + [self._gates_dim],
    )
    self._context_weights_bias = variable(
      "context_weights_bias",
      [self._gates_dim, self._output_dim],
      tf1.zeros_initializer(),
    )
    self._prior_weights = mtf.layers.embedding_weights(
      mesh,
      self._gate_embedding_dim,
      self._output_dim,
      variable_dtype,
      name="%s_prior_weights" % name,
      ensemble_dim=ensemble + [self._pre_gates_dim],
    )
    self._prior_weights_bias = variable(
      "prior_weights_bias",
      [self._pre_gates_dim, self._gate_embedding_dim],
      tf1.zeros_initializer(),
    )
    self._prior_vocab_vector = variable(
      "prior_vocab_vector",
      [self._frequent_vocab_dim, self._gate_embedding_dim],
      tf1.random_normal_initializer(),
    )
    self._prior_gates_vector = variable(
      "prior_gates_vector",
      [self._pre_gates_dim, self._output_dim],
      tf1.random_normal_initializer(),
    )
    self._prior_bias = variable(
      "prior_bias",
      [self._frequent_vocab_dim, self._pre_gates_dim],
      tf1.random_normal_initializer(),
    )

  def ids_to_embedding(self, ids: mtf.Tensor, context) -> mtf.Tensor:
    """Looks the ids up in the embedding table.

    Args:
      ids: int token ids [batch..., length].
      context: the Context of the call (unused).

    Returns:
      The embeddings [batch..., length, d_model].
    """
    del context
    return mtf.gather(self._embedding_weights, ids, self._vocab_dim)

  def _sigmoid_tree(self, gate_logits: mtf.Tensor) -> mtf.Tensor:
    """3 gate logits -> 4 gate probabilities along "gates" (a binary tree)."""
    g1, g2, g3 = mtf.split(mtf.sigmoid(gate_logits), self._pre_gates_dim, 3)
    return mtf.concat(
      [g1 * g2, g1 * (1.0 - g2), (1.0 - g1) * g3, (1.0 - g1) * (1.0 - g3)],
      self._gates_dim.name,
    )

  def _dropout(self, x: mtf.Tensor, context) -> mtf.Tensor:
    if not context.train or self._dropout_rate == 0.0:
      return x
    noise_shape = x.shape
    if context.length_dim in noise_shape.dims:
      noise_shape = noise_shape - context.length_dim
    return mtf.dropout(
      x, True, rate=self._dropout_rate, noise_shape=noise_shape
    )

  def _add_noise(self, gate_logits: mtf.Tensor, context) -> mtf.Tensor:
    if not context.train or self._noise_std_dev == 0.0:
      return gate_logits
    return gate_logits + mtf.random_normal(
      self._mesh,
      gate_logits.shape,
      stddev=self._noise_std_dev,
      dtype=gate_logits.dtype,
    )

  def _move_first_ids_last(self, logits: mtf.Tensor) -> mtf.Tensor:
    """Moves the first extra_ids entries along vocab to the end."""
    if not self._extra_ids:
      return logits
    first, rest = mtf.split(
      logits,
      self._vocab_dim,
      [self._extra_ids, self._vocab_dim.size - self._extra_ids],
    )
    return mtf.concat([rest, first], self._vocab_dim.name)

  def hidden_to_logits(self, hidden: mtf.Tensor, context) -> mtf.Tensor:
    """hidden [..., d_model] -> gated mixture of logits [..., vocab].

    Args:
      hidden: the hidden states [batch..., length, d_model].
      context: the Context of the call (mesh, dims, mode, states...).

    Returns:
      The logits [batch..., length, vocab].
    """
    hidden = scale_hidden(hidden, self._output_dim)
    contexts = mtf.einsum(
      [
        mtf.rename_dimension(
          hidden, self._output_dim.name, self._copy_output_dim.name
        ),
        self._context_weights,
      ],
      reduced_dims=[self._copy_output_dim],
    )
    contexts = mtf.tanh(contexts + self._context_weights_bias)
    component_logits = self._dropout(
      mtf.einsum(
        [contexts, self._embedding_weights], reduced_dims=[self._output_dim]
      ),
      context,
    )

    gate_contexts = self._dropout(
      mtf.tanh(
        mtf.einsum(
          [hidden, self._prior_weights], reduced_dims=[self._output_dim]
        )
        + self._prior_weights_bias
      ),
      context,
    )
    shared_gate_logits = mtf.einsum(
      [hidden, self._prior_gates_vector], reduced_dims=[self._output_dim]
    )
    frequent_gate_logits = (
      mtf.einsum(
        [gate_contexts, self._prior_vocab_vector],
        reduced_dims=[self._gate_embedding_dim],
      )
      + shared_gate_logits
      + self._prior_bias
    )
    rare_gate_logits = shared_gate_logits * mtf.ones(
      self._mesh,
      mtf.Shape([self._rare_vocab_dim]),
      dtype=shared_gate_logits.dtype,
    )
    gate_logits = self._add_noise(
      mtf.concat(
        [frequent_gate_logits, rare_gate_logits], self._vocab_dim.name
      ),
      context,
    )
    logits = mtf.einsum(
      [component_logits, self._sigmoid_tree(gate_logits)],
      reduced_dims=[self._gates_dim],
    )
    return self._move_first_ids_last(logits)
