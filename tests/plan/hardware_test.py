"""Hardware profiles and the this_machine probe."""

import dataclasses

import pytest

from mesh_tensorflow import plan as mtf_plan
from mesh_tensorflow._src.plan import hardware


def test_the_named_profiles_exist():
  assert set(mtf_plan.HARDWARE_PROFILES) == {
    "tpu_v2",
    "tpu_v3",
    "tpu_v4",
    "a100",
    "h100",
    "this_machine",
  }


@pytest.mark.parametrize("name", ["tpu_v2", "tpu_v3", "tpu_v4", "a100", "h100"])
def test_published_profiles_are_sane(name):
  p = mtf_plan.HARDWARE_PROFILES[name]
  assert p.name == name
  assert p.peak_flops("bfloat16") >= p.peak_flops("float32") > 1e12
  assert p.hbm_bytes >= 8 * 2**30
  assert p.hbm_bandwidth > p.link_bandwidth > 1e10
  assert not p.shared_compute


def test_newer_is_faster():
  peaks = [
    mtf_plan.HARDWARE_PROFILES[n].peak_flops_bf16
    for n in ("tpu_v2", "tpu_v3", "tpu_v4")
  ]
  assert peaks == sorted(peaks)
  assert (
    mtf_plan.HARDWARE_PROFILES["h100"].peak_flops_bf16
    > mtf_plan.HARDWARE_PROFILES["a100"].peak_flops_bf16
  )


def test_unknown_profile_names_the_known_ones():
  with pytest.raises(KeyError, match="tpu_v3"):
    mtf_plan.HARDWARE_PROFILES["tpu_v5"]  # pylint: disable=pointless-statement
  with pytest.raises(ValueError, match="unknown hardware profile 'gpu'"):
    hardware.get_hardware_profile("gpu")


def test_device_count_check():
  v2 = mtf_plan.HARDWARE_PROFILES["tpu_v2"]
  v2.check_num_devices(512, "rows:16;cols:32")
  with pytest.raises(ValueError, match="1024 devices.*at most 512"):
    v2.check_num_devices(1024, "rows:32;cols:32")
  bigger = dataclasses.replace(v2, max_devices=1024)
  bigger.check_num_devices(1024, "rows:32;cols:32")


def test_this_machine_probe_measures_something():
  p = hardware.measure_this_machine(matmul_size=256)
  assert p.name == "this_machine"
  assert p.shared_compute
  assert 1e8 < p.peak_flops_f32 < 1e14
  assert 1e8 < p.hbm_bandwidth < 1e13
  assert 0 < p.op_overhead_seconds < 1e-2
  assert p.hbm_bytes > 2**30
