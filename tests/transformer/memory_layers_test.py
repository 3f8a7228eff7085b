"""Tests for transformer/memory_layers.py (ProductKeyValueMemory).

The layer's product-key lookup is compared with a brute-force numpy
formulation from its exported variables: score all n_keys^2 full keys, take
the top knn, softmax, weighted sum of values (the product-key search must
find exactly those). Same numbers on the 1-device mesh and 4-device meshes
splitting batch and heads; gradients reach the query, keys and values;
incremental (one position) calls match the full pass.
"""

import types

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mesh_test_util as mtu
from tests import meshes
from transformer import memory_layers
from transformer._src.layers.context import Context

B, L, D = 4, 5, 8
KEY_SIZE, N_KEYS, N_HEADS, KNN = 6, 5, 4, 3
BATCH = mtf.Dimension("batch", B)
LENGTH = mtf.Dimension("length", L)
D_MODEL = mtf.Dimension("d_model", D)
F32 = mtf.VariableDType(tf.float32)

_RNG = np.random.RandomState(5)
X = _RNG.normal(size=(B, L, D)).astype(np.float32)
G = _RNG.normal(size=(B, L, D)).astype(np.float32)


def _context(mesh, mode="train"):
  model = types.SimpleNamespace(
    model_dim=D_MODEL,
    ensemble_dims=[],
    ensemble_dim=None,
    fully_autoregressive=True,
    autoregressive=True,
    layout=None,
    mesh_shape=None,
    max_length_dim=LENGTH,
  )
  return Context(model, mesh, [BATCH], LENGTH, F32, mode=mode, losses=[])


def _imp(mesh, value, dims):
  return mtf.import_tf_tensor(mesh, tf.constant(value), mtf.Shape(dims))


def _softmax(x):
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def np_query(x, query):
  """[b, l, h, 2, s] queries, layer-normalized over s (the layer norm's
  scale and bias, like the query bias, are still at their initial ones and
  zeros).
  """
  q = np.einsum("bld,dhcs->blhcs", x, query)
  return (q - q.mean(-1, keepdims=True)) / np.sqrt(
    q.var(-1, keepdims=True) + 1e-6
  )


def np_memory(x, query, keys, values, knn):
  """Brute force over all n_keys^2 product keys."""
  n_keys = keys.shape[2]
  q = np_query(x, query)  # [b, l, h, 2, s]
  half = np.einsum("blhcs,hcks->blhck", q, keys)  # [b, l, h, 2, k]
  full = half[..., 0, :, None] + half[..., 1, None, :]  # [b, l, h, k, k]
  full = full.reshape(full.shape[:3] + (n_keys * n_keys,))
  top = np.argsort(-full, axis=-1, kind="stable")[..., :knn]
  scores = np.take_along_axis(full, top, axis=-1)
  weights = _softmax(scores)
  return np.einsum("blhn,blhnd->bld", weights, values[top])


def _layer(n_heads=N_HEADS, knn=KNN):
  return memory_layers.ProductKeyValueMemory(
    key_size=KEY_SIZE, n_keys=N_KEYS, n_heads=n_heads, knn=knn
  )


def _program(layer):
  """Outputs: y, gradients (query, keys, values), the three variables."""

  def build(mesh):
    x = _imp(mesh, X, [BATCH, LENGTH, D_MODEL])
    y = layer.call(_context(mesh), x)
    loss = mtf.reduce_sum(y * _imp(mesh, G, [BATCH, LENGTH, D_MODEL]))
    var = mesh.graph.name_to_variable
    variables = [var[n].outputs[0] for n in ("query/kernel", "keys", "values")]
    return [y] + mtf.gradients([loss], variables) + variables

  return build


