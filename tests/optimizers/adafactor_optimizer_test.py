"""AdafactorOptimizer (and its multi-LR form) against a numpy Adafactor."""

import functools
import types

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import meshes
from tests.optimizers import optimizer_test_util as otu

# With min_dim_size_to_factor=4: w_ab [8, 4] is factored (d0=a, d1=b), w_ac
# [8, 3] is not (3 < 4), w_b is 1-d, w_sab [2, 8, 4] has a stacked dim s and
# is factored over (a, b) with per-s statistics.
SPECS = [
  ("w_ab", [("a", 8), ("b", 4)]),
  ("w_ac", [("a", 8), ("c", 3)]),
  ("w_b", [("b", 4)]),
  ("w_sab", [("s", 2), ("a", 8), ("b", 4)]),
]
DIMS = dict(SPECS)
MESH_2X2 = ("rows:2;cols:2", "a:rows;b:cols")

FULL = dict(beta1=0.9, min_dim_size_to_factor=4, stacked_dim_names=["s"])
FULL_NP = dict(beta1=0.9, min_dim=4, stacked=["s"])


def _check(
  mesh_shape,
  layout,
  mode,
  kwargs,
  np_kwargs,
  specs=SPECS,
  steps=6,
  expect_clipping=True,
):
  problem = otu.Problem(specs, steps=steps)
  actual = otu.train(
    problem,
    lambda: mtf.optimize.AdafactorOptimizer(**kwargs),
    mesh_shape,
    layout,
    mode,
  )
  reference = otu.NpAdafactor(DIMS, **np_kwargs)
  expected = otu.train_numpy(problem, reference)
  if expect_clipping:
    assert reference.clip_events > 0  # the data spike makes clipping act
  otu.assert_same_history(
    actual, expected, msg="adafactor %s %s" % (mesh_shape, mode)
  )
  return actual


@meshes.parametrize(meshes.OPTIMIZERS)
def test_factored_momentum_param_scale_default_schedule(mesh_shape, layout):
  """Default lr and decay from the global step, beta1 > 0, clipping."""
  actual = _check(mesh_shape, layout, "function", FULL, FULL_NP)
  last = actual[-1]
  # The original's slot names and shapes (var minus d0, var minus d1).
  assert last["w_ab_slot_vr"].shape == (4,)
  assert last["w_ab_slot_vc"].shape == (8,)
  assert last["w_sab_slot_vr"].shape == (2, 4)
  assert last["w_sab_slot_vc"].shape == (2, 8)
  assert last["w_ac_slot_v"].shape == (8, 3)
  assert last["w_b_slot_v"].shape == (4,)
  for name in DIMS:
    assert last[name + "_slot_m"].shape == last[name].shape
  assert "w_ab_slot_v" not in last and "w_ac_slot_vr" not in last


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_eager_and_v1_graph_modes(mode):
  _check(*MESH_2X2, mode, FULL, FULL_NP, specs=SPECS[:2] + SPECS[3:])


def test_given_rates_excluded_scale_no_clipping_no_momentum():
  kwargs = dict(
    learning_rate=0.02,
    decay_rate=0.7,
    clipping_threshold=None,
    min_dim_size_to_factor=4,
    stacked_dim_names="s",
    exclude_from_parameter_scale=["_ac$"],
  )
  np_kwargs = dict(
    learning_rate=0.02,
    decay_rate=0.7,
    clipping_threshold=None,
    min_dim=4,
    stacked=["s"],
    no_scale=["w_ac"],
  )
  last = _check("", "", "function", kwargs, np_kwargs, expect_clipping=False)[
    -1
  ]
  assert not any(name.endswith("_slot_m") for name in last)


def test_no_parameter_scale_default_lr_and_unfactored():
  """Default lr * 0.05 without parameter scale; factored=False; tf rates."""
  kwargs = dict(
    multiply_by_parameter_scale=False,
    factored=False,
    clipping_threshold=0.5,
    epsilon1=1e-20,
  )
  np_kwargs = dict(
    multiply_by_parameter_scale=False,
    factored=False,
    clipping_threshold=0.5,
    epsilon1=1e-20,
  )
  last = _check("", "", "function", kwargs, np_kwargs)[-1]
  assert "w_ab_slot_v" in last and "w_ab_slot_vr" not in last


