"""Tests for mesh_tensorflow._src.ops.elementwise and mtf.slicewise.

Every elementwise function is run on the 1-device mesh, the 4-device 1-d mesh
and the 2x2 mesh under several layouts; values and gradients are compared with
numpy / tf.GradientTape.
"""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow._src.ops import slicewise as slicewise_lib
from tests import mesh_test_util as mtu
from tests import meshes

BATCH = mtf.Dimension("batch", 4)
HIDDEN = mtf.Dimension("hidden", 8)
SHAPE = [BATCH, HIDDEN]


_RNG = np.random.RandomState(0)
X_ANY = _RNG.uniform(-2.0, 2.0, size=(4, 8)).astype(np.float32)
# Keep |x| away from 0 (kinks of relu/sign, poles of reciprocal).
X_ANY = np.where(np.abs(X_ANY) < 0.1, X_ANY + 0.3, X_ANY).astype(np.float32)
X_POS = _RNG.uniform(0.2, 3.0, size=(4, 8)).astype(np.float32)
W = _RNG.uniform(-1.0, 1.0, size=(4, 8)).astype(np.float32)


def _gelu_tf(x):
  return x * 0.5 * (1.0 + tf.tanh(0.7978845608028654 * (x + 0.044715 * x**3)))


# name -> (mtf fn, tf reference fn, input)
UNARY_CASES = {
  "identity": (mtf.identity, tf.identity, X_ANY),
  "sin": (mtf.sin, tf.sin, X_ANY),
  "cos": (mtf.cos, tf.cos, X_ANY),
  "square": (mtf.square, tf.square, X_ANY),
  "sqrt": (mtf.sqrt, tf.sqrt, X_POS),
  "rsqrt": (mtf.rsqrt, tf.math.rsqrt, X_POS),
  "log": (mtf.log, tf.math.log, X_POS),
  "exp": (mtf.exp, tf.exp, X_ANY),
  "sigmoid": (mtf.sigmoid, tf.sigmoid, X_ANY),
  "tanh": (mtf.tanh, tf.tanh, X_ANY),
  "negative": (mtf.negative, tf.negative, X_ANY),
  "reciprocal": (mtf.reciprocal, tf.math.reciprocal, X_ANY),
  "relu": (mtf.relu, tf.nn.relu, X_ANY),
  "leaky_relu": (
    mtf.leaky_relu,
    lambda t: tf.nn.leaky_relu(t, alpha=0.2),
    X_ANY,
  ),
  "leaky_relu_0.05": (
    lambda t: mtf.leaky_relu(t, alpha=0.05),
    lambda t: tf.nn.leaky_relu(t, alpha=0.05),
    X_ANY,
  ),
  "elu": (mtf.elu, tf.nn.elu, X_ANY),
  "selu": (mtf.selu, tf.nn.selu, X_ANY),
  "softplus": (mtf.softplus, tf.math.softplus, X_ANY),
  "swish": (mtf.swish, lambda t: t * tf.sigmoid(t), X_ANY),
  "gelu": (mtf.gelu, _gelu_tf, X_ANY),
  "mtf_abs": (mtf.mtf_abs, tf.abs, X_ANY),
  "abs": (mtf.abs, tf.abs, X_ANY),
  "mtf_pow": (lambda t: mtf.mtf_pow(t, 2.5), lambda t: tf.pow(t, 2.5), X_POS),
  "pow": (lambda t: mtf.pow(t, 0.5), tf.sqrt, X_POS),
  "stop_gradient_product": (
    lambda t: t * mtf.stop_gradient(t),
    lambda t: t * tf.stop_gradient(t),
    X_ANY,
  ),
  "cast_float64": (
    lambda t: mtf.cast(mtf.cast(t, tf.float64), tf.float32),
    lambda t: tf.cast(tf.cast(t, tf.float64), tf.float32),
    X_ANY,
  ),
  "to_float_of_bfloat16": (
    lambda t: mtf.to_float(mtf.to_bfloat16(t)),
    lambda t: tf.cast(tf.cast(t, tf.bfloat16), tf.float32),
    X_ANY,
  ),
}


