"""Dense layers, initializers, embeddings and unit scaling.

Variable names follow the original mtf.layers (relative to the enclosing
tf.compat.v1.variable_scope): `dense` makes `<name>/kernel` and `<name>/bias`,
`dense_relu_dense` makes `<name>/wi/kernel` and `<name>/wo/kernel`, embeddings
are one variable named `name`. Default scope names ("dense", ...) are made
unique per mtf Graph (see scope_util.py), so rebuilding a program reuses its
variables. The layers that act in training (noise, custom gradients) are
in training_layers.py.
"""

from __future__ import annotations

import functools
import math
from typing import Callable, List, Optional, Sequence

from absl import logging
import gin
import tensorflow as tf

from mesh_tensorflow._src.graph import Mesh
from mesh_tensorflow._src.graph import Tensor
from mesh_tensorflow._src.graph import current_variable_scope_name
from mesh_tensorflow._src.layers.scope_util import layer_variable_scope
from mesh_tensorflow._src.ops import binary
from mesh_tensorflow._src.ops import einsum as einsum_lib
from mesh_tensorflow._src.ops import elementwise
from mesh_tensorflow._src.ops import gather as gather_lib
from mesh_tensorflow._src.ops import random as random_lib
from mesh_tensorflow._src.ops import reshape as reshape_lib
from mesh_tensorflow._src.shapes import Dimension
from mesh_tensorflow._src.shapes import Shape
from mesh_tensorflow._src.shapes import convert_to_dimension
from mesh_tensorflow._src.shapes import list_product
from mesh_tensorflow._src.variables import VariableDType
from mesh_tensorflow._src.variables import get_variable

tf1 = tf.compat.v1

_GIN_MODULE = "mesh_tensorflow.layers"


# ----------------------------------------------------------------------------
# Unit scaling.


@gin.configurable(module=_GIN_MODULE)
def unit_scaling_convention(value: bool = False) -> bool:
  """Whether the unit-scaling convention is on (set it with gin).

  Under this convention weights are initialised with unit variance and the
  outputs of contractions (`us_einsum`, hence `dense`) are divided by the
  square root of the product of the contracted dimension sizes, instead of
  scaling the initial weights by 1/sqrt(fan_in).

  Example (gin):
    >>> import gin
    >>> unit_scaling_convention()
    False
    >>> gin.bind_parameter(
    ...     "mesh_tensorflow.layers.unit_scaling_convention.value", True)
    >>> unit_scaling_convention()
    True
    >>> gin.clear_config()

  Args:
    value: the setting (bound with gin).

  Returns:
    the bool value.
  """
  return value


def us_einsum(xs: Sequence[Tensor], *args, **kwargs) -> Tensor:
  """mtf.einsum, divided by sqrt(contracted size) under unit scaling.

  Example:
    The convention is off by default, so this is plain mtf.einsum:

    >>> converter = mtf.test_utils.NumpyConverter()
    >>> x = mtf.ones(converter.mesh, "batch:2;d_model:4")
    >>> w = mtf.ones(converter.mesh, "d_model:4;d_ff:3")
    >>> unit_scaling_convention()
    False
    >>> y = us_einsum([x, w], output_shape=[x.shape.dims[0], w.shape.dims[1]])
    >>> converter.convert_mtf_tensor_to_np_array(y)
    array([[4., 4., 4.],
           [4., 4., 4.]], dtype=float32)

  Args:
    xs: the mtf Tensors to contract (more arguments as for mtf.einsum).

  Returns:
    the mtf Tensor mtf.einsum returns, scaled under the unit-scaling convention.
  """
  xs = list(xs)
  y = einsum_lib.einsum(xs, *args, **kwargs)
  if unit_scaling_convention():
    seen = []
    for x in xs:
      for d in x.shape.dims:
        if d not in seen:
          seen.append(d)
    contracted = [d for d in seen if d not in y.shape.dims]
    y *= Shape(contracted).size ** -0.5
  return y


# ----------------------------------------------------------------------------
# Initializers.


class DenseInitializer:
  """An initializer for `dense` that may depend on reduced and new dims.

  `__call__(reduced_dims, new_dims)` returns a TF initializer (a callable
  `(shape, dtype) -> tf.Tensor`).
  """

  def __call__(self, reduced_dims, new_dims):
    raise NotImplementedError(
      "%s does not implement __call__" % type(self).__name__
    )


_MODES = ("fan_in", "fan_out", "fan_avg")
_DISTRIBUTIONS = ("normal", "uniform")


