"""Tests of the Cloud TPU driver (transformer/_src/driver/tpu.py,
tpu_connection.py, tpu_mesh.py and tpu_train_loop.py).

No TPU is needed: topologies are synthetic (a v3-8 and a v4-32 slice), the
TPU step graph is built in a tf.Graph and inspected without running, and the
same step code runs on CPU with SimdMeshImpl's collective backend.
"""

import itertools
import json
import pathlib
import shutil
import socket

from absl.testing import flagsaver
import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import simd_mesh_impl
from tests.transformer import driver_test_util as dtu
from transformer import dataset as dataset_lib
from transformer import utils
from transformer import vocabulary
from transformer._src.driver import checkpoints
from transformer._src.driver import cluster_spec
from transformer._src.driver import evaluation
from transformer._src.driver import run as driver_run
from transformer._src.driver import tpu
from transformer._src.driver import tpu_connection
from transformer._src.driver import tpu_mesh
from transformer._src.driver import tpu_train_loop

V3_8 = [2, 2, 1, 2]  # x, y, z, cores per chip; one host
V4_32 = [2, 2, 4, 1]  # 16 megacore chips on 4 hosts
V3_MESH = ("rows:4;cols:2", "batch:rows,heads:cols,d_ff:cols,vocab:cols")
V4_MESH = ("batch:4;model:4", "batch:batch,d_ff:model,vocab:model")
CPU_MESH = ("all:2", "heads:all,d_ff:all,vocab:all")


def v3_8():
  return tpu_connection.synthetic_topology(V3_8)


def v4_32():
  return tpu_connection.synthetic_topology(V4_32, num_hosts=4)


# Tests run on the v3-8 and on the v4-32, with their meshes and replicas.
ON_BOTH_SLICES = pytest.mark.parametrize(
  "topology, mesh, replicas",
  [(v3_8, V3_MESH, 8), (v4_32, V4_MESH, 16)],
  ids=["v3-8", "v4-32"],
)


def coordinates(plan, replica):
  return tuple(int(c) for c in plan.device_assignment.coordinates(replica, 0))


# --------------------------------------------------------------------------
# Synthetic topologies and the mesh -> topology plan.


def test_synthetic_topologies_look_like_the_slices():
  topology = v3_8()
  assert list(topology.mesh_shape) == V3_8
  assert (topology.num_tasks, topology.num_tpus_per_task) == (1, 8)
  topology = v4_32()
  assert list(topology.mesh_shape) == V4_32
  assert (topology.num_tasks, topology.num_tpus_per_task) == (4, 4)
  # Host h owns the z == h plane of 2x2 chips.
  for host in range(4):
    zs = {int(c[2]) for c in topology.device_coordinates[host]}
    assert zs == {host}
  with pytest.raises(ValueError, match="3 hosts do not divide the 16"):
    tpu_connection.synthetic_topology(V4_32, num_hosts=3)
  with pytest.raises(ValueError, match="4 positive ints"):
    tpu_connection.synthetic_topology([2, 2, 2])


def test_plan_v3_8_one_dim_mesh_walks_the_chip_ring():
  plan = tpu_mesh.plan_mesh("batch:8", v3_8())
  assert plan.physical_shape == [2, 2, 2]  # [y*z, x, cores]
  assert plan.logical_to_physical == [0, 1, 2, 3, 6, 7, 4, 5]
  da = plan.device_assignment
  assert (da.num_replicas, da.num_cores_per_replica) == (8, 1)
  # Replica r is the core of physical pnum r (row-major over [y, x, core]).
  for r in range(8):
    y, x, core = np.unravel_index(r, [2, 2, 2])
    assert coordinates(plan, r) == (x, y, 0, core)
  assert len({coordinates(plan, r) for r in range(8)}) == 8
  # Logical neighbours are on the same chip or on neighbouring chips, and
  # the ring closes.
  chips = [coordinates(plan, p)[:2] for p in plan.logical_to_physical]
  for a, b in zip(chips, chips[1:] + chips[:1]):
    assert abs(a[0] - b[0]) + abs(a[1] - b[1]) <= 1
  assert {da.host_device(replica=r) for r in range(8)} == {
    "/task:0/device:CPU:0"
  }
  assert [da.tpu_ordinal(replica=r) for r in range(8)] == [
    v3_8().tpu_device_ordinal_at_coordinates(coordinates(plan, r))
    for r in range(8)
  ]


def test_plan_v3_8_two_dim_mesh_keeps_model_groups_on_a_chip():
  plan = tpu_mesh.plan_mesh(V3_MESH[0], v3_8())
  mesh_impl = tpu_mesh.tpu_mesh_impl(plan, V3_MESH[1])
  assert isinstance(mesh_impl, simd_mesh_impl.SimdMeshImpl)
  assert mesh_impl.device_assignment is plan.device_assignment
  # The two processors of every "cols" group are the two cores of one chip.
  for group in mtf.processor_groups(plan.mesh_shape, [1]):
    chips = {coordinates(plan, plan.logical_to_physical[p])[:3] for p in group}
    assert len(chips) == 1, group
  # The backend's replica devices are the assignment's TPU cores.
  for r in range(8):
    assert mesh_impl.backend.device(r) == plan.device_assignment.tpu_device(
      replica=r
    )


def test_plan_v4_32_covers_every_chip_and_feeds_from_its_host():
  topology = v4_32()
  plan = tpu_mesh.plan_mesh(V4_MESH[0], topology)
  assert plan.physical_shape == [8, 2, 1]  # [y*z, x, cores]
  assert sorted(plan.logical_to_physical) == list(range(16))
  da = plan.device_assignment
  assert (da.num_replicas, da.num_cores_per_replica) == (16, 1)
  coords = [coordinates(plan, r) for r in range(16)]
  assert sorted(coords) == sorted(
    tuple(c) for c in itertools.product(range(2), range(2), range(4), [0])
  )
  mesh_impl = tpu_mesh.tpu_mesh_impl(plan, V4_MESH[1])
  hosts = tpu_mesh.replica_host_devices(mesh_impl, job="worker")
  for r in range(16):
    task = topology.task_ordinal_at_coordinates(coords[r])
    assert hosts[r] == "/job:worker/task:%d/device:CPU:0" % task
    assert task == coords[r][2]
  assert sorted(hosts.count(h) for h in set(hosts)) == [4, 4, 4, 4]


def test_plan_with_a_hierarchical_tiling_spec():
  spec = [("batch", None), ("model", [1, 1, 2])]
  plan = tpu_mesh.plan_mesh("batch:4;model:2", v3_8(), spec)
  tiling = simd_mesh_impl.HierarchicalTiling(spec, [2, 2, 2])
  assert plan.logical_to_physical == tiling.logical_to_physical
  with pytest.raises(ValueError, match="gives mesh 'batch:4;model:2'"):
    tpu_mesh.plan_mesh("batch:2;model:4", v3_8(), spec)


ORIGINAL_MAPPINGS = json.loads(
  (
    pathlib.Path(__file__).parents[1]
    / "mesh_impls"
    / "data"
    / "original_tpu_mapping.json"
  ).read_text()
)


def original_mapping(topology_shape, logical_shape, cores_per_chip, fold_xy):
  """The original's auto_logical_to_physical_tpu on that input.

  From tests/mesh_impls/data/make_original_tpu_mapping.py.
  """
  (case,) = [
    c
    for c in ORIGINAL_MAPPINGS
    if c["topology"] == topology_shape
    and c["logical_shape"] == logical_shape
    and c["logical_cores_per_chip"] == cores_per_chip
    and c["fold_xy"] == fold_xy
  ]
  return case["logical_to_physical"]["value"]


