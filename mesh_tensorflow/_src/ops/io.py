"""Constants and import of TF tensors into an mtf mesh."""

from __future__ import annotations

from typing import Optional

import numpy as np
import tensorflow as tf

from mesh_tensorflow._src import graph_constants
from mesh_tensorflow._src.graph import Mesh
from mesh_tensorflow._src.graph import Operation
from mesh_tensorflow._src.graph import Tensor
from mesh_tensorflow._src.ops import reshape as reshape_lib
from mesh_tensorflow._src.shapes import anonymous_shape
from mesh_tensorflow._src.shapes import convert_to_shape


class Constant(Operation):
  """A tensor filled with a scalar, or cut from a full-size numpy value.

  Args:
    mesh: the mtf Mesh.
    value: a Python scalar (filling the tensor) or a numpy array of the full
      shape.
    shape: the Shape of the tensor (None: a scalar).
    dtype: the tf.DType of the tensor.
    name: an optional name for the operation.
  """

  def __init__(
    self, mesh: Mesh, value, shape, dtype, name: Optional[str] = None
  ):
    super().__init__([], mesh, name=name or "constant")
    shape = convert_to_shape(shape)
    dtype = tf.as_dtype(dtype)
    array = np.asarray(value)
    if array.ndim and list(array.shape) != shape.to_integer_list:
      raise ValueError(
        "constant value of shape %s does not match %s"
        % (list(array.shape), shape.to_string)
      )
    self._value = array
    self._outputs = [Tensor(self, shape, dtype)]

  def lower(self, lowering) -> None:
    mesh_impl = lowering.mesh_impl(self)
    out = self.outputs[0]
    if self._value.ndim:
      laid_out = mesh_impl.import_tf_tensor(
        out, tf.constant(self._value, dtype=out.dtype)
      )
    else:
      slice_shape = mesh_impl.slice_shape(out.shape)
      value, dtype = self._value, out.dtype
      laid_out = mesh_impl.slicewise(
        lambda _: graph_constants.shared(
          (
            "fill",
            tuple(slice_shape),
            value.dtype.str,
            repr(value.item()),
            dtype.name,
          ),
          lambda: tf.fill(slice_shape, tf.constant(value, dtype=dtype)),
        ),
        mesh_impl.laid_out_pnum(),
      )
    lowering.set_tensor_lowering(out, laid_out)


def constant(mesh: Mesh, value, shape=None, dtype=tf.float32) -> Tensor:
  """A constant tensor; `value` is a scalar or an array of the full shape.

  Args:
    mesh: the mtf Mesh.
    value: a Python scalar (filling the tensor) or a numpy array of the full
      shape.
    shape: the Shape of the tensor (None: a scalar).
    dtype: the tf.DType of the tensor.

  Returns:
    an mtf Tensor of shape `shape` and dtype `dtype`.
  """
  if shape is None:
    shape = []
  return Constant(mesh, value, shape, dtype).outputs[0]


def zeros(mesh: Mesh, shape, dtype=tf.float32) -> Tensor:
  """A tensor of zeros.

  Args:
    mesh: the mtf Mesh.
    shape: the Shape of the result (or anything convert_to_shape accepts).
    dtype: the tf.DType of the tensor.

  Returns:
    an mtf Tensor of shape `shape` filled with 0.
  """
  return constant(mesh, 0, shape=shape, dtype=dtype)


def ones(mesh: Mesh, shape, dtype=tf.float32) -> Tensor:
  """A tensor of ones.

  Args:
    mesh: the mtf Mesh.
    shape: the Shape of the result (or anything convert_to_shape accepts).
    dtype: the tf.DType of the tensor.

  Returns:
    an mtf Tensor of shape `shape` filled with 1.
  """
  return constant(mesh, 1, shape=shape, dtype=dtype)


def zeros_like(t: Tensor) -> Tensor:
  """A tensor of zeros with the shape and dtype of t.

  Args:
    t: an mtf Tensor.

  Returns:
    an mtf Tensor of zeros, shaped like `t`.
  """
  return zeros(t.mesh, t.shape, dtype=t.dtype)


def ones_like(t: Tensor) -> Tensor:
  """A tensor of ones with the shape and dtype of t.

  Args:
    t: an mtf Tensor.

  Returns:
    an mtf Tensor of ones, shaped like `t`.
  """
  return ones(t.mesh, t.shape, dtype=t.dtype)


