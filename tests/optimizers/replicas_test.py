"""Adafactor training on placement meshes: replicas stay equal, no read races.

Each processor holding a copy of a slice of a weight or slot gets the same
all-reduced gradient, so after training every copy must be bit for bit the
same. A training step (one Session run of the train op and the loss, as an
Estimator runs it) must also read each weight before updating it: the
original reads a slice variable again at each use, so it can propagate a
gradient with a weight its own update has already changed, and its numbers
vary from run to run. Here each slice is read once per step, and the numbers
equal the original's with its reads put before its updates
(data/replicas_original.npz, written by data/make_replicas_original.py).
"""

import os

import numpy as np
import pytest

import mesh_tensorflow as mtf
from mesh_tensorflow._src.mesh_impls import collectives
from tests import meshes
from tests.optimizers import replicas_program

_ORIGINAL = os.path.join(
  os.path.dirname(__file__), "data", "replicas_original.npz"
)


@pytest.fixture(params=["shared", "separate"])
def memory(request, monkeypatch):
  """Runs a test on CPUs sharing host memory, and as on separate devices.

  On shared memory the replicas of a slice share one slice variable; on
  separate devices (other tasks, accelerators) each holds its own, updated
  from its own copy of the gradient.
  """
  if request.param == "separate":
    monkeypatch.setattr(collectives, "share_host_memory", lambda devices: False)
  return request.param


@meshes.parametrize(replicas_program.MESH_LAYOUTS, "mesh_layout")
def test_no_read_races_an_update_and_replicas_stay_equal(mesh_layout, memory):
  del memory  # Used for its monkeypatch.
  run = replicas_program.train(mtf, *mesh_layout)
  assert run.unordered == []
  for name, slices in run.slices.items():
    first_with_begin = {}
    for pnum, begin in enumerate(run.begins[name]):
      first = first_with_begin.setdefault(tuple(begin), pnum)
      np.testing.assert_array_equal(
        slices[pnum], slices[first], err_msg="%s on %d" % (name, pnum)
      )


@meshes.parametrize(replicas_program.MESH_LAYOUTS, "mesh_layout")
def test_equals_the_original(mesh_layout):
  run = replicas_program.train(mtf, *mesh_layout)
  mesh_shape = mesh_layout[0]
  with np.load(_ORIGINAL) as original:
    np.testing.assert_allclose(
      run.losses, original[mesh_shape + "/losses"], rtol=1e-6
    )
    names = {
      key.split("/", 1)[1].rsplit("|", 1)[0]
      for key in original.files
      if key.startswith(mesh_shape + "/") and "|" in key
    }
    assert sorted(run.slices) == sorted(names)
    for name, slices in run.slices.items():
      for pnum, value in enumerate(slices):
        np.testing.assert_allclose(
          value,
          original["%s/%s|%d" % (mesh_shape, name, pnum)],
          rtol=1e-5,
          atol=1e-7,
          err_msg="%s on %d" % (name, pnum),
        )
