"""The projection variables of an attention layer (transformer.attention).

`AttentionParams` creates the q, k, v (or shared kv) and o kernels of one
attention layer and applies them (`compute_q`, `compute_k`, `compute_v`,
`compute_kv`, `compute_output`); `attention_params_simple` builds one for
plain multi-head attention. The attention math that runs between the
projections is in attention_core.py; the layers that own these parameters
(self_attention.py, ...) choose their dims and initializers.
"""

from __future__ import annotations

from typing import List, Optional

import tensorflow as tf

import mesh_tensorflow as mtf
from transformer._src.layers.attention_core import us_einsum

tf1 = tf.compat.v1

__all__ = [
  "AttentionParams",
  "attention_params_simple",
]


def _combined_dim(dims: List[mtf.Dimension]) -> mtf.Dimension:
  """One dimension named like dims[0] whose size is the product of dims."""
  return mtf.Dimension(dims[0].name, mtf.Shape(dims).size)


class AttentionParams:
  """The projection variables of an attention layer.

  Variables (in the current variable scope): `q` (unless no_query), `k` and
  `v` (or one `kv` when shared_kv) and `o`. With combine_dims the heads and
  channel dims of each kernel are merged into one dimension named like its
  first dim (q/k/v [d_model, heads*d_kv] named "heads", o [heads*d_kv,
  d_model]; [d_model, d_kv] for a single head). An ensemble_dim is prepended
  to every variable. Initializers (normal): q stddev d_model^-0.5 *
  d_kv^-0.5 (the logit scaling folded in; d_model^-0.5 without folding, the
  scaling is then applied by compute_q), k and v d_model^-0.5, o
  (query heads * d_kv)^-0.5; stddev 1 under the unit-scaling convention.

  keep_query_heads_dims: compute_output keeps the query heads dims (no sum
  over heads); the caller passes an output_shape that contains them.

  Example:
    >>> mesh = mtf.Mesh(mtf.Graph(), "mesh")
    >>> d_model, d_kv = mtf.Dimension("d_model", 8), mtf.Dimension("d_kv", 4)
    >>> heads = mtf.Dimension("heads", 2)
    >>> params = AttentionParams(mesh, d_model, d_model, d_model, d_kv, d_kv,
    ...                          [heads], [heads], mtf.VariableDType())
    >>> for v in mesh.graph.all_variables:
    ...   print(v.name, v.shape)
    q Shape[d_model=8, heads=8]
    k Shape[d_model=8, heads=8]
    v Shape[d_model=8, heads=8]
    o Shape[heads=8, d_model=8]
  """

  def __init__(
    self,
    mesh: mtf.Mesh,
    query_input_dim: mtf.Dimension,
    memory_input_dim: mtf.Dimension,
    output_dim: mtf.Dimension,
    key_dim: mtf.Dimension,
    value_dim: mtf.Dimension,
    query_heads_dims,
    memory_heads_dims,
    variable_dtype: mtf.VariableDType,
    shared_kv: bool = False,
    no_query: bool = False,
    combine_dims: bool = True,
    ensemble_dim: Optional[mtf.Dimension] = None,
    keep_query_heads_dims: bool = False,
    fold_scaling_into_initializer: bool = True,
    make_attention_vars: bool = True,
  ):
    """Creates the projections' variables (unless make_attention_vars is False).

    Args:
      mesh: the mtf.Mesh.
      query_input_dim: the model Dimension of the query input (d_model).
      memory_input_dim: the model Dimension of the memory input (d_model).
      output_dim: the model Dimension of the output.
      key_dim: the per-head key channels Dimension (d_k).
      value_dim: the per-head value channels Dimension (d_v).
      query_heads_dims: the list of query heads Dimensions.
      memory_heads_dims: the list of key/value heads Dimensions (the query
        heads dims, or fewer heads that groups of query heads share).
      variable_dtype: the mtf.VariableDType of the variables q, k, v, o.
      shared_kv: use one projection for keys and values (no variable v).
      no_query: make no query projection (q is not used).
      combine_dims: compute the projections with the heads and channel dims
        combined (same results).
      ensemble_dim: an ensemble Dimension (one set of variables per member) or
        None.
      keep_query_heads_dims: keep the query heads dims in compute_output's
        result.
      fold_scaling_into_initializer: fold d_k**-0.5 into q's initializer (else
        compute_q scales).
      make_attention_vars: create the variables now (False: the caller sets
        them).

    Raises:
      ValueError: if shared_kv with key_dim != value_dim, or a memory heads dim
        is not a query heads dim.
    """
    self.mesh = mesh
    self.query_input_dim = query_input_dim
    self.memory_input_dim = memory_input_dim
    self.output_dim = output_dim
    self.key_dim = key_dim
    self.value_dim = value_dim
    self.query_heads_dims = list(query_heads_dims or [])
    self.memory_heads_dims = list(memory_heads_dims or [])
    self.variable_dtype = variable_dtype
    self.shared_kv = shared_kv
    self.no_query = no_query
    self.combine_dims = combine_dims
    self.ensemble_dim = ensemble_dim
    self.keep_query_heads_dims = keep_query_heads_dims
    self.fold_scaling_into_initializer = fold_scaling_into_initializer
    self.make_attention_vars = make_attention_vars
    if shared_kv and key_dim != value_dim:
      raise ValueError(
        "AttentionParams: shared_kv needs key_dim == value_dim, "
        "got %s and %s" % (key_dim, value_dim)
      )
    for d in self.memory_heads_dims:
      if d not in self.query_heads_dims:
        raise ValueError(
          "AttentionParams: memory heads dimension %s must also be a query "
          "heads dimension (query heads %s)"
          % (d, mtf.Shape(self.query_heads_dims).to_string)
        )
    self.wq = self.wk = self.wv = self.wkv = self.wo = None
    if make_attention_vars:
      self.init_weights()

  def _initializers(self):
    if mtf.layers.unit_scaling_convention():
      unit = tf1.random_normal_initializer(stddev=1.0)
      return unit, unit, unit
    q_stddev = self.query_input_dim.size**-0.5
    if self.fold_scaling_into_initializer:
      q_stddev *= self.key_dim.size**-0.5
    kv_stddev = self.memory_input_dim.size**-0.5
    o_stddev = mtf.Shape(self.query_heads_dims + [self.value_dim]).size ** -0.5
    return (
      tf1.random_normal_initializer(stddev=q_stddev),
      tf1.random_normal_initializer(stddev=kv_stddev),
      tf1.random_normal_initializer(stddev=o_stddev),
    )

  def _kernel_shapes(self):
    if self.combine_dims:
      q_shape = [self.query_input_dim, _combined_dim(self.q_dims)]
      k_shape = [self.memory_input_dim, _combined_dim(self.k_dims)]
      v_shape = [self.memory_input_dim, _combined_dim(self.v_dims)]
      o_shape = [_combined_dim(self.o_dims), self.output_dim]
    else:
      q_shape = [self.query_input_dim] + self.q_dims
      k_shape = [self.memory_input_dim] + self.k_dims
      v_shape = [self.memory_input_dim] + self.v_dims
      o_shape = self.o_dims + [self.output_dim]
    if self.ensemble_dim is not None:
      q_shape, k_shape, v_shape, o_shape = (
        [self.ensemble_dim] + s for s in (q_shape, k_shape, v_shape, o_shape)
      )
    return (
      mtf.Shape(q_shape),
      mtf.Shape(k_shape),
      mtf.Shape(v_shape),
      mtf.Shape(o_shape),
    )

  def init_weights(self) -> None:
    """Creates (or reuses) the variables q, k, v (or kv) and o."""
    q_init, kv_init, o_init = self._initializers()
    q_shape, k_shape, v_shape, o_shape = self._kernel_shapes()
    dtype = self.variable_dtype
    if not self.no_query:
      self.wq = mtf.get_variable(
        self.mesh, "q", q_shape, initializer=q_init, dtype=dtype
      )
    if self.shared_kv:
      self.wkv = mtf.get_variable(
        self.mesh, "kv", k_shape, initializer=kv_init, dtype=dtype
      )
    else:
      self.wk = mtf.get_variable(
        self.mesh, "k", k_shape, initializer=kv_init, dtype=dtype
      )
      self.wv = mtf.get_variable(
        self.mesh, "v", v_shape, initializer=kv_init, dtype=dtype
      )
    self.wo = mtf.get_variable(
      self.mesh, "o", o_shape, initializer=o_init, dtype=dtype
    )

  def _project(
    self,
    x: mtf.Tensor,
    w: Optional[mtf.Tensor],
    input_dim: mtf.Dimension,
    dims: List[mtf.Dimension],
    what: str,
  ) -> mtf.Tensor:
    if w is None:
      raise ValueError(
        "AttentionParams: no %s weights (make_attention_vars, "
        "no_query or shared_kv exclude them)" % what
      )
    if input_dim not in x.shape.dims:
      raise ValueError(
        "AttentionParams.compute_%s: input %s has no dimension "
        "%s" % (what, x.shape.to_string, input_dim)
      )
    ret = us_einsum([x, w], reduced_dims=[input_dim])
    if self.combine_dims:
      ret = mtf.replace_dimensions(ret, ret.shape.dims[-1], dims)
    return ret

  def compute_q(self, query_antecedent: mtf.Tensor) -> mtf.Tensor:
    """[..., query_input_dim] -> [..., query heads..., key_dim].

    Args:
      query_antecedent: the query input [batch..., length, d_model].

    Returns:
      The queries [batch..., length, query heads..., d_k].
    """
    ret = self._project(
      query_antecedent, self.wq, self.query_input_dim, self.q_dims, "q"
    )
    if not self.fold_scaling_into_initializer:
      ret *= self.key_dim.size**-0.5
    return ret

  def compute_kv(self, memory_antecedent: mtf.Tensor) -> mtf.Tensor:
    """Shared keys/values: [..., memory_input_dim] -> [..., heads..., key].

    Args:
      memory_antecedent: the memory input [batch..., memory_length, d_model].

    Returns:
      The shared keys/values [batch..., memory_length, memory heads..., d_k].

    Raises:
      ValueError: unless shared_kv.
    """
    if not self.shared_kv:
      raise ValueError("AttentionParams.compute_kv needs shared_kv=True")
    return self._project(
      memory_antecedent, self.wkv, self.memory_input_dim, self.k_dims, "kv"
    )

  def compute_k(self, memory_antecedent: mtf.Tensor) -> mtf.Tensor:
    """[..., memory_input_dim] -> [..., memory heads..., key_dim].

    Args:
      memory_antecedent: the memory input [batch..., memory_length, d_model].

    Returns:
      The keys [batch..., memory_length, memory heads..., d_k].

    Raises:
      ValueError: with shared_kv (use compute_kv).
    """
    if self.shared_kv:
      raise ValueError(
        "AttentionParams.compute_k: use compute_kv with shared_kv=True"
      )
    return self._project(
      memory_antecedent, self.wk, self.memory_input_dim, self.k_dims, "k"
    )

  def compute_v(self, memory_antecedent: mtf.Tensor) -> mtf.Tensor:
    """[..., memory_input_dim] -> [..., memory heads..., value_dim].

    Args:
      memory_antecedent: the memory input [batch..., memory_length, d_model].

    Returns:
      The values [batch..., memory_length, memory heads..., d_v].

    Raises:
      ValueError: with shared_kv (use compute_kv).
    """
    if self.shared_kv:
      raise ValueError(
        "AttentionParams.compute_v: use compute_kv with shared_kv=True"
      )
    return self._project(
      memory_antecedent, self.wv, self.memory_input_dim, self.v_dims, "v"
    )

  def compute_output(self, o: mtf.Tensor, output_shape=None) -> mtf.Tensor:
    """[..., query heads..., value_dim] -> output_shape (default: the heads
    and value dims replaced by output_dim).

    Args:
      o: the attention output [batch..., length, heads..., d_v].
      output_shape: the Shape of the result (default: o's dims with the heads
        and d_v replaced by the output dim).

    Returns:
      The output, of `output_shape`.

    Raises:
      ValueError: if the variables were not made (make_attention_vars False) and
        o was not set.
    """
    if self.wo is None:
      raise ValueError(
        "AttentionParams: no o weights (make_attention_vars was False)"
      )
    wo = self.wo
    if self.combine_dims:
      wo = mtf.replace_dimensions(wo, wo.shape.dims[-2], self.o_dims)
    if output_shape is None:
      output_shape = o.shape - self.o_dims + [self.output_dim]
    return us_einsum([o, wo], mtf.convert_to_shape(output_shape))

  @property
  def q_dims(self) -> List[mtf.Dimension]:
    """Dims of q's variable: [ensemble?, d_model, query heads..., d_k]."""
    return self.query_heads_dims + [self.key_dim]

  @property
  def k_dims(self) -> List[mtf.Dimension]:
    """Dims of k's variable: [ensemble?, d_model, memory heads..., d_k]."""
    return self.memory_heads_dims + [self.key_dim]

  @property
  def v_dims(self) -> List[mtf.Dimension]:
    """Dims of v's variable: [ensemble?, d_model, memory heads..., d_v]."""
    return self.memory_heads_dims + [self.value_dim]

  @property
  def o_dims(self) -> List[mtf.Dimension]:
    """Dims of o's variable: [ensemble?, query heads..., d_v, d_output]."""
    return self.query_heads_dims + [self.value_dim]


