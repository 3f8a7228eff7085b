"""SimdMeshImpl's collective backend traces the replica program once.

The program is traced as one function of the replica's pnum and called on
every replica's device: the tests count the calls of the Python program
(once per replicate, whatever the number of replicas) and check the results
against PlacementMeshImpl and numpy, in a tf.function, eagerly and in a
tf.compat.v1 graph.
"""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import simd_mesh_impl
from mesh_tensorflow._src.mesh_impls import simd_collective
from tests import mesh_test_util as mtu
from tests import meshes

DEVICES = ["/cpu:%d" % i for i in range(8)]
# Physical pnum p runs on SHUFFLED[p]: collective ranks differ from group
# positions, so the rank tables looked up by the pnum tensor are exercised.
SHUFFLED = ["/cpu:3", "/cpu:1", "/cpu:0", "/cpu:2"]

BATCH = mtf.Dimension("batch", 8)
D_IN = mtf.Dimension("d_in", 4)
HIDDEN = mtf.Dimension("hidden", 8)
D_OUT = mtf.Dimension("d_out", 4)


def _train_step(mesh, x, y):
  """One SGD step of a two-layer MLP (with a shift); the loss, the updates."""
  w1 = mtf.get_variable(
    mesh,
    "w1",
    [D_IN, HIDDEN],
    initializer=tf.random_normal_initializer(seed=1),
  )
  w2 = mtf.get_variable(
    mesh,
    "w2",
    [HIDDEN, D_OUT],
    initializer=tf.random_normal_initializer(seed=2),
  )
  h = mtf.relu(
    mtf.einsum(
      [mtf.import_tf_tensor(mesh, x, [BATCH, D_IN]), w1],
      output_shape=[BATCH, HIDDEN],
    )
  )
  h += mtf.shift(h, 1, HIDDEN, wrap=False)
  out = mtf.einsum([h, w2], output_shape=[BATCH, D_OUT])
  target = mtf.import_tf_tensor(mesh, y, [BATCH, D_OUT])
  loss = mtf.reduce_mean(mtf.square(out - target))
  variables = mesh.graph.trainable_variables
  grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
  updates = [mtf.assign_sub(v, g * 0.1) for v, g in zip(variables, grads)]
  return loss, updates, variables


def _data():
  rng = np.random.RandomState(0)
  x = rng.normal(size=[8, 4]).astype(np.float32)
  y = rng.normal(size=[8, 4]).astype(np.float32)
  return tf.constant(x), tf.constant(y)


def _train(mesh_impl, steps, simd):
  """Losses and final variables of `steps` steps; counts of traces."""
  store = mtf.VariableStore()
  counts = {"step traces": 0, "programs": 0}

  def lower(x, y):
    counts["programs"] += 1
    with mtf.variable_store(store):
      graph = mtf.Graph()
      mesh = mtf.Mesh(graph, "mesh")
      loss, updates, variables = _train_step(mesh, x, y)
      lowering = mtf.Lowering(graph, {mesh: mesh_impl})
      tf_updates = [lowering.lowered_operation(u) for u in updates]
      values = [lowering.export_to_tf_tensor(v.outputs[0]) for v in variables]
      with tf.control_dependencies(tf_updates):
        return [tf.identity(lowering.export_to_tf_tensor(loss))] + values

  @tf.function(autograph=False)
  def step(x, y):
    counts["step traces"] += 1
    if simd:
      return mesh_impl.replicate(lower, x, y)
    return [lower(x, y)]

  results = [step(*_data()) for _ in range(steps)]
  per_replica = [[np.asarray(t) for t in outs] for outs in results[-1]]
  losses = [float(r[0][0]) for r in results]
  return losses, per_replica, counts


