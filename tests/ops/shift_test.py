"""Tests for mesh_tensorflow._src.ops.shift.

The shifted dim "n" (size 8) is left whole, split over "all:4" (blocks of 2)
and over rows or cols of the 2x2 mesh (blocks of 4), with other dims split too.
Offsets -9..9 cover zero, multiples of both block sizes and |offset| >= size.
Values and gradients are compared with an explicit numpy shift matrix.
"""

import numpy as np
import pytest

import mesh_tensorflow as mtf
from tests import mesh_test_util as mtu
from tests import meshes

A = mtf.Dimension("a", 4)
N = mtf.Dimension("n", 8)
C = mtf.Dimension("c", 2)
OFFSETS = list(range(-9, 10)) + [16, -17]
WRAPS = [False, True]


_RNG = np.random.RandomState(0)
X = _RNG.uniform(-1.0, 1.0, size=(4, 8, 2)).astype(np.float32)
W = _RNG.uniform(-1.0, 1.0, size=(4, 8, 2)).astype(np.float32)


def shift_matrix(size, offset, wrap):
  """M with y[i] = sum_j M[i, j] x[j] for the shift: y[i] = x[i - offset]."""
  m = np.zeros((size, size), np.float32)
  for i in range(size):
    j = i - offset
    if wrap:
      m[i, j % size] = 1.0
    elif 0 <= j < size:
      m[i, j] = 1.0
  return m


def np_shift(x, offset, wrap):
  return np.einsum("ij,ajc->aic", shift_matrix(8, offset, wrap), x)


def np_shift_grad(w, offset, wrap):
  """d/dx sum(shift(x) * w) = M^T w."""
  return np.einsum("ij,aic->ajc", shift_matrix(8, offset, wrap), w)


def test_reference_matches_roll():
  for offset in OFFSETS:
    np.testing.assert_array_equal(
      np_shift(X, offset, True), np.roll(X, offset, axis=1)
    )


@meshes.parametrize(meshes.SHIFT_OPS)
def test_shift_values_and_gradients(mesh_shape, layout):
  cases = [(o, w) for w in WRAPS for o in OFFSETS]

  def build(mesh):
    x = mtf.import_tf_tensor(mesh, X, mtf.Shape([A, N, C]))
    weights = mtf.constant(mesh, W, mtf.Shape([A, N, C]))
    ys = [mtf.shift(x, o, N, w) for o, w in cases]
    grads = [mtf.gradients([mtf.reduce_sum(y * weights)], [x])[0] for y in ys]
    return ys + grads

  expected = [np_shift(X, o, w) for o, w in cases] + [
    np_shift_grad(W, o, w) for o, w in cases
  ]
  out = mtu.run_program(build, mesh_shape, layout)
  for i, (o, w) in enumerate(cases):
    np.testing.assert_allclose(
      out[i], expected[i], atol=1e-6, err_msg="value offset=%d wrap=%s" % (o, w)
    )
    np.testing.assert_allclose(
      out[len(cases) + i],
      expected[len(cases) + i],
      atol=1e-6,
      err_msg="gradient offset=%d wrap=%s" % (o, w),
    )


@pytest.mark.parametrize("mode", mtu.MODES)
@meshes.parametrize(
  [("", ""), ("all:4", "n:all"), ("rows:2;cols:2", "a:rows;n:cols")]
)
def test_shift_all_modes(mode, mesh_shape, layout):
  cases = [(1, False), (-3, True), (4, False), (-6, False), (5, True)]

  def build(mesh):
    x = mtf.import_tf_tensor(mesh, X, mtf.Shape([A, N, C]))
    return [mtf.shift(x, o, N, w) for o, w in cases]

  mtu.assert_all_close(
    mtu.run_program(build, mesh_shape, layout, mode),
    [np_shift(X, o, w) for o, w in cases],
    atol=1e-6,
  )


@meshes.parametrize([("all:4", "n:all"), ("rows:2;cols:2", "n:rows")])
def test_shift_along_first_axis_by_name(mesh_shape, layout):
  xt = np.transpose(X, (1, 0, 2))

  def build(mesh):
    x = mtf.import_tf_tensor(mesh, xt, mtf.Shape([N, A, C]))
    return [mtf.shift(x, o, "n", w) for o in (-5, 3) for w in WRAPS]

  expected = [
    np.transpose(np_shift(X, o, w), (1, 0, 2)) for o in (-5, 3) for w in WRAPS
  ]
  mtu.assert_all_close(
    mtu.run_program(build, mesh_shape, layout), expected, atol=1e-6
  )


@meshes.parametrize(
  [
    ("all:4", "b:all"),
    ("rows:2;cols:2", "b:rows;n:cols"),
    ("rows:2;cols:2", "n:rows;b:cols"),
  ]
)
def test_shift_of_lazy_allreduce_sum(mesh_shape, layout):
  x = _RNG.uniform(-1.0, 1.0, size=(4, 4, 8)).astype(np.float32)

  def build(mesh):
    b = mtf.Dimension("b", 4)
    t = mtf.import_tf_tensor(mesh, x, mtf.Shape([A, b, N]))
    s = mtf.reduce_sum(t, reduced_dim=b)
    return [mtf.shift(s, o, N, w) for o in (3, -2, 4) for w in WRAPS]

  s = x.sum(1)
  expected = [
    np_shift(s[:, :, None], o, w)[:, :, 0] for o in (3, -2, 4) for w in WRAPS
  ]
  mtu.assert_all_close(
    mtu.run_program(build, mesh_shape, layout), expected, atol=1e-5
  )


def _counters(offset, wrap, mesh_shape, layout):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.import_tf_tensor(mesh, X, mtf.Shape([A, N, C]))
  mtf.shift(x, offset, N, wrap)
  lowering = mtf.Lowering(graph, {mesh: mtu.mesh_impl_for(mesh_shape, layout)})
  return {k: v for k, v in lowering.counters if k.startswith("shift")}


def test_shift_counters():
  laid_out = 4 * 8 * 2  # Replicated nowhere: laid_out_size == size.
  # Block size 2 on "all:4": offset 3 = 1 block + 1 position.
  assert _counters(3, False, "all:4", "n:all") == {
    "shift[2]": laid_out // 2,
    "shift[1]": laid_out // 2,
  }
  assert _counters(-4, True, "all:4", "n:all") == {"shift[2]": laid_out}
  assert _counters(2, False, "all:4", "n:all") == {"shift[1]": laid_out}
  # Not split: no communication.
  assert _counters(3, False, "all:4", "a:all") == {}
  assert _counters(9, False, "all:4", "n:all") == {}


def test_shift_operation_and_errors():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, [A, N])
  op = mtf.ShiftOperation(x, -2, N, True, name="my_shift")
  assert op.name == "my_shift"
  assert op.outputs[0].shape == x.shape
  assert (op.offset, op.wrap) == (-2, True)
  with pytest.raises(ValueError, match="dimension 'q' is not in"):
    mtf.shift(x, 1, mtf.Dimension("q", 8), False)
  with pytest.raises(ValueError, match="'n': offset must be an int"):
    mtf.shift(x, 1.5, N, False)
