"""Tests for DenseReluDense and ParallelLayer against numpy.

Weights are pre-created under the names the layer must use, with known
values, so a layer that used other names would make fresh random variables
and fail the numeric comparison; variable names and shapes are also checked
directly. Multi-device runs use tf.function on 1-device, "all:4" and
"rows:2;cols:2" meshes with layouts splitting d_ff, batch and d_model.
"""

import types

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mesh_test_util as mtu
from tests import meshes
from transformer import transformer_layers
from transformer._src.layers import context as context_lib
from transformer._src.layers import dense_layers

tf1 = tf.compat.v1

BATCH = mtf.Dimension("batch", 2)
LENGTH = mtf.Dimension("length", 4)
D_MODEL = mtf.Dimension("d_model", 8)
ENSEMBLE = mtf.Dimension("ensemble", 2)
D_FF = 12

_RNG = np.random.RandomState(1)
X = _RNG.normal(size=(2, 4, 8)).astype(np.float32)


def _weights(seed, shape):
  return np.random.RandomState(seed).normal(size=shape).astype(np.float32) * 0.5


def _model(ensemble_dims=()):
  return types.SimpleNamespace(
    model_dim=D_MODEL,
    ensemble_dims=list(ensemble_dims),
    ensemble_dim=ensemble_dims[0] if ensemble_dims else None,
    fully_autoregressive=False,
    autoregressive=False,
    layout=None,
    mesh_shape=None,
    max_length_dim=LENGTH,
  )


def _context(mesh, mode="eval", ensemble_dims=()):
  return context_lib.Context(
    model=_model(ensemble_dims),
    mesh=mesh,
    batch_dims=[BATCH],
    length_dim=LENGTH,
    variable_dtype=mtf.VariableDType(tf.float32),
    mode=mode,
    losses=[],
  )


def _make_vars(mesh, values):
  """Pre-creates variables {relative name: (dims, numpy value)}."""
  for name, (dims, value) in values.items():
    scope, var = name.rsplit("/", 1)
    with tf1.variable_scope(scope):
      mtf.get_variable(
        mesh, var, dims, initializer=tf1.constant_initializer(value)
      )


def _gelu(x):
  return 0.5 * x * (1.0 + np.tanh(0.7978845608028654 * (x + 0.044715 * x**3)))


def _relu(x):
  return np.maximum(x, 0.0)


def _var_shapes(graph):
  return {v.name: [d.size for d in v.shape.dims] for v in graph.all_variables}


# ----------------------------------------------------------------------------
# Values against numpy.


def _wi(x, w, b=None):
  y = np.einsum("...d,df->...f", x, w)
  return y if b is None else y + b


def test_relu_values_and_variable_names():
  wi = _weights(2, (8, D_FF))
  wo = _weights(3, (D_FF, 8))
  d_ff = mtf.Dimension("d_ff", D_FF)
  seen = {}

  def build(mesh):
    with tf1.variable_scope("layer_001"):
      with tf1.variable_scope("DenseReluDense"):
        _make_vars(
          mesh,
          {
            "wi/kernel": ([D_MODEL, d_ff], wi),
            "wo/kernel": ([d_ff, D_MODEL], wo),
          },
        )
        layer = dense_layers.DenseReluDense(hidden_size=D_FF)
        x = mtf.import_tf_tensor(mesh, X, [BATCH, LENGTH, D_MODEL])
        y = layer.call(_context(mesh), x)
    seen.update(_var_shapes(mesh.graph))
    assert y.shape == x.shape
    return [y]

  (y,) = mtu.run_program(build)
  np.testing.assert_allclose(y, _relu(X @ wi) @ wo, rtol=1e-5, atol=1e-5)
  assert seen == {
    "layer_001/DenseReluDense/wi/kernel": [8, D_FF],
    "layer_001/DenseReluDense/wo/kernel": [D_FF, 8],
  }


def test_fresh_variables_have_spec_names_and_shapes():
  seen = {}

  def build(mesh):
    with tf1.variable_scope("DenseReluDense"):
      layer = dense_layers.DenseReluDense(
        hidden_size=6, activation=["gelu", "linear"], use_bias=True
      )
      y = layer.call(
        _context(mesh), mtf.import_tf_tensor(mesh, X, [BATCH, LENGTH, D_MODEL])
      )
    seen.update(_var_shapes(mesh.graph))
    return [y]

  mtu.run_program(build)
  assert seen == {
    "DenseReluDense/wi_0/kernel": [8, 6],
    "DenseReluDense/wi_0/bias": [6],
    "DenseReluDense/wi_1/kernel": [8, 6],
    "DenseReluDense/wi_1/bias": [6],
    "DenseReluDense/wo/kernel": [6, 8],
    "DenseReluDense/wo/bias": [8],
  }


