"""BERT's training update: Adam with weight decay, warmup, linear decay.

`create_optimizer` adds to an mtf graph the variable updates of one training
step: gradients of the loss, optionally clipped to global norm 1, applied by
AdamWeightDecayOptimizer (or Adafactor) at a learning rate that rises
linearly over the warmup steps and then falls linearly to 0 at
num_train_steps.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import tensorflow as tf

import mesh_tensorflow as mtf

__all__ = ["clip_by_global_norm", "create_optimizer", "learning_rate_at"]


def clip_by_global_norm(
  grads: Sequence[Optional[mtf.Tensor]], clip_norm
) -> Tuple[List[Optional[mtf.Tensor]], mtf.Tensor]:
  """grads scaled so that their joint L2 norm is at most clip_norm.

  Args:
    grads: mtf.Tensors (None entries stay None).
    clip_norm: the largest norm (a number or scalar mtf.Tensor).

  Returns:
    (clipped grads, the global norm before clipping).
  """
  global_norm = mtf.sqrt(
    mtf.add_n([mtf.reduce_sum(mtf.square(g)) for g in grads if g is not None])
  )
  scale = clip_norm / mtf.maximum(global_norm, clip_norm)
  return [None if g is None else g * scale for g in grads], global_norm


def learning_rate_at(
  global_step, init_lr: float, num_train_steps: int, num_warmup_steps: int
) -> tf.Tensor:
  """BERT's learning rate at global_step (float32 scalar).

  init_lr * (1 - step / num_train_steps) (0 from num_train_steps on); during
  the first num_warmup_steps steps init_lr * step / num_warmup_steps instead.

  Args:
    global_step: the step (int tensor or number).
    init_lr: the peak learning rate.
    num_train_steps: the step at which the rate reaches 0.
    num_warmup_steps: the number of warmup steps (0 or None: none).

  Returns:
    The learning rate.
  """
  step = tf.cast(global_step, tf.float32)
  total = float(num_train_steps)
  learning_rate = tf.constant(init_lr, tf.float32) * (
    1.0 - tf.minimum(step, total) / total
  )
  if num_warmup_steps:
    warmup_rate = init_lr * (step / float(num_warmup_steps))
    in_warmup = tf.cast(
      tf.cast(global_step, tf.int32) < int(num_warmup_steps), tf.float32
    )
    learning_rate = (1.0 - in_warmup) * learning_rate + in_warmup * warmup_rate
  return learning_rate


def create_optimizer(
  loss: mtf.Tensor,
  init_lr: Optional[float],
  num_train_steps: int,
  num_warmup_steps: int,
  max_optimized_variable_size: Optional[int] = None,
  optimizer: str = "adam",
  clip_gradients: bool = True,
):
  """Adds the training updates of loss's mesh graph; returns them.

  The learning rate follows the graph's global step
  (tf.compat.v1.train.get_or_create_global_step; BertEstimator puts its step
  into the graph it traces).

  Adam (the fine-tuning default, as BERT was pretrained) uses weight decay
  0.01 except on layer-norm and bias variables, beta_1 0.9, beta_2 0.999 and
  epsilon 1e-6; "adafactor" uses min_dim_size_to_factor 32.

  Args:
    loss: the scalar mtf.Tensor to minimize.
    init_lr: the peak learning rate (None or 0: Adafactor's own schedule).
    num_train_steps: the step at which the learning rate reaches 0.
    num_warmup_steps: the number of linear warmup steps.
    max_optimized_variable_size: train only variables of at most this many
      elements (None: all).
    optimizer: "adam" or "adafactor".
    clip_gradients: clip the gradients to global norm 1.

  Returns:
    (learning_rate tf.Tensor or None, the list of mtf update operations).

  Raises:
    ValueError: for adam without init_lr, or an unknown optimizer.
  """
  mesh = loss.mesh
  if init_lr:
    learning_rate = learning_rate_at(
      tf.compat.v1.train.get_or_create_global_step(),
      init_lr,
      num_train_steps,
      num_warmup_steps,
    )
    mtf_learning_rate = mtf.import_tf_tensor(mesh, learning_rate, [])
  elif optimizer == "adam":
    raise ValueError("Adam does not have a default learning rate")
  else:
    learning_rate = mtf_learning_rate = None
  if optimizer == "adam":
    update_rule = mtf.optimize.AdamWeightDecayOptimizer(
      learning_rate=mtf_learning_rate,
      weight_decay_rate=0.01,
      beta_1=0.9,
      beta_2=0.999,
      epsilon=1e-6,
      exclude_from_weight_decay=["LayerNorm", "layer_norm", "bias"],
    )
  elif optimizer == "adafactor":
    update_rule = mtf.optimize.AdafactorOptimizer(
      learning_rate=learning_rate, min_dim_size_to_factor=32
    )
  else:
    raise ValueError(
      "unknown optimizer %r: use 'adam' or 'adafactor'" % (optimizer,)
    )
  variables = mesh.graph.trainable_variables
  if max_optimized_variable_size:
    variables = [
      v for v in variables if v.shape.size <= max_optimized_variable_size
    ]
  grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
  if clip_gradients:
    grads, _ = clip_by_global_norm(
      grads, clip_norm=mtf.constant(mesh, 1.0, dtype=tf.float32)
    )
  return learning_rate, update_rule.apply_grads(grads, variables)
