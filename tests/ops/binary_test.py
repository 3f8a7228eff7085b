"""Tests for mesh_tensorflow._src.ops.binary: broadcasting binary operations."""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow._src.ops import broadcast_binary
from tests import mesh_test_util as mtu
from tests import meshes

A = mtf.Dimension("a", 4)
B = mtf.Dimension("b", 8)
C = mtf.Dimension("c", 2)


_RNG = np.random.RandomState(1)
X_AB = _RNG.randn(4, 8).astype(np.float32)
Y_AB = _RNG.randn(4, 8).astype(np.float32)
Y_B = _RNG.randn(8).astype(np.float32)
Y_BA = _RNG.randn(8, 4).astype(np.float32)
Y_CB = _RNG.randn(2, 8).astype(np.float32)


def _imp(mesh, value, dims, dtype=None):
  if dtype is not None:
    value = np.asarray(value).astype(dtype)
  return mtf.import_tf_tensor(mesh, value, dims)


# The output-shape rule.


def test_infer_binary_broadcast_shape_rule():
  infer = mtf.ops._infer_binary_broadcast_shape  # pylint: disable=protected-access
  s = mtf.Shape
  # Explicit output shape wins.
  assert infer(s([A]), s([B]), s([B, A])) == s([B, A])
  assert infer(s([A]), s([B]), [B, A]) == s([B, A])
  # One a subsequence of the other: the longer.
  assert infer(s([A]), s([A, B])) == s([A, B])
  assert infer(s([A, B]), s([B])) == s([A, B])
  assert infer(s([A, C]), s([A, B, C])) == s([A, B, C])
  assert infer(s([]), s([A, B])) == s([A, B])
  assert infer(s([A, B]), s([A, B])) == s([A, B])
  # Otherwise shape1 followed by the new dims of shape2.
  assert infer(s([A, C]), s([B, C])) == s([A, C, B])
  assert infer(s([B, A]), s([A, B])) == s([B, A])
  assert infer(s([A, B]), s([B, A])) == s([A, B])
  assert infer(s([C, A]), s([A, B])) == s([C, A, B])
  # Same name, different size: ValueError naming the dimension.
  with pytest.raises(ValueError, match="'a'"):
    infer(s([A, C]), s([mtf.Dimension("a", 5), B]))


# Values on every mesh and layout.


def _arith_program(mesh):
  x = _imp(mesh, X_AB, [A, B])
  y = _imp(mesh, Y_AB, [A, B])
  yb = _imp(mesh, Y_B, [B])
  yba = _imp(mesh, Y_BA, [B, A])
  ycb = _imp(mesh, Y_CB, [C, B])
  outs = [
    mtf.add(x, y),
    mtf.sub(x, yb),
    mtf.multiply(x, yba),
    mtf.divide(x, yb + 3.0),
    mtf.minimum(x, y),
    mtf.maximum(yb, x),
    mtf.add(x, ycb),
    mtf.multiply(ycb, x),
    mtf.add(yba, x),
    mtf.add(yb, x, output_shape=[B, A]),
    mtf.multiply(x, yb, output_shape=[B, A]),
    mtf.minimum(x, yb, output_shape=[B, A]),
    mtf.add(x, 1.5),
    mtf.add(2.5, x),
    mtf.sub(x, 1.0),
    mtf.sub(3.0, x),
    mtf.multiply(x, 3.0),
    mtf.multiply(-2.0, x),
    mtf.divide(x, 4.0),
    mtf.divide(2.0, yb + 3.0),
    mtf.minimum(x, 0.5),
    mtf.maximum(-0.5, x),
  ]
  return outs


