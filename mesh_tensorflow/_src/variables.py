"""mtf Variables, their dtypes, the TF2 variable store and assignment ops.

A variable has one full-shape *master* tf.Variable (what checkpoints hold, under
the original's names) and, per lowering, per-processor *slices* that training
reads and writes. Masters live in a VariableStore so that re-tracing a
tf.function reuses the same tf.Variables (VariableStore says which store a
new variable uses).
"""

from __future__ import annotations

import contextlib
import sys
import threading
from typing import Callable, Dict, Iterator, List, Optional, Sequence
import weakref

from absl import logging
import tensorflow as tf
from tensorflow.python.trackable import base as trackable_base  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.trackable import data_structures  # pylint: disable=g-direct-tensorflow-import

from mesh_tensorflow._src.graph import Graph
from mesh_tensorflow._src.graph import Mesh
from mesh_tensorflow._src.graph import Operation
from mesh_tensorflow._src.graph import Tensor
from mesh_tensorflow._src.graph import current_variable_scope_name
from mesh_tensorflow._src.graph import register_graph_rewrites
from mesh_tensorflow._src.shapes import Shape
from mesh_tensorflow._src.shapes import convert_to_shape

tf1 = tf.compat.v1


class VariableDType:
  """Dtypes of a variable: checkpoint (master), in-memory (slice), activation.

  Args:
    master_dtype: the dtype of the master variable, as checkpointed.
    slice_dtype: the dtype of the per-processor slice variables; defaults to
      master_dtype.
    activation_dtype: the dtype the variable is read as in the computation;
      defaults to slice_dtype.
  """

  def __init__(
    self, master_dtype=tf.float32, slice_dtype=None, activation_dtype=None
  ) -> None:
    self._master_dtype = tf.as_dtype(master_dtype)
    self._slice_dtype = tf.as_dtype(slice_dtype or master_dtype)
    self._activation_dtype = tf.as_dtype(activation_dtype or master_dtype)

  @property
  def master_dtype(self) -> tf.DType:
    """The dtype of the master variable (as checkpointed)."""
    return self._master_dtype

  @property
  def slice_dtype(self) -> tf.DType:
    """The dtype of the per-processor slice variables."""
    return self._slice_dtype

  @property
  def activation_dtype(self) -> tf.DType:
    """The dtype in which the variable is read in the computation."""
    return self._activation_dtype

  def __repr__(self) -> str:
    return (
      "VariableDType(master_dtype=%s, slice_dtype=%s, activation_dtype=%s)"
      % (
        self._master_dtype.name,
        self._slice_dtype.name,
        self._activation_dtype.name,
      )
    )