def test_default_min_dim_size_to_factor_is_128():
  specs = [("big", [("a", 128), ("b", 128)]), ("tall", [("a", 128), ("c", 4)])]
  problem = otu.Problem(specs, steps=5)
  actual = otu.train(problem, mtf.optimize.AdafactorOptimizer, mode="function")
  reference = otu.NpAdafactor(dict(specs))
  otu.assert_same_history(actual, otu.train_numpy(problem, reference))
  assert actual[-1]["big_slot_vr"].shape == (128,)
  assert actual[-1]["big_slot_vc"].shape == (128,)
  assert actual[-1]["tall_slot_v"].shape == (128, 4)


def _slot_shapes(var_dims, **kwargs):
  """{slot name: Shape} after apply_grads on one variable (no lowering)."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  with mtf.variable_store(mtf.VariableStore()):
    w = mtf.get_variable(
      mesh, "w", var_dims, initializer=tf.zeros_initializer()
    )
    with tf.compat.v1.variable_scope("some_scope"):
      mtf.optimize.AdafactorOptimizer(**kwargs).apply_grads(
        [w * 1.0], [w.operation]
      )
  return {v.name: v.shape for v in graph.all_variables if v.name != "w"}, graph


def test_factoring_rule_ties_stacked_dims_and_slot_variables():
  a, b, c, s = (
    mtf.Dimension("a", 4),
    mtf.Dimension("b", 4),
    mtf.Dimension("c", 6),
    mtf.Dimension("s", 8),
  )
  # Ties go by dimension order: d0 = a, d1 = b.
  slots, _ = _slot_shapes([a, b], min_dim_size_to_factor=4)
  assert slots == {"w_slot_vr": mtf.Shape([b]), "w_slot_vc": mtf.Shape([a])}
  # The two largest: c (6) then a (4, first of the tie).
  slots, _ = _slot_shapes([a, b, c], min_dim_size_to_factor=4)
  assert slots == {
    "w_slot_vr": mtf.Shape([a, b]),
    "w_slot_vc": mtf.Shape([b, c]),
  }
  # s is largest but stacked, so it is ignored.
  slots, graph = _slot_shapes(
    [s, a, b], min_dim_size_to_factor=4, beta1=0.5, stacked_dim_names=["s"]
  )
  assert slots == {
    "w_slot_vr": mtf.Shape([s, b]),
    "w_slot_vc": mtf.Shape([s, a]),
    "w_slot_m": mtf.Shape([s, a, b]),
  }
  # Only one non-stacked dim: not factored.
  slots, _ = _slot_shapes(
    [s, a], min_dim_size_to_factor=4, stacked_dim_names=["s"]
  )
  assert slots == {"w_slot_v": mtf.Shape([s, a])}
  # Slots: float32 masters, untrainable, top-level names despite the scope.
  for v in graph.all_variables:
    if v.name != "w":
      assert v.master_dtype == tf.float32 and not v.trainable
  assert [v.name for v in graph.trainable_variables] == ["w"]


def test_slots_are_float32_for_bfloat16_variables():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  dims = [mtf.Dimension("a", 4), mtf.Dimension("b", 4)]
  with mtf.variable_store(mtf.VariableStore()):
    w = mtf.get_variable(
      mesh, "w", dims, dtype=tf.bfloat16, initializer=tf.ones_initializer()
    )
    mtf.optimize.AdafactorOptimizer(
      learning_rate=0.1, decay_rate=0.5, beta1=0.5, min_dim_size_to_factor=4
    ).apply_grads([w * 0.5], [w.operation])
    mtf.Lowering(graph, {mesh: otu.mtu.mesh_impl_for("", "")})
  slot_dtypes = {v.name: v.master_dtype for v in graph.all_variables}
  assert slot_dtypes == {
    "w": tf.bfloat16,
    "w_slot_vr": tf.float32,
    "w_slot_vc": tf.float32,
    "w_slot_m": tf.float32,
  }


def test_adafactor_with_multi_lr_schedule():
  specs = SPECS[:3]
  problem = otu.Problem(specs, steps=5)
  make = functools.partial(
    mtf.optimize.AdafactorWithMultiLRSchedule,
    variable_search=["_b$", "_ac"],
    alt_lr_schedules=[
      [
        lambda s, t: 0.05,
        lambda s, t: t / 524288.0,
        lambda s, t: tf.math.rsqrt(s + 1.0),
      ],
      None,
    ],
    learning_rate=0.01,
    decay_rate=0.8,
    min_dim_size_to_factor=4,
  )
  actual = otu.train(problem, make, mode="function")
  expected = otu.train_numpy(
    problem,
    otu.NpAdafactor(
      DIMS,
      learning_rate=0.01,
      decay_rate=0.8,
      min_dim=4,
      lr_of={"w_b": lambda k: 0.05 / (k + 1.0) ** 0.5},
    ),
  )
  otu.assert_same_history(actual, expected, msg="adafactor multi-lr")


def test_invalid_arguments():
  with pytest.raises(ValueError, match="beta1"):
    mtf.optimize.AdafactorOptimizer(beta1=1.0)
  with pytest.raises(ValueError, match="clipping_threshold"):
    mtf.optimize.AdafactorOptimizer(clipping_threshold=0.0)
  with pytest.raises(ValueError, match="1 regexes but alt_lr_schedules has 0"):
    mtf.optimize.AdafactorWithMultiLRSchedule(
      variable_search="x", alt_lr_schedules=[]
    )


def _set_step(value):
  mtf.optimize.get_or_create_global_step().assign(value)


def test_decay_rate_functions_follow_the_global_step():
  try:
    for k in (0, 1, 7):
      _set_step(k)
      np.testing.assert_allclose(
        float(mtf.optimize.adafactor_decay_rate_pow()),
        1.0 - (k + 1.0) ** -0.8,
        rtol=1e-6,
      )
      np.testing.assert_allclose(
        float(mtf.optimize.adafactor_decay_rate_pow(0.5, offset=1)),
        1.0 - (k - 1.0 + 1.0) ** -0.5 if k >= 1 else -np.inf,
        rtol=1e-6,
      )
      t = k + 1.0
      np.testing.assert_allclose(
        float(mtf.optimize.adafactor_decay_rate_adam(0.99)),
        0.99 * (1 - 0.99 ** (t - 1)) / (1 - 0.99**t),
        rtol=1e-5,
      )
  finally:
    _set_step(0)


def _hparams(**overrides):
  values = dict(
    optimizer="Adafactor",
    optimizer_adafactor_decay_type="pow",
    optimizer_adafactor_beta2=0.999,
    optimizer_adafactor_memory_exponent=0.5,
    optimizer_adafactor_multiply_by_parameter_scale=False,
    optimizer_adafactor_beta1=0.25,
    optimizer_adafactor_clipping_threshold=2.0,
    optimizer_adafactor_factored=False,
  )
  values.update(overrides)
  return types.SimpleNamespace(**values)


def test_optimizer_from_hparams_and_make_optimizer():
  try:
    _set_step(3)
    opt = mtf.optimize.adafactor_optimizer_from_hparams(_hparams(), 0.125)
    assert isinstance(opt, mtf.optimize.AdafactorOptimizer)
    # pylint: disable=protected-access
    assert (
      opt._learning_rate,
      opt._beta1,
      opt._clipping_threshold,
      opt._factored,
      opt._multiply_by_parameter_scale,
    ) == (0.125, 0.25, 2.0, False, False)
    np.testing.assert_allclose(float(opt._decay_rate), 1 - 4.0**-0.5, rtol=1e-6)
    opt = mtf.optimize.adafactor_optimizer_from_hparams(
      _hparams(optimizer_adafactor_decay_type="Adam"), 0.1
    )
    np.testing.assert_allclose(
      float(opt._decay_rate), 0.999 * (1 - 0.999**3) / (1 - 0.999**4), rtol=1e-5
    )
    # pylint: enable=protected-access
  finally:
    _set_step(0)
  with pytest.raises(ValueError, match="'bogus'"):
    mtf.optimize.adafactor_optimizer_from_hparams(
      _hparams(optimizer_adafactor_decay_type="bogus"), 0.1
    )
  assert isinstance(
    mtf.optimize.make_optimizer(_hparams(), 0.1),
    mtf.optimize.AdafactorOptimizer,
  )
  sgd = mtf.optimize.make_optimizer(_hparams(optimizer="SGD"), 0.1)
  assert isinstance(sgd, mtf.optimize.SgdOptimizer) and sgd.lr == 0.1
  with pytest.raises(ValueError, match="'Adam'"):
    mtf.optimize.make_optimizer(_hparams(optimizer="Adam"), 0.1)
