"""mesh_tensorflow.placement_mesh_impl: one TF device per processor."""
# pylint: disable=useless-import-alias

from mesh_tensorflow._src.mesh_impls.placement import (
  LaidOutTensor as LaidOutTensor,
)
from mesh_tensorflow._src.mesh_impls.placement import (
  LaidOutVariable as LaidOutVariable,
)
from mesh_tensorflow._src.mesh_impls.placement import (
  PlacementMeshImpl as PlacementMeshImpl,
)
from mesh_tensorflow._src.mesh_impls.placement import (
  allconcat_ring as allconcat_ring,
)
from mesh_tensorflow._src.mesh_impls.placement import (
  allreduce_ring as allreduce_ring,
)
from mesh_tensorflow._src.mesh_impls.placement import (
  allreduce_ring_single_shard as allreduce_ring_single_shard,
)
from mesh_tensorflow._src.mesh_impls.placement import (
  alltoall_pointtwise as alltoall_pointtwise,
)
from mesh_tensorflow._src.mesh_impls.placement import (
  alltoall_ring as alltoall_ring,
)

__all__ = [
  "LaidOutTensor",
  "LaidOutVariable",
  "PlacementMeshImpl",
  "allconcat_ring",
  "allreduce_ring",
  "allreduce_ring_single_shard",
  "alltoall_pointtwise",
  "alltoall_ring",
]
