"""reshape, rename_dimension, replace_dimensions and broadcast.

A reshape keeps data in place when, for every mesh axis, the split lands on the
same "digit" of the flattened index before and after (the exclusive cumprod of
the split tensor axis is unchanged). Otherwise the lowering moves data:
alltoall when the old shape has an axis matching the new split, allconcat when
a split disappears, and allsplit (local) when a new split appears.
"""

from __future__ import annotations

from typing import Optional, Sequence

from mesh_tensorflow._src import graph_constants
from mesh_tensorflow._src.graph import Operation
from mesh_tensorflow._src.graph import Tensor
from mesh_tensorflow._src.shapes import Shape
from mesh_tensorflow._src.shapes import convert_to_dimension
from mesh_tensorflow._src.shapes import convert_to_shape


class ReshapeOperation(Operation):
  """Reshape to a shape of the same size, moving data if layouts differ.

  Args:
    x: an mtf Tensor.
    new_shape: the new Shape; its size equals that of x.
    name: an optional name for the operation.
  """

  def __init__(self, x: Tensor, new_shape: Shape, name: Optional[str] = None):
    super().__init__([x], name=name or "reshape")
    self._outputs = [Tensor(self, new_shape, x.dtype)]

  def gradient(
    self, grad_ys: Sequence[Optional[Tensor]]
  ) -> Sequence[Optional[Tensor]]:
    return [reshape(grad_ys[0], self.inputs[0].shape)]

  def lower(self, lowering) -> None:
    mesh_impl = lowering.mesh_impl(self)
    x = self.inputs[0]
    old_shape = x.shape
    new_shape = self.outputs[0].shape
    mesh_dims = mesh_impl.shape.dims
    old_cum = mesh_impl.mesh_axis_to_cumprod(old_shape)
    new_cum = mesh_impl.mesh_axis_to_cumprod(new_shape)
    new_ta2ma = mesh_impl.tensor_layout(new_shape).mesh_axis_to_tensor_axis(
      mesh_impl.ndims
    )
    changed = [m for m in range(mesh_impl.ndims) if old_cum[m] != new_cum[m]]
    laid_out = lowering.tensors[x]
    # ValueError naming the dimension if the new layout does not divide it.
    new_slice_shape = mesh_impl.slice_shape(new_shape)
    if not changed:
      lowering.set_tensor_lowering(
        self.outputs[0],
        mesh_impl.slicewise_delay_allreduce(
          lambda t: graph_constants.reshape(t, new_slice_shape), laid_out
        ),
      )
      return

    laid_out = laid_out.to_laid_out_tensor()
    layout = list(
      mesh_impl.tensor_layout(old_shape)
    )  # tensor axis -> mesh axis
    pending_splits = []
    for m in changed:
      k = mesh_dims[m].size
      old_axis = layout.index(m) if m in layout else None
      if old_axis is None:
        pending_splits.append(m)
        continue
      target = None
      if new_cum[m] is not None:
        for ta, dim in enumerate(old_shape.dims):
          if (
            ta != old_axis
            and layout[ta] is None
            and dim.size % k == 0
            and old_shape.cumprod[ta] == new_cum[m]
          ):
            target = ta
      if target is not None:
        lowering.add_counter(
          "alltoall/%d/reshape_op" % m, mesh_impl.laid_out_size(old_shape)
        )
        laid_out = mesh_impl.alltoall(laid_out, m, target, old_axis)
        layout[target], layout[old_axis] = m, None
      else:
        lowering.add_counter(
          "allconcat/%d/reshape_op" % m, mesh_impl.laid_out_size(old_shape)
        )
        laid_out = mesh_impl.allconcat(laid_out, m, old_axis)
        layout[old_axis] = None
        if new_cum[m] is not None:
          pending_splits.append(m)
    new_layout = mesh_impl.tensor_layout(new_shape)
    local_shape = [
      d.size
      if ma is None or ma in pending_splits
      else d.size // mesh_dims[ma].size
      for d, ma in zip(new_shape.dims, new_layout)
    ]
    for m in range(mesh_impl.ndims):
      here = old_shape.cumprod[layout.index(m)] if m in layout else None
      there = None if m in pending_splits else new_cum[m]
      if here != there:
        raise NotImplementedError(
          "reshape from %s to %s under layout %r needs a data movement "
          "along mesh dimension %r that is not supported"
          % (
            old_shape.to_string,
            new_shape.to_string,
            mesh_impl.layout_rules,
            mesh_dims[m].name,
          )
        )
    laid_out = mesh_impl.slicewise(
      lambda t: graph_constants.reshape(t, local_shape), laid_out
    )
    for m in pending_splits:
      laid_out = mesh_impl.allsplit(laid_out, m, new_ta2ma[m])
    lowering.set_tensor_lowering(self.outputs[0], laid_out)


