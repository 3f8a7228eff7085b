"""Creation of per-processor slice variables from an mtf variable's master.

Shared by the placement and SIMD backends: eagerly (and in tf.function, where
variables are made under tf.init_scope) a slice starts as a copy of its part
of the master; in a legacy tf.compat.v1 graph it starts as zeros and the
original protocol applies (run the initializers, then
lowering.copy_masters_to_slices()).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence

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
  "ShapelessSliceVariable",
  "shape_source",
  "shaped_entry",
  "slice_variable_creator",
  "slice_variables_creator",
]


def _master_part(master, begin, slice_shape, dtype) -> tf.Tensor:
  """The part of `master` at `begin`, of `slice_shape`, cast to `dtype`."""
  return tf.cast(
    mesh_impl_lib.static_slice(master, list(begin), list(slice_shape)), dtype
  )


class MasterParts:
  """The parts of one mtf variable's master, all cut at once (eagerly).

  Slices of many processors start from the same part of the master (the
  replicas over mesh axes the variable is not split along); reading the
  master once and cutting it into all its parts with one split per split
  dimension keeps the eager work of making the slices from growing with the
  devices. The parts are those a slice at each offset would cut, bit for bit.

  Args:
    variable: the mtf Variable.
  """

  def __init__(self, variable):
    self._variable = variable
    self._parts = None

  def __call__(self, begin: Sequence[int], slice_shape: Sequence[int]):
    """The part of the master at `begin` (a tf.Tensor of the slice dtype).

    Args:
      begin: the part's offsets in the full (master) tensor.
      slice_shape: the part's shape.
    """
    slice_shape = tuple(slice_shape)
    if self._parts is None or self._parts[0] != slice_shape:
      self._parts = (slice_shape, self._cut(slice_shape))
    index = tuple(b // s if s else 0 for b, s in zip(begin, slice_shape))
    return self._parts[1][index]

  def _cut(self, slice_shape) -> Dict[tuple, tf.Tensor]:
    """{part index along each dimension: part} of the whole master."""
    master = tf.cast(self._variable.get_master(), self._variable.slice_dtype)
    parts = {(): master}
    for axis, (size, part) in enumerate(zip(master.shape, slice_shape)):
      count = size // part if part else 1
      if count == 1:
        parts = {index + (0,): x for index, x in parts.items()}
        continue
      parts = {
        index + (i,): piece
        for index, x in parts.items()
        for i, piece in enumerate(tf.split(x, count, axis=axis))
      }
    return parts


# The debug name of every eager slice variable's handle (see below).
_SLICE_DEBUG_NAME = "mtf_slice_variable"


class ShapelessSliceVariable(resource_variable_ops.BaseResourceVariable):
  """An eager slice variable whose handle carries no shape in the runtime.

  Its handle op and assignment then build one eager kernel per device, not
  per device and shape. The shape matters only where TensorFlow takes the
  handle as a function input (it reaches Grappler); there the handle is
  passed packed after that of `shape_source`, a slice of the same shape
  and dtype whose handle has it (see simd_collective).

  Args:
    shape_source: the slice whose handle has the shape.
    **kwargs: BaseResourceVariable's arguments.
  """

  def __init__(self, shape_source: tf.Variable, **kwargs):
    super().__init__(**kwargs)
    self.mtf_shape_source = shape_source
    # What is derived from this slice and its shape source, made once.
    self.mtf_shaped = {}


def shape_source(variable: tf.Variable) -> Optional[tf.Variable]:
  """The shaped slice `variable` borrows its handle's shape from, or None.

  Args:
    variable: a tf.Variable.

  Returns:
    the slice whose handle has the shape, or None if `variable`'s has.
  """
  if isinstance(variable, ShapelessSliceVariable):
    return variable.mtf_shape_source
  return None


def shaped_entry(variable: ShapelessSliceVariable) -> Dict[str, Any]:
  """A dict kept with a shapeless slice, for what is derived from it.

  Args:
    variable: a slice for which `shape_source` is not None.

  Returns:
    the same dict for every call with `variable`.
  """
  return variable.mtf_shaped


class _EagerSliceMaker:
  """Makes eager slice variables of one shape and dtype, in one name scope.

  tf.Variable(initial_value, name=name, trainable=False), made eagerly, but
  cheaper: TensorFlow caches the kernel of an eager op by its attributes and
  device. tf.Variable gives its handle op the variable's name as an
  attribute (`debug_name`), so the handle of every slice (one per device and
  variable: thousands on large meshes) built a kernel of its own; here all
  slice handles carry one debug name, and only slices of a new shape and
  device build one (the shape must stay: TensorFlow's graph optimisations
  read it from the handle, and results change without it). Made without a
  shape (ShapelessSliceVariable), the handle op and the assignment build one
  kernel per device. The variables keep the slices' own names. Variable
  creator scopes are not consulted: slices are the lowering's state, kept in
  its VariableStore, and tf.function need not trace again because one was
  made.

  Args:
    shape: the slices' shape (fully defined).
    dtype: the slices' dtype.
  """

  def __init__(self, shape: tf.TensorShape, dtype: tf.DType):
    self._shape, self._dtype = shape, dtype
    self._handle_data = handle_data_util.create_handle_data(shape, dtype)
    with ops.name_scope("s", skip_on_eager=False) as scope:
      # The current name scope, into which every slice is named.
      self._scope = ops.name_from_scope_name(scope)[:-1]

  def __call__(
    self,
    initial_value: tf.Tensor,
    name: str,
    shape_source_variable: Optional[tf.Variable] = None,
  ) -> tf.Variable:
    """A slice variable `name` starting as `initial_value`, on its device.

    Args:
      initial_value: the slice's initial value (eager, of the shape).
      name: the slice variable's name (in the maker's name scope).
      shape_source_variable: a slice of the same shape and dtype whose
        handle has the shape, or None to give this handle its shape.
    """
    handle = gen_resource_variable_ops.var_handle_op(
      dtype=self._dtype,
      # An unknown shape given as TensorShape(None), not None, keeps the op
      # on TensorFlow's fast path.
      shape=self._shape
      if shape_source_variable is None
      else tf.TensorShape(None),
      shared_name=context.anonymous_name(),
      debug_name=_SLICE_DEBUG_NAME,
      container="",
    )
    handle_data_util.set_handle_data(handle, self._handle_data)
    gen_resource_variable_ops.assign_variable_op(handle, initial_value)
    handle_name = self._scope + name
    kwargs = dict(
      trainable=False,
      shape=self._shape,
      dtype=self._dtype,
      handle=handle,
      handle_name=handle_name,
      unique_id="%s_%d" % (handle_name, ops.uid()),
      in_graph_mode=False,
    )
    if shape_source_variable is None:
      return resource_variable_ops.BaseResourceVariable(**kwargs)
    return ShapelessSliceVariable(shape_source_variable, **kwargs)


def slice_variable_creator(
  variable,
  name: str,
  device: str,
  begin: Sequence[int],
  slice_shape: Sequence[int],
  graph_collections: Sequence[str] = (tf.compat.v1.GraphKeys.LOCAL_VARIABLES,),
) -> Callable[[], tf.Variable]:
  """A zero-argument function creating one slice variable of `variable`.

  Args:
    variable: the mtf Variable (its master gives the initial value).
    name: the slice variable's name, e.g. "w_slice_3".
    device: where the slice lives.
    begin: the slice's offsets in the full (master) tensor.
    slice_shape: the slice's shape.
    graph_collections: collections of the slice in a legacy graph.
  """

  def create():
    with tf.device(device):
      if tf.executing_eagerly():
        part = _master_part(
          variable.get_master(), begin, slice_shape, variable.slice_dtype
        )
        return _EagerSliceMaker(part.shape, part.dtype)(part, name)
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


def slice_variables_creator(
  variable,
  names: Sequence[str],
  devices: Sequence[str],
  begins: Sequence[Sequence[int]],
  slice_shape: Sequence[int],
  omit_shapes: bool = False,
) -> Callable[[List[Optional[tf.Variable]]], List[tf.Variable]]:
  """A function completing a list of `variable`'s slice variables.

  The function takes the slices already made (None where missing, one per
  name) and returns all of them, made in one go: eagerly, the master read
  once and cut into its parts at once, every slice named in one name scope.

  Args:
    variable: the mtf Variable (its master gives the initial values).
    names: the slice variables' names, e.g. "w_slice_3".
    devices: where each slice lives.
    begins: each slice's offsets in the full (master) tensor.
    slice_shape: the slices' shape.
    omit_shapes: made eagerly, the handles of all slices but the first have
      no shape and borrow the first's (see ShapelessSliceVariable).
  """

  def create(found: List[Optional[tf.Variable]]) -> List[tf.Variable]:
    if not tf.executing_eagerly():
      return [
        v
        if v is not None
        else slice_variable_creator(
          variable, names[i], devices[i], begins[i], slice_shape
        )()
        for i, v in enumerate(found)
      ]
    parts = MasterParts(variable)
    made = list(found)
    maker = None
    for i, v in enumerate(made):
      if v is not None:
        continue
      with tf.device(devices[i]):
        part = parts(begins[i], slice_shape)
        if maker is None:
          maker = _EagerSliceMaker(part.shape, part.dtype)
        made[i] = maker(part, names[i], made[0] if omit_shapes and i else None)
    return made

  return create
