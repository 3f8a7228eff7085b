"""BalancedVariablePlacer: spreads variables over devices by bytes.

Used as `mtf.Mesh(graph, name, variable_placer=placer)`: master variables are
then created under `tf.device(placer.device_function)`. TensorFlow accepts a
device *function* only while building a graph (tf.compat.v1 graph mode, or
ops traced into a graph); in eager mode `tf.device` rejects functions.
"""

from __future__ import annotations

import heapq
from typing import List, Optional, Sequence

from absl import logging
import tensorflow as tf

# Op types that create a variable (reference and resource variables).
_VARIABLE_OP_TYPES = frozenset(["Variable", "VariableV2", "VarHandleOp"])


class BalancedVariablePlacer:
  """Places each new variable on the device with the fewest bytes so far.

  Ties go to the device listed first. Non-variable ops (initializers, reads,
  assignments created with a variable) go to the device chosen last.

  Example:
    In a tf.compat.v1 graph, the 64-byte w1 goes to cpu:0, then w2 and w3
    (16 bytes each) both to cpu:1, which has fewer bytes:

    >>> placer = BalancedVariablePlacer(["/cpu:0", "/cpu:1"])
    >>> with tf.Graph().as_default():
    ...   graph = mtf.Graph()
    ...   mesh = mtf.Mesh(graph, "my_mesh", variable_placer=placer)
    ...   for name, shape in [("w1", "a:4;b:4"), ("w2", "a:4"), ("w3", "a:4")]:
    ...     _ = mtf.get_variable(mesh, name, shape)
    >>> [v.master_device for v in graph.all_variables]
    ['/cpu:0', '/cpu:1', '/cpu:1']
    >>> placer
    BalancedVariablePlacer(devices=['/cpu:0', '/cpu:1'], usage=[64, 32])
  """

  def __init__(
    self, devices: Sequence[str], init_usage: Optional[Sequence[int]] = None
  ):
    """Starts with the given usage of each device.

    Args:
      devices: device strings to spread variables over.
      init_usage: bytes already used on each device (default all 0), e.g. to
        keep room on a host that also runs the input pipeline.

    Raises:
      ValueError: if devices is empty or init_usage has another length.
    """
    devices = list(devices)
    if not devices:
      raise ValueError("BalancedVariablePlacer needs at least one device")
    if init_usage is None:
      init_usage = [0] * len(devices)
    init_usage = list(init_usage)
    if len(init_usage) != len(devices):
      raise ValueError(
        "BalancedVariablePlacer: init_usage has %d entries for "
        "%d devices %s" % (len(init_usage), len(devices), devices)
      )
    self._devices = devices
    self._usage = list(init_usage)
    # (bytes used, device index): the smallest index wins ties.
    self._heap = [(usage, i) for i, usage in enumerate(init_usage)]
    heapq.heapify(self._heap)
    self._last_device = devices[0]

  @property
  def devices(self) -> List[str]:
    """The device strings variables are spread over."""
    return list(self._devices)

  @property
  def usage(self) -> List[int]:
    """Bytes placed so far on each device (aligned with `devices`)."""
    return list(self._usage)

  def device_function(self, var) -> str:
    """The device for the tf.Operation being created (`var`, as the original).

    Args:
      var: the tf.Operation being placed.

    Returns:
      the device string: for a variable op, the device with the least usage so
      far (whose usage then grows by the variable's size); for other ops, the
      device of the last variable placed.

    Raises:
      ValueError: if a variable op has a shape that is not fully known.
    """
    op = var
    if op.type not in _VARIABLE_OP_TYPES:
      return self._last_device
    shape = tf.TensorShape(op.get_attr("shape"))
    if not shape.is_fully_defined():
      raise ValueError(
        "BalancedVariablePlacer: variable op %r has shape %s; "
        "a fully known shape is needed to balance bytes" % (op.name, shape)
      )
    size = shape.num_elements() * tf.as_dtype(op.get_attr("dtype")).size
    usage, index = heapq.heappop(self._heap)
    usage += size
    heapq.heappush(self._heap, (usage, index))
    self._usage[index] = usage
    device = self._devices[index]
    logging.debug(
      "BalancedVariablePlacer: %s (%d bytes) -> %s (now %d bytes)",
      op.name,
      size,
      device,
      usage,
    )
    self._last_device = device
    return device

  def __repr__(self) -> str:
    return "BalancedVariablePlacer(devices=%r, usage=%r)" % (
      self._devices,
      self._usage,
    )
