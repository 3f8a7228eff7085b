"""ExpertsAttentionParams: attention projections computed by a MoE layer.

Instead of the dense kernels q and kv, a mixture-of-experts layer (MoE1D)
maps the antecedent to the projections. expert_computation chooses which:
  "qkv": one MoE call on the query antecedent gives q and the shared kv
    (variables `wi`, `q`, `kv` with an "experts" dim, plus the router);
  "q": q by experts (MoE variables `wi`, `wo`), kv by the plain kernel `kv`;
  "kv": kv by experts, q by the plain kernel `q`.
As in the original, q and kv both come from the query antecedent
(compute_q computes both; compute_kv returns that kv, whatever the memory),
and q is always scaled by d_kv**-0.5. compute_memory_kv gives the kv of a
memory itself, for the decoding caches. The output projection is always
the plain kernel `o`. The layer requires combine_dims=True and
shared_kv=True; the MoE output dim is named "d_model" with size heads*d_kv
and is split back into heads and d_kv.
"""

from __future__ import annotations

from typing import Optional

import tensorflow as tf

import mesh_tensorflow as mtf
from transformer._src.layers import moe_layers
from transformer._src.layers.attention_params import AttentionParams

__all__ = ["ExpertsAttentionParams"]

tf1 = tf.compat.v1

_EXPERT_COMPUTATIONS = ("qkv", "q", "kv")


def _combined(dims) -> mtf.Dimension:
  return mtf.Dimension(dims[0].name, mtf.Shape(dims).size)