@meshes.parametrize(meshes.MEMORY_LAYERS, "mesh_layout")
def test_matches_brute_force_numpy_on_meshes(mesh_layout):
  y, g_query, g_keys, g_values, query, keys, values = mtu.run_program(
    _program(_layer()), *mesh_layout
  )
  assert query.shape == (D, N_HEADS, 2, KEY_SIZE // 2)
  assert keys.shape == (N_HEADS, 2, N_KEYS, KEY_SIZE // 2)
  assert values.shape == (N_KEYS * N_KEYS, D)
  np.testing.assert_allclose(
    y, np_memory(X, query, keys, values, KNN), rtol=1e-5, atol=1e-5
  )
  for name, g in (("query", g_query), ("keys", g_keys), ("values", g_values)):
    assert np.abs(g).max() > 0, name
  # Values: only the selected slots get gradient, d/dV = sum w * G.
  q = np_query(X, query)
  half = np.einsum("blhcs,hcks->blhck", q, keys)
  full = (half[..., 0, :, None] + half[..., 1, None, :]).reshape(
    B, L, N_HEADS, -1
  )
  top = np.argsort(-full, axis=-1, kind="stable")[..., :KNN]
  w = _softmax(np.take_along_axis(full, top, axis=-1))
  expected = np.zeros_like(values)
  np.add.at(
    expected,
    top.reshape(-1),
    (w[..., None] * G[:, :, None, None, :]).reshape(-1, D),
  )
  np.testing.assert_allclose(g_values, expected, rtol=1e-4, atol=1e-5)


def test_keys_gradient_matches_finite_differences():
  # The only float path to the keys is through the selected scores.
  layer = _layer()
  y, _, g_keys, _, query, keys, values = mtu.run_program(_program(layer))
  loss = lambda k: np.sum(np_memory(X, query, k, values, KNN) * G)  # noqa
  eps = 1e-3
  for index in [(0, 0, 1, 2), (1, 1, 3, 0), (0, 1, 0, 1)]:
    kp, km = keys.copy(), keys.copy()
    kp[index] += eps
    km[index] -= eps
    fd = (loss(kp.astype(np.float64)) - loss(km.astype(np.float64))) / (2 * eps)
    np.testing.assert_allclose(g_keys[index], fd, rtol=2e-2, atol=2e-3)
  del y


def test_knn_equal_to_n_keys_covers_every_slot_of_each_half():
  y, _, _, _, query, keys, values = mtu.run_program(
    _program(_layer(knn=N_KEYS)), "rows:2;cols:2", "batch:rows;n_heads:cols"
  )
  np.testing.assert_allclose(
    y, np_memory(X, query, keys, values, N_KEYS), rtol=1e-5, atol=1e-5
  )


def test_incremental_position_matches_full_pass():
  layer = _layer()

  def build(mesh):
    y = layer.call(
      _context(mesh, "eval"), _imp(mesh, X, [BATCH, LENGTH, D_MODEL])
    )
    steps = []
    for t in range(L):
      ctx = _context(mesh, "incremental")
      ctx.position = mtf.constant(mesh, t, [BATCH], tf.int32)
      steps.append(layer.call(ctx, _imp(mesh, X[:, t], [BATCH, D_MODEL])))
    return [y] + steps

  y, *steps = mtu.run_program(build, "all:4", "n_heads:all")
  for t, y_t in enumerate(steps):
    assert y_t.shape == (B, D)
    np.testing.assert_allclose(y_t, y[:, t], rtol=1e-5, atol=1e-5)


def test_odd_key_size_uses_key_size_floordiv_2_per_half():
  layer = memory_layers.ProductKeyValueMemory(
    key_size=KEY_SIZE + 1, n_keys=N_KEYS, n_heads=N_HEADS, knn=KNN
  )
  y, _, _, _, query, keys, values = mtu.run_program(_program(layer))
  assert keys.shape == (N_HEADS, 2, N_KEYS, KEY_SIZE // 2)
  np.testing.assert_allclose(
    y, np_memory(X, query, keys, values, KNN), rtol=1e-5, atol=1e-5
  )


def test_get_indices_returns_best_product_scores_and_slots():
  rng = np.random.RandomState(7)
  keys = rng.normal(size=(N_HEADS, 2, N_KEYS, 2)).astype(np.float32)
  query = rng.normal(size=(B, N_HEADS, 2, 2)).astype(np.float32)
  heads = mtf.Dimension("n_heads", N_HEADS)
  halves = mtf.Dimension("product_key", 2)
  key = mtf.Dimension("key", 2)

  def build(mesh):
    return list(
      _layer().get_indices(
        _imp(mesh, keys, [heads, halves, mtf.Dimension("n_keys", N_KEYS), key]),
        _imp(mesh, query, [BATCH, heads, halves, key]),
      )
    )

  scores, indices = mtu.run_program(build)
  half = np.einsum("bhcs,hcks->bhck", query, keys)
  full = (half[:, :, 0, :, None] + half[:, :, 1, None, :]).reshape(
    B, N_HEADS, -1
  )
  best = np.argsort(-full, axis=-1, kind="stable")[..., :KNN]
  np.testing.assert_allclose(
    scores, np.take_along_axis(full, best, -1), rtol=1e-5
  )
  np.testing.assert_array_equal(indices, best)


@pytest.mark.parametrize(
  "kwargs,match",
  [
    (dict(key_size=1), "key_size must be at least 2"),
    (dict(knn=N_KEYS + 1), "knn"),
    (dict(n_heads=0), "n_heads"),
  ],
)
def test_bad_arguments(kwargs, match):
  args = dict(key_size=KEY_SIZE, n_keys=N_KEYS, n_heads=N_HEADS, knn=KNN)
  args.update(kwargs)
  layer = memory_layers.ProductKeyValueMemory(**args)
  with pytest.raises(ValueError, match="ProductKeyValueMemory.*" + match):
    mtu.run_program(
      lambda mesh: [
        layer.call(_context(mesh), _imp(mesh, X, [BATCH, LENGTH, D_MODEL]))
      ]
    )


def test_gin_required_parameters():
  with pytest.raises(Exception, match="key_size|n_keys|n_heads|knn"):
    memory_layers.ProductKeyValueMemory()
  with gin.unlock_config():
    gin.parse_config("""
        mesh_tensorflow.transformer.memory_layers.ProductKeyValueMemory.key_size = 4
        mesh_tensorflow.transformer.memory_layers.ProductKeyValueMemory.n_keys = 8
        mesh_tensorflow.transformer.memory_layers.ProductKeyValueMemory.n_heads = 2
        mesh_tensorflow.transformer.memory_layers.ProductKeyValueMemory.knn = 4
    """)
  try:
    layer = memory_layers.ProductKeyValueMemory()
    assert (layer.key_size, layer.n_keys, layer.n_heads, layer.knn) == (
      4,
      8,
      2,
      4,
    )
  finally:
    gin.clear_config()