class VariableStore(tf.Module):
  """Holds the tf.Variables behind mtf variables, keyed by full name.

  Trackable, so `tf.train.Checkpoint(store=store)` sees every master. Slice
  variables are kept apart and are not meant to be checkpointed.

  Variable lifetime (which store a new mtf variable uses, so which earlier
  variable of the same name it reuses): inside `mtf.variable_store(store)`,
  that store, always. Otherwise, in a tf.compat.v1 graph (TF1 code, or a
  tf.function called from one), one store per tf.Graph: a model built in a
  fresh tf.Graph gets fresh variables, as the original's tf.get_variable
  did. Eagerly, one store per mtf.Graph: a new mtf.Graph starts with no
  variables, so a different model may reuse the names of an earlier one (the
  original made new variables eagerly too). While a tf.function traces from
  eager code, one store per tf.function (its outermost one): every trace
  rebuilds its mtf graph, and the re-traced graph finds the variables of the
  first trace, so re-tracing creates no tf.Variables. To share variables
  between functions or mtf graphs (a train step and an eval step, say),
  create a VariableStore and build both inside `mtf.variable_store(store)`.

  Args:
    name: the name of the tf.Module.
  """

  def __init__(self, name: str = "mtf_variable_store"):
    super().__init__(name=name)
    self.masters: Dict[str, tf.Variable] = {}
    # The slices, in a plain dict: tf.Module's automatic dict wrapper copies
    # the whole dict on every insertion, quadratic in the number of slices
    # (thousands on large meshes). They are tracked for checkpoints under
    # "_slices/<key>" as the wrapper tracked them, by _slice_dependencies.
    self._slices: Dict[str, tf.Variable] = data_structures.NoDependency({})
    self._slice_dependencies = data_structures.NoDependency(
      trackable_base.Trackable()
    )
    self._track_trackable(self._slice_dependencies, name="_slices")

  def get_or_create_master(
    self,
    name: str,
    shape: Shape,
    dtype: tf.DType,
    initializer,
    trainable: bool,
    device,
  ) -> tf.Variable:
    """The master tf.Variable `name`; created on first use.

    Args:
      name: the full name of the variable (with scopes), as checkpointed.
      shape: its mtf Shape.
      dtype: the master dtype.
      initializer: a TF initializer (called with the shape and dtype), a value
        broadcast to the shape, or None for glorot_uniform.
      trainable: whether the tf.Variable is trainable.
      device: the device (string or device function) to create it on.

    Returns:
      the master tf.Variable.

    Raises:
      ValueError: if a variable of that name exists with another shape/dtype.
    """
    existing = self.masters.get(name)
    if existing is not None:
      _check_same_graph(name, existing)
      if (
        existing.shape.as_list() != shape.to_integer_list
        or existing.dtype != dtype
      ):
        raise ValueError(
          "variable %r already exists with shape %s and dtype %s; asked for "
          "%s and dtype %s"
          % (
            name,
            existing.shape.as_list(),
            existing.dtype.name,
            shape.to_string,
            dtype.name,
          )
        )
      return existing
    with tf.init_scope(), _device_scope(device, name, shape, dtype):
      with _root_name_scope():
        var = tf.Variable(
          initial_value=_initial_value_fn(initializer, shape, dtype),
          name=name,
          trainable=trainable,
          dtype=dtype,
        )
    self.masters[name] = var
    return var

  def get_or_create_slice(
    self, key: str, create_fn: Callable[[], tf.Variable]
  ) -> tf.Variable:
    """The slice tf.Variable stored under `key`; created on first use.

    Args:
      key: a string identifying the slice (variable name and processor).
      create_fn: a function of no arguments creating the tf.Variable.

    Returns:
      the slice tf.Variable.
    """
    return self.get_or_create_slices([key], lambda _: [create_fn()])[0]

  def get_or_create_slices(
    self,
    keys: Sequence[str],
    create_fn: Callable[[List[Optional[tf.Variable]]], List[tf.Variable]],
  ) -> List[tf.Variable]:
    """The slice tf.Variables stored under `keys`; the missing ones created.

    Args:
      keys: strings identifying the slices (variable name and processor).
      create_fn: a function taking the stored slices (None where missing)
        and returning all of them, the missing ones created (in one go, e.g.
        from one read of the master).

    Returns:
      the slice tf.Variables, one per key.
    """
    found = [self._slices.get(key) for key in keys]
    if all(v is not None for v in found):
      return found
    with tf.init_scope(), _root_name_scope():
      made = create_fn(found)
    for key, old, new in zip(keys, found, made):
      if old is None:
        self._slices[key] = new
        # pylint: disable-next=protected-access
        self._slice_dependencies._track_trackable(new, name=key)
    return made


def _check_same_graph(name: str, var: tf.Variable) -> None:
  """ValueError if `var` lives in another tf.Graph than the one in use.

  A variable of a finished tf.compat.v1 Graph cannot be used in a new one
  (its reads would be built in the old graph); use one store per graph.
  """
  with tf.init_scope():
    current = None if tf.executing_eagerly() else tf1.get_default_graph()
  try:
    owner = var.graph
  except (AttributeError, RuntimeError):  # an eager variable
    owner = None
  if owner is not current:
    raise ValueError(
      "variable %r of this VariableStore was created in another TensorFlow "
      "graph (or eagerly); use one VariableStore per tf.Graph" % name
    )


