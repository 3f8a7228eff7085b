"""mesh_tensorflow.utils: small helpers used by mtf programs and drivers."""
# pylint: disable=g-importing-member,useless-import-alias

import contextlib
from typing import Iterator

import tensorflow as tf

from mesh_tensorflow._src.host_call import create_host_call as create_host_call
from mesh_tensorflow._src.host_call import remove_summaries as remove_summaries
from mesh_tensorflow._src.ops.summary import SCALAR_SUMMARIES_COLLECTION_KEY
from mesh_tensorflow._src.topology_rank import topology_rank as topology_rank
from mesh_tensorflow._src.variable_placer import (
  BalancedVariablePlacer as BalancedVariablePlacer,
)
from mesh_tensorflow._src.virtual_devices import (
  configure_virtual_cpus as configure_virtual_cpus,
)


@contextlib.contextmanager
def outside_all_rewrites() -> Iterator[None]:
  """Escapes control-flow (and TPU rewrite) contexts: no control deps inside."""
  with tf.control_dependencies(None):
    yield


__all__ = [
  "BalancedVariablePlacer",
  "SCALAR_SUMMARIES_COLLECTION_KEY",
  "configure_virtual_cpus",
  "create_host_call",
  "outside_all_rewrites",
  "remove_summaries",
  "topology_rank",
]
