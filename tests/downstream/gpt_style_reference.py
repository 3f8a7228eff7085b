"""The GPT-style model of gpt_style_model.py in plain numpy.

Same weights (gpt_style_program.initial_value), same maths: layer norm,
attention without query scaling (global: causal; local: each position sees
itself and the `radius - 1` positions before it), a tanh-approximated GELU MLP,
logits tied to the token embedding and a softmax cross-entropy with z-loss.
"""

import json
from typing import Dict, List, Tuple

import numpy as np

from tests.downstream import gpt_style_model as gm
from tests.downstream import gpt_style_program as gp


def weights(variables_json: str) -> Dict[str, np.ndarray]:
  """Every trainable variable's initial value, by name."""
  names_shapes: List[Tuple[str, List[int]]] = json.loads(variables_json)
  return {
    name: gp.initial_value(name, shape)
    for name, shape in names_shapes
    if not name.endswith(("/adam_m", "/adam_v"))
  }


def _layer_norm(x, gain, shift, epsilon=1e-5):
  x = x - x.mean(-1, keepdims=True)
  return x / np.sqrt((x * x).mean(-1, keepdims=True) + epsilon) * gain + shift


def _gelu(x):
  return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def _softmax(x):
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _attention(w, prefix, x, attention_type, params):
  batch, length, _ = x.shape
  heads = params["n_head"]

  def split_heads(name):
    return (x @ w[prefix + name]).reshape(batch, length, heads, -1)

  q, k, v = split_heads("q"), split_heads("k"), split_heads("v")
  logits = np.einsum("bshk,bmhk->bhsm", q, k)
  query = np.arange(length)[:, None]
  key = np.arange(length)[None, :]
  visible = key <= query
  if attention_type == "local":
    visible &= key > query - params["local_attention_radius"]
  logits = np.where(visible, logits, -1e10)
  out = np.einsum("bhsm,bmhk->bshk", _softmax(logits), v)
  out = out.reshape(batch, length, -1) @ w[prefix + "o"]
  return out + w[prefix + "compute_output_bias/o_b"]


def logits(
  w: Dict[str, np.ndarray], ids: np.ndarray, params=None
) -> np.ndarray:
  """Logits [batch, length, vocab] of the model on `ids`, in float64."""
  params = params or gm.PARAMS
  w = {k: v.astype(np.float64) for k, v in w.items()}
  h = w["gpt2/wte"][ids] + w["gpt2/wpe"][np.arange(ids.shape[1])]
  for layer, attention_type in enumerate(params["attention_types"]):
    p = "gpt2/h%d/" % layer
    normed = _layer_norm(h, w[p + "norm_1/g"], w[p + "norm_1/b"])
    h = h + _attention(w, p + "attn/", normed, attention_type, params)
    normed = _layer_norm(h, w[p + "norm_2/g"], w[p + "norm_2/b"])
    m = p + "mlp/conv1d_main/"
    hidden = _gelu(normed @ w[m + "c_fc/kernel"] + w[m + "c_fc/bias"])
    h = h + hidden @ w[m + "c_proj/kernel"] + w[m + "c_proj/bias"]
  h = _layer_norm(h, w["gpt2/ln_f/g"], w["gpt2/ln_f/b"])
  return h @ w["gpt2/wte"].T


def token_losses(logits_: np.ndarray, labels: np.ndarray, z_loss: float):
  """Softmax cross-entropy plus z_loss * logsumexp**2, per token."""
  top = logits_.max(-1, keepdims=True)
  log_z = np.log(np.exp(logits_ - top).sum(-1)) + top[..., 0]
  picked = np.take_along_axis(logits_, labels[..., None], -1)[..., 0]
  return log_z - picked + z_loss * log_z**2
