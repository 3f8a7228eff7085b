"""TpuBackend: SimdMeshImpl's communication on TPU replicas (tpu_ops).

The lowered mtf program is the program of ONE replica; the caller runs it with
one TPU replica per mesh processor (`tf.compat.v1.tpu.replicate`,
TPUEstimator with `num_cores_per_replica=1`, ...). The backend never calls
replicate itself. Collectives map onto the XLA cross-replica ops of
`tensorflow.python.tpu.ops.tpu_ops` (TF 2.21):

  allreduce_sum -> CrossReplicaSum      (tpu_ops.cross_replica_sum)
  all_gather    -> AllToAll of tiled copies (default), or the original's
                   one-hot-masked CrossReplicaSum
  all_to_all    -> AllToAll             (tpu_ops.all_to_all)
  permute       -> CollectivePermute    (tpu_ops.collective_permute)
  replica_pnum  -> TPUReplicatedInput of per-replica constants

TF 2.21 has no TPU all-gather op in tpu_ops/raw_ops (XLA's AllGather is only
reachable through DTensor/SPMD internals), hence the AllToAll formulation:
every replica sends one copy of its tensor to every group member, which moves
as many bytes as a true all-gather and is bit-exact for every dtype.

Differences from the original (on purpose): all_to_all sends float32 as
float32 (the original cast it to bfloat16); permute and the masked all-gather
carry non-native dtypes as int32 bit patterns (exact) instead of float32.

None of this can run without a TPU; graphs can still be built on CPU.
"""

from __future__ import annotations

from typing import Any, Callable, List, Sequence, Tuple
import weakref

import tensorflow as tf
from tensorflow.python.tpu.ops import tpu_ops

from mesh_tensorflow._src.mesh_impls import simd_backend

__all__ = ["TpuBackend"]

_ALL_GATHER_MODES = ("all_to_all", "cross_replica_sum")
# dtypes CollectivePermute moves natively (as in the original).
_PERMUTE_NATIVE = (tf.float32, tf.bfloat16, tf.int32)


def _to_int32_bits(
  x: tf.Tensor,
) -> Tuple[tf.Tensor, Callable[[tf.Tensor], tf.Tensor]]:
  """Carries `x` exactly as int32 values; returns (carrier, restore_fn).

  4-byte types are bitcast, 1- and 2-byte types (and bool) widened, 8- and
  16-byte types bitcast to a trailing axis of 2 or 4 int32 words.
  """
  dtype = x.dtype
  if dtype == tf.int32:
    return x, lambda y: y
  if dtype == tf.bool:
    return tf.cast(x, tf.int32), lambda y: tf.cast(y, tf.bool)
  if not (dtype.is_integer or dtype.is_floating or dtype.is_complex):
    raise ValueError(
      f"TpuBackend cannot transfer tensors of dtype {dtype.name}"
    )
  size = dtype.size
  if size in (4, 8, 16):
    return (tf.bitcast(x, tf.int32), lambda y: tf.bitcast(y, dtype))
  if size in (1, 2):
    narrow = tf.int8 if size == 1 else tf.int16
    bits = x if dtype == narrow else tf.bitcast(x, narrow)

    def restore(y):
      y = tf.cast(y, narrow)
      return y if dtype == narrow else tf.bitcast(y, dtype)

    return tf.cast(bits, tf.int32), restore
  raise ValueError(f"TpuBackend cannot transfer tensors of dtype {dtype.name}")


def _normalize_axis(axis: int, rank: int, what: str) -> int:
  if not -rank <= axis < rank:
    raise ValueError(f"{what} {axis} out of range for a tensor of rank {rank}")
  return axis % rank


