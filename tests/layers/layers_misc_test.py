"""Tests for misc mtf.layers: jitter, RevNet blocks, activation-gradient
clipping and summaries, annealed dropout, per-graph default scope names and
gin names.
"""

import inspect

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow._src.layers import scope_util
from tests import mesh_test_util as mtu
from tests import meshes

tf1 = tf.compat.v1

BATCH = mtf.Dimension("batch", 4)
D_MODEL = mtf.Dimension("d_model", 8)
HIDDEN = mtf.Dimension("hidden", 4)

_RNG = np.random.RandomState(0)
X = _RNG.uniform(-1.0, 1.0, size=(4, 8)).astype(np.float32)
C = _RNG.uniform(-1.0, 1.0, size=(4, 8)).astype(np.float32)
WI = [_RNG.uniform(-1.0, 1.0, size=(8, 4)).astype(np.float32) for _ in range(2)]
WO = [_RNG.uniform(-1.0, 1.0, size=(4, 8)).astype(np.float32) for _ in range(2)]


# ----------------------------------------------------------------------------
# multiplicative_jitter.


def test_multiplicative_jitter_range_and_layout_independence():
  mtu.skip_under_tf1(
    "eager op seeds under tf.random.set_seed (a new tf.Graph draws "
    "its own op seeds)"
  )
  big = mtf.Dimension("big", 64)

  def build(mesh):
    x = mtf.import_tf_tensor(
      mesh, np.tile(X, (1, 8)), [BATCH, mtf.Dimension("d", 64)]
    )
    ones = mtf.ones(mesh, [BATCH, big])
    assert mtf.layers.multiplicative_jitter(x, epsilon=0) is x
    return [
      mtf.layers.multiplicative_jitter(ones, epsilon=0.1),
      mtf.layers.multiplicative_jitter(x),
    ]

  mtu.skip_under_simd(
    "eager op seeds under tf.random.set_seed; in the SIMD "
    "tf.function the draw's op seed depends on its "
    "position in the traced graph"
  )
  results = []
  for mesh_shape, layout in [
    ("", ""),
    ("rows:2;cols:2", "batch:rows;big:cols"),
  ]:
    tf.random.set_seed(7)
    results.append(mtu.run_program(build, mesh_shape, layout))
  jit, jx = results[0]
  assert jit.min() >= 0.9 and jit.max() < 1.1 and jit.std() > 0.03
  ratio = jx / np.tile(X, (1, 8))
  assert ratio.min() >= 0.99 - 1e-6 and ratio.max() <= 1.01 + 1e-6
  # Random values are functions of global indices: the same on every layout.
  mtu.assert_all_close(results[1], results[0], rtol=0, atol=0)


# ----------------------------------------------------------------------------
# reversible_half_residual_and_swap.


def _f(t, layer):
  h = mtf.layers.dense(
    t,
    HIDDEN,
    reduced_dims=[D_MODEL],
    activation=mtf.tanh,
    kernel_initializer=tf.constant_initializer(WI[layer]),
    name="wi",
  )
  return mtf.layers.dense(
    h,
    D_MODEL,
    reduced_dims=[HIDDEN],
    kernel_initializer=tf.constant_initializer(WO[layer]),
    name="wo",
  )


_VAR_NAMES = [
  "layer_%d/%s/%s" % (i, w, k)
  for i in range(2)
  for w in ("wi", "wo")
  for k in ("kernel", "bias")
]


def _revnet_program(recompute_grads):
  def build(mesh):
    x = mtf.import_tf_tensor(mesh, X, [BATCH, D_MODEL])
    c = mtf.import_tf_tensor(mesh, C, [BATCH, D_MODEL])
    x1, x1_b, x2, x2_b = x, None, x, None
    for i in range(2):
      with tf1.variable_scope("layer_%d" % i):
        x1, x1_b, x2, x2_b = mtf.layers.reversible_half_residual_and_swap(
          x1,
          x1_b,
          x2,
          x2_b,
          lambda t, i=i: _f(t, i),
          recompute_grads=recompute_grads,
        )
    if recompute_grads:
      assert isinstance(x1.operation, mtf.CustomGradientOperation)
    y = (x1 + x2) * 0.5
    graph = mesh.graph
    assert [v.name for v in graph.trainable_variables] == _VAR_NAMES
    var_tensors = [graph.name_to_variable[n].outputs[0] for n in _VAR_NAMES]
    grads = mtf.gradients([mtf.reduce_sum(y * c)], [x] + var_tensors)
    return [y] + grads

  return build


