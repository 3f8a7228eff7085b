"""Collectives over a list of per-device tf.Tensors (one group of processors).

Free functions of (slices, devices): the placement backend calls them once per
processor group. Results are lists aligned with the inputs, each placed on its
device.

When every device of the group is a CPU of one TF task (e.g. virtual CPUs),
the devices share host memory: moving a tensor between them is free (TF passes
the buffer, no copy) while every extra add or concat costs memory bandwidth on
the same cores. There the result is computed once, on the first device, and
the others take it with a (zero-copy) tf.identity, or in a graph read it.
"""

from __future__ import annotations

import functools
from typing import Callable, List, Sequence

import tensorflow as tf

# On devices with separate memories, below this many elements a reduction is
# done on one device and copied out; above it the work is split in shards, one
# per device (reduce-scatter, then all-gather), so every device adds a 1/n
# share.
_SHARDED_ALLREDUCE_MIN_SIZE = 1 << 14

_BINARY_REDUCTIONS = {
  "SUM": tf.add,
  "MAX": tf.maximum,
  "MIN": tf.minimum,
}


@functools.lru_cache(maxsize=None)
def _task_and_type(device: str):
  spec = tf.DeviceSpec.from_string(device or "")
  return (
    (spec.job or "localhost", spec.replica or 0, spec.task or 0),
    (spec.device_type or "CPU").upper(),
  )


def share_host_memory(devices: Sequence[str]) -> bool:
  """True iff all devices are CPUs of one task (so tensors move without copy).

  Unset job/replica/task fields mean the local default task.
  """
  keys = [_task_and_type(d) for d in devices]
  return all(k == (keys[0][0], "CPU") for k in keys)


def binary_reduction_fn(
  reduction_fn_string: str,
) -> Callable[[tf.Tensor, tf.Tensor], tf.Tensor]:
  """The TF function combining two tensors for a reduction name.

  Args:
    reduction_fn_string: "SUM", "MAX" or "MIN".

  Returns:
    tf.add, tf.maximum or tf.minimum.

  Raises:
    ValueError: for any other string.
  """
  try:
    return _BINARY_REDUCTIONS[reduction_fn_string]
  except KeyError:
    raise ValueError(
      "unknown reduction %r; expected one of %s"
      % (reduction_fn_string, sorted(_BINARY_REDUCTIONS))
    ) from None


def _reduce_list(
  xs: Sequence[tf.Tensor], reduction_fn_string: str
) -> tf.Tensor:
  """The reduction of the tensors of several devices, in a fixed order.

  A sum is a reduce_sum over the stacked terms, not tf.add / tf.add_n:
  Grappler's arithmetic optimiser merges trees of Add ops on one device
  into one AddN, which would take in this sum's terms along with the terms
  added to its result (a residual, other gradients). The AddN kernel adds
  its inputs after moving the first one whose buffer it may reuse to the
  front, and whether the buffer of a term read by other devices too (all
  of them, on devices sharing host memory) is free yet depends on their
  timing: the order of the additions, and the last bits of the sum, would
  change from run to run.
  """
  if reduction_fn_string == "SUM":
    return tf.reduce_sum(tf.stack(list(xs)), axis=0)
  return functools.reduce(binary_reduction_fn(reduction_fn_string), xs)


def compute_then_broadcast(
  fn, x: tf.Tensor, devices: Sequence[str]
) -> List[tf.Tensor]:
  """fn(x) on the first device; every other device takes a copy of it.

  In a graph, devices sharing host memory use that very tensor instead: their
  ops read it without a copy either way, and an identity per device would
  only cost graph-building time (eagerly, each copy is placed on its device).
  """
  with tf.device(devices[0]):
    y = fn(x)
  if not tf.executing_eagerly() and share_host_memory(devices):
    return [y] * len(devices)
  out = [y]
  for d in devices[1:]:
    with tf.device(d):
      out.append(tf.identity(y))
  return out


