"""Local self-attention of mesh_tensorflow.transformer.transformer_layers.

`LocalSelfAttention` attends to the positions within `radius` of the query
(blockwise over the length, which may be split over the mesh). Decoding: in
mode "first_part" it records a ring buffer of the last `radius` keys/values,
which each "incremental" call reads back and updates.
"""

from __future__ import annotations

import gin
import tensorflow as tf

import mesh_tensorflow as mtf
from transformer._src.layers import attention_core as attention
from transformer._src.layers.attention_bias import sequence_id_for_bias
from transformer._src.layers.attention_bias import to_bias
from transformer._src.layers.context import Context
from transformer._src.layers.local_attention import local_attention_1d
from transformer._src.layers.self_attention import SelfAttention

__all__ = ["LocalSelfAttention"]

_GIN_MODULE = "mesh_tensorflow.transformer.transformer_layers"


def _length_num_splits(context: Context) -> int:
  model = context.model
  layout = getattr(model, "layout", None)
  mesh_shape = getattr(model, "mesh_shape", None)
  if not layout or not mesh_shape:
    return 1
  return mtf.tensor_dim_to_mesh_dim_size(layout, mesh_shape, context.length_dim)


@gin.configurable(module=_GIN_MODULE)
class LocalSelfAttention(SelfAttention):
  """Self-attention to the positions within `radius` of the query.

  Query i sees memory j iff 1 - radius <= j - i <= 0 (autoregressive model)
  or |j - i| < radius. Short sequences (length <= max(256, 4 * radius)) use
  full attention with that window as a mask, longer ones
  local_attention_1d. Decoding keeps a "window" ring buffer of the
  last radius keys/values (position p in slot p % radius); incremental steps
  see the window only (no priorities or packed sequences, as when sampling).

  Args:
    radius: each position attends to the `radius` previous positions (and,
      unless fully autoregressive, the `radius` next ones).
  """

  def __init__(
    self,
    radius: int = 128,
    num_heads: int = 8,
    num_memory_heads: int = 0,
    key_value_size: int = 128,
    shared_kv: bool = False,
    dropout_rate: float = 0.0,
    attention_kwargs=None,
  ):
    super().__init__(
      num_heads=num_heads,
      num_memory_heads=num_memory_heads,
      key_value_size=key_value_size,
      shared_kv=shared_kv,
      dropout_rate=dropout_rate,
      attention_kwargs=attention_kwargs,
    )
    if radius < 1:
      raise ValueError(
        "LocalSelfAttention: radius must be >= 1, got %r" % (radius,)
      )
    self.radius = radius

  @property
  def window_dim(self) -> mtf.Dimension:
    """The Dimension ("window", radius + 1 or 2 * radius + 1) of a query's
    window.
    """
    return mtf.Dimension("window", self.radius)

  def min_relative_position(self, context: Context) -> int:
    """The smallest memory - query position a query attends to.

    Args:
      context: the Context of the call (mesh, dims, mode, states...).

    Returns:
      The smallest memory - query position attended to (-radius).
    """
    return 1 - self.radius

  def max_relative_position(self, context: Context) -> int:
    """The largest memory - query position a query attends to.

    Args:
      context: the Context of the call (mesh, dims, mode, states...).

    Returns:
      The largest memory - query position attended to: radius, or 0 when the
      model is autoregressive.
    """
    return 0 if context.model.fully_autoregressive else self.radius - 1

  def call(self, context: Context, x: mtf.Tensor, losses=None) -> mtf.Tensor:
    if context.mode == "incremental":
      return self._call_incremental(context, x, losses)
    params = self.make_params(context)
    q = params.compute_q(x)
    k, v = self._keys_and_values(params, x)
    kwargs = self.attention_kwargs_from_context(context)
    if context.length_dim.size <= max(256, 4 * self.radius):
      memory_length = self.memory_length(context)
      memory_position = self.rename_length_to_memory_length(
        context.get_position(), context
      )
      bias = self.compute_bias(
        context, memory_position, x, params.query_heads_dims, q
      )
      o = attention.attention(
        q,
        self.rename_length_to_memory_length(k, context),
        self.rename_length_to_memory_length(v, context),
        memory_length,
        self.kv_dim,
        self.kv_dim,
        bias,
        context=context,
        **kwargs,
      )
    else:
      sequence_id = sequence_id_for_bias(context)
      o = local_attention_1d(
        q,
        k,
        v,
        context.length_dim,
        self.kv_dim,
        self.kv_dim,
        fully_autoregressive=context.model.fully_autoregressive,
        length_dim_num_splits=_length_num_splits(context),
        radius=self.radius,
        sequence_id=1 if sequence_id is None else sequence_id,
        write_priority=context.write_priority,
        read_priority=context.read_priority,
        attention_kwargs=kwargs,
      )
    if context.mode == "first_part":
      self._record_window(context, [k] if self.shared_kv else [k, v])
    output = params.compute_output(
      o, output_shape=self.expected_attention_output_shape(x, params)
    )
    return self.layer_output_from_attention_output(context, output, losses)

  def _record_window(self, context: Context, states) -> None:
    """States for decoding: slot w holds position p < initial_position,
    p >= initial_position - radius, p % radius == w.
    """
    mesh = context.mesh
    pos = mtf.range(mesh, context.length_dim, tf.int32)
    slot = mtf.range(mesh, self.window_dim, tf.int32)
    start = context.initial_position
    select = mtf.logical_and(
      mtf.equal(mtf.mod(pos, self.radius), slot),
      mtf.logical_and(
        mtf.less(pos, start), mtf.greater_equal(pos, start - self.radius)
      ),
    )
    recorded = []
    for s in states:
      shape = mtf.replace_dimensions(
        s.shape, context.length_dim, self.window_dim
      )
      recorded.append(mtf.einsum([s, mtf.cast(select, s.dtype)], shape))
    context.record_new_states(recorded)

  def _call_incremental(
    self, context: Context, x: mtf.Tensor, losses
  ) -> mtf.Tensor:
    params = self.make_params(context)
    q = params.compute_q(x)
    k, v = self._keys_and_values(params, x)
    position = context.get_position()
    slot = mtf.range(context.mesh, self.window_dim, tf.int32)
    write = mtf.equal(slot, mtf.mod(position, self.radius))
    k, v = self._write_kv_states(context, write, k, v)
    # Slot w holds position p - ((p - w) mod radius), visible if >= 0.
    slot_position = position - mtf.mod(
      position - slot + self.radius, self.radius
    )
    bias = to_bias(mtf.greater_equal(slot_position, 0), context)
    o = attention.attention(
      q,
      k,
      v,
      self.window_dim,
      self.kv_dim,
      self.kv_dim,
      bias,
      context=context,
      **self.attention_kwargs_from_context(context),
    )
    output = params.compute_output(
      o, output_shape=self.expected_attention_output_shape(x, params)
    )
    return self.layer_output_from_attention_output(context, output, losses)
