"""Tests for mtf.layers.layer_norm and mtf.layers.batch_norm.

Values and gradients against plain TF, on 1-device, 4-device and 2x2 meshes,
including layouts that split the normalized dimension; variable names; and
batch_norm's moving-statistics updates in eager, tf.function and v1 graphs.
"""

import inspect

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mesh_test_util as mtu
from tests import meshes

tf1 = tf.compat.v1

BATCH = mtf.Dimension("batch", 4)
LENGTH = mtf.Dimension("length", 2)
D_MODEL = mtf.Dimension("d_model", 8)

_RNG = np.random.RandomState(0)
X = (_RNG.uniform(-1.0, 1.0, size=(4, 2, 8)) * 3.0 + 1.0).astype(np.float32)
C = _RNG.uniform(-1.0, 1.0, size=(4, 2, 8)).astype(np.float32)


def _var(graph, name):
  return graph.name_to_variable[name].outputs[0]


# ----------------------------------------------------------------------------
# layer_norm.


def _layer_norm_program(mesh):
  x = mtf.import_tf_tensor(mesh, X, [BATCH, LENGTH, D_MODEL])
  c = mtf.import_tf_tensor(mesh, C, [BATCH, LENGTH, D_MODEL])
  y = mtf.layers.layer_norm(x, D_MODEL, epsilon=1e-3, name="ln")
  scale = _var(mesh.graph, "ln/layer_norm/layer_norm_scale")
  bias = _var(mesh.graph, "ln/layer_norm/layer_norm_bias")
  # Make scale and bias non-trivial without changing their variables.
  z = y * (scale * 0.5 + 0.75) + bias
  dx, ds, db = mtf.gradients([mtf.reduce_sum(z * c)], [x, scale, bias])
  return [z, dx, ds, db]


def _layer_norm_reference():
  x = tf.constant(X)
  s = tf.Variable(np.ones(8, np.float32))
  b = tf.Variable(np.zeros(8, np.float32))
  with tf.GradientTape() as tape:
    tape.watch(x)
    mean, var = tf.nn.moments(x, axes=[2], keepdims=True)
    y = (x - mean) * tf.math.rsqrt(var + 1e-3) * s + b
    z = y * (s * 0.5 + 0.75) + b
    loss = tf.reduce_sum(z * C)
  return [z.numpy()] + [g.numpy() for g in tape.gradient(loss, [x, s, b])]


@meshes.parametrize(meshes.NORMS)
def test_layer_norm_values_and_gradients(mesh_shape, layout):
  got = mtu.run_program(_layer_norm_program, mesh_shape, layout)
  mtu.assert_all_close(
    got, _layer_norm_reference(), rtol=1e-4, atol=1e-4, msg=layout
  )


@pytest.mark.parametrize("mode", ["function", "graph"])
def test_layer_norm_modes(mode):
  got = mtu.run_program(
    _layer_norm_program, "rows:2;cols:2", "batch:rows;d_model:cols", mode
  )
  mtu.assert_all_close(got, _layer_norm_reference(), rtol=1e-4, atol=1e-4)


def test_layer_norm_variables_and_errors():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  with mtf.variable_store(mtf.VariableStore()):
    x = mtf.zeros(mesh, [BATCH, D_MODEL])
    mtf.layers.layer_norm(x, D_MODEL)
    with tf1.variable_scope("encoder"):
      y = mtf.layers.layer_norm(x, D_MODEL, name="final")
    xb = mtf.cast(x, tf.bfloat16)
    yb = mtf.layers.layer_norm(xb, D_MODEL, name="bf")
    with pytest.raises(ValueError, match="layer_norm.*length"):
      mtf.layers.layer_norm(x, LENGTH)
  assert y.shape == x.shape and yb.dtype == tf.bfloat16
  assert [(v.name, v.shape.to_string) for v in graph.trainable_variables] == [
    ("layer_prepostprocess/layer_norm/layer_norm_scale", "Shape[d_model=8]"),
    ("layer_prepostprocess/layer_norm/layer_norm_bias", "Shape[d_model=8]"),
    ("encoder/final/layer_norm/layer_norm_scale", "Shape[d_model=8]"),
    ("encoder/final/layer_norm/layer_norm_bias", "Shape[d_model=8]"),
    ("bf/layer_norm/layer_norm_scale", "Shape[d_model=8]"),
    ("bf/layer_norm/layer_norm_bias", "Shape[d_model=8]"),
  ]
  bf = graph.name_to_variable["bf/layer_norm/layer_norm_scale"]
  assert bf.master_dtype == tf.float32 and bf.activation_dtype == tf.bfloat16


