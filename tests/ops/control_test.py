"""Tests for mtf.while_loop, mtf.depend and Graph.clone_operations.

Loops run on the 1-device mesh, the 4-device 1-d mesh and the 2x2 mesh under
layouts that split the loop's contracted/reduced dims (allreduce inside the
loop or once after it), and are compared with numpy.
"""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import placement_mesh_impl
from tests import mesh_test_util as mtu
from tests import meshes

BATCH = mtf.Dimension("batch", 4)
N = mtf.Dimension("n", 4)
M = mtf.Dimension("m", 8)

_RNG = np.random.RandomState(0)
X = _RNG.uniform(-1.0, 1.0, size=(4, 4)).astype(np.float32)
W1 = (_RNG.uniform(-1.0, 1.0, size=(4, 8)) * 0.4).astype(np.float32)
W2 = (_RNG.uniform(-1.0, 1.0, size=(8, 4)) * 0.4).astype(np.float32)

NUM_STEPS = 3


def _counter_loop(mesh):
  i0 = mtf.constant(mesh, 0, dtype=tf.int32)
  total0 = mtf.zeros(mesh, [BATCH, N])
  x = mtf.import_tf_tensor(mesh, X, [BATCH, N])
  i, total = mtf.while_loop(
    lambda i, t: mtf.less(i, 5), lambda i, t: [i + 1, t + x], [i0, total0]
  )
  return [i, total]


def _einsum_loop(mesh):
  """s <- tanh(s @ W1) @ W2, NUM_STEPS times; contracts n, then m."""
  x = mtf.import_tf_tensor(mesh, X, [BATCH, N])
  w1 = mtf.import_tf_tensor(mesh, W1, [N, M])
  w2 = mtf.import_tf_tensor(mesh, W2, [M, N])

  def body(i, s):
    h = mtf.einsum([s, w1], output_shape=[BATCH, M])
    return [i + 1, mtf.einsum([mtf.tanh(h), w2], output_shape=[BATCH, N])]

  i, s = mtf.while_loop(
    lambda i, s: mtf.less(i, NUM_STEPS),
    body,
    [mtf.constant(mesh, 0, dtype=tf.int32), x],
  )
  return [i, s]


def _einsum_loop_expected():
  s = X
  for _ in range(NUM_STEPS):
    s = np.tanh(s @ W1) @ W2
  return [np.int32(NUM_STEPS), s]


@meshes.parametrize(meshes.CONTROL_OPS_PER_MESH)
@pytest.mark.parametrize("mode", mtu.MODES)
def test_while_loop_modes(mesh_shape, layout, mode):
  i, total = mtu.run_program(_counter_loop, mesh_shape, layout, mode)
  assert i == 5
  np.testing.assert_allclose(total, 5 * X, rtol=1e-5)
  mtu.assert_all_close(
    mtu.run_program(_einsum_loop, mesh_shape, layout, mode),
    _einsum_loop_expected(),
  )


@meshes.parametrize(meshes.CONTROL_OPS)
def test_while_loop_einsum_layouts(mesh_shape, layout):
  mtu.assert_all_close(
    mtu.run_program(_einsum_loop, mesh_shape, layout), _einsum_loop_expected()
  )


def _accumulator_loop(mesh):
  """Accumulates sum_n(x) * i over i = 0..NUM_STEPS-1 and sum_batch(x)."""
  x = mtf.import_tf_tensor(mesh, X, [BATCH, N])

  def body(i):
    scale = mtf.cast(i, tf.float32)
    return [
      i + 1,
      mtf.reduce_sum(x * scale, output_shape=[BATCH]),
      mtf.reduce_sum(x, output_shape=[N]),
    ]

  return mtf.while_loop(
    lambda i: mtf.less(i, NUM_STEPS),
    body,
    [mtf.constant(mesh, 0, dtype=tf.int32)],
    has_accumulators=True,
  )


def _accumulator_expected():
  steps = np.arange(NUM_STEPS).sum()
  return [np.int32(NUM_STEPS), X.sum(axis=1) * steps, X.sum(axis=0) * NUM_STEPS]


