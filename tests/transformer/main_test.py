"""`python -m transformer.main`: flags, gin parsing, errors, kill + resume.

End-to-end runs use a subprocess with 4 virtual CPUs and a tiny
Bitransformer on an in-memory reverse task registered by
main_test_data.py (imported with --module_import).
"""

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import tensorflow as tf

REPO = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)
PYTHON = sys.executable

DATA_MODULE = """
import gin, numpy as np, tensorflow as tf

@gin.configurable
def tiny_reverse(sequence_length, vocabulary, dataset_split):
  rng = np.random.RandomState(0 if dataset_split == "train" else 1)
  n, length = 64, sequence_length["targets"]
  x = rng.randint(3, 20, size=(n, length)).astype(np.int32)
  x[:, -1] = 1
  y = x.copy()
  y[:, :-1] = x[:, :-1][:, ::-1]
  return tf.data.Dataset.from_tensor_slices({"inputs": x, "targets": y})

class TinyVocab:
  vocab_size = 20
  def encode(self, s):
    return [3 + (ord(c) % 17) for c in s]
  def decode(self, ids):
    return " ".join(str(i) for i in ids)

@gin.configurable
def tiny_vocab():
  return TinyVocab()
"""

TINY = [
  "num_layers = 1",
  "d_model = 16",
  "d_ff = 32",
  "num_heads = 2",
  "d_kv = 8",
  "dropout_rate = 0.0",
  "transformer.Unitransformer.max_length = 8",
  "utils.run.vocabulary = @tiny_vocab()",
  "utils.run.train_dataset_fn = @tiny_reverse",
  "utils.run.eval_dataset_fn = @tiny_reverse",
  "utils.run.sequence_length = 8",
  "utils.run.batch_size = ('sequences_per_batch', 8)",
  "utils.run.mesh_shape = 'rows:2;cols:2'",
  "utils.run.layout_rules = 'batch:rows,heads:cols,d_ff:cols'",
  "utils.serialize_num_microbatches.tokens_per_microbatch_per_replica = 32",
  "utils.get_variable_dtype.activation_dtype = 'float32'",
  "utils.run.learning_rate_schedule = @learning_rate_schedules.constant_learning_rate",
  "learning_rate_schedules.constant_learning_rate.learning_rate = 0.01",
]


def _main(tmp_path, model_dir, params=(), extra=(), **kwargs):
  (tmp_path / "main_test_data.py").write_text(DATA_MODULE)
  args = [
    PYTHON,
    "-m",
    "transformer.main",
    "--mesh_devices=4",
    "--module_import=main_test_data",
    "--model_dir=%s" % model_dir,
  ]
  args += ["--gin_param=%s" % p for p in TINY + list(params)] + list(extra)
  env = dict(
    os.environ, PYTHONPATH="%s:%s" % (REPO, tmp_path), TF_CPP_MIN_LOG_LEVEL="2"
  )
  return subprocess.Popen(
    args,
    cwd=str(tmp_path),
    env=env,
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
    **kwargs,
  )


def _run(tmp_path, model_dir, params=(), extra=()):
  proc = _main(tmp_path, model_dir, params, extra)
  out, _ = proc.communicate(timeout=300)
  return proc.returncode, out


@pytest.mark.slow
def test_train_writes_command_config_and_checkpoints(tmp_path):
  model_dir = tmp_path / "model"
  code, out = _run(
    tmp_path,
    model_dir,
    ["utils.run.train_steps = 12", "utils.run.save_checkpoints_steps = 5"],
  )
  assert code == 0, out
  assert "step 12/12" in out
  names = os.listdir(model_dir)
  assert "command" in names and "operative_config.gin" in names
  assert "model.ckpt-12.index" in names and "model.ckpt-10.index" in names
  config = (model_dir / "operative_config.gin").read_text()
  assert "tiny_reverse" in config
  # perplexity_eval mode on the same model_dir: metrics printed and written
  # where the original's Estimator.evaluate wrote them.
  code, out = _run(
    tmp_path,
    model_dir,
    [
      "utils.run.mode = 'perplexity_eval'",
      "utils.run.perplexity_eval_steps = 2",
      "utils.run.train_steps = 12",
    ],
  )
  assert code == 0, out
  assert "sequence_accuracy" in out and "token_accuracy" in out
  # Every checkpoint is evaluated, then the iterator stops at train_steps.
  assert "step 10)" in out and "step 12)" in out
  assert tf.io.gfile.glob(
    str(model_dir / "eval_eval_train_16" / "events.out.tfevents*")
  )
  assert "command.1" in os.listdir(model_dir)
  # infer mode: decode_from_file on the latest checkpoint.
  (tmp_path / "in.txt").write_text("abc\nxyz\n")
  code, out = _run(
    tmp_path,
    model_dir,
    [
      "utils.run.mode = 'infer'",
      "utils.run.eval_checkpoint_step = -1",
      "utils.decode_from_file.input_filename = '%s'" % (tmp_path / "in.txt"),
      "utils.decode_from_file.output_filename = '%s'" % (tmp_path / "out"),
    ],
  )
  assert code == 0, out
  assert len((tmp_path / "out-12").read_text().splitlines()) == 2


