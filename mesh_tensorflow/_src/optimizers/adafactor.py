"""Adafactor (Shazeer & Stern, 2018) on mtf variables, and its multi-LR form.

Second-moment statistics are factored for variables with two large
dimensions: instead of a full-shape accumulator, one row and one column
accumulator (slots `<var>_slot_vr`, `<var>_slot_vc`); otherwise one full
accumulator `<var>_slot_v`. With beta1 > 0 a momentum slot `<var>_slot_m`.
"""

from __future__ import annotations

import re
from typing import List, Optional

import gin
import tensorflow as tf

from mesh_tensorflow._src.graph import Operation
from mesh_tensorflow._src.graph import Tensor
from mesh_tensorflow._src.layers.core import unit_scaling_convention
from mesh_tensorflow._src.ops import binary
from mesh_tensorflow._src.ops import elementwise
from mesh_tensorflow._src.ops import reduce as reduce_lib
from mesh_tensorflow._src.optimizers.base import Optimizer
from mesh_tensorflow._src.optimizers.base import check_grad
from mesh_tensorflow._src.optimizers.base import create_slot
from mesh_tensorflow._src.optimizers.base import reduce_rms
from mesh_tensorflow._src.optimizers.global_step import step_num
from mesh_tensorflow._src.optimizers.schedules import MultiLRScheduleMixin
from mesh_tensorflow._src.optimizers.sgd import SgdOptimizer
from mesh_tensorflow._src.shapes import Dimension
from mesh_tensorflow._src.shapes import Shape
from mesh_tensorflow._src.variables import Variable
from mesh_tensorflow._src.variables import assign
from mesh_tensorflow._src.variables import assign_sub


def _as_list(x) -> List[str]:
  if x is None:
    return []
  if isinstance(x, str):
    return [x]
  return list(x)


