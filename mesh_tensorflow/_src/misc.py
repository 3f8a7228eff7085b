"""Small helpers of the original's public API."""

from __future__ import annotations

from typing import Callable, List, Sequence

import tensorflow as tf

from mesh_tensorflow._src.shapes import convert_to_shape


def parallel(devices: Sequence[str], fn: Callable, *args, **kwargs) -> list:
  """Calls fn once per device; list args/kwargs are indexed per device.

  Each call runs under tf.device(devices[i]) and variable scope `parallel_<i>`.
  """
  n = len(devices)
  for a in list(args) + list(kwargs.values()):
    if not isinstance(a, list) or len(a) != n:
      raise ValueError("parallel: every argument must be a list of length %d "
                       "(one per device), got %r" % (n, a))
  results = []
  for i, device in enumerate(devices):
    with tf.device(device), tf.compat.v1.variable_scope("parallel_%d" % i):
      results.append(fn(*[a[i] for a in args],
                        **{k: v[i] for k, v in kwargs.items()}))
  return results


def transpose_list_of_lists(lol: Sequence[Sequence]) -> List[list]:
  if not lol:
    raise ValueError("cannot transpose an empty list of lists")
  return [list(x) for x in zip(*lol)]


def verify_no_new_dims(input_shapes, output_shape) -> None:
  """ValueError if output_shape has a dimension no input has."""
  all_dims = set()
  for s in input_shapes:
    all_dims.update(convert_to_shape(s).dims)
  for d in convert_to_shape(output_shape).dims:
    if d not in all_dims:
      raise ValueError("output dimension %s is not in any input shape %s"
                       % (d, [convert_to_shape(s).to_string
                              for s in input_shapes]))


__all__ = ["parallel", "transpose_list_of_lists", "verify_no_new_dims"]
