"""An exact branch-and-bound layout search that needs no ortools.

It minimizes the same objective as the layout optimizer's integer program,
scale * peak_memory(layout) - number_of_assigned_dimensions, directly over
layouts (each splittable dimension goes to one valid mesh dimension or stays
unassigned; dimensions that meet in an operation never share a mesh
dimension). Among optimal layouts it returns the lexicographically first one:
dimensions in sorted name order, each preferring the mesh dimensions in mesh
order and then "unassigned". The CP-SAT path applies the same tiebreak, so the
two solvers return the same layout.

The search visits at most MAX_SEARCH_NODES partial layouts and raises
SearchLimitError beyond that (install ortools for larger programs).
"""

from __future__ import annotations

import dataclasses
from typing import FrozenSet, List, Optional, Sequence, Tuple

# The most partial layouts the search visits before giving up.
MAX_SEARCH_NODES = 200_000

# A layout: for each dimension of LayoutProblem.dim_names, the index of its
# mesh dimension in LayoutProblem.mesh_dims, or None (unassigned).
Layout = Tuple[Optional[int], ...]


class SearchLimitError(RuntimeError):
  """The exact search needed more than MAX_SEARCH_NODES nodes."""


@dataclasses.dataclass(frozen=True)
class TensorCost:
  """How one tensor's per-device size depends on the layout.

  Attributes:
    bytes_per_entry: the size of one entry (the dtype's size).
    num_entries: the number of entries of the whole tensor.
    dims: indices (into LayoutProblem.dim_names) of its splittable
      dimensions, in the tensor's dimension order.
  """

  bytes_per_entry: int
  num_entries: int
  dims: Tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class LayoutProblem:
  """The layout optimizer's program, stated over layouts.

  Attributes:
    dim_names: the splittable dimensions, sorted by name.
    mesh_dims: (name, size) of each mesh dimension, in mesh order.
    valid_mesh_dims: for each dimension, the mesh dimension indices it may be
      assigned to (divisibility).
    operation_dim_sets: sets of dimension indices that meet in one operation
      and so must go to distinct mesh dimensions.
    tensors: the cost of each tensor that counts towards memory.
    memory_contents: for each step of the schedule, the indices (into
      tensors) of the tensors in memory.
    scale: the weight of the peak memory against the number of assigned
      dimensions.
  """

  dim_names: Tuple[str, ...]
  mesh_dims: Tuple[Tuple[str, int], ...]
  valid_mesh_dims: Tuple[Tuple[int, ...], ...]
  operation_dim_sets: Tuple[FrozenSet[int], ...]
  tensors: Tuple[TensorCost, ...]
  memory_contents: Tuple[Tuple[int, ...], ...]
  scale: int

  def tensor_size(self, tensor: TensorCost, divisors: Sequence[int]) -> int:
    """A tensor's bytes per device when dimension d is split `divisors[d]` ways.

    Args:
      tensor: the tensor's cost.
      divisors: for each dimension, the size of its mesh dimension (1 when
        unassigned).

    Returns:
      the number of bytes (entries are rounded up at every split).
    """
    entries = tensor.num_entries
    for dim in tensor.dims:
      entries = -(-entries // divisors[dim])
    return tensor.bytes_per_entry * entries

  def peak_memory(self, divisors: Sequence[int]) -> int:
    """The largest memory use of any schedule step.

    Args:
      divisors: for each dimension, the size of its mesh dimension (1 when
        unassigned).

    Returns:
      the peak number of bytes.
    """
    sizes = [self.tensor_size(t, divisors) for t in self.tensors]
    return max(
      (sum(sizes[t] for t in step) for step in self.memory_contents),
      default=0,
    )

  def divisors(self, layout: Layout) -> List[int]:
    """The split factor of every dimension under a layout.

    Args:
      layout: a mesh dimension index (or None) per dimension.

    Returns:
      for each dimension, its mesh dimension's size, or 1 when unassigned.
    """
    return [1 if m is None else self.mesh_dims[m][1] for m in layout]

  def objective(self, layout: Layout) -> int:
    """scale * peak memory - number of assigned dimensions.

    Args:
      layout: a mesh dimension index (or None) per dimension.

    Returns:
      the objective value.
    """
    assigned = sum(m is not None for m in layout)
    return self.scale * self.peak_memory(self.divisors(layout)) - assigned


def _dominant_steps(
  memory_contents: Sequence[Sequence[int]],
) -> Tuple[Tuple[int, ...], ...]:
  """The steps whose tensor set is not contained in another step's set.

  Sizes are never negative, so a contained step never sets the peak.
  """
  kept: List[FrozenSet[int]] = []
  for step in sorted({frozenset(s) for s in memory_contents}, key=len)[::-1]:
    if not any(step <= other for other in kept):
      kept.append(step)
  return tuple(tuple(sorted(step)) for step in kept)


def solve(
  problem: LayoutProblem, max_nodes: Optional[int] = None
) -> Tuple[Layout, int]:
  """The lexicographically first layout of minimum objective.

  Args:
    problem: the program.
    max_nodes: the most partial layouts to visit (default MAX_SEARCH_NODES).

  Returns:
    (layout, objective value).

  Raises:
    SearchLimitError: the search needed more than max_nodes nodes.
  """
  if max_nodes is None:
    max_nodes = MAX_SEARCH_NODES
  num_dims = len(problem.dim_names)
  steps = _dominant_steps(problem.memory_contents)
  pruning_problem = dataclasses.replace(problem, memory_contents=steps)
  neighbours = [set() for _ in range(num_dims)]
  for dim_set in problem.operation_dim_sets:
    for dim in dim_set:
      neighbours[dim].update(dim_set - {dim})
  largest_split = [
    max((problem.mesh_dims[m][1] for m in valid), default=1)
    for valid in problem.valid_mesh_dims
  ]
  layout: List[Optional[int]] = [None] * num_dims
  best: List = [None, None]  # [objective, layout]
  nodes = [0]

  def lower_bound(depth: int, assigned: int) -> int:
    # Undecided dimensions split as far as any of their mesh dimensions
    # allows, ignoring conflicts: no completion does better.
    divisors = problem.divisors(layout[:depth]) + largest_split[depth:]
    assignable = sum(1 for valid in problem.valid_mesh_dims[depth:] if valid)
    peak = pruning_problem.peak_memory(divisors)
    return problem.scale * peak - assigned - assignable

  def search(depth: int, assigned: int) -> None:
    nodes[0] += 1
    if nodes[0] > max_nodes:
      raise SearchLimitError(
        "the exact layout search visited more than MAX_SEARCH_NODES=%d "
        "partial layouts (%d splittable dimensions, %d mesh dimensions); "
        "install ortools (the `auto_mtf` extra) to solve larger programs"
        % (max_nodes, num_dims, len(problem.mesh_dims))
      )
    if best[0] is not None and lower_bound(depth, assigned) >= best[0]:
      return
    if depth == num_dims:
      value = pruning_problem.objective(tuple(layout))
      if best[0] is None or value < best[0]:
        best[0], best[1] = value, tuple(layout)
      return
    taken = {layout[n] for n in neighbours[depth] if n < depth}
    for mesh_index in problem.valid_mesh_dims[depth]:
      if mesh_index not in taken:
        layout[depth] = mesh_index
        search(depth + 1, assigned + 1)
    layout[depth] = None
    search(depth + 1, assigned)

  search(0, 0)
  return best[1], best[0]
