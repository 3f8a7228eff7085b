"""Halo exchange between neighbouring blocks of a (possibly split) dimension.

A spatial dimension of size nb * b is often stored as two dims: `blocks_dim`
(nb blocks, which may be split across the mesh) and `block_size_dim` (b
positions per block, kept whole). A halo exchange gives each block the
`halo_size` positions just before (and after) it, taken from the neighbouring
blocks, so that a local operation such as a VALID convolution sees the same
data as on the unblocked dimension. The margins are built from mtf.shift along
blocks_dim (a collective permute when that dim is split), mtf.slice and
mtf.concat along block_size_dim; a halo larger than a block takes data from
several blocks. Outside the ends the margins are zeros, or wrap around with
wrap=True. Gradients follow from those ops.

Example (nb = 2, b = 3, halo_size = 1; one block per processor):

  >>> converter = mtf.test_utils.NumpyConverter(
  ...     mesh_shape="all:2", layout="nb:all", devices=["cpu:0", "cpu:1"])
  >>> blocks = converter.convert_np_array_to_mtf_tensor(
  ...     [[1, 2, 3], [4, 5, 6]], ["nb", "b"])
  >>> converter.convert_mtf_tensor_to_np_array(
  ...     halo_exchange(blocks, "nb", "b", halo_size=1))
  array([[0, 1, 2, 3, 4],
         [3, 4, 5, 6, 0]], dtype=int32)
"""

from __future__ import annotations

from typing import List, Union

from mesh_tensorflow._src.graph import Tensor
from mesh_tensorflow._src.ops.shift import shift
from mesh_tensorflow._src.ops.tensor_ops import concat
from mesh_tensorflow._src.ops.tensor_ops import mtf_slice
from mesh_tensorflow._src.shapes import Dimension
from mesh_tensorflow._src.shapes import convert_to_dimension

DimLike = Union[Dimension, str]


def _resolve_dim(x: Tensor, dim: DimLike, what: str, label: str) -> Dimension:
  name = dim if isinstance(dim, str) else convert_to_dimension(dim).name
  if name not in x.shape.dimension_names:
    raise ValueError(
      "%s: %s %r is not a dimension of %s"
      % (label, what, name, x.shape.to_string)
    )
  actual = x.shape.get_dim_by_name(name)
  if not isinstance(dim, str) and convert_to_dimension(dim) != actual:
    raise ValueError(
      "%s: %s %s does not match %s in %s"
      % (label, what, convert_to_dimension(dim), actual, x.shape.to_string)
    )
  return actual


def _check_args(
  x: Tensor, blocks_dim: DimLike, block_size_dim: DimLike, halo_size, label: str
):
  blocks = _resolve_dim(x, blocks_dim, "blocks_dim", label)
  block_size = _resolve_dim(x, block_size_dim, "block_size_dim", label)
  if blocks.name == block_size.name:
    raise ValueError(
      "%s: blocks_dim and block_size_dim are both %r" % (label, blocks.name)
    )
  if (
    not isinstance(halo_size, int)
    or isinstance(halo_size, bool)
    or (halo_size < 0)
  ):
    raise ValueError(
      "%s: halo_size must be a non-negative int, got %r" % (label, halo_size)
    )
  return blocks, block_size