@pytest.mark.parametrize("fold_xy", [False, True])
def test_plan_v4_32_with_one_logical_core_per_chip(fold_xy):
  # --logical_cores_per_chip=1: the original's mapping over TF's default
  # device assignment (TPUEstimator's), the 16 chips seen as [y*z, x] =
  # 8 x 2 (--fold_xy: [x*y, z] = 4 x 4).
  with flagsaver.flagsaver(logical_cores_per_chip=1, fold_xy=fold_xy):
    plan = tpu_mesh.plan_mesh(V4_MESH[0], v4_32())
    assert plan.physical_shape == ([4, 4, 1] if fold_xy else [8, 2, 1])
    default = tf.tpu.experimental.DeviceAssignment.build(
      v4_32(), num_replicas=16
    )
    assert [coordinates(plan, r) for r in range(16)] == [
      tuple(int(c) for c in default.coordinates(r, 0)) for r in range(16)
    ]
    assert plan.logical_to_physical == original_mapping(
      V4_32, [4, 4], 1, fold_xy
    )
    # The TPU backend's collectives use those replica ids.
    mesh_impl = tpu_mesh.tpu_mesh_impl(plan, V4_MESH[1])
    assert mesh_impl.logical_to_physical == plan.logical_to_physical
    coords = simd_mesh_impl.auto_logical_to_physical_tpu(
      [4, 4], plan.physical_shape, return_coordinates=True
    )
  # Each "model" group is a rectangle of 4 chips of that grid (2 x 2, or a
  # whole column of 4 when the grid is 4 x 4).
  for group in mtf.processor_groups(plan.mesh_shape, [1]):
    rows, columns = zip(*[coords[p][:2] for p in group])
    assert len(set(rows)) * len(set(columns)) == 4
    assert max(rows) - min(rows) + 1 == len(set(rows))


