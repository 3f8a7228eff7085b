"""mesh_tensorflow.plan: memory, FLOPs, communication and step time of a run.

`python -m mesh_tensorflow.plan --gin_file=... --mesh_shape=... --layout=...`
prints the plan of a gin-configured Transformer; plan_graph plans any mtf
graph. `--picture out.svg` (or --text_picture) draws which slice of each
variable every device holds; tensor_slices and its picture functions draw
any shape.
"""
# pylint: disable=useless-import-alias

from mesh_tensorflow._src.plan.hardware import (
  HARDWARE_PROFILES as HARDWARE_PROFILES,
)
from mesh_tensorflow._src.plan.hardware import (
  HardwareProfile as HardwareProfile,
)
from mesh_tensorflow._src.plan.hardware import (
  measure_this_machine as measure_this_machine,
)
from mesh_tensorflow._src.plan.picture import TensorSlices as TensorSlices
from mesh_tensorflow._src.plan.picture import graph_slices as graph_slices
from mesh_tensorflow._src.plan.picture import svg_picture as svg_picture
from mesh_tensorflow._src.plan.picture import tensor_slices as tensor_slices
from mesh_tensorflow._src.plan.picture import text_picture as text_picture
from mesh_tensorflow._src.plan.picture import write_picture as write_picture
from mesh_tensorflow._src.plan.planner import GinStep as GinStep
from mesh_tensorflow._src.plan.planner import Plan as Plan
from mesh_tensorflow._src.plan.planner import StepTime as StepTime
from mesh_tensorflow._src.plan.planner import build_gin_step as build_gin_step
from mesh_tensorflow._src.plan.planner import plan_gin as plan_gin
from mesh_tensorflow._src.plan.planner import plan_graph as plan_graph

__all__ = [
  "GinStep",
  "HARDWARE_PROFILES",
  "HardwareProfile",
  "Plan",
  "StepTime",
  "TensorSlices",
  "build_gin_step",
  "graph_slices",
  "measure_this_machine",
  "plan_gin",
  "plan_graph",
  "svg_picture",
  "tensor_slices",
  "text_picture",
  "write_picture",
]

if __name__ == "__main__":
  import sys  # pylint: disable=g-import-not-at-top

  from mesh_tensorflow._src.plan import report  # pylint: disable=g-import-not-at-top

  sys.exit(report.main(sys.argv[1:]))
