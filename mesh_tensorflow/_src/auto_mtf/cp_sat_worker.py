"""Solves one integer program with ortools' CP-SAT; run as a script.

CP-SAT can crash a process that has TensorFlow loaded, so the layout optimizer
runs this file in a separate Python process (see cp_sat.py). This file
imports only the standard library and ortools, never mesh_tensorflow or
TensorFlow: it is run by path, not imported as part of the package.

Protocol: one JSON object on stdin,
  {"model": CpModel.to_json_dict(),
   "tiebreaks": [[vars, coeffs], ...],
   "max_time_in_seconds": float or null}
and one JSON object on stdout,
  {"status": "OPTIMAL" | "FEASIBLE" | "INFEASIBLE" | ...,
   "objective_value": float or null, "values": [int, ...] or null}.

After the objective's optimum is found, each tiebreak expression (in order)
is minimized with the objective and the earlier tiebreaks held at their
optimal values, so the returned solution does not depend on CP-SAT's search.
"""

import importlib
import json
import sys


def _cp_model():
  # Imported on use, so that importing this file (e.g. to collect its
  # docstrings) works without ortools.
  return importlib.import_module("ortools.sat.python.cp_model")


def _weighted_sum(variables, indices, coeffs):
  return _cp_model().LinearExpr.weighted_sum(
    [variables[i] for i in indices], list(coeffs)
  )


def _literal(variables, literal):
  if literal >= 0:
    return variables[literal]
  return variables[-literal - 1].Not()


def _build(model_data):
  """The ortools CpModel and its variables for CpModel.to_json_dict() data."""
  model = _cp_model().CpModel()
  variables = [
    model.new_int_var(lower, upper, name)
    for name, lower, upper in model_data["variables"]
  ]
  for indices, coeffs, lower, upper in model_data["linear"]:
    model.add_linear_constraint(
      _weighted_sum(variables, indices, coeffs), lower, upper
    )
  for premise, conclusion in model_data["implications"]:
    model.add_implication(
      _literal(variables, premise), _literal(variables, conclusion)
    )
  return model, variables


def _new_solver(max_time_in_seconds):
  solver = _cp_model().CpSolver()
  if max_time_in_seconds is not None:
    solver.parameters.max_time_in_seconds = max_time_in_seconds
  return solver


def solve(request):
  """Solves the request (see the module docstring) and returns the reply."""
  cp_model = _cp_model()
  model, variables = _build(request["model"])
  indices, coeffs, offset = request["model"]["objective"]
  objective = _weighted_sum(variables, indices, coeffs)
  model.minimize(objective)
  max_time = request.get("max_time_in_seconds")
  solver = _new_solver(max_time)
  status = solver.solve(model)
  reply = {
    "status": solver.status_name(status),
    "objective_value": None,
    "values": None,
  }
  if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
    return reply
  reply["objective_value"] = solver.objective_value + offset
  values = [solver.value(v) for v in variables]
  if status == cp_model.OPTIMAL:
    model.add(objective == round(solver.objective_value))
    for tie_indices, tie_coeffs in request.get("tiebreaks", []):
      expression = _weighted_sum(variables, tie_indices, tie_coeffs)
      model.clear_hints()
      for variable, value in zip(variables, values):
        model.add_hint(variable, value)
      model.minimize(expression)
      solver = _new_solver(max_time)
      status = solver.solve(model)
      if status != cp_model.OPTIMAL:
        # The values found so far are optimal for the objective; only the
        # remaining tiebreaks are left undecided.
        break
      values = [solver.value(v) for v in variables]
      model.add(expression == round(solver.objective_value))
  reply["values"] = values
  return reply


def main():
  reply = solve(json.load(sys.stdin))
  json.dump(reply, sys.stdout)
  sys.stdout.flush()


if __name__ == "__main__":
  main()
