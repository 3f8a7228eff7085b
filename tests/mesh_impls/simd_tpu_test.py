"""Tests of the TPU backend of SimdMeshImpl (no TPU needed).

Two kinds of checks:
  - Graph checks: the backend is called inside `tf.compat.v1.tpu.replicate`
    in a legacy graph (building works on CPU; running would need a TPU) and
    the emitted ops are inspected: op types, their group_assignment /
    source_target_pairs inputs, dtypes.
  - Semantics: `tpu_ops` is replaced by a thread-based emulator (one Python
    thread per replica, eager TF, a barrier per collective) so that the
    backend's own TF code around the collectives (tiling, masks, dtype
    carriers, zeros) is checked against numpy.
"""

import contextlib
import inspect
import threading

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.eager import context  # pylint: disable=g-direct-tensorflow-import

from mesh_tensorflow._src import layout as layout_lib
from mesh_tensorflow._src.mesh_impls import simd_backend
from mesh_tensorflow._src.mesh_impls import simd_tpu
from mesh_tensorflow._src.mesh_impls.simd_tpu import TpuBackend

tf1 = tf.compat.v1

MESH = "a:2;b:4"
N = 8
# A non-identity logical -> physical map (what SimdMeshImpl would apply).
L2P = [0, 1, 3, 2, 6, 7, 5, 4]
MESH_AXES = [[0], [1], [0, 1]]


def physical_groups(mesh_axes, l2p=L2P, mesh=MESH):
  return [
    [l2p[p] for p in g] for g in layout_lib.processor_groups(mesh, mesh_axes)
  ]


# --------------------------------------------------------------------------
# Interface and constructor.


def test_implements_the_simd_backend_interface():
  abstract = simd_backend.SimdBackend.__abstractmethods__
  assert abstract == {
    "replica_pnum",
    "allreduce_sum",
    "all_gather",
    "all_to_all",
    "permute",
    "device",
  }
  assert issubclass(TpuBackend, simd_backend.SimdBackend)
  assert not TpuBackend.__abstractmethods__
  for name in abstract:
    ours = list(inspect.signature(getattr(TpuBackend, name)).parameters)
    theirs = list(
      inspect.signature(getattr(simd_backend.SimdBackend, name)).parameters
    )
    assert ours == theirs, name
  params = inspect.signature(TpuBackend).parameters
  assert [(p.name, p.default) for p in params.values()] == [
    ("num_replicas", inspect.Parameter.empty),
    ("device_assignment", None),
    ("allreduce_in_bfloat16_max_group_size", 8),
    ("all_gather_mode", "all_to_all"),
  ]
  assert params["all_gather_mode"].kind == inspect.Parameter.KEYWORD_ONLY


