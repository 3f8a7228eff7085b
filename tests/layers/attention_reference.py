"""Plain reference implementations for the attention layer tests.

The same reference code runs on numpy arrays (values) and on TF tensors under
tf.GradientTape (gradients): functions take a backend `xp` (NP or TF) giving
einsum, softmax, pad and where. Masks are built in numpy from their plain
definitions (which memory position each query may see).
"""

import numpy as np
import tensorflow as tf

NEG = -1e9


class NP:
  """numpy backend."""

  @staticmethod
  def einsum(eq, *xs):
    return np.einsum(eq, *xs)

  @staticmethod
  def softmax(x, extra_logit=None):
    m = np.max(x, axis=-1, keepdims=True)
    if extra_logit is not None:
      m = np.maximum(m, extra_logit)
    e = np.exp(x - m)
    total = e.sum(-1, keepdims=True)
    if extra_logit is not None:
      total = total + np.exp(extra_logit - m)
    return e / total

  @staticmethod
  def pad(x, axis, before, after):
    paddings = [(0, 0)] * x.ndim
    paddings[axis] = (before, after)
    return np.pad(x, paddings)

  @staticmethod
  def mean(x, axis):
    return np.mean(x, axis=axis)

  @staticmethod
  def reshape(x, shape):
    return np.reshape(x, shape)


class TF:
  """TensorFlow backend (for tf.GradientTape)."""

  @staticmethod
  def einsum(eq, *xs):
    return tf.einsum(eq, *xs)

  @staticmethod
  def softmax(x, extra_logit=None):
    if extra_logit is None:
      return tf.nn.softmax(x, axis=-1)
    m = tf.stop_gradient(
      tf.maximum(tf.reduce_max(x, -1, keepdims=True), extra_logit)
    )
    e = tf.exp(x - m)
    return e / (tf.reduce_sum(e, -1, keepdims=True) + tf.exp(extra_logit - m))

  @staticmethod
  def pad(x, axis, before, after):
    paddings = [[0, 0]] * len(x.shape)
    paddings[axis] = [before, after]
    return tf.pad(x, paddings)

  @staticmethod
  def mean(x, axis):
    return tf.reduce_mean(x, axis=axis)

  @staticmethod
  def reshape(x, shape):
    return tf.reshape(x, shape)


def bias_from_allowed(allowed):
  """0 where allowed, -1e9 elsewhere (float32)."""
  return np.where(allowed, 0.0, NEG).astype(np.float32)


def attend(xp, q, k, v, bias=None, extra_logit=None):
  """q [..., l, c], k/v [..., m, c], bias broadcastable to [..., l, m]."""
  logits = xp.einsum("...lc,...mc->...lm", q, k)
  if bias is not None:
    logits = logits + bias
  return xp.einsum("...lm,...mc->...lc", xp.softmax(logits, extra_logit), v)


def mha(xp, x, memory, w, bias=None, extra_logit=None):
  """Multihead attention; x [b, l, d], memory [b, m, d], w [4, h, d, c].

  bias broadcastable to [b, h, l, m]. Returns [b, l, d].
  """
  q = xp.einsum("bld,hdc->bhlc", x, w[0])
  k = xp.einsum("bmd,hdc->bhmc", memory, w[1])
  v = xp.einsum("bmd,hdc->bhmc", memory, w[2])
  o = attend(xp, q, k, v, bias, extra_logit)
  return xp.einsum("bhlc,hdc->bld", o, w[3])


def padded_local_attention(xp, x, w, allowed, pad_before, pad_after):
  """Attention over the zero-padded sequence of keys/values of x.

  x [b, l, d]; the memory is k/v of x padded with pad_before/pad_after zero
  positions (zero keys: logit 0; zero values); allowed [l, pad_before + l +
  pad_after] says which memory positions each query sees.
  """
  q = xp.einsum("bld,hdc->bhlc", x, w[0])
  k = xp.pad(xp.einsum("bld,hdc->bhlc", x, w[1]), 2, pad_before, pad_after)
  v = xp.pad(xp.einsum("bld,hdc->bhlc", x, w[2]), 2, pad_before, pad_after)
  o = attend(xp, q, k, v, bias_from_allowed(allowed))
  return xp.einsum("bhlc,hdc->bld", o, w[3])


def tape_gradients(fn, inputs, weights):
  """d(sum(fn(*inputs) * weights)) / d inputs via tf.GradientTape."""
  tensors = [tf.constant(a) for a in inputs]
  with tf.GradientTape() as tape:
    for t in tensors:
      tape.watch(t)
    loss = tf.reduce_sum(fn(*tensors) * weights)
  return [g.numpy() for g in tape.gradient(loss, tensors)]
