"""Tests for mesh_tensorflow._src.ops.sequence.

cumsum, dynamic_shift, reduce_first, pool_tensor_1d and stride_tensor_1d are
run on x of shape [a=4, n=8, c=2] with the operated dim "n" whole, split over
"all:4" and over either axis of the 2x2 mesh, and with other dims split.
Values and gradients (of sum(y * w)) are compared with numpy.
"""

import inspect

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mesh_test_util as mtu
from tests import meshes

A = mtf.Dimension("a", 4)
N = mtf.Dimension("n", 8)
C = mtf.Dimension("c", 2)
SHAPE = mtf.Shape([A, N, C])


_RNG = np.random.RandomState(0)
X = _RNG.uniform(-1.0, 1.0, size=(4, 8, 2)).astype(np.float32)
W = _RNG.uniform(-1.0, 1.0, size=(4, 8, 2)).astype(np.float32)
X_INT = _RNG.randint(-5, 6, size=(4, 8, 2)).astype(np.int32)
# Per-row offsets: over [a] (broadcast along c) and over [a, c].
OFFSET_A = np.array([1, -3, 9, 0], np.int32)
OFFSET_AC = np.array([[2, -1], [-8, 5], [0, 7], [-2, 16]], np.int32)

_EMPTY = inspect.Parameter.empty


def _n_split(mesh_shape, layout):
  """Number of pieces "n" is split into under this mesh and layout."""
  mesh = mtf.convert_to_shape(mesh_shape)
  for pair in filter(None, layout.split(";")):
    tensor_dim, mesh_dim = pair.split(":")
    if tensor_dim == "n":
      return mesh.get_dim_by_name(mesh_dim).size
  return 1


# ------------------------------------------------------------------ numpy
def np_cumsum(x, exclusive):
  y = np.cumsum(x, axis=1)
  return y - x if exclusive else y


def np_cumsum_grad(w, exclusive):
  """d/dx sum(cumsum(x) * w): suffix sums of w."""
  suffix = np.cumsum(w[:, ::-1], axis=1)[:, ::-1]
  return suffix - w if exclusive else suffix


def shift_matrix(size, offset, wrap):
  """M with y[i] = sum_j M[i, j] x[j] for y[i] = x[i - offset]."""
  m = np.zeros((size, size), np.float32)
  for i in range(size):
    j = i - offset
    if wrap:
      m[i, j % size] = 1.0
    elif 0 <= j < size:
      m[i, j] = 1.0
  return m


def np_dynamic_shift(x, offsets_ac, wrap, transpose=False):
  """Row (a, c) of x shifted by offsets_ac[a, c]; transpose gives the grad."""
  y = np.zeros_like(x)
  for a in range(x.shape[0]):
    for c in range(x.shape[2]):
      m = shift_matrix(x.shape[1], int(offsets_ac[a, c]), wrap)
      y[a, :, c] = (m.T if transpose else m) @ x[a, :, c]
  return y


def test_reference_shift_matches_roll():
  for off in range(-9, 10):
    np.testing.assert_array_equal(
      np_dynamic_shift(X, np.full((4, 2), off), True), np.roll(X, off, axis=1)
    )


# -------------------------------------------------------------- signatures
@pytest.mark.parametrize(
  "fn,params",
  [
    (mtf.cumsum, [("x", _EMPTY), ("dim", _EMPTY), ("exclusive", False)]),
    (
      mtf.dynamic_shift,
      [("x", _EMPTY), ("offset", _EMPTY), ("dim", _EMPTY), ("wrap", _EMPTY)],
    ),
    (mtf.reduce_first, [("tensor", _EMPTY), ("reduced_dim", _EMPTY)]),
    (
      mtf.pool_tensor_1d,
      [
        ("tensor", _EMPTY),
        ("pool_dim", _EMPTY),
        ("reduce_fn", mtf.reduce_mean),
        ("pool_size", 2),
      ],
    ),
    (
      mtf.stride_tensor_1d,
      [("tensor", _EMPTY), ("pool_dim", _EMPTY), ("pool_size", 2)],
    ),
  ],
)
def test_signature(fn, params):
  actual = [
    (p.name, p.default) for p in inspect.signature(fn).parameters.values()
  ]
  assert actual == params


