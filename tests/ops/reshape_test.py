"""Tests for mesh_tensorflow._src.ops.reshape: reshape, renames, broadcast.

Each case names the communication the layouts require: none (a local
reshape), allconcat (a split disappears), alltoall (a split moves to another
dimension) and allsplit (a new split appears). A MeshImpl that records its
collective calls checks that, and the values and gradients are compared with
numpy on every case.
"""

import numpy as np
import pytest

import mesh_tensorflow as mtf
from mesh_tensorflow import placement_mesh_impl
from mesh_tensorflow._src.laid_out import LazyAllreduceSum
from tests import mesh_test_util as mtu
from tests import meshes

A = mtf.Dimension("a", 4)
B = mtf.Dimension("b", 6)
AB = mtf.Dimension("ab", 24)
X = mtf.Dimension("x", 2)
Y = mtf.Dimension("y", 2)
C = mtf.Dimension("c", 4)  # a renamed
P = mtf.Dimension("p", 4)
Q = mtf.Dimension("q", 8)
R = mtf.Dimension("r", 4)
S = mtf.Dimension("s", 8)

M1, M4, M22 = meshes.ONE_DEVICE, meshes.ALL_4, meshes.ROWS_COLS

# (mesh_shape, layout, old dims, new dims, expected collectives)
RESHAPE_CASES = [
  # [a, b] -> [ab]
  (M1, "", [A, B], [AB], set()),
  (M4, "", [A, B], [AB], set()),
  (M4, "a:all;ab:all", [A, B], [AB], set()),
  (M4, "a:all", [A, B], [AB], {"allconcat"}),
  (M4, "ab:all", [A, B], [AB], {"allsplit"}),
  (M22, "b:rows;ab:rows", [A, B], [AB], {"alltoall"}),
  (M22, "b:rows;ab:cols", [A, B], [AB], {"allconcat", "allsplit"}),
  (M22, "a:rows;b:cols;ab:rows", [A, B], [AB], {"allconcat"}),
  (M22, "a:cols;ab:cols", [A, B], [AB], set()),
  # [ab] -> [a, b]
  (M4, "ab:all", [AB], [A, B], {"allconcat"}),
  (M4, "ab:all;a:all", [AB], [A, B], set()),
  (M4, "a:all", [AB], [A, B], {"allsplit"}),
  (M22, "ab:rows;b:rows", [AB], [A, B], {"allconcat", "allsplit"}),
  (M22, "ab:rows;b:cols", [AB], [A, B], {"allconcat", "allsplit"}),
  (M22, "a:rows;b:cols", [AB], [A, B], {"allsplit"}),
  # [a, b] -> [x, y, b]
  (M22, "a:rows;x:rows", [A, B], [X, Y, B], set()),
  (M22, "a:rows;y:rows", [A, B], [X, Y, B], {"allconcat", "allsplit"}),
  (M22, "a:cols;b:rows;x:cols", [A, B], [X, Y, B], set()),
  (M22, "x:rows;y:cols", [A, B], [X, Y, B], {"allsplit"}),
  (M22, "b:cols;y:rows", [A, B], [X, Y, B], {"allsplit"}),
  # [x, y, b] -> [a, b]
  (M22, "y:rows;a:rows", [X, Y, B], [A, B], {"alltoall"}),
  (M22, "x:rows;a:rows", [X, Y, B], [A, B], set()),
  (M22, "x:rows;y:cols", [X, Y, B], [A, B], {"allconcat"}),
  (M4, "a:all", [X, Y, B], [A, B], {"allsplit"}),
  # [x, y, b] <-> [ab]
  (M22, "x:rows;ab:rows", [X, Y, B], [AB], set()),
  (M22, "b:cols;ab:rows", [X, Y, B], [AB], {"allconcat", "allsplit"}),
  (M22, "x:cols;y:rows", [X, Y, B], [AB], {"allconcat"}),
  (M4, "ab:all", [X, Y, B], [AB], {"allsplit"}),
  (M22, "ab:cols;y:rows", [AB], [X, Y, B], {"allconcat", "allsplit"}),
  (M22, "ab:cols;x:cols", [AB], [X, Y, B], set()),
  # The split moves to another dimension: alltoall.
  (M4, "p:all;s:all", [P, Q], [R, S], {"alltoall"}),
  (M4, "q:all;r:all", [P, Q], [R, S], {"alltoall"}),
  (M22, "p:rows;s:rows", [P, Q], [R, S], {"alltoall"}),
  (M22, "q:cols;r:cols", [P, Q], [R, S], {"alltoall"}),
  (
    M22,
    "p:rows;q:cols;r:cols;s:rows",
    [P, Q],
    [R, S],
    {"allconcat", "alltoall", "allsplit"},
  ),
  # Both mesh axes swap tensor dims: done as allconcat + alltoall +
  # allsplit (the rows split cannot move onto q while q is split on cols).
  (
    M22,
    "p:rows;s:rows;q:cols;r:cols",
    [P, Q],
    [R, S],
    {"allconcat", "alltoall", "allsplit"},
  ),
  # Same names, new order: a reshape reinterprets the flattened data.
  (M22, "a:rows", [A, B], [B, A], {"allconcat", "allsplit"}),
  (M22, "b:cols", [A, B], [B, A], {"alltoall"}),
  (M4, "a:all", [A, B], [B, A], {"allconcat", "allsplit"}),
  # rename_dimension a -> c.
  (M22, "a:rows;c:rows", [A, B], [C, B], set()),
  (M22, "a:rows", [A, B], [C, B], {"allconcat"}),
  (M22, "c:rows", [A, B], [C, B], {"allsplit"}),
  (M22, "a:rows;c:cols", [A, B], [C, B], {"allconcat", "allsplit"}),
  (M22, "a:rows;b:cols;c:rows", [A, B], [C, B], set()),
  (M4, "a:all", [A, B], [C, B], {"allconcat"}),
  (M4, "c:all", [A, B], [C, B], {"allsplit"}),
]


