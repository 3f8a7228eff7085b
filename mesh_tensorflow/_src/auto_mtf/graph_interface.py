"""One read-only view of a tf.Graph or an mtf.Graph for the layout optimizer.

Operations and tensors are named by strings (tensor names "<op>:<index>"), so
the scheduler and the optimizer work the same on both kinds of graph. The view
also builds a CostGraphDef proto and replays a schedule to list the tensors in
memory at each step.
"""

from __future__ import annotations

import collections
from typing import Dict, FrozenSet, Iterator, List, Optional, Sequence, Set

import tensorflow as tf
from tensorflow.core.framework import cost_graph_pb2

from mesh_tensorflow._src.graph import Graph as MtfGraph
from mesh_tensorflow._src.graph import Tensor as MtfTensor


class GraphInterface:
  """tf.Graph and mtf.Graph behind one interface; produces a CostGraphDef.

  Attributes:
    canonical_device: the name of the device whose memory counts (see
      is_tensor_on_canonical_device), or None.

  Example:
    >>> graph = mtf.Graph()
    >>> mesh = mtf.Mesh(graph, "mesh")
    >>> x = mtf.zeros(mesh, "a:3,b:4")
    >>> view = GraphInterface(graph)
    >>> list(view.get_all_operation_names()), list(view.get_all_tensor_names())
    (['constant'], ['constant:0'])
    >>> view.get_tensor_size(x.name)  # 12 float32 entries
    48
    >>> view.get_tensor_size(x.name, {"a": "m"}, {"m": 3})  # a split 3 ways
    16
  """

  def __init__(self, graph, canonical_device: Optional[str] = None):
    """Indexes the graph's operations and tensors by name.

    Args:
      graph: a tf.Graph or an mtf.Graph.
      canonical_device: optional name of the device whose memory counts.

    Raises:
      TypeError: graph is neither a tf.Graph nor an mtf.Graph.
    """
    if isinstance(graph, tf.Graph):
      operations = graph.get_operations()
    elif isinstance(graph, MtfGraph):
      operations = list(graph.operations)
    else:
      raise TypeError(
        "Graph is not tf.Graph or mtf.Graph: {}".format(type(graph))
      )
    self._graph = graph
    self.canonical_device = canonical_device
    self._operations = operations
    self._operation_ids = {op.name: i for i, op in enumerate(operations)}
    self._tensor_ids = {
      tensor.name: (i, j)
      for i, op in enumerate(operations)
      for j, tensor in enumerate(op.outputs)
    }
    self._final_tensor_names: Set[str] = set()

  def get_num_operations(self) -> int:
    """The number of operations in the graph.

    Returns:
      an integer.
    """
    return len(self._operations)

  def get_all_operation_names(self) -> Iterator[str]:
    """The names of all operations, in graph order.

    Yields:
      an operation name.
    """
    for operation in self._operations:
      yield operation.name

  def get_operation_input_names(self, operation_name: str) -> Iterator[str]:
    """The names of an operation's input tensors, in order.

    Args:
      operation_name: the name of an operation of the graph.

    Yields:
      a tensor name.
    """
    for tensor in self._operation(operation_name).inputs:
      yield tensor.name

  def get_operation_output_names(self, operation_name: str) -> Iterator[str]:
    """The names of an operation's output tensors, in order.

    Args:
      operation_name: the name of an operation of the graph.

    Yields:
      a tensor name.
    """
    for tensor in self._operation(operation_name).outputs:
      yield tensor.name

  def get_all_tensor_names(self) -> Iterator[str]:
    """The names of all tensors (the outputs of each operation in order).

    Yields:
      a tensor name.
    """
    for operation in self._operations:
      for tensor in operation.outputs:
        yield tensor.name

  def get_tensor_dtype(self, tensor_name: str) -> tf.DType:
    """A tensor's dtype.

    Args:
      tensor_name: the name of a tensor of the graph.

    Returns:
      a tf.DType.
    """
    return self._tensor(tensor_name).dtype

  def get_tensor_shape(self, tensor_name: str) -> tf.TensorShape:
    """A tensor's (global) shape.

    Args:
      tensor_name: the name of a tensor of the graph.

    Returns:
      a tf.TensorShape.
    """
    tensor = self._tensor(tensor_name)
    if isinstance(tensor, MtfTensor):
      return tf.TensorShape(tensor.shape.to_integer_list)
    return tensor.shape

  def get_tensor_num_entries(
    self,
    tensor_name: str,
    partial_layout: Optional[Dict[str, str]] = None,
    mesh_dimension_to_size: Optional[Dict[str, int]] = None,
  ) -> int:
    """The number of entries of a tensor, or of its slice on one device.

    Args:
      tensor_name: the name of a tensor of the graph.
      partial_layout: optional {mtf dimension name: mesh dimension name}; if
        given, the entries of one device's slice are counted (rounded up at
        each split dimension).
      mesh_dimension_to_size: {mesh dimension name: size}, required with
        partial_layout.

    Returns:
      an integer.
    """
    num_entries = 1
    for size in self.get_tensor_shape(tensor_name).as_list():
      num_entries *= size
    if not partial_layout:
      return num_entries
    for dim_name in self.get_tensor_mtf_dimension_names(tensor_name):
      if dim_name in partial_layout:
        split = mesh_dimension_to_size[partial_layout[dim_name]]
        num_entries = -(-num_entries // split)
    return num_entries

  def get_tensor_size(
    self,
    tensor_name: str,
    partial_layout: Optional[Dict[str, str]] = None,
    mesh_dimension_to_size: Optional[Dict[str, int]] = None,
  ) -> int:
    """The size in bytes of a tensor, or of its slice on one device.

    Args:
      tensor_name: the name of a tensor of the graph.
      partial_layout: optional {mtf dimension name: mesh dimension name}, as in
        get_tensor_num_entries.
      mesh_dimension_to_size: {mesh dimension name: size}, required with
        partial_layout.

    Returns:
      an integer.
    """
    return self.get_tensor_dtype(tensor_name).size * (
      self.get_tensor_num_entries(
        tensor_name, partial_layout, mesh_dimension_to_size
      )
    )

  def get_tensor_device(self, tensor_name: str) -> Optional[str]:
    """A tensor's device (only TensorFlow tensors have one).

    Args:
      tensor_name: the name of a tensor of the graph.

    Returns:
      the device name, or None for an mtf tensor.
    """
    tensor = self._tensor(tensor_name)
    return None if isinstance(tensor, MtfTensor) else tensor.device

  def is_tensor_on_canonical_device(self, tensor_name: str) -> bool:
    """Whether a tensor lives on the canonical device.

    A tensor without a device counts as being on every device.

    Args:
      tensor_name: the name of a tensor of the graph.

    Returns:
      a boolean.
    """
    device = self.get_tensor_device(tensor_name)
    return not device or device == self.canonical_device

  def get_operation_device(self, operation_name: str) -> Optional[str]:
    """An operation's device (only TensorFlow operations have one).

    Args:
      operation_name: the name of an operation of the graph.

    Returns:
      the device name, or None for an mtf operation.
    """
    operation = self._operation(operation_name)
    return operation.device if isinstance(operation, tf.Operation) else None

  def get_tensor_mtf_dimension_names(self, tensor_name: str) -> List[str]:
    """The names of a tensor's mtf dimensions (none for a tf tensor).

    Args:
      tensor_name: the name of a tensor of the graph.

    Returns:
      a list of dimension names, in the tensor's order.
    """
    tensor = self._tensor(tensor_name)
    if isinstance(tensor, MtfTensor):
      return tensor.shape.dimension_names
    return []

  def get_operation_mtf_dimension_names(self, operation_name: str) -> Set[str]:
    """The mtf dimension names of an operation's inputs and outputs.

    Args:
      operation_name: the name of an operation of the graph.

    Returns:
      a set of dimension names.
    """
    names = set()
    for tensor_name in self.get_operation_input_names(operation_name):
      names.update(self.get_tensor_mtf_dimension_names(tensor_name))
    for tensor_name in self.get_operation_output_names(operation_name):
      names.update(self.get_tensor_mtf_dimension_names(tensor_name))
    return names

  def set_tensor_final(self, tensor_name: str) -> None:
    """Marks a tensor as an output of the computation (never freed).

    Args:
      tensor_name: the name of a tensor of the graph.
    """
    self._tensor(tensor_name)  # Raises KeyError for an unknown name.
    self._final_tensor_names.add(tensor_name)

  def is_tensor_final(self, tensor_name: str) -> bool:
    """Whether a tensor is an output of the computation.

    Args:
      tensor_name: the name of a tensor of the graph.

    Returns:
      a boolean.
    """
    self._tensor(tensor_name)
    return tensor_name in self._final_tensor_names

  def compute_cost_graph(
    self, devices: Optional[Sequence[str]] = None
  ) -> cost_graph_pb2.CostGraphDef:
    """A CostGraphDef with one node per operation, in graph order.

    Each node lists its inputs (producer id and output port) and its outputs
    (size, dtype, shape); a node with a final output is marked final.

    Args:
      devices: optional device names; an output on a device not listed gets
        size 0 and no shape. Device-less (mtf) tensors are always counted.

    Returns:
      a CostGraphDef.
    """
    cost_graph = cost_graph_pb2.CostGraphDef()
    for node_id, operation_name in enumerate(self.get_all_operation_names()):
      node = cost_graph.node.add(name=operation_name, id=node_id)
      device = self.get_operation_device(operation_name)
      if device is not None:
        node.device = device
      for input_name in self.get_operation_input_names(operation_name):
        producer, port = self._tensor_ids[input_name]
        node.input_info.add(preceding_node=producer, preceding_port=port)
      for output_name in self.get_operation_output_names(operation_name):
        dtype = self.get_tensor_dtype(output_name).as_datatype_enum
        tensor_device = self.get_tensor_device(output_name)
        if devices is None or tensor_device is None or tensor_device in devices:
          node.output_info.add(
            size=self.get_tensor_size(output_name),
            alias_input_port=-1,
            dtype=dtype,
            shape=self.get_tensor_shape(output_name).as_proto(),
          )
        else:
          node.output_info.add(size=0, alias_input_port=-1, dtype=dtype)
        # CostGraphDef marks operations, not tensors, as final.
        if self.is_tensor_final(output_name):
          node.is_final = True
    return cost_graph

  def compute_memory_contents_under_schedule(
    self, schedule: Sequence[int]
  ) -> List[FrozenSet[str]]:
    """The tensors in memory while each scheduled operation runs.

    An operation's outputs are allocated when it runs; a tensor is freed once
    its last consumer has run (final tensors are never freed, unused non-final
    outputs right after their operation). The schedule is assumed to be a
    topological order.

    Args:
      schedule: operation indices (into get_all_operation_names()), in the
        order they run.

    Returns:
      one frozenset of tensor names per entry of schedule.
    """
    remaining_uses = self._compute_initial_out_degree()
    in_memory = set()
    contents = []
    for operation_id in schedule:
      operation_name = self._operations[operation_id].name
      outputs = list(self.get_operation_output_names(operation_name))
      in_memory.update(outputs)
      contents.append(frozenset(in_memory))
      for output_name in outputs:
        if remaining_uses[output_name] == 0:
          in_memory.remove(output_name)
      for input_name in self.get_operation_input_names(operation_name):
        remaining_uses[input_name] -= 1
        if remaining_uses[input_name] == 0:
          in_memory.remove(input_name)
    return contents

  def _operation(self, operation_name: str):
    return self._operations[self._operation_ids[operation_name]]

  def _tensor(self, tensor_name: str):
    operation_id, index = self._tensor_ids[tensor_name]
    return self._operations[operation_id].outputs[index]

  def _compute_initial_out_degree(self) -> Dict[str, int]:
    """{tensor name: number of consuming operations, plus one if final}."""
    uses = collections.defaultdict(int)
    for tensor_name in self._final_tensor_names:
      uses[tensor_name] = 1
    for operation_name in self.get_all_operation_names():
      for input_name in self.get_operation_input_names(operation_name):
        uses[input_name] += 1
    return uses