@meshes.parametrize(meshes.CONTROL_OPS)
def test_while_loop_accumulators(mesh_shape, layout):
  mtu.assert_all_close(
    mtu.run_program(_accumulator_loop, mesh_shape, layout),
    _accumulator_expected(),
  )


@pytest.mark.parametrize("mode", mtu.MODES)
def test_while_loop_accumulators_modes(mode):
  mtu.assert_all_close(
    mtu.run_program(
      _accumulator_loop, "rows:2;cols:2", "n:rows;batch:cols", mode
    ),
    _accumulator_expected(),
  )


def test_while_loop_accumulator_allreduced_once_after_loop():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  with mtf.variable_store(mtf.VariableStore()):
    outputs = _accumulator_loop(mesh)
    lowering = mtf.Lowering(graph, {mesh: mtu.mesh_impl_for("all:4", "n:all")})
    values = [lowering.export_to_tf_tensor(t) for t in outputs]
  mtu.assert_all_close(values, _accumulator_expected())
  # Eager runs the body NUM_STEPS times; the split-n sum is reduced once.
  allreduces = [k for k, _ in lowering.counters if k.startswith("allreduce/")]
  assert allreduces == ["allreduce/[0]/reduce_op"]


def test_while_loop_ops_kept_out_of_graph_and_variables_hoisted():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.import_tf_tensor(mesh, X, [BATCH, N])

  def body(i, s):
    w = mtf.get_variable(mesh, "w", [N], initializer=tf.ones_initializer())
    return [i + 1, s + w]

  before = len(graph.operations)
  with mtf.variable_store(mtf.VariableStore()):
    i, s = mtf.while_loop(
      lambda i, s: mtf.less(i, 2),
      body,
      [mtf.constant(mesh, 0, dtype=tf.int32), x],
    )
    loop_op = s.operation
    new_ops = graph.operations[before:]
    # The constant, the hoisted variable, then the loop itself.
    assert [type(op).__name__ for op in new_ops] == [
      "Constant",
      "Variable",
      "WhileLoopOperation",
    ]
    assert not set(loop_op.body_operations) & set(graph.operations)
    assert not loop_op.has_gradient
    lowering = mtf.Lowering(graph, {mesh: mtu.mesh_impl_for("all:4", "n:all")})
    np.testing.assert_allclose(
      lowering.export_to_tf_tensor(s), X + 2.0, rtol=1e-6
    )
    assert int(lowering.export_to_tf_tensor(i)) == 2


@pytest.mark.parametrize("mode", mtu.MODES)
def test_while_loop_with_hoisted_variable_modes(mode):
  def build(mesh):
    x = mtf.import_tf_tensor(mesh, X, [BATCH, N])

    def body(i, s):
      w = mtf.get_variable(mesh, "w", [N], initializer=tf.ones_initializer())
      return [i + 1, s + w]

    return mtf.while_loop(
      lambda i, s: mtf.less(i, 2),
      body,
      [mtf.constant(mesh, 0, dtype=tf.int32), x],
    )

  _, s = mtu.run_program(build, "rows:2;cols:2", "batch:rows;n:cols", mode)
  np.testing.assert_allclose(s, X + 2.0, rtol=1e-6)


def test_while_loop_maximum_iterations_kwarg():
  def build(mesh):
    return mtf.while_loop(
      lambda i: mtf.less(i, 100),
      lambda i: [i + 1],
      [mtf.constant(mesh, 0, dtype=tf.int32)],
      maximum_iterations=4,
    )

  [i] = mtu.run_program(build, "all:4", "")
  assert i == 4


def test_while_loop_shape_change_raises():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, [BATCH, N])
  with pytest.raises(ValueError, match=r"body_fn output 1 has shape"):
    mtf.while_loop(
      lambda i, s: mtf.less(i, 2),
      lambda i, s: [i + 1, mtf.reduce_sum(s, output_shape=[N])],
      [mtf.constant(mesh, 0, dtype=tf.int32), x],
    )
  with pytest.raises(ValueError, match=r"body_fn output 0 .* dtype float32"):
    mtf.while_loop(
      lambda i: mtf.less(i, 2),
      lambda i: [mtf.cast(i, tf.float32)],
      [mtf.constant(mesh, 0, dtype=tf.int32)],
    )
  with pytest.raises(ValueError, match=r"has_accumulators=True"):
    mtf.while_loop(
      lambda i: mtf.less(i, 2),
      lambda i: [i + 1, i],
      [mtf.constant(mesh, 0, dtype=tf.int32)],
    )
  with pytest.raises(ValueError, match=r"scalar boolean"):
    mtf.while_loop(
      lambda i: i, lambda i: [i + 1], [mtf.constant(mesh, 0, dtype=tf.int32)]
    )


