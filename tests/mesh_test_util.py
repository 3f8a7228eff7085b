"""Run one mtf program on several meshes, layouts and TF execution modes.

`run_program(build_fn, mesh_shape, layout, mode)` builds the mtf graph with
`build_fn(mesh)` (which returns a list of mtf Tensors), lowers it on a
PlacementMeshImpl over virtual CPUs and returns the exported values as numpy
arrays. Tests compare these across the meshes and layouts of tests/meshes.py,
the MODES, and numpy.

mode="simd" runs the program on a SimdMeshImpl (collective backend) instead:
one replica per processor, in a tf.function, via mesh_impl.replicate; it
returns replica 0's values (and checks that every replica exported the same).
With the environment variable MTF_TEST_MESH_IMPL=simd, every multi-processor
run_program call runs in mode "simd", whatever mode it asks for (SIMD_ENV).
With MTF_TEST_TF_MODE=v1 (TF2 behaviour disabled, see conftest.py), there is
no eager execution: "eager" and "function" runs become "graph" runs (TF1_ENV),
whose graph takes the global seed as a tf.function's would.
"""

import contextlib
import os
from typing import Callable, List, Sequence

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.eager import context  # pylint: disable=g-direct-tensorflow-import

import mesh_tensorflow as mtf
from mesh_tensorflow import placement_mesh_impl
from mesh_tensorflow import simd_mesh_impl
from mesh_tensorflow._src.mesh_impls import simd_collective

DEVICES = ["/cpu:%d" % i for i in range(8)]

MODES = ["eager", "function", "graph"]

# True when MTF_TEST_MESH_IMPL=simd: multi-processor programs run on SIMD.
SIMD_ENV = os.environ.get("MTF_TEST_MESH_IMPL", "") == "simd"
# True when MTF_TEST_TF_MODE=v1: programs run in tf.compat.v1 graphs only.
TF1_ENV = os.environ.get("MTF_TEST_TF_MODE", "") == "v1"
# 0: no per-collective timeout. A timeout costs one sleeping OS thread per
# collective execution (see CollectiveBackend), and the SIMD pass runs tens of
# thousands of collectives per worker: with 120 s, workers ran out of threads
# and aborted. A hung test is failed by pytest-timeout (pytest.ini) instead.
COLLECTIVE_TIMEOUT_SECONDS = float(
  os.environ.get("MTF_TEST_COLLECTIVE_TIMEOUT", "0")
)
SIMD_SKIP_REASON = (
  "placement-specific behaviour (MTF_TEST_MESH_IMPL=simd "
  "runs programs on SimdMeshImpl)"
)


def skip_under_simd(why: str) -> None:
  """Skips a test that checks placement-only behaviour when SIMD_ENV."""
  if SIMD_ENV:
    pytest.skip("%s: %s" % (SIMD_SKIP_REASON, why))


def skip_under_tf1(why: str) -> None:
  """Skips a test of eager-only behaviour when TF1_ENV (no eager programs)."""
  if TF1_ENV:
    pytest.skip(
      "eager-only behaviour (MTF_TEST_TF_MODE=v1 runs programs in "
      "tf.compat.v1 graphs): %s" % why
    )


def as_tf1_program():
  """The context of a TF1 program's top level: graph mode under TF1_ENV.

  The legacy pass runs test bodies eagerly (conftest.py); a test that calls a
  program's entry point (a main) as a program started with
  `tf.compat.v1.disable_v2_behavior()` would, calls it in this context.
  Elsewhere, and under TF2 behaviour, the context does nothing.

  Returns:
    a context manager.
  """
  return context.graph_mode() if TF1_ENV else contextlib.nullcontext()


def eager_seed(seed: int) -> None:
  """Sets the eager global seed, that of the drivers (which run eagerly).

  Also where a legacy-pass test runs in graph mode (fixtures).

  Args:
    seed: the global seed.
  """
  with context.eager_mode():
    tf.random.set_seed(seed)


def simd_mesh_impl_for(mesh_shape: str, layout) -> simd_mesh_impl.SimdMeshImpl:
  n = mtf.convert_to_shape(mesh_shape).size
  # A collective that waits this long fails the test instead of hanging.
  backend = simd_collective.CollectiveBackend(
    DEVICES[:n], timeout_seconds=COLLECTIVE_TIMEOUT_SECONDS
  )
  return simd_mesh_impl.SimdMeshImpl(mesh_shape, layout, backend=backend)


