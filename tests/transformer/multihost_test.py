"""Training on a real 2-task cluster of `python -m transformer.serve` workers.

Each test starts its worker processes on free localhost ports (two CPU
devices each, so the demo's 2x2 mesh spans both tasks) and stops them by pid.
The trainer is `python -m transformer.main --cluster=...` in a subprocess,
on the demo config (configs/demo/reverse.gin) or a small model of the demo
task (fewer layers, a smaller batch) where only the failure handling is
checked.

Checked: 200 steps of the demo config on the cluster end with the very
weights and loss of one process with the same seed; a mesh larger than the
cluster, an unreachable worker, a taken port and a worker killed mid-run
(placement and SIMD) give errors naming the counts / task; so does a worker
stopped (SIGSTOP) mid-run, within its --stall_timeout; the checkpoints
survive and a restarted run resumes from the latest. After a SIMD run lost a
worker, or after a clean SIMD run, a run with only that worker restarted is
refused before any collective op, naming the surviving task (TensorFlow
keeps the restarted peer's former incarnation there), until it is restarted
too.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from transformer._src.driver import cluster
from transformer._src.driver import cluster_spec

REPO = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)
SMALL_DEMO = [
  "num_layers = 1",
  "d_model = 32",
  "d_ff = 64",
  "num_heads = 4",
  "d_kv = 8",
  "utils.run.batch_size = ('sequences_per_batch', 8)",
  "utils.run.keep_checkpoint_max = None",
]
LOSS_LINE = re.compile(r"^step (\d+)/\d+  loss ([0-9.]+) ", re.MULTILINE)


def _env():
  env = {
    k: v
    for k, v in os.environ.items()
    if k not in ("TF_CONFIG", "MTF_VERBOSE", "TF_CPP_MIN_LOG_LEVEL")
  }
  env["PYTHONPATH"] = REPO
  # A process that crashes (a fatal signal) writes its threads' Python
  # stacks to its log first.
  env["PYTHONFAULTHANDLER"] = "1"
  return env


class Worker:
  """One `python -m transformer.serve` task, stopped by its pid."""

  def __init__(self, addresses, index, log_dir, command=None, env=None):
    self.address = addresses[index]
    self.log = os.path.join(log_dir, "worker%d-%d.log" % (index, time.time()))
    with open(self.log, "w") as out:
      self.process = subprocess.Popen(
        command
        or [
          sys.executable,
          "-m",
          "transformer.serve",
          "--cluster=%s" % ",".join(addresses),
          "--task_index=%d" % index,
          "--cpus=2",
        ],
        stdout=out,
        stderr=subprocess.STDOUT,
        env=dict(_env(), **(env or {})),
        cwd=log_dir,
      )
    # Generous: on a loaded machine importing the package takes minutes.
    deadline = time.monotonic() + 300
    while "serving" not in self.output():
      if self.process.poll() is not None or time.monotonic() > deadline:
        self.kill()
        pytest.fail("worker %d did not start:\n%s" % (index, self.output()))
      time.sleep(0.2)

  def output(self):
    with open(self.log) as f:
      return f.read()

  def kill(self):
    if self.process.poll() is None:
      os.kill(self.process.pid, signal.SIGKILL)
    self.process.wait()

  def pause(self):
    """SIGSTOP: the task stalls, its connections stay open."""
    os.kill(self.process.pid, signal.SIGSTOP)

  def resume(self):
    os.kill(self.process.pid, signal.SIGCONT)

  def stop(self):
    """SIGTERM: the task must print that it stopped and exit with 0."""
    if self.process.poll() is None:
      self.resume()  # a stopped process keeps SIGTERM pending
      os.kill(self.process.pid, signal.SIGTERM)
      assert self.process.wait(timeout=30) == 0, self.output()
      assert "stopped /job:worker/task:" in self.output()


@pytest.fixture(name="tfds_dir", scope="module")
def fixture_tfds_dir(tmp_path_factory):
  """The demo's data, generated once, so trainers can share it concurrently."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  import transformer.dataset  # noqa: F401  # pylint: disable=g-import-not-at-top,unused-import  (registers mtf_reverse)

  data_dir = str(tmp_path_factory.mktemp("tfds"))
  tfds.builder("mtf_reverse", data_dir=data_dir).download_and_prepare()
  return data_dir


