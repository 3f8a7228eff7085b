"""Tests for mesh_tensorflow._src.variables: variables, dtypes, store, assign."""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mesh_test_util as mtu
from tests import meshes

tf1 = tf.compat.v1

A = mtf.Dimension("a", 4)
B = mtf.Dimension("b", 8)
H = mtf.Dimension("h", 2)


_RNG = np.random.RandomState(5)
W0 = _RNG.randn(4, 8).astype(np.float32)
DELTA = _RNG.randn(4, 8).astype(np.float32)
INPUT = _RNG.randn(2, 4).astype(np.float32)  # [h, a]
TARGET = _RNG.randn(2, 8).astype(np.float32)  # [h, b]


def _new_mesh():
  graph = mtf.Graph()
  return graph, mtf.Mesh(graph, "mesh")


def _run(build_fn, mesh_shape, layout, mode, store, steps=1, read_first=False):
  """Runs build_fn(mesh) -> (assign ops, output tensors, mtf variables).

  Eager and tf.function modes build and lower the program once per step
  (variables persist in `store`); graph mode builds one tf.Graph and runs it
  `steps` times in a Session: the assigns, then the outputs (or the outputs
  first if `read_first`). Returns (output values of each step, master values
  after copy_slices_to_masters).
  """

  def build_and_lower():
    graph, mesh = _new_mesh()
    assigns, outputs, variables = build_fn(mesh)
    lowering = mtf.Lowering(
      graph, {mesh: mtu.mesh_impl_for(mesh_shape, layout)}
    )
    return lowering, assigns, outputs, variables

  if mode == "eager":
    all_values = []
    for _ in range(steps):
      with mtf.variable_store(store):
        lowering, _, outputs, variables = build_and_lower()
        all_values.append(
          [lowering.export_to_tf_tensor(t).numpy() for t in outputs]
        )
        lowering.copy_slices_to_masters()
    return all_values, [v.master.numpy() for v in variables]
  if mode == "function":
    holder = {}

    @tf.function(autograph=False)
    def fn():
      with mtf.variable_store(store):
        lowering, _, outputs, variables = build_and_lower()
        values = [lowering.export_to_tf_tensor(t) for t in outputs]
        with tf.control_dependencies(values):
          copy = lowering.copy_slices_to_masters()
        holder["variables"] = variables
        with tf.control_dependencies([copy]):
          return [tf.identity(v) for v in values]

    all_values = [[v.numpy() for v in fn()] for _ in range(steps)]
    return all_values, [v.master.numpy() for v in holder["variables"]]
  if mode == "graph":
    with tf.Graph().as_default():
      lowering, assigns, outputs, variables = build_and_lower()
      assign_ops = [lowering.lowered_operation(a) for a in assigns]
      tensors = [lowering.export_to_tf_tensor(t) for t in outputs]
      init = tf1.global_variables_initializer()
      local_init = tf1.local_variables_initializer()
      to_slices = lowering.copy_masters_to_slices()
      to_masters = lowering.copy_slices_to_masters()
      config = tf1.ConfigProto(device_count={"CPU": len(mtu.DEVICES)})
      all_values = []
      with tf1.Session(config=config) as sess:
        sess.run(init)
        sess.run(local_init)
        sess.run(to_slices)
        for _ in range(steps):
          if read_first:
            all_values.append(sess.run(tensors))
          sess.run(assign_ops)  # in one run: all read the same values
          if not read_first:
            all_values.append(sess.run(tensors))
        sess.run(to_masters)
        return all_values, sess.run([v.master for v in variables])
  raise ValueError(mode)


def _variable(mesh, name, shape, value, **kwargs):
  """An mtf Variable (the Operation) initialised to `value`."""
  t = mtf.get_variable(
    mesh, name, shape, initializer=tf.constant_initializer(value), **kwargs
  )
  return t.operation


# get_variable: creation and reuse.


def test_get_variable_returns_variable_output():
  with mtf.variable_store(mtf.VariableStore()):
    graph, mesh = _new_mesh()
    w = mtf.get_variable(
      mesh, "w", [A, B], initializer=tf.constant_initializer(W0)
    )
    var = w.operation
    assert isinstance(var, mtf.Variable)
    assert var.value is w
    assert var.name == "w"
    assert var.shape == mtf.Shape([A, B])
    assert var.size == 32
    assert var.trainable
    assert graph.trainable_variables == [var]
    assert graph.all_variables == [var]
    assert graph.name_to_variable == {"w": var}
    assert isinstance(var.master, tf.Variable)
    assert var.master.shape.as_list() == [4, 8]
    np.testing.assert_array_equal(var.get_master().numpy(), W0)
    assert "CPU:0" in var.master_device
    assert var.splittable_dims == frozenset(["a", "b"])


