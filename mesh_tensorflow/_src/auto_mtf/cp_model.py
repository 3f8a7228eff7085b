"""A pure-Python integer program in the shape of a CP-SAT model.

The layout optimizer builds its program here, in the process that has
TensorFlow loaded; nothing here imports TensorFlow or ortools. The program is
plain data: `to_json_dict` hands it to the CP-SAT worker process, and `Proto`
gives a read-only view with the field names of ortools' `CpModelProto`
(`variables[i].name`, `objective.vars`, ...), so tools written for ortools
models (print_cp_model_solution) read both.

Literals follow the CP-SAT convention: variable `i` is the literal `i`, its
negation is `-i - 1`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Mapping, Sequence, Tuple


@dataclasses.dataclass(frozen=True)
class IntegerVariable:
  """An integer variable with the inclusive domain [lower_bound, upper_bound]."""

  name: str
  lower_bound: int
  upper_bound: int

  @property
  def domain(self) -> Tuple[int, int]:
    """The domain as CP-SAT stores it: (lower bound, upper bound)."""
    return (self.lower_bound, self.upper_bound)


@dataclasses.dataclass(frozen=True)
class LinearConstraint:
  """lower_bound <= sum(coeffs[k] * variables[vars[k]]) <= upper_bound."""

  vars: Tuple[int, ...]
  coeffs: Tuple[int, ...]
  lower_bound: int
  upper_bound: int


@dataclasses.dataclass(frozen=True)
class Implication:
  """The literal `premise` implies the literal `conclusion`."""

  premise: int
  conclusion: int


@dataclasses.dataclass(frozen=True)
class LinearObjective:
  """Minimize offset + sum(coeffs[k] * variables[vars[k]])."""

  vars: Tuple[int, ...] = ()
  coeffs: Tuple[int, ...] = ()
  offset: int = 0
  # CP-SAT stores a maximization as a negative scaling factor.
  scaling_factor: float = 1.0


@dataclasses.dataclass(frozen=True)
class ModelView:
  """A read-only snapshot of a CpModel with CpModelProto's field names."""

  variables: Tuple[IntegerVariable, ...]
  constraints: Tuple[Any, ...]
  objective: LinearObjective
  has_objective: bool

  def HasField(self, field_name: str) -> bool:  # noqa: N802  pylint: disable=invalid-name
    """Whether an optional field is set (only `objective` is optional).

    Args:
      field_name: the name of a field.

    Returns:
      True if `field_name` is "objective" and the model has one.
    """
    return field_name == "objective" and self.has_objective


def negated(literal: int) -> int:
  """The negation of a literal, -1 - literal (an involution).

  Args:
    literal: a variable index or a negated variable index.

  Returns:
    the literal of the opposite truth value.
  """
  return -literal - 1


