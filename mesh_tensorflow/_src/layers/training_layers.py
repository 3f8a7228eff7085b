"""Layers that act in training: noise and custom gradients.

Noise: `multiplicative_jitter` (random factors near 1, for bfloat16
robustness) and `annealed_dropout` (a dropout rate falling to 0 over the
global steps). Custom gradients: `reversible_half_residual_and_swap` (a
reversible residual whose backward pass recomputes instead of storing
activations) and `clip_activation_gradient` with its summary
`summary_for_clip_activation_gradient`.
"""

from __future__ import annotations

from typing import Callable, Optional

import gin
import tensorflow as tf

from mesh_tensorflow._src.graph import Tensor
from mesh_tensorflow._src.layers.core import as_dim_list
from mesh_tensorflow._src.ops import binary
from mesh_tensorflow._src.ops import broadcast_binary
from mesh_tensorflow._src.ops import custom_gradient as custom_gradient_lib
from mesh_tensorflow._src.ops import elementwise
from mesh_tensorflow._src.ops import gradients as gradients_lib
from mesh_tensorflow._src.ops import io
from mesh_tensorflow._src.ops import random as random_lib
from mesh_tensorflow._src.ops import reduce as reduce_lib
from mesh_tensorflow._src.ops import summary as summary_lib
from mesh_tensorflow._src.shapes import Shape
from mesh_tensorflow._src.shapes import convert_to_shape
from mesh_tensorflow._src.variables import Variable

tf1 = tf.compat.v1

_GIN_MODULE = "mesh_tensorflow.layers"


def multiplicative_jitter(x: Tensor, epsilon: float = 1e-2) -> Tensor:
  """x times uniform noise in [1 - epsilon, 1 + epsilon) (bfloat16 robustness).

  Example:
    Each value is multiplied by a random factor in [1 - epsilon, 1 + epsilon]:

    >>> converter = mtf.test_utils.NumpyConverter()
    >>> logits = mtf.ones(converter.mesh, "batch:2;vocab:4")
    >>> jittered = converter.convert_mtf_tensor_to_np_array(
    ...     multiplicative_jitter(logits, epsilon=1e-2))
    >>> bool(np.all(np.abs(jittered - 1.0) <= 1e-2))
    True
    >>> multiplicative_jitter(logits, epsilon=0) is logits
    True

  Args:
    x: a floating mtf Tensor.
    epsilon: the noise amplitude; 0 returns x unchanged.

  Returns:
    an mtf Tensor like x.
  """
  if epsilon == 0:
    return x
  return x * random_lib.random_uniform(
    x.mesh, x.shape, minval=1.0 - epsilon, maxval=1.0 + epsilon, dtype=x.dtype
  )


def _capture_forward(graph, fn, explicit_inputs):
  """Runs fn; (outputs, forward ops without Variables, implicit inputs).

  Variables created inside fn stay ordinary graph operations; their values
  become implicit inputs of the custom-gradient operation, so gradients
  reach them through grad_fn.
  """
  outputs, ops = graph.capture_operations(lambda: fn(*explicit_inputs))
  forward_ops = [op for op in ops if not isinstance(op, Variable)]
  produced = set()
  for op in forward_ops:
    produced.update(op.outputs)
  explicit = set(explicit_inputs)
  implicit = []
  for op in forward_ops:
    for t in op.inputs:
      if (
        t.dtype.is_floating
        and t not in produced
        and t not in explicit
        and t not in implicit
      ):
        implicit.append(t)
  return outputs, forward_ops, implicit


def _add_optional(a: Optional[Tensor], b: Optional[Tensor]):
  if a is None:
    return b
  if b is None:
    return a
  return a + b


