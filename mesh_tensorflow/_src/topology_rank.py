"""topology_rank: the rank of a TPU topology's mesh (mtf.utils.topology_rank).

Reads a tf.tpu.experimental.Topology, so it needs TensorFlow; the pure mapping
of logical to physical TPU processors is mesh_impls/tpu_topology.py.
"""

from __future__ import annotations

import tensorflow as tf


def topology_rank(topology) -> int:
  """Number of dimensions of a TPU topology's mesh (4 for [x, y, z, core]).

  Example:
    On a TPU, pass tf.tpu.experimental.initialize_tpu_system(resolver):

    >>> topology = tf.tpu.experimental.Topology(
    ...     mesh_shape=[2, 2, 1, 2],
    ...     device_coordinates=np.zeros([1, 1, 4], np.int32))
    >>> topology_rank(topology)
    4
    >>> topology_rank(topology.serialized())
    4
    >>> topology_rank([2, 2, 1, 2])
    4

  Args:
    topology: a tf.tpu.experimental.Topology, its serialized TopologyProto
      (bytes), or a mesh shape (a sequence of ints).

  Returns:
    the rank as an int.

  Raises:
    ValueError: if topology is none of these.
  """
  if isinstance(topology, bytes):
    topology = tf.tpu.experimental.Topology(serialized=topology)
  if isinstance(topology, tf.tpu.experimental.Topology):
    return int(topology.mesh_rank)
  try:
    return len(topology)
  except TypeError:
    raise ValueError(
      "topology_rank: expected a tf.tpu.experimental.Topology, "
      "serialized topology bytes or a mesh shape, got %r" % (topology,)
    ) from None
