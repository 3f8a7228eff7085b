"""mesh_tensorflow.auto_mtf.api: layouts of least memory or step time."""
# pylint: disable=g-importing-member,useless-import-alias

from mesh_tensorflow._src.auto_mtf.api import layout as layout
from mesh_tensorflow._src.auto_mtf.api import (
  layout_and_mesh_shape as layout_and_mesh_shape,
)
from mesh_tensorflow._src.auto_mtf.api import (
  mesh_shape_iterator as _mesh_shape_iterator,  # noqa: F401
)
from mesh_tensorflow._src.auto_mtf.step_time import (
  StepTimeLayout as StepTimeLayout,
)
from mesh_tensorflow._src.auto_mtf.step_time import (
  layout_and_mesh_shape_for_step_time as layout_and_mesh_shape_for_step_time,
)
from mesh_tensorflow._src.auto_mtf.step_time import (
  layout_for_step_time as layout_for_step_time,
)

__all__ = [
  "StepTimeLayout",
  "layout",
  "layout_and_mesh_shape",
  "layout_and_mesh_shape_for_step_time",
  "layout_for_step_time",
]
