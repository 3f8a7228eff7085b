"""SimdMeshImpl on the collective backend: replicas on virtual CPUs.

Collectives against numpy (with device lists and logical_to_physical maps out
of device order, so the rank bookkeeping is exercised), programs against the
placement backend, variables, the MLP of examples/mlp_demo.py trained step by
step on both backends, and the modes replicate supports.
"""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import placement_mesh_impl
from mesh_tensorflow import simd_mesh_impl
from mesh_tensorflow._src.mesh_impls import simd_collective
from tests import mesh_test_util as mtu
from tests import meshes

DEVICES = ["/cpu:%d" % i for i in range(8)]


def _backend(devices):
  return simd_collective.CollectiveBackend(
    devices, timeout_seconds=mtu.COLLECTIVE_TIMEOUT_SECONDS
  )


def _run_replicas(backend, fn, pnums):
  """fn(pnum) traced once per replica in a tf.function; numpy results."""

  @tf.function(autograph=False)
  def run():
    return backend.replicate(lambda: fn(backend.current_replica()), (), pnums)

  return [tf.nest.map_structure(np.asarray, r) for r in run()]


# Devices deliberately out of device order: physical pnum p runs on
# SHUFFLED[p], so collective ranks differ from group positions.
SHUFFLED = ["/cpu:3", "/cpu:1", "/cpu:0", "/cpu:2"]


def _value(p, shape=(2, 4), dtype=np.float32):
  return (np.arange(np.prod(shape)).reshape(shape) + 100 * p).astype(dtype)


class TestBackendCollectives:
  def test_all_gather_and_all_to_all_in_group_order(self):
    backend = _backend(SHUFFLED)
    groups = [[2, 0], [3, 1]]

    def fn(p):
      x = tf.constant(_value(p))
      return [
        backend.all_gather(x, groups, 0),
        backend.all_gather(x, groups, 1),
        backend.all_to_all(x, groups, 1, 0),
        backend.all_to_all(x, groups, 0, 1),
      ]

    out = _run_replicas(backend, fn, [0, 1, 2, 3])
    for group in groups:
      for p in group:
        xs = [_value(q) for q in group]
        np.testing.assert_array_equal(out[p][0], np.concatenate(xs, 0))
        np.testing.assert_array_equal(out[p][1], np.concatenate(xs, 1))
        j = group.index(p)
        np.testing.assert_array_equal(
          out[p][2], np.concatenate([np.split(x, 2, 1)[j] for x in xs], 0)
        )
        np.testing.assert_array_equal(
          out[p][3], np.concatenate([np.split(x, 2, 0)[j] for x in xs], 1)
        )

  @pytest.mark.parametrize(
    "dtype",
    [
      np.float32,
      np.float64,
      np.int32,
      np.int64,
      np.float16,
      tf.bfloat16.as_numpy_dtype,
      np.bool_,
      np.uint8,
      np.complex64,
    ],
  )
  def test_dtypes_sum_and_gather(self, dtype):
    backend = _backend(SHUFFLED)
    groups = [[0, 1, 2, 3]]

    def value(p):
      v = _value(p, (3,), np.float32) % 7
      if dtype == np.bool_:
        return (v % 2 == 0) & (p % 2 == 0)
      if dtype == np.complex64:
        return (v + 1j * p).astype(dtype)
      return v.astype(dtype)

    def fn(p):
      x = tf.constant(value(p))
      return [
        backend.allreduce_sum(x, groups),
        backend.all_gather(x, groups, 0),
        backend.all_to_all(tf.concat([x] * 4, 0), groups, 0, 0),
      ]

    out = _run_replicas(backend, fn, [0, 1, 2, 3])
    xs = [value(p) for p in range(4)]
    if dtype == np.bool_:
      expected_sum = np.any(xs, 0)
    else:
      expected_sum = np.sum(
        np.stack(xs).astype(
          np.float64 if dtype != np.complex64 else np.complex128
        ),
        0,
      ).astype(dtype)
    for p in range(4):
      assert out[p][0].dtype == np.dtype(dtype)
      np.testing.assert_array_equal(out[p][0], expected_sum)
      np.testing.assert_array_equal(out[p][1], np.concatenate(xs))
      np.testing.assert_array_equal(out[p][2], np.concatenate(xs))

  def test_permute_partial_and_self(self):
    backend = _backend(SHUFFLED)
    pairs = [(0, 3), (3, 1), (2, 2)]  # 0 receives nothing.

    def fn(p):
      return backend.permute(tf.constant(_value(p)), pairs)

    out = _run_replicas(backend, fn, [0, 1, 2, 3])
    np.testing.assert_array_equal(out[0], np.zeros((2, 4), np.float32))
    np.testing.assert_array_equal(out[3], _value(0))
    np.testing.assert_array_equal(out[1], _value(3))
    np.testing.assert_array_equal(out[2], _value(2))
    with pytest.raises(ValueError, match="repeat"):
      _run_replicas(
        backend,
        lambda p: backend.permute(tf.constant(1.0), [(0, 1), (2, 1)]),
        [0, 1, 2, 3],
      )

  def test_replica_pnum_and_errors_outside_replicate(self):
    backend = _backend(SHUFFLED)
    out = _run_replicas(backend, lambda p: backend.replica_pnum(), [2, 0, 3, 1])
    assert [int(o) for o in out] == [2, 0, 3, 1]
    with pytest.raises(RuntimeError, match="replicate"):
      backend.replica_pnum()
    with pytest.raises(ValueError, match="not a partition"):
      _run_replicas(
        backend,
        lambda p: backend.allreduce_sum(tf.constant(1.0), [[0, 1], [1, 2, 3]]),
        [0, 1, 2, 3],
      )

  def test_mismatched_programs_fail_at_trace_time(self):
    backend = _backend(DEVICES[:2])

    def fn(p):
      x = tf.constant(1.0)
      if p == 0:
        x = backend.allreduce_sum(x, [[0, 1]])
      return x

    with pytest.raises(RuntimeError, match="different numbers of collectives"):
      _run_replicas(backend, fn, [0, 1])

  def test_communication_inside_while_loop_is_refused(self):
    backend = _backend(DEVICES[:2])

    def fn(p):
      del p
      return tf.while_loop(
        lambda i: i < 2.0,
        lambda i: [i + backend.allreduce_sum(tf.constant(1.0), [[0, 1]])],
        [0.0],
      )

    with pytest.raises(NotImplementedError, match="while loop"):
      _run_replicas(backend, fn, [0, 1])

  def test_backend_while_loop_communicates_every_iteration(self):
    # Replica p starts at p + 1; each of 3 iterations halves the group sum:
    # sums 10, 20, 40, so 5, 10, 20 on every replica.
    backend = _backend(SHUFFLED)

    def fn(p):
      return backend.while_loop(
        lambda i, x: i < 3,
        lambda i, x: [i + 1, 0.5 * backend.allreduce_sum(x, [[0, 1, 2, 3]])],
        [tf.constant(0), tf.constant(float(p + 1))],
      )[1]

    np.testing.assert_allclose(
      _run_replicas(backend, fn, [0, 1, 2, 3]), [20.0] * 4
    )

  def test_collectives_use_the_ring_on_cpus(self):
    assert _backend(DEVICES[:2]).communication_hint == "auto"


