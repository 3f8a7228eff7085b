"""Fixup initialization (Zhang, Dauphin and Ma, 2019) for transformer layers.

Fixup trains deep residual networks without normalization layers: the last
projection of every residual branch starts at zero (so every branch is the
identity-plus-zero at initialization), the other projections of a branch of
m weight layers are scaled by L^(-1/(2m-2)) for L residual branches, and
scalar biases / multipliers are added around the branches.

This module provides Fixup versions of DenseReluDense, SelfAttention and
EncDecAttention (same variables and computation as the transformer_layers
classes, other initializers; L = `num_blocks`, m = 2: the input projection
`wi` / value projection `v` is scaled by num_blocks^-1/2 and the output
projection `wo` / `o` is zero) and the scalar sublayers
`sublayer_fixup_scale` (variable "fixup_scale", init 1) and
`sublayer_fixup_shift` (variable "fixup_bias", init 0) for LayerStack
sublayer lists, e.g.
  sublayers_per_layer = [@sublayer_fixup_shift, @sublayer_call_layer,
                         @sublayer_fixup_scale, @sublayer_residual]
"""

from __future__ import annotations

from typing import Sequence, Union

import gin
import tensorflow as tf

import mesh_tensorflow as mtf
from transformer._src.layers import attention_core
from transformer._src.layers import attention_layers
from transformer._src.layers import dense_layers
from transformer._src.layers.context import Context

__all__ = [
    "DenseReluDense",
    "EncDecAttention",
    "SelfAttention",
    "fixup_scale_factor",
    "sublayer_fixup_scale",
    "sublayer_fixup_shift",
]

_GIN_MODULE = "mesh_tensorflow.transformer.fixup_layers"
tf1 = tf.compat.v1

# Weight layers per residual branch (wi/wo; v/o).
_BRANCH_DEPTH = 2


def fixup_scale_factor(num_blocks: int, branch_depth: int = _BRANCH_DEPTH
                       ) -> float:
  """L^(-1/(2m-2)): the Fixup scale of a branch's inner weights.

  Args:
    num_blocks: L, the number of residual branches (a positive int).
    branch_depth: m, the number of weight layers in a branch (>= 2).

  Returns:
    num_blocks ** (-1 / (2 * branch_depth - 2)).

  Raises:
    ValueError: for a non-positive num_blocks or branch_depth < 2.
  """
  if (not isinstance(num_blocks, int) or isinstance(num_blocks, bool)
      or num_blocks < 1):
    raise ValueError("fixup: num_blocks must be a positive int, got %r"
                     % (num_blocks,))
  if branch_depth < 2:
    raise ValueError("fixup: branch_depth must be >= 2, got %r"
                     % (branch_depth,))
  return float(num_blocks) ** (-1.0 / (2 * branch_depth - 2))


def _ensemble_dims(context: Context):
  return list(getattr(context.model, "ensemble_dims", None) or [])


@gin.configurable(module=_GIN_MODULE)
class DenseReluDense(dense_layers.DenseReluDense):
  """DenseReluDense with Fixup initialization.

  Same variables as transformer_layers.DenseReluDense (`wi/kernel`
  [d_model, d_ff] or `wi_<i>/kernel` for gated activations, `wo/kernel`
  [d_ff, d_model]); `wi` is drawn as usual (truncated normal, stddev
  d_model^-0.5) times num_blocks^-1/2, `wo` starts at zero, so the layer
  outputs zeros at initialization.

  Example:
    DenseReluDense(hidden_size=2048, num_blocks=12).call(context, x)
  """

  def __init__(self, hidden_size: int = 4096, dropout_rate: float = 0.0,
               activation: Union[str, Sequence[str]] = "relu",
               use_bias: bool = False, num_blocks: int = gin.REQUIRED):
    """Creates the layer; num_blocks is L, the number of residual branches
    of the network (see the module docstring); the rest as
    transformer_layers.DenseReluDense.

    Args:
      num_blocks: L, the number of residual branches of the model (sets the
        Fixup scale of the initializers).
    """
    super().__init__(hidden_size=hidden_size, dropout_rate=dropout_rate,
                     activation=activation, use_bias=use_bias)
    self.num_blocks = num_blocks

  def _wi_initializer(self):
    # Variance scaling multiplies the variance: scale**2 scales the stddev.
    return mtf.layers.VarianceScalingInitializer(
        scale=fixup_scale_factor(self.num_blocks) ** 2)

  def _wo_initializer(self):
    return tf1.zeros_initializer()


