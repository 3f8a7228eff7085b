"""Training on a cluster of TensorFlow server tasks (several processes/hosts).

Each worker host runs one server task (`python -m transformer.serve`, a
`tf.distribute.Server`). The trainer is a client of those tasks: it resolves
the cluster (an explicit `cluster` value, else TF_CONFIG) with TF's cluster
resolvers, checks every task answers, connects its eager runtime with
`tf.config.experimental_connect_to_cluster`, and lays the mesh's processors
over the worker tasks' devices in task order. Everything else stays on the
trainer's host: the full-shape master variables, the global step, the input
pipeline and the checkpoints (they are created without a device scope, so on
the trainer's local device).

With collective ops across the tasks (mesh_impl="simd"), TensorFlow keeps
state in every task that only a restart of its process resets (aborted
collectives after a peer failed, the peers' device incarnations): once one
task restarted, restart them all. Before a run's first collective op the
trainer checks for both (check_restarted_tasks, check_collectives) and
names the tasks to restart.

A task that dies mid-run fails the pending step within seconds; one that
stalls (a stopped process, a frozen host) keeps its connections open, and
the step would wait for it forever: while utils.run runs, a
task_watchdog.TaskWatchdog probes every task and ends the run when one stops
answering for `stall_timeout` seconds (names_unavailable_tasks).

Accepted cluster values (`utils.run(cluster=...)`, `--cluster`):
  - "host0:2222,host1:2222": the addresses of the "worker" job's tasks;
  - a JSON object or dict {"worker": [...], ...} (TF_CONFIG's "cluster");
  - a tf.train.ClusterSpec or a tf.distribute.cluster_resolver resolver.

Commands for two workers, the trainer in a third process:

  python -m transformer.serve --cluster=h0:2222,h1:2222 --task_index=0  # h0
  python -m transformer.serve --cluster=h0:2222,h1:2222 --task_index=1  # h1
  python -m transformer.main --cluster=h0:2222,h1:2222 --gin_file=...

Example (the trainer's view of that cluster):
  >>> parse_cluster("h0:2222,h1:2222")
  {'worker': ['h0:2222', 'h1:2222']}
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import random
import re
import socket
import time
from typing import Callable, Dict, List, Optional, Tuple, Union
import uuid

from absl import logging
import tensorflow as tf

import mesh_tensorflow as mtf
from transformer._src.driver import checkpoints
from transformer._src.driver import mesh_impl_choice
from transformer._src.driver import task_watchdog

__all__ = [
  "Cluster",
  "TaskUnavailableError",
  "check_collectives",
  "check_restarted_tasks",
  "check_tf_versions",
  "cluster_resolver",
  "connect",
  "disable_placement_dependent_rewrites",
  "free_local_ports",
  "names_unavailable_tasks",
  "parse_cluster",
  "publish_tf_version",
  "start_server",
  "unavailable_tasks",
  "wait_for_tasks",
]

WORKER_JOB = "worker"
# A string resource variable on each transformer.serve task's first CPU
# holding the task's TensorFlow version, which the trainer compares to its
# own (the runtime does not report a task's version).
VERSION_VARIABLE = "mesh_tensorflow_serve_tf_version"
# String resource variables on each task's first CPU that the trainer of a
# run with collective ops sets (check_restarted_tasks): a random identity of
# the task's process, set by the first such trainer it serves, and the
# identities of the tasks of the last such run (a JSON object {task: id}).
PROCESS_ID_VARIABLE = "mesh_tensorflow_process_id"
COLLECTIVE_PEERS_VARIABLE = "mesh_tensorflow_collective_peers"
TF_CONFIG = "TF_CONFIG"
DEFAULT_TIMEOUT_SECONDS = 60.0
# How long check_collectives waits for a task's one-member collective.
COLLECTIVE_CHECK_SECONDS = 30.0
# check_collectives' group keys: random in this range (below the collective
# backend's), so no group a previous run resolved is reused.
_CHECK_GROUP_KEYS = (1 << 20, 1 << 21)
# Errors the eager runtime raises when a remote task went away mid-run.
_TASK_LOSS_ERRORS = (
  tf.errors.UnavailableError,
  tf.errors.CancelledError,
  tf.errors.AbortedError,
  tf.errors.InternalError,
  tf.errors.UnknownError,
)

ClusterLike = Union[
  None,
  str,
  Dict[str, List[str]],
  tf.train.ClusterSpec,
  tf.distribute.cluster_resolver.ClusterResolver,
]


class TaskUnavailableError(ConnectionError):
  """A task of the cluster did not answer (at start-up or during a run)."""


class _RestartedTaskError(TaskUnavailableError):
  """Tasks keep a restarted peer's former incarnation (check_restarted_tasks).

  Attributes:
    description: what happened (the start of the message).
    keepers: the (task, address) pairs to restart.
  """

  def __init__(self, description: str, keepers: List[Tuple[str, str]]):
    super().__init__(
      "%s; restart %s (python -m transformer.serve) and run again"
      % (description, _describe(keepers))
    )
    self.description = description
    self.keepers = keepers


def parse_cluster(cluster: Union[str, Dict[str, List[str]]]) -> Dict:
  """{job: [address, ...]} of a --cluster string or a dict.

  Example:
    >>> parse_cluster("h0:2222,h1:2222")
    {'worker': ['h0:2222', 'h1:2222']}
    >>> parse_cluster('{"worker": ["h0:2222"], "chief": ["h2:2222"]}')
    {'worker': ['h0:2222'], 'chief': ['h2:2222']}

  Args:
    cluster: "host:port,host:port" (the worker job's tasks in order), a JSON
      object {"job": ["host:port", ...]}, or such a dict.

  Returns:
    {job name: [address of task 0, task 1, ...]}.

  Raises:
    ValueError: if the value names no task or an address has no port.
  """
  if isinstance(cluster, str):
    text = cluster.strip()
    if text.startswith("{"):
      cluster = json.loads(text)
    else:
      cluster = {WORKER_JOB: [a.strip() for a in text.split(",") if a.strip()]}
  jobs = {str(job): list(tasks) for job, tasks in dict(cluster).items()}
  if not any(jobs.values()):
    raise ValueError("cluster %r names no task" % (cluster,))
  for job, tasks in jobs.items():
    for address in tasks:
      _host_and_port(address, "/job:%s" % job)
  return jobs


def free_local_ports(count: int) -> List[int]:
  """`count` distinct localhost ports that nothing listens on right now.

  For a cluster of tasks on this host (tests, benchmarks, trying the
  commands above on one machine): the ports are held together while they
  are picked, so they differ, then released for the servers to bind.

  Example:
    >>> ports = free_local_ports(2)
    >>> len(set(ports)), all(0 < port < 65536 for port in ports)
    (2, True)

  Args:
    count: how many ports.

  Returns:
    The port numbers.
  """
  sockets = [socket.socket() for _ in range(count)]
  try:
    for s in sockets:
      s.bind(("localhost", 0))
    return [s.getsockname()[1] for s in sockets]
  finally:
    for s in sockets:
      s.close()


def cluster_resolver(
  cluster: ClusterLike = None,
) -> Optional[tf.distribute.cluster_resolver.ClusterResolver]:
  """The cluster resolver of `cluster`, else of TF_CONFIG, else None.

  Args:
    cluster: see the module docstring; None reads the TF_CONFIG environment
      variable (TFConfigClusterResolver) if it describes a cluster.

  Returns:
    A ClusterResolver, or None for a single-process run.
  """
  resolvers = tf.distribute.cluster_resolver
  if isinstance(cluster, resolvers.ClusterResolver):
    return cluster
  if isinstance(cluster, tf.train.ClusterSpec):
    return resolvers.SimpleClusterResolver(cluster)
  if cluster:
    return resolvers.SimpleClusterResolver(
      tf.train.ClusterSpec(parse_cluster(cluster))
    )
  if os.environ.get(TF_CONFIG):
    resolver = resolvers.TFConfigClusterResolver()
    if resolver.cluster_spec().jobs:
      return resolver
  return None


def _host_and_port(address: str, task: str) -> Tuple[str, int]:
  host, _, port = address.rpartition(":")
  if not host or not port.isdigit():
    raise ValueError("task %s: address %r is not host:port" % (task, address))
  return host.strip("[]"), int(port)


def _answers(address: str, task: str, timeout: float) -> bool:
  try:
    with socket.create_connection(_host_and_port(address, task), timeout):
      return True
  except OSError:
    return False


def _tasks(spec: tf.train.ClusterSpec, skip=None) -> List[Tuple[str, str]]:
  """[(task name, address)] of every task of spec except `skip`."""
  tasks = []
  for job in sorted(spec.jobs):
    for index in spec.task_indices(job):
      if (job, index) != skip:
        tasks.append(
          ("/job:%s/task:%d" % (job, index), spec.task_address(job, index))
        )
  return tasks


def unavailable_tasks(
  spec: tf.train.ClusterSpec, skip=None, timeout: float = 2.0
) -> List[Tuple[str, str]]:
  """[(task name, address)] of the tasks whose port accepts no connection."""
  return [
    (task, address)
    for task, address in _tasks(spec, skip)
    if not _answers(address, task, timeout)
  ]


def wait_for_tasks(
  spec: tf.train.ClusterSpec,
  timeout: float = DEFAULT_TIMEOUT_SECONDS,
  skip=None,
) -> None:
  """Waits until every task of `spec` (but `skip`) accepts connections.

  Workers started at the same time as the trainer get `timeout` seconds to
  come up.

  Args:
    spec: the cluster.
    timeout: seconds to wait in all.
    skip: a (job, task index) not to wait for (the trainer's own task).

  Raises:
    TaskUnavailableError: naming every task still unreachable at the end.
  """
  deadline = time.monotonic() + timeout
  while True:
    missing = unavailable_tasks(spec, skip)
    if not missing:
      return
    if time.monotonic() >= deadline:
      raise TaskUnavailableError(
        "cannot reach %s within %g s: start a server there "
        "(python -m transformer.serve) or fix the cluster addresses"
        % (_describe(missing), timeout)
      )
    time.sleep(0.25)


def _local_task(resolver) -> Optional[Tuple[str, int]]:
  """The (job, index) a resolver gives this process in its cluster, if any."""
  job = getattr(resolver, "task_type", None)
  if job and job in resolver.cluster_spec().jobs:
    return job, int(resolver.task_id or 0)
  return None


def _error_lines(error: Exception) -> List[str]:
  return [
    line.strip()
    for line in str(getattr(error, "message", error)).splitlines()
    if line.strip()
  ]


def _error_summary(
  error: Exception, pattern: str = r"socket|connect|unavailable|closed|reset"
) -> str:
  """The first line of a runtime error matching `pattern`, else its last."""
  lines = _error_lines(error)
  for line in lines:
    if re.search(pattern, line, re.I):
      return line
  return lines[-1] if lines else ""


def _restarted_task(
  error: Exception, spec: tf.train.ClusterSpec
) -> Optional[Tuple[str, str]]:
  """(task, address) of the task a device incarnation error names, if any.

  The collective ops of a task keep the incarnations of the devices they
  exchanged data with; after one of those tasks restarted they fail with
  such an error, naming one of its devices first.
  """
  for line in _error_lines(error):
    if "incarnation" in line:
      found = re.search(r"/job:([\w-]+)/replica:\d+/task:(\d+)", line)
      if found:
        job, index = found.group(1), int(found.group(2))
        if job in spec.jobs and index in spec.task_indices(job):
          return (
            "/job:%s/task:%d" % (job, index),
            spec.task_address(job, index),
          )
  return None


def _describe(tasks: List[Tuple[str, str]]) -> str:
  return ", ".join("task %s at %s" % t for t in tasks)


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

  def devices(self, job: str = WORKER_JOB) -> Dict[str, List[str]]:
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

  def mesh_devices(self, mesh_shape, job: str = WORKER_JOB) -> List[str]:
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
  cluster: ClusterLike = None,
  timeout: float = DEFAULT_TIMEOUT_SECONDS,
  collectives: bool = False,
) -> Optional[Cluster]:
  """Connects this process's eager runtime to the cluster, if there is one.

  Args:
    cluster: see the module docstring (None: TF_CONFIG, else no cluster).
    timeout: seconds to wait for the tasks to accept connections.
    collectives: the run uses collective ops across the tasks (SIMD):
      check_restarted_tasks and check_collectives check every task can still
      run them.

  Returns:
    The connected Cluster, or None (no cluster: a single-process run).

  Raises:
    TaskUnavailableError: a task did not answer within `timeout`, or (with
      `collectives`) it keeps the former incarnation of a restarted task or
      its collective ops were aborted by an earlier failure.
    ValueError: a malformed cluster value, or a task started by
      transformer.serve runs another TensorFlow version than this process.
  """
  resolver = cluster_resolver(cluster)
  if resolver is None:
    return None
  spec = resolver.cluster_spec()
  local_task = _local_task(resolver)
  wait_for_tasks(spec, timeout, skip=local_task)
  if local_task:
    tf.config.experimental_connect_to_cluster(
      spec, job_name=local_task[0], task_index=local_task[1]
    )
  else:
    tf.config.experimental_connect_to_cluster(spec)
  logging.info("Connected to cluster %s", spec.as_dict())
  check_tf_versions(spec, skip=local_task)
  if collectives:
    check_restarted_tasks(spec, skip=local_task)
    check_collectives(spec, skip=local_task)
  return Cluster(spec, local_task)


def check_restarted_tasks(spec: tf.train.ClusterSpec, skip=None) -> None:
  """Checks no task restarted since the others ran collective ops with it.

  The collective ops of a task keep the device incarnations of the tasks
  they exchanged data with, and fail once one of those restarted. That
  failure aborts the collective ops of the tasks it reaches first: of the
  tasks that kept the former incarnation, and, depending on the order the
  tasks notice it, of the restarted one too, so what the user has to
  restart after it would be a matter of timing. This check runs before any
  collective op of the run instead: each task holds a random identity of its
  process and the identities of the tasks its last run with collective ops
  had; a task whose record names another identity than a task's current
  one keeps that task's former incarnation. When no task does, it records
  the current identities on every task for the next run's check.

  Args:
    spec: the cluster this process is connected to.
    skip: a (job, task index) not to check (this process's own task).

  Raises:
    TaskUnavailableError: naming the restarted tasks and the tasks that keep
      their former incarnation (to restart too).
  """
  tasks = _tasks(spec, skip)
  identities = {}
  for task, _ in tasks:
    identities[task] = _read_string(task, PROCESS_ID_VARIABLE)
    if identities[task] is None:
      identities[task] = uuid.uuid4().hex
      _write_string(task, PROCESS_ID_VARIABLE, identities[task])
  restarted, keepers = set(), []
  for task, address in tasks:
    peers = json.loads(_read_string(task, COLLECTIVE_PEERS_VARIABLE) or "{}")
    changed = [
      peer
      for peer, identity in peers.items()
      if identities.get(peer, identity) != identity
    ]
    if changed:
      restarted.update(changed)
      keepers.append((task, address))
  if keepers:
    restarted = [t for t in tasks if t[0] in restarted]
    raise _RestartedTaskError(
      "%s %s restarted after a run with collective ops: the other tasks "
      "keep %s former incarnation (%s ran collective ops with %s earlier "
      "process; found before any collective op of this run), which only a "
      "restart of their processes resets"
      % (
        _describe(restarted),
        "was" if len(restarted) == 1 else "were",
        "its" if len(restarted) == 1 else "their",
        _describe(keepers),
        "its" if len(restarted) == 1 else "their",
      ),
      keepers,
    )
  record = json.dumps(identities, sort_keys=True)
  for task, _ in tasks:
    _write_string(task, COLLECTIVE_PEERS_VARIABLE, record)


def check_collectives(
  spec: tf.train.ClusterSpec,
  skip=None,
  timeout: float = COLLECTIVE_CHECK_SECONDS,
) -> None:
  """Checks every task of `spec` (but `skip`) can run collective ops.

  When a task of a run with collective ops dies, TensorFlow aborts the
  collective executor of the tasks that exchanged data with it, and they
  fail every later collective (of any client) until their process exits.
  A run on such a task would fail at its first step with TensorFlow's
  error; this check runs one collective of a single member on each task's
  first CPU instead and names the tasks to restart.

  Args:
    spec: the cluster this process is connected to.
    skip: a (job, task index) not to check (this process's own task).
    timeout: seconds a task's collective may take.

  Raises:
    TaskUnavailableError: naming each task whose collective failed.
  """
  # Every task resolves its collective groups through the group leader,
  # which experimental_connect_to_cluster makes task 0 of the last job but
  # this process's own: its check goes first, and when it fails the others'
  # checks would fail through it, so they are not run.
  leader = None
  for job in spec.jobs:
    if not skip or job != skip[0]:
      leader = "/job:%s/task:0" % job
  tasks = sorted(_tasks(spec, skip), key=lambda t: t[0] != leader)
  failed = []
  for task, address in tasks:
    if failed and failed[0][0] == leader:
      break
    with tf.device("%s/device:CPU:0" % task):
      try:
        tf.raw_ops.CollectiveReduceV2(
          input=tf.zeros([1]),
          group_size=1,
          group_key=random.randrange(*_CHECK_GROUP_KEYS),
          instance_key=1,
          ordering_token=[],
          merge_op="Add",
          final_op="Id",
          timeout_seconds=timeout,
        ).numpy()
      except tf.errors.OpError as e:
        failed.append((task, address, _error_summary(e)))
  if failed:
    raise TaskUnavailableError(
      "%s cannot run collective ops (%s): a failure in an earlier run "
      "aborted them, and TensorFlow resets them only when the task's "
      "process restarts; restart %s (python -m transformer.serve) and run "
      "again"
      % (
        _describe([(task, address) for task, address, _ in failed]),
        "; ".join(summary for _, _, summary in failed),
        "it" if len(failed) == 1 else "them",
      )
    )


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


def _string_handle(name: str = VERSION_VARIABLE):
  """A handle to the string resource variable `name` of the current device."""
  return tf.raw_ops.VarHandleOp(
    dtype=tf.string, shape=[], container="", shared_name=name
  )


def _read_string(task: str, name: str) -> Optional[str]:
  """The string variable `name` on `task`'s first CPU; None if it is not set.

  Asked first whether it is set: reading a variable that is not fails the
  remote op, and the eager runtime may report that error again at a later
  op of this process (it failed the next AssignVariableOp once).
  """
  with tf.device("%s/device:CPU:0" % task):
    handle = _string_handle(name)
    if not tf.raw_ops.VarIsInitializedOp(resource=handle).numpy():
      return None
    value = tf.raw_ops.ReadVariableOp(resource=handle, dtype=tf.string)
    return value.numpy().decode()


def _write_string(task: str, name: str, value: str) -> None:
  """Sets the string variable `name` on `task`'s first CPU to `value`."""
  with tf.device("%s/device:CPU:0" % task):
    tf.raw_ops.AssignVariableOp(
      resource=_string_handle(name), value=tf.constant(value)
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
        resource=_string_handle(), value=tf.constant(version)
      )
    # The filter keeps the session to this task: without it the session
    # would wait for every other task of the cluster to be up.
    config = tf.compat.v1.ConfigProto(device_filters=[task])
    with tf.compat.v1.Session(server.target, config=config) as session:
      session.run(assign)


def check_tf_versions(spec: tf.train.ClusterSpec, skip=None) -> None:
  """Compares every task's published TensorFlow version to this process's.

  Tasks not started by transformer.serve publish none and are not checked.

  Args:
    spec: the cluster this process is connected to.
    skip: a (job, task index) not to check (this process's own task).

  Raises:
    ValueError: naming each task whose version differs.
  """
  mismatched = []
  for task, address in _tasks(spec, skip):
    version = _read_string(task, VERSION_VARIABLE)
    if version is None:
      continue  # not a transformer.serve task
    if version != tf.__version__:
      mismatched.append("task %s at %s runs %s" % (task, address, version))
  if mismatched:
    raise ValueError(
      "TensorFlow versions differ: this process runs %s, %s; install the "
      "same version on every host" % (tf.__version__, ", ".join(mismatched))
    )


def _uses_collectives(mesh_impl) -> bool:
  """Whether a run with this mesh_impl setting runs collective ops."""
  try:
    return mesh_impl_choice.resolve_mesh_impl(mesh_impl) == "simd"
  except ValueError:
    return False


def _checkpoint_advice(bound, restart: str) -> str:
  """The end of a lost-task error: the checkpoint to resume from, what to do."""
  model_dir = bound.get("model_dir")
  latest = checkpoints.latest_checkpoint(model_dir) if model_dir else None
  return "%s; %s and run again to resume from it." % (
    "The latest checkpoint %s is intact" % latest
    if latest
    else "No checkpoint was written yet",
    restart,
  )


def _stall_message(stalled, spec, local_task, bound, timeout: float) -> str:
  """The error for tasks that stopped answering (see names_unavailable_tasks).

  A stalled task that resumes goes on where it stopped. With collective ops
  the other tasks' collectives were waiting for it: a run right after it
  resumed went on from the checkpoint in two of three tries and failed in
  the third, so then every task is to be restarted.
  """
  survivors = [t for t in _tasks(spec, local_task) if t not in stalled]
  tasks = "the task" if len(stalled) == 1 else "the tasks"
  restart = "resume or restart %s" % tasks
  if survivors and _uses_collectives(bound.get("mesh_impl", "auto")):
    restart = (
      "restart %s and %s too (their collective ops may still hold the "
      "stalled run's state, which only a restart of the process resets)"
      % (tasks, _describe(survivors))
    )
  return (
    "%s stopped responding during the run: no answer to a health check for "
    "%g s (a stopped or hung process; stall_timeout sets how long to wait). "
    "%s" % (_describe(stalled), timeout, _checkpoint_advice(bound, restart))
  )


def _stall_timeout(bound) -> Optional[float]:
  """The run's stall_timeout (None: its cluster_timeout); None when off."""
  timeout = bound.get("stall_timeout")
  if timeout is None:
    timeout = bound.get("cluster_timeout", DEFAULT_TIMEOUT_SECONDS)
  return float(timeout) if timeout and timeout > 0 else None


def names_unavailable_tasks(fn: Callable) -> Callable:
  """Decorates utils.run: a lost or stalled task raises TaskUnavailableError.

  While `fn` runs on a cluster (its `cluster` argument, else TF_CONFIG), a
  task_watchdog.TaskWatchdog probes every task; one that answers no probe
  for the run's `stall_timeout` seconds (None: its `cluster_timeout`; 0 or
  less: no watchdog) is stalled, and the watchdog makes the pending call
  fail, so the run raises TaskUnavailableError naming it.
  When `fn` fails with one of the errors the eager runtime raises for a lost
  remote task, every task of the run's cluster is probed; the error names
  those that no longer answer and the latest checkpoint of the run's
  `model_dir`, which a restarted run resumes from. In a run with collective
  ops (SIMD) it also names the other tasks: TensorFlow aborts their
  collectives with the lost peer's, and only a restart of their processes
  resets them (see check_collectives). A task restarted since the others
  last exchanged data with it (they keep its former device incarnation),
  found by check_restarted_tasks before the run's first collective op or by
  a collective that fails for it, raises TaskUnavailableError naming it, the
  tasks to restart and the latest checkpoint. Other failures pass through
  unchanged.
  """
  signature = inspect.signature(fn)

  @functools.wraps(fn)
  def wrapper(*args, **kwargs):
    bound = signature.bind_partial(*args, **kwargs)
    bound.apply_defaults()
    bound = bound.arguments
    try:
      resolver = cluster_resolver(bound.get("cluster"))
    except ValueError:
      resolver = None  # fn raises it, naming the value
    if resolver is None:
      return fn(*args, **kwargs)
    spec, local_task = resolver.cluster_spec(), _local_task(resolver)
    timeout = _stall_timeout(bound)
    watchdog = None
    if timeout:
      watchdog = task_watchdog.TaskWatchdog(
        _tasks(spec, local_task),
        timeout,
        lambda stalled: (
          "%s: %s"
          % (
            TaskUnavailableError.__name__,
            _stall_message(stalled, spec, local_task, bound, timeout),
          )
        ),
      )
      watchdog.start()
    try:
      return fn(*args, **kwargs)
    except _RestartedTaskError as e:
      restart = "restart %s too" % _describe(e.keepers)
      raise TaskUnavailableError(
        "%s. %s" % (e.description, _checkpoint_advice(bound, restart))
      ) from e
    except Exception as e:  # pylint: disable=broad-except
      if watchdog is not None and watchdog.stalled:
        logging.error("TensorFlow's error: %s", e)
        raise TaskUnavailableError(
          _stall_message(watchdog.stalled, spec, local_task, bound, timeout)
        ) from e
      if not isinstance(e, tf.errors.OpError):
        raise
      restarted = _restarted_task(e, spec)
      lost = [restarted] if restarted else []
      if not lost and isinstance(e, _TASK_LOSS_ERRORS):
        lost = unavailable_tasks(spec, skip=local_task)
      if not lost:
        raise
      logging.error("TensorFlow's error: %s", e)
      survivors = [t for t in _tasks(spec, local_task) if t not in lost]
      if restarted:
        message = (
          "%s was restarted after a run with collective ops: the other tasks "
          "keep its former incarnation (%s: %s), and this run's failure "
          "aborted their collective ops"
          % (
            _describe(lost),
            type(e).__name__,
            _error_summary(e, "incarnation"),
          )
        )
        # Which tasks the failure reached first is a matter of timing: the
        # restarted one's collective ops may be aborted as well.
        restart = "restart %s too, and %s again" % (
          _describe(survivors),
          _describe(lost),
        )
      else:
        message = "lost %s during the run (%s: %s)" % (
          _describe(lost),
          type(e).__name__,
          _error_summary(e),
        )
        restart = "restart the task"
        if survivors and _uses_collectives(bound.get("mesh_impl", "auto")):
          restart += (
            " and %s too (the failure aborted their collective ops, which "
            "only a restart of the process resets)" % _describe(survivors)
          )
      raise TaskUnavailableError(
        "%s. %s" % (message, _checkpoint_advice(bound, restart))
      ) from e
    finally:
      if watchdog is not None:
        watchdog.stop()

  # gin reads parameters with inspect.getfullargspec (see
  # estimator.eager_in_legacy_mode).
  wrapper.__signature__ = signature
  return wrapper


def start_server(
  cluster: ClusterLike = None,
  job_name: Optional[str] = None,
  task_index: Optional[int] = None,
  cpus: Optional[int] = None,
) -> Tuple[tf.distribute.Server, str, int]:
  """Starts this process's tf.distribute.Server task of the cluster.

  For instance, start_server("h0:2222,h1:2222", task_index=1, cpus=2) serves
  /job:worker/task:1 on port 2222 of this host, with 2 CPU devices (a server
  lives as long as its process, so this is not run as an example here).

  Args:
    cluster: see the module docstring (None: TF_CONFIG, whose "task" also
      gives the job and index).
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
  resolver = cluster_resolver(cluster)
  if resolver is None:
    raise ValueError(
      "no cluster: pass --cluster=host:port,... or set TF_CONFIG"
    )
  spec = resolver.cluster_spec()
  job_name = job_name or getattr(resolver, "task_type", None) or WORKER_JOB
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
