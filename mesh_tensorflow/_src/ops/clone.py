"""Copying operations with remapped inputs (used for rematerialisation).

`clone_operations` re-creates operations of a graph on new inputs: each copy is
a shallow copy of the original operation object whose input tensors (and any
other attribute holding a tensor or an operation) are replaced through a
mapping, with fresh output tensors. Variables and random operations are never
copied: the copies read the same variables and reuse the same random values.
"""

from __future__ import annotations

import copy
from typing import Dict, List, Sequence, Tuple

from mesh_tensorflow._src.graph import Graph, Operation, Tensor
from mesh_tensorflow._src.variables import Variable


def _is_random_operation(op: Operation) -> bool:
  """True for mtf random ops (their copies would draw new random numbers)."""
  try:
    from mesh_tensorflow._src.ops import random as random_lib  # pylint: disable=g-import-not-at-top
    random_cls = getattr(random_lib, "RandomOperation", None)
  except ImportError:
    random_cls = None
  if random_cls is not None:
    return isinstance(op, random_cls)
  # The random op family may not be importable; recognise it by class name.
  return any(c.__name__ == "RandomOperation" for c in type(op).__mro__)


def is_cloneable(op: Operation) -> bool:
  """False for Variables and random operations, which clones share."""
  return not isinstance(op, Variable) and not _is_random_operation(op)


def _remap(value, tensor_map: Dict[Tensor, Tensor],
           op_map: Dict[Operation, Operation]):
  """value with tensors/operations replaced (also inside lists and tuples)."""
  if isinstance(value, Tensor):
    return tensor_map.get(value, value)
  if isinstance(value, Operation):
    return op_map.get(value, value)
  if isinstance(value, (list, tuple)) and any(
      isinstance(v, (Tensor, Operation)) for v in value):
    remapped = [_remap(v, tensor_map, op_map) for v in value]
    return remapped if isinstance(value, list) else type(value)(remapped)
  return value


def _copy_operation(graph: Graph, op: Operation,
                    tensor_map: Dict[Tensor, Tensor],
                    op_map: Dict[Operation, Operation]) -> Operation:
  """A registered copy of `op`; extends tensor_map with its outputs."""
  new_op = copy.copy(op)
  for key, value in list(vars(op).items()):
    if key in ("_inputs", "_outputs"):
      continue
    vars(new_op)[key] = _remap(value, tensor_map, op_map)
  new_op._inputs = [tensor_map.get(t, t) for t in op.inputs]  # pylint: disable=protected-access
  new_op._name = graph.unique_name(op.name)  # pylint: disable=protected-access
  new_outputs = []
  for i, t in enumerate(op.outputs):
    new_t = Tensor(new_op, t.shape, t.dtype, index=i)
    tensor_map[t] = new_t
    new_outputs.append(new_t)
  new_op._outputs = new_outputs  # pylint: disable=protected-access
  graph.operations.append(new_op)
  op_map[op] = new_op
  return new_op


def clone_operations(graph: Graph, ops: Sequence[Operation], input_mapping
                     ) -> Tuple[List[Operation], Dict[Tensor, Tensor]]:
  """Copies `ops` (except Variables and random ops) onto remapped inputs.

  Example:
    new_ops, mapping = graph.clone_operations(forward_ops, {x: x2})
    y2 = mapping[y]   # y recomputed from x2

  Args:
    graph: the Graph the copies are added to (at the end, in order).
    ops: operations to copy, in graph order.
    input_mapping: dict {Tensor: Tensor} of replacements for inputs.

  Returns:
    (new_ops, extended_mapping): the copies, and input_mapping extended with
    {old output: new output} for every copied operation.
  """
  tensor_map = dict(input_mapping)
  op_map: Dict[Operation, Operation] = {}
  new_ops = []
  for op in ops:
    if not is_cloneable(op):
      continue
    new_ops.append(_copy_operation(graph, op, tensor_map, op_map))
  return new_ops, tensor_map


__all__ = []
