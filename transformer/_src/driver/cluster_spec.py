"""The tasks of a cluster: its value, resolver, task list and reachability.

A cluster is given as a value (`utils.run(cluster=...)`, `--cluster`) or by
the TF_CONFIG environment variable; cluster_resolver turns either into a TF
cluster resolver. The tasks of its spec are listed in job and task order
(tasks), probed for an open port (unavailable_tasks, wait_for_tasks) and
named in messages (describe). A task that does not answer raises
TaskUnavailableError.

Accepted cluster values (`utils.run(cluster=...)`, `--cluster`):
  - "host0:2222,host1:2222": the addresses of the "worker" job's tasks;
  - a JSON object or dict {"worker": [...], ...} (TF_CONFIG's "cluster");
  - a tf.train.ClusterSpec or a tf.distribute.cluster_resolver resolver.

Example (the trainer's view of a cluster of two workers):
  >>> parse_cluster("h0:2222,h1:2222")
  {'worker': ['h0:2222', 'h1:2222']}
"""

from __future__ import annotations

import json
import os
import socket
import time
from typing import Dict, List, Optional, Tuple, Union

import tensorflow as tf

__all__ = [
  "ClusterLike",
  "TaskUnavailableError",
  "cluster_resolver",
  "free_local_ports",
  "parse_cluster",
  "unavailable_tasks",
  "wait_for_tasks",
]

WORKER_JOB = "worker"
TF_CONFIG = "TF_CONFIG"
DEFAULT_TIMEOUT_SECONDS = 60.0


ClusterLike = Union[
  None,
  str,
  Dict[str, List[str]],
  tf.train.ClusterSpec,
  tf.distribute.cluster_resolver.ClusterResolver,
]


class TaskUnavailableError(ConnectionError):
  """A task of the cluster did not answer (at start-up or during a run)."""


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


def tasks(spec: tf.train.ClusterSpec, skip=None) -> List[Tuple[str, str]]:
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
    for task, address in tasks(spec, skip)
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
        % (describe(missing), timeout)
      )
    time.sleep(0.25)


def local_task(resolver) -> Optional[Tuple[str, int]]:
  """The (job, index) a resolver gives this process in its cluster, if any."""
  job = getattr(resolver, "task_type", None)
  if job and job in resolver.cluster_spec().jobs:
    return job, int(resolver.task_id or 0)
  return None


def describe(tasks: List[Tuple[str, str]]) -> str:
  return ", ".join("task %s at %s" % t for t in tasks)
