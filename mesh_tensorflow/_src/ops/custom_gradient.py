"""Custom gradients and rematerialisation (recompute_grad).

`custom_gradient(fn, grad_fn, explicit_inputs)` runs fn once to build its
forward operations, then hides them behind a CustomGradientOperation whose
outputs are fn's outputs and whose gradient is grad_fn. `recompute_grad` is a
custom gradient that rebuilds the forward operations (clone_operations) on the
backward pass instead of keeping their activations.
"""

from __future__ import annotations

from typing import Callable, List, Optional, Sequence

import tensorflow as tf

from mesh_tensorflow._src.graph import Operation
from mesh_tensorflow._src.graph import Tensor
from mesh_tensorflow._src.ops import gradients as gradients_lib
from mesh_tensorflow._src.variables import Variable


def _implicit_inputs(
  explicit_inputs: Sequence[Tensor], forward_operations: Sequence[Operation]
) -> List[Tensor]:
  """Float tensors from outside fn that the forward operations read."""
  produced = set()
  for op in forward_operations:
    produced.update(op.outputs)
  explicit = set(explicit_inputs)
  implicit = []
  for op in forward_operations:
    for t in op.inputs:
      if (
        t.dtype.is_floating
        and t not in produced
        and t not in explicit
        and t not in implicit
      ):
        implicit.append(t)
  return implicit


class CustomGradientOperation(Operation):
  """Re-exports fn's outputs; its gradient is grad_fn's.

  The forward operations stay in the graph (and are lowered in place); their
  tensors are marked unusable so that code outside fn goes through this op.
  grad_fn is called with keywords explicit_inputs, all_inputs,
  forward_operations, outputs (fn's own outputs) and output_grads, and returns
  one gradient (or None) per tensor of all_inputs.

  Args:
    explicit_inputs: the tensors passed to fn.
    all_inputs: explicit_inputs followed by the tensors fn read from outside
      (such as variables).
    fn_outputs: the outputs of fn.
    grad_fn: the gradient function (called as described above).
    forward_operations: the operations fn created.
    name: an optional name for the operation.
  """

  def __init__(
    self,
    explicit_inputs: Sequence[Tensor],
    all_inputs: Sequence[Tensor],
    fn_outputs: Sequence[Tensor],
    grad_fn: Callable,
    forward_operations: Sequence[Operation],
    name: Optional[str] = None,
  ):
    self._explicit_inputs = list(explicit_inputs)
    self._forward_operations = list(forward_operations)
    self._fn_outputs = list(fn_outputs)
    self._grad_fn = grad_fn
    for op in self._forward_operations:
      if isinstance(op, Variable):
        raise ValueError(
          "custom_gradient: variable %r was created inside fn; create it "
          "before calling custom_gradient (reusing it inside is fine)" % op.name
        )
    for t in self._fn_outputs:
      if not isinstance(t, Tensor):
        raise ValueError(
          "custom_gradient: fn must return mtf Tensors, got %r" % (t,)
        )
    super().__init__(
      all_inputs, mesh=self._fn_outputs[0].mesh, name=name or "custom_gradient"
    )
    self._outputs = [
      Tensor(self, t.shape, t.dtype, index=i)
      for i, t in enumerate(self._fn_outputs)
    ]
    returned = set(self._fn_outputs)
    self._internal_tensors = [
      t
      for op in self._forward_operations
      for t in op.outputs
      if t not in returned
    ]
    for t in self._internal_tensors:
      t.usable = False

  @property
  def explicit_inputs(self) -> List[Tensor]:
    """The tensors passed to the function explicitly (not captured)."""
    return list(self._explicit_inputs)

  @property
  def forward_operations(self) -> List[Operation]:
    """The mtf operations the forward function created."""
    return list(self._forward_operations)

  @property
  def fn_outputs(self) -> List[Tensor]:
    """The outputs of the forward function, inside the operation."""
    return list(self._fn_outputs)

  def lower(self, lowering) -> None:
    for out, fn_out in zip(self._outputs, self._fn_outputs):
      lowering.set_tensor_lowering(out, lowering.tensors[fn_out])

  def gradient(
    self, grad_ys: Sequence[Optional[Tensor]]
  ) -> Sequence[Optional[Tensor]]:
    graph = self.graph
    num_variables = len(graph.all_variables)
    # grad_fn works "inside" fn: it may build on fn's internal tensors.
    for t in self._internal_tensors:
      t.usable = True
    try:
      grads = self._grad_fn(
        explicit_inputs=list(self._explicit_inputs),
        all_inputs=list(self._inputs),
        forward_operations=list(self._forward_operations),
        outputs=list(self._fn_outputs),
        output_grads=list(grad_ys),
      )
    finally:
      for t in self._internal_tensors:
        t.usable = False
    if len(graph.all_variables) != num_variables:
      raise ValueError(
        "custom_gradient %s: grad_fn created variables" % self.name
      )
    grads = list(grads)
    if len(grads) != len(self._inputs):
      raise ValueError(
        "custom_gradient %s: grad_fn returned %d gradients for %d inputs "
        "(explicit then implicit: %s)"
        % (
          self.name,
          len(grads),
          len(self._inputs),
          [t.name for t in self._inputs],
        )
      )
    return grads


