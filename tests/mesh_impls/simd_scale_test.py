"""SimdMeshImpl's collective backend: work that must not grow with devices.

Making the slice variables reads each mtf variable's master once and cuts
each distinct part once (not once per device); the replica program's
function is called once per device and stored once in the step's graph,
the calls built before the function is added (so TensorFlow does not infer
the shapes of the whole body again for every call); collectives over the
same groups look the replica's entry of a pnum table up once; the calls
take each variable's slices as one packed input, ordered with direct uses
of the slices; slices made for packed calls have shapeless handles but the
first, and give the numbers of shaped slices wherever they are taken
unpacked. The numbers stay those of PlacementMeshImpl on the meshes of
tests/meshes.py.
"""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import simd_mesh_impl
from mesh_tensorflow._src import variables as variables_lib
from mesh_tensorflow._src.mesh_impls import collective_ops
from mesh_tensorflow._src.mesh_impls import simd_collective
from mesh_tensorflow._src.mesh_impls import slice_variables
from tests import mesh_test_util as mtu
from tests import meshes

DEVICES = ["/cpu:%d" % i for i in range(8)]
BATCH = mtf.Dimension("batch", 8)
D_IN = mtf.Dimension("d_in", 4)
HIDDEN = mtf.Dimension("hidden", 8)


def _program(mesh):
  """Two variables (one split on both mesh axes in the 2-d layouts)."""
  x = mtf.import_tf_tensor(
    mesh, tf.reshape(tf.range(32.0), [8, 4]), [BATCH, D_IN]
  )
  w = mtf.get_variable(
    mesh, "w", [D_IN, HIDDEN], initializer=tf.random_normal_initializer(seed=3)
  )
  b = mtf.get_variable(
    mesh, "b", [HIDDEN], initializer=tf.random_normal_initializer(seed=4)
  )
  h = mtf.einsum([x, w], output_shape=[BATCH, HIDDEN]) + b
  return [h, mtf.reduce_sum(h, reduced_dim=BATCH)]


def _count_master_reads(monkeypatch):
  """{variable name: number of get_master calls}, filled as they happen."""
  reads = {}
  original = variables_lib.Variable.get_master

  def counting(self):
    reads[self.name] = reads.get(self.name, 0) + 1
    return original(self)

  monkeypatch.setattr(variables_lib.Variable, "get_master", counting)
  return reads


@meshes.parametrize(
  meshes.ELEMENTWISE_OPS[1:]
  + meshes.mesh_layouts(("b:2;m:4", ["batch:b;hidden:m", "hidden:b;d_in:m"]))
)
def test_slices_from_one_master_read(monkeypatch, mesh_shape, layout):
  size = mtf.convert_to_shape(mesh_shape).size
  expected = mtu.run_program(_program, mesh_shape, layout, "function")
  mesh_impl = simd_mesh_impl.SimdMeshImpl(
    mesh_shape, layout, devices=DEVICES[:size]
  )
  reads = _count_master_reads(monkeypatch)
  store = mtf.VariableStore()
  found = {}

  @tf.function(autograph=False)
  def run():
    with mtf.variable_store(store):
      graph = mtf.Graph()
      mesh = mtf.Mesh(graph, "mesh")
      outputs = _program(mesh)

      def computation():
        lowering = mtf.Lowering(graph, {mesh: mesh_impl})
        found["slices"] = {
          v.name: lowering.variables[v].slice_variables
          for v in graph.all_variables
        }
        found["masters"] = {v.name: v.master for v in graph.all_variables}
        return [lowering.export_to_tf_tensor(t) for t in outputs]

      return mesh_impl.replicate(computation)

  per_replica = run()
  # One read per variable, however many devices hold its slices.
  assert reads == {"w": 1, "b": 1}
  for outs in per_replica:
    mtu.assert_all_close([np.asarray(o) for o in outs], expected)
  for name, slices in found["slices"].items():
    assert len(slices) == size
    master = found["masters"][name].numpy()
    shape = mtf.convert_to_shape(
      [(d.name, d.size) for d in ([D_IN, HIDDEN] if name == "w" else [HIDDEN])]
    )
    for pnum, var in enumerate(slices):
      begin = mesh_impl.slice_begin(shape, mesh_impl.p2l(pnum))
      sizes = mesh_impl.slice_shape(shape)
      part = master[tuple(slice(b, b + s) for b, s in zip(begin, sizes))]
      assert var.name == "%s/%s_slice_%d:0" % (name, name, pnum)
      assert var.device.endswith("CPU:%d" % pnum)
      np.testing.assert_array_equal(var.numpy(), part)


