"""Tests for the schedulers: topological order and the greedy list rule."""

import random

import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow._src.auto_mtf.graph_interface import GraphInterface
from mesh_tensorflow._src.auto_mtf.scheduler import minimize_peak_memory


def _constant(mesh, shape, name):
  return mtf.Constant(
    mesh, 0, shape=mtf.convert_to_shape(shape), dtype=tf.int32, name=name
  ).outputs[0]


def _random_graph(seed):
  """A random DAG of einsums over a few dimensions."""
  rng = random.Random(seed)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  dims = {"a": 2, "b": 3, "c": 4, "d": 5}
  tensors = []
  for i in range(rng.randint(4, 10)):
    shape = mtf.Shape(
      [mtf.Dimension(n, dims[n]) for n in sorted(rng.sample(sorted(dims), 2))]
    )
    if len(tensors) < 2 or rng.random() < 0.3:
      tensors.append(_constant(mesh, shape, "c%d" % i))
    else:
      inputs = rng.sample(tensors, rng.randint(1, 2))
      tensors.append(
        mtf.EinsumOperation(inputs, shape, name="e%d" % i).outputs[0]
      )
  view = GraphInterface(graph)
  view.set_tensor_final(tensors[-1].name)
  return view


def _is_topological(view, schedule):
  position = {op_id: i for i, op_id in enumerate(schedule)}
  names = list(view.get_all_operation_names())
  producer = {
    t: i
    for i, n in enumerate(names)
    for t in view.get_operation_output_names(n)
  }
  return sorted(schedule) == list(range(len(names))) and all(
    position[producer[t]] < position[i]
    for i, n in enumerate(names)
    for t in view.get_operation_input_names(n)
  )


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("algorithm", ["NAIVE", "LIST"])
def test_schedules_are_topological_orders(algorithm, seed):
  view = _random_graph(seed)
  assert _is_topological(view, list(minimize_peak_memory(view, algorithm)))


def test_list_runs_what_frees_most_memory_first():
  # The original's documented example: after X and Y, W (-15 entries) beats
  # Z (-60); then Z (-60 + 12 + 20 freed) beats V (-60 + 15).
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = _constant(mesh, "a:3,b:4", "X")
  y = _constant(mesh, "b:4,c:5", "Y")
  mtf.EinsumOperation([x, y], mtf.convert_to_shape("a:3,b:4,c:5"), name="Z")
  w = mtf.EinsumOperation(
    [x, y], mtf.convert_to_shape("a:3,c:5"), name="W"
  ).outputs[0]
  mtf.BroadcastOperation(w, mtf.convert_to_shape("a:3,b:4,c:5"), name="V")
  view = GraphInterface(graph)
  view.set_tensor_final("Z:0")
  view.set_tensor_final("V:0")
  assert list(minimize_peak_memory(view, "LIST")) == [0, 1, 3, 2, 4]


@pytest.mark.parametrize(
  "final, expected",
  [
    # X (4 entries, final) costs more than Y (3): Y and its user Z first.
    (("X:0", "Z:0"), [1, 2, 0]),
    # Nothing final: X is unused, so it costs nothing and runs first.
    ((), [0, 1, 2]),
  ],
)
def test_list_counts_only_used_or_final_outputs(final, expected):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  _constant(mesh, "a:4", "X")
  y = _constant(mesh, "b:3", "Y")
  mtf.BroadcastOperation(y, mtf.convert_to_shape("b:3,c:2"), name="Z")
  view = GraphInterface(graph)
  for name in final:
    view.set_tensor_final(name)
  assert list(minimize_peak_memory(view, "LIST")) == expected


def test_unknown_algorithm():
  view = _random_graph(0)
  with pytest.raises(NotImplementedError, match="FANCY is not a scheduler"):
    minimize_peak_memory(view, "FANCY")