def _reference(tf_fn, x):
  """(value, d sum(f(x) * W) / dx) with tf.GradientTape."""
  x = tf.constant(x)
  with tf.GradientTape() as tape:
    tape.watch(x)
    y = tf_fn(x)
    loss = tf.reduce_sum(y * W)
  return y.numpy(), tape.gradient(loss, x).numpy()


def _value_and_grad_program(mtf_fn, x_value):
  def build(mesh):
    x = mtf.import_tf_tensor(mesh, x_value, SHAPE)
    y = mtf_fn(x)
    w = mtf.import_tf_tensor(mesh, W, SHAPE)
    loss = mtf.reduce_sum(y * w)
    [dx] = mtf.gradients([loss], [x])
    return [y, dx]

  return build


@meshes.parametrize(meshes.ELEMENTWISE_OPS, "mesh_layout")
@pytest.mark.parametrize("case", sorted(UNARY_CASES))
def test_unary_values_and_gradients(case, mesh_layout):
  mtf_fn, tf_fn, x_value = UNARY_CASES[case]
  y, dx = mtu.run_program(
    _value_and_grad_program(mtf_fn, x_value), *mesh_layout
  )
  want_y, want_dx = _reference(tf_fn, x_value)
  np.testing.assert_allclose(y, want_y, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(dx, want_dx, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", mtu.MODES)
@pytest.mark.parametrize("case", ["tanh", "softplus"])
def test_unary_three_modes(case, mode):
  mtf_fn, tf_fn, x_value = UNARY_CASES[case]
  y, dx = mtu.run_program(
    _value_and_grad_program(mtf_fn, x_value),
    "rows:2;cols:2",
    "batch:rows;hidden:cols",
    mode,
  )
  want_y, want_dx = _reference(tf_fn, x_value)
  np.testing.assert_allclose(y, want_y, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(dx, want_dx, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("fn", [mtf.elu, mtf.selu, mtf.softplus])
def test_elu_selu_softplus_use_generic_gradient(fn):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.import_tf_tensor(mesh, X_ANY, SHAPE)
  y = fn(x)
  assert isinstance(y.operation, mtf.SlicewiseOperation)
  mtf.gradients([mtf.reduce_sum(y)], [x])
  generic = [
    op for op in graph.operations if isinstance(op, mtf.GenericGradOperation)
  ]
  assert len(generic) == 1
  # The generic gradient keeps the forward op's splittability.
  assert generic[0].splittable_dims == y.operation.splittable_dims
  assert generic[0].splittable_dims == frozenset(["batch", "hidden"])


@pytest.mark.parametrize("fn", [mtf.sin, mtf.exp, mtf.relu, mtf.tanh])
def test_hand_written_gradients_are_not_generic(fn):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.import_tf_tensor(mesh, X_POS, SHAPE)
  mtf.gradients([mtf.reduce_sum(fn(x))], [x])
  assert not any(
    isinstance(op, mtf.GenericGradOperation) for op in graph.operations
  )


def test_default_names():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.import_tf_tensor(mesh, X_POS, SHAPE)
  for fn, name in [
    (mtf.identity, "identity"),
    (mtf.sin, "sin"),
    (mtf.cos, "cos"),
    (mtf.square, "square"),
    (mtf.sqrt, "sqrt"),
    (mtf.rsqrt, "rsqrt"),
    (mtf.log, "log"),
    (mtf.exp, "exp"),
    (mtf.sigmoid, "sigmoid"),
    (mtf.tanh, "tanh"),
    (mtf.negative, "negative"),
    (mtf.reciprocal, "reciprocal"),
    (mtf.relu, "relu"),
    (mtf.leaky_relu, "leaky_relu"),
    (mtf.sign, "sign"),
    (mtf.elu, "elu"),
    (mtf.selu, "selu"),
    (mtf.softplus, "softplus"),
  ]:
    assert fn(x).operation.name == name
  assert mtf.sin(x, name="my_sin").operation.name == "my_sin"
  assert mtf.cast(x, tf.int32).operation.name == "cast"
  assert mtf.to_int32(x).operation.name == "to_int32"
  assert mtf.to_bfloat16(x).operation.name == "to_bfloat16"


@meshes.parametrize(meshes.ELEMENTWISE_OPS, "mesh_layout")
def test_sign_values_and_no_gradient(mesh_layout):
  x_value = X_ANY.copy()
  x_value[0, 0] = 0.0

  def build(mesh):
    x = mtf.import_tf_tensor(mesh, x_value, SHAPE)
    y = mtf.sign(x)
    assert not y.operation.has_gradient
    assert mtf.gradients([mtf.reduce_sum(y)], [x]) == [None]
    return [y]

  [y] = mtu.run_program(build, *mesh_layout)
  np.testing.assert_array_equal(y, np.sign(x_value))


@meshes.parametrize(meshes.ELEMENTWISE_OPS, "mesh_layout")
def test_cast_values_and_dtypes(mesh_layout):
  x_value = X_ANY * 3.0
  ints = np.arange(32, dtype=np.int32).reshape(4, 8) - 10

  def build(mesh):
    x = mtf.import_tf_tensor(mesh, x_value, SHAPE)
    i = mtf.import_tf_tensor(mesh, ints, SHAPE)
    as_int = mtf.cast(x, tf.int32)
    as_bf16 = mtf.to_bfloat16(x)
    as_float = mtf.to_float(i)
    to_int = mtf.to_int32(x)
    as_bool = mtf.cast(i, tf.bool)
    assert as_int.dtype == tf.int32
    assert as_bf16.dtype == tf.bfloat16
    assert as_float.dtype == tf.float32
    assert to_int.dtype == tf.int32
    assert as_bool.dtype == tf.bool
    return [
      as_int,
      as_bf16,
      as_float,
      to_int,
      as_bool,
      mtf.logical_not(as_bool),
    ]

  as_int, as_bf16, as_float, to_int, as_bool, not_bool = mtu.run_program(
    build, *mesh_layout
  )
  np.testing.assert_array_equal(as_int, np.trunc(x_value).astype(np.int32))
  np.testing.assert_array_equal(to_int, np.trunc(x_value).astype(np.int32))
  assert as_int.dtype == np.int32
  np.testing.assert_array_equal(
    np.asarray(as_bf16, np.float32),
    tf.cast(tf.cast(x_value, tf.bfloat16), tf.float32).numpy(),
  )
  np.testing.assert_array_equal(as_float, ints.astype(np.float32))
  assert as_float.dtype == np.float32
  np.testing.assert_array_equal(as_bool, ints != 0)
  np.testing.assert_array_equal(not_bool, ints == 0)


def test_cast_to_same_dtype_is_identity():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.import_tf_tensor(mesh, X_ANY, SHAPE)
  n = len(graph.operations)
  assert mtf.cast(x, tf.float32) is x
  assert mtf.to_float(x) is x
  assert mtf.cast(x, "float32") is x
  assert len(graph.operations) == n


def test_cast_gradient_is_cast_back():
  def build(mesh):
    x = mtf.import_tf_tensor(mesh, X_ANY, SHAPE)
    y = mtf.to_bfloat16(x)
    loss = mtf.reduce_sum(
      mtf.to_float(y * mtf.to_bfloat16(mtf.import_tf_tensor(mesh, W, SHAPE)))
    )
    [dx] = mtf.gradients([loss], [x])
    assert dx.dtype == tf.float32
    return [dx]

  [dx] = mtu.run_program(build, "rows:2;cols:2", "batch:rows;hidden:cols")
  want = tf.cast(tf.cast(W, tf.bfloat16), tf.float32).numpy()
  np.testing.assert_allclose(dx, want, rtol=1e-2)


def test_stop_gradient_has_no_gradient():
  def build(mesh):
    x = mtf.import_tf_tensor(mesh, X_ANY, SHAPE)
    y = mtf.stop_gradient(x)
    assert isinstance(y.operation, mtf.StopGradient)
    assert not y.operation.has_gradient
    assert mtf.gradients([mtf.reduce_sum(mtf.exp(y))], [x]) == [None]
    return [y]

  [y] = mtu.run_program(build, "all:4", "hidden:all")
  np.testing.assert_array_equal(y, X_ANY)


def test_operators_on_bfloat16():
  def build(mesh):
    x = mtf.to_bfloat16(mtf.import_tf_tensor(mesh, X_ANY, SHAPE))
    return [mtf.to_float(mtf.relu(x) * 2.0 + mtf.sigmoid(x))]

  [y] = mtu.run_program(build, "rows:2;cols:2", "hidden:rows")
  xb = tf.cast(tf.cast(X_ANY, tf.bfloat16), tf.float32).numpy()
  np.testing.assert_allclose(
    y, np.maximum(xb, 0) * 2 + 1 / (1 + np.exp(-xb)), rtol=2e-2, atol=2e-2
  )


# mtf.slicewise: multiple outputs, forbidden splits.


def _two_outputs_program(mesh, x_value):
  x = mtf.import_tf_tensor(mesh, x_value, SHAPE)
  y_float, y_int = mtf.slicewise(
    lambda t: (tf.sin(t) * 2.0, tf.cast(t > 0, tf.int32)),
    [x],
    output_dtype=[tf.float32, tf.int32],
    splittable_dims=SHAPE,
    name="two_outputs",
  )
  return x, y_float, y_int


@meshes.parametrize(meshes.ELEMENTWISE_OPS, "mesh_layout")
def test_slicewise_multiple_outputs(mesh_layout):
  def build(mesh):
    x, y_float, y_int = _two_outputs_program(mesh, X_ANY)
    assert y_float.dtype == tf.float32 and y_int.dtype == tf.int32
    assert y_float.shape == x.shape and y_int.shape == x.shape
    assert y_float.operation is y_int.operation
    assert y_int.name == "two_outputs:1"
    [dx] = mtf.gradients([mtf.reduce_sum(y_float)], [x])
    return [y_float, y_int, dx]

  y_float, y_int, dx = mtu.run_program(build, *mesh_layout)
  np.testing.assert_allclose(y_float, np.sin(X_ANY) * 2.0, rtol=1e-5)
  np.testing.assert_array_equal(y_int, (X_ANY > 0).astype(np.int32))
  np.testing.assert_allclose(dx, np.cos(X_ANY) * 2.0, rtol=1e-5, atol=1e-6)


@meshes.parametrize(meshes.ELEMENTWISE_OPS, "mesh_layout")
def test_slicewise_two_float_outputs_generic_gradient(mesh_layout):
  w2 = W[::-1].copy()

  def build(mesh):
    x = mtf.import_tf_tensor(mesh, X_ANY, SHAPE)
    s, c = mtf.slicewise(
      lambda t: (tf.sin(t), tf.cos(t)),
      [x],
      output_dtype=[tf.float32, tf.float32],
      output_shape=[x.shape, x.shape],
      splittable_dims=SHAPE,
    )
    loss = mtf.reduce_sum(
      s * mtf.import_tf_tensor(mesh, W, SHAPE)
    ) + mtf.reduce_sum(c * mtf.import_tf_tensor(mesh, w2, SHAPE))
    (grad_both,) = mtf.gradients([loss], [x])
    (grad_cos_only,) = mtf.gradients([mtf.reduce_sum(c)], [x])
    return [s, c, grad_both, grad_cos_only]

  s, c, grad_both, grad_cos_only = mtu.run_program(build, *mesh_layout)
  np.testing.assert_allclose(s, np.sin(X_ANY), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(c, np.cos(X_ANY), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(
    grad_both, np.cos(X_ANY) * W - np.sin(X_ANY) * w2, rtol=1e-5, atol=1e-5
  )
  np.testing.assert_allclose(
    grad_cos_only, -np.sin(X_ANY), rtol=1e-5, atol=1e-6
  )


def _cumsum_program(mesh):
  x = mtf.import_tf_tensor(mesh, X_ANY, SHAPE)
  y = mtf.slicewise(
    lambda t: tf.cumsum(t, axis=1),
    [x],
    splittable_dims=[BATCH],
    name="cumsum_hidden",
  )
  total = mtf.slicewise(
    lambda t: tf.reduce_sum(t, axis=1),
    [x],
    output_shape=[BATCH],
    splittable_dims=["batch"],
  )
  [dx] = mtf.gradients(
    [mtf.reduce_sum(y * mtf.import_tf_tensor(mesh, W, SHAPE))], [x]
  )
  return [y, total, dx]


@meshes.parametrize(
  [
    ("", ""),
    ("all:4", "batch:all"),
    ("rows:2;cols:2", "batch:rows"),
    ("rows:2;cols:2", "batch:cols"),
  ],
  "mesh_layout",
)
def test_slicewise_with_unsplittable_dim(mesh_layout):
  y, total, dx = mtu.run_program(_cumsum_program, *mesh_layout)
  np.testing.assert_allclose(y, np.cumsum(X_ANY, axis=1), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(total, X_ANY.sum(axis=1), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(
    dx, np.cumsum(W[:, ::-1], axis=1)[:, ::-1], rtol=1e-5, atol=1e-5
  )


@meshes.parametrize(
  [
    ("all:4", "hidden:all"),
    ("rows:2;cols:2", "hidden:cols"),
    ("rows:2;cols:2", "batch:rows;hidden:cols"),
  ],
  "mesh_layout",
)
def test_slicewise_forbidden_split_raises_naming_dim(mesh_layout):
  mesh_dim = mesh_layout[1].split("hidden:")[1]
  with pytest.raises(ValueError, match="'hidden'.*'%s'" % mesh_dim):
    mtu.run_program(_cumsum_program, *mesh_layout)


def test_slicewise_splittable_dims_bookkeeping():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.import_tf_tensor(mesh, X_ANY, SHAPE)
  y = mtf.slicewise(tf.identity, [x], splittable_dims=[BATCH])
  assert y.operation.splittable_dims == frozenset(["batch"])
  assert y.operation.unsplittable_dims == frozenset(["hidden"])
  z = mtf.cwise(tf.identity, [x])
  assert z.operation.splittable_dims == frozenset(["batch", "hidden"])
  assert z.operation.unsplittable_dims == frozenset()
  nothing = mtf.slicewise(tf.identity, [x])
  assert nothing.operation.splittable_dims == frozenset()


def test_slicewise_grad_function_zero_means_no_gradient():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.import_tf_tensor(mesh, X_ANY, SHAPE)
  y = mtf.cwise(tf.sin, [x], grad_function=0)
  assert not y.operation.has_gradient
  assert mtf.gradients([mtf.reduce_sum(y)], [x]) == [None]


def test_check_splits_allowed_directly():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.import_tf_tensor(mesh, X_ANY, SHAPE)
  y = mtf.identity(x)
  lowering = mtf.Lowering(
    graph, {mesh: mtu.mesh_impl_for("rows:2;cols:2", "batch:rows;hidden:cols")}
  )
  slicewise_lib.check_splits_allowed(
    y.operation, lowering, [x], ["batch", "hidden"]
  )
  with pytest.raises(ValueError, match="'batch'.*'rows'"):
    slicewise_lib.check_splits_allowed(y.operation, lowering, [x], ["hidden"])
