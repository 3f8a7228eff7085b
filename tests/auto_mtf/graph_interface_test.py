"""Tests for GraphInterface on tf and mtf graphs."""

import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow._src.auto_mtf.graph_interface import GraphInterface


def _mtf_view():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.Constant(
    mesh, 0, mtf.convert_to_shape("a:3,b:4"), tf.int32, name="X"
  ).outputs[0]
  y = mtf.Constant(
    mesh, 0, mtf.convert_to_shape("b:4,c:5"), tf.int32, name="Y"
  ).outputs[0]
  mtf.EinsumOperation([x, y], mtf.convert_to_shape("a:3,c:5"), name="Z1")
  mtf.EinsumOperation([x, y], mtf.convert_to_shape("a:3,c:5"), name="Z2")
  return GraphInterface(graph)


def _tf_view():
  graph = tf.Graph()
  with graph.as_default(), tf.device("/device:CPU:0"):
    x = tf.zeros([3, 4], dtype=tf.int32, name="X")
    y = tf.zeros([4, 5], dtype=tf.int32, name="Y")
    tf.matmul(x, y, name="Z1")
    tf.matmul(x, y, name="Z2")
  return GraphInterface(graph, canonical_device="/device:CPU:0")


@pytest.mark.parametrize("make_view", [_mtf_view, _tf_view])
def test_names_sizes_and_memory_contents(make_view):
  view = make_view()
  assert list(view.get_all_operation_names()) == ["X", "Y", "Z1", "Z2"]
  assert list(view.get_operation_input_names("Z2")) == ["X:0", "Y:0"]
  assert list(view.get_all_tensor_names()) == ["X:0", "Y:0", "Z1:0", "Z2:0"]
  assert view.get_tensor_shape("Y:0") == tf.TensorShape([4, 5])
  assert view.get_tensor_size("Y:0") == 4 * 20
  view.set_tensor_final("Z1:0")
  assert view.is_tensor_final("Z1:0") and not view.is_tensor_final("Z2:0")
  # Z2 is not final and unused: freed right after it runs; X and Y after
  # their last user.
  assert view.compute_memory_contents_under_schedule([0, 1, 3, 2]) == [
    {"X:0"},
    {"X:0", "Y:0"},
    {"X:0", "Y:0", "Z2:0"},
    {"X:0", "Y:0", "Z1:0"},
  ]
  cost_graph = view.compute_cost_graph()
  assert [n.name for n in cost_graph.node] == ["X", "Y", "Z1", "Z2"]
  assert [n.is_final for n in cost_graph.node] == [False, False, True, False]
  assert [
    (i.preceding_node, i.preceding_port) for i in cost_graph.node[2].input_info
  ] == [(0, 0), (1, 0)]
  assert cost_graph.node[1].output_info[0].size == 80


def test_mtf_dimensions_and_split_sizes():
  view = _mtf_view()
  assert view.get_tensor_mtf_dimension_names("X:0") == ["a", "b"]
  assert view.get_operation_mtf_dimension_names("Z1") == {"a", "b", "c"}
  assert view.get_tensor_device("X:0") is None
  assert view.is_tensor_on_canonical_device("X:0")
  # 12 entries, a split 2 ways -> 6, b split 4 ways -> 2 (rounded up).
  assert (
    view.get_tensor_num_entries("X:0", {"a": "m", "b": "n"}, {"m": 2, "n": 4})
    == 2
  )
  assert view.get_tensor_num_entries("X:0", {"a": "m"}, {"m": 2}) == 6
  # 15 entries of Z1, a (size 3) split 2 ways: ceil(15 / 2).
  assert view.get_tensor_num_entries("Z1:0", {"a": "m"}, {"m": 2}) == 8


def test_tf_devices():
  view = _tf_view()
  assert view.get_tensor_device("X:0") == "/device:CPU:0"
  assert view.get_tensor_mtf_dimension_names("X:0") == []
  other = GraphInterface(view._graph, canonical_device="/device:CPU:1")  # pylint: disable=protected-access
  assert not other.is_tensor_on_canonical_device("X:0")
  # Outputs on devices not listed get size 0.
  assert other.compute_cost_graph(devices=[]).node[0].output_info[0].size == 0


def test_not_a_graph():
  with pytest.raises(TypeError, match="not tf.Graph or mtf.Graph"):
    GraphInterface("hello")