@gin.configurable(module=_GIN_MODULE)
class VarianceScalingInitializer(DenseInitializer):
  """Variance scaling from the sizes of the reduced (in) and new (out) dims.

  With distribution "normal": a truncated normal with stddev sqrt(scale / n);
  with "uniform": uniform on [-limit, limit], limit = sqrt(3 * scale / n).
  n is fan_in (product of reduced dim sizes), fan_out (of new dims) or their
  average, per `mode`; under the unit-scaling convention n = 1 and only
  "fan_in" is allowed.

  Example:
    With fan_avg over 100 inputs and 300 outputs, n = 200 and the standard
    deviation is sqrt(2.0 / 200) = 0.1:

    >>> init = VarianceScalingInitializer(
    ...     scale=2.0, mode="fan_avg", distribution="uniform")
    >>> d_in, d_out = mtf.Dimension("d_in", 100), mtf.Dimension("d_out", 300)
    >>> kernel = init([d_in], [d_out])([100, 300]).numpy()
    >>> round(float(kernel.std()), 2), bool(abs(kernel).max() <= 0.1 * 3**0.5)
    (0.1, True)

    Pass it to `dense` as `kernel_initializer=init`.

  Args:
    scale: the variance scale.
    mode: "fan_in", "fan_out" or "fan_avg": which dims n counts.
    distribution: "normal" or "uniform".
  """

  def __init__(
    self, scale: float = 1.0, mode: str = "fan_in", distribution: str = "normal"
  ):
    self.scale = scale
    self.mode = mode.lower()
    self.distribution = distribution.lower()
    self._check()

  def _check(self):
    if self.mode not in _MODES:
      raise ValueError(
        "VarianceScalingInitializer: invalid mode %r; expected "
        "one of %s" % (self.mode, list(_MODES))
      )
    if self.distribution not in _DISTRIBUTIONS:
      raise ValueError(
        "VarianceScalingInitializer: invalid distribution %r; "
        "expected one of %s" % (self.distribution, list(_DISTRIBUTIONS))
      )

  def __call__(self, reduced_dims, new_dims):
    self._check()
    fan_in = list_product(d.size for d in reduced_dims)
    fan_out = list_product(d.size for d in new_dims)
    unit_scaling = unit_scaling_convention()
    if unit_scaling and self.mode != "fan_in":
      raise ValueError(
        "VarianceScalingInitializer: the unit scaling "
        "convention only works with mode 'fan_in', got %r" % self.mode
      )
    if unit_scaling:
      n = 1.0
    elif self.mode == "fan_in":
      n = max(1.0, float(fan_in))
    elif self.mode == "fan_out":
      n = max(1.0, float(fan_out))
    else:
      n = max(1.0, (fan_in + fan_out) / 2.0)
    stddev = math.sqrt(self.scale / n)
    if self.distribution == "normal":
      return tf1.truncated_normal_initializer(stddev=stddev)
    limit = stddev * math.sqrt(3.0)
    return tf1.random_uniform_initializer(minval=-limit, maxval=limit)


# ----------------------------------------------------------------------------
# Dense layers.


def as_dim_list(dims, what: str) -> List[Dimension]:
  """dims (None, a Shape, a Dimension or a list of them) as a list.

  Args:
    dims: the dimensions.
    what: the argument's name, for the error.

  Returns:
    a list of Dimensions.

  Raises:
    ValueError: if dims is none of these.
  """
  if dims is None:
    return []
  if isinstance(dims, Shape):
    return list(dims.dims)
  if isinstance(dims, Dimension) or (
    isinstance(dims, tuple) and len(dims) == 2 and isinstance(dims[0], str)
  ):
    return [convert_to_dimension(dims)]
  if not isinstance(dims, (list, tuple)):
    raise ValueError(
      "%s must be a Dimension or a list of Dimensions, got %r" % (what, dims)
    )
  return [convert_to_dimension(d) for d in dims]


def _default_variable_dtype(
  x: Tensor, variable_dtype, master_dtype, slice_dtype
) -> VariableDType:
  if variable_dtype is None:
    return VariableDType(master_dtype, slice_dtype, x.dtype)
  return variable_dtype