# ------------------------------------------------------------------ cumsum
@meshes.parametrize(meshes.SEQUENCE_OPS)
def test_cumsum_values_and_gradients(mesh_shape, layout):
  def build(mesh):
    x = mtf.import_tf_tensor(mesh, X, SHAPE)
    w = mtf.constant(mesh, W, SHAPE)
    ys = [mtf.cumsum(x, N), mtf.cumsum(x, "n", exclusive=True)]
    grads = [mtf.gradients([mtf.reduce_sum(y * w)], [x])[0] for y in ys]
    # Input that is a pending (lazy) sum over c, which may be split.
    summed = mtf.cumsum(mtf.reduce_sum(x, reduced_dim=C), N)
    as_int = mtf.cumsum(
      mtf.import_tf_tensor(mesh, X_INT, SHAPE), N, exclusive=True
    )
    return ys + grads + [summed, as_int]

  out = mtu.run_program(build, mesh_shape, layout)
  expected = [
    np_cumsum(X, False),
    np_cumsum(X, True),
    np_cumsum_grad(W, False),
    np_cumsum_grad(W, True),
    np.cumsum(X.sum(axis=2), axis=1),
  ]
  mtu.assert_all_close(out[:5], expected, msg="%s %s" % (mesh_shape, layout))
  assert out[5].dtype == np.int32
  np.testing.assert_array_equal(out[5], np_cumsum(X_INT, True))


@pytest.mark.parametrize("mode", mtu.MODES)
def test_cumsum_modes(mode):
  def build(mesh):
    x = mtf.import_tf_tensor(mesh, X, SHAPE)
    y = mtf.cumsum(x, N)
    return [
      y,
      mtf.gradients([mtf.reduce_sum(y * mtf.constant(mesh, W, SHAPE))], [x])[0],
    ]

  out = mtu.run_program(build, "rows:2;cols:2", "n:rows;c:cols", mode)
  mtu.assert_all_close(out, [np_cumsum(X, False), np_cumsum_grad(W, False)])


