"""Convolutions (2-D/3-D, plain and transposed) and their backprops.

Every operation here is one partial derivative of the same trilinear form

  T(a, w, b) = <conv(a, w), b>

where `a` is the convolution input ([batch..., spatial..., a_ch]), `w` the
filter ([f..., a_ch, b_ch]) and `b` the convolution output ([batch...,
spatial'..., b_ch]). Given two of them an operation computes the third:

  target b = conv(a, w):                 Conv2dOperation, Conv3dOperation,
                                         conv*_transpose_backprop_input
  target a = conv_backprop_input(w, b):  Conv*TransposeOperation,
                                         conv*_backprop_input
  target w = conv_backprop_filter(a, b): conv*_backprop_filter

Each slice runs the TF kernel on its local data (leading batch dims are
flattened into one). Spatial and filter dims must not be split (ValueError at
lowering, naming the dim). Whatever dimension a target contracts may be split,
and the result is then a LazyAllreduceSum over its mesh axes: a_ch for target
b, b_ch for target a, the batch dims for target w. Gradients are built from the
same three targets, so every op here is differentiable twice.

Example:
  >>> converter = mtf.test_utils.NumpyConverter()
  >>> x_np = np.arange(16.0, dtype=np.float32).reshape([1, 4, 4, 1])
  >>> x = converter.convert_np_array_to_mtf_tensor(
  ...     x_np, ["batch", "h", "w", "in"], dtype=tf.float32)
  >>> w = mtf.ones(converter.mesh, "fh:2;fw:2;in:1;out:1")
  >>> y = mtf.Conv2dOperation(x, w, [1, 1, 1, 1], "SAME").outputs[0]
  >>> y.shape
  Shape[batch=1, h=4, w=4, out=1]
  >>> converter.convert_mtf_tensor_to_np_array(y)[0, :, :, 0]  # 2x2 sums
  array([[10., 14., 18., 10.],
         [26., 30., 34., 18.],
         [42., 46., 50., 26.],
         [25., 27., 29., 15.]], dtype=float32)
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import tensorflow as tf
from tensorflow.python.ops.gen_nn_ops import conv3d_backprop_input_v2  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.ops.nn_ops import conv3d_backprop_filter_v2  # pylint: disable=g-direct-tensorflow-import

from mesh_tensorflow._src.graph import Operation
from mesh_tensorflow._src.graph import Tensor
from mesh_tensorflow._src.laid_out import LazyAllreduceSum
from mesh_tensorflow._src.laid_out import convert_args_to_laid_out_tensors
from mesh_tensorflow._src.ops.slicewise import check_splits_allowed
from mesh_tensorflow._src.shapes import Dimension
from mesh_tensorflow._src.shapes import Shape
from mesh_tensorflow._src.shapes import convert_to_shape
from mesh_tensorflow._src.shapes import list_product

_PADDINGS = ("SAME", "VALID")
_SPATIAL_LETTERS = {2: "hw", 3: "dhw"}


def _conv_output_size(n: int, f: int, s: int, padding: str) -> int:
  """Output size of a conv along one spatial dim (as tf.nn.conv*d)."""
  if padding == "VALID":
    return (n - f) // s + 1
  return -(-n // s)


def check_padding(padding, label: str) -> None:
  if padding not in _PADDINGS:
    raise ValueError(
      "%s: padding must be 'SAME' or 'VALID', got %r" % (label, padding)
    )


def _normalize_strides(strides, n: int, label: str) -> List[int]:
  """Full-rank strides [1, s..., 1]; accepts None (all ones) or spatial only."""
  if strides is None:
    return [1] * (n + 2)
  strides = list(strides)
  if len(strides) == n:
    strides = [1] + strides + [1]
  if len(strides) != n + 2 or not all(
    isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in strides
  ):
    raise ValueError(
      "%s: strides must be %d positive ints [1, %s, 1], got %r"
      % (
        label,
        n + 2,
        ", ".join("s_" + c for c in _SPATIAL_LETTERS[n]),
        strides,
      )
    )
  if strides[0] != 1 or strides[-1] != 1:
    raise ValueError(
      "%s: strides along batch and channels must be 1, got %r"
      % (label, strides)
    )
  return strides


def _check_conv_dimension(conv_dimension) -> int:
  if conv_dimension not in (2, 3):
    raise ValueError(
      "conv_dimension must be 2 or 3, got %r" % (conv_dimension,)
    )
  return conv_dimension


def _check_ranks_and_kernel(
  n: int, x: Shape, w: Shape, padding: str, label: str
) -> None:
  """ValueError for too few dims, or (VALID) a filter larger than x."""
  if x.ndims < n + 1:
    raise ValueError(
      "%s: the tensor %s needs at least %d dims ([batch..., %s, channels])"
      % (label, x.to_string, n + 1, ", ".join(_SPATIAL_LETTERS[n]))
    )
  if w.ndims != n + 2:
    raise ValueError(
      "%s: the filter %s must have %d dims [%s, in, out]"
      % (
        label,
        w.to_string,
        n + 2,
        ", ".join("f" + c for c in _SPATIAL_LETTERS[n]),
      )
    )
  if padding == "VALID":
    for d, f in zip(x.dims[-(n + 1) : -1], w.dims[:n]):
      if f.size > d.size:
        raise ValueError(
          "%s: filter dimension %r (size %d) is larger than input dimension "
          "%r (size %d) with padding VALID"
          % (label, f.name, f.size, d.name, d.size)
        )


def _check_roles(
  n: int,
  a: Shape,
  w: Shape,
  b: Shape,
  strides: List[int],
  padding: str,
  label: str,
) -> None:
  """ValueError unless a (input), w (filter), b (output) fit one conv."""
  _check_ranks_and_kernel(n, a, w, padding, label)
  _check_ranks_and_kernel(n, b, w, "SAME", label)
  if a.dims[: -(n + 1)] != b.dims[: -(n + 1)]:
    raise ValueError(
      "%s: batch dims of input %s and output %s differ"
      % (label, a.to_string, b.to_string)
    )
  if w.dims[-2] != a.dims[-1]:
    raise ValueError(
      "%s: filter in-channels %s do not match input channels %s"
      % (label, w.dims[-2], a.dims[-1])
    )
  if w.dims[-1] != b.dims[-1]:
    raise ValueError(
      "%s: filter out-channels %s do not match output "
      "channels %s" % (label, w.dims[-1], b.dims[-1])
    )
  for i in range(n):
    a_dim, b_dim, f_dim = a.dims[-(n + 1) + i], b.dims[-(n + 1) + i], w.dims[i]
    s = strides[i + 1]
    expected = _conv_output_size(a_dim.size, f_dim.size, s, padding)
    if expected != b_dim.size:
      raise ValueError(
        "%s: along %r a convolution of size %d with filter %r (size %d), "
        "stride %d and padding %s gives size %d, but the output dimension "
        "%r has size %d"
        % (
          label,
          a_dim.name,
          a_dim.size,
          f_dim.name,
          f_dim.size,
          s,
          padding,
          expected,
          b_dim.name,
          b_dim.size,
        )
      )


def _flatten_batch(t: tf.Tensor, n: int) -> tf.Tensor:
  """[batch..., spatial..., c] -> [prod(batch), spatial..., c]."""
  return tf.reshape(t, [-1] + t.shape.as_list()[-(n + 1) :])


def _restore_batch(t: tf.Tensor, batch_shape: Sequence[int]) -> tf.Tensor:
  return tf.reshape(t, list(batch_shape) + t.shape.as_list()[1:])


def _conv_fn(n: int):
  return tf.nn.conv2d if n == 2 else tf.nn.conv3d


def _backprop_input_fn(n: int):
  return (
    tf.compat.v1.nn.conv2d_backprop_input
    if n == 2
    else (conv3d_backprop_input_v2)
  )


def _backprop_filter_fn(n: int):
  return (
    tf.compat.v1.nn.conv2d_backprop_filter
    if n == 2
    else (conv3d_backprop_filter_v2)
  )


class _ConvFamilyOperation(Operation):
  """Shared lowering/gradient of the six conv operations (see module doc)."""

  # Set by subclasses in __init__.
  _n: int
  _strides: List[int]
  _padding: str
  _roles: Dict[str, Tensor]  # role ("a", "w", "b") -> input tensor
  _target: str  # role of the output
  _allreduce_counter: str  # e.g. "conv2d_op"
  _compute_counter: str  # e.g. "conv2d/forward"

  def _role_shape(self, role: str) -> Shape:
    if role == self._target:
      return self.outputs[0].shape
    return self._roles[role].shape

  def _unsplittable_names(self) -> List[str]:
    n = self._n
    a, w, b = (self._role_shape(r) for r in "awb")
    return (
      [d.name for d in a.dims[-(n + 1) : -1]]
      + [d.name for d in b.dims[-(n + 1) : -1]]
      + [d.name for d in w.dims[:n]]
    )

  def _init_splittability(self, spatial_unsplittable: bool) -> None:
    if spatial_unsplittable:
      self._initialize_splittable_and_unsplittable_dims(
        "splittable", self._unsplittable_names()
      )
    else:
      self._initialize_all_dimensions_as_splittable()

  def gradient(
    self, grad_ys: Sequence[Optional[Tensor]]
  ) -> Sequence[Optional[Tensor]]:
    """d<g, out>/d(input) for each input: the target of that input's role."""
    g = grad_ys[0]
    grads = []
    for x in self.inputs:
      role = next(r for r, t in self._roles.items() if t is x)
      given = dict(self._roles)
      del given[role]
      given[self._target] = g
      grads.append(
        _compute_role(
          self._n, role, given, x.shape, self._strides, self._padding
        )
      )
    return grads

  def lower(self, lowering) -> None:
    n = self._n
    mesh_impl = lowering.mesh_impl(self)
    everything = self.inputs + self.outputs
    unsplittable = set(self._unsplittable_names())
    allowed = {d.name for t in everything for d in t.shape.dims} - unsplittable
    check_splits_allowed(self, lowering, everything, allowed)

    out = self.outputs[0]
    out_slice_shape = mesh_impl.slice_shape(out.shape)
    strides, padding = self._strides, self._padding
    target = self._target
    if target == "b":
      batch_shape = out_slice_shape[: -(n + 1)]
      conv = _conv_fn(n)

      def slice_fn(ta, tw):
        return _restore_batch(
          conv(_flatten_batch(ta, n), tw, strides, padding), batch_shape
        )

      args = [self._roles["a"], self._roles["w"]]
      reduced_dims = [self._roles["a"].shape.dims[-1]]
    elif target == "a":
      batch_shape = out_slice_shape[: -(n + 1)]
      input_sizes = [list_product(batch_shape)] + out_slice_shape[-(n + 1) :]
      backprop_input = _backprop_input_fn(n)

      def slice_fn(tw, tb):
        return _restore_batch(
          backprop_input(
            input_sizes, tw, _flatten_batch(tb, n), strides, padding
          ),
          batch_shape,
        )

      args = [self._roles["w"], self._roles["b"]]
      reduced_dims = [self._roles["b"].shape.dims[-1]]
    else:
      backprop_filter = _backprop_filter_fn(n)

      def slice_fn(ta, tb):
        return backprop_filter(
          _flatten_batch(ta, n),
          out_slice_shape,
          _flatten_batch(tb, n),
          strides,
          padding,
        )

      args = [self._roles["a"], self._roles["b"]]
      reduced_dims = self._roles["b"].shape.dims[: -(n + 1)]

    # The TF kernel takes inputs in role order; map them to our inputs.
    laid_out = convert_args_to_laid_out_tensors(
      [lowering.tensors[t] for t in args]
    )
    y = mesh_impl.slicewise(slice_fn, *laid_out)
    reduced_mesh_axes = sorted(
      set(mesh_impl.tensor_dimension_to_mesh_axis(d) for d in reduced_dims)
      - {None}
    )
    if reduced_mesh_axes:
      counter = "allreduce/%s/%s" % (reduced_mesh_axes, self._allreduce_counter)

      def add_counter_fn():
        lowering.add_counter(counter, mesh_impl.laid_out_size(out.shape))

      y = LazyAllreduceSum(mesh_impl, y, reduced_mesh_axes, add_counter_fn)
    lowering.set_tensor_lowering(out, y)
    union = {}
    for t in everything:
      for d in t.shape.dims:
        union.setdefault(d.name, d)
    union_shape = Shape(list(union.values()))
    lowering.add_counter(
      self._compute_counter, mesh_impl.laid_out_size(union_shape)
    )
    lowering.add_counter(
      self._compute_counter.replace("/", "_unique/", 1), union_shape.size
    )