def test_constructor_errors():
  with pytest.raises(ValueError, match="num_replicas"):
    TpuBackend(0)
  with pytest.raises(ValueError, match="all_gather_mode"):
    TpuBackend(2, all_gather_mode="ring")

  class FakeAssignment:
    num_replicas = 4

    def tpu_device(self, replica=0, logical_core=0, job=None):
      del logical_core, job
      return "/job:worker/task:%d/device:TPU:%d" % (replica // 2, replica % 2)

  with pytest.raises(ValueError, match="device_assignment has 4 replicas"):
    TpuBackend(8, FakeAssignment())
  backend = TpuBackend(4, FakeAssignment())
  assert backend.device(3) == "/job:worker/task:1/device:TPU:1"
  assert TpuBackend(4).device(2) == "/device:TPU:2"
  with pytest.raises(ValueError, match="physical pnum 4"):
    TpuBackend(4).device(4)
  assert "num_replicas=4" in repr(backend)


def test_rejects_bad_groups_and_pairs():
  backend = TpuBackend(4)
  x = tf.zeros([4])
  with pytest.raises(ValueError, match="not a partition"):
    backend.allreduce_sum(x, [[0, 1], [1, 2]])
  with pytest.raises(ValueError, match="unequal sizes"):
    backend.all_gather(x, [[0, 1, 2], [3]], 0)
  with pytest.raises(ValueError, match="does not divide into 4"):
    backend.all_to_all(tf.zeros([3, 2]), [[0, 1, 2, 3]], 0, 1)
  with pytest.raises(ValueError, match="split_axis 2 out of range"):
    backend.all_to_all(tf.zeros([4, 2]), [[0, 1, 2, 3]], 2, 1)
  with pytest.raises(ValueError, match="target 4 out of range"):
    backend.permute(x, [(0, 4)])
  with pytest.raises(ValueError, match="twice as source"):
    backend.permute(x, [(0, 1), (0, 2)])
  with pytest.raises(ValueError, match="twice as target"):
    backend.permute(x, [(0, 1), (2, 1)])
  with pytest.raises(ValueError, match="dtype string"):
    backend.permute(tf.constant(["a"]), [(0, 1)])
  with pytest.raises(ValueError, match="dtype string"):
    TpuBackend(4, all_gather_mode="cross_replica_sum").all_gather(
      tf.constant(["a"]), [[0, 1], [2, 3]], 0
    )


# --------------------------------------------------------------------------
# Graph checks inside tf.compat.v1.tpu.replicate.


def build_replicated(fn, num_replicas=N, inputs=None):
  """Builds `fn(*inputs)` under tpu.replicate in a fresh graph; returns it."""
  graph = tf.Graph()
  with graph.as_default():
    if inputs is None:
      inputs = [tf.constant(np.zeros([4, 8], np.float32))]
    tf1.tpu.replicate(fn, inputs=[inputs] * num_replicas)
  return graph


def ops_of_type(graph, op_type):
  return [op for op in graph.get_operations() if op.type == op_type]


def static_input(op, index=1):
  return tf.get_static_value(op.inputs[index]).tolist()


def in_cluster(op):
  return "_tpu_replicate" in op.node_def.attr


def test_replica_pnum_is_replicated_input_outside_the_cluster():
  backend = TpuBackend(N)
  seen = []

  def fn(x):
    seen.append(backend.replica_pnum())
    seen.append(backend.replica_pnum())
    return x + tf.cast(seen[0], tf.float32)

  graph = build_replicated(fn)
  assert seen[0] is seen[1]  # cached per graph
  ops = [
    op
    for op in ops_of_type(graph, "TPUReplicatedInput")
    if op.name.startswith("pnum_constants")
  ]
  assert len(ops) == 1
  (op,) = ops
  assert not in_cluster(op)
  assert op.get_attr("T") == tf.int32
  assert [tf.get_static_value(t) for t in op.inputs] == list(range(N))
  assert all(not in_cluster(t.op) for t in op.inputs)
  # The consumer inside the cluster sees it.
  assert any(in_cluster(c) for c in op.outputs[0].consumers())
  # A new graph gets its own tensor.
  graph2 = build_replicated(
    lambda x: x + tf.cast(backend.replica_pnum(), tf.float32)
  )
  assert (
    len(
      [
        op
        for op in ops_of_type(graph2, "TPUReplicatedInput")
        if op.name.startswith("pnum_constants")
      ]
    )
    == 1
  )


@pytest.mark.parametrize("mesh_axes", MESH_AXES, ids=str)
def test_allreduce_emits_cross_replica_sum_with_groups(mesh_axes):
  backend = TpuBackend(N)
  groups = physical_groups(mesh_axes)
  graph = build_replicated(lambda x: backend.allreduce_sum(x, groups))
  (op,) = ops_of_type(graph, "CrossReplicaSum")
  assert in_cluster(op)
  assert static_input(op) == groups
  assert op.get_attr("T") == tf.float32


def test_allreduce_groups_differ_from_logical_groups():
  # Sanity of the fixture: the non-identity map changes the groups.
  assert physical_groups([0]) != layout_lib.processor_groups(MESH, [0])
  assert physical_groups([0]) == [[0, 6], [1, 7], [3, 5], [2, 4]]


@pytest.mark.parametrize(
  "dtype,max_group,mesh_axes,summed_in",
  [
    (tf.bfloat16, 8, [0, 1], tf.bfloat16),  # group 8 <= 8: native
    (tf.bfloat16, 4, [0, 1], tf.float32),  # group 8 > 4: float32
    (tf.bfloat16, 4, [1], tf.bfloat16),  # group 4 <= 4
    (tf.bfloat16, 1, [0], tf.float32),  # group 2 > 1
    (tf.float32, 1, [0, 1], tf.float32),
    (tf.int32, 8, [1], tf.float32),  # non-float: float32
    (tf.float16, 8, [1], tf.float32),
  ],
)
def test_allreduce_dtypes(dtype, max_group, mesh_axes, summed_in):
  backend = TpuBackend(N, allreduce_in_bfloat16_max_group_size=max_group)
  out = []

  def fn(x):
    out.append(
      backend.allreduce_sum(tf.cast(x, dtype), physical_groups(mesh_axes))
    )
    return out[-1]

  graph = build_replicated(fn)
  (op,) = ops_of_type(graph, "CrossReplicaSum")
  assert op.get_attr("T") == summed_in
  assert out[0].dtype == dtype


def test_allreduce_singleton_groups_emit_nothing():
  backend = TpuBackend(N)
  graph = build_replicated(
    lambda x: backend.allreduce_sum(x, [[p] for p in range(N)])
  )
  assert not ops_of_type(graph, "CrossReplicaSum")


@pytest.mark.parametrize("mesh_axes", MESH_AXES, ids=str)
@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16, tf.int32])
def test_all_to_all_keeps_dtype(mesh_axes, dtype):
  backend = TpuBackend(N)
  groups = physical_groups(mesh_axes)
  out = []

  def fn(x):
    out.append(backend.all_to_all(tf.cast(x, dtype), groups, 1, 0))
    return out[-1]

  graph = build_replicated(fn)
  (op,) = ops_of_type(graph, "AllToAll")
  assert static_input(op) == groups
  assert op.get_attr("T") == dtype  # float32 is NOT sent as bfloat16
  assert op.get_attr("split_dimension") == 1
  assert op.get_attr("concat_dimension") == 0
  assert op.get_attr("split_count") == len(groups[0])
  assert not ops_of_type(graph, "Cast") or dtype != tf.float32
  assert out[0].dtype == dtype
  assert out[0].shape.as_list() == [4 * len(groups[0]), 8 // len(groups[0])]


@pytest.mark.parametrize("mesh_axes", MESH_AXES, ids=str)
def test_all_gather_all_to_all_mode(mesh_axes):
  backend = TpuBackend(N)
  groups = physical_groups(mesh_axes)
  out = []

  def fn(x):
    out.append(backend.all_gather(x, groups, 1))
    return out[-1]

  graph = build_replicated(fn)
  (op,) = ops_of_type(graph, "AllToAll")
  assert static_input(op) == groups
  assert op.get_attr("T") == tf.float32
  assert op.get_attr("split_count") == len(groups[0])
  assert not ops_of_type(graph, "CrossReplicaSum")
  assert out[0].shape.as_list() == [4, 8 * len(groups[0])]


@pytest.mark.parametrize("mesh_axes", MESH_AXES, ids=str)
def test_all_gather_cross_replica_sum_mode(mesh_axes):
  backend = TpuBackend(N, all_gather_mode="cross_replica_sum")
  groups = physical_groups(mesh_axes)
  out = []

  def fn(x):
    out.append(backend.all_gather(x, groups, 0))
    return out[-1]

  graph = build_replicated(fn)
  (op,) = ops_of_type(graph, "CrossReplicaSum")
  assert static_input(op) == groups
  assert op.get_attr("T") == tf.int32  # exact bit carrier
  assert not ops_of_type(graph, "AllToAll")
  assert (
    len(
      [
        op
        for op in ops_of_type(graph, "TPUReplicatedInput")
        if op.name.startswith("pnum_constants")
      ]
    )
    == 1
  )
  assert out[0].shape.as_list() == [4 * len(groups[0]), 8]
  assert out[0].dtype == tf.float32


@pytest.mark.parametrize(
  "dtype,sent",
  [
    (tf.float32, tf.float32),
    (tf.bfloat16, tf.bfloat16),
    (tf.int32, tf.int32),
    (tf.float16, tf.int32),
    (tf.int64, tf.int32),
    (tf.bool, tf.int32),
    (tf.uint8, tf.int32),
  ],
)
def test_permute_pairs_and_dtypes(dtype, sent):
  backend = TpuBackend(N)
  # Shift by one along mesh axis "b" (logical), in physical ids.
  pairs = []
  for p in range(N):
    a, b = layout_lib.pnum_to_processor_coordinates(MESH, p)
    if b + 1 < 4:
      target = layout_lib.processor_coordinates_to_pnum(MESH, [a, b + 1])
      pairs.append((L2P[p], L2P[target]))
  out = []

  def fn(x):
    out.append(backend.permute(tf.cast(x, dtype), pairs))
    return tf.cast(out[-1], tf.float32)

  graph = build_replicated(fn)
  (op,) = ops_of_type(graph, "CollectivePermute")
  assert static_input(op) == [list(p) for p in pairs]
  assert op.get_attr("T") == sent
  assert out[0].dtype == dtype
  assert out[0].shape.as_list() == [4, 8]


def test_permute_without_pairs_is_zeros():
  backend = TpuBackend(N)
  out = []

  def fn(x):
    out.append(backend.permute(x, []))
    return out[-1]

  graph = build_replicated(fn)
  assert not ops_of_type(graph, "CollectivePermute")
  assert out[0].op.type in ("ZerosLike", "Fill", "Const")


# --------------------------------------------------------------------------
# Semantics with emulated TPU collectives.


class _World:
  """Emulates tpu_ops across threads, one thread per replica."""

  def __init__(self, n):
    self.n = n
    self.barrier = threading.Barrier(n, timeout=60)
    self.local = threading.local()
    self.deposits = {}
    self.calls = []
    self.lock = threading.Lock()

  @property
  def rank(self):
    return self.local.rank

  def _exchange(self, x):
    step = self.local.step
    self.local.step += 1
    value = x.numpy()
    with self.lock:
      self.deposits[(step, self.rank)] = value
    self.barrier.wait()
    return [self.deposits[(step, r)] for r in range(self.n)], step

  @staticmethod
  def _my_group(groups, rank):
    (group,) = [list(g) for g in groups if rank in g]
    return group

  def cross_replica_sum(self, x, group_assignment=None, name=None):
    del name
    with self.lock:
      self.calls.append(("CrossReplicaSum", x.dtype))
    values, _ = self._exchange(x)
    group = self._my_group(group_assignment, self.rank)
    total = values[group[0]].copy()
    for r in group[1:]:
      total = total + values[r]
    return tf.constant(total, dtype=x.dtype)

  def all_to_all(
    self,
    x,
    concat_dimension,
    split_dimension,
    split_count,
    group_assignment=None,
    name=None,
  ):
    del name
    with self.lock:
      self.calls.append(("AllToAll", x.dtype))
    values, _ = self._exchange(x)
    group = self._my_group(group_assignment, self.rank)
    assert len(group) == split_count
    i = group.index(self.rank)
    pieces = [
      np.split(values[r], split_count, axis=split_dimension)[i] for r in group
    ]
    return tf.constant(
      np.concatenate(pieces, axis=concat_dimension), dtype=x.dtype
    )

  def collective_permute(self, x, source_target_pairs, name=None):
    del name
    with self.lock:
      self.calls.append(("CollectivePermute", x.dtype))
    values, _ = self._exchange(x)
    sources = [s for s, t in source_target_pairs if t == self.rank]
    if sources:
      return tf.constant(values[sources[0]], dtype=x.dtype)
    return tf.zeros_like(x)

  def run(self, backend, fn):
    """Runs fn(rank) on every replica in its own thread; returns results."""
    results = [None] * self.n
    errors = []
    backend.replica_pnum = lambda: tf.constant(self.local.rank, tf.int32)

    def body(rank):
      self.local.rank = rank
      self.local.step = 0
      try:
        # A new thread starts in the process's default mode, which is graph
        # mode under TF1 legacy behaviour: the emulation reads values.
        with context.eager_mode():
          results[rank] = fn(rank)
      except Exception as e:  # pylint: disable=broad-except
        errors.append(e)
        self.barrier.abort()

    threads = [threading.Thread(target=body, args=(r,)) for r in range(self.n)]
    for t in threads:
      t.start()
    for t in threads:
      t.join()
    if errors:
      raise errors[0]
    return results


@contextlib.contextmanager
def emulated(monkeypatch, n=N):
  world = _World(n)
  monkeypatch.setattr(simd_tpu, "tpu_ops", world)
  yield world


def _values(shape, dtype, seed):
  rng = np.random.RandomState(seed)
  if dtype == np.bool_:
    return rng.rand(*shape) > 0.5
  if np.issubdtype(dtype, np.integer):
    info = np.iinfo(dtype)
    return rng.randint(info.min, info.max, size=shape, dtype=dtype)
  if np.issubdtype(dtype, np.complexfloating):
    return (rng.randn(*shape) + 1j * rng.randn(*shape)).astype(dtype)
  return rng.randn(*shape).astype(dtype)


def _bits(a):
  a = np.asarray(a)
  return a.view(np.uint8) if a.dtype != np.bool_ else a


def test_emulated_allreduce_sum(monkeypatch):
  with emulated(monkeypatch) as world:
    backend = TpuBackend(N, allreduce_in_bfloat16_max_group_size=2)
    xs = [
      np.arange(6, dtype=np.float32).reshape(2, 3) * (r + 1) for r in range(N)
    ]
    for mesh_axes in MESH_AXES:
      groups = physical_groups(mesh_axes)
      for dtype in (tf.float32, tf.bfloat16, tf.int32):
        world.calls.clear()
        got = world.run(
          backend,
          lambda r, g=groups, d=dtype: backend.allreduce_sum(
            tf.cast(xs[r], d), g
          ).numpy(),
        )
        for group in groups:
          expected = sum(xs[r] for r in group)
          for r in group:
            np.testing.assert_allclose(
              np.asarray(got[r], np.float32), expected, rtol=1e-2
            )
            assert got[r].dtype == dtype.as_numpy_dtype
        sent = {c[1] for c in world.calls}
        if dtype == tf.bfloat16:
          assert sent == {tf.float32 if len(groups[0]) > 2 else tf.bfloat16}
        else:
          assert sent == {tf.float32}


_EXACT_DTYPES = [
  np.float32,
  np.int64,
  np.bool_,
  np.uint8,
  np.float16,
  np.int16,
  np.complex64,
  np.uint32,
  np.float64,
]


@pytest.mark.parametrize("mode", ["all_to_all", "cross_replica_sum"])
def test_emulated_all_gather_is_exact(monkeypatch, mode):
  with emulated(monkeypatch) as world:
    backend = TpuBackend(N, all_gather_mode=mode)
    for mesh_axes, axis, dtype in [
      ([0], 0, np.float32),
      ([1], 1, np.int64),
      ([0, 1], -1, np.bool_),
      ([1], 0, np.uint8),
      ([0], 1, np.float16),
      ([0, 1], 0, np.int16),
      ([1], 1, np.complex64),
      ([0], 0, np.uint32),
      ([1], 1, np.float64),
    ]:
      groups = physical_groups(mesh_axes)
      xs = [_values([2, 3], dtype, seed=r) for r in range(N)]
      if dtype == np.float32:  # special values must survive
        xs[0][0, 0] = np.nan
        xs[1][0, 1] = -0.0
        xs[2][1, 2] = np.inf
      world.calls.clear()
      got = world.run(
        backend,
        lambda r, g=groups, a=axis, v=xs: backend.all_gather(
          tf.constant(v[r]), g, a
        ).numpy(),
      )
      for group in groups:
        expected = np.concatenate([xs[r] for r in group], axis=axis)
        for r in group:
          assert got[r].dtype == expected.dtype
          np.testing.assert_array_equal(_bits(got[r]), _bits(expected))
      op_types = {c[0] for c in world.calls}
      assert op_types == (
        {"AllToAll"} if mode == "all_to_all" else {"CrossReplicaSum"}
      )


def test_emulated_all_gather_bfloat16(monkeypatch):
  with emulated(monkeypatch) as world:
    for mode in ("all_to_all", "cross_replica_sum"):
      backend = TpuBackend(N, all_gather_mode=mode)
      xs = [np.full([1, 2], r - 3.5, np.float32) for r in range(N)]
      groups = physical_groups([1])
      got = world.run(
        backend,
        lambda r, g=groups, b=backend, xs=xs: tf.cast(
          b.all_gather(tf.cast(xs[r], tf.bfloat16), g, 0), tf.float32
        ).numpy(),
      )
      for group in groups:
        for r in group:
          np.testing.assert_array_equal(
            got[r], np.concatenate([xs[q] for q in group], 0)
          )


def test_emulated_all_to_all(monkeypatch):
  with emulated(monkeypatch) as world:
    backend = TpuBackend(N)
    for mesh_axes in MESH_AXES:
      groups = physical_groups(mesh_axes)
      n = len(groups[0])
      xs = [_values([n * 2, 3], np.float32, seed=r) for r in range(N)]
      world.calls.clear()
      got = world.run(
        backend,
        lambda r, g=groups, xs=xs: backend.all_to_all(
          tf.constant(xs[r]), g, 0, 1
        ).numpy(),
      )
      for group in groups:
        for i, r in enumerate(group):
          expected = np.concatenate(
            [np.split(xs[q], n, axis=0)[i] for q in group], axis=1
          )
          np.testing.assert_array_equal(got[r], expected)  # exact float32
      assert {c[1] for c in world.calls} == {tf.float32}


@pytest.mark.parametrize(
  "dtype", _EXACT_DTYPES + [np.int32], ids=lambda d: np.dtype(d).name
)
def test_emulated_permute(monkeypatch, dtype):
  with emulated(monkeypatch) as world:
    backend = TpuBackend(N)
    pairs = [(L2P[p], L2P[p + 1]) for p in range(N - 1)]  # no target L2P[0]
    xs = [_values([3, 2], dtype, seed=10 + r) for r in range(N)]
    got = world.run(
      backend, lambda r: backend.permute(tf.constant(xs[r]), pairs).numpy()
    )
    for source, target in pairs:
      np.testing.assert_array_equal(_bits(got[target]), _bits(xs[source]))
    np.testing.assert_array_equal(got[L2P[0]], np.zeros([3, 2], dtype))
    native = dtype in (np.float32, np.int32)
    sent = {c[1] for c in world.calls}
    assert sent == ({tf.as_dtype(dtype)} if native else {tf.int32})


# --------------------------------------------------------------------------
# SimdMeshImpl(..., backend="tpu") lowering an mtf program under replicate.


def _simd_mesh_impl_class():
  try:
    from mesh_tensorflow._src.mesh_impls import simd  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    pytest.skip("SimdMeshImpl is not available: %s" % e)
  return simd.SimdMeshImpl


def test_simd_mesh_impl_lowers_to_tpu_collectives():
  import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top

  simd_mesh_impl_cls = _simd_mesh_impl_class()
  graph = tf.Graph()
  lowerings = []
  with graph.as_default():
    mesh_impl = simd_mesh_impl_cls(
      MESH, "x:a;y:b;r:a;s2:a", logical_to_physical=L2P, backend="tpu"
    )
    assert isinstance(mesh_impl.backend, TpuBackend)

    def computation():
      mtf_graph = mtf.Graph()
      mesh = mtf.Mesh(mtf_graph, "mesh")
      x, y, z = (
        mtf.Dimension("x", 4),
        mtf.Dimension("y", 8),
        mtf.Dimension("z", 6),
      )
      r, s = mtf.Dimension("r", 4), mtf.Dimension("s", 6)
      r2, s2 = mtf.Dimension("r2", 4), mtf.Dimension("s2", 6)
      u = mtf.import_tf_tensor(
        mesh, tf.reshape(tf.range(32, dtype=tf.float32), [4, 8]), [x, y]
      )
      w = mtf.get_variable(mesh, "w", [y, z])
      # Contracted y is split over mesh axis b -> allreduce over b.
      e = mtf.einsum([u, w], output_shape=[x, z])
      # r (split on a) -> s2 (split on a): alltoall over a.
      q = mtf.reshape(
        mtf.import_tf_tensor(mesh, tf.ones([4, 6]), [r, s]), [r2, s2]
      )
      # Shift along y (split over b): collective permute along b.
      sh = mtf.shift(u, 1, y, wrap=False)
      lowering = mtf.Lowering(mtf_graph, {mesh: mesh_impl})
      lowerings.append(lowering)
      return [
        lowering.tensors[t].to_laid_out_tensor().one_slice for t in (e, q, sh)
      ]

    with mtf.variable_store(mtf.VariableStore()):
      outputs = tf1.tpu.replicate(computation, inputs=[[]] * N)
    assert len(outputs) == N
    assert [o.shape.as_list() for o in outputs[0]] == [[2, 6], [4, 3], [2, 2]]

  (crs,) = ops_of_type(graph, "CrossReplicaSum")
  assert in_cluster(crs)
  assert static_input(crs) == physical_groups([1])
  assert crs.get_attr("T") == tf.float32
  (a2a,) = ops_of_type(graph, "AllToAll")
  assert static_input(a2a) == physical_groups([0])
  assert (
    a2a.get_attr("split_dimension"),
    a2a.get_attr("concat_dimension"),
    a2a.get_attr("split_count"),
  ) == (1, 0, 2)
  assert a2a.get_attr("T") == tf.float32
  (perm,) = ops_of_type(graph, "CollectivePermute")
  expected_pairs = []
  for p in range(N):
    a, b = layout_lib.pnum_to_processor_coordinates(MESH, p)
    if b < 3:
      expected_pairs.append(
        [
          L2P[p],
          L2P[layout_lib.processor_coordinates_to_pnum(MESH, [a, b + 1])],
        ]
      )
  assert static_input(perm) == expected_pairs
  # One pnum input for the whole graph, outside the cluster.
  (pnum,) = [
    op
    for op in ops_of_type(graph, "TPUReplicatedInput")
    if op.name == "pnum_constants"
  ]
  assert not in_cluster(pnum)
  # Slice variables: one per physical replica, on its TPU device, read in the
  # cluster through one replicated handle ordered by physical pnum.
  handles = {op.name: op for op in ops_of_type(graph, "VarHandleOp")}
  for p in range(N):
    assert handles["w_slice_%d" % p].device == "/device:TPU:%d" % p
  replicated = [
    op
    for op in ops_of_type(graph, "TPUReplicatedInput")
    if op.inputs and op.inputs[0].op.type == "VarHandleOp"
  ]
  assert len(replicated) == 1
  assert [t.op.name for t in replicated[0].inputs] == [
    "w_slice_%d" % p for p in range(N)
  ]
  assert any(in_cluster(c) for c in replicated[0].outputs[0].consumers())


@pytest.mark.parametrize(
  "max_group,summed_in", [(16, tf.bfloat16), (8, tf.float32), (4, tf.float32)]
)
def test_simd_mesh_impl_bfloat16_allreduce_threshold(max_group, summed_in):
  import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top

  simd_mesh_impl_cls = _simd_mesh_impl_class()
  n = 16
  graph = tf.Graph()
  with graph.as_default():
    mesh_impl = simd_mesh_impl_cls(
      "all:%d" % n,
      "y:all",
      backend="tpu",
      allreduce_in_bfloat16_max_group_size=max_group,
    )

    def computation():
      mtf_graph = mtf.Graph()
      mesh = mtf.Mesh(mtf_graph, "mesh")
      y = mtf.Dimension("y", 2 * n)
      u = mtf.cast(
        mtf.import_tf_tensor(mesh, tf.ones([2 * n]), [y]), tf.bfloat16
      )
      total = mtf.reduce_sum(u)
      lowering = mtf.Lowering(mtf_graph, {mesh: mesh_impl})
      out = lowering.tensors[total].to_laid_out_tensor().one_slice
      assert out.dtype == tf.bfloat16
      return [tf.cast(out, tf.float32)]

    tf1.tpu.replicate(computation, inputs=[[]] * n)
  (crs,) = ops_of_type(graph, "CrossReplicaSum")
  assert static_input(crs) == [list(range(n))]
  assert crs.get_attr("T") == summed_in
