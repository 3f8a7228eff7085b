"""mesh_tensorflow.auto_mtf.memory_estimator: memory cost of an mtf graph."""
# pylint: disable=g-importing-member,useless-import-alias

from mesh_tensorflow._src.auto_mtf.memory_estimator import (
  MemoryEstimator as MemoryEstimator,
)

__all__ = ["MemoryEstimator"]