def _compute_role(
  n: int,
  target: str,
  given: Dict[str, Tensor],
  shape: Shape,
  strides: List[int],
  padding: str,
) -> Tensor:
  """The `target` role from the two `given` roles, via the backprop ops."""
  if target == "a":
    return Conv2or3dBackpropInputOperation(
      n, False, shape, given["w"], given["b"], strides, padding
    ).outputs[0]
  if target == "b":
    return Conv2or3dBackpropInputOperation(
      n, True, shape, given["w"], given["a"], strides, padding
    ).outputs[0]
  return Conv2or3dBackpropFilterOperation(
    n, False, given["a"], shape, given["b"], strides, padding
  ).outputs[0]


class _ConvNdOperation(_ConvFamilyOperation):
  """like tf.nn.conv2d / conv3d: target b from input a and filter w."""

  def __init__(
    self,
    n: int,
    conv_input: Tensor,
    conv_filter: Tensor,
    strides,
    padding: str,
    name: Optional[str],
  ):
    label = "conv%dd" % n
    super().__init__([conv_input, conv_filter], name=name or label)
    check_padding(padding, label)
    self._n = n
    self._strides = _normalize_strides(strides, n, label)
    self._padding = padding
    a, w = conv_input.shape, conv_filter.shape
    _check_ranks_and_kernel(n, a, w, padding, label)
    b = Shape(
      a.dims[: -(n + 1)]
      + [
        Dimension(d.name, _conv_output_size(d.size, f.size, s, padding))
        for d, f, s in zip(
          a.dims[-(n + 1) : -1], w.dims[:n], self._strides[1:-1]
        )
      ]
      + [w.dims[-1]]
    )
    _check_roles(n, a, w, b, self._strides, padding, label)
    self._outputs = [Tensor(self, b, conv_input.dtype)]
    self._roles = {"a": conv_input, "w": conv_filter}
    self._target = "b"
    self._allreduce_counter = "conv%dd_op" % n
    self._compute_counter = "conv%dd/forward" % n
    self._init_splittability(True)

  def gradient(
    self, grad_ys: Sequence[Optional[Tensor]]
  ) -> Sequence[Optional[Tensor]]:
    dy = grad_ys[0]
    conv_input, conv_filter = self.inputs
    n = self._n
    backprop_input = conv2d_backprop_input if n == 2 else conv3d_backprop_input
    backprop_filter = (
      conv2d_backprop_filter if n == 2 else conv3d_backprop_filter
    )
    return [
      backprop_input(
        conv_input.shape, conv_filter, dy, self._strides, self._padding
      ),
      backprop_filter(
        conv_input, conv_filter.shape, dy, self._strides, self._padding
      ),
    ]