def _arith_expected():
  x, y, yb, yba, ycb = X_AB, Y_AB, Y_B, Y_BA, Y_CB
  return [
    x + y,
    x - yb,
    x * yba.T,
    x / (yb + 3.0),
    np.minimum(x, y),
    np.maximum(yb, x),
    x[:, None, :] * 0 + x[:, None, :] + ycb[None],
    ycb[:, None, :] * x[None],
    yba + x.T,
    (yb + x).T,
    (x * yb).T,
    np.minimum(x, yb).T,
    x + 1.5,
    2.5 + x,
    x - 1.0,
    3.0 - x,
    x * 3.0,
    -2.0 * x,
    x / 4.0,
    2.0 / (yb + 3.0),
    np.minimum(x, 0.5),
    np.maximum(-0.5, x),
  ]


def _check_arith_shapes(outs):
  names = [o.shape.dimension_names for o in outs]
  assert names[0] == ["a", "b"]
  assert names[2] == ["a", "b"]  # [a, b] x [b, a]: shape1 order.
  assert names[5] == ["a", "b"]  # [b] x [a, b]: the longer.
  assert names[6] == ["a", "b", "c"]  # [a, b] + [c, b] -> union.
  assert names[7] == ["c", "b", "a"]
  assert names[8] == ["b", "a"]
  assert names[9] == ["b", "a"]


@meshes.parametrize(meshes.BINARY_OPS, "mesh_layout")
def test_arithmetic_values(mesh_layout):
  def build(mesh):
    outs = _arith_program(mesh)
    _check_arith_shapes(outs)
    return outs

  got = mtu.run_program(build, *mesh_layout)
  want = _arith_expected()
  # x + ycb has shape [a, b, c]; expected above is [a, c, b].
  want[6] = np.transpose(want[6], (0, 2, 1))
  want[7] = np.transpose(want[7], (0, 2, 1))
  mtu.assert_all_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", mtu.MODES)
def test_arithmetic_three_modes(mode):
  got = mtu.run_program(_arith_program, "rows:2;cols:2", "a:rows;b:cols", mode)
  want = _arith_expected()
  want[6] = np.transpose(want[6], (0, 2, 1))
  want[7] = np.transpose(want[7], (0, 2, 1))
  mtu.assert_all_close(got, want, rtol=1e-5, atol=1e-5)


@meshes.parametrize(meshes.BINARY_OPS, "mesh_layout")
def test_tensor_operators(mesh_layout):
  xi = (np.arange(32).reshape(4, 8) - 13).astype(np.int32)
  yi = np.array([1, 2, 3, -4, 5, -6, 7, 3], np.int32)

  def build(mesh):
    x = _imp(mesh, X_AB, [A, B])
    yb = _imp(mesh, Y_B, [B])
    i = _imp(mesh, xi, [A, B])
    j = _imp(mesh, yi, [B])
    return [
      x + yb,
      yb + x,
      x - yb,
      yb - x,
      x * yb,
      x / (yb + 3.0),
      2.0 + x,
      x + 2.0,
      2.0 - x,
      x - 2.0,
      2.0 * x,
      x * 2.0,
      1.0 / (yb + 3.0),
      x / 2.0,
      -x,
      i // j,
      i % j,
      7 // j,
      7 % j,
      i // 3,
      i % 3,
      -i,
      i + 1,
      2 * i,
      i - j,
      x // 0.5,
      x % 0.7,
    ]

  got = mtu.run_program(build, *mesh_layout)
  x, yb = X_AB, Y_B
  want = [
    x + yb,
    yb + x,
    x - yb,
    yb - x,
    x * yb,
    x / (yb + 3.0),
    2.0 + x,
    x + 2.0,
    2.0 - x,
    x - 2.0,
    2.0 * x,
    x * 2.0,
    1.0 / (yb + 3.0),
    x / 2.0,
    -x,
    xi // yi,
    xi % yi,
    7 // yi,
    7 % yi,
    xi // 3,
    xi % 3,
    -xi,
    xi + 1,
    2 * xi,
    xi - yi,
    np.floor_divide(x, 0.5),
    np.mod(x, 0.7),
  ]
  mtu.assert_all_close(got, want, rtol=1e-5, atol=1e-5)
  for g, w in zip(got[15:25], want[15:25]):
    assert g.dtype == np.int32, (g.dtype, w)


