"""The lazy mtf program: Graph, Mesh, Tensor and Operation.

An mtf program is built once as a list of Operations on named-dimension Tensors.
Nothing is computed here; a Lowering later asks each Operation to emit TensorFlow
ops for one mesh implementation.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence, Tuple

import gin
import tensorflow as tf

from mesh_tensorflow._src.shapes import Shape, convert_to_shape

tf1 = tf.compat.v1


def current_variable_scope_name() -> str:
  """Name of the current tf.compat.v1 variable scope ("" at top level)."""
  return tf1.get_variable_scope().name


class Graph:
  """A container of mtf Operations, in the order they were created.

  Example:
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "my_mesh")
  """

  def __init__(self):
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
    return self._operations

  @property
  def trainable_variables(self):
    return self._trainable_variables

  @property
  def all_variables(self):
    return self._all_variables

  @property
  def to_string(self) -> str:
    return "\n".join(op.to_string for op in self._operations)

  def unique_name(self, name: str, mark_as_used: bool = True) -> str:
    """Uniquifies `name` under the current tf variable scope, TF style.

    Matching is case-insensitive: after "a" come "a_1", "a_2"; asking for "a_1"
    afterwards yields "a_1_1"; "A" after "a" yields "A_1".
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
    """Removes the given mtf Variables from `trainable_variables`."""
    untrainable = set(variables)
    for v in untrainable:
      v._trainable = False  # pylint: disable=protected-access
    self._trainable_variables = [
        v for v in self._trainable_variables if v not in untrainable]

  def register_variable(self, variable) -> None:
    """Records a newly created mtf Variable (called by Variable.__init__)."""
    self._all_variables.append(variable)
    if variable.trainable:
      self._trainable_variables.append(variable)
    self.name_to_variable[variable.name] = variable

  def clone_operations(self, ops: Sequence["Operation"], input_mapping):
    """Copies `ops` (except Variables and random ops) with remapped inputs.

    Args:
      ops: operations to copy, in graph order.
      input_mapping: dict {Tensor: Tensor} of replacements for inputs.

    Returns:
      (new_ops, extended_mapping): the copies and the mapping extended with
      {old output: new output} for every copied operation.
    """
    # Imported here: the copying logic needs op classes defined downstream.
    from mesh_tensorflow._src.ops import clone  # pylint: disable=g-import-not-at-top
    return clone.clone_operations(self, ops, input_mapping)

  def capture_operations(self, fn: Callable[[], Any]) -> Tuple[Any, List["Operation"]]:
    """Runs `fn` and returns (its output, the operations it created)."""
    n = len(self._operations)
    output = fn()
    return output, self._operations[n:]

  def combine_assignments(self, assignments):
    """Merges Assign operations that share an assign_fn into one Assign each."""
    from mesh_tensorflow._src.variables import Assign  # pylint: disable=g-import-not-at-top
    by_fn = {}
    order = []
    for a in assignments:
      if not isinstance(a, Assign):
        raise TypeError("combine_assignments expects Assign operations, got %r"
                        % (a,))
      key = a.assign_fn
      if key not in by_fn:
        by_fn[key] = ([], [])
        order.append(key)
      by_fn[key][0].extend(a.variables)
      by_fn[key][1].extend(a._inputs)  # pylint: disable=protected-access
    # The merged Assigns replace the originals in the graph.
    merged = set(assignments)
    self._operations[:] = [op for op in self._operations if op not in merged]
    return [Assign(by_fn[k][0], by_fn[k][1], assign_fn=k) for k in order]

  @property
  def stacked_variables_rewritten(self) -> bool:
    return self._rewrote_stack_variables

  # Configurable as the original's (gin name
  # mesh_tensorflow.ops.rewrite_stack_variables).
  @gin.configurable(module="mesh_tensorflow.ops")
  def rewrite_stack_variables(self, max_combined_variable_size=2 ** 29,
                              max_combined_slice_size=2 ** 27,
                              mesh_to_impl=None):
    """Replaces groups of same-shape variables by StackedVariables (once).

    A speed optimisation with no effect on results or checkpoints; see
    _src/stacking.py for the grouping rule.
    """
    from mesh_tensorflow._src import stacking  # pylint: disable=g-import-not-at-top
    if self._rewrote_stack_variables:
      raise ValueError("rewrite_stack_variables() may only be called once.")
    self._rewrote_stack_variables = True
    stacking.rewrite_stack_variables(
        self, max_combined_variable_size, max_combined_slice_size, mesh_to_impl)


class Mesh:
  """A named set of processors; its shape is given only at lowering time.

  Example:
    mesh = mtf.Mesh(graph, "my_mesh")
  """

  def __init__(self, graph: Graph, name: str, variable_placer=None):
    self._graph = graph
    self._name = name
    self._variable_placer = variable_placer

  def __repr__(self) -> str:
    return "Mesh(name=%r)" % self._name

  @property
  def graph(self) -> Graph:
    return self._graph

  @property
  def name(self) -> str:
    return self._name

  @property
  def variable_placer_fn(self):
    if self._variable_placer is not None:
      return self._variable_placer.device_function
    return "cpu:0"


