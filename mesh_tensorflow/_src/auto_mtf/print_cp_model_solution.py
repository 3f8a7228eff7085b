"""Prints a CP-SAT style model's solution: each variable, the objective.

Works on ortools' CpModel/CpSolver and on the layout optimizer's own model and
solution, which expose the same fields (`Proto()`, `ResponseProto()`,
`ObjectiveValue()`).
"""

from __future__ import annotations

from typing import Any


def print_solution(model: Any, solver: Any) -> None:
  """Prints every named variable's value, the objective and its value.

  Call it after a successful solve; without a solution it fails.

  Args:
    model: a model with `Proto()` (variables, objective), e.g. a CpModel.
    solver: a solved solver with `ResponseProto().solution` and
      `ObjectiveValue()`, e.g. a CpSolver.
  """
  proto = model.Proto()
  solution = solver.ResponseProto().solution
  coefficients = {}
  maximize = False
  if proto.HasField("objective"):
    coefficients = dict(zip(proto.objective.vars, proto.objective.coeffs))
    maximize = proto.objective.scaling_factor < 0.0
  assignments = []
  terms = []
  for index, variable in enumerate(proto.variables):
    if not variable.name:
      continue
    coefficient = coefficients.get(index, 0)
    if maximize:
      coefficient = -coefficient
    if coefficient > 0:
      terms.append(" + {} * {}".format(coefficient, variable.name))
    elif coefficient < 0:
      terms.append(" - {} * {}".format(-coefficient, variable.name))
    assignments.append("  {} = {}\n".format(variable.name, solution[index]))
  print("".join(assignments), end="")
  if terms and terms[0].startswith(" +"):
    terms[0] = terms[0][2:]
  print("{}:{}".format("Maximize" if maximize else "Minimize", "".join(terms)))
  print("Objective value: {}\n".format(solver.ObjectiveValue()))