# ----------------------------------------------------------------------------
# batch_norm.


def _batch_norm_program(mesh):
  x = mtf.import_tf_tensor(mesh, X, [BATCH, LENGTH, D_MODEL])
  c = mtf.import_tf_tensor(mesh, C, [BATCH, LENGTH, D_MODEL])
  y, update_ops = mtf.layers.batch_norm(x, True, 0.9, epsilon=1e-3)
  assert len(update_ops) == 2
  scale = _var(mesh.graph, "batch_norm/batch_norm_scale")
  bias = _var(mesh.graph, "batch_norm/batch_norm_bias")
  dx, ds, db = mtf.gradients([mtf.reduce_sum(y * c)], [x, scale, bias])
  return [y, dx, ds, db]


def _batch_norm_reference():
  x = tf.constant(X)
  s = tf.Variable(np.ones(8, np.float32))
  b = tf.Variable(np.zeros(8, np.float32))
  with tf.GradientTape() as tape:
    tape.watch(x)
    mean, var = tf.nn.moments(x, axes=[0, 1])
    y = (x - mean) * tf.math.rsqrt(var + 1e-3) * s + b
    loss = tf.reduce_sum(y * C)
  return [y.numpy()] + [g.numpy() for g in tape.gradient(loss, [x, s, b])]


@meshes.parametrize(meshes.NORMS)
def test_batch_norm_training_values_and_gradients(mesh_shape, layout):
  got = mtu.run_program(_batch_norm_program, mesh_shape, layout)
  mtu.assert_all_close(
    got, _batch_norm_reference(), rtol=1e-4, atol=1e-4, msg=layout
  )


