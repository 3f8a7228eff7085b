"""Shape-only lowering and cost counting of one processor's step.

The planner lowers the mtf graph with the very code a SimdMeshImpl runs (the
same operations, lazy sums and collective calls), into a scratch tf.Graph that
is never run, on a backend whose collectives only produce tensors of the
right shape. Nothing is allocated: slice variables are graph nodes, imported
tensors become zeros of the slice shape. The Lowering's own counters then
give the bytes of every collective, and the TF ops of the one processor's
program give its FLOPs and memory traffic.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Dict, List, Sequence, Tuple

import tensorflow as tf

from mesh_tensorflow._src.lowering import Lowering
from mesh_tensorflow._src.mesh_impls import simd
from mesh_tensorflow._src.mesh_impls import simd_backend
from mesh_tensorflow._src.shapes import list_product
from mesh_tensorflow._src.variables import Variable


class ShapeOnlyBackend(simd_backend.SimdBackend):
  """A SIMD backend whose collectives make tensors of the right shape only."""

  def replica_pnum(self) -> tf.Tensor:
    return tf.constant(0, tf.int32)

  def allreduce_sum(self, x, groups):
    del groups
    return tf.identity(x)

  def all_gather(self, x, groups, axis):
    return tf.concat([x] * len(groups[0]), axis)

  def all_to_all(self, x, groups, split_axis, concat_axis):
    return tf.concat(tf.split(x, len(groups[0]), split_axis), concat_axis)

  def permute(self, x, source_target_pairs):
    del source_target_pairs
    return tf.identity(x)

  def device(self, physical_pnum: int) -> str:
    del physical_pnum
    return ""

  def replica_variable(self, name: str, slice_variables: Sequence):
    del name
    return slice_variables[0]


def _stand_in(shape, dtype) -> tf.Tensor:
  """A free graph node of the given shape: a value nothing computes."""
  return tf.compat.v1.placeholder(dtype, shape)


class SliceStandIn:
  """Stands in for a slice variable: assignments become the ops they cost.

  Args:
    value: the tensor the slice reads as.
  """

  def __init__(self, value: tf.Tensor):
    self.value = value

  def assign(self, new_value):
    """The new value (an assignment writes it).

    Args:
      new_value: a tf.Tensor.

    Returns:
      a tf.Tensor.
    """
    return tf.identity(new_value)

  def assign_add(self, delta):
    """The sum an assign_add computes.

    Args:
      delta: a tf.Tensor.

    Returns:
      a tf.Tensor.
    """
    return self.value + delta

  def assign_sub(self, delta):
    """The difference an assign_sub computes.

    Args:
      delta: a tf.Tensor.

    Returns:
      a tf.Tensor.
    """
    return self.value - delta


class ShapeOnlyVariable:
  """The slice of one mtf Variable on the planned processor: a graph node.

  Args:
    variable: the mtf Variable.
    mesh_impl: the ShapeOnlyMeshImpl.
  """

  def __init__(self, variable, mesh_impl: "ShapeOnlyMeshImpl"):
    self._variable = variable
    value = _stand_in(
      mesh_impl.slice_shape(variable.shape), variable.slice_dtype
    )
    self._slice = SliceStandIn(value)
    self._laid_out_tensor = simd.LaidOutTensor([value])

  @property
  def laid_out_tensor(self):
    """A LaidOutTensor reading the slice."""
    return self._laid_out_tensor

  @property
  def copy_master_to_slices(self):
    """Nothing to copy: a no-op."""
    return tf.no_op()

  @property
  def copy_slices_to_master(self):
    """Nothing to copy: a no-op."""
    return tf.no_op()

  def assign_to_slices(self, assign_fn: Callable, values: Sequence):
    """assign_fn(variable, slice, value), as SimdMeshImpl's variables do.

    Args:
      assign_fn: a function (variable, slice_var, value) -> assign op.
      values: a list of one tf.Tensor.

    Returns:
      what assign_fn returns.
    """
    return assign_fn(self._variable, self._slice, list(values)[0])


class ShapeOnlyMeshImpl(simd.SimdMeshImpl):
  """SimdMeshImpl lowering one processor's program without running anything.

  Args:
    shape: the mesh shape.
    layout: the layout rules.
  """

  LaidOutVariable = ShapeOnlyVariable

  def __init__(self, shape, layout):
    super().__init__(shape, layout, backend=ShapeOnlyBackend())

  def import_tf_tensor(self, x, tf_x):
    del tf_x
    return simd.LaidOutTensor([_stand_in(self.slice_shape(x.shape), x.dtype)])

  def export_to_tf_tensor(self, x, laid_out_x):
    """This processor's slice (realising a pending sum): what the step needs.

    Args:
      x: the mtf Tensor.
      laid_out_x: its laid-out value.

    Returns:
      the slice, a tf.Tensor.
    """
    del x
    return laid_out_x.to_laid_out_tensor().one_slice


@dataclasses.dataclass(frozen=True)
class OpCost:
  """The cost of the TF ops of one kind (type and dtype) in the program.

  Attributes:
    op_type: the TF op type, e.g. "MatMul".
    dtype: the dtype name of its first output.
    count: how many such ops.
    flops: their floating point operations.
    bytes_accessed: bytes they read and write.
    matmul: whether they run on the matmul units.
  """

  op_type: str
  dtype: str
  count: int
  flops: int
  bytes_accessed: int
  matmul: bool


# Ops that move no data: metadata, views, variable handles.
_FREE_OPS = frozenset(
  [
    "Const",
    "Identity",
    "IdentityN",
    "Reshape",
    "Shape",
    "ShapeN",
    "Size",
    "Rank",
    "NoOp",
    "Placeholder",
    "PlaceholderWithDefault",
    "VarHandleOp",
    "ReadVariableOp",
    "VarIsInitializedOp",
    "ExpandDims",
    "Squeeze",
    "StopGradient",
    "Snapshot",
    "AssignVariableOp",
  ]
)
# Ops that copy data but compute nothing.
_COPY_OPS = frozenset(
  [
    "Transpose",
    "ConcatV2",
    "Slice",
    "StridedSlice",
    "Pad",
    "PadV2",
    "Tile",
    "GatherV2",
    "Split",
    "SplitV",
    "Pack",
    "Unpack",
    "BroadcastTo",
    "Fill",
    "ZerosLike",
    "OnesLike",
    "Cast",
    "ScatterNd",
    "TensorScatterAdd",
  ]
)
_MATMUL_OPS = frozenset(
  ["MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "Einsum"]
)


def _num_elements(shape: tf.TensorShape) -> int:
  n = shape.num_elements()
  return 0 if n is None else n


def _tensor_bytes(t: tf.Tensor) -> int:
  if t.dtype == tf.resource or t.dtype == tf.variant:
    return 0
  return _num_elements(t.shape) * t.dtype.size


def _matmul_flops(op: tf.Operation) -> int:
  """2 * (output elements) * (contracted size) of a matmul or einsum."""
  out = _num_elements(op.outputs[0].shape)
  if op.type == "Einsum":
    equation = op.get_attr("equation").decode()
    inputs, output = equation.split("->")
    sizes = {}
    for spec, t in zip(inputs.split(","), op.inputs):
      for letter, size in zip(spec, t.shape.as_list()):
        sizes[letter] = size
    contracted = [c for c in sizes if c not in output]
    return (2 if contracted else 1) * list_product([sizes[c] for c in sizes])
  a = op.inputs[0].shape.as_list()
  if op.type == "MatMul":
    transpose = op.get_attr("transpose_a")
    k = a[0] if transpose else a[1]
  else:
    adjoint = op.get_attr("adj_x")
    k = a[-2] if adjoint else a[-1]
  return 2 * out * k


def tf_op_costs(ops: Sequence[tf.Operation]) -> Tuple[OpCost, ...]:
  """FLOPs and memory traffic of TF ops, grouped by (op type, dtype).

  Matmuls and einsums count 2 FLOPs per multiply-add; other computing ops one
  FLOP per element of their largest input or output; copies and views none.
  Memory traffic is the bytes of every input and output, except for views.

  Args:
    ops: the ops of one processor's program.

  Returns:
    a tuple of OpCost, one per (op type, dtype), sorted by op type.
  """
  totals: Dict[Tuple[str, str], List[int]] = {}
  for op in ops:
    if op.type in _FREE_OPS or not op.outputs:
      continue
    tensors = list(op.inputs) + list(op.outputs)
    bytes_accessed = sum(_tensor_bytes(t) for t in tensors)
    if op.type in _MATMUL_OPS:
      flops = _matmul_flops(op)
    elif op.type in _COPY_OPS:
      flops = 0
    else:
      flops = max(
        [_num_elements(t.shape) for t in tensors if t.dtype != tf.resource]
        or [0]
      )
    key = (op.type, op.outputs[0].dtype.name)
    entry = totals.setdefault(key, [0, 0, 0])
    entry[0] += 1
    entry[1] += flops
    entry[2] += bytes_accessed
  return tuple(
    OpCost(op_type, dtype, count, flops, bytes_accessed, op_type in _MATMUL_OPS)
    for (op_type, dtype), (count, flops, bytes_accessed) in sorted(
      totals.items()
    )
  )


@dataclasses.dataclass(frozen=True)
class LoweredCounts:
  """What a shape-only lowering of one processor's step counted.

  Attributes:
    collective_total_bytes: {kind: bytes sent over all processors}.
    op_costs: the costs of the processor's TF ops (see tf_op_costs).
    counters: the Lowering's counters, totalled by name.
  """

  collective_total_bytes: Dict[str, int]
  op_costs: Tuple[OpCost, ...]
  counters: Dict[str, int]


def needed_in_order(items: Sequence, sinks: Sequence, predecessors) -> List:
  """The items the sinks depend on, in the order of `items`.

  Args:
    items: all operations of a graph, in creation order.
    sinks: the operations the step must run.
    predecessors: a function from an operation to the ones it depends on.

  Returns:
    the items reachable from the sinks through predecessors.
  """
  needed = set()
  stack = list(sinks)
  while stack:
    item = stack.pop()
    if item not in needed:
      needed.add(item)
      stack.extend(predecessors(item))
  return [item for item in items if item in needed]


def needed_ops(ops, sinks) -> List[tf.Operation]:
  """The TF ops among `ops` that computing `sinks` runs (TF prunes the rest).

  Args:
    ops: the ops of a graph, in creation order.
    sinks: tf.Tensors or tf.Operations the step computes.

  Returns:
    the ops the sinks depend on (through inputs and control inputs).
  """
  return needed_in_order(
    ops,
    [s if isinstance(s, tf.Operation) else s.op for s in sinks],
    lambda op: [t.op for t in op.inputs] + list(op.control_inputs),
  )


def _tf_graph_of(graph) -> tf.Graph:
  """The tf.Graph the mtf graph was built in, else a new scratch graph.

  An mtf graph built inside a tf.Graph (shape-only) may hold tensors of that
  graph (a learning rate, a step counter): the lowering must join them there.
  """
  if not tf.executing_eagerly():
    return tf.compat.v1.get_default_graph()
  for variable in graph.all_variables:
    try:
      return variable.master.handle.graph
    except AttributeError:  # An eager variable has no graph.
      break
  return tf.Graph()


def lower_shape_only(
  graph, mesh, mesh_shape, layout_rules, exported=()
) -> LoweredCounts:
  """Lowers `graph` shape-only and counts its collectives and TF ops.

  Args:
    graph: the mtf Graph.
    mesh: its Mesh to lower (others are not supported).
    mesh_shape: the mesh shape.
    layout_rules: the layout rules.
    exported: mtf Tensors the step exports (a loss): their pending sums are
      realised, as an export does.

  Returns:
    a LoweredCounts.
  """
  mesh_impl = ShapeOnlyMeshImpl(mesh_shape, layout_rules)
  lowerings = []

  sinks = []

  def lower():
    lowering = Lowering(graph, {mesh: mesh_impl}, autostack=False)
    for tensor in exported:
      sinks.append(lowering.export_to_tf_tensor(tensor))
    mesh_impl.set_collective_counter(None)
    # The assignments (variable updates) and exports are what a step runs.
    sinks.extend(lowering.operations.values())
    lowerings.append(lowering)

  # A function graph of its own (traced, never run) for each plan, so cached
  # constants of earlier lowerings are not reused; it captures the tensors of
  # the graph the mtf graph was built in.
  with _tf_graph_of(graph).as_default():
    traced = tf.function(lower, autograph=False).get_concrete_function()
  [lowering] = lowerings
  ops = needed_ops(traced.graph.get_operations(), sinks)
  counters = {}
  for key, value in lowering.counters:
    counters[key] = counters.get(key, 0) + value
  return LoweredCounts(
    collective_total_bytes=lowering.collective_bytes(),
    op_costs=tf_op_costs(ops),
    counters=counters,
  )


def slice_bytes(mesh_impl, shape, dtype) -> int:
  """Bytes of one processor's slice of a tensor.

  Args:
    mesh_impl: a MeshImpl (its layout answers; nothing is lowered).
    shape: the tensor's Shape.
    dtype: its tf dtype.

  Returns:
    an int.

  Raises:
    ValueError: naming the dimension and mesh if a split does not divide.
  """
  return mesh_impl.slice_size(shape) * tf.as_dtype(dtype).size


def variable_bytes(graph, mesh_impl) -> Tuple[int, int]:
  """Per-processor bytes of trainable variables and of the others (slots).

  Args:
    graph: the mtf Graph.
    mesh_impl: a MeshImpl giving the layout.

  Returns:
    (parameter bytes, other variable bytes): optimizer slots, step counters.
  """
  trainable = set(graph.trainable_variables)
  params = slots = 0
  for v in graph.all_variables:
    b = slice_bytes(mesh_impl, v.shape, v.slice_dtype)
    if v in trainable:
      params += b
    else:
      slots += b
  return params, slots


def peak_activation_bytes(graph, mesh_impl) -> int:
  """Estimated peak bytes of live activations on one processor.

  Walks the operations in order (the order the lowering emits them); a
  tensor lives from its operation to its last consumer. Variables are not
  counted (they are parameters or slots).

  Args:
    graph: the mtf Graph.
    mesh_impl: a MeshImpl giving the layout.

  Returns:
    an int: the largest total of live activation bytes.
  """
  operations = graph.operations
  last_use = {}
  for i, op in enumerate(operations):
    for t in op.inputs:
      last_use[t] = i
  freed_at: Dict[int, int] = {}
  live = peak = 0
  for i, op in enumerate(operations):
    if not isinstance(op, Variable):
      for t in op.outputs:
        b = slice_bytes(mesh_impl, t.shape, t.dtype)
        live += b
        end = last_use.get(t, i)
        freed_at[end] = freed_at.get(end, 0) + b
    peak = max(peak, live)
    live -= freed_at.pop(i, 0)
  return peak