class _PendingVariableOp:
  """Describes, to a device function, the variable op about to be made.

  Eagerly there is no op to pass (and tf.device rejects functions), so a
  variable placer's device_function is asked about this stand-in instead.
  """

  type = "VarHandleOp"

  def __init__(self, name: str, shape: Shape, dtype: tf.DType):
    self.name = name
    self._attrs = {
      "shape": tf.TensorShape(shape.to_integer_list),
      "dtype": dtype,
    }

  def get_attr(self, key: str):
    return self._attrs[key]


def _device_scope(device, name: str, shape: Shape, dtype: tf.DType):
  """tf.device for a device string or a device function (variable placer)."""
  if not callable(device):
    return tf.device(device)
  if not tf.executing_eagerly():
    return tf1.device(device)  # tf.device (v2) rejects device functions.
  return tf.device(device(_PendingVariableOp(name, shape, dtype)))


@contextlib.contextmanager
def _root_name_scope():
  """Resets the TF name scope in graph mode so variable names are exact."""
  if tf.executing_eagerly():
    yield
  else:
    with tf1.get_default_graph().name_scope(None):
      yield


def _initial_value_fn(initializer, shape: Shape, dtype: tf.DType):
  """A zero-argument callable producing the initial full-shape value."""
  dims = shape.to_integer_list
  if initializer is None:
    initializer = tf1.glorot_uniform_initializer()
  if callable(initializer):
    return lambda: tf.cast(initializer(dims, dtype=dtype), dtype)
  return lambda: tf.cast(
    tf.broadcast_to(tf.convert_to_tensor(initializer), dims), dtype
  )


_store_override = threading.local()
# tf.compat.v1 Graph -> its store.
_graph_stores = weakref.WeakKeyDictionary()
# tf.function -> the store of the mtf graphs its traces build.
_function_stores = weakref.WeakKeyDictionary()
# mtf Graph built eagerly -> its store.
_mtf_graph_stores = weakref.WeakKeyDictionary()
# The store of the mtf graph that last made a variable eagerly (what
# get_default_variable_store() returns in eager code).
_latest_eager_store: Optional[VariableStore] = None


def _outermost_traced_function() -> Optional[object]:
  """The outermost tf.function being traced by this thread, or None.

  Its Python frames are on the stack while its function body runs; a traced
  function called from inside another's trace belongs to that outer one.

  Why the stack: TensorFlow (2.21) has no public way to ask which tf.function
  is tracing. What tracing does expose changes from one trace to the next: the
  default graph is a new FuncGraph per trace, and the variable creator scope a
  tf.function installs differs between its first trace and later ones. A store
  keyed on either would be new in a re-trace, which would then create
  tf.Variables again, and tf.function rejects that ("only supports singleton
  tf.Variables created on the first call").
  """
  found = None
  frame = sys._getframe(1)  # pylint: disable=protected-access
  while frame is not None:
    owner = frame.f_locals.get("self")
    if isinstance(owner, tf.types.experimental.PolymorphicFunction):
      found = owner
    frame = frame.f_back
  return found


def _store_for(stores: weakref.WeakKeyDictionary, key) -> VariableStore:
  store = stores.get(key)
  if store is None:
    store = stores[key] = VariableStore()
  return store


def _store_in_context(mtf_graph=None) -> VariableStore:
  """The store for variables made now (of `mtf_graph`, if given)."""
  global _latest_eager_store
  stack = getattr(_store_override, "stack", None)
  if stack:
    return stack[-1]
  with tf.init_scope():
    outer_graph = None if tf.executing_eagerly() else tf1.get_default_graph()
  if outer_graph is not None:
    return _store_for(_graph_stores, outer_graph)
  if not tf.executing_eagerly():  # Tracing a tf.function from eager code.
    function = _outermost_traced_function()
    if function is not None:
      return _store_for(_function_stores, function)
  if mtf_graph is not None:
    _latest_eager_store = _store_for(_mtf_graph_stores, mtf_graph)
  elif _latest_eager_store is None:
    _latest_eager_store = VariableStore()
  return _latest_eager_store


