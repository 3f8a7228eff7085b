"""Drop-in replacements for the transformer's VocabEmbedding.

Each class has VocabEmbedding's interface, so a model picks one with
`get_vocab_embedding_cls.cls = @vocab_embeddings.<Class>` in gin:
`cls(mesh, vocab_dim, output_dim, variable_dtype, name, ensemble_dim, ...)`,
`ids_to_embedding(ids, context) -> [..., output_dim]` and
`hidden_to_logits(hidden, context) -> [..., vocab_dim]`.

- FactorizedVocabEmbedding: the table is the product of a [vocab, inner] and
  an [inner, d_model] matrix (as in ALBERT).
- AdaptiveVocabEmbedding: consecutive clusters of ids with embeddings of
  their own (smaller) inner sizes (adaptive input representations); logits
  are one softmax over the whole vocabulary.
- MixtureOfSoftmaxes and Mixtape: mixtures of several softmaxes or logit
  vectors (breaking the softmax bottleneck). They live in mixture_softmaxes;
  this module imports them, so importing it registers all four in gin.

Variable names (relative to the caller's variable scope, `name` being the
constructor argument, [ensemble] leading every shape when given) are listed
in each class's docstring.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import gin
import tensorflow as tf

import mesh_tensorflow as mtf
from transformer._src.layers import embeddings as embeddings_lib
from transformer._src.layers.embeddings import ensemble_list
from transformer._src.layers.embeddings import scale_hidden
from transformer._src.layers.mixture_softmaxes import Mixtape
from transformer._src.layers.mixture_softmaxes import MixtureOfSoftmaxes

__all__ = [
  "AdaptiveVocabEmbedding",
  "FactorizedVocabEmbedding",
  "Mixtape",
  "MixtureOfSoftmaxes",
]

_GIN_MODULE = "mesh_tensorflow.transformer.vocab_embeddings"

tf1 = tf.compat.v1


@gin.configurable(module=_GIN_MODULE)
class FactorizedVocabEmbedding:
  """Embedding table factorized through a small inner dimension.

  table [vocab, d_model] = `<name>1` [vocab, inner_vocab] @ `<name>2`
  [inner_vocab, d_model]; both factors are initialized with stddev
  inner_dimension_size**-0.25, so the product has unit variance like
  VocabEmbedding's table. The inner dimension is named "inner_vocab".

  Example:
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> vocab_dim = mtf.Dimension("vocab", 16)
    >>> d_model = mtf.Dimension("d_model", 8)
    >>> emb = FactorizedVocabEmbedding(
    ...     converter.mesh, vocab_dim, d_model, mtf.VariableDType(),
    ...     "embedding", None, inner_dimension_size=4)
    >>> ids = converter.convert_np_array_to_mtf_tensor(
    ...     [[3, 5, 7, 1]], ["batch", "length"])
    >>> x = emb.ids_to_embedding(ids, None)  # the context is not used
    >>> logits = emb.hidden_to_logits(x, None)
    >>> x.shape, logits.shape
    (Shape[batch=1, length=4, d_model=8], Shape[batch=1, length=4, vocab=16])
    >>> for v in converter.graph.all_variables:
    ...   print(v.name, v.shape)
    embedding1 Shape[vocab=16, inner_vocab=4]
    embedding2 Shape[inner_vocab=4, d_model=8]

  Args:
    mesh: the mtf.Mesh the variables live on.
    vocab_dim: the vocabulary Dimension.
    output_dim: the output Dimension (None: the input's model dim).
    variable_dtype: the mtf.VariableDType of the variables.
    name: the name (scope) of the variables, e.g. "embedding" or "softmax".
    ensemble_dim: an ensemble Dimension (one table per member) or None.
    inner_dimension_size: the size of the factorization's inner dim (the table
      is [vocab, inner] times [inner, d_model]).

  Raises:
    ValueError: if inner_dimension_size is not a positive int.
  """

  def __init__(
    self,
    mesh: mtf.Mesh,
    vocab_dim: mtf.Dimension,
    output_dim: mtf.Dimension,
    variable_dtype,
    name: str,
    ensemble_dim: Optional[mtf.Dimension],
    inner_dimension_size: int = gin.REQUIRED,
  ):
    if not isinstance(inner_dimension_size, int) or inner_dimension_size < 1:
      raise ValueError(
        "FactorizedVocabEmbedding %r: inner_dimension_size must "
        "be a positive int, got %r" % (name, inner_dimension_size)
      )
    self._vocab_dim = mtf.convert_to_dimension(vocab_dim)
    self._output_dim = mtf.convert_to_dimension(output_dim)
    self._inner_dim = mtf.Dimension("inner_vocab", inner_dimension_size)
    initializer = tf1.random_normal_initializer(
      stddev=inner_dimension_size**-0.25
    )
    ensemble = ensemble_list(ensemble_dim)
    self._factored_embedding = mtf.layers.embedding_weights(
      mesh,
      self._vocab_dim,
      self._inner_dim,
      variable_dtype,
      name="%s1" % name,
      ensemble_dim=ensemble,
      initializer=initializer,
    )
    self._embedding_proj = mtf.layers.embedding_weights(
      mesh,
      self._inner_dim,
      self._output_dim,
      variable_dtype,
      name="%s2" % name,
      ensemble_dim=ensemble,
      initializer=initializer,
    )

  @property
  def inner_dim(self) -> mtf.Dimension:
    """The factorization's inner Dimension ("inner_vocab",
    inner_dimension_size).
    """
    return self._inner_dim

  def ids_to_embedding(self, ids: mtf.Tensor, context) -> mtf.Tensor:
    """ids [...] -> [..., d_model]: a row of factor 1 times factor 2.

    Args:
      ids: int token ids [batch..., length].
      context: the Context of the call (mesh, dims, mode, states...).

    Returns:
      The embeddings [batch..., length, d_model].
    """
    del context
    inner = mtf.gather(self._factored_embedding, ids, self._vocab_dim)
    return mtf.einsum(
      [inner, self._embedding_proj], reduced_dims=[self._inner_dim]
    )

  def hidden_to_logits(self, hidden: mtf.Tensor, context) -> mtf.Tensor:
    """hidden [..., d_model] -> logits [..., vocab] (hidden * d_model^-0.5).

    Args:
      hidden: the hidden states [batch..., length, d_model].
      context: the Context of the call (mesh, dims, mode, states...).

    Returns:
      The logits [batch..., length, vocab].
    """
    del context
    hidden = scale_hidden(hidden, self._output_dim)
    inner = mtf.einsum(
      [hidden, self._embedding_proj], reduced_dims=[self._output_dim]
    )
    return mtf.einsum(
      [inner, self._factored_embedding], reduced_dims=[self._inner_dim]
    )


def cluster_specs(
  clusters: Sequence[Dict[str, Any]],
  vocab_dim: mtf.Dimension,
  output_dim: mtf.Dimension,
  owner: str,
  allow_length_projection: bool,
) -> List[Dict[str, Any]]:
  """Validated cluster specs with defaults filled in.

  Each spec is a dict with "token_count" (required), "embedding_size"
  (default: d_model) and, for the adaptive softmax, "length_projection_factor"
  (default 1.0). The token counts must add up to the vocabulary size.
  """
  if (
    clusters is None or not isinstance(clusters, (list, tuple)) or not clusters
  ):
    raise ValueError(
      "%s: clusters must be a non-empty list of dicts, got %r"
      % (owner, clusters)
    )
  allowed = {"token_count", "embedding_size"}
  if allow_length_projection:
    allowed.add("length_projection_factor")
  specs = []
  for i, spec in enumerate(clusters):
    if not isinstance(spec, dict) or "token_count" not in spec:
      raise ValueError(
        "%s: cluster %d must be a dict with a 'token_count', "
        "got %r" % (owner, i, spec)
      )
    unknown = sorted(set(spec) - allowed)
    if unknown:
      raise ValueError(
        "%s: cluster %d has unknown keys %s (allowed: %s)"
        % (owner, i, unknown, sorted(allowed))
      )
    token_count = spec["token_count"]
    embedding_size = spec.get("embedding_size", output_dim.size)
    factor = spec.get("length_projection_factor", 1.0)
    if not isinstance(token_count, int) or token_count < 1:
      raise ValueError(
        "%s: cluster %d token_count must be a positive int, "
        "got %r" % (owner, i, token_count)
      )
    if not isinstance(embedding_size, int) or embedding_size < 1:
      raise ValueError(
        "%s: cluster %d embedding_size must be a positive int, "
        "got %r" % (owner, i, embedding_size)
      )
    if not 0 < factor <= 1:
      raise ValueError(
        "%s: cluster %d length_projection_factor must be in "
        "(0, 1], got %r" % (owner, i, factor)
      )
    specs.append(
      {
        "token_count": token_count,
        "embedding_size": embedding_size,
        "length_projection_factor": factor,
      }
    )
  counts = [s["token_count"] for s in specs]
  if sum(counts) != vocab_dim.size:
    raise ValueError(
      "%s: the cluster token counts %s sum to %d, not to the "
      "size %d of vocab dimension %r"
      % (owner, counts, sum(counts), vocab_dim.size, vocab_dim.name)
    )
  return specs


def cluster_embedding(
  mesh: mtf.Mesh,
  cluster_vocab_dim: mtf.Dimension,
  output_dim: mtf.Dimension,
  variable_dtype,
  name: str,
  ensemble_dim,
  embedding_size: int,
):
  """The embedding of one cluster: a VocabEmbedding when embedding_size is
  d_model, else a FactorizedVocabEmbedding through embedding_size.
  """
  if embedding_size == output_dim.size:
    return embeddings_lib.VocabEmbedding(
      mesh=mesh,
      vocab_dim=cluster_vocab_dim,
      output_dim=output_dim,
      variable_dtype=variable_dtype,
      name=name,
      ensemble_dim=ensemble_dim,
    )
  return FactorizedVocabEmbedding(
    mesh=mesh,
    vocab_dim=cluster_vocab_dim,
    output_dim=output_dim,
    variable_dtype=variable_dtype,
    name=name,
    ensemble_dim=ensemble_dim,
    inner_dimension_size=embedding_size,
  )


def cluster_ids_to_embedding(
  embedding, ids: mtf.Tensor, start_token_id: int, cluster_size: int, context
) -> mtf.Tensor:
  """Embeddings of the ids in [start, start + cluster_size); zeros elsewhere."""
  in_cluster = mtf.logical_and(
    mtf.greater_equal(ids, start_token_id),
    mtf.less(ids, start_token_id + cluster_size),
  )
  local_ids = mtf.where(in_cluster, ids - start_token_id, mtf.zeros_like(ids))
  emb = embedding.ids_to_embedding(local_ids, context)
  return emb * mtf.cast(in_cluster, emb.dtype)


@gin.configurable(module=_GIN_MODULE)
class AdaptiveVocabEmbedding:
  """Adaptive input embeddings: clusters of ids with their own capacity.

  `clusters` is a list of dicts, in vocabulary order: "token_count" (ids in
  the cluster; the counts must sum to the vocabulary size) and optionally
  "embedding_size" (default d_model). A cluster of size d_model uses a
  VocabEmbedding named `<name>_<i>` [vocab_i, d_model]; a smaller one a
  FactorizedVocabEmbedding with variables `<name>_<i>1` [vocab_i,
  inner_vocab] and `<name>_<i>2` [inner_vocab, d_model]. Cluster vocab dims
  keep vocab_dim's name. Unlike the adaptive softmax, logits are computed for
  the whole vocabulary (concatenated cluster logits), so the vocab dimension
  must not be split over the mesh.

  Example (ids 0-11 embedded in d_model dims, ids 12-15 in 4 dims):
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> vocab_dim = mtf.Dimension("vocab", 16)
    >>> d_model = mtf.Dimension("d_model", 8)
    >>> emb = AdaptiveVocabEmbedding(
    ...     converter.mesh, vocab_dim, d_model, mtf.VariableDType(),
    ...     "embedding", None,
    ...     clusters=[{"token_count": 12, "embedding_size": 8},
    ...               {"token_count": 4, "embedding_size": 4}])
    >>> ids = converter.convert_np_array_to_mtf_tensor(
    ...     [[3, 5, 7, 1]], ["batch", "length"])
    >>> x = emb.ids_to_embedding(ids, None)  # the context is not used
    >>> logits = emb.hidden_to_logits(x, None)
    >>> x.shape, logits.shape
    (Shape[batch=1, length=4, d_model=8], Shape[batch=1, length=4, vocab=16])
    >>> for v in converter.graph.all_variables:
    ...   print(v.name, v.shape)
    embedding_0 Shape[vocab=12, d_model=8]
    embedding_11 Shape[vocab=4, inner_vocab=4]
    embedding_12 Shape[inner_vocab=4, d_model=8]

  Args:
    mesh: the mtf.Mesh the variables live on.
    vocab_dim: the vocabulary Dimension.
    output_dim: the output Dimension (None: the input's model dim).
    variable_dtype: the mtf.VariableDType of the variables.
    name: the name (scope) of the variables, e.g. "embedding" or "softmax".
    ensemble_dim: an ensemble Dimension (one table per member) or None.
    clusters: a list of {"token_count": n, "embedding_size": e} dicts:
      consecutive id ranges of n tokens each embedded in e dims and projected to
      d_model.
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
    specs = cluster_specs(
      clusters,
      self._vocab_dim,
      self._output_dim,
      "AdaptiveVocabEmbedding %r" % name,
      allow_length_projection=False,
    )
    self._clusters = []  # (embedding, start_token_id, token_count)
    start = 0
    for i, spec in enumerate(specs):
      cluster_vocab_dim = mtf.Dimension(
        self._vocab_dim.name, spec["token_count"]
      )
      embedding = cluster_embedding(
        mesh,
        cluster_vocab_dim,
        self._output_dim,
        variable_dtype,
        "%s_%d" % (name, i),
        ensemble_dim,
        spec["embedding_size"],
      )
      self._clusters.append((embedding, start, spec["token_count"]))
      start += spec["token_count"]

  def ids_to_embedding(self, ids: mtf.Tensor, context) -> mtf.Tensor:
    """Each id is embedded by its cluster (the others contribute zeros).

    Args:
      ids: int token ids [batch..., length].
      context: the Context of the call (mesh, dims, mode, states...).

    Returns:
      The embeddings [batch..., length, d_model].
    """
    return mtf.add_n(
      [
        cluster_ids_to_embedding(embedding, ids, start, count, context)
        for embedding, start, count in self._clusters
      ]
    )

  def hidden_to_logits(self, hidden: mtf.Tensor, context) -> mtf.Tensor:
    """The clusters' logits concatenated along the vocab dimension.

    Args:
      hidden: the hidden states [batch..., length, d_model].
      context: the Context of the call (mesh, dims, mode, states...).

    Returns:
      The logits [batch..., length, vocab].
    """
    logits = [
      embedding.hidden_to_logits(hidden, context)
      for embedding, _, _ in self._clusters
    ]
    if len(logits) == 1:
      return logits[0]
    return mtf.concat(logits, self._vocab_dim.name)
