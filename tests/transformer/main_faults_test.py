"""Faults through `python -m transformer.main`: each stops loudly, naming it.

A diverging learning rate stops before any non-finite checkpoint is written
(on 1 device and on a 2x2 mesh) and keeps the last finite one; a second
trainer on a model_dir refuses while the first runs; bad flags, splits,
files and state files exit non-zero naming the culprit; infer mode stops
after the run's last checkpoint. In-process tests cover the lock's stale
takeover and the checkpoint functions' refusal of inf/nan.
"""

import os
import signal
import subprocess
import time

import numpy as np
import pytest
import tensorflow as tf

from tests.transformer import main_test
from transformer._src.driver import checkpoint_restore
from transformer._src.driver import checkpoints
from transformer._src.driver import model_dir_lock

EMPTY_SPLIT = """

@gin.configurable
def tiny_empty(sequence_length, vocabulary, dataset_split):
  x = np.zeros((0, sequence_length["targets"]), np.int32)
  return tf.data.Dataset.from_tensor_slices({"inputs": x, "targets": x})
"""

ONE_DEVICE = ["utils.run.mesh_shape = ''", "utils.run.layout_rules = ''"]
DIVERGE = [
  "utils.run.optimizer = @optimize.SgdOptimizer",
  "learning_rate_schedules.constant_learning_rate.learning_rate = 1e3",
]
FROZEN = [
  "utils.run.optimizer = @optimize.SgdOptimizer",
  "learning_rate_schedules.constant_learning_rate.learning_rate = 0.0",
]
SANE = [
  "utils.run.optimizer = @optimize.SgdOptimizer",
  "learning_rate_schedules.constant_learning_rate.learning_rate = 0.01",
]


def _main(tmp_path, model_dir, params=(), extra=()):
  """Starts the CLI on 4 virtual CPUs with main_test's tiny model and data."""
  args = [
    main_test.PYTHON,
    "-m",
    "transformer.main",
    "--mesh_devices=4",
    "--module_import=main_test_data",
    "--model_dir=%s" % model_dir,
  ]
  args += ["--gin_param=%s" % p for p in main_test.TINY + list(params)]
  env = dict(
    os.environ,
    PYTHONPATH="%s:%s" % (main_test.REPO, tmp_path),
    TF_CPP_MIN_LOG_LEVEL="2",
  )
  return subprocess.Popen(
    args + list(extra),
    cwd=str(tmp_path),
    env=env,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
  )


def _run(tmp_path, model_dir, params=(), extra=(), timeout=300):
  if not (tmp_path / "main_test_data.py").exists():
    (tmp_path / "main_test_data.py").write_text(main_test.DATA_MODULE)
  proc = _main(tmp_path, model_dir, params, extra)
  out, _ = proc.communicate(timeout=timeout)
  return proc.returncode, out


def _all_finite(prefix):
  reader = tf.train.load_checkpoint(prefix)
  for name in reader.get_variable_to_shape_map():
    value = reader.get_tensor(name)
    if value.dtype.kind == "f" and not np.isfinite(value).all():
      return False
  return True


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """A model_dir trained 4 steps on one device (checkpoints 2 and 4)."""
  tmp_path = tmp_path_factory.mktemp("trained")
  model_dir = tmp_path / "model"
  code, out = _run(
    tmp_path,
    model_dir,
    ONE_DEVICE
    + SANE
    + ["utils.run.train_steps = 4", "utils.run.save_checkpoints_steps = 2"],
  )
  assert code == 0, out
  return tmp_path, model_dir


