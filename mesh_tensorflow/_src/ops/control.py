"""Control flow: control dependencies (Depend) and while loops.

A while loop traces its condition and body once, on placeholder tensors, into
sub-graphs that are kept out of the main operation list; its lowering runs one
`tf.while_loop` over every per-processor slice of every loop variable and
lowers the sub-graphs inside it, each iteration with its own tensor mapping.
"""

from __future__ import annotations

import collections
import contextlib
from typing import Callable, List, Optional, Sequence

import tensorflow as tf

from mesh_tensorflow._src.graph import Operation
from mesh_tensorflow._src.graph import Tensor
from mesh_tensorflow._src.laid_out import LazyAllreduceSum
from mesh_tensorflow._src.variables import ReadVariable
from mesh_tensorflow._src.variables import Variable


def _read_slice(v):
  return v.read_value() if isinstance(v, tf.Variable) else tf.identity(v)


def _variable_read_by(x: Tensor) -> Optional[Variable]:
  """The Variable whose value x is (x output of a Variable or ReadVariable)."""
  op = x.operation
  if isinstance(op, Variable):
    return op
  if isinstance(op, ReadVariable):
    source = op.inputs[0].operation
    if isinstance(source, Variable):
      return source
  return None


class Depend(Operation):
  """Identity of x, computed only after `dependencies` have run.

  Dependencies are mtf Operations (their lowered TF operation, e.g. the group
  of an Assign, or else their outputs) or mtf Tensors (all their slices). When
  x is a variable's value it is read again after the dependencies, so
  `depend(v, [assign_op])` sees the assigned value in every execution mode.

  Args:
    x: the mtf Tensor to pass through.
    dependencies: a list of mtf Operations and Tensors that must be computed
      first.
    name: an optional name for the operation.
  """

  def __init__(
    self, x: Tensor, dependencies: Sequence, name: Optional[str] = None
  ):
    dependencies = list(dependencies)
    for d in dependencies:
      if not isinstance(d, (Operation, Tensor)):
        raise ValueError(
          "depend: dependencies must be mtf Operations or "
          "Tensors, got %r" % (d,)
        )
    super().__init__([x], x.mesh, name=name or "depend")
    self._dependencies = dependencies
    self._outputs = [Tensor(self, x.shape, x.dtype)]

  @property
  def dependencies(self) -> list:
    """The operations that must run before the output is computed."""
    return list(self._dependencies)

  def gradient(
    self, grad_ys: Sequence[Optional[Tensor]]
  ) -> Sequence[Optional[Tensor]]:
    return list(grad_ys)

  def _control_inputs(self, lowering) -> list:
    control_inputs = []
    for d in self._dependencies:
      if isinstance(d, Tensor):
        control_inputs.extend(
          lowering.tensors[d].to_laid_out_tensor().tensor_list
        )
        continue
      if d in lowering.operations:
        control_inputs.append(lowering.operations[d])
      elif d.outputs:
        for t in d.outputs:
          control_inputs.extend(
            lowering.tensors[t].to_laid_out_tensor().tensor_list
          )
      else:
        raise ValueError(
          "depend: operation %s has neither a lowered TF "
          "operation nor outputs to depend on" % d.name
        )
    # Eager tf.group returns None: there is nothing to wait for.
    return [c for c in control_inputs if c is not None]

  def lower(self, lowering) -> None:
    mesh_impl = lowering.mesh_impl(self)
    if not mesh_impl.supports_control_dependencies:
      raise ValueError(
        "Depend (%s): mesh implementation %s does not support control "
        "dependencies" % (self.name, type(mesh_impl).__name__)
      )
    x = self.inputs[0]
    control_inputs = self._control_inputs(lowering)
    variable = _variable_read_by(x)
    with tf.control_dependencies(control_inputs):
      if variable is not None and variable in lowering.variables:
        dtype = x.dtype
        value = mesh_impl.slicewise(
          lambda v: tf.cast(_read_slice(v), dtype),
          lowering.variables[variable].laid_out_tensor,
        )
      else:
        value = mesh_impl.slicewise(
          tf.identity, lowering.tensors[x].to_laid_out_tensor()
        )
    lowering.set_tensor_lowering(self.outputs[0], value)


