"""Tests for mtf.layers dense family, initializers, dense_relu_dense, embedding.

Values and gradients are checked against plain TF (tf.GradientTape) on the
1-device mesh, the 4-device 1-d mesh and the 2x2 mesh under layouts that split
the batch, the reduced dim, the new dim and the vocabulary.
"""

import inspect

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mesh_test_util as mtu
from tests import meshes

tf1 = tf.compat.v1

BATCH = mtf.Dimension("batch", 4)
D_MODEL = mtf.Dimension("d_model", 8)
HIDDEN = mtf.Dimension("hidden", 4)
EXPERTS = mtf.Dimension("experts", 2)
VOCAB = mtf.Dimension("vocab", 8)
LENGTH = mtf.Dimension("length", 2)

_RNG = np.random.RandomState(0)
X = _RNG.uniform(-1.0, 1.0, size=(4, 8)).astype(np.float32)
W = _RNG.uniform(-1.0, 1.0, size=(8, 4)).astype(np.float32)
B = _RNG.uniform(-0.5, 0.5, size=(4,)).astype(np.float32)
C = _RNG.uniform(-1.0, 1.0, size=(4, 4)).astype(np.float32)  # loss weights
W2 = _RNG.uniform(-1.0, 1.0, size=(8, 4)).astype(np.float32)
IDS = np.array([[0, 7], [3, 3], [5, 1], [2, 6]], dtype=np.int32)


def _var(graph, name):
  for v in graph.all_variables:
    if v.name == name:
      return v.outputs[0]
  raise KeyError(name)


# ----------------------------------------------------------------------------
# dense: values and gradients against tf.GradientTape.


def _dense_program(mesh):
  x = mtf.import_tf_tensor(mesh, X, [BATCH, D_MODEL])
  c = mtf.import_tf_tensor(mesh, C, [BATCH, HIDDEN])
  y = mtf.layers.dense(
    x,
    HIDDEN,
    reduced_dims=[D_MODEL],
    activation=mtf.tanh,
    kernel_initializer=tf.constant_initializer(W),
    name="dense",
  )
  # A nonzero bias: add a constant through the variable's assignable value.
  kernel = _var(mesh.graph, "dense/kernel")
  bias = _var(mesh.graph, "dense/bias")
  loss = mtf.reduce_sum(y * c)
  dx, dk, db = mtf.gradients([loss], [x, kernel, bias])
  return [y, dx, dk, db, kernel, bias]


def _dense_reference():
  x = tf.constant(X)
  k = tf.Variable(W)
  b = tf.Variable(np.zeros(4, np.float32))
  with tf.GradientTape() as tape:
    tape.watch(x)
    y = tf.tanh(tf.matmul(x, k) + b)
    loss = tf.reduce_sum(y * C)
  dx, dk, db = tape.gradient(loss, [x, k, b])
  return [
    y.numpy(),
    dx.numpy(),
    dk.numpy(),
    db.numpy(),
    W,
    np.zeros(4, np.float32),
  ]


@meshes.parametrize(meshes.DENSE)
def test_dense_values_and_gradients(mesh_shape, layout):
  got = mtu.run_program(_dense_program, mesh_shape, layout)
  mtu.assert_all_close(got, _dense_reference(), msg=layout)


@pytest.mark.parametrize("mode", mtu.MODES)
def test_dense_three_modes(mode):
  got = mtu.run_program(
    _dense_program, "rows:2;cols:2", "batch:rows;hidden:cols", mode
  )
  mtu.assert_all_close(got, _dense_reference(), msg=mode)


