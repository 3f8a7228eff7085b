"""A GPT-style decoder written the way downstream mtf 0.1.21 programs are.

Downstream projects (GPT-Neo is the best known) build their models from the
low-level mtf API directly rather than from mesh_tensorflow.transformer's
layer stacks: variables made with mtf.get_variable and a VariableDType's three
dtypes, layer norm from reduce_mean / rsqrt, projections with
mtf.layers.dense(variable_dtype=...), attention through
transformer.attention.attention_params_simple with a causal bias built from
mtf.range / mtf.less / mtf.cast, local attention through
transformer.attention.local_attention_1d, incremental decoding through a
transformer.transformer.Context in "first_part" and "incremental" modes, and
a sampling loop on mtf.while_loop. This module does the same, with the
original package's public names only, so that one program runs unchanged on
this package and on mesh-tensorflow 0.1.21 (gpt_style_program.py).

`mtf` and `mtf_transformer` are passed in by the caller (the package under
test), never imported here.
"""

import re
from typing import Any, Dict, Optional

import tensorflow.compat.v1 as tf

# The model's sizes; vocab, heads and embd divide by the meshes' 4 devices.
PARAMS = {
  "n_vocab": 16,
  "n_ctx": 8,
  "n_embd": 8,
  "n_head": 4,
  "n_layer": 2,
  "attention_types": ["global", "local"],
  "local_attention_radius": 3,
  "batch_size": 4,
  "z_loss": 1e-4,
  "lr": 0.01,
  "gradient_clipping": 1.0,
  "weight_decay": 0.01,
}


class Dims:
  """The named dimensions of the model, as a GPT-style model_fn makes them."""

  def __init__(self, mtf, params: Dict[str, Any]):
    self.batch = mtf.Dimension("batch", params["batch_size"])
    self.sequence = mtf.Dimension("sequence", params["n_ctx"])
    self.memory_length = mtf.Dimension("memory_length", params["n_ctx"])
    self.embed_sequence = mtf.Dimension("embed_sequence", params["n_ctx"])
    self.embd = mtf.Dimension("embd", params["n_embd"])
    self.vocab = mtf.Dimension("vocab", params["n_vocab"])
    self.heads = mtf.Dimension("heads", params["n_head"])
    self.kv = mtf.Dimension(
      "features_per_head", params["n_embd"] // params["n_head"]
    )
    self.intermediate = mtf.Dimension(
      "intermediate_expanded", 4 * params["n_embd"]
    )


def _incremental(context) -> bool:
  return context is not None and context.mode == "incremental"


def variable(mtf, mesh, name, shape, variable_dtype, initializer):
  """mtf.get_variable with the three dtypes of a VariableDType."""
  return mtf.get_variable(
    mesh,
    name,
    shape,
    initializer=initializer,
    master_dtype=variable_dtype.master_dtype,
    slice_dtype=variable_dtype.slice_dtype,
    activation_dtype=variable_dtype.activation_dtype,
  )


def causal_bias(mtf, mesh, dims: Dims, variable_dtype):
  """-1e10 where a query (sequence) would see a later key (memory_length)."""
  query_pos = mtf.range(mesh, dims.sequence, tf.int32)
  key_pos = mtf.range(mesh, dims.memory_length, tf.int32)
  query_pos, key_pos = [
    mtf.broadcast(t, [dims.sequence, dims.memory_length])
    for t in (query_pos, key_pos)
  ]
  later = mtf.cast(
    mtf.less(query_pos, key_pos), variable_dtype.activation_dtype
  )
  return later * -1e10


def layer_norm(mtf, x, scope, variable_dtype, epsilon=1e-5):
  """Zero mean, unit variance over the last dim, then a learnt affine map."""
  axis = x.shape[-1]
  with tf.variable_scope(scope):
    gain = variable(
      mtf, x.mesh, "g", [axis], variable_dtype, tf.constant_initializer(1)
    )
    shift = variable(
      mtf, x.mesh, "b", [axis], variable_dtype, tf.constant_initializer(0)
    )
    x -= mtf.reduce_mean(x, reduced_dim=axis, name="norm_reduce_mean_u")
    var = mtf.reduce_mean(
      mtf.square(x), reduced_dim=axis, name="norm_reduce_mean_s"
    )
    return x * mtf.rsqrt(var + epsilon) * gain + shift


def linear(mtf, x, scope, new_dim, variable_dtype):
  """A biased projection of the last dim onto new_dim."""
  with tf.variable_scope("conv1d_main"):
    return mtf.layers.dense(
      x,
      new_dims=[new_dim],
      reduced_dims=[x.shape[-1]],
      name=scope,
      use_bias=True,
      kernel_initializer=tf.random_normal_initializer(stddev=0.02),
      variable_dtype=variable_dtype,
    )