class Conv2dOperation(_ConvNdOperation):
  """like tf.nn.conv2d on [batch..., h, w, in] with filter [fh, fw, in, out].

  The output keeps the input's dim names: [batch..., h', w', out], with
  h' = ceil(h / s_h) for SAME and ceil((h - fh + 1) / s_h) for VALID. h, w,
  fh, fw may not be split; a split `in` gives a LazyAllreduceSum.

  Example:
    With batch split over two processors:

    >>> converter = mtf.test_utils.NumpyConverter(
    ...     mesh_shape="all:2", layout="batch:all", devices=["cpu:0", "cpu:1"])
    >>> x_np = np.random.RandomState(0).randn(2, 5, 5, 3).astype(np.float32)
    >>> w_np = np.random.RandomState(1).randn(3, 3, 3, 4).astype(np.float32)
    >>> x = converter.convert_np_array_to_mtf_tensor(
    ...     x_np, ["batch", "h", "w", "in"], dtype=tf.float32)
    >>> w = converter.convert_np_array_to_mtf_tensor(
    ...     w_np, ["fh", "fw", "in", "out"], dtype=tf.float32)
    >>> y = mtf.Conv2dOperation(x, w, [1, 2, 2, 1], "VALID").outputs[0]
    >>> y.shape
    Shape[batch=2, h=2, w=2, out=4]
    >>> np.allclose(converter.convert_mtf_tensor_to_np_array(y),
    ...             tf.nn.conv2d(x_np, w_np, [1, 2, 2, 1], "VALID"), atol=1e-5)
    True

  Args:
    conv_input: the input, an mtf Tensor [batch..., h, w, in_channels].
    conv_filter: the filter, an mtf Tensor [fh, fw, in_channels, out_channels].
    strides: the strides, a list of 4 ints as for tf.nn.conv2d (1 for batch and
      channels).
    padding: "SAME" or "VALID".
    name: an optional name for the operation.
  """

  def __init__(
    self,
    conv_input: Tensor,
    conv_filter: Tensor,
    strides,
    padding: str,
    name: Optional[str] = None,
  ):
    super().__init__(2, conv_input, conv_filter, strides, padding, name)


