"""Slicewise operations: a TF function applied independently to every slice."""

from __future__ import annotations

from typing import Callable, List, Optional, Sequence

import tensorflow as tf

from mesh_tensorflow._src.graph import Operation
from mesh_tensorflow._src.graph import Tensor
from mesh_tensorflow._src.shapes import convert_to_shape


def _dim_names(dims) -> List[str]:
  return [d if isinstance(d, str) else d.name for d in (dims or [])]


def check_splits_allowed(
  op: Operation, lowering, tensors: Sequence[Tensor], allowed_names
) -> None:
  """ValueError naming the first dim of `tensors` split but not allowed.

  Args:
    op: the Operation being lowered (named in the error).
    lowering: the Lowering in progress (its mesh implementation gives the
      layouts).
    tensors: the mtf Tensors whose dims are checked.
    allowed_names: the names of the dims that may be split.

  Raises:
    ValueError: if a dim of `tensors` that is not allowed is split across the
      mesh.
  """
  mesh_impl = lowering.mesh_impl(op)
  allowed = set(allowed_names)
  for t in tensors:
    for dim in t.shape.dims:
      if dim.name in allowed:
        continue
      mesh_axis = mesh_impl.tensor_dimension_to_mesh_axis(dim)
      if mesh_axis is not None:
        raise ValueError(
          "%s (%s) cannot split dimension %r over mesh dimension %r: the "
          "operation needs the whole dimension on each processor"
          % (
            type(op).__name__,
            op.name,
            dim.name,
            mesh_impl.shape.dims[mesh_axis].name,
          )
        )


class SlicewiseOperation(Operation):
  """Applies tf_fn to each slice; only `splittable_dims` may be split.

  Args:
    tf_fn: a function of tf.Tensors (one slice of each input) returning the
      output slice(s).
    inputs: the mtf Tensors whose slices tf_fn gets.
    output_shapes: the list of Shapes of the outputs.
    output_dtypes: the list of tf.DTypes of the outputs.
    splittable_dims: the Dimensions (or dim names) that may be split across the
      mesh; lowering raises ValueError if another dim is split.
    grad_function: optional function (operation, *output_grads) returning the
      list of input gradients; None differentiates tf_fn slice by slice, and 0
      (for cwise) means a zero gradient.
    name: an optional name for the operation.
  """

  def __init__(
    self,
    tf_fn: Callable,
    inputs: Sequence[Tensor],
    output_shapes,
    output_dtypes,
    splittable_dims,
    grad_function=None,
    name: Optional[str] = None,
  ):
    super().__init__(inputs, name=name or "slicewise")
    self._tf_fn = tf_fn
    self._outputs = [
      Tensor(self, convert_to_shape(shape), dtype, index=i)
      for i, (shape, dtype) in enumerate(zip(output_shapes, output_dtypes))
    ]
    self._splittable_names = _dim_names(splittable_dims)
    self._grad_function = grad_function
    self._initialize_splittable_and_unsplittable_dims(
      "unsplittable", self._splittable_names
    )

  @property
  def tf_fn(self) -> Callable:
    """The TF function applied to each slice."""
    return self._tf_fn

  @property
  def has_gradient(self) -> bool:
    if self._grad_function == 0:
      return False
    return super().has_gradient

  def gradient(
    self, grad_ys: Sequence[Optional[Tensor]]
  ) -> Sequence[Optional[Tensor]]:
    if self._grad_function is None:
      return GenericGradOperation(self, grad_ys).outputs_for_inputs()
    return self._grad_function(self, *grad_ys)

  def lower(self, lowering) -> None:
    check_splits_allowed(
      self, lowering, self._inputs + self._outputs, self._splittable_names
    )
    mesh_impl = lowering.mesh_impl(self)
    values = mesh_impl.slicewise(
      self._tf_fn, *[lowering.tensors[x] for x in self._inputs]
    )
    if len(self._outputs) == 1:
      values = (values,) if not isinstance(values, tuple) else values
    for output, value in zip(self._outputs, values):
      lowering.set_tensor_lowering(output, value)