def get_default_variable_store() -> VariableStore:
  """The VariableStore new mtf variables would use here; see VariableStore.

  Inside `mtf.variable_store(store)`: that store. In a tf.compat.v1 graph:
  that graph's store. While a tf.function traces: that function's store.
  Eagerly: the store of the mtf graph that last created a variable.

  Returns:
    the VariableStore that new mtf variables use.
  """
  return _store_in_context()


@contextlib.contextmanager
def variable_store(store: VariableStore) -> Iterator[VariableStore]:
  """Makes `store` the VariableStore for mtf variables created inside.

  Example:
    >>> mesh = mtf.Mesh(mtf.Graph(), "my_mesh")
    >>> with mtf.variable_store(mtf.VariableStore()) as store:
    ...   w = mtf.get_variable(mesh, "w", "d_model:2;d_ff:3")
    >>> list(store.masters)
    ['w']
    >>> store.masters["w"].shape.as_list()
    [2, 3]

  Args:
    store: a VariableStore.

  Yields:
    the VariableStore `store`.
  """
  if not hasattr(_store_override, "stack"):
    _store_override.stack = []
  _store_override.stack.append(store)
  try:
    yield store
  finally:
    _store_override.stack.pop()


class Variable(Operation):
  """An mtf variable; its output is the variable's value as an activation.

  Args:
    mesh: the mtf Mesh.
    name: the full name of the variable (with scopes).
    shape: the Shape of the variable (or anything convert_to_shape accepts).
    dtype: a VariableDType.
    initializer: a TF initializer for the master variable.
    trainable: whether the variable joins the graph's trainable_variables.
  """

  shared_by_clones = True  # Rematerialised code reads the same variable.

  def __init__(
    self,
    mesh: Mesh,
    name: str,
    shape,
    dtype: VariableDType,
    initializer,
    trainable: bool,
    **kwargs,
  ):
    super().__init__([], mesh, name="name_will_be_set_below")
    if not isinstance(dtype, VariableDType):
      raise ValueError(
        "dtype of variable %r must be a VariableDType, got %r" % (name, dtype)
      )
    for k in kwargs:
      if k not in (
        "collections",
        "use_resource",
        "caching_device",
        "partitioner",
        "validate_shape",
        "constraint",
        "synchronization",
        "aggregation",
        "regularizer",
      ):
        raise TypeError("unexpected argument %r for variable %r" % (k, name))
    self._variable_dtype = dtype
    self._trainable = trainable
    self._shape = convert_to_shape(shape)
    scope = current_variable_scope_name()
    self._name = scope + "/" + name if scope else name
    self._store = _store_in_context(mesh.graph)
    self._master = self._store.get_or_create_master(
      self._name,
      self._shape,
      dtype.master_dtype,
      initializer,
      trainable,
      mesh.variable_placer_fn,
    )
    self._outputs = [Tensor(self, self._shape, dtype.activation_dtype)]
    self.graph.register_variable(self)

  def lower(self, lowering) -> None:
    mesh_impl = lowering.mesh_impl(self)
    laid_out = mesh_impl.LaidOutVariable(self, mesh_impl)
    lowering.variables[self] = laid_out
    activation_dtype = self.activation_dtype
    lowering.set_tensor_lowering(
      self.outputs[0],
      mesh_impl.slicewise(
        lambda v: tf.cast(_read(v), activation_dtype), laid_out.laid_out_tensor
      ),
    )

  def get_master(self) -> tf.Tensor:
    """Reads the master tf.Variable.

    Returns:
      a tf.Tensor with the full value of the variable, in the master dtype.
    """
    return self._master.read_value()

  def assign_to_master(self, val: tf.Tensor):
    """Assigns a full value to the master tf.Variable.

    Args:
      val: a tf.Tensor of the variable's full shape (cast to master_dtype).

    Returns:
      the tf assign op.
    """
    return self._master.assign(tf.cast(val, self.master_dtype))

  @property
  def master(self) -> tf.Variable:
    """The master tf.Variable (full shape, master dtype)."""
    return self._master

  @property
  def store(self) -> VariableStore:
    """The VariableStore holding the master variable."""
    return self._store

  @property
  def value(self) -> Tensor:
    """The mtf Tensor of the variable's value (the operation's output)."""
    return self.outputs[0]

  @property
  def shape(self) -> Shape:
    """The Shape of the variable."""
    return self._shape

  @property
  def size(self) -> int:
    """The number of elements of the variable."""
    return self._shape.size

  @property
  def dtype(self) -> VariableDType:
    """The VariableDType (master, slice and activation dtypes)."""
    return self._variable_dtype

  @property
  def variable_dtype(self) -> VariableDType:
    """The VariableDType of the variable (alias of dtype)."""
    return self._variable_dtype

  @property
  def master_dtype(self) -> tf.DType:
    """The dtype of the master variable (as checkpointed)."""
    return self._variable_dtype.master_dtype

  @property
  def slice_dtype(self) -> tf.DType:
    """The dtype of the per-processor slice variables."""
    return self._variable_dtype.slice_dtype

  @property
  def activation_dtype(self) -> tf.DType:
    """The dtype of the variable's value as read in the computation."""
    return self._variable_dtype.activation_dtype

  @property
  def trainable(self) -> bool:
    """Whether the variable is in the graph's trainable_variables."""
    return self._trainable

  @property
  def master_device(self) -> str:
    """The device of the master variable."""
    return self._master.device


