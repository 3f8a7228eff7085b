"""mesh_tensorflow.auto_mtf: automatic layouts that minimize peak memory."""
# pylint: disable=g-importing-member,useless-import-alias

from mesh_tensorflow.auto_mtf import api as api
from mesh_tensorflow.auto_mtf import graph_interface as graph_interface
from mesh_tensorflow.auto_mtf import layout_optimizer as layout_optimizer
from mesh_tensorflow.auto_mtf import memory_estimator as memory_estimator
from mesh_tensorflow.auto_mtf import (
  print_cp_model_solution as print_cp_model_solution,
)
from mesh_tensorflow.auto_mtf import scheduler as scheduler
from mesh_tensorflow.auto_mtf import valid_layouts as valid_layouts
from mesh_tensorflow.auto_mtf.api import layout as layout
from mesh_tensorflow.auto_mtf.api import (
  layout_and_mesh_shape as layout_and_mesh_shape,
)
from mesh_tensorflow.auto_mtf.api import (
  layout_and_mesh_shape_for_step_time as layout_and_mesh_shape_for_step_time,
)
from mesh_tensorflow.auto_mtf.api import (
  layout_for_step_time as layout_for_step_time,
)

__all__ = [
  "api",
  "graph_interface",
  "layout",
  "layout_and_mesh_shape",
  "layout_and_mesh_shape_for_step_time",
  "layout_for_step_time",
  "layout_optimizer",
  "memory_estimator",
  "print_cp_model_solution",
  "scheduler",
  "valid_layouts",
]
