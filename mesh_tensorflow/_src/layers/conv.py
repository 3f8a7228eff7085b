"""Convolution and pooling layers (mtf.layers.conv2d, max_pool2d, ...).

Inputs are [batch..., spatial..., channels]; the kernel variable is "kernel"
with filter dims "fh", "fw" (2-D) or "fd", "fh", "fw" (3-D), created in
tf.compat.v1.variable_scope(name), or a default name (the function's name)
made unique per mtf Graph (scope_util.layer_variable_scope). No bias.

The *_with_blocks variants, for images stored as blocks split across the
mesh, are in blocked_conv.py.

Example:
  >>> converter = mtf.test_utils.NumpyConverter()
  >>> x_np = np.random.RandomState(0).randn(1, 4, 4, 2).astype(np.float32)
  >>> x = converter.convert_np_array_to_mtf_tensor(
  ...     x_np, ["batch", "h", "w", "in"], dtype=tf.float32)
  >>> y = mtf.layers.conv2d(x, mtf.Dimension("out", 3), filter_size=(3, 3))
  >>> y.shape
  Shape[batch=1, h=4, w=4, out=3]
  >>> [(v.name, v.shape) for v in converter.graph.trainable_variables]
  [('conv2d/kernel', Shape[fh=3, fw=3, in=2, out=3])]
  >>> kernel = converter.convert_mtf_tensor_to_np_array(
  ...     converter.graph.trainable_variables[0].outputs[0])
  >>> np.allclose(converter.convert_mtf_tensor_to_np_array(y),
  ...             tf.nn.conv2d(x_np, kernel, 1, "SAME"), atol=1e-5)
  True
"""

from __future__ import annotations

from typing import Optional, Sequence

from mesh_tensorflow._src.graph import Tensor
from mesh_tensorflow._src.layers import core
from mesh_tensorflow._src.layers.scope_util import layer_variable_scope
from mesh_tensorflow._src.ops import conv as conv_ops
from mesh_tensorflow._src.ops import pool as pool_ops
from mesh_tensorflow._src.ops.reshape import reshape
from mesh_tensorflow._src.ops.shift import shift
from mesh_tensorflow._src.shapes import Dimension
from mesh_tensorflow._src.shapes import Shape
from mesh_tensorflow._src.variables import VariableDType
from mesh_tensorflow._src.variables import get_variable

FILTER_DIM_NAMES = {2: ("fh", "fw"), 3: ("fd", "fh", "fw")}


def _kernel(
  x: Tensor,
  name: Optional[str],
  default_name: str,
  filter_size: Sequence[int],
  channel_dims,
  filter_initializer,
  variable_dtype,
) -> Tensor:
  """Creates (or reuses) the "kernel" variable [f..., *channel_dims]."""
  names = FILTER_DIM_NAMES[len(filter_size)]
  filter_dims = [Dimension(n, s) for n, s in zip(names, filter_size)]
  with layer_variable_scope(x.mesh.graph, name, default_name):
    if variable_dtype is None:
      variable_dtype = VariableDType(activation_dtype=x.dtype)
    return get_variable(
      x.mesh,
      "kernel",
      Shape(filter_dims + channel_dims),
      initializer=filter_initializer,
      dtype=variable_dtype,
    )


def check_sizes(values, n: int, what: str, label: str):
  """values, checked to be n positive ints, as a list.

  Args:
    values: a list or tuple of ints.
    n: how many there must be.
    what: the argument's name, for the error.
    label: the layer's name, for the error.

  Returns:
    values as a list.

  Raises:
    ValueError: if values are not n positive ints.
  """
  values = list(values) if isinstance(values, (list, tuple)) else values
  if (
    not isinstance(values, list)
    or len(values) != n
    or not all(
      isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in values
    )
  ):
    raise ValueError(
      "%s: %s must be %d positive ints, got %r" % (label, what, n, values)
    )
  return values