def get_dense_kernel_weights(
  x: Tensor,
  new_dims,
  reduced_dims,
  expert_dims,
  kernel_initializer,
  name: Optional[str] = None,
  variable_dtype: Optional[VariableDType] = None,
  master_dtype=tf.float32,
  slice_dtype=tf.float32,
) -> Tensor:
  """The kernel of a dense layer: variable `<name>/kernel`, cast to x.dtype.

  Example:
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> x = mtf.ones(converter.mesh, "batch:2;d_model:3")
    >>> d_model, d_ff = x.shape.dims[1], mtf.Dimension("d_ff", 4)
    >>> get_dense_kernel_weights(x, [d_ff], [d_model], [], None, name="wi")
    Tensor[wi/kernel:0, Shape[d_model=3, d_ff=4], float32]

  Args:
    x: the layer input (gives the mesh and the activation dtype).
    new_dims: Dimension(s) of the output.
    reduced_dims: Dimension(s) of x contracted away.
    expert_dims: Dimension(s) with separate weights per index, or None.
    kernel_initializer: a DenseInitializer, a TF initializer or None
      (VarianceScalingInitializer()).
    name: variable scope (default "dense", made unique).
    variable_dtype: a VariableDType; default (master_dtype, slice_dtype,
      x.dtype).
    master_dtype: deprecated, see variable_dtype.
    slice_dtype: deprecated, see variable_dtype.

  Returns:
    a Tensor of shape expert_dims + reduced_dims + new_dims.
  """
  variable_dtype = _default_variable_dtype(
    x, variable_dtype, master_dtype, slice_dtype
  )
  new_dims = as_dim_list(new_dims, "new_dims")
  reduced_dims = as_dim_list(reduced_dims, "reduced_dims")
  expert_dims = as_dim_list(expert_dims, "expert_dims")
  w_shape = Shape(expert_dims + reduced_dims + new_dims)
  with layer_variable_scope(x.mesh.graph, name, "dense"):
    if kernel_initializer is None:
      kernel_initializer = VarianceScalingInitializer()
    if isinstance(kernel_initializer, DenseInitializer):
      kernel_initializer = kernel_initializer(reduced_dims, new_dims)
    w = get_variable(
      x.mesh,
      "kernel",
      w_shape,
      initializer=kernel_initializer,
      dtype=variable_dtype,
    )
    return elementwise.cast(w, x.dtype)


