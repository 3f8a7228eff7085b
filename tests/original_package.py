"""The original package's numbers: a guard for recording, a reader for tests.

The make_*_original.py scripts beside the tests must run with the original
mesh-tensorflow 0.1.21 first on PYTHONPATH; run by mistake with this
project's package first, they would store our own numbers as the original's
and every comparison against them would pass whatever we compute.
"""

import collections
from typing import Callable, Dict, Sequence

import numpy as np

import mesh_tensorflow as mtf


def require_original() -> None:
  """Exits unless `mesh_tensorflow` is the original package.

  Raises:
    SystemExit: when this project's package (which has `_src`) was imported.
  """
  if hasattr(mtf, "_src"):
    raise SystemExit(
      "%s is this project's package; put the original first on PYTHONPATH"
      % mtf.__file__
    )


def recorded_outputs(path: str) -> Dict[str, Dict[str, np.ndarray]]:
  """The arrays such a script stored, by program: {name: {key: array}}.

  The scripts store output `key` of program `name` as `name/key` (keys may
  hold more slashes: they are variable names).

  Args:
    path: the .npz file a make_*_original.py script wrote.

  Returns:
    for each program's name, its outputs by key.
  """
  outputs = collections.defaultdict(dict)
  with np.load(path) as arrays:
    for stored_key in arrays.files:
      name, key = stored_key.split("/", 1)
      outputs[name][key] = arrays[stored_key]
  return dict(outputs)


def record_outputs(
  path: str,
  names: Sequence[str],
  run_program: Callable[[str], Dict[str, np.ndarray]],
) -> None:
  """Runs each program and stores its outputs as `recorded_outputs` reads them.

  Args:
    path: the .npz file to write.
    names: the programs to run, in this order.
    run_program: a program's outputs by key, given its name.
  """
  arrays = {}
  for name in names:
    for key, value in run_program(name).items():
      arrays["%s/%s" % (name, key)] = value
    print("%s: done" % name)
  np.savez_compressed(path, **arrays)
  print("wrote %d arrays to %s" % (len(arrays), path))
