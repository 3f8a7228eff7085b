"""`python -m transformer.main` is quiet by default, verbose on request.

A tiny model trains for a few steps on the demo's mtf_reverse task (so TFDS
generates data, with its progress bars when they are on) in a subprocess
whose environment does not set TF_CPP_MIN_LOG_LEVEL.
"""

import os
import re
import subprocess
import sys

import pytest

from transformer._src import quiet

REPO = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)

TINY_REVERSE = [
  "num_layers = 1",
  "d_model = 16",
  "d_ff = 32",
  "num_heads = 2",
  "d_kv = 8",
  "utils.run.batch_size = ('sequences_per_batch', 8)",
  "utils.run.train_steps = 3",
  "utils.run.save_checkpoints_steps = 0",
]
# Lines of TF's C++ logging and of absl's Python logging ("I1125 21:05:33.6
# 1399 utils.py:300] ..."), TensorFlow's start-up notices, TFDS output.
NOISE = re.compile(
  r"^[IWE]\d{4} |cpu_feature_guard|oneDNN|absl::InitializeLog|"
  r"examples/s|Generating splits|dataset_info\.json",
  re.MULTILINE,
)


def _run_main(tmp_path, extra_args=(), extra_env=None):
  env = {
    k: v
    for k, v in os.environ.items()
    if k not in ("TF_CPP_MIN_LOG_LEVEL", quiet.VERBOSE_ENV)
  }
  env.update(PYTHONPATH=REPO, **(extra_env or {}))
  args = [
    sys.executable,
    "-m",
    "transformer.main",
    "--mesh_devices=4",
    "--model_dir=%s" % (tmp_path / "model"),
    "--gin_file=demo/reverse.gin",
  ]
  args += [
    "--gin_param=%s" % p
    for p in TINY_REVERSE
    + [
      "dataset.untokenized_tfds_dataset.tfds_data_dir = '%s'"
      % (tmp_path / "tfds")
    ]
  ]
  result = subprocess.run(
    args + list(extra_args),
    cwd=str(tmp_path),
    env=env,
    capture_output=True,
    text=True,
    timeout=600,
    check=False,
  )
  assert result.returncode == 0, result.stdout + result.stderr
  return result.stdout, result.stderr


@pytest.mark.slow
def test_main_prints_only_progress_by_default(tmp_path):
  stdout, stderr = _run_main(tmp_path)
  assert "step 3/3  loss " in stdout
  assert not NOISE.findall(stdout + stderr), stdout + stderr
  # The checkpoint still exists: quiet is only about what is printed.
  assert (tmp_path / "model" / "model.ckpt-3.index").exists()


@pytest.mark.slow
def test_verbosity_flag_brings_the_logs_back(tmp_path):
  stdout, stderr = _run_main(tmp_path, ["--verbosity=0"])
  assert "step 3/3  loss " in stdout
  out = stdout + stderr
  assert "oneDNN" in out  # TensorFlow's C++ start-up line
  assert "Generating splits" in out  # TFDS progress bar
  assert re.search(r"^I\d{4} .*Saved checkpoint", out, re.MULTILINE)


@pytest.mark.parametrize(
  "argv, env, verbose",
  [
    ([], None, False),
    (["--model_dir=x"], "0", False),
    ([], "1", True),
    (["-v", "0"], None, True),
    (["--verbosity=1"], None, True),
    (["--v=2", "--model_dir=x"], None, True),
    (["--verbosity=-1"], None, False),
    (["-v", "1", "--verbosity", "-1"], None, False),  # the last one wins
    (["--verbose_eval=1"], None, False),
  ],
)
def test_verbose_requested(monkeypatch, argv, env, verbose):
  if env is None:
    monkeypatch.delenv(quiet.VERBOSE_ENV, raising=False)
  else:
    monkeypatch.setenv(quiet.VERBOSE_ENV, env)
  assert quiet.verbose_requested(argv) == verbose