def test_get_variable_reuses_by_full_name():
  with mtf.variable_store(mtf.VariableStore()) as store:
    graph, mesh = _new_mesh()
    w1 = mtf.get_variable(mesh, "w", [A, B])
    w2 = mtf.get_variable(mesh, "w", [A, B])
    assert w1 is w2
    with tf1.variable_scope("scope"):
      s1 = mtf.get_variable(mesh, "w", [A])
    with tf1.variable_scope("scope"):
      s2 = mtf.get_variable(mesh, "w", [A])
      with tf1.variable_scope("inner"):
        s3 = mtf.get_variable(mesh, "w", [B])
    assert s1 is s2
    assert s1 is not w1
    assert s1.operation.name == "scope/w"
    assert s3.operation.name == "scope/inner/w"
    assert sorted(graph.name_to_variable) == ["scope/inner/w", "scope/w", "w"]
    assert len(graph.all_variables) == 3
    assert sorted(store.masters) == ["scope/inner/w", "scope/w", "w"]


def test_get_variable_reuse_with_other_shape_raises():
  with mtf.variable_store(mtf.VariableStore()):
    _, mesh = _new_mesh()
    mtf.get_variable(mesh, "w", [A, B])
    with pytest.raises(ValueError, match="'w'"):
      mtf.get_variable(mesh, "w", [B, A])


def test_store_shape_conflict_raises_naming_variable():
  with mtf.variable_store(mtf.VariableStore()):
    _, mesh = _new_mesh()
    mtf.get_variable(mesh, "my_var", [A, B])
    _, mesh2 = _new_mesh()
    # Same store, new mtf graph, same name: the master is reused...
    same = mtf.get_variable(mesh2, "my_var", [A, B])
    assert same.operation.master is not None
    _, mesh3 = _new_mesh()
    # ...but not with another shape or dtype.
    with pytest.raises(ValueError, match="'my_var'"):
      mtf.get_variable(mesh3, "my_var", [A])
    with pytest.raises(ValueError, match="'my_var'"):
      mtf.get_variable(mesh3, "my_var", [A, B], dtype=tf.bfloat16)


def test_masters_are_reused_across_graphs_of_one_store():
  with mtf.variable_store(mtf.VariableStore()) as store:
    _, mesh = _new_mesh()
    v1 = mtf.get_variable(mesh, "w", [A, B]).operation
    _, mesh2 = _new_mesh()
    v2 = mtf.get_variable(mesh2, "w", [A, B]).operation
    assert v1 is not v2
    assert v1.master is v2.master
    assert list(store.masters) == ["w"]


def test_two_stores_are_independent():
  s1, s2 = mtf.VariableStore(), mtf.VariableStore()
  with mtf.variable_store(s1):
    _, mesh = _new_mesh()
    v1 = _variable(mesh, "w", [A, B], W0)
  with mtf.variable_store(s2):
    _, mesh = _new_mesh()
    v2 = _variable(mesh, "w", [A, B], 1.0)
  assert v1.master is not v2.master
  assert v1.store is s1 and v2.store is s2
  v1.master.assign_add(tf.ones([4, 8]))
  np.testing.assert_array_equal(v1.master.numpy(), W0 + 1)
  np.testing.assert_array_equal(v2.master.numpy(), np.ones([4, 8]))
  assert list(s1.masters) == ["w"] and list(s2.masters) == ["w"]
  # Nested stores restore the outer one on exit.
  with mtf.variable_store(s1):
    with mtf.variable_store(s2):
      assert mtf.get_default_variable_store() is s2
    assert mtf.get_default_variable_store() is s1


def test_store_shared_across_tf_graphs_raises():
  store = mtf.VariableStore()
  with tf.Graph().as_default():
    with mtf.variable_store(store):
      _, mesh = _new_mesh()
      mtf.get_variable(mesh, "w", [A])
  with tf.Graph().as_default():
    with mtf.variable_store(store):
      _, mesh = _new_mesh()
      with pytest.raises(ValueError, match="'w'.*another TensorFlow graph"):
        mtf.get_variable(mesh, "w", [A])
  with mtf.variable_store(store):
    _, mesh = _new_mesh()
    with pytest.raises(ValueError, match="'w'"):
      mtf.get_variable(mesh, "w", [A])