class TpuBackend(simd_backend.SimdBackend):
  """SimdBackend for TPU replicas; see the module docstring.

  Example (inside the computation passed to tf.compat.v1.tpu.replicate with 8
  replicas):
    backend = TpuBackend(8)
    y = backend.allreduce_sum(x, [[0, 1, 2, 3], [4, 5, 6, 7]])
  """

  def __init__(
    self,
    num_replicas: int,
    device_assignment: Any = None,
    allreduce_in_bfloat16_max_group_size: int = 8,
    *,
    all_gather_mode: str = "all_to_all",
  ):
    """Creates the backend.

    Args:
      num_replicas: number of TPU replicas (= mesh size).
      device_assignment: optional tf.tpu.experimental.DeviceAssignment; gives
        each replica's device (`tpu_device(replica=pnum)`).
      allreduce_in_bfloat16_max_group_size: bfloat16 allreduces over larger
        groups are summed in float32.
      all_gather_mode: "all_to_all" (default, exact) or "cross_replica_sum"
        (the original's one-hot mask + sum, 2x the traffic).

    Raises:
      ValueError: on a non-positive num_replicas, an unknown mode, or a
        device_assignment with a different number of replicas.
    """
    if (
      not isinstance(num_replicas, int)
      or isinstance(num_replicas, bool)
      or num_replicas <= 0
    ):
      raise ValueError(
        f"num_replicas must be a positive int, got {num_replicas!r}"
      )
    if all_gather_mode not in _ALL_GATHER_MODES:
      raise ValueError(
        f"all_gather_mode must be one of {_ALL_GATHER_MODES}, "
        f"got {all_gather_mode!r}"
      )
    da_replicas = getattr(device_assignment, "num_replicas", None)
    if (
      device_assignment is not None
      and da_replicas is not None
      and (da_replicas != num_replicas)
    ):
      raise ValueError(
        f"device_assignment has {da_replicas} replicas but the mesh has "
        f"{num_replicas} processors"
      )
    self._num_replicas = num_replicas
    self._device_assignment = device_assignment
    self._allreduce_in_bfloat16_max_group_size = (
      allreduce_in_bfloat16_max_group_size
    )
    self._all_gather_mode = all_gather_mode
    self._pnum_tensors = weakref.WeakKeyDictionary()

  def __repr__(self) -> str:
    return (
      f"TpuBackend(num_replicas={self._num_replicas}, "
      f"device_assignment={self._device_assignment!r}, "
      f"allreduce_in_bfloat16_max_group_size="
      f"{self._allreduce_in_bfloat16_max_group_size}, "
      f"all_gather_mode={self._all_gather_mode!r})"
    )

  @property
  def num_replicas(self) -> int:
    return self._num_replicas

  @property
  def device_assignment(self) -> Any:
    return self._device_assignment

  @property
  def allreduce_in_bfloat16_max_group_size(self) -> int:
    return self._allreduce_in_bfloat16_max_group_size

  def _groups(self, groups: Sequence[Sequence[int]]) -> List[List[int]]:
    return simd_backend.check_groups(groups, self._num_replicas)

  def replica_pnum(self) -> tf.Tensor:
    """TPUReplicatedInput of the constants 0..n-1, one per replica.

    Created once per graph, outside all rewrites (no control-flow or TPU
    context) and at the root name scope ("pnum_constants"), so that the TPU
    rewrite feeds replica p the constant p.
    """
    graph = tf.compat.v1.get_default_graph()
    pnum = self._pnum_tensors.get(graph)
    if pnum is None:
      with graph.name_scope(None), tf.control_dependencies(None):
        constants = [
          tf.constant(p, tf.int32, name="pnum_constant")
          for p in range(self._num_replicas)
        ]
        pnum = tpu_ops.tpu_replicated_input(constants, name="pnum_constants")
      self._pnum_tensors[graph] = pnum
    return pnum

  def allreduce_sum(
    self, x: tf.Tensor, groups: Sequence[Sequence[int]]
  ) -> tf.Tensor:
    """CrossReplicaSum over `groups`.

    float32 is summed natively; bfloat16 natively for groups of at most
    `allreduce_in_bfloat16_max_group_size` replicas, else in float32; every
    other dtype is summed in float32 and cast back (as the original).
    """
    groups = self._groups(groups)
    group_size = len(groups[0])
    x = tf.convert_to_tensor(x)
    if group_size == 1:
      return tf.identity(x)
    dtype = x.dtype
    if dtype == tf.float32:
      in_float32 = False
    elif dtype == tf.bfloat16:
      in_float32 = group_size > self._allreduce_in_bfloat16_max_group_size
    else:
      in_float32 = True
    y = tf.cast(x, tf.float32) if in_float32 else x
    y = tpu_ops.cross_replica_sum(y, groups)
    return tf.cast(y, dtype) if in_float32 else y

  def all_gather(
    self, x: tf.Tensor, groups: Sequence[Sequence[int]], axis: int
  ) -> tf.Tensor:
    """Concatenates `x` of the group members along `axis`, in group order."""
    groups = self._groups(groups)
    n = len(groups[0])
    x = tf.convert_to_tensor(x)
    axis = _normalize_axis(axis, x.shape.rank, "all_gather axis")
    if n == 1:
      return tf.identity(x)
    if self._all_gather_mode == "all_to_all":
      # Copy i goes to the i-th member; copies received are concatenated in
      # group order.
      tiled = tf.concat([x] * n, axis)
      return tpu_ops.all_to_all(
        tiled,
        concat_dimension=axis,
        split_dimension=axis,
        split_count=n,
        group_assignment=groups,
      )
    # Original formulation: place x in slot (my index in group) of n zero
    # slots, then sum over the group. Carried as int32 bits so the sum with
    # zeros is exact for every dtype (NaN, -0.0 included).
    bits, restore = _to_int32_bits(x)
    position = [0] * self._num_replicas
    for group in groups:
      for i, p in enumerate(group):
        position[p] = i
    my_position = tf.gather(
      tf.constant(position, tf.int32), self.replica_pnum()
    )
    expanded = tf.expand_dims(bits, axis)
    mask_shape = [1] * expanded.shape.rank
    mask_shape[axis] = n
    mask = tf.reshape(tf.equal(tf.range(n), my_position), mask_shape)
    slots = tf.where(mask, expanded, tf.zeros_like(expanded))
    summed = tpu_ops.cross_replica_sum(slots, groups)
    if summed.shape.is_fully_defined():
      shape = summed.shape.as_list()
    else:
      shape = tf.unstack(tf.shape(summed))
    merged = shape[:axis] + [shape[axis] * shape[axis + 1]] + shape[axis + 2 :]
    return restore(tf.reshape(summed, merged))

  def all_to_all(
    self,
    x: tf.Tensor,
    groups: Sequence[Sequence[int]],
    split_axis: int,
    concat_axis: int,
  ) -> tf.Tensor:
    """tpu_ops.all_to_all in the tensor's own dtype (no bfloat16 cast)."""
    groups = self._groups(groups)
    n = len(groups[0])
    x = tf.convert_to_tensor(x)
    rank = x.shape.rank
    split_axis = _normalize_axis(split_axis, rank, "all_to_all split_axis")
    concat_axis = _normalize_axis(concat_axis, rank, "all_to_all concat_axis")
    size = x.shape.as_list()[split_axis]
    if size is not None and size % n:
      raise ValueError(
        f"all_to_all: split axis {split_axis} of size {size} does not divide "
        f"into {n} pieces (group size) for tensor shape {x.shape}"
      )
    if n == 1:
      return tf.identity(x)
    return tpu_ops.all_to_all(
      x,
      concat_dimension=concat_axis,
      split_dimension=split_axis,
      split_count=n,
      group_assignment=groups,
    )

  def permute(
    self, x: tf.Tensor, source_target_pairs: Sequence[Tuple[int, int]]
  ) -> tf.Tensor:
    """CollectivePermute; zeros where this replica is no target.

    float32, bfloat16 and int32 go natively (as in the original); other
    dtypes travel as int32 bit patterns and are restored exactly.
    """
    x = tf.convert_to_tensor(x)
    pairs = [[int(s), int(t)] for s, t in source_target_pairs]
    for what, column in (("source", 0), ("target", 1)):
      ids = [p[column] for p in pairs]
      for i in ids:
        if not 0 <= i < self._num_replicas:
          raise ValueError(
            f"permute: {what} {i} out of range for "
            f"{self._num_replicas} replicas in {pairs}"
          )
      if len(set(ids)) != len(ids):
        raise ValueError(
          f"permute: a replica appears twice as {what} in {pairs}"
        )
    if not pairs:
      return tf.zeros_like(x)
    if x.dtype in _PERMUTE_NATIVE:
      return tpu_ops.collective_permute(x, pairs)
    bits, restore = _to_int32_bits(x)
    return restore(tpu_ops.collective_permute(bits, pairs))

  def device(self, physical_pnum: int) -> str:
    """`device_assignment.tpu_device(replica=p)`, else "/device:TPU:<p>".

    The default suits a single host; pass a device_assignment on pods.
    """
    if not 0 <= physical_pnum < self._num_replicas:
      raise ValueError(
        f"physical pnum {physical_pnum} out of range for "
        f"{self._num_replicas} replicas"
      )
    if self._device_assignment is not None:
      return self._device_assignment.tpu_device(replica=physical_pnum)
    return f"/device:TPU:{physical_pnum}"
