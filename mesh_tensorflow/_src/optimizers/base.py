"""The Optimizer base class and helpers shared by the mtf optimizers.

An optimizer turns (gradient, variable) pairs into mtf Assign operations. The
assignments of one `apply_grads` call are merged per assign function with
`Graph.combine_assignments`, which variable stacking relies on.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, List, Optional, Sequence, Tuple

from absl import logging
import tensorflow as tf

from mesh_tensorflow._src.graph import Operation
from mesh_tensorflow._src.graph import Tensor
from mesh_tensorflow._src.ops import binary
from mesh_tensorflow._src.ops import elementwise
from mesh_tensorflow._src.ops import io
from mesh_tensorflow._src.ops import reduce as reduce_lib
from mesh_tensorflow._src.optimizers.global_step import root_variable_scope
from mesh_tensorflow._src.variables import Variable
from mesh_tensorflow._src.variables import get_variable


class Optimizer:
  """Base class: subclasses implement `apply_grad(grad, var)`.

  Example:
    A minimal subclass, and its use:

    >>> class HalfGradientDescent(Optimizer):
    ...   def apply_grad(self, grad, var):
    ...     return [mtf.assign_sub(var, grad * 0.5)]
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> w = mtf.get_variable(converter.mesh, "w", "d:2",
    ...                      initializer=tf.ones_initializer())
    >>> [grad] = mtf.gradients([mtf.reduce_sum(mtf.square(w))], [w])
    >>> update_ops = HalfGradientDescent().apply_grads(
    ...     [grad], converter.graph.trainable_variables)
    >>> converter.convert_mtf_tensor_to_np_array(mtf.depend(w, update_ops))
    array([0., 0.], dtype=float32)
  """

  _step_cache: Optional[dict] = None

  def apply_grads(
    self, grads: Sequence[Optional[Tensor]], variables: Sequence[Variable]
  ) -> List[Operation]:
    """Updates `variables` with `grads`; call this rather than apply_grad.

    Args:
      grads: mtf Tensors (or None: that variable is skipped with a warning),
        aligned with `variables`.
      variables: mtf Variables, e.g. `graph.trainable_variables`.

    Returns:
      The Assign operations, merged by `graph.combine_assignments` (one per
      assign function), which is what variable stacking needs.

    Raises:
      ValueError: if the lists differ in length, or an entry of `variables`
        is not an mtf Variable.
    """
    grads = list(grads)
    variables = list(variables)
    if len(grads) != len(variables):
      raise ValueError(
        "%s.apply_grads got %d gradients for %d variables"
        % (type(self).__name__, len(grads), len(variables))
      )
    for var in variables:
      check_variable(var, type(self).__name__)
    ops = []
    with self._per_call_cache():
      for grad, var in zip(grads, variables):
        ops.extend(self.apply_grad(grad, var))
    if not ops:
      return ops
    return variables[0].graph.combine_assignments(ops)

  def apply_grad(
    self, grad: Optional[Tensor], var: Variable
  ) -> List[Operation]:
    """Assign operations updating `var` (and its slots) with `grad`.

    Args:
      grad: the gradient of var, an mtf Tensor of its shape (or None: no
        update).
      var: the mtf Variable to update.

    Returns:
      a list of Assign operations updating var and its slot variables.

    Raises:
      ValueError: if the optimizer does not implement apply_grad.
    """
    raise ValueError(
      "%s does not implement apply_grad (grad %s, variable %s)"
      % (type(self).__name__, grad, var)
    )

  @contextlib.contextmanager
  def _per_call_cache(self):
    """Within one apply_grads call, step-derived scalars are built once."""
    outer = self._step_cache
    if outer is None:
      self._step_cache = {}
    try:
      yield
    finally:
      if outer is None:
        self._step_cache = None

  def _cached(self, key: Any, fn: Callable[[], Any]) -> Any:
    if self._step_cache is None:
      return fn()
    if key not in self._step_cache:
      self._step_cache[key] = fn()
    return self._step_cache[key]


def check_variable(var, who: str) -> None:
  """ValueError naming `var` unless it is an mtf Variable."""
  if isinstance(var, Variable):
    return
  if isinstance(var, Tensor):
    raise ValueError(
      "%s: expected an mtf.Variable, got the mtf Tensor %r; pass the "
      "Variable objects (e.g. graph.trainable_variables), not their values"
      % (who, var.name)
    )
  raise ValueError(
    "%s: expected an mtf.Variable, got %r of type %s"
    % (who, var, type(var).__name__)
  )


def check_grad(grad: Optional[Tensor], var, who: str) -> bool:
  """False (after a warning) for a None gradient; checks var and shapes."""
  check_variable(var, who)
  if grad is None:
    logging.warning(
      "%s: gradient is None for variable %s; not updating it", who, var.name
    )
    return False
  if not isinstance(grad, Tensor):
    raise ValueError(
      "%s: gradient for variable %s must be an mtf Tensor, got "
      "%r" % (who, var.name, grad)
    )
  if grad.shape != var.shape:
    raise ValueError(
      "%s: gradient %s has shape %s but variable %s has shape "
      "%s"
      % (who, grad.name, grad.shape.to_string, var.name, var.shape.to_string)
    )
  return True


def create_slot(var: Variable, suffix: str, shape, dtype=tf.float32) -> Tensor:
  """A zero-initialized, untrainable slot variable named `var.name + suffix`.

  Slots are created in the top-level variable scope, so their names are
  exactly `<var.name><suffix>` (the checkpoint names of the original) whatever
  scope the optimizer is called in.
  """
  with root_variable_scope():
    return get_variable(
      var.mesh,
      var.name + suffix,
      shape,
      dtype=dtype,
      initializer=tf.zeros_initializer(),
      trainable=False,
    )


def reduce_rms(x: Tensor, **kwargs) -> Tensor:
  """Root mean square of x; kwargs (output_shape, reduced_dim) as reduce_mean.

  Example:
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> x = converter.convert_np_array_to_mtf_tensor(
    ...     [[3.0, 4.0], [0.0, 0.0]], ["stacked", "d"], dtype=tf.float32)
    >>> converter.convert_mtf_tensor_to_np_array(reduce_rms(x))  # scalar
    array(2.5, dtype=float32)
    >>> converter.convert_mtf_tensor_to_np_array(  # one RMS per stacked slice
    ...     reduce_rms(x, output_shape=x.shape.dims[:1]))
    array([3.535534, 0.      ], dtype=float32)

  Args:
    x: a floating mtf Tensor.

  Returns:
    an mtf Tensor: sqrt(mean(x ** 2)) over the reduced dims.
  """
  return elementwise.sqrt(
    reduce_lib.reduce_mean(elementwise.square(x), **kwargs)
  )


def scalar_to_mtf(mesh, value, dtype=tf.float32) -> Tensor:
  """A 0-d mtf Tensor from a Python number, tf scalar or mtf scalar."""
  if isinstance(value, Tensor):
    return value if value.dtype == dtype else elementwise.cast(value, dtype)
  if isinstance(value, (tf.Tensor, tf.Variable)):
    return io.import_tf_tensor(mesh, tf.cast(value, dtype), [])
  return io.constant(mesh, value, shape=[], dtype=dtype)


def clip_by_global_norm(
  grads: Sequence[Optional[Tensor]], clip_norm
) -> Tuple[List[Optional[Tensor]], Optional[Tensor]]:
  """Scales gradients so that their joint L2 norm is at most `clip_norm`.

  Like `tf.clip_by_global_norm`: each gradient becomes
  `g * clip_norm / max(global_norm, clip_norm)`; None entries pass through.
  The norm is accumulated in float32.

  Args:
    grads: mtf Tensors or None.
    clip_norm: a positive Python number, tf scalar or mtf scalar.

  Returns:
    (clipped_grads, global_norm): the list aligned with `grads`, and the
    global norm as a float32 mtf scalar (None when every gradient is None).

  Example:
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> g1 = converter.convert_np_array_to_mtf_tensor(
    ...     [3.0, 4.0], ["a"], dtype=tf.float32)
    >>> g2 = converter.convert_np_array_to_mtf_tensor(
    ...     [[0.0, 12.0]], ["b", "c"], dtype=tf.float32)
    >>> grads, norm = mtf.optimize.clip_by_global_norm([g1, None, g2], 1.0)
    >>> converter.convert_mtf_tensor_to_np_array(norm)  # sqrt(9 + 16 + 144)
    array(13., dtype=float32)
    >>> grads[1] is None
    True
    >>> np.allclose(converter.convert_mtf_tensor_to_np_array(grads[0]),
    ...             np.array([3.0, 4.0]) / 13)
    True
  """
  if isinstance(clip_norm, (int, float)) and not clip_norm > 0:
    raise ValueError(
      "clip_by_global_norm: clip_norm must be positive, got %r" % (clip_norm,)
    )
  grads = list(grads)
  present = [g for g in grads if g is not None]
  if not present:
    return grads, None
  for g in present:
    if not isinstance(g, Tensor):
      raise ValueError(
        "clip_by_global_norm: gradients must be mtf Tensors or "
        "None, got %r" % (g,)
      )
  total = None
  for g in present:
    g32 = elementwise.cast(g, tf.float32)
    sq = reduce_lib.reduce_sum(elementwise.square(g32))
    total = sq if total is None else total + sq
  global_norm = elementwise.sqrt(total)
  mesh = present[0].mesh
  clip = scalar_to_mtf(mesh, clip_norm)
  scale = clip / binary.maximum(global_norm, clip)
  clipped = []
  for g in grads:
    if g is None:
      clipped.append(None)
    else:
      s = scale if g.dtype == tf.float32 else elementwise.cast(scale, g.dtype)
      clipped.append(g * s)
  return clipped, global_norm


__all__ = [
  "Optimizer",
  "check_grad",
  "check_variable",
  "clip_by_global_norm",
  "create_slot",
  "reduce_rms",
  "scalar_to_mtf",
]
