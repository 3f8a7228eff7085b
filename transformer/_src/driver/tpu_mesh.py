"""Mapping the mtf mesh onto a TPU topology.

`plan_mesh` maps logical processors to physical ones with
`auto_logical_to_physical_tpu` (or a HierarchicalTiling spec) on the
topology's 3-d form, as the original's flags --logical_cores_per_chip and
--fold_xy say; replica r of the DeviceAssignment is the core of physical
processor r, so the TPU backend's replica ids are the physical pnums
SimdMeshImpl computes its collective groups with. `tpu_mesh_impl` makes the
SimdMeshImpl of such a plan, and `replica_host_devices` names the host CPU
that feeds each replica. Step 2 of the TPU driver (tpu.py).
"""

from __future__ import annotations

from typing import Any, List, NamedTuple, Optional

from absl import flags
from absl import logging
import numpy as np
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import simd_mesh_impl

__all__ = [
  "TpuMeshPlan",
  "plan_mesh",
  "replica_host_devices",
  "tpu_mesh_impl",
]


class TpuMeshPlan(NamedTuple):
  """Where each processor of an mtf mesh runs on a TPU slice.

  Attributes:
    mesh_shape: the mtf mesh shape.
    topology: the TPU topology.
    physical_shape: the 3-d grid of chips and cores the mapping works on:
      [y*z, x, cores], or [x*y, z, cores] with --fold_xy (as the original).
    logical_to_physical: the physical pnum of each logical pnum.
    device_assignment: replica r = the core of physical pnum r (row-major
      over physical_shape); with --logical_cores_per_chip=1 on one-core
      chips, TF's default assignment, which the mapping then names.
  """

  mesh_shape: mtf.Shape
  topology: Any
  physical_shape: List[int]
  logical_to_physical: List[int]
  device_assignment: Any


def _mesh_string(shape: mtf.Shape) -> str:
  """'batch:4;model:2', the form mesh_shape is given in."""
  return ";".join(f"{d.name}:{d.size}" for d in shape.dims)