def reshape(x: Tensor, new_shape, name: str = "reshape") -> Tensor:
  """Same data, new shape (sizes must multiply to the same total).

  Args:
    x: an mtf Tensor.
    new_shape: the new Shape (or anything convert_to_shape accepts); its size
      equals that of x.
    name: an optional name for the operation.

  Returns:
    an mtf Tensor of shape `new_shape` holding x's values in the same
    (row-major) order.
  """
  new_shape = convert_to_shape(new_shape)
  if new_shape.size != x.shape.size:
    raise ValueError(
      "cannot reshape %s (size %d) to %s (size %d)"
      % (x.shape.to_string, x.shape.size, new_shape.to_string, new_shape.size)
    )
  if new_shape == x.shape:
    return x
  return ReshapeOperation(x, new_shape, name=name).outputs[0]


def rename_dimension(x: Tensor, old_name: str, new_name: str) -> Tensor:
  """x with one dimension renamed (a reshape; data may move if layouts differ).

  Args:
    x: an mtf Tensor.
    old_name: the name of a dimension of x.
    new_name: its new name.

  Returns:
    an mtf Tensor like x, with the dimension renamed.
  """
  if old_name not in x.shape.dimension_names:
    raise ValueError(
      "rename_dimension: %r is not a dimension of %s"
      % (old_name, x.shape.to_string)
    )
  return reshape(x, x.shape.rename_dimension(old_name, new_name))


def replace_dimensions(
  tensor_or_shape, old_dim_or_dims, new_dim_or_dims
) -> Shape | Tensor:
  """Replaces consecutive dims by others, in a Shape or (by reshape) a Tensor.

  Args:
    tensor_or_shape: an mtf Tensor or a Shape.
    old_dim_or_dims: a Dimension, or a list of consecutive Dimensions, of it.
    new_dim_or_dims: a Dimension or list of Dimensions to put in their place
      (same total size for a Tensor).

  Returns:
    the new Shape, or (for a Tensor) the reshaped mtf Tensor.

  Raises:
    ValueError: if the old dims are not consecutive dims of the shape.
  """
  if isinstance(tensor_or_shape, Tensor):
    return reshape(
      tensor_or_shape,
      replace_dimensions(
        tensor_or_shape.shape, old_dim_or_dims, new_dim_or_dims
      ),
    )
  shape = convert_to_shape(tensor_or_shape)
  old = (
    list(old_dim_or_dims)
    if isinstance(old_dim_or_dims, (list, Shape))
    else [old_dim_or_dims]
  )
  new = (
    list(new_dim_or_dims)
    if isinstance(new_dim_or_dims, (list, Shape))
    else [new_dim_or_dims]
  )
  old = [convert_to_dimension(d) for d in old]
  new = [convert_to_dimension(d) for d in new]
  dims = shape.dims
  for d in old:
    if d not in dims:
      raise ValueError(
        "replace_dimensions: %s is not in %s" % (d, shape.to_string)
      )
  positions = [dims.index(d) for d in old]
  if positions != list(range(positions[0], positions[0] + len(positions))):
    raise ValueError(
      "replace_dimensions: %s are not consecutive in %s"
      % (old, shape.to_string)
    )
  return Shape(dims[: positions[0]] + new + dims[positions[-1] + 1 :])


__all__ = [
  "ReshapeOperation",
  "reshape",
  "rename_dimension",
  "replace_dimensions",
]
