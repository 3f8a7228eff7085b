"""Convolutions of images stored as blocks (mtf.layers.conv2d_with_blocks, ...).

The *_with_blocks layers take an image stored as blocks: e.g. for 2-D
[batch, h_blocks, w_blocks, h, w, channels], where the block dims may be split
across the mesh. A halo exchange over each block dim gives every block the
border it needs, and the result equals the plain layer (conv.py) on the
unblocked image (SAME padding); dims without blocks are zero-padded.
"""

from __future__ import annotations

from typing import Optional

from mesh_tensorflow._src.graph import Tensor
from mesh_tensorflow._src.layers import conv as conv_layers
from mesh_tensorflow._src.ops import conv as conv_ops
from mesh_tensorflow._src.ops.halo import halo_exchange_sides
from mesh_tensorflow._src.ops.tensor_ops import mtf_slice
from mesh_tensorflow._src.ops.tensor_ops import pad
from mesh_tensorflow._src.shapes import Dimension

__all__ = [
  "conv2d_transpose_with_blocks",
  "conv2d_with_blocks",
  "conv3d_transpose_with_blocks",
  "conv3d_with_blocks",
]


def _same_padding(n: int, f: int, s: int):
  """(before, after) zero padding of a SAME conv along a dim of size n."""
  total = max((-(-n // s) - 1) * s + f - n, 0)
  return total // 2, total - total // 2


def _check_blocks_args(
  label: str, padding: str, filter_size, strides, n: int, odd_filters: bool
):
  conv_ops.check_padding(padding, label)
  filter_size = conv_layers.check_sizes(filter_size, n, "filter_size", label)
  strides = conv_layers.check_sizes(strides, n, "strides", label)
  if padding != "SAME":
    raise NotImplementedError(
      "%s requires padding=SAME, got %r" % (label, padding)
    )
  if odd_filters:
    for i, f in enumerate(filter_size):
      if f % 2 == 0:
        raise ValueError(
          "%s: filter sizes must be odd, got %d for filter dim "
          "%r" % (label, f, conv_layers.FILTER_DIM_NAMES[n][i])
        )
  return filter_size, strides


def _blocked_spatial(x: Tensor, n: int, blocks_dims, label: str):
  """[(spatial dim, its blocks dim or None)] after checking the blocks dims."""
  spatial = x.shape.dims[-(n + 1) : -1]
  pairs = []
  for i, dim in enumerate(spatial):
    blocks = blocks_dims[i] if i < len(blocks_dims) else None
    if blocks is not None:
      if blocks not in x.shape.dims[: -(n + 1)]:
        raise ValueError(
          "%s: blocks dim %s of %r must be a leading (batch) "
          "dim of %s" % (label, blocks, dim.name, x.shape.to_string)
        )
    pairs.append((dim, blocks))
  return pairs


def _conv_with_blocks(
  x,
  output_dim,
  filter_size,
  strides,
  padding,
  blocks_dims,
  filter_initializer,
  variable_dtype,
  name,
  n: int,
) -> Tensor:
  """Halo exchange (or zero padding) per spatial dim, then a VALID conv."""
  label = "conv%dd_with_blocks" % n
  filter_size, strides = _check_blocks_args(
    label, padding, filter_size, strides, n, odd_filters=True
  )
  for (dim, blocks), f, s in zip(
    _blocked_spatial(x, n, blocks_dims, label), filter_size, strides
  ):
    num_blocks = 1 if blocks is None else blocks.size
    if blocks is not None and dim.size % s:
      raise ValueError(
        "%s: block dimension %r (size %d) is not a multiple "
        "of its stride %d" % (label, dim.name, dim.size, s)
      )
    before, after = _same_padding(num_blocks * dim.size, f, s)
    if blocks is None:
      if before or after:
        x = pad(x, [before, after], dim.name)
    else:
      x = halo_exchange_sides(x, blocks, dim, before, after, label=label)
  return conv_layers.conv_nd(
    x,
    output_dim,
    filter_size,
    strides,
    "VALID",
    filter_initializer,
    variable_dtype,
    name,
    n,
    False,
  )


def _conv_transpose_with_blocks(
  x,
  output_dim,
  filter_size,
  strides,
  padding,
  blocks_dims,
  filter_initializer,
  variable_dtype,
  name,
  n: int,
) -> Tensor:
  """Halo exchange, a SAME transposed conv per block, then crop the halo."""
  label = "conv%dd_transpose_with_blocks" % n
  filter_size, strides = _check_blocks_args(
    label, padding, filter_size, strides, n, odd_filters=False
  )
  crops = []
  for (dim, blocks), f, s in zip(
    _blocked_spatial(x, n, blocks_dims, label), filter_size, strides
  ):
    if blocks is None:
      continue  # The whole dim is local: SAME handles its borders.
    # Output o gets inputs i with o = i * s + k - before, 0 <= k < f.
    before = max(f - s, 0) // 2
    left, right = (f - 1 - before) // s, (s - 1 + before) // s
    if left or right:
      x = halo_exchange_sides(x, blocks, dim, left, right, label=label)
      crops.append((dim, left * s, dim.size * s))
  y = conv_layers.conv_nd(
    x,
    output_dim,
    filter_size,
    strides,
    "SAME",
    filter_initializer,
    variable_dtype,
    name,
    n,
    True,
  )
  for dim, begin, size in crops:
    y = mtf_slice(y, begin, size, dim.name)
  return y


def conv2d_with_blocks(
  x: Tensor,
  output_dim: Dimension,
  filter_size=(3, 3),
  strides=(1, 1),
  padding: str = "SAME",
  h_blocks_dim: Optional[Dimension] = None,
  w_blocks_dim: Optional[Dimension] = None,
  filter_initializer=None,
  variable_dtype=None,
  name: Optional[str] = None,
) -> Tensor:
  """conv2d of an image stored as blocks (spatial partitioning).

  Example:
    An 8x8 image as 2x2 blocks of 4x4, h_blocks split over two processors;
    the result is conv2d of the whole image, re-blocked:

    >>> converter = mtf.test_utils.NumpyConverter(
    ...     mesh_shape="all:2", layout="h_blocks:all",
    ...     devices=["cpu:0", "cpu:1"])
    >>> image = np.random.RandomState(0).randn(1, 8, 8, 2).astype(np.float32)
    >>> def to_blocks(a):  # [b, 8, 8, c] -> [b, h_blocks, w_blocks, 4, 4, c]
    ...   return a.reshape([1, 2, 4, 2, 4, -1]).transpose([0, 1, 3, 2, 4, 5])
    >>> x = converter.convert_np_array_to_mtf_tensor(
    ...     to_blocks(image), ["batch", "h_blocks", "w_blocks", "h", "w", "in"],
    ...     dtype=tf.float32)
    >>> y = conv2d_with_blocks(x, mtf.Dimension("out", 3),
    ...                        h_blocks_dim=x.shape.dims[1],
    ...                        w_blocks_dim=x.shape.dims[2])
    >>> y.shape
    Shape[batch=1, h_blocks=2, w_blocks=2, h=4, w=4, out=3]
    >>> kernel = converter.convert_mtf_tensor_to_np_array(
    ...     converter.graph.trainable_variables[0].outputs[0])
    >>> np.allclose(converter.convert_mtf_tensor_to_np_array(y),
    ...             to_blocks(tf.nn.conv2d(image, kernel, 1, "SAME").numpy()),
    ...             atol=1e-5)
    True

  Args:
    x: [batch..., h_blocks, w_blocks, h, w, in_channels].
    output_dim: the output channel Dimension.
    filter_size: (fh, fw), odd.
    strides: (s_h, s_w); block sizes must be multiples of them.
    padding: "SAME" only.
    h_blocks_dim: the Dimension of height blocks (may be split), or None.
    w_blocks_dim: the Dimension of width blocks (may be split), or None.
    filter_initializer: initializer of the kernel.
    variable_dtype: an mtf.VariableDType.
    name: variable scope (default "conv2d").

  Returns:
    [batch..., h_blocks, w_blocks, h', w', output_dim].

  Raises:
    ValueError: for an even filter size; NotImplementedError for VALID.
  """
  if h_blocks_dim is None and w_blocks_dim is None:
    return conv_layers.conv2d(
      x,
      output_dim,
      filter_size,
      strides,
      padding,
      filter_initializer,
      variable_dtype,
      name,
    )
  return _conv_with_blocks(
    x,
    output_dim,
    filter_size,
    strides,
    padding,
    [h_blocks_dim, w_blocks_dim],
    filter_initializer,
    variable_dtype,
    name,
    2,
  )


def conv3d_with_blocks(
  x: Tensor,
  output_dim: Dimension,
  filter_size=(3, 3, 3),
  strides=(1, 1, 1),
  padding: str = "SAME",
  d_blocks_dim: Optional[Dimension] = None,
  h_blocks_dim: Optional[Dimension] = None,
  filter_initializer=None,
  variable_dtype=None,
  name: Optional[str] = None,
) -> Tensor:
  """conv3d of [batch..., d_blocks, h_blocks, d, h, w, in] stored as blocks.

  As conv2d_with_blocks, with depth and height blocks (w is never blocked).

  Args:
    x: the input, an mtf Tensor of blocks: [batch..., blocks dims..., spatial
      dims..., in_channels].
    output_dim: the Dimension of the output channels.
    filter_size: the 3 spatial sizes of the filter.
    strides: the 3 spatial strides.
    padding: "SAME" or "VALID".
    d_blocks_dim: optional Dimension counting the blocks of the depth axis
      (None: not blocked).
    h_blocks_dim: optional Dimension counting the blocks of the height axis
      (None: not blocked).
    filter_initializer: a TF initializer for the kernel variable; None uses
      get_variable's default (the variable scope's initializer, else
      glorot_uniform).
    variable_dtype: an mtf VariableDType for the kernel; None keeps float32
      master and slices and reads it in x's dtype.
    name: the variable scope of the kernel variable; None makes a unique one
      from the layer's name (e.g. "conv2d").

  Returns:
    an mtf Tensor with the same block dims, the spatial sizes of the convolution
    and output_dim last.
  """
  if d_blocks_dim is None and h_blocks_dim is None:
    return conv_layers.conv3d(
      x,
      output_dim,
      filter_size,
      strides,
      padding,
      filter_initializer,
      variable_dtype,
      name,
    )
  return _conv_with_blocks(
    x,
    output_dim,
    filter_size,
    strides,
    padding,
    [d_blocks_dim, h_blocks_dim],
    filter_initializer,
    variable_dtype,
    name,
    3,
  )


def conv2d_transpose_with_blocks(
  x: Tensor,
  output_dim: Dimension,
  filter_size=(2, 2),
  strides=(2, 2),
  padding: str = "SAME",
  h_blocks_dim: Optional[Dimension] = None,
  w_blocks_dim: Optional[Dimension] = None,
  filter_initializer=None,
  variable_dtype=None,
  name: Optional[str] = None,
) -> Tensor:
  """conv2d_transpose of an image stored as blocks (SAME padding only).

  Each block of size b becomes b * stride; the result equals
  conv2d_transpose of the unblocked image, re-blocked.

  Args:
    x: the input, an mtf Tensor of blocks: [batch..., blocks dims..., spatial
      dims..., in_channels].
    output_dim: the Dimension of the output channels.
    filter_size: the 2 spatial sizes of the filter.
    strides: the 2 spatial strides.
    padding: "SAME" or "VALID".
    h_blocks_dim: optional Dimension counting the blocks of the height axis
      (None: not blocked).
    w_blocks_dim: optional Dimension counting the blocks of the width axis
      (None: not blocked).
    filter_initializer: a TF initializer for the kernel variable; None uses
      get_variable's default (the variable scope's initializer, else
      glorot_uniform).
    variable_dtype: an mtf VariableDType for the kernel; None keeps float32
      master and slices and reads it in x's dtype.
    name: the variable scope of the kernel variable; None makes a unique one
      from the layer's name (e.g. "conv2d").

  Returns:
    an mtf Tensor with the same block dims, the spatial sizes of the convolution
    and output_dim last.
  """
  if h_blocks_dim is None and w_blocks_dim is None:
    return conv_layers.conv2d_transpose(
      x,
      output_dim,
      filter_size,
      strides,
      padding,
      filter_initializer,
      variable_dtype,
      name,
    )
  return _conv_transpose_with_blocks(
    x,
    output_dim,
    filter_size,
    strides,
    padding,
    [h_blocks_dim, w_blocks_dim],
    filter_initializer,
    variable_dtype,
    name,
    2,
  )


def conv3d_transpose_with_blocks(
  x: Tensor,
  output_dim: Dimension,
  filter_size=(2, 2, 2),
  strides=(2, 2, 2),
  padding: str = "SAME",
  d_blocks_dim: Optional[Dimension] = None,
  h_blocks_dim: Optional[Dimension] = None,
  filter_initializer=None,
  variable_dtype=None,
  name: Optional[str] = None,
) -> Tensor:
  """conv3d_transpose of [batch..., d_blocks, h_blocks, d, h, w, in] blocks.

  Args:
    x: the input, an mtf Tensor of blocks: [batch..., blocks dims..., spatial
      dims..., in_channels].
    output_dim: the Dimension of the output channels.
    filter_size: the 3 spatial sizes of the filter.
    strides: the 3 spatial strides.
    padding: "SAME" or "VALID".
    d_blocks_dim: optional Dimension counting the blocks of the depth axis
      (None: not blocked).
    h_blocks_dim: optional Dimension counting the blocks of the height axis
      (None: not blocked).
    filter_initializer: a TF initializer for the kernel variable; None uses
      get_variable's default (the variable scope's initializer, else
      glorot_uniform).
    variable_dtype: an mtf VariableDType for the kernel; None keeps float32
      master and slices and reads it in x's dtype.
    name: the variable scope of the kernel variable; None makes a unique one
      from the layer's name (e.g. "conv2d").

  Returns:
    an mtf Tensor with the same block dims, the spatial sizes of the convolution
    and output_dim last.
  """
  if d_blocks_dim is None and h_blocks_dim is None:
    return conv_layers.conv3d_transpose(
      x,
      output_dim,
      filter_size,
      strides,
      padding,
      filter_initializer,
      variable_dtype,
      name,
    )
  return _conv_transpose_with_blocks(
    x,
    output_dim,
    filter_size,
    strides,
    padding,
    [d_blocks_dim, h_blocks_dim],
    filter_initializer,
    variable_dtype,
    name,
    3,
  )