def reversible_half_residual_and_swap(
  x1: Tensor,
  x1_backwards: Optional[Tensor],
  x2: Tensor,
  x2_backwards: Optional[Tensor],
  f: Callable[[Tensor], Tensor],
  recompute_grads: bool = True,
):
  """One RevNet half-block, y1 = x1 + f(x2), y2 = x2, returned swapped.

  https://arxiv.org/abs/1707.04585. With recompute_grads the backward pass
  reconstructs the block's inputs from its outputs (x2 = y2,
  x1 = y1 - f(y2)) instead of keeping them: the `*_backwards` tensors carry
  those reconstructions down the stack during backpropagation (their
  "gradients" are activations). Pass None for the first block, then the
  outputs of each block to the next.

  Example:
    Two blocks with f(t) = t @ kernel, checked against numpy:

    >>> converter = mtf.test_utils.NumpyConverter()
    >>> x_np = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
    >>> x = converter.convert_np_array_to_mtf_tensor(
    ...     x_np, ["batch", "d_model"], dtype=tf.float32)
    >>> d_model = x.shape.dims[1]
    >>> def f(t):
    ...   return mtf.layers.dense(t, d_model, reduced_dims=[d_model],
    ...                           use_bias=False)
    >>> x1, x1_b, x2, x2_b = x, None, x, None
    >>> for i in range(2):
    ...   with tf.compat.v1.variable_scope("layer_%d" % i):
    ...     x1, x1_b, x2, x2_b = reversible_half_residual_and_swap(
    ...         x1, x1_b, x2, x2_b, f)
    >>> y = (x1 + x2) / 2
    >>> kernels = [converter.convert_mtf_tensor_to_np_array(v.outputs[0])
    ...            for v in converter.graph.trainable_variables]
    >>> a1, a2 = x_np, x_np
    >>> for kernel in kernels:
    ...   a1, a2 = a2, a1 + a2 @ kernel
    >>> np.allclose(converter.convert_mtf_tensor_to_np_array(y), (a1 + a2) / 2)
    True

  Args:
    x1: a Tensor.
    x1_backwards: a Tensor or None.
    x2: a Tensor of x1's shape and dtype.
    x2_backwards: a Tensor or None.
    f: a function Tensor -> Tensor of the same shape (may create variables).
    recompute_grads: use the reconstructing backward pass.

  Returns:
    (y2, y2_backwards, y1, y1_backwards).
  """
  if x1.shape != x2.shape or x1.dtype != x2.dtype:
    raise ValueError(
      "reversible_half_residual_and_swap: x1 %s and x2 %s must "
      "have the same shape and dtype" % (x1.to_string, x2.to_string)
    )
  if not recompute_grads:
    return x2, x2_backwards, x1 + f(x2), x1_backwards
  if x1_backwards is None:
    x1_backwards = io.zeros_like(x1)
  if x2_backwards is None:
    x2_backwards = io.zeros_like(x2)
  graph = x1.graph
  captured = {}

  def forward(a1, a1_backwards, a2, a2_backwards):
    fa2, f_ops = graph.capture_operations(lambda: f(a2))
    if not isinstance(fa2, Tensor) or fa2.shape != a2.shape:
      raise ValueError(
        "reversible_half_residual_and_swap: f must return a "
        "Tensor of shape %s, got %r" % (a2.shape.to_string, fa2)
      )
    captured["fx2"] = fa2
    captured["f_ops"] = [op for op in f_ops if not isinstance(op, Variable)]
    return [a2, a2_backwards, a1 + fa2, a1_backwards]

  def grad_fn(
    explicit_inputs, all_inputs, forward_operations, outputs, output_grads
  ):
    del forward_operations
    dy2, y2_value, dy1, y1_value = output_grads
    orig_x2 = explicit_inputs[2]
    extra_inputs = list(all_inputs[len(explicit_inputs) :])
    # Reconstruct this block's inputs from its outputs: handed down by the
    # next block, or (last block) the outputs themselves.
    x2_value = orig_x2 if y2_value is None else y2_value
    y1 = outputs[2] if y1_value is None else y1_value
    f_again_ops, mapping = graph.clone_operations(
      captured["f_ops"], {orig_x2: x2_value}
    )
    fx2 = mapping.get(captured["fx2"], captured["fx2"])
    x1_value = y1 - fx2
    if dy1 is None:
      f_grads = [None] * (1 + len(extra_inputs))
    else:
      f_grads = gradients_lib.gradients(
        [fx2], [x2_value] + extra_inputs, grad_ys=[dy1], operations=f_again_ops
      )
    dx2 = _add_optional(dy2, f_grads[0])
    return [dy1, x1_value, dx2, x2_value] + list(f_grads[1:])

  explicit_inputs = [x1, x1_backwards, x2, x2_backwards]
  fn_outputs, forward_ops, implicit = _capture_forward(
    graph, forward, explicit_inputs
  )
  op = custom_gradient_lib.CustomGradientOperation(
    explicit_inputs,
    explicit_inputs + implicit,
    fn_outputs,
    grad_fn,
    forward_ops,
    name="reversible_half_residual_and_swap",
  )
  return tuple(op.outputs)