def _read(v):
  """The value of a slice: one read op (read_value adds an identity)."""
  return v.value() if isinstance(v, tf.Variable) else tf.identity(v)


def get_variable(
  mesh: Mesh,
  name: str,
  shape,
  dtype=tf.float32,
  master_dtype=None,
  slice_dtype=None,
  activation_dtype=None,
  initializer=None,
  trainable: bool = True,
  **kwargs,
) -> Tensor:
  """Creates (or reuses, by full name) an mtf variable; returns its value.

  Example:
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> w = mtf.get_variable(converter.mesh, "w", "d_model:2;d_ff:3",
    ...                      initializer=tf.ones_initializer())
    >>> w
    Tensor[w:0, Shape[d_model=2, d_ff=3], float32]
    >>> converter.convert_mtf_tensor_to_np_array(w)
    array([[1., 1., 1.],
           [1., 1., 1.]], dtype=float32)

  Args:
    mesh: the mtf Mesh.
    name: the variable's name, prefixed by the current variable scope.
    shape: its Shape (or anything convert_to_shape accepts).
    dtype: a tf.DType, or a VariableDType giving master, slice and activation
      dtypes.
    master_dtype: overrides the master (checkpoint) dtype.
    slice_dtype: overrides the slice dtype.
    activation_dtype: overrides the activation dtype.
    initializer: a TF initializer; defaults to that of the variable scope, else
      glorot_uniform as in tf.compat.v1.get_variable.
    trainable: whether the variable is trained.

  Returns:
    an mtf Tensor of shape `shape` and the activation dtype: the variable's
    value.
  """
  if dtype is None:
    dtype = tf.float32
  if isinstance(dtype, VariableDType):
    if master_dtype or slice_dtype or activation_dtype:
      raise ValueError(
        "variable %r: give per-role dtypes either in the "
        "VariableDType or as arguments, not both" % name
      )
    variable_dtype = dtype
  else:
    dtype = tf.as_dtype(dtype)
    variable_dtype = VariableDType(
      master_dtype or dtype, slice_dtype or dtype, activation_dtype or dtype
    )
  scope = current_variable_scope_name()
  full_name = scope + "/" + name if scope else name
  existing = mesh.graph.name_to_variable.get(full_name)
  if existing is not None:
    if existing.shape != convert_to_shape(shape):
      raise ValueError(
        "variable %r reused with shape %s, created with %s"
        % (
          full_name,
          convert_to_shape(shape).to_string,
          existing.shape.to_string,
        )
      )
    return existing.outputs[0]
  if initializer is None:
    logging.log_first_n(
      logging.WARNING,
      "Using default tf glorot_uniform_initializer for "
      "variable %s. The initialzer will guess the input and output "
      "dimensions based on dimension order.",
      10,
      full_name,
    )
  v = Variable(
    mesh, name, shape, variable_dtype, initializer, trainable, **kwargs
  )
  return v.outputs[0]