def depend(x: Tensor, dependencies: Sequence) -> Tensor:
  """x, computed after `dependencies` (mtf Operations or Tensors).

  Example:
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> v = mtf.get_variable(converter.mesh, "v", "n:2",
    ...                      initializer=tf.ones_initializer())
    >>> update = mtf.assign(v, v + 1.0)
    >>> v_new = mtf.depend(v, [update])  # the value after the assignment
    >>> converter.convert_mtf_tensor_to_np_array(v_new)
    array([2., 2.], dtype=float32)

  Args:
    x: the mtf Tensor to pass through.
    dependencies: a list of mtf Operations and Tensors that must be computed
      first.

  Returns:
    an mtf Tensor equal to x, computed after the dependencies.
  """
  return Depend(x, dependencies).outputs[0]


def _scope_name(op_name: str) -> str:
  name = "".join(c if c.isalnum() or c in "_.-/" else "_" for c in op_name)
  if not name or not name[0].isalnum():
    name = "op" + name
  return name


@contextlib.contextmanager
def _nested_lowering(lowering):
  """Tensors/operations lowered inside stay in a layer dropped on exit.

  Lookups fall through to the enclosing lowering, so sub-graph operations see
  every tensor lowered before the loop.
  """
  saved_tensors, saved_operations = lowering.tensors, lowering.operations
  lowering.tensors = collections.ChainMap({}, saved_tensors)
  lowering.operations = collections.ChainMap({}, saved_operations)
  try:
    yield
  finally:
    lowering.tensors, lowering.operations = saved_tensors, saved_operations


def _zeros_like_output(mesh_impl, t: Tensor):
  slice_shape = mesh_impl.slice_shape(t.shape)
  dtype = t.dtype
  return mesh_impl.slicewise(
    lambda _: tf.zeros(slice_shape, dtype), mesh_impl.laid_out_pnum()
  )


