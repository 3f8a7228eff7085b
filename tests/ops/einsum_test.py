"""Tests for mesh_tensorflow._src.ops.einsum: einsum, matmul, transpose."""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow._src.laid_out import LazyAllreduceSum
from tests import mesh_test_util as mtu
from tests import meshes

BATCH = mtf.Dimension("batch", 4)
IO = mtf.Dimension("io", 8)
HIDDEN = mtf.Dimension("hidden", 8)
EXTRA = mtf.Dimension("extra", 2)

_RNG = np.random.RandomState(3)
X = _RNG.randn(4, 8).astype(np.float32)  # [batch, io]
W = _RNG.randn(8, 8).astype(np.float32)  # [io, hidden]
V = _RNG.randn(8, 4).astype(np.float32)  # [hidden, batch]
U = _RNG.randn(2, 8).astype(np.float32)  # [extra, io]


def _imp(mesh, value, dims):
  return mtf.import_tf_tensor(mesh, value, dims)


def _matmul_program(mesh):
  x = _imp(mesh, X, [BATCH, IO])
  w = _imp(mesh, W, [IO, HIDDEN])
  y = mtf.matmul(x, w)
  y_t = mtf.einsum([x, w], output_shape=[HIDDEN, BATCH])
  g = _imp(mesh, V.T.copy(), [BATCH, HIDDEN])
  loss = mtf.reduce_sum(y * g)
  dx, dw = mtf.gradients([loss], [x, w])
  return [y, y_t, dx, dw]


def _matmul_expected():
  gy = V.T
  return [X @ W, (X @ W).T, gy @ W.T, X.T @ gy]