def _rms(t: Tensor, output_shape=None) -> Tensor:
  t = elementwise.cast(t, tf.float32)
  return elementwise.sqrt(
    reduce_lib.reduce_mean(elementwise.square(t), output_shape=output_shape)
  )


@gin.configurable(module=_GIN_MODULE)
def clip_activation_gradient(
  x: Tensor, clip_rms_norm: Optional[float] = None
) -> Tensor:
  """Identity whose gradient is scaled down to RMS norm <= clip_rms_norm.

  The RMS is taken over all elements of the gradient; None or 0 disables it.

  Example (gin):
    The gradient of sum(y^2) at x = [3, 4] is [6, 8] (RMS norm sqrt(50));
    clipped to RMS norm 1 it is [6, 8] / sqrt(50):

    >>> import gin
    >>> gin.bind_parameter(
    ...     "mesh_tensorflow.layers.clip_activation_gradient.clip_rms_norm", 1.0)
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> x = converter.convert_np_array_to_mtf_tensor(
    ...     [3.0, 4.0], ["d"], dtype=tf.float32)
    >>> y = clip_activation_gradient(x)
    >>> grad = mtf.gradients([mtf.reduce_sum(y * y)], [x])[0]
    >>> np.allclose(converter.convert_mtf_tensor_to_np_array(grad),
    ...             np.array([6.0, 8.0]) / np.sqrt(50.0))
    True
    >>> gin.clear_config()

  Args:
    x: a floating mtf Tensor.
    clip_rms_norm: the largest RMS norm of the gradient, or None/0 for no
      clipping.

  Returns:
    an mtf Tensor equal to x.
  """
  if not clip_rms_norm:
    return x
  if clip_rms_norm < 0:
    raise ValueError(
      "clip_activation_gradient: clip_rms_norm must be "
      "positive, got %r" % (clip_rms_norm,)
    )

  def grad_fn(
    explicit_inputs, all_inputs, forward_operations, outputs, output_grads
  ):
    del explicit_inputs, forward_operations, outputs
    g = output_grads[0]
    denom = binary.maximum(_rms(g) * (1.0 / clip_rms_norm), 1.0)
    clipped = g * elementwise.cast(elementwise.reciprocal(denom), g.dtype)
    return [clipped] + [None] * (len(all_inputs) - 1)

  return custom_gradient_lib.custom_gradient(elementwise.identity, grad_fn, [x])


def summary_for_clip_activation_gradient(
  t: Tensor, name: Optional[str] = None, batch_dims=None
) -> Tensor:
  """Identity that records scalar summaries of the RMS of its gradient.

  Useful to pick `clip_rms_norm` for clip_activation_gradient. Summaries
  (mtf.scalar_summary, created on the backward pass):
    `<name>/grad_rms_norm`: RMS over all elements;
    with batch_dims, per example (RMS over the other dims):
    `<name>/grad_rms_norm_max` and `<name>/grad_rms_norm_mean`.

  Example:
    The summaries are made with the gradients:

    >>> converter = mtf.test_utils.NumpyConverter()
    >>> x = mtf.ones(converter.mesh, "batch:2;d_model:3")
    >>> y = summary_for_clip_activation_gradient(x, "layer_3", x.shape.dims[:1])
    >>> _ = mtf.gradients([mtf.reduce_sum(y)], [x])
    >>> [op.summary_name for op in converter.graph.operations
    ...  if isinstance(op, mtf.ScalarSummaryOperation)]
    ['layer_3/grad_rms_norm', 'layer_3/grad_rms_norm_max',
     'layer_3/grad_rms_norm_mean']

  Args:
    t: a Tensor.
    name: summary name prefix (default "activation_gradient").
    batch_dims: optional Dimensions of t indexing examples.

  Returns:
    t (through an identity with the summarising gradient).
  """
  name = name or "activation_gradient"
  batch_dims = as_dim_list(batch_dims, "batch_dims")
  for d in batch_dims:
    if d not in t.shape.dims:
      raise ValueError(
        "summary_for_clip_activation_gradient: batch dim %s is "
        "not a dimension of %s" % (d, t.shape.to_string)
      )

  def grad_fn(
    explicit_inputs, all_inputs, forward_operations, outputs, output_grads
  ):
    del explicit_inputs, forward_operations, outputs
    g = output_grads[0]
    summary_lib.scalar_summary(name + "/grad_rms_norm", _rms(g))
    if batch_dims:
      per_example = _rms(g, output_shape=Shape(batch_dims))
      summary_lib.scalar_summary(
        name + "/grad_rms_norm_max", reduce_lib.reduce_max(per_example)
      )
      summary_lib.scalar_summary(
        name + "/grad_rms_norm_mean", reduce_lib.reduce_mean(per_example)
      )
    return [g] + [None] * (len(all_inputs) - 1)

  return custom_gradient_lib.custom_gradient(elementwise.identity, grad_fn, [t])