class CpModel:
  """An integer program: variables, linear constraints, implications, objective.

  Variables are referred to by their index (the value `new_bool_var` and
  `new_int_var` return).
  """

  def __init__(self) -> None:
    self._variables: List[IntegerVariable] = []
    self._constraints: List[Any] = []
    self._objective = LinearObjective()
    self._has_objective = False

  @property
  def num_variables(self) -> int:
    """The number of variables created so far."""
    return len(self._variables)

  @property
  def variables(self) -> Tuple[IntegerVariable, ...]:
    """The variables, in creation order."""
    return tuple(self._variables)

  @property
  def objective(self) -> LinearObjective:
    """The objective to minimize (empty until `minimize` is called)."""
    return self._objective

  def new_int_var(self, lower_bound: int, upper_bound: int, name: str) -> int:
    """Adds an integer variable with domain [lower_bound, upper_bound].

    Args:
      lower_bound: the smallest value.
      upper_bound: the largest value.
      name: the variable's name.

    Returns:
      the variable's index.
    """
    if lower_bound > upper_bound:
      raise ValueError(
        "variable %r has an empty domain [%d, %d]"
        % (name, lower_bound, upper_bound)
      )
    self._variables.append(
      IntegerVariable(name, int(lower_bound), int(upper_bound))
    )
    return len(self._variables) - 1

  def new_bool_var(self, name: str) -> int:
    """Adds a 0/1 variable.

    Args:
      name: the variable's name.

    Returns:
      the variable's index.
    """
    return self.new_int_var(0, 1, name)

  def add_linear_constraint(
    self,
    terms: Mapping[int, int],
    lower_bound: int,
    upper_bound: int,
  ) -> None:
    """Adds lower_bound <= sum(coefficient * variable) <= upper_bound.

    Args:
      terms: {variable index: integer coefficient}.
      lower_bound: the smallest allowed value of the sum.
      upper_bound: the largest allowed value of the sum.
    """
    variables = tuple(terms)
    self._check_variables(variables)
    self._constraints.append(
      LinearConstraint(
        variables,
        tuple(int(terms[v]) for v in variables),
        int(lower_bound),
        int(upper_bound),
      )
    )

  def add_implication(self, premise: int, conclusion: int) -> None:
    """Adds premise => conclusion for two literals (see `negated`).

    Args:
      premise: a literal.
      conclusion: a literal.
    """
    self._check_variables(
      [p if p >= 0 else negated(p) for p in (premise, conclusion)]
    )
    self._constraints.append(Implication(premise, conclusion))

  def minimize(self, terms: Mapping[int, int], offset: int = 0) -> None:
    """Sets the objective: minimize offset + sum(coefficient * variable).

    Args:
      terms: {variable index: integer coefficient}.
      offset: a constant added to the objective.
    """
    variables = tuple(terms)
    self._check_variables(variables)
    self._objective = LinearObjective(
      variables, tuple(int(terms[v]) for v in variables), int(offset)
    )
    self._has_objective = True

  def objective_value(self, values: Sequence[int]) -> int:
    """The objective's value at an assignment of every variable.

    Args:
      values: one value per variable, in index order.

    Returns:
      the objective value.
    """
    objective = self._objective
    return objective.offset + sum(
      c * values[v] for v, c in zip(objective.vars, objective.coeffs)
    )

  def violated_constraints(self, values: Sequence[int]) -> List[Any]:
    """The constraints (and variable domains) an assignment violates.

    Args:
      values: one value per variable, in index order.

    Returns:
      the violated variables and constraints (empty if the assignment is
      feasible).
    """

    def literal_value(literal):
      return values[literal] if literal >= 0 else 1 - values[negated(literal)]

    violated = [
      variable
      for variable, value in zip(self._variables, values)
      if not variable.lower_bound <= value <= variable.upper_bound
    ]
    for constraint in self._constraints:
      if isinstance(constraint, Implication):
        if literal_value(constraint.premise) and not literal_value(
          constraint.conclusion
        ):
          violated.append(constraint)
      else:
        total = sum(
          c * values[v] for v, c in zip(constraint.vars, constraint.coeffs)
        )
        if not constraint.lower_bound <= total <= constraint.upper_bound:
          violated.append(constraint)
    return violated

  def Proto(self) -> ModelView:  # noqa: N802  pylint: disable=invalid-name
    """A read-only view with the field names of ortools' CpModelProto.

    Returns:
      a ModelView.
    """
    return ModelView(
      tuple(self._variables),
      tuple(self._constraints),
      self._objective,
      self._has_objective,
    )

  def to_json_dict(self) -> Dict[str, Any]:
    """The program as JSON-compatible plain data (for the CP-SAT worker).

    Returns:
      a dict with "variables" ([name, lower, upper]), "linear" ([vars, coeffs,
      lower, upper]), "implications" ([premise, conclusion]) and "objective"
      ([vars, coeffs, offset]).
    """
    linear, implications = [], []
    for constraint in self._constraints:
      if isinstance(constraint, Implication):
        implications.append([constraint.premise, constraint.conclusion])
      else:
        linear.append(
          [
            list(constraint.vars),
            list(constraint.coeffs),
            constraint.lower_bound,
            constraint.upper_bound,
          ]
        )
    return {
      "variables": [
        [v.name, v.lower_bound, v.upper_bound] for v in self._variables
      ],
      "linear": linear,
      "implications": implications,
      "objective": [
        list(self._objective.vars),
        list(self._objective.coeffs),
        self._objective.offset,
      ],
    }

  def _check_variables(self, variables: Sequence[int]) -> None:
    for v in variables:
      if not 0 <= v < len(self._variables):
        raise ValueError(
          "unknown variable index %r (the model has %d variables)"
          % (v, len(self._variables))
        )


@dataclasses.dataclass(frozen=True)
class SolverResponse:
  """`solution` as in CP-SAT's CpSolverResponse: one value per variable."""

  solution: Tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Solution:
  """A solved model, read through the methods of ortools' CpSolver.

  Attributes:
    status: "OPTIMAL" or "FEASIBLE".
    values: one value per model variable.
    objective_value: the objective at `values`.
    solver_name: which solver found it ("cp_sat" or "exact").
  """

  status: str
  values: Tuple[int, ...]
  objective_value: float
  solver_name: str

  def Value(self, variable: int) -> int:  # noqa: N802  pylint: disable=invalid-name
    """A variable's value.

    Args:
      variable: a variable index.

    Returns:
      its value in the solution.
    """
    return self.values[variable]

  def ObjectiveValue(self) -> float:  # noqa: N802  pylint: disable=invalid-name
    """The objective's value at the solution.

    Returns:
      a number.
    """
    return self.objective_value

  def ResponseProto(self) -> SolverResponse:  # noqa: N802  pylint: disable=invalid-name
    """The solution values, as CpSolver.ResponseProto() gives them.

    Returns:
      a SolverResponse.
    """
    return SolverResponse(self.values)
