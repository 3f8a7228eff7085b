"""mesh_tensorflow.auto_mtf.scheduler: schedules with low peak memory."""
# pylint: disable=g-importing-member,useless-import-alias

from mesh_tensorflow._src.auto_mtf.scheduler import (
  minimize_peak_memory as minimize_peak_memory,
)

__all__ = ["minimize_peak_memory"]
