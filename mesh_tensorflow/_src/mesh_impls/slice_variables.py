"""Creation of per-processor slice variables from an mtf variable's master.

Shared by the placement and SIMD backends: eagerly (and in tf.function, where
variables are made under tf.init_scope) a slice starts as a copy of its part
of the master; in a legacy tf.compat.v1 graph it starts as zeros and the
original protocol applies (run the initializers, then
lowering.copy_masters_to_slices()).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Sequence, Tuple
import weakref

import tensorflow as tf
from tensorflow.python.eager import context  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.framework import ops  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.ops import gen_resource_variable_ops  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.ops import handle_data_util  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.ops import resource_variable_ops  # pylint: disable=g-direct-tensorflow-import

from mesh_tensorflow._src import graph_constants
from mesh_tensorflow._src import mesh_impl as mesh_impl_lib

__all__ = [
  "MasterParts",
  "shape_source",
  "shaped_entry",
  "slice_variable_creator",
]


class MasterParts:
  """The parts of one mtf variable's master, each computed once (eagerly).

  Slices of many processors start from the same part of the master (the
  replicas over mesh axes the variable is not split along); reading the
  master once and each distinct part once keeps the eager work of making
  the slices from growing with those replicas.

  Args:
    variable: the mtf Variable.
  """

  def __init__(self, variable):
    self._variable = variable
    self._master = None
    self._parts = {}

  def __call__(self, begin: Sequence[int], slice_shape: Sequence[int]):
    """The part of the master at `begin` (a tf.Tensor of the slice dtype).

    Args:
      begin: the part's offsets in the full (master) tensor.
      slice_shape: the part's shape.
    """
    key = (tuple(begin), tuple(slice_shape))
    if key not in self._parts:
      if self._master is None:
        self._master = self._variable.get_master()
      self._parts[key] = tf.cast(
        mesh_impl_lib.static_slice(self._master, list(begin), slice_shape),
        self._variable.slice_dtype,
      )
    return self._parts[key]


# The debug name of every eager slice variable's handle (see below).
_SLICE_DEBUG_NAME = "mtf_slice_variable"


# id(slice variable made without a shape in its handle) -> (weak reference
# to it, the slice whose handle has the shape, {what is derived from both}).
_SHAPELESS: Dict[int, Tuple[Any, tf.Variable, Dict[str, Any]]] = {}


def shape_source(variable: tf.Variable) -> Optional[tf.Variable]:
  """The shaped slice `variable` borrows its handle's shape from, or None.

  A slice made with a `shape_source_variable` (see slice_variable_creator)
  has a handle whose runtime carries no shape. That shape matters only
  where TensorFlow takes the handle as a function input (it reaches
  Grappler); there the handle is passed packed after the shaped slice's.

  Args:
    variable: a tf.Variable.

  Returns:
    the slice whose handle has the shape, or None if `variable`'s has.
  """
  entry = _SHAPELESS.get(id(variable))
  if entry is None or entry[0]() is not variable:
    return None
  return entry[1]


def shaped_entry(variable: tf.Variable) -> Dict[str, Any]:
  """A dict kept with a shapeless slice, for what is derived from it.

  Args:
    variable: a slice for which `shape_source` is not None.

  Returns:
    the same dict for every call with `variable`.
  """
  return _SHAPELESS[id(variable)][2]


def _eager_slice_variable(
  initial_value: tf.Tensor,
  name: str,
  shape_source_variable: Optional[tf.Variable] = None,
) -> tf.Variable:
  """tf.Variable(initial_value, name=name, trainable=False), made eagerly.

  TensorFlow caches the kernel of an eager op by its attributes and device.
  tf.Variable gives its handle op the variable's name as an attribute
  (`debug_name`), so the handle of every slice (one per device and
  variable: thousands on large meshes) builds a kernel of its own; here all
  slice handles carry one debug name, and only slices of a new shape and
  device build one (the shape must stay: TensorFlow's graph optimisations
  read it from the handle, and results change without it). The variable
  keeps the slice's own name. Variable creator scopes are not consulted:
  slices are the lowering's state, kept in its VariableStore, and
  tf.function need not trace again because one was made.

  With `shape_source_variable`, the handle is made without a shape: the
  handle op and the assignment then build one kernel per device, not per
  device and shape (see `shape_source`).

  Args:
    initial_value: the slice's initial value (eager, fully defined shape).
    name: the slice variable's name (in the current name scope).
    shape_source_variable: a slice of the same shape and dtype whose handle
      has the shape, or None to give this handle its shape.
  """
  with ops.name_scope(name, skip_on_eager=False) as scope:
    handle_name = ops.name_from_scope_name(scope)
  shape, dtype = initial_value.shape, initial_value.dtype
  handle = gen_resource_variable_ops.var_handle_op(
    dtype=dtype,
    shape=None if shape_source_variable is not None else shape,
    shared_name=context.anonymous_name(),
    debug_name=_SLICE_DEBUG_NAME,
    container="",
  )
  handle_data_util.set_handle_data(
    handle, handle_data_util.create_handle_data(shape, dtype)
  )
  gen_resource_variable_ops.assign_variable_op(handle, initial_value)
  variable = resource_variable_ops.BaseResourceVariable(
    trainable=False,
    shape=shape,
    dtype=dtype,
    handle=handle,
    handle_name=handle_name,
    unique_id="%s_%d" % (handle_name, ops.uid()),
    in_graph_mode=False,
  )
  if shape_source_variable is not None:
    key = id(variable)
    _SHAPELESS[key] = (
      weakref.ref(variable, lambda _: _SHAPELESS.pop(key, None)),
      shape_source_variable,
      {},
    )
  return variable


def slice_variable_creator(
  variable,
  name: str,
  device: str,
  begin: Sequence[int],
  slice_shape: Sequence[int],
  graph_collections: Sequence[str] = (tf.compat.v1.GraphKeys.LOCAL_VARIABLES,),
  master_parts: Optional[MasterParts] = None,
  shape_source_variable: Optional[tf.Variable] = None,
) -> Callable[[], tf.Variable]:
  """A zero-argument function creating one slice variable of `variable`.

  Args:
    variable: the mtf Variable (its master gives the initial value).
    name: the slice variable's name, e.g. "w_slice_3".
    device: where the slice lives.
    begin: the slice's offsets in the full (master) tensor.
    slice_shape: the slice's shape.
    graph_collections: collections of the slice in a legacy graph.
    master_parts: where to take the eager initial value from (shared by the
      slices of one variable); by default the master is read for this slice.
    shape_source_variable: made eagerly, the slice's handle has no shape and
      borrows that slice's (see `shape_source`); None: its own.
  """

  def create():
    with tf.device(device):
      if tf.executing_eagerly():
        parts = master_parts or MasterParts(variable)
        return _eager_slice_variable(
          parts(begin, slice_shape), name, shape_source_variable
        )
      dtype = variable.slice_dtype
      # One zeros tensor per device, shape and dtype serves all slices.
      init = graph_constants.shared(
        ("zeros", tuple(slice_shape), dtype.name),
        lambda: tf.zeros(slice_shape, dtype),
      )
      return tf.compat.v1.Variable(
        init,
        name=name,
        trainable=False,
        collections=list(graph_collections),
        use_resource=True,
      )

  return create