@meshes.parametrize(meshes.BINARY_OPS, "mesh_layout")
def test_comparisons_and_logic(mesh_layout):
  yb_int = np.array([0, 1, 2, 3, 4, 5, 6, 7], np.int32)
  xi = _RNG.randint(0, 8, size=(4, 8)).astype(np.int32)

  def build(mesh):
    x = _imp(mesh, X_AB, [A, B])
    yb = _imp(mesh, Y_B, [B])
    i = _imp(mesh, xi, [A, B])
    j = _imp(mesh, yb_int, [B])
    outs = [
      mtf.less(x, yb),
      mtf.greater(x, yb),
      mtf.less_equal(i, j),
      mtf.greater_equal(i, j),
      mtf.equal(i, j),
      mtf.not_equal(i, j),
      mtf.less(x, 0.0),
      mtf.greater(0.0, x),
      mtf.equal(i, 3),
      mtf.logical_and(mtf.less(x, 0.5), mtf.greater(x, -0.5)),
      mtf.logical_or(mtf.less(yb, -0.5), mtf.greater(x, 0.5)),
      mtf.less(yb, x, output_shape=[B, A]),
    ]
    for o in outs:
      assert o.dtype == tf.bool
    return outs

  got = mtu.run_program(build, *mesh_layout)
  x, yb = X_AB, Y_B
  want = [
    x < yb,
    x > yb,
    xi <= yb_int,
    xi >= yb_int,
    xi == yb_int,
    xi != yb_int,
    x < 0,
    0 > x,
    xi == 3,
    (x < 0.5) & (x > -0.5),
    (yb < -0.5) | (x > 0.5),
    (yb < x).T,
  ]
  for g, w in zip(got, want):
    assert g.dtype == np.bool_
    np.testing.assert_array_equal(g, w)


