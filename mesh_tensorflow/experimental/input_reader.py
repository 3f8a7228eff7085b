"""mesh_tensorflow.experimental.input_reader: per-processor input slices."""
# pylint: disable=useless-import-alias

from mesh_tensorflow._src.experimental.input_reader import (
  PlacementMeshImplInputReader as PlacementMeshImplInputReader,
)
from mesh_tensorflow._src.experimental.input_reader import (
  ProcessDevices as ProcessDevices,
)
from mesh_tensorflow._src.experimental.input_reader import (
  SimdMeshImplInputReader as SimdMeshImplInputReader,
)
from mesh_tensorflow._src.experimental.input_reader import (
  SubBatchSlicer as SubBatchSlicer,
)

__all__ = [
  "PlacementMeshImplInputReader",
  "ProcessDevices",
  "SimdMeshImplInputReader",
  "SubBatchSlicer",
]