def _case_id(case):
  mesh_shape, layout, old, new, comm = case
  return "%s|%s|%s->%s|%s" % (
    mesh_shape,
    layout,
    "".join(d.name for d in old),
    "".join(d.name for d in new),
    "+".join(sorted(comm)) or "local",
  )


class RecordingMeshImpl(placement_mesh_impl.PlacementMeshImpl):
  """PlacementMeshImpl that records which collectives were called."""

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.calls = []

  def allconcat(self, x, mesh_axis, concat_axis):
    self.calls.append(("allconcat", mesh_axis))
    return super().allconcat(x, mesh_axis, concat_axis)

  def alltoall(self, x, mesh_axis, split_axis, concat_axis):
    self.calls.append(("alltoall", mesh_axis))
    return super().alltoall(x, mesh_axis, split_axis, concat_axis)

  def allsplit(self, x, mesh_axis, split_axis, which=None):
    self.calls.append(("allsplit", mesh_axis))
    return super().allsplit(x, mesh_axis, split_axis, which)


def _value(dims, seed=0):
  size = mtf.Shape(dims).size
  rng = np.random.RandomState(seed)
  return (
    np.arange(size, dtype=np.float32)
    + rng.uniform(0, 0.5, size).astype(np.float32)
  ).reshape(mtf.Shape(dims).to_integer_list)


def _new_value(x_value, old, new):
  return x_value.reshape(mtf.Shape(new).to_integer_list)


def _reshape_fn(old, new):
  """How the case turns old into new: a rename when one name changes."""
  old_names = [d.name for d in old]
  new_names = [d.name for d in new]
  if (
    len(old) == len(new)
    and sum(o != n for o, n in zip(old_names, new_names)) == 1
    and set(old_names) != set(new_names)
    and all(o.size == n.size for o, n in zip(old, new))
  ):
    i = [o != n for o, n in zip(old_names, new_names)].index(True)
    return lambda x: mtf.rename_dimension(x, old_names[i], new_names[i])
  return lambda x: mtf.reshape(x, new)


