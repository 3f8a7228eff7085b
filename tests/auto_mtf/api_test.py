"""Tests for mesh_tensorflow.auto_mtf's layout() and layout_and_mesh_shape()."""

import pytest

import mesh_tensorflow as mtf
from mesh_tensorflow._src.auto_mtf.api import mesh_shape_iterator
import mesh_tensorflow.auto_mtf  # pylint: disable=unused-import


def _all_mesh_shapes(num_machines, max_dims):
  """Non-increasing power-of-two factorizations, by plain enumeration."""
  shapes = []

  def extend(prefix, product):
    if product == num_machines:
      shapes.append(prefix)
      return
    size = 2
    while product * size <= num_machines:
      if not prefix or size <= prefix[-1]:
        extend(prefix + [size], product * size)
      size *= 2

  extend([], 1)
  return [s for s in shapes if max_dims is None or len(s) <= max_dims]


@pytest.mark.parametrize("max_dims", [None, 1, 2, 3])
@pytest.mark.parametrize("num_machines", [2, 4, 8, 64, 512])
def test_mesh_shape_iterator_lists_every_shape_once(num_machines, max_dims):
  shapes = list(mesh_shape_iterator(num_machines, max_dims))
  assert sorted(shapes) == sorted(_all_mesh_shapes(num_machines, max_dims))
  assert shapes == sorted(shapes, reverse=True)


def test_mesh_shape_iterator_one_machine():
  assert list(mesh_shape_iterator(1)) == [[1]]
  assert len(list(mesh_shape_iterator(512))) == 30  # as the original lists


def _einsum_graph():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, "a:10,b:5")
  y = mtf.zeros(mesh, "b:5,c:20")
  return graph, mtf.einsum([x, y], "a:10,c:20")


def test_layout_and_mesh_shape():
  graph, z = _einsum_graph()
  layout = mtf.auto_mtf.layout(graph, "m1:4;m2:2", [z])
  assert list(layout) == [("a", "m2"), ("c", "m1")]
  layout, mesh_shape = mtf.auto_mtf.layout_and_mesh_shape(graph, 8, [z])
  assert mesh_shape == mtf.convert_to_shape("mesh_0:4;mesh_1:2")
  assert list(layout) == [("a", "mesh_1"), ("c", "mesh_0")]
  # One mesh dimension of 8 divides none of a, b, c.
  layout, mesh_shape = mtf.auto_mtf.layout_and_mesh_shape(graph, 8, [z], 1)
  assert mesh_shape == mtf.convert_to_shape("mesh_0:8")
  assert list(layout) == []