@gin.configurable(module="mesh_tensorflow.optimize")
class AdafactorOptimizer(Optimizer):
  """Adafactor.

  Per step, for a gradient g of a variable w (all in float32):
    g2 = g**2 + epsilon1
    factored: vr = d*vr + (1-d)*mean(g2 over d0); vc = d*vc + (1-d)*mean(g2
      over d1); x = g * rsqrt(vr / mean(vr over d1)) * rsqrt(vc)
    otherwise: v = d*v + (1-d)*g2; x = g * rsqrt(v)
    x /= max(1, rms(x) / clipping_threshold)        (if clipping_threshold)
    u = x * lr * max(rms(w), epsilon2)               (parameter scale), or x*lr
    if beta1: m = beta1*m + (1-beta1)*u; u = m
    w -= u
  where d is the decay rate. d0 >= d1 are the two largest dimensions of w
  (ties by dimension order, dims in `stacked_dim_names` ignored); w is
  factored iff `factored` and d1.size >= min_dim_size_to_factor. The RMS of x
  and w is taken per slice of the stacked dims (over all dims if none).

  Defaults depending on the global step (see get_or_create_global_step; they
  are built when the update is built, so an optimizer made outside a
  tf.function reads the step of each call):
    learning_rate: min(rsqrt(step + 1), 0.01), times 0.05 when the update is
      not multiplied by the parameter scale and unit scaling is off.
    decay_rate: adafactor_decay_rate_pow() = 1 - (step + 1)**-0.8.

  Args:
    multiply_by_parameter_scale: scale updates by max(rms(w), epsilon2).
    learning_rate: a number or float scalar tf.Tensor; None for the default.
    decay_rate: a number or float scalar tf.Tensor; None for the default.
    beta1: momentum coefficient in [0, 1); 0 means no `_slot_m`.
    clipping_threshold: update clipping threshold, or None for no clipping.
    factored: whether to factor second moments of large variables.
    epsilon1: added to squared gradients.
    epsilon2: lower bound of the parameter scale.
    min_dim_size_to_factor: factor only if the second-largest dim is >= this.
    stacked_dim_names: names of dims that stack independent variables.
    exclude_from_parameter_scale: regexes of variable names (re.search) that
      are not multiplied by the parameter scale.
  """

  def __init__(
    self,
    multiply_by_parameter_scale=True,
    learning_rate=None,
    decay_rate=None,
    beta1=0.0,
    clipping_threshold=1.0,
    factored=True,
    epsilon1=1e-30,
    epsilon2=1e-3,
    min_dim_size_to_factor=128,
    stacked_dim_names=None,
    exclude_from_parameter_scale=None,
  ) -> None:
    if isinstance(beta1, (int, float)) and not 0.0 <= beta1 < 1.0:
      raise ValueError(
        "AdafactorOptimizer: beta1 must be in [0, 1), got %r" % (beta1,)
      )
    if (
      isinstance(clipping_threshold, (int, float))
      and not clipping_threshold > 0
    ):
      raise ValueError(
        "AdafactorOptimizer: clipping_threshold must be "
        "positive or None, got %r" % (clipping_threshold,)
      )
    self._multiply_by_parameter_scale = multiply_by_parameter_scale
    self._learning_rate = learning_rate
    self._decay_rate = decay_rate
    self._beta1 = beta1
    self._clipping_threshold = clipping_threshold
    self._factored = factored
    self._epsilon1 = epsilon1
    self._epsilon2 = epsilon2
    self._min_dim_size_to_factor = min_dim_size_to_factor
    self._stacked_dim_names = _as_list(stacked_dim_names)
    self._exclude_from_parameter_scale = _as_list(exclude_from_parameter_scale)
    for pattern in self._exclude_from_parameter_scale:
      try:
        re.compile(pattern)
      except re.error as e:
        raise ValueError(
          "AdafactorOptimizer: bad exclude_from_parameter_scale "
          "regex %r: %s" % (pattern, e)
        ) from None

  # Step-dependent scalars, built once per apply_grads call.
  def _get_learning_rate(self):
    if self._learning_rate is not None:
      return self._learning_rate
    return self._cached(
      "learning_rate",
      lambda: self._learning_rate_default(self._multiply_by_parameter_scale),
    )

  def _get_decay_rate(self):
    if self._decay_rate is not None:
      return self._decay_rate
    return self._cached("decay_rate", self._decay_rate_default)

  def _decay_rate_default(self):
    return adafactor_decay_rate_pow()  # gin may bind its arguments

  def _learning_rate_default(self, multiply_by_parameter_scale):
    learning_rate = tf.minimum(tf.math.rsqrt(step_num() + 1.0), 0.01)
    if not multiply_by_parameter_scale and not unit_scaling_convention():
      learning_rate *= 0.05
    return learning_rate

  def _learning_rate_for(self, var: Variable):
    """Learning rate of `var` (a hook for the multi-schedule subclass)."""
    del var
    return self._get_learning_rate()

  def _factored_dims(self, shape: Shape) -> Optional[List[Dimension]]:
    """[d0, d1], the two largest non-stacked dims, if the rule factors shape."""
    if not self._factored:
      return None
    dims = [d for d in shape.dims if d.name not in self._stacked_dim_names]
    if len(dims) < 2:
      return None
    by_size = sorted(dims, key=lambda d: -d.size)  # stable: ties by order
    if by_size[1].size < self._min_dim_size_to_factor:
      return None
    return by_size[:2]

  def _stacked_dims(self, shape: Shape) -> List[Dimension]:
    return [d for d in shape.dims if d.name in self._stacked_dim_names]

  def _rms(self, x: Tensor) -> Tensor:
    return reduce_rms(x, output_shape=self._stacked_dims(x.shape))

  def _parameter_scale(self, var_value: Tensor) -> Tensor:
    """max(rms(var), epsilon2): lets zero-initialized variables move."""
    return binary.maximum(self._rms(var_value), self._epsilon2)

  def _uses_parameter_scale(self, var_name: str) -> bool:
    if not self._multiply_by_parameter_scale:
      return False
    return not any(
      re.search(p, var_name) is not None
      for p in self._exclude_from_parameter_scale
    )

  def apply_grad(
    self, grad: Optional[Tensor], var: Variable
  ) -> List[Operation]:
    if not check_grad(grad, var, type(self).__name__):
      return []
    grad = elementwise.cast(grad, tf.float32)
    factored_dims = self._factored_dims(var.shape)
    if factored_dims:
      d0, d1 = factored_dims
      vr_shape = var.shape - d0
      vc_shape = var.shape - d1
      vr = create_slot(var, "_slot_vr", vr_shape)
      vc = create_slot(var, "_slot_vc", vc_shape)
    else:
      v = create_slot(var, "_slot_v", var.shape)
    if self._beta1:
      m = create_slot(var, "_slot_m", var.shape)

    learning_rate = self._learning_rate_for(var)
    decay_rate = self._get_decay_rate()
    mixing_rate = 1.0 - decay_rate
    grad_squared = elementwise.square(grad) + self._epsilon1
    if self._uses_parameter_scale(var.name):
      old_val = elementwise.cast(var.value, tf.float32)
      update_scale = self._parameter_scale(old_val) * learning_rate
    else:
      update_scale = learning_rate
    updates = []
    if factored_dims:
      row_mean = reduce_lib.reduce_mean(grad_squared, output_shape=vr_shape)
      col_mean = reduce_lib.reduce_mean(grad_squared, output_shape=vc_shape)
      new_vr = vr * decay_rate + row_mean * mixing_rate
      new_vc = vc * decay_rate + col_mean * mixing_rate
      updates.extend([assign(vr, new_vr), assign(vc, new_vc)])
      long_term_mean = reduce_lib.reduce_mean(new_vr, reduced_dim=d1)
      r_factor = elementwise.rsqrt(new_vr / long_term_mean)
      c_factor = elementwise.rsqrt(new_vc)
      x = grad * r_factor * c_factor
    else:
      new_v = v * decay_rate + grad_squared * mixing_rate
      updates.append(assign(v, new_v))
      x = grad * elementwise.rsqrt(new_v)
    if self._clipping_threshold is not None:
      clipping_denom = binary.maximum(
        self._rms(x) * (1.0 / self._clipping_threshold), 1.0
      )
      x = x / clipping_denom
    subtrahend = x * update_scale
    if self._beta1:
      new_m = m * self._beta1 + subtrahend * (1.0 - self._beta1)
      subtrahend = new_m
      updates.append(assign(m, new_m))
    # assign_sub, not assign(var, var - ...): bfloat16 slices round once.
    updates.append(assign_sub(var, subtrahend))
    return updates