def test_dense_variable_names_shapes_and_scopes():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  with mtf.variable_store(mtf.VariableStore()):
    x = mtf.zeros(mesh, [BATCH, EXPERTS, D_MODEL])
    y0 = mtf.layers.dense(x, HIDDEN, reduced_dims=[D_MODEL])
    y1 = mtf.layers.dense(x, [HIDDEN], reduced_dims=[D_MODEL], use_bias=False)
    with tf1.variable_scope("outer"):
      mtf.layers.dense(
        x, HIDDEN, reduced_dims=[D_MODEL], name="proj", expert_dims=[EXPERTS]
      )
      mtf.layers.dense(x, HIDDEN, reduced_dims=[D_MODEL])
  names = [(v.name, v.shape.to_string) for v in graph.trainable_variables]
  assert names == [
    # The original's names: a default-named kernel and bias get separate
    # scopes; use_bias=False still uses up a scope name (dense_3).
    ("dense/kernel", "Shape[d_model=8, hidden=4]"),
    ("dense_1/bias", "Shape[hidden=4]"),
    ("dense_2/kernel", "Shape[d_model=8, hidden=4]"),
    ("outer/proj/kernel", "Shape[experts=2, d_model=8, hidden=4]"),
    ("outer/proj/bias", "Shape[experts=2, hidden=4]"),
    ("outer/dense/kernel", "Shape[d_model=8, hidden=4]"),
    ("outer/dense_1/bias", "Shape[hidden=4]"),
  ]
  assert y0.shape == mtf.Shape([BATCH, EXPERTS, HIDDEN])
  assert y1.shape == mtf.Shape([BATCH, EXPERTS, HIDDEN])
  assert [v.name for v in graph.all_variables] == [
    v.name for v in graph.trainable_variables
  ]


def test_dense_default_names_stable_across_rebuilds():
  """Rebuilding a program (each eager step) must reuse the same names."""
  store = mtf.VariableStore()
  all_names = []
  for _ in range(2):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    with mtf.variable_store(store):
      x = mtf.zeros(mesh, [BATCH, D_MODEL])
      mtf.layers.dense(x, HIDDEN, reduced_dims=[D_MODEL])
      mtf.layers.dense(x, HIDDEN, reduced_dims=[D_MODEL])
    all_names.append([v.name for v in graph.all_variables])
  assert (
    all_names[0]
    == all_names[1]
    == ["dense/kernel", "dense_1/bias", "dense_2/kernel", "dense_3/bias"]
  )
  assert sorted(store.masters) == sorted(all_names[0])


def test_dense_expert_dims_and_renamed_reduced_dim():
  e = _RNG.uniform(-1, 1, size=(2, 4, 8)).astype(np.float32)
  we = _RNG.uniform(-1, 1, size=(2, 8, 4)).astype(np.float32)
  sq = _RNG.uniform(-1, 1, size=(8, 8)).astype(np.float32)

  def build(mesh):
    x = mtf.import_tf_tensor(mesh, e, [EXPERTS, BATCH, D_MODEL])
    y = mtf.layers.dense(
      x,
      HIDDEN,
      reduced_dims=[D_MODEL],
      expert_dims=[EXPERTS],
      use_bias=False,
      kernel_initializer=tf.constant_initializer(we),
      name="moe",
    )
    # A reduced dim equal to a new dim: x's d_model is renamed "_d_model".
    x2 = mtf.import_tf_tensor(mesh, X, [BATCH, D_MODEL])
    z = mtf.layers.dense(
      x2,
      [D_MODEL],
      reduced_dims=[D_MODEL],
      use_bias=False,
      kernel_initializer=tf.constant_initializer(sq),
      name="square",
    )
    assert z.shape == mtf.Shape([BATCH, D_MODEL])
    k = _var(mesh.graph, "square/kernel")
    assert k.shape.dimension_names == ["_d_model", "d_model"]
    return [y, z]

  for mesh_shape, layout in [
    ("", ""),
    ("rows:2;cols:2", "experts:rows;d_model:cols"),
  ]:
    y, z = mtu.run_program(build, mesh_shape, layout)
    np.testing.assert_allclose(
      y, np.einsum("ebd,edh->ebh", e, we), rtol=1e-5, atol=1e-5
    )
    np.testing.assert_allclose(z, X @ sq, rtol=1e-5, atol=1e-5)


