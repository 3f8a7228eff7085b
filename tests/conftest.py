"""Test setup for every test folder.

Creates the 8 virtual CPU devices the meshes run on (before TensorFlow
initialises); under MTF_TEST_MESH_IMPL=simd selects the SIMD pass's tests, and
under MTF_TEST_TF_MODE=v1 switches TF2 behaviour off (the legacy TF1 pass).
Fixtures that serve one folder live in that folder's conftest.py.
"""

import contextlib
import os
import sys

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The repository root first, so that `from tests import mesh_test_util` and
# `import mesh_tensorflow` resolve to this checkout.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tensorflow as tf  # pylint: disable=g-import-not-at-top

from mesh_tensorflow import utils  # pylint: disable=g-import-not-at-top

NUM_VIRTUAL_CPUS = 8

# MTF_TEST_TF_MODE=v1: the legacy TF1 pass. TF2 behaviour is switched off for
# the whole process before any test runs, as TF1 programs do at start-up.
TF1_ENV = os.environ.get("MTF_TEST_TF_MODE", "") == "v1"
if TF1_ENV:
  tf.compat.v1.disable_v2_behavior()

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


def _deselected(params) -> bool:
  """Whether a test variant is left out of the pass the environment asks for.

  The SIMD pass (MTF_TEST_MESH_IMPL=simd) replaces every multi-processor run
  with a SimdMeshImpl run in a tf.function, so the "eager" and "graph"
  variants of a test would repeat its "function" variant, and 1-device
  variants repeat the placement pass. The TF1 pass (MTF_TEST_TF_MODE=v1) has
  no eager execution: only "graph" variants can run.
  """
  if TF1_ENV and params.get("mode", "graph") != "graph":
    return True
  if os.environ.get("MTF_TEST_MESH_IMPL", "") == "simd":
    return params.get("mode", "function") != "function" or _runs_on_one_device(
      params
    )
  return False


def pytest_collection_modifyitems(config, items):
  """Deselects the variants that the pass the environment asks for omits."""
  keep, drop = [], []
  for item in items:
    params = item.callspec.params if hasattr(item, "callspec") else {}
    (drop if _deselected(params) else keep).append(item)
  if drop:
    config.hook.pytest_deselected(items=drop)
    items[:] = keep


def _eager_in_tf1_pass():
  """Eager execution for test code under MTF_TEST_TF_MODE=v1, as TF1 tests had.

  Legacy mode keeps its process-wide switches (TF1 shapes, control flow and
  variables); only numpy-side reference code (tf ops followed by .numpy(), in
  test bodies or at module import) needs eager execution, and every mtf
  program runs in a tf.Graph of its own (mesh_test_util turns eager/function
  runs into graph runs).
  """
  if not TF1_ENV:
    return contextlib.nullcontext()
  from tensorflow.python.eager import context  # pylint: disable=g-import-not-at-top,g-direct-tensorflow-import

  return context.eager_mode()


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
  del collector
  with _eager_in_tf1_pass():
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
  del item  # Test functions and unittest.TestCase methods alike.
  with _eager_in_tf1_pass():
    yield