class Tensor:
  """A lazy named-dimension tensor: the output of an mtf Operation."""

  def __init__(self, operation: "Operation", shape, dtype, name: Optional[str] = None,
               index: int = 0):
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
    return self._shape

  @property
  def size(self) -> int:
    return self._shape.size

  @property
  def mesh(self) -> Mesh:
    return self._operation.mesh

  @property
  def graph(self) -> Graph:
    return self._operation.graph

  @property
  def operation(self) -> "Operation":
    return self._operation

  @property
  def dtype(self) -> tf.DType:
    return self._dtype

  @property
  def name(self) -> str:
    return self._name

  @property
  def to_string(self) -> str:
    return "Tensor[%s, %s, %s]" % (self._name, self._shape.to_string,
                                   self._dtype.name)

  # Arithmetic operators; imported lazily because the op families build on
  # this module.
  def __add__(self, other):
    from mesh_tensorflow._src.ops import binary  # pylint: disable=g-import-not-at-top
    return binary.add(self, other)

  def __radd__(self, other):
    from mesh_tensorflow._src.ops import binary  # pylint: disable=g-import-not-at-top
    return binary.add(self, other)

  def __sub__(self, other):
    from mesh_tensorflow._src.ops import binary  # pylint: disable=g-import-not-at-top
    return binary.sub(self, other)

  def __rsub__(self, other):
    from mesh_tensorflow._src.ops import binary  # pylint: disable=g-import-not-at-top
    return binary.sub(other, self)

  def __mul__(self, other):
    from mesh_tensorflow._src.ops import binary  # pylint: disable=g-import-not-at-top
    return binary.multiply(self, other)

  def __rmul__(self, other):
    from mesh_tensorflow._src.ops import binary  # pylint: disable=g-import-not-at-top
    return binary.multiply(other, self)

  def __truediv__(self, other):
    from mesh_tensorflow._src.ops import binary  # pylint: disable=g-import-not-at-top
    return binary.divide(self, other)

  def __rtruediv__(self, other):
    from mesh_tensorflow._src.ops import binary  # pylint: disable=g-import-not-at-top
    return binary.divide(other, self)

  def __floordiv__(self, other):
    from mesh_tensorflow._src.ops import binary  # pylint: disable=g-import-not-at-top
    return binary.floordiv(self, other)

  def __rfloordiv__(self, other):
    from mesh_tensorflow._src.ops import binary  # pylint: disable=g-import-not-at-top
    return binary.floordiv(other, self)

  def __mod__(self, other):
    from mesh_tensorflow._src.ops import binary  # pylint: disable=g-import-not-at-top
    return binary.mod(self, other)

  def __rmod__(self, other):
    from mesh_tensorflow._src.ops import binary  # pylint: disable=g-import-not-at-top
    return binary.mod(other, self)

  def __neg__(self):
    from mesh_tensorflow._src.ops import elementwise  # pylint: disable=g-import-not-at-top
    return elementwise.negative(self)


class Operation:
  """A node of the mtf graph: inputs, outputs and how to lower itself."""

  def __init__(self, inputs: Sequence[Tensor], mesh: Optional[Mesh] = None,
               name: Optional[str] = None):
    inputs = list(inputs)
    for t in inputs:
      if not isinstance(t, Tensor):
        raise TypeError("inputs of %s must be mtf Tensors, got %r"
                        % (type(self).__name__, t))
      if not t.usable:
        raise ValueError(
            "Tensor %s is internal to a custom_gradient and may not be used "
            "outside it" % t.name)
    if mesh is None:
      if not inputs:
        raise ValueError("%s needs a mesh or at least one input"
                         % type(self).__name__)
      mesh = inputs[0].mesh
    for t in inputs:
      if t.mesh is not mesh:
        raise ValueError("%s mixes meshes %r and %r (tensor %s)"
                         % (type(self).__name__, mesh, t.mesh, t.name))
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
    return self._mesh.graph

  @property
  def mesh(self) -> Mesh:
    return self._mesh

  @property
  def name(self) -> str:
    return self._name

  @property
  def inputs(self) -> List[Tensor]:
    return self._inputs[:]

  @property
  def outputs(self) -> List[Tensor]:
    return self._outputs[:]

  @property
  def splittable_dims(self) -> frozenset:
    if self._splittable_dims is None:
      self._initialize_all_dimensions_as_splittable()
    return self._splittable_dims

  @property
  def unsplittable_dims(self) -> frozenset:
    if self._unsplittable_dims is None:
      self._initialize_all_dimensions_as_splittable()
    return self._unsplittable_dims

  @property
  def to_string(self) -> str:
    return "%s[Inputs=(%s) Outputs=(%s)]" % (
        type(self).__name__,
        ", ".join(t.to_string for t in self._inputs),
        ", ".join(t.to_string for t in self._outputs))

  @property
  def has_gradient(self) -> bool:
    return (any(t.dtype.is_floating for t in self._inputs) and
            any(t.dtype.is_floating for t in self._outputs))

  def gradient(self, unused_grad_ys):
    raise NotImplementedError("No gradient for %s" % type(self).__name__)

  def lower(self, lowering):
    raise NotImplementedError("Lower not implemented for %s"
                              % type(self).__name__)

  def _all_dim_names(self) -> List[str]:
    names = []
    for t in self._inputs + self._outputs:
      for d in t.shape.dims:
        if d.name not in names:
          names.append(d.name)
    return names

  def _initialize_splittable_and_unsplittable_dims(
      self, default_splittability: str, exception_dims_iterable=None):
    """Marks every dim `default_splittability` except the listed exceptions.

    Args:
      default_splittability: "splittable" or "unsplittable".
      exception_dims_iterable: dim names that get the opposite marking.

    Returns:
      (splittable_dims, unsplittable_dims) as frozensets of dim names.
    """
    if default_splittability not in ("splittable", "unsplittable"):
      raise ValueError("default_splittability must be 'splittable' or "
                       "'unsplittable', got %r" % default_splittability)
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


__all__ = ["Graph", "Mesh", "Tensor", "Operation", "current_variable_scope_name"]