def _margin(
  x: Tensor,
  blocks: Dimension,
  block_size: Dimension,
  halo_size: int,
  wrap: bool,
  left: bool,
) -> Tensor:
  """The halo_size positions just before (left) or after each block."""
  b = block_size.size
  num_blocks_needed = -(-halo_size // b)
  partial = halo_size - (num_blocks_needed - 1) * b  # In (0, b].
  pieces: List[Tensor] = []
  for k in range(1, num_blocks_needed + 1):
    source = x
    if k == num_blocks_needed and partial < b:
      # Only the part next to the block is needed: slice before sending.
      begin = b - partial if left else 0
      source = mtf_slice(x, begin, partial, block_size.name)
    pieces.append(shift(source, k if left else -k, blocks, wrap))
  if left:
    pieces.reverse()  # Farthest block first.
  return pieces[0] if len(pieces) == 1 else concat(pieces, block_size.name)


def halo_exchange(
  x: Tensor,
  blocks_dim: DimLike,
  block_size_dim: DimLike,
  halo_size: int,
  wrap: bool = False,
) -> Tensor:
  """Appends margins from the neighbouring blocks on both sides.

  Example:
    Two blocks of 3, one per processor, each gets 1 value from each
    neighbour (zeros past the ends):

    >>> converter = mtf.test_utils.NumpyConverter(
    ...     mesh_shape="all:2", layout="nb:all", devices=["cpu:0", "cpu:1"])
    >>> x = converter.convert_np_array_to_mtf_tensor(
    ...     [[1, 2, 3], [4, 5, 6]], ["nb", "b"])
    >>> y = halo_exchange(x, "nb", "b", 1)
    >>> y.shape
    Shape[nb=2, b=5]
    >>> converter.convert_mtf_tensor_to_np_array(y)
    array([[0, 1, 2, 3, 4],
           [3, 4, 5, 6, 0]], dtype=int32)
    >>> converter.convert_mtf_tensor_to_np_array(
    ...     halo_exchange(x, "nb", "b", 1, wrap=True))
    array([[6, 1, 2, 3, 4],
           [3, 4, 5, 6, 1]], dtype=int32)

  Args:
    x: a Tensor with dims blocks_dim and block_size_dim.
    blocks_dim: the Dimension (or name) indexing the blocks; may be split.
    block_size_dim: the Dimension (or name) within a block; must not be split.
    halo_size: margin size on each side (may exceed the block size).
    wrap: take the margins of the end blocks from the other end.

  Returns:
    x with block_size_dim grown by 2 * halo_size.

  Raises:
    ValueError: for dims not in x or a negative halo_size; at lowering if
      block_size_dim is split.
  """
  return halo_exchange_sides(
    x,
    blocks_dim,
    block_size_dim,
    halo_size,
    halo_size,
    wrap,
    label="halo_exchange",
  )


def left_halo_exchange(
  x: Tensor,
  blocks_dim: DimLike,
  block_size_dim: DimLike,
  halo_size: int,
  wrap: bool = False,
) -> Tensor:
  """Like halo_exchange, but prepends the left margin only.

  Example:
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> x = converter.convert_np_array_to_mtf_tensor(
    ...     [[1, 2, 3], [4, 5, 6]], ["nb", "b"])
    >>> converter.convert_mtf_tensor_to_np_array(
    ...     left_halo_exchange(x, "nb", "b", 1))
    array([[0, 1, 2, 3],
           [3, 4, 5, 6]], dtype=int32)

  Args:
    x: an mtf Tensor laid out as blocks: blocks_dim x block_size_dim.
    blocks_dim: the Dimension (or name) counting the blocks; it may be split
      across the mesh.
    block_size_dim: the Dimension (or name) of positions within a block.
    halo_size: the number of positions taken from the end of the previous block.
    wrap: if True the first block gets the end of the last block; else zeros.

  Returns:
    an mtf Tensor like x whose block_size_dim is halo_size longer.
  """
  return halo_exchange_sides(
    x,
    blocks_dim,
    block_size_dim,
    halo_size,
    0,
    wrap,
    label="left_halo_exchange",
  )


def halo_exchange_sides(
  x: Tensor,
  blocks_dim: DimLike,
  block_size_dim: DimLike,
  left_size: int,
  right_size: int,
  wrap: bool = False,
  label: str = "halo_exchange_sides",
) -> Tensor:
  """Halo exchange with margins of different sizes on the two sides.

  Example:
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> x = converter.convert_np_array_to_mtf_tensor(
    ...     [[1, 2, 3], [4, 5, 6]], ["nb", "b"])
    >>> converter.convert_mtf_tensor_to_np_array(
    ...     halo_exchange_sides(x, "nb", "b", 1, 2))  # left 1, right 2
    array([[0, 1, 2, 3, 4, 5],
           [3, 4, 5, 6, 0, 0]], dtype=int32)
  """
  blocks, block_size = _check_args(
    x, blocks_dim, block_size_dim, left_size, label
  )
  _check_args(x, blocks_dim, block_size_dim, right_size, label)
  pieces = []
  if left_size:
    pieces.append(_margin(x, blocks, block_size, left_size, wrap, left=True))
  pieces.append(x)
  if right_size:
    pieces.append(_margin(x, blocks, block_size, right_size, wrap, left=False))
  return pieces[0] if len(pieces) == 1 else concat(pieces, block_size.name)


__all__ = ["halo_exchange", "left_halo_exchange"]