# ----------------------------------------------------------- mtf programs
A = mtf.Dimension("a", 4)
B = mtf.Dimension("b", 8)
C = mtf.Dimension("c", 6)
X = np.random.RandomState(0).uniform(-1, 1, (4, 8, 6)).astype(np.float32)


def _program(mesh):
  x = mtf.import_tf_tensor(mesh, X, [A, B, C])
  w = mtf.get_variable(
    mesh, "w", [B, C], initializer=tf.random_normal_initializer(seed=1)
  )
  y = mtf.einsum([x, w], output_shape=[A, B])
  loss = mtf.reduce_sum(mtf.square(y))
  grad_w = mtf.gradients([loss], [w])[0]
  return [
    y,
    mtf.reduce_max(x, reduced_dim=C),
    mtf.reduce_min(x, reduced_dim=B),
    mtf.shift(x, 3, B, wrap=False),
    mtf.shift(x, -1, A, wrap=True),
    mtf.reshape(x, [mtf.Dimension("c", 6), mtf.Dimension("ab", 32)]),
    mtf.random_uniform(mesh, [A, B], seed=5),
    mtf.random_normal(mesh, [A, C], seed=6),
    grad_w,
    mtf.cumsum(x, B),
    mtf.mtf_range(mesh, B, tf.int32),
    mtf.one_hot(mtf.mtf_range(mesh, A, tf.int32), B),
  ]


