"""Finds the layout of an mtf graph that minimizes per-device peak memory.

A layout maps each splittable mtf dimension to a mesh dimension or leaves it
unassigned. The problem is stated as a boolean integer program, as the
original Mesh TensorFlow did:

  x_(t:m)   1 if mtf dimension t is split over mesh dimension m;
  y_(...)   for each set of dimensions that an operation or tensor uses and
            each assignment of that set to mesh dimensions, 1 if the x's agree
            with the assignment;
  z         the peak memory.

Constraints: a dimension goes to at most one mesh dimension, and only to one
whose size divides it; dimensions that meet in an operation use distinct mesh
dimensions; exactly one y per set is 1, and it agrees with the x's; z is at
least the memory in use at every step of a schedule (scheduler.py), each
tensor counted at its size under its y. Objective: minimize
(number of splittable dimensions + 1) * z - sum(x), i.e. peak memory first,
then the most splits.

The program is built in pure Python (cp_model.py). `solve` runs ortools'
CP-SAT on it in a separate process (cp_sat.py; CP-SAT crashes processes that
have TensorFlow loaded), or, when ortools is not installed, an exact
branch-and-bound search over layouts (exact_solver.py). Both return, among
optimal layouts, the lexicographically first one (dimensions in name order,
each preferring mesh dimensions in mesh order, then "unassigned"), so they
agree.
"""

from __future__ import annotations

import itertools
from typing import Dict, FrozenSet, Iterable, List, Mapping, Optional, Tuple

from absl import logging

from mesh_tensorflow._src.auto_mtf import cp_sat
from mesh_tensorflow._src.auto_mtf import exact_solver
from mesh_tensorflow._src.auto_mtf import print_cp_model_solution
from mesh_tensorflow._src.auto_mtf import scheduler
from mesh_tensorflow._src.auto_mtf.cp_model import CpModel
from mesh_tensorflow._src.auto_mtf.cp_model import Solution
from mesh_tensorflow._src.auto_mtf.cp_model import negated
from mesh_tensorflow._src.auto_mtf.memory_estimator import MemoryEstimator

# The values of LayoutOptimizer.solver.
SOLVERS = ("auto", "cp_sat", "exact")


class SolverError(Exception):
  """The solver found no solution, or failed."""