def global_attention(mtf, mtf_transformer, q, k, v, dims, bias):
  """Attention of q over all of k and v (their sequence as memory_length)."""
  k = mtf.replace_dimensions(k, k.shape[1], dims.memory_length)
  v = mtf.replace_dimensions(v, v.shape[1], dims.memory_length)
  return mtf_transformer.attention.attention(
    q,
    k,
    v,
    memory_length_dim=dims.memory_length,
    key_dim=dims.kv,
    value_dim=dims.kv,
    bias=bias,
    dropout_rate=0,
  )


def attention_block(
  mtf,
  mtf_transformer,
  x,
  scope,
  attention_type,
  dims,
  params,
  bias,
  variable_dtype,
  context,
):
  """Multi-head self-attention, global (with bias) or local (radius)."""
  with tf.variable_scope(scope):
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
    if _incremental(context):
      # Write this step's key and value into the cached ones.
      one_hot = mtf.one_hot(
        context.position - 1, dims.sequence, dtype=variable_dtype.master_dtype
      )
      old_k, old_v = context.get_states(2)
      k = old_k * (1.0 - one_hot) + k * one_hot
      v = old_v * (1.0 - one_hot) + v * one_hot
    if context is not None:
      context.record_new_states([k, v])
    with tf.variable_scope("attention"):
      if attention_type == "local":
        if _incremental(context):
          q *= one_hot
        out = mtf_transformer.attention.local_attention_1d(
          q,
          k,
          v,
          length_dim=k.shape[1],
          key_dim=dims.kv,
          value_dim=dims.kv,
          radius=params["local_attention_radius"],
          length_dim_num_splits=1,
          fully_autoregressive=True,
          attention_kwargs={},
        )
        if _incremental(context):
          out = mtf.gather(out, context.position - 1, dims.sequence)
      else:
        if _incremental(context):
          bias = mtf.gather(bias, context.position - 1, dims.sequence)
          full_bias = mtf.broadcast(
            bias, [dims.batch, dims.heads, bias.shape[-1]]
          )
        else:
          full_bias = mtf.broadcast(
            bias, [dims.batch, dims.heads, bias.shape[-2], bias.shape[-1]]
          )
        out = global_attention(mtf, mtf_transformer, q, k, v, dims, full_bias)
    with tf.variable_scope("compute_output"):
      out = attention_params.compute_output(out, x.shape)
    with tf.variable_scope("compute_output_bias"):
      out_bias = variable(
        mtf,
        x.mesh,
        "o_b",
        [dims.embd],
        variable_dtype,
        tf.constant_initializer(0),
      )
      return out + out_bias


def mlp(mtf, x, scope, dims, variable_dtype):
  with tf.variable_scope(scope):
    hidden = mtf.gelu(linear(mtf, x, "c_fc", dims.intermediate, variable_dtype))
    return linear(mtf, hidden, "c_proj", x.shape[-1], variable_dtype)


def model(
  mtf,
  mtf_transformer,
  inputs,
  labels,
  dims,
  params,
  bias,
  variable_dtype,
  context=None,
):
  """Logits [batch, sequence, vocab] and, given labels, the mean loss.

  In incremental mode (a decoding step) `inputs` are the ids so far and the
  logits are the next token's, [batch, sequence:1, vocab].
  """
  mesh = inputs.mesh
  x = inputs
  if _incremental(context):
    x = mtf.gather(x, context.position - 1, dims.sequence)
    x = mtf.reshape(x, [dims.batch])
  wte = variable(
    mtf,
    mesh,
    "wte",
    mtf.Shape([dims.vocab, dims.embd]),
    variable_dtype,
    tf.random_normal_initializer(stddev=0.02),
  )
  wpe = variable(
    mtf,
    mesh,
    "wpe",
    mtf.Shape([dims.embed_sequence, dims.embd]),
    variable_dtype,
    tf.random_normal_initializer(stddev=0.01),
  )
  with tf.variable_scope("token_embd"):
    h = mtf.gather(wte, x, dims.vocab)
  with tf.variable_scope("pos_embd"):
    if _incremental(context):
      positions = context.position - 1
    else:
      positions = mtf.range(mesh, dims.sequence, tf.int64)
    h += mtf.gather(wpe, positions, wpe.shape[0])
  for layer, attention_type in enumerate(params["attention_types"]):
    with tf.variable_scope("h%d" % layer):
      normed = layer_norm(mtf, h, "norm_1", variable_dtype)
      h += attention_block(
        mtf,
        mtf_transformer,
        normed,
        "attn",
        attention_type,
        dims,
        params,
        bias,
        variable_dtype,
        context,
      )
      normed = layer_norm(mtf, h, "norm_2", variable_dtype)
      h += mlp(mtf, normed, "mlp", dims, variable_dtype)
  h = layer_norm(mtf, h, "ln_f", variable_dtype)
  if _incremental(context):
    seq_dim = mtf.Dimension("sequence", 1)
  else:
    seq_dim = dims.sequence
  with tf.variable_scope("wte_final_einsum"):
    logits = mtf.einsum(
      [h, wte], output_shape=[dims.batch, seq_dim, dims.vocab]
    )
  if labels is None:
    return logits, None, None
  logits = mtf.cast(logits, tf.float32)
  with tf.variable_scope("xentropy_final"):
    loss_batch = mtf.layers.softmax_cross_entropy_with_logits(
      logits=logits,
      targets=labels,
      vocab_dim=logits.shape[-1],
      z_loss=params["z_loss"],
    )
  with tf.variable_scope("reduce_mean_final"):
    loss = mtf.reduce_mean(loss_batch)
  loss = mtf.cast(loss, variable_dtype.slice_dtype)
  return logits, loss, loss_batch


