"""mesh_tensorflow.plan: memory, FLOPs, communication and step time of a run.

`python -m mesh_tensorflow.plan --gin_file=... --mesh_shape=... --layout=...`
prints the plan of a gin-configured Transformer; plan_graph plans any mtf
graph.
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
from mesh_tensorflow._src.plan.planner import Plan as Plan
from mesh_tensorflow._src.plan.planner import StepTime as StepTime
from mesh_tensorflow._src.plan.planner import plan_gin as plan_gin
from mesh_tensorflow._src.plan.planner import plan_graph as plan_graph

__all__ = [
  "HARDWARE_PROFILES",
  "HardwareProfile",
  "Plan",
  "StepTime",
  "measure_this_machine",
  "plan_gin",
  "plan_graph",
]

if __name__ == "__main__":
  import sys  # pylint: disable=g-import-not-at-top

  from mesh_tensorflow._src.plan import report  # pylint: disable=g-import-not-at-top

  sys.exit(report.main(sys.argv[1:]))