class WhileLoopOperation(Operation):
  """A while loop over mtf tensors; lowers to one tf.while_loop, no gradient.

  cond_fn(*loop_vars) returns a scalar boolean mtf Tensor; body_fn(*loop_vars)
  returns new loop values of the same shapes and dtypes, followed (when
  has_accumulators) by extra tensors that are summed over the iterations,
  starting from zeros. The outputs are the final loop values and then the
  accumulated sums; a sum over a split dimension is allreduced once, after
  the loop.

  Args:
    cond_fn: a function of the loop values returning a scalar boolean mtf
      Tensor.
    body_fn: a function of the loop values returning their new values (and then
      the accumulated values, with has_accumulators).
    inputs: the initial loop values, mtf Tensors.
    tf_kwargs: optional dict of keyword arguments for tf.while_loop (e.g.
      maximum_iterations).
    has_accumulators: whether body_fn returns extra tensors summed over the
      iterations.
    name: an optional name for the operation.
  """

  def __init__(
    self,
    cond_fn: Callable,
    body_fn: Callable,
    inputs: Sequence[Tensor],
    tf_kwargs=None,
    has_accumulators: bool = False,
    name: str = "while_loop",
  ):
    inputs = list(inputs)
    if not inputs:
      raise ValueError("while_loop needs at least one loop variable")
    tf_kwargs = dict(tf_kwargs or {})
    if tf_kwargs.pop("back_prop", False):
      raise ValueError(
        "while_loop %r: back_prop=True is not supported; mtf "
        "while loops have no gradient" % name
      )
    super().__init__(inputs, mesh=inputs[0].mesh, name=name)
    graph = self.graph
    # Re-appended below, after any variable hoisted out of the body.
    graph.operations.remove(self)
    self._cond_fn = cond_fn
    self._body_fn = body_fn
    self._tf_kwargs = tf_kwargs
    self._has_accumulators = bool(has_accumulators)

    self._cond_inputs = self._make_placeholders("cond_input")
    cond_output, self._cond_ops = self._trace(
      lambda: cond_fn(*self._cond_inputs)
    )
    if isinstance(cond_output, (list, tuple)) and len(cond_output) == 1:
      cond_output = cond_output[0]
    if (
      not isinstance(cond_output, Tensor)
      or cond_output.dtype != tf.bool
      or cond_output.shape.ndims != 0
    ):
      raise ValueError(
        "while_loop %s: cond_fn must return a scalar boolean "
        "mtf Tensor, got %r" % (self.name, cond_output)
      )
    self._cond_output = cond_output

    self._body_inputs = self._make_placeholders("body_input")
    body_outputs, self._body_ops = self._trace(
      lambda: body_fn(*self._body_inputs)
    )
    if isinstance(body_outputs, Tensor):
      body_outputs = [body_outputs]
    body_outputs = list(body_outputs)
    self._check_body_outputs(inputs, body_outputs)
    self._body_outputs = body_outputs

    hoisted = [
      op for op in self._cond_ops + self._body_ops if isinstance(op, Variable)
    ]
    self._cond_ops = [op for op in self._cond_ops if op not in hoisted]
    self._body_ops = [op for op in self._body_ops if op not in hoisted]
    graph.operations.extend(hoisted)
    graph.operations.append(self)
    self._outputs = [
      Tensor(self, t.shape, t.dtype, index=i)
      for i, t in enumerate(body_outputs)
    ]

  def _make_placeholders(self, kind: str) -> List[Tensor]:
    return [
      Tensor(self, x.shape, x.dtype, name="%s/%s:%d" % (self.name, kind, i))
      for i, x in enumerate(self._inputs)
    ]

  def _trace(self, fn: Callable):
    """Runs fn; returns its output and the ops it made (kept out of the graph)."""
    ops = self.graph.operations
    n = len(ops)
    output, captured = self.graph.capture_operations(fn)
    del ops[n:]
    return output, list(captured)

  def _check_body_outputs(self, inputs, body_outputs) -> None:
    n = len(inputs)
    for i, t in enumerate(body_outputs):
      if not isinstance(t, Tensor):
        raise ValueError(
          "while_loop %s: body_fn output %d is not an mtf "
          "Tensor: %r" % (self.name, i, t)
        )
    if len(body_outputs) < n or (
      len(body_outputs) > n and not self._has_accumulators
    ):
      raise ValueError(
        "while_loop %s: body_fn returned %d tensors for %d loop variables%s"
        % (
          self.name,
          len(body_outputs),
          n,
          ""
          if self._has_accumulators
          else " (extra outputs need has_accumulators=True)",
        )
      )
    for i, (x, y) in enumerate(zip(inputs, body_outputs)):
      if x.shape != y.shape or x.dtype != y.dtype:
        raise ValueError(
          "while_loop %s: body_fn output %d has shape %s and dtype %s but "
          "loop variable %d has shape %s and dtype %s"
          % (
            self.name,
            i,
            y.shape.to_string,
            y.dtype.name,
            i,
            x.shape.to_string,
            x.dtype.name,
          )
        )

  @property
  def has_gradient(self) -> bool:
    return False

  @property
  def cond_operations(self) -> List[Operation]:
    """The mtf operations of the loop condition, in creation order."""
    return list(self._cond_ops)

  @property
  def body_operations(self) -> List[Operation]:
    """The mtf operations of the loop body, in creation order."""
    return list(self._body_ops)

  def _external_tensors(self) -> List[Tensor]:
    """Tensors the sub-graphs read from outside the loop."""
    inside = set(self._cond_inputs) | set(self._body_inputs)
    for op in self._cond_ops + self._body_ops:
      inside.update(op.outputs)
    seen = []
    candidates = [
      t for op in self._cond_ops + self._body_ops for t in op.inputs
    ]
    candidates += self._body_outputs + [self._cond_output]
    for t in candidates:
      if t not in inside and t not in seen:
        seen.append(t)
    return seen

  def lower(self, lowering) -> None:
    mesh_impl = lowering.mesh_impl(self)
    laid_out_cls = mesh_impl.LaidOutTensor
    n = len(self._inputs)
    acc_tensors = self._body_outputs[n:]
    # Lazy sums computed before the loop must be reduced outside it (their
    # cached result would otherwise live inside the loop body).
    for t in self._external_tensors():
      lowering.tensors[t].to_laid_out_tensor()

    initial = [lowering.tensors[x].to_laid_out_tensor() for x in self._inputs]
    initial += [_zeros_like_output(mesh_impl, t) for t in acc_tensors]
    sizes = [len(lt.tensor_list) for lt in initial]

    def flatten(laid_outs):
      flat = []
      for lt in laid_outs:
        flat.extend(lt.tensor_list)
      return flat

    def unflatten(flat):
      flat = list(flat)
      out, start = [], 0
      for size in sizes:
        out.append(laid_out_cls.from_tensor_list(flat[start : start + size]))
        start += size
      return out

    def lower_sub_graph(ops, placeholders, loop_values):
      for placeholder, value in zip(placeholders, loop_values):
        lowering.set_tensor_lowering(placeholder, value)
      for op in ops:
        with tf.name_scope(_scope_name(op.name)):
          op.lower(lowering)

    def cond(*flat):
      loop_values = unflatten(flat)[:n]
      with _nested_lowering(lowering):
        lower_sub_graph(self._cond_ops, self._cond_inputs, loop_values)
        result = lowering.tensors[self._cond_output].to_laid_out_tensor()
      return result.tensor_list[0]

    # For each accumulator: (mesh_axes, add_counter_fn) if it is a lazy sum.
    lazy_sums = [None] * len(acc_tensors)

    def body(*flat):
      values = unflatten(flat)
      loop_values, acc_values = values[:n], values[n:]
      with _nested_lowering(lowering):
        lower_sub_graph(self._body_ops, self._body_inputs, loop_values)
        new_values = [
          lowering.tensors[t].to_laid_out_tensor()
          for t in self._body_outputs[:n]
        ]
        for i, (t, acc) in enumerate(zip(acc_tensors, acc_values)):
          term = lowering.tensors[t]
          if isinstance(term, LazyAllreduceSum) and term.mesh_axes:
            lazy_sums[i] = (term.mesh_axes, term.add_counter_fn)
            term = term.laid_out_input
          term = term.to_laid_out_tensor()
          new_values.append(mesh_impl.slicewise(tf.add, acc, term))
      return flatten(new_values)

    results = mesh_impl.while_loop(
      cond, body, flatten(initial), **self._tf_kwargs
    )
    results = unflatten(results)
    for i, (out, value) in enumerate(zip(self._outputs, results)):
      # back_prop=False semantics: nothing flows back through the loop.
      value = mesh_impl.slicewise(tf.stop_gradient, value)
      if i >= n and lazy_sums[i - n] is not None:
        mesh_axes, add_counter_fn = lazy_sums[i - n]
        value = LazyAllreduceSum(
          mesh_impl, value, mesh_axes, add_counter_fn=add_counter_fn
        )
      lowering.set_tensor_lowering(out, value)


