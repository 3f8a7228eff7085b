"""Run one mtf program on several meshes, layouts and TF execution modes.

`run_program(build_fn, mesh_shape, layout, mode)` builds the mtf graph with
`build_fn(mesh)` (which returns a list of mtf Tensors), lowers it on a
PlacementMeshImpl over virtual CPUs and returns the exported values as numpy
arrays. Tests compare these across MESHES x layouts x MODES and against numpy.
"""

from typing import Callable, List, Sequence

import numpy as np
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import placement_mesh_impl

DEVICES = ["/cpu:%d" % i for i in range(8)]

# (mesh_shape, number of processors)
MESH_1 = ("", 1)
MESH_4 = ("all:4", 4)
MESH_2X2 = ("rows:2;cols:2", 4)
MESHES = [MESH_1, MESH_4, MESH_2X2]
MODES = ["eager", "function", "graph"]


def mesh_impl_for(mesh_shape: str, layout) -> placement_mesh_impl.PlacementMeshImpl:
  n = mtf.convert_to_shape(mesh_shape).size
  return placement_mesh_impl.PlacementMeshImpl(mesh_shape, layout, DEVICES[:n])


def _build_and_export(build_fn, mesh_shape, layout):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  outputs = build_fn(mesh)
  lowering = mtf.Lowering(graph, {mesh: mesh_impl_for(mesh_shape, layout)})
  return lowering, [lowering.export_to_tf_tensor(t) for t in outputs]


def run_program(build_fn: Callable[[mtf.Mesh], Sequence[mtf.Tensor]],
                mesh_shape: str = "", layout="", mode: str = "eager"
                ) -> List[np.ndarray]:
  """Builds, lowers and runs an mtf program; returns numpy outputs."""
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
    with tf.Graph().as_default():
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
    np.testing.assert_allclose(a, e, rtol=rtol, atol=atol,
                               err_msg="%s output %d" % (msg, i))