def test_untrainable_variable():
  with mtf.variable_store(mtf.VariableStore()):
    graph, mesh = _new_mesh()
    v = mtf.get_variable(
      mesh, "step", [], trainable=False, initializer=tf.zeros_initializer()
    ).operation
    w = mtf.get_variable(mesh, "w", [A]).operation
    assert not v.trainable
    assert graph.trainable_variables == [w]
    assert graph.all_variables == [v, w]
    assert not v.master.trainable
    graph.make_variables_untrainable([w])
    assert graph.trainable_variables == []


def test_unexpected_keyword_raises():
  with mtf.variable_store(mtf.VariableStore()):
    _, mesh = _new_mesh()
    with pytest.raises(TypeError, match="bogus"):
      mtf.get_variable(mesh, "w", [A], bogus=1)


# Dtypes.


def test_variable_dtype_defaults():
  d = mtf.VariableDType()
  assert (d.master_dtype, d.slice_dtype, d.activation_dtype) == (
    tf.float32,
    tf.float32,
    tf.float32,
  )
  d = mtf.VariableDType(tf.bfloat16)
  assert (d.master_dtype, d.slice_dtype, d.activation_dtype) == (
    tf.bfloat16,
    tf.bfloat16,
    tf.bfloat16,
  )
  d = mtf.VariableDType(tf.float32, activation_dtype=tf.bfloat16)
  assert d.slice_dtype == tf.float32 and d.activation_dtype == tf.bfloat16
  assert "bfloat16" in repr(d)


@meshes.parametrize(
  [("", ""), ("rows:2;cols:2", "a:rows;b:cols")], "mesh_layout"
)
def test_variable_dtype_roles(mesh_layout):
  store = mtf.VariableStore()

  def build(mesh):
    # Master float32, slices float32, activations bfloat16.
    v1 = _variable(
      mesh,
      "v1",
      [A, B],
      W0,
      dtype=mtf.VariableDType(tf.float32, tf.float32, tf.bfloat16),
    )
    # Master bfloat16 (as in released checkpoints), float32 in memory.
    v2 = _variable(
      mesh,
      "v2",
      [A, B],
      W0,
      dtype=mtf.VariableDType(tf.bfloat16, tf.float32, tf.float32),
    )
    # The deprecated per-role arguments.
    v3 = _variable(
      mesh, "v3", [A, B], W0, dtype=tf.float32, activation_dtype=tf.bfloat16
    )
    assert v1.outputs[0].dtype == tf.bfloat16
    assert v1.master.dtype == tf.float32 and v1.slice_dtype == tf.float32
    assert v2.outputs[0].dtype == tf.float32
    assert v2.master.dtype == tf.bfloat16 and v2.master_dtype == tf.bfloat16
    assert v2.slice_dtype == tf.float32
    assert v3.activation_dtype == tf.bfloat16
    assert v3.master_dtype == tf.float32
    assert isinstance(v3.dtype, mtf.VariableDType)
    assert v3.variable_dtype is v3.dtype
    new = mtf.import_tf_tensor(mesh, DELTA, [A, B])
    assigns = [mtf.assign(v2, new)]
    return (
      assigns,
      [v1.outputs[0], v2.outputs[0], mtf.read_variable(v2), v3.outputs[0]],
      [v1, v2],
    )

  [values], masters = _run(build, *mesh_layout, "eager", store)
  w0_bf16 = tf.cast(tf.cast(W0, tf.bfloat16), tf.float32).numpy()
  delta_bf16 = tf.cast(tf.cast(DELTA, tf.bfloat16), tf.float32).numpy()
  assert values[0].dtype.name == "bfloat16"
  np.testing.assert_array_equal(np.asarray(values[0], np.float32), w0_bf16)
  # The bfloat16 master rounds the initial value; the slice keeps float32.
  np.testing.assert_array_equal(values[1], w0_bf16)
  np.testing.assert_array_equal(values[2], DELTA)
  assert values[3].dtype.name == "bfloat16"
  np.testing.assert_array_equal(masters[0], W0)
  assert masters[1].dtype.name == "bfloat16"
  np.testing.assert_array_equal(np.asarray(masters[1], np.float32), delta_bf16)


