"""The lazy mtf program: Graph, Mesh, Tensor and Operation.

An mtf program is built once as a list of Operations on named-dimension Tensors.
Nothing is computed here; a Lowering later asks each Operation to emit TensorFlow
ops for one mesh implementation.
"""

from __future__ import annotations

import copy
from typing import (
  Any,
  Callable,
  Dict,
  List,
  Mapping,
  Optional,
  Sequence,
  Tuple,
  Union,
)

import gin
import tensorflow as tf

from mesh_tensorflow._src.shapes import Shape
from mesh_tensorflow._src.shapes import convert_to_shape

tf1 = tf.compat.v1

# The functions behind Tensor's arithmetic operators, by name: "add", "sub",
# "multiply", "divide", "floordiv", "mod" (binary) and "negative" (unary).
# They are operations built on this module, so the op module that defines them
# registers them once when it is imported (as JAX registers its array methods);
# `import mesh_tensorflow` imports it.
_TENSOR_OPERATORS: Dict[str, Callable[..., Any]] = {}

# Graph methods whose work needs operation types defined on top of this module
# ("combine_assignments": Assign, in variables.py; "rewrite_stack_variables":
# StackedVariable, in stacking.py). Each module registers its implementation,
# a function taking the Graph first, when it is imported.
_GRAPH_REWRITES: Dict[str, Callable[..., Any]] = {}

TENSOR_OPERATOR_NAMES = (
  "add",
  "sub",
  "multiply",
  "divide",
  "floordiv",
  "mod",
  "negative",
)
GRAPH_REWRITE_NAMES = ("combine_assignments", "rewrite_stack_variables")


def _register(
  table: Dict[str, Callable[..., Any]],
  allowed: Sequence[str],
  kind: str,
  implementations: Mapping[str, Callable[..., Any]],
) -> None:
  unknown = sorted(set(implementations) - set(allowed))
  if unknown:
    raise ValueError(
      "unknown %s %s; expected names from %s" % (kind, unknown, list(allowed))
    )
  table.update(implementations)


def _registered(
  table: Dict[str, Callable[..., Any]], kind: str, name: str, owner: str
) -> Callable[..., Any]:
  try:
    return table[name]
  except KeyError:
    raise NotImplementedError(
      "%s %r is not registered: import %s (or mesh_tensorflow), which "
      "registers it" % (kind, name, owner)
    ) from None


def register_tensor_operators(
  operators: Mapping[str, Callable[..., Any]],
) -> None:
  """Sets the functions behind Tensor's arithmetic operators.

  Example:
    Importing mesh_tensorflow registers the ops; `1 - x` then builds
    negative(x) and adds 1:

    >>> TENSOR_OPERATOR_NAMES
    ('add', 'sub', 'multiply', 'divide', 'floordiv', 'mod', 'negative')
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> x = converter.convert_np_array_to_mtf_tensor([1, 2], ["n"])
    >>> y = 1 - x
    >>> [op.name for op in converter.graph.operations]
    ['constant', 'negative', 'sub']
    >>> converter.convert_mtf_tensor_to_np_array(y)
    array([ 0, -1], dtype=int32)

  Args:
    operators: name (one of TENSOR_OPERATOR_NAMES) -> function. Binary
      functions take (x1, x2); the reflected operators pass their operands
      swapped, so `1 / x` calls divide(1, x).
  """
  _register(
    _TENSOR_OPERATORS, TENSOR_OPERATOR_NAMES, "Tensor operator", operators
  )


def register_graph_rewrites(rewrites: Mapping[str, Callable[..., Any]]) -> None:
  """Sets implementations of Graph methods that need higher-level op types.

  Args:
    rewrites: name (one of GRAPH_REWRITE_NAMES) -> function taking the Graph
      followed by the method's arguments.
  """
  _register(_GRAPH_REWRITES, GRAPH_REWRITE_NAMES, "Graph rewrite", rewrites)


