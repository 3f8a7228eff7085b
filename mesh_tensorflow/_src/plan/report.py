"""The planner's command line: `python -m mesh_tensorflow.plan`.

Plans a gin-configured Transformer training step for one mesh and layout and
prints the per-device report, then the estimated step time on each hardware
profile asked for.
"""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional, Sequence

from mesh_tensorflow._src.plan import picture
from mesh_tensorflow._src.plan.hardware import HARDWARE_PROFILES
from mesh_tensorflow._src.plan.hardware import get_hardware_profile
from mesh_tensorflow._src.plan.planner import Plan
from mesh_tensorflow._src.plan.planner import build_gin_step
from mesh_tensorflow._src.plan.planner import format_bytes
from mesh_tensorflow._src.plan.planner import format_seconds


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
    prog="python -m mesh_tensorflow.plan",
    description=(
      "Per-device memory, FLOPs, communication and estimated step time of "
      "a gin-configured Transformer training step, built shape-only."
    ),
  )
  parser.add_argument(
    "--gin_file",
    action="append",
    default=[],
    help="gin file (as transformer.main takes it), e.g. models/bi_base.gin",
  )
  parser.add_argument(
    "--gin_param", action="append", default=[], help="gin binding"
  )
  parser.add_argument(
    "--mesh_shape", help="mesh, e.g. 'batch:8;model:4' (default: gin's)"
  )
  parser.add_argument(
    "--layout", help="layout rules, e.g. 'batch:batch;d_ff:model'"
  )
  parser.add_argument("--batch_size", type=int, help="sequences per step")
  parser.add_argument("--sequence_length", type=int, help="tokens per sequence")
  parser.add_argument("--vocab_size", type=int, default=32128)
  parser.add_argument(
    "--hardware",
    action="append",
    default=[],
    help="hardware profile (repeatable; 'all' for every published one): %s"
    % ", ".join(HARDWARE_PROFILES),
  )
  parser.add_argument(
    "--picture",
    help="draw which slice of each variable every device holds into this "
    "file: .svg, .png (needs matplotlib), else text",
  )
  parser.add_argument(
    "--text_picture",
    action="store_true",
    help="print that picture as text after the report",
  )
  parser.add_argument(
    "--tensors",
    help="comma-separated names of the variables, tensors ('op:0') or "
    "operations to draw (default: every variable)",
  )
  return parser


def hardware_table(plan: Plan, hardware: Sequence) -> str:
  """A table of the plan's estimated step time on several profiles.

  Profiles with fewer devices than the mesh are listed as not fitting.

  Args:
    plan: a Plan.
    hardware: HardwareProfiles or profile names.

  Returns:
    a multi-line string.
  """
  rows = [
    "%-13s %11s %11s %13s %10s  %s"
    % ("hardware", "step time", "compute", "communication", "memory", "fits")
  ]
  for name in hardware:
    hw = get_hardware_profile(name)
    if plan.num_devices > hw.max_devices:
      rows.append(
        "%-13s  (the mesh has %d devices, at most %d)"
        % (hw.name, plan.num_devices, hw.max_devices)
      )
      continue
    t = plan.step_time(hw)
    rows.append(
      "%-13s %11s %11s %13s %10s  %s"
      % (
        hw.name,
        format_seconds(t.total),
        format_seconds(t.compute),
        format_seconds(t.communication),
        format_bytes(hw.hbm_bytes),
        "yes" if plan.fits(hw) else "NO",
      )
    )
  return "\n".join(rows)


def main(argv: Optional[List[str]] = None) -> int:
  """Runs the command line.

  Args:
    argv: the arguments (default: sys.argv[1:]).

  Returns:
    the exit status: 0, or 2 for bad input (the error is printed).
  """
  args = _parser().parse_args(argv)
  hardware = []
  for name in args.hardware:
    if name == "all":
      hardware += [n for n in HARDWARE_PROFILES if n != "this_machine"]
    else:
      hardware.append(name)
  unknown = [name for name in hardware if name not in HARDWARE_PROFILES]
  if unknown:
    print(
      "error: unknown hardware profile %s; known profiles: %s"
      % (", ".join(map(repr, unknown)), ", ".join(HARDWARE_PROFILES)),
      file=sys.stderr,
    )
    return 2
  try:
    step = build_gin_step(
      args.gin_file,
      args.gin_param,
      mesh_shape=args.mesh_shape,
      layout_rules=args.layout,
      batch_size=args.batch_size,
      sequence_length=args.sequence_length,
      vocab_size=args.vocab_size,
    )
    plan = step.plan()
    slices = []
    if args.picture or args.text_picture:
      names = args.tensors.split(",") if args.tensors else None
      slices = picture.graph_slices(
        step.graph, step.mesh_shape, step.layout_rules, names
      )
  except (ValueError, OSError) as e:
    print("error: %s" % e, file=sys.stderr)
    return 2
  print(plan.to_text())
  if hardware:
    print()
    print(hardware_table(plan, hardware))
  if args.text_picture:
    print()
    print(picture.text_picture(slices))
  if args.picture:
    try:
      picture.write_picture(args.picture, slices)
    except ImportError as e:
      print("error: %s" % e, file=sys.stderr)
      return 2
    print(
      "\nwrote the layout picture of %d variables to %s"
      % (len(slices), args.picture)
    )
  return 0