class ReadVariable(Operation):
  """Reads a variable's slices again (after assignments); identity gradient.

  Args:
    var: the mtf Variable to read.
    name: an optional name for the operation.
  """

  def __init__(self, var: Variable, name: Optional[str] = None):
    super().__init__([var.outputs[0]], name=name or "read_variable")
    self._var = var
    self._outputs = [Tensor(self, var.shape, var.activation_dtype)]

  def gradient(
    self, grad_ys: Sequence[Optional[Tensor]]
  ) -> Sequence[Optional[Tensor]]:
    return grad_ys

  def lower(self, lowering) -> None:
    mesh_impl = lowering.mesh_impl(self)
    laid_out = lowering.variables[self._var]
    dtype = self._var.activation_dtype
    lowering.set_tensor_lowering(
      self.outputs[0],
      mesh_impl.slicewise(
        lambda v: tf.cast(_read(v), dtype), laid_out.laid_out_tensor
      ),
    )


def read_variable(var) -> Tensor:
  """The current value of a variable, read after assignments it depends on.

  Args:
    var: an mtf Variable, or its output Tensor.

  Returns:
    an mtf Tensor with the variable's value.
  """
  return ReadVariable(_variable_of(var)).outputs[0]


def assign_slice(variable: Variable, slice_var, val):
  """Assigns val to one slice variable (the default assign_fn).

  Args:
    variable: the mtf Variable the slice belongs to.
    slice_var: the tf.Variable holding the slice.
    val: a tf.Tensor of the slice's shape.

  Returns:
    the assignment, as slice_var's assign method returns it.
  """
  return slice_var.assign(tf.cast(val, variable.slice_dtype))


def assign_add_slice(variable: Variable, slice_var, val):
  """Assigns slice_var + val to one slice variable.

  Args:
    variable: the mtf Variable the slice belongs to.
    slice_var: the tf.Variable holding the slice.
    val: a tf.Tensor of the slice's shape.

  Returns:
    the assignment, as slice_var's assign method returns it.
  """
  return slice_var.assign_add(tf.cast(val, variable.slice_dtype))


def assign_sub_slice(variable: Variable, slice_var, val):
  """Assigns slice_var - val to one slice variable.

  Args:
    variable: the mtf Variable the slice belongs to.
    slice_var: the tf.Variable holding the slice.
    val: a tf.Tensor of the slice's shape.

  Returns:
    the assignment, as slice_var's assign method returns it.
  """
  return slice_var.assign_sub(tf.cast(val, variable.slice_dtype))