@pytest.mark.slow
@pytest.mark.parametrize("mesh", ["1", "2x2"])
def test_divergence_stops_before_saving_non_finite_weights(tmp_path, mesh):
  model_dir = tmp_path / "model"
  params = DIVERGE + [
    "utils.run.train_steps = 20",
    "utils.run.save_checkpoints_steps = 2",
    "utils.run.keep_checkpoint_max = 2",
  ]
  if mesh == "1":
    params += ONE_DEVICE
  code, out = _run(tmp_path, model_dir, params)
  assert code != 0, out
  assert "FloatingPointError: training diverged at step" in out, out
  assert "non-finite variables: decoder/" in out, out
  kept = checkpoints.all_checkpoints(str(model_dir))
  assert kept, out
  assert all(_all_finite(p) for p in kept), kept
  step = int(out.split("training diverged at step ")[1].split(":")[0])
  assert checkpoints.checkpoint_steps(str(model_dir))[-1] < step
  if mesh != "1":
    return
  # A restart that keeps the weights (learning rate 0) resumes from the last
  # finite checkpoint and saves finite ones.
  params = [p for p in params if p not in DIVERGE] + FROZEN
  code, out = _run(tmp_path, model_dir, params)
  assert code == 0, out
  assert checkpoints.checkpoint_steps(str(model_dir))[-1] == 20
  assert all(
    _all_finite(p) for p in checkpoints.all_checkpoints(str(model_dir))
  )


@pytest.mark.slow
def test_second_trainer_refuses_and_stale_lock_is_taken_over(tmp_path):
  (tmp_path / "main_test_data.py").write_text(main_test.DATA_MODULE)
  model_dir = tmp_path / "model"
  params = ONE_DEVICE + SANE + ["utils.run.save_checkpoints_steps = 1000"]
  first = _main(tmp_path, model_dir, params + ["utils.run.train_steps = 5000"])
  lock = model_dir / model_dir_lock.LOCK_FILENAME
  try:
    deadline = time.monotonic() + 240
    while not lock.exists():
      assert first.poll() is None, first.communicate()[0]
      assert time.monotonic() < deadline
      time.sleep(0.5)
    code, out = _run(tmp_path, model_dir, params + ["utils.run.train_steps=4"])
    assert code != 0, out
    assert "is in use by another trainer: pid %d" % first.pid in out, out
    # Readers are not blocked by the lock.
    assert model_dir_lock.holder(str(model_dir))["pid"] == str(first.pid)
  finally:
    first.send_signal(signal.SIGKILL)
    first.communicate()
  # The dead trainer's lock is stale: the next trainer takes it over.
  assert lock.exists()
  code, out = _run(tmp_path, model_dir, params + ["utils.run.train_steps=2"])
  assert code == 0, out
  assert "taking over the stale lock" in out, out
  assert not lock.exists()


@pytest.mark.slow
@pytest.mark.parametrize(
  "params, expected",
  [
    (
      ["utils.run.train_dataset_fn = @tiny_empty"],
      "dataset_split 'train' of train_dataset_fn: the training dataset has "
      "no batches",
    ),
    (["utils.run.train_steps = 0"], "train_steps must be > 0"),
    (["utils.run.train_steps = -5"], "train_steps must be > 0"),
  ],
)
def test_bad_training_inputs_are_named(tmp_path, params, expected):
  (tmp_path / "main_test_data.py").write_text(
    main_test.DATA_MODULE + EMPTY_SPLIT
  )
  code, out = _run(tmp_path, tmp_path / "model", ONE_DEVICE + params)
  assert code != 0, out
  assert expected in out, out
  assert not checkpoints.checkpoint_steps(str(tmp_path / "model"))


def test_negative_mesh_devices_names_the_flag(tmp_path):
  code, out = _run(tmp_path, tmp_path / "model", extra=["--mesh_devices=-1"])
  assert code != 0, out
  assert "flag --mesh_devices=-1: -1 is not a positive integer" in out, out