class GenericGradOperation(Operation):
  """Gradient of a SlicewiseOperation, by differentiating tf_fn per slice.

  Args:
    forward_op: the SlicewiseOperation to differentiate.
    grad_ys: the gradients of its outputs (mtf Tensors, or None for zero).
    name: an optional name for the operation.
  """

  def __init__(
    self, forward_op: SlicewiseOperation, grad_ys, name: Optional[str] = None
  ):
    self._forward_op = forward_op
    self._float_inputs = [
      i for i, x in enumerate(forward_op.inputs) if x.dtype.is_floating
    ]
    self._float_outputs = [
      i
      for i, (y, dy) in enumerate(zip(forward_op.outputs, grad_ys))
      if y.dtype.is_floating and dy is not None
    ]
    super().__init__(
      forward_op.inputs + [grad_ys[i] for i in self._float_outputs],
      mesh=forward_op.mesh,
      name=name or "generic_grad",
    )
    self._outputs = [
      Tensor(
        self, forward_op.inputs[i].shape, forward_op.inputs[i].dtype, index=k
      )
      for k, i in enumerate(self._float_inputs)
    ]
    # As the original: the default (every dimension splittable), not the
    # forward op's sets; splittability only informs layout search.

  def outputs_for_inputs(self) -> list:
    """The gradient of each input of the forward operation.

    Returns:
      a list with one entry per input of the forward operation: the output of
      this operation holding its gradient, or None for non-floating inputs.
    """
    grads = [None] * len(self._forward_op.inputs)
    for k, i in enumerate(self._float_inputs):
      grads[i] = self._outputs[k]
    return grads

  def lower(self, lowering) -> None:
    forward = self._forward_op
    n_in = len(forward.inputs)
    float_inputs = self._float_inputs
    float_outputs = self._float_outputs

    def grad_fn(*args):
      xs, dys = list(args[:n_in]), args[n_in:]
      with tf.GradientTape() as tape:
        for i in float_inputs:
          tape.watch(xs[i])
        ys = forward.tf_fn(*xs)
      if not isinstance(ys, (tuple, list)):
        ys = (ys,)
      grads = tape.gradient(
        [ys[i] for i in float_outputs],
        [xs[i] for i in float_inputs],
        output_gradients=list(dys),
        unconnected_gradients=tf.UnconnectedGradients.ZERO,
      )
      return tuple(grads) if len(grads) > 1 else grads[0]

    mesh_impl = lowering.mesh_impl(self)
    values = mesh_impl.slicewise(
      grad_fn, *[lowering.tensors[x] for x in self._inputs]
    )
    if not isinstance(values, tuple):
      values = (values,)
    for output, value in zip(self._outputs, values):
      lowering.set_tensor_lowering(output, value)


def slicewise(
  tf_fn: Callable,
  xs: Sequence[Tensor],
  output_shape=None,
  output_dtype=None,
  splittable_dims=None,
  grad_function=None,
  name: Optional[str] = None,
) -> Tensor | tuple[Tensor, ...]:
  """Applies tf_fn to each slice of xs.

  Example:
    Each of two processors applies tf.nn.relu to its half of x:

    >>> converter = mtf.test_utils.NumpyConverter(
    ...     mesh_shape="all:2", layout="batch:all", devices=["cpu:0", "cpu:1"])
    >>> x = converter.convert_np_array_to_mtf_tensor(
    ...     [[1.0, -2.0], [-3.0, 4.0]], ["batch", "d"], dtype=tf.float32)
    >>> y = mtf.slicewise(tf.nn.relu, [x], splittable_dims=x.shape.dims)
    >>> converter.convert_mtf_tensor_to_np_array(y)
    array([[1., 0.],
           [0., 4.]], dtype=float32)

  Args:
    tf_fn: a function of tf.Tensors (one slice of each input) returning the
      output slice(s).
    xs: the mtf Tensors (or Python scalars) whose slices tf_fn gets.
    output_shape: the Shape of the output, or a list of Shapes for several
      outputs; defaults to the shape of xs[0].
    output_dtype: the tf.DType of the output, or a list for several outputs;
      defaults to the dtype of xs[0].
    splittable_dims: the Dimensions (or dim names) that may be split across the
      mesh; lowering raises ValueError if another dim is split.
    grad_function: optional function (operation, *output_grads) returning the
      list of input gradients; None differentiates tf_fn slice by slice, and 0
      (for cwise) means a zero gradient.
    name: an optional name for the operation.

  Returns:
    a Tensor, or a tuple of Tensors when output_dtype is a list.
  """
  xs = list(xs)
  multiple = isinstance(output_dtype, (list, tuple))
  if multiple:
    dtypes = list(output_dtype)
    shapes_ = (
      list(output_shape)
      if isinstance(output_shape, (list, tuple))
      and output_shape
      and not _is_dim_like(output_shape[0])
      else [output_shape] * len(dtypes)
    )
  else:
    dtypes = [output_dtype]
    shapes_ = [output_shape]
  shapes_ = [xs[0].shape if s is None else convert_to_shape(s) for s in shapes_]
  dtypes = [xs[0].dtype if d is None else tf.as_dtype(d) for d in dtypes]
  op = SlicewiseOperation(
    tf_fn,
    xs,
    shapes_,
    dtypes,
    splittable_dims or [],
    grad_function=grad_function,
    name=name,
  )
  return tuple(op.outputs) if multiple else op.outputs[0]


def _is_dim_like(x) -> bool:
  return isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str)


def cwise(
  tf_fn: Callable,
  xs: Sequence[Tensor],
  output_dtype=None,
  grad_function=None,
  name: Optional[str] = None,
) -> Tensor:
  """Component-wise: slicewise with every dimension of xs[0] splittable.

  Args:
    tf_fn: an elementwise TF function of the slices of xs.
    xs: mtf Tensors (or Python scalars) of the same shape.
    output_dtype: the tf.DType of the result; defaults to that of xs[0].
    grad_function: optional function (operation, *output_grads) returning the
      list of input gradients; None differentiates tf_fn slice by slice, and 0
      (for cwise) means a zero gradient.
    name: an optional name for the operation.

  Returns:
    an mtf Tensor with the shape of xs[0].
  """
  return slicewise(
    tf_fn,
    xs,
    output_dtype=output_dtype,
    splittable_dims=xs[0].shape.dims,
    grad_function=grad_function,
    name=name or "cwise",
  )


__all__ = [
  "GenericGradOperation",
  "SlicewiseOperation",
  "check_splits_allowed",
  "cwise",
  "slicewise",
]
