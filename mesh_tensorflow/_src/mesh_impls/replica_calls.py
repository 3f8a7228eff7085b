"""The calls of a SIMD replica program, one per replica, and their inputs.

CollectiveBackend traces the replica program once and calls the traced
function on every replica's device. `ReplicaCaller` makes those calls (as
`StatefulPartitionedCall` ops, as direct calls of the function optimised
once, or, while a gradient tape records, as ordinary calls). The slices of
one mesh variable, one per replica, reach the calls as one packed handle
(`PackedSlices`), and automatic control dependencies learn, through the
resolver registered here, that an op using a slice directly also uses its
packed handle. Slices made without a shape in their handles reach a
function through `shaped_handle` / `shaped_variable`, which borrow the
shape of a shaped slice (see CollectiveBackend.slice_handles_may_omit_shape).
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple
import weakref

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2
from tensorflow.python.eager import context  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.eager import record  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.framework import auto_control_deps  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.framework import auto_control_deps_utils as acd_utils  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.framework import ops  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.ops import resource_variable_ops  # pylint: disable=g-direct-tensorflow-import

from mesh_tensorflow._src.mesh_impls import optimize_once
from mesh_tensorflow._src.mesh_impls import (
  slice_variables as slice_variables_lib,
)

__all__ = [
  "PACKED_SLICES",
  "PackedSlices",
  "ReplicaCaller",
  "shaped_handle",
  "shaped_variable",
]


class ReplicaCaller:
  """Calls the replica program's traced function once per replica.

  Creating a call op makes TensorFlow infer the shapes of the function's
  whole body if the function is already in the graph (milliseconds per
  thousand ops, for every call). The calls are therefore made first, as
  plain `StatefulPartitionedCall` ops whose output shapes are those of the
  trace, and the function is added to the graph once, by `finish()`. While
  a gradient tape records, each call is an ordinary call of the concrete
  function instead, so that the tape sees it.

  Args:
    concrete: the traced replica program (a ConcreteFunction of the pnum).
    packed: for each captured input, whether the calls pass it packed (marked
      read-only for automatic control dependencies, see
      CollectiveBackend._pack_slices).
    written: for each captured input, whether to mark it written even if the
      program only reads it (the ordering tokens).
    optimize_on: a device of the calls: call the function optimised there
      by Grappler once, not inlined (see optimize_once); None: the calls
      are inlined and optimised with the step, once per call.
    direct: with optimize_on, call the optimised function directly (an op
      of its type) if optimize_once allows it and every resource input is
      on the call's device (packed slices and ordering tokens): a direct
      call runs its whole body on its own device, where a partitioned call
      reads a resource on another device there. A direct call's op needs
      the function in the graph when it is made, so the function is added
      before the first call, and the calls are marked
      `_disable_call_shape_inference`.
  """

  def __init__(
    self, concrete, packed=(), written=(), optimize_on=None, direct=True
  ):
    self._concrete = concrete
    self._captured = list(concrete.captured_inputs)
    self._taped = record.could_possibly_record()
    graph = concrete.graph
    self._outputs = list(graph.outputs)
    dtypes = [t.dtype.as_datatype_enum for t in graph.inputs]
    first = len(graph.inputs) - len(self._captured)
    packed, written = list(packed), list(written)
    on_call_device = all(
      (packed and packed[i]) or (written and written[i])
      for i, c in enumerate(self._captured)
      if c.dtype == tf.resource
    )
    read_only = set(acd_utils.get_read_only_resource_input_indices_graph(graph))
    read_only |= {first + i for i, p in enumerate(packed) if p}
    read_only -= {first + i for i, w in enumerate(written) if w}
    self._attrs = {
      "Tin": _type_list(dtypes),
      "Tout": _type_list([t.dtype.as_datatype_enum for t in self._outputs]),
      "f": attr_value_pb2.AttrValue(
        func=attr_value_pb2.NameAttrList(
          name=concrete.function_def.signature.name
        )
      ),
      # Automatic control dependencies order no calls after one another
      # for resources they only read (e.g. a master read by every replica).
      acd_utils.READ_ONLY_RESOURCE_INPUTS_ATTR: attr_value_pb2.AttrValue(
        list=attr_value_pb2.AttrValue.ListValue(i=sorted(read_only))
      ),
    }
    # The call options of the context, as tf.function's own calls have.
    for key, value in (
      context.context().function_call_options.as_attrs().items()
    ):
      self._attrs[key] = attr_value_pb2.AttrValue(s=tf.compat.as_bytes(value))
    self._optimized = None
    self._op_type = "StatefulPartitionedCall"
    self._added_to = None
    if optimize_on is not None and not self._taped:
      self._optimize(optimize_on, direct and on_call_device)

  def _optimize(self, device: str, direct: bool) -> None:
    """Makes the calls call the function optimised once (optimize_once)."""
    config = self._attrs["config_proto"].s
    optimized = optimize_once.optimize_function(
      self._concrete, config, device, direct
    )
    if optimized is None:
      return
    self._optimized = optimized.function
    if optimized.direct:
      # A direct call takes only the attributes of the function's signature
      # (none) and private ones; it runs no Grappler, so no config_proto.
      self._op_type = optimized.function.name
      self._attrs = {k: v for k, v in self._attrs.items() if k[0] == "_"}
      # The function is in the graph before the calls: without this, making
      # each call would infer the shapes of its whole body (the outputs get
      # the trace's shapes instead, in __call__).
      self._attrs["_disable_call_shape_inference"] = attr_value_pb2.AttrValue(
        b=True
      )
      return
    self._attrs["f"] = attr_value_pb2.AttrValue(
      func=attr_value_pb2.NameAttrList(name=optimized.function.name)
    )
    self._attrs["config_proto"] = attr_value_pb2.AttrValue(
      s=optimize_once.calls_config(config)
    )

  @property
  def op_type(self) -> str:
    """The type of the call ops (StatefulPartitionedCall or the function)."""
    return tf.compat.as_str(self._op_type)

  def __call__(self, pnum: tf.Tensor, captured: Sequence) -> List[tf.Tensor]:
    """The outputs of one call, with `captured` as the captured inputs."""
    if self._taped:
      self._concrete.set_external_captures(list(captured))
      return self._concrete(pnum)
    graph = tf.compat.v1.get_default_graph()
    if self._op_type != "StatefulPartitionedCall":
      self._add_optimized(graph)
    inputs = [pnum] + [tf.convert_to_tensor(c) for c in captured]
    op = graph.create_op(
      self.op_type,
      inputs,
      [t.dtype for t in self._outputs],
      name="replica_program",
      attrs=self._attrs,
    )
    for out, traced in zip(op.outputs, self._outputs):
      out.set_shape(traced.shape)
    return tf.nest.pack_sequence_as(
      self._concrete.structured_outputs,
      list(op.outputs),
      expand_composites=True,
    )

  def finish(self) -> None:
    """Adds the function to the graph (after the calls: see the class)."""
    if self._taped:
      self._concrete.set_external_captures(self._captured)
    elif self._optimized is not None:
      self._add_optimized(tf.compat.v1.get_default_graph())
    else:
      self._concrete.add_to_graph(tf.compat.v1.get_default_graph())

  def _add_optimized(self, graph) -> None:
    """Adds the optimised function to `graph` (once)."""
    if self._added_to is not graph:
      graph._add_function_recursive(self._optimized)  # pylint: disable=protected-access
      self._added_to = graph


class PackedSlices:
  """The packed slice handles the replica calls of one graph take."""

  def __init__(self):
    # (ids of one variable's eager slice handles) -> their packed handle;
    # also (id of a shapeless slice handle,) -> its shaped handle.
    self.packed: Dict[Tuple[int, ...], Any] = {}
    self._placeholders = (None, {})

  def add_shaped(self, handle, shaped) -> None:
    """Orders direct uses of `handle` with the uses of its shaped handle."""
    self.packed.setdefault((id(handle),), shaped)

  def pack(self, handles: Sequence[Any]):
    """The packed handle of `handles` (one per graph: calls share it)."""
    key = tuple(id(h) for h in handles)
    if key not in self.packed:
      with tf.init_scope():
        self.packed[key] = ops.pack_eager_tensors(list(handles))
    return self.packed[key]

  def packed_placeholder_of(self, graph) -> Dict[int, List[Any]]:
    """{id(placeholder of a slice handle): placeholders of its packed handles}.

    A shaped handle of a slice counts as the slice itself: its placeholder
    maps to the slice's packed handles too. Recomputed when the graph
    captured more tensors.
    """
    internal = graph.function_captures.by_val_internal
    version, found = self._placeholders
    if version != (len(internal), len(self.packed)):
      found = {}
      shaped = {}
      for handle_ids, packed in self.packed.items():
        packed_internal = internal.get(id(packed))
        if packed_internal is None:
          continue
        if len(handle_ids) == 1:
          shaped[handle_ids[0]] = packed_internal
        for handle_id in handle_ids:
          placeholder = internal.get(handle_id)
          if placeholder is not None:
            found.setdefault(id(placeholder), []).append(packed_internal)
      for handle_id, shaped_internal in shaped.items():
        placeholder = internal.get(handle_id)
        others = (
          found.get(id(placeholder), []) if placeholder is not None else []
        )
        found.setdefault(id(shaped_internal), []).extend(
          p for p in others if p is not shaped_internal
        )
      self._placeholders = ((len(internal), len(self.packed)), found)
    return found


# Graphs whose replica calls take packed slice handles -> their PackedSlices.
PACKED_SLICES = weakref.WeakKeyDictionary()


@auto_control_deps.register_acd_resource_resolver
def _order_direct_slice_uses(op, resource_reads, resource_writes) -> bool:
  """Automatic control dependencies: a direct use of a packed slice.

  An op of the step's graph that uses a slice variable directly (not through
  a replica call), e.g. a copy of the slices to the masters after the
  calls, is taken to write the slice's packed handle too: it then runs
  after every call passed that handle and before every later one, as it
  did when the calls took the slice handles themselves.

  Args:
    op: the op whose resource inputs are resolved.
    resource_reads: the resources it reads (a set of tensors, updated).
    resource_writes: the resources it writes (a set of tensors, updated).

  Returns:
    whether the sets changed.
  """
  packed_slices = PACKED_SLICES.get(op.graph)
  if packed_slices is None:
    return False
  packed_of = packed_slices.packed_placeholder_of(op.graph)
  added = []
  for t in list(resource_reads) + list(resource_writes):
    for packed in packed_of.get(id(t), ()):
      if packed not in resource_writes and packed not in added:
        added.append(packed)
  resource_writes.update(added)
  return bool(added)


def shaped_handle(variable):
  """A handle of `variable` with its shape, for a function input, or None.

  None for a slice whose handle has its shape; for one made without (see
  CollectiveBackend.slice_handles_may_omit_shape), its handle packed after
  that of the shaped slice it borrows the shape from: TensorFlow gives a
  function the packed handle's shape (its first component's), and a
  function on the slice's device the slice's own handle. Registered for
  the graph being built, so that automatic control dependencies order it
  with direct uses of the slice.
  """
  source = slice_variables_lib.shape_source(variable)
  if source is None:
    return None
  entry = slice_variables_lib.shaped_entry(variable)
  if "handle" not in entry:
    with tf.init_scope():
      entry["handle"] = ops.pack_eager_tensors([source.handle, variable.handle])
  graph = tf.compat.v1.get_default_graph()
  PACKED_SLICES.setdefault(graph, PackedSlices()).add_shaped(
    variable.handle, entry["handle"]
  )
  return entry["handle"]


def shaped_variable(variable):
  """`variable`, or a variable over its shaped handle (see shaped_handle)."""
  handle = shaped_handle(variable)
  if handle is None:
    return variable
  entry = slice_variables_lib.shaped_entry(variable)
  if "variable" not in entry:
    name = variable.name.split(":")[0]
    with tf.init_scope():
      entry["variable"] = resource_variable_ops.BaseResourceVariable(
        trainable=False,
        shape=variable.shape,
        dtype=variable.dtype,
        handle=handle,
        handle_name=name,
        unique_id="%s_shaped_%d" % (name, ops.uid()),
        in_graph_mode=False,
      )
  return entry["variable"]


def _type_list(dtypes: Sequence[int]) -> attr_value_pb2.AttrValue:
  return attr_value_pb2.AttrValue(
    list=attr_value_pb2.AttrValue.ListValue(type=list(dtypes))
  )
