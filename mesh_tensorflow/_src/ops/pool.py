"""Non-overlapping max/average pooling over HW (2-D) or DHW (3-D) dims.

Input layout is [batch..., spatial..., channels] (leading batch dims are
flattened per slice). Pooling is VALID with strides == ksize, so every window
lies in one place and the backprop is an upsampling of dy. Spatial dims may not
be split (ValueError at lowering, naming the dim); batch and channel dims may.

Example:
  >>> converter = mtf.test_utils.NumpyConverter()
  >>> x = converter.convert_np_array_to_mtf_tensor(
  ...     np.arange(16.0).reshape([1, 4, 4, 1]), ["batch", "h", "w", "c"],
  ...     dtype=tf.float32)
  >>> y = mtf.PoolOperation(x, [2, 2], [2, 2], "MAX_2D").outputs[0]
  >>> y.shape
  Shape[batch=1, h=2, w=2, c=1]
  >>> converter.convert_mtf_tensor_to_np_array(y)[0, :, :, 0]
  array([[ 5.,  7.],
         [13., 15.]], dtype=float32)
"""

from __future__ import annotations

from typing import Callable, List, Optional, Sequence

import tensorflow as tf

from mesh_tensorflow._src.graph import Operation
from mesh_tensorflow._src.graph import Tensor
from mesh_tensorflow._src.laid_out import convert_args_to_laid_out_tensors
from mesh_tensorflow._src.ops.slicewise import check_splits_allowed
from mesh_tensorflow._src.shapes import Dimension
from mesh_tensorflow._src.shapes import Shape
from mesh_tensorflow._src.shapes import list_product

_POOL_FNS = {
  "MAX_2D": tf.nn.max_pool2d,
  "AVG_2D": tf.nn.avg_pool2d,
  "MAX_3D": tf.nn.max_pool3d,
  "AVG_3D": tf.nn.avg_pool3d,
}


def pool_fn(pool_fn_string: str) -> Callable:
  """The TF pooling function (x, ksize, strides, padding) for a pool string.

  Example:
    >>> pool_fn("MAX_2D") is tf.nn.max_pool2d
    True
    >>> pool_fn("AVG_3D") is tf.nn.avg_pool3d
    True

  Args:
    pool_fn_string: "MAX_2D", "AVG_2D", "MAX_3D" or "AVG_3D".

  Returns:
    the TF pooling function, e.g. tf.nn.max_pool2d.

  Raises:
    ValueError: if pool_fn_string is not one of MAX_2D, AVG_2D, MAX_3D, AVG_3D.
  """
  if pool_fn_string not in _POOL_FNS:
    raise ValueError(
      "unknown pool_fn_string %r; expected one of %s"
      % (pool_fn_string, sorted(_POOL_FNS))
    )
  return _POOL_FNS[pool_fn_string]


def _check_pool_args(
  x_shape: Shape, ksize, strides, pool_fn_string: str, label: str
) -> List[int]:
  """Validated ksize (a list of ints); ValueError naming what is wrong."""
  pool_fn(pool_fn_string)
  n = 2 if pool_fn_string.endswith("2D") else 3
  ksize = list(ksize) if isinstance(ksize, (list, tuple)) else ksize
  strides = list(strides) if isinstance(strides, (list, tuple)) else strides
  if (
    not isinstance(ksize, list)
    or len(ksize) != n
    or not all(
      isinstance(k, int) and not isinstance(k, bool) and k >= 1 for k in ksize
    )
  ):
    raise ValueError(
      "%s %s: ksize must be %d positive ints, got %r"
      % (label, pool_fn_string, n, ksize)
    )
  if strides != ksize:
    raise ValueError(
      "%s: only non-overlapping pooling is supported; strides "
      "%r must equal ksize %r" % (label, strides, ksize)
    )
  if x_shape.ndims < n + 1:
    raise ValueError(
      "%s %s: input %s needs at least %d dims "
      "([batch..., spatial x %d, channels])"
      % (label, pool_fn_string, x_shape.to_string, n + 1, n)
    )
  for d, k in zip(x_shape.dims[-(n + 1) : -1], ksize):
    if k > d.size:
      raise ValueError(
        "%s: window size %d is larger than dimension %r "
        "(size %d)" % (label, k, d.name, d.size)
      )
  return ksize