@pytest.mark.parametrize("case", RESHAPE_CASES, ids=_case_id)
def test_reshape_communication(case):
  mesh_shape, layout, old, new, comm = case
  x_value = _value(old)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.import_tf_tensor(mesh, x_value, old)
  y = _reshape_fn(old, new)(x)
  assert y.shape == mtf.Shape(new)
  n = mtf.convert_to_shape(mesh_shape).size
  mesh_impl = RecordingMeshImpl(mesh_shape, layout, mtu.DEVICES[:n])
  lowering = mtf.Lowering(graph, {mesh: mesh_impl})
  assert {kind for kind, _ in mesh_impl.calls} == comm
  keys = {
    k.split("/")[0] for k, _ in lowering.counters if k.endswith("/reshape_op")
  }
  assert keys == comm - {"allsplit"}
  for kind, mesh_axis in mesh_impl.calls:
    if kind != "allsplit":
      assert "%s/%d/reshape_op" % (kind, mesh_axis) in [
        k for k, _ in lowering.counters
      ]
  np.testing.assert_array_equal(
    lowering.export_to_tf_tensor(y).numpy(), _new_value(x_value, old, new)
  )


@pytest.mark.parametrize("case", RESHAPE_CASES, ids=_case_id)
def test_reshape_values_and_gradients(case):
  mesh_shape, layout, old, new, _ = case
  x_value = _value(old)
  w_value = _value(new, seed=1) / 10.0

  def build(mesh):
    x = mtf.import_tf_tensor(mesh, x_value, old)
    w = mtf.import_tf_tensor(mesh, w_value, new)
    y = _reshape_fn(old, new)(x)
    # A second reshape back, to check the round trip too.
    back = mtf.reshape(y, old)
    (dx,) = mtf.gradients([mtf.reduce_sum(y * w)], [x])
    return [y, back, dx]

  y, back, dx = mtu.run_program(build, mesh_shape, layout)
  np.testing.assert_array_equal(y, _new_value(x_value, old, new))
  np.testing.assert_array_equal(back, x_value)
  np.testing.assert_allclose(dx, w_value.reshape(x_value.shape), rtol=1e-6)


@pytest.mark.parametrize("mode", mtu.MODES)
def test_reshape_three_modes(mode):
  x_value = _value([P, Q])

  def build(mesh):
    x = mtf.import_tf_tensor(mesh, x_value, [P, Q])
    y = mtf.reshape(x, [R, S])
    z = mtf.reshape(x, [mtf.Dimension("pq", 32)])
    (dx,) = mtf.gradients([mtf.reduce_sum(y * y)], [x])
    return [y, z, dx]

  y, z, dx = mtu.run_program(build, M22, "p:rows;q:cols;r:cols;s:rows", mode)
  np.testing.assert_array_equal(y, x_value)
  np.testing.assert_array_equal(z, x_value.reshape(-1))
  np.testing.assert_allclose(dx, 2 * x_value)


def test_reshape_of_lazy_sum_stays_lazy():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x_value = _value([P, A, B])
  x = mtf.import_tf_tensor(mesh, x_value, [P, A, B])
  s = mtf.reduce_sum(x, output_shape=[A, B])  # p split: lazy
  y = mtf.reshape(s, [AB])  # a split both sides: local
  lowering = mtf.Lowering(
    graph, {mesh: mtu.mesh_impl_for(M22, "p:rows;a:cols;ab:cols")}
  )
  assert isinstance(lowering.tensors[y], LazyAllreduceSum)
  np.testing.assert_allclose(
    lowering.export_to_tf_tensor(y).numpy(),
    x_value.sum(0).reshape(-1),
    rtol=1e-5,
  )


def test_reshape_to_same_shape_is_identity():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.import_tf_tensor(mesh, _value([A, B]), [A, B])
  assert mtf.reshape(x, [A, B]) is x
  assert mtf.reshape(x, "a:4;b:6") is x
  assert mtf.reshape(x, [AB]).operation.name == "reshape"
  assert isinstance(mtf.reshape(x, [AB]).operation, mtf.ReshapeOperation)


# replace_dimensions.