@pytest.mark.slow
def test_decode_from_file_faults(trained):
  tmp_path, model_dir = trained
  bad = tmp_path / "bad.txt"
  bad.write_bytes(b"abc\n\xff\xfe\n")
  empty = tmp_path / "empty.txt"
  empty.write_bytes(b"")
  infer = ONE_DEVICE + [
    "utils.run.mode = 'infer'",
    "utils.run.train_steps = 4",
    "utils.run.eval_checkpoint_step = -1",
    "decode_from_file.output_filename = '%s'" % (tmp_path / "out"),
  ]
  code, out = _run(
    tmp_path,
    model_dir,
    infer + ["decode_from_file.input_filename = '%s'" % bad],
  )
  assert code != 0, out
  assert "input file %s is not UTF-8 text" % bad in out, out
  code, out = _run(
    tmp_path,
    model_dir,
    infer + ["decode_from_file.input_filename = '%s'" % empty],
  )
  assert code == 0, out
  assert (tmp_path / "out-4").read_text() == ""


@pytest.mark.slow
def test_infer_with_default_step_stops_after_train_steps(trained):
  tmp_path, model_dir = trained
  inputs = tmp_path / "in.txt"
  inputs.write_text("abc\n")
  code, out = _run(
    tmp_path,
    model_dir,
    ONE_DEVICE
    + [
      "utils.run.mode = 'infer'",
      "utils.run.train_steps = 4",
      "decode_from_file.input_filename = '%s'" % inputs,
      "decode_from_file.output_filename = '%s'" % (tmp_path / "dec"),
    ],
    timeout=240,
  )
  assert code == 0, out
  assert (tmp_path / "dec-2").exists() and (tmp_path / "dec-4").exists()


@pytest.mark.slow
def test_binary_state_file_is_named(tmp_path):
  model_dir = tmp_path / "model"
  model_dir.mkdir()
  (model_dir / "checkpoint").write_bytes(b"\x80\x81\xff garbage \x00")
  code, out = _run(
    tmp_path, model_dir, ONE_DEVICE + ["utils.run.train_steps = 2"]
  )
  assert code != 0, out
  assert "checkpoint state file %s" % (model_dir / "checkpoint") in out, out


# In-process: the lock and the checkpoint functions.


def test_lock_refuses_a_live_holder_and_takes_over_a_dead_one(tmp_path):
  model_dir = str(tmp_path)
  lock = tmp_path / model_dir_lock.LOCK_FILENAME
  sleeper = subprocess.Popen(["sleep", "60"])
  try:
    lock.write_text(
      "host=%s pid=%d started=x\n" % (os.uname().nodename, sleeper.pid)
    )
    with pytest.raises(
      model_dir_lock.ModelDirLockedError, match="pid %d on host" % sleeper.pid
    ):
      model_dir_lock.acquire(model_dir)
  finally:
    sleeper.kill()
    sleeper.wait()
  # The holder is dead now: its lock is taken over, then released.
  with model_dir_lock.ModelDirLock(model_dir):
    with model_dir_lock.ModelDirLock(model_dir):  # Re-entrant.
      assert model_dir_lock.holder(model_dir)["pid"] == str(os.getpid())
    assert lock.exists()
  assert not lock.exists()


def test_non_finite_checkpoints_are_not_saved_or_restored(tmp_path):
  model_dir = str(tmp_path)
  w = tf.Variable([1.0, 2.0])
  step = tf.Variable(1, dtype=tf.int64)
  checkpoints.save(model_dir, 1, {"w": w, "global_step": step})
  w.assign([1.0, np.nan])
  with pytest.raises(ValueError, match="1 of 2 tensors hold inf/nan.*: w"):
    checkpoints.save(model_dir, 2, {"w": w, "global_step": step})
  assert checkpoints.checkpoint_steps(model_dir) == [1]
  # Written on purpose, it is refused on restore unless allowed.
  checkpoints.save(
    model_dir, 2, {"w": w, "global_step": step}, allow_non_finite=True
  )
  v = tf.Variable([0.0, 0.0])
  with pytest.raises(ValueError, match="model.ckpt-2: 1 of 1 tensors"):
    checkpoint_restore.restore(model_dir, {"w": v})
  np.testing.assert_array_equal(v.numpy(), [0.0, 0.0])
  checkpoint_restore.restore(model_dir, {"w": v}, allow_non_finite=True)
  assert np.isnan(v.numpy()[1])
