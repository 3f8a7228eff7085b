"""Plain and momentum stochastic gradient descent."""

from __future__ import annotations

from typing import Any, List, Optional

import gin

from mesh_tensorflow._src.graph import Operation
from mesh_tensorflow._src.graph import Tensor
from mesh_tensorflow._src.optimizers.base import Optimizer
from mesh_tensorflow._src.optimizers.base import check_grad
from mesh_tensorflow._src.optimizers.base import create_slot
from mesh_tensorflow._src.variables import Variable
from mesh_tensorflow._src.variables import assign
from mesh_tensorflow._src.variables import assign_add
from mesh_tensorflow._src.variables import assign_sub


@gin.configurable(module="mesh_tensorflow.optimize")
class SgdOptimizer(Optimizer):
  """SGD: `var -= learning_rate * grad`.

  Example:
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> x = converter.convert_np_array_to_mtf_tensor(
    ...     [1.0, -2.0], ["d"], dtype=tf.float32)
    >>> w = mtf.get_variable(converter.mesh, "w", "d:2",
    ...                      initializer=tf.ones_initializer())
    >>> [grad] = mtf.gradients([mtf.reduce_sum(w * x)], [w])  # grad = x
    >>> update_ops = mtf.optimize.SgdOptimizer(0.1).apply_grads(
    ...     [grad], converter.graph.trainable_variables)
    >>> converter.convert_mtf_tensor_to_np_array(mtf.depend(w, update_ops))
    array([0.9, 1.2], dtype=float32)
  """

  def __init__(self, learning_rate) -> None:
    """Stores the learning rate.

    Args:
      learning_rate: a Python number or a float scalar tf.Tensor.
    """
    self._lr = learning_rate

  @property
  def lr(self) -> Any:
    """The learning rate (alias of learning_rate)."""
    return self._lr

  @property
  def learning_rate(self) -> Any:
    """The learning rate (a float or a scalar tensor)."""
    return self._lr

  def apply_grad(
    self, grad: Optional[Tensor], var: Variable
  ) -> List[Operation]:
    if not check_grad(grad, var, type(self).__name__):
      return []
    # assign_sub rather than assign(var, var - ...): with bfloat16 slices the
    # slice value is then rounded once per step, not twice.
    return [assign_sub(var, grad * self._lr)]


@gin.configurable(module="mesh_tensorflow.optimize")
class MomentumOptimizer(Optimizer):
  """SGD with momentum: `v = momentum * v - lr * grad; var += v`.

  The velocity slot is `<var.name>_momentum_v`, with the variable's dtypes,
  zero-initialized and untrainable.

  Args:
    learning_rate: a Python number or float scalar tf.Tensor.
    momentum: the momentum coefficient.
  """

  def __init__(self, learning_rate, momentum) -> None:
    self._lr = learning_rate
    self._momentum = momentum

  @property
  def lr(self) -> Any:
    """The learning rate (alias of learning_rate)."""
    return self._lr

  @property
  def learning_rate(self) -> Any:
    """The learning rate (a float or a scalar tensor)."""
    return self._lr

  @property
  def momentum(self) -> float:
    """The momentum coefficient."""
    return self._momentum

  def apply_grad(
    self, grad: Optional[Tensor], var: Variable
  ) -> List[Operation]:
    if not check_grad(grad, var, type(self).__name__):
      return []
    velocity = create_slot(var, "_momentum_v", var.shape, dtype=var.dtype)
    new_velocity = velocity * self._momentum - grad * self._lr
    return [assign(velocity, new_velocity), assign_add(var, new_velocity)]


__all__ = ["MomentumOptimizer", "SgdOptimizer"]
