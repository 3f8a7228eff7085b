"""Collective building blocks of CollectiveBackend, free of its state.

`collective_sum` builds a `CollectiveReduceV2` directly in a traced graph
(the raw op's argument conversion costs most of a collective's tracing
time); the codecs carry dtypes the CPU/GPU collective kernels do not take
(bool, bfloat16, small and unsigned integers, complex) as ones they do; the
axis helpers turn a stack of pieces into a concatenation and back.
"""

from __future__ import annotations

from typing import Sequence

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2
from tensorflow.core.framework import tensor_pb2
from tensorflow.core.framework import tensor_shape_pb2
from tensorflow.core.framework import types_pb2
from tensorflow.python.eager import record  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.framework import op_callbacks  # pylint: disable=g-direct-tensorflow-import

__all__ = [
  "NATIVE_DTYPES",
  "collective_sum",
  "encode_exact",
  "encode_for_sum",
  "merge_leading_axis",
  "split_leading_axis",
]

# dtypes the CPU/GPU collective kernels take.
NATIVE_DTYPES = (tf.float32, tf.float16, tf.float64, tf.int32, tf.int64)


def collective_sum(
  x: tf.Tensor,
  group_size: tf.Tensor,
  group_key: tf.Tensor,
  instance_key: int,
  ordering_token: Sequence[tf.Tensor],
  communication_hint: str,
  timeout_seconds: float,
) -> tf.Tensor:
  """tf.raw_ops.CollectiveReduceV2 summing x, built directly in the graph.

  The same op, inputs, attributes and names as the raw op builds, without
  its generic argument checks and conversions, which cost most of the
  collective's tracing time (hundreds of collectives per step on large
  meshes). Eagerly, while a gradient tape may record (the raw op records
  itself on the tape) and while op callbacks are on, the raw op is used.
  """
  if (
    tf.executing_eagerly()
    or record.could_possibly_record()
    or op_callbacks.should_invoke_op_callbacks()
  ):
    return tf.raw_ops.CollectiveReduceV2(
      input=x,
      group_size=group_size,
      group_key=group_key,
      instance_key=instance_key,
      ordering_token=ordering_token,
      merge_op="Add",
      final_op="Id",
      communication_hint=communication_hint,
      timeout_seconds=timeout_seconds,
    )
  graph = tf.compat.v1.get_default_graph()
  with graph.name_scope("CollectiveReduceV2") as scope:
    # pylint: disable-next=protected-access
    key = graph._create_op_internal(
      "Const",
      [],
      [tf.int32],
      name="instance_key",
      attrs={
        "value": attr_value_pb2.AttrValue(
          tensor=tensor_pb2.TensorProto(
            dtype=types_pb2.DT_INT32,
            tensor_shape=tensor_shape_pb2.TensorShapeProto(),
            int_val=[instance_key],
          )
        ),
        "dtype": attr_value_pb2.AttrValue(type=types_pb2.DT_INT32),
      },
    ).outputs[0]
    attrs = {
      "T": attr_value_pb2.AttrValue(type=x.dtype.as_datatype_enum),
      "merge_op": attr_value_pb2.AttrValue(s=b"Add"),
      "final_op": attr_value_pb2.AttrValue(s=b"Id"),
      "communication_hint": attr_value_pb2.AttrValue(
        s=communication_hint.encode()
      ),
      "timeout_seconds": attr_value_pb2.AttrValue(f=timeout_seconds),
      "Nordering_token": attr_value_pb2.AttrValue(i=len(ordering_token)),
    }
    # pylint: disable-next=protected-access
    op = graph._create_op_internal(
      "CollectiveReduceV2",
      [x, group_size, group_key, key] + list(ordering_token),
      [x.dtype],
      name=scope,
      attrs=attrs,
    )
  return op.outputs[0]


# ------------------------------------------------------------ dtype codecs
def encode_exact(x: tf.Tensor):
  """(tensor of a native collective dtype, decode fn), bit-exact."""
  dtype = x.dtype
  if dtype in NATIVE_DTYPES:
    return x, lambda y: y
  if dtype == tf.bool:
    return tf.cast(x, tf.int32), lambda y: tf.cast(y, tf.bool)
  if dtype in (tf.bfloat16,):
    return tf.cast(x, tf.float32), lambda y: tf.cast(y, dtype)
  if dtype in (tf.int8, tf.int16, tf.uint8, tf.uint16):
    return tf.cast(x, tf.int32), lambda y: tf.cast(y, dtype)
  if dtype == tf.uint32:
    return tf.cast(x, tf.int64), lambda y: tf.cast(y, dtype)
  if dtype == tf.uint64:
    return (tf.bitcast(x, tf.int64), lambda y: tf.bitcast(y, tf.uint64))
  if dtype.is_complex:
    return (
      tf.stack([tf.math.real(x), tf.math.imag(x)], -1),
      lambda y: tf.complex(y[..., 0], y[..., 1]),
    )
  raise TypeError("collective backend cannot transfer dtype %s" % dtype.name)


def encode_for_sum(x: tf.Tensor):
  """(tensor of a native dtype, decode fn) for a sum (bfloat16 sums in f32)."""
  dtype = x.dtype
  if dtype in NATIVE_DTYPES:
    return x, lambda y: y
  if dtype == tf.bool:  # Logical or, as a sum of 0/1.
    return tf.cast(x, tf.int32), lambda y: y > 0
  if dtype == tf.uint64:  # Two's complement sums wrap exactly like uint64.
    return tf.bitcast(x, tf.int64), lambda y: tf.bitcast(y, tf.uint64)
  if dtype.is_integer:
    wide = tf.int64 if dtype.size >= 4 else tf.int32
    return tf.cast(x, wide), lambda y: tf.cast(y, dtype)
  if dtype.is_floating:
    return tf.cast(x, tf.float32), lambda y: tf.cast(y, dtype)
  if dtype.is_complex:
    return encode_exact(x)
  raise TypeError("collective backend cannot sum dtype %s" % dtype.name)


# --------------------------------------------------------- axis plumbing
def merge_leading_axis(stacked: tf.Tensor, axis: int) -> tf.Tensor:
  """[n, d0, .., dk] -> concatenation of the n pieces along `axis`."""
  n = stacked.shape.as_list()[0]
  rest = stacked.shape.as_list()[1:]
  if not rest:
    raise ValueError("cannot concatenate scalars; stack them instead")
  if axis:
    perm = list(range(1, axis + 1)) + [0] + list(range(axis + 1, len(rest) + 1))
    stacked = tf.transpose(stacked, perm)
  new_shape = list(rest)
  new_shape[axis] *= n
  return tf.reshape(stacked, new_shape)


def split_leading_axis(x: tf.Tensor, axis: int, n: int) -> tf.Tensor:
  """x -> [n] + x.shape with axis divided by n (piece j = j-th block)."""
  shape = x.shape.as_list()
  split_shape = shape[:axis] + [n, shape[axis] // n] + shape[axis + 1 :]
  y = tf.reshape(x, split_shape)
  if axis:
    perm = [axis] + list(range(axis)) + list(range(axis + 1, len(split_shape)))
    y = tf.transpose(y, perm)
  return y
