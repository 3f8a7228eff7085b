"""Normalization layers (layer_norm, batch_norm) and Pearson correlation."""

from __future__ import annotations

from typing import List, Optional, Tuple

import tensorflow as tf

from mesh_tensorflow._src.graph import Operation
from mesh_tensorflow._src.graph import Tensor
from mesh_tensorflow._src.layers.scope_util import layer_variable_scope
from mesh_tensorflow._src.ops import einsum as einsum_lib
from mesh_tensorflow._src.ops import elementwise
from mesh_tensorflow._src.ops import reduce as reduce_lib
from mesh_tensorflow._src.ops import reshape as reshape_lib
from mesh_tensorflow._src.shapes import Dimension
from mesh_tensorflow._src.shapes import Shape
from mesh_tensorflow._src.shapes import convert_to_dimension
from mesh_tensorflow._src.variables import assign
from mesh_tensorflow._src.variables import get_variable

tf1 = tf.compat.v1


def _normalize(
  x: Tensor, mean: Tensor, variance: Tensor, epsilon: float
) -> Tensor:
  return (x - mean) * elementwise.rsqrt(variance + epsilon)


def layer_norm(
  x: Tensor,
  dim: Dimension,
  epsilon: float = 1e-6,
  name: str = "layer_prepostprocess",
) -> Tensor:
  """Layer normalization over dimension `dim`, with learned scale and bias.

  Variables (scope `<name>/layer_norm`): `layer_norm_scale` (ones) and
  `layer_norm_bias` (zeros), both of shape [dim]. `dim` may be split over
  the mesh (the mean and variance are then allreduced).

  Example:
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> x_np = np.random.RandomState(0).randn(2, 3, 4).astype(np.float32)
    >>> x = converter.convert_np_array_to_mtf_tensor(
    ...     x_np, ["batch", "length", "d_model"], dtype=tf.float32)
    >>> y = layer_norm(x, x.shape.dims[2], name="encoder/final")
    >>> [v.name for v in converter.graph.trainable_variables]
    ['encoder/final/layer_norm/layer_norm_scale',
     'encoder/final/layer_norm/layer_norm_bias']
    >>> mean, var = x_np.mean(-1, keepdims=True), x_np.var(-1, keepdims=True)
    >>> np.allclose(converter.convert_mtf_tensor_to_np_array(y),
    ...             (x_np - mean) / np.sqrt(var + 1e-6), atol=1e-5)
    True

  Args:
    x: a floating mtf Tensor.
    dim: the Dimension to normalize over.
    epsilon: added to the variance for stability.
    name: the variable scope (the variables live in <name>/layer_norm).

  Returns:
    an mtf Tensor like x.

  Raises:
    ValueError: if dim is not a dimension of x.
  """
  dim = convert_to_dimension(dim)
  if dim not in x.shape.dims:
    raise ValueError(
      "layer_norm: dimension %s is not a dimension of x %s"
      % (dim, x.shape.to_string)
    )
  with tf1.variable_scope(name + "/layer_norm"):
    scale = get_variable(
      x.mesh,
      "layer_norm_scale",
      Shape([dim]),
      initializer=tf1.ones_initializer(),
      activation_dtype=x.dtype,
    )
    bias = get_variable(
      x.mesh,
      "layer_norm_bias",
      Shape([dim]),
      initializer=tf1.zeros_initializer(),
      activation_dtype=x.dtype,
    )
    reduced_shape = x.shape - dim
    mean = reduce_lib.reduce_mean(x, output_shape=reduced_shape)
    variance = reduce_lib.reduce_mean(
      elementwise.square(x - mean), output_shape=reduced_shape
    )
    return _normalize(x, mean, variance, epsilon) * scale + bias


