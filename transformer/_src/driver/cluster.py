"""Connecting to a cluster of TensorFlow server tasks, and serving a task of it.

Each worker host runs one server task (`python -m transformer.serve`, a
`tf.distribute.Server`, started by start_server). The trainer is a client of
those tasks: it resolves the cluster (an explicit `cluster` value, else
TF_CONFIG; see cluster_spec) with TF's cluster resolvers, checks every task
answers, connects its eager runtime with
`tf.config.experimental_connect_to_cluster` (connect), and lays the mesh's
processors over the worker tasks' devices in task order
(Cluster.mesh_devices). Everything else stays on the trainer's host: the
full-shape master variables, the global step, the input pipeline and the
checkpoints (they are created without a device scope, so on the trainer's
local device).

Before a run with collective ops connect checks every task can run them
(cluster_checks); during a run cluster_failures names the tasks lost or
stalled.

Commands for two workers, the trainer in a third process:

  python -m transformer.serve --cluster=h0:2222,h1:2222 --task_index=0  # h0
  python -m transformer.serve --cluster=h0:2222,h1:2222 --task_index=1  # h1
  python -m transformer.main --cluster=h0:2222,h1:2222 --gin_file=...

Example (the trainer's view of that cluster):
  >>> cluster_spec.parse_cluster("h0:2222,h1:2222")
  {'worker': ['h0:2222', 'h1:2222']}
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from absl import logging
import tensorflow as tf

import mesh_tensorflow as mtf
from transformer._src.driver import cluster_checks
from transformer._src.driver import cluster_spec

__all__ = [
  "Cluster",
  "connect",
  "disable_placement_dependent_rewrites",
  "publish_tf_version",
  "start_server",
]


class Cluster:
  """A cluster the trainer is connected to.

  Attributes:
    spec: the tf.train.ClusterSpec.
    local_task: the trainer's own (job, task index) in spec, or None when it
      is a client outside the cluster (job "localhost").
  """

  def __init__(self, spec: tf.train.ClusterSpec, local_task=None):
    self.spec = spec
    self.local_task = local_task

  def devices(self, job: str = cluster_spec.WORKER_JOB) -> Dict[str, List[str]]:
    """{"CPU"/"GPU": device names of `job`'s tasks, in task order}."""
    by_kind = {}
    for kind in ("GPU", "CPU"):
      found = []
      for device in tf.config.list_logical_devices(kind):
        spec = tf.DeviceSpec.from_string(device.name)
        if spec.job == job:
          found.append((spec.task, spec.device_index, device.name))
      by_kind[kind] = [name for _, _, name in sorted(found)]
    return by_kind

  def mesh_devices(
    self, mesh_shape, job: str = cluster_spec.WORKER_JOB
  ) -> List[str]:
    """The first mesh_shape.size devices of `job`, GPUs if there are enough.

    Args:
      mesh_shape: an mtf.Shape or a string like "rows:2;cols:2".
      job: the job whose tasks hold the mesh.

    Returns:
      Device names such as "/job:worker/replica:0/task:1/device:CPU:0".

    Raises:
      ValueError: if the job has fewer devices than the mesh has processors.
    """
    mesh_shape = mtf.convert_to_shape(mesh_shape)
    size = max(mesh_shape.size, 1)
    mesh_text = ";".join("%s:%d" % (d.name, d.size) for d in mesh_shape.dims)
    by_kind = self.devices(job)
    for kind in ("GPU", "CPU"):
      if len(by_kind[kind]) >= size:
        return by_kind[kind][:size]
    per_task = {}
    for name in by_kind["CPU"]:
      task = tf.DeviceSpec.from_string(name).task
      per_task[task] = per_task.get(task, 0) + 1
    raise ValueError(
      "mesh_shape %s needs %d devices but the cluster's %r job has %d CPU "
      "and %d GPU device(s) (%s); start the servers with more devices "
      "(python -m transformer.serve --cpus=N), add tasks, or use a smaller "
      "mesh"
      % (
        mesh_text,
        size,
        job,
        len(by_kind["CPU"]),
        len(by_kind["GPU"]),
        ", ".join("task %d: %d CPU" % item for item in sorted(per_task.items()))
        or "no task",
      )
    )


def connect(
  cluster: cluster_spec.ClusterLike = None,
  timeout: float = cluster_spec.DEFAULT_TIMEOUT_SECONDS,
  collectives: bool = False,
) -> Optional[Cluster]:
  """Connects this process's eager runtime to the cluster, if there is one.

  Args:
    cluster: see cluster_spec's docstring (None: TF_CONFIG, else no
      cluster).
    timeout: seconds to wait for the tasks to accept connections.
    collectives: the run uses collective ops across the tasks (SIMD):
      cluster_checks.check_restarted_tasks and check_collectives check every
      task can still run them.

  Returns:
    The connected Cluster, or None (no cluster: a single-process run).

  Raises:
    TaskUnavailableError: a task did not answer within `timeout`, or (with
      `collectives`) it keeps the former incarnation of a restarted task or
      its collective ops were aborted by an earlier failure.
    ValueError: a malformed cluster value, or a task started by
      transformer.serve runs another TensorFlow version than this process.
  """
  resolver = cluster_spec.cluster_resolver(cluster)
  if resolver is None:
    return None
  spec = resolver.cluster_spec()
  local_task = cluster_spec.local_task(resolver)
  cluster_spec.wait_for_tasks(spec, timeout, skip=local_task)
  if local_task:
    tf.config.experimental_connect_to_cluster(
      spec, job_name=local_task[0], task_index=local_task[1]
    )
  else:
    tf.config.experimental_connect_to_cluster(spec)
  logging.info("Connected to cluster %s", spec.as_dict())
  cluster_checks.check_tf_versions(spec, skip=local_task)
  if collectives:
    cluster_checks.check_restarted_tasks(spec, skip=local_task)
    cluster_checks.check_collectives(spec, skip=local_task)
  return Cluster(spec, local_task)


def disable_placement_dependent_rewrites() -> None:
  """Turns off Grappler's arithmetic optimizer in this process.

  Its rewrites of arithmetic (sums, common factors) depend on the devices
  the ops are placed on, so the same mesh computation rounds differently
  when its devices are virtual CPUs of one process or CPUs of several tasks;
  training amplifies those last-bit differences into different losses after
  a few dozen steps. Without the rewrites a run on a cluster computes the
  very values of a one-process run with the same seed.
  """
  tf.config.optimizer.set_experimental_options(
    {"arithmetic_optimization": False}
  )


def publish_tf_version(
  server: tf.distribute.Server,
  job_name: str,
  task_index: int,
  version: str = tf.__version__,
) -> None:
  """Stores `version` in the server task's resources for check_tf_versions.

  Args:
    server: the task's running server.
    job_name: the task's job.
    task_index: the task's index in its job.
    version: the version to publish (default: this process's TensorFlow).
  """
  task = "/job:%s/task:%d" % (job_name, task_index)
  with tf.Graph().as_default():
    with tf.device(task + "/device:CPU:0"):
      assign = tf.raw_ops.AssignVariableOp(
        resource=cluster_checks.string_handle(), value=tf.constant(version)
      )
    # The filter keeps the session to this task: without it the session
    # would wait for every other task of the cluster to be up.
    config = tf.compat.v1.ConfigProto(device_filters=[task])
    with tf.compat.v1.Session(server.target, config=config) as session:
      session.run(assign)


def start_server(
  cluster: cluster_spec.ClusterLike = None,
  job_name: Optional[str] = None,
  task_index: Optional[int] = None,
  cpus: Optional[int] = None,
) -> Tuple[tf.distribute.Server, str, int]:
  """Starts this process's tf.distribute.Server task of the cluster.

  For instance, start_server("h0:2222,h1:2222", task_index=1, cpus=2) serves
  /job:worker/task:1 on port 2222 of this host, with 2 CPU devices (a server
  lives as long as its process, so this is not run as an example here).

  Args:
    cluster: see cluster_spec's docstring (None: TF_CONFIG, whose "task"
      also gives the job and index).
    job_name: the task's job (default: TF_CONFIG's task type, else "worker").
    task_index: the task's index in its job (default: TF_CONFIG's, else 0).
    cpus: the number of CPU devices the task offers (virtual CPUs sharing the
      host's cores; default: TensorFlow's one).

  Returns:
    (server, job name, task index).

  Raises:
    ValueError: no cluster, or the task is not in it.
    OSError: the server cannot start (e.g. the port is taken), naming the
      task and its address.
  """
  resolver = cluster_spec.cluster_resolver(cluster)
  if resolver is None:
    raise ValueError(
      "no cluster: pass --cluster=host:port,... or set TF_CONFIG"
    )
  spec = resolver.cluster_spec()
  job_name = (
    job_name or getattr(resolver, "task_type", None) or cluster_spec.WORKER_JOB
  )
  if task_index is None:
    task_index = int(getattr(resolver, "task_id", None) or 0)
  if job_name not in spec.jobs or task_index not in spec.task_indices(job_name):
    raise ValueError(
      "task /job:%s/task:%d is not in the cluster %s"
      % (job_name, task_index, spec.as_dict())
    )
  config = None
  if cpus:
    config = tf.compat.v1.ConfigProto(device_count={"CPU": int(cpus)})
  try:
    server = tf.distribute.Server(
      spec, job_name=job_name, task_index=task_index, config=config, start=True
    )
  except tf.errors.OpError as e:
    raise OSError(
      "cannot serve task /job:%s/task:%d at %s: %s (is another process "
      "listening on its port?)"
      % (
        job_name,
        task_index,
        spec.task_address(job_name, task_index),
        e.message,
      )
    ) from e
  return server, job_name, task_index
