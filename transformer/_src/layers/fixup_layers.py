"""Fixup initialization (Zhang, Dauphin and Ma, 2019) for transformer layers.

Fixup trains deep residual networks without normalization layers: the last
projection of every residual branch starts at zero, the other projections
of a branch of m weight layers are drawn from a He or Glorot initializer
scaled by L^(-1/(2m-2)) for L = `num_blocks` residual branches, and scalar
biases / multipliers are added around the branches.

Layers: DenseReluDenseFixup (m = 2), SelfAttentionFixup (m = 4, through
AttentionParamsFixup), EncDecAttentionFixup, and the scalar sublayers
`sublayer_fixup_scale` (variable "fixup_scale_weight", init 1) and
`sublayer_fixup_shift` (variable "fixup_bias", init 0) for LayerStack
sublayer lists, e.g.
  sublayers_per_layer = [@sublayer_fixup_shift, @sublayer_call_layer,
                         @sublayer_fixup_scale, @sublayer_residual]
"""

from __future__ import annotations

import math

import gin
import tensorflow as tf

import mesh_tensorflow as mtf
from transformer._src.layers import attention_params
from transformer._src.layers import enc_dec_attention
from transformer._src.layers import self_attention
from transformer._src.layers.context import Context
from transformer._src.layers.context import TransformerLayer

__all__ = [
  "AttentionParamsFixup",
  "DenseReluDenseFixup",
  "EncDecAttentionFixup",
  "SelfAttentionFixup",
  "dense_product_fixup",
  "get_single_scalar_bias",
  "sublayer_fixup_scale",
  "sublayer_fixup_shift",
]

_GIN_MODULE = "mesh_tensorflow.transformer.fixup_layers"
tf1 = tf.compat.v1


def _fixup_initializer(
  default_init: str, init_distribution: str, glorot_scale: float
):
  """Variance scaling: Glorot (fan_avg, glorot_scale) or He (fan_in, 2x).

  tf's variance scaling draws with variance scale / fan, so glorot_scale is
  the square of the factor applied to the standard deviation.
  """
  if default_init == "glorot":
    return tf1.initializers.variance_scaling(
      mode="fan_avg", distribution=init_distribution, scale=glorot_scale
    )
  if default_init == "he":
    return tf1.initializers.variance_scaling(
      mode="fan_in", distribution=init_distribution, scale=2.0 * glorot_scale
    )
  raise ValueError(
    "Unsupported default initialization %r. Only 'glorot' and "
    "'he' initializations are supported." % (default_init,)
  )


def get_single_scalar_bias(x: mtf.Tensor, name: str) -> mtf.Tensor:
  """A trainable bias [single_bias=1], zero-initialized, of x's dtype.

  The Fixup `shift` placed before a projection or convolution.

  Args:
    x: a Tensor; gives the mesh and dtype.
    name: the variable name.

  Returns:
    the variable, a Tensor [single_bias=1].
  """
  return mtf.get_variable(
    x.mesh,
    name,
    mtf.Shape([mtf.Dimension("single_bias", 1)]),
    initializer=tf1.zeros_initializer(),
    dtype=x.dtype,
  )


def dense_product_fixup(
  x: mtf.Tensor,
  reduced_dims,
  new_dims,
  kernel_initializer,
  activation_functions=None,
  name: str = "dense_product",
  **kwargs,
) -> mtf.Tensor:
  """mtf.layers.dense_product with an explicit kernel initializer.

  Args:
    x: a Tensor.
    reduced_dims: Dimensions to contract.
    new_dims: Dimensions of the output.
    kernel_initializer: initializer of every kernel (the Fixup-scaled one).
    activation_functions: activations as in mtf.layers.dense_product.
    name: variable scope prefix.
    **kwargs: more arguments of mtf.layers.dense.

  Returns:
    the elementwise product of the dense layers.
  """
  return mtf.layers.dense_product(
    x,
    reduced_dims,
    new_dims,
    activation_functions,
    name,
    kernel_initializer=kernel_initializer,
    **kwargs,
  )


