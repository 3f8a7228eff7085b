"""Tests for LayoutOptimizer: exhaustive search, both solvers, the original."""

import contextlib
import functools
import io
import itertools
import random

import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow._src.auto_mtf import cp_sat
from mesh_tensorflow._src.auto_mtf import exact_solver
from mesh_tensorflow._src.auto_mtf.layout_optimizer import LayoutOptimizer
from mesh_tensorflow._src.auto_mtf.layout_optimizer import SolverError
from mesh_tensorflow._src.auto_mtf.layout_optimizer import generate_assignments
from mesh_tensorflow._src.auto_mtf.layout_optimizer import local_var_name
from mesh_tensorflow._src.auto_mtf.memory_estimator import MemoryEstimator

needs_ortools = pytest.mark.skipif(
  not cp_sat.ortools_available(), reason="ortools is not installed"
)


def _einsum_graph():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, "a:10,b:5")
  y = mtf.zeros(mesh, "b:5,c:20")
  return graph, [mtf.einsum([x, y], "a:10,c:20")]


def _symmetric_graph():
  # a and b are interchangeable: the optimum is not unique.
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, "a:4,b:4")
  return graph, [mtf.relu(x * 2.0)]


def _chain_graph():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, "batch:8,hidden:6,d:4", dtype=tf.float32)
  w = mtf.zeros(mesh, "d:4,ff:12")
  h = mtf.relu(mtf.einsum([x, w], "batch:8,hidden:6,ff:12"))
  out = mtf.reduce_sum(h, reduced_dim=mtf.Dimension("hidden", 6))
  return graph, [out]


def _random_graph(seed):
  """Twelve zeros and einsums over up to six dimensions."""
  rng = random.Random(seed)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  sizes = {"a": 8, "b": 4, "c": 6, "d": 2, "e": 16, "f": 12}
  tensors = []
  for _ in range(12):
    names = sorted(rng.sample(sorted(sizes), rng.randint(1, 3)))
    shape = mtf.Shape([mtf.Dimension(n, sizes[n]) for n in names])
    if len(tensors) < 2 or rng.random() < 0.3:
      tensors.append(mtf.zeros(mesh, shape))
    else:
      tensors.append(mtf.einsum(rng.sample(tensors, 2), output_shape=shape))
  return graph, [tensors[-1]]


GRAPHS = {
  "einsum": _einsum_graph,
  "symmetric": _symmetric_graph,
  "chain": _chain_graph,
  "random0": functools.partial(_random_graph, 0),
  "random1": functools.partial(_random_graph, 1),
  "random4": functools.partial(_random_graph, 4),
}
MESH_SHAPES = ("m1:4", "m1:4;m2:2", "m1:2;m2:2", "m1:4;m2:2;m3:1")


def _optimizer(graph_name, mesh_shape, solver):
  graph, outputs = GRAPHS[graph_name]()
  estimator = MemoryEstimator(graph, mtf.convert_to_shape(mesh_shape), outputs)
  optimizer = LayoutOptimizer(estimator)
  optimizer.solver = solver
  return optimizer, estimator


def _exhaustive_best(optimizer, estimator):
  """The first layout of minimum objective over every valid layout.

  Layouts are enumerated dimension by dimension in name order, each trying
  the mesh dimensions in mesh order and then "unassigned", and scored with
  the original's objective: (#dims + 1) * peak memory - #assigned.
  """
  validator = estimator.get_layout_validator()
  graph = estimator.get_graph_interface()
  dims = sorted(validator.splittable_mtf_dimension_names)
  mesh = list(validator.mesh_dimension_name_to_size)
  op_dim_sets = [
    graph.get_operation_mtf_dimension_names(name)
    for name in graph.get_all_operation_names()
  ]
  best = None
  choices = [
    [m for m in mesh if validator.is_valid_assignment(d, m)] + [None]
    for d in dims
  ]
  for combination in itertools.product(*choices):
    layout = {d: m for d, m in zip(dims, combination) if m is not None}
    if any(
      len({layout[d] for d in s if d in layout}) < sum(d in layout for d in s)
      for s in op_dim_sets
    ):
      continue
    layout_string = ";".join(sorted("%s:%s" % kv for kv in layout.items()))
    value = (len(dims) + 1) * optimizer.evaluate_layout(layout_string) - len(
      layout
    )
    if best is None or value < best[0]:
      best = (value, layout_string)
  return best[1]