@gin.configurable(module="mesh_tensorflow.optimize")
class AdafactorWithMultiLRSchedule(MultiLRScheduleMixin, AdafactorOptimizer):
  """AdafactorOptimizer where regex-selected variables use other rates.

  Args:
    variable_search: regexes; a variable uses the schedule of the first one
      that matches (re.search) its name, others the base learning rate.
    alt_lr_schedules: one entry per regex: None (the base learning rate) or a
      list of factor functions `f(step, total_train_steps)` whose product is
      the rate (see compute_lr_for_step).
    **kwargs: AdafactorOptimizer arguments.
  """

  def __init__(
    self, variable_search=None, alt_lr_schedules=None, **kwargs
  ) -> None:
    super().__init__(**kwargs)
    self._init_multi_lr(variable_search, alt_lr_schedules)

  def _learning_rate_for(self, var: Variable):
    return self._select_learning_rate(var.name, self._get_learning_rate())


def adafactor_decay_rate_adam(beta2: float) -> tf.Tensor:
  """Second-moment decay rate like Adam's beta2, including bias correction.

  decay = beta2 * (1 - beta2**(t-1)) / (1 - beta2**t) with t = step + 1.

  Args:
    beta2: a float in (0, 1).

  Returns:
    A float32 scalar tf.Tensor.
  """
  t = step_num() + 1.0
  log_beta2 = tf.math.log(tf.constant(beta2, tf.float32))
  # 1 - beta2**n as -expm1(n log beta2): no cancellation for beta2 near 1.
  return (
    beta2
    * (-tf.math.expm1((t - 1.0) * log_beta2))
    / (-tf.math.expm1(t * log_beta2))
  )