def test_replace_dimensions_on_shapes():
  shape = mtf.Shape([A, B, P])
  assert mtf.replace_dimensions(shape, A, [X, Y]) == mtf.Shape([X, Y, B, P])
  assert mtf.replace_dimensions(shape, [A, B], AB) == mtf.Shape([AB, P])
  assert mtf.replace_dimensions(shape, [B, P], [P, B]) == mtf.Shape([A, P, B])
  assert mtf.replace_dimensions(shape, P, Q) == mtf.Shape([A, B, Q])
  assert mtf.replace_dimensions(shape, mtf.Shape([A]), mtf.Shape([C])) == (
    mtf.Shape([C, B, P])
  )
  assert mtf.replace_dimensions(shape, B, []) == mtf.Shape([A, P])
  assert mtf.replace_dimensions([("a", 4), ("b", 6)], ("a", 4), ("z", 4)) == (
    mtf.Shape([mtf.Dimension("z", 4), B])
  )
  # On Shapes sizes need not match (it is only a substitution).
  assert mtf.replace_dimensions(shape, A, Q) == mtf.Shape([Q, B, P])


def test_replace_dimensions_errors():
  shape = mtf.Shape([A, B, P])
  with pytest.raises(ValueError, match="not consecutive"):
    mtf.replace_dimensions(shape, [A, P], AB)
  with pytest.raises(ValueError, match="not consecutive"):
    mtf.replace_dimensions(shape, [B, A], AB)
  with pytest.raises(ValueError, match="'q'"):
    mtf.replace_dimensions(shape, Q, AB)
  with pytest.raises(ValueError, match="'a'"):
    mtf.replace_dimensions(shape, mtf.Dimension("a", 5), AB)


@meshes.parametrize(
  [
    (M1, ""),
    (M4, "a:all;ab:all"),
    (M22, "b:cols;x:rows"),
    (M22, "a:rows;y:cols"),
  ],
  "mesh_layout",
)
def test_replace_dimensions_on_tensors(mesh_layout):
  x_value = _value([A, B, P])

  def build(mesh):
    t = mtf.import_tf_tensor(mesh, x_value, [A, B, P])
    split = mtf.replace_dimensions(t, A, [X, Y])
    merged = mtf.replace_dimensions(split, [X, Y, B], AB)
    assert split.shape == mtf.Shape([X, Y, B, P])
    assert merged.shape == mtf.Shape([AB, P])
    (dt,) = mtf.gradients([mtf.reduce_sum(merged * merged)], [t])
    return [split, merged, dt]

  split, merged, dt = mtu.run_program(build, *mesh_layout)
  np.testing.assert_array_equal(split, x_value.reshape(2, 2, 6, 4))
  np.testing.assert_array_equal(merged, x_value.reshape(24, 4))
  np.testing.assert_allclose(dt, 2 * x_value, rtol=1e-6)


def test_reshape_errors():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.import_tf_tensor(mesh, _value([A, B]), [A, B])
  with pytest.raises(ValueError, match="size"):
    mtf.reshape(x, [A])
  with pytest.raises(ValueError, match="size"):
    mtf.replace_dimensions(x, A, X)
  with pytest.raises(ValueError, match="'zz'"):
    mtf.rename_dimension(x, "zz", "c")
  with pytest.raises(ValueError, match="not consecutive"):
    mtf.replace_dimensions(mtf.reshape(x, [X, Y, B]), [X, B], AB)
  # Renaming to an existing dimension (same name and size) is a duplicate.
  with pytest.raises(ValueError, match="'b'"):
    mtf.rename_dimension(
      mtf.zeros(mesh, [A, mtf.Dimension("c", 6), B]), "c", "b"
    )


def test_rename_dimension_shape():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.import_tf_tensor(mesh, _value([A, B]), [A, B])
  y = mtf.rename_dimension(x, "a", "c")
  assert y.shape == mtf.Shape([C, B])
  assert isinstance(y.operation, mtf.ReshapeOperation)


def test_split_does_not_divide_raises_naming_dim():
  def build(mesh):
    x = mtf.import_tf_tensor(mesh, _value([A, B]), [A, B])
    return [mtf.reshape(x, [AB])]

  with pytest.raises(ValueError, match="'b'.*'all'"):
    mtu.run_program(build, M4, "b:all")


# broadcast.


