"""Runs ortools' CP-SAT on a CpModel in a separate Python process.

CP-SAT segfaults in processes that have TensorFlow 2.21 loaded, so the solve
never happens in the caller's process: cp_sat_worker.py runs in a fresh
interpreter (the caller's `sys.executable`, with the caller's PYTHONPATH) that
imports only ortools. The model travels as JSON on the worker's stdin and the
solution comes back on its stdout. A crash of the worker raises an error in
the caller instead of taking it down.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
from typing import Optional, Sequence, Tuple

from mesh_tensorflow._src.auto_mtf.cp_model import CpModel

WORKER_PATH = pathlib.Path(__file__).with_name("cp_sat_worker.py")

# Runs the script named by argv[1] as __main__, without putting its
# directory (or the current one) first on sys.path, so that nothing there
# shadows a module the script imports. (`python -P` does the same from
# Python 3.11 on.)
_RUN_SCRIPT = (
  "import runpy, sys; del sys.path[0]; sys.argv = sys.argv[1:]; "
  "runpy.run_path(sys.argv[0], run_name='__main__')"
)


def worker_command() -> list:
  """The command line that runs the worker in a fresh interpreter.

  Returns:
    a list of strings for subprocess.
  """
  return [sys.executable, "-c", _RUN_SCRIPT, str(WORKER_PATH)]


class CpSatWorkerError(RuntimeError):
  """The CP-SAT worker process failed (crashed, or printed no reply)."""


@dataclasses.dataclass(frozen=True)
class CpSatResult:
  """The worker's reply.

  Attributes:
    status: CP-SAT's status name ("OPTIMAL", "FEASIBLE", "INFEASIBLE", ...).
    objective_value: the objective at the solution, or None without one.
    values: one value per model variable, or None without a solution.
  """

  status: str
  objective_value: Optional[float]
  values: Optional[Tuple[int, ...]]


def ortools_available() -> bool:
  """Whether ortools can be imported (checked without importing it).

  Returns:
    True if the `ortools` package is installed.
  """
  return importlib.util.find_spec("ortools") is not None


def solve_in_subprocess(
  model: CpModel,
  tiebreaks: Sequence[Tuple[Sequence[int], Sequence[int]]] = (),
  max_time_in_seconds: Optional[float] = None,
) -> CpSatResult:
  """Minimizes `model`'s objective with CP-SAT in a separate process.

  Args:
    model: the program to solve.
    tiebreaks: (variable indices, coefficients) linear expressions, minimized
      in order among the optimal solutions, so that the solution returned is
      the same whatever CP-SAT's search does.
    max_time_in_seconds: optional time limit of each CP-SAT solve.

  Returns:
    a CpSatResult.

  Raises:
    CpSatWorkerError: the worker process exited abnormally or its reply
      could not be read.
  """
  request = {
    "model": model.to_json_dict(),
    "tiebreaks": [[list(v), list(c)] for v, c in tiebreaks],
    "max_time_in_seconds": max_time_in_seconds,
  }
  command = worker_command()
  env = dict(os.environ)
  env["PYTHONPATH"] = os.pathsep.join(
    p for p in [env.get("PYTHONPATH", "")] + sys.path if p
  )
  completed = subprocess.run(
    command,
    input=json.dumps(request),
    capture_output=True,
    text=True,
    env=env,
    check=False,
  )
  if completed.returncode != 0:
    raise CpSatWorkerError(
      "the CP-SAT worker %s exited with status %d: %s"
      % (command[-1], completed.returncode, completed.stderr[-2000:])
    )
  try:
    reply = json.loads(completed.stdout)
  except ValueError as error:
    raise CpSatWorkerError(
      "the CP-SAT worker printed no JSON reply (%s): %r"
      % (error, completed.stdout[-2000:])
    ) from error
  values = reply["values"]
  return CpSatResult(
    reply["status"],
    reply["objective_value"],
    None if values is None else tuple(int(v) for v in values),
  )
