"""The less common paths of GPT-style programs, in one model.

Rotary position embeddings, a ReZero residual (a scalar gain made with
dtype=VariableDType), scale norm, a gated MLP (mtf.split), causal linear
attention (cumsum), a mixture-of-experts feed-forward layer, a
gradient-checkpointed block (mtf.recompute_grad), an untied output
projection and an entmax loss whose gradient is given with
mtf.custom_gradient. Like gpt_style_model.py, written with the original's
public names only; `mtf` and `mtf_transformer` are passed in.
"""

import tensorflow.compat.v1 as tf

from tests.downstream import gpt_style_model as gm

VARIANT_PARAMS = dict(
  gm.PARAMS,
  attention_types=["global", "linear"],
  moe_layers=(1,),
  moe_params={
    "moe_num_experts": 4,
    "moe_hidden_size": 16,
    "moe_group_size": 8,
    "moe_dropout_rate": 0.0,
    # Deterministic second-expert choice (the default is random).
    "moe_second_policy_train": "all",
    "moe_second_policy_eval": "all",
    # 0.1.21 reads these; its set_default_moe_hparams does not set
    # them.
    "moe_word_embed_mode": None,
    "moe_z_loss": None,
  },
  # 0.1.21's top-2 gating in training needs `nonpadding`, which GPT-style
  # programs do not pass.
  moe_train=False,
  entmax_iterations=8,
)


