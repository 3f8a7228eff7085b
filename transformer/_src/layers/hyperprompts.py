# coding=utf-8
"""Task prompts prepended to attention keys and values (multi-task learning).

Two modes share one pipeline: learned prompt embeddings
`context.shared_params[tower]["prompts"]` [task_num, memory_length, d_model]
are layer-normalized and mapped by a two-layer ReLU network
(d_model -> prefix_hidden -> heads x d_kv) to per-task prompt keys and values;
each example then takes its task's prompts (task ids in
`context.cache["task-id"]` [batch, length], constant along length), and they
are prepended to the layer's keys and values along "memory_length".

- MTL-Prompt (`make_params_mtlprompt`): the projection network is a layer's
  own variables (scope "prompt"), shared by all tasks or one per task.
- HyperPrompt (`make_params_hyperprompt`): a hypernetwork generates the
  projection network per task and per layer from a task embedding
  concatenated with a layer-id embedding (all in `context.shared_params`).

The caller (the model's task code) provides the shared parameters and the
task ids; the layer id is parsed from the variable scope "<tower>/layer_<i>".
"""

from __future__ import annotations

from typing import Optional, Tuple

import tensorflow as tf

import mesh_tensorflow as mtf

tf1 = tf.compat.v1


def _dropout(x: mtf.Tensor, context, dropout_rate: float) -> mtf.Tensor:
  if context.train and dropout_rate:
    return mtf.dropout(x, context.train, keep_prob=1.0 - dropout_rate)
  return x


def _batch_task_id(context) -> mtf.Tensor:
  """context.cache["task-id"] [batch, length] -> [batch] (first position)."""
  task_id = context.cache["task-id"]
  return mtf.gather(task_id, 0, task_id.shape.dims[-1])


def _normalized_prompts(context, tower: str, dropout_rate: float) -> mtf.Tensor:
  prompts = context.shared_params[tower]["prompts"]
  prompts = mtf.layers.layer_norm(
    prompts, dim=context.model.model_dim, name="prompts_layernorm"
  )
  return _dropout(prompts, context, dropout_rate)


def _project_prompts(
  prompts: mtf.Tensor,
  w_up: mtf.Tensor,
  w_down: mtf.Tensor,
  task_id: mtf.Tensor,
  dims,
  context,
  dropout_rate: float,
) -> mtf.Tensor:
  """relu(prompts . w_up) . w_down for every task, gathered per example.

  Args:
    prompts: [task_num, memory_length, d_model].
    w_up: [(task_num,) d_model, prefix_hidden].
    w_down: [(task_num,) prefix_hidden, heads, d_kv].
    task_id: [batch] int32.
    dims: (task_num, prompt_length, prefix_hidden, heads, kv) Dimensions.
    context: the transformer Context.
    dropout_rate: dropout on the hidden layer (training only).

  Returns:
    [batch, memory_length, heads, d_kv].
  """
  task_num_dim, length_dim, hidden_dim, heads_dim, kv_dim = dims
  hidden = mtf.relu(
    mtf.matmul(
      prompts,
      w_up,
      output_shape=[task_num_dim, length_dim, hidden_dim],
      reduced_dims=[context.model.model_dim],
    )
  )
  hidden = _dropout(hidden, context, dropout_rate)
  per_task = mtf.matmul(
    hidden,
    w_down,
    output_shape=[task_num_dim, length_dim, heads_dim, kv_dim],
    reduced_dims=[hidden_dim],
  )
  batch_dim = task_id.shape.get_dim_by_name("batch")
  return mtf.gather(
    per_task,
    task_id,
    task_num_dim,
    output_shape=[batch_dim, length_dim, heads_dim, kv_dim],
  )


def _prompt_dims(
  task_num: int,
  prompt_length: int,
  prefix_hidden_dim: int,
  num_heads: int,
  kv_dim: mtf.Dimension,
):
  return (
    mtf.Dimension("task_num", task_num),
    mtf.Dimension("memory_length", prompt_length),
    mtf.Dimension("prefix_hidden", prefix_hidden_dim),
    mtf.Dimension("heads", num_heads),
    kv_dim,
  )