class Conv3dOperation(_ConvNdOperation):
  """like tf.nn.conv3d: [batch..., d, h, w, in] * [fd, fh, fw, in, out].

  Args:
    conv_input: the input, an mtf Tensor [batch..., d, h, w, in_channels].
    conv_filter: the filter, an mtf Tensor [fd, fh, fw, in_channels,
      out_channels].
    strides: the strides, a list of 5 ints as for tf.nn.conv3d (1 for batch and
      channels).
    padding: "SAME" or "VALID".
    name: an optional name for the operation.
  """

  def __init__(
    self,
    conv_input: Tensor,
    conv_filter: Tensor,
    strides,
    padding: str,
    name: Optional[str] = None,
  ):
    super().__init__(3, conv_input, conv_filter, strides, padding, name)


class _ConvNdTransposeOperation(_ConvFamilyOperation):
  """like tf.nn.conv2d_transpose / conv3d_transpose (target a from b and w)."""

  def __init__(
    self,
    n: int,
    conv_input: Tensor,
    conv_filter: Tensor,
    strides,
    padding: str,
    name: Optional[str],
  ):
    label = "conv%dd_transpose" % n
    super().__init__([conv_input, conv_filter], name=name or label)
    check_padding(padding, label)
    self._n = n
    self._strides = _normalize_strides(strides, n, label)
    self._padding = padding
    b, w = conv_input.shape, conv_filter.shape
    _check_ranks_and_kernel(n, b, w, "SAME", label)
    # The filter is [f..., out, in]; spatial sizes grow by the strides.
    a = Shape(
      b.dims[: -(n + 1)]
      + [
        Dimension(d.name, d.size * s)
        for d, s in zip(b.dims[-(n + 1) : -1], self._strides[1:-1])
      ]
      + [w.dims[-2]]
    )
    _check_roles(n, a, w, b, self._strides, padding, label)
    self._outputs = [Tensor(self, a, conv_input.dtype)]
    self._roles = {"b": conv_input, "w": conv_filter}
    self._target = "a"
    self._allreduce_counter = "conv%dd_transpose_op" % n
    self._compute_counter = "conv%dd_transpose/forward" % n
    self._init_splittability(True)

  def gradient(
    self, grad_ys: Sequence[Optional[Tensor]]
  ) -> Sequence[Optional[Tensor]]:
    dy = grad_ys[0]
    conv_input, conv_filter = self.inputs
    if self._n == 2:
      backprop_input = conv2d_transpose_backprop_input
      backprop_filter = conv2d_transpose_backprop_filter
    else:
      backprop_input = conv3d_transpose_backprop_input
      backprop_filter = conv3d_transpose_backprop_filter
    return [
      backprop_input(
        conv_input.shape, conv_filter, dy, self._strides, self._padding
      ),
      backprop_filter(
        conv_input, conv_filter.shape, dy, self._strides, self._padding
      ),
    ]