def _backend(devices):
  return simd_collective.CollectiveBackend(
    devices, timeout_seconds=mtu.COLLECTIVE_TIMEOUT_SECONDS
  )


def _replicate_in_function(backend, program):
  """(outputs, GraphDef of the step): program on every replica in a step."""
  graphs = []

  @tf.function(autograph=False)
  def run():
    outputs = backend.replicate(program, (), list(range(backend.num_replicas)))
    graphs.append(tf.compat.v1.get_default_graph())
    return outputs

  outputs = run()
  return outputs, graphs[0].as_graph_def()


def test_one_function_called_on_every_device():
  backend = _backend(DEVICES)
  shared = tf.Variable(2.0)  # Read by every replica (no ordering between).

  def program():
    x = tf.cast(backend.replica_pnum(), tf.float32) * shared
    for _ in range(50):  # A body much larger than the calls.
      x = x * 1.0
    return backend.allreduce_sum(tf.fill([3], x), [list(range(8))])

  outputs, graph_def = _replicate_in_function(backend, program)
  for y in outputs:
    np.testing.assert_array_equal(y.numpy(), [56.0] * 3)  # 2 * (0 + .. + 7)
  # Partitioned calls (not direct ones): the shared variable is on a device
  # of its own.
  calls = [n for n in graph_def.node if n.op == "StatefulPartitionedCall"]
  assert sorted(n.device for n in calls) == sorted(
    tf.DeviceSpec.from_string(d).to_string() for d in DEVICES
  )
  assert len({n.attr["f"].func.name for n in calls}) == 1
  assert [f.signature.name for f in graph_def.library.function] == [
    calls[0].attr["f"].func.name
  ]
  # The shared variable is an input the calls only read.
  for call in calls:
    read_only = list(call.attr["_read_only_resource_inputs"].list.i)
    assert read_only
  # The outputs have the shapes of the trace.
  assert all(y.shape == [3] for y in outputs)


def test_replicate_under_a_gradient_tape():
  backend = _backend(DEVICES[:4])
  w = tf.Variable(3.0)

  def program():
    pnum = tf.cast(backend.replica_pnum(), tf.float32)
    return pnum * w * w

  @tf.function(autograph=False)
  def run():
    with tf.GradientTape() as tape:
      outputs = backend.replicate(program, (), [0, 1, 2, 3])
      total = tf.add_n(outputs)
    return total, tape.gradient(total, w)

  total, grad = run()
  assert float(total) == pytest.approx(6 * 9.0)  # (0 + 1 + 2 + 3) * w^2
  assert float(grad) == pytest.approx(6 * 2 * 3.0)


def _all_reduce_nodes(backend):
  """(outputs, [(CollectiveReduceV2 node, its instance key Const node)])."""

  def program():
    x = tf.cast(backend.replica_pnum(), tf.float32)
    return backend.allreduce_sum(tf.fill([2], x), [[0, 1], [2, 3]])

  outputs, graph_def = _replicate_in_function(backend, program)
  nodes = {n.name: n for f in graph_def.library.function for n in f.node_def}
  reduces = [n for n in nodes.values() if n.op == "CollectiveReduceV2"]
  return [y.numpy() for y in outputs], [
    (n, nodes[n.input[3].split(":")[0]]) for n in reduces
  ]


