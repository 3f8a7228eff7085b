"""Small constants shared by the ops of one device while a graph is built.

Lowering a mesh program builds the same small constants (shapes, axes,
scalars) once per slice: in a graph, a tf.constant made from a Python list
costs as much Python time as the op it feeds, and constants were a third of
the ops of a lowered training step. `shared` builds each such constant once
per graph, device scope and name of the value, and hands the same tensor to
every later caller in the same place; `value_keys` tells which tensors of
different devices hold the same such value. `reshape` likewise reuses an
identical earlier reshape of the same tensor.

The cache is bypassed (a fresh tensor is built) when executing eagerly,
inside a tf.compat.v1 control-flow context (while_loop, cond: their ops need
the context's frame), under colocate_with, or under a device function that is
not a plain device name (its placement may depend on the op).
"""

from __future__ import annotations

from typing import Callable, Hashable, Optional, Sequence
import weakref

import tensorflow as tf

__all__ = ["constant", "reshape", "shared", "value_keys"]

# tf.Graph -> {key: tf.Tensor}.
_CACHE = weakref.WeakKeyDictionary()
# tf.Graph -> {id(tensor): key} for the tensors of _CACHE (which keeps them
# alive, so their ids stay theirs).
_VALUE_KEYS = weakref.WeakKeyDictionary()
# tf.Graph -> {(device scope, id(x), shape): (x, reshaped x)}.
_RESHAPES = weakref.WeakKeyDictionary()


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
    _VALUE_KEYS.setdefault(graph, {})[id(tensor)] = key
  return tensor


def value_keys(graph) -> dict:
  """{id(tensor): key} for the tensors `shared` built in graph.

  Tensors of equal keys hold equal values, whatever their device: a caller
  may treat them as one value (e.g. compute a function of them once).

  Args:
    graph: a tf.Graph.

  Returns:
    a dict (empty if `shared` built nothing in graph); do not modify it.
  """
  return _VALUE_KEYS.get(graph, {})


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

  In a graph, reshaping the same tensor to the same shape again in the same
  device scope (outside control dependencies) gives the first reshape's
  result: a matrix view of an activation serves all matmuls that read it.

  Args:
    x: a tf.Tensor.
    shape: the new static shape, a list of ints.

  Returns:
    the reshaped tensor.
  """
  shape = [int(d) for d in shape]
  if x.shape.rank is not None and x.shape.as_list() == shape:
    return x
  if tf.executing_eagerly():
    return tf.reshape(x, shape)
  graph = tf.compat.v1.get_default_graph()
  scope = _scope_key(graph)
  # pylint: disable-next=protected-access
  if scope is None or graph._control_dependencies_stack:
    return tf.reshape(x, constant(shape))
  cache = _RESHAPES.setdefault(graph, {})
  key = (scope, id(x), tuple(shape))
  hit = cache.get(key)
  if hit is not None and hit[0] is x:
    return hit[1]
  y = tf.reshape(x, constant(shape))
  cache[key] = (x, y)
  return y
