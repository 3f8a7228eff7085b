"""Tests for LayoutValidator."""

import mesh_tensorflow as mtf
from mesh_tensorflow._src.auto_mtf.valid_layouts import LayoutValidator


def test_splittable_dimensions_and_divisibility():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  a, b = mtf.Dimension("a", 5), mtf.Dimension("b", 10)
  x1 = mtf.zeros(mesh, mtf.Shape([a, b, mtf.Dimension("concat", 15)]))
  x2 = mtf.zeros(mesh, mtf.Shape([a, b, mtf.Dimension("concat", 20)]))
  mtf.concat([x1, x2], "concat")
  mtf.zeros(mesh, mtf.anonymous_shape(mtf.Shape([a, b])))
  # b also appears with size 6: only sizes dividing gcd(10, 6) = 2 fit.
  mtf.zeros(mesh, "b:6")
  validator = LayoutValidator(graph, mtf.convert_to_shape("m1:4;m2:2"))
  # concat is unsplittable; anonymous dimensions never count.
  assert validator.splittable_mtf_dimension_names == {"a", "b"}
  assert validator.mesh_dimension_name_to_size == {"m1": 4, "m2": 2}
  assert not validator.is_valid_assignment("a", "m2")
  assert validator.is_valid_assignment("b", "m2")
  assert not validator.is_valid_assignment("b", "m1")
  assert not validator.is_valid_assignment("concat", "m2")