@gin.configurable(module="mesh_tensorflow.optimize")
def adafactor_decay_rate_pow(
  exponent: float = 0.8, offset: int = 0
) -> tf.Tensor:
  """Decay rate 1 - (step - offset + 1)**-exponent (memory grows with step).

  Args:
    exponent: a float in (0, 1].
    offset: steps to subtract from the global step.

  Returns:
    A float32 scalar tf.Tensor.
  """
  step = step_num() - tf.cast(offset, tf.float32)
  return 1.0 - tf.pow(step + 1.0, -float(exponent))


def adafactor_optimizer_from_hparams(hparams, lr) -> AdafactorOptimizer:
  """An AdafactorOptimizer from t2t-style `optimizer_adafactor_*` hparams.

  Args:
    hparams: an object with attributes optimizer_adafactor_decay_type ("Adam"
      or "pow"), optimizer_adafactor_beta2 (for "Adam"),
      optimizer_adafactor_memory_exponent (for "pow"),
      optimizer_adafactor_multiply_by_parameter_scale,
      optimizer_adafactor_beta1, optimizer_adafactor_clipping_threshold and
      optimizer_adafactor_factored.
    lr: the learning rate.

  Returns:
    An AdafactorOptimizer.

  Raises:
    ValueError: on an unknown decay type.
  """
  decay_type = hparams.optimizer_adafactor_decay_type
  if decay_type == "Adam":
    decay_rate = adafactor_decay_rate_adam(hparams.optimizer_adafactor_beta2)
  elif decay_type == "pow":
    decay_rate = adafactor_decay_rate_pow(
      hparams.optimizer_adafactor_memory_exponent
    )
  else:
    raise ValueError(
      "unknown optimizer_adafactor_decay_type %r (expected "
      "'Adam' or 'pow')" % (decay_type,)
    )
  return AdafactorOptimizer(
    multiply_by_parameter_scale=(
      hparams.optimizer_adafactor_multiply_by_parameter_scale
    ),
    learning_rate=lr,
    decay_rate=decay_rate,
    beta1=hparams.optimizer_adafactor_beta1,
    clipping_threshold=hparams.optimizer_adafactor_clipping_threshold,
    factored=hparams.optimizer_adafactor_factored,
  )


def make_optimizer(hparams, lr) -> Optimizer:
  """SgdOptimizer or AdafactorOptimizer, by `hparams.optimizer`.

  Args:
    hparams: an object with attribute `optimizer` ("SGD" or "Adafactor") and,
      for Adafactor, the optimizer_adafactor_* settings.
    lr: the learning rate (a float or scalar tf.Tensor).

  Returns:
    the Optimizer.

  Raises:
    ValueError: if hparams.optimizer is neither "SGD" nor "Adafactor".
  """
  if hparams.optimizer == "SGD":
    return SgdOptimizer(lr)
  if hparams.optimizer == "Adafactor":
    return adafactor_optimizer_from_hparams(hparams, lr)
  raise ValueError(
    "unknown optimizer %r (make_optimizer knows 'SGD' and "
    "'Adafactor')" % (hparams.optimizer,)
  )


__all__ = [
  "AdafactorOptimizer",
  "AdafactorWithMultiLRSchedule",
  "adafactor_decay_rate_adam",
  "adafactor_decay_rate_pow",
  "adafactor_optimizer_from_hparams",
  "make_optimizer",
]