def _tensor_operator(name: str) -> Callable[..., Any]:
  return _registered(
    _TENSOR_OPERATORS,
    "Tensor operator",
    name,
    "mesh_tensorflow._src.ops.binary",
  )


def current_variable_scope_name() -> str:
  """Name of the current tf.compat.v1 variable scope ("" at top level)."""
  return tf1.get_variable_scope().name


class Graph:
  """A container of mtf Operations, in the order they were created.

  Example:
    >>> graph = mtf.Graph()
    >>> mesh = mtf.Mesh(graph, "my_mesh")
    >>> x = mtf.zeros(mesh, "batch:2;d_model:3")
    >>> y = x + 1.0
    >>> [op.name for op in graph.operations]
    ['constant', 'scalar_add']
  """

  def __init__(self) -> None:
    self._operations: List["Operation"] = []
    self._trainable_variables = []
    self._all_variables = []
    self._names_in_use = {}
    self._rewrote_stack_variables = False
    # Full variable name -> mtf Variable; get_variable reuses these.
    self.name_to_variable = {}
    self.captured_variable_scope = tf1.get_variable_scope()

  def __repr__(self) -> str:
    return self.to_string

  @property
  def operations(self) -> List["Operation"]:
    """All operations of the graph, in creation order."""
    return self._operations

  @property
  def trainable_variables(self) -> list:
    """The trainable mtf Variables, in creation order."""
    return self._trainable_variables

  @property
  def all_variables(self) -> list:
    """Every mtf Variable of the graph (trainable or not), in creation order."""
    return self._all_variables

  @property
  def to_string(self) -> str:
    """A multi-line description of the graph: one line per operation."""
    return "\n".join(op.to_string for op in self._operations)

  def unique_name(self, name: str, mark_as_used: bool = True) -> str:
    """Uniquifies `name` under the current tf variable scope, TF style.

    Matching is case-insensitive: after "a" come "a_1", "a_2"; asking for "a_1"
    afterwards yields "a_1_1"; "A" after "a" yields "A_1".

    Args:
      name: the requested name (without the variable scope prefix).
      mark_as_used: if True, records the returned name so later calls do not
        return it again; if False, only previews the name.

    Returns:
      str: `name` prefixed by the current tf variable scope, with a "_<n>"
      suffix if that name is already in use.
    """
    scope_name = current_variable_scope_name()
    if scope_name:
      name = scope_name + "/" + name
    name_key = name.lower()
    count = self._names_in_use.get(name_key, 0)
    if mark_as_used:
      self._names_in_use[name_key] = count + 1
    if count > 0:
      base_key = name_key
      while name_key in self._names_in_use:
        name_key = "%s_%d" % (base_key, count)
        count += 1
      if mark_as_used:
        self._names_in_use[name_key] = 1
      name = "%s_%d" % (name, count - 1)
    return name

  def make_variables_untrainable(self, variables) -> None:
    """Removes the given mtf Variables from `trainable_variables`.

    Args:
      variables: an iterable of mtf Variables of this graph.
    """
    untrainable = set(variables)
    for v in untrainable:
      v._trainable = False  # pylint: disable=protected-access
    self._trainable_variables = [
      v for v in self._trainable_variables if v not in untrainable
    ]

  def register_variable(self, variable) -> None:
    """Records a newly created mtf Variable (called by Variable.__init__).

    Args:
      variable: the new mtf Variable.
    """
    self._all_variables.append(variable)
    if variable.trainable:
      self._trainable_variables.append(variable)
    self.name_to_variable[variable.name] = variable

  def clone_operations(self, ops: Sequence["Operation"], input_mapping):
    """Copies `ops` (except Variables and random ops) with remapped inputs.

    Used for rematerialisation. Operations whose `shared_by_clones` is True
    (Variables, random operations) are not copied: the copies read the same
    variables and reuse the same random values.

    Example:
      >>> converter = mtf.test_utils.NumpyConverter()
      >>> graph = converter.graph
      >>> x = converter.convert_np_array_to_mtf_tensor([1, 2], ["n"])
      >>> y = x * 10
      >>> x2 = converter.convert_np_array_to_mtf_tensor([3, 4], ["n"])
      >>> new_ops, mapping = graph.clone_operations([y.operation], {x: x2})
      >>> converter.convert_mtf_tensor_to_np_array(mapping[y])  # y from x2
      array([30, 40], dtype=int32)

    Args:
      ops: operations to copy, in graph order.
      input_mapping: dict {Tensor: Tensor} of replacements for inputs.

    Returns:
      (new_ops, extended_mapping): the copies and the mapping extended with
      {old output: new output} for every copied operation.
    """
    tensor_map = dict(input_mapping)
    op_map = {}
    new_ops = []
    for op in ops:
      if op.shared_by_clones:
        continue
      new_ops.append(self._copy_operation(op, tensor_map, op_map))
    return new_ops, tensor_map

  def _copy_operation(self, op: "Operation", tensor_map, op_map) -> "Operation":
    """A registered copy of `op`; extends tensor_map with its outputs.

    The copy is a shallow copy whose input tensors, and any other attribute
    holding a Tensor or an Operation (also inside lists and tuples), are
    replaced through the maps; its outputs are fresh Tensors.
    """
    # pylint: disable=protected-access
    new_op = copy.copy(op)
    for key, value in list(vars(op).items()):
      if key in ("_inputs", "_outputs"):
        continue
      vars(new_op)[key] = _remap(value, tensor_map, op_map)
    new_op._inputs = [tensor_map.get(t, t) for t in op.inputs]
    new_op._name = self.unique_name(op.name)
    new_outputs = []
    for i, t in enumerate(op.outputs):
      new_t = Tensor(new_op, t.shape, t.dtype, index=i)
      tensor_map[t] = new_t
      new_outputs.append(new_t)
    new_op._outputs = new_outputs
    self._operations.append(new_op)
    op_map[op] = new_op
    return new_op

  def capture_operations(
    self, fn: Callable[[], Any]
  ) -> Tuple[Any, List["Operation"]]:
    """Runs `fn` and returns (its output, the operations it created).

    Args:
      fn: a function of no arguments that builds mtf operations in this graph.

    Returns:
      (output, operations): the value `fn` returned and the list of operations
      it added to the graph, in creation order.
    """
    n = len(self._operations)
    output = fn()
    return output, self._operations[n:]

  def combine_assignments(
    self, assignments: Sequence["Operation"]
  ) -> List["Operation"]:
    """Merges Assign operations that share an assign_fn into one Assign each.

    Args:
      assignments: a list of mtf Assign operations.

    Returns:
      a list of Assign operations, one per distinct assign_fn, together
      assigning everything `assignments` assigned.
    """
    return _registered(
      _GRAPH_REWRITES,
      "Graph rewrite",
      "combine_assignments",
      "mesh_tensorflow._src.variables",
    )(self, assignments)

  @property
  def stacked_variables_rewritten(self) -> bool:
    """Whether rewrite_stack_variables() has run on this graph."""
    return self._rewrote_stack_variables

  # Configurable as the original's (gin name
  # mesh_tensorflow.ops.rewrite_stack_variables).
  @gin.configurable(module="mesh_tensorflow.ops")
  def rewrite_stack_variables(
    self,
    max_combined_variable_size: int = 2**29,
    max_combined_slice_size: int = 2**27,
    mesh_to_impl: Optional[Mapping["Mesh", Any]] = None,
  ) -> None:
    """Replaces groups of same-shape variables by StackedVariables (once).

    A speed optimisation with no effect on results or checkpoints; see
    _src/stacking.py for the grouping rule.

    Args:
      max_combined_variable_size: the largest number of elements of a stack of
        variables (summed over the stacked variables).
      max_combined_slice_size: the largest number of elements of one processor's
        slice of a stack.
      mesh_to_impl: optional dict {Mesh: MeshImpl}; when given, slice sizes
        are measured with it and variables of one-processor meshes are left
        alone.

    Raises:
      ValueError: if called a second time.
    """
    rewrite = _registered(
      _GRAPH_REWRITES,
      "Graph rewrite",
      "rewrite_stack_variables",
      "mesh_tensorflow._src.stacking",
    )
    if self._rewrote_stack_variables:
      raise ValueError("rewrite_stack_variables() may only be called once.")
    self._rewrote_stack_variables = True
    rewrite(
      self, max_combined_variable_size, max_combined_slice_size, mesh_to_impl
    )