def test_both_variable_dtype_and_role_args_raise():
  with mtf.variable_store(mtf.VariableStore()):
    _, mesh = _new_mesh()
    with pytest.raises(ValueError, match="'w'"):
      mtf.get_variable(
        mesh, "w", [A], dtype=mtf.VariableDType(), master_dtype=tf.bfloat16
      )


# Assign.


def _assign_program(mesh):
  v = _variable(mesh, "v", [A, B], W0)
  u = _variable(mesh, "u", [A, B], W0)
  s = _variable(mesh, "s", [A, B], W0)
  delta = mtf.import_tf_tensor(mesh, DELTA, [A, B])
  assigns = [
    mtf.assign(v, delta * 2.0),
    mtf.assign_add(u.outputs[0], delta),
    mtf.assign_sub(mtf.identity(s.outputs[0]), delta),
  ]
  for a in assigns:
    assert isinstance(a, mtf.Assign)
  assert assigns[1].assign_fn is mtf.assign_add_slice
  assert assigns[2].variables == [s]
  outputs = [
    mtf.read_variable(v),
    mtf.read_variable(u),
    mtf.read_variable(s.outputs[0]),
    mtf.read_variable(u) * 2.0,
  ]
  return assigns, outputs, [v, u, s]


def _assign_expected():
  values = [2 * DELTA, W0 + DELTA, W0 - DELTA, 2 * (W0 + DELTA)]
  masters = [2 * DELTA, W0 + DELTA, W0 - DELTA]
  return values, masters


@meshes.parametrize(meshes.VARIABLES, "mesh_layout")
def test_assign_family(mesh_layout):
  [values], masters = _run(
    _assign_program, *mesh_layout, "eager", mtf.VariableStore()
  )
  want_values, want_masters = _assign_expected()
  mtu.assert_all_close(values, want_values)
  mtu.assert_all_close(masters, want_masters)


@pytest.mark.parametrize("mode", mtu.MODES)
@meshes.parametrize(
  [("", ""), ("rows:2;cols:2", "a:rows;b:cols")], "mesh_layout"
)
def test_assign_family_three_modes(mesh_layout, mode):
  [values], masters = _run(
    _assign_program, *mesh_layout, mode, mtf.VariableStore()
  )
  want_values, want_masters = _assign_expected()
  mtu.assert_all_close(values, want_values)
  mtu.assert_all_close(masters, want_masters)


def test_assign_errors():
  with mtf.variable_store(mtf.VariableStore()):
    _, mesh = _new_mesh()
    v = _variable(mesh, "v", [A, B], W0)
    with pytest.raises(ValueError, match="v"):
      mtf.assign(v, mtf.zeros(mesh, [B, A]))
    with pytest.raises(TypeError):
      mtf.assign(np.zeros([4, 8]), mtf.zeros(mesh, [A, B]))
    x = mtf.import_tf_tensor(mesh, W0, [A, B])
    with pytest.raises(ValueError):
      mtf.assign(
        x + mtf.import_tf_tensor(mesh, W0, [A, B]), mtf.zeros(mesh, [A, B])
      )
    with pytest.raises(ValueError):
      mtf.Assign([v], [])


def test_lowered_operation_of_assign_is_a_tf_op():
  with tf.Graph().as_default():
    graph, mesh = _new_mesh()
    v = _variable(mesh, "v", [A, B], W0)
    a = mtf.assign(v, mtf.zeros(mesh, [A, B]))
    lowering = mtf.Lowering(graph, {mesh: mtu.mesh_impl_for("all:4", "a:all")})
    op = lowering.lowered_operation(a)
    assert isinstance(op, tf.Operation)
    assert lowering.operations[a] is op
    assert set(lowering.variables) == {v}


def test_combine_assignments():
  with mtf.variable_store(mtf.VariableStore()):
    graph, mesh = _new_mesh()
    v = _variable(mesh, "v", [A, B], W0)
    u = _variable(mesh, "u", [A, B], W0)
    s = _variable(mesh, "s", [A], 0.0)
    delta = mtf.import_tf_tensor(mesh, DELTA, [A, B])
    ops = [
      mtf.assign(v, delta),
      mtf.assign_add(u, delta),
      mtf.assign(s, mtf.ones(mesh, [A])),
    ]
    combined = graph.combine_assignments(ops)
    assert len(combined) == 2
    assert combined[0].variables == [v, s]
    assert combined[1].variables == [u]
    assert combined[1].assign_fn is mtf.assign_add_slice