def while_loop(
  cond_fn: Callable,
  body_fn: Callable,
  inputs: Sequence[Tensor],
  num_loop_vars: Optional[int] = None,
  has_accumulators: bool = False,
  **kwargs,
) -> List[Tensor]:
  """A while loop over mtf tensors (no gradient).

  Example:
    Adds x three times:

    >>> converter = mtf.test_utils.NumpyConverter()
    >>> mesh = converter.mesh
    >>> x = converter.convert_np_array_to_mtf_tensor([1, 2], ["n"])
    >>> i, total = mtf.while_loop(
    ...     lambda i, total: mtf.less(i, 3),
    ...     lambda i, total: [i + 1, total + x],
    ...     [mtf.constant(mesh, 0, dtype=tf.int32), mtf.zeros_like(x)])
    >>> converter.convert_mtf_tensor_to_np_array(total)
    array([3, 6], dtype=int32)

  Args:
    cond_fn: loop variables -> scalar boolean mtf Tensor.
    body_fn: loop variables -> new loop variables (same shapes and dtypes),
      followed by accumulator terms when has_accumulators.
    inputs: initial loop variables.
    num_loop_vars: the original's GPU workaround turning later loop variables
      into local variables; only None (or len(inputs)) is supported.
    has_accumulators: extra body outputs are summed over iterations.
    **kwargs: passed to tf.while_loop (e.g. maximum_iterations).

  Returns:
    the final loop variables, then the accumulated sums.

  Raises:
    ValueError: if body outputs change a loop variable's shape or dtype.
    NotImplementedError: for num_loop_vars < len(inputs).
  """
  inputs = list(inputs)
  if num_loop_vars is not None and num_loop_vars < len(inputs):
    raise NotImplementedError(
      "while_loop: num_loop_vars=%d < %d inputs (the original's GPU "
      "workaround keeping loop variables in local variables) is not "
      "supported; pass num_loop_vars=None" % (num_loop_vars, len(inputs))
    )
  return WhileLoopOperation(
    cond_fn,
    body_fn,
    inputs,
    tf_kwargs=kwargs,
    has_accumulators=has_accumulators,
  ).outputs


__all__ = ["Depend", "WhileLoopOperation", "depend", "while_loop"]
