"""Tests for the pure-Python CpModel and the CP-SAT worker process."""

import itertools
import json
import subprocess
import sys

import pytest

from mesh_tensorflow._src.auto_mtf import cp_model
from mesh_tensorflow._src.auto_mtf import cp_sat

needs_ortools = pytest.mark.skipif(
  not cp_sat.ortools_available(), reason="ortools is not installed"
)


def _small_model():
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


def _brute_force(model):
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
  model = _small_model()
  assert model.violated_constraints([0, 1, 0]) == []
  assert model.objective_value([0, 1, 0]) == -1
  # a without z >= 2, then a and b together.
  assert len(model.violated_constraints([1, 0, 0])) == 1
  assert len(model.violated_constraints([1, 1, 2])) == 2
  assert _brute_force(model) == -1


def test_proto_view_has_cp_model_proto_fields():
  proto = _small_model().Proto()
  assert [v.name for v in proto.variables] == ["a", "b", "z"]
  assert proto.variables[2].domain == (0, 5)
  assert proto.HasField("objective")
  assert list(proto.objective.coeffs) == [3, -1, -1]
  assert not cp_model.CpModel().Proto().HasField("objective")


def test_unknown_variable_raises():
  model = cp_model.CpModel()
  with pytest.raises(ValueError, match="unknown variable index 0"):
    model.add_linear_constraint({0: 1}, 0, 1)


def test_worker_imports_no_tensorflow():
  # The worker file must run in a process without TensorFlow.
  probe = (
    "import runpy, sys; del sys.path[0]; runpy.run_path(%r); "
    "print('tensorflow' in sys.modules, 'mesh_tensorflow' in sys.modules)"
    % str(cp_sat.WORKER_PATH)
  )
  out = subprocess.run(
    [sys.executable, "-c", probe],
    capture_output=True,
    text=True,
    check=True,
  ).stdout
  assert out.split() == ["False", "False"]


def test_worker_crash_raises_instead_of_killing_the_caller(
  monkeypatch, tmp_path
):
  crashing = tmp_path / "crash.py"
  crashing.write_text(
    "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n"
  )
  monkeypatch.setattr(cp_sat, "WORKER_PATH", crashing)
  with pytest.raises(cp_sat.CpSatWorkerError, match="exited with status"):
    cp_sat.solve_in_subprocess(_small_model())


@needs_ortools
def test_cp_sat_finds_the_enumerated_optimum():
  model = _small_model()
  result = cp_sat.solve_in_subprocess(model)
  assert result.status == "OPTIMAL"
  assert result.objective_value == _brute_force(model)
  assert model.violated_constraints(result.values) == []


@needs_ortools
def test_cp_sat_tiebreaks_pick_one_optimum():
  # min -a - b with a + b <= 1: a=1 and b=1 tie; the tiebreak min(-b) picks b.
  model = cp_model.CpModel()
  a = model.new_bool_var("a")
  b = model.new_bool_var("b")
  model.add_linear_constraint({a: 1, b: 1}, 0, 1)
  model.minimize({a: -1, b: -1})
  for tiebreak, expected in (([b], [0, 1]), ([a], [1, 0])):
    result = cp_sat.solve_in_subprocess(model, [(tiebreak, [-1])])
    assert list(result.values) == expected


def test_to_json_dict_round_trips_through_json():
  data = _small_model().to_json_dict()
  assert json.loads(json.dumps(data)) == data
  assert data["implications"] == [[1, -1]]
