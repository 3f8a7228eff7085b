"""Tests for the pure-Python CpModel."""

import itertools
import json

import pytest

from mesh_tensorflow._src.auto_mtf import cp_model


def small_model():
  """min 3z - a - b  s.t.  a + b <= 1, a => z >= 2 (via z - 2a >= 0), b => !a."""
  model = cp_model.CpModel()
  a = model.new_bool_var("a")
  b = model.new_bool_var("b")
  z = model.new_int_var(0, 5, "z")
  model.add_linear_constraint({a: 1, b: 1}, 0, 1)
  model.add_linear_constraint({z: 1, a: -2}, 0, 10)
  model.add_implication(b, cp_model.negated(a))
  model.minimize({z: 3, a: -1, b: -1})
  return model


def brute_force(model):
  """The optimal objective value, by enumerating every assignment."""
  domains = [range(v.lower_bound, v.upper_bound + 1) for v in model.variables]
  return min(
    model.objective_value(values)
    for values in itertools.product(*domains)
    if not model.violated_constraints(values)
  )


def test_negated_is_an_involution():
  assert cp_model.negated(0) == -1
  assert cp_model.negated(cp_model.negated(7)) == 7


def test_violated_constraints_and_objective():
  model = small_model()
  assert model.violated_constraints([0, 1, 0]) == []
  assert model.objective_value([0, 1, 0]) == -1
  # a without z >= 2, then a and b together.
  assert len(model.violated_constraints([1, 0, 0])) == 1
  assert len(model.violated_constraints([1, 1, 2])) == 2
  assert brute_force(model) == -1


def test_proto_view_has_cp_model_proto_fields():
  proto = small_model().Proto()
  assert [v.name for v in proto.variables] == ["a", "b", "z"]
  assert proto.variables[2].domain == (0, 5)
  assert proto.HasField("objective")
  assert list(proto.objective.coeffs) == [3, -1, -1]
  assert not cp_model.CpModel().Proto().HasField("objective")


def test_unknown_variable_raises():
  model = cp_model.CpModel()
  with pytest.raises(ValueError, match="unknown variable index 0"):
    model.add_linear_constraint({0: 1}, 0, 1)


def test_to_json_dict_round_trips_through_json():
  data = small_model().to_json_dict()
  assert json.loads(json.dumps(data)) == data
  assert data["implications"] == [[1, -1]]