class Conv2dTransposeOperation(_ConvNdTransposeOperation):
  """Like tf.nn.conv2d_transpose.

  Input [batch..., h, w, in], filter [fh, fw, out, in].

  Output [batch..., h * s_h, w * s_w, out] (dim names kept). With VALID the
  filter may not be larger than the stride (else ValueError).

  Args:
    conv_input: the input, an mtf Tensor [batch..., h, w, in_channels].
    conv_filter: the filter, an mtf Tensor [fh, fw, out_channels, in_channels].
    strides: the strides, a list of 4 ints as for tf.nn.conv2d (1 for batch and
      channels).
    padding: "SAME" or "VALID".
    name: an optional name for the operation.
  """

  def __init__(
    self,
    conv_input: Tensor,
    conv_filter: Tensor,
    strides,
    padding: str,
    name: Optional[str] = None,
  ):
    super().__init__(2, conv_input, conv_filter, strides, padding, name)


class Conv3dTransposeOperation(_ConvNdTransposeOperation):
  """like tf.nn.conv3d_transpose: filter [fd, fh, fw, out, in].

  Args:
    conv_input: the input, an mtf Tensor [batch..., d, h, w, in_channels].
    conv_filter: the filter, an mtf Tensor [fd, fh, fw, out_channels,
      in_channels].
    strides: the strides, a list of 5 ints as for tf.nn.conv3d (1 for batch and
      channels).
    padding: "SAME" or "VALID".
    name: an optional name for the operation.
  """

  def __init__(
    self,
    conv_input: Tensor,
    conv_filter: Tensor,
    strides,
    padding: str,
    name: Optional[str] = None,
  ):
    super().__init__(3, conv_input, conv_filter, strides, padding, name)


