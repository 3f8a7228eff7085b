"""Running a function once per device, and regrouping per-device results.

`parallel` calls a function under each of several devices; its results (one
list per device) are regrouped per output by `transpose_list_of_lists`.
"""

from __future__ import annotations

from typing import Callable, List, Sequence

import tensorflow as tf


def parallel(devices: Sequence[str], fn: Callable, *args, **kwargs) -> list:
  """Calls fn once per device; list args/kwargs are indexed per device.

  Each call runs under tf.device(devices[i]) and variable scope `parallel_<i>`.

  Args:
    devices: the device strings.
    fn: a function, or a list with one function per device.

  Returns:
    a list with the result of each call.
  """
  n = len(devices)
  for a in list(args) + list(kwargs.values()):
    if not isinstance(a, list) or len(a) != n:
      raise ValueError(
        "parallel: every argument must be a list of length %d "
        "(one per device), got %r" % (n, a)
      )
  results = []
  for i, device in enumerate(devices):
    with tf.device(device), tf.compat.v1.variable_scope("parallel_%d" % i):
      results.append(
        fn(*[a[i] for a in args], **{k: v[i] for k, v in kwargs.items()})
      )
  return results


def transpose_list_of_lists(lol: Sequence[Sequence]) -> List[list]:
  """Transposes a list of equal-length lists.

  Args:
    lol: a non-empty list of lists of equal length.

  Returns:
    a list of lists: result[j][i] = lol[i][j].
  """
  if not lol:
    raise ValueError("cannot transpose an empty list of lists")
  return [list(x) for x in zip(*lol)]


__all__ = ["parallel", "transpose_list_of_lists"]