class Assign(Operation):
  """Assigns new values to variables' slices; lowers to a tf.group.

  Args:
    variables: the mtf Variables to assign.
    new_values: one mtf Tensor per variable, of its shape.
    assign_fn: a function (variable, slice_var, value) assigning one slice, e.g.
      assign_slice or assign_add_slice.
    name: an optional name for the operation.
  """

  def __init__(
    self,
    variables: List[Variable],
    new_values: List[Tensor],
    assign_fn=assign_slice,
    name: Optional[str] = None,
  ):
    variables = list(variables)
    new_values = list(new_values)
    if len(variables) != len(new_values):
      raise ValueError(
        "Assign got %d variables and %d values"
        % (len(variables), len(new_values))
      )
    for var, val in zip(variables, new_values):
      if var.shape != val.shape:
        raise ValueError(
          "cannot assign %s to variable %s of shape %s"
          % (val.to_string, var.name, var.shape.to_string)
        )
    super().__init__(new_values, variables[0].mesh, name=name or "assign")
    self._variables = variables
    self._assign_fn = assign_fn

  @property
  def variables(self) -> List[Variable]:
    """The mtf Variables assigned, in order."""
    return self._variables

  @property
  def assign_fn(self) -> Callable:
    """The function (variable, slice_var, value) assigning each slice."""
    return self._assign_fn

  def lower(self, lowering) -> None:
    updates = []
    for var, val in zip(self._variables, self._inputs):
      laid_out_val = lowering.tensors[val].to_laid_out_tensor()
      updates.append(
        lowering.variables[var].assign_to_slices(
          self._assign_fn, laid_out_val.all_slices
        )
      )
    lowering.operations[self] = tf.group(*[u for u in updates if u is not None])


def _variable_of(var) -> Variable:
  """The Variable behind var: a Variable, its output, or a chain of 1-input ops."""
  if isinstance(var, Variable):
    return var
  if not isinstance(var, Tensor):
    raise TypeError("expected an mtf Variable or Tensor, got %r" % (var,))
  op = var.operation
  while not isinstance(op, Variable):
    if len(op.inputs) != 1:
      raise ValueError(
        "%s is not a variable nor a chain of one-input ops "
        "leading to one" % var.name
      )
    op = op.inputs[0].operation
  return op


def assign(
  var, new_val: Tensor, assign_fn=assign_slice, name: Optional[str] = None
) -> Operation:
  """Assign op; `var` may be a Variable or its output tensor.

  Args:
    var: an mtf Variable, or its output Tensor.
    new_val: an mtf Tensor of the variable's shape.
    assign_fn: a function (variable, slice_var, value) assigning one slice.
    name: an optional name for the operation.

  Returns:
    the Assign Operation; lowering.lowered_operation gives its tf op.
  """
  return Assign([_variable_of(var)], [new_val], assign_fn=assign_fn, name=name)


def assign_add(var, new_val: Tensor) -> Operation:
  """Adds new_val to the variable (see assign).

  Args:
    var: an mtf Variable, or its output Tensor.
    new_val: an mtf Tensor of the variable's shape.

  Returns:
    the Assign Operation.
  """
  return assign(var, new_val, assign_fn=assign_add_slice)


def assign_sub(var, new_val: Tensor) -> Operation:
  """Subtracts new_val from the variable (see assign).

  Args:
    var: an mtf Variable, or its output Tensor.
    new_val: an mtf Tensor of the variable's shape.

  Returns:
    the Assign Operation.
  """
  return assign(var, new_val, assign_fn=assign_sub_slice)


def combine_assignments(graph: Graph, assignments) -> List[Assign]:
  """Merges Assign operations that share an assign_fn into one Assign each.

  The merged Assigns replace the originals in the graph (Graph's
  combine_assignments method).
  """
  by_fn = {}
  order = []
  for a in assignments:
    if not isinstance(a, Assign):
      raise TypeError(
        "combine_assignments expects Assign operations, got %r" % (a,)
      )
    key = a.assign_fn
    if key not in by_fn:
      by_fn[key] = ([], [])
      order.append(key)
    by_fn[key][0].extend(a.variables)
    by_fn[key][1].extend(a.inputs)
  merged = set(assignments)
  graph.operations[:] = [op for op in graph.operations if op not in merged]
  return [Assign(by_fn[k][0], by_fn[k][1], assign_fn=k) for k in order]


register_graph_rewrites({"combine_assignments": combine_assignments})

__all__ = [
  "Assign",
  "ReadVariable",
  "Variable",
  "VariableDType",
  "VariableStore",
  "assign",
  "assign_add",
  "assign_add_slice",
  "assign_slice",
  "assign_sub",
  "assign_sub_slice",
  "get_default_variable_store",
  "get_variable",
  "read_variable",
  "variable_store",
]
