"""Tests for print_solution on our model and on a maximization view."""

import contextlib
import io

from mesh_tensorflow._src.auto_mtf import cp_model
from mesh_tensorflow._src.auto_mtf.print_cp_model_solution import print_solution


def _printed(model, solution):
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    print_solution(model, solution)
  return out.getvalue()


def test_minimization():
  model = cp_model.CpModel()
  a = model.new_bool_var("a")
  z = model.new_int_var(0, 9, "z")
  model.new_bool_var("")  # Unnamed variables are not printed.
  model.minimize({a: -1, z: 3})
  solution = cp_model.Solution("OPTIMAL", (1, 4, 0), 11.0, "exact")
  assert _printed(model, solution) == (
    "  a = 1\n  z = 4\nMinimize: - 1 * a + 3 * z\nObjective value: 11.0\n\n"
  )


class _MaximizationModel:
  """A model view whose objective CP-SAT stores negated (a maximization)."""

  def Proto(self):  # noqa: N802
    return cp_model.ModelView(
      variables=(cp_model.IntegerVariable("x", 0, 3),),
      constraints=(),
      objective=cp_model.LinearObjective((0,), (-2,), 0, -1.0),
      has_objective=True,
    )


def test_maximization_flips_the_coefficients():
  solution = cp_model.Solution("OPTIMAL", (3,), 6.0, "exact")
  assert _printed(_MaximizationModel(), solution) == (
    "  x = 3\nMaximize: 2 * x\nObjective value: 6.0\n\n"
  )