def test_dense_default_reduced_dim_kernel_weights_and_dtypes():
  def build(mesh):
    x = mtf.import_tf_tensor(mesh, X, [BATCH, D_MODEL])
    # reduced_dims=None: the last dim (deprecated path).
    y = mtf.layers.dense(
      x,
      HIDDEN,
      use_bias=False,
      kernel_initializer=tf.constant_initializer(W),
      name="last",
    )
    # kernel_weights given: no kernel variable.
    w2 = mtf.import_tf_tensor(mesh, W2, [D_MODEL, HIDDEN])
    z = mtf.layers.dense(
      x, HIDDEN, reduced_dims=[D_MODEL], kernel_weights=w2, name="given"
    )
    # bfloat16 activations, float32 masters.
    xb = mtf.cast(x, tf.bfloat16)
    yb = mtf.layers.dense(
      xb,
      HIDDEN,
      reduced_dims=[D_MODEL],
      use_bias=False,
      kernel_initializer=tf.constant_initializer(W),
      name="bf16",
    )
    assert yb.dtype == tf.bfloat16
    v = mesh.graph.name_to_variable["bf16/kernel"]
    assert v.master_dtype == tf.float32 and v.activation_dtype == tf.bfloat16
    names = [v.name for v in mesh.graph.all_variables]
    assert names == ["last/kernel", "given/bias", "bf16/kernel"]
    # get_dense_kernel_weights: the cast kernel of `<name>/kernel`.
    k = mtf.layers.get_dense_kernel_weights(
      xb, [HIDDEN], [D_MODEL], [], tf.constant_initializer(W), name="gk"
    )
    assert k.dtype == tf.bfloat16 and k.shape == mtf.Shape([D_MODEL, HIDDEN])
    assert "gk/kernel" in mesh.graph.name_to_variable
    return [y, z, mtf.cast(yb, tf.float32), mtf.cast(k, tf.float32)]

  y, z, yb, k = mtu.run_program(
    build, "rows:2;cols:2", "batch:rows;hidden:cols"
  )
  np.testing.assert_allclose(y, X @ W, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(z, X @ W2, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(yb, X @ W, rtol=3e-2, atol=3e-2)
  np.testing.assert_allclose(k, W, rtol=1e-2, atol=1e-2)


def test_dense_errors():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, [BATCH, D_MODEL])
  with pytest.raises(ValueError, match="reduced dimension.*hidden"):
    mtf.layers.dense(x, VOCAB, reduced_dims=[HIDDEN])
  with pytest.raises(ValueError, match="reduced dimension.*d_model.*5"):
    mtf.layers.dense(x, VOCAB, reduced_dims=[mtf.Dimension("d_model", 5)])
  with pytest.raises(ValueError, match="new dimension.*batch"):
    mtf.layers.dense(x, BATCH, reduced_dims=[D_MODEL])
  assert not graph.all_variables


# ----------------------------------------------------------------------------
# dense_product.


def test_dense_product_glu_and_named_activations():
  def build(mesh):
    x = mtf.import_tf_tensor(mesh, X, [BATCH, D_MODEL])
    init = tf.constant_initializer(W)
    glu = mtf.layers.dense_product(
      x,
      [D_MODEL],
      [HIDDEN],
      ["linear", "sigmoid"],
      name="glu",
      use_bias=False,
      kernel_initializer=init,
    )
    single = mtf.layers.dense_product(
      x, [D_MODEL], [HIDDEN], "relu", use_bias=False, kernel_initializer=init
    )
    trio = mtf.layers.dense_product(
      x,
      [D_MODEL],
      [HIDDEN],
      [None, mtf.tanh, "gelu"],
      name="trio",
      use_bias=False,
      kernel_initializer=init,
    )
    names = [v.name for v in mesh.graph.all_variables]
    assert names == [
      "glu_0/kernel",
      "glu_1/kernel",
      "dense_product/kernel",
      "trio_0/kernel",
      "trio_1/kernel",
      "trio_2/kernel",
    ]
    [dx] = mtf.gradients([mtf.reduce_sum(glu)], [x])
    return [glu, single, trio, dx]

  h = X @ W
  sig = 1 / (1 + np.exp(-h))
  gelu = 0.5 * h * (1 + np.tanh(0.7978845608028654 * (h + 0.044715 * h**3)))
  dx = (sig + h * sig * (1 - sig)) @ W.T
  expected = [h * sig, np.maximum(h, 0), h * np.tanh(h) * gelu, dx]
  for mesh_shape, layout in [
    ("", ""),
    ("rows:2;cols:2", "batch:rows;hidden:cols"),
  ]:
    got = mtu.run_program(build, mesh_shape, layout)
    mtu.assert_all_close(got, expected, msg=layout)


def test_dense_product_unknown_activation():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, [BATCH, D_MODEL])
  with pytest.raises(ValueError, match="no_such_activation"):
    mtf.layers.dense_product(
      x, [D_MODEL], [HIDDEN], ["linear", "no_such_activation"]
    )
  with pytest.raises(ValueError, match="callable"):
    mtf.layers.dense_product(x, [D_MODEL], [HIDDEN], [3])
  assert not graph.all_variables