class AttentionParamsFixup(attention_params.AttentionParams):
  """Attention parameters with Fixup initialization.

  Variables `q_fixup`, `k_fixup`, `v_fixup` (or `kv_fixup` with shared_kv)
  drawn from the Glorot / He initializer scaled by num_blocks^(-1/6) in
  standard deviation (m = 4 weight layers per attention branch), and
  `o_fixup`, zero-initialized.
  """

  def __init__(
    self,
    mesh,
    query_input_dim,
    memory_input_dim,
    output_dim,
    key_dim,
    value_dim,
    query_heads_dims,
    memory_heads_dims,
    variable_dtype,
    shared_kv: bool = False,
    fold_scaling_into_initializer: bool = False,
    num_blocks=None,
    default_init: str = "he",
    init_distribution: str = "uniform",
    **kwargs,
  ):
    """Creates the parameters (the arguments of AttentionParams and more).

    Args:
      mesh: the Mesh.
      query_input_dim: a Dimension.
      memory_input_dim: a Dimension.
      output_dim: a Dimension.
      key_dim: a Dimension.
      value_dim: a Dimension.
      query_heads_dims: list of Dimensions.
      memory_heads_dims: list of Dimensions.
      variable_dtype: an mtf.VariableDType.
      shared_kv: one kv projection.
      fold_scaling_into_initializer: must be False.
      num_blocks: L, the number of residual branches of the network.
      default_init: "glorot" or "he".
      init_distribution: distribution of tf's variance scaling.
      **kwargs: more arguments of AttentionParams.

    Raises:
      ValueError: with the unit scaling convention or
        fold_scaling_into_initializer.
    """
    self.num_blocks = num_blocks
    self.default_init = default_init
    self.init_distribution = init_distribution
    if mtf.layers.unit_scaling_convention():
      raise ValueError(
        "Fixup initialization is not compatible with unit scaling convention."
      )
    if fold_scaling_into_initializer:
      raise ValueError(
        "Fixup initialization is not compatible with "
        "`fold_scaling_into_initializer`."
      )
    super().__init__(
      mesh,
      query_input_dim,
      memory_input_dim,
      output_dim,
      key_dim,
      value_dim,
      query_heads_dims,
      memory_heads_dims,
      variable_dtype,
      shared_kv=shared_kv,
      fold_scaling_into_initializer=fold_scaling_into_initializer,
      **kwargs,
    )

  def init_weights(self) -> None:
    """Creates q/k/v (or kv) and o with the Fixup initializers."""
    init = _fixup_initializer(
      self.default_init,
      self.init_distribution,
      math.pow(self.num_blocks, -1.0 / 3),
    )
    q_shape, k_shape, v_shape, o_shape = self._kernel_shapes()

    def variable(name, shape, initializer):
      return mtf.get_variable(
        self.mesh,
        name,
        shape,
        initializer=initializer,
        dtype=self.variable_dtype,
      )

    if not self.no_query:
      self.wq = variable("q_fixup", q_shape, init)
    if self.shared_kv:
      self.wkv = variable("kv_fixup", k_shape, init)
    else:
      self.wk = variable("k_fixup", k_shape, init)
      self.wv = variable("v_fixup", v_shape, init)
    self.wo = variable("o_fixup", o_shape, tf1.zeros_initializer())


@gin.configurable(module=_GIN_MODULE)
class DenseReluDenseFixup(TransformerLayer):
  """Two dense layers with an activation between, Fixup-initialized.

  h = act(x wi) (`wi/kernel` [d_model, d_ff], or `wi_<i>` for a list of
  activations, Glorot / He scaled by num_blocks^-1/2 in standard
  deviation), dropout in training, h + `shift` (a scalar [single_bias=1],
  init 0), then `wo/kernel` [d_ff, d_model], zero-initialized.
  """

  def __init__(
    self,
    hidden_size: int = 4096,
    dropout_rate: float = 0.0,
    activation="relu",
    use_bias: bool = False,
    default_init: str = "he",
    init_distribution: str = "uniform",
    num_blocks: int = gin.REQUIRED,
  ):
    """Creates the layer.

    Args:
      hidden_size: size of d_ff.
      dropout_rate: dropout on the hidden layer in training.
      activation: an activation or list of them (mtf.layers.dense_product).
      use_bias: biases in both dense layers.
      default_init: "glorot" or "he".
      init_distribution: distribution of tf's variance scaling.
      num_blocks: L, the number of residual branches of the network.

    Raises:
      ValueError: for another default_init.
    """
    self.hidden_size = hidden_size
    self.dropout_rate = dropout_rate
    self.activation = activation
    self.use_bias = use_bias
    self.downproject_initializer = tf1.zeros_initializer()
    self.upproject_initializer = _fixup_initializer(
      default_init, init_distribution, 1.0 / num_blocks
    )

  def call(self, context: Context, x: mtf.Tensor, losses=None) -> mtf.Tensor:
    """Runs the layer on x [..., d_model]."""
    del losses
    io_channels = x.shape.dims[-1]
    ensemble_dims = context.model.ensemble_dims
    h = dense_product_fixup(
      x,
      reduced_dims=x.shape.dims[-1:],
      new_dims=[mtf.Dimension("d_ff", self.hidden_size)],
      activation_functions=self.activation,
      use_bias=self.use_bias,
      variable_dtype=context.variable_dtype,
      name="wi",
      kernel_initializer=self.upproject_initializer,
      expert_dims=ensemble_dims,
    )
    if context.train and self.dropout_rate != 0.0:
      h = mtf.dropout(
        h,
        context.train,
        1.0 - self.dropout_rate,
        noise_shape=h.shape - context.length_dim,
      )
    h = mtf.reshape(h + get_single_scalar_bias(x, "shift"), h.shape)
    return mtf.layers.dense(
      h,
      io_channels,
      use_bias=self.use_bias,
      activation=None,
      variable_dtype=context.variable_dtype,
      reduced_dims=h.shape.dims[-1:],
      name="wo",
      expert_dims=ensemble_dims,
      kernel_initializer=self.downproject_initializer,
    )