def dense(
  x: Tensor,
  new_dims,
  reduced_dims=None,
  expert_dims=None,
  use_bias: bool = True,
  activation: Optional[Callable] = None,
  master_dtype=tf.float32,
  slice_dtype=tf.float32,
  variable_dtype: Optional[VariableDType] = None,
  kernel_initializer=None,
  kernel_weights: Optional[Tensor] = None,
  name: Optional[str] = None,
) -> Tensor:
  """Dense layer: activation(einsum(x, kernel) + bias).

  Example:
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> x_np = np.arange(6.0, dtype=np.float32).reshape([1, 2, 3])
    >>> x = converter.convert_np_array_to_mtf_tensor(
    ...     x_np, ["batch", "length", "d_model"], dtype=tf.float32)
    >>> d_model, d_ff = x.shape.dims[2], mtf.Dimension("d_ff", 4)
    >>> h = mtf.layers.dense(x, [d_ff], reduced_dims=[d_model], name="wi")
    >>> h.shape
    Shape[batch=1, length=2, d_ff=4]
    >>> [(v.name, v.shape) for v in converter.graph.trainable_variables]
    [('wi/kernel', Shape[d_model=3, d_ff=4]), ('wi/bias', Shape[d_ff=4])]
    >>> kernel, bias = [converter.convert_mtf_tensor_to_np_array(v.outputs[0])
    ...                 for v in converter.graph.trainable_variables]
    >>> np.allclose(converter.convert_mtf_tensor_to_np_array(h),
    ...             x_np @ kernel + bias)
    True

  Args:
    x: a Tensor with all of reduced_dims (and expert_dims).
    new_dims: a Dimension or list of Dimensions appended to the output.
    reduced_dims: Dimensions of x to contract; None means the last dim of x
      (deprecated). A reduced dim equal to a new dim is first renamed
      "_<name>" in x.
    expert_dims: optional Dimensions of x with separate weights per index.
    use_bias: add a `bias` variable of shape expert_dims + new_dims (zeros).
    activation: optional function Tensor -> Tensor.
    master_dtype: deprecated, see variable_dtype.
    slice_dtype: deprecated, see variable_dtype.
    variable_dtype: a VariableDType; default (master_dtype, slice_dtype,
      x.dtype).
    kernel_initializer: a DenseInitializer, a TF initializer or None
      (VarianceScalingInitializer()).
    kernel_weights: optional Tensor used as the kernel (no `kernel`
      variable is made).
    name: variable scope. By default the kernel and the bias each get a
      "dense" scope made unique per mtf Graph ("dense/kernel" and
      "dense_1/bias"), as in the original.

  Returns:
    a Tensor of shape [dims of x not reduced] + new_dims.

  Raises:
    ValueError: if a reduced dim is not in x, or a new dim clashes with a
      kept dim of x.
  """
  new_dims = as_dim_list(new_dims, "new_dims")
  expert_dims = as_dim_list(expert_dims, "expert_dims")
  variable_dtype = _default_variable_dtype(
    x, variable_dtype, master_dtype, slice_dtype
  )
  if reduced_dims is None:
    logging.warning(
      "Deprecation warning - it is recommended to pass reduced_dims "
      "explicitly to mtf.layers.dense() so as not to depend on dimension "
      "order. To silence this warning, explicitly pass "
      "reduced_dims=x.shape.dims[-1:] (in scope %s)",
      current_variable_scope_name(),
    )
    reduced_dims = x.shape.dims[-1:]
  reduced_dims = as_dim_list(reduced_dims, "reduced_dims")
  for d in reduced_dims:
    if d not in x.shape.dims:
      raise ValueError(
        "dense: reduced dimension %s is not a dimension of x %s"
        % (d, x.shape.to_string)
      )
  for d in expert_dims:
    if d in reduced_dims:
      raise ValueError(
        "dense: dimension %s is both an expert dim and a reduced dim" % (d,)
      )
  # A reduced dim equal to a new dim is renamed "_<name>" in x, so that the
  # kernel has two distinct dims. A reduced dim that only shares its name
  # with a new dim keeps it: the kernel is then e.g. [d_model=6, d_model=2],
  # as in the original (and a mesh split of that name cannot apply to it).
  for i, d in enumerate(reduced_dims):
    if d in new_dims:
      tmp = Dimension("_" + d.name, d.size)
      x = reshape_lib.rename_dimension(x, d.name, tmp.name)
      reduced_dims[i] = tmp
  kept = [d for d in x.shape.dims if d not in reduced_dims]
  for d in new_dims:
    if d in kept:
      raise ValueError(
        "dense: new dimension %s is already a dimension of x %s "
        "that is not reduced" % (d, x.shape.to_string)
      )
  output_shape = Shape(kept + new_dims)
  if kernel_weights is None:
    # Looked up as a module attribute at call time (mockable through
    # mtf.layers, as in the original). With name=None the kernel and the bias
    # get separate default scopes ("dense/kernel", "dense_1/bias"), which is
    # how the original names them.
    kernel_weights = get_dense_kernel_weights(
      x,
      new_dims,
      reduced_dims,
      expert_dims,
      kernel_initializer,
      name,
      variable_dtype,
      master_dtype,
      slice_dtype,
    )
  with layer_variable_scope(x.mesh.graph, name, "dense"):
    y = us_einsum([x, kernel_weights], output_shape)
    if use_bias:
      b = get_variable(
        x.mesh,
        "bias",
        Shape(expert_dims + new_dims),
        initializer=tf1.zeros_initializer(),
        dtype=variable_dtype,
      )
      y += b
    if activation is not None:
      y = activation(y)
    return y


# Activation functions dense_product accepts by name: the elementwise mtf ops,
# under their mtf names ("abs" is mtf.abs).
_ACTIVATIONS_BY_NAME = dict(
  {
    name: getattr(elementwise, name)
    for name in elementwise.__all__
    if not isinstance(getattr(elementwise, name), type)
  },
  abs=elementwise.mtf_abs,
)


def _resolve_activation(activation) -> Optional[Callable]:
  """None for None/"linear"; an mtf function for a name; else the callable."""
  if activation is None or activation == "linear":
    return None
  if isinstance(activation, str):
    fn = _ACTIVATIONS_BY_NAME.get(activation)
    if fn is None:
      raise ValueError(
        "dense_product: unknown activation function name %r "
        "(expected an mtf function name such as 'relu', "
        "'sigmoid', 'gelu', or 'linear')" % activation
      )
    return fn
  if not callable(activation):
    raise ValueError(
      "dense_product: activation must be a callable, an mtf "
      "function name or None, got %r" % (activation,)
    )
  return activation


