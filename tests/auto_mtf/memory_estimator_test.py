"""Tests for MemoryEstimator."""

import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow._src.auto_mtf.memory_estimator import MemoryEstimator


def test_memory_estimator_marks_outputs_final():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.Constant(mesh, 0, mtf.convert_to_shape("a:3,b:4"), tf.int32, "X")
  z = mtf.reduce_sum(x.outputs[0], reduced_dim=mtf.Dimension("b", 4))
  estimator = MemoryEstimator(graph, mtf.convert_to_shape("m:3"), [z])
  view = estimator.get_graph_interface()
  assert view is estimator.get_graph_interface()
  assert view.is_tensor_final(z.name) and not view.is_tensor_final("X:0")
  validator = estimator.get_layout_validator()
  assert validator.is_valid_assignment("a", "m")
  assert not validator.is_valid_assignment("b", "m")
