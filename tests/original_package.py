"""A guard for the scripts that record the original package's numbers.

The make_*_original.py scripts beside the tests must run with the original
mesh-tensorflow 0.1.21 first on PYTHONPATH; run by mistake with this
project's package first, they would store our own numbers as the original's
and every comparison against them would pass whatever we compute.
"""

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
