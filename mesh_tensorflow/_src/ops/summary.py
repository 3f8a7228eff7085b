"""Debugging and summary operations: Print and scalar_summary."""

from __future__ import annotations

from typing import Optional, Sequence

import tensorflow as tf

from mesh_tensorflow._src.graph import Operation
from mesh_tensorflow._src.graph import Tensor

SCALAR_SUMMARIES_COLLECTION_KEY = "mtf_scalar_summaries"


class PrintOperation(Operation):
  """Identity on x that prints `data` (full tensors) when x is computed.

  Args:
    x: the mtf Tensor to pass through.
    data: the mtf Tensors to print (gathered to full tensors).
    message: a string printed before the data.
    name: an optional name for the operation.
  """

  def __init__(
    self,
    x: Tensor,
    data: Sequence[Tensor],
    message: str,
    name: Optional[str] = None,
    **kwargs,
  ):
    super().__init__([x], name=name or "Print")
    self._data = list(data)
    self._message = message
    self._kwargs = kwargs
    self._outputs = [Tensor(self, x.shape, x.dtype)]

  def gradient(
    self, grad_ys: Sequence[Optional[Tensor]]
  ) -> Sequence[Optional[Tensor]]:
    return grad_ys

  def lower(self, lowering) -> None:
    mesh_impl = lowering.mesh_impl(self)
    data = [lowering.export_to_tf_tensor(d) for d in self._data]
    lowering.set_tensor_lowering(
      self.outputs[0],
      mesh_impl.Print(
        lowering.tensors[self.inputs[0]], data, self._message, **self._kwargs
      ),
    )


def Print(x: Tensor, data: Sequence[Tensor], message: str, **kwargs) -> Tensor:  # pylint: disable=invalid-name
  """Returns x; printing `data` with `message` when the program runs.

  Args:
    x: the mtf Tensor to pass through.
    data: the mtf Tensors to print (gathered to full tensors).
    message: a string printed before the data.

  Returns:
    an mtf Tensor equal to x.
  """
  return PrintOperation(x, data, message, **kwargs).outputs[0]


class ScalarSummaryOperation(Operation):
  """Exports a scalar for summaries; its TF value is lowering.operations[op].

  Args:
    name: the name of the summary.
    x: a scalar mtf Tensor.
  """

  def __init__(self, name: str, x: Tensor):
    if x.shape.ndims:
      raise ValueError(
        "scalar_summary %r needs a scalar, got %s" % (name, x.to_string)
      )
    super().__init__([x], name="ScalarSummaryOperation")
    self._summary_name = name

  @property
  def summary_name(self) -> str:
    """The name of the scalar summary."""
    return self._summary_name

  def gradient(
    self, grad_ys: Sequence[Optional[Tensor]]
  ) -> Sequence[Optional[Tensor]]:
    return grad_ys

  def lower(self, lowering) -> None:
    value = tf.cast(lowering.export_to_tf_tensor(self.inputs[0]), tf.float32)
    lowering.operations[self] = value
    if not tf.executing_eagerly():
      tf.compat.v1.add_to_collection(
        SCALAR_SUMMARIES_COLLECTION_KEY, (self._summary_name, value)
      )


def scalar_summary(name: str, x: Tensor) -> Operation:
  """Records scalar x under `name`; returns the Operation (as the original).

  Args:
    name: the name of the summary.
    x: a scalar mtf Tensor.

  Returns:
    the ScalarSummaryOperation; the lowering exports its value to the summaries
    collection.
  """
  return ScalarSummaryOperation(name, x)


__all__ = [
  "Print",
  "PrintOperation",
  "ScalarSummaryOperation",
  "scalar_summary",
]
