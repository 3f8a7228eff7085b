"""Creation of per-processor slice variables from an mtf variable's master.

Shared by the placement and SIMD backends: eagerly (and in tf.function, where
variables are made under tf.init_scope) a slice starts as a copy of its part
of the master; in a legacy tf.compat.v1 graph it starts as zeros and the
original protocol applies (run the initializers, then
lowering.copy_masters_to_slices()).
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import tensorflow as tf

from mesh_tensorflow._src import graph_constants
from mesh_tensorflow._src import mesh_impl as mesh_impl_lib

__all__ = ["MasterParts", "slice_variable_creator"]


class MasterParts:
  """The parts of one mtf variable's master, each computed once (eagerly).

  Slices of many processors start from the same part of the master (the
  replicas over mesh axes the variable is not split along); reading the
  master once and each distinct part once keeps the eager work of making
  the slices from growing with those replicas.

  Args:
    variable: the mtf Variable.
  """

  def __init__(self, variable):
    self._variable = variable
    self._master = None
    self._parts = {}

  def __call__(self, begin: Sequence[int], slice_shape: Sequence[int]):
    """The part of the master at `begin` (a tf.Tensor of the slice dtype).

    Args:
      begin: the part's offsets in the full (master) tensor.
      slice_shape: the part's shape.
    """
    key = (tuple(begin), tuple(slice_shape))
    if key not in self._parts:
      if self._master is None:
        self._master = self._variable.get_master()
      self._parts[key] = tf.cast(
        mesh_impl_lib.static_slice(self._master, list(begin), slice_shape),
        self._variable.slice_dtype,
      )
    return self._parts[key]


def slice_variable_creator(
  variable,
  name: str,
  device: str,
  begin: Sequence[int],
  slice_shape: Sequence[int],
  graph_collections: Sequence[str] = (tf.compat.v1.GraphKeys.LOCAL_VARIABLES,),
  master_parts: Optional[MasterParts] = None,
) -> Callable[[], tf.Variable]:
  """A zero-argument function creating one slice variable of `variable`.

  Args:
    variable: the mtf Variable (its master gives the initial value).
    name: the slice variable's name, e.g. "w_slice_3".
    device: where the slice lives.
    begin: the slice's offsets in the full (master) tensor.
    slice_shape: the slice's shape.
    graph_collections: collections of the slice in a legacy graph.
    master_parts: where to take the eager initial value from (shared by the
      slices of one variable); by default the master is read for this slice.
  """

  def create():
    with tf.device(device):
      if tf.executing_eagerly():
        parts = master_parts or MasterParts(variable)
        init = parts(begin, slice_shape)
        return tf.Variable(init, name=name, trainable=False)
      dtype = variable.slice_dtype
      # One zeros tensor per device, shape and dtype serves all slices.
      init = graph_constants.shared(
        ("zeros", tuple(slice_shape), dtype.name),
        lambda: tf.zeros(slice_shape, dtype),
      )
      return tf.compat.v1.Variable(
        init,
        name=name,
        trainable=False,
        collections=list(graph_collections),
        use_resource=True,
      )

  return create