def _spatial_dims(shape: Shape, n: int) -> List[Dimension]:
  return shape.dims[-(n + 1) : -1]


def _flatten_batch(t: tf.Tensor, n: int) -> tf.Tensor:
  return tf.reshape(t, [-1] + t.shape.as_list()[-(n + 1) :])


class PoolOperation(Operation):
  """Pools x: [batch..., spatial..., c] -> [batch..., spatial // k..., c].

  pool_fn_string is "MAX_2D", "AVG_2D", "MAX_3D" or "AVG_3D"; padding is
  VALID and strides must equal ksize (the spatial window sizes). The output
  spatial dims keep their names.

  Args:
    x: the input, an mtf Tensor [batch..., spatial..., channels] (2 or 3 spatial
      dims).
    ksize: the window size along each spatial dim.
    strides: equal to ksize (windows do not overlap).
    pool_fn_string: "MAX_2D", "AVG_2D", "MAX_3D" or "AVG_3D".
    name: an optional name for the operation.
  """

  def __init__(
    self,
    x: Tensor,
    ksize: Sequence[int],
    strides: Sequence[int],
    pool_fn_string: str,
    name: Optional[str] = None,
  ):
    super().__init__([x], name=name or "pool")
    self._ksize = _check_pool_args(
      x.shape, ksize, strides, pool_fn_string, "PoolOperation"
    )
    self._strides = list(self._ksize)
    self._pool_fn_string = pool_fn_string
    self._n = n = len(self._ksize)
    out_spatial = [
      Dimension(d.name, d.size // k)
      for d, k in zip(_spatial_dims(x.shape, n), self._ksize)
    ]
    output_shape = Shape(
      x.shape.dims[: -(n + 1)] + out_spatial + x.shape.dims[-1:]
    )
    self._outputs = [Tensor(self, output_shape, x.dtype)]
    self._initialize_splittable_and_unsplittable_dims(
      "splittable", [d.name for d in _spatial_dims(x.shape, n)]
    )

  def gradient(
    self, grad_ys: Sequence[Optional[Tensor]]
  ) -> Sequence[Optional[Tensor]]:
    x, y, dy = self.inputs[0], self.outputs[0], grad_ys[0]
    return [
      pool_backprop(x, y, dy, self._ksize, self._strides, self._pool_fn_string)
    ]

  def lower(self, lowering) -> None:
    check_splits_allowed(
      self, lowering, self.inputs + self.outputs, self.splittable_dims
    )
    mesh_impl = lowering.mesh_impl(self)
    n, ksize = self._n, self._ksize
    fn = pool_fn(self._pool_fn_string)
    batch_shape = mesh_impl.slice_shape(self.outputs[0].shape)[: -(n + 1)]

    def slice_fn(t):
      y = fn(_flatten_batch(t, n), ksize, ksize, "VALID")
      return tf.reshape(y, batch_shape + y.shape.as_list()[1:])

    x = convert_args_to_laid_out_tensors([lowering.tensors[self.inputs[0]]])
    lowering.set_tensor_lowering(
      self.outputs[0], mesh_impl.slicewise(slice_fn, *x)
    )


def _upsample(t: tf.Tensor, ksize: Sequence[int], n: int) -> tf.Tensor:
  """Repeats each element k times along each spatial axis of t."""
  rank = t.shape.rank
  for i, k in enumerate(ksize):
    if k > 1:
      t = tf.repeat(t, k, axis=rank - 1 - n + i)
  return t


class PoolBackPropOperation(Operation):
  """Gradient of a non-overlapping PoolOperation: inputs [x, y, dy].

  MAX: dy flows to every input equal to its window's max (ties all get it);
  AVG: dy / window size to every input. Positions dropped by VALID pooling
  (when a spatial size is not a multiple of the window) get zero.

  Args:
    x: the input, an mtf Tensor [batch..., spatial..., channels] (2 or 3 spatial
      dims).
    y: the output of the pooling.
    dy: the gradient of y, an mtf Tensor shaped like y.
    ksize: the window size along each spatial dim.
    strides: equal to ksize (windows do not overlap).
    pool_fn_string: "MAX_2D", "AVG_2D", "MAX_3D" or "AVG_3D".
    name: an optional name for the operation.
  """

  def __init__(
    self,
    x: Tensor,
    y: Tensor,
    dy: Tensor,
    ksize: Sequence[int],
    strides: Sequence[int],
    pool_fn_string: str,
    name: Optional[str] = None,
  ):
    super().__init__([x, y, dy], name=name or "pool_backprop")
    self._ksize = _check_pool_args(
      x.shape, ksize, strides, pool_fn_string, "PoolBackPropOperation"
    )
    self._strides = list(self._ksize)
    self._pool_fn_string = pool_fn_string
    self._n = len(self._ksize)
    self._outputs = [Tensor(self, x.shape, dy.dtype)]
    self._initialize_splittable_and_unsplittable_dims(
      "splittable", [d.name for d in _spatial_dims(x.shape, self._n)]
    )

  def lower(self, lowering) -> None:
    check_splits_allowed(
      self, lowering, self.inputs + self.outputs, self.splittable_dims
    )
    mesh_impl = lowering.mesh_impl(self)
    n, ksize = self._n, self._ksize
    is_max = self._pool_fn_string.startswith("MAX")
    window = list_product(ksize)

    def slice_fn(tx, ty, tdy):
      dy_up = _upsample(tdy, ksize, n)
      # VALID pooling ignores the tail of a dim that ksize does not divide.
      core = dy_up.shape.as_list()
      full = tx.shape.as_list()
      if is_max:
        x_core = tf.slice(tx, [0] * len(full), core)
        mask = tf.cast(tf.equal(x_core, _upsample(ty, ksize, n)), tdy.dtype)
        dx = mask * dy_up
      else:
        dx = dy_up / tf.cast(window, tdy.dtype)
      if core != full:
        dx = tf.pad(dx, [[0, f - c] for f, c in zip(full, core)])
      return dx

    args = convert_args_to_laid_out_tensors(
      [lowering.tensors[t] for t in self.inputs]
    )
    lowering.set_tensor_lowering(
      self.outputs[0], mesh_impl.slicewise(slice_fn, *args)
    )


def pool_backprop(
  x: Tensor,
  y: Tensor,
  dy: Tensor,
  ksize: Sequence[int],
  strides: Sequence[int],
  pool_fn_string: str,
  name: Optional[str] = None,
) -> Tensor:
  """Gradient w.r.t. x of y = PoolOperation(x, ksize, strides, ...) given dy.

  Args:
    x: the input, an mtf Tensor [batch..., spatial..., channels] (2 or 3 spatial
      dims).
    y: the output of the pooling.
    dy: the gradient of y, an mtf Tensor shaped like y.
    ksize: the window size along each spatial dim.
    strides: equal to ksize (windows do not overlap).
    pool_fn_string: "MAX_2D", "AVG_2D", "MAX_3D" or "AVG_3D".
    name: an optional name for the operation.

  Returns:
    an mtf Tensor shaped like x: the gradient with respect to x.
  """
  return PoolBackPropOperation(
    x, y, dy, ksize, strides, pool_fn_string, name=name
  ).outputs[0]


__all__ = ["PoolBackPropOperation", "PoolOperation", "pool_backprop", "pool_fn"]