@pytest.fixture(name="workers")
def fixture_workers(tmp_path):
  addresses = ["localhost:%d" % p for p in cluster_spec.free_local_ports(2)]
  workers = []
  try:
    for index in range(2):
      workers.append(Worker(addresses, index, str(tmp_path)))
    yield workers
  finally:
    for worker in workers:
      worker.stop()


def _train(
  model_dir, tfds_dir, steps, *args, gin=(), check=True, wait=True, small=True
):
  """Runs the trainer; returns its CompletedProcess (a Popen if not wait).

  small: the small model of the demo task, else the demo config itself.
  """
  command = [
    sys.executable,
    "-m",
    "transformer.main",
    "--seed=1",
    "--model_dir=%s" % model_dir,
    "--gin_file=demo/reverse.gin",
  ] + list(args)
  command += [
    "--gin_param=%s" % p
    for p in (SMALL_DEMO if small else [])
    + list(gin)
    + [
      "utils.run.train_steps = %d" % steps,
      "dataset.untokenized_tfds_dataset.tfds_data_dir = '%s'" % tfds_dir,
    ]
  ]
  process = subprocess.Popen(
    command,
    env=_env(),
    cwd=REPO,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )
  if not wait:
    return process
  return _finish(process, check)


def _finish(process, check=True, timeout=900):
  try:
    stdout, stderr = process.communicate(timeout=timeout)
  finally:
    if process.poll() is None:
      process.kill()
      process.wait()
  result = subprocess.CompletedProcess(
    process.args, process.returncode, stdout, stderr
  )
  if check:
    assert result.returncode == 0, result.stdout + result.stderr
  return result


def _kill_running(*processes):
  """Kills (by pid) the trainers still running, e.g. after another failed."""
  for process in processes:
    if process.poll() is None:
      process.kill()
      process.wait()


def _last_loss(stdout):
  matches = LOSS_LINE.findall(stdout)
  assert matches, stdout
  return int(matches[-1][0]), float(matches[-1][1])


def _start_both(workers, tmp_path, tfds_dir, steps, *args, small=True):
  """Starts a one-process trainer and a cluster trainer: (local, remote)."""
  local = _train(
    tmp_path / "local",
    tfds_dir,
    steps,
    "--mesh_devices=4",
    "--same_rounding_as_cluster",
    *args,
    wait=False,
    small=small,
  )
  remote = _train(
    tmp_path / "cluster",
    tfds_dir,
    steps,
    "--cluster=%s" % ",".join(w.address for w in workers),
    *args,
    wait=False,
    small=small,
  )
  return local, remote


def _assert_same_training(local, remote, tmp_path, steps):
  """Same last loss, and checkpoints holding the very same values."""
  local_step, local_loss = _last_loss(local.stdout)
  remote_step, remote_loss = _last_loss(remote.stdout)
  assert local_step == remote_step == steps
  assert remote_loss == local_loss
  # The checkpoint is written on the trainer's host, with the very weights
  # and optimizer slots of the one-process run.
  name = "model.ckpt-%d" % steps
  local_reader = tf.train.load_checkpoint(str(tmp_path / "local" / name))
  remote_reader = tf.train.load_checkpoint(str(tmp_path / "cluster" / name))
  variables = local_reader.get_variable_to_shape_map()
  assert variables == remote_reader.get_variable_to_shape_map()
  for variable in variables:
    np.testing.assert_array_equal(
      remote_reader.get_tensor(variable),
      local_reader.get_tensor(variable),
      err_msg=variable,
    )


@pytest.mark.slow
def test_cluster_training_matches_one_process(workers, tmp_path, tfds_dir):
  # The demo config: long enough for last-bit differences in a step to grow
  # into different losses (they reached 1e-4 by step 60, 0.07 by step 100).
  steps = 200
  # Three trainers at once (they share the cores).
  local, remote = _start_both(workers, tmp_path, tfds_dir, steps, small=False)
  addresses = ",".join(w.address for w in workers)
  # A mesh with more processors than the cluster's 4 devices.
  too_large = _train(
    tmp_path / "too_large",
    tfds_dir,
    steps,
    "--cluster=%s" % addresses,
    gin=["utils.run.mesh_shape = 'rows:2;cols:4'"],
    wait=False,
  )
  try:
    finished = _finish(local), _finish(remote)
    refused = _finish(too_large, check=False)
  finally:
    _kill_running(local, remote, too_large)
  _assert_same_training(*finished, tmp_path, steps)

  assert refused.returncode != 0
  assert re.search(
    r"mesh_shape rows:2;cols:4 needs 8 devices but the cluster's 'worker' "
    r"job has 4 CPU and 0 GPU device\(s\) \(task 0: 2 CPU, task 1: 2 CPU\)",
    refused.stderr,
  ), refused.stderr
  assert not (tmp_path / "too_large" / "checkpoint").exists()