@meshes.parametrize(meshes.BINARY_OPS, "mesh_layout")
def test_floordiv_mod_keep_dtype(mesh_layout):
  xi = (np.arange(32).reshape(4, 8) - 13).astype(np.int32)
  yi = np.array([1, 2, 3, -4, 5, -6, 7, 3], np.int32)
  k_value = (np.arange(32).reshape(4, 8) % 5 + 1).astype(np.int32)

  def build(mesh):
    i = _imp(mesh, xi, [A, B])
    j = _imp(mesh, yi, [B])
    x = _imp(mesh, X_AB, [A, B])
    k = _imp(mesh, k_value, [A, B])
    outs = [
      mtf.floordiv(i, j),
      mtf.mod(i, j),
      mtf.floordiv(20, j),
      mtf.mod(20, j),
      mtf.floordiv(i, 4),
      mtf.mod(i, 4),
      mtf.floordiv(x, 0.3),
      mtf.mod(x, 0.3),
      mtf.floordiv(j, k, output_shape=[B, A]),
    ]
    assert [o.dtype for o in outs] == [tf.int32] * 6 + [tf.float32] * 2 + [
      tf.int32
    ]
    return outs

  got = mtu.run_program(build, *mesh_layout)
  want = [
    xi // yi,
    xi % yi,
    20 // yi,
    20 % yi,
    xi // 4,
    xi % 4,
    np.floor_divide(X_AB, np.float32(0.3)),
    np.mod(X_AB, np.float32(0.3)),
    (yi // k_value).T,
  ]
  mtu.assert_all_close(got, want, rtol=1e-5, atol=1e-4)


@meshes.parametrize(meshes.BINARY_OPS, "mesh_layout")
def test_where(mesh_layout):
  def build(mesh):
    x = _imp(mesh, X_AB, [A, B])
    y = _imp(mesh, Y_AB, [A, B])
    yb = _imp(mesh, Y_B, [B])
    cond = mtf.greater(x, yb)
    cond_b = mtf.greater(yb, 0.0)
    return [
      mtf.where(cond, x, y),
      mtf.where(cond_b, x, y),
      mtf.where(cond, yb, x),
      mtf.where(cond, x, 0.0),
      mtf.where(cond, 1.0, y),
      mtf.where(cond_b, x, yb, output_shape=[B, A]),
    ]

  got = mtu.run_program(build, *mesh_layout)
  x, y, yb = X_AB, Y_AB, Y_B
  cond = x > yb
  want = [
    np.where(cond, x, y),
    np.where(yb > 0, x, y),
    np.where(cond, yb, x),
    np.where(cond, x, 0.0),
    np.where(cond, 1.0, y),
    np.where(yb > 0, x, yb).T,
  ]
  mtu.assert_all_close(got, want, rtol=1e-5, atol=1e-6)


def test_where_is_an_arithmetic_blend():
  # Faithful to the original: cond * a + (1 - cond) * b, so an inf in the
  # unused branch turns into NaN.
  a_value = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
  b_value = np.array([np.inf, 5.0, 6.0, 7.0], np.float32)

  def build(mesh):
    a = _imp(mesh, a_value, [A])
    b = _imp(mesh, b_value, [A])
    return [mtf.where(mtf.greater(a, 0.0), a, b)]

  [got] = mtu.run_program(build)
  assert np.isnan(got[0])
  np.testing.assert_array_equal(got[1:], a_value[1:])


@meshes.parametrize(meshes.BINARY_OPS, "mesh_layout")
def test_add_n(mesh_layout):
  def build(mesh):
    xs = [
      _imp(mesh, X_AB, [A, B]),
      _imp(mesh, Y_AB, [A, B]),
      _imp(mesh, Y_B, [B]),
    ]
    return [mtf.add_n(xs), mtf.add_n(xs[:1]), mtf.add_n(xs[2:] + xs[:1])]

  got = mtu.run_program(build, *mesh_layout)
  mtu.assert_all_close(got, [X_AB + Y_AB + Y_B, X_AB, Y_B + X_AB])
  assert mtf.add_n([]) == 0


# Gradients.


def _grad_program(mesh):
  x = _imp(mesh, X_AB, [A, B])
  y = _imp(mesh, Y_AB, [A, B])
  yb = _imp(mesh, Y_B, [B])
  yba = _imp(mesh, Y_BA, [B, A])
  ycb = _imp(mesh, Y_CB, [C, B])
  w = _imp(mesh, Y_AB[::-1].copy(), [A, B])
  terms = [
    x * y + yb,  # add with broadcasting
    x - yb * 2.0,  # sub
    x * yba,  # multiply, transposed operand
    x / (yb + 3.0),  # divide
    (3.0 - x) * 0.5,  # scalar ops
    mtf.minimum(x, yb),
    mtf.maximum(yb, y),
  ]
  loss = mtf.reduce_sum(mtf.add_n([t * w for t in terms]))
  loss += mtf.reduce_sum(mtf.add(x, ycb) * mtf.add(yb, ycb))
  return mtf.gradients([loss], [x, y, yb, yba, ycb])


def _grad_expected():
  x = tf.constant(X_AB)
  y = tf.constant(Y_AB)
  yb = tf.constant(Y_B)
  yba = tf.constant(Y_BA)
  ycb = tf.constant(Y_CB)
  w = tf.constant(Y_AB[::-1].copy())
  with tf.GradientTape() as tape:
    tape.watch([x, y, yb, yba, ycb])
    terms = [
      x * y + yb,
      x - yb * 2.0,
      x * tf.transpose(yba),
      x / (yb + 3.0),
      (3.0 - x) * 0.5,
      tf.minimum(x, yb),
      tf.maximum(yb, y),
    ]
    loss = tf.reduce_sum(tf.add_n([t * w for t in terms]))
    loss += tf.reduce_sum(
      (x[:, None, :] + ycb[None]) * (yb[None, None, :] + ycb[None])
    )
  return [g.numpy() for g in tape.gradient(loss, [x, y, yb, yba, ycb])]


@meshes.parametrize(meshes.BINARY_OPS, "mesh_layout")
def test_gradients(mesh_layout):
  got = mtu.run_program(_grad_program, *mesh_layout)
  mtu.assert_all_close(got, _grad_expected(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mode", mtu.MODES)
def test_gradients_three_modes(mode):
  got = mtu.run_program(_grad_program, "rows:2;cols:2", "a:cols;b:rows", mode)
  mtu.assert_all_close(got, _grad_expected(), rtol=1e-4, atol=1e-4)


@meshes.parametrize(meshes.BINARY_OPS, "mesh_layout")
def test_min_max_gradient_ties_go_to_both(mesh_layout):
  x_value = np.array([[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]] * 4, np.float32)
  y_value = np.array([1.0, 0.0, 3.0, 9.0, 5.0, 0.0, 9.0, 8.0], np.float32)

  def build(mesh):
    x = _imp(mesh, x_value, [A, B])
    y = _imp(mesh, y_value, [B])
    lo = mtf.minimum(x, y)
    hi = mtf.maximum(x, y)
    return mtf.gradients([mtf.reduce_sum(lo)], [x, y]) + mtf.gradients(
      [mtf.reduce_sum(hi)], [x, y]
    )

  dx_min, dy_min, dx_max, dy_max = mtu.run_program(build, *mesh_layout)
  tie = (x_value == y_value).astype(np.float32)
  x_small = (x_value <= y_value).astype(np.float32)
  x_big = (x_value >= y_value).astype(np.float32)
  np.testing.assert_array_equal(dx_min, x_small)
  np.testing.assert_array_equal(
    dy_min, ((x_value >= y_value).astype(np.float32)).sum(0)
  )
  np.testing.assert_array_equal(dx_max, x_big)
  np.testing.assert_array_equal(dy_max, x_small.sum(0))
  assert tie.sum() > 0


def test_add_gradient_reduces_to_input_shape():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = _imp(mesh, X_AB, [A, B])
  yb = _imp(mesh, Y_B, [B])
  dx, dyb = mtf.gradients([mtf.reduce_sum(x + yb)], [x, yb])
  assert dx.shape == x.shape
  assert dyb.shape == yb.shape


def test_comparisons_have_no_gradient():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = _imp(mesh, X_AB, [A, B])
  c = mtf.less(x, 0.0)
  assert not c.operation.has_gradient
  assert mtf.gradients([mtf.reduce_sum(mtf.to_float(c))], [x]) == [None]


# Which operation implements what.


def test_operation_classes():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = _imp(mesh, X_AB, [A, B])
  yb = _imp(mesh, Y_B, [B])
  assert isinstance((x + 1.0).operation, mtf.ScalarAddOperation)
  assert isinstance((1.0 + x).operation, mtf.ScalarAddOperation)
  assert isinstance((x - 1.0).operation, mtf.ScalarAddOperation)
  assert isinstance((x * 2.0).operation, mtf.ScalarMultiplyOperation)
  assert isinstance((2.0 * x).operation, mtf.ScalarMultiplyOperation)
  assert isinstance((x / 2.0).operation, mtf.ScalarMultiplyOperation)
  assert isinstance((x + yb).operation, mtf.AddOperation)
  assert isinstance((x - yb).operation, mtf.AddOperation)
  assert isinstance((x * yb).operation, mtf.EinsumOperation)
  assert isinstance((x / yb).operation, mtf.EinsumOperation)
  assert isinstance(mtf.minimum(x, yb).operation, mtf.MinMaxOperation)
  assert isinstance(mtf.less(x, yb).operation, mtf.BinaryOpWithBroadcasting)
  assert isinstance((-x).operation, mtf.SlicewiseOperation)


# Errors.


def test_mismatched_dtypes_raise():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = _imp(mesh, X_AB, [A, B])
  i = _imp(mesh, np.zeros([4, 8], np.int32), [A, B])
  for fn in (
    mtf.add,
    mtf.sub,
    mtf.multiply,
    mtf.divide,
    mtf.minimum,
    mtf.maximum,
    mtf.less,
    mtf.equal,
    mtf.floordiv,
    mtf.mod,
  ):
    with pytest.raises(ValueError, match="dtype"):
      fn(x, i)
  with pytest.raises(ValueError, match="dtype"):
    _ = x + i
  with pytest.raises(ValueError, match="dtype"):
    _ = i * x


def test_two_python_scalars_raise():
  with pytest.raises(ValueError):
    mtf.binary_arguments_to_tensors(1.0, 2.0)


def test_same_name_different_size_raises_naming_dim():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = _imp(mesh, X_AB, [A, B])
  other = _imp(mesh, np.zeros([5], np.float32), [mtf.Dimension("b", 5)])
  for fn in (
    mtf.add,
    mtf.sub,
    mtf.multiply,
    mtf.divide,
    mtf.minimum,
    mtf.maximum,
    mtf.less,
    mtf.floordiv,
  ):
    with pytest.raises(ValueError, match="'b'"):
      fn(x, other)


def test_output_shape_missing_an_input_dim_raises():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = _imp(mesh, X_AB, [A, B])
  yb = _imp(mesh, Y_B, [B])
  for fn in (mtf.add, mtf.sub, mtf.minimum, mtf.less, mtf.floordiv):
    with pytest.raises(ValueError, match="a=4"):
      fn(x, yb, output_shape=[B])


def test_multiply_with_smaller_output_shape_is_an_einsum():
  # Faithful to the original: multiply is an einsum, so output dims left out
  # are summed over.
  def build(mesh):
    x = _imp(mesh, X_AB, [A, B])
    yb = _imp(mesh, Y_B, [B])
    return [mtf.multiply(x, yb, output_shape=[B])]

  [got] = mtu.run_program(build, "rows:2;cols:2", "a:rows;b:cols")
  np.testing.assert_allclose(got, (X_AB * Y_B).sum(0), rtol=1e-5)


def test_binary_arguments_to_tensors_converts_scalars():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  i = _imp(mesh, np.zeros([4], np.int32), [A])
  a, b = broadcast_binary.binary_arguments_to_tensors(i, 3)
  assert a is i
  assert b.dtype == tf.int32 and b.shape == mtf.Shape([])
  a, b = mtf.binary_arguments_to_tensors(2, i)
  assert b is i and a.dtype == tf.int32


def test_binary_op_with_broadcasting_custom_fn():
  def build(mesh):
    x = _imp(mesh, X_AB, [A, B])
    yb = _imp(mesh, Y_B, [B])
    z = mtf.binary_op_with_broadcasting(tf.math.squared_difference, x, yb)
    w = mtf.binary_op_with_broadcasting(
      tf.math.greater, yb, x, output_shape=[B, A], output_dtype=tf.bool
    )
    return [z, w]

  z, w = mtu.run_program(build, "rows:2;cols:2", "a:rows;b:cols")
  np.testing.assert_allclose(z, (X_AB - Y_B) ** 2, rtol=1e-5)
  np.testing.assert_array_equal(w, (Y_B > X_AB).T)


def test_binary_op_output_dim_in_no_input():
  # An output dim found in neither input is broadcast.
  def build(mesh):
    x = _imp(mesh, X_AB[:, 0].copy(), [A])
    y = _imp(mesh, Y_B, [B])
    return [
      mtf.binary_op_with_broadcasting(tf.add, x, y, output_shape=[C, A, B]),
      mtf.add(x, y, output_shape=[A, C, B]),
    ]

  for mesh_layout in [
    ("", ""),
    ("rows:2;cols:2", "a:rows;c:cols"),
    ("all:4", "b:all"),
  ]:
    z, z2 = mtu.run_program(build, *mesh_layout)
    want = X_AB[:, 0][:, None] + Y_B[None, :]
    np.testing.assert_allclose(z, np.broadcast_to(want, (2, 4, 8)), rtol=1e-6)
    np.testing.assert_allclose(
      z2, np.broadcast_to(want[:, None, :], (4, 2, 8)), rtol=1e-6
    )