# Training updates and master/slice copies.


def _train_step_program(mesh):
  w = _variable(mesh, "w", [A, B], W0)
  b = _variable(mesh, "bias", [B], 0.5)
  x = mtf.import_tf_tensor(mesh, INPUT, [H, A])
  t = mtf.import_tf_tensor(mesh, TARGET, [H, B])
  y = mtf.matmul(x, w.outputs[0]) + b.outputs[0]
  loss = mtf.reduce_sum(mtf.square(y - t))
  dw, db = mtf.gradients([loss], [w.outputs[0], b.outputs[0]])
  assigns = [mtf.assign_sub(w, dw * 0.01), mtf.assign_sub(b, db * 0.01)]
  return assigns, [loss], [w, b]


def _train(mesh_shape, layout, mode, steps=2):
  values, masters = _run(
    _train_step_program,
    mesh_shape,
    layout,
    mode,
    mtf.VariableStore(),
    steps=steps,
    read_first=True,
  )
  return [v[0] for v in values], masters


def _train_reference(steps=2):
  w = tf.Variable(W0)
  b = tf.Variable(tf.fill([8], 0.5))
  losses = []
  for _ in range(steps):
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(tf.square(INPUT @ w + b - TARGET))
    dw, db = tape.gradient(loss, [w, b])
    losses.append(loss.numpy())
    w.assign_sub(dw * 0.01)
    b.assign_sub(db * 0.01)
  return losses, [w.numpy(), b.numpy()]


