"""The command line: python -m mesh_tensorflow.plan."""

import os
import subprocess
import sys

import pytest

from mesh_tensorflow._src.plan import report

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))


def test_unknown_hardware_exits_2(capsys):
  assert report.main(["--gin_file=models/tiny.gin", "--hardware=tpu_v9"]) == 2
  assert "unknown hardware profile 'tpu_v9'" in capsys.readouterr().err


def test_layout_that_does_not_divide_exits_2(capsys):
  status = report.main(
    [
      "--gin_file=models/tiny.gin",
      "--mesh_shape=model:3",
      "--layout=heads:model",
      "--batch_size=2",
      "--sequence_length=8",
    ]
  )
  assert status == 2
  assert "heads" in capsys.readouterr().err


@pytest.mark.slow
def test_module_prints_the_plan_and_the_hardware_table():
  result = subprocess.run(
    [
      sys.executable,
      "-m",
      "mesh_tensorflow.plan",
      "--gin_file=models/tiny.gin",
      "--gin_file=layouts/2x2_dp.gin",
      "--batch_size=8",
      "--sequence_length=16",
      "--hardware=all",
    ],
    cwd=ROOT,
    env=dict(os.environ, PYTHONPATH=ROOT),
    capture_output=True,
    text=True,
    timeout=600,
    check=False,
  )
  assert result.returncode == 0, result.stderr[-2000:]
  out = result.stdout
  assert "parameters" in out and "allreduce" in out
  for name in ("tpu_v2", "tpu_v3", "tpu_v4", "a100", "h100"):
    assert name in out
  assert "this_machine" not in out
