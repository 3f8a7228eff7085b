"""Test setup for every test folder.

Creates the 8 virtual CPU devices the meshes run on (before TensorFlow
initialises) and, under MTF_TEST_MESH_IMPL=simd, selects the SIMD pass's tests.
Fixtures that serve one folder live in that folder's conftest.py.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The repository root first, so that `from tests import mesh_test_util` and
# `import mesh_tensorflow` resolve to this checkout.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mesh_tensorflow import utils  # pylint: disable=g-import-not-at-top

NUM_VIRTUAL_CPUS = 8

# Configure before anything initialises the runtime: list_logical_devices()
# would initialise it (with one CPU) and make the configuration fail.
try:
  utils.configure_virtual_cpus(NUM_VIRTUAL_CPUS)
except RuntimeError:  # Initialised with fewer CPUs by an earlier import.
  pass


def _runs_on_one_device(params) -> bool:
  mesh = params.get("mesh_shape", params.get("mesh_layout"))
  if isinstance(mesh, (tuple, list)) and mesh:
    mesh = mesh[0]
  return mesh == ""


def pytest_collection_modifyitems(config, items):
  """Under MTF_TEST_MESH_IMPL=simd, runs each SIMD program once.

  The SIMD pass replaces every multi-processor run with a SimdMeshImpl run in
  a tf.function, so the "eager" and "graph" variants of a test would repeat
  its "function" variant, and 1-device variants repeat the placement pass.
  """
  if os.environ.get("MTF_TEST_MESH_IMPL", "") != "simd":
    return
  keep, drop = [], []
  for item in items:
    params = item.callspec.params if hasattr(item, "callspec") else {}
    redundant = (params.get("mode", "function") != "function"
                 or _runs_on_one_device(params))
    (drop if redundant else keep).append(item)
  if drop:
    config.hook.pytest_deselected(items=drop)
    items[:] = keep
