"""Tests for the exact layout search: against enumerating every layout."""

import itertools
import random

import pytest

from mesh_tensorflow._src.auto_mtf import exact_solver


def _all_layouts(problem):
  """Every valid layout, in the solver's lexicographic preference order."""
  choices = [list(valid) + [None] for valid in problem.valid_mesh_dims]
  for layout in itertools.product(*choices):
    if all(
      len({layout[d] for d in dim_set if layout[d] is not None})
      == sum(layout[d] is not None for d in dim_set)
      for dim_set in problem.operation_dim_sets
    ):
      yield layout


def _brute_force(problem):
  """The first layout of minimum objective, by enumeration."""
  return min(_all_layouts(problem), key=problem.objective)


def _random_problem(rng):
  num_dims = rng.randint(1, 4)
  mesh_dims = tuple(
    ("m%d" % i, rng.choice([1, 2, 3, 4])) for i in range(rng.randint(1, 3))
  )
  valid = tuple(
    tuple(m for m in range(len(mesh_dims)) if rng.random() < 0.7)
    for _ in range(num_dims)
  )
  tensors = []
  for _ in range(rng.randint(1, 5)):
    dims = rng.sample(range(num_dims), rng.randint(0, num_dims))
    tensors.append(
      exact_solver.TensorCost(
        rng.choice([1, 4]), rng.randint(1, 60), tuple(dims)
      )
    )
  operation_dim_sets = tuple(frozenset(t.dims) for t in tensors)
  steps = tuple(
    tuple(rng.sample(range(len(tensors)), rng.randint(1, len(tensors))))
    for _ in range(rng.randint(1, 4))
  )
  return exact_solver.LayoutProblem(
    dim_names=tuple("d%d" % i for i in range(num_dims)),
    mesh_dims=mesh_dims,
    valid_mesh_dims=valid,
    operation_dim_sets=operation_dim_sets,
    tensors=tuple(tensors),
    memory_contents=steps,
    scale=num_dims + 1,
  )


@pytest.mark.parametrize("seed", range(60))
def test_matches_enumeration_of_all_layouts(seed):
  problem = _random_problem(random.Random(seed))
  expected = _brute_force(problem)
  layout, value = exact_solver.solve(problem)
  assert layout == expected
  assert value == problem.objective(expected)


def test_tensor_size_rounds_up_at_every_split():
  problem = _random_problem(random.Random(0))
  tensor = exact_solver.TensorCost(4, 10, (0, 1))
  assert problem.tensor_size(tensor, [3, 2]) == 4 * 2  # ceil(ceil(10/3)/2)


def test_prefers_more_splits_at_equal_memory():
  # One tensor over d0 and d1; d1 can only go to the size-1 mesh dimension,
  # which saves no memory but counts as a split.
  problem = exact_solver.LayoutProblem(
    dim_names=("d0", "d1"),
    mesh_dims=(("m0", 2), ("m1", 1)),
    valid_mesh_dims=((0, 1), (1,)),
    operation_dim_sets=(frozenset({0, 1}),),
    tensors=(exact_solver.TensorCost(1, 8, (0, 1)),),
    memory_contents=((0,),),
    scale=3,
  )
  assert exact_solver.solve(problem) == ((0, 1), 3 * 4 - 2)


def test_search_limit_names_the_limit():
  problem = _random_problem(random.Random(3))
  with pytest.raises(
    exact_solver.SearchLimitError, match="MAX_SEARCH_NODES=1 "
  ):
    exact_solver.solve(problem, max_nodes=1)