def clip_by_global_norm(mtf, grads, clip_norm):
  norm = mtf.sqrt(
    mtf.add_n([mtf.reduce_sum(mtf.square(g)) for g in grads if g is not None])
  )
  multiplier = clip_norm / mtf.maximum(norm, clip_norm)
  return [None if g is None else g * multiplier for g in grads], norm


def make_adam_optimizer(mtf):
  """An Adam with decoupled weight decay on mtf.optimize.Optimizer."""

  class AdamWeightDecay(mtf.optimize.Optimizer):
    """Adam whose weight decay skips norm and bias variables."""

    def __init__(
      self,
      learning_rate,
      weight_decay_rate=0.0,
      beta_1=0.9,
      beta_2=0.999,
      epsilon=1e-6,
      exclude_from_weight_decay=None,
    ):
      self.learning_rate = learning_rate
      self.weight_decay_rate = weight_decay_rate
      self.beta_1 = beta_1
      self.beta_2 = beta_2
      self.epsilon = epsilon
      self.exclude_from_weight_decay = exclude_from_weight_decay or []

    def apply_grad(self, grad, var):
      if grad is None:
        return []
      grad = mtf.to_float(grad)
      first = mtf.get_variable(
        var.mesh,
        var.name + "/adam_m",
        var.shape,
        initializer=tf.zeros_initializer(),
        trainable=False,
      )
      second = mtf.get_variable(
        var.mesh,
        var.name + "/adam_v",
        var.shape,
        initializer=tf.zeros_initializer(),
        trainable=False,
      )
      next_first = self.beta_1 * first + (1.0 - self.beta_1) * grad
      next_second = self.beta_2 * second + (1.0 - self.beta_2) * mtf.square(
        grad
      )
      update = next_first / (mtf.sqrt(next_second) + self.epsilon)
      if self.weight_decay_rate and not any(
        re.search(pattern, var.name)
        for pattern in self.exclude_from_weight_decay
      ):
        update += mtf.to_float(var.value) * self.weight_decay_rate
      return [
        mtf.assign_sub(var, self.learning_rate * update),
        mtf.assign(first, next_first),
        mtf.assign(second, next_second),
      ]

  return AdamWeightDecay


def train_ops(
  mtf, mesh, loss, params, variable_dtype, optimizer_name, var_grads=None
):
  """The update ops of one step and the (clipped) gradients."""
  graph = mesh.graph
  if var_grads is None:
    var_grads = mtf.gradients(
      [loss], [v.outputs[0] for v in graph.trainable_variables]
    )
  var_grads = [mtf.cast(g, variable_dtype.slice_dtype) for g in var_grads]
  if optimizer_name == "adam":
    learning_rate = mtf.import_fully_replicated(
      mesh,
      tf.constant(params["lr"], dtype=variable_dtype.slice_dtype),
      mtf.Shape([]),
      name="learning_rate",
    )
    mtf.scalar_summary("lr", learning_rate)
    clip = mtf.constant(
      mesh, params["gradient_clipping"], dtype=variable_dtype.slice_dtype
    )
    var_grads, _ = clip_by_global_norm(mtf, var_grads, clip)
    optimizer = make_adam_optimizer(mtf)(
      learning_rate=learning_rate,
      weight_decay_rate=params["weight_decay"],
      exclude_from_weight_decay=["norm", "bias"],
    )
  else:
    optimizer = mtf.optimize.AdafactorOptimizer(
      learning_rate=params["lr"],
      decay_rate=None,
      beta1=0.0,
      epsilon1=1e-30,
      epsilon2=1e-3,
    )
  update_ops = optimizer.apply_grads(var_grads, graph.trainable_variables)
  return update_ops, var_grads