def attention_params_simple(
  mesh: mtf.Mesh,
  io_dim: mtf.Dimension,
  kv_dim: mtf.Dimension,
  heads_dim: mtf.Dimension,
  variable_dtype: mtf.VariableDType,
) -> AttentionParams:
  """AttentionParams for plain multi-head attention (io_dim in and out).

  Example:
    >>> mesh = mtf.Mesh(mtf.Graph(), "mesh")
    >>> d_model, d_kv = mtf.Dimension("d_model", 8), mtf.Dimension("d_kv", 4)
    >>> params = attention_params_simple(
    ...     mesh, d_model, d_kv, mtf.Dimension("heads", 2), mtf.VariableDType())
    >>> params.query_heads_dims == params.memory_heads_dims
    True
    >>> [v.name for v in mesh.graph.all_variables]
    ['q', 'k', 'v', 'o']

  Args:
    mesh: the mtf.Mesh.
    io_dim: the model Dimension of input and output (d_model).
    kv_dim: the per-head key/value channels Dimension.
    heads_dim: the heads Dimension.
    variable_dtype: the mtf.VariableDType.

  Returns:
    An AttentionParams with one heads dim, shared by queries and memory.
  """
  return AttentionParams(
    mesh,
    query_input_dim=io_dim,
    memory_input_dim=io_dim,
    output_dim=io_dim,
    key_dim=kv_dim,
    value_dim=kv_dim,
    query_heads_dims=[heads_dim],
    memory_heads_dims=[heads_dim],
    variable_dtype=variable_dtype,
  )