@meshes.parametrize(
  meshes.ELEMENTWISE_OPS[1:]
  + meshes.mesh_layouts(("b:2;m:4", ["batch:b;hidden:m", "hidden:b;batch:m"]))
)
def test_traced_once_and_same_numbers_as_placement(mesh_shape, layout):
  size = mtf.convert_to_shape(mesh_shape).size
  expected_losses, expected, _ = _train(
    mtu.mesh_impl_for(mesh_shape, layout), 3, simd=False
  )
  mesh_impl = simd_mesh_impl.SimdMeshImpl(
    mesh_shape, layout, devices=DEVICES[:size]
  )
  losses, per_replica, counts = _train(mesh_impl, 3, simd=True)
  # One trace of the step, and in it one trace of the replica program.
  assert counts == {"step traces": 1, "programs": 1}
  np.testing.assert_allclose(losses, expected_losses, rtol=1e-5)
  assert len(per_replica) == size
  for outs in per_replica:
    mtu.assert_all_close(outs, expected[0], msg="%s %s" % (mesh_shape, layout))


def _backend(devices):
  return simd_collective.CollectiveBackend(
    devices, timeout_seconds=mtu.COLLECTIVE_TIMEOUT_SECONDS
  )


def _value(pnum, shape=(2, 4)):
  """Replica pnum's input: numpy for a Python pnum, TF for the pnum tensor."""
  base = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
  if isinstance(pnum, int):
    return base + 100 * pnum
  return tf.constant(base) + 100.0 * tf.cast(pnum, tf.float32)


def test_collectives_of_the_pnum_tensor_on_shuffled_devices():
  backend = _backend(SHUFFLED)
  pairs_rows = [(0, 1), (1, 0), (2, 3), (3, 2)]  # Swaps within [0,1], [2,3].
  pairs_mixed = [(0, 3), (3, 1), (2, 2)]  # 0 gets nothing; unequal sets.
  traces = []

  def program():
    traces.append(1)
    x = _value(backend.replica_pnum())
    return [
      backend.allreduce_sum(x, [[2, 0], [3, 1]]),
      backend.all_gather(x, [[2, 0], [3, 1]], 1),
      backend.all_to_all(x, [[2, 0], [3, 1]], 1, 0),
      backend.all_to_all(x, [[0, 1, 2, 3]], 1, 0),
      backend.permute(x, pairs_rows),
      backend.permute(x, pairs_mixed),
      backend.permute(x, [(1, 1), (3, 3)]),  # Only self-sends.
    ]

  run = tf.function(
    lambda: backend.replicate(program, (), [0, 1, 2, 3]), autograph=False
  )
  out = [[np.asarray(t) for t in r] for r in run()]
  assert len(traces) == 1
  xs = [_value(p) for p in range(4)]
  for p in range(4):
    group = [2, 0] if p in (2, 0) else [3, 1]
    members = [xs[q] for q in group]
    np.testing.assert_array_equal(out[p][0], members[0] + members[1])
    np.testing.assert_array_equal(out[p][1], np.concatenate(members, 1))
    me = group.index(p)
    np.testing.assert_array_equal(
      out[p][2], np.concatenate([np.split(m, 2, 1)[me] for m in members], 0)
    )
    np.testing.assert_array_equal(
      out[p][3], np.concatenate([np.split(m, 4, 1)[p] for m in xs], 0)
    )
    np.testing.assert_array_equal(out[p][4], xs[p ^ 1])
    mixed = {0: np.zeros_like(xs[0]), 1: xs[3], 2: xs[2], 3: xs[0]}
    np.testing.assert_array_equal(out[p][5], mixed[p])
    np.testing.assert_array_equal(
      out[p][6], xs[p] if p in (1, 3) else np.zeros_like(xs[p])
    )


def test_python_pnum_traces_once_per_replica():
  backend = _backend(SHUFFLED)
  traces = []

  def program():
    traces.append(backend.current_replica())
    x = tf.constant(_value(backend.current_replica()))
    return backend.allreduce_sum(x, [[0, 1, 2, 3]])

  run = tf.function(
    lambda: backend.replicate(program, (), [2, 0, 3, 1]), autograph=False
  )
  out = [np.asarray(t) for t in run()]
  assert traces == [2, 0, 3, 1]  # The shared trace stopped at the question.
  total = sum(_value(p) for p in range(4))
  for o in out:
    np.testing.assert_array_equal(o, total)