def dense_product(
  x: Tensor,
  reduced_dims,
  new_dims,
  activation_functions=None,
  name: str = "dense_product",
  **kwargs,
) -> Tensor:
  """Elementwise product of dense layers, one per activation (e.g. GLU).

  Example:
    A gated linear unit, (x @ k0 + b0) * sigmoid(x @ k1 + b1):

    >>> converter = mtf.test_utils.NumpyConverter()
    >>> x_np = np.random.RandomState(0).randn(2, 3).astype(np.float32)
    >>> x = converter.convert_np_array_to_mtf_tensor(
    ...     x_np, ["batch", "d_model"], dtype=tf.float32)
    >>> d_model, d_ff = x.shape.dims[1], mtf.Dimension("d_ff", 4)
    >>> h = dense_product(x, [d_model], [d_ff], ["linear", "sigmoid"],
    ...                   name="glu")
    >>> h.shape
    Shape[batch=2, d_ff=4]
    >>> [v.name for v in converter.graph.trainable_variables]
    ['glu_0/kernel', 'glu_0/bias', 'glu_1/kernel', 'glu_1/bias']
    >>> lowering, h_tf = converter.convert_mtf_tensor_to_tf_tensor(h)
    >>> k0, b0, k1, b1 = [lowering.export_to_tf_tensor(v.outputs[0]).numpy()
    ...                   for v in converter.graph.trainable_variables]
    >>> np.allclose(h_tf, (x_np @ k0 + b0) * tf.sigmoid(x_np @ k1 + b1))
    True

  Args:
    x: a Tensor.
    reduced_dims: Dimensions to contract.
    new_dims: Dimensions of the output.
    activation_functions: a list (or one) of: a callable, the name of an mtf
      function, or None / "linear" for no activation.
    name: variable scope; with several factors the scopes are
      "<name>_0", "<name>_1", ...
    **kwargs: more arguments for `dense`.

  Returns:
    a Tensor.

  Raises:
    ValueError: for an unknown activation name.
  """
  if not isinstance(activation_functions, (list, tuple)):
    activation_functions = [activation_functions]
  activations = [_resolve_activation(a) for a in activation_functions]
  factors = []
  for i, activation in enumerate(activations):
    factor_name = "%s_%d" % (name, i) if len(activations) > 1 else name
    factors.append(
      dense(
        x,
        new_dims,
        reduced_dims=reduced_dims,
        activation=activation,
        name=factor_name,
        **kwargs,
      )
    )
  return functools.reduce(binary.multiply, factors)


def dense_relu_dense(
  x: Tensor,
  hidden_channels: Dimension,
  is_training: bool,
  dropout: float = 0.0,
  dropout_broadcast_dims=None,
  master_dtype=tf.float32,
  slice_dtype=tf.float32,
  name: Optional[str] = None,
) -> Tensor:
  """relu(x W_i) W_o, without biases; the output has x's shape.

  Example:
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> x_np = np.random.RandomState(0).randn(2, 3).astype(np.float32)
    >>> x = converter.convert_np_array_to_mtf_tensor(
    ...     x_np, ["batch", "d_model"], dtype=tf.float32)
    >>> y = dense_relu_dense(x, mtf.Dimension("d_ff", 4), is_training=False,
    ...                      dropout=0.1)
    >>> y.shape
    Shape[batch=2, d_model=3]
    >>> [(v.name, v.shape) for v in converter.graph.trainable_variables]
    [('dense_relu_dense/wi/kernel', Shape[d_model=3, d_ff=4]),
     ('dense_relu_dense/wo/kernel', Shape[d_ff=4, d_model=3])]
    >>> lowering, y_tf = converter.convert_mtf_tensor_to_tf_tensor(y)
    >>> wi, wo = [lowering.export_to_tf_tensor(v.outputs[0]).numpy()
    ...           for v in converter.graph.trainable_variables]
    >>> np.allclose(y_tf, np.maximum(x_np @ wi, 0) @ wo, atol=1e-6)
    True

  Args:
    x: a Tensor whose last dimension is the io channels.
    hidden_channels: the hidden Dimension.
    is_training: dropout is applied only when True.
    dropout: dropout rate on the hidden layer.
    dropout_broadcast_dims: optional Dimensions along which the dropout mask
      is shared.
    master_dtype: master dtype of the variables.
    slice_dtype: slice dtype of the variables.
    name: variable scope (default "dense_relu_dense").

  Returns:
    a Tensor of x's shape.
  """
  with layer_variable_scope(x.mesh.graph, name, "dense_relu_dense"):
    io_channels = x.shape.dims[-1]
    h = dense(
      x,
      hidden_channels,
      reduced_dims=[io_channels],
      use_bias=False,
      activation=elementwise.relu,
      master_dtype=master_dtype,
      slice_dtype=slice_dtype,
      name="wi",
    )
    if dropout != 0.0:
      h = random_lib.dropout(
        h,
        is_training,
        keep_prob=1.0 - dropout,
        noise_shape=h.shape
        - as_dim_list(dropout_broadcast_dims, "dropout_broadcast_dims"),
      )
    return dense(
      h,
      io_channels,
      reduced_dims=[h.shape.dims[-1]],
      use_bias=False,
      activation=None,
      master_dtype=master_dtype,
      slice_dtype=slice_dtype,
      name="wo",
    )