def conv_nd(
  x,
  output_dim,
  filter_size,
  strides,
  padding,
  filter_initializer,
  variable_dtype,
  name,
  n: int,
  transpose: bool,
) -> Tensor:
  """The n-d (transposed) convolution layer: a "kernel" variable and the op.

  Args:
    x: the input [batch..., spatial..., channels].
    output_dim: the output channels Dimension.
    filter_size: n filter sizes.
    strides: n strides.
    padding: "SAME" or "VALID".
    filter_initializer: the kernel's initializer.
    variable_dtype: the kernel's VariableDType (None: x's dtype).
    name: the variable scope (None: a default name).
    n: 2 or 3.
    transpose: whether the convolution is transposed.

  Returns:
    the output Tensor.
  """
  label = "conv%dd%s" % (n, "_transpose" if transpose else "")
  filter_size = check_sizes(filter_size, n, "filter_size", label)
  strides = check_sizes(strides, n, "strides", label)
  input_dim = x.shape.dims[-1]
  channels = [output_dim, input_dim] if transpose else [input_dim, output_dim]
  conv_filter = _kernel(
    x, name, label, filter_size, channels, filter_initializer, variable_dtype
  )
  op = {
    (2, False): conv_ops.Conv2dOperation,
    (3, False): conv_ops.Conv3dOperation,
    (2, True): conv_ops.Conv2dTransposeOperation,
    (3, True): conv_ops.Conv3dTransposeOperation,
  }[(n, transpose)]
  return op(x, conv_filter, [1] + strides + [1], padding).outputs[0]


def conv1d(
  x: Tensor,
  output_dim: Dimension,
  filter_size: int = 3,
  stride: int = 1,
  **kw_args,
) -> Tensor:
  """1-D convolution of x [batch..., length, channels] -> [..., output_dim].

  Runs conv2d on x with an extra dim "fake_height" (size 1) before length;
  kw_args go to conv2d (padding, filter_initializer, variable_dtype, name).

  Args:
    x: an mtf Tensor [batch..., length, channels].
    output_dim: the Dimension of the output channels.
    filter_size: the width of the filter.
    stride: the stride along length.

  Returns:
    an mtf Tensor [batch..., length', output_dim].
  """
  fake_height_dim = Dimension("fake_height", 1)
  x = reshape(
    x, Shape(x.shape.dims[:-2] + [fake_height_dim] + x.shape.dims[-2:])
  )
  output = conv2d(
    x, output_dim, filter_size=(1, filter_size), strides=(1, stride), **kw_args
  )
  return reshape(output, output.shape - fake_height_dim)


def separable_conv1d(
  x: Tensor,
  output_dim: Dimension,
  min_relative_pos: int = -1,
  max_relative_pos: int = 1,
  depthwise_filter_initializer_scale: float = 1.0,
  pointwise_filter_initializer_scale: float = 1.0,
  name: Optional[str] = None,
  use_bias: bool = True,
  kernel_depth_weights=None,
) -> Tensor:
  """1-D convolution with separable filters on x [batch..., length, depth].

  A depthwise filter of size max_relative_pos - min_relative_pos + 1 (output
  position i sees inputs i + min_relative_pos .. i + max_relative_pos, zeros
  outside) followed by a pointwise dense layer to output_dim. Variables:
  <name>/depthwise_conv_hack/depthwise_dense_<i>/kernel [depth] (+ bias [depth]
  for i = 0) and <name>/pointwise_dense/kernel [depth, output_dim] (+ bias).

  Args:
    x: a Tensor [batch..., length, depth].
    output_dim: the output channel Dimension.
    min_relative_pos: inclusive minimum relative position of the filter.
    max_relative_pos: inclusive maximum relative position of the filter.
    depthwise_filter_initializer_scale: scale of the depthwise initializer.
    pointwise_filter_initializer_scale: scale of the pointwise initializer.
    name: variable scope (default "separable_conv1d").
    use_bias: add biases.
    kernel_depth_weights: optional list of Tensors [depth], one per relative
      position, used instead of the depthwise variables.

  Returns:
    a Tensor [batch..., length, output_dim].
  """
  if max_relative_pos < min_relative_pos:
    raise ValueError(
      "separable_conv1d: max_relative_pos %d < "
      "min_relative_pos %d" % (max_relative_pos, min_relative_pos)
    )
  depth_dim = x.shape.dims[-1]
  length_dim = x.shape.dims[-2]
  kernel_size = max_relative_pos - min_relative_pos + 1
  if kernel_depth_weights is not None and len(kernel_depth_weights) != (
    kernel_size
  ):
    raise ValueError(
      "separable_conv1d: %d kernel_depth_weights for a filter "
      "of size %d" % (len(kernel_depth_weights), kernel_size)
    )
  graph = x.mesh.graph
  with layer_variable_scope(graph, name, "separable_conv1d"):
    depthwise = None
    # A fixed inner name: calling again under the same outer name reuses.
    with layer_variable_scope(graph, "depthwise_conv_hack", ""):
      for i in range(kernel_size):
        relative_pos = min_relative_pos + i
        shifted = shift(x, -relative_pos, length_dim, wrap=False)
        term = core.dense(
          shifted,
          new_dims=[],
          reduced_dims=[],
          expert_dims=[depth_dim],
          kernel_weights=(
            kernel_depth_weights[i] if kernel_depth_weights else None
          ),
          name="depthwise_dense_%d" % i,
          use_bias=use_bias and i == 0,
          kernel_initializer=core.VarianceScalingInitializer(
            scale=depthwise_filter_initializer_scale / kernel_size
          ),
        )
        depthwise = term if depthwise is None else depthwise + term
    return core.dense(
      depthwise,
      new_dims=[output_dim],
      reduced_dims=[depth_dim],
      name="pointwise_dense",
      use_bias=use_bias,
      kernel_initializer=core.VarianceScalingInitializer(
        scale=pointwise_filter_initializer_scale
      ),
    )


