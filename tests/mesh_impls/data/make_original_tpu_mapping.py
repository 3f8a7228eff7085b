"""Writes original_tpu_mapping.json: the original's logical-to-physical maps.

For every case (TPU topology mesh shape, mtf mesh shape, the flags
--logical_cores_per_chip and --fold_xy) it records what the original
mesh-tensorflow 0.1.21 returns from
simd_mesh_impl.physical_shape_3d_from_topology_proto_4d and from
simd_mesh_impl.auto_logical_to_physical_tpu, called as its
transformer.utils.tpu_estimator_model_fn called them (the 3-d physical shape
and TPUEstimator's device assignment: TF's default one of one core per
replica). Run with the original first on PYTHONPATH, from the repository
root:

  PYTHONPATH=<original>:. python \
    tests/mesh_impls/data/make_original_tpu_mapping.py
"""

import functools
import itertools
import json
import os

import numpy as np
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import original_package

FLAGS = tf.compat.v1.flags.FLAGS

# x, y, z, cores per chip.
TOPOLOGIES = [
  [1, 1, 1, 2],
  [2, 2, 1, 2],  # v3-8
  [4, 4, 1, 2],  # v3-32
  [8, 4, 1, 2],
  [2, 2, 2, 2],
  [2, 2, 1, 1],  # v4-8
  [2, 2, 4, 1],  # v4-32
  [2, 4, 4, 1],  # v4-64
  [4, 4, 4, 1],  # v4-128
  [2, 2, 4, 2],
]


def factorizations(n, max_len):
  """Ordered factorizations of n into at most max_len factors > 1."""
  if n == 1:
    return [[]]
  result = []
  if max_len == 0:
    return result
  for f in range(2, n + 1):
    if n % f == 0:
      result += [[f] + rest for rest in factorizations(n // f, max_len - 1)]
  return result


def default_assignment(topology_shape):
  x, y, z, cores = topology_shape
  coordinates = [
    [i, j, k, c]
    for k, j, i, c in itertools.product(
      range(z), range(y), range(x), range(cores)
    )
  ]
  topology = tf.tpu.experimental.Topology(
    mesh_shape=topology_shape,
    device_coordinates=np.array([coordinates], np.int32),
  )
  return tf.tpu.experimental.DeviceAssignment.build(
    topology, num_replicas=len(coordinates)
  )


def outcome(fn):
  try:
    value = fn()
  except Exception as e:  # pylint: disable=broad-except
    return {"error": type(e).__name__}
  if callable(value):
    return {"error": "returns a function"}
  return {"value": [int(v) for v in value]}


def main():
  original_package.require_original()
  FLAGS(["make_original_tpu_mapping"])
  simd = mtf.simd_mesh_impl
  cases = []
  for topology_shape in TOPOLOGIES:
    assignment = default_assignment(topology_shape)
    num_cores = int(np.prod(topology_shape))
    for cores_per_chip, fold_xy in itertools.product([2, 1], [False, True]):
      FLAGS.logical_cores_per_chip = cores_per_chip
      FLAGS.fold_xy = fold_xy
      physical = simd.physical_shape_3d_from_topology_proto_4d(topology_shape)
      for logical_shape in factorizations(num_cores, 3) or [[1]]:
        cases.append(
          {
            "topology": topology_shape,
            "logical_cores_per_chip": cores_per_chip,
            "fold_xy": fold_xy,
            "logical_shape": logical_shape,
            "physical_shape_3d": physical,
            "logical_to_physical": outcome(
              functools.partial(
                simd.auto_logical_to_physical_tpu,
                logical_shape,
                physical,
                device_assignment=assignment,
              )
            ),
          }
        )
  path = os.path.join(os.path.dirname(__file__), "original_tpu_mapping.json")
  with open(path, "w") as f:
    json.dump(cases, f, indent=None, separators=(",", ":"))
    f.write("\n")
  print("%d cases written to %s" % (len(cases), path))


if __name__ == "__main__":
  main()