def test_while_loop_num_loop_vars_not_supported():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  i0 = mtf.constant(mesh, 0, dtype=tf.int32)
  with pytest.raises(NotImplementedError, match="num_loop_vars=1"):
    mtf.while_loop(
      lambda i, j: mtf.less(i, 2),
      lambda i, j: [i + 1, j],
      [i0, i0],
      num_loop_vars=1,
    )


def _depend_program(mesh):
  v = mtf.get_variable(
    mesh, "v", [BATCH, N], initializer=tf.constant_initializer(X)
  )
  update = mtf.assign(v, v * 2.0 + 1.0)
  v_new = mtf.depend(v, [update])
  x = mtf.import_tf_tensor(mesh, X, [BATCH, N])
  x_after = mtf.depend(x, [v_new])
  return [v_new, x_after]


@pytest.mark.parametrize("mode", mtu.MODES)
@meshes.parametrize(
  [("", ""), ("all:4", "n:all"), ("rows:2;cols:2", "batch:rows;n:cols")]
)
def test_depend_sees_assigned_value(mesh_shape, layout, mode):
  v_new, x_after = mtu.run_program(_depend_program, mesh_shape, layout, mode)
  np.testing.assert_allclose(v_new, X * 2.0 + 1.0, rtol=1e-6)
  np.testing.assert_allclose(x_after, X)


def test_depend_gradient_is_identity():
  def build(mesh):
    x = mtf.import_tf_tensor(mesh, X, [BATCH, N])
    y = mtf.depend(x * x, [mtf.zeros(mesh, [M])])
    [dx] = mtf.gradients([mtf.reduce_sum(y)], [x])
    return [dx]

  mtu.assert_all_close(mtu.run_program(build, "all:4", "batch:all"), [2 * X])


class _NoControlDepsMeshImpl(placement_mesh_impl.PlacementMeshImpl):
  @property
  def supports_control_dependencies(self) -> bool:
    return False


def test_depend_raises_without_control_dependencies():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, [BATCH])
  mtf.depend(x, [mtf.ones(mesh, [BATCH])])
  impl = _NoControlDepsMeshImpl("all:4", "", mtu.DEVICES[:4])
  with pytest.raises(ValueError, match="does not support control dependencies"):
    mtf.Lowering(graph, {mesh: impl})
  with pytest.raises(ValueError, match="must be mtf Operations or Tensors"):
    mtf.depend(x, ["not an op"])


def test_clone_operations_recomputes_on_new_inputs():
  def build(mesh):
    x = mtf.import_tf_tensor(mesh, X, [BATCH, N])
    w1 = mtf.import_tf_tensor(mesh, W1, [N, M])
    graph = mesh.graph
    n = len(graph.operations)
    h = mtf.relu(mtf.einsum([x, w1], output_shape=[BATCH, M]))
    noise = mtf.random_uniform(mesh, [BATCH, M])
    y = h * noise
    forward = graph.operations[n:]
    x2 = mtf.import_tf_tensor(mesh, -X, [BATCH, N])
    new_ops, mapping = graph.clone_operations(forward, {x: x2})
    # Random operations are shared, not copied.
    assert noise.operation not in new_ops and noise not in mapping
    assert len(new_ops) == len(forward) - 1
    assert all(op in graph.operations for op in new_ops)
    assert mapping[y].operation in new_ops and mapping[y] is not y
    return [y, mapping[y], noise]

  y, y2, noise = mtu.run_program(build, "rows:2;cols:2", "batch:rows;m:cols")
  np.testing.assert_allclose(y, np.maximum(X @ W1, 0) * noise, rtol=1e-5)
  np.testing.assert_allclose(y2, np.maximum(-X @ W1, 0) * noise, rtol=1e-5)
