"""A cluster configured by TF_CONFIG alone, and where the trainer keeps what.

Two `python -m transformer.serve` workers (two CPU devices each, on free
localhost ports) get no flag but --cpus: each reads its task from
TF_CONFIG. The trainer, a third process, reads the cluster from its own
TF_CONFIG through TFConfigClusterResolver, as a client (no task) or as a
"chief" task it serves itself, and trains a tiny model on a 2x2 mesh over
the workers: the masters and the global step must be on the trainer's CPU,
the slices on the workers (the worker process helpers are
multihost_test's).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import tensorflow as tf

from tests.transformer import multihost_test
from transformer._src.driver import cluster_spec


def _trainer_env(tf_config):
  """This process's environment with the repository and that TF_CONFIG."""
  env = {
    k: v
    for k, v in os.environ.items()
    if k not in ("MTF_VERBOSE", "TF_CPP_MIN_LOG_LEVEL")
  }
  env["PYTHONPATH"] = multihost_test.REPO
  env["TF_CONFIG"] = json.dumps(tf_config)
  return env


# A trainer that finds the cluster in TF_CONFIG, trains the tiny
# Bitransformer of driver_test_util for 2 steps on a 2x2 mesh over the
# worker job, and prints where everything lives.
TF_CONFIG_TRAINER = """
import json, sys
from tests.transformer import driver_test_util as dtu
from transformer._src.driver import cluster
connected = cluster.connect()  # no argument: TF_CONFIG
devices = connected.mesh_devices(dtu.MESH_2X2[0])
est = dtu.estimator(sys.argv[1], mesh_devices=devices)
result = est.train(dtu.input_fn, 2)
masters = sorted({v.device for v in est.store.masters.values()})
every = {v.device for v in est.store.variables}
print(json.dumps({
  "local_task": connected.local_task,
  "devices": devices,
  "masters": masters,
  "slices": sorted(every - set(masters)),
  "global_step": est.global_step.device,
  "step": int(result["step"]),
}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("trainer_task", [None, "chief"])
def test_tf_config_starts_workers_and_places_the_trainer(
  tmp_path, trainer_task
):
  """Workers and trainer from TF_CONFIG alone; masters on the trainer.

  The workers get no flag but --cpus: each reads its task from TF_CONFIG.
  The trainer's TF_CONFIG names the cluster and no task (a client) or a
  "chief" task of its own (it serves that task itself).
  """
  ports = cluster_spec.free_local_ports(3)
  addresses = ["localhost:%d" % p for p in ports[:2]]
  workers = []
  try:
    for index in range(2):
      tf_config = {
        "cluster": {"worker": addresses},
        "task": {"type": "worker", "index": index},
      }
      workers.append(
        multihost_test.Worker(
          addresses,
          index,
          str(tmp_path),
          command=[sys.executable, "-m", "transformer.serve", "--cpus=2"],
          env={"TF_CONFIG": json.dumps(tf_config)},
        )
      )
      assert (
        "serving /job:worker/task:%d at grpc://%s with 2 CPU device(s)"
        % (index, addresses[index])
      ) in workers[index].output()
    tf_config = {"cluster": {"worker": addresses}}
    trainer_job = "localhost"
    if trainer_task:
      tf_config["cluster"][trainer_task] = ["localhost:%d" % ports[2]]
      tf_config["task"] = {"type": trainer_task, "index": 0}
      trainer_job = trainer_task
    trained = subprocess.run(
      [sys.executable, "-c", TF_CONFIG_TRAINER, str(tmp_path / "model")],
      env=_trainer_env(tf_config),
      cwd=multihost_test.REPO,
      capture_output=True,
      text=True,
      timeout=600,
      check=False,
    )
  finally:
    for worker in workers:
      worker.stop()
  assert trained.returncode == 0, trained.stderr
  found = json.loads(trained.stdout.strip().splitlines()[-1])
  assert found["step"] == 2
  assert found["local_task"] == ([trainer_task, 0] if trainer_task else None)
  # The mesh spans both workers' devices, task by task.
  assert [tf.DeviceSpec.from_string(d).task for d in found["devices"]] == [
    0,
    0,
    1,
    1,
  ]
  assert {tf.DeviceSpec.from_string(d).job for d in found["devices"]} == {
    "worker"
  }
  # The masters and the global step live in the trainer's own process, the
  # slices on the workers (both tasks).
  trainer_cpu = "/job:%s/replica:0/task:0/device:CPU:0" % trainer_job
  assert found["masters"] == [trainer_cpu]
  assert found["global_step"] == trainer_cpu
  slice_tasks = {
    (tf.DeviceSpec.from_string(d).job, tf.DeviceSpec.from_string(d).task)
    for d in found["slices"]
  }
  assert slice_tasks == {("worker", 0), ("worker", 1)}
  # The checkpoint is written in the trainer's model_dir.
  assert tf.train.latest_checkpoint(str(tmp_path / "model")).endswith(
    "model.ckpt-2"
  )
