"""Memory cost of an mtf graph, estimated from the sizes of its mtf tensors.

One mtf operation may lower to several TensorFlow operations with temporary
tensors, but the mtf tensors alone are a quick approximation of the memory a
layout needs, and need no lowering.
"""

from __future__ import annotations

from typing import Iterable, Optional

from mesh_tensorflow._src.auto_mtf.graph_interface import GraphInterface
from mesh_tensorflow._src.auto_mtf.valid_layouts import LayoutValidator
from mesh_tensorflow._src.graph import Graph
from mesh_tensorflow._src.graph import Tensor
from mesh_tensorflow._src.shapes import Shape


class MemoryEstimator:
  """The graph view and layout validator of one graph on one mesh shape.

  Attributes:
    mtf_graph: the mtf.Graph.
    mesh_shape: the mtf.Shape of the mesh.
    mtf_outputs: the output tensors of the computation (never freed).

  Example:
    >>> graph = mtf.Graph()
    >>> mesh = mtf.Mesh(graph, "mesh")
    >>> y = mtf.reduce_sum(mtf.zeros(mesh, "a:4,b:6"), reduced_dim=mtf.Dimension("b", 6))
    >>> estimator = MemoryEstimator(graph, mtf.convert_to_shape("m:2"), [y])
    >>> estimator.get_graph_interface().is_tensor_final(y.name)
    True
    >>> sorted(estimator.get_layout_validator().splittable_mtf_dimension_names)
    ['a', 'b']
  """

  def __init__(
    self,
    mtf_graph: Graph,
    mesh_shape: Shape,
    mtf_outputs: Iterable[Tensor] = (),
  ):
    """Stores the graph; the views are built on first use.

    Args:
      mtf_graph: an mtf.Graph.
      mesh_shape: an mtf.Shape.
      mtf_outputs: optional output tensors of the computation.
    """
    self.mtf_graph = mtf_graph
    self.mesh_shape = mesh_shape
    self.mtf_outputs = mtf_outputs
    self._layout_validator: Optional[LayoutValidator] = None
    self._graph_interface: Optional[GraphInterface] = None

  def get_layout_validator(self) -> LayoutValidator:
    """The LayoutValidator of the graph and mesh shape (built once).

    Returns:
      a LayoutValidator.
    """
    if self._layout_validator is None:
      self._layout_validator = LayoutValidator(self.mtf_graph, self.mesh_shape)
    return self._layout_validator

  def get_graph_interface(self) -> GraphInterface:
    """The GraphInterface of the graph, outputs marked final (built once).

    Returns:
      a GraphInterface.
    """
    if self._graph_interface is None:
      self._graph_interface = GraphInterface(self.mtf_graph)
      for tensor in self.mtf_outputs:
        self._graph_interface.set_tensor_final(tensor.name)
    return self._graph_interface