def test_gated_gelu_linear_with_bias():
  w0, w1, wo = (
    _weights(4, (8, D_FF)),
    _weights(5, (8, D_FF)),
    _weights(6, (D_FF, 8)),
  )
  b0, b1, bo = _weights(7, (D_FF,)), _weights(8, (D_FF,)), _weights(9, (8,))
  d_ff = mtf.Dimension("d_ff", D_FF)

  def build(mesh):
    _make_vars(
      mesh,
      {
        "wi_0/kernel": ([D_MODEL, d_ff], w0),
        "wi_0/bias": ([d_ff], b0),
        "wi_1/kernel": ([D_MODEL, d_ff], w1),
        "wi_1/bias": ([d_ff], b1),
        "wo/kernel": ([d_ff, D_MODEL], wo),
        "wo/bias": ([D_MODEL], bo),
      },
    )
    layer = dense_layers.DenseReluDense(
      hidden_size=D_FF, activation=["gelu", "linear"], use_bias=True
    )
    x = mtf.import_tf_tensor(mesh, X, [BATCH, LENGTH, D_MODEL])
    return [layer.call(_context(mesh), x)]

  (y,) = mtu.run_program(build)
  h = _gelu(_wi(X, w0, b0)) * _wi(X, w1, b1)
  np.testing.assert_allclose(y, h @ wo + bo, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
  "activation,fn",
  [
    ("swish", lambda x: x / (1.0 + np.exp(-x))),
    ("silu", lambda x: x / (1.0 + np.exp(-x))),
    ("sigmoid", lambda x: 1.0 / (1.0 + np.exp(-x))),
    ("tanh", np.tanh),
    ("linear", lambda x: x),
  ],
)
def test_activation_names(activation, fn):
  wi, wo = _weights(10, (8, D_FF)), _weights(11, (D_FF, 8))
  d_ff = mtf.Dimension("d_ff", D_FF)

  def build(mesh):
    _make_vars(
      mesh,
      {"wi/kernel": ([D_MODEL, d_ff], wi), "wo/kernel": ([d_ff, D_MODEL], wo)},
    )
    layer = dense_layers.DenseReluDense(hidden_size=D_FF, activation=activation)
    x = mtf.import_tf_tensor(mesh, X, [BATCH, LENGTH, D_MODEL])
    return [layer.call(_context(mesh), x)]

  (y,) = mtu.run_program(build)
  np.testing.assert_allclose(y, fn(X @ wi) @ wo, rtol=1e-5, atol=1e-5)


def test_unknown_activation_raises():
  def build(mesh):
    layer = dense_layers.DenseReluDense(hidden_size=4, activation="nope")
    x = mtf.import_tf_tensor(mesh, X, [BATCH, LENGTH, D_MODEL])
    return [layer.call(_context(mesh), x)]

  with pytest.raises(ValueError, match="DenseReluDense.*'nope'"):
    mtu.run_program(build)


def test_ensemble_dims_lead_variable_shapes():
  wi = _weights(12, (2, 8, D_FF))
  wo = _weights(13, (2, D_FF, 8))
  xe = _weights(14, (2, 2, 4, 8))  # [ensemble, batch, length, d_model]
  d_ff = mtf.Dimension("d_ff", D_FF)
  seen = {}

  def build(mesh):
    _make_vars(
      mesh,
      {
        "wi/kernel": ([ENSEMBLE, D_MODEL, d_ff], wi),
        "wo/kernel": ([ENSEMBLE, d_ff, D_MODEL], wo),
      },
    )
    layer = dense_layers.DenseReluDense(hidden_size=D_FF)
    x = mtf.import_tf_tensor(mesh, xe, [ENSEMBLE, BATCH, LENGTH, D_MODEL])
    y = layer.call(_context(mesh, ensemble_dims=[ENSEMBLE]), x)
    seen.update(_var_shapes(mesh.graph))
    return [y]

  (y,) = mtu.run_program(build)
  h = _relu(np.einsum("ebld,edf->eblf", xe, wi))
  np.testing.assert_allclose(
    y, np.einsum("eblf,efd->ebld", h, wo), rtol=1e-5, atol=1e-5
  )
  assert seen == {"wi/kernel": [2, 8, D_FF], "wo/kernel": [2, D_FF, 8]}


def test_incremental_shape_without_length():
  wi, wo = _weights(15, (8, D_FF)), _weights(16, (D_FF, 8))
  d_ff = mtf.Dimension("d_ff", D_FF)

  def build(mesh):
    _make_vars(
      mesh,
      {"wi/kernel": ([D_MODEL, d_ff], wi), "wo/kernel": ([d_ff, D_MODEL], wo)},
    )
    layer = dense_layers.DenseReluDense(hidden_size=D_FF, dropout_rate=0.5)
    x = mtf.import_tf_tensor(mesh, X[:, 2], [BATCH, D_MODEL])
    return [layer.call(_context(mesh, mode="incremental"), x)]

  (y,) = mtu.run_program(build)
  np.testing.assert_allclose(y, _relu(X[:, 2] @ wi) @ wo, rtol=1e-5, atol=1e-5)