class Conv2or3dBackpropInputOperation(_ConvFamilyOperation):
  """like tf.nn.conv2d/conv3d_backprop_input: inputs [dy, conv_filter].

  Not transposed: the gradient of a conv w.r.t. its input (shape
  input_shape) from dy = d(output). Transposed: the gradient of a
  conv*_transpose w.r.t. its input, i.e. a forward conv of dy. A split
  channel dim of dy gives a LazyAllreduceSum.

  Args:
    conv_dimension: 2 or 3: the number of spatial dims.
    is_transpose: whether the forward op is a transposed convolution.
    input_shape: the Shape of the forward convolution's input.
    conv_filter: the filter of the forward convolution, an mtf Tensor.
    dy: the gradient of the forward convolution's output, an mtf Tensor.
    strides: the strides of the forward convolution (a list of ints, as for
      tf.nn.conv2d/conv3d).
    padding: "SAME" or "VALID", as in the forward convolution.
    name: an optional name for the operation.
  """

  def __init__(
    self,
    conv_dimension: int,
    is_transpose: bool,
    input_shape,
    conv_filter: Tensor,
    dy: Tensor,
    strides,
    padding: str,
    name: Optional[str] = None,
  ):
    n = _check_conv_dimension(conv_dimension)
    trans = "_trans" if is_transpose else ""
    label = "conv%dd%s_backprop" % (n, trans)
    super().__init__([dy, conv_filter], name=name or label)
    check_padding(padding, label)
    self._n = n
    self._is_transpose = bool(is_transpose)
    self._strides = _normalize_strides(strides, n, label)
    self._padding = padding
    input_shape = convert_to_shape(input_shape)
    self._outputs = [Tensor(self, input_shape, dy.dtype)]
    if self._is_transpose:
      self._roles = {"a": dy, "w": conv_filter}
      self._target = "b"
      _check_roles(
        n,
        dy.shape,
        conv_filter.shape,
        input_shape,
        self._strides,
        padding,
        label,
      )
    else:
      self._roles = {"b": dy, "w": conv_filter}
      self._target = "a"
      _check_roles(
        n,
        input_shape,
        conv_filter.shape,
        dy.shape,
        self._strides,
        padding,
        label,
      )
    self._allreduce_counter = "conv%dd%s_op" % (n, trans)
    self._compute_counter = "conv%dd%s/backprop_input" % (n, trans)
    self._init_splittability(False)

  def gradient(
    self, unused_grad_ys: Sequence[Optional[Tensor]]
  ) -> Sequence[Optional[Tensor]]:
    # The original's parameter name; unlike the original (which raised),
    # second derivatives are supported.
    return super().gradient(unused_grad_ys)


class Conv2or3dBackpropFilterOperation(_ConvFamilyOperation):
  """like tf.nn.conv2d/conv3d_backprop_filter: inputs [conv_input, dy].

  Sums over the batch dims: split batch dims give a LazyAllreduceSum. With
  is_transpose, conv_input/dy are those of a conv*_transpose.

  Args:
    conv_dimension: 2 or 3: the number of spatial dims.
    is_transpose: whether the forward op is a transposed convolution.
    conv_input: the input of the forward convolution, an mtf Tensor.
    filter_shape: the Shape of the forward convolution's filter.
    dy: the gradient of the forward convolution's output, an mtf Tensor.
    strides: the strides of the forward convolution (a list of ints, as for
      tf.nn.conv2d/conv3d).
    padding: "SAME" or "VALID", as in the forward convolution.
    name: an optional name for the operation.
  """

  def __init__(
    self,
    conv_dimension: int,
    is_transpose: bool,
    conv_input: Tensor,
    filter_shape,
    dy: Tensor,
    strides,
    padding: str,
    name: Optional[str] = None,
  ):
    n = _check_conv_dimension(conv_dimension)
    trans = "_trans" if is_transpose else ""
    label = "conv%dd%s_backprop_filter" % (n, trans)
    super().__init__([conv_input, dy], name=name or label)
    check_padding(padding, label)
    self._n = n
    self._is_transpose = bool(is_transpose)
    self._strides = _normalize_strides(strides, n, label)
    self._padding = padding
    filter_shape = convert_to_shape(filter_shape)
    self._outputs = [Tensor(self, filter_shape, dy.dtype)]
    if self._is_transpose:
      self._roles = {"a": dy, "b": conv_input}
    else:
      self._roles = {"a": conv_input, "b": dy}
    self._target = "w"
    _check_roles(
      n,
      self._roles["a"].shape,
      filter_shape,
      self._roles["b"].shape,
      self._strides,
      padding,
      label,
    )
    self._allreduce_counter = "conv%dd%s_backprop_filter" % (n, trans)
    self._compute_counter = "conv%dd%s/backprop_filter" % (n, trans)
    self._init_splittability(False)

  def gradient(
    self, unused_grad_ys: Sequence[Optional[Tensor]]
  ) -> Sequence[Optional[Tensor]]:
    # The original's parameter name; unlike the original (which raised),
    # second derivatives are supported.
    return super().gradient(unused_grad_ys)