class LayoutOptimizer:
  """Computes a layout that minimizes peak memory (see the module docstring).

  Attributes:
    solver: which solver `solve` uses: "cp_sat" (ortools' CP-SAT, run in a
      separate process), "exact" (branch and bound, no ortools; limited to
      small programs) or "auto" (the default: CP-SAT when ortools is
      installed, else exact).

  Example:
    >>> graph = mtf.Graph()
    >>> mesh = mtf.Mesh(graph, "mesh")
    >>> x = mtf.zeros(mesh, "a:10,b:5")
    >>> y = mtf.zeros(mesh, "b:5,c:20")
    >>> z = mtf.einsum([x, y], "a:10,c:20")
    >>> estimator = MemoryEstimator(graph, mtf.convert_to_shape("m1:4,m2:2"))
    >>> optimizer = LayoutOptimizer(estimator)
    >>> optimizer.solver = "exact"
    >>> optimizer.solve()
    'a:m2;c:m1'
    >>> # Peak bytes: x, y and z together, unsplit or split 2, 4 and 8 ways.
    >>> optimizer.evaluate_layout(""), optimizer.evaluate_layout("a:m2;c:m1")
    (1400.0, 300.0)
  """

  def __init__(
    self, memory_estimator: MemoryEstimator, scheduler_alg: str = "LIST"
  ):
    """Builds the integer program.

    Args:
      memory_estimator: a MemoryEstimator of the graph and mesh shape.
      scheduler_alg: the schedule under which memory is measured, 'LIST' or
        'NAIVE' (see scheduler.minimize_peak_memory).
    """
    self.solver = "auto"
    self._estimator = memory_estimator
    self._scheduler_alg = scheduler_alg
    self._layout_validator = memory_estimator.get_layout_validator()
    self._graph = memory_estimator.get_graph_interface()
    self._memory_contents: Optional[List[FrozenSet[str]]] = None
    self._cp_solver: Optional[Solution] = None
    validator = self._layout_validator
    self._dim_names = tuple(sorted(validator.splittable_mtf_dimension_names))
    self._mesh_sizes = dict(validator.mesh_dimension_name_to_size)
    self._collect_dimension_sets()
    self._model = CpModel()
    self._add_variables()
    self._add_constraints()
    scale = len(self._dim_names) + 1
    objective = {self._memory_var: scale}
    for variable in self._global_vars.values():
      objective[variable] = -1
    self._model.minimize(objective)

  def _splittable(self, dim_names: Iterable[str]) -> FrozenSet[str]:
    return frozenset(dim_names) & frozenset(self._dim_names)

  def _collect_dimension_sets(self) -> None:
    """The splittable dimension sets of operations and tensors."""
    graph = self._graph
    operation_dim_sets = {
      self._splittable(graph.get_operation_mtf_dimension_names(name))
      for name in graph.get_all_operation_names()
    }
    self._tensor_dim_sets = {
      name: self._splittable(graph.get_tensor_mtf_dimension_names(name))
      for name in graph.get_all_tensor_names()
    }
    all_sets = operation_dim_sets | set(self._tensor_dim_sets.values())
    # Sorted, so that the program is the same in every process (set order
    # depends on string hashing).
    self._operation_dim_sets = sorted(operation_dim_sets, key=_set_order)
    self._dim_sets = sorted(all_sets, key=_set_order)
    self._assignments = {
      dim_set: generate_assignments(dim_set, self._mesh_sizes)
      for dim_set in self._dim_sets
    }

  def _add_variables(self) -> None:
    model = self._model
    self._global_vars: Dict[Tuple[str, str], int] = {}
    for dim_name in self._dim_names:
      for mesh_dim_name in self._mesh_sizes:
        self._global_vars[(dim_name, mesh_dim_name)] = model.new_bool_var(
          global_var_name(dim_name, mesh_dim_name)
        )
    self._local_vars: Dict[FrozenSet[str], Dict[str, int]] = {}
    for dim_set in self._dim_sets:
      self._local_vars[dim_set] = {}
      for assignment in self._assignments[dim_set]:
        name = local_var_name(dim_set, assignment)
        self._local_vars[dim_set][name] = model.new_bool_var(name)
    # A crude bound: every tensor in memory at once, unsplit.
    upper_bound = sum(
      self._graph.get_tensor_size(name)
      for name in self._graph.get_all_tensor_names()
      if self._graph.is_tensor_on_canonical_device(name)
    )
    self._memory_var = model.new_int_var(0, upper_bound, "z")

  def _add_constraints(self) -> None:
    model = self._model
    x = self._global_vars
    for mesh_dim_name in self._mesh_sizes:
      for dim_set in self._operation_dim_sets:
        if len(dim_set) > 1:
          model.add_linear_constraint(
            {x[(d, mesh_dim_name)]: 1 for d in sorted(dim_set)}, 0, 1
          )
    for dim_name in self._dim_names:
      model.add_linear_constraint(
        {x[(dim_name, m)]: 1 for m in self._mesh_sizes}, 0, 1
      )
      for mesh_dim_name in self._mesh_sizes:
        if not self._layout_validator.is_valid_assignment(
          dim_name, mesh_dim_name
        ):
          model.add_linear_constraint({x[(dim_name, mesh_dim_name)]: 1}, 0, 0)
    for dim_set in self._dim_sets:
      local_vars = self._local_vars[dim_set]
      model.add_linear_constraint({v: 1 for v in local_vars.values()}, 1, 1)
      for assignment in self._assignments[dim_set]:
        y = local_vars[local_var_name(dim_set, assignment)]
        for dim_name in sorted(dim_set):
          if dim_name in assignment:
            model.add_implication(y, x[(dim_name, assignment[dim_name])])
          else:
            for mesh_dim_name in self._mesh_sizes:
              model.add_implication(x[(dim_name, mesh_dim_name)], negated(y))
    tensor_terms = self._tensor_memory_terms()
    for step in sorted(set(self._get_memory_contents()), key=sorted):
      terms = {self._memory_var: -1}
      for tensor_name in step:
        for variable, size in tensor_terms[tensor_name].items():
          terms[variable] = terms.get(variable, 0) + size
      model.add_linear_constraint(terms, -_UNBOUNDED, 0)

  def _tensor_memory_terms(self) -> Dict[str, Dict[int, int]]:
    """{tensor name: {local variable: the tensor's size under it}}."""
    terms = {}
    for tensor_name, dim_set in self._tensor_dim_sets.items():
      terms[tensor_name] = {}
      if not self._graph.is_tensor_on_canonical_device(tensor_name):
        continue
      for assignment in self._assignments[dim_set]:
        variable = self._local_vars[dim_set][
          local_var_name(dim_set, assignment)
        ]
        terms[tensor_name][variable] = self._graph.get_tensor_size(
          tensor_name, assignment, self._mesh_sizes
        )
    return terms

  def _get_memory_contents(self) -> List[FrozenSet[str]]:
    """The tensors in memory at each step of the schedule (computed once)."""
    if self._memory_contents is None:
      schedule = scheduler.minimize_peak_memory(
        self._graph, self._scheduler_alg
      )
      self._memory_contents = (
        self._graph.compute_memory_contents_under_schedule(schedule)
      )
    return self._memory_contents

  def _layout_problem(self) -> exact_solver.LayoutProblem:
    """The program restated over layouts, for the exact solver."""
    dim_index = {name: i for i, name in enumerate(self._dim_names)}
    mesh_dims = tuple(self._mesh_sizes.items())
    valid = tuple(
      tuple(
        m
        for m, (mesh_dim_name, _) in enumerate(mesh_dims)
        if self._layout_validator.is_valid_assignment(dim_name, mesh_dim_name)
      )
      for dim_name in self._dim_names
    )
    tensor_index, tensors = {}, []
    for tensor_name, dim_set in self._tensor_dim_sets.items():
      if not self._graph.is_tensor_on_canonical_device(tensor_name):
        continue
      tensor_index[tensor_name] = len(tensors)
      tensors.append(
        exact_solver.TensorCost(
          self._graph.get_tensor_dtype(tensor_name).size,
          self._graph.get_tensor_num_entries(tensor_name),
          tuple(
            dim_index[d]
            for d in self._graph.get_tensor_mtf_dimension_names(tensor_name)
            if d in dim_set
          ),
        )
      )
    steps = tuple(
      tuple(tensor_index[t] for t in step if t in tensor_index)
      for step in self._get_memory_contents()
    )
    return exact_solver.LayoutProblem(
      dim_names=self._dim_names,
      mesh_dims=mesh_dims,
      valid_mesh_dims=valid,
      operation_dim_sets=tuple(
        frozenset(dim_index[d] for d in s) for s in self._operation_dim_sets
      ),
      tensors=tuple(tensors),
      memory_contents=steps,
      scale=len(self._dim_names) + 1,
    )

  def _tiebreaks(self) -> List[Tuple[List[int], List[int]]]:
    """For each dimension in name order: the index of its choice.

    Mesh dimensions count 0, 1, ... in mesh order and "unassigned" counts
    len(mesh): x_(t:m) has coefficient index(m) - len(mesh), dropping the
    constant.
    """
    num_mesh_dims = len(self._mesh_sizes)
    return [
      (
        [self._global_vars[(dim_name, m)] for m in self._mesh_sizes],
        [i - num_mesh_dims for i in range(num_mesh_dims)],
      )
      for dim_name in self._dim_names
    ]

  def _solve_with_cp_sat(self) -> Solution:
    result = cp_sat.solve_in_subprocess(self._model, self._tiebreaks())
    if result.status not in ("OPTIMAL", "FEASIBLE"):
      logging.error("Solver returned status %s.", result.status)
      raise SolverError(
        "The solver could not solve the problem and returned status {}.".format(
          result.status
        )
      )
    if result.status == "FEASIBLE":
      logging.warning("A potentially suboptimal solution was found.")
    return Solution(
      result.status, result.values, result.objective_value, "cp_sat"
    )

  def _solve_exactly(self) -> Solution:
    problem = self._layout_problem()
    try:
      layout, objective_value = exact_solver.solve(problem)
    except exact_solver.SearchLimitError as error:
      raise SolverError(str(error)) from error
    values = [0] * self._model.num_variables
    layout_dict = {}
    for dim_name, mesh_index in zip(self._dim_names, layout):
      if mesh_index is not None:
        mesh_dim_name = problem.mesh_dims[mesh_index][0]
        layout_dict[dim_name] = mesh_dim_name
        values[self._global_vars[(dim_name, mesh_dim_name)]] = 1
    for dim_set in self._dim_sets:
      restriction = {d: m for d, m in layout_dict.items() if d in dim_set}
      values[
        self._local_vars[dim_set][local_var_name(dim_set, restriction)]
      ] = 1
    values[self._memory_var] = problem.peak_memory(problem.divisors(layout))
    return Solution("OPTIMAL", tuple(values), float(objective_value), "exact")

  def solve(self, print_solution: bool = False) -> str:
    """Solves the program and returns the layout.

    Args:
      print_solution: whether to print every variable's value and the
        objective (print_cp_model_solution.print_solution).

    Returns:
      the layout, e.g. "a:m2;c:m1": "dimension:mesh dimension" pairs in sorted
      order, joined by ";" ("" when nothing is split).

    Raises:
      SolverError: no solution was found, or the solver failed.
    """
    if self.solver not in SOLVERS:
      raise ValueError(
        "unknown solver %r; LayoutOptimizer.solver is one of %s"
        % (self.solver, ", ".join(SOLVERS))
      )
    use_cp_sat = self.solver == "cp_sat" or (
      self.solver == "auto" and cp_sat.ortools_available()
    )
    if use_cp_sat:
      try:
        solution = self._solve_with_cp_sat()
      except cp_sat.CpSatWorkerError as error:
        if self.solver == "cp_sat":
          raise SolverError(str(error)) from error
        logging.warning("CP-SAT failed, using the exact search: %s", error)
        solution = self._solve_exactly()
    else:
      solution = self._solve_exactly()
    self._cp_solver = solution
    violated = self._model.violated_constraints(solution.values)
    if violated:
      raise SolverError(
        "the %s solver's solution violates %d constraints, e.g. %s"
        % (solution.solver_name, len(violated), violated[0])
      )
    if print_solution:
      print_cp_model_solution.print_solution(self._model, solution)
    layout = [
      "%s:%s" % (dim_name, mesh_dim_name)
      for (dim_name, mesh_dim_name), variable in self._global_vars.items()
      if solution.Value(variable)
    ]
    return ";".join(sorted(layout))

  def evaluate_layout(self, layout: str) -> float:
    """The peak memory (bytes per device) of a layout under the schedule.

    The layout is not checked for validity; unsplittable dimensions in it
    are skipped with a warning.

    Args:
      layout: a layout string, e.g. "d_ff:m1;heads:m2".

    Returns:
      the peak memory, a float.
    """
    layout_dict = {}
    for pair in layout.split(";") if layout else ():
      dim_name, mesh_dim_name = pair.split(":", 1)
      if dim_name in self._layout_validator.splittable_mtf_dimension_names:
        layout_dict[dim_name] = mesh_dim_name
      else:
        logging.warning("Skipping unsplittable dimension %s.", dim_name)
    sizes = {}
    for tensor_name in self._graph.get_all_tensor_names():
      if self._graph.is_tensor_on_canonical_device(tensor_name):
        sizes[tensor_name] = self._graph.get_tensor_size(
          tensor_name, layout_dict, self._mesh_sizes
        )
      else:
        sizes[tensor_name] = 0.0
    peak = 0.0
    for step in self._get_memory_contents():
      peak = max(peak, float(sum(sizes[t] for t in step)))
    return peak