class ImportOperation(Operation):
  """Imports a full tf.Tensor; each processor keeps its slice.

  Args:
    mesh: the mtf Mesh.
    tf_tensor: a tf.Tensor whose shape matches `shape`.
    shape: the mtf Shape of the imported tensor.
    name: an optional name for the operation.
  """

  def __init__(self, mesh: Mesh, tf_tensor, shape, name: Optional[str] = None):
    super().__init__([], mesh, name=name or "import")
    tf_tensor = tf.convert_to_tensor(tf_tensor)
    shape = convert_to_shape(shape)
    if not tf_tensor.shape.is_compatible_with(shape.to_integer_list):
      raise ValueError(
        "cannot import tf tensor of shape %s as mtf shape %s"
        % (tf_tensor.shape, shape.to_string)
      )
    self._tf_tensor = tf_tensor
    self._outputs = [Tensor(self, shape, tf_tensor.dtype)]

  def lower(self, lowering) -> None:
    mesh_impl = lowering.mesh_impl(self)
    lowering.set_tensor_lowering(
      self.outputs[0],
      mesh_impl.import_tf_tensor(self.outputs[0], self._tf_tensor),
    )


def import_tf_tensor(
  mesh: Mesh, tf_tensor, shape=None, name: Optional[str] = None
) -> Tensor:
  """mtf Tensor from a tf.Tensor; shape None means a scalar.

  Args:
    mesh: the mtf Mesh.
    tf_tensor: a tf.Tensor (or a value tf.convert_to_tensor accepts) whose shape
      matches `shape`.
    shape: the mtf Shape to give it (None: a scalar).
    name: an optional name for the operation.

  Returns:
    an mtf Tensor of shape `shape` with the dtype of `tf_tensor`.
  """
  return ImportOperation(
    mesh, tf_tensor, [] if shape is None else shape, name=name
  ).outputs[0]


def import_fully_replicated(
  mesh: Mesh, tf_tensor, shape, name: Optional[str] = None
) -> Tensor:
  """Imports replicated (under anonymous dims), then reshapes; no comm.

  Args:
    mesh: the mtf Mesh.
    tf_tensor: a tf.Tensor, the same on every processor, whose shape matches
      `shape`.
    shape: the mtf Shape to give it.
    name: an optional name for the operation.

  Returns:
    an mtf Tensor of shape `shape`.
  """
  shape = convert_to_shape(shape)
  return reshape_lib.reshape(
    import_tf_tensor(mesh, tf_tensor, anonymous_shape(shape), name=name), shape
  )


class ImportLaidOutTensorOperation(Operation):
  """Uses slices the caller already laid out (e.g. an input pipeline).

  Args:
    mesh: the mtf Mesh.
    laid_out_tensor: a LaidOutTensor (of the lowering's mesh implementation)
      holding each processor's slice.
    shape: the mtf Shape of the full tensor.
    name: an optional name for the operation.
  """

  def __init__(
    self, mesh: Mesh, laid_out_tensor, shape, name: Optional[str] = None
  ):
    super().__init__([], mesh, name=name or "import_laid_out")
    self._laid_out_tensor = laid_out_tensor
    self._outputs = [
      Tensor(
        self, convert_to_shape(shape), laid_out_tensor.tensor_list[0].dtype
      )
    ]
    self._initialize_splittable_and_unsplittable_dims("unsplittable")

  def lower(self, lowering) -> None:
    lowering.set_tensor_lowering(self.outputs[0], self._laid_out_tensor)


def import_laid_out_tensor(
  mesh: Mesh, laid_out_tensor, shape, name: Optional[str] = None
) -> Tensor:
  """An mtf Tensor made of slices already laid out by the caller.

  Args:
    mesh: the mtf Mesh.
    laid_out_tensor: a LaidOutTensor (of the lowering's mesh implementation)
      holding each processor's slice.
    shape: the mtf Shape of the full tensor.
    name: an optional name for the operation.

  Returns:
    an mtf Tensor of shape `shape`.
  """
  return ImportLaidOutTensorOperation(
    mesh, laid_out_tensor, shape, name=name
  ).outputs[0]


def anonymize(x: Tensor) -> Tensor:
  """Reshapes to anonymous dims, which no layout splits (replicates x).

  Args:
    x: an mtf Tensor.

  Returns:
    an mtf Tensor with x's values under anonymous dims (a fully replicated
    copy).
  """
  return reshape_lib.reshape(x, anonymous_shape(x.shape))


__all__ = [
  "Constant",
  "ImportLaidOutTensorOperation",
  "ImportOperation",
  "anonymize",
  "constant",
  "import_fully_replicated",
  "import_laid_out_tensor",
  "import_tf_tensor",
  "ones",
  "ones_like",
  "zeros",
  "zeros_like",
]