def rotary_embedding(mtf, mesh, dims, variable_dtype):
  """cos and sin [sequence, features_per_head] of rotary embeddings."""
  dtype = variable_dtype.activation_dtype
  half = mtf.Dimension("half_features_per_head", dims.kv.size // 2)
  exponents = mtf.range(mesh, half, dtype) * 2 / dims.kv.size
  inverse_freqs = 1.0 / mtf.pow(
    mtf.constant(mesh, 10000, dtype=dtype), exponents
  )
  positions = mtf.range(mesh, dims.sequence, dtype)
  half_freqs = mtf.einsum([inverse_freqs, positions], [dims.sequence, half])
  freqs = mtf.concat((half_freqs, half_freqs), half.name)
  freqs = mtf.rename_dimension(freqs, half.name, dims.kv.name)
  return mtf.cos(freqs), mtf.sin(freqs)


def apply_rotary(mtf, x, cos, sin):
  kv = x.shape.get_dim_by_name("features_per_head")
  half = kv.size // 2
  first = mtf.slice(x, 0, half, kv.name)
  second = mtf.slice(x, half, half, kv.name)
  return x * cos + mtf.concat((-second, first), kv.name) * sin


def rezero(mtf, x, scope, dtype):
  with tf.variable_scope(scope):
    gain = mtf.get_variable(
      x.mesh, "g", [], initializer=tf.constant_initializer(0.5), dtype=dtype
    )
    return x * gain


def scale_norm(mtf, x, scope, variable_dtype, epsilon=1e-5):
  axis = x.shape[-1]
  with tf.variable_scope(scope):
    gain = gm.variable(
      mtf, x.mesh, "g", [], variable_dtype, tf.constant_initializer(1)
    )
    x -= mtf.reduce_mean(x, reduced_dim=axis)
    var = mtf.reduce_mean(mtf.square(x), reduced_dim=axis)
    return x * mtf.rsqrt(var + epsilon) * gain


def causal_linear_attention(mtf, q, k, v, epsilon=1e-6):
  batch, seq, heads, dim_out = v.shape.dims
  q = mtf.rename_dimension(q, "features_per_head", "features_per_head_in")
  k = mtf.rename_dimension(k, "features_per_head", "features_per_head_in")
  dim_in = k.shape[-1]
  q = mtf.softmax(q, dim_in)
  k = mtf.exp(k)
  k_sums = mtf.cumsum(k, seq) + epsilon
  inverse_norm = 1.0 / mtf.einsum([q, k_sums], output_shape=[batch, seq, heads])
  kv = mtf.einsum([k, v], output_shape=[batch, seq, heads, dim_in, dim_out])
  kv_sums = mtf.cumsum(kv, seq)
  return mtf.einsum(
    [q, kv_sums, inverse_norm], output_shape=[batch, seq, heads, dim_out]
  )


def variant_attention(
  mtf, mtf_transformer, x, kind, dims, bias, rotary, variable_dtype
):
  with tf.variable_scope("attn"):
    attention_params = mtf_transformer.attention.attention_params_simple(
      x.mesh,
      io_dim=dims.embd,
      kv_dim=dims.kv,
      heads_dim=dims.heads,
      variable_dtype=variable_dtype,
    )
    q = attention_params.compute_q(x)
    k = attention_params.compute_k(x)
    v = attention_params.compute_v(x)
    cos, sin = rotary
    q, k = apply_rotary(mtf, q, cos, sin), apply_rotary(mtf, k, cos, sin)
    if kind == "linear":
      out = causal_linear_attention(mtf, q, k, v)
    else:
      out = gm.global_attention(mtf, mtf_transformer, q, k, v, dims, bias)
    return attention_params.compute_output(out, x.shape)


def mlp_glu(mtf, x, scope, dims, variable_dtype):
  with tf.variable_scope(scope):
    doubled = mtf.Dimension("intermediate_expanded", 2 * dims.intermediate.size)
    hidden = gm.linear(mtf, x, "c_fc", doubled, variable_dtype)
    hidden, gate = mtf.split(hidden, hidden.shape[-1], 2)
    hidden *= mtf.swish(gate) + mtf.leaky_relu(gate, alpha=0.01)
    return gm.linear(mtf, hidden, "c_proj", x.shape[-1], variable_dtype)


def moe_mlp(
  mtf,
  mtf_transformer,
  x,
  params,
  variable_dtype,
  mesh_shape,
  layout,
  num_microbatches,
):
  hparams = mtf_transformer.moe.HParams()
  mtf_transformer.moe.set_default_moe_hparams(hparams)
  hparams.add_hparam("moe_min_expert_capacity", 1)
  hparams.add_hparam("moe_use_experts_attention", False)
  for key, value in params["moe_params"].items():
    hparams.add_hparam(key, value)
  return mtf_transformer.moe.transformer_moe_layer_v1(
    x,
    x.shape[-1],
    hparams,
    train=params["moe_train"],
    mesh_shape=mesh_shape,
    layout=layout,
    activation="relu",
    variable_dtype=variable_dtype,
    num_microbatches=num_microbatches,
  )


def entmax(mtf, x, dim, alpha=1.3, iterations=8):
  """alpha-entmax over dim (bisection), its gradient by custom_gradient."""

  def forward(x):
    x = x * (alpha - 1)
    top = mtf.reduce_max(x, reduced_dim=dim)
    tau_lo = top - 1.0
    tau_hi = top - (1.0 / dim.size) ** (alpha - 1)

    def probs(tau):
      return mtf.pow(mtf.relu(x - tau), 1 / (alpha - 1))

    f_lo = mtf.reduce_sum(probs(tau_lo), reduced_dim=dim) - 1
    step = tau_hi - tau_lo
    for _ in range(iterations):
      step /= 2
      tau_mid = tau_lo + step
      p_mid = probs(tau_mid)
      f_mid = mtf.reduce_sum(p_mid, reduced_dim=dim) - 1
      tau_lo = mtf.where(mtf.greater_equal(f_mid * f_lo, 0), tau_mid, tau_lo)
    return p_mid / mtf.reduce_sum(p_mid, reduced_dim=dim)

  def backward(
    explicit_inputs, all_inputs, forward_operations, outputs, output_grads
  ):
    del explicit_inputs, all_inputs, forward_operations
    (y,) = outputs
    (dy,) = output_grads
    gppr = mtf.where(
      mtf.greater(y, 0), mtf.pow(y, 2 - alpha), mtf.zeros_like(y)
    )
    dx = dy * gppr
    q = mtf.reduce_sum(dx, reduced_dim=dim) / mtf.reduce_sum(
      gppr, reduced_dim=dim
    )
    return (dx - q * gppr,)

  return mtf.custom_gradient(forward, backward, [x])


def variant_model(
  mtf,
  mtf_transformer,
  inputs,
  labels,
  dims,
  params,
  bias,
  variable_dtype,
  mesh_shape,
  layout,
  num_microbatches=1,
):
  """Logits, loss and per-token losses of the variants model."""
  mesh = inputs.mesh
  wte = gm.variable(
    mtf,
    mesh,
    "wte",
    mtf.Shape([dims.vocab, dims.embd]),
    variable_dtype,
    tf.random_normal_initializer(stddev=0.02),
  )
  with tf.variable_scope("token_embd"):
    h = mtf.gather(wte, inputs, dims.vocab)
  rotary = rotary_embedding(mtf, mesh, dims, variable_dtype)
  aux_losses = 0
  for layer, kind in enumerate(params["attention_types"]):
    with tf.variable_scope("h%d" % layer):

      def block(x, layer=layer, kind=kind):
        if layer == 0:
          a = variant_attention(
            mtf, mtf_transformer, x, kind, dims, bias, rotary, variable_dtype
          )
          x += rezero(mtf, a, "norm_rezero_1", dtype=variable_dtype)
          m = mlp_glu(mtf, x, "mlp", dims, variable_dtype)
          return x + rezero(mtf, m, "norm_rezero_2", dtype=variable_dtype)
        normed = scale_norm(mtf, x, "norm_1", variable_dtype)
        x += variant_attention(
          mtf,
          mtf_transformer,
          normed,
          kind,
          dims,
          bias,
          rotary,
          variable_dtype,
        )
        return x

      if layer == 0:
        h = mtf.recompute_grad(block, [h])
      else:
        h = block(h)
        normed = scale_norm(mtf, h, "norm_2", variable_dtype)
        m, aux_loss = moe_mlp(
          mtf,
          mtf_transformer,
          normed,
          params,
          variable_dtype,
          mesh_shape,
          layout,
          num_microbatches,
        )
        h += m
        aux_losses += mtf.cast(aux_loss, tf.float32)
  with tf.variable_scope("wte_final_linear"):
    logits = gm.linear(mtf, h, "linear_out", dims.vocab, variable_dtype)
  logits = mtf.cast(logits, tf.float32)
  with tf.variable_scope("xentropy_final"):
    targets = mtf.one_hot(labels, dims.vocab, dtype=logits.dtype)
    probs = entmax(
      mtf, logits, dims.vocab, iterations=params["entmax_iterations"]
    )
    loss_batch = mtf.negative(
      mtf.reduce_sum(mtf.log(probs + 1e-6) * targets, reduced_dim=dims.vocab)
    )
  loss = mtf.reduce_mean(loss_batch) + aux_losses
  loss /= num_microbatches
  return logits, mtf.cast(loss, variable_dtype.slice_dtype), loss_batch