def reduce_then_broadcast(
  xs: Sequence[tf.Tensor],
  devices: Sequence[str],
  reduction_fn_string: str = "SUM",
) -> List[tf.Tensor]:
  """Reduces on the first device, then every device reads the result."""
  if len(xs) == 1:
    return list(xs)
  return compute_then_broadcast(
    lambda _: _reduce_list(xs, reduction_fn_string), xs[0], devices
  )


def allreduce(
  xs: Sequence[tf.Tensor],
  devices: Sequence[str],
  reduction_fn_string: str = "SUM",
) -> List[tf.Tensor]:
  """All-reduce of equally shaped tensors; result on every device.

  Small tensors, and any tensor on devices sharing host memory, are reduced on
  the first device and copied out; large ones on separate devices are reduced
  in shards, one per device, then gathered.

  Args:
    xs: one tf.Tensor per device, all of one shape.
    devices: the device of each tensor.
    reduction_fn_string: "SUM", "MAX" or "MIN".

  Returns:
    a list with the reduced tf.Tensor on each device.
  """
  n = len(xs)
  if n == 1:
    return list(xs)
  size = xs[0].shape.num_elements()
  if (
    size is None
    or size < _SHARDED_ALLREDUCE_MIN_SIZE
    or size % n
    or share_host_memory(devices)
  ):
    return reduce_then_broadcast(xs, devices, reduction_fn_string)
  return sharded_allreduce(xs, devices, reduction_fn_string)


def sharded_allreduce(
  xs: Sequence[tf.Tensor],
  devices: Sequence[str],
  reduction_fn_string: str = "SUM",
) -> List[tf.Tensor]:
  """Reduce-scatter (device i reduces shard i), then all-gather the shards.

  Every device does 1/n of the arithmetic; needs a size divisible by n.
  """
  n = len(xs)
  shape = xs[0].shape
  pieces = []
  for x, d in zip(xs, devices):
    with tf.device(d):
      pieces.append(tf.split(tf.reshape(x, [-1]), n))
  reduced = []
  for i, d in enumerate(devices):
    with tf.device(d):
      reduced.append(_reduce_list([p[i] for p in pieces], reduction_fn_string))
  out = []
  for d in devices:
    with tf.device(d):
      out.append(tf.reshape(tf.concat(reduced, 0), shape))
  return out


def allconcat(
  xs: Sequence[tf.Tensor], devices: Sequence[str], concat_axis: int
) -> List[tf.Tensor]:
  """Every device gets the concatenation of all xs along concat_axis.

  Args:
    xs: one tf.Tensor per device, all of one shape.
    devices: the device of each tensor.
    concat_axis: the axis to concatenate on.

  Returns:
    a list with the concatenation on each device.
  """
  if len(xs) == 1:
    return list(xs)
  if share_host_memory(devices):
    return compute_then_broadcast(
      lambda _: tf.concat(list(xs), concat_axis), xs[0], devices
    )
  out = []
  for d in devices:
    with tf.device(d):
      out.append(tf.concat(list(xs), concat_axis))
  return out


def alltoall(
  xs: Sequence[tf.Tensor],
  devices: Sequence[str],
  split_axis: int,
  concat_axis: int,
) -> List[tf.Tensor]:
  """Device j gets piece j (along split_axis) of every x, concatenated.

  Args:
    xs: one tf.Tensor per device, all of one shape.
    devices: the device of each tensor.
    split_axis: the axis each x is split on into len(xs) pieces.
    concat_axis: the axis the received pieces are concatenated on.

  Returns:
    a list with the tf.Tensor received by each device.
  """
  n = len(xs)
  if n == 1:
    return list(xs)
  pieces = []
  for x, d in zip(xs, devices):
    with tf.device(d):
      pieces.append(tf.split(x, n, axis=split_axis))
  out = []
  for j, d in enumerate(devices):
    with tf.device(d):
      out.append(tf.concat([p[j] for p in pieces], concat_axis))
  return out