def _heads_dims(num_heads: int, num_memory_heads: int):
  """(query heads dims, memory heads dims), as attention_params makes them."""
  if num_heads == 1:
    return [], []
  if num_memory_heads == 0:
    heads = [mtf.Dimension("heads", num_heads)]
    return heads, heads
  if num_memory_heads == 1:
    return [mtf.Dimension("heads", num_heads)], []
  if num_heads % num_memory_heads:
    raise ValueError("num_memory_heads must divide num_heads")
  memory = [mtf.Dimension("heads", num_memory_heads)]
  return memory + [
    mtf.Dimension("query_heads", num_heads // num_memory_heads)
  ], memory


@gin.configurable(module=_GIN_MODULE)
class SelfAttentionFixup(self_attention.SelfAttention):
  """SelfAttention whose parameters are AttentionParamsFixup.

  Needs fold_scaling_into_initializer=False (AttentionParamsFixup rejects
  it). Variables `q_fixup`, `k_fixup`, `v_fixup`, `o_fixup`.
  """

  def __init__(
    self,
    num_blocks: int = gin.REQUIRED,
    default_init: str = "glorot",
    init_distribution: str = "uniform",
    **kwargs,
  ):
    """Creates the layer.

    Args:
      num_blocks: L, the number of residual branches of the network.
      default_init: "glorot" or "he".
      init_distribution: distribution of tf's variance scaling.
      **kwargs: arguments of SelfAttention.
    """
    super().__init__(**kwargs)
    self.num_blocks = num_blocks
    self.default_init = default_init
    self.init_distribution = init_distribution

  def make_params(self, context: Context) -> AttentionParamsFixup:
    query_heads, memory_heads = _heads_dims(
      self.num_heads, self.num_memory_heads
    )
    model = context.model
    return AttentionParamsFixup(
      context.mesh,
      query_input_dim=model.model_dim,
      memory_input_dim=model.model_dim,
      output_dim=model.model_dim,
      key_dim=self.kv_dim,
      value_dim=self.kv_dim,
      query_heads_dims=query_heads,
      memory_heads_dims=memory_heads,
      variable_dtype=context.variable_dtype,
      shared_kv=self.shared_kv,
      ensemble_dim=model.ensemble_dim,
      combine_dims=self.combine_dims,
      keep_query_heads_dims=self.keep_query_heads_dims,
      fold_scaling_into_initializer=self.fold_scaling_into_initializer,
      num_blocks=self.num_blocks,
      default_init=self.default_init,
      init_distribution=self.init_distribution,
    )


@gin.configurable(module=_GIN_MODULE)
class EncDecAttentionFixup(enc_dec_attention.EncDecAttention):
  """Attention over the encoder output, registered for Fixup models.

  As in the original it keeps EncDecAttention's parameters and
  initializers (it defines no Fixup parameters of its own).
  """

  def __init__(self, relative_attention_type=None, **kwargs) -> None:
    """Creates the layer; the arguments as EncDecAttention's."""
    super().__init__(relative_attention_type=relative_attention_type, **kwargs)


@gin.configurable(module=_GIN_MODULE)
def sublayer_fixup_scale(
  x: mtf.Tensor, layer_stack, context: Context
) -> mtf.Tensor:
  """x times a learned scalar `fixup_scale_weight` [single_scale=1], init 1.

  The variable lives in the scope of the layer in progress.

  Args:
    x: the branch's output [batch..., length, d_model].
    layer_stack: the LayerStack (unused).
    context: the Context of the call (mesh, dims, mode, states...).

  Returns:
    x times the scalar, shaped as x.
  """
  del layer_stack
  weight = mtf.get_variable(
    x.mesh,
    "fixup_scale_weight",
    shape=mtf.Shape([mtf.Dimension("single_scale", 1)]),
    dtype=context.variable_dtype,
    initializer=tf1.constant_initializer(1.0),
  )
  return mtf.reshape(x * weight, x.shape)


@gin.configurable(module=_GIN_MODULE)
def sublayer_fixup_shift(
  x: mtf.Tensor, layer_stack, context: Context
) -> mtf.Tensor:
  """x plus a learned scalar `fixup_bias` [single_bias=1], init 0.

  The variable lives in the scope of the layer in progress.

  Args:
    x: the branch's input or output [batch..., length, d_model].
    layer_stack: the LayerStack (unused).
    context: the Context of the call (mesh, dims, mode, states...).

  Returns:
    x plus the scalar, shaped as x.
  """
  del layer_stack
  bias = mtf.get_variable(
    x.mesh,
    "fixup_bias",
    shape=mtf.Shape([mtf.Dimension("single_bias", 1)]),
    dtype=context.variable_dtype,
    initializer=tf1.zeros_initializer(),
  )
  return mtf.reshape(x + bias, x.shape)
