"""AdamWeightDecayOptimizer and AdamWithMultiLRSchedule against numpy."""

import functools

import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import meshes
from tests.optimizers import optimizer_test_util as otu

SPECS = [
  ("layer/w_ab", [("a", 8), ("b", 4)]),
  ("layer/bias_b", [("b", 4)]),
  ("norm_ac", [("a", 8), ("c", 3)]),
]


@meshes.parametrize(meshes.OPTIMIZERS)
def test_adam_weight_decay_with_exclusions_matches_numpy(mesh_shape, layout):
  problem = otu.Problem(SPECS, steps=5)
  make = functools.partial(
    mtf.optimize.AdamWeightDecayOptimizer,
    learning_rate=0.01,
    weight_decay_rate=0.1,
    beta_1=0.8,
    beta_2=0.95,
    epsilon=1e-6,
    exclude_from_weight_decay=["bias", "^norm"],
  )
  actual = otu.train(problem, make, mesh_shape, layout, "function")
  expected = otu.train_numpy(
    problem,
    otu.NpAdam(
      0.01, 0.1, 0.8, 0.95, 1e-6, excluded=("layer/bias_b", "norm_ac")
    ),
  )
  otu.assert_same_history(actual, expected, msg="adam")
  for name, _ in SPECS:
    assert name + "/adam_m" in actual[-1] and name + "/adam_v" in actual[-1]


def test_adam_defaults_and_no_weight_decay():
  opt = mtf.optimize.AdamWeightDecayOptimizer(0.01)
  assert (
    opt.learning_rate,
    opt.weight_decay_rate,
    opt.beta_1,
    opt.beta_2,
    opt.epsilon,
    opt.exclude_from_weight_decay,
  ) == (0.01, 0.0, 0.9, 0.999, 1e-6, None)
  assert not opt._do_use_weight_decay("w")  # pylint: disable=protected-access
  problem = otu.Problem(SPECS[:1], steps=5)
  actual = otu.train(
    problem, lambda: mtf.optimize.AdamWeightDecayOptimizer(0.01), mode="eager"
  )
  otu.assert_same_history(actual, otu.train_numpy(problem, otu.NpAdam(0.01)))


def test_adam_with_multi_lr_schedule():
  problem = otu.Problem(SPECS, steps=5)
  make = functools.partial(
    mtf.optimize.AdamWithMultiLRSchedule,
    variable_search=["bias", "norm"],
    alt_lr_schedules=[
      [lambda s, t: 0.05, lambda s, t: tf.math.rsqrt(s + 1.0)],
      None,
    ],
    learning_rate=0.01,
    weight_decay_rate=0.1,
  )
  actual = otu.train(problem, make, mode="function")
  expected = otu.train_numpy(
    problem,
    otu.NpAdam(
      0.01, 0.1, lr_of={"layer/bias_b": lambda k: 0.05 / (k + 1.0) ** 0.5}
    ),
  )
  otu.assert_same_history(actual, expected, msg="adam multi-lr")


def test_multi_lr_schedule_lengths_must_match():
  with pytest.raises(ValueError, match="2 regexes but alt_lr_schedules has 1"):
    mtf.optimize.AdamWithMultiLRSchedule(
      variable_search=["a", "b"], alt_lr_schedules=[None], learning_rate=0.1
    )


def test_bad_exclusion_regex_is_a_value_error():
  with pytest.raises(ValueError, match=r"'\('"):
    mtf.optimize.AdamWeightDecayOptimizer(0.1, exclude_from_weight_decay=["("])
