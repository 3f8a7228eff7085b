"""Tests for mesh_tensorflow._src.ops.tensor_ops: concat, split, stack, unstack,
slice and pad.

Each op is run on the 1-device mesh, the 4-device 1-d mesh and the 2x2 mesh
under layouts splitting the other dims; values and gradients (of
reduce_sum(out * fixed_random_weights)) are compared with numpy. Splitting the
operated dim must raise a ValueError naming it.
"""

import numpy as np
import pytest

import mesh_tensorflow as mtf
from tests import mesh_test_util as mtu
from tests import meshes

A = mtf.Dimension("a", 4)
C = mtf.Dimension("c", 4)


_RNG = np.random.RandomState(0)


def _rand(*shape):
  return _RNG.uniform(-1.0, 1.0, size=shape).astype(np.float32)


def _import(mesh, value, dims):
  return mtf.import_tf_tensor(mesh, value, mtf.Shape(dims))


def _weighted_sum(mesh, ys, ws):
  """sum_i reduce_sum(ys[i] * ws[i]) with ws numpy arrays of ys' shapes."""
  total = None
  for y, w in zip(ys, ws):
    term = mtf.reduce_sum(y * mtf.constant(mesh, w, y.shape))
    total = term if total is None else total + term
  return total


def _run_everywhere(
  build, expected, mesh_layouts=meshes.TENSOR_OPS, modes=("eager",)
):
  for mode in modes:
    for mesh_shape, layout in mesh_layouts:
      out = mtu.run_program(build, mesh_shape, layout, mode)
      mtu.assert_all_close(
        out, expected, msg="%s %s|%s" % (mode, mesh_shape, layout)
      )


# ------------------------------------------------------------------ concat


@pytest.mark.parametrize("mode", mtu.MODES)
def test_concat_and_split_all_modes(mode):
  x1, x2 = _rand(4, 3, 4), _rand(4, 5, 4)
  w = _rand(4, 8, 4)
  w_pieces = [_rand(4, 2, 4), _rand(4, 6, 4)]

  def build(mesh):
    n1, n2 = mtf.Dimension("n", 3), mtf.Dimension("n", 5)
    t1, t2 = _import(mesh, x1, [A, n1, C]), _import(mesh, x2, [A, n2, C])
    y = mtf.concat([t1, t2], "n")
    pieces = mtf.split(y, y.shape.get_dim_by_name("n"), [2, 6])
    loss = _weighted_sum(mesh, [y], [w]) + _weighted_sum(mesh, pieces, w_pieces)
    g1, g2 = mtf.gradients([loss], [t1, t2])
    return [y] + pieces + [g1, g2]

  y = np.concatenate([x1, x2], axis=1)
  g = w + np.concatenate(w_pieces, axis=1)
  expected = [y, y[:, :2], y[:, 2:], g[:, :3], g[:, 3:]]
  _run_everywhere(
    build,
    expected,
    mesh_layouts=[
      ("", ""),
      ("all:4", "a:all"),
      ("rows:2;cols:2", "a:rows;c:cols"),
    ],
    modes=(mode,),
  )


@meshes.parametrize(meshes.TENSOR_OPS)
def test_concat_three_inputs_with_gradient(mesh_shape, layout):
  xs = [_rand(4, 2, 4), _rand(4, 1, 4), _rand(4, 3, 4)]
  w = _rand(4, 6, 4)

  def build(mesh):
    ts = [_import(mesh, x, [A, mtf.Dimension("n", x.shape[1]), C]) for x in xs]
    y = mtf.concat(ts, "n")
    return [y] + mtf.gradients([_weighted_sum(mesh, [y], [w])], ts)

  expected = [np.concatenate(xs, axis=1), w[:, :2], w[:, 2:3], w[:, 3:]]
  _run_everywhere(build, expected, [(mesh_shape, layout)])


def test_concat_along_first_and_last_axis():
  x1, x2 = _rand(2, 4), _rand(3, 4)

  def build(mesh):
    t1 = _import(mesh, x1, [mtf.Dimension("n", 2), C])
    t2 = _import(mesh, x2, [mtf.Dimension("n", 3), C])
    u1 = _import(mesh, x1.T, [C, mtf.Dimension("n", 2)])
    u2 = _import(mesh, x2.T, [C, mtf.Dimension("n", 3)])
    return [mtf.concat([t1, t2], "n"), mtf.concat([u1, u2], "n")]

  y = np.concatenate([x1, x2], 0)
  _run_everywhere(
    build, [y, y.T], [("", ""), ("all:4", "c:all"), ("rows:2;cols:2", "c:cols")]
  )


