"""mtf.optimize: public names, signatures, gin, global step and helpers."""

import inspect

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow._src.optimizers import global_step as global_step_lib
from tests import mesh_test_util as mtu
from tests import meshes

tf1 = tf.compat.v1
E = inspect.Parameter.empty

# name -> [(parameter, default)], as in the original mtf.optimize.
SIGNATURES = {
  "SgdOptimizer": [("learning_rate", E)],
  "MomentumOptimizer": [("learning_rate", E), ("momentum", E)],
  "AdamWeightDecayOptimizer": [
    ("learning_rate", E),
    ("weight_decay_rate", 0.0),
    ("beta_1", 0.9),
    ("beta_2", 0.999),
    ("epsilon", 1e-6),
    ("exclude_from_weight_decay", None),
  ],
  "AdafactorOptimizer": [
    ("multiply_by_parameter_scale", True),
    ("learning_rate", None),
    ("decay_rate", None),
    ("beta1", 0.0),
    ("clipping_threshold", 1.0),
    ("factored", True),
    ("epsilon1", 1e-30),
    ("epsilon2", 1e-3),
    ("min_dim_size_to_factor", 128),
    ("stacked_dim_names", None),
    ("exclude_from_parameter_scale", None),
  ],
  "adafactor_decay_rate_adam": [("beta2", E)],
  "adafactor_decay_rate_pow": [("exponent", 0.8), ("offset", 0)],
  "adafactor_optimizer_from_hparams": [("hparams", E), ("lr", E)],
  "make_optimizer": [("hparams", E), ("lr", E)],
  "reduce_rms": [("x", E), ("kwargs", E)],
  "product_learning_rate": [
    ("step", E),
    ("total_train_steps", E),
    ("factors", gin.REQUIRED),
    ("offset", 0),
  ],
  "compute_lr_for_step": [
    ("schedules", E),
    ("learning_rate", E),
    ("train_steps", 524288),
  ],
  "AdafactorWithMultiLRSchedule": [
    ("variable_search", None),
    ("alt_lr_schedules", None),
    ("kwargs", E),
  ],
  "AdamWithMultiLRSchedule": [
    ("variable_search", None),
    ("alt_lr_schedules", None),
    ("kwargs", E),
  ],
  "clip_by_global_norm": [("grads", E), ("clip_norm", E)],
}
GIN_CONFIGURABLES = [
  "SgdOptimizer",
  "MomentumOptimizer",
  "AdamWeightDecayOptimizer",
  "AdafactorOptimizer",
  "adafactor_decay_rate_pow",
  "product_learning_rate",
  "compute_lr_for_step",
  "AdafactorWithMultiLRSchedule",
  "AdamWithMultiLRSchedule",
]


def _params(fn):
  return [
    (p.name, p.default) for p in inspect.signature(fn).parameters.values()
  ]


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_signature(name):
  assert _params(getattr(mtf.optimize, name)) == SIGNATURES[name]


def test_public_names():
  spec_names = set(SIGNATURES) | {"Optimizer"}
  assert set(mtf.optimize.__all__) == spec_names | {"get_or_create_global_step"}
  for name in mtf.optimize.__all__:
    assert getattr(mtf.optimize, name) is not None
  assert _params(mtf.optimize.Optimizer.apply_grads) == [
    ("self", E),
    ("grads", E),
    ("variables", E),
  ]
  assert _params(mtf.optimize.Optimizer.apply_grad) == [
    ("self", E),
    ("grad", E),
    ("var", E),
  ]
  assert issubclass(
    mtf.optimize.AdafactorWithMultiLRSchedule, mtf.optimize.AdafactorOptimizer
  )
  assert issubclass(
    mtf.optimize.AdamWithMultiLRSchedule, mtf.optimize.AdamWeightDecayOptimizer
  )


@pytest.mark.parametrize("name", GIN_CONFIGURABLES)
def test_gin_registered_under_original_module(name):
  assert (
    gin.config._REGISTRY.get_match(  # pylint: disable=protected-access
      "mesh_tensorflow.optimize." + name
    )
    is not None
  )