def sample_autoregressive(
  mtf,
  mtf_transformer,
  partial_sequences,
  dims,
  params,
  bias,
  variable_dtype,
  stop_at_token: Optional[int] = None,
  max_steps: Optional[int] = None,
  temperature: float = 0.0,
  remove_partial_sequences: bool = False,
  sampling_keep_top_k: int = -1,
  slow_sampling: bool = False,
):
  """Continues the nonzero prefixes one token at a time (a while loop).

  By default each step runs the model on one position with the keys and
  values cached in a Context; with slow_sampling every step runs the whole
  sequence without a Context (as GPT-style programs do for MoE models) and
  shifts the predictions one position right.

  Returns:
    the filled-in ids [batch, sequence]; with remove_partial_sequences they
    are shifted left by the length of each prefix.
  """
  inputs = partial_sequences
  mesh = inputs.mesh
  batch_dims = inputs.shape.dims[:-1]
  length_dim = inputs.shape.dims[-1]
  initial_position = mtf.reduce_sum(
    mtf.to_int32(mtf.not_equal(inputs, 0)), reduced_dim=length_dim
  )
  length_range = mtf.range(mesh, length_dim, tf.int32)
  priority = length_range * mtf.to_int32(
    mtf.greater(length_range, initial_position)
  )

  def make_context(mode, position, states, ids):
    return mtf_transformer.transformer.Context(
      model=None,
      mesh=mesh,
      batch_dims=batch_dims,
      length_dim=length_dim,
      variable_dtype=variable_dtype,
      mode=mode,
      position=position,
      position_is_default=True,
      states=states,
      new_states=[],
      initial_position=initial_position if mode == "first_part" else position,
      sequence_id=None,
      constant_states=[],
      write_priority=priority,
      read_priority=priority,
      inputs=ids,
    )

  initial_states = []
  if not slow_sampling:
    first_part = make_context("first_part", length_range, None, inputs)
    with tf.variable_scope("gpt2"):
      model(
        mtf,
        mtf_transformer,
        inputs,
        None,
        dims,
        params,
        bias,
        variable_dtype,
        first_part,
      )
    initial_states = first_part.new_states
  eos_before = None
  if stop_at_token is not None:
    eos_before = mtf.reduce_sum(
      mtf.to_int32(mtf.equal(partial_sequences, stop_at_token)),
      reduced_dim=length_dim,
    )

  def cond_fn(position, ids, *unused_states):
    done = mtf.greater_equal(position, length_dim.size)
    if max_steps:
      done = mtf.logical_or(
        done, mtf.greater_equal(position - initial_position, max_steps)
      )
    if stop_at_token is not None:
      eos_count = mtf.reduce_sum(
        mtf.to_int32(mtf.equal(ids, stop_at_token)), reduced_dim=length_dim
      )
      done = mtf.logical_or(done, mtf.greater(eos_count, eos_before))
    return mtf.logical_not(mtf.reduce_all(done))

  def body_fn(position, ids, *states):
    context = None
    if not slow_sampling:
      context = make_context("incremental", position, states, ids)
    with tf.variable_scope("gpt2", reuse=tf.AUTO_REUSE):
      logits, _, _ = model(
        mtf,
        mtf_transformer,
        ids,
        None,
        dims,
        params,
        bias,
        variable_dtype,
        context,
      )
    if sampling_keep_top_k != -1:
      kth = mtf.nth_largest_element(
        logits, n=sampling_keep_top_k, reduced_dim=dims.vocab
      )
      logits = mtf.where(
        mtf.less_equal(logits, kth), mtf.ones_like(logits) * -1e6, logits
      )
    next_ids = mtf.sample_with_temperature(logits, dims.vocab, temperature)
    if slow_sampling:
      next_ids = mtf.shift(next_ids, offset=1, dim=length_dim, wrap=False)
    else:
      next_ids = mtf.reshape(next_ids, batch_dims)
    one_hot = mtf.one_hot(position, length_dim, dtype=tf.int32)
    new_ids = (1 - one_hot) * ids + next_ids * one_hot
    return [position + 1, new_ids] + (context.new_states if context else [])

  outputs = mtf.while_loop(
    cond_fn, body_fn, [initial_position, inputs] + initial_states
  )[1]
  if remove_partial_sequences:
    prefix_length = mtf.reduce_sum(
      mtf.to_int32(mtf.not_equal(partial_sequences, 0)), reduced_dim=length_dim
    )
    outputs = mtf.dynamic_shift(outputs, -prefix_length, length_dim, wrap=False)
  return outputs