def test_concat_of_lazy_allreduce_sums():
  # reduce_sum over a split dim is a lazy allreduce; concat keeps it lazy.
  x1, x2 = _rand(4, 4, 2), _rand(4, 4, 3)

  def build(mesh):
    b = mtf.Dimension("b", 4)
    t1 = _import(mesh, x1, [A, b, mtf.Dimension("n", 2)])
    t2 = _import(mesh, x2, [A, b, mtf.Dimension("n", 3)])
    s1 = mtf.reduce_sum(t1, reduced_dim=b)
    s2 = mtf.reduce_sum(t2, reduced_dim=b)
    return [mtf.concat([s1, s2], "n")]

  expected = [np.concatenate([x1.sum(1), x2.sum(1)], axis=1)]
  _run_everywhere(
    build, expected, [("all:4", "b:all"), ("rows:2;cols:2", "b:rows;a:cols")]
  )


def test_concat_shape_errors():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  n3, n5 = mtf.Dimension("n", 3), mtf.Dimension("n", 5)
  x = mtf.zeros(mesh, [A, n3, C])
  with pytest.raises(ValueError, match="dimension 'a' has size 4 vs 2"):
    mtf.concat([x, mtf.zeros(mesh, [mtf.Dimension("a", 2), n5, C])], "n")
  with pytest.raises(ValueError, match="only dimension 'n' may differ"):
    mtf.concat([x, mtf.zeros(mesh, [C, n5, A])], "n")
  with pytest.raises(ValueError, match="'n'"):
    mtf.concat([x, mtf.zeros(mesh, [A, C])], "n")
  with pytest.raises(ValueError, match="dimension 'q' is not in"):
    mtf.concat([x, x], "q")
  with pytest.raises(ValueError, match="dtype"):
    mtf.concat([x, mtf.zeros(mesh, [A, n5, C], dtype="int32")], "n")
  with pytest.raises(ValueError, match="at least one"):
    mtf.concat([], "n")


# ------------------------------------------------------------------- split


@meshes.parametrize(meshes.TENSOR_OPS)
def test_split_equal_and_sizes_with_gradient(mesh_shape, layout):
  x = _rand(4, 8, 4)
  w0, w2 = _rand(4, 3, 4), _rand(4, 4, 4)
  wq = _rand(4, 2, 4)

  def build(mesh):
    n = mtf.Dimension("n", 8)
    t = _import(mesh, x, [A, n, C])
    quarters = mtf.split(t, n, 4)
    pieces = mtf.split(t, "n", [3, 1, 4])
    # Piece 1 and quarters 0, 1, 3 are unused: their gradients are zeros.
    loss = _weighted_sum(
      mesh, [pieces[0], pieces[2], quarters[2]], [w0, w2, wq]
    )
    [g] = mtf.gradients([loss], [t])
    return quarters + pieces + [g]

  g = np.zeros_like(x)
  g[:, :3] += w0
  g[:, 4:] += w2
  g[:, 4:6] += wq
  expected = [x[:, 2 * i : 2 * i + 2] for i in range(4)] + [
    x[:, :3],
    x[:, 3:4],
    x[:, 4:],
    g,
  ]
  _run_everywhere(build, expected, [(mesh_shape, layout)])


def test_split_shapes_and_names():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  n = mtf.Dimension("n", 6)
  x = mtf.zeros(mesh, [A, n])
  pieces = mtf.split(x, n, 3)
  assert isinstance(pieces, list)
  assert [p.shape for p in pieces] == [mtf.Shape([A, ("n", 2)])] * 3
  assert len({p.name for p in pieces}) == 3
  assert [p.shape.dims[1].size for p in mtf.split(x, n, (1, 0, 5))] == [1, 0, 5]


def test_split_errors():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  n = mtf.Dimension("n", 8)
  x = mtf.zeros(mesh, [A, n])
  with pytest.raises(ValueError, match=r"dimension 'n' \(size 8\) into 3"):
    mtf.split(x, n, 3)
  with pytest.raises(ValueError, match=r"'n' \(size 8\).*sum to 7"):
    mtf.split(x, n, [3, 4])
  with pytest.raises(ValueError, match="'n'"):
    mtf.split(x, n, [9, -1])
  with pytest.raises(ValueError, match="'n'"):
    mtf.split(x, n, 0)
  with pytest.raises(ValueError, match="dimension 'q' is not in"):
    mtf.split(x, mtf.Dimension("q", 8), 2)
  with pytest.raises(ValueError, match="does not match"):
    mtf.split(x, mtf.Dimension("n", 4), 2)


# ------------------------------------------------------------ stack/unstack