def custom_gradient(
  fn: Callable, grad_fn: Callable, explicit_inputs: Sequence[Tensor]
):
  """fn(*explicit_inputs) with gradients given by grad_fn.

  Example:
    An identity whose gradient is doubled:

    >>> def grad_fn(explicit_inputs, all_inputs, forward_operations, outputs,
    ...             output_grads):
    ...   return [output_grads[0] * 2.0] + [None] * (len(all_inputs) - 1)
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> x = converter.convert_np_array_to_mtf_tensor(
    ...     [1.0, -2.0], ["n"], dtype=tf.float32)
    >>> y = mtf.custom_gradient(mtf.identity, grad_fn, [x])
    >>> [dx] = mtf.gradients([mtf.reduce_sum(y)], [x])
    >>> converter.convert_mtf_tensor_to_np_array(y)
    array([ 1., -2.], dtype=float32)
    >>> converter.convert_mtf_tensor_to_np_array(dx)
    array([2., 2.], dtype=float32)

  Args:
    fn: explicit inputs -> a Tensor or a list/tuple of Tensors. It may read
      other tensors (e.g. variables); float ones become implicit inputs.
      Variables it creates are treated as created before it (implicit
      inputs too).
    grad_fn: see CustomGradientOperation.
    explicit_inputs: the tensors passed to fn.

  Returns:
    fn's output(s), through the CustomGradientOperation.
  """
  explicit_inputs = list(explicit_inputs)
  if not explicit_inputs:
    raise ValueError("custom_gradient needs at least one explicit input")
  graph = explicit_inputs[0].graph
  outputs, forward_operations = graph.capture_operations(
    lambda: fn(*explicit_inputs)
  )
  # Variables fn creates (layers create theirs on first call) act as if made
  # before fn: they stay ordinary graph operations and their values become
  # implicit inputs, so grad_fn gives their gradients.
  forward_operations = [
    op for op in forward_operations if not isinstance(op, Variable)
  ]
  single = isinstance(outputs, Tensor)
  fn_outputs = [outputs] if single else list(outputs)
  all_inputs = explicit_inputs + _implicit_inputs(
    explicit_inputs, forward_operations
  )
  new_outputs = CustomGradientOperation(
    explicit_inputs, all_inputs, fn_outputs, grad_fn, forward_operations
  ).outputs
  if single:
    return new_outputs[0]
  return tuple(new_outputs) if isinstance(outputs, tuple) else new_outputs