class ExpertsAttentionParams(AttentionParams):
  """AttentionParams whose q and/or kv projections are MoE layers.

  ExpertsSelfAttention builds its projections with this class.

  Example (2 experts compute q and the shared kv; a switch router):
    >>> from transformer import transformer
    >>> from transformer.transformer_layers import ExpertsSelfAttention
    >>> stack = transformer.make_layer_stack(
    ...     [(ExpertsSelfAttention, {"num_experts": 2, "hidden_size": 4,
    ...                              "shared_kv": True, "num_heads": 2,
    ...                              "key_value_size": 4})],
    ...     num_layers=1)
    >>> lm = transformer.Unitransformer(
    ...     stack, d_model=8, input_vocab_size=16, output_vocab_size=16,
    ...     autoregressive=True, max_length=4, vocab_divisor=1)
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> ids = converter.convert_np_array_to_mtf_tensor(
    ...     [[3, 5, 7, 1]], ["batch", "length"])
    >>> logits, _ = lm.call_simple(ids, ids, compute_loss=False)
    >>> converter.convert_mtf_tensor_to_np_array(logits).shape
    (1, 4, 16)
    >>> prefix = "transformer/block_000/layer_000/ExpertsSelfAttention/"
    >>> for v in converter.graph.all_variables:  # the layer's variables
    ...   if v.name.startswith(prefix):
    ...     print(v.name[len(prefix):], v.shape)
    o Shape[heads=8, d_model=8]
    switch_gating/kernel Shape[d_model=8, expert_unsplit=2]
    wi/kernel Shape[experts=2, d_model=8, expert_hidden=4]
    q_wo/kernel Shape[experts=2, expert_hidden=4, d_model=8]
    k_wo/kernel Shape[experts=2, expert_hidden=4, d_model=8]
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
    context=None,
    experts_hparams=None,
    expert_computation: str = "qkv",
  ):
    """An AttentionParams whose projections a mixture of experts computes.

    Args:
      mesh: the Mesh the parameters live on.
      query_input_dim: the Dimension of the query inputs (e.g. d_model).
      memory_input_dim: the Dimension of the memory inputs.
      output_dim: the Dimension of the outputs.
      key_dim: the per-head key Dimension.
      value_dim: the per-head value Dimension.
      query_heads_dims: the list of query head Dimensions.
      memory_heads_dims: the list of memory (key/value) head Dimensions.
      variable_dtype: the mtf.VariableDType of the weights.
      shared_kv: keys and values share one projection.
      no_query: make no query projection.
      combine_dims: store each projection as one combined weight.
      ensemble_dim: an optional ensemble Dimension of the weights.
      keep_query_heads_dims: keep the query heads dims in combined weights.
      fold_scaling_into_initializer: fold 1/sqrt(key size) into the query
        initializer instead of scaling the logits.
      context: the layer's Context (the MoE reads mode, padding, losses).
      experts_hparams: HParams with moe_gating, num_experts, loss_coef,
        group_size, min_expert_capacity, capacity_factor_train/eval,
        switch_policy_train/eval, switch_dropout, switch_temperature,
        switch_jitter, ntlb_top_k, hidden_size, activation, z_loss.
      expert_computation: "qkv", "q" or "kv" (see the module docstring).

    Raises:
      ValueError: without context/experts_hparams, for an unknown
        expert_computation, or unless combine_dims and shared_kv.
      NotImplementedError: under the unit-scaling convention.
    """
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
      no_query=no_query,
      combine_dims=combine_dims,
      ensemble_dim=ensemble_dim,
      keep_query_heads_dims=keep_query_heads_dims,
      fold_scaling_into_initializer=fold_scaling_into_initializer,
      make_attention_vars=False,
    )
    if expert_computation not in _EXPERT_COMPUTATIONS:
      raise ValueError(
        "ExpertsAttentionParams: unknown expert_computation %r;"
        " expected one of %s" % (expert_computation, list(_EXPERT_COMPUTATIONS))
      )
    if not combine_dims:
      raise ValueError("ExpertsAttentionParams: combine_dims must be True")
    if not shared_kv:
      raise ValueError(
        "ExpertsAttentionParams: shared_kv must be True "
        "(set shared_kv=True on the experts attention layer)"
      )
    if context is None or experts_hparams is None:
      raise ValueError(
        "ExpertsAttentionParams needs context and experts_hparams"
      )
    if mtf.layers.unit_scaling_convention():
      raise NotImplementedError(
        "ExpertsAttentionParams does not support the unit-scaling convention"
      )
    self.context = context
    self.expert_computation = expert_computation
    self._kv = None

    ensemble = [] if ensemble_dim is None else [ensemble_dim]
    if expert_computation == "q":
      self.wkv = mtf.get_variable(
        mesh,
        "kv",
        mtf.Shape(ensemble + [memory_input_dim, _combined(self.k_dims)]),
        initializer=tf1.random_normal_initializer(
          stddev=memory_input_dim.size**-0.5
        ),
        dtype=variable_dtype,
      )
    elif expert_computation == "kv":
      self.wq = mtf.get_variable(
        mesh,
        "q",
        mtf.Shape(ensemble + [query_input_dim, _combined(self.q_dims)]),
        initializer=tf1.random_normal_initializer(
          stddev=query_input_dim.size**-0.5
        ),
        dtype=variable_dtype,
      )
    self.wo = mtf.get_variable(
      mesh,
      "o",
      mtf.Shape(ensemble + [_combined(self.o_dims), output_dim]),
      initializer=tf1.random_normal_initializer(
        stddev=mtf.Shape(self.o_dims).size ** -0.5
      ),
      dtype=variable_dtype,
    )

    # Named "d_model" (not "heads") so that layouts can split both the
    # experts' hidden dim and the heads.
    moe_output_dim = mtf.Dimension("d_model", _combined(self.q_dims).size)
    hp = experts_hparams
    get = lambda name, default: getattr(hp, name, default)
    self.moe_layer = moe_layers.MoE1D(
      moe_gating=get("moe_gating", "switch"),
      num_experts=get("num_experts", 16),
      loss_coef=get("loss_coef", 1e-2),
      group_size=get("group_size", 1024),
      min_expert_capacity=get("min_expert_capacity", 4),
      capacity_factor_train=get("capacity_factor_train", 1.25),
      capacity_factor_eval=get("capacity_factor_eval", 2.0),
      switch_policy_train=get("switch_policy_train", "input_jitter"),
      switch_policy_eval=get("switch_policy_eval", "input_jitter"),
      switch_dropout=get("switch_dropout", 0.1),
      switch_temperature=get("switch_temperature", 1.0),
      switch_jitter=get("switch_jitter", 1e-2),
      ntlb_top_k=get("ntlb_top_k", 4),
      hidden_size=get("hidden_size", 3072),
      output_dim=moe_output_dim,
      use_experts_attention=(expert_computation == "qkv"),
      activation=get("activation", "relu"),
      z_loss=get("z_loss", None),
    )

  def _moe(self, antecedent: mtf.Tensor):
    return self.moe_layer.call(self.context, antecedent)

  def compute_q(self, query_antecedent: mtf.Tensor) -> mtf.Tensor:
    """q [..., query heads..., d_kv], always scaled by d_kv**-0.5.

    The same call computes the shared keys/values from the query antecedent
    (by the experts or the plain kernel, per expert_computation); they are
    what compute_kv returns.
    """
    x = query_antecedent
    if self.expert_computation == "qkv":
      q, kv = self._moe(x)
    elif self.expert_computation == "q":
      q = self._moe(x)
      kv = self._project(x, self.wkv, self.memory_input_dim, self.k_dims, "kv")
    else:
      kv = self._moe(x)
      q = self._project(x, self.wq, self.query_input_dim, self.q_dims, "q")
    if q.shape.dims[-1] not in self.q_dims:
      q = mtf.replace_dimensions(q, q.shape.dims[-1], self.q_dims)
    if kv.shape.dims[-1] not in self.k_dims:
      kv = mtf.replace_dimensions(kv, kv.shape.dims[-1], self.k_dims)
    self._kv = kv
    return q * self.key_dim.size**-0.5

  def compute_kv(self, memory_antecedent: mtf.Tensor) -> mtf.Tensor:
    """The shared keys/values compute_q made from the query antecedent.

    As in the original, the memory antecedent is not used: the keys/values
    keep the query's length dim, so attention over memory_length gives each
    position its own value (in "incremental" mode the one position is the
    memory's new position, so decoding attends over the cached values).

    Args:
      memory_antecedent: ignored.

    Returns:
      The keys/values [batch..., length, memory heads..., d_kv].

    Raises:
      ValueError: before compute_q.
    """
    del memory_antecedent
    if self._kv is None:
      raise ValueError("ExpertsAttentionParams: compute_q comes first")
    return self._kv

  def compute_memory_kv(self, memory_antecedent: mtf.Tensor) -> mtf.Tensor:
    """Keys/values of the memory itself (the layers' decoding caches).

    The experts (or the plain kernel) run on the memory antecedent, with
    the encoder's padding mask when it is the encoder output.

    Args:
      memory_antecedent: the memory [batch..., memory_length, d_model].

    Returns:
      The keys/values [batch..., memory_length, memory heads..., d_kv].
    """
    m = memory_antecedent
    if self.expert_computation == "q":
      return self._project(
        m, self.wkv, self.memory_input_dim, self.k_dims, "kv"
      )
    use_enc = m is self.context.encoder_output
    kv = self.moe_layer.run_experts(self.context, m, use_enc_nonpadding=use_enc)
    if self.expert_computation == "qkv":
      kv = kv[1]
    return mtf.replace_dimensions(kv, kv.shape.dims[-1], self.k_dims)

  def compute_k(self, memory_antecedent: mtf.Tensor) -> mtf.Tensor:
    return self.compute_kv(memory_antecedent)

  def compute_v(self, memory_antecedent: mtf.Tensor) -> mtf.Tensor:
    return self.compute_kv(memory_antecedent)