def _revnet_reference():
  x = tf.constant(X)
  ws = []
  for i in range(2):
    ws += [
      tf.Variable(WI[i]),
      tf.Variable(np.zeros(4, np.float32)),
      tf.Variable(WO[i]),
      tf.Variable(np.zeros(8, np.float32)),
    ]
  with tf.GradientTape() as tape:
    tape.watch(x)
    x1, x2 = x, x
    for i in range(2):
      wi, bi, wo, bo = ws[4 * i : 4 * i + 4]
      fx2 = tf.matmul(tf.tanh(tf.matmul(x2, wi) + bi), wo) + bo
      x1, x2 = x2, x1 + fx2
    y = (x1 + x2) * 0.5
    loss = tf.reduce_sum(y * C)
  return [y.numpy()] + [g.numpy() for g in tape.gradient(loss, [x] + ws)]


@meshes.parametrize(meshes.LAYERS_MISC)
def test_reversible_block_gradients(mesh_shape, layout):
  expected = _revnet_reference()
  for recompute in (True, False):
    got = mtu.run_program(_revnet_program(recompute), mesh_shape, layout)
    mtu.assert_all_close(
      got,
      expected,
      rtol=1e-4,
      atol=1e-4,
      msg="%s recompute=%s" % (layout, recompute),
    )


@pytest.mark.parametrize("mode", ["function", "graph"])
def test_reversible_block_modes(mode):
  got = mtu.run_program(
    _revnet_program(True), "rows:2;cols:2", "batch:rows;hidden:cols", mode
  )
  mtu.assert_all_close(got, _revnet_reference(), rtol=1e-4, atol=1e-4)


def test_reversible_block_recomputes_and_checks_shapes():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  with mtf.variable_store(mtf.VariableStore()):
    x = mtf.zeros(mesh, [BATCH, D_MODEL])
    outs = mtf.layers.reversible_half_residual_and_swap(
      x, None, x, None, lambda t: _f(t, 0)
    )
    assert len(outs) == 4 and all(o.shape == x.shape for o in outs)
    n_ops = len(graph.operations)
    mtf.gradients([mtf.reduce_sum(outs[2])], [x])
    # The backward pass clones f's forward operations (recomputation).
    einsums = [
      op
      for op in graph.operations[n_ops:]
      if isinstance(op, mtf.EinsumOperation)
    ]
    assert len(einsums) >= 2
    with pytest.raises(ValueError, match="same shape"):
      mtf.layers.reversible_half_residual_and_swap(
        x, None, mtf.zeros(mesh, [BATCH]), None, lambda t: t
      )
    with pytest.raises(ValueError, match="f must return"):
      mtf.layers.reversible_half_residual_and_swap(
        x, None, x, None, lambda t: mtf.reduce_sum(t)
      )


# ----------------------------------------------------------------------------
# clip_activation_gradient / summary_for_clip_activation_gradient.


def _clip_program(clip):
  def build(mesh):
    x = mtf.import_tf_tensor(mesh, X, [BATCH, D_MODEL])
    c = mtf.import_tf_tensor(mesh, C, [BATCH, D_MODEL])
    y = mtf.layers.clip_activation_gradient(x, clip)
    [dx] = mtf.gradients([mtf.reduce_sum(y * c)], [x])
    return [y, dx]

  return build