@meshes.parametrize(meshes.MATMUL, "mesh_layout")
def test_matmul_all_layouts(mesh_layout):
  got = mtu.run_program(_matmul_program, *mesh_layout)
  mtu.assert_all_close(got, _matmul_expected(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mode", mtu.MODES)
def test_matmul_three_modes(mode):
  got = mtu.run_program(
    _matmul_program, "rows:2;cols:2", "batch:rows;io:cols", mode
  )
  mtu.assert_all_close(got, _matmul_expected(), rtol=1e-4, atol=1e-4)


# Output-shape rules.


def test_default_output_keeps_dims_occurring_once():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = _imp(mesh, X, [BATCH, IO])
  w = _imp(mesh, W, [IO, HIDDEN])
  v = _imp(mesh, V, [HIDDEN, BATCH])
  u = _imp(mesh, U, [EXTRA, IO])
  assert mtf.einsum([x, w]).shape == mtf.Shape([BATCH, HIDDEN])
  assert mtf.einsum([w, x]).shape == mtf.Shape([HIDDEN, BATCH])
  assert mtf.einsum([x, w, v]).shape == mtf.Shape([])
  assert mtf.einsum([x, u]).shape == mtf.Shape([BATCH, EXTRA])
  assert mtf.einsum([x]).shape == x.shape
  assert mtf.einsum([x, x]).shape == mtf.Shape([])
  assert mtf.matmul(x, w).shape == mtf.Shape([BATCH, HIDDEN])


def test_reduced_dims_rule():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = _imp(mesh, X, [BATCH, IO])
  w = _imp(mesh, W, [IO, HIDDEN])
  assert mtf.einsum([x, w], reduced_dims=[IO]).shape == mtf.Shape(
    [BATCH, HIDDEN]
  )
  assert mtf.einsum([x, w], reduced_dims=[]).shape == mtf.Shape(
    [BATCH, IO, HIDDEN]
  )
  assert mtf.einsum([x, w], reduced_dims=[IO, BATCH]).shape == mtf.Shape(
    [HIDDEN]
  )
  assert mtf.einsum([x, w], reduced_dims=["io"]).shape == mtf.Shape(
    [BATCH, HIDDEN]
  )
  assert mtf.matmul(x, w, reduced_dims=[HIDDEN]).shape == mtf.Shape([BATCH, IO])
  # Both given and consistent (any order).
  assert mtf.einsum(
    [x, w], output_shape=[HIDDEN, BATCH], reduced_dims=[IO]
  ).shape == mtf.Shape([HIDDEN, BATCH])


def test_output_shape_and_reduced_dims_inconsistent_raise():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = _imp(mesh, X, [BATCH, IO])
  w = _imp(mesh, W, [IO, HIDDEN])
  with pytest.raises(ValueError):
    mtf.einsum([x, w], output_shape=[BATCH, HIDDEN], reduced_dims=[HIDDEN])
  with pytest.raises(ValueError):
    mtf.einsum([x, w], output_shape=[BATCH], reduced_dims=[IO])
  with pytest.raises(ValueError, match="extra"):
    mtf.einsum([x, w], reduced_dims=[EXTRA])


@meshes.parametrize(meshes.MATMUL, "mesh_layout")
def test_einsum_variants_values(mesh_layout):
  def build(mesh):
    x = _imp(mesh, X, [BATCH, IO])
    w = _imp(mesh, W, [IO, HIDDEN])
    v = _imp(mesh, V, [HIDDEN, BATCH])
    u = _imp(mesh, U, [EXTRA, IO])
    return [
      mtf.einsum([x, w, v]),  # 3 operands
      mtf.einsum([x, w, v], output_shape=[HIDDEN]),
      mtf.einsum([x, w, u], output_shape=[EXTRA, BATCH, HIDDEN]),
      mtf.einsum([x, w], reduced_dims=[]),  # outer-ish
      mtf.einsum([x, w], reduced_dims=[IO, BATCH]),
      mtf.einsum([x, x]),  # sum of squares
      mtf.einsum([x], output_shape=[IO]),  # a reduction
      mtf.einsum([x, u]),
      mtf.transpose(x, [IO, BATCH]),
      mtf.transpose(w, [HIDDEN, IO]),
    ]

  got = mtu.run_program(build, *mesh_layout)
  want = [
    np.einsum("bi,ih,hb->", X, W, V),
    np.einsum("bi,ih,hb->h", X, W, V),
    np.einsum("bi,ih,ei->ebh", X, W, U),
    np.einsum("bi,ih->bih", X, W),
    np.einsum("bi,ih->h", X, W),
    (X * X).sum(),
    X.sum(0),
    np.einsum("bi,ei->be", X, U),
    X.T,
    W.T,
  ]
  mtu.assert_all_close(got, want, rtol=1e-4, atol=1e-4)


@meshes.parametrize(meshes.MATMUL, "mesh_layout")
def test_einsum_gradients(mesh_layout):
  g_ebh = _RNG.randn(2, 4, 8).astype(np.float32)

  def build(mesh):
    x = _imp(mesh, X, [BATCH, IO])
    w = _imp(mesh, W, [IO, HIDDEN])
    v = _imp(mesh, V, [HIDDEN, BATCH])
    u = _imp(mesh, U, [EXTRA, IO])
    g = _imp(mesh, g_ebh, [EXTRA, BATCH, HIDDEN])
    loss = (
      mtf.einsum([x, w, v])
      + mtf.reduce_sum(
        mtf.einsum([x, w, u], output_shape=[EXTRA, BATCH, HIDDEN]) * g
      )
      + mtf.einsum([x, x]) * 0.5
      + mtf.reduce_sum(
        mtf.transpose(w, [HIDDEN, IO]) * _imp(mesh, W, [IO, HIDDEN])
      )
    )
    return mtf.gradients([loss], [x, w, v, u])

  got = mtu.run_program(build, *mesh_layout)
  tx, tw, tv, tu = (tf.constant(a) for a in (X, W, V, U))
  with tf.GradientTape() as tape:
    tape.watch([tx, tw, tv, tu])
    loss = (
      tf.einsum("bi,ih,hb->", tx, tw, tv)
      + tf.reduce_sum(tf.einsum("bi,ih,ei->ebh", tx, tw, tu) * g_ebh)
      + tf.reduce_sum(tx * tx) * 0.5
      + tf.reduce_sum(tw * W)
    )
  want = [g.numpy() for g in tape.gradient(loss, [tx, tw, tv, tu])]
  mtu.assert_all_close(got, want, rtol=1e-4, atol=1e-3)


# Output dims found in no input: broadcast after the contraction.

NEW = mtf.Dimension("new", 4)


@meshes.parametrize(
  [
    ("", ""),
    ("all:4", "new:all"),
    ("all:4", "io:all"),
    ("rows:2;cols:2", "new:rows;io:cols"),
    ("rows:2;cols:2", "new:cols;batch:rows"),
    ("rows:2;cols:2", "hidden:cols;new:rows"),
  ],
  "mesh_layout",
)
def test_output_dims_in_no_input_are_broadcast(mesh_layout):
  def build(mesh):
    x = _imp(mesh, X, [BATCH, IO])
    w = _imp(mesh, W, [IO, HIDDEN])
    y = mtf.einsum([x, w], output_shape=[NEW, BATCH, HIDDEN])
    z = mtf.einsum([x], output_shape=[BATCH, NEW])
    (dx,) = mtf.gradients([mtf.reduce_sum(y) + mtf.reduce_sum(z)], [x])
    return [y, z, dx]

  y, z, dx = mtu.run_program(build, *mesh_layout)
  np.testing.assert_allclose(
    y, np.broadcast_to(X @ W, (4, 4, 8)), rtol=1e-4, atol=1e-4
  )
  np.testing.assert_allclose(
    z, np.broadcast_to(X.sum(1)[:, None], (4, 4)), rtol=1e-5, atol=1e-5
  )
  np.testing.assert_allclose(
    dx, np.broadcast_to(4 * W.sum(1), (4, 8)) + 4, rtol=1e-4, atol=1e-4
  )


# Integer dtypes.


@meshes.parametrize(meshes.MATMUL, "mesh_layout")
def test_integer_einsum(mesh_layout):
  xi = _RNG.randint(-5, 5, size=(4, 8)).astype(np.int32)
  wi = _RNG.randint(-5, 5, size=(8, 8)).astype(np.int32)

  def build(mesh):
    x = _imp(mesh, xi, [BATCH, IO])
    w = _imp(mesh, wi, [IO, HIDDEN])
    outs = [
      mtf.matmul(x, w),
      mtf.einsum([x, w], output_shape=[HIDDEN, BATCH]),
      mtf.einsum([x, w], reduced_dims=[]),
      x * w,
      mtf.einsum([x], output_shape=[IO]),
      mtf.einsum([x, w], output_shape=[NEW, HIDDEN]),
    ]
    for o in outs:
      assert o.dtype == tf.int32
    return outs

  got = mtu.run_program(build, *mesh_layout)
  want = [
    xi @ wi,
    (xi @ wi).T,
    np.einsum("bi,ih->bih", xi, wi),
    np.einsum("bi,ih->bih", xi, wi),
    xi.sum(0),
    np.broadcast_to(np.einsum("bi,ih->h", xi, wi), (4, 8)),
  ]
  for g, w in zip(got, want):
    assert g.dtype == np.int32
    np.testing.assert_array_equal(g, w)


# Contracted split dims: a lazy allreduce.


@pytest.mark.parametrize(
  "mesh_shape,layout,axes",
  [
    ("all:4", "io:all", [0]),
    ("rows:2;cols:2", "io:rows", [0]),
    ("rows:2;cols:2", "io:cols;batch:rows", [1]),
    ("all:4", "batch:all", []),
    ("rows:2;cols:2", "hidden:cols", []),
  ],
)
def test_contracted_split_dims_are_lazily_allreduced(mesh_shape, layout, axes):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = _imp(mesh, X, [BATCH, IO])
  w = _imp(mesh, W, [IO, HIDDEN])
  w2 = _imp(mesh, W * 2.0, [IO, HIDDEN])
  y1 = mtf.matmul(x, w)
  y2 = mtf.matmul(x, w2)
  total = y1 + y2
  lowering = mtf.Lowering(graph, {mesh: mtu.mesh_impl_for(mesh_shape, layout)})
  keys = [k for k, _ in lowering.counters]
  assert "einsum" in keys and "einsum_unique" in keys
  einsum_unique = [v for k, v in lowering.counters if k == "einsum_unique"]
  assert einsum_unique == [4 * 8 * 8] * 2
  if axes:
    for t in (y1, y2, total):
      assert isinstance(lowering.tensors[t], LazyAllreduceSum)
      assert list(lowering.tensors[t].mesh_axes) == axes
  else:
    assert not isinstance(lowering.tensors[total], LazyAllreduceSum)
  assert not any(k.startswith("allreduce") for k in keys)
  got = lowering.export_to_tf_tensor(total).numpy()
  np.testing.assert_allclose(got, 3 * X @ W, rtol=1e-4, atol=1e-4)
  allreduces = [k for k, _ in lowering.counters if k.startswith("allreduce")]
  if axes:
    assert allreduces == ["allreduce/%s/einsum_op" % axes]
  else:
    assert not allreduces


# Errors.


def test_einsum_errors():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = _imp(mesh, X, [BATCH, IO])
  xi = _imp(mesh, X.astype(np.int32), [BATCH, IO])
  other = _imp(mesh, np.zeros([5], np.float32), [mtf.Dimension("io", 5)])
  with pytest.raises(ValueError):
    mtf.einsum([])
  with pytest.raises(ValueError, match="dtype"):
    mtf.einsum([x, xi])
  with pytest.raises(ValueError, match="'io'"):
    mtf.einsum([x, other])
  with pytest.raises(ValueError, match="'io'"):
    mtf.einsum([x], output_shape=[mtf.Dimension("io", 3)])
  with pytest.raises(ValueError, match="io"):
    mtf.transpose(x, [BATCH])
  with pytest.raises(ValueError, match="hidden"):
    mtf.transpose(x, [IO, HIDDEN])


def test_operation_fields():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = _imp(mesh, X, [BATCH, IO])
  w = _imp(mesh, W, [IO, HIDDEN])
  y = mtf.einsum([x, w], name="my_einsum")
  assert isinstance(y.operation, mtf.EinsumOperation)
  assert y.operation.name == "my_einsum"
  assert y.operation.splittable_dims == frozenset(["batch", "io", "hidden"])
  assert mtf.transpose(x, [IO, BATCH]).operation.name == "transpose"


def test_two_einsum_dims_on_one_mesh_axis_raise():
  # io (contracted) and hidden (kept) come from different inputs but share a
  # mesh axis: partial sums could not be allreduced correctly, so lowering
  # refuses the layout, naming both dims.
  def build(mesh):
    p = _imp(mesh, X[0], [IO])
    q = _imp(mesh, W[0], [HIDDEN])
    return [mtf.einsum([p, q], output_shape=[HIDDEN])]

  with pytest.raises(ValueError, match="'io'.*'hidden'.*'all'"):
    mtu.run_program(build, "all:4", "io:all;hidden:all")