def make_params_mtlprompt(
  task_num: int,
  num_heads: int,
  prefix_hidden_dim: int,
  kv_dim: mtf.Dimension,
  context,
  mtlprompt_share: bool,
  dropout_rate: float,
  prompt_length: Optional[int] = None,
) -> Tuple[mtf.Tensor, mtf.Tensor]:
  """Prompt keys and values of MTL-Prompt mode.

  Variables (scope "prompt"): w_k_up, w_v_up [d_model, prefix_hidden] and
  w_k_down, w_v_down [prefix_hidden, heads, d_kv], with a leading task_num
  dimension unless mtlprompt_share (one network for all tasks).

  Args:
    task_num: number of tasks.
    num_heads: attention heads.
    prefix_hidden_dim: size of the projection's hidden layer.
    kv_dim: the d_kv Dimension.
    context: the transformer Context (task ids, shared prompts).
    mtlprompt_share: share the projection network among tasks.
    dropout_rate: dropout on prompts and hidden layers (training only).
    prompt_length: number of prompt positions.

  Returns:
    (keys, values), each [batch, memory_length=prompt_length, heads, d_kv].
  """
  dims = _prompt_dims(
    task_num, prompt_length, prefix_hidden_dim, num_heads, kv_dim
  )
  task_num_dim, _, hidden_dim, heads_dim, _ = dims
  up_dims = [context.model.model_dim, hidden_dim]
  down_dims = [hidden_dim, heads_dim, kv_dim]
  if not mtlprompt_share:
    up_dims = [task_num_dim] + up_dims
    down_dims = [task_num_dim] + down_dims
  with tf1.variable_scope("prompt"):
    weights = {
      name: mtf.get_variable(
        context.mesh, name, mtf.Shape(shape), dtype=context.variable_dtype
      )
      for name, shape in (
        ("w_k_up", up_dims),
        ("w_k_down", down_dims),
        ("w_v_up", up_dims),
        ("w_v_down", down_dims),
      )
    }
  tower = tf1.get_variable_scope().name.split("/")[0]
  prompts = _normalized_prompts(context, tower, dropout_rate)
  task_id = _batch_task_id(context)
  return tuple(
    _project_prompts(
      prompts,
      weights["w_%s_up" % kind],
      weights["w_%s_down" % kind],
      task_id,
      dims,
      context,
      dropout_rate,
    )
    for kind in ("k", "v")
  )


def _layer_id(scope_name: str, num_layers: int) -> int:
  """The i of a variable scope "<tower>/layer_<i>/..."."""
  parts = scope_name.split("/")
  try:
    layer_id = int(parts[1].split("_")[1])
  except (IndexError, ValueError):
    layer_id = -1
  if not 0 <= layer_id < num_layers:
    raise ValueError(
      "HyperPrompt: cannot parse a layer id below %d from "
      "variable scope %r" % (num_layers, scope_name)
    )
  return layer_id


def make_params_hyperprompt(
  task_num: int,
  num_heads: int,
  prefix_hidden_dim: int,
  kv_dim: mtf.Dimension,
  context,
  mtlprompt_share: bool,
  dropout_rate: float,
  prompt_length: int,
  scope: Optional[str] = None,
) -> Tuple[mtf.Tensor, mtf.Tensor]:
  """Prompt keys and values of HyperPrompt mode.

  context.shared_params[scope] holds: "prompts", "task_raw_embedding"
  [task_num, e], "layer_embedding" [layers, l], "task_projector_layer_one"
  [e + l, h], "task_projector_layer_two" [h, f] and "hypernet_w_{k,v}_up"
  [f, d_model, prefix_hidden], "hypernet_w_{k,v}_down"
  [f, prefix_hidden, heads, d_kv]. The layer-aware task embedding
  layer_norm(relu([task_emb, layer_emb] . one) . two) [task_num, f] times the
  hypernetworks gives each task's projection network of this layer.

  Args:
    task_num: number of tasks.
    num_heads: attention heads.
    prefix_hidden_dim: size of the projection's hidden layer.
    kv_dim: the d_kv Dimension.
    context: the transformer Context (task ids, shared parameters).
    mtlprompt_share: unused (every task's network is generated).
    dropout_rate: dropout on prompts and hidden layers (training only).
    prompt_length: number of prompt positions.
    scope: the tower ("encoder"/"decoder") whose shared parameters to use.

  Returns:
    (keys, values), each [batch, memory_length=prompt_length, heads, d_kv].
  """
  del mtlprompt_share
  dims = _prompt_dims(
    task_num, prompt_length, prefix_hidden_dim, num_heads, kv_dim
  )
  task_num_dim, _, hidden_dim, heads_dim, _ = dims
  prompts = _normalized_prompts(context, scope, dropout_rate)
  scope_name = tf1.get_variable_scope().name
  shared = context.shared_params[scope_name.split("/")[0]]
  task_embedding = shared["task_raw_embedding"]
  layer_embedding = shared["layer_embedding"]
  layer_one = shared["task_projector_layer_one"]
  layer_two = shared["task_projector_layer_two"]
  layers_dim, layer_embedding_dim = layer_embedding.shape.dims
  layer_ids = mtf.constant(
    context.mesh,
    _layer_id(scope_name, layers_dim.size),
    shape=mtf.Shape([task_num_dim]),
    dtype=tf.int32,
  )
  this_layer = mtf.gather(
    layer_embedding,
    layer_ids,
    layers_dim,
    output_shape=[task_num_dim, layer_embedding_dim],
  )
  task_and_layer = mtf.concat(
    [task_embedding, this_layer],
    concat_dim_name=task_embedding.shape.dims[1].name,
  )
  in_dim, task_hidden_dim = layer_one.shape.dims
  final_dim = layer_two.shape.dims[1]
  hidden = mtf.relu(
    mtf.matmul(
      task_and_layer,
      layer_one,
      output_shape=[task_num_dim, task_hidden_dim],
      reduced_dims=[in_dim],
    )
  )
  hidden = _dropout(hidden, context, dropout_rate)
  task_layer_embedding = mtf.layers.layer_norm(
    mtf.matmul(
      hidden,
      layer_two,
      output_shape=[task_num_dim, final_dim],
      reduced_dims=[task_hidden_dim],
    ),
    dim=final_dim,
    name="prompt_task_embed_layernorm",
  )

  def generate(name, shape):
    return mtf.matmul(
      task_layer_embedding,
      shared[name],
      output_shape=[task_num_dim] + shape,
      reduced_dims=[final_dim],
    )

  up_dims = [context.model.model_dim, hidden_dim]
  down_dims = [hidden_dim, heads_dim, kv_dim]
  task_id = _batch_task_id(context)
  return tuple(
    _project_prompts(
      prompts,
      generate("hypernet_w_%s_up" % kind, up_dims),
      generate("hypernet_w_%s_down" % kind, down_dims),
      task_id,
      dims,
      context,
      dropout_rate,
    )
    for kind in ("k", "v")
  )