class Mesh:
  """A named set of processors; its shape is given only at lowering time.

  Example:
    >>> mesh = mtf.Mesh(mtf.Graph(), "my_mesh")
    >>> mesh
    Mesh(name='my_mesh')
    >>> x = mtf.ones(mesh, "batch:4")
    >>> x.mesh is mesh
    True

  Args:
    graph: the mtf Graph the mesh belongs to.
    name: the mesh name; layouts and mesh implementations are looked up by it at
      lowering time.
    variable_placer: optional object with a `device_function(var)` method (such
      as utils.BalancedVariablePlacer) choosing the device of each master
      variable; None places them on "cpu:0".
  """

  def __init__(self, graph: Graph, name: str, variable_placer=None):
    self._graph = graph
    self._name = name
    self._variable_placer = variable_placer

  def __repr__(self) -> str:
    return "Mesh(name=%r)" % self._name

  @property
  def graph(self) -> Graph:
    """The mtf Graph this mesh belongs to."""
    return self._graph

  @property
  def name(self) -> str:
    """The name of the mesh."""
    return self._name

  @property
  def variable_placer_fn(self) -> Union[Callable, str]:
    """Device function (or "cpu:0") placing the master variables."""
    if self._variable_placer is not None:
      return self._variable_placer.device_function
    return "cpu:0"