def run_simd(build_fn, mesh_shape, layout) -> List[np.ndarray]:
  """Runs on SimdMeshImpl: graph built once, lowered on every replica."""
  mesh_impl = simd_mesh_impl_for(mesh_shape, layout)
  store = mtf.VariableStore()

  @tf.function(autograph=False)
  def fn():
    with mtf.variable_store(store):
      graph = mtf.Graph()
      mesh = mtf.Mesh(graph, "mesh")
      outputs = build_fn(mesh)

      def computation():
        lowering = mtf.Lowering(graph, {mesh: mesh_impl})
        return [lowering.export_to_tf_tensor(t) for t in outputs]

      return mesh_impl.replicate(computation)

  try:
    results = fn()
  except NotImplementedError as e:
    if "while loop" in str(e):
      pytest.skip(
        "SimdMeshImpl (collective backend) cannot communicate "
        "inside while loops: %s" % e
      )
    raise
  except ValueError as e:
    if "does not support control dependencies" in str(e):
      pytest.skip(
        "SimdMeshImpl does not support control dependencies "
        "(as the original): %s" % e
      )
    raise
  per_replica = [[np.asarray(t) for t in outs] for outs in results]
  for pnum, outs in enumerate(per_replica[1:], 1):
    for i, (a, b) in enumerate(zip(per_replica[0], outs)):
      # Replicas run the same kernels on the same values, but CPU reductions
      # may split work differently between runs: allow rounding.
      np.testing.assert_allclose(
        a,
        b,
        rtol=1e-6,
        atol=1e-6,
        err_msg="replica %d exported another output %d than replica 0"
        % (pnum, i),
      )
  return per_replica[0]


def with_variables(build_fn: Callable[[mtf.Mesh], Sequence[mtf.Tensor]]):
  """A runner for build_fn that also exports every variable.

  Example:
    outs, variables = with_variables(build)("rows:2;cols:2", "b:rows")
    # outs: build's outputs; variables: {full variable name: value}
  """
  names = []

  def program(mesh):
    outs = list(build_fn(mesh))
    names[:] = [v.name for v in mesh.graph.all_variables]
    return outs + [v.outputs[0] for v in mesh.graph.all_variables]

  def run(mesh_shape="", layout="", mode="eager"):
    results = run_program(program, mesh_shape, layout, mode)
    n = len(results) - len(names)
    return results[:n], dict(zip(names, results[n:]))

  return run


def mesh_impl_for(
  mesh_shape: str, layout
) -> placement_mesh_impl.PlacementMeshImpl:
  n = mtf.convert_to_shape(mesh_shape).size
  return placement_mesh_impl.PlacementMeshImpl(mesh_shape, layout, DEVICES[:n])


def _build_and_export(build_fn, mesh_shape, layout):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  outputs = build_fn(mesh)
  lowering = mtf.Lowering(graph, {mesh: mesh_impl_for(mesh_shape, layout)})
  return lowering, [lowering.export_to_tf_tensor(t) for t in outputs]


def run_program(
  build_fn: Callable[[mtf.Mesh], Sequence[mtf.Tensor]],
  mesh_shape: str = "",
  layout="",
  mode: str = "eager",
) -> List[np.ndarray]:
  """Builds, lowers and runs an mtf program; returns numpy outputs."""
  if mode == "simd" or (SIMD_ENV and mtf.convert_to_shape(mesh_shape).size > 1):
    return run_simd(build_fn, mesh_shape, layout)
  seed = None
  if TF1_ENV and mode in ("eager", "function"):
    # The graph run stands in for a tf.function, which takes the global seed
    # set (eagerly) by tf.random.set_seed when it traces: give it that seed.
    seed = context.global_seed()
    mode = "graph"
  if mode == "eager":
    with mtf.variable_store(mtf.VariableStore()):
      _, tensors = _build_and_export(build_fn, mesh_shape, layout)
      return [np.asarray(t) for t in tensors]
  if mode == "function":
    store = mtf.VariableStore()

    @tf.function(autograph=False)
    def fn():
      with mtf.variable_store(store):
        return _build_and_export(build_fn, mesh_shape, layout)[1]

    return [np.asarray(t) for t in fn()]
  if mode == "graph":
    with tf.Graph().as_default() as graph:
      if seed is not None:
        graph.seed = seed
      lowering, tensors = _build_and_export(build_fn, mesh_shape, layout)
      init = tf.compat.v1.global_variables_initializer()
      local_init = tf.compat.v1.local_variables_initializer()
      copy = lowering.copy_masters_to_slices()
      config = tf.compat.v1.ConfigProto(device_count={"CPU": len(DEVICES)})
      with tf.compat.v1.Session(config=config) as sess:
        sess.run(init)
        sess.run(local_init)
        sess.run(copy)
        return [np.asarray(v) for v in sess.run(tensors)]
  raise ValueError("unknown mode %r" % mode)


def assert_all_close(actual, expected, rtol=1e-5, atol=1e-5, msg=""):
  for i, (a, e) in enumerate(zip(actual, expected)):
    np.testing.assert_allclose(
      a, e, rtol=rtol, atol=atol, err_msg="%s output %d" % (msg, i)
    )
