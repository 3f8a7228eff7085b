"""Virtual CPU devices: one physical CPU split into several logical ones.

A mesh on one machine (demos, benchmarks, tests) places its slices on
logical CPU devices "/cpu:0" ... "/cpu:N-1". TensorFlow creates them only if
they are configured before its runtime initialises (before the first op runs
or anything lists logical devices).
"""

from typing import List

import tensorflow as tf


def configure_virtual_cpus(num_cpus: int) -> List[str]:
  """Splits the first physical CPU into `num_cpus` logical CPU devices.

  Call it before TensorFlow initialises its runtime. If the runtime is
  already initialised with at least `num_cpus` logical CPUs (an earlier call,
  for example), those devices are used as they are.

  Example:
    >>> devices = configure_virtual_cpus(4)
    >>> devices
    ['/cpu:0', '/cpu:1', '/cpu:2', '/cpu:3']
    >>> mesh_impl = mtf.placement_mesh_impl.PlacementMeshImpl(
    ...     "rows:2;cols:2", "batch:rows", devices)
    >>> mesh_impl.devices
    ['/cpu:0', '/cpu:1', '/cpu:2', '/cpu:3']

  Args:
    num_cpus: how many logical CPU devices to create (at least 1).

  Returns:
    The device names "/cpu:0" ... "/cpu:<num_cpus - 1>".

  Raises:
    ValueError: if `num_cpus` is less than 1.
    RuntimeError: if TensorFlow's runtime is already initialised with fewer
      than `num_cpus` logical CPU devices (they can no longer be changed).
  """
  if num_cpus < 1:
    raise ValueError("num_cpus must be at least 1, got %d" % num_cpus)
  cpu = tf.config.list_physical_devices("CPU")[0]
  try:
    tf.config.set_logical_device_configuration(
      cpu, [tf.config.LogicalDeviceConfiguration()] * num_cpus
    )
  except RuntimeError as e:
    existing = len(tf.config.list_logical_devices("CPU"))
    if existing < num_cpus:
      raise RuntimeError(
        "cannot create %d virtual CPU devices: TensorFlow is already "
        "initialised with %d logical CPU device(s); call "
        "configure_virtual_cpus before anything runs a TensorFlow op or "
        "lists logical devices (%s)" % (num_cpus, existing, e)
      ) from e
  return ["/cpu:%d" % i for i in range(num_cpus)]