def test_dropout_in_training_is_shared_along_length():
  ones = np.ones((2, 4, 8), np.float32)
  eye = np.ones((8, 64), np.float32) / 8.0
  d_ff = mtf.Dimension("d_ff", 64)

  def build(mesh):
    _make_vars(
      mesh,
      {
        "wi/kernel": ([D_MODEL, d_ff], eye),
        "wo/kernel": ([d_ff, D_MODEL], np.eye(64, 8, dtype=np.float32)),
      },
    )
    layer = dense_layers.DenseReluDense(hidden_size=64, dropout_rate=0.5)
    x = mtf.import_tf_tensor(mesh, ones, [BATCH, LENGTH, D_MODEL])
    return [layer.call(_context(mesh, mode="train"), x)]

  (y,) = mtu.run_program(build)
  # Each output channel reads one hidden unit (value 1): 0 or 1/keep_prob.
  assert set(np.unique(np.round(y, 5))) <= {0.0, 2.0}
  assert 0 < np.count_nonzero(y) < y.size
  np.testing.assert_array_equal(y, np.broadcast_to(y[:, :1], y.shape))


# ----------------------------------------------------------------------------
# Same numbers on every mesh and layout.


@meshes.parametrize(meshes.DENSE_LAYERS)
def test_meshes_and_layouts(mesh_shape, layout):
  w0, w1, wo = (
    _weights(17, (8, D_FF)),
    _weights(18, (8, D_FF)),
    _weights(19, (D_FF, 8)),
  )
  b0, b1, bo = _weights(20, (D_FF,)), _weights(21, (D_FF,)), _weights(22, (8,))
  d_ff = mtf.Dimension("d_ff", D_FF)

  def build(mesh):
    _make_vars(
      mesh,
      {
        "wi_0/kernel": ([D_MODEL, d_ff], w0),
        "wi_0/bias": ([d_ff], b0),
        "wi_1/kernel": ([D_MODEL, d_ff], w1),
        "wi_1/bias": ([d_ff], b1),
        "wo/kernel": ([d_ff, D_MODEL], wo),
        "wo/bias": ([D_MODEL], bo),
      },
    )
    layer = dense_layers.DenseReluDense(
      hidden_size=D_FF, activation=["relu", "linear"], use_bias=True
    )
    x = mtf.import_tf_tensor(mesh, X, [BATCH, LENGTH, D_MODEL])
    return [layer.call(_context(mesh), x)]

  (y,) = mtu.run_program(build, mesh_shape, layout, mode="function")
  h = _relu(_wi(X, w0, b0)) * _wi(X, w1, b1)
  np.testing.assert_allclose(y, h @ wo + bo, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------
# ParallelLayer.


def test_parallel_layer_sums_outputs_over_sqrt_n_in_scopes():
  w = {
    i: (_weights(30 + i, (8, D_FF)), _weights(40 + i, (D_FF, 8)))
    for i in range(2)
  }
  d_ff = mtf.Dimension("d_ff", D_FF)
  seen = {}

  def build(mesh):
    for i in range(2):
      _make_vars(
        mesh,
        {
          "parallel_layer_%d/wi/kernel" % i: ([D_MODEL, d_ff], w[i][0]),
          "parallel_layer_%d/wo/kernel" % i: ([d_ff, D_MODEL], w[i][1]),
        },
      )
    layer = dense_layers.ParallelLayer(
      layer_classes=(
        dense_layers.DenseReluDense(hidden_size=D_FF),
        dense_layers.DenseReluDense(hidden_size=D_FF, activation="tanh"),
      )
    )
    x = mtf.import_tf_tensor(mesh, X, [BATCH, LENGTH, D_MODEL])
    y = layer.call(_context(mesh), x)
    seen.update(_var_shapes(mesh.graph))
    return [y]

  (y,) = mtu.run_program(build)
  expected = (
    _relu(X @ w[0][0]) @ w[0][1] + np.tanh(X @ w[1][0]) @ w[1][1]
  ) / np.sqrt(2.0)
  np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)
  assert sorted(seen) == [
    "parallel_layer_%d/%s/kernel" % (i, n)
    for i in range(2)
    for n in ("wi", "wo")
  ]


def test_parallel_layer_instantiates_classes_with_gin():
  gin.clear_config()
  try:
    gin.parse_config(
      "mesh_tensorflow.transformer.transformer_layers.DenseReluDense"
      ".hidden_size = 5"
    )
    layer = dense_layers.ParallelLayer(
      layer_classes=(dense_layers.DenseReluDense,), use_scope=False
    )
  finally:
    gin.clear_config()
  assert [l.hidden_size for l in layer.layer_classes] == [5]
  with pytest.raises(ValueError, match="ParallelLayer"):
    dense_layers.ParallelLayer(layer_classes=(int,))


def test_gin_and_exports():
  assert transformer_layers.DenseReluDense is dense_layers.DenseReluDense
  assert transformer_layers.ParallelLayer is dense_layers.ParallelLayer
  gin.clear_config()
  try:
    gin.parse_config(
      "mesh_tensorflow.transformer.transformer_layers.DenseReluDense"
      ".activation = ['gelu', 'linear']"
    )
    assert dense_layers.DenseReluDense().activation == ["gelu", "linear"]
  finally:
    gin.clear_config()
