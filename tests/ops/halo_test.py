"""Tests for mesh_tensorflow._src.ops.halo (halo_exchange, left_halo_exchange).

x has dims [a, nb (blocks), n (block size), c]; the reference builds each
block's window [j*b - left, (j+1)*b + right) of the flattened nb*n sequence
with numpy (zeros outside, or wrapped). Halo sizes cover 0, less than a
block, a whole block and more than a block (data from several blocks). The
blocks dim is left whole or split over "all:4" and over rows/cols of a 2x2
mesh, where the shifts communicate; gradients are checked too.
"""

import inspect

import numpy as np
import pytest

import mesh_tensorflow as mtf
from tests import mesh_test_util as mtu
from tests import meshes

A = mtf.Dimension("a", 2)
NB = mtf.Dimension("nb", 4)
N = mtf.Dimension("n", 3)
C = mtf.Dimension("c", 2)

_RNG = np.random.RandomState(2)
X = _RNG.uniform(-1.0, 1.0, size=(2, 4, 3, 2)).astype(np.float32)


def window_matrix(nb, b, left, right, wrap):
  """M[j, i, k]: output block j position i takes flat input position k."""
  total = nb * b
  m = np.zeros((nb, b + left + right, total), np.float32)
  for j in range(nb):
    for i in range(b + left + right):
      k = j * b - left + i
      if wrap:
        m[j, i, k % total] = 1.0
      elif 0 <= k < total:
        m[j, i, k] = 1.0
  return m


def np_halo(x, left, right, wrap):
  a, nb, b, c = x.shape
  m = window_matrix(nb, b, left, right, wrap)
  return np.einsum("jik,akc->ajic", m, x.reshape(a, nb * b, c))


def np_halo_grad(g, nb, b, left, right, wrap):
  a, c = g.shape[0], g.shape[-1]
  m = window_matrix(nb, b, left, right, wrap)
  return np.einsum("jik,ajic->akc", m, g).reshape(a, nb, b, c)


def test_reference_on_the_docstring_example():
  x = np.arange(1, 7, dtype=np.float32).reshape(1, 2, 3, 1)
  got = np_halo(x, 1, 1, False)[0, :, :, 0]
  np.testing.assert_array_equal(got, [[0, 1, 2, 3, 4], [3, 4, 5, 6, 0]])


HALOS = [0, 1, 2, 3, 4, 7]  # Block size 3: partial, whole and several blocks.


@meshes.parametrize(meshes.HALO)
def test_halo_exchange_values_and_gradients(mesh_shape, layout):
  cases = [
    (h, wrap, both)
    for h in HALOS
    for wrap in (False, True)
    for both in (True, False)
  ]
  weights = {}
  for h, wrap, both in cases:
    size = 3 + h * (2 if both else 1)
    weights[(h, wrap, both)] = _RNG.uniform(-1, 1, size=(2, 4, size, 2)).astype(
      np.float32
    )

  def build(mesh):
    x = mtf.import_tf_tensor(mesh, X, mtf.Shape([A, NB, N, C]))
    ys, grads = [], []
    for h, wrap, both in cases:
      fn = mtf.halo_exchange if both else mtf.left_halo_exchange
      y = fn(x, NB, N, h, wrap=wrap)
      w = mtf.import_tf_tensor(mesh, weights[(h, wrap, both)], y.shape)
      ys.append(y)
      grads.append(mtf.gradients([mtf.reduce_sum(y * w)], [x])[0])
    return ys + grads

  out = mtu.run_program(build, mesh_shape, layout)
  for i, (h, wrap, both) in enumerate(cases):
    right = h if both else 0
    msg = "halo=%d wrap=%s both=%s" % (h, wrap, both)
    np.testing.assert_allclose(
      out[i], np_halo(X, h, right, wrap), atol=1e-6, err_msg=msg
    )
    np.testing.assert_allclose(
      out[len(cases) + i],
      np_halo_grad(weights[(h, wrap, both)], 4, 3, h, right, wrap),
      atol=1e-5,
      err_msg="gradient " + msg,
    )


@pytest.mark.parametrize("mode", mtu.MODES)
def test_halo_exchange_all_modes(mode):
  def build(mesh):
    x = mtf.import_tf_tensor(mesh, X, mtf.Shape([A, NB, N, C]))
    return [
      mtf.halo_exchange(x, NB, N, 2),
      mtf.left_halo_exchange(x, "nb", "n", 4, wrap=True),
    ]

  out = mtu.run_program(build, "rows:2;cols:2", "nb:rows;a:cols", mode)
  mtu.assert_all_close(
    out, [np_halo(X, 2, 2, False), np_halo(X, 4, 0, True)], atol=1e-6
  )


def test_halo_exchange_communicates_by_shift():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, [A, NB, N, C])
  mtf.halo_exchange(x, NB, N, 1)
  lowering = mtf.Lowering(graph, {mesh: mtu.mesh_impl_for("all:4", "nb:all")})
  assert any(k.startswith("shift[") for k, _ in lowering.counters)


def test_split_block_size_dim_raises():
  def build(mesh):
    x = mtf.zeros(mesh, [A, NB, mtf.Dimension("n", 4), C])
    return [mtf.halo_exchange(x, NB, "n", 1)]

  with pytest.raises(ValueError, match="dimension 'n'"):
    mtu.run_program(build, "all:4", "n:all")


def test_bad_arguments():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, [A, NB, N, C])
  assert mtf.halo_exchange(x, NB, N, 0) is x
  with pytest.raises(ValueError, match="halo_size must be a non-negative int"):
    mtf.halo_exchange(x, NB, N, -1)
  with pytest.raises(ValueError, match="blocks_dim 'q' is not a dimension"):
    mtf.halo_exchange(x, mtf.Dimension("q", 4), N, 1)
  with pytest.raises(ValueError, match="does not match"):
    mtf.left_halo_exchange(x, NB, mtf.Dimension("n", 5), 1)
  with pytest.raises(ValueError, match="both 'n'"):
    mtf.halo_exchange(x, N, N, 1)
  y = mtf.halo_exchange(x, NB, N, 4)
  assert y.shape == mtf.Shape([A, NB, mtf.Dimension("n", 11), C])
  assert (
    mtf.left_halo_exchange(x, NB, N, 4).shape.get_dim_by_name("n").size == 7
  )


def test_signatures():
  def params(fn):
    return [
      (p.name, p.default) for p in inspect.signature(fn).parameters.values()
    ]

  empty = inspect.Parameter.empty
  expected = [
    ("x", empty),
    ("blocks_dim", empty),
    ("block_size_dim", empty),
    ("halo_size", empty),
    ("wrap", False),
  ]
  assert params(mtf.halo_exchange) == expected
  assert params(mtf.left_halo_exchange) == expected
