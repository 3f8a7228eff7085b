"""Shape-only lowering: collective bytes equal the real lowerings' counters."""

import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import placement_mesh_impl
from mesh_tensorflow._src.mesh_impl import MeshImpl
from mesh_tensorflow._src.mesh_impl import collective_total_bytes
from mesh_tensorflow._src.plan import counting
from tests import mesh_test_util as mtu
from tests import meshes

A, N, C, H = 8, 8, 8, 4


def build_step(mesh):
  """Forward, gradient and SGD update using every kind of collective.

  Only the loss is exported: a lazily summed gradient exported too would be
  reduced twice by SimdMeshImpl (once per linear consumer) but once by
  PlacementMeshImpl on devices sharing host memory.

  Returns:
    the loss.
  """
  a, n, c = mtf.Dimension("a", A), mtf.Dimension("n", N), mtf.Dimension("c", C)
  h = mtf.Dimension("h", H)
  x = mtf.import_tf_tensor(
    mesh,
    tf.reshape(tf.range(A * N * C, dtype=tf.float32) / 100.0, [A, N, C]),
    [a, n, c],
  )
  w = mtf.get_variable(
    mesh, "w", [c, h], initializer=tf.random_normal_initializer(seed=1)
  )
  y = mtf.einsum([x, w], output_shape=[a, n, h])  # allreduce if c is split
  y = mtf.shift(y, 1, n, wrap=False)  # shift if n is split
  y = mtf.cumsum(y, n)  # allconcat if n is split
  a2, n2 = mtf.Dimension("a2", A), mtf.Dimension("n2", N)
  y = mtf.reshape(y, [a2, n2, h])  # a's split moves to n2: alltoall
  loss = mtf.reduce_sum(mtf.square(y))
  [dw] = mtf.gradients([loss], [w])
  mtf.assign_sub(w, dw * 0.01)
  return loss


def _placement_counts(mesh_shape, layout):
  size = mtf.convert_to_shape(mesh_shape).size
  mesh_impl = placement_mesh_impl.PlacementMeshImpl(
    mesh_shape, layout, mtu.DEVICES[:size]
  )
  with tf.Graph().as_default():
    with mtf.variable_store(mtf.VariableStore()):
      graph = mtf.Graph()
      mesh = mtf.Mesh(graph, "mesh")
      loss = build_step(mesh)
      lowering = mtf.Lowering(graph, {mesh: mesh_impl})
      lowering.export_to_tf_tensor(loss)
  return lowering.collective_bytes()


def _simd_counts(mesh_shape, layout):
  """The counters of each Lowering the replica program made (SimdMeshImpl,
  collective backend: one per trace of the replica program, which is traced
  once for all replicas, or once per replica where it falls back).
  """
  mesh_impl = mtu.simd_mesh_impl_for(mesh_shape, layout)
  per_replica = []
  store = mtf.VariableStore()

  @tf.function(autograph=False)
  def fn():
    with mtf.variable_store(store):
      graph = mtf.Graph()
      mesh = mtf.Mesh(graph, "mesh")
      loss = build_step(mesh)

      def computation():
        lowering = mtf.Lowering(graph, {mesh: mesh_impl})
        output = lowering.export_to_tf_tensor(loss)
        per_replica.append(lowering.collective_bytes())
        return [output]

      return mesh_impl.replicate(computation)

  fn.get_concrete_function()  # Traces (lowers) without running.
  return per_replica


def _planned_counts(mesh_shape, layout):
  with tf.Graph().as_default():
    with mtf.variable_store(mtf.VariableStore()):
      graph = mtf.Graph()
      mesh = mtf.Mesh(graph, "mesh")
      loss = build_step(mesh)
  return counting.lower_shape_only(
    graph, mesh, mesh_shape, layout, exported=[loss]
  )


@meshes.parametrize(meshes.PLAN)
def test_collective_bytes_equal_placement_lowering_counters(mesh_shape, layout):
  planned = _planned_counts(mesh_shape, layout).collective_total_bytes
  assert planned == _placement_counts(mesh_shape, layout)


@meshes.parametrize(meshes.PLAN[1:])
def test_collective_bytes_equal_simd_lowering_counters(mesh_shape, layout):
  planned = _planned_counts(mesh_shape, layout).collective_total_bytes
  per_trace = _simd_counts(mesh_shape, layout)
  assert per_trace
  for counted in per_trace:
    assert counted == planned


def test_every_kind_of_collective_is_exercised():
  kinds = set()
  for mesh_shape, layout in meshes.PLAN:
    counts = _planned_counts(mesh_shape, layout).collective_total_bytes
    kinds |= {k for k, v in counts.items() if v}
  assert kinds == {"allreduce", "allconcat", "alltoall", "shift"}


def test_allreduce_bytes_by_hand():
  # "c:all": the [a, n, h] einsum output (8*8*4 float32 = 1024 B per device)
  # is summed over 4 devices: a ring sends 2 * 3/4 of it from each. dw
  # ([c, h], c split) needs none; the scalar loss is local after that.
  counts = _planned_counts("all:4", "c:all").collective_total_bytes
  assert counts["allreduce"] == 4 * 2 * 3 * A * N * H * 4 // 4
  assert counts["allreduce"] == collective_total_bytes(
    "allreduce", A * N * H * 4, 4, 4
  )


def test_shape_only_lowering_allocates_no_variable():
  store = mtf.VariableStore()
  with tf.Graph().as_default() as g:
    with mtf.variable_store(store):
      graph = mtf.Graph()
      mesh = mtf.Mesh(graph, "mesh")
      loss = build_step(mesh)
      counting.lower_shape_only(graph, mesh, "all:4", "a:all", [loss])
  # No slice joins the store; the one master is a node of the build graph.
  assert list(store.masters) == ["w"]
  assert store.masters["w"].handle.graph is g


def test_matmul_flops_and_bytes():
  with tf.Graph().as_default() as g:
    a = tf.zeros([16, 32])
    b = tf.zeros([32, 8])
    first = len(g.get_operations())
    tf.matmul(a, b)
    tf.einsum("ij,jk->ik", a, b)
    tf.nn.relu(a)
    costs = counting.tf_op_costs(g.get_operations()[first:])
  by_type = {c.op_type: c for c in costs}
  assert by_type["MatMul"].flops == 2 * 16 * 32 * 8
  assert by_type["Einsum"].flops == 2 * 16 * 32 * 8
  assert by_type["MatMul"].bytes_accessed == 4 * (16 * 32 + 32 * 8 + 16 * 8)
  assert by_type["Relu"].flops == 16 * 32
  assert by_type["MatMul"].matmul and not by_type["Relu"].matmul


def test_peak_activation_bytes_of_a_chain():
  # x -> y -> z, each [64] float32: at most two are alive at once.
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  d = mtf.Dimension("d", 64)
  with tf.Graph().as_default():
    x = mtf.zeros(mesh, [d])
    y = mtf.exp(x)
    mtf.exp(y)
  impl = MeshImpl("all:4", "d:all")
  assert counting.peak_activation_bytes(graph, impl) == 2 * 64 * 4 // 4
  assert counting.slice_bytes(impl, x.shape, tf.float32) == 64


def test_numbers_are_exact_ints():
  counts = _planned_counts("rows:2;cols:2", "a:rows;n:cols")
  values = counts.collective_total_bytes.values()
  assert all(isinstance(v, int) and v >= 0 for v in values)
