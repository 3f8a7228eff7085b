"""Variable stacking: many same-shape variables become one stacked variable.

On meshes with more than one processor every variable costs a slice variable
and a copy op per processor; stacking cuts that count. It never changes
results or checkpoints: each StackedVariable keeps the original masters
(get_master stacks them, assign_to_master unstacks into them).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import tensorflow as tf

from mesh_tensorflow._src.graph import Graph
from mesh_tensorflow._src.graph import Operation
from mesh_tensorflow._src.graph import Tensor
from mesh_tensorflow._src.graph import register_graph_rewrites
from mesh_tensorflow._src.ops import io
from mesh_tensorflow._src.shapes import Dimension
from mesh_tensorflow._src.shapes import Shape
from mesh_tensorflow._src.variables import Assign
from mesh_tensorflow._src.variables import ReadVariable
from mesh_tensorflow._src.variables import Variable

STACKED_DIM_NAME = "stacked"


class StackedVariable(Variable):
  """Variables of equal shape and dtype stacked along a new "stacked" dim.

  Args:
    vs: two or more mtf Variables of one shape and dtype; they are stacked in
      this order.
  """

  def __init__(self, vs: Sequence[Variable]):
    vs = list(vs)
    Operation.__init__(self, [], vs[0].mesh, name="stacked/" + vs[0].name)
    self._name = "stacked/" + vs[0].name
    self._vars = vs
    self._variable_dtype = vs[0].dtype
    self._trainable = vs[0].trainable
    self._shape = Shape(
      [Dimension(STACKED_DIM_NAME, len(vs))] + vs[0].shape.dims
    )
    self._store = vs[0].store
    self._outputs = [Tensor(self, self._shape, vs[0].activation_dtype)]

  @property
  def original_names(self) -> List[str]:
    """The names of the stacked variables, in stacking order."""
    return [v.name for v in self._vars]

  @property
  def original_variables(self) -> List[Variable]:
    """The stacked mtf Variables, in stacking order."""
    return list(self._vars)

  @property
  def master(self) -> None:
    """None: the masters are the original variables' (see get_master)."""
    return None

  @property
  def master_device(self) -> str:
    """The device of the stacked master variable."""
    return self._vars[0].master_device

  def get_master(self) -> tf.Tensor:
    return tf.stack([v.get_master() for v in self._vars])

  def assign_to_master(self, val: tf.Tensor) -> tf.Operation:
    return tf.group(
      *[v.assign_to_master(t) for v, t in zip(self._vars, tf.unstack(val))]
    )


class UnstackVariableOperation(Operation):
  """Splits a StackedVariable's value back into the original variables' values."""

  def __init__(self, stacked: StackedVariable, outputs: Sequence[Tensor]):
    super().__init__([stacked.outputs[0]], name=stacked.name + "/unstack")
    self._outputs = list(outputs)

  def gradient(
    self, grad_ys: Sequence[Optional[Tensor]]
  ) -> Sequence[Optional[Tensor]]:
    grads = [
      g if g is not None else io.zeros_like(t)
      for g, t in zip(grad_ys, self._outputs)
    ]
    return [StackOperation(grads).outputs[0]]

  def lower(self, lowering) -> None:
    _lower_unstack(self, lowering)


class StackOperation(Operation):
  """Stacks equally shaped tensors along a new leading "stacked" dim."""

  def __init__(self, xs: Sequence[Tensor], name: Optional[str] = None):
    xs = list(xs)
    super().__init__(xs, name=name or "stack_for_stacked_variable")
    shape = Shape([Dimension(STACKED_DIM_NAME, len(xs))] + xs[0].shape.dims)
    self._outputs = [Tensor(self, shape, xs[0].dtype)]

  def gradient(
    self, grad_ys: Sequence[Optional[Tensor]]
  ) -> Sequence[Optional[Tensor]]:
    unstack = _UnstackTensorOperation(
      grad_ys[0], [x.shape for x in self.inputs]
    )
    return unstack.outputs

  def lower(self, lowering) -> None:
    mesh_impl = lowering.mesh_impl(self)
    lowering.set_tensor_lowering(
      self.outputs[0],
      mesh_impl.slicewise(
        lambda *ts: tf.stack(ts, axis=0),
        *[lowering.tensors[x] for x in self.inputs],
      ),
    )


