"""shift: move contents along one dimension, wrapping around or zero-filling.

When the shifted dimension is split over mesh axis m into k blocks of size b,
output block i along m is assembled from at most two source blocks: with
offset = n * b + r (0 <= r < b), its first r positions are the last r positions
of block i - n - 1, and its remaining b - r positions are the first b - r
positions of block i - n. Each part travels with one
`mesh_impl.shift_by_n_processors` (a `receive`, i.e. a collective permute);
a local concat joins them.
"""

from __future__ import annotations

from typing import Optional, Sequence

import tensorflow as tf

from mesh_tensorflow._src.graph import Operation
from mesh_tensorflow._src.graph import Tensor
from mesh_tensorflow._src.laid_out import to_laid_out_tensor
from mesh_tensorflow._src.ops.tensor_ops import DimLike
from mesh_tensorflow._src.ops.tensor_ops import find_axis


def _is_int(x) -> bool:
  return isinstance(x, int) and not isinstance(x, bool)


class ShiftOperation(Operation):
  """Shifts x by `offset` positions along `dim` (positive = towards the end).

  With wrap=True positions wrap around (a roll); otherwise vacated positions
  are zero and |offset| >= dim.size gives all zeros.

  Args:
    x: the mtf Tensor to shift.
    offset: the number of positions (negative shifts towards the start).
    dim: the Dimension (or its name) to shift along.
    wrap: whether positions wrap around.
    name: an optional name for the operation.
  """

  def __init__(
    self,
    x: Tensor,
    offset: int,
    dim: DimLike,
    wrap: bool,
    name: Optional[str] = None,
  ):
    super().__init__([x], name=name or "shift")
    self._axis, self._dim = find_axis(x, dim, "shift")
    if not _is_int(offset):
      raise ValueError(
        "shift along %r: offset must be an int, got %r"
        % (self._dim.name, offset)
      )
    self._offset = offset
    self._wrap = bool(wrap)
    self._outputs = [Tensor(self, x.shape, x.dtype)]

  @property
  def offset(self) -> int:
    """How many positions to shift by (negative shifts the other way)."""
    return self._offset

  @property
  def wrap(self) -> bool:
    """Whether the shift wraps around (else zeros are shifted in)."""
    return self._wrap

  def gradient(
    self, grad_ys: Sequence[Optional[Tensor]]
  ) -> Sequence[Optional[Tensor]]:
    return [shift(grad_ys[0], -self._offset, self._dim, self._wrap)]

  def _local_slice(self, t, start: int, size: int):
    """Positions [start, start + size) of the shifted axis of a slice."""
    begin = [0] * t.shape.rank
    begin[self._axis] = start
    sizes = [-1] * t.shape.rank
    sizes[self._axis] = size
    return tf.slice(t, begin, sizes)

  def lower(self, lowering) -> None:
    mesh_impl = lowering.mesh_impl(self)
    x = self.inputs[0]
    size = self._dim.size
    offset = self._offset
    if self._wrap:
      offset %= size if size else 1
    lowered_x = lowering.tensors[x]
    mesh_axis = mesh_impl.tensor_dimension_to_mesh_axis(self._dim)

    if offset == 0:
      y = lowered_x
    elif abs(offset) >= size:  # Only without wrap: everything shifts out.
      slice_shape, dtype = mesh_impl.slice_shape(x.shape), x.dtype
      y = mesh_impl.slicewise(
        lambda _: tf.zeros(slice_shape, dtype), mesh_impl.laid_out_pnum()
      )
    elif mesh_axis is None:
      y = mesh_impl.slicewise_delay_allreduce(
        lambda t: self._shift_local(t, offset, size), lowered_x
      )
    else:
      y = self._shift_split(
        lowering, mesh_impl, to_laid_out_tensor(lowered_x), mesh_axis, offset
      )
    lowering.set_tensor_lowering(self.outputs[0], y)

  def _shift_local(self, t, offset: int, size: int):
    """Shift of a slice holding the whole dimension (0 < |offset| < size)."""
    if self._wrap:
      return tf.roll(t, offset, axis=self._axis)
    paddings = [[0, 0] for _ in range(t.shape.rank)]
    if offset > 0:
      kept = self._local_slice(t, 0, size - offset)
      paddings[self._axis] = [offset, 0]
    else:
      kept = self._local_slice(t, -offset, size + offset)
      paddings[self._axis] = [0, -offset]
    return tf.pad(kept, paddings)

  def _shift_split(
    self, lowering, mesh_impl, lowered_x, mesh_axis: int, offset: int
  ):
    """Shift along a dimension split over mesh_axis (0 < |offset| < size)."""
    num_blocks = mesh_impl.shape.dims[mesh_axis].size
    block = self._dim.size // num_blocks
    n, r = divmod(offset, block)  # offset = n * block + r, 0 <= r < block.
    laid_out_size = mesh_impl.laid_out_size(self.inputs[0].shape)
    if r == 0:
      lowering.add_counter("shift[%d]" % n, laid_out_size)
      return self._shift_blocks(mesh_impl, lowered_x, mesh_axis, n, num_blocks)
    # The tail of block i - n - 1 becomes the head of output block i ...
    tail = mesh_impl.slicewise(
      lambda t: self._local_slice(t, block - r, r), lowered_x
    )
    lowering.add_counter("shift[%d]" % (n + 1), laid_out_size * r // block)
    head_part = self._shift_blocks(
      mesh_impl, tail, mesh_axis, n + 1, num_blocks
    )
    # ... and the head of block i - n its remainder.
    head = mesh_impl.slicewise(
      lambda t: self._local_slice(t, 0, block - r), lowered_x
    )
    lowering.add_counter("shift[%d]" % n, laid_out_size * (block - r) // block)
    tail_part = self._shift_blocks(mesh_impl, head, mesh_axis, n, num_blocks)
    axis = self._axis
    return mesh_impl.slicewise(
      lambda a, b: tf.concat([a, b], axis=axis), head_part, tail_part
    )

  def _shift_blocks(
    self, mesh_impl, laid_out, mesh_axis: int, n: int, num_blocks: int
  ):
    """Each processor gets the slice of the one n before it on mesh_axis."""
    if self._wrap:
      n %= num_blocks
    if n == 0:
      return laid_out  # Data stays where it is.
    if abs(n) >= num_blocks:  # Without wrap: nothing arrives.
      return mesh_impl.slicewise(tf.zeros_like, laid_out)
    return mesh_impl.shift_by_n_processors(laid_out, mesh_axis, n, self._wrap)


def shift(
  x: Tensor, offset: int, dim: DimLike, wrap: bool, name: Optional[str] = None
) -> Tensor:
  """Shifts x by offset along dim (negative offset = towards the start).

  Example:
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> x = converter.convert_np_array_to_mtf_tensor([1, 2, 3, 4], ["n"])
    >>> converter.convert_mtf_tensor_to_np_array(mtf.shift(x, 1, "n", False))
    array([0, 1, 2, 3], dtype=int32)
    >>> converter.convert_mtf_tensor_to_np_array(mtf.shift(x, -1, "n", True))
    array([2, 3, 4, 1], dtype=int32)

  Args:
    x: the tensor.
    offset: an int; y[i] = x[i - offset].
    dim: the Dimension of x to shift along (or its name).
    wrap: roll around the ends instead of filling with zeros.
    name: optional op name.

  Returns:
    a Tensor with x's shape.
  """
  return ShiftOperation(x, offset, dim, wrap, name=name).outputs[0]


__all__ = ["ShiftOperation", "shift"]