@meshes.parametrize(meshes.TENSOR_OPS)
def test_stack_axes_with_gradient(mesh_shape, layout):
  xs = [_rand(4, 4) for _ in range(3)]
  ws = [_rand(3, 4, 4), _rand(4, 3, 4), _rand(4, 4, 3), _rand(4, 3, 4)]

  def build(mesh):
    ts = [_import(mesh, x, [A, C]) for x in xs]
    ys = [
      mtf.stack(ts, "s", axis=0),
      mtf.stack(ts, "s", axis=1),
      mtf.stack(ts, "s", axis=-1),
      mtf.stack(ts, "s", axis=-2),
    ]
    assert ys[2].shape.dimension_names == ["a", "c", "s"]
    assert ys[3].shape.dimension_names == ["a", "s", "c"]
    return ys + mtf.gradients([_weighted_sum(mesh, ys, ws)], ts)

  expected = [
    np.stack(xs, 0),
    np.stack(xs, 1),
    np.stack(xs, 2),
    np.stack(xs, 1),
  ]
  expected += [
    ws[0][i] + ws[1][:, i] + ws[2][:, :, i] + ws[3][:, i] for i in range(3)
  ]
  _run_everywhere(build, expected, [(mesh_shape, layout)])


@meshes.parametrize(meshes.TENSOR_OPS)
def test_unstack_with_gradient(mesh_shape, layout):
  x = _rand(4, 3, 4)
  w0, w2 = _rand(4, 4), _rand(4, 4)

  def build(mesh):
    n = mtf.Dimension("n", 3)
    t = _import(mesh, x, [A, n, C])
    ys = mtf.unstack(t, n)
    assert isinstance(ys, list) and len(ys) == 3
    assert ys[0].shape == mtf.Shape([A, C])
    # ys[1] is unused: its gradient slot is zero.
    [g] = mtf.gradients([_weighted_sum(mesh, [ys[0], ys[2]], [w0, w2])], [t])
    return ys + [g]

  g = np.zeros_like(x)
  g[:, 0], g[:, 2] = w0, w2
  _run_everywhere(build, [x[:, 0], x[:, 1], x[:, 2], g], [(mesh_shape, layout)])


def test_stack_unstack_roundtrip_all_modes():
  x = _rand(4, 2, 4)

  def build(mesh):
    t = _import(mesh, x, [A, mtf.Dimension("n", 2), C])
    return [mtf.stack(mtf.unstack(t, "n"), "m", axis=-1)]

  _run_everywhere(
    build,
    [np.transpose(x, (0, 2, 1))],
    [("rows:2;cols:2", "a:rows;c:cols")],
    modes=mtu.MODES,
  )


def test_stack_errors():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, [A, C])
  with pytest.raises(ValueError, match="stack along 's': tensor 1"):
    mtf.stack([x, mtf.zeros(mesh, [C, A])], "s")
  with pytest.raises(ValueError, match="'a' is already in"):
    mtf.stack([x, x], "a")
  with pytest.raises(ValueError, match="axis 4 out of range"):
    mtf.stack([x, x], "s", axis=4)
  with pytest.raises(ValueError, match="out of range"):
    mtf.stack([x, x], "s", axis=-4)
  with pytest.raises(ValueError, match="dimension 'q' is not in"):
    mtf.unstack(x, "q")


# --------------------------------------------------------------- slice/pad


@meshes.parametrize(meshes.TENSOR_OPS)
def test_slice_and_pad_with_gradient(mesh_shape, layout):
  x = _rand(4, 8, 4)
  ws, wp = _rand(4, 3, 4), _rand(4, 11, 4)

  def build(mesh):
    t = _import(mesh, x, [A, mtf.Dimension("n", 8), C])
    s = mtf.mtf_slice(t, 2, 3, "n")
    p = mtf.pad(t, [1, 2], "n")
    [g] = mtf.gradients([_weighted_sum(mesh, [s, p], [ws, wp])], [t])
    return [s, p, mtf.mtf_slice(t, 0, 8, "n"), mtf.pad(t, [0, 0], "n"), g]

  pad = np.pad(x, [[0, 0], [1, 2], [0, 0]])
  g = wp[:, 1:9].copy()
  g[:, 2:5] += ws
  _run_everywhere(build, [x[:, 2:5], pad, x, x, g], [(mesh_shape, layout)])