def test_all_reduce_built_as_the_raw_op(monkeypatch):
  """The all-reduce built directly equals the raw op built under a tape."""
  outputs, direct = _all_reduce_nodes(_backend(DEVICES[:4]))
  monkeypatch.setattr(
    collective_ops.record, "could_possibly_record", lambda: True
  )
  raw_outputs, raw = _all_reduce_nodes(_backend(DEVICES[:4]))
  for got in (outputs, raw_outputs):
    np.testing.assert_array_equal(got, [[1.0] * 2] * 2 + [[5.0] * 2] * 2)
  assert len(direct) == len(raw) == 1
  (node, key), (raw_node, raw_key) = direct[0], raw[0]
  assert dict(node.attr) == dict(raw_node.attr)
  assert node.name == raw_node.name
  # The same inputs; the ordering token's function argument is named apart.
  assert node.input[:4] == raw_node.input[:4]
  assert len(node.input) == len(raw_node.input) == 5
  assert key.name.endswith("/instance_key")
  assert key.attr["dtype"] == raw_key.attr["dtype"]
  value, raw_value = key.attr["value"].tensor, raw_key.attr["value"].tensor
  assert value.dtype == raw_value.dtype
  assert value.tensor_shape == raw_value.tensor_shape
  assert len(value.int_val) == len(raw_value.int_val) == 1


def test_pnum_tables_looked_up_once_per_trace():
  """Collectives over the same groups share one lookup of their group key."""
  backend = _backend(DEVICES)
  halves = [[0, 1, 2, 3], [4, 5, 6, 7]]  # A key per half: a pnum table.

  def program():
    x = tf.cast(backend.replica_pnum(), tf.float32)
    for _ in range(3):
      x = backend.allreduce_sum(x, halves)
    return x

  outputs, graph_def = _replicate_in_function(backend, program)
  # Sums of 0..3 and 4..7, then 4 and 16 times those.
  expected = [6.0 * 16] * 4 + [22.0 * 16] * 4
  assert [float(y) for y in outputs] == expected
  (body,) = graph_def.library.function
  ops_of = [n.op for n in body.node_def]
  assert ops_of.count("CollectiveReduceV2") == 3
  assert ops_of.count("GatherV2") == 1


def _slices(values):
  """One float32 [2] variable per device of DEVICES, slice i holding values[i]."""
  slices = []
  for device, value in zip(DEVICES, values):
    with tf.device(device):
      slices.append(tf.Variable(tf.fill([2], float(value))))
  return slices


def _add_pnum_program(backend, slices):
  """Each replica adds its pnum + 1 to its slice and returns the new value."""

  def program():
    var = backend.replica_variable("w", slices)
    pnum = tf.cast(backend.replica_pnum(), tf.float32)
    return tf.identity(var.assign_add(tf.fill([2], pnum + 1.0)))

  return program


def test_slices_passed_packed_one_input_per_variable():
  """The calls share one packed input per variable; each updates its slice."""
  backend = _backend(DEVICES)
  slices = _slices(range(8))
  outputs, graph_def = _replicate_in_function(
    backend, _add_pnum_program(backend, slices)
  )
  want = [2.0 * p + 1.0 for p in range(8)]
  assert [float(y[0]) for y in outputs] == want
  assert [float(v[1]) for v in slices] == want
  # Called directly (ops of the function's type): every resource input
  # is on the call's device.
  (function,) = graph_def.library.function
  assert not [n for n in graph_def.node if "PartitionedCall" in n.op]
  calls = [n for n in graph_def.node if n.op == function.signature.name]
  assert len(calls) == 8
  placeholders = {n.name for n in graph_def.node if n.op == "Placeholder"}
  # Inputs: the pnum, the packed slices (one input for all calls) and the
  # call's device's ordering token.
  packed = {c.input[1] for c in calls}
  assert len(packed) == 1 and packed <= placeholders
  assert len({c.input[2] for c in calls}) == 8