@pytest.mark.slow
def test_simd_cluster_training_matches_one_process(workers, tmp_path, tfds_dir):
  """The collective backend across the two tasks: TF collective ops.

  The demo config itself, as for placement.
  """
  steps = 200
  local, remote = _start_both(
    workers, tmp_path, tfds_dir, steps, "--mesh_impl=simd", small=False
  )
  try:
    finished = _finish(local), _finish(remote)
  finally:
    _kill_running(local, remote)
  _assert_same_training(*finished, tmp_path, steps)


def _run_until_hurt(workers, model_dir, tfds_dir, mesh_impl, hurt, *args):
  """(CompletedProcess, seconds it ran on) of a trainer after hurt(worker 1).

  hurt is called once the trainer wrote its step-10 checkpoint.
  """
  trainer = _train(
    model_dir,
    tfds_dir,
    100000,
    "--cluster=%s" % ",".join(w.address for w in workers),
    "--mesh_impl=%s" % mesh_impl,
    *args,
    gin=["utils.run.save_checkpoints_steps = 5"],
    wait=False,
  )
  try:
    deadline = time.monotonic() + 240
    while not (model_dir / "model.ckpt-10.index").exists():
      assert trainer.poll() is None, trainer.communicate()
      assert time.monotonic() < deadline
      time.sleep(0.2)
    hurt(workers[1])
    hurt_at = time.monotonic()
    # A lost or stalled peer must end the run, not leave it waiting.
    finished = _finish(trainer, check=False, timeout=120)
    seconds = time.monotonic() - hurt_at
    print(
      "%s: the trainer ended %.1f s after %s"
      % (mesh_impl, seconds, hurt.__name__)
    )
    return finished, seconds
  finally:
    _kill_running(trainer)


def _run_until_killed(workers, model_dir, tfds_dir, mesh_impl):
  """The CompletedProcess of a trainer whose worker 1 is SIGKILLed mid-run."""
  return _run_until_hurt(workers, model_dir, tfds_dir, mesh_impl, Worker.kill)[
    0
  ]


def _checkpoint_files(model_dir):
  return sorted(p.name for p in model_dir.iterdir() if ".ckpt-" in p.name)


def _after_failure(trainer, model_dir):
  """(latest checkpoint, its step, last stderr line) of a trainer that failed.

  No checkpoint was lost: the state file lists one for every 5 steps up to
  the latest (the trainer saves every 5 and keeps all), and each of them is
  complete (its global step is its name's).
  """
  assert trainer.returncode != 0
  latest = tf.train.latest_checkpoint(str(model_dir))
  latest_step = int(latest.rsplit("-", 1)[1])
  assert latest_step >= 10
  listed = tf.train.get_checkpoint_state(
    str(model_dir)
  ).all_model_checkpoint_paths
  steps = {int(path.rsplit("-", 1)[1]) for path in listed}
  assert set(range(5, latest_step + 1, 5)) <= steps, sorted(steps)
  assert max(steps) == latest_step
  for path in listed:
    reader = tf.train.load_checkpoint(path)
    assert reader.get_tensor("global_step") == int(path.rsplit("-", 1)[1])
  return latest, latest_step, trainer.stderr.strip().splitlines()[-1]


def _assert_resumed(resumed, latest, latest_step):
  """The run restored `latest` and trained 5 steps on from it."""
  assert re.search(
    r"Restored %s \(global step %d\)" % (re.escape(latest), latest_step),
    resumed.stderr,
  ), resumed.stderr
  assert _last_loss(resumed.stdout)[0] == latest_step + 5