def _topology_coordinates(
  physical_shape: List[int], tpu_mesh: List[int], pnum: int
) -> List[int]:
  """[x, y, z, core] of physical pnum (row-major over the 3-d physical_shape).

  The 3-d rows are the topology's y*z (z slower), or x*y (y slower) with
  --fold_xy; see physical_shape_3d_from_topology_proto_4d.
  """
  row, column, core = [int(c) for c in np.unravel_index(pnum, physical_shape)]
  x_size, y_size = tpu_mesh[0], tpu_mesh[1]
  if flags.FLAGS["fold_xy"].value:
    return [row % x_size, row // x_size, column, core]
  return [column, row % y_size, row // y_size, core]


def plan_mesh(
  mesh_shape,
  topology: tf.tpu.experimental.Topology,
  hierarchical_tiling_spec=None,
  *,
  tpu_name: str = "",
) -> TpuMeshPlan:
  """Maps the mtf mesh onto the TPU topology: one processor per core.

  Example:
    Mesh "batch:8" on a v3-8 walks the chips along a ring, two cores per
    chip:

    >>> from transformer._src.driver.tpu_connection import synthetic_topology
    >>> plan = plan_mesh("batch:8", synthetic_topology([2, 2, 1, 2]))
    >>> plan.logical_to_physical
    [0, 1, 2, 3, 6, 7, 4, 5]

  Args:
    mesh_shape: an mtf.Shape or its string.
    topology: the TPU topology (`initialize_tpu` or `synthetic_topology`).
    hierarchical_tiling_spec: optional HierarchicalTiling spec (used when the
      topology has z == 1, as in the original); default: the automatic
      mapping.
    tpu_name: the TPU's name, for error messages.

  Returns:
    a TpuMeshPlan.

  Raises:
    ValueError: naming the mesh and the topology, if the mesh's size is not
      the number of cores, or the tiling spec does not give the mesh shape.
  """
  mesh_shape = mtf.convert_to_shape(mesh_shape)
  tpu_mesh = [int(s) for s in topology.mesh_shape]
  num_cores = topology.num_tasks * topology.num_tpus_per_task
  where = f"TPU {tpu_name!r} " if tpu_name else "the TPU "
  if mesh_shape.size != num_cores:
    raise ValueError(
      f"mesh_shape {_mesh_string(mesh_shape)!r} has {mesh_shape.size} "
      f"processors but {where}(topology {tpu_mesh}: x, y, z, cores per "
      f"chip) has {num_cores} cores on {topology.num_tasks} host(s); use a "
      f"mesh of {num_cores} processors, e.g. 'batch:{num_cores}'"
    )
  sizes = mesh_shape.to_integer_list
  physical_shape = simd_mesh_impl.physical_shape_3d_from_topology_proto_4d(
    tpu_mesh
  )
  if hierarchical_tiling_spec is not None and tpu_mesh[2] > 1:
    logging.warning(
      "hierarchical_tiling_spec is ignored on %s(topology %s, z > 1): the "
      "automatic mapping places the mesh, as in the original",
      where,
      tpu_mesh,
    )
  device_assignment = None
  if hierarchical_tiling_spec is not None and tpu_mesh[2] == 1:
    tiling = simd_mesh_impl.HierarchicalTiling(
      hierarchical_tiling_spec, physical_shape
    )
    if tiling.mesh_shape.to_integer_list != sizes:
      raise ValueError(
        f"hierarchical_tiling_spec {hierarchical_tiling_spec} gives mesh "
        f"{_mesh_string(tiling.mesh_shape)!r} on {where}(physical shape "
        f"{physical_shape}), not mesh_shape {_mesh_string(mesh_shape)!r}"
      )
    logical_to_physical = tiling.logical_to_physical
  elif flags.FLAGS["logical_cores_per_chip"].value == 1 == tpu_mesh[3]:
    # One core per chip: as the original, the mapping names replicas of
    # TF's default device assignment (TPUEstimator's).
    device_assignment = tf.tpu.experimental.DeviceAssignment.build(
      topology, num_replicas=num_cores
    )
    logical_to_physical = simd_mesh_impl.auto_logical_to_physical_tpu(
      sizes, physical_shape, device_assignment=device_assignment
    )
  else:
    logical_to_physical = simd_mesh_impl.auto_logical_to_physical_tpu(
      sizes, physical_shape
    )
  try:
    if device_assignment is None:
      # Replica r is the core of physical pnum r.
      core_assignment = np.array(
        [
          [_topology_coordinates(physical_shape, tpu_mesh, p)]
          for p in range(mesh_shape.size)
        ],
        np.int32,
      )
      device_assignment = tf.tpu.experimental.DeviceAssignment(
        topology, core_assignment
      )
  except ValueError as e:
    raise ValueError(
      f"cannot place mesh {_mesh_string(mesh_shape)!r} on {where}(topology "
      f"{tpu_mesh}): {e}"
    ) from e
  return TpuMeshPlan(
    mesh_shape,
    topology,
    list(physical_shape),
    list(logical_to_physical),
    device_assignment,
  )


def tpu_mesh_impl(plan: TpuMeshPlan, layout_rules):
  """SimdMeshImpl lowering to TPU replicas as `plan` places them.

  Args:
    plan: from plan_mesh.
    layout_rules: the layout rules (mtf.LayoutRules or string).

  Returns:
    a SimdMeshImpl with the TPU backend.
  """
  return simd_mesh_impl.SimdMeshImpl(
    plan.mesh_shape,
    layout_rules,
    device_assignment=plan.device_assignment,
    logical_to_physical=plan.logical_to_physical,
    backend="tpu",
  )


def replica_host_devices(mesh_impl, job: Optional[str] = None) -> List[str]:
  """The host CPU that feeds each physical replica.

  TPU backend: the host owning the replica's core. Collective backend: the
  CPU of the local host (one host).

  Args:
    mesh_impl: a SimdMeshImpl.
    job: the TPU workers' job name (None: the device assignment's default).

  Returns:
    a device name per physical pnum.
  """
  assignment = mesh_impl.device_assignment
  if assignment is not None:
    return [
      assignment.host_device(replica=r, job=job) for r in range(mesh_impl.size)
    ]
  return ["/device:CPU:0"] * mesh_impl.size
