"""Small transformer layers and numpy references for the core-model tests.

The layers are deliberately simple (so numpy can mirror them exactly) but
exercise the protocols a real layer uses: variables under the layer scope,
incremental states (RunningMeanLayer) and constant states plus the encoder
output (EncDecGateLayer).
"""

import numpy as np
import tensorflow as tf

import mesh_tensorflow as mtf
from transformer import transformer

VOCAB, VOCAB_PADDED, VOCAB_DIVISOR = 13, 16, 8
BATCH, LENGTH, D_MODEL, D_HIDDEN = 4, 6, 8, 6


def _init(stddev=0.5):
  return tf.compat.v1.random_normal_initializer(stddev=stddev)


class DenseReluLayer(transformer.TransformerLayer):
  """y = relu(x wi) wo; variables wi [d_model, d_hidden], wo [d_hidden, d_model]."""

  def __init__(self, hidden_size=D_HIDDEN):
    self.hidden_size = hidden_size

  def call(self, context, x):
    d_model = context.model.model_dim
    hidden = mtf.Dimension("d_hidden", self.hidden_size)
    ens = context.model.ensemble_dims
    wi = mtf.get_variable(
      x.mesh,
      "wi",
      ens + [d_model, hidden],
      initializer=_init(),
      dtype=context.variable_dtype,
    )
    wo = mtf.get_variable(
      x.mesh,
      "wo",
      ens + [hidden, d_model],
      initializer=_init(),
      dtype=context.variable_dtype,
    )
    h = mtf.relu(mtf.einsum([x, wi], reduced_dims=[d_model]))
    return mtf.einsum([h, wo], reduced_dims=[hidden])


class RunningMeanLayer(transformer.TransformerLayer):
  """Causal: y[t] = mean(x[0..t]) * scale; one incremental state (the sum)."""

  def call(self, context, x):
    d_model = context.model.model_dim
    scale = mtf.get_variable(
      x.mesh,
      "scale",
      context.model.ensemble_dims + [d_model],
      initializer=_init(1.0),
      dtype=context.variable_dtype,
    )
    if context.mode == "incremental":
      (total,) = context.get_states(1)
      total += x
      context.record_new_states([total])
      count = mtf.cast(context.position + 1, x.dtype)
      return total * mtf.reciprocal(count) * scale
    length_dim = context.length_dim
    if context.mode == "first_part":
      before = mtf.cumsum(x, length_dim, exclusive=True)
      context.record_new_states(
        [mtf.gather(before, context.initial_position, length_dim)]
      )
    count = mtf.cast(mtf.range(x.mesh, length_dim, tf.int32) + 1, x.dtype)
    return mtf.cumsum(x, length_dim) * mtf.reciprocal(count) * scale


class EncDecGateLayer(transformer.TransformerLayer):
  """y = x * sigmoid(masked_mean(encoder_output) * gate); a constant state."""

  def call(self, context, x):
    d_model = context.model.model_dim
    gate = mtf.get_variable(
      x.mesh,
      "gate",
      [d_model],
      initializer=_init(1.0),
      dtype=context.variable_dtype,
    )
    if context.mode == "incremental":
      g = context.get_constant_state()
    else:
      memory = context.encoder_output
      memory_length = context.encoder_length_dim
      mask = mtf.cast(mtf.not_equal(context.encoder_sequence_id, 0), x.dtype)
      total = mtf.reduce_sum(memory * mask, reduced_dim=memory_length)
      count = mtf.reduce_sum(mask, reduced_dim=memory_length)
      g = mtf.sigmoid(total * mtf.reciprocal(count) * gate)
      if context.mode == "first_part":
        context.record_constant_state(g)
    return x * g


# ----------------------------------------------------------------------------
# numpy references.


def np_rms_norm(x, scale, epsilon=1e-6):
  return x / np.sqrt(np.mean(np.square(x), -1, keepdims=True) + epsilon) * scale


def np_layer(kind, params, prefix, h, enc=None, enc_mask=None):
  if kind == "DenseReluLayer":
    return np.maximum(h @ params[prefix + "/wi"], 0) @ params[prefix + "/wo"]
  if kind == "RunningMeanLayer":
    count = np.arange(1, h.shape[-2] + 1, dtype=np.float32)[:, None]
    return np.cumsum(h, axis=-2) / count * params[prefix + "/scale"]
  if kind == "EncDecGateLayer":
    mask = enc_mask[..., None].astype(np.float32)
    mean = (enc * mask).sum(-2) / mask.sum(-2)
    g = 1.0 / (1.0 + np.exp(-mean * params[prefix + "/gate"]))
    return h * g[..., None, :]
  raise ValueError(kind)


def np_tower(
  params,
  tower,
  ids,
  layers,
  *,
  embedding=None,
  positions=None,
  nonpadding=None,
  enc=None,
  enc_mask=None,
  norm_names=None,
):
  """Hidden states of a Unitransformer with the default LayerStack.

  layers: list of (layer class name, layer name) in stack order.
  norm_names: (per-layer norm scope, final norm scope).
  """
  layer_norm, final_norm = norm_names or ("rms_norm", "rms_norm")
  emb = params[embedding or tower + "/embedding"]
  x = emb[ids]
  if positions is not None:
    x = x + params[positions][: ids.shape[-1]]
  for kind, name in layers:
    h = np_rms_norm(x, params["%s/%s/%s/scale" % (tower, name, layer_norm)])
    if nonpadding is not None:
      h = h * nonpadding[..., None]
    x = x + np_layer(
      kind, params, "%s/%s/%s" % (tower, name, kind), h, enc, enc_mask
    )
  x = np_rms_norm(x, params["%s/%s/scale" % (tower, final_norm)])
  if nonpadding is not None:
    x = x * nonpadding[..., None]
  return x


def np_log_softmax(logits):
  m = logits.max(-1, keepdims=True)
  log_z = np.log(np.exp(logits - m).sum(-1, keepdims=True)) + m
  return logits - log_z, log_z[..., 0]


def np_loss(logits, targets, label_smoothing=0.0, z_loss=0.0, denominator=None):
  vocab = logits.shape[-1]
  off = label_smoothing / vocab
  on = 1.0 - label_smoothing + off
  soft = np.full(logits.shape, off, np.float64)
  idx = np.maximum(targets, 0)
  np.put_along_axis(soft, idx[..., None], on, axis=-1)
  log_probs, log_z = np_log_softmax(logits.astype(np.float64))
  ce = -(soft * log_probs).sum(-1) + z_loss * np.square(log_z)
  weights = (targets > 0).astype(np.float64)
  if denominator is None:
    denominator = targets.size
  return (ce * weights).sum() / denominator


# ----------------------------------------------------------------------------
# Building helpers.


def import_ids(mesh, array, dim_names):
  dims = [mtf.Dimension(n, s) for n, s in zip(dim_names, array.shape)]
  return mtf.import_fully_replicated(
    mesh, tf.constant(array, tf.int32), mtf.Shape(dims)
  )


def variables_by_name(mesh):
  """{full name: value Tensor} of every variable built so far, sorted."""
  graph = mesh.graph
  return {
    v.name: v.outputs[0]
    for v in sorted(graph.all_variables, key=lambda v: v.name)
  }


def random_ids(seed, shape, low=2, high=VOCAB):
  return (
    np.random.RandomState(seed).randint(low, high, size=shape).astype(np.int32)
  )