def _assert_refused_for_restart(refused, addresses, latest):
  """A SIMD run refused: task 1 was restarted, task 0 keeps its past."""
  assert refused.returncode != 0
  message = refused.stderr.strip().splitlines()[-1]
  assert message.startswith(
    "transformer.main: task /job:worker/task:1 at %s was restarted after a "
    "run with collective ops: the other tasks keep its former incarnation "
    "(task /job:worker/task:0 at %s ran collective ops with its earlier "
    "process; found before any collective op of this run)"
    % (addresses[1], addresses[0])
  ), refused.stderr
  assert message.endswith(
    "The latest checkpoint %s is intact; restart task /job:worker/task:0 at "
    "%s too and run again to resume from it." % (latest, addresses[0])
  ), message


@pytest.mark.slow
@pytest.mark.parametrize("mesh_impl", ["placement", "simd"])
def test_killed_worker_is_named_and_a_restart_resumes(
  workers, tmp_path, tfds_dir, mesh_impl
):
  addresses = [w.address for w in workers]
  model_dir = tmp_path / "model"
  trainer = _run_until_killed(workers, model_dir, tfds_dir, mesh_impl)
  latest, latest_step, message = _after_failure(trainer, model_dir)
  assert message.startswith(
    "transformer.main: lost task /job:worker/task:1 at %s during the run "
    % addresses[1]
  ), message
  assert "The latest checkpoint %s is intact; restart the task " % latest in (
    message
  )
  assert message.endswith(" and run again to resume from it."), message
  saved = _checkpoint_files(model_dir)

  resume = [
    model_dir,
    tfds_dir,
    latest_step + 5,
    "--cluster=%s" % ",".join(addresses),
    "--mesh_impl=%s" % mesh_impl,
    "--verbosity=0",
  ]
  workers[1] = Worker(addresses, 1, str(tmp_path))
  if mesh_impl == "simd":
    # The survivor's collectives were aborted with the lost peer's: the
    # message says to restart it too, and a run before that is refused
    # (the survivor keeps the lost peer's former incarnation).
    assert (
      "restart the task and task /job:worker/task:0 at %s too (the failure "
      "aborted their collective ops" % addresses[0]
    ) in message
    _assert_refused_for_restart(_train(*resume, check=False), addresses, latest)
    assert _checkpoint_files(model_dir) == saved
    workers[0].stop()
    workers[0] = Worker(addresses, 0, str(tmp_path))
  _assert_resumed(_train(*resume), latest, latest_step)


@pytest.mark.slow
def test_simd_needs_every_task_restarted_after_one_was(
  workers, tmp_path, tfds_dir
):
  """The tasks keep a restarted peer's former incarnation for collectives."""
  addresses = [w.address for w in workers]
  model_dir = tmp_path / "model"
  args = ["--cluster=%s" % ",".join(addresses), "--mesh_impl=simd"]
  _train(model_dir, tfds_dir, 5, *args)
  latest = tf.train.latest_checkpoint(str(model_dir))
  assert latest.endswith("model.ckpt-5")
  saved = _checkpoint_files(model_dir)
  workers[1].stop()
  workers[1] = Worker(addresses, 1, str(tmp_path))

  # Refused before any collective op ran, so the restarted task's collective
  # ops are intact and restarting task 0 is enough.
  _assert_refused_for_restart(
    _train(model_dir, tfds_dir, 10, *args, check=False), addresses, latest
  )
  assert _checkpoint_files(model_dir) == saved

  workers[0].stop()
  workers[0] = Worker(addresses, 0, str(tmp_path))
  _assert_resumed(
    _train(model_dir, tfds_dir, 10, *args, "--verbosity=0"), latest, 5
  )