@pytest.mark.parametrize(
  "mesh_shape,layout,l2p",
  [
    ("all:4", "b:all", [2, 0, 3, 1]),
    ("all:4", "a:all", None),
    ("rows:2;cols:2", "a:rows;b:cols", [3, 1, 0, 2]),
    ("rows:2;cols:2", "b:rows;c:cols", [1, 3, 0, 2]),
    ("rows:2;cols:2", "c:cols", None),
  ],
)
def test_program_matches_placement(mesh_shape, layout, l2p):
  expected = mtu.run_program(_program, mesh_shape, layout, "function")
  devices = DEVICES[4:8] if l2p is None else SHUFFLED
  mesh_impl = simd_mesh_impl.SimdMeshImpl(
    mesh_shape, layout, devices=devices, logical_to_physical=l2p
  )
  store = mtf.VariableStore()

  @tf.function(autograph=False)
  def run():
    def computation():  # The mtf graph is built on every replica.
      with mtf.variable_store(store):
        graph = mtf.Graph()
        mesh = mtf.Mesh(graph, "mesh")
        outputs = _program(mesh)
        lowering = mtf.Lowering(graph, {mesh: mesh_impl})
        return [lowering.export_to_tf_tensor(t) for t in outputs]

    return mesh_impl.replicate(computation)

  per_replica = run()
  assert len(per_replica) == 4
  for outs in per_replica:
    mtu.assert_all_close(
      [np.asarray(o) for o in outs],
      expected,
      msg="%s %s" % (mesh_shape, layout),
    )


def test_replicate_eagerly_and_unseeded_random_agrees():
  mesh_impl = simd_mesh_impl.SimdMeshImpl("rows:2;cols:2", "a:rows")
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  r = mtf.random_uniform(mesh, [A, B])
  d = mtf.dropout(mtf.ones(mesh, [A, C]), True, rate=0.5)
  ones = mtf.ones(mesh, [A])

  def computation():
    lowering = mtf.Lowering(graph, {mesh: mesh_impl})
    return [
      lowering.export_to_tf_tensor(r),
      lowering.export_to_tf_tensor(d),
      lowering.export_to_tf_tensor(ones),
    ]

  with mtf.variable_store(mtf.VariableStore()):
    per_replica = mesh_impl.replicate(computation)  # Eager: traced inside.
  for outs in per_replica[1:]:
    for a, b in zip(per_replica[0], outs):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert 0.0 <= float(np.min(per_replica[0][0])) < 1.0


def test_mesh_impl_random_and_pnum():
  mesh_impl = simd_mesh_impl.SimdMeshImpl(
    "rows:2;cols:2",
    "a:rows",
    devices=SHUFFLED,
    logical_to_physical=[1, 3, 0, 2],
  )
  shape = mtf.Shape([A, B])

  def computation():
    rnd = mesh_impl.random(shape, tf.random.uniform, {})
    full = mesh_impl.allconcat(rnd, 0, 0)
    return [
      mesh_impl.pnum_tensor,
      full.one_slice,
      mesh_impl.laid_out_pcoord(1).one_slice,
    ]

  per_replica = tf.function(
    lambda: mesh_impl.replicate(computation), autograph=False
  )()
  for logical, (pnum, full, pcoord) in enumerate(per_replica):
    assert int(pnum) == logical
    assert int(pcoord) == logical % 2
    np.testing.assert_array_equal(full, per_replica[0][1])


def test_legacy_graph_mode():
  mesh_impl = simd_mesh_impl.SimdMeshImpl("all:4", "b:all", devices=DEVICES[:4])
  with tf.Graph().as_default():
    store = mtf.VariableStore()

    def computation():
      with mtf.variable_store(store):
        graph = mtf.Graph()
        mesh = mtf.Mesh(graph, "mesh")
        outputs = _program(mesh)[:4]
        lowering = mtf.Lowering(graph, {mesh: mesh_impl})
        copy = lowering.copy_masters_to_slices()
        return copy, [lowering.export_to_tf_tensor(t) for t in outputs]

    per_replica = mesh_impl.replicate(computation)
    config = tf.compat.v1.ConfigProto(device_count={"CPU": 8})
    with tf.compat.v1.Session(config=config) as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      sess.run(tf.compat.v1.local_variables_initializer())
      sess.run([c for c, _ in per_replica])
      values = sess.run([o for _, o in per_replica])
  expected = mtu.run_program(
    lambda m: _program(m)[:4], "all:4", "b:all", "function"
  )
  for outs in values:
    mtu.assert_all_close(outs, expected)


