"""Adam with decoupled weight decay (BERT's optimizer), and multi-LR."""

from __future__ import annotations

import re
from typing import List, Optional

import gin
import tensorflow as tf

from mesh_tensorflow._src.graph import Operation
from mesh_tensorflow._src.graph import Tensor
from mesh_tensorflow._src.ops import elementwise
from mesh_tensorflow._src.optimizers.base import Optimizer
from mesh_tensorflow._src.optimizers.base import check_grad
from mesh_tensorflow._src.optimizers.base import create_slot
from mesh_tensorflow._src.optimizers.schedules import MultiLRScheduleMixin
from mesh_tensorflow._src.variables import Variable
from mesh_tensorflow._src.variables import assign
from mesh_tensorflow._src.variables import assign_sub


@gin.configurable(module="mesh_tensorflow.optimize")
class AdamWeightDecayOptimizer(Optimizer):
  """Adam without bias correction, plus decoupled ("correct" L2) weight decay.

  Per step, with slots m = `<var>/adam_m` and v = `<var>/adam_v` (float32,
  zero-initialized):
    m = beta_1 * m + (1 - beta_1) * grad
    v = beta_2 * v + (1 - beta_2) * grad**2
    update = m / (sqrt(v) + epsilon) [+ weight_decay_rate * var]
    var -= learning_rate * update
  The decay term is added unless weight_decay_rate is 0 or a regex of
  `exclude_from_weight_decay` matches (re.search) the variable name.

  Example:
    One step from w = b = 1 with gradients g_w = [1, -2], g_b = [1, 1]; the
    decay term 0.5 * w applies to w only:

    >>> converter = mtf.test_utils.NumpyConverter()
    >>> x = converter.convert_np_array_to_mtf_tensor(
    ...     [1.0, -2.0], ["d"], dtype=tf.float32)
    >>> with tf.compat.v1.variable_scope("layer"):
    ...   w = mtf.get_variable(converter.mesh, "w", "d:2",
    ...                        initializer=tf.ones_initializer())
    ...   b = mtf.get_variable(converter.mesh, "bias", "d:2",
    ...                        initializer=tf.ones_initializer())
    >>> variables = converter.graph.trainable_variables
    >>> grads = mtf.gradients([mtf.reduce_sum(w * x + b)], [w, b])
    >>> opt = AdamWeightDecayOptimizer(0.1, weight_decay_rate=0.5,
    ...                                exclude_from_weight_decay=["bias"])
    >>> update_ops = opt.apply_grads(grads, variables)
    >>> [v.name for v in converter.graph.all_variables]
    ['layer/w', 'layer/bias', 'layer/w/adam_m', 'layer/w/adam_v',
     'layer/bias/adam_m', 'layer/bias/adam_v']
    >>> new_w, new_b = mtf.depend(w, update_ops), mtf.depend(b, update_ops)
    >>> lowering, new_w_tf = converter.convert_mtf_tensor_to_tf_tensor(new_w)
    >>> def first_update(g):  # m = (1 - beta_1) g, v = (1 - beta_2) g**2
    ...   return 0.1 * g / (np.sqrt(0.001 * g**2) + 1e-6)
    >>> np.allclose(new_w_tf, 1 - 0.1 * (first_update(np.array([1, -2])) + 0.5))
    True
    >>> np.allclose(lowering.export_to_tf_tensor(new_b),
    ...             1 - 0.1 * first_update(np.array([1, 1])))
    True

  Args:
    learning_rate: a Python number or float scalar tf.Tensor.
    weight_decay_rate: the decoupled weight decay coefficient.
    beta_1: the decay of the first-moment estimate m.
    beta_2: the decay of the second-moment estimate v.
    epsilon: added to sqrt(v) for stability.
    exclude_from_weight_decay: a regexp or list of regexps; variables whose name
      matches one get no weight decay.
  """

  def __init__(
    self,
    learning_rate,
    weight_decay_rate=0.0,
    beta_1=0.9,
    beta_2=0.999,
    epsilon=1e-6,
    exclude_from_weight_decay=None,
  ) -> None:
    if isinstance(exclude_from_weight_decay, str):
      exclude_from_weight_decay = [exclude_from_weight_decay]
    for pattern in exclude_from_weight_decay or []:
      try:
        re.compile(pattern)
      except re.error as e:
        raise ValueError(
          "AdamWeightDecayOptimizer: bad exclude_from_weight_"
          "decay regex %r: %s" % (pattern, e)
        ) from None
    self.learning_rate = learning_rate
    self.weight_decay_rate = weight_decay_rate
    self.beta_1 = beta_1
    self.beta_2 = beta_2
    self.epsilon = epsilon
    self.exclude_from_weight_decay = exclude_from_weight_decay

  def _do_use_weight_decay(self, param_name: str) -> bool:
    """Whether to apply weight decay to the variable named param_name."""
    if not self.weight_decay_rate:
      return False
    for pattern in self.exclude_from_weight_decay or []:
      if re.search(pattern, param_name) is not None:
        return False
    return True

  def _learning_rate_for(self, var: Variable):
    return self.learning_rate

  def apply_grad(
    self, grad: Optional[Tensor], var: Variable
  ) -> List[Operation]:
    if not check_grad(grad, var, type(self).__name__):
      return []
    grad = elementwise.cast(grad, tf.float32)
    m = create_slot(var, "/adam_m", var.shape)
    v = create_slot(var, "/adam_v", var.shape)
    next_m = m * self.beta_1 + grad * (1.0 - self.beta_1)
    next_v = v * self.beta_2 + elementwise.square(grad) * (1.0 - self.beta_2)
    update = next_m / (elementwise.sqrt(next_v) + self.epsilon)
    if self._do_use_weight_decay(var.name):
      update += elementwise.cast(var.value, tf.float32) * self.weight_decay_rate
    update_with_lr = update * self._learning_rate_for(var)
    return [
      assign_sub(var, update_with_lr),
      assign(m, next_m),
      assign(v, next_v),
    ]


@gin.configurable(module="mesh_tensorflow.optimize")
class AdamWithMultiLRSchedule(MultiLRScheduleMixin, AdamWeightDecayOptimizer):
  """AdamWeightDecayOptimizer where regex-selected variables use other rates.

  Args:
    variable_search: regexes; a variable uses the schedule of the first one
      that matches (re.search) its name, others use `learning_rate`.
    alt_lr_schedules: one entry per regex: None (the base learning rate) or a
      list of factor functions `f(step, total_train_steps)` whose product is
      the rate (see compute_lr_for_step).
    **kwargs: AdamWeightDecayOptimizer arguments.
  """

  def __init__(
    self, variable_search=None, alt_lr_schedules=None, **kwargs
  ) -> None:
    super().__init__(**kwargs)
    self._init_multi_lr(variable_search, alt_lr_schedules)

  def _learning_rate_for(self, var: Variable):
    return self._select_learning_rate(var.name, self.learning_rate)


__all__ = ["AdamWeightDecayOptimizer", "AdamWithMultiLRSchedule"]