@meshes.parametrize(
  [
    (M1, ""),
    (M4, "a:all"),
    (M4, "p:all"),
    (M22, "a:rows;p:cols"),
    (M22, "b:rows;p:cols"),
    (M22, "p:rows;a:cols"),
  ],
  "mesh_layout",
)
def test_broadcast(mesh_layout):
  x_value = _value([A])
  w_value = _value([P, B, A], seed=2)

  def build(mesh):
    x = mtf.import_tf_tensor(mesh, x_value, [A])
    y = mtf.broadcast(x, [P, B, A])
    z = mtf.broadcast(
      mtf.import_tf_tensor(mesh, _value([A, B]), [A, B]), [B, P, A]
    )
    assert isinstance(y.operation, mtf.BroadcastOperation)
    (dx,) = mtf.gradients(
      [mtf.reduce_sum(y * mtf.import_tf_tensor(mesh, w_value, [P, B, A]))], [x]
    )
    return [y, z, dx]

  y, z, dx = mtu.run_program(build, *mesh_layout)
  np.testing.assert_array_equal(y, np.broadcast_to(x_value, (4, 6, 4)))
  np.testing.assert_array_equal(
    z, np.broadcast_to(_value([A, B]).T[:, None, :], (6, 4, 4))
  )
  np.testing.assert_allclose(dx, w_value.sum((0, 1)), rtol=1e-5)


def test_broadcast_errors_and_identity():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.import_tf_tensor(mesh, _value([A, B]), [A, B])
  assert mtf.broadcast(x, [A, B]) is x
  with pytest.raises(ValueError, match="'b'"):
    mtf.broadcast(x, [A, P])


def test_new_layout_that_does_not_divide_raises_naming_dim():
  def build(mesh):
    # The split moves from p (alltoall) onto x, which 4 does not divide.
    x = mtf.import_tf_tensor(mesh, _value([Q, P]), [Q, P])
    return [mtf.reshape(x, [X, mtf.Dimension("w", 8), Y])]

  with pytest.raises(ValueError, match="'x'.*'all'"):
    mtu.run_program(build, M4, "p:all;x:all")


def _random_reshape_cases(n, seed=0):
  """Random reshapes between shapes of 32 elements under random layouts."""
  rng = np.random.RandomState(seed)
  sizes = [
    [32],
    [2, 16],
    [16, 2],
    [4, 8],
    [8, 4],
    [2, 2, 8],
    [2, 8, 2],
    [4, 4, 2],
    [2, 4, 4],
    [4, 2, 4],
  ]
  cases = []
  while len(cases) < n:
    old = sizes[rng.randint(len(sizes))]
    new = sizes[rng.randint(len(sizes))]
    old_dims = [mtf.Dimension("o%d" % i, s) for i, s in enumerate(old)]
    new_dims = [
      mtf.Dimension(
        "o%d" % i
        if i < len(old) and old[i] == s and rng.rand() < 0.4
        else "n%d" % i,
        s,
      )
      for i, s in enumerate(new)
    ]
    mesh_shape = [M4, M22][rng.randint(2)]
    mesh_dims = ["all"] if mesh_shape == M4 else ["rows", "cols"]
    names = sorted({d.name for d in old_dims + new_dims})
    layout = ";".join(
      "%s:%s" % (name, mesh_dims[rng.randint(len(mesh_dims))])
      for name in names
      if rng.rand() < 0.5
    )
    try:
      impl = mtu.mesh_impl_for(mesh_shape, layout)
      impl.slice_shape(old_dims)
      impl.slice_shape(new_dims)
    except ValueError:
      continue  # not a valid layout for these shapes
    cases.append((mesh_shape, layout, old_dims, new_dims))
  return cases


@pytest.mark.parametrize(
  "case",
  _random_reshape_cases(40),
  ids=lambda c: (
    "%s|%s|%s->%s"
    % (c[0], c[1], [d.size for d in c[2]], [d.name + str(d.size) for d in c[3]])
  ),
)
def test_random_reshapes(case):
  mesh_shape, layout, old, new = case
  x_value = _value(old)

  def build(mesh):
    return [mtf.reshape(mtf.import_tf_tensor(mesh, x_value, old), new)]

  [y] = mtu.run_program(build, mesh_shape, layout)
  np.testing.assert_array_equal(y, x_value.reshape([d.size for d in new]))
