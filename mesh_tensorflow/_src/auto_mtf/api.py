"""Computes a layout (and a mesh shape) for an mtf graph automatically.

`layout` finds the layout rules that minimize per-device peak memory on a
given mesh shape; `layout_and_mesh_shape` also tries every mesh shape of a
number of machines (a power of two) and keeps the best.
"""

from __future__ import annotations

from typing import Iterable, Iterator, List, Optional, Tuple

from absl import logging

from mesh_tensorflow._src.auto_mtf.layout_optimizer import LayoutOptimizer
from mesh_tensorflow._src.auto_mtf.memory_estimator import MemoryEstimator
from mesh_tensorflow._src.graph import Graph
from mesh_tensorflow._src.graph import Tensor
from mesh_tensorflow._src.layout import LayoutRules
from mesh_tensorflow._src.layout import convert_to_layout_rules
from mesh_tensorflow._src.shapes import Dimension
from mesh_tensorflow._src.shapes import Shape
from mesh_tensorflow._src.shapes import convert_to_shape


def layout(
  mtf_graph: Graph, mesh_shape, mtf_outputs: Iterable[Tensor] = ()
) -> LayoutRules:
  """The layout rules that minimize peak memory of a graph on a mesh shape.

  Args:
    mtf_graph: an mtf.Graph.
    mesh_shape: an mtf.Shape, a string or a list of mtf.Dimension.
    mtf_outputs: optional output tensors of the computation (they are never
      freed, which matters to the optimization).

  Returns:
    an mtf.LayoutRules.

  Example:
    >>> graph = mtf.Graph()
    >>> mesh = mtf.Mesh(graph, "mesh")
    >>> x = mtf.zeros(mesh, "a:10,b:5")
    >>> y = mtf.zeros(mesh, "b:5,c:20")
    >>> z = mtf.einsum([x, y], "a:10,c:20")
    >>> layout(graph, "m1:4;m2:2", [z])  # split a 2 ways and c 4 ways
    LayoutRules([('a', 'm2'), ('c', 'm1')])
  """
  estimator = MemoryEstimator(
    mtf_graph, convert_to_shape(mesh_shape), mtf_outputs
  )
  return convert_to_layout_rules(LayoutOptimizer(estimator).solve())


def layout_and_mesh_shape(
  mtf_graph: Graph,
  num_machines: int,
  mtf_outputs: Iterable[Tensor] = (),
  max_mesh_shape_dimensions: Optional[int] = 2,
) -> Tuple[Optional[LayoutRules], Optional[Shape]]:
  """The best (layout rules, mesh shape) over the mesh shapes of num_machines.

  Each mesh shape of mesh_shape_iterator(num_machines,
  max_mesh_shape_dimensions), named "mesh_0", "mesh_1", ..., gets its optimal
  layout; the pair of lowest peak memory wins (the first on ties). Fewer mesh
  dimensions make the search faster.

  Args:
    mtf_graph: an mtf.Graph.
    num_machines: the number of machines, a power of two.
    mtf_outputs: optional output tensors of the computation.
    max_mesh_shape_dimensions: optional largest number of mesh dimensions
      (None: no limit). For example 1024 machines and 2 try "mesh_0:1024",
      "mesh_0:512;mesh_1:2", ..., "mesh_0:32;mesh_1:32".

  Returns:
    an (mtf.LayoutRules, mtf.Shape) tuple.
  """
  best_value = None
  best = (None, None)
  for sizes in mesh_shape_iterator(num_machines, max_mesh_shape_dimensions):
    mesh_shape = Shape(
      [Dimension("mesh_{}".format(i), size) for i, size in enumerate(sizes)]
    )
    logging.info("Computing layout for mesh shape: %s", mesh_shape)
    estimator = MemoryEstimator(mtf_graph, mesh_shape, mtf_outputs)
    optimizer = LayoutOptimizer(estimator)
    layout_string = optimizer.solve()
    value = optimizer.evaluate_layout(layout_string)
    if best_value is None or value < best_value:
      best_value = value
      best = (convert_to_layout_rules(layout_string), mesh_shape)
  return best


def mesh_shape_iterator(
  num_machines: int, max_mesh_shape_dimensions: Optional[int] = None
) -> Iterator[List[int]]:
  """The mesh shapes of num_machines machines, sizes non-increasing.

  Every size is a power of two of at least 2 (except [1] for one machine).
  Shapes come in decreasing lexicographic order: 8 gives [8], [4, 2],
  [2, 2, 2].

  Args:
    num_machines: the number of machines, a power of two.
    max_mesh_shape_dimensions: optional largest number of dimensions (None:
      no limit).

  Yields:
    a list of dimension sizes.

  Example:
    >>> list(mesh_shape_iterator(16, 3))
    [[16], [8, 2], [4, 4], [4, 2, 2]]
  """
  if num_machines == 1:
    yield [1]
    return

  limit = max_mesh_shape_dimensions

  def partitions(remaining: int, largest: int, length: int):
    # Non-increasing lists of powers of two (>= 2, <= largest) whose product
    # is `remaining`, largest first, of at most `limit - length` entries.
    if remaining == 1:
      yield []
      return
    if limit is not None and length >= limit:
      return
    size = min(largest, remaining)
    while size >= 2:
      if remaining % size == 0:
        for rest in partitions(remaining // size, size, length + 1):
          yield [size] + rest
      size //= 2

  yield from partitions(num_machines, num_machines, 0)