@pytest.mark.parametrize("fold_xy", [False, True])
def test_plan_v3_with_fold_xy_and_a_z_axis(fold_xy):
  # A 2-core-per-chip slice with z > 1 ([2, 2, 2, 2]): the original's
  # mapping on [y*z, x, 2] (--fold_xy: [x*y, z, 2]); replica r is the core
  # at 3-d pnum r.
  topology = tpu_connection.synthetic_topology([2, 2, 2, 2], num_hosts=2)
  with flagsaver.flagsaver(fold_xy=fold_xy):
    plan = tpu_mesh.plan_mesh("batch:4;model:4", topology)
  assert plan.physical_shape == [4, 2, 2]
  assert plan.logical_to_physical == original_mapping(
    [2, 2, 2, 2], [4, 4], 2, fold_xy
  )
  for r in range(16):
    row, column, core = np.unravel_index(r, [4, 2, 2])
    if fold_xy:  # rows are (y, x), columns z
      want = (row % 2, row // 2, column, core)
    else:  # rows are (z, y), columns x
      want = (column, row % 2, row // 2, core)
    assert coordinates(plan, r) == want


def test_tpu_mesh_shape_counts_logical_cores_per_chip():
  assert utils.tpu_mesh_shape("2x2x4", 4) == mtf.convert_to_shape(
    "batch:8;model:4"
  )
  with flagsaver.flagsaver(logical_cores_per_chip=1):
    assert utils.tpu_mesh_shape("2x2x4", 4) == mtf.convert_to_shape(
      "batch:4;model:4"
    )
    assert utils.tpu_mesh_shape("v4-32", 4) == mtf.convert_to_shape(
      "batch:8;model:4"
    )


def test_a_mesh_that_does_not_fit_the_topology_is_a_clear_error():
  with pytest.raises(
    ValueError,
    match=r"mesh_shape 'batch:16' has 16 processors but TPU 'my-tpu' "
    r"\(topology \[2, 2, 1, 2\].*has 8 cores on 1 host",
  ):
    tpu_mesh.plan_mesh("batch:16", v3_8(), tpu_name="my-tpu")
  with pytest.raises(ValueError, match="has 4 processors.*16 cores on 4"):
    tpu_mesh.plan_mesh("batch:4", v4_32())


# --------------------------------------------------------------------------
# Resolving and connecting: clear errors naming the TPU.


def test_unreachable_tpu_address_is_a_clear_error():
  port = cluster_spec.free_local_ports(1)[0]
  address = "grpc://127.0.0.1:%d" % port
  with pytest.raises(
    tpu_connection.TpuConnectionError,
    match=r"TPU 'grpc://127.0.0.1:%d' is unreachable: worker "
    r"127.0.0.1:%d does not accept connections" % (port, port),
  ):
    tpu_connection.resolve_tpu(address, connect_timeout_seconds=5)


def test_unresolvable_tpu_name_is_a_clear_error():
  with pytest.raises(
    tpu_connection.TpuConnectionError,
    match=r"cannot resolve TPU 'no-such-tpu' \(zone 'us-central2-b', "
    r"project 'no-project'\)",
  ):
    tpu_connection.resolve_tpu("no-such-tpu", "us-central2-b", "no-project")
  with pytest.raises(tpu_connection.TpuConnectionError, match="no TPU given"):
    tpu_connection.resolve_tpu("")


def test_initialising_without_a_tpu_is_a_clear_error():
  resolver = tpu_connection.resolve_tpu("local")
  with pytest.raises(
    tpu_connection.TpuConnectionError,
    match="cannot initialise TPU 'local': TPUs not",
  ):
    tpu_connection.initialize_tpu(resolver, "local")


def test_setup_tpu_resolves_connects_initialises_and_plans(monkeypatch):
  # The --tpu path up to the first program, with TF's TPU calls recorded:
  # TPUClusterResolver gets the flags, every worker's port is checked, the
  # client connects to the resolver's cluster, initialise_tpu_system runs
  # on it, and the mesh is planned on the topology it returns (a v4-32).
  listeners = [socket.socket() for _ in range(4)]
  calls = []
  try:
    for s in listeners:
      s.bind(("127.0.0.1", 0))
      s.listen()
    addresses = ["127.0.0.1:%d" % s.getsockname()[1] for s in listeners]

    class FakeResolver:
      def __init__(self, tpu, zone, project, job_name):
        calls.append(("resolve", tpu, zone, project, job_name))
        self.job_name = job_name

      def cluster_spec(self):
        return tf.train.ClusterSpec({self.job_name: addresses})

      def master(self):
        return "grpc://" + addresses[0]

      def get_job_name(self):
        return self.job_name

    def fake_connect(resolver):
      calls.append(("connect", resolver.master()))

    def fake_initialize(resolver):
      calls.append(("initialize", resolver.get_job_name()))
      return v4_32()

    monkeypatch.setattr(
      tf.distribute.cluster_resolver, "TPUClusterResolver", FakeResolver
    )
    monkeypatch.setattr(
      tf.config, "experimental_connect_to_cluster", fake_connect
    )
    monkeypatch.setattr(
      tf.tpu.experimental, "initialize_tpu_system", fake_initialize
    )
    setup = tpu.setup_tpu(
      "my-tpu", "us-central2-b", "my-project", "tpu_worker", V4_MESH[0]
    )
  finally:
    for s in listeners:
      s.close()
  assert calls == [
    ("resolve", "my-tpu", "us-central2-b", "my-project", "tpu_worker"),
    ("connect", "grpc://" + addresses[0]),
    ("initialize", "tpu_worker"),
  ]
  assert (setup.tpu, setup.job) == ("my-tpu", "tpu_worker")
  assert setup.plan.device_assignment.num_replicas == 16
  # The plan is the automatic mapping of the mesh onto that topology.
  expected = tpu_mesh.plan_mesh(V4_MESH[0], v4_32())
  assert setup.plan.logical_to_physical == expected.logical_to_physical
  # Each processor is the TPU core of its replica on the host owning it,
  # in the TPU's job.
  for r, device in enumerate(setup.mesh_devices):
    spec = tf.DeviceSpec.from_string(device)
    assert (spec.job, spec.device_type) == ("tpu_worker", "TPU")
    assert spec.task == v4_32().task_ordinal_at_coordinates(
      coordinates(setup.plan, r)
    )
  assert len(set(setup.mesh_devices)) == 16


def test_setup_tpu_with_an_unreachable_worker_names_the_tpu(monkeypatch):
  # One of the resolved workers does not accept connections: nothing is
  # connected or initialised (connecting would wait forever).
  port = cluster_spec.free_local_ports(1)[0]
  calls = []

  class FakeResolver:
    def __init__(self, tpu, zone, project, job_name):
      self.job_name = job_name

    def cluster_spec(self):
      return tf.train.ClusterSpec({self.job_name: ["127.0.0.1:%d" % port]})

  monkeypatch.setattr(
    tf.distribute.cluster_resolver, "TPUClusterResolver", FakeResolver
  )
  monkeypatch.setattr(
    tf.config, "experimental_connect_to_cluster", calls.append
  )
  monkeypatch.setattr(
    tf.tpu.experimental, "initialize_tpu_system", calls.append
  )
  with pytest.raises(
    tpu_connection.TpuConnectionError,
    match=r"TPU 'my-tpu' \(zone 'z', project 'p'\) is unreachable: worker "
    r"127.0.0.1:%d does not accept connections" % port,
  ):
    tpu.setup_tpu("my-tpu", "z", "p", None, V4_MESH[0])
  assert not calls


# --------------------------------------------------------------------------
# The TPU step graph, built in a tf.Graph (not run).


# The legacy pass (MTF_TEST_TF_MODE=v1) builds these graphs with TF1 control
# flow, by TensorFlow's choice: a while loop is a frame of Enter, Merge,
# Switch, LoopCond and Exit ops in the graph itself, not a While op whose
# condition and body are functions. The helpers below find the same things
# in either form; a loop is named by its While op, or by its LoopCond op.
V1_LOOPS = not tf.compat.v1.control_flow_v2_enabled()
LOOP_OP = "LoopCond" if V1_LOOPS else "While"


def host_loops(graph):
  """The outermost while loops of `graph` (its host loops)."""
  return [
    op
    for op in graph.get_operations()
    if op.type == LOOP_OP
    and (not V1_LOOPS or op._get_control_flow_context().outer_context is None)  # pylint: disable=protected-access
  ]


def loop_cond_ops(ops, loop_op):
  """The ops computing the loop's condition (v1: up to its Merge and Enter)."""
  if not V1_LOOPS:
    cond = loop_op.get_attr("cond").name
    return [op for op in ops if getattr(op.graph, "name", None) == cond]
  found, stack = [], [loop_op.inputs[0].op]
  while stack:
    op = stack.pop()
    if op not in found:
      found.append(op)
      if op.type not in ("Merge", "Enter"):
        stack.extend(t.op for t in op.inputs)
  return found


def loop_invariants(ops, loop_op):
  """The tensors a loop takes as inputs (v1: the inputs of its Enter ops)."""
  if not V1_LOOPS:
    return list(loop_op.inputs)
  context = loop_op._get_control_flow_context()  # pylint: disable=protected-access
  return [
    op.inputs[0]
    for op in ops
    if op.type == "Enter" and op._get_control_flow_context() is context  # pylint: disable=protected-access
  ]


def runs_in_loop_body(op, loop_op):
  """Whether `op` runs in the body of the loop (v1: in its frame)."""
  if not V1_LOOPS:
    return getattr(op.graph, "name", None) == loop_op.get_attr("body").name
  context = op._get_control_flow_context()  # pylint: disable=protected-access
  while context is not None and not context.IsWhileContext():
    context = context.outer_context
  return context is loop_op._get_control_flow_context()  # pylint: disable=protected-access


def group_assignment(op):
  value = tf.get_static_value(op.inputs[-1])
  if value is None:
    value = tf.make_ndarray(op.inputs[-1].op.get_attr("value"))
  return [list(g) for g in np.asarray(value).tolist()]


def expected_groups(plan, mesh_axes):
  return [
    [plan.logical_to_physical[p] for p in group]
    for group in mtf.processor_groups(plan.mesh_shape, mesh_axes)
  ]


def tpu_estimator_in(graph, tmp_path, topology, mesh):
  """An Estimator in `graph` whose mesh_impl is the TPU backend."""
  plan = tpu_mesh.plan_mesh(mesh[0], topology)
  with graph.as_default():
    # The TPU cores as the mesh's devices (the host has too few CPUs).
    devices = [
      plan.device_assignment.tpu_device(replica=r)
      for r in range(plan.mesh_shape.size)
    ]
    # The program is built in `graph`, not run by the driver: its global
    # step belongs there in TF1 legacy mode too (eager there by default).
    est = dtu.estimator(
      tmp_path, mesh=mesh, mesh_devices=devices, variables_in_current_graph=True
    )
    est.mesh_impl = tpu_mesh.tpu_mesh_impl(plan, mesh[1])
  return plan, est


def count_step_traces(est):
  """Makes est.lower_train_step count its calls in est.step_traces.

  One call per trace of the replica program.
  """
  lower_train_step = est.lower_train_step
  est.step_traces = 0

  def counted(features):
    est.step_traces += 1
    return lower_train_step(features)

  est.lower_train_step = counted
  return est


def build_tpu_train_graph(tmp_path, topology, mesh, iterations_per_loop):
  graph = tf.Graph()
  plan, est = tpu_estimator_in(graph, tmp_path, topology, mesh)
  count_step_traces(est)
  with graph.as_default():
    loop = tpu_train_loop.ReplicatedTrainLoop(
      est, iterations_per_loop, job="worker"
    )
    outputs = loop.trace(loop.make_iterators(dtu.input_fn))
  # One trace of the replica program for all replicas and steps.
  assert est.step_traces == 1
  return plan, graph, loop, outputs


def test_v3_8_step_graph_replicates_over_8_cores_in_a_host_loop(tmp_path):
  plan, graph, loop, outputs = build_tpu_train_graph(
    tmp_path, v3_8(), V3_MESH, iterations_per_loop=3
  )
  assert loop.hosts == ["/job:worker/task:0/device:CPU:0"]
  assert sorted(outputs) == [
    "diverged_loss",
    "diverged_step",
    "finite",
    "learning_rate",
    "loss",
    "step",
  ]
  ops = list(dtu.all_ops(graph))
  (loop_op,) = host_loops(graph)
  (metadata,) = [op for op in ops if op.type == "TPUReplicateMetadata"]
  # One replicated computation of 8 replicas, inside the host while loop.
  assert metadata.get_attr("num_replicas") == 8
  assert V1_LOOPS or metadata.graph is not graph
  assert runs_in_loop_body(metadata, loop_op)
  assert metadata.get_attr("device_assignment") == [
    c for r in range(8) for c in coordinates(plan, r)
  ]
  topology = tf.tpu.experimental.Topology(
    serialized=metadata.get_attr("topology")
  )
  assert list(topology.mesh_shape) == V3_8
  # The loop count is the while condition's bound.
  assert loop_bound(ops, loop_op) == 3
  # The loop also stops after a non-finite step.
  cond_ops = [op.type for op in loop_cond_ops(ops, loop_op)]
  assert "LogicalAnd" in cond_ops
  # Collectives run over the physical groups of the mesh axes.
  allowed = {str(expected_groups(plan, axes)) for axes in ([0], [1], [0, 1])}
  sums = [op for op in ops if op.type == "CrossReplicaSum"]
  seen = {str(group_assignment(op)) for op in sums}
  assert seen <= allowed
  # The d_ff contraction sums over "cols", the gradients over "rows".
  assert str(expected_groups(plan, [1])) in seen
  assert str(expected_groups(plan, [0])) in seen
  # One host pipeline feeds all 8 replicas.
  reads = [op for op in ops if op.type == "IteratorGetNext"]
  assert [op.device for op in reads] == ["/job:worker/task:0/device:CPU:0"]


def test_v4_32_step_graph_each_host_feeds_its_own_replicas(tmp_path):
  plan, graph, loop, _ = build_tpu_train_graph(
    tmp_path, v4_32(), V4_MESH, iterations_per_loop=2
  )
  ops = list(dtu.all_ops(graph))
  (metadata,) = [op for op in ops if op.type == "TPUReplicateMetadata"]
  assert metadata.get_attr("num_replicas") == 16
  hosts = ["/job:worker/task:%d/device:CPU:0" % h for h in range(4)]
  assert loop.hosts == hosts
  # The masters stay on the first host's CPU (the TPU cores hold slices).
  masters = loop.estimator.store.masters.values()
  assert masters and {v.device for v in masters} == {hosts[0]}
  reads = [op for op in ops if op.type == "IteratorGetNext"]
  assert sorted(op.device for op in reads) == hosts
  # Each feature's replicated input takes replica r's value from the
  # pipeline of the host owning replica r's chip.
  feature_inputs = [
    op
    for op in ops
    if op.type == "TPUReplicatedInput"
    and op.inputs[0].op.type in ("Cast", "Identity", "IteratorGetNext")
  ]
  assert feature_inputs
  for op in feature_inputs:
    assert len(op.inputs) == 16
    for r, tensor in enumerate(op.inputs):
      source = tensor.op
      while source.type != "IteratorGetNext":
        source = source.inputs[0].op
      task = v4_32().task_ordinal_at_coordinates(coordinates(plan, r))
      assert source.device == hosts[task]
  allowed = {str(expected_groups(plan, axes)) for axes in ([0], [1], [0, 1])}
  sums = [op for op in ops if op.type == "CrossReplicaSum"]
  seen = {str(group_assignment(op)) for op in sums}
  assert sums and seen <= allowed
  # The d_ff contraction sums over "model", the gradients over "batch".
  assert str(expected_groups(plan, [1])) in seen
  assert str(expected_groups(plan, [0])) in seen


# --------------------------------------------------------------------------
# Evaluation, scoring and decoding programs on TPU, built in a tf.Graph.


def replicated_ops(ops, metadata):
  """The ops of the replicated computation `metadata` heads."""
  cluster = metadata.get_attr("_tpu_replicate")
  for op in ops:
    try:
      if op.get_attr("_tpu_replicate") == cluster:
        yield op
    except ValueError:
      pass


@ON_BOTH_SLICES
def test_eval_and_decode_programs_replicate_over_every_core(
  tmp_path, topology, mesh, replicas
):
  graph = tf.Graph()
  plan, est = tpu_estimator_in(graph, tmp_path, topology(), mesh)
  x, y = dtu.reverse_data(dtu.BATCH)
  with graph.as_default():
    features = {"inputs": tf.constant(x), "targets": tf.constant(y)}
    # The teacher-forced program of eval and scoring.
    _, loss, xent, predictions, _, _ = evaluation.teacher_forced_graph(
      est, features
    )
    # Greedy decoding (the model's while loop).
    _, decodes = evaluation.decode_graph(est, tf.constant(x))
  assert loss.shape == [] and loss.dtype == tf.float32
  assert xent.shape == y.shape and predictions.shape == y.shape
  assert decodes.shape == x.shape and decodes.dtype == tf.int32
  ops = list(dtu.all_ops(graph))
  metadata = [op for op in ops if op.type == "TPUReplicateMetadata"]
  assert len(metadata) == 2  # one replicated program each
  for m in metadata:
    assert m.get_attr("num_replicas") == replicas
    assert m.get_attr("device_assignment") == [
      c for r in range(replicas) for c in coordinates(plan, r)
    ]
  # The outputs are those of logical processor 0's replica.
  for t in (loss, xent, predictions, decodes):
    source = t.op.inputs[0]
    assert source.op.type == "TPUReplicatedOutput", t
    assert source.value_index == plan.logical_to_physical[0], t
  # The decode's while loop runs inside its replicated computation.
  decode_ops = list(replicated_ops(ops, metadata[1]))
  assert LOOP_OP in {op.type for op in decode_ops}
  # Collectives over the mesh's physical groups; the batch reaches every
  # replica as its input.
  allowed = {str(expected_groups(plan, axes)) for axes in ([0], [1], [0, 1])}
  sums = [op for op in ops if op.type == "CrossReplicaSum"]
  seen = {str(group_assignment(op)) for op in sums}
  assert sums and seen <= allowed
  # The d_ff contraction sums over "model", the gradients over "batch".
  assert str(expected_groups(plan, [1])) in seen
  assert str(expected_groups(plan, [0])) in seen
  inputs = [
    op
    for op in ops
    if op.type == "TPUReplicatedInput"
    and op.inputs[0].op.type == "Const"
    and "pnum" not in op.name
  ]
  assert inputs and all(len(op.inputs) == replicas for op in inputs)


def loop_bound(ops, loop_op):
  """The Python int bounding a while loop (the Const of its condition)."""
  (bound,) = [
    tf.get_static_value(op.outputs[0])
    for op in loop_cond_ops(ops, loop_op)
    if op.type == "Const"
  ]
  return bound


@ON_BOTH_SLICES
def test_eval_loop_runs_iterations_per_loop_batches_per_host_call(
  tmp_path, topology, mesh, replicas
):
  graph = tf.Graph()
  plan, est = tpu_estimator_in(graph, tmp_path, topology(), mesh)
  x, y = dtu.reverse_data(dtu.BATCH)
  with graph.as_default():
    features = {
      "inputs": tf.constant(np.stack([x] * 3)),
      "targets": tf.constant(np.stack([y] * 3)),
    }
    _, losses, xent, predictions, _, _ = evaluation.teacher_forced_loop_graph(
      est, features
    )
  assert losses.shape == (3,)
  assert xent.shape == predictions.shape == (3,) + y.shape
  ops = list(dtu.all_ops(graph))
  # One replicated program, traced once, inside a host loop of 3 batches.
  (loop_op,) = host_loops(graph)
  (metadata,) = [op for op in ops if op.type == "TPUReplicateMetadata"]
  assert runs_in_loop_body(metadata, loop_op)
  assert metadata.get_attr("num_replicas") == replicas
  assert metadata.get_attr("device_assignment") == [
    c for r in range(replicas) for c in coordinates(plan, r)
  ]
  assert loop_bound(ops, loop_op) == 3
  allowed = {str(expected_groups(plan, axes)) for axes in ([0], [1], [0, 1])}
  sums = [op for op in ops if op.type == "CrossReplicaSum"]
  seen = {str(group_assignment(op)) for op in sums}
  assert sums and seen <= allowed
  # The d_ff contraction sums over "model", the gradients over "batch".
  assert str(expected_groups(plan, [1])) in seen
  assert str(expected_groups(plan, [0])) in seen


def count_calls(est, graphs=None):
  """Makes est.run_phase record (batches given, batches to run) of each
  call of a loop phase in the returned list (and the graph of its trace in
  `graphs`), and check that later calls of a phase (the last call, with
  fewer batches to run, among them) retrace nothing.
  """
  calls = []
  traces = {}
  run_phase = est.run_phase

  def counted(phase, features, *num_batches):
    if num_batches:
      calls.append(
        (int(next(iter(features.values())).shape[0]), int(num_batches[0]))
      )
    result = run_phase(phase, features, *num_batches)
    count = phase.fn.experimental_get_tracing_count()
    assert traces.setdefault(phase, count) == count
    if graphs is not None:
      graphs.append(
        phase.fn.get_concrete_function(features, *num_batches).graph
      )
    return result

  est.run_phase = counted
  return calls


@pytest.mark.slow
def test_eval_with_iterations_per_loop_gives_the_same_metrics(
  tmp_path, monkeypatch
):
  # 5 batches, 2 per call on a fake TPU (collective backend on CPUs): 3
  # calls, and the metrics of placement's one batch per call.
  (model_dir,) = common_start(tmp_path, "model")
  dataset = dtu.eval_dataset(n=5 * dtu.BATCH - 3)
  want = dtu.estimator(model_dir, mesh=CPU_MESH).evaluate(dataset)
  fake_tpu_on_cpus(monkeypatch, CPU_MESH[0])
  inner = dtu.estimator(model_dir, mesh=CPU_MESH)
  est = tpu.TpuEstimator(inner, tpu.setup_tpu(), iterations_per_loop=2)
  assert est.batches_per_call == 2
  calls = count_calls(inner)
  got = evaluation.evaluate(est, dataset)
  # The last call's missing batch is a zero batch it does not count.
  assert calls == [(2, 2), (2, 2), (2, 1)]
  assert sorted(got) == sorted(want)
  for metric, value in want.items():
    assert got[metric] == pytest.approx(value, rel=1e-5), metric
  assert got["num_eval_sequences"] == 5 * dtu.BATCH - 3


@ON_BOTH_SLICES
def test_score_and_decode_loops_run_batches_in_one_host_call(
  tmp_path, topology, mesh, replicas
):
  # Scoring's teacher-forced program and greedy decoding, 3 batches per host
  # call, the number to run an input of the call (the last call of a run
  # may have fewer): each is one replicated program, traced once, in the
  # body of a host While whose bound is that input; each host copies the
  # batch once and feeds its own replicas.
  graph = tf.Graph()
  plan, inner = tpu_estimator_in(graph, tmp_path, topology(), mesh)
  est = tpu.TpuEstimator(
    inner, tpu.TpuSetup("t", None, plan, "worker"), iterations_per_loop=3
  )
  assert est.batches_per_call == 3
  x, y = dtu.reverse_data(dtu.BATCH)
  with graph.as_default():
    features = {
      "inputs": tf.constant(np.stack([x] * 3)),
      "targets": tf.constant(np.stack([y] * 3)),
    }
    count = tf.compat.v1.placeholder(tf.int32, [], name="num_batches")
    _, losses, xent, predictions, _, _ = evaluation.teacher_forced_loop_graph(
      est, features, count
    )
    _, decodes = evaluation.decode_loop_graph(
      est, {"inputs": features["inputs"]}, count
    )
  assert losses.shape == (3,)
  assert xent.shape == predictions.shape == decodes.shape == (3,) + y.shape
  assert decodes.dtype == tf.int32
  ops = list(dtu.all_ops(graph))
  loops = host_loops(graph)
  metadata = [op for op in ops if op.type == "TPUReplicateMetadata"]
  assert len(loops) == len(metadata) == 2
  hosts = sorted(set(est.replica_hosts))
  assert len(hosts) == topology().num_tasks
  for loop_op, m in zip(loops, metadata):
    assert runs_in_loop_body(m, loop_op)
    assert m.get_attr("num_replicas") == replicas
    assert m.get_attr("device_assignment") == [
      c for r in range(replicas) for c in coordinates(plan, r)
    ]
    # The bound is the loop's input `count`, not a constant.
    assert count in loop_invariants(ops, loop_op)
    assert not [op for op in loop_cond_ops(ops, loop_op) if op.type == "Const"]
    # Replica r's batch is the copy on the host owning its core.
    body = [op for op in ops if runs_in_loop_body(op, loop_op)]
    feeds = [
      op
      for op in body
      if op.type == "TPUReplicatedInput" and op.inputs[0].op.type == "Identity"
    ]
    assert feeds
    for op in feeds:
      assert [t.op.device for t in op.inputs] == [
        est.replica_hosts[r] for r in range(replicas)
      ]
  # The decode's own while loop runs inside its replicated computation.
  assert LOOP_OP in {op.type for op in replicated_ops(ops, metadata[1])}
  allowed = {str(expected_groups(plan, axes)) for axes in ([0], [1], [0, 1])}
  sums = [op for op in ops if op.type == "CrossReplicaSum"]
  seen = {str(group_assignment(op)) for op in sums}
  assert sums and seen <= allowed
  # The d_ff contraction sums over "model", the gradients over "batch".
  assert str(expected_groups(plan, [1])) in seen
  assert str(expected_groups(plan, [0])) in seen


def assert_same_decodes(got, want):
  assert len(got) == len(want)
  for g, w in zip(got, want):
    np.testing.assert_array_equal(g, w)


@pytest.mark.slow
def test_scoring_and_decoding_in_calls_of_batches_match_placement(
  tmp_path, monkeypatch
):
  # 37 examples in 5 batches, 3 per call: 2 calls, the second running 2 of
  # its 3 batches. Placement's one batch per call is the reference; the
  # same loops run on placement (a real host while loop on CPU) and on a
  # fake TPU (the collective backend, the loop unrolled).
  (model_dir,) = common_start(tmp_path, "model")
  dtu.estimator(model_dir, mesh=CPU_MESH).train(dtu.input_fn, 2)
  x, y = dtu.reverse_data(5 * dtu.BATCH - 3, seed=2)
  reference = dtu.estimator(model_dir, mesh=CPU_MESH)
  want_scores = evaluation.score_ids(reference, x, y)
  want_decodes = evaluation.decode_ids(reference, x)
  assert len(want_scores) == len(want_decodes) == len(x)
  looped = dtu.estimator(model_dir, mesh=CPU_MESH)
  looped.batches_per_call = 3
  fake_tpu_on_cpus(monkeypatch, CPU_MESH[0])
  inner = dtu.estimator(model_dir, mesh=CPU_MESH)
  on_tpu = tpu.TpuEstimator(inner, tpu.setup_tpu(), iterations_per_loop=3)
  for est, calls in (
    (looped, count_calls(looped)),
    (on_tpu, count_calls(inner)),
  ):
    np.testing.assert_allclose(
      evaluation.score_ids(est, x, y), want_scores, rtol=1e-5
    )
    assert_same_decodes(evaluation.decode_ids(est, x), want_decodes)
    # Scoring, then decoding: 3 batches given per call, 3 then 2 run.
    assert calls == [(3, 3), (3, 2)] * 2
  # Beam search, and fewer batches than one call holds.
  beam = dict(beam_size=2)
  assert_same_decodes(
    evaluation.decode_ids(on_tpu, x[:10], **beam),
    evaluation.decode_ids(reference, x[:10], **beam),
  )


@pytest.mark.slow
def test_multihost_scoring_and_decoding_match_placement(tmp_path, monkeypatch):
  # The v3-8 as if each of its 4 chips had its own host (host h faked by
  # /device:CPU:h): each host's copy of the batches feeds the replicas on
  # its chip; 2 batches per call over 3 batches.
  (model_dir,) = common_start(tmp_path, "model")
  x, y = dtu.reverse_data(3 * dtu.BATCH - 1, seed=3)
  reference = dtu.estimator(model_dir, mesh=MULTIHOST_MESH)
  want_scores = evaluation.score_ids(reference, x, y)
  want_decodes = evaluation.decode_ids(reference, x)
  topology = tpu_connection.synthetic_topology(V3_8, num_hosts=4)
  fake_tpu_on_cpus(monkeypatch, MULTIHOST_MESH[0], topology)
  setup = tpu.setup_tpu()
  hosts = [
    "/device:CPU:%d"
    % topology.task_ordinal_at_coordinates(coordinates(setup.plan, r))
    for r in range(8)
  ]
  assert len(set(hosts)) == 4
  inner = dtu.estimator(model_dir, mesh=MULTIHOST_MESH)
  est = tpu.TpuEstimator(
    inner, setup, iterations_per_loop=2, replica_hosts=hosts
  )
  graphs = []
  calls = count_calls(inner, graphs)
  np.testing.assert_allclose(
    evaluation.score_ids(est, x, y), want_scores, rtol=1e-5
  )
  assert_same_decodes(evaluation.decode_ids(est, x), want_decodes)
  assert calls == [(2, 2), (2, 1)] * 2
  # Each call's batches are copied to every host.
  for graph in graphs:
    copies = {
      op.device
      for op in graph.get_operations()
      if op.type == "Identity" and op.device
    }
    assert {tf.DeviceSpec.from_string(h).to_string() for h in hosts} <= {
      tf.DeviceSpec.from_string(d).to_string() for d in copies
    }


def test_eval_and_decode_programs_compile_with_xla(tmp_path):
  # A TPU runs only what XLA compiles; the teacher-forced and decoding
  # programs (one processor) compile with XLA on CPU and give what the
  # uncompiled ones give.
  est = dtu.estimator(tmp_path, mesh=("all:1", "batch:all"), mesh_impl="simd")
  est.train(dtu.input_fn, 1)
  x, y = dtu.reverse_data(dtu.BATCH)
  features = {"inputs": tf.constant(x), "targets": tf.constant(y)}

  def programs(features):
    _, loss, xent, predictions, _, _ = evaluation.teacher_forced_graph(
      est, features
    )
    _, decodes = evaluation.decode_graph(est, features["inputs"])
    return loss, xent, predictions, decodes

  compiled = tf.function(programs, jit_compile=True, autograph=False)
  plain = tf.function(programs, autograph=False)
  for got, want in zip(compiled(features), plain(features)):
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5)


# --------------------------------------------------------------------------
# The same step code on CPU (collective backend).


def simd_estimator(model_dir, **kwargs):
  est = dtu.estimator(model_dir, mesh=CPU_MESH, **kwargs)
  est.mesh_impl = simd_mesh_impl.SimdMeshImpl(est.mesh_shape, est.layout_rules)
  return est


def common_start(tmp_path, *names):
  """Model dirs holding one step-0 checkpoint (the same initial weights)."""
  start = dtu.estimator(tmp_path / "start", mesh=CPU_MESH)
  start.train(dtu.input_fn, 0)
  start.save()
  for name in names:
    shutil.copytree(tmp_path / "start", tmp_path / name)
  return [tmp_path / name for name in names]


def assert_same_checkpoints(directory, reference_directory):
  reference = tf.train.load_checkpoint(str(reference_directory))
  reader = tf.train.load_checkpoint(str(directory))
  names = set(reference.get_variable_to_shape_map())
  assert set(reader.get_variable_to_shape_map()) == names
  for name in names:
    np.testing.assert_allclose(
      reader.get_tensor(name),
      reference.get_tensor(name),
      rtol=1e-5,
      atol=1e-6,
      err_msg=name,
    )


@pytest.mark.slow
def test_iterations_per_loop_same_training_as_single_steps_and_placement(
  tmp_path,
):
  placement_dir, single_dir, looped_dir = common_start(
    tmp_path, "placement", "single", "looped"
  )
  # Placement: the Estimator's own loop.
  expected = dtu.estimator(placement_dir, mesh=CPU_MESH).train(dtu.input_fn, 2)
  # SIMD (collective backend), one step per call, one host.
  one = tpu_train_loop.train(
    simd_estimator(single_dir), dtu.input_fn, 2, iterations_per_loop=1
  )
  # SIMD, two steps in one call, each replica fed by its own "host".
  two = tpu_train_loop.train(
    simd_estimator(looped_dir),
    dtu.input_fn,
    2,
    iterations_per_loop=2,
    replica_hosts=["/device:CPU:0", "/device:CPU:1"],
  )
  assert one["step"] == two["step"] == expected["step"] == 2
  np.testing.assert_allclose(one["loss"], expected["loss"], rtol=1e-5)
  np.testing.assert_allclose(two["loss"], expected["loss"], rtol=1e-5)
  # Same checkpoint names and values: either side restores the other's.
  assert_same_checkpoints(single_dir, placement_dir)
  assert_same_checkpoints(looped_dir, placement_dir)


MULTIHOST_MESH = ("batch:4;model:2", "batch:batch,d_ff:model,vocab:model")


@pytest.mark.slow
def test_multihost_loop_traces_once_and_trains_as_placement(tmp_path):
  # A v3-8 as if each of its 4 chips had its own host, faked on the 8 CPUs:
  # the TPU plan places the mesh, host h's "CPU" is /device:CPU:h, and each
  # host's own input pipeline feeds the replicas on its chip.
  placement_dir, multihost_dir = common_start(
    tmp_path, "placement", "multihost"
  )
  expected = dtu.estimator(placement_dir, mesh=MULTIHOST_MESH).train(
    dtu.input_fn, 2
  )
  topology = tpu_connection.synthetic_topology(V3_8, num_hosts=4)
  plan = tpu_mesh.plan_mesh(MULTIHOST_MESH[0], topology)
  assert plan.logical_to_physical != list(range(8))
  est = dtu.estimator(multihost_dir, mesh=MULTIHOST_MESH)
  est.mesh_impl = simd_mesh_impl.SimdMeshImpl(
    est.mesh_shape,
    est.layout_rules,
    devices=["/device:CPU:%d" % i for i in range(8)],
    logical_to_physical=plan.logical_to_physical,
  )
  count_step_traces(est)
  hosts = [
    "/device:CPU:%d"
    % topology.task_ordinal_at_coordinates(coordinates(plan, replica))
    for replica in range(8)
  ]
  assert hosts == ["/device:CPU:%d" % (r // 2) for r in range(8)]
  read_on = []

  def input_fn(context):
    # Called once per host, on that host's device.
    read_on.append(
      (context.input_pipeline_id, tf.constant(0).device.split("device:")[-1])
    )
    return dtu.input_fn()

  got = tpu_train_loop.train(
    est, input_fn, 2, iterations_per_loop=2, replica_hosts=hosts
  )
  assert read_on == [(h, "CPU:%d" % h) for h in range(4)]
  # The replica program was traced once per step of the loop, not once per
  # replica.
  assert est.step_traces == 2
  assert got["step"] == expected["step"] == 2
  np.testing.assert_allclose(got["loss"], expected["loss"], rtol=1e-5)
  assert_same_checkpoints(multihost_dir, placement_dir)


@pytest.mark.slow
def test_checkpoints_restore_across_placement_and_simd(tmp_path):
  straight_dir, simd_first, placement_first = common_start(
    tmp_path, "straight", "simd_first", "placement_first"
  )
  expected = dtu.estimator(straight_dir, mesh=CPU_MESH).train(dtu.input_fn, 4)
  # Two SIMD steps, then two placement steps from the SIMD checkpoint.
  tpu_train_loop.train(
    simd_estimator(simd_first), dtu.input_fn, 2, iterations_per_loop=2
  )
  got = dtu.estimator(simd_first, mesh=CPU_MESH).train(
    dtu.input_fn, 4, skip_seen_data=True
  )
  np.testing.assert_allclose(got["loss"], expected["loss"], rtol=1e-5)
  assert_same_checkpoints(simd_first, straight_dir)
  # Two placement steps, then two SIMD steps from the placement checkpoint.
  dtu.estimator(placement_first, mesh=CPU_MESH).train(dtu.input_fn, 2)
  got = tpu_train_loop.train(
    simd_estimator(placement_first),
    dtu.input_fn,
    4,
    iterations_per_loop=2,
    skip_seen_data=True,
  )
  assert got["step"] == 4
  np.testing.assert_allclose(got["loss"], expected["loss"], rtol=1e-5)
  assert_same_checkpoints(placement_first, straight_dir)


def diverged_at(error, model_dir):
  """(step and loss, non-finite names) of a divergence error's message."""
  message = str(error).replace(str(model_dir), "DIR")
  head, rest = message.split("; non-finite variables: ")
  return head, rest.split(". Nothing")[0]


@pytest.mark.slow
def test_a_diverging_loop_raises_as_placement_and_saves_nothing(tmp_path):
  dirs = common_start(tmp_path, "placement", "two", "four")
  # SGD at 1e30: step 1's weights are huge, step 2 overflows.
  diverge = dict(
    optimizer=mtf.optimize.SgdOptimizer, learning_rate_schedule=1e30
  )
  with pytest.raises(FloatingPointError) as placement:
    dtu.estimator(dirs[0], mesh=CPU_MESH, **diverge).train(dtu.input_fn, 4)
  want_step, want_names = diverged_at(placement.value, dirs[0])
  assert want_step.startswith("training diverged at step 2: loss ")
  for model_dir, iterations in zip(dirs[1:], (2, 4)):
    est = simd_estimator(model_dir, **diverge)
    with pytest.raises(FloatingPointError) as looped:
      # One call runs every step; with 4, steps 3 and 4 run after the
      # divergence (the collective backend's loop is unrolled).
      tpu_train_loop.train(est, dtu.input_fn, 4, iterations_per_loop=iterations)
    step, names = diverged_at(looped.value, model_dir)
    assert step == want_step  # the first non-finite step and its loss
    if iterations == 2:  # the loop ended at that step: the same variables
      assert names == want_names
      assert str(looped.value).replace(str(model_dir), "DIR") == str(
        placement.value
      ).replace(str(dirs[0]), "DIR")
    assert names.startswith("decoder/") or names.startswith("encoder/")
    # Nothing was saved, and the non-finite masters refuse to be.
    assert checkpoints.checkpoint_steps(str(model_dir)) == [0]
    with pytest.raises(ValueError, match="hold inf/nan"):
      est.save()
    assert checkpoints.checkpoint_steps(str(model_dir)) == [0]


def test_loop_needs_a_simd_mesh_impl(tmp_path):
  est = dtu.estimator(tmp_path, mesh=CPU_MESH)
  with pytest.raises(ValueError, match="SimdMeshImpl, got PlacementMeshImpl"):
    tpu_train_loop.ReplicatedTrainLoop(est)
  est.mesh_impl = simd_mesh_impl.SimdMeshImpl(est.mesh_shape, est.layout_rules)
  with pytest.raises(ValueError, match="iterations_per_loop must be >= 1"):
    tpu_train_loop.ReplicatedTrainLoop(est, 0)
  with pytest.raises(ValueError, match="1 replica hosts given for a mesh of 2"):
    tpu_train_loop.ReplicatedTrainLoop(est, 1, replica_hosts=["/device:CPU:0"])


# --------------------------------------------------------------------------
# utils.run with --tpu.


def run_with_tpu(tmp_path, tpu_name, mode="train", **kwargs):
  kwargs.setdefault("mesh_shape", "batch:8")
  kwargs.setdefault("layout_rules", "batch:batch")
  kwargs.setdefault("train_steps", 4)
  return driver_run.run(
    tpu_job_name=None,
    tpu=tpu_name,
    gcp_project=None,
    tpu_zone=None,
    model_dir=str(tmp_path),
    mode=mode,
    sequence_length=dtu.LENGTH,
    batch_size=dtu.BATCH,
    train_dataset_fn=lambda **unused: dtu.input_fn().unbatch(),
    **kwargs,
  )


def test_run_with_a_tpu_trains_with_the_tpu_loop(tmp_path, monkeypatch):
  # The TPU is replaced by a synthetic v3-8 and the training by a recorder:
  # run() must map the mesh onto it and hand the loop its settings.
  plan = tpu_mesh.plan_mesh("batch:8", v3_8(), tpu_name="my-tpu")
  setup = tpu.TpuSetup("my-tpu", None, plan, "worker")
  calls = {}

  def fake_setup(*args):
    calls["setup"] = args
    return setup

  def fake_train(estimator, input_fn, max_steps, iterations_per_loop, **kw):
    calls["train"] = (estimator, max_steps, iterations_per_loop, kw)
    calls["batch"] = next(iter(input_fn()))
    return {"step": max_steps}

  monkeypatch.setattr(tpu, "setup_tpu", fake_setup)
  monkeypatch.setattr(tpu, "train", fake_train)
  dtu.tiny_gin()
  result = run_with_tpu(
    tmp_path,
    "my-tpu",
    vocabulary=vocabulary.ByteVocabulary(),
    iterations_per_loop=3,
  )
  assert result == {"step": 4}
  assert calls["setup"] == ("my-tpu", None, None, None, "batch:8")
  estimator, max_steps, iterations_per_loop, kw = calls["train"]
  assert (max_steps, iterations_per_loop) == (4, 3)
  assert kw["job"] == "worker"
  mesh_impl = estimator.mesh_impl
  assert isinstance(mesh_impl, simd_mesh_impl.SimdMeshImpl)
  assert mesh_impl.device_assignment is plan.device_assignment
  assert mesh_impl.logical_to_physical == plan.logical_to_physical
  assert calls["batch"]["targets"].shape == (dtu.BATCH, dtu.LENGTH)


def test_run_with_an_unreachable_tpu_fails_before_building(tmp_path):
  port = cluster_spec.free_local_ports(1)[0]
  with pytest.raises(tpu_connection.TpuConnectionError, match="is unreachable"):
    run_with_tpu(tmp_path, "grpc://127.0.0.1:%d" % port)
  assert not list(tmp_path.iterdir())


def test_run_places_the_mesh_as_the_originals_gin_options_say(
  tmp_path, monkeypatch
):
  # The original's recipe: mesh_shape = @tpu_mesh_shape() with a tiling spec
  # as model_parallelism, the same spec as
  # tpu_estimator_model_fn.hierarchical_tiling_spec; autostack from run().
  spec = [("batch", None), ("model", [2, 1, 1])]
  mesh_shape = utils.tpu_mesh_shape("2x2", spec)
  assert mesh_shape == mtf.convert_to_shape("batch:4;model:2")
  monkeypatch.setattr(
    tpu,
    "setup_tpu",
    lambda name, zone, project, job, mesh: tpu.TpuSetup(
      name, None, tpu_mesh.plan_mesh(mesh, v3_8()), None
    ),
  )
  trained = []
  monkeypatch.setattr(
    tpu, "train", lambda est, *args, **kwargs: trained.append(est) or {}
  )
  dtu.tiny_gin(
    "utils.tpu_estimator_model_fn.hierarchical_tiling_spec = %r" % spec
  )
  run_with_tpu(
    tmp_path,
    "my-tpu",
    mesh_shape=mesh_shape,
    layout_rules="batch:batch,d_ff:model",
    autostack=False,
    vocabulary=vocabulary.ByteVocabulary(),
  )
  (est,) = trained
  tiling = simd_mesh_impl.HierarchicalTiling(spec, [2, 2, 2])
  automatic = tpu_mesh.plan_mesh(mesh_shape, v3_8()).logical_to_physical
  assert est.mesh_impl.logical_to_physical == tiling.logical_to_physical
  assert tiling.logical_to_physical != automatic
  assert est.autostack is False
  # The "model" pairs span the two chips of a column ([2, 1, 1]: y).
  plan = tpu_mesh.plan_mesh(mesh_shape, v3_8(), spec)
  for group in mtf.processor_groups(mesh_shape, [1]):
    chips = [coordinates(plan, plan.logical_to_physical[p]) for p in group]
    assert [c[1] for c in chips] == [0, 1] and chips[0][0] == chips[1][0]
  # Ensemble parallelism: [ensemble, batch, model]; the later dims stay
  # close (each model pair is one chip's two cores).
  mesh_shape = utils.tpu_mesh_shape("2x2", 2, ensemble_parallelism=2)
  assert mesh_shape == mtf.convert_to_shape("ensemble:2;batch:2;model:2")
  plan = tpu_mesh.plan_mesh(mesh_shape, v3_8())
  for group in mtf.processor_groups(mesh_shape, [2]):
    chips = {coordinates(plan, plan.logical_to_physical[p])[:3] for p in group}
    assert len(chips) == 1, group


def fake_tpu_on_cpus(monkeypatch, mesh_shape, topology=None):
  """run()'s TPU: a synthetic slice of mesh_shape's size (or `topology`)
  whose programs run on CPUs with the collective backend (placed as on the
  TPU).
  """
  size = mtf.convert_to_shape(mesh_shape).size
  topology = topology or tpu_connection.synthetic_topology([1, size // 2, 1, 2])
  plan = tpu_mesh.plan_mesh(mesh_shape, topology, tpu_name="fake-tpu")
  setup = tpu.TpuSetup("fake-tpu", None, plan, None)
  made = []

  def collective_mesh_impl(plan, layout_rules):
    mesh_impl = simd_mesh_impl.SimdMeshImpl(
      plan.mesh_shape,
      layout_rules,
      devices=["/device:CPU:%d" % i for i in range(size)],
      logical_to_physical=plan.logical_to_physical,
    )
    made.append(mesh_impl)
    return mesh_impl

  monkeypatch.setattr(tpu, "setup_tpu", lambda *args: setup)
  monkeypatch.setattr(tpu, "tpu_mesh_impl", collective_mesh_impl)
  return made


REVERSE_STRINGS = ["abc", "hello", "xy", "mesh"]


def exact_match(targets, predictions):
  return {
    "exact_match": float(
      np.mean([t == p for t, p in zip(targets, predictions)])
    )
  }


def eval_dataset_fn(**unused):
  x, y = dtu.reverse_data(12, seed=1)
  examples = lambda: tf.data.Dataset.from_tensor_slices(
    {"inputs": x, "targets": y}
  )
  return [dataset_lib.EvalDataset("rev", examples, None, [exact_match])]


def bind_infer_and_score(tmp_path, name):
  """gin bindings of infer and score_from_strings; returns the scores."""
  inputs = str(tmp_path / "inputs.txt")
  with open(inputs, "w") as f:
    f.write("\n".join(REVERSE_STRINGS) + "\n")
  scores = []
  prefix = "mesh_tensorflow.transformer.utils."
  for param, value in (
    ("decode_from_file.input_filename", inputs),
    ("decode_from_file.output_filename", str(tmp_path / name / "decodes")),
    ("score_from_strings.inputs", REVERSE_STRINGS),
    ("score_from_strings.targets", [s[::-1] for s in REVERSE_STRINGS]),
    (
      "score_from_strings.score_postprocess_fn",
      lambda results, vocabulary: scores.extend(r["scores"] for r in results),
    ),
  ):
    gin.bind_parameter(prefix + param, value)
  return scores


@pytest.mark.slow
def test_run_eval_infer_score_export_with_a_tpu_match_placement(
  tmp_path, monkeypatch
):
  # run() with --tpu on CPUs: the TPU path's estimator and phases, lowered
  # with the collective backend; the results are placement's.
  mesh = dict(mesh_shape="all:2", layout_rules=CPU_MESH[1])
  model_dir = tmp_path / "model"
  bytes_vocabulary = vocabulary.ByteVocabulary()
  common = dict(vocabulary=bytes_vocabulary, eval_checkpoint_step=-1, **mesh)
  # float32 activations: bfloat16 rounds differently on other layouts.
  dtu.tiny_gin("utils.get_variable_dtype.activation_dtype = 'float32'")
  run_with_tpu(model_dir, None, "train", train_steps=2, **common)
  results = {}
  for name in ("placement", "tpu"):
    if name == "tpu":
      made = fake_tpu_on_cpus(monkeypatch, mesh["mesh_shape"])
    scores = bind_infer_and_score(tmp_path, name)
    tpu_name = None if name == "placement" else "fake-tpu"
    metrics = run_with_tpu(
      model_dir,
      tpu_name,
      "eval",
      eval_dataset_fn=eval_dataset_fn,
      eval_summary_dir=str(tmp_path / name),
      **common,
    )["rev"]
    # The teacher-forced metrics (12 examples: two batches of 8).
    metrics.update(
      run_with_tpu(
        model_dir,
        tpu_name,
        "perplexity_eval",
        eval_dataset_fn=eval_dataset_fn,
        perplexity_eval_steps=2,
        **common,
      )["rev"]
    )
    run_with_tpu(model_dir, tpu_name, "infer", **common)
    run_with_tpu(model_dir, tpu_name, "score_from_strings", **common)
    results[name] = (metrics, scores)
  # eval, perplexity_eval, infer and score ran on the "TPU" mesh.
  assert len(made) == 4
  assert all(m.device_assignment is None for m in made)  # on CPUs
  (want, want_scores), (got, got_scores) = results["placement"], results["tpu"]
  assert sorted(got) == sorted(want)
  for metric, value in want.items():
    assert got[metric] == pytest.approx(value, rel=1e-5), metric
  assert got["num_eval_tokens"] == 12 * dtu.LENGTH
  np.testing.assert_allclose(got_scores, want_scores, rtol=1e-5)
  assert len(got_scores) == len(REVERSE_STRINGS)

  # Greedy decodes: of the eval examples and of the infer inputs.
  def read(name, file_name):
    return utils.get_inputs_from_file(str(tmp_path / name / file_name))

  for file_name in ("rev_2_predictions", "decodes-2"):
    assert read("tpu", file_name) == read("placement", file_name), file_name
  decodes = read("tpu", "decodes-2")
  assert len(decodes) == len(REVERSE_STRINGS)
  # Export with --tpu: the CPU SavedModel, without contacting the TPU.
  monkeypatch.setattr(tpu, "setup_tpu", None)
  path = run_with_tpu(
    model_dir,
    "fake-tpu",
    "export_infer",
    export_path=str(tmp_path / "export"),
    **common,
  )
  served = tf.saved_model.load(path).signatures["serving_default"]
  outputs = served(inputs=tf.constant(REVERSE_STRINGS))["outputs"].numpy()
  assert [o.decode() for o in outputs] == decodes