def concat_hyper_prompts_kv(
  k: mtf.Tensor,
  v: mtf.Tensor,
  scope_encoder_or_decoder: str,
  use_hyperprompt: bool,
  memory_length: mtf.Dimension,
  task_num: int,
  num_heads: int,
  prefix_hidden_dim: int,
  kv_dim: mtf.Dimension,
  context,
  mtlprompt_share: bool,
  dropout_rate: float,
  prompt_length: int,
):
  """Prepends the task prompts to keys and values along "memory_length".

  Args:
    k: keys [batch, memory_length, heads, d_kv].
    v: values, same shape.
    scope_encoder_or_decoder: the tower whose shared parameters to use.
    use_hyperprompt: HyperPrompt mode if true, else MTL-Prompt.
    memory_length: the keys' memory_length Dimension.
    task_num: number of tasks.
    num_heads: attention heads.
    prefix_hidden_dim: size of the prompt projection's hidden layer.
    kv_dim: the d_kv Dimension.
    context: the transformer Context.
    mtlprompt_share: MTL-Prompt: one projection network for all tasks.
    dropout_rate: dropout in the prompt networks (training only).
    prompt_length: number of prompt positions.

  Returns:
    (k, v, memory_position, memory_length): the extended keys and values,
    int32 positions 0..n-1 and the extended memory_length Dimension.
  """
  if use_hyperprompt:
    prompt_k, prompt_v = make_params_hyperprompt(
      task_num,
      num_heads,
      prefix_hidden_dim,
      kv_dim,
      context,
      mtlprompt_share,
      dropout_rate,
      prompt_length=prompt_length,
      scope=scope_encoder_or_decoder,
    )
  else:
    prompt_k, prompt_v = make_params_mtlprompt(
      task_num,
      num_heads,
      prefix_hidden_dim,
      kv_dim,
      context,
      mtlprompt_share,
      dropout_rate,
      prompt_length=prompt_length,
    )

  def prepend(prompt, x):
    prompt_dims = {d.name: d for d in prompt.shape.dims}
    prompt = mtf.transpose(
      prompt, mtf.Shape([prompt_dims.get(d.name, d) for d in x.shape.dims])
    )
    return mtf.concat([mtf.cast(prompt, x.dtype), x], "memory_length")

  k = prepend(prompt_k, k)
  v = prepend(prompt_v, v)
  memory_length = mtf.Dimension(
    "memory_length", memory_length.size + prompt_length
  )
  memory_position = mtf.range(context.mesh, memory_length, tf.int32)
  return k, v, memory_position, memory_length
