"""The trainer's checks that every task of a cluster can run a run's ops.

Each transformer.serve task publishes its TensorFlow version in a string
resource variable of its first CPU; check_tf_versions compares it to the
trainer's (the runtime does not report a task's version).

With collective ops across the tasks (mesh_impl="simd"), TensorFlow keeps
state in every task that only a restart of its process resets (aborted
collectives after a peer failed, the peers' device incarnations): once one
task restarted, restart them all. Before a run's first collective op the
trainer checks for both (check_restarted_tasks, check_collectives) and
names the tasks to restart.
"""

from __future__ import annotations

import json
import random
import re
from typing import List, Optional, Tuple
import uuid

import tensorflow as tf

from transformer._src.driver import cluster_spec

__all__ = [
  "check_collectives",
  "check_restarted_tasks",
  "check_tf_versions",
]

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
# How long check_collectives waits for a task's one-member collective.
COLLECTIVE_CHECK_SECONDS = 30.0
# check_collectives' group keys: random in this range (below the collective
# backend's), so no group a previous run resolved is reused.
_CHECK_GROUP_KEYS = (1 << 20, 1 << 21)


class RestartedTaskError(cluster_spec.TaskUnavailableError):
  """Tasks keep a restarted peer's former incarnation (check_restarted_tasks).

  Attributes:
    description: what happened (the start of the message).
    keepers: the (task, address) pairs to restart.
  """

  def __init__(self, description: str, keepers: List[Tuple[str, str]]):
    super().__init__(
      "%s; restart %s (python -m transformer.serve) and run again"
      % (description, cluster_spec.describe(keepers))
    )
    self.description = description
    self.keepers = keepers


def error_lines(error: Exception) -> List[str]:
  return [
    line.strip()
    for line in str(getattr(error, "message", error)).splitlines()
    if line.strip()
  ]


def error_summary(
  error: Exception, pattern: str = r"socket|connect|unavailable|closed|reset"
) -> str:
  """The first line of a runtime error matching `pattern`, else its last."""
  lines = error_lines(error)
  for line in lines:
    if re.search(pattern, line, re.I):
      return line
  return lines[-1] if lines else ""


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
  tasks = cluster_spec.tasks(spec, skip)
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
    raise RestartedTaskError(
      "%s %s restarted after a run with collective ops: the other tasks "
      "keep %s former incarnation (%s ran collective ops with %s earlier "
      "process; found before any collective op of this run), which only a "
      "restart of their processes resets"
      % (
        cluster_spec.describe(restarted),
        "was" if len(restarted) == 1 else "were",
        "its" if len(restarted) == 1 else "their",
        cluster_spec.describe(keepers),
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
  tasks = sorted(cluster_spec.tasks(spec, skip), key=lambda t: t[0] != leader)
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
        failed.append((task, address, error_summary(e)))
  if failed:
    raise cluster_spec.TaskUnavailableError(
      "%s cannot run collective ops (%s): a failure in an earlier run "
      "aborted them, and TensorFlow resets them only when the task's "
      "process restarts; restart %s (python -m transformer.serve) and run "
      "again"
      % (
        cluster_spec.describe([(task, address) for task, address, _ in failed]),
        "; ".join(summary for _, _, summary in failed),
        "it" if len(failed) == 1 else "them",
      )
    )


def string_handle(name: str = VERSION_VARIABLE):
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
    handle = string_handle(name)
    if not tf.raw_ops.VarIsInitializedOp(resource=handle).numpy():
      return None
    value = tf.raw_ops.ReadVariableOp(resource=handle, dtype=tf.string)
    return value.numpy().decode()


def _write_string(task: str, name: str, value: str) -> None:
  """Sets the string variable `name` on `task`'s first CPU to `value`."""
  with tf.device("%s/device:CPU:0" % task):
    tf.raw_ops.AssignVariableOp(
      resource=string_handle(name), value=tf.constant(value)
    )


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
  for task, address in cluster_spec.tasks(spec, skip):
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
