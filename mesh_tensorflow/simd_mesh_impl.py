"""mesh_tensorflow.simd_mesh_impl: one SPMD program per processor (TPU, collectives)."""
# pylint: disable=useless-import-alias

from mesh_tensorflow._src.mesh_impls.simd import LaidOutTensor as LaidOutTensor
from mesh_tensorflow._src.mesh_impls.simd import (
  LaidOutVariable as LaidOutVariable,
)
from mesh_tensorflow._src.mesh_impls.simd import SimdMeshImpl as SimdMeshImpl
from mesh_tensorflow._src.mesh_impls.tpu_topology import (
  HierarchicalTiling as HierarchicalTiling,
)
from mesh_tensorflow._src.mesh_impls.tpu_topology import (
  _logical_1d_to_physical_subspace_auto as _logical_1d_to_physical_subspace_auto,
)
from mesh_tensorflow._src.mesh_impls.tpu_topology import (
  _logical_to_physical_v1 as _logical_to_physical_v1,
)
from mesh_tensorflow._src.mesh_impls.tpu_topology import _ring_2d as _ring_2d
from mesh_tensorflow._src.mesh_impls.tpu_topology import (
  auto_logical_to_physical_tpu as auto_logical_to_physical_tpu,
)
from mesh_tensorflow._src.mesh_impls.tpu_topology import (
  physical_shape_3d_from_topology_proto_4d as physical_shape_3d_from_topology_proto_4d,
)

__all__ = [
  "HierarchicalTiling",
  "LaidOutTensor",
  "LaidOutVariable",
  "SimdMeshImpl",
  "auto_logical_to_physical_tpu",
  "physical_shape_3d_from_topology_proto_4d",
]