def test_cumsum_split_dim_communicates_block_totals_only():
  """A split n costs one allconcat of per-block totals (not an allreduce)."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  with mtf.variable_store(mtf.VariableStore()):
    mtf.cumsum(mtf.import_tf_tensor(mesh, X, SHAPE), N)
    lowering = mtf.Lowering(graph, {mesh: mtu.mesh_impl_for("all:4", "n:all")})
  keys = [k for k, _ in lowering.counters]
  assert "allconcat/0/cumsum_op" in keys
  assert not [k for k in keys if k.startswith("allreduce")]


def test_cumsum_errors():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, SHAPE)
  with pytest.raises(ValueError, match=r"'m'"):
    mtf.cumsum(x, mtf.Dimension("m", 8))
  with pytest.raises(ValueError, match=r"'n'.*boolean"):
    mtf.cumsum(mtf.zeros(mesh, SHAPE, dtype=tf.bool), N)


# ----------------------------------------------------------- dynamic_shift
@meshes.parametrize(meshes.SEQUENCE_OPS)
def test_dynamic_shift_values_and_gradients(mesh_shape, layout):
  cases = [(OFFSET_A, [A]), (OFFSET_AC, [A, C])]

  def build(mesh):
    x = mtf.import_tf_tensor(mesh, X, SHAPE)
    w = mtf.constant(mesh, W, SHAPE)
    outs = []
    for wrap in (False, True):
      for value, dims in cases:
        offset = mtf.import_tf_tensor(mesh, value, dims)
        y = mtf.dynamic_shift(x, offset, N, wrap)
        outs += [y, mtf.gradients([mtf.reduce_sum(y * w)], [x])[0]]
    return outs

  expected = []
  for wrap in (False, True):
    for value, _ in cases:
      offsets_ac = np.broadcast_to(value.reshape(4, -1), (4, 2))
      expected += [
        np_dynamic_shift(X, offsets_ac, wrap),
        np_dynamic_shift(W, offsets_ac, wrap, transpose=True),
      ]
  out = mtu.run_program(build, mesh_shape, layout)
  mtu.assert_all_close(out, expected, msg="%s %s" % (mesh_shape, layout))


@pytest.mark.parametrize("mode", mtu.MODES)
def test_dynamic_shift_modes(mode):
  def build(mesh):
    x = mtf.import_tf_tensor(mesh, X, SHAPE)
    offset = mtf.import_tf_tensor(mesh, OFFSET_AC, [A, C])
    return [
      mtf.dynamic_shift(x, offset, N, False),
      mtf.dynamic_shift(x, offset, N, True),
    ]

  out = mtu.run_program(build, "rows:2;cols:2", "a:rows;n:cols", mode)
  mtu.assert_all_close(
    out,
    [
      np_dynamic_shift(X, OFFSET_AC, False),
      np_dynamic_shift(X, OFFSET_AC, True),
    ],
  )


def test_dynamic_shift_int_and_bool_tensors():
  def build(mesh):
    offset = mtf.import_tf_tensor(mesh, OFFSET_A, [A])
    xi = mtf.import_tf_tensor(mesh, X_INT, SHAPE)
    xb = mtf.import_tf_tensor(mesh, X_INT > 0, SHAPE)
    return [
      mtf.dynamic_shift(xi, offset, N, True),
      mtf.dynamic_shift(xb, offset, N, False),
      mtf.dynamic_shift(xi, 3, N, False),
    ]  # an int offset: plain shift

  yi, yb, ys = mtu.run_program(build, "all:4", "n:all")
  offsets_ac = np.broadcast_to(OFFSET_A.reshape(4, 1), (4, 2))
  assert yi.dtype == np.int32 and yb.dtype == np.bool_
  np.testing.assert_array_equal(
    yi, np_dynamic_shift(X_INT.astype(np.float32), offsets_ac, True)
  )
  np.testing.assert_array_equal(
    yb, np_dynamic_shift((X_INT > 0).astype(np.float32), offsets_ac, False) > 0
  )
  np.testing.assert_array_equal(
    ys, np_dynamic_shift(X_INT.astype(np.float32), np.full((4, 2), 3), False)
  )


def test_dynamic_shift_errors():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, SHAPE)
  with pytest.raises(
    ValueError,
    match=r"must not contain the shifted "
    r"dimension 'n'",
  ):
    mtf.dynamic_shift(x, mtf.zeros(mesh, [A, N], dtype=tf.int32), N, True)
  with pytest.raises(ValueError, match=r"offset dimension .*'b'"):
    mtf.dynamic_shift(
      x, mtf.zeros(mesh, [mtf.Dimension("b", 3)], dtype=tf.int32), N, True
    )
  with pytest.raises(ValueError, match=r"integer dtype"):
    mtf.dynamic_shift(x, mtf.zeros(mesh, [A]), N, False)
  with pytest.raises(ValueError, match=r"integer mtf Tensor"):
    mtf.dynamic_shift(x, 1.5, N, False)
  with pytest.raises(ValueError, match=r"'m'"):
    mtf.dynamic_shift(x, mtf.zeros(mesh, [A], dtype=tf.int32), "m", False)


# ------------------------------------------ reduce_first and 1-d pooling
def _pool_sizes(mesh_shape, layout):
  """Pool sizes whose pooled n still divides over n's mesh axis."""
  split = _n_split(mesh_shape, layout)
  return [p for p in (2, 4, 8) if (8 // p) % split == 0]


@meshes.parametrize(meshes.SEQUENCE_OPS)
def test_reduce_first_and_pooling(mesh_shape, layout):
  pool_sizes = _pool_sizes(mesh_shape, layout)
  reducers = [
    (mtf.reduce_mean, np.mean),
    (mtf.reduce_max, np.max),
    (mtf.reduce_sum, np.sum),
  ]

  def build(mesh):
    x = mtf.import_tf_tensor(mesh, X, SHAPE)
    outs = []

    def with_grad(y):
      if y.shape.ndims == 3:  # pooled: weights W[:, :pooled size]
        w = mtf.constant(mesh, W[:, : y.shape.dims[1].size], y.shape)
      else:
        w = mtf.ones(mesh, y.shape)
      return [y, mtf.gradients([mtf.reduce_sum(y * w)], [x])[0]]

    outs += with_grad(mtf.reduce_first(x, N))
    for p in pool_sizes:
      for mtf_fn, _ in reducers:
        outs += with_grad(mtf.pool_tensor_1d(x, N, mtf_fn, p))
      outs += with_grad(mtf.stride_tensor_1d(x, N, pool_size=p))
    return outs

  def np_grad(fn_name, p):
    """Gradient of sum(y * W[:, :8 // p]) (or sum(y)) wrt x."""
    if fn_name == "first":
      g = np.zeros_like(X)
      g[:, 0] = 1.0
      return g
    wp = np.repeat(W[:, : 8 // p], p, axis=1)
    if fn_name == "mean":
      return wp / p
    if fn_name == "sum":
      return wp
    if fn_name == "max":
      blocks = X.reshape(4, 8 // p, p, 2)
      mask = blocks == blocks.max(axis=2, keepdims=True)
      return wp * mask.reshape(4, 8, 2)
    g = np.zeros_like(X)  # stride
    g[:, ::p] = W[:, : 8 // p]
    return g

  expected = [X[:, 0], np_grad("first", 1)]
  for p in pool_sizes:
    blocks = X.reshape(4, 8 // p, p, 2)
    for (_, np_fn), name in zip(reducers, ["mean", "max", "sum"]):
      expected += [np_fn(blocks, axis=2), np_grad(name, p)]
    expected += [X[:, ::p], np_grad("stride", p)]
  out = mtu.run_program(build, mesh_shape, layout)
  assert len(out) == len(expected)
  mtu.assert_all_close(out, expected, msg="%s %s" % (mesh_shape, layout))


def test_pooled_dim_keeps_name_and_shrinks():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, SHAPE)
  assert mtf.pool_tensor_1d(x, N).shape == mtf.Shape(
    [A, mtf.Dimension("n", 4), C]
  )
  assert mtf.stride_tensor_1d(x, N, pool_size=4).shape == mtf.Shape(
    [A, mtf.Dimension("n", 2), C]
  )
  assert mtf.reduce_first(x, N).shape == mtf.Shape([A, C])


def test_pooling_errors():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, SHAPE)
  with pytest.raises(ValueError, match=r"'n'.*pools of size 3"):
    mtf.pool_tensor_1d(x, N, pool_size=3)
  with pytest.raises(ValueError, match=r"'n'.*pools of size 3"):
    mtf.stride_tensor_1d(x, N, pool_size=3)
  with pytest.raises(ValueError, match=r"pool_size must be a positive int"):
    mtf.pool_tensor_1d(x, N, pool_size=0)
  with pytest.raises(ValueError, match=r"'m'"):
    mtf.reduce_first(x, mtf.Dimension("m", 2))


def test_pooled_size_must_divide_over_split_axis():
  """n:8 over all:4 pooled by 4 leaves n:2, which cannot split 4 ways."""

  def build(mesh):
    return [
      mtf.pool_tensor_1d(mtf.import_tf_tensor(mesh, X, SHAPE), N, pool_size=4)
    ]

  with pytest.raises(ValueError, match=r"'n' \(size 2\).*'all'"):
    mtu.run_program(build, "all:4", "n:all")