class _UnstackTensorOperation(Operation):
  """Gradient helper: unstacks a tensor along its leading "stacked" dim."""

  def __init__(self, x: Tensor, shapes: Sequence[Shape]):
    super().__init__([x], name="unstack_stacked")
    self._outputs = [
      Tensor(self, s, x.dtype, index=i) for i, s in enumerate(shapes)
    ]

  def gradient(
    self, grad_ys: Sequence[Optional[Tensor]]
  ) -> Sequence[Optional[Tensor]]:
    return [StackOperation(grad_ys).outputs[0]]

  def lower(self, lowering) -> None:
    _lower_unstack(self, lowering)


def _lower_unstack(op: Operation, lowering) -> None:
  """Lowers op by unstacking its single input along the leading axis."""
  mesh_impl = lowering.mesh_impl(op)
  pieces = mesh_impl.slicewise(
    lambda t: tuple(tf.unstack(t, axis=0)), lowering.tensors[op.inputs[0]]
  )
  if not isinstance(pieces, tuple):
    pieces = (pieces,)
  for out, piece in zip(op.outputs, pieces):
    lowering.set_tensor_lowering(out, piece)


def _move_new_ops_before(graph: Graph, count: int, anchor: Operation) -> None:
  """Moves the last `count` operations of graph to just before `anchor`."""
  ops = graph.operations
  new_ops = ops[-count:]
  del ops[-count:]
  index = ops.index(anchor)
  ops[index:index] = new_ops


def rewrite_stack_variables(
  graph: Graph,
  max_combined_variable_size: int,
  max_combined_slice_size: int,
  mesh_to_impl,
) -> None:
  """Groups stackable variables and rewrites the graph to use StackedVariables.

  Variables stack when they share mesh, shape, dtypes, trainability and the
  exact set of Assign operations that write them, and are not read through
  ReadVariable. Stacks are capped by total size and per-processor slice size.
  """
  assigns_of: Dict[Variable, List[Assign]] = {
    v: [] for v in graph.all_variables
  }
  excluded = set()
  for op in graph.operations:
    if isinstance(op, Assign):
      for v in op.variables:
        if v in assigns_of:
          assigns_of[v].append(op)
    elif isinstance(op, ReadVariable):
      excluded.add(op._var)  # pylint: disable=protected-access
  groups: Dict[tuple, List[Variable]] = {}
  live = set(graph.operations)
  for v in graph.all_variables:
    if v in excluded or v not in live or isinstance(v, StackedVariable):
      continue
    mesh_impl = mesh_to_impl.get(v.mesh) if mesh_to_impl else None
    if mesh_impl is not None and mesh_impl.size == 1:
      continue
    key = (
      v.mesh,
      v.shape.to_string,
      repr(v.dtype),
      v.trainable,
      frozenset(id(a) for a in assigns_of[v]),
    )
    groups.setdefault(key, []).append(v)
  for vs in groups.values():
    mesh_impl = mesh_to_impl.get(vs[0].mesh) if mesh_to_impl else None
    slice_size = (
      mesh_impl.slice_size(vs[0].shape)
      if mesh_impl is not None
      else vs[0].shape.size
    )
    stack: List[Variable] = []
    for v in vs:
      if stack and (
        (len(stack) + 1) * v.shape.size > max_combined_variable_size
        or (len(stack) + 1) * slice_size > max_combined_slice_size
      ):
        _stack(graph, stack, assigns_of[stack[0]])
        stack = []
      stack.append(v)
    _stack(graph, stack, assigns_of[stack[0]] if stack else [])


def _stack(graph: Graph, vs: List[Variable], assigns: List[Assign]) -> None:
  if len(vs) < 2:
    return
  first = min(graph.operations.index(v) for v in vs)
  anchor = graph.operations[first]
  stacked = StackedVariable(vs)
  outputs = [v.outputs[0] for v in vs]
  unstack = UnstackVariableOperation(stacked, outputs)
  for out in outputs:
    out._operation = unstack  # pylint: disable=protected-access
  _move_new_ops_before(graph, 2, anchor)
  for v in vs:
    graph.operations.remove(v)
  in_stack = set(vs)
  for a in assigns:
    values = dict(zip(a.variables, a._inputs))  # pylint: disable=protected-access
    stacked_value = StackOperation([values[v] for v in vs])
    _move_new_ops_before(graph, 1, a)
    keep = [v for v in a.variables if v not in in_stack]
    a._variables = keep + [stacked]  # pylint: disable=protected-access
    a._inputs = [values[v] for v in keep] + [stacked_value.outputs[0]]  # pylint: disable=protected-access


register_graph_rewrites({"rewrite_stack_variables": rewrite_stack_variables})

__all__ = ["StackedVariable", "rewrite_stack_variables"]