@pytest.mark.slow
def test_sigkill_then_resume_reaches_the_same_step(tmp_path):
  model_dir = tmp_path / "model"
  params = [
    "utils.run.train_steps = 400",
    "utils.run.save_checkpoints_steps = 10",
  ]
  proc = _main(tmp_path, model_dir, params)
  deadline = time.time() + 240
  while time.time() < deadline:
    if tf.io.gfile.glob(str(model_dir / "model.ckpt-20.index")):
      break
    time.sleep(0.5)
  proc.send_signal(signal.SIGKILL)
  proc.communicate()
  from transformer._src.driver import checkpoints  # pylint: disable=g-import-not-at-top

  steps = checkpoints.checkpoint_steps(str(model_dir))
  assert steps and steps[-1] >= 20
  latest = checkpoints.latest_checkpoint(str(model_dir))
  assert latest.endswith("model.ckpt-%d" % steps[-1])
  resume_from = steps[-1]
  code, out = _run(
    tmp_path,
    model_dir,
    [
      "utils.run.train_steps = %d" % (resume_from + 15),
      "utils.run.save_checkpoints_steps = 10",
    ],
  )
  assert code == 0, out
  assert "Restored" in out or "step %d/" % (resume_from + 15) in out
  final = checkpoints.checkpoint_steps(str(model_dir))[-1]
  assert final == resume_from + 15


def test_missing_gin_file_is_named(tmp_path):
  code, out = _run(
    tmp_path, tmp_path / "m", extra=["--gin_file=no_such_config.gin"]
  )
  assert code != 0
  assert "no_such_config.gin" in out


def test_unknown_gin_binding_is_named(tmp_path):
  code, out = _run(
    tmp_path, tmp_path / "m", params=["utils.run.no_such_param = 3"]
  )
  assert code != 0
  assert "no_such_param" in out


def test_unknown_tfds_dataset_is_named(tmp_path):
  code, out = _run(
    tmp_path,
    tmp_path / "m",
    params=[
      "utils.run.train_dataset_fn = @dataset.untokenized_tfds_dataset",
      "dataset.untokenized_tfds_dataset.dataset_name = 'no_such_dataset_xyz'",
      "dataset.untokenized_tfds_dataset.text2self = False",
      "dataset.untokenized_tfds_dataset.pack = False",
      "dataset.untokenized_tfds_dataset.tfds_data_dir = '%s'"
      % (tmp_path / "tfds"),
    ],
    extra=["--module_import=mesh_tensorflow.transformer.dataset"],
  )
  assert code != 0
  assert "no_such_dataset_xyz" in out


def _last_loss(out: str) -> str:
  lines = [line for line in out.splitlines() if line.startswith("step ")]
  assert lines, out
  return lines[-1].split("loss ")[1].split()[0]


@pytest.mark.slow
def test_mesh_impl_flag_and_binding_continue_training_alike(tmp_path):
  # Three placement steps, then three more with --mesh_impl=simd on one copy
  # of the model_dir and with run.mesh_impl = 'placement' on another: the
  # same printed loss (microbatched steps, as TINY asks for).
  first = tmp_path / "first"
  code, out = _run(tmp_path, first, ["utils.run.train_steps = 3"])
  assert code == 0, out
  second = tmp_path / "second"
  shutil.copytree(first, second)
  steps = ["utils.run.train_steps = 6"]
  code, simd_out = _run(tmp_path, first, steps, extra=["--mesh_impl=simd"])
  assert code == 0, simd_out
  code, placement_out = _run(
    tmp_path, second, steps + ["utils.run.mesh_impl = 'placement'"]
  )
  assert code == 0, placement_out
  assert "step 6/6" in simd_out and "step 6/6" in placement_out
  assert _last_loss(simd_out) == _last_loss(placement_out)


@pytest.mark.parametrize(
  "flag, binding", [("simd", "placement"), ("placement", "simd")]
)
def test_mesh_impl_flag_reaches_run_and_wins_over_the_binding(
  tmp_path, flag, binding
):
  # A mesh larger than the 4 virtual CPUs: the error names the
  # implementation that was built, which is the flag's, not the binding's.
  code, out = _run(
    tmp_path,
    tmp_path / "m",
    params=[
      "utils.run.mesh_shape = 'rows:4;cols:2'",
      "utils.run.mesh_impl = '%s'" % binding,
    ],
    extra=["--mesh_impl=%s" % flag],
  )
  assert code != 0
  assert (
    "mesh_impl '%s': mesh_shape rows:4;cols:2 needs 8 devices but this "
    "process has 4 CPU device(s)" % flag
  ) in out, out
  assert not (tmp_path / "m" / "checkpoint").exists()


def test_unknown_mesh_impl_binding_is_named(tmp_path):
  code, out = _run(
    tmp_path, tmp_path / "m", params=["utils.run.mesh_impl = 'spmd'"]
  )
  assert code != 0
  assert "unknown mesh_impl 'spmd'" in out