class _AfterOperation(Operation):
  """x, computed no earlier than `after` (an ordering hint; identity gradient).

  With control dependencies each processor's slice waits for its slice of
  every tensor in `after`; otherwise 1e-30 times a local sum of them is added.
  """

  def __init__(
    self, x: Tensor, after: Sequence[Tensor], name: Optional[str] = None
  ):
    super().__init__([x] + list(after), name=name or "recompute_after")
    self._outputs = [Tensor(self, x.shape, x.dtype)]

  def gradient(
    self, grad_ys: Sequence[Optional[Tensor]]
  ) -> Sequence[Optional[Tensor]]:
    return [grad_ys[0]] + [None] * (len(self._inputs) - 1)

  def lower(self, lowering) -> None:
    mesh_impl = lowering.mesh_impl(self)
    laid_outs = [lowering.tensors[t].to_laid_out_tensor() for t in self._inputs]
    dtype = self._inputs[0].dtype
    if mesh_impl.supports_control_dependencies:

      def fn(x, *after):
        with tf.control_dependencies(list(after)):
          return tf.identity(x)
    else:

      def fn(x, *after):
        tiny = tf.add_n([tf.reduce_sum(tf.cast(a, tf.float32)) for a in after])
        return x + tf.cast(tiny * 1e-30, dtype)

    lowering.set_tensor_lowering(
      self.outputs[0], mesh_impl.slicewise(fn, *laid_outs)
    )


def recompute_grad(
  fn: Callable,
  explicit_inputs: Sequence[Tensor],
  control_dependencies: bool = True,
):
  """fn(*explicit_inputs), recomputed on the backward pass (rematerialisation).

  Activations inside fn are not needed by the gradient: the backward pass
  clones fn's operations (random operations excepted, so dropout masks are
  reused) and differentiates the clones.

  Example:
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> x = converter.convert_np_array_to_mtf_tensor(
    ...     [1.0, -2.0], ["n"], dtype=tf.float32)
    >>> w = converter.convert_np_array_to_mtf_tensor(
    ...     [[1.0, 2.0], [3.0, -4.0]], ["n", "m"], dtype=tf.float32)
    >>> m = w.shape.dims[1]
    >>> y = mtf.recompute_grad(
    ...     lambda x: mtf.relu(mtf.einsum([x, w], output_shape=[m])), [x])
    >>> [dx] = mtf.gradients([mtf.reduce_sum(y)], [x])
    >>> converter.convert_mtf_tensor_to_np_array(y)  # relu(x @ w)
    array([ 0., 10.], dtype=float32)
    >>> converter.convert_mtf_tensor_to_np_array(dx)  # w[:, 1]
    array([ 2., -4.], dtype=float32)
    >>> [op.name for op in converter.graph.operations if "recompute" in op.name]
    ['custom_gradient/gradients/recompute_after',
     'custom_gradient/gradients/recompute_after_1']

  Args:
    fn: explicit inputs -> Tensor(s). It may create variables (a layer
      called for the first time); they are not recomputed.
    explicit_inputs: tensors passed to fn.
    control_dependencies: make the recomputation wait for the output
      gradients, so it happens late in the backward pass.

  Returns:
    fn's output(s).
  """

  def grad_fn(
    explicit_inputs, all_inputs, forward_operations, outputs, output_grads
  ):
    del explicit_inputs
    graph = all_inputs[0].graph
    pairs = [(y, dy) for y, dy in zip(outputs, output_grads) if dy is not None]
    if not pairs:
      return [None] * len(all_inputs)
    mapping = {}
    if control_dependencies:
      after = [dy for _, dy in pairs]
      for x in all_inputs:
        mapping[x] = _AfterOperation(x, after).outputs[0]
    new_ops, mapping = graph.clone_operations(forward_operations, mapping)
    ys = [mapping.get(y, y) for y, _ in pairs]
    xs = [mapping.get(x, x) for x in all_inputs]
    return gradients_lib.gradients(
      ys, xs, grad_ys=[dy for _, dy in pairs], operations=new_ops
    )

  return custom_gradient(fn, grad_fn, explicit_inputs)


__all__ = ["CustomGradientOperation", "custom_gradient", "recompute_grad"]
