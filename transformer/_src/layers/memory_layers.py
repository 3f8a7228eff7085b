"""Product-key memory layer (Lample et al., 2019, "Large Memory Layers with
Product Keys"), without the query batch norm.

A memory of n_keys^2 value vectors is addressed through two tables of n_keys
sub-keys each: the key of slot (i, j) is the concatenation of sub-key i of
the first table and sub-key j of the second, so the best keys for a query
q = [q_1, q_2] are found exactly from the top-knn sub-keys of each half:
the knn x knn sums of candidate scores contain the top-knn full scores.
Each head has its own query projection and sub-keys; the values are shared
by the heads and the heads' outputs are summed.
"""

from __future__ import annotations

import gin
import tensorflow as tf

import mesh_tensorflow as mtf
from transformer._src.layers.context import Context, TransformerLayer

__all__ = ["ProductKeyValueMemory"]

_GIN_MODULE = "mesh_tensorflow.transformer.memory_layers"
tf1 = tf.compat.v1


def _check_positive_int(value, what: str) -> int:
  if not isinstance(value, int) or isinstance(value, bool) or value < 1:
    raise ValueError("ProductKeyValueMemory: %s must be a positive int, got %r"
                     % (what, value))
  return value


@gin.configurable(module=_GIN_MODULE)
class ProductKeyValueMemory(TransformerLayer):
  """Product-key memory: a sparse lookup in n_keys^2 learned values.

  Per position and head h: q = x W_q [halves=2, d_subkey=key_size/2];
  scores of half c against sub-key table c, keep the top knn per half;
  candidate (a, b) scores s_1[a] + s_2[b] (knn^2 of them), keep the top knn;
  weights = softmax over those knn; output = sum over heads and the knn of
  weight * values[i_1[a] * n_keys + i_2[b]].

  Variables: `query/kernel` [d_model, heads, halves, d_subkey],
  `keys` [heads, halves, n_keys, d_subkey] (normal, stddev d_subkey^-0.5),
  `values` [memory_slots = n_keys^2, d_model] (normal, stddev d_model^-0.5).
  Position-wise, so it works in every mode (incremental decoding included).
  Layouts may split "heads" and batch dims.

  Example:
    ProductKeyValueMemory(key_size=64, n_keys=128, n_heads=4, knn=16)
  """

  def __init__(self, key_size: int = gin.REQUIRED, n_keys: int = gin.REQUIRED,
               n_heads: int = gin.REQUIRED, knn: int = gin.REQUIRED):
    """Creates the layer.

    Args:
      key_size: size of a full key (even: each half is key_size / 2).
      n_keys: sub-keys per table; the memory has n_keys^2 slots.
      n_heads: number of memory heads (dimension "heads").
      knn: neighbours kept per half and in the final selection
        (knn <= n_keys).
    """
    self.key_size = key_size
    self.n_keys = n_keys
    self.n_heads = n_heads
    self.knn = knn

  def _check(self) -> None:
    _check_positive_int(self.key_size, "key_size")
    _check_positive_int(self.n_keys, "n_keys")
    _check_positive_int(self.n_heads, "n_heads")
    _check_positive_int(self.knn, "knn")
    if self.key_size % 2:
      raise ValueError("ProductKeyValueMemory: key_size must be even (two "
                       "halves), got %d" % self.key_size)
    if self.knn > self.n_keys:
      raise ValueError("ProductKeyValueMemory: knn (%d) must not exceed "
                       "n_keys (%d)" % (self.knn, self.n_keys))

  def call(self, context: Context, x: mtf.Tensor,
           losses=None) -> mtf.Tensor:
    """x [batch..., (length,) d_model] -> same shape.

    Raises:
      ValueError: if the model is an ensemble.
    """
    del losses
    self._check()
    if getattr(context.model, "ensemble_dims", None):
      raise ValueError("ProductKeyValueMemory does not support ensembles "
                       "(model ensemble dims %s)"
                       % (context.model.ensemble_dims,))
    mesh = x.mesh
    dtype = context.activation_dtype
    model_dim = x.shape.dims[-1]
    heads = mtf.Dimension("heads", self.n_heads)
    halves = mtf.Dimension("key_halves", 2)
    subkey = mtf.Dimension("d_subkey", self.key_size // 2)
    keys_dim = mtf.Dimension("n_keys", self.n_keys)
    knn = mtf.Dimension("knn", self.knn)
    knn_b = mtf.Dimension("knn_b", self.knn)
    candidates = mtf.Dimension("knn_candidates", self.knn * self.knn)
    slots = mtf.Dimension("memory_slots", self.n_keys * self.n_keys)

    q = mtf.layers.dense(
        x, new_dims=[heads, halves, subkey], reduced_dims=[model_dim],
        use_bias=False, variable_dtype=context.variable_dtype, name="query")
    keys = mtf.get_variable(
        mesh, "keys", mtf.Shape([heads, halves, keys_dim, subkey]),
        initializer=tf1.random_normal_initializer(stddev=subkey.size ** -0.5),
        dtype=context.variable_dtype)
    values = mtf.get_variable(
        mesh, "values", mtf.Shape([slots, model_dim]),
        initializer=tf1.random_normal_initializer(
            stddev=model_dim.size ** -0.5),
        dtype=context.variable_dtype)
    keys = mtf.cast(keys, dtype)
    values = mtf.cast(values, dtype)

    # Per half: scores against its sub-keys, top knn.
    scores = mtf.einsum([q, keys], reduced_dims=[subkey])
    half_scores, half_ids = mtf.top_k(scores, keys_dim, knn)
    s1, s2 = mtf.unstack(half_scores, halves)
    i1, i2 = mtf.unstack(half_ids, halves)
    s2 = mtf.rename_dimension(s2, knn.name, knn_b.name)
    i2 = mtf.rename_dimension(i2, knn.name, knn_b.name)
    # All knn x knn candidate pairs, flattened; then the top knn of those.
    pair_scores = mtf.replace_dimensions(s1 + s2, [knn, knn_b], candidates)
    best_scores, best = mtf.top_k(pair_scores, candidates, knn)
    # Candidate c is the pair (c // knn, c % knn).
    a = mtf.floordiv(best, self.knn)
    b = mtf.mod(best, self.knn)
    id_a = mtf.reduce_sum(
        mtf.one_hot(a, knn_b, dtype=tf.int32) *
        mtf.rename_dimension(i1, knn.name, knn_b.name), reduced_dim=knn_b)
    id_b = mtf.reduce_sum(mtf.one_hot(b, knn_b, dtype=tf.int32) * i2,
                          reduced_dim=knn_b)
    memory_ids = id_a * self.n_keys + id_b
    weights = mtf.softmax(best_scores, knn)
    # Sparse lookup: weight * one-hot slot, summed with the values.
    lookup = mtf.one_hot(memory_ids, slots, dtype=dtype) * weights
    return mtf.einsum([lookup, values], output_shape=x.shape)