def _set_order(dim_set: FrozenSet[str]) -> Tuple[int, List[str]]:
  return (len(dim_set), sorted(dim_set))


# Stands for "no bound" in a linear constraint (CP-SAT takes int64 bounds).
_UNBOUNDED = 2**62


def global_var_name(splittable_dimension: str, mesh_dimension: str) -> str:
  """The name of the variable x_(t:m): t is split over m.

  Args:
    splittable_dimension: an mtf dimension name.
    mesh_dimension: a mesh dimension name.

  Returns:
    "x_(<splittable_dimension>:<mesh_dimension>)".
  """
  return "x_({}:{})".format(splittable_dimension, mesh_dimension)


def local_var_name(
  splittable_dimensions: Iterable[str], assignment: Mapping[str, str]
) -> str:
  """The name of the variable y_(...) of one assignment of a dimension set.

  Args:
    splittable_dimensions: the dimension set.
    assignment: {dimension: mesh dimension} for its assigned dimensions.

  Returns:
    "y_(" + the dimensions in sorted order, each as "dim:mesh" if assigned or
    "dim" if not, joined by "," + ")".
  """
  parts = [
    "{}:{}".format(d, assignment[d]) if d in assignment else d
    for d in sorted(splittable_dimensions)
  ]
  return "y_(" + ",".join(parts) + ")"


def generate_assignments(
  splittable_dimensions: Iterable[str],
  mesh_dimension_to_size: Mapping[str, int],
) -> List[Dict[str, str]]:
  """Every injective map of some of the dimensions to mesh dimensions.

  Args:
    splittable_dimensions: the dimension names.
    mesh_dimension_to_size: {mesh dimension name: size}.

  Returns:
    a list of {dimension: mesh dimension} dicts, the empty one first, then by
    number of assigned dimensions.
  """
  dims = sorted(splittable_dimensions)
  mesh_dims = list(mesh_dimension_to_size)
  return [
    dict(zip(chosen_dims, chosen_mesh_dims))
    for count in range(1 + min(len(dims), len(mesh_dims)))
    for chosen_dims in itertools.combinations(dims, count)
    for chosen_mesh_dims in itertools.permutations(mesh_dims, count)
  ]