def test_slice_and_pad_all_modes_and_lazy_input():
  x = _rand(4, 4, 6)

  def build(mesh):
    b = mtf.Dimension("b", 4)
    t = _import(mesh, x, [A, b, mtf.Dimension("n", 6)])
    s = mtf.reduce_sum(t, reduced_dim=b)  # Lazy allreduce when b is split.
    return [mtf.pad(mtf.mtf_slice(s, 1, 4, "n"), [2, 0], "n")]

  y = np.pad(x.sum(1)[:, 1:5], [[0, 0], [2, 0]])
  _run_everywhere(
    build,
    [y],
    [("", ""), ("all:4", "b:all"), ("rows:2;cols:2", "b:rows;a:cols")],
    modes=mtu.MODES,
  )


def test_slice_and_pad_errors():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, [A, mtf.Dimension("n", 8)])
  for begin, size in [(6, 3), (-1, 2), (0, 9), (2, -1)]:
    with pytest.raises(ValueError, match=r"'n' \(size 8\).*out of range"):
      mtf.mtf_slice(x, begin, size, "n")
  with pytest.raises(ValueError, match="dimension 'q' is not in"):
    mtf.mtf_slice(x, 0, 1, "q")
  with pytest.raises(ValueError, match="pad of dimension 'n'"):
    mtf.pad(x, [1], "n")
  with pytest.raises(ValueError, match="pad of dimension 'n'"):
    mtf.pad(x, [1, -1], "n")
  with pytest.raises(ValueError, match="dimension 'q' is not in"):
    mtf.pad(x, [1, 1], "q")


# ---------------------------------------------- operated dim split: errors


def _concat(mesh):
  n = mtf.Dimension("n", 4)
  return [mtf.concat([mtf.zeros(mesh, [A, n]), mtf.ones(mesh, [A, n])], "n")]


def _split(mesh):
  n = mtf.Dimension("n", 8)
  return mtf.split(mtf.zeros(mesh, [A, n]), n, 2)


def _stack(mesh):
  return [mtf.stack([mtf.zeros(mesh, [A])] * 4, "n")]


def _unstack(mesh):
  n = mtf.Dimension("n", 4)
  return mtf.unstack(mtf.zeros(mesh, [A, n]), n)


def _slice(mesh):
  return [mtf.mtf_slice(mtf.zeros(mesh, [A, mtf.Dimension("n", 8)]), 0, 4, "n")]


def _pad(mesh):
  return [mtf.pad(mtf.zeros(mesh, [A, mtf.Dimension("n", 4)]), [2, 2], "n")]


@pytest.mark.parametrize(
  "build", [_concat, _split, _stack, _unstack, _slice, _pad]
)
@meshes.parametrize([("all:4", "n:all"), ("rows:2;cols:2", "a:rows;n:cols")])
def test_operated_dim_split_raises(build, mesh_shape, layout):
  with pytest.raises(ValueError, match="dimension 'n' over mesh dimension"):
    mtu.run_program(build, mesh_shape, layout)


def test_splittability_recorded():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  n = mtf.Dimension("n", 4)
  x = mtf.zeros(mesh, [A, n, C])
  ops = [
    mtf.concat([x, x], "n").operation,
    mtf.split(x, n, 2)[0].operation,
    mtf.unstack(x, n)[0].operation,
    mtf.mtf_slice(x, 0, 2, "n").operation,
    mtf.pad(x, [1, 1], "n").operation,
    mtf.stack([mtf.zeros(mesh, [A, C])], "n", axis=1).operation,
  ]
  for op in ops:
    assert op.unsplittable_dims == frozenset(["n"]), op
    assert op.splittable_dims == frozenset(["a", "c"]), op
  assert isinstance(ops[0], mtf.ConcatOperation)
  assert isinstance(ops[1], mtf.SplitOperation)
  assert isinstance(ops[2], mtf.UnstackOperation)
  assert isinstance(ops[3], mtf.SliceOperation)
  assert isinstance(ops[4], mtf.PadOperation)
  assert isinstance(ops[5], mtf.StackOperation)


def test_operation_classes_directly():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  n = mtf.Dimension("n", 4)
  x = mtf.zeros(mesh, [A, n])
  assert mtf.StackOperation([x, x], "s", -1).outputs[0].shape == mtf.Shape(
    [A, n, ("s", 2)]
  )
  assert len(mtf.UnstackOperation(x, n).outputs) == 4
  assert mtf.SliceOperation(x, 1, 2, "n").outputs[0].shape == mtf.Shape(
    [A, ("n", 2)]
  )
  assert mtf.PadOperation(x, [1, 0], "n").outputs[0].shape == mtf.Shape(
    [A, ("n", 5)]
  )
  assert len(mtf.SplitOperation(x, n, [1, 3]).outputs) == 2
  assert mtf.ConcatOperation([x, x], "n", name="cc").name == "cc"
