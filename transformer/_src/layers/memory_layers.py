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

from typing import Tuple

import gin
import tensorflow as tf

import mesh_tensorflow as mtf
from transformer._src.layers.context import Context
from transformer._src.layers.context import TransformerLayer

__all__ = ["ProductKeyValueMemory"]

_GIN_MODULE = "mesh_tensorflow.transformer.memory_layers"
tf1 = tf.compat.v1


def _check_positive_int(value, what: str) -> int:
  if not isinstance(value, int) or isinstance(value, bool) or value < 1:
    raise ValueError(
      "ProductKeyValueMemory: %s must be a positive int, got %r" % (what, value)
    )
  return value


@gin.configurable(module=_GIN_MODULE)
class ProductKeyValueMemory(TransformerLayer):
  """Product-key memory: a sparse lookup in n_keys^2 learned values.

  Per position and head h: q = layer_norm(x W_q + b_q) [product_key=2,
  key=key_size // 2] (normalized over "key"); scores of half c against
  sub-key table c, keep the top knn per half;
  candidate (a, b) scores s_1[a] + s_2[b] (knn^2 of them), keep the top knn;
  weights = softmax over those knn; output = sum over heads and the knn of
  weight * values[i_1[a] * n_keys + i_2[b]].

  Variables: `query/kernel` [d_model, n_heads, product_key, key],
  `query/bias` [n_heads, product_key, key],
  `layer_prepostprocess/layer_norm/layer_norm_{scale,bias}` [key],
  `keys` [n_heads, product_key, n_keys, key] (get_variable's default
  initializer), `values` [n_values = n_keys^2, d_model] (normal, stddev 1).
  Position-wise, so it works in every mode (incremental decoding included).
  Layouts may split "n_heads" and batch dims.

  Example (16 values, in a one-layer language model):
    >>> from transformer import transformer
    >>> stack = transformer.make_layer_stack(
    ...     [(ProductKeyValueMemory,
    ...       {"key_size": 8, "n_keys": 4, "n_heads": 2, "knn": 2})],
    ...     num_layers=1)
    >>> lm = transformer.Unitransformer(
    ...     stack, d_model=8, input_vocab_size=16, output_vocab_size=16,
    ...     autoregressive=True, max_length=4, vocab_divisor=1)
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> ids = converter.convert_np_array_to_mtf_tensor(
    ...     [[3, 5, 7, 1]], ["batch", "length"])
    >>> logits, _ = lm.call_simple(ids, ids, compute_loss=False)
    >>> converter.convert_mtf_tensor_to_np_array(logits).shape
    (1, 4, 16)
    >>> prefix = "transformer/block_000/layer_000/ProductKeyValueMemory/"
    >>> for v in converter.graph.all_variables:  # the layer's variables
    ...   if v.name.startswith(prefix):
    ...     print(v.name[len(prefix):], v.shape)
    keys Shape[n_heads=2, product_key=2, n_keys=4, key=4]
    values Shape[n_values=16, d_model=8]
    query/kernel Shape[d_model=8, n_heads=2, product_key=2, key=4]
    query/bias Shape[n_heads=2, product_key=2, key=4]
    layer_prepostprocess/layer_norm/layer_norm_scale Shape[key=4]
    layer_prepostprocess/layer_norm/layer_norm_bias Shape[key=4]
  """

  def __init__(
    self,
    key_size: int = gin.REQUIRED,
    n_keys: int = gin.REQUIRED,
    n_heads: int = gin.REQUIRED,
    knn: int = gin.REQUIRED,
  ):
    """Creates the layer.

    Args:
      key_size: size of a full key; each half has key_size // 2 entries.
      n_keys: sub-keys per table; the memory has n_keys^2 slots.
      n_heads: number of memory heads (dimension "n_heads").
      knn: neighbours kept per half and in the final selection
        (knn <= n_keys).
    """
    self.key_size = key_size
    self.n_keys = n_keys
    self.n_values = n_keys**2 if isinstance(n_keys, int) else n_keys
    self.n_heads = n_heads
    self.knn = knn

  def _check(self) -> None:
    _check_positive_int(self.key_size, "key_size")
    if self.key_size < 2:
      raise ValueError(
        "ProductKeyValueMemory: key_size must be at least 2 "
        "(each half has key_size // 2 entries), got %d" % self.key_size
      )
    _check_positive_int(self.n_keys, "n_keys")
    _check_positive_int(self.n_heads, "n_heads")
    _check_positive_int(self.knn, "knn")
    if self.knn > self.n_keys:
      raise ValueError(
        "ProductKeyValueMemory: knn (%d) must not exceed "
        "n_keys (%d)" % (self.knn, self.n_keys)
      )

  def call(self, context: Context, x: mtf.Tensor) -> mtf.Tensor:
    """x [batch..., (length,) d_model] -> same shape."""
    self._check()
    ensemble_dims = getattr(context.model, "ensemble_dims", None)
    if isinstance(ensemble_dims, (list, tuple)) and ensemble_dims:
      raise ValueError(
        "ProductKeyValueMemory does not support ensembles "
        "(model ensemble dims %s)" % (context.model.ensemble_dims,)
      )
    model_dim = x.shape.dims[-1]
    heads = mtf.Dimension("n_heads", self.n_heads)
    halves = mtf.Dimension("product_key", 2)
    subkey = mtf.Dimension("key", self.key_size // 2)
    slots = mtf.Dimension("n_values", self.n_keys * self.n_keys)
    keys = mtf.get_variable(
      x.mesh,
      "keys",
      mtf.Shape([heads, halves, mtf.Dimension("n_keys", self.n_keys), subkey]),
      dtype=context.variable_dtype,
    )
    values = mtf.layers.embedding_weights(
      x.mesh, slots, model_dim, context.variable_dtype, name="values"
    )
    query = mtf.layers.dense(
      x,
      new_dims=[heads, halves, subkey],
      reduced_dims=[model_dim],
      use_bias=True,
      variable_dtype=context.variable_dtype,
      name="query",
    )
    query = mtf.layers.layer_norm(query, subkey)
    scores, memory_ids = self.get_indices(keys, query)
    weights = mtf.softmax(scores, scores.shape.dims[-1])
    # Sparse lookup: weight * one-hot slot, summed with the values (and
    # over the heads).
    lookup = mtf.one_hot(memory_ids, slots, dtype=weights.dtype) * weights
    return mtf.einsum(
      [lookup, mtf.cast(values, weights.dtype)], output_shape=x.shape
    )

  def get_indices(
    self, keys: mtf.Tensor, query: mtf.Tensor
  ) -> Tuple[mtf.Tensor, mtf.Tensor]:
    """The knn best memory slots of each query and their scores.

    Args:
      keys: [heads, 2 (halves), n_keys, key] sub-keys.
      query: [batch..., heads, 2, key].

    Returns:
      (scores, indices), both [batch..., heads, knn]: the knn best sums
      s_1[a] + s_2[b] of the halves' scores (best first) and their slots
      a * n_keys + b.
    """
    halves = keys.shape.dims[1]
    keys_dim = keys.shape.dims[2]
    knn = mtf.Dimension("knn", self.knn)
    knn_b = mtf.Dimension("knn_b", self.knn)
    candidates = mtf.Dimension("knn_candidates", self.knn * self.knn)
    # Per half: scores against its sub-keys, top knn.
    scores = mtf.einsum(
      [query, mtf.cast(keys, query.dtype)], reduced_dims=[query.shape.dims[-1]]
    )
    half_scores, half_ids = mtf.top_k(scores, keys_dim, knn)
    s1, s2 = mtf.unstack(half_scores, halves)
    i1, i2 = mtf.unstack(half_ids, halves)
    s2 = mtf.rename_dimension(s2, knn.name, knn_b.name)
    i2 = mtf.rename_dimension(i2, knn.name, knn_b.name)
    # All knn x knn candidate pairs, flattened; then the top knn of those.
    pair_scores = mtf.replace_dimensions(s1 + s2, [knn, knn_b], candidates)
    pair_ids = mtf.replace_dimensions(
      i1 * keys_dim.size + i2, [knn, knn_b], candidates
    )
    best_scores, best = mtf.top_k(pair_scores, candidates, knn)
    return best_scores, mtf.gather(pair_ids, best, candidates)