def conv2d(
  x: Tensor,
  output_dim: Dimension,
  filter_size=(3, 3),
  strides=(1, 1),
  padding: str = "SAME",
  filter_initializer=None,
  variable_dtype=None,
  name: Optional[str] = None,
) -> Tensor:
  """2-D convolution: x [batch..., h, w, in] -> [batch..., h', w', output_dim].

  Kernel variable <name>/kernel [fh, fw, in, output_dim]; strides are spatial
  (s_h, s_w); padding "SAME" or "VALID".

  Args:
    x: the input, an mtf Tensor [batch..., h, w, in_channels].
    output_dim: the Dimension of the output channels.
    filter_size: the 2 spatial sizes of the filter.
    strides: the 2 spatial strides.
    padding: "SAME" or "VALID".
    filter_initializer: a TF initializer for the kernel variable; None uses
      get_variable's default (the variable scope's initializer, else
      glorot_uniform).
    variable_dtype: an mtf VariableDType for the kernel; None keeps float32
      master and slices and reads it in x's dtype.
    name: the variable scope of the kernel variable; None makes a unique one
      from the layer's name (e.g. "conv2d").

  Returns:
    an mtf Tensor with x's batch and spatial dim names, spatial sizes set by the
    strides and padding, and output_dim last.
  """
  return conv_nd(
    x,
    output_dim,
    filter_size,
    strides,
    padding,
    filter_initializer,
    variable_dtype,
    name,
    2,
    False,
  )


def conv3d(
  x: Tensor,
  output_dim: Dimension,
  filter_size=(3, 3, 3),
  strides=(1, 1, 1),
  padding: str = "SAME",
  filter_initializer=None,
  variable_dtype=None,
  name: Optional[str] = None,
) -> Tensor:
  """3-D convolution of [batch..., d, h, w, in]; kernel [fd, fh, fw, in, o].

  Args:
    x: the input, an mtf Tensor [batch..., d, h, w, in_channels].
    output_dim: the Dimension of the output channels.
    filter_size: the 3 spatial sizes of the filter.
    strides: the 3 spatial strides.
    padding: "SAME" or "VALID".
    filter_initializer: a TF initializer for the kernel variable; None uses
      get_variable's default (the variable scope's initializer, else
      glorot_uniform).
    variable_dtype: an mtf VariableDType for the kernel; None keeps float32
      master and slices and reads it in x's dtype.
    name: the variable scope of the kernel variable; None makes a unique one
      from the layer's name (e.g. "conv2d").

  Returns:
    an mtf Tensor with x's batch and spatial dim names, spatial sizes set by the
    strides and padding, and output_dim last.
  """
  return conv_nd(
    x,
    output_dim,
    filter_size,
    strides,
    padding,
    filter_initializer,
    variable_dtype,
    name,
    3,
    False,
  )


def conv2d_transpose(
  x: Tensor,
  output_dim: Dimension,
  filter_size=(2, 2),
  strides=(2, 2),
  padding: str = "SAME",
  filter_initializer=None,
  variable_dtype=None,
  name: Optional[str] = None,
) -> Tensor:
  """Transposed 2-D conv: [batch..., h, w, in] -> [..., h*s_h, w*s_w, out].

  Kernel variable <name>/kernel [fh, fw, output_dim, in].

  Args:
    x: the input, an mtf Tensor [batch..., h, w, in_channels].
    output_dim: the Dimension of the output channels.
    filter_size: the 2 spatial sizes of the filter.
    strides: the 2 spatial strides.
    padding: "SAME" or "VALID".
    filter_initializer: a TF initializer for the kernel variable; None uses
      get_variable's default (the variable scope's initializer, else
      glorot_uniform).
    variable_dtype: an mtf VariableDType for the kernel; None keeps float32
      master and slices and reads it in x's dtype.
    name: the variable scope of the kernel variable; None makes a unique one
      from the layer's name (e.g. "conv2d").

  Returns:
    an mtf Tensor with x's batch and spatial dim names, spatial sizes set by the
    strides and padding, and output_dim last.
  """
  return conv_nd(
    x,
    output_dim,
    filter_size,
    strides,
    padding,
    filter_initializer,
    variable_dtype,
    name,
    2,
    True,
  )