def annealed_dropout(
  x: Tensor,
  is_training: bool,
  start_step: int,
  end_step: int,
  init_rate: Optional[float] = None,
  noise_shape=None,
  name: Optional[str] = None,
) -> Tensor:
  """Dropout whose rate falls linearly from init_rate to 0 over training.

  The rate is init_rate until the TF global step reaches start_step, then
  decreases linearly to 0 at end_step. Without init_rate, or when not
  training, x is returned unchanged.

  Example:
    At global step 0 the rate is init_rate (kept values are scaled by 2);
    not training, x is unchanged:

    >>> with tf.Graph().as_default():
    ...   _ = tf.compat.v1.train.get_or_create_global_step()  # step 0
    ...   converter = mtf.test_utils.NumpyConverter()
    ...   x = mtf.ones(converter.mesh, "batch:4;d_model:8")
    ...   h = annealed_dropout(x, True, 0, 10000, init_rate=0.5)
    ...   h_np = converter.convert_mtf_tensor_to_np_array(h)
    >>> sorted(set(h_np.flatten().tolist()))
    [0.0, 2.0]
    >>> annealed_dropout(x, False, 0, 10000, init_rate=0.5) is x
    True

  Args:
    x: a floating mtf Tensor.
    is_training: whether dropout applies.
    start_step: the global step where the rate starts to fall.
    end_step: the global step where it reaches 0.
    init_rate: the initial dropout rate in [0, 1), or None for no dropout.
    noise_shape: optional Shape (a subset of x's dims) of the dropout mask; it
      is broadcast over the other dims.
    name: optional name scope.

  Returns:
    an mtf Tensor like x.

  Raises:
    ValueError: if end_step <= start_step, init_rate is outside [0, 1), or
      there is no global step (tf.compat.v1.train.get_or_create_global_step).
  """
  if not is_training or not init_rate:
    return x
  if not 0.0 <= init_rate < 1.0:
    raise ValueError(
      "annealed_dropout: init_rate must be in [0, 1), got %r" % (init_rate,)
    )
  if end_step <= start_step:
    raise ValueError(
      "annealed_dropout: end_step (%r) must be greater than "
      "start_step (%r)" % (end_step, start_step)
    )
  noise_shape = (
    x.shape if noise_shape is None else convert_to_shape(noise_shape)
  )
  for d in noise_shape.dims:
    if d not in x.shape.dims:
      raise ValueError(
        "annealed_dropout: noise_shape dimension %s is not a "
        "dimension of x %s" % (d, x.shape.to_string)
      )
  step = tf1.train.get_global_step()
  if step is None:
    raise ValueError(
      "annealed_dropout needs a TF global step; create it with "
      "tf.compat.v1.train.get_or_create_global_step()"
    )
  name = name or "annealed_dropout"
  progress = tf.clip_by_value(
    (tf.cast(step, tf.float32) - float(start_step))
    / float(end_step - start_step),
    0.0,
    1.0,
  )
  keep_prob_tf = 1.0 - init_rate * (1.0 - progress)
  keep_prob = io.import_fully_replicated(
    x.mesh, keep_prob_tf, Shape([]), name=name + "/keep_prob"
  )
  noise = random_lib.random_uniform(
    x.mesh, noise_shape, dtype=tf.float32, name=name + "/noise"
  )
  mask = elementwise.cast(broadcast_binary.less(noise, keep_prob), tf.float32)
  mask = elementwise.cast(mask * elementwise.reciprocal(keep_prob), x.dtype)
  return binary.multiply(
    x, elementwise.stop_gradient(mask), output_shape=x.shape
  )


__all__ = [
  "annealed_dropout",
  "clip_activation_gradient",
  "multiplicative_jitter",
  "reversible_half_residual_and_swap",
  "summary_for_clip_activation_gradient",
]