def conv2d_backprop_input(
  input_shape,
  conv_filter: Tensor,
  dy: Tensor,
  strides,
  padding: str,
  name: Optional[str] = None,
) -> Tensor:
  """Gradient of conv2d w.r.t. its input (shape input_shape).

  Args:
    input_shape: the Shape of the forward convolution's input.
    conv_filter: the filter of the forward convolution, an mtf Tensor.
    dy: the gradient of the forward convolution's output, an mtf Tensor.
    strides: the strides of the forward convolution (a list of ints, as for
      tf.nn.conv2d/conv3d).
    padding: "SAME" or "VALID", as in the forward convolution.
    name: an optional name for the operation.

  Returns:
    an mtf Tensor of shape `input_shape`: the gradient with respect to the
    input.
  """
  return Conv2or3dBackpropInputOperation(
    2, False, input_shape, conv_filter, dy, strides, padding, name=name
  ).outputs[0]


def conv2d_backprop_filter(
  conv_input: Tensor,
  filter_shape,
  dy: Tensor,
  strides,
  padding: str,
  name: Optional[str] = None,
) -> Tensor:
  """Gradient of conv2d w.r.t. its filter (shape filter_shape).

  Args:
    conv_input: the input of the forward convolution, an mtf Tensor.
    filter_shape: the Shape of the forward convolution's filter.
    dy: the gradient of the forward convolution's output, an mtf Tensor.
    strides: the strides of the forward convolution (a list of ints, as for
      tf.nn.conv2d/conv3d).
    padding: "SAME" or "VALID", as in the forward convolution.
    name: an optional name for the operation.

  Returns:
    an mtf Tensor of shape `filter_shape`: the gradient with respect to the
    filter.
  """
  return Conv2or3dBackpropFilterOperation(
    2, False, conv_input, filter_shape, dy, strides, padding, name=name
  ).outputs[0]


def conv3d_backprop_input(
  input_shape,
  conv_filter: Tensor,
  dy: Tensor,
  strides,
  padding: str,
  name: Optional[str] = None,
) -> Tensor:
  """Gradient of conv3d w.r.t. its input (shape input_shape).

  Args:
    input_shape: the Shape of the forward convolution's input.
    conv_filter: the filter of the forward convolution, an mtf Tensor.
    dy: the gradient of the forward convolution's output, an mtf Tensor.
    strides: the strides of the forward convolution (a list of ints, as for
      tf.nn.conv2d/conv3d).
    padding: "SAME" or "VALID", as in the forward convolution.
    name: an optional name for the operation.

  Returns:
    an mtf Tensor of shape `input_shape`: the gradient with respect to the
    input.
  """
  return Conv2or3dBackpropInputOperation(
    3, False, input_shape, conv_filter, dy, strides, padding, name=name
  ).outputs[0]


def conv3d_backprop_filter(
  conv_input: Tensor,
  filter_shape,
  dy: Tensor,
  strides,
  padding: str,
  name: Optional[str] = None,
) -> Tensor:
  """Gradient of conv3d w.r.t. its filter (shape filter_shape).

  Args:
    conv_input: the input of the forward convolution, an mtf Tensor.
    filter_shape: the Shape of the forward convolution's filter.
    dy: the gradient of the forward convolution's output, an mtf Tensor.
    strides: the strides of the forward convolution (a list of ints, as for
      tf.nn.conv2d/conv3d).
    padding: "SAME" or "VALID", as in the forward convolution.
    name: an optional name for the operation.

  Returns:
    an mtf Tensor of shape `filter_shape`: the gradient with respect to the
    filter.
  """
  return Conv2or3dBackpropFilterOperation(
    3, False, conv_input, filter_shape, dy, strides, padding, name=name
  ).outputs[0]