@pytest.mark.slow
@pytest.mark.parametrize("mesh_impl", ["placement", "simd"])
def test_stalled_worker_is_named_and_a_restart_resumes(
  workers, tmp_path, tfds_dir, mesh_impl
):
  """A SIGSTOPped worker keeps its connections open but answers nothing."""
  addresses = [w.address for w in workers]
  model_dir = tmp_path / "model"
  stall_timeout = 8
  trainer, seconds = _run_until_hurt(
    workers,
    model_dir,
    tfds_dir,
    mesh_impl,
    Worker.pause,
    "--stall_timeout=%d" % stall_timeout,
  )
  # The health checks run once a second, each waits at most 3 s; the rest
  # is slack for a loaded machine.
  assert seconds < stall_timeout + 30, seconds
  latest, latest_step, message = _after_failure(trainer, model_dir)
  assert message.startswith(
    "transformer.main: task /job:worker/task:1 at %s stopped responding "
    "during the run: no answer to a health check for %d s (a stopped or "
    "hung process; stall_timeout sets how long to wait). The latest "
    "checkpoint %s is intact; " % (addresses[1], stall_timeout, latest)
  ), message
  # Every checkpoint the state file lists is complete, and nothing but
  # complete checkpoints was left in model_dir.
  for path in tf.train.get_checkpoint_state(
    str(model_dir)
  ).all_model_checkpoint_paths:
    reader = tf.train.load_checkpoint(path)
    assert reader.get_tensor("global_step") == int(path.rsplit("-", 1)[1])
  assert not [p.name for p in model_dir.iterdir() if p.name.startswith(".")]

  workers[1].resume()
  if mesh_impl == "simd":
    assert message.endswith(
      "restart the task and task /job:worker/task:0 at %s too (their "
      "collective ops may still hold the stalled run's state, which only a "
      "restart of the process resets) and run again to resume from it."
      % addresses[0]
    ), message
    for index in range(2):
      workers[index].stop()
      workers[index] = Worker(addresses, index, str(tmp_path))
  else:
    # The stalled task goes on where it stopped: no restart is needed.
    assert message.endswith(
      "resume or restart the task and run again to resume from it."
    ), message
  resumed = _train(
    model_dir,
    tfds_dir,
    latest_step + 5,
    "--cluster=%s" % ",".join(addresses),
    "--mesh_impl=%s" % mesh_impl,
    "--verbosity=0",
  )
  _assert_resumed(resumed, latest, latest_step)


# A trainer's connection for a SIMD run, without the run.
CONNECT_FOR_COLLECTIVES = """
import sys
from transformer._src.driver import cluster
from transformer._src.driver import cluster_spec
try:
  cluster.connect(sys.argv[1], collectives=True)
except cluster_spec.TaskUnavailableError as e:
  sys.exit(str(e))
"""


def _connect_for_collectives(workers):
  """The error of connect(collectives=True) in a new process, else None."""
  connected = subprocess.run(
    [
      sys.executable,
      "-c",
      CONNECT_FOR_COLLECTIVES,
      ",".join(w.address for w in workers),
    ],
    env=_env(),
    capture_output=True,
    text=True,
    timeout=300,
    check=False,
  )
  if connected.returncode == 0:
    return None
  return connected.stderr.strip().splitlines()[-1]


@pytest.mark.slow
def test_restarted_task_is_named_before_any_collective(workers, tmp_path):
  """Each task records the process identities of its last SIMD run's tasks."""
  addresses = [w.address for w in workers]
  assert _connect_for_collectives(workers) is None
  assert _connect_for_collectives(workers) is None  # nothing restarted
  for restarted, keeper in ((1, 0), (0, 1)):
    # Either way round: task 0 leads the collective groups, task 1 keeps
    # copies of the groups it was in.
    workers[restarted].stop()
    workers[restarted] = Worker(addresses, restarted, str(tmp_path))
    for _ in range(2):  # refused until the keeper restarts, not aborted
      assert _connect_for_collectives(workers) == (
        "task /job:worker/task:%d at %s was restarted after a run with "
        "collective ops: the other tasks keep its former incarnation (task "
        "/job:worker/task:%d at %s ran collective ops with its earlier "
        "process; found before any collective op of this run), which only a "
        "restart of their processes resets; restart task /job:worker/task:%d "
        "at %s (python -m transformer.serve) and run again"
        % (
          restarted,
          addresses[restarted],
          keeper,
          addresses[keeper],
          keeper,
          addresses[keeper],
        )
      )
    workers[keeper].stop()
    workers[keeper] = Worker(addresses, keeper, str(tmp_path))
    assert _connect_for_collectives(workers) is None


def test_unreachable_worker_is_named(tmp_path):
  port = cluster_spec.free_local_ports(1)[0]
  start = time.monotonic()
  with pytest.raises(
    cluster_spec.TaskUnavailableError,
    match=r"cannot reach task /job:worker/task:0 at localhost:%d within 1 s"
    % port,
  ):
    cluster.connect("localhost:%d" % port, timeout=1.0)
  assert time.monotonic() - start < 10


