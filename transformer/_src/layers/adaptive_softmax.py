"""Adaptive softmax: a vocabulary embedding whose training loss skips most of
the vocabulary.

The vocabulary is cut into consecutive clusters (frequent ids first). The
softmax factorizes as p(token) = p(cluster) * p(token | cluster): the head
cluster's softmax covers its own tokens plus one entry per tail cluster
(p(cluster)); each tail cluster has its own softmax. During training
`hidden_to_logits` returns the hidden states unchanged and
`adaptive_softmax_loss_fn` (set as the Unitransformer's `loss_fn`) computes
the loss from them, evaluating each tail softmax only at the positions whose
target is in that cluster (at most length_projection_factor * length of
them). In other modes `hidden_to_logits` returns the full log-probabilities.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Optional, Sequence

import gin
import tensorflow as tf

import mesh_tensorflow as mtf
from transformer._src.layers import vocab_embeddings
from transformer._src.layers.context import ModeKeys

__all__ = ["AdaptiveSoftmaxVocabEmbedding", "adaptive_softmax_loss_fn"]

_GIN_MODULE = "mesh_tensorflow.transformer.adaptive_softmax"

# Key of context.cache where the embedding records itself in training, so
# that adaptive_softmax_loss_fn finds it.
_CACHE_KEY = "adaptive_softmax_vocab_embedding"


class _Cluster:
  """One cluster: its embedding and the ids [start_token_id, end_token_id)."""

  def __init__(
    self,
    embedding,
    start_token_id: int,
    end_token_id: int,
    length_projection_factor: float,
    vocab_dim: mtf.Dimension,
  ):
    self.embedding = embedding
    self.start_token_id = start_token_id
    self.end_token_id = end_token_id
    self.length_projection_factor = length_projection_factor
    # The cluster's own vocab dim (the head's includes one entry per tail).
    self.vocab_dim = vocab_dim

  @property
  def token_count(self) -> int:
    return self.end_token_id - self.start_token_id

  def ids_to_embedding(self, ids: mtf.Tensor, context) -> mtf.Tensor:
    return vocab_embeddings.cluster_ids_to_embedding(
      self.embedding, ids, self.start_token_id, self.token_count, context
    )

  def log_softmax(self, hidden: mtf.Tensor, context) -> mtf.Tensor:
    logits = self.embedding.hidden_to_logits(hidden, context)
    return mtf.log_softmax(logits, reduced_dim=self.vocab_dim)

  def mask(self, targets: mtf.Tensor) -> mtf.Tensor:
    """Boolean: targets in this cluster."""
    return mtf.logical_and(
      mtf.greater_equal(targets, self.start_token_id),
      mtf.less(targets, self.end_token_id),
    )

  def summed_loss(
    self,
    decoder,
    hidden: mtf.Tensor,
    targets: mtf.Tensor,
    weights: mtf.Tensor,
    context,
  ) -> mtf.Tensor:
    """Sum over positions of weights * cross-entropy of local targets."""
    logits = self.embedding.hidden_to_logits(hidden, context)
    z_loss = _z_loss(decoder) if context.train else 0.0
    loss = mtf.layers.softmax_cross_entropy_with_logits(
      logits,
      mtf.one_hot(targets, self.vocab_dim, dtype=logits.dtype),
      self.vocab_dim,
      z_loss=z_loss,
    )
    return mtf.reduce_sum(loss * mtf.cast(weights, loss.dtype))


def _z_loss(decoder) -> float:
  z_loss = getattr(decoder, "z_loss", None)
  if z_loss is None:
    z_loss = getattr(decoder, "_z_loss", 0.0)
  return z_loss or 0.0


@gin.configurable(module=_GIN_MODULE)
class AdaptiveSoftmaxVocabEmbedding:
  """Vocabulary embedding with an adaptive softmax (drop-in VocabEmbedding).

  `clusters` is a list of dicts in vocabulary order: "token_count" (the
  counts must sum to the vocabulary size), optionally "embedding_size"
  (default d_model; smaller sizes use a factorized embedding) and
  "length_projection_factor" in (0, 1] (default 1: a tail cluster's loss is
  computed at up to ceil(factor * length) target positions per sequence; the
  targets beyond that are left out of the loss).

  Variables are those of one embedding per cluster, as in
  AdaptiveVocabEmbedding: `<name>_<i>` [vocab_i, d_model] (VocabEmbedding)
  or `<name>_<i>1` [vocab_i, inner_vocab], `<name>_<i>2` [inner_vocab,
  d_model]; the head cluster's vocab_0 has token_count + (number of clusters
  - 1) entries. Embedding and softmax weights must be shared (use it as the
  model's vocab embedding with shared_embedding_and_softmax_weights=True) and
  the vocab dimension must not be split over the mesh.

  Example (gin; ids 12-15 form a tail cluster embedded in 4 dims):
    >>> from transformer import transformer
    >>> _ = gin.parse_config('''
    ... get_vocab_embedding_cls.cls = @AdaptiveSoftmaxVocabEmbedding
    ... AdaptiveSoftmaxVocabEmbedding.clusters = [
    ...     {"token_count": 12, "embedding_size": 8},
    ...     {"token_count": 4, "embedding_size": 4,
    ...      "length_projection_factor": 0.5}]
    ... Unitransformer.loss_fn = @adaptive_softmax_loss_fn
    ... ''')
    >>> lm = transformer.Unitransformer(
    ...     transformer.LayerStack([]), d_model=8, input_vocab_size=16,
    ...     output_vocab_size=16, autoregressive=True, max_length=4,
    ...     vocab_divisor=1, shared_embedding_and_softmax_weights=True)
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> targets = converter.convert_np_array_to_mtf_tensor(
    ...     [[3, 13, 7, 1]], ["batch", "length"])
    >>> inputs = transformer.autoregressive_inputs(targets)
    >>> hidden, loss = lm.call_simple(inputs, targets, compute_loss=True)
    >>> gin.clear_config()
    >>> hidden.shape, loss.shape  # training: the loss is computed per cluster
    (Shape[batch=1, length=4, d_model=8], Shape[])
    >>> for v in converter.graph.all_variables:
    ...   if "embedding_" in v.name:
    ...     print(v.name, v.shape)
    transformer/embedding_0 Shape[vocab=13, d_model=8]
    transformer/embedding_11 Shape[vocab=4, inner_vocab=4]
    transformer/embedding_12 Shape[inner_vocab=4, d_model=8]

  Args:
    mesh: the mtf.Mesh the variables live on.
    vocab_dim: the vocabulary Dimension.
    output_dim: the output Dimension (None: the input's model dim).
    variable_dtype: the mtf.VariableDType of the variables.
    name: the name (scope) of the variables, e.g. "embedding" or "softmax".
    ensemble_dim: an ensemble Dimension (one table per member) or None.
    clusters: a list of {"token_count": n, "embedding_size": e} dicts: the
      vocabulary is split in frequency order into clusters of n tokens with
      e-dimensional embeddings (the first cluster is the head, whose softmax
      also scores the other clusters).
  """

  def __init__(
    self,
    mesh: mtf.Mesh,
    vocab_dim: mtf.Dimension,
    output_dim: mtf.Dimension,
    variable_dtype,
    name: str,
    ensemble_dim: Optional[mtf.Dimension],
    clusters: Sequence[Dict[str, Any]] = gin.REQUIRED,
  ):
    self._vocab_dim = mtf.convert_to_dimension(vocab_dim)
    self._output_dim = mtf.convert_to_dimension(output_dim)
    specs = vocab_embeddings.cluster_specs(
      clusters,
      self._vocab_dim,
      self._output_dim,
      "AdaptiveSoftmaxVocabEmbedding %r" % name,
      allow_length_projection=True,
    )
    num_tails = len(specs) - 1
    self._clusters = []
    start = 0
    for i, spec in enumerate(specs):
      count = spec["token_count"]
      cluster_vocab_dim = mtf.Dimension(
        self._vocab_dim.name, count + (num_tails if i == 0 else 0)
      )
      embedding = vocab_embeddings.cluster_embedding(
        mesh,
        cluster_vocab_dim,
        self._output_dim,
        variable_dtype,
        "%s_%d" % (name, i),
        ensemble_dim,
        spec["embedding_size"],
      )
      self._clusters.append(
        _Cluster(
          embedding,
          start,
          start + count,
          spec["length_projection_factor"],
          cluster_vocab_dim,
        )
      )
      start += count

  @property
  def vocab_dim(self) -> mtf.Dimension:
    """The vocabulary Dimension."""
    return self._vocab_dim

  def ids_to_embedding(self, ids: mtf.Tensor, context) -> mtf.Tensor:
    """Each id is embedded by its cluster (the others contribute zeros).

    Args:
      ids: int token ids [batch..., length].
      context: the Context of the call (mesh, dims, mode, states...).

    Returns:
      The embeddings [batch..., length, d_model].
    """
    return mtf.add_n([c.ids_to_embedding(ids, context) for c in self._clusters])

  def hidden_to_logits(self, hidden: mtf.Tensor, context) -> mtf.Tensor:
    """Training: hidden itself (for adaptive_softmax_loss_fn); otherwise the
    log-probabilities over the whole vocabulary, [..., vocab].

    Args:
      hidden: the hidden states [batch..., length, d_model].
      context: the Context of the call (mesh, dims, mode, states...).

    Returns:
      In training, `hidden` itself (the loss function computes the clusters'
      softmaxes); otherwise the log-probabilities [batch..., length, vocab].
    """
    if context.mode == ModeKeys.TRAIN:
      if getattr(context, "cache", None) is not None:
        context.cache[_CACHE_KEY] = self
      return hidden
    return self.hidden_to_log_softmax(hidden, context)

  def hidden_to_log_softmax(self, hidden: mtf.Tensor, context) -> mtf.Tensor:
    """log p(token) for every token: log p(cluster) + log p(token|cluster).

    Args:
      hidden: the hidden states [batch..., length, d_model].
      context: the Context of the call (mesh, dims, mode, states...).

    Returns:
      Log-probabilities [batch..., length, vocab].
    """
    head = self._clusters[0]
    head_log_softmax = head.log_softmax(hidden, context)
    if len(self._clusters) == 1:
      return head_log_softmax
    head_tokens, _ = mtf.split(
      head_log_softmax,
      head.vocab_dim,
      [head.token_count, len(self._clusters) - 1],
    )
    parts = [head_tokens]
    for i, cluster in enumerate(self._clusters[1:]):
      log_p_cluster = mtf.gather(
        head_log_softmax, head.token_count + i, head.vocab_dim
      )
      parts.append(cluster.log_softmax(hidden, context) + log_p_cluster)
    return mtf.concat(parts, self._vocab_dim.name)

  def compute_loss(
    self, decoder, hidden: mtf.Tensor, targets: mtf.Tensor, context
  ) -> mtf.Tensor:
    """Mean cross-entropy of targets from the hidden states (scalar).

    Sums -log p(target) over target positions (targets > 0; 0 is padding,
    negative targets are masked) and divides by
    decoder.loss_denominator(targets, context.num_microbatches). With z_loss
    (training) each softmax adds z_loss * log(Z)^2.

    Args:
      decoder: the Unitransformer (its loss_denominator and z_loss are used).
      hidden: the hidden states [batch..., length, d_model].
      targets: int target ids [batch..., length] (0: padding).
      context: the Context of the call (mesh, dims, mode, states...).

    Returns:
      The scalar loss.

    Raises:
      ValueError: if hidden or targets lacks the context's length dimension.
    """
    length_dim = _length_dim(targets, context)
    if length_dim not in hidden.shape.dims:
      raise ValueError(
        "AdaptiveSoftmaxVocabEmbedding.compute_loss: hidden %s lacks the "
        "targets' length dimension %s" % (hidden.shape.to_string, length_dim)
      )
    weights = mtf.greater(targets, 0)
    head = self._clusters[0]
    head_targets = mtf.where(
      head.mask(targets), targets, mtf.zeros_like(targets)
    )
    for i, cluster in enumerate(self._clusters[1:]):
      head_targets = mtf.where(
        cluster.mask(targets),
        mtf.zeros_like(targets) + (head.token_count + i),
        head_targets,
      )
    total = head.summed_loss(
      decoder, hidden, head_targets, weights, context
    ) / _loss_denominator(decoder, targets, context)
    for cluster in self._clusters[1:]:
      total += self._tail_loss(
        cluster, decoder, hidden, targets, length_dim, context
      )
    return total

  def _tail_loss(
    self,
    cluster: _Cluster,
    decoder,
    hidden: mtf.Tensor,
    targets: mtf.Tensor,
    length_dim: mtf.Dimension,
    context,
  ) -> mtf.Tensor:
    """Loss of one tail cluster at the positions of its targets.

    The summed loss is divided by the decoder's loss denominator of the
    targets the cluster sees: all targets, or the shorter cluster_length
    ones when the cluster projects (as the original does).
    """
    mask = cluster.mask(targets)
    local_targets = mtf.where(
      mask, targets - cluster.start_token_id, mtf.zeros_like(targets)
    )
    if cluster.length_projection_factor >= 1:
      return cluster.summed_loss(
        decoder, hidden, local_targets, mask, context
      ) / _loss_denominator(decoder, targets, context)
    # Gather the in-cluster positions into a shorter "cluster_length" dim:
    # the k-th in-cluster position of a sequence goes to slot k.
    cluster_length_dim = mtf.Dimension(
      "cluster_length",
      max(1, math.ceil(length_dim.size * cluster.length_projection_factor)),
    )
    slot = mtf.cumsum(mtf.cast(mask, tf.int32), length_dim) - 1
    dtype = hidden.dtype
    projection = mtf.one_hot(slot, cluster_length_dim, dtype=dtype) * mtf.cast(
      mask, dtype
    )
    cluster_hidden = mtf.einsum([projection, hidden], reduced_dims=[length_dim])
    cluster_weights = mtf.reduce_sum(projection, reduced_dim=length_dim)
    cluster_targets = mtf.cast(
      mtf.einsum(
        [projection, mtf.cast(local_targets, dtype)], reduced_dims=[length_dim]
      )
      + 0.5,
      tf.int32,
    )
    return cluster.summed_loss(
      decoder, cluster_hidden, cluster_targets, cluster_weights, context
    ) / _loss_denominator(decoder, cluster_targets, context)


def _length_dim(targets: mtf.Tensor, context) -> mtf.Dimension:
  """The sequence dim of targets: the context's length_dim if targets have
  it, else their dim named "length" (the original looks it up by name).
  """
  length_dim = getattr(context, "length_dim", None)
  if isinstance(length_dim, mtf.Dimension) and length_dim in targets.shape.dims:
    return length_dim
  if "length" not in targets.shape.dimension_names:
    raise ValueError(
      "AdaptiveSoftmaxVocabEmbedding.compute_loss: targets %s have neither "
      "the context's length dimension %s nor a dimension named 'length'"
      % (targets.shape.to_string, length_dim)
    )
  return targets.shape.get_dim_by_name("length")


def _loss_denominator(decoder, targets: mtf.Tensor, context):
  fn = getattr(decoder, "loss_denominator", None)
  if fn is not None:
    return fn(targets, context.num_microbatches)
  return float(targets.shape.size * (context.num_microbatches or 1))


def _find_embedding(context) -> Optional[AdaptiveSoftmaxVocabEmbedding]:
  shared = getattr(context, "shared_params", None) or {}
  embedding = shared.get("embedding")
  if isinstance(embedding, AdaptiveSoftmaxVocabEmbedding):
    return embedding
  cache = getattr(context, "cache", None) or {}
  return cache.get(_CACHE_KEY)


@gin.configurable(module=_GIN_MODULE)
def adaptive_softmax_loss_fn(
  decoder,
  context,
  logits: mtf.Tensor,
  targets: mtf.Tensor,
  output_vocab_dim: mtf.Dimension,
) -> mtf.Tensor:
  """Unitransformer loss_fn for AdaptiveSoftmaxVocabEmbedding.

  In training `logits` are the final hidden states (what the embedding's
  hidden_to_logits returned) and the loss is computed cluster by cluster.
  When `logits` already have output_vocab_dim (log-probabilities outside
  training), the loss is their cross-entropy with the targets.

  Example (gin; outside training, the loss checked against numpy):
    >>> from transformer import transformer
    >>> _ = gin.parse_config('''
    ... get_vocab_embedding_cls.cls = @AdaptiveSoftmaxVocabEmbedding
    ... AdaptiveSoftmaxVocabEmbedding.clusters = [
    ...     {"token_count": 12, "embedding_size": 8},
    ...     {"token_count": 4, "embedding_size": 4,
    ...      "length_projection_factor": 0.5}]
    ... Unitransformer.loss_fn = @adaptive_softmax_loss_fn
    ... ''')
    >>> lm = transformer.Unitransformer(
    ...     transformer.LayerStack([]), d_model=8, input_vocab_size=16,
    ...     output_vocab_size=16, autoregressive=True, max_length=4,
    ...     vocab_divisor=1, shared_embedding_and_softmax_weights=True)
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> targets = converter.convert_np_array_to_mtf_tensor(
    ...     [[3, 13, 7, 1]], ["batch", "length"])
    >>> inputs = transformer.autoregressive_inputs(targets)
    >>> log_p, loss = lm.call_simple(inputs, targets, compute_loss=True,
    ...                              mode="eval")
    >>> gin.clear_config()
    >>> lowering, loss_tf = converter.convert_mtf_tensor_to_tf_tensor(loss)
    >>> log_p_np = lowering.export_to_tf_tensor(log_p).numpy()[0]
    >>> np.allclose(np.exp(log_p_np).sum(-1), 1.0)
    True
    >>> np.allclose(loss_tf.numpy(),
    ...             -log_p_np[np.arange(4), [3, 13, 7, 1]].mean())
    True

  Args:
    decoder: the Unitransformer (its output embedding must be an
      AdaptiveSoftmaxVocabEmbedding).
    context: the Context of the call (mesh, dims, mode, states...).
    logits: the final hidden states [batch..., length, d_model] in training, or
      log-probabilities [batch..., length, vocab].
    targets: int target ids [batch..., length] (0: padding).
    output_vocab_dim: the output vocabulary Dimension.

  Returns:
    a scalar: summed cross-entropy / decoder.loss_denominator(...).

  Raises:
    ValueError: if logits are hidden states but the model's vocab embedding
      is not an AdaptiveSoftmaxVocabEmbedding.
  """
  output_vocab_dim = mtf.convert_to_dimension(output_vocab_dim)
  if output_vocab_dim in logits.shape.dims:
    loss = mtf.layers.softmax_cross_entropy_with_logits(
      logits,
      mtf.one_hot(targets, output_vocab_dim, dtype=logits.dtype),
      output_vocab_dim,
    )
    weights = mtf.cast(mtf.greater(targets, 0), loss.dtype)
    return mtf.reduce_sum(loss * weights) / _loss_denominator(
      decoder, targets, context
    )
  embedding = _find_embedding(context)
  if embedding is None:
    raise ValueError(
      "adaptive_softmax_loss_fn: logits %s have no vocab dimension %s and "
      "no AdaptiveSoftmaxVocabEmbedding produced them; use "
      "AdaptiveSoftmaxVocabEmbedding as the vocab embedding with "
      "shared_embedding_and_softmax_weights=True"
      % (logits.shape.to_string, output_vocab_dim)
    )
  return embedding.compute_loss(decoder, logits, targets, context)