def test_gin_bindings_apply():
  gin.clear_config()
  try:
    gin.parse_config("""
        mesh_tensorflow.optimize.AdafactorOptimizer.beta1 = 0.5
        mesh_tensorflow.optimize.AdafactorOptimizer.min_dim_size_to_factor = 4
        mesh_tensorflow.optimize.SgdOptimizer.learning_rate = 0.25
        mesh_tensorflow.optimize.compute_lr_for_step.train_steps = 100
        mesh_tensorflow.optimize.adafactor_decay_rate_pow.exponent = 0.5
        """)
    opt = mtf.optimize.AdafactorOptimizer()
    # pylint: disable=protected-access,no-value-for-parameter
    assert (opt._beta1, opt._min_dim_size_to_factor) == (0.5, 4)
    assert mtf.optimize.SgdOptimizer().lr == 0.25
    rates = mtf.optimize.compute_lr_for_step([[lambda s, t: t * 0.5]], 0.1)
    assert float(rates[0]) == 50.0
    mtf.optimize.get_or_create_global_step().assign(3)
    # The default decay rate is adafactor_decay_rate_pow() with gin's args.
    np.testing.assert_allclose(float(opt._get_decay_rate()), 0.5, rtol=1e-6)
    # pylint: enable=protected-access,no-value-for-parameter
  finally:
    gin.clear_config()
    mtf.optimize.get_or_create_global_step().assign(0)


# ------------------------------------------------------------ global step


@pytest.fixture
def fresh_eager_global_step(monkeypatch):
  """No process-wide step and an empty tf1 GLOBAL_STEP collection (restored)."""
  monkeypatch.setattr(global_step_lib, "_eager_global_step", None)
  collection = tf1.get_collection_ref(tf1.GraphKeys.GLOBAL_STEP)
  saved = list(collection)
  del collection[:]
  yield
  collection[:] = saved


@pytest.mark.usefixtures("fresh_eager_global_step")
def test_global_step_eager_and_function():
  @tf.function(autograph=False)
  def increment():
    # First creation happens inside this trace (and its re-trace).
    return mtf.optimize.get_or_create_global_step().assign_add(1)

  assert int(increment()) == 1
  assert int(increment()) == 2
  step = mtf.optimize.get_or_create_global_step()
  assert step is mtf.optimize.get_or_create_global_step()
  assert step.dtype == tf.int64 and step.shape == [] and not step.trainable
  assert step.name == "global_step:0" and int(step) == 2
  with tf1.variable_scope("scope"):
    assert mtf.optimize.get_or_create_global_step() is step
  # tf1 code sees the same step at top level and in later tf.functions.
  assert tf1.train.get_global_step() is step

  @tf.function(autograph=False)
  def tf1_increment():
    return tf1.train.get_global_step().assign_add(5)

  assert int(tf1_increment()) == 7 and int(step) == 7


@pytest.mark.usefixtures("fresh_eager_global_step")
def test_global_step_adopts_a_tf1_eager_step():
  tf1_step = tf1.train.get_or_create_global_step()
  assert mtf.optimize.get_or_create_global_step() is tf1_step


def test_global_step_in_v1_graph():
  with tf.Graph().as_default() as graph:
    with tf1.variable_scope("scope"):
      step = mtf.optimize.get_or_create_global_step()
    assert step is mtf.optimize.get_or_create_global_step()
    assert step.name == "global_step:0"
    assert tf1.train.get_global_step(graph) is step
    assert step in tf1.global_variables()
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      sess.run(step.assign_add(3))
      assert sess.run(step) == 3


def test_default_learning_rate_reads_the_step_of_each_call():
  """An optimizer made outside a tf.function follows the step per call."""
  step = mtf.optimize.get_or_create_global_step()
  opt = mtf.optimize.AdafactorOptimizer(multiply_by_parameter_scale=False)
  dim = mtf.Dimension("a", 4)
  store = mtf.VariableStore()

  @tf.function(autograph=False)
  def run():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    with mtf.variable_store(store):
      w = mtf.get_variable(mesh, "w", [dim], initializer=tf.zeros_initializer())
      opt.apply_grads([mtf.ones(mesh, [dim])], [w.operation])
      lowering = mtf.Lowering(graph, {mesh: mtu.mesh_impl_for("", "")})
    lowering.copy_slices_to_masters()
    step.assign_add(1)

  try:
    step.assign(0)
    expected = np.zeros(4)
    for k in range(3):
      run()
      # Gradient 1 everywhere: x = 1 (no clipping: rms 1); lr*0.05.
      expected -= min((k + 1.0) ** -0.5, 0.01) * 0.05
      np.testing.assert_allclose(
        store.masters["w"].numpy(), expected, rtol=1e-5
      )
  finally:
    step.assign(0)