def batch_norm(
  x: Tensor,
  is_training: bool,
  momentum: float,
  epsilon: float = 1e-9,
  dims_idx_start: int = 0,
  dims_idx_end: int = -1,
  init_zero: bool = False,
  name: Optional[str] = None,
) -> Tuple[Tensor, List[Operation]]:
  """Batch normalization over x.shape.dims[dims_idx_start:dims_idx_end].

  The statistics are taken over those dims (by default all but the last, e.g.
  batch and spatial dims); the remaining dims get their own `batch_norm_scale`
  (ones, or zeros with init_zero) and `batch_norm_bias` (zeros), and the
  non-trainable `bn_moving_mean` (drawn from a standard normal, as the
  original's) and `bn_moving_variance` (ones).
  When training, the batch statistics normalize x and the returned Assign
  operations update the moving statistics:
    moving = momentum * moving + (1 - momentum) * batch_statistic.
  Otherwise the moving statistics normalize x and no update is returned.

  Example:
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> x_np = np.random.RandomState(0).randn(8, 3).astype(np.float32) * 3 + 1
    >>> x = converter.convert_np_array_to_mtf_tensor(
    ...     x_np, ["batch", "channels"], dtype=tf.float32)
    >>> y, update_ops = batch_norm(x, is_training=True, momentum=0.99)
    >>> [v.name for v in converter.graph.all_variables]
    ['batch_norm/batch_norm_scale', 'batch_norm/batch_norm_bias',
     'batch_norm/bn_moving_mean', 'batch_norm/bn_moving_variance']
    >>> moving_var = converter.graph.all_variables[3].outputs[0]
    >>> lowering, moving_var_tf = converter.convert_mtf_tensor_to_tf_tensor(
    ...     mtf.depend(moving_var, update_ops))  # read after the update
    >>> np.allclose(moving_var_tf, 0.99 + 0.01 * x_np.var(0))
    True
    >>> y_np = lowering.export_to_tf_tensor(y).numpy()
    >>> np.allclose(y_np.mean(0), 0, atol=1e-5), np.allclose(y_np.std(0), 1)
    (True, True)

  Args:
    x: a floating mtf Tensor.
    is_training: whether to use (and update) the batch statistics.
    momentum: the decay of the moving statistics.
    epsilon: added to the variance for stability.
    dims_idx_start: the first index (into x.shape.dims) of the dims to normalize
      over.
    dims_idx_end: the end index (exclusive, Python slice semantics) of those
      dims.
    init_zero: whether the scale starts at zero (else one).
    name: the variable scope (default: "batch_norm").

  Returns:
    (y, update_ops): y has x's shape; update_ops is a list of Assign ops.

  Raises:
    ValueError: if the index range selects no dimension or every dimension.
  """
  norm_dims = x.shape.dims[dims_idx_start:dims_idx_end]
  if not norm_dims:
    raise ValueError(
      "batch_norm: dims_idx_start=%d, dims_idx_end=%d select no "
      "dimension of x %s to normalize over"
      % (dims_idx_start, dims_idx_end, x.shape.to_string)
    )
  with layer_variable_scope(x.mesh.graph, name, "batch_norm"):
    gamma_initializer = (
      tf1.zeros_initializer() if init_zero else tf1.ones_initializer()
    )
    reduced_shape = x.shape - norm_dims
    scale = get_variable(
      x.mesh,
      "batch_norm_scale",
      reduced_shape,
      initializer=gamma_initializer,
      activation_dtype=x.dtype,
    )
    bias = get_variable(
      x.mesh,
      "batch_norm_bias",
      reduced_shape,
      initializer=tf1.zeros_initializer(),
      activation_dtype=x.dtype,
    )
    # A standard normal start, as the original's (its draw also keeps the
    # graph's later seeded initializers on the original's op seeds).
    moving_mean = get_variable(
      x.mesh,
      "bn_moving_mean",
      reduced_shape,
      initializer=tf1.random_normal_initializer(stddev=1.0),
      activation_dtype=x.dtype,
      trainable=False,
    )
    moving_variance = get_variable(
      x.mesh,
      "bn_moving_variance",
      reduced_shape,
      initializer=tf1.ones_initializer(),
      activation_dtype=x.dtype,
      trainable=False,
    )
    if is_training:
      mean = reduce_lib.reduce_mean(x, output_shape=reduced_shape)
      variance = reduce_lib.reduce_mean(
        elementwise.square(x - mean), output_shape=reduced_shape
      )
      norm_x = _normalize(x, mean, variance, epsilon)
      update_ops = [
        assign(
          moving_mean,
          momentum * moving_mean
          + (1.0 - momentum) * elementwise.stop_gradient(mean),
          name="bn_mean_update",
        ),
        assign(
          moving_variance,
          momentum * moving_variance
          + (1.0 - momentum) * elementwise.stop_gradient(variance),
          name="bn_var_update",
        ),
      ]
    else:
      norm_x = _normalize(x, moving_mean, moving_variance, epsilon)
      update_ops = []
    return norm_x * scale + bias, update_ops


def corr(
  x: Tensor,
  dim: Dimension,
  epsilon: float = 1e-20,
  name: str = "pearson_correlation",
) -> Tensor:
  """Pearson correlation between the entries of `dim`, over all other dims.

  Each index of `dim` is one random variable; every position of the other
  dimensions is one sample of all of them (as tfp.stats.correlation with
  event_axis at `dim` and every other axis a sample axis).

  Example:
    c[i, j] is the correlation of channel i with channel j, estimated over
    batch and length:

    >>> converter = mtf.test_utils.NumpyConverter()
    >>> x_np = np.random.RandomState(0).randn(2, 3, 4).astype(np.float32)
    >>> x = converter.convert_np_array_to_mtf_tensor(
    ...     x_np, ["batch", "length", "channels"], dtype=tf.float32)
    >>> c = corr(x, x.shape.dims[2])
    >>> c.shape
    Shape[channels_1=4, channels_2=4]
    >>> samples = x_np.reshape([6, 4])  # one row per (batch, length)
    >>> np.allclose(converter.convert_mtf_tensor_to_np_array(c),
    ...             np.corrcoef(samples, rowvar=False), atol=1e-5)
    True

  Args:
    x: a Tensor with dimension `dim`, which should be its last dimension (as
      in the original, the norms are summed over all dims but the last one).
    dim: the event Dimension.
    epsilon: added to each norm, so constant variables do not divide by 0.
    name: kept for the original's signature; corr makes no variables.

  Returns:
    a Tensor of shape [<dim>_1, <dim>_2].
  """
  del name  # The original used it only as a variable scope (no variables).
  dim = convert_to_dimension(dim)
  centered = x - reduce_lib.reduce_mean(x, output_shape=[dim])
  left = reshape_lib.rename_dimension(centered, dim.name, dim.name + "_1")
  right = reshape_lib.rename_dimension(centered, dim.name, dim.name + "_2")

  def norm(z: Tensor) -> Tensor:
    return (
      elementwise.sqrt(
        reduce_lib.reduce_sum(
          elementwise.square(z), output_shape=z.shape.dims[-1:]
        )
      )
      + epsilon
    )

  return einsum_lib.matmul(left, right) / einsum_lib.matmul(
    norm(left), norm(right)
  )


__all__ = ["batch_norm", "corr", "layer_norm"]