class Tensor:
  """A lazy named-dimension tensor: the output of an mtf Operation.

  Args:
    operation: the Operation producing this tensor.
    shape: its Shape (or anything convert_to_shape accepts), with named
      dimensions.
    dtype: its tf.DType (or anything tf.as_dtype accepts).
    name: optional name; defaults to "<operation name>:<index>".
    index: the position of the tensor among the operation's outputs.
  """

  def __init__(
    self,
    operation: "Operation",
    shape,
    dtype,
    name: Optional[str] = None,
    index: int = 0,
  ):
    if not isinstance(shape, Shape):
      shape = convert_to_shape(shape)
    self._operation = operation
    self._shape = shape
    self._dtype = tf.as_dtype(dtype)
    self._name = name if name is not None else "%s:%d" % (operation.name, index)
    self.usable = True

  def __repr__(self) -> str:
    return self.to_string

  @property
  def shape(self) -> Shape:
    """The Shape of the tensor: its named dimensions and their sizes."""
    return self._shape

  @property
  def size(self) -> int:
    """The number of elements of the (whole, not sliced) tensor."""
    return self._shape.size

  @property
  def mesh(self) -> Mesh:
    """The Mesh of the operation producing the tensor."""
    return self._operation.mesh

  @property
  def graph(self) -> Graph:
    """The Graph of the operation producing the tensor."""
    return self._operation.graph

  @property
  def operation(self) -> "Operation":
    """The Operation producing the tensor."""
    return self._operation

  @property
  def dtype(self) -> tf.DType:
    """The tf.DType of the tensor."""
    return self._dtype

  @property
  def name(self) -> str:
    """The name of the tensor ("<operation name>:<index>" by default)."""
    return self._name

  @property
  def to_string(self) -> str:
    """The tensor as "Tensor[name, shape, dtype]", as repr() prints it."""
    return "Tensor[%s, %s, %s]" % (
      self._name,
      self._shape.to_string,
      self._dtype.name,
    )

  # Arithmetic operators, implemented by the op modules (see
  # register_tensor_operators).
  def __add__(self, other):
    return _tensor_operator("add")(self, other)

  def __radd__(self, other):
    return _tensor_operator("add")(self, other)

  def __sub__(self, other):
    return _tensor_operator("sub")(self, other)

  def __rsub__(self, other):
    return _tensor_operator("sub")(other, self)

  def __mul__(self, other):
    return _tensor_operator("multiply")(self, other)

  def __rmul__(self, other):
    return _tensor_operator("multiply")(other, self)

  def __truediv__(self, other):
    return _tensor_operator("divide")(self, other)

  def __rtruediv__(self, other):
    return _tensor_operator("divide")(other, self)

  def __floordiv__(self, other):
    return _tensor_operator("floordiv")(self, other)

  def __rfloordiv__(self, other):
    return _tensor_operator("floordiv")(other, self)

  def __mod__(self, other):
    return _tensor_operator("mod")(self, other)

  def __rmod__(self, other):
    return _tensor_operator("mod")(other, self)

  def __neg__(self):
    return _tensor_operator("negative")(self)