def conv2d_transpose_backprop_input(
  input_shape,
  conv_filter: Tensor,
  dy: Tensor,
  strides,
  padding: str,
  name: Optional[str] = None,
) -> Tensor:
  """Gradient of conv2d_transpose w.r.t. its input (a conv2d of dy).

  Args:
    input_shape: the Shape of the forward convolution's input.
    conv_filter: the filter of the forward convolution, an mtf Tensor.
    dy: the gradient of the forward convolution's output, an mtf Tensor.
    strides: the strides of the forward convolution (a list of ints, as for
      tf.nn.conv2d/conv3d).
    padding: "SAME" or "VALID", as in the forward convolution.
    name: an optional name for the operation.

  Returns:
    an mtf Tensor of shape `input_shape`: the gradient with respect to the
    input.
  """
  return Conv2or3dBackpropInputOperation(
    2, True, input_shape, conv_filter, dy, strides, padding, name=name
  ).outputs[0]


def conv2d_transpose_backprop_filter(
  conv_input: Tensor,
  filter_shape,
  dy: Tensor,
  strides,
  padding: str,
  name: Optional[str] = None,
) -> Tensor:
  """Gradient of conv2d_transpose w.r.t. its filter.

  Args:
    conv_input: the input of the forward convolution, an mtf Tensor.
    filter_shape: the Shape of the forward convolution's filter.
    dy: the gradient of the forward convolution's output, an mtf Tensor.
    strides: the strides of the forward convolution (a list of ints, as for
      tf.nn.conv2d/conv3d).
    padding: "SAME" or "VALID", as in the forward convolution.
    name: an optional name for the operation.

  Returns:
    an mtf Tensor of shape `filter_shape`: the gradient with respect to the
    filter.
  """
  return Conv2or3dBackpropFilterOperation(
    2, True, conv_input, filter_shape, dy, strides, padding, name=name
  ).outputs[0]


def conv3d_transpose_backprop_input(
  input_shape,
  conv_filter: Tensor,
  dy: Tensor,
  strides,
  padding: str,
  name: Optional[str] = None,
) -> Tensor:
  """Gradient of conv3d_transpose w.r.t. its input (a conv3d of dy).

  Args:
    input_shape: the Shape of the forward convolution's input.
    conv_filter: the filter of the forward convolution, an mtf Tensor.
    dy: the gradient of the forward convolution's output, an mtf Tensor.
    strides: the strides of the forward convolution (a list of ints, as for
      tf.nn.conv2d/conv3d).
    padding: "SAME" or "VALID", as in the forward convolution.
    name: an optional name for the operation.

  Returns:
    an mtf Tensor of shape `input_shape`: the gradient with respect to the
    input.
  """
  return Conv2or3dBackpropInputOperation(
    3, True, input_shape, conv_filter, dy, strides, padding, name=name
  ).outputs[0]


def conv3d_transpose_backprop_filter(
  conv_input: Tensor,
  filter_shape,
  dy: Tensor,
  strides,
  padding: str,
  name: Optional[str] = None,
) -> Tensor:
  """Gradient of conv3d_transpose w.r.t. its filter.

  Args:
    conv_input: the input of the forward convolution, an mtf Tensor.
    filter_shape: the Shape of the forward convolution's filter.
    dy: the gradient of the forward convolution's output, an mtf Tensor.
    strides: the strides of the forward convolution (a list of ints, as for
      tf.nn.conv2d/conv3d).
    padding: "SAME" or "VALID", as in the forward convolution.
    name: an optional name for the operation.

  Returns:
    an mtf Tensor of shape `filter_shape`: the gradient with respect to the
    filter.
  """
  return Conv2or3dBackpropFilterOperation(
    3, True, conv_input, filter_shape, dy, strides, padding, name=name
  ).outputs[0]


__all__ = [
  "Conv2dOperation",
  "Conv2dTransposeOperation",
  "Conv2or3dBackpropFilterOperation",
  "Conv2or3dBackpropInputOperation",
  "Conv3dOperation",
  "Conv3dTransposeOperation",
  "conv2d_backprop_filter",
  "conv2d_backprop_input",
  "conv2d_transpose_backprop_filter",
  "conv2d_transpose_backprop_input",
  "conv3d_backprop_filter",
  "conv3d_backprop_filter_v2",
  "conv3d_backprop_input",
  "conv3d_backprop_input_v2",
  "conv3d_transpose_backprop_filter",
  "conv3d_transpose_backprop_input",
]
