"""Tests for the CP-SAT worker process (the ortools half skips without it)."""

import subprocess
import sys

import pytest

from mesh_tensorflow._src.auto_mtf import cp_model
from mesh_tensorflow._src.auto_mtf import cp_sat
from tests.auto_mtf.cp_model_test import brute_force
from tests.auto_mtf.cp_model_test import small_model

needs_ortools = pytest.mark.skipif(
  not cp_sat.ortools_available(), reason="ortools is not installed"
)


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
    cp_sat.solve_in_subprocess(small_model())


@needs_ortools
def test_cp_sat_finds_the_enumerated_optimum():
  model = small_model()
  result = cp_sat.solve_in_subprocess(model)
  assert result.status == "OPTIMAL"
  assert result.objective_value == brute_force(model)
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