@pytest.mark.parametrize("mesh_shape", MESH_SHAPES)
@pytest.mark.parametrize("graph_name", sorted(GRAPHS))
def test_exact_solver_matches_exhaustive_search(graph_name, mesh_shape):
  optimizer, estimator = _optimizer(graph_name, mesh_shape, "exact")
  assert optimizer.solve() == _exhaustive_best(optimizer, estimator)


@needs_ortools
@pytest.mark.parametrize("mesh_shape", ("m1:4;m2:2", "m1:2;m2:2"))
@pytest.mark.parametrize("graph_name", ["chain", "random0", "symmetric"])
def test_cp_sat_and_exact_solvers_agree(graph_name, mesh_shape):
  layouts = {}
  for solver in ("cp_sat", "exact"):
    optimizer, _ = _optimizer(graph_name, mesh_shape, solver)
    layouts[solver] = optimizer.solve()
    assert optimizer._cp_solver.solver_name == solver  # pylint: disable=protected-access
  assert layouts["cp_sat"] == layouts["exact"]


def test_original_examples():
  # The original's documented results: cut a and c to equal sizes, and give
  # the size-1 mesh dimension to b (more splits at equal memory).
  optimizer, _ = _optimizer("einsum", "m1:4;m2:2", "exact")
  assert optimizer.solve() == "a:m2;c:m1"
  # Peak: x (50 entries) and y (100 entries) are freed when z is made, but
  # z (200 entries, final) coexists with them: 4 * (50 + 100 + 200) bytes
  # unsplit; a:m2, c:m1 divide x by 2, y by 4 and z by 8.
  assert optimizer.evaluate_layout("") == 4.0 * (50 + 100 + 200)
  assert optimizer.evaluate_layout("a:m2;c:m1") == 4.0 * (25 + 25 + 25)
  optimizer, _ = _optimizer("einsum", "m1:4;m2:2;m3:1", "exact")
  assert optimizer.solve() == "a:m2;b:m3;c:m1"


def test_symmetric_optimum_takes_the_first_dimension_first():
  optimizer, _ = _optimizer("symmetric", "m1:2;m2:2", "exact")
  assert optimizer.solve() == "a:m1;b:m2"


def test_print_solution_lists_variables_and_objective():
  optimizer, _ = _optimizer("einsum", "m1:4;m2:2", "exact")
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    optimizer.solve(print_solution=True)
  text = out.getvalue()
  assert "  x_(a:m2) = 1\n" in text
  assert "  x_(a:m1) = 0\n" in text
  assert "  z = 300\n" in text  # bytes: 4 * (25 + 25 + 25)
  assert "Minimize: - 1 * x_(a:m1) - 1 * x_(a:m2)" in text
  assert "- 1 * x_(c:m2) + 4 * z\n" in text
  # 4 * 300 - 2 assigned dimensions.
  assert "Objective value: 1198.0" in text


def test_search_limit_raises_solver_error(monkeypatch):
  monkeypatch.setattr(exact_solver, "MAX_SEARCH_NODES", 2)
  optimizer, _ = _optimizer("chain", "m1:4;m2:2", "exact")
  with pytest.raises(SolverError, match="MAX_SEARCH_NODES=2"):
    optimizer.solve()


def test_unknown_solver():
  optimizer, _ = _optimizer("einsum", "m1:4", "gurobi")
  with pytest.raises(ValueError, match="unknown solver 'gurobi'"):
    optimizer.solve()


def test_model_size_does_not_grow_with_repeated_operations():
  graph, _ = _einsum_graph()
  x, y = graph.operations[0].outputs[0], graph.operations[1].outputs[0]
  for _ in range(50):
    mtf.einsum([x, y], "a:10,c:20")
  estimator = MemoryEstimator(graph, mtf.convert_to_shape("m1:4;m2:2"))
  optimizer = LayoutOptimizer(estimator)
  assert len(optimizer._model.Proto().variables) <= 50  # pylint: disable=protected-access


def test_generate_assignments():
  assignments = generate_assignments({"s1", "s2", "s3"}, {"m1": 4, "m2": 8})
  # 1 empty, 3 * 2 with one dimension, 3 * 2 with two.
  assert len(assignments) == 13
  assert assignments[0] == {}
  assert {"s1": "m2", "s2": "m1"} in assignments
  assert {"s1": "m2", "s3": "m2"} not in assignments


def test_local_var_name():
  assert local_var_name(frozenset(), {}) == "y_()"
  assert local_var_name({"hidden", "channel"}, {"channel": "y"}) == (
    "y_(channel:y,hidden)"
  )