def _program(mesh):
  x = mtf.import_tf_tensor(
    mesh, tf.reshape(tf.range(32.0), [8, 4]), [BATCH, D_IN]
  )
  w = mtf.get_variable(
    mesh, "w", [D_IN, HIDDEN], initializer=tf.random_normal_initializer(seed=3)
  )
  h = mtf.einsum([x, w], output_shape=[BATCH, HIDDEN])
  return [h, mtf.reduce_sum(h, reduced_dim=BATCH), mtf.shift(h, 2, BATCH, True)]


@pytest.mark.parametrize("where", ["eager", "legacy graph"])
def test_traced_once_eagerly_and_in_a_legacy_graph(where):
  mesh_shape, layout = "rows:2;cols:2", "batch:rows;hidden:cols"
  expected = mtu.run_program(_program, mesh_shape, layout, "function")
  mesh_impl = simd_mesh_impl.SimdMeshImpl(
    mesh_shape, layout, devices=SHUFFLED, logical_to_physical=[3, 1, 0, 2]
  )
  traces = []

  def computation(graph, mesh, outputs):
    traces.append(1)
    lowering = mtf.Lowering(graph, {mesh: mesh_impl})
    return lowering, [lowering.export_to_tf_tensor(t) for t in outputs]

  if where == "eager":
    with mtf.variable_store(mtf.VariableStore()):
      graph = mtf.Graph()
      mesh = mtf.Mesh(graph, "mesh")
      outputs = _program(mesh)
      per_replica = mesh_impl.replicate(
        lambda: computation(graph, mesh, outputs)[1]
      )
  else:
    with tf.Graph().as_default():
      with mtf.variable_store(mtf.VariableStore()):
        graph = mtf.Graph()
        mesh = mtf.Mesh(graph, "mesh")
        outputs = _program(mesh)
        results = mesh_impl.replicate(computation, graph, mesh, outputs)
      # The trace's lowering, returned as is: its copy, built outside the
      # replicas, fills every replica's slices.
      lowering = results[0][0]
      assert all(r[0] is lowering for r in results)
      copy = lowering.copy_masters_to_slices()
      config = tf.compat.v1.ConfigProto(device_count={"CPU": 8})
      with tf.compat.v1.Session(config=config) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(tf.compat.v1.local_variables_initializer())
        sess.run(copy)
        per_replica = sess.run([r[1] for r in results])
  assert len(traces) == 1
  for outs in per_replica:
    mtu.assert_all_close([np.asarray(o) for o in outs], expected)


def test_program_writing_a_shared_resource_is_traced_per_replica():
  # Calls of one shared function that all write `shared` would be run one
  # after the other by automatic control dependencies, and the first would
  # wait forever for the others' collectives.
  backend = _backend(DEVICES[:2])
  shared = tf.Variable(0.0)
  traces = []

  def program():
    traces.append(1)
    shared.assign_add(1.0)
    x = tf.cast(backend.replica_pnum(), tf.float32) + 1.0
    return backend.allreduce_sum(x, [[0, 1]])

  run = tf.function(
    lambda: backend.replicate(program, (), [0, 1]), autograph=False
  )
  assert [float(y) for y in run()] == [3.0, 3.0]
  assert float(shared.numpy()) == 2.0
  assert len(traces) == 3  # The shared trace, then one per replica.


def test_driver_lowers_once_on_simd():
  from transformer._src.driver import mesh_impl_choice  # pylint: disable=g-import-not-at-top

  mesh_impl = mesh_impl_choice.make_mesh_impl(
    "simd", "rows:2;cols:2", "batch:rows;hidden:cols"
  )
  traces = []

  def build():
    traces.append(1)
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    outputs = _program(mesh)
    lowering = mtf.Lowering(graph, {mesh: mesh_impl})
    return lowering, [lowering.export_to_tf_tensor(t) for t in outputs]

  @tf.function(autograph=False)
  def run():
    with mtf.variable_store(store):
      return mesh_impl_choice.lower_on_mesh(mesh_impl, build)[1]

  store = mtf.VariableStore()
  expected = mtu.run_program(
    _program, "rows:2;cols:2", "batch:rows;hidden:cols", "function"
  )
  mtu.assert_all_close([np.asarray(t) for t in run()], expected)
  assert len(traces) == 1
