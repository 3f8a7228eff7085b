"""one_hot, gather and range: index-driven ops over named dimensions.

`one_hot` and `mtf_range` are computed locally on every processor (a split
output dimension only shifts each processor's indices by its slice begin).
`gather` is an einsum against a one-hot matrix, so a split `dim` (a vocabulary
split over the mesh) costs exactly the einsum's allreduce.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import tensorflow as tf

from mesh_tensorflow._src.graph import Mesh, Operation, Tensor
from mesh_tensorflow._src.ops import einsum as einsum_lib
from mesh_tensorflow._src.ops import elementwise
from mesh_tensorflow._src.ops import io
from mesh_tensorflow._src.shapes import Shape, convert_to_dimension


class OneHotOperation(Operation):
  """indices -> one-hot tensor with `output_dim` appended; no communication."""

  def __init__(self, indices: Tensor, output_dim, on_value, off_value, dtype,
               name: Optional[str] = None):
    if not isinstance(indices, Tensor):
      raise TypeError("one_hot indices must be an mtf Tensor, got %r"
                      % (indices,))
    if not indices.dtype.is_integer:
      raise ValueError("one_hot indices %s must have an integer dtype, got %s"
                       % (indices.name, indices.dtype.name))
    output_dim = convert_to_dimension(output_dim)
    if output_dim.name in indices.shape.dimension_names:
      raise ValueError("one_hot output dimension %s is already a dimension of "
                       "indices %s" % (output_dim, indices.to_string))
    super().__init__([indices], name=name or "one_hot")
    self._output_dim = output_dim
    self._on_value = on_value
    self._off_value = off_value
    self._dtype = tf.as_dtype(dtype)
    self._outputs = [Tensor(self, Shape(indices.shape.dims + [output_dim]),
                            self._dtype)]

  @property
  def has_gradient(self) -> bool:
    return False

  def lower(self, lowering):
    mesh_impl = lowering.mesh_impl(self)
    out = self.outputs[0]
    depth = mesh_impl.slice_shape(out.shape)[-1]
    mesh_axis = mesh_impl.tensor_dimension_to_mesh_axis(self._output_dim)
    dtype, on_value, off_value = self._dtype, self._on_value, self._off_value

    def one_hot_fn(indices_slice, pcoord):
      if isinstance(pcoord, int):
        if pcoord:
          indices_slice -= pcoord * depth
      else:
        indices_slice -= tf.cast(pcoord, indices_slice.dtype) * depth
      return tf.one_hot(indices_slice, depth,
                        on_value=tf.cast(on_value, dtype),
                        off_value=tf.cast(off_value, dtype), dtype=dtype)

    pcoord = 0 if mesh_axis is None else mesh_impl.laid_out_pcoord(mesh_axis)
    lowering.set_tensor_lowering(
        out, mesh_impl.slicewise(one_hot_fn, lowering.tensors[self.inputs[0]],
                                 pcoord))


def one_hot(indices: Tensor, output_dim, on_value=1.0, off_value=0.0,
            dtype=tf.float32, name: Optional[str] = None) -> Tensor:
  """One-hot encoding of integer `indices` along a new last dim `output_dim`.

  Example:
    ids: [batch] int32 -> mtf.one_hot(ids, vocab_dim): [batch, vocab] float32
  """
  return OneHotOperation(indices, output_dim, on_value, off_value, dtype,
                         name=name).outputs[0]


def gather(weights: Tensor, indices, dim, output_shape=None) -> Tensor:
  """weights[..., indices, ...] along `dim`, as einsum(one_hot(indices), w).

  Args:
    weights: the tensor to gather from; must have dimension `dim`.
    indices: an integer mtf Tensor, or a Python int (a scalar index).
    dim: the dimension of weights that is indexed (and removed).
    output_shape: optional output shape; default is the dims of indices
      followed by the dims of weights other than `dim`.

  Returns:
    a Tensor of weights' dtype.

  Example:
    embedding [vocab, d_model], ids [batch, length]
      -> mtf.gather(embedding, ids, vocab): [batch, length, d_model]
  """
  dim = convert_to_dimension(dim)
  if dim not in weights.shape.dims:
    raise ValueError("gather: dimension %s is not a dimension of weights %s"
                     % (dim, weights.to_string))
  if not isinstance(indices, Tensor):
    if np.ndim(indices) != 0:
      raise ValueError("gather: indices must be an mtf Tensor or a Python "
                       "int, got %r" % (indices,))
    indices = io.constant(weights.mesh, int(indices), shape=[], dtype=tf.int32)
  if weights.dtype == tf.bool:
    return elementwise.cast(
        gather(elementwise.to_float(weights), indices, dim, output_shape),
        tf.bool)
  return einsum_lib.einsum(
      [one_hot(indices, dim, dtype=weights.dtype), weights],
      output_shape=output_shape, reduced_dims=[dim])


class RangeOperation(Operation):
  """The 1-D tensor [0, 1, ..., dim.size - 1]; each processor makes its part."""

  def __init__(self, mesh: Mesh, dim, dtype, name: Optional[str] = None):
    super().__init__([], mesh, name=name or "range")
    dim = convert_to_dimension(dim)
    self._dim = dim
    self._outputs = [Tensor(self, Shape([dim]), dtype)]

  def lower(self, lowering):
    mesh_impl = lowering.mesh_impl(self)
    out = self.outputs[0]
    size = mesh_impl.slice_shape(out.shape)[0]
    dtype = out.dtype
    # tf.range has no kernels for bfloat16/float16: count in int64, then cast.
    compute_dtype = dtype if dtype in (tf.int32, tf.int64) else tf.int64

    def range_fn(begin):
      start = begin[0]
      if isinstance(start, int):
        values = tf.range(start, start + size, dtype=compute_dtype)
      else:
        values = tf.range(size, dtype=compute_dtype) + tf.cast(
            start, compute_dtype)
      return tf.cast(values, dtype)

    lowering.set_tensor_lowering(
        out, mesh_impl.slicewise(range_fn,
                                 mesh_impl.laid_out_slice_begin(out.shape)))


def mtf_range(mesh: Mesh, dim, dtype, name: Optional[str] = None) -> Tensor:
  """[0, dim.size) along `dim` (also exported as `mtf.range`).

  Example:
    mtf.range(mesh, length_dim, tf.int32): [length] = 0, 1, ..., length - 1
  """
  return RangeOperation(mesh, dim, dtype, name=name).outputs[0]


__all__ = ["OneHotOperation", "RangeOperation", "gather", "mtf_range",
           "one_hot"]
