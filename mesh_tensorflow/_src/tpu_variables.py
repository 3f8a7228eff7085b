"""ReplicatedVariable: one logical variable backed by one variable per replica.

Inside a TPU replicate context (`tf.compat.v1.tpu.replicate`, the model
SimdMeshImpl's programs run under) the variable's handle is a
`TPUReplicatedInput` over all the per-replica variables, so every replica
reads and writes its own copy. Everywhere else it stands for its first
variable.

What needs a TPU: building the replicated graph works on any machine (tests do
it on CPU), but *running* anything built inside a replicate context needs TPU
hardware and a TPU system initialisation. Without a TPU, only the outside-
context behaviour (a proxy of the first variable) is usable; the other
variables are neither read nor written there.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import tensorflow as tf

# The original's flag for "TensorFlow >= 2.3" (it chose a variable base class
# by it); always true for the TensorFlow versions this package supports.
TF_23 = True

try:  # Private TF modules: only needed to recognise a TPU replicate context.
  from tensorflow.python.ops import control_flow_ops as _control_flow_ops  # pylint: disable=g-direct-tensorflow-import

  _XLA_CONTEXT_CLASS = _control_flow_ops.XLAControlFlowContext
except (ImportError, AttributeError):  # pragma: no cover
  _XLA_CONTEXT_CLASS = None


def _enclosing_tpu_context():
  """The innermost XLA (TPU replicate) control-flow context, or None.

  Looks through the current graph's control-flow contexts and then through
  the graphs enclosing it (a tf.function traced inside a replicate call).
  """
  if _XLA_CONTEXT_CLASS is None or tf.executing_eagerly():
    return None
  graph = tf.compat.v1.get_default_graph()
  while graph is not None:
    context = graph._get_control_flow_context()  # pylint: disable=protected-access
    while context is not None:
      if isinstance(context, _XLA_CONTEXT_CLASS):
        return context
      context = context.outer_context
    graph = getattr(graph, "outer_graph", None)
  return None


_not_converted = tf.autograph.experimental.do_not_convert


class ReplicatedVariable(tf.__internal__.types.Tensor):
  """A variable that, on TPU, is a different variable on every replica.

  Outside a TPU replicate context it proxies `variables[0]`: reads return its
  value and assignments change only it. Inside one (graph construction under
  `tf.compat.v1.tpu.replicate`) its `handle` is the replicated handle and
  reads/assignments use it, so replica i works on `variables[i]` (in the
  order of the enclosing device assignment, if any). Running such a graph
  needs a TPU.

  Example:
    >>> slices = [tf.Variable(tf.zeros([2]), name="w_slice_%d" % i)
    ...           for i in range(2)]
    >>> w = ReplicatedVariable("w", slices)
    >>> w
    <ReplicatedVariable name='w' shape=(2,) dtype=float32 replicas=2>
    >>> _ = w.assign_add(tf.ones([2]))  # outside replicate: slices[0] only
    >>> tf.convert_to_tensor(w).numpy()  # the value of slices[0]
    array([1., 1.], dtype=float32)
    >>> slices[1].numpy()
    array([0., 0.], dtype=float32)

  Args:
    name: the name of the variable.
    variables: one tf.Variable per replica, of one shape and dtype (the first is
      the primary).
  """

  def __init__(self, name: str, variables: Sequence[tf.Variable]):
    variables = list(variables)
    if not variables:
      raise ValueError(
        "ReplicatedVariable %r needs at least one variable" % (name,)
      )
    first = variables[0]
    for i, v in enumerate(variables[1:], 1):
      if v.dtype.base_dtype != first.dtype.base_dtype:
        raise ValueError(
          "ReplicatedVariable %r: variable %d (%s) has dtype %s but "
          "variable 0 (%s) has %s"
          % (name, i, v.name, v.dtype.name, first.name, first.dtype.name)
        )
      if not v.shape.is_compatible_with(first.shape):
        raise ValueError(
          "ReplicatedVariable %r: variable %d (%s) has shape %s but "
          "variable 0 (%s) has %s"
          % (name, i, v.name, v.shape, first.name, first.shape)
        )
    self._name = name
    self._vars = variables
    self._primary_var = first
    self._common_name = first.name.split(":")[0]
    self._handle_id = "%s_%d" % (self._common_name, id(first))

  def __repr__(self) -> str:
    return "<ReplicatedVariable name=%r shape=%s dtype=%s replicas=%d>" % (
      self._name,
      self.shape,
      self.dtype.name,
      len(self._vars),
    )

  # ------------------------------------------------------------ properties
  @property
  def variables(self) -> list:
    """The per-replica variables (a copy of the list)."""
    return list(self._vars)

  @property
  def handle(self) -> tf.Tensor:
    """The replicated handle inside a TPU replicate context, else the first
    variable's handle.
    """
    context = _enclosing_tpu_context()
    if context is None:
      return self._primary_var.handle
    return context.get_replicated_var_handle(
      self._name, self._handle_id, self._vars
    )

  @property
  def initializer(self) -> Optional[tf.Operation]:
    """One op initialising every per-replica variable (None when eager)."""
    if tf.executing_eagerly():
      return None
    return tf.group(*[v.initializer for v in self._vars])

  @property
  def graph(self) -> tf.Graph:
    """The tf graph of the primary replica."""
    return self._primary_var.graph

  @property
  def name(self) -> str:
    """The name of the variable."""
    return self._name

  @property
  def dtype(self) -> tf.DType:
    """The dtype of the variable (that of its replicas)."""
    return self._primary_var.dtype

  @property
  def shape(self) -> tf.TensorShape:
    """The tf.TensorShape of the variable."""
    return self._primary_var.shape

  def get_shape(self) -> tf.TensorShape:
    """The shape of the variable.

    Returns:
      a tf.TensorShape.
    """
    return self.shape

  def to_proto(self, export_scope: Optional[str] = None):
    """Serialises the primary variable to a VariableDef.

    Args:
      export_scope: optional name scope to strip from the names.

    Returns:
      the VariableDef proto of the primary variable.
    """
    return self._primary_var.to_proto(export_scope=export_scope)

  @property
  def constraint(self) -> None:
    """None: replicated variables have no constraint."""
    return self._primary_var.constraint

  @property
  def op(self) -> tf.Operation:
    """The op of the primary replica."""
    return self.get().op

  def get(self) -> tf.Variable:
    """The first variable (what this proxies outside a replicate context).

    Returns:
      the primary tf.Variable.
    """
    return self._primary_var

  # ----------------------------------------------------------- read/write
  # These methods choose between the primary variable and the replica's
  # handle with plain Python conditions; autograph need not convert them (and
  # its conversion cache once handed one method's converted code to another
  # when a tf.function called assign_add).
  @_not_converted
  def _read_replicated(self):
    return tf.raw_ops.ReadVariableOp(
      resource=self.handle, dtype=self.dtype.base_dtype
    )

  @_not_converted
  def read_value(self) -> tf.Tensor:
    """The current value (of this replica's variable inside replicate).

    Returns:
      a tf.Tensor with the variable's value.
    """
    if _enclosing_tpu_context() is None:
      return self._primary_var.read_value()
    return self._read_replicated()

  @_not_converted
  def value(self) -> tf.Tensor:
    """The current value (see read_value).

    Returns:
      a tf.Tensor with the variable's value.
    """
    return self.read_value()

  @_not_converted
  def _assign(
    self, method: str, raw_op, value, use_locking, name, read_value: bool
  ):
    if _enclosing_tpu_context() is None:
      return getattr(self._primary_var, method)(
        value, use_locking=use_locking, name=name, read_value=read_value
      )
    value = tf.convert_to_tensor(value, dtype=self.dtype.base_dtype)
    assign_op = raw_op(resource=self.handle, value=value, name=name)
    if not read_value:
      return assign_op
    with tf.control_dependencies([assign_op]):
      return self._read_replicated()

  @_not_converted
  def assign(
    self,
    value: Any,
    use_locking: Optional[bool] = None,
    name: Optional[str] = None,
    read_value: bool = False,
  ) -> Any:
    """Assigns value; returns the new value if read_value else the op.

    Args:
      value: the new value, of the variable's shape and dtype.
      use_locking: passed on to the assignment (as tf.Variable.assign).
      name: optional name of the assignment op.
      read_value: whether to return the new value instead of the assign op.

    Returns:
      the new value (a tf.Tensor) if read_value, else the assign op.
    """
    return self._assign(
      "assign",
      tf.raw_ops.AssignVariableOp,
      value,
      use_locking,
      name,
      read_value,
    )

  @_not_converted
  def assign_add(
    self,
    delta: Any,
    use_locking: Optional[bool] = None,
    name: Optional[str] = None,
    read_value: bool = True,
  ) -> Any:
    """Adds delta to the variable.

    Args:
      delta: the value to add.
      use_locking: passed on to the assignment (as tf.Variable.assign).
      name: optional name of the assignment op.
      read_value: whether to return the new value instead of the assign op.

    Returns:
      the new value (a tf.Tensor) if read_value, else the assign op.
    """
    return self._assign(
      "assign_add",
      tf.raw_ops.AssignAddVariableOp,
      delta,
      use_locking,
      name,
      read_value,
    )

  @_not_converted
  def assign_sub(
    self,
    delta: Any,
    use_locking: Optional[bool] = None,
    name: Optional[str] = None,
    read_value: bool = True,
  ) -> Any:
    """Subtracts delta from the variable.

    Args:
      delta: the value to subtract.
      use_locking: passed on to the assignment (as tf.Variable.assign).
      name: optional name of the assignment op.
      read_value: whether to return the new value instead of the assign op.

    Returns:
      the new value (a tf.Tensor) if read_value, else the assign op.
    """
    return self._assign(
      "assign_sub",
      tf.raw_ops.AssignSubVariableOp,
      delta,
      use_locking,
      name,
      read_value,
    )

  def _dense_var_to_tensor(self, dtype=None, name=None, as_ref=False):
    """Tensor conversion: the value, or (as_ref, in replicate) the handle."""
    if _enclosing_tpu_context() is None:
      # pylint: disable=protected-access
      return self._primary_var._dense_var_to_tensor(
        dtype=dtype, name=name, as_ref=as_ref
      )
    if dtype is not None and tf.as_dtype(dtype) != self.dtype.base_dtype:
      raise ValueError(
        "cannot convert ReplicatedVariable %r of dtype %s to %s"
        % (self._name, self.dtype.name, tf.as_dtype(dtype).name)
      )
    if as_ref:
      return self.handle
    return self._read_replicated()


def _tensor_conversion(value, dtype=None, name=None, as_ref=False):
  return value._dense_var_to_tensor(dtype=dtype, name=name, as_ref=as_ref)  # pylint: disable=protected-access


tf.register_tensor_conversion_function(ReplicatedVariable, _tensor_conversion)
