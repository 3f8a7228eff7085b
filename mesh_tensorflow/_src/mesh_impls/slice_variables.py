"""Creation of per-processor slice variables from an mtf variable's master.

Shared by the placement and SIMD backends: eagerly (and in tf.function, where
variables are made under tf.init_scope) a slice starts as a copy of its part
of the master; in a legacy tf.compat.v1 graph it starts as zeros and the
original protocol applies (run the initializers, then
lowering.copy_masters_to_slices()).
"""

from __future__ import annotations

from typing import Callable, Sequence

import tensorflow as tf

from mesh_tensorflow._src import graph_constants
from mesh_tensorflow._src import mesh_impl as mesh_impl_lib

__all__ = ["slice_variable_creator"]


def slice_variable_creator(
  variable,
  name: str,
  device: str,
  begin: Sequence[int],
  slice_shape: Sequence[int],
  graph_collections: Sequence[str] = (tf.compat.v1.GraphKeys.LOCAL_VARIABLES,),
) -> Callable[[], tf.Variable]:
  """A zero-argument function creating one slice variable of `variable`.

  Args:
    variable: the mtf Variable (its master gives the initial value).
    name: the slice variable's name, e.g. "w_slice_3".
    device: where the slice lives.
    begin: the slice's offsets in the full (master) tensor.
    slice_shape: the slice's shape.
    graph_collections: collections of the slice in a legacy graph.
  """

  def create():
    with tf.device(device):
      if tf.executing_eagerly():
        init = tf.cast(
          mesh_impl_lib.static_slice(variable.get_master(), begin, slice_shape),
          variable.slice_dtype,
        )
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