def test_unreachable_worker_stops_the_trainer_writing_nothing(tmp_path):
  # Through the command line: the trainer gives up after --cluster_timeout
  # with one line naming the task and its address, and writes no checkpoint.
  port = cluster_spec.free_local_ports(1)[0]
  model_dir = tmp_path / "model"
  start = time.monotonic()
  refused = _train(
    model_dir,
    str(tmp_path / "tfds"),
    10,
    "--cluster=localhost:%d" % port,
    "--cluster_timeout=2",
    check=False,
  )
  assert refused.returncode == 1
  assert refused.stderr.strip().splitlines()[-1] == (
    "transformer.main: cannot reach task /job:worker/task:0 at "
    "localhost:%d within 2 s: start a server there (python -m "
    "transformer.serve) or fix the cluster addresses" % port
  ), refused.stderr
  assert time.monotonic() - start < 300
  assert not _checkpoint_files(model_dir)
  assert not (model_dir / "checkpoint").exists()


def test_taken_port_is_named():
  with socket.socket() as taken:
    taken.bind(("localhost", 0))
    taken.listen()
    address = "localhost:%d" % taken.getsockname()[1]
    served = subprocess.run(
      [
        sys.executable,
        "-m",
        "transformer.serve",
        "--cluster=localhost:1,%s" % address,
        "--task_index=1",
      ],
      env=_env(),
      capture_output=True,
      text=True,
      timeout=300,
      check=False,
    )
  assert served.returncode == 1
  assert served.stderr.strip().splitlines()[-1] == (
    "transformer.serve: cannot serve task /job:worker/task:1 at %s: Could "
    "not start gRPC server (is another process listening on its port?)"
    % address
  ), served.stderr


# A worker that says it runs another TensorFlow version.
OLD_VERSION_WORKER = """
import sys, time
from transformer._src.driver import cluster
server, job, index = cluster.start_server(sys.argv[1], task_index=0)
cluster.publish_tf_version(server, job, index, version="0.0.0-old")
print("serving", flush=True)
time.sleep(600)
"""


def test_other_tensorflow_version_is_named(tmp_path):
  address = "localhost:%d" % cluster_spec.free_local_ports(1)[0]
  worker = Worker(
    [address],
    0,
    str(tmp_path),
    command=[sys.executable, "-c", OLD_VERSION_WORKER, address],
  )
  try:
    trainer = subprocess.run(
      [
        sys.executable,
        "-c",
        "import sys; from transformer._src.driver import cluster; "
        "cluster.connect(sys.argv[1])",
        address,
      ],
      env=_env(),
      capture_output=True,
      text=True,
      timeout=300,
      check=False,
    )
  finally:
    worker.kill()
  assert trainer.returncode != 0
  assert (
    "ValueError: TensorFlow versions differ: this process runs %s, task "
    "/job:worker/task:0 at %s runs 0.0.0-old" % (tf.__version__, address)
  ) in trainer.stderr, trainer.stderr


def test_parse_cluster():
  assert cluster_spec.parse_cluster("h0:2222, h1:2223") == {
    "worker": ["h0:2222", "h1:2223"]
  }
  assert cluster_spec.parse_cluster('{"worker": ["h0:1"], "ps": ["h1:2"]}') == {
    "worker": ["h0:1"],
    "ps": ["h1:2"],
  }
  with pytest.raises(ValueError, match="task /job:worker: address 'h0'"):
    cluster_spec.parse_cluster("h0")
  with pytest.raises(ValueError, match="names no task"):
    cluster_spec.parse_cluster("")


def test_cluster_resolver_reads_tf_config(monkeypatch):
  monkeypatch.delenv("TF_CONFIG", raising=False)
  assert cluster_spec.cluster_resolver(None) is None
  monkeypatch.setenv(
    "TF_CONFIG",
    '{"cluster": {"worker": ["h0:1", "h1:2"]}, '
    '"task": {"type": "worker", "index": 1}}',
  )
  resolver = cluster_spec.cluster_resolver(None)
  assert isinstance(
    resolver, tf.distribute.cluster_resolver.TFConfigClusterResolver
  )
  assert resolver.cluster_spec().as_dict() == {"worker": ["h0:1", "h1:2"]}
  assert (resolver.task_type, resolver.task_id) == ("worker", 1)
  # An explicit cluster wins over TF_CONFIG.
  explicit = cluster_spec.cluster_resolver("h2:3")
  assert explicit.cluster_spec().as_dict() == {"worker": ["h2:3"]}
