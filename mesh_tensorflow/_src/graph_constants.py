"""Small constants shared by the ops of one device while a graph is built.

Lowering a mesh program builds the same small constants (shapes, axes,
scalars) once per slice: in a graph, a tf.constant made from a Python list
costs as much Python time as the op it feeds, and constants were a third of
the ops of a lowered training step. `shared` builds each such constant once
per graph, device scope and name of the value, and hands the same tensor to
every later caller in the same place.

The cache is bypassed (a fresh tensor is built) when executing eagerly,
inside a tf.compat.v1 control-flow context (while_loop, cond: their ops need
the context's frame), under colocate_with, or under a device function that is
not a plain device name (its placement may depend on the op).
"""

from __future__ import annotations

from typing import Callable, Hashable, Optional, Sequence
import weakref

import tensorflow as tf

__all__ = ["constant", "reshape", "shared"]

# tf.Graph -> {key: tf.Tensor}.
_CACHE = weakref.WeakKeyDictionary()


def _scope_key(graph) -> Optional[tuple]:
  """The device scope of new ops in `graph`, or None if it cannot be cached."""
  # pylint: disable=protected-access
  if graph._get_control_flow_context() is not None:
    return None
  if graph._colocation_stack:
    return None
  devices = []
  for spec in graph._device_function_stack.peek_objs():
    if spec.function is None:
      devices.append(None)
    elif spec.raw_string is not None:
      devices.append(spec.raw_string)
    else:
      return None
  # pylint: enable=protected-access
  return tuple(devices)


def shared(key: Hashable, make: Callable[[], tf.Tensor]) -> tf.Tensor:
  """make() once per graph and device scope for `key`; the same tensor after.

  Args:
    key: names the value make() builds (equal keys must mean equal values).
    make: builds the tensor from constants only (no inputs, no state).

  Returns:
    a tf.Tensor equal to make().
  """
  if tf.executing_eagerly():
    return make()
  graph = tf.compat.v1.get_default_graph()
  scope = _scope_key(graph)
  if scope is None:
    return make()
  cache = _CACHE.setdefault(graph, {})
  full_key = (scope, key)
  tensor = cache.get(full_key)
  if tensor is None:
    # Not ordered after whatever the first caller waits for.
    with graph.control_dependencies(None):
      tensor = make()
    cache[full_key] = tensor
  return tensor


def constant(value: Sequence[int], dtype: tf.DType = tf.int32) -> tf.Tensor:
  """A shared integer constant (a shape, axes, a permutation).

  Args:
    value: an int or a flat sequence of ints.
    dtype: an integer tf.DType.

  Returns:
    the constant, as tf.constant(value, dtype).
  """
  frozen = tuple(value) if isinstance(value, (list, tuple)) else value
  return shared(
    ("constant", dtype.name, frozen), lambda: tf.constant(value, dtype)
  )


def reshape(x: tf.Tensor, shape: Sequence[int]) -> tf.Tensor:
  """tf.reshape(x, shape) with a shared shape; x itself if already shaped so.

  Args:
    x: a tf.Tensor.
    shape: the new static shape, a list of ints.

  Returns:
    the reshaped tensor.
  """
  shape = [int(d) for d in shape]
  if x.shape.rank is not None and x.shape.as_list() == shape:
    return x
  return tf.reshape(x, constant(shape))