def test_direct_slice_uses_ordered_with_packed_calls():
  """Slices used directly before and after the calls see their updates."""
  backend = _backend(DEVICES[:4])
  slices = _slices([10, 20, 30, 40])

  @tf.function(autograph=False)
  def run():
    slices[2].assign(tf.fill([2], 100.0))
    first = backend.replicate(
      _add_pnum_program(backend, slices), (), [0, 1, 2, 3]
    )
    # A second program on the same slices, without collectives: the calls
    # of each device run after that device's first call.
    second = backend.replicate(
      _add_pnum_program(backend, slices), (), [0, 1, 2, 3]
    )
    after = [v.read_value() for v in slices]
    return first, second, after

  first, second, after = run()
  assert [float(y[0]) for y in first] == [11.0, 22.0, 103.0, 44.0]
  assert [float(y[0]) for y in second] == [12.0, 24.0, 106.0, 48.0]
  assert [float(y[0]) for y in after] == [12.0, 24.0, 106.0, 48.0]


def _update_program(mesh):
  """h = x w (read before the update) and the update w := 1.5 w + 0.25."""
  x = mtf.import_tf_tensor(
    mesh, tf.reshape(tf.range(32.0) / 7.0, [8, 4]), [BATCH, D_IN]
  )
  w = mtf.get_variable(
    mesh, "w", [D_IN, HIDDEN], initializer=tf.random_normal_initializer(seed=3)
  )
  h = mtf.einsum([x, w], output_shape=[BATCH, HIDDEN])
  update = mtf.assign(w, w * 1.5 + 0.25)
  return h, update


def _step(mesh_impl, store, kind, found):
  """A step running _update_program, traced per replica for "per_replica"."""

  @tf.function(autograph=False)
  def step():
    with mtf.variable_store(store):
      graph = mtf.Graph()
      mesh = mtf.Mesh(graph, "mesh")
      h, update = _update_program(mesh)

      def computation():
        if kind == "per_replica":
          mesh_impl.backend.current_replica()
        lowering = mtf.Lowering(graph, {mesh: mesh_impl})
        (w,) = graph.all_variables
        found["slices"] = lowering.variables[w].slice_variables
        with tf.control_dependencies([lowering.lowered_operation(update)]):
          return tf.identity(lowering.export_to_tf_tensor(h))

      return mesh_impl.replicate(computation)[0]

  return step


def _run_steps(mesh_impl, store, kinds):
  """Runs _update_program once per kind: "packed", "per_replica", "taped".

  Returns the outputs of every step (replica 0's h) and the slices of w.
  """
  found = {}
  results = []
  for kind in kinds:
    step = _step(mesh_impl, store, kind, found)
    if kind == "taped":
      with tf.GradientTape():
        results.append(step().numpy())
    else:
      results.append(step().numpy())
  return results, found["slices"]


def test_slices_made_packed_borrow_the_shape_of_the_first():
  """Slices made for packed calls have shapeless handles but pnum 0's.

  Taken unpacked (traced per replica, or while a tape records), they are
  passed with the first slice's shape; the steps give the numbers of
  slices that all have shapes, and direct reads after the steps see the
  updates.
  """
  mesh_impl = simd_mesh_impl.SimdMeshImpl(
    "b:2;m:4", "batch:b;hidden:m", devices=DEVICES, backend="collective"
  )
  steps = ["packed", "per_replica", "taped", "per_replica"]
  shaped_store = mtf.VariableStore()
  want, shaped = _run_steps(mesh_impl, shaped_store, ["per_replica"] + steps)
  assert all(slice_variables.shape_source(v) is None for v in shaped)

  store = mtf.VariableStore()
  got, slices = _run_steps(mesh_impl, store, ["packed"] + steps)
  assert slice_variables.shape_source(slices[0]) is None
  assert all(slice_variables.shape_source(v) is slices[0] for v in slices[1:])
  for a, b in zip(got, want):
    np.testing.assert_array_equal(a, b)
  for a, b in zip(slices, shaped):
    np.testing.assert_array_equal(a.numpy(), b.numpy())
  # Five updates w := 1.5 w + 0.25 of the master's value (the slices of
  # pnums 0-3 hold the four parts of hidden).
  master = store.masters["w"].numpy()
  for _ in range(5):
    master = master * 1.5 + 0.25
  np.testing.assert_allclose(
    np.concatenate([s.numpy() for s in slices[:4]], axis=1), master, rtol=1e-6
  )