def conv3d_transpose(
  x: Tensor,
  output_dim: Dimension,
  filter_size=(2, 2, 2),
  strides=(2, 2, 2),
  padding: str = "SAME",
  filter_initializer=None,
  variable_dtype=None,
  name: Optional[str] = None,
) -> Tensor:
  """Transposed 3-D conv; kernel [fd, fh, fw, output_dim, in].

  Args:
    x: the input, an mtf Tensor [batch..., d, h, w, in_channels].
    output_dim: the Dimension of the output channels.
    filter_size: the 3 spatial sizes of the filter.
    strides: the 3 spatial strides.
    padding: "SAME" or "VALID".
    filter_initializer: a TF initializer for the kernel variable; None uses
      get_variable's default (the variable scope's initializer, else
      glorot_uniform).
    variable_dtype: an mtf VariableDType for the kernel; None keeps float32
      master and slices and reads it in x's dtype.
    name: the variable scope of the kernel variable; None makes a unique one
      from the layer's name (e.g. "conv2d").

  Returns:
    an mtf Tensor with x's batch and spatial dim names, spatial sizes set by the
    strides and padding, and output_dim last.
  """
  return conv_nd(
    x,
    output_dim,
    filter_size,
    strides,
    padding,
    filter_initializer,
    variable_dtype,
    name,
    3,
    True,
  )


def _pool(x: Tensor, ksize, name: str, pool_fn_string: str) -> Tensor:
  n = 2 if pool_fn_string.endswith("2D") else 3
  ksize = check_sizes(ksize, n, "ksize", name)
  if all(k == 1 for k in ksize):
    return x
  return pool_ops.PoolOperation(
    x, ksize, strides=ksize, pool_fn_string=pool_fn_string, name=name
  ).outputs[0]


def max_pool2d(x: Tensor, ksize=(2, 2), name: str = "max_pool2d") -> Tensor:
  """Non-overlapping max pooling of [batch..., h, w, c] (identity for 1x1).

  Args:
    x: an mtf Tensor [batch..., h, w, channels].
    ksize: the 2 window sizes (also the strides).
    name: the name of the operation.

  Returns:
    an mtf Tensor like x with each spatial size divided by its window size.
  """
  return _pool(x, ksize, name, "MAX_2D")


def max_pool3d(x: Tensor, ksize=(2, 2, 2), name: str = "max_pool3d") -> Tensor:
  """Non-overlapping max pooling of [batch..., d, h, w, c].

  Args:
    x: an mtf Tensor [batch..., d, h, w, channels].
    ksize: the 3 window sizes (also the strides).
    name: the name of the operation.

  Returns:
    an mtf Tensor like x with each spatial size divided by its window size.
  """
  return _pool(x, ksize, name, "MAX_3D")


def avg_pool2d(x: Tensor, ksize=(2, 2), name: str = "avg_pool2d") -> Tensor:
  """Non-overlapping average pooling of [batch..., h, w, c].

  Args:
    x: an mtf Tensor [batch..., h, w, channels].
    ksize: the 2 window sizes (also the strides).
    name: the name of the operation.

  Returns:
    an mtf Tensor like x with each spatial size divided by its window size.
  """
  return _pool(x, ksize, name, "AVG_2D")


def avg_pool3d(x: Tensor, ksize=(2, 2, 2), name: str = "avg_pool3d") -> Tensor:
  """Non-overlapping average pooling of [batch..., d, h, w, c].

  Args:
    x: an mtf Tensor [batch..., d, h, w, channels].
    ksize: the 3 window sizes (also the strides).
    name: the name of the operation.

  Returns:
    an mtf Tensor like x with each spatial size divided by its window size.
  """
  return _pool(x, ksize, name, "AVG_3D")


__all__ = [
  "avg_pool2d",
  "avg_pool3d",
  "conv1d",
  "conv2d",
  "conv2d_transpose",
  "conv3d",
  "conv3d_transpose",
  "max_pool2d",
  "max_pool3d",
  "separable_conv1d",
]