@meshes.parametrize(meshes.VARIABLES, "mesh_layout")
def test_training_updates_masters(mesh_layout):
  losses, masters = _train(*mesh_layout, "eager")
  want_losses, want_masters = _train_reference()
  np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
  mtu.assert_all_close(masters, want_masters, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", mtu.MODES)
def test_training_2x2_equals_1_device(mode):
  losses_1, masters_1 = _train("", "", mode)
  losses_4, masters_4 = _train("rows:2;cols:2", "a:rows;b:cols", mode)
  np.testing.assert_allclose(losses_4, losses_1, rtol=1e-5)
  mtu.assert_all_close(masters_4, masters_1, rtol=1e-5, atol=1e-6)
  want_losses, want_masters = _train_reference()
  np.testing.assert_allclose(losses_4, want_losses, rtol=1e-5)
  mtu.assert_all_close(masters_4, want_masters, rtol=1e-5, atol=1e-6)


def test_graph_mode_replicas_read_before_shared_slice_is_assigned():
  # "bias" is replicated over rows; replicas may share one slice variable,
  # whose assignment must wait for every replica's read (a legacy graph has
  # no automatic control dependencies). Several graphs make a race visible.
  want_losses, want_masters = _train_reference(steps=3)
  for _ in range(6):  # the schedule varies from graph to graph
    losses, masters = _train("rows:2;cols:2", "a:rows;b:cols", "graph", steps=3)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
    mtu.assert_all_close(masters, want_masters, rtol=1e-5, atol=1e-5)


@meshes.parametrize(
  [("all:4", "b:all"), ("rows:2;cols:2", "a:cols;b:rows")], "mesh_layout"
)
def test_copy_masters_to_slices(mesh_layout):
  with mtf.variable_store(mtf.VariableStore()):
    graph, mesh = _new_mesh()
    v = _variable(mesh, "v", [A, B], W0)
    mesh_impl = mtu.mesh_impl_for(*mesh_layout)
    lowering = mtf.Lowering(graph, {mesh: mesh_impl})
    laid_out = lowering.variables[v]
    assert len(laid_out.slice_variables) == 4

    def slices_value():
      return mesh_impl.combine_slices(
        [s.read_value() for s in laid_out.slice_variables], v.shape
      ).numpy()

    np.testing.assert_array_equal(slices_value(), W0)
    v.master.assign(DELTA)
    np.testing.assert_array_equal(slices_value(), W0)  # not copied yet
    lowering.copy_masters_to_slices()
    np.testing.assert_array_equal(slices_value(), DELTA)
    for s in laid_out.slice_variables:
      s.assign(tf.zeros_like(s))
    lowering.copy_slices_to_masters()
    np.testing.assert_array_equal(v.master.numpy(), np.zeros([4, 8]))


def test_one_device_slice_is_the_master():
  with mtf.variable_store(mtf.VariableStore()):
    graph, mesh = _new_mesh()
    v = _variable(mesh, "v", [A, B], W0)
    lowering = mtf.Lowering(graph, {mesh: mtu.mesh_impl_for("", "")})
    assert lowering.variables[v].slice_variables == [v.master]


# No new tf.Variables when a tf.function is traced again.


def test_retracing_creates_no_new_variables():
  store = mtf.VariableStore()
  mesh_shape, layout = "rows:2;cols:2", "a:rows;b:cols"

  @tf.function(autograph=False)
  def step(x, scale):
    with mtf.variable_store(store):
      graph, mesh = _new_mesh()
      w = _variable(mesh, "w", [A, B], W0)
      xx = mtf.import_tf_tensor(mesh, x, [H, A])
      y = mtf.matmul(xx, w.outputs[0]) * scale
      (dw,) = mtf.gradients([mtf.reduce_sum(y)], [w.outputs[0]])
      mtf.assign_sub(w, dw * 0.01)
      lowering = mtf.Lowering(
        graph, {mesh: mtu.mesh_impl_for(mesh_shape, layout)}
      )
      return lowering.export_to_tf_tensor(y)

  step(tf.constant(INPUT), 1.0)
  n_masters = len(store.masters)
  n_module_vars = len(store.variables)
  assert n_masters == 1
  assert n_module_vars >= 1
  # A second signature traces again; so does a concrete function.
  step(tf.constant(INPUT), 2.0)
  step.get_concrete_function(tf.TensorSpec([2, 4], tf.float32), 3.0)
  step.get_concrete_function(tf.TensorSpec([2, 4], tf.float32), 4.0)
  assert len(store.masters) == n_masters
  assert len(store.variables) == n_module_vars
  # The traces share the same variables: two steps of updates so far.
  dw = np.tile(INPUT.sum(0)[:, None], [1, 8])
  want = W0 - 0.01 * 1.0 * dw - 0.01 * 2.0 * dw
  # Masters are only written back by copy_slices_to_masters; read the slices.
  with mtf.variable_store(store):
    graph, mesh = _new_mesh()
    w = _variable(mesh, "w", [A, B], W0)
    lowering = mtf.Lowering(
      graph, {mesh: mtu.mesh_impl_for(mesh_shape, layout)}
    )
    np.testing.assert_allclose(
      lowering.export_to_tf_tensor(w.outputs[0]).numpy(), want, rtol=1e-5
    )
    assert len(store.variables) == n_module_vars


def test_store_is_trackable_for_checkpoints(tmp_path):
  store = mtf.VariableStore()
  with mtf.variable_store(store):
    _, mesh = _new_mesh()
    v = _variable(mesh, "encoder/w", [A, B], W0)
  assert any(var is v.master for var in store.variables)
  path = tf.train.Checkpoint(store=store).save(str(tmp_path / "ckpt"))
  v.master.assign(tf.zeros([4, 8]))
  tf.train.Checkpoint(store=store).restore(path)
  np.testing.assert_array_equal(v.master.numpy(), W0)


def test_store_tracks_slices_for_checkpoints(tmp_path):
  """Slices: checkpointed as `store/_slices/<key>`, restored when made later."""
  store = mtf.VariableStore()
  key = "simd:w_slice_0/CPU:0/[0]/[2]"
  made = store.get_or_create_slice(key, lambda: tf.Variable([1.0, 2.0]))
  assert any(var is made for var in store.variables)
  assert store.get_or_create_slice(key, lambda: None) is made
  path = tf.train.Checkpoint(store=store).save(str(tmp_path / "ckpt"))
  names = [name for name, _ in tf.train.list_variables(path)]
  # TensorFlow writes "/" in a name as ".S".
  assert (
    "store/_slices/simd:w_slice_0.SCPU:0.S[0].S[2]/.ATTRIBUTES/VARIABLE_VALUE"
    in names
  )
  fresh = mtf.VariableStore()
  tf.train.Checkpoint(store=fresh).restore(path).expect_partial()
  later = fresh.get_or_create_slice(key, lambda: tf.Variable([0.0, 0.0]))
  np.testing.assert_array_equal(later.numpy(), [1.0, 2.0])