class Operation:
  """A node of the mtf graph: inputs, outputs and how to lower itself.

  Args:
    inputs: the mtf Tensors the operation reads; they must all be on one mesh
      and usable (not internal to a custom_gradient).
    mesh: the Mesh of the operation; defaults to the mesh of the first input.
    name: the operation's name, made unique in its graph; defaults to the class
      name.

  Raises:
    TypeError: if an input is not an mtf Tensor.
    ValueError: if there is no mesh and no input, if the inputs are on different
      meshes, or if an input is internal to a custom_gradient.
  """

  # True for operations that Graph.clone_operations must not copy, because a
  # copy would hold new state or draw new values (Variables, random ops).
  shared_by_clones = False

  def __init__(
    self,
    inputs: Sequence[Tensor],
    mesh: Optional[Mesh] = None,
    name: Optional[str] = None,
  ):
    inputs = list(inputs)
    for t in inputs:
      if not isinstance(t, Tensor):
        raise TypeError(
          "inputs of %s must be mtf Tensors, got %r" % (type(self).__name__, t)
        )
      if not t.usable:
        raise ValueError(
          "Tensor %s is internal to a custom_gradient and may not be used "
          "outside it" % t.name
        )
    if mesh is None:
      if not inputs:
        raise ValueError(
          "%s needs a mesh or at least one input" % type(self).__name__
        )
      mesh = inputs[0].mesh
    for t in inputs:
      if t.mesh is not mesh:
        raise ValueError(
          "%s mixes meshes %r and %r (tensor %s)"
          % (type(self).__name__, mesh, t.mesh, t.name)
        )
    self._inputs = inputs
    self._outputs: List[Tensor] = []
    self._mesh = mesh
    self._splittable_dims = None
    self._unsplittable_dims = None
    self._name = mesh.graph.unique_name(name or type(self).__name__)
    mesh.graph.operations.append(self)

  def __repr__(self) -> str:
    return self.to_string

  @property
  def graph(self) -> Graph:
    """The Graph of the operation's mesh."""
    return self._mesh.graph

  @property
  def mesh(self) -> Mesh:
    """The Mesh the operation runs on."""
    return self._mesh

  @property
  def name(self) -> str:
    """The unique name of the operation in its graph."""
    return self._name

  @property
  def inputs(self) -> List[Tensor]:
    """A copy of the list of input Tensors."""
    return self._inputs[:]

  @property
  def outputs(self) -> List[Tensor]:
    """A copy of the list of output Tensors."""
    return self._outputs[:]

  @property
  def splittable_dims(self) -> frozenset:
    """Frozenset of the dim names that may be split across processors."""
    if self._splittable_dims is None:
      self._initialize_all_dimensions_as_splittable()
    return self._splittable_dims

  @property
  def unsplittable_dims(self) -> frozenset:
    """Frozenset of the dim names that must not be split."""
    if self._unsplittable_dims is None:
      self._initialize_all_dimensions_as_splittable()
    return self._unsplittable_dims

  @property
  def to_string(self) -> str:
    """The operation as "Type[Inputs=(...) Outputs=(...)]", as repr() prints."""
    return "%s[Inputs=(%s) Outputs=(%s)]" % (
      type(self).__name__,
      ", ".join(t.to_string for t in self._inputs),
      ", ".join(t.to_string for t in self._outputs),
    )

  @property
  def has_gradient(self) -> bool:
    """Whether gradients flow through (floating inputs and outputs)."""
    return any(t.dtype.is_floating for t in self._inputs) and any(
      t.dtype.is_floating for t in self._outputs
    )

  def gradient(
    self, unused_grad_ys: Sequence[Optional["Tensor"]]
  ) -> Sequence[Optional["Tensor"]]:
    """The gradients of the operation's inputs, given those of its outputs.

    Args:
      unused_grad_ys: a list with one mtf Tensor (or None, for no gradient) per
        output, shaped like that output.

    Returns:
      a list with one mtf Tensor (or None) per input: the gradient of the loss
      with respect to that input, shaped like it.

    Raises:
      NotImplementedError: if the operation has no gradient.
    """
    raise NotImplementedError("No gradient for %s" % type(self).__name__)

  def lower(self, lowering) -> None:
    """Emits the TensorFlow ops of the operation for one mesh implementation.

    Args:
      lowering: the Lowering in progress; the operation reads the laid-out
        tensors of its inputs from it and records those of its outputs with
        lowering.set_tensor_lowering.

    Raises:
      NotImplementedError: if the operation cannot be lowered.
    """
    raise NotImplementedError(
      "Lower not implemented for %s" % type(self).__name__
    )

  def _all_dim_names(self) -> List[str]:
    names = []
    for t in self._inputs + self._outputs:
      for d in t.shape.dims:
        if d.name not in names:
          names.append(d.name)
    return names

  def _initialize_splittable_and_unsplittable_dims(
    self, default_splittability: str, exception_dims_iterable=None
  ):
    """Marks every dim `default_splittability` except the listed exceptions.

    Args:
      default_splittability: "splittable" or "unsplittable".
      exception_dims_iterable: dim names that get the opposite marking.

    Returns:
      (splittable_dims, unsplittable_dims) as frozensets of dim names.
    """
    if default_splittability not in ("splittable", "unsplittable"):
      raise ValueError(
        "default_splittability must be 'splittable' or "
        "'unsplittable', got %r" % default_splittability
      )
    exceptions = set(exception_dims_iterable or ())
    everything = set(self._all_dim_names())
    if default_splittability == "splittable":
      splittable = everything - exceptions
    else:
      splittable = everything & exceptions
    unsplittable = everything - splittable
    self._splittable_dims = frozenset(splittable)
    self._unsplittable_dims = frozenset(unsplittable)
    return self._splittable_dims, self._unsplittable_dims

  def _initialize_all_dimensions_as_splittable(self):
    return self._initialize_splittable_and_unsplittable_dims("splittable")


def _remap(value, tensor_map, op_map):
  """value with tensors/operations replaced (also inside lists and tuples)."""
  if isinstance(value, Tensor):
    return tensor_map.get(value, value)
  if isinstance(value, Operation):
    return op_map.get(value, value)
  if isinstance(value, (list, tuple)) and any(
    isinstance(v, (Tensor, Operation)) for v in value
  ):
    remapped = [_remap(v, tensor_map, op_map) for v in value]
    return remapped if isinstance(value, list) else type(value)(remapped)
  return value


__all__ = [
  "Graph",
  "Mesh",
  "Tensor",
  "Operation",
  "current_variable_scope_name",
  "register_graph_rewrites",
  "register_tensor_operators",
]