@meshes.parametrize(meshes.LAYERS_MISC[:3])
def test_clip_activation_gradient(mesh_shape, layout):
  rms = np.sqrt(np.mean(C**2))
  for clip, scale in [(0.1, 0.1 / rms), (100.0, 1.0)]:
    y, dx = mtu.run_program(_clip_program(clip), mesh_shape, layout)
    np.testing.assert_allclose(y, X)
    np.testing.assert_allclose(dx, C * scale, rtol=1e-5, atol=1e-6)


def test_clip_activation_gradient_disabled_and_gin():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, [BATCH, D_MODEL])
  assert mtf.layers.clip_activation_gradient(x) is x
  gin.bind_parameter(
    "mesh_tensorflow.layers.clip_activation_gradient.clip_rms_norm", 0.1
  )
  try:
    [y, dx] = mtu.run_program(_clip_via_gin, "", "")
  finally:
    gin.clear_config()
  np.testing.assert_allclose(y, X)
  np.testing.assert_allclose(dx, C * 0.1 / np.sqrt(np.mean(C**2)), rtol=1e-5)


def _clip_via_gin(mesh):
  x = mtf.import_tf_tensor(mesh, X, [BATCH, D_MODEL])
  c = mtf.import_tf_tensor(mesh, C, [BATCH, D_MODEL])
  y = mtf.layers.clip_activation_gradient(x)  # clip_rms_norm from gin
  [dx] = mtf.gradients([mtf.reduce_sum(y * c)], [x])
  return [y, dx]


def test_summary_for_clip_activation_gradient():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.import_tf_tensor(mesh, X, [BATCH, D_MODEL])
  c = mtf.import_tf_tensor(mesh, C, [BATCH, D_MODEL])
  y = mtf.layers.summary_for_clip_activation_gradient(
    x, "act", batch_dims=[BATCH]
  )
  [dx] = mtf.gradients([mtf.reduce_sum(y * c)], [x])
  summaries = [
    op for op in graph.operations if isinstance(op, mtf.ScalarSummaryOperation)
  ]
  assert [s.summary_name for s in summaries] == [
    "act/grad_rms_norm",
    "act/grad_rms_norm_max",
    "act/grad_rms_norm_mean",
  ]
  with mtf.variable_store(mtf.VariableStore()):
    lowering = mtf.Lowering(
      graph,
      {mesh: mtu.mesh_impl_for("rows:2;cols:2", "batch:rows;d_model:cols")},
    )
    got = [lowering.export_to_tf_tensor(t).numpy() for t in (y, dx)]
    values = [float(lowering.operations[s]) for s in summaries]
  np.testing.assert_allclose(got[0], X)
  np.testing.assert_allclose(got[1], C, rtol=1e-6)
  per_example = np.sqrt(np.mean(C**2, axis=1))
  np.testing.assert_allclose(
    values,
    [np.sqrt(np.mean(C**2)), per_example.max(), per_example.mean()],
    rtol=1e-5,
  )
  with pytest.raises(ValueError, match="batch dim.*hidden"):
    mtf.layers.summary_for_clip_activation_gradient(x, batch_dims=[HIDDEN])


# ----------------------------------------------------------------------------
# annealed_dropout.


def test_annealed_dropout_rate_follows_global_step():
  mtu.skip_under_tf1(
    "the global step is an eager variable assigned between runs"
  )
  big = [mtf.Dimension("a", 64), mtf.Dimension("b", 64)]
  step = tf1.train.get_or_create_global_step()

  def build(mesh):
    x = mtf.ones(mesh, big)
    assert mtf.layers.annealed_dropout(x, False, 0, 100, init_rate=0.5) is x
    assert mtf.layers.annealed_dropout(x, True, 0, 100) is x
    return [mtf.layers.annealed_dropout(x, True, 100, 300, init_rate=0.5)]

  for step_value, rate in [
    (0, 0.5),
    (100, 0.5),
    (200, 0.25),
    (300, 0.0),
    (1000, 0.0),
  ]:
    step.assign(step_value)
    [y] = mtu.run_program(build, "rows:2;cols:2", "a:rows;b:cols")
    kept = y != 0
    np.testing.assert_allclose(1.0 - kept.mean(), rate, atol=0.03)
    np.testing.assert_allclose(y[kept], 1.0 / (1.0 - rate), rtol=1e-6)
  step.assign(0)