def test_batch_norm_eval_uses_moving_statistics():
  def build(mesh):
    x = mtf.import_tf_tensor(mesh, X, [BATCH, LENGTH, D_MODEL])
    y, update_ops = mtf.layers.batch_norm(x, False, 0.9, epsilon=1e-3)
    assert update_ops == []
    # Normalize over length only (dims 1..2), per (batch, d_model).
    y2, _ = mtf.layers.batch_norm(
      x, True, 0.9, dims_idx_start=1, dims_idx_end=2, init_zero=True, name="z"
    )
    y3, _ = mtf.layers.batch_norm(
      x, True, 0.9, dims_idx_start=1, dims_idx_end=2, name="per_example"
    )
    return [y, y2, y3, _var(mesh.graph, "batch_norm/bn_moving_mean")]

  mean = X.mean(axis=1, keepdims=True)
  var = X.var(axis=1, keepdims=True)
  for mesh_shape, layout in [
    ("", ""),
    ("rows:2;cols:2", "batch:rows;length:cols"),
  ]:
    y, y2, y3, moving_mean = mtu.run_program(build, mesh_shape, layout)
    np.testing.assert_allclose(
      y, (X - moving_mean) / np.sqrt(1.0 + 1e-3), rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(y2, np.zeros_like(X))
    np.testing.assert_allclose(
      y3, (X - mean) / np.sqrt(var + 1e-9), rtol=1e-3, atol=1e-3
    )


def test_batch_norm_variables_and_errors():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  with mtf.variable_store(mtf.VariableStore()) as store:
    x = mtf.zeros(mesh, [BATCH, LENGTH, D_MODEL])
    mtf.layers.batch_norm(x, True, 0.99)
    with tf1.variable_scope("block"):
      mtf.layers.batch_norm(
        x, False, 0.99, dims_idx_start=1, dims_idx_end=2, name="bn"
      )
    with pytest.raises(ValueError, match="dims_idx_start=2, dims_idx_end=2"):
      mtf.layers.batch_norm(x, True, 0.9, dims_idx_start=2, dims_idx_end=2)
    mean_init = store.masters["batch_norm/bn_moving_mean"].numpy()
    var_init = store.masters["batch_norm/bn_moving_variance"].numpy()
  assert [v.name for v in graph.trainable_variables] == [
    "batch_norm/batch_norm_scale",
    "batch_norm/batch_norm_bias",
    "block/bn/batch_norm_scale",
    "block/bn/batch_norm_bias",
  ]
  assert [
    (v.name, v.shape.to_string, v.trainable)
    for v in graph.all_variables
    if not v.trainable
  ] == [
    ("batch_norm/bn_moving_mean", "Shape[d_model=8]", False),
    ("batch_norm/bn_moving_variance", "Shape[d_model=8]", False),
    ("block/bn/bn_moving_mean", "Shape[batch=4, d_model=8]", False),
    ("block/bn/bn_moving_variance", "Shape[batch=4, d_model=8]", False),
  ]
  # The original draws the moving mean from a standard normal.
  assert np.all(mean_init != 0) and np.all(np.abs(mean_init) < 6)
  np.testing.assert_array_equal(var_init, np.ones(8, np.float32))


def _bn_step(mesh_shape, layout):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.import_tf_tensor(mesh, tf.constant(X), [BATCH, LENGTH, D_MODEL])
  y, update_ops = mtf.layers.batch_norm(x, True, 0.9, epsilon=1e-3)
  lowering = mtf.Lowering(graph, {mesh: mtu.mesh_impl_for(mesh_shape, layout)})
  updates = [lowering.lowered_operation(op) for op in update_ops]
  return lowering, lowering.export_to_tf_tensor(y), updates


def _expected_moving_stats(steps, initial_mean):
  """The moving statistics after steps from initial_mean and variance 1."""
  mean, var = X.mean(axis=(0, 1)), X.var(axis=(0, 1))
  m, v = initial_mean, np.ones(8)
  for _ in range(steps):
    m = 0.9 * m + 0.1 * mean
    v = 0.9 * v + 0.1 * var
  return m, v


@pytest.mark.parametrize("mode", mtu.MODES)
def test_batch_norm_update_ops_update_moving_statistics(mode):
  mesh_shape, layout = "rows:2;cols:2", "batch:rows;d_model:cols"
  names = ["batch_norm/bn_moving_mean", "batch_norm/bn_moving_variance"]
  if mode == "graph":
    with tf.Graph().as_default():
      lowering, y, updates = _bn_step(mesh_shape, layout)
      with tf1.Session(
        config=tf1.ConfigProto(device_count={"CPU": len(mtu.DEVICES)})
      ) as sess:
        sess.run(tf1.global_variables_initializer())
        sess.run(tf1.local_variables_initializer())
        sess.run(lowering.copy_masters_to_slices())
        store = mtf.get_default_variable_store()
        initial_mean = sess.run(store.masters[names[0]])
        for _ in range(2):
          sess.run([y] + updates)
        sess.run(lowering.copy_slices_to_masters())
        got = sess.run([store.masters[n] for n in names])
  else:
    store = mtf.VariableStore()

    def step():
      with mtf.variable_store(store):
        lowering, y, _ = _bn_step(mesh_shape, layout)
        with tf.control_dependencies([y]):
          lowering.copy_slices_to_masters()
        return y

    if mode == "function":
      step = tf.function(step, autograph=False)
    with mtf.variable_store(store):  # creates the variables
      mesh = mtf.Mesh(mtf.Graph(), "mesh")
      x = mtf.import_tf_tensor(mesh, tf.constant(X), [BATCH, LENGTH, D_MODEL])
      mtf.layers.batch_norm(x, True, 0.9, epsilon=1e-3)
    initial_mean = store.masters[names[0]].numpy()
    for _ in range(2):
      step()
    got = [store.masters[n].numpy() for n in names]
  m, v = _expected_moving_stats(2, initial_mean)
  np.testing.assert_allclose(got[0], m, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(got[1], v, rtol=1e-5, atol=1e-6)


def _params(fn):
  return [
    (p.name, p.default) for p in inspect.signature(fn).parameters.values()
  ]


def test_signatures():
  e = inspect.Parameter.empty
  assert _params(mtf.layers.layer_norm) == [
    ("x", e),
    ("dim", e),
    ("epsilon", 1e-6),
    ("name", "layer_prepostprocess"),
  ]
  assert _params(mtf.layers.batch_norm) == [
    ("x", e),
    ("is_training", e),
    ("momentum", e),
    ("epsilon", 1e-9),
    ("dims_idx_start", 0),
    ("dims_idx_end", -1),
    ("init_zero", False),
    ("name", None),
  ]