# ---------------------------------------------------------- helpers


def test_product_learning_rate_and_compute_lr_for_step():
  assert (
    mtf.optimize.product_learning_rate(
      10, 100, factors=[lambda s, t: s / t, lambda s, t: 2.0]
    )
    == 0.2
  )
  assert (
    mtf.optimize.product_learning_rate(
      10, 100, factors=[lambda s, t: s], offset=4
    )
    == 6
  )
  assert mtf.optimize.product_learning_rate(3, 100, factors=[]) == 1.0
  with pytest.raises(Exception, match="factors"):
    mtf.optimize.product_learning_rate(3, 100)  # gin.REQUIRED
  step = mtf.optimize.get_or_create_global_step()
  try:
    step.assign(8)
    base = tf.constant(0.5)
    rates = mtf.optimize.compute_lr_for_step(
      [None, [lambda s, t: tf.math.rsqrt(s + 1.0), lambda s, t: t / 1000.0]],
      base,
      train_steps=2000,
    )
    assert rates[0] is base
    np.testing.assert_allclose(float(rates[1]), 2.0 / 3.0, rtol=1e-6)
  finally:
    step.assign(0)


def _run_eager(build_fn, mesh_shape, layout):
  return mtu.run_program(build_fn, mesh_shape, layout, "eager")


@meshes.parametrize([("", ""), ("rows:2;cols:2", "a:rows;b:cols")])
@pytest.mark.parametrize("clip_norm", [1.5, 100.0])
def test_clip_by_global_norm_matches_tf(mesh_shape, layout, clip_norm):
  rng = np.random.default_rng(0)
  x = rng.standard_normal((4, 6)).astype(np.float32)
  y = rng.standard_normal((6,)).astype(np.float32)
  a, b = mtf.Dimension("a", 4), mtf.Dimension("b", 6)

  def build(mesh):
    gx = mtf.import_tf_tensor(mesh, x, [a, b])
    gy = mtf.import_tf_tensor(mesh, y, [b])
    clipped, norm = mtf.optimize.clip_by_global_norm([gx, None, gy], clip_norm)
    assert clipped[1] is None
    return [clipped[0], clipped[2], norm]

  got = _run_eager(build, mesh_shape, layout)
  (ex, ey), norm = tf.clip_by_global_norm([x, y], clip_norm)
  mtu.assert_all_close(got, [ex.numpy(), ey.numpy(), norm.numpy()])


def test_clip_by_global_norm_tf_scalar_bfloat16_and_all_none():
  a = mtf.Dimension("a", 4)
  x = np.array([3.0, 4.0, 0.0, 0.0], np.float32)

  def build(mesh):
    g = mtf.cast(mtf.import_tf_tensor(mesh, x, [a]), tf.bfloat16)
    (clipped,), norm = mtf.optimize.clip_by_global_norm([g], tf.constant(1.0))
    assert clipped.dtype == tf.bfloat16 and norm.dtype == tf.float32
    return [mtf.cast(clipped, tf.float32), norm]

  clipped, norm = _run_eager(build, "all:4", "a:all")
  np.testing.assert_allclose(norm, 5.0)
  np.testing.assert_allclose(clipped, [0.6, 0.8, 0, 0], rtol=1e-2)
  assert mtf.optimize.clip_by_global_norm([None, None], 1.0) == (
    [None, None],
    None,
  )
  with pytest.raises(ValueError, match="positive"):
    mtf.optimize.clip_by_global_norm([None], 0.0)


def test_reduce_rms():
  rng = np.random.default_rng(1)
  x = rng.standard_normal((2, 4)).astype(np.float32)
  s, a = mtf.Dimension("s", 2), mtf.Dimension("a", 4)

  def build(mesh):
    t = mtf.import_tf_tensor(mesh, x, [s, a])
    return [
      mtf.optimize.reduce_rms(t),
      mtf.optimize.reduce_rms(t, output_shape=[s]),
      mtf.optimize.reduce_rms(t, reduced_dim=s),
    ]

  got = _run_eager(build, "rows:2;cols:2", "s:rows;a:cols")
  mtu.assert_all_close(
    got,
    [
      np.sqrt(np.mean(x**2)),
      np.sqrt(np.mean(x**2, axis=1)),
      np.sqrt(np.mean(x**2, axis=0)),
    ],
  )
