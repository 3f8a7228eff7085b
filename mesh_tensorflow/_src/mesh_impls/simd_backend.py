"""The communication backend interface of SimdMeshImpl.

SimdMeshImpl lowers an mtf graph to the program of ONE replica; every replica
runs the same program. A `SimdBackend` supplies what that program needs from
the runtime: the replica's own (physical) processor number and the cross-replica
collectives. Processor numbers given to a backend are always PHYSICAL replica
ids (SimdMeshImpl maps logical to physical before calling).

Two backends exist:
  - "tpu" (simd_tpu.TpuBackend): tf.compat.v1.tpu.replicate + tpu_ops.
  - "collective" (simd_collective.CollectiveBackend): TF collective ops over
    local devices (virtual CPUs, GPUs), replicas run by SimdMeshImpl.replicate.
"""

import abc
from typing import Callable, List, Optional, Sequence, Tuple

import tensorflow as tf

from mesh_tensorflow._src import tpu_variables

__all__ = ["SimdBackend"]


class SimdBackend(abc.ABC):
  """Per-replica communication for a SIMD (single program) mesh.

  Groups are lists of lists of physical pnums that partition all replicas; a
  replica takes part in the group containing its own pnum. Every replica calls
  the same collectives in the same order.
  """

  @abc.abstractmethod
  def replica_pnum(self) -> tf.Tensor:
    """This replica's PHYSICAL processor number, an int32 scalar tensor."""

  @abc.abstractmethod
  def allreduce_sum(
    self, x: tf.Tensor, groups: Sequence[Sequence[int]]
  ) -> tf.Tensor:
    """Sum of `x` over the replicas of this replica's group.

    Args:
      x: this replica's tensor (same shape and dtype on every replica).
      groups: a partition of all physical pnums.

    Returns:
      a tensor shaped like `x`.
    """

  @abc.abstractmethod
  def all_gather(
    self, x: tf.Tensor, groups: Sequence[Sequence[int]], axis: int
  ) -> tf.Tensor:
    """Concatenation along `axis` of `x` from each replica, in group order.

    Args:
      x: this replica's tensor (same shape on every replica).
      groups: a partition of all physical pnums; the order inside a group is
        the concatenation order.
      axis: the tensor axis to concatenate along.

    Returns:
      a tensor whose `axis` is len(group) times larger.
    """

  @abc.abstractmethod
  def all_to_all(
    self,
    x: tf.Tensor,
    groups: Sequence[Sequence[int]],
    split_axis: int,
    concat_axis: int,
  ) -> tf.Tensor:
    """All-to-all within each group.

    `x` is split into len(group) equal pieces along `split_axis`; piece i goes
    to the i-th replica of the group, and the pieces received are concatenated
    along `concat_axis` in group order. Values are transferred exactly (no
    precision-reducing casts).
    """

  @abc.abstractmethod
  def permute(
    self, x: tf.Tensor, source_target_pairs: Sequence[Tuple[int, int]]
  ) -> tf.Tensor:
    """Sends `x` from each source replica to its target replica.

    Args:
      x: this replica's tensor.
      source_target_pairs: (source, target) physical pnums; each replica is a
        source at most once and a target at most once.

    Returns:
      the tensor received by this replica, or zeros shaped like `x` where this
      replica is no target.
    """

  @abc.abstractmethod
  def device(self, physical_pnum: int) -> str:
    """The device name where replica `physical_pnum` keeps its variables."""

  # Non-abstract hooks with the TPU behaviour as default.

  def replica_variable(self, name: str, slice_variables: Sequence):
    """The variable this replica's program reads and assigns.

    Args:
      name: the base name (the mtf variable's name).
      slice_variables: one slice variable per PHYSICAL pnum (index = pnum).

    Returns:
      by default a tpu_variables.ReplicatedVariable, which resolves to the
      replica's own slice inside a TPU replicate context.
    """
    return tpu_variables.ReplicatedVariable(name, list(slice_variables))

  def slice_handles_may_omit_shape(self) -> bool:
    """Whether slices made now may have handles without a shape.

    Such handles build fewer kernels when made eagerly (see
    slice_variables.shape_source); a backend that says so hands every
    function taking one a handle with the shape.
    """
    return False

  def while_loop(self, cond: Callable, body: Callable, loop_vars, **kwargs):
    """A tf while loop of one replica's program (default: tf.while_loop).

    Args:
      cond: the loop condition, a function of the loop tensors.
      body: the loop body, a function of the loop tensors.
      loop_vars: the initial loop tensors.
      **kwargs: further tf.while_loop arguments.

    Returns:
      the final loop tensors.
    """
    return tf.while_loop(cond, body, loop_vars, **kwargs)

  def local_replica_pnums(self) -> Optional[List[int]]:
    """Physical pnums whose slice variables the current program updates.

    Used by copy_master_to_slices. None (the default) means all replicas: the
    copy ops are built once, outside the replicated computation.
    """
    return None


def check_groups(
  groups: Sequence[Sequence[int]], num_replicas: int
) -> List[List[int]]:
  """Validates that `groups` partitions range(num_replicas); returns lists."""
  groups = [list(g) for g in groups]
  flat = sorted(p for g in groups for p in g)
  if flat != list(range(num_replicas)):
    raise ValueError(
      f"group assignment {groups} is not a partition of the "
      f"{num_replicas} replicas"
    )
  sizes = {len(g) for g in groups}
  if len(sizes) != 1:
    raise ValueError(f"group assignment {groups} has groups of unequal sizes")
  return groups