# ----------------------------------------------------------------------------
# Unit scaling and initializers.


@pytest.fixture
def unit_scaling():
  gin.bind_parameter(
    "mesh_tensorflow.layers.unit_scaling_convention.value", True
  )
  try:
    yield
  finally:
    gin.bind_parameter(
      "mesh_tensorflow.layers.unit_scaling_convention.value", False
    )


def test_us_einsum_without_unit_scaling():
  assert mtf.layers.unit_scaling_convention() is False

  def build(mesh):
    x = mtf.import_tf_tensor(mesh, X, [BATCH, D_MODEL])
    w = mtf.import_tf_tensor(mesh, W, [D_MODEL, HIDDEN])
    return [mtf.layers.us_einsum([x, w], mtf.Shape([BATCH, HIDDEN]))]

  [y] = mtu.run_program(build, "all:4", "d_model:all")
  np.testing.assert_allclose(y, X @ W, rtol=1e-5, atol=1e-5)


# pylint: disable-next=redefined-outer-name,unused-argument
def test_unit_scaling_convention(unit_scaling):
  assert mtf.layers.unit_scaling_convention() is True

  def build(mesh):
    x = mtf.import_tf_tensor(mesh, X, [BATCH, D_MODEL])
    w = mtf.import_tf_tensor(mesh, W, [D_MODEL, HIDDEN])
    y = mtf.layers.us_einsum([x, w], mtf.Shape([BATCH, HIDDEN]))
    z = mtf.layers.dense(
      x,
      HIDDEN,
      reduced_dims=[D_MODEL],
      use_bias=False,
      kernel_initializer=tf.constant_initializer(W),
    )
    return [y, z]

  y, z = mtu.run_program(build, "rows:2;cols:2", "d_model:rows;hidden:cols")
  np.testing.assert_allclose(y, X @ W / np.sqrt(8), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(z, X @ W / np.sqrt(8), rtol=1e-5, atol=1e-5)
  init = mtf.layers.VarianceScalingInitializer(scale=4.0)
  big = mtf.Dimension("big", 128)
  vals = init([big], [mtf.Dimension("o", 256)])([128, 256]).numpy()
  np.testing.assert_allclose(vals.std(), 2.0 * 0.87962566, rtol=0.05)
  for mode in ("fan_out", "fan_avg"):
    with pytest.raises(ValueError, match="unit scaling.*fan_in.*%s" % mode):
      mtf.layers.VarianceScalingInitializer(mode=mode)([big], [big])


# Std of a standard normal truncated at +-2 standard deviations.
_TRUNCATED_STD = 0.87962566


@pytest.mark.parametrize("mode", ["fan_in", "fan_out", "fan_avg"])
@pytest.mark.parametrize("distribution", ["normal", "uniform"])
def test_variance_scaling_statistics(mode, distribution):
  reduced = [mtf.Dimension("a", 64), mtf.Dimension("b", 4)]  # fan_in 256
  new = [mtf.Dimension("c", 64)]  # fan_out 64
  n = {"fan_in": 256.0, "fan_out": 64.0, "fan_avg": 160.0}[mode]
  init = mtf.layers.VarianceScalingInitializer(
    scale=2.0, mode=mode.upper(), distribution=distribution
  )
  tf.random.set_seed(1)
  vals = init(reduced, new)([64, 4, 64], dtype=tf.float32).numpy()
  target = np.sqrt(2.0 / n)
  if distribution == "normal":
    np.testing.assert_allclose(vals.std(), target * _TRUNCATED_STD, rtol=0.04)
    assert np.abs(vals).max() <= 2.0 * target + 1e-6
  else:
    limit = target * np.sqrt(3.0)
    np.testing.assert_allclose(vals.std(), target, rtol=0.04)
    assert np.abs(vals).max() <= limit
    assert np.abs(vals).max() > 0.95 * limit
  assert abs(vals.mean()) < 0.05 * target


def test_dense_default_initializer_is_variance_scaling_fan_in():
  d_in = mtf.Dimension("d_in", 256)
  d_out = mtf.Dimension("d_out", 128)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  with mtf.variable_store(mtf.VariableStore()):
    mtf.layers.dense(mtf.zeros(mesh, [BATCH, d_in]), d_out, reduced_dims=[d_in])
    kernel = graph.name_to_variable["dense/kernel"].master.numpy()
    bias = graph.name_to_variable["dense_1/bias"].master.numpy()
  np.testing.assert_allclose(kernel.std(), _TRUNCATED_STD / 16.0, rtol=0.05)
  np.testing.assert_array_equal(bias, np.zeros(128, np.float32))


def test_initializer_errors_and_base_class():
  with pytest.raises(ValueError, match="mode 'fan_sideways'"):
    mtf.layers.VarianceScalingInitializer(mode="fan_sideways")
  with pytest.raises(ValueError, match="distribution 'cauchy'"):
    mtf.layers.VarianceScalingInitializer(distribution="cauchy")
  with pytest.raises(NotImplementedError):
    mtf.layers.DenseInitializer()([D_MODEL], [HIDDEN])
  assert issubclass(
    mtf.layers.VarianceScalingInitializer, mtf.layers.DenseInitializer
  )


def test_variance_scaling_initializer_is_gin_configurable():
  gin.parse_config(
    "mesh_tensorflow.layers.VarianceScalingInitializer.scale = 3.0\n"
    "mesh_tensorflow.layers.VarianceScalingInitializer.mode = 'fan_out'"
  )
  try:
    init = mtf.layers.VarianceScalingInitializer()
    assert (init.scale, init.mode, init.distribution) == (
      3.0,
      "fan_out",
      "normal",
    )
  finally:
    gin.clear_config()
  assert mtf.layers.VarianceScalingInitializer().scale == 1.0


# ----------------------------------------------------------------------------
# dense_relu_dense.


def _drd_program(is_training, dropout):
  def build(mesh):
    x = mtf.import_tf_tensor(mesh, X, [BATCH, D_MODEL])
    y = mtf.layers.dense_relu_dense(
      x, HIDDEN, is_training, dropout=dropout, dropout_broadcast_dims=[BATCH]
    )
    wi = _var(mesh.graph, "dense_relu_dense/wi/kernel")
    wo = _var(mesh.graph, "dense_relu_dense/wo/kernel")
    dx, dwi = mtf.gradients([mtf.reduce_sum(y * y)], [x, wi])
    return [y, dx, dwi, wi, wo]

  return build


def _drd_reference(wi, wo):
  x = tf.constant(X)
  wi_v = tf.Variable(wi)
  with tf.GradientTape() as tape:
    tape.watch(x)
    y = tf.matmul(tf.nn.relu(tf.matmul(x, wi_v)), wo)
    loss = tf.reduce_sum(y * y)
  dx, dwi = tape.gradient(loss, [x, wi_v])
  return [y.numpy(), dx.numpy(), dwi.numpy()]


@meshes.parametrize(
  [
    ("", ""),
    ("rows:2;cols:2", "batch:rows;hidden:cols"),
    ("rows:2;cols:2", "d_model:rows;hidden:cols"),
  ]
)
def test_dense_relu_dense_eval_is_deterministic(mesh_shape, layout):
  build = _drd_program(is_training=False, dropout=0.5)
  y, dx, dwi, wi, wo = mtu.run_program(build, mesh_shape, layout)
  assert wi.shape == (8, 4) and wo.shape == (4, 8)
  mtu.assert_all_close([y, dx, dwi], _drd_reference(wi, wo), msg=layout)


def test_dense_relu_dense_training_dropout():
  build = _drd_program(is_training=True, dropout=0.5)
  y, _, _, wi, wo = mtu.run_program(
    build, "rows:2;cols:2", "batch:rows;hidden:cols"
  )
  h = np.maximum(X @ wi, 0.0)
  # The mask is shared along batch: each hidden unit is kept (x2) or dropped.
  matches = []
  for mask in range(16):
    m = np.array([(mask >> i) & 1 for i in range(4)], np.float32) * 2.0
    if np.allclose(y, (h * m) @ wo, rtol=1e-4, atol=1e-4):
      matches.append(mask)
  assert matches


def test_dense_relu_dense_names():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  with mtf.variable_store(mtf.VariableStore()):
    x = mtf.zeros(mesh, [BATCH, LENGTH, D_MODEL])
    y = mtf.layers.dense_relu_dense(x, HIDDEN, False)
    mtf.layers.dense_relu_dense(x, HIDDEN, False, name="ffn")
  assert y.shape == x.shape
  assert [(v.name, v.shape.dimension_names) for v in graph.all_variables] == [
    ("dense_relu_dense/wi/kernel", ["d_model", "hidden"]),
    ("dense_relu_dense/wo/kernel", ["hidden", "d_model"]),
    ("ffn/wi/kernel", ["d_model", "hidden"]),
    ("ffn/wo/kernel", ["hidden", "d_model"]),
  ]


# ----------------------------------------------------------------------------
# Embedding.


def _embedding_program(mesh):
  ids = mtf.import_tf_tensor(mesh, IDS, [BATCH, LENGTH])
  y = mtf.layers.embedding(
    ids, VOCAB, D_MODEL, mtf.VariableDType(tf.float32), name="emb"
  )
  w = _var(mesh.graph, "emb")
  c = mtf.import_tf_tensor(mesh, _EMB_C, [BATCH, LENGTH, D_MODEL])
  [dw] = mtf.gradients([mtf.reduce_sum(y * c)], [w])
  return [y, dw, w]


_EMB_C = np.arange(64, dtype=np.float32).reshape(4, 2, 8)


@meshes.parametrize(
  [
    ("", ""),
    ("all:4", "vocab:all"),
    ("rows:2;cols:2", "vocab:rows;d_model:cols"),
    ("rows:2;cols:2", "batch:rows;vocab:cols"),
  ]
)
def test_embedding_values_and_gradient(mesh_shape, layout):
  y, dw, w = mtu.run_program(_embedding_program, mesh_shape, layout)
  expected_dw = np.zeros((8, 8), np.float32)
  np.add.at(expected_dw, IDS.reshape(-1), _EMB_C.reshape(-1, 8))
  mtu.assert_all_close([y, dw], [w[IDS], expected_dw], msg=layout)


def test_embedding_weights_shapes_and_default_initializer():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  big_vocab = mtf.Dimension("vocab", 512)
  d = mtf.Dimension("d", 64)
  with mtf.variable_store(mtf.VariableStore()):
    w = mtf.layers.embedding_weights(mesh, big_vocab, d, tf.float32)
    with tf1.variable_scope("shared"):
      e = mtf.layers.embedding_weights(
        mesh,
        VOCAB,
        D_MODEL,
        mtf.VariableDType(tf.float32),
        name="ens",
        ensemble_dim=EXPERTS,
        initializer=tf.zeros_initializer(),
      )
    master = graph.name_to_variable["embedding"].master.numpy()
  assert w.shape == mtf.Shape([big_vocab, d])
  assert e.shape == mtf.Shape([EXPERTS, VOCAB, D_MODEL])
  assert [v.name for v in graph.all_variables] == ["embedding", "shared/ens"]
  np.testing.assert_allclose(master.std(), 1.0, rtol=0.05)
  ids = mtf.zeros(mesh, [BATCH], dtype=tf.int32)
  with pytest.raises(ValueError, match="integers"):
    mtf.layers.embedding(mtf.zeros(mesh, [BATCH]), VOCAB, D_MODEL, tf.float32)
  with pytest.raises(ValueError, match="vocab"):
    mtf.layers.embedding(
      mtf.zeros(mesh, [BATCH, VOCAB], dtype=tf.int32),
      VOCAB,
      D_MODEL,
      tf.float32,
    )
  del ids


# ----------------------------------------------------------------------------
# Signatures (names, order, defaults as in the original).


def _params(fn):
  return [
    (p.name, p.default) for p in inspect.signature(fn).parameters.values()
  ]


_E = inspect.Parameter.empty


def test_signatures():
  assert _params(mtf.layers.dense) == [
    ("x", _E),
    ("new_dims", _E),
    ("reduced_dims", None),
    ("expert_dims", None),
    ("use_bias", True),
    ("activation", None),
    ("master_dtype", tf.float32),
    ("slice_dtype", tf.float32),
    ("variable_dtype", None),
    ("kernel_initializer", None),
    ("kernel_weights", None),
    ("name", None),
  ]
  assert _params(mtf.layers.get_dense_kernel_weights) == [
    ("x", _E),
    ("new_dims", _E),
    ("reduced_dims", _E),
    ("expert_dims", _E),
    ("kernel_initializer", _E),
    ("name", None),
    ("variable_dtype", None),
    ("master_dtype", tf.float32),
    ("slice_dtype", tf.float32),
  ]
  assert _params(mtf.layers.dense_product) == [
    ("x", _E),
    ("reduced_dims", _E),
    ("new_dims", _E),
    ("activation_functions", None),
    ("name", "dense_product"),
    ("kwargs", _E),
  ]
  assert _params(mtf.layers.unit_scaling_convention) == [("value", False)]
  assert _params(mtf.layers.us_einsum) == [
    ("xs", _E),
    ("args", _E),
    ("kwargs", _E),
  ]
  assert _params(mtf.layers.VarianceScalingInitializer.__init__)[1:] == [
    ("scale", 1.0),
    ("mode", "fan_in"),
    ("distribution", "normal"),
  ]
  assert _params(mtf.layers.DenseInitializer.__call__) == [
    ("self", _E),
    ("reduced_dims", _E),
    ("new_dims", _E),
  ]
  assert _params(mtf.layers.dense_relu_dense) == [
    ("x", _E),
    ("hidden_channels", _E),
    ("is_training", _E),
    ("dropout", 0.0),
    ("dropout_broadcast_dims", None),
    ("master_dtype", tf.float32),
    ("slice_dtype", tf.float32),
    ("name", None),
  ]
  assert _params(mtf.layers.embedding_weights) == [
    ("mesh", _E),
    ("vocab_dim", _E),
    ("output_dim", _E),
    ("variable_dtype", _E),
    ("name", "embedding"),
    ("ensemble_dim", None),
    ("initializer", None),
  ]
  assert _params(mtf.layers.embedding) == [
    ("indices", _E),
    ("vocab_dim", _E),
    ("output_dim", _E),
    ("variable_dtype", _E),
    ("name", "embedding"),
  ]
