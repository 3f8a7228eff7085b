"""Which Mesh TensorFlow dimensions may go to which mesh dimensions.

A dimension may be split over a mesh dimension only if no operation forbids
splitting it (`Operation.unsplittable_dims`, e.g. the concatenation dimension
of a concat), it is not anonymous (`_anonymous_*` names are internal), and the
mesh dimension's size divides every size the dimension has in the graph.
"""

from __future__ import annotations

import math
import re
from typing import Dict, Set

from mesh_tensorflow._src.graph import Graph
from mesh_tensorflow._src.shapes import Shape

_ANONYMOUS_DIM_NAME = re.compile(r"_anonymous_\d*")


class LayoutValidator:
  """Validates potential layouts of one mtf graph on one mesh shape.

  Attributes:
    splittable_mtf_dimension_names: set of the names of the dimensions that
      may be assigned to a mesh dimension.
    mesh_dimension_name_to_size: {mesh dimension name: size}.

  Example:
    >>> graph = mtf.Graph()
    >>> mesh = mtf.Mesh(graph, "mesh")
    >>> _ = mtf.zeros(mesh, "batch:6,hidden:8")
    >>> validator = LayoutValidator(graph, mtf.convert_to_shape("m:4"))
    >>> sorted(validator.splittable_mtf_dimension_names)
    ['batch', 'hidden']
    >>> validator.is_valid_assignment("batch", "m")  # 4 does not divide 6
    False
    >>> validator.is_valid_assignment("hidden", "m")
    True
  """

  def __init__(self, mtf_graph: Graph, mesh_shape: Shape):
    """Collects the graph's dimensions and the mesh's sizes.

    Args:
      mtf_graph: the mtf.Graph whose layout is sought.
      mesh_shape: an mtf.Shape, the mesh.
    """
    dim_names = set()
    self._size_gcd: Dict[str, int] = {}
    unsplittable = set()
    for operation in mtf_graph.operations:
      unsplittable.update(operation.unsplittable_dims)
      for tensor in operation.outputs:
        for dim in tensor.shape.dims:
          if not _ANONYMOUS_DIM_NAME.match(dim.name):
            dim_names.add(dim.name)
          self._size_gcd[dim.name] = math.gcd(
            self._size_gcd.get(dim.name, dim.size), dim.size
          )
    self._splittable = dim_names - unsplittable
    self._mesh_sizes = {dim.name: dim.size for dim in mesh_shape.dims}

  @property
  def splittable_mtf_dimension_names(self) -> Set[str]:
    """The names of the dimensions a layout may assign."""
    return self._splittable

  @property
  def mesh_dimension_name_to_size(self) -> Dict[str, int]:
    """{mesh dimension name: size}, in mesh order."""
    return self._mesh_sizes

  def is_valid_assignment(
    self, mtf_dimension_name: str, mesh_dimension_name: str
  ) -> bool:
    """Whether the dimension may be split over the mesh dimension.

    Args:
      mtf_dimension_name: the name of a Mesh TensorFlow dimension.
      mesh_dimension_name: the name of a mesh dimension.

    Returns:
      True if the dimension is splittable and the mesh dimension's size
      divides all its sizes.
    """
    return (
      mtf_dimension_name in self._splittable
      and self._size_gcd[mtf_dimension_name]
      % self._mesh_sizes[mesh_dimension_name]
      == 0
    )