def test_annealed_dropout_errors():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.ones(mesh, [BATCH, D_MODEL])
  with pytest.raises(ValueError, match="end_step.*start_step"):
    mtf.layers.annealed_dropout(x, True, 10, 10, init_rate=0.1)
  with pytest.raises(ValueError, match="init_rate"):
    mtf.layers.annealed_dropout(x, True, 0, 10, init_rate=1.5)
  with pytest.raises(ValueError, match="noise_shape.*hidden"):
    mtf.layers.annealed_dropout(
      x, True, 0, 10, init_rate=0.1, noise_shape=[HIDDEN]
    )
  with tf.Graph().as_default():  # a graph without a global step
    with pytest.raises(ValueError, match="global step"):
      mtf.layers.annealed_dropout(x, True, 0, 10, init_rate=0.1)


# ----------------------------------------------------------------------------
# Default scope names, gin names, signatures.


def test_default_scope_names_unique_per_graph():
  graph = mtf.Graph()
  names = []
  for _ in range(2):
    with scope_util.layer_variable_scope(graph, None, "dense") as s:
      names.append(s.name)
  with tf1.variable_scope("outer"):
    with scope_util.layer_variable_scope(graph, None, "dense") as s:
      names.append(s.name)
  with scope_util.layer_variable_scope(graph, "explicit", "dense") as s:
    names.append(s.name)
  assert names == ["dense", "dense_1", "outer/dense", "explicit"]
  # A new mtf Graph starts again.
  with scope_util.layer_variable_scope(mtf.Graph(), None, "dense") as s:
    assert s.name == "dense"


def test_default_name_skips_explicitly_used_scope():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  with mtf.variable_store(mtf.VariableStore()):
    x = mtf.zeros(mesh, [BATCH, D_MODEL])
    mtf.layers.dense(x, HIDDEN, reduced_dims=[D_MODEL], name="dense")
    mtf.layers.dense(x, HIDDEN, reduced_dims=[D_MODEL])
  assert [v.name for v in graph.all_variables] == [
    "dense/kernel",
    "dense/bias",
    "dense_1/kernel",
    "dense_2/bias",
  ]


def test_gin_configurables_registered_under_original_module():
  # parse_config fails on an unknown configurable or parameter.
  gin.parse_config(
    "mesh_tensorflow.layers.unit_scaling_convention.value = False\n"
    "mesh_tensorflow.layers.VarianceScalingInitializer.scale = 1.0\n"
    "mesh_tensorflow.layers.clip_activation_gradient.clip_rms_norm = None\n"
  )
  try:
    assert (
      gin.query_parameter(
        "mesh_tensorflow.layers.VarianceScalingInitializer.scale"
      )
      == 1.0
    )
  finally:
    gin.clear_config()


def _params(fn):
  return [
    (p.name, p.default) for p in inspect.signature(fn).parameters.values()
  ]


def test_signatures():
  e = inspect.Parameter.empty
  assert _params(mtf.layers.multiplicative_jitter) == [
    ("x", e),
    ("epsilon", 1e-2),
  ]
  assert _params(mtf.layers.reversible_half_residual_and_swap) == [
    ("x1", e),
    ("x1_backwards", e),
    ("x2", e),
    ("x2_backwards", e),
    ("f", e),
    ("recompute_grads", True),
  ]
  assert _params(mtf.layers.clip_activation_gradient) == [
    ("x", e),
    ("clip_rms_norm", None),
  ]
  assert _params(mtf.layers.summary_for_clip_activation_gradient) == [
    ("t", e),
    ("name", None),
    ("batch_dims", None),
  ]
  assert _params(mtf.layers.annealed_dropout) == [
    ("x", e),
    ("is_training", e),
    ("start_step", e),
    ("end_step", e),
    ("init_rate", None),
    ("noise_shape", None),
    ("name", None),
  ]
