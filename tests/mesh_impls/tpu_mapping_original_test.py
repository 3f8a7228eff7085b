"""auto_logical_to_physical_tpu and the 3-d TPU shape against the original.

data/original_tpu_mapping.json holds what the original mesh-tensorflow 0.1.21
returned (data/make_original_tpu_mapping.py) for v2/v3-like (2 cores per
chip) and v4-like (1 core per chip) topologies, every mtf mesh of up to 3
dims, and each value of --logical_cores_per_chip and --fold_xy, given the
device assignment TPUEstimator used (TF's default one, one core per replica).
"""

import itertools
import json
import pathlib

from absl import flags
from absl.testing import flagsaver
import numpy as np
import pytest

from mesh_tensorflow import simd_mesh_impl
from mesh_tensorflow._src import layout as layout_lib
from tests.mesh_impls.data.make_original_tpu_mapping import default_assignment

CASES = json.loads(
  (
    pathlib.Path(__file__).parent / "data" / "original_tpu_mapping.json"
  ).read_text()
)


def test_flags_have_the_originals_names_and_defaults():
  assert flags.FLAGS["logical_cores_per_chip"].default == 2
  assert flags.FLAGS["fold_xy"].default is False
  assert simd_mesh_impl.physical_shape_3d_from_topology_proto_4d(
    [2, 3, 4, 2]
  ) == [12, 2, 2]
  with flagsaver.flagsaver(fold_xy=True):
    assert simd_mesh_impl.physical_shape_3d_from_topology_proto_4d(
      [2, 3, 4, 2]
    ) == [6, 4, 2]


def test_the_reference_covers_both_flags_and_chip_kinds():
  keys = {
    (c["logical_cores_per_chip"], c["fold_xy"], c["topology"][3]) for c in CASES
  }
  assert keys == set(itertools.product([1, 2], [False, True], [1, 2]))
  assert len(CASES) > 300


@pytest.mark.parametrize(
  "flag_values",
  list(itertools.product([2, 1], [False, True])),
  ids=lambda v: "cores_per_chip=%d,fold_xy=%s" % v,
)
def test_same_mapping_as_the_original(flag_values):
  cores_per_chip, fold_xy = flag_values
  cases = [
    c
    for c in CASES
    if (c["logical_cores_per_chip"], c["fold_xy"]) == flag_values
  ]
  checked = fallbacks = 0
  with flagsaver.flagsaver(
    logical_cores_per_chip=cores_per_chip, fold_xy=fold_xy
  ):
    for case in cases:
      topology = case["topology"]
      physical = simd_mesh_impl.physical_shape_3d_from_topology_proto_4d(
        topology
      )
      assert physical == case["physical_shape_3d"], case
      assignment = default_assignment(topology)
      got = simd_mesh_impl.auto_logical_to_physical_tpu(
        case["logical_shape"], physical, device_assignment=assignment
      )
      from_4d = simd_mesh_impl.auto_logical_to_physical_tpu(
        case["logical_shape"], topology, device_assignment=assignment
      )
      assert from_4d == got, case
      want = case["logical_to_physical"]
      if "value" in want:
        assert got == want["value"], case
        checked += 1
      else:
        # The original returned its fallback function itself (no mapping)
        # when the chips' cores are not --logical_cores_per_chip.
        assert want["error"] == "returns a function", case
        assert topology[3] != cores_per_chip
        assert got == list(range(int(np.prod(topology)))), case
        fallbacks += 1
  assert checked >= 30 and checked + fallbacks == len(cases)


def test_one_core_per_chip_needs_the_device_assignment():
  with flagsaver.flagsaver(logical_cores_per_chip=1):
    with pytest.raises(ValueError, match="device_assignment"):
      simd_mesh_impl.auto_logical_to_physical_tpu([4, 4], [2, 2, 4, 1])
    # The coordinates themselves need none.
    coordinates = simd_mesh_impl.auto_logical_to_physical_tpu(
      [4, 4], [2, 2, 4, 1], return_coordinates=True
    )
  assert sorted(map(tuple, coordinates)) == sorted(
    itertools.product(range(8), range(2), [0])
  )


def test_v4_32_mapping_keeps_model_groups_on_neighbouring_chips():
  # 16 one-core chips seen as an 8 x 2 grid; each "model" group of 4 is a
  # 2 x 2 block of that grid.
  with flagsaver.flagsaver(logical_cores_per_chip=1):
    coordinates = simd_mesh_impl.auto_logical_to_physical_tpu(
      [4, 4], [2, 2, 4, 1], return_coordinates=True
    )
  for group in layout_lib.processor_groups([4, 4], [1]):
    block = [coordinates[p] for p in group]
    assert len({c[0] for c in block}) == 2 and len({c[1] for c in block}) == 2