# ----------------------------------------------------------------------------
# Embeddings.


def embedding_weights(
  mesh: Mesh,
  vocab_dim: Dimension,
  output_dim: Dimension,
  variable_dtype,
  name: str = "embedding",
  ensemble_dim=None,
  initializer=None,
) -> Tensor:
  """The embedding variable `name`, shape [ensemble..., vocab, output].

  Example:
    >>> mesh = mtf.Mesh(mtf.Graph(), "my_mesh")
    >>> vocab, d_model = mtf.Dimension("vocab", 5), mtf.Dimension("d_model", 3)
    >>> embedding_weights(mesh, vocab, d_model, mtf.VariableDType())
    Tensor[embedding:0, Shape[vocab=5, d_model=3], float32]

  Args:
    mesh: the Mesh.
    vocab_dim: the vocabulary Dimension.
    output_dim: the embedding Dimension.
    variable_dtype: a VariableDType (or a tf dtype).
    name: the variable name.
    ensemble_dim: optional Dimension or list of Dimensions prepended.
    initializer: default tf.random_normal_initializer() (stddev 1).

  Returns:
    the variable's value, a Tensor.
  """
  ensemble = as_dim_list(ensemble_dim or None, "ensemble_dim")
  shape = Shape(
    ensemble
    + [convert_to_dimension(vocab_dim), convert_to_dimension(output_dim)]
  )
  if initializer is None:
    initializer = tf1.random_normal_initializer()
  return get_variable(
    mesh, name, shape, dtype=variable_dtype, initializer=initializer
  )


def embedding(
  indices: Tensor,
  vocab_dim: Dimension,
  output_dim: Dimension,
  variable_dtype,
  name: str = "embedding",
) -> Tensor:
  """Looks integer `indices` up in the embedding variable `name`.

  Example:
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> ids = converter.convert_np_array_to_mtf_tensor(
    ...     [[4, 0, 4]], ["batch", "length"])
    >>> vocab, d_model = mtf.Dimension("vocab", 5), mtf.Dimension("d_model", 3)
    >>> y = embedding(ids, vocab, d_model, mtf.VariableDType())
    >>> y.shape
    Shape[batch=1, length=3, d_model=3]
    >>> table = converter.convert_mtf_tensor_to_np_array(
    ...     converter.graph.trainable_variables[0].outputs[0])
    >>> y_np = converter.convert_mtf_tensor_to_np_array(y)
    >>> np.allclose(y_np, table[[[4, 0, 4]]])
    True

  Args:
    indices: an integer mtf Tensor of ids in [0, vocab_dim.size).
    vocab_dim: the vocabulary Dimension.
    output_dim: the embedding Dimension.
    variable_dtype: an mtf VariableDType for the [vocab_dim, output_dim]
      variable.
    name: the name of the embedding variable.

  Returns:
    an mtf Tensor of shape indices.shape + output_dim, in the activation dtype.

  Raises:
    ValueError: if indices are not integers or already have vocab_dim.
  """
  if not indices.dtype.is_integer:
    raise ValueError(
      "embedding: indices must be integers, got %s of dtype %s"
      % (indices.to_string, indices.dtype.name)
    )
  if convert_to_dimension(vocab_dim) in indices.shape.dims:
    raise ValueError(
      "embedding: indices %s must not have the vocab dimension "
      "%s" % (indices.to_string, vocab_dim)
    )
  weights = embedding_weights(
    indices.mesh, vocab_dim, output_dim, variable_dtype, name
  )
  return gather_lib.gather(weights, indices, vocab_dim)


__all__ = [
  "DenseInitializer",
  "VarianceScalingInitializer",
  "dense",
  "dense_product",
  "dense_relu_dense",
  "embedding",
  "embedding_weights",
  "get_dense_kernel_weights",
  "unit_scaling_convention",
  "us_einsum",
]