class _FixupAttentionParams(attention_core.AttentionParams):
  """AttentionParams whose v (or kv) is scaled and whose o starts at zero."""

  def __init__(self, *args, fixup_scale: float, **kwargs):
    self.fixup_scale = fixup_scale
    super().__init__(*args, **kwargs)

  def init_weights(self) -> None:
    q_init, kv_init, _ = self._initializers()
    stddev = kv_init.stddev * self.fixup_scale
    v_init = tf1.random_normal_initializer(stddev=stddev)
    q_shape, k_shape, v_shape, o_shape = self._kernel_shapes()
    dtype = self.variable_dtype
    if not self.no_query:
      self.wq = mtf.get_variable(self.mesh, "q", q_shape, initializer=q_init,
                                 dtype=dtype)
    if self.shared_kv:
      self.wkv = mtf.get_variable(self.mesh, "kv", k_shape,
                                  initializer=v_init, dtype=dtype)
    else:
      self.wk = mtf.get_variable(self.mesh, "k", k_shape, initializer=kv_init,
                                 dtype=dtype)
      self.wv = mtf.get_variable(self.mesh, "v", v_shape, initializer=v_init,
                                 dtype=dtype)
    self.wo = mtf.get_variable(self.mesh, "o", o_shape,
                               initializer=tf1.zeros_initializer(),
                               dtype=dtype)


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
    raise ValueError("num_memory_heads (%d) must divide num_heads (%d)"
                     % (num_memory_heads, num_heads))
  memory = [mtf.Dimension("heads", num_memory_heads)]
  return memory + [mtf.Dimension("query_heads",
                                 num_heads // num_memory_heads)], memory


class _FixupAttentionMixin:
  """make_params with Fixup initializers (v / kv scaled, o zero)."""

  def make_params(self, context: Context) -> attention_core.AttentionParams:
    query_heads, memory_heads = _heads_dims(self.num_heads,
                                            self.num_memory_heads)
    model = context.model
    return _FixupAttentionParams(
        context.mesh, query_input_dim=model.model_dim,
        memory_input_dim=model.model_dim, output_dim=model.model_dim,
        key_dim=self.kv_dim, value_dim=self.kv_dim,
        query_heads_dims=query_heads, memory_heads_dims=memory_heads,
        variable_dtype=context.variable_dtype, shared_kv=self.shared_kv,
        ensemble_dim=getattr(model, "ensemble_dim", None),
        combine_dims=self.combine_dims,
        keep_query_heads_dims=self.keep_query_heads_dims,
        fold_scaling_into_initializer=self.fold_scaling_into_initializer,
        fixup_scale=fixup_scale_factor(self.num_blocks))


@gin.configurable(module=_GIN_MODULE)
class SelfAttention(_FixupAttentionMixin, attention_layers.SelfAttention):
  """SelfAttention with Fixup initialization.

  Same variables and computation as transformer_layers.SelfAttention; `v`
  (`kv` with shared_kv) is drawn as usual times num_blocks^-1/2 and `o`
  starts at zero, so the layer outputs zeros at initialization. q and k
  keep their usual initializers (scaling them would only change the
  attention temperature).

  Example:
    SelfAttention(num_heads=8, num_blocks=12).call(context, x)
  """

  def __init__(self, num_heads: int = 8, num_memory_heads: int = 0,
               key_value_size: int = 128, shared_kv: bool = False,
               dropout_rate: float = 0.0, attention_kwargs=None,
               relative_attention_type=None,
               relative_attention_num_buckets: int = 32,
               attention_func=None, combine_dims: bool = True,
               keep_query_heads_dims: bool = False,
               fold_scaling_into_initializer: bool = True,
               num_blocks: int = gin.REQUIRED):
    """Creates the layer; num_blocks is L (module docstring), the rest as
    transformer_layers.SelfAttention.

    Args:
      num_blocks: L, the number of residual branches of the model (sets the
        Fixup scale of the initializers).
    """
    super().__init__(
        num_heads=num_heads, num_memory_heads=num_memory_heads,
        key_value_size=key_value_size, shared_kv=shared_kv,
        dropout_rate=dropout_rate, attention_kwargs=attention_kwargs,
        relative_attention_type=relative_attention_type,
        relative_attention_num_buckets=relative_attention_num_buckets,
        attention_func=attention_func, combine_dims=combine_dims,
        keep_query_heads_dims=keep_query_heads_dims,
        fold_scaling_into_initializer=fold_scaling_into_initializer)
    self.num_blocks = num_blocks


@gin.configurable(module=_GIN_MODULE)
class EncDecAttention(_FixupAttentionMixin, attention_layers.EncDecAttention):
  """EncDecAttention with Fixup initialization (v scaled, o zero; see
  SelfAttention here). Other keyword arguments as SelfAttention's.

  Args:
    num_blocks: L, the number of residual branches of the model (sets the Fixup
      scale of the initializers).
  """

  def __init__(self, relative_attention_type=None,
               num_blocks: int = gin.REQUIRED, **kwargs):
    super().__init__(relative_attention_type=relative_attention_type,
                     **kwargs)
    self.num_blocks = num_blocks


def _scalar_variable(context: Context, name: str, value: float
                     ) -> mtf.Tensor:
  var = mtf.get_variable(
      context.mesh, name, mtf.Shape(_ensemble_dims(context)),
      initializer=tf1.constant_initializer(value),
      dtype=context.variable_dtype)
  return mtf.cast(var, context.activation_dtype)


@gin.configurable(module=_GIN_MODULE)
def sublayer_fixup_scale(x: mtf.Tensor, layer_stack, context: Context, *,
                         name: str = "fixup_scale") -> mtf.Tensor:
  """x * s, s a learned scalar (per ensemble member) initialized to 1.

  The variable `<name>` (default "fixup_scale") lives in the scope of the
  layer in progress (`<block>/<layer>/fixup_scale`); calling the sublayer
  twice for one layer reuses it unless another name is configured.

  Args:
    x: the branch's output [batch..., length, d_model].
    layer_stack: the LayerStack (unused).
    context: the Context of the call (mesh, dims, mode, states...).
    name: the variable's name.

  Returns:
    x times the scalar, shaped as x.
  """
  del layer_stack
  return x * _scalar_variable(context, name, 1.0)


@gin.configurable(module=_GIN_MODULE)
def sublayer_fixup_shift(x: mtf.Tensor, layer_stack, context: Context, *,
                         name: str = "fixup_bias") -> mtf.Tensor:
  """x + b, b a learned scalar (per ensemble member) initialized to 0.

  The variable `<name>` (default "fixup_bias") lives in the scope of the
  layer in progress; calling the sublayer twice for one layer reuses it
  unless another name is configured (e.g. with gin scopes).

  Args:
    x: the branch's input or output [batch..., length, d_model].
    layer_stack: the LayerStack (unused).
    context: the Context of the call (mesh, dims, mode, states...).
    name: the variable's name.

  Returns:
    x plus the scalar, shaped as x.
  """
  del layer_stack
  return x + _scalar_variable(context, name, 0.0)