# -------------------------------------------------------------- variables
def test_variables_slices_assign_and_copy_back():
  mesh_impl = simd_mesh_impl.SimdMeshImpl(
    "rows:2;cols:2",
    "b:cols",
    devices=SHUFFLED,
    logical_to_physical=[2, 0, 3, 1],
  )
  store = mtf.VariableStore()
  init = np.arange(48, dtype=np.float32).reshape(8, 6)

  @tf.function(autograph=False)
  def step():
    def computation():
      with mtf.variable_store(store):
        graph = mtf.Graph()
        mesh = mtf.Mesh(graph, "mesh")
        v = mtf.get_variable(
          mesh, "v", [B, C], initializer=tf.constant_initializer(init)
        )
        op = mtf.assign_add(v, mtf.ones(mesh, [B, C]))
        lowering = mtf.Lowering(graph, {mesh: mesh_impl})
        with tf.control_dependencies([lowering.lowered_operation(op)]):
          copy = lowering.copy_slices_to_masters()
        with tf.control_dependencies([copy]):
          return tf.constant(0)

    return mesh_impl.replicate(computation)

  step()
  step()
  master = store.masters["v"]
  np.testing.assert_array_equal(master.numpy(), init + 2)
  slices = {k: s for k, s in store._slices.items()}  # pylint: disable=protected-access
  assert len(slices) == 4
  for key, s in slices.items():
    physical = int(s.name.split("_slice_")[1].split(":")[0])
    assert s.name.split("/")[-1] == "v_slice_%d:0" % physical, key
    assert s.device.endswith(SHUFFLED[physical].replace("/cpu", "CPU")), (
      s.device
    )
    logical = mesh_impl.p2l(physical)
    col = logical % 2
    np.testing.assert_array_equal(s.numpy(), (init + 2)[4 * col : 4 * col + 4])


# ---------------------------------------------------------------- the MLP
MLP_BATCH = mtf.Dimension("batch", 32)
D_IN = mtf.Dimension("d_in", 16)
HIDDEN = mtf.Dimension("hidden", 32)
D_MODEL = mtf.Dimension("d_model", 32)
D_OUT = mtf.Dimension("d_out", 8)


def _mlp_loss(mesh, x, y):
  """examples/mlp_demo.py's model: 3 dense layers, relu, mean squared error."""

  def dense(h, name, in_dim, out_dim, activation=True):
    w = mtf.get_variable(
      mesh,
      name,
      [in_dim, out_dim],
      initializer=tf.random_normal_initializer(
        stddev=in_dim.size**-0.5, seed=len(name)
      ),
    )
    b = mtf.get_variable(
      mesh, name + "_bias", [out_dim], initializer=tf.zeros_initializer()
    )
    out = mtf.einsum([h, w], output_shape=[MLP_BATCH, out_dim]) + b
    return mtf.relu(out) if activation else out

  h = mtf.import_tf_tensor(mesh, x, [MLP_BATCH, D_IN])
  target = mtf.import_tf_tensor(mesh, y, [MLP_BATCH, D_OUT])
  h = dense(h, "layer_0", D_IN, HIDDEN)
  h = dense(h, "layer_1", HIDDEN, D_MODEL)
  h = dense(h, "layer_2x", D_MODEL, D_OUT, activation=False)
  return mtf.reduce_mean(mtf.square(h - target))


def _mlp_step(mesh, x, y, learning_rate=0.1):
  loss = _mlp_loss(mesh, x, y)
  graph = mesh.graph
  variables = graph.trainable_variables
  grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
  for v, g in zip(variables, grads):
    mtf.assign_sub(v, g * learning_rate)
  return loss


def _train(mesh_impl, steps, data, simd):
  store = mtf.VariableStore()

  def build_and_lower(x, y):
    with mtf.variable_store(store):
      graph = mtf.Graph()
      mesh = mtf.Mesh(graph, "mesh")
      loss = _mlp_step(mesh, x, y)
      lowering = mtf.Lowering(graph, {mesh: mesh_impl})
      return lowering.export_to_tf_tensor(loss)

  @tf.function(autograph=False)
  def step(x, y):
    if simd:
      return mesh_impl.replicate(build_and_lower, x, y)[0]
    return build_and_lower(x, y)

  return [float(step(*data[i % len(data)])) for i in range(steps)]


@meshes.parametrize(
  [
    ("rows:2;cols:2", "batch:rows;hidden:cols"),
    ("all:4", "batch:all"),
  ]
)
def test_mlp_trains_identically_on_placement_and_simd(mesh_shape, layout):
  rng = np.random.RandomState(0)
  teacher = rng.normal(size=(16, 8)).astype(np.float32) / 4.0
  data = []
  for _ in range(4):
    x = rng.normal(size=(32, 16)).astype(np.float32)
    data.append((tf.constant(x), tf.constant(np.tanh(x @ teacher))))
  steps = 20
  placement = _train(
    placement_mesh_impl.PlacementMeshImpl(mesh_shape, layout, DEVICES[:4]),
    steps,
    data,
    simd=False,
  )
  simd = _train(
    simd_mesh_impl.SimdMeshImpl(
      mesh_shape, layout, devices=DEVICES[4:8], logical_to_physical=[1, 0, 3, 2]
    ),
    steps,
    data,
    simd=True,
  )
  np.testing.assert_allclose(simd, placement, rtol=1e-5, atol=1e-5)
  assert simd[-1] < simd[0]
