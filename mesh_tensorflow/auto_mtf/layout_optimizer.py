"""mesh_tensorflow.auto_mtf.layout_optimizer: the layout integer program."""
# pylint: disable=g-importing-member,useless-import-alias,unused-import

from mesh_tensorflow._src.auto_mtf.layout_optimizer import (
  LayoutOptimizer as LayoutOptimizer,
)
from mesh_tensorflow._src.auto_mtf.layout_optimizer import (
  SolverError as SolverError,
)
from mesh_tensorflow._src.auto_mtf.layout_optimizer import (
  generate_assignments as _generate_assignments,  # noqa: F401
)
from mesh_tensorflow._src.auto_mtf.layout_optimizer import (
  global_var_name as _global_var_name,  # noqa: F401
)
from mesh_tensorflow._src.auto_mtf.layout_optimizer import (
  local_var_name as _local_var_name,  # noqa: F401
)

__all__ = ["LayoutOptimizer", "SolverError"]
