"""Naming the cluster tasks lost or stalled during a run (utils.run's errors).

A task that dies mid-run fails the pending step within seconds; one that
stalls (a stopped process, a frozen host) keeps its connections open, and
the step would wait for it forever: while utils.run runs, a
task_watchdog.TaskWatchdog probes every task and ends the run when one stops
answering for `stall_timeout` seconds. names_unavailable_tasks, the
decorator of utils.run, turns either failure (and a task restarted since a
run with collective ops, see cluster_checks) into a TaskUnavailableError
naming the tasks to restart and the checkpoint to resume from.
"""

from __future__ import annotations

import functools
import inspect
import re
from typing import Callable, Optional, Tuple

from absl import logging
import tensorflow as tf

from transformer._src.driver import checkpoints
from transformer._src.driver import cluster_checks
from transformer._src.driver import cluster_spec
from transformer._src.driver import mesh_impl_choice
from transformer._src.driver import task_watchdog

__all__ = [
  "names_unavailable_tasks",
]

# Errors the eager runtime raises when a remote task went away mid-run.
_TASK_LOSS_ERRORS = (
  tf.errors.UnavailableError,
  tf.errors.CancelledError,
  tf.errors.AbortedError,
  tf.errors.InternalError,
  tf.errors.UnknownError,
)


def _restarted_task(
  error: Exception, spec: tf.train.ClusterSpec
) -> Optional[Tuple[str, str]]:
  """(task, address) of the task a device incarnation error names, if any.

  The collective ops of a task keep the incarnations of the devices they
  exchanged data with; after one of those tasks restarted they fail with
  such an error, naming one of its devices first.
  """
  for line in cluster_checks.error_lines(error):
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
  survivors = [
    t for t in cluster_spec.tasks(spec, local_task) if t not in stalled
  ]
  tasks = "the task" if len(stalled) == 1 else "the tasks"
  restart = "resume or restart %s" % tasks
  if survivors and _uses_collectives(bound.get("mesh_impl", "auto")):
    restart = (
      "restart %s and %s too (their collective ops may still hold the "
      "stalled run's state, which only a restart of the process resets)"
      % (tasks, cluster_spec.describe(survivors))
    )
  return (
    "%s stopped responding during the run: no answer to a health check for "
    "%g s (a stopped or hung process; stall_timeout sets how long to wait). "
    "%s"
    % (
      cluster_spec.describe(stalled),
      timeout,
      _checkpoint_advice(bound, restart),
    )
  )


def _stall_timeout(bound) -> Optional[float]:
  """The run's stall_timeout (None: its cluster_timeout); None when off."""
  timeout = bound.get("stall_timeout")
  if timeout is None:
    timeout = bound.get("cluster_timeout", cluster_spec.DEFAULT_TIMEOUT_SECONDS)
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
      resolver = cluster_spec.cluster_resolver(bound.get("cluster"))
    except ValueError:
      resolver = None  # fn raises it, naming the value
    if resolver is None:
      return fn(*args, **kwargs)
    spec, local_task = (
      resolver.cluster_spec(),
      cluster_spec.local_task(resolver),
    )
    timeout = _stall_timeout(bound)
    watchdog = None
    if timeout:
      watchdog = task_watchdog.TaskWatchdog(
        cluster_spec.tasks(spec, local_task),
        timeout,
        lambda stalled: (
          "%s: %s"
          % (
            cluster_spec.TaskUnavailableError.__name__,
            _stall_message(stalled, spec, local_task, bound, timeout),
          )
        ),
      )
      watchdog.start()
    try:
      return fn(*args, **kwargs)
    except cluster_checks.RestartedTaskError as e:
      restart = "restart %s too" % cluster_spec.describe(e.keepers)
      raise cluster_spec.TaskUnavailableError(
        "%s. %s" % (e.description, _checkpoint_advice(bound, restart))
      ) from e
    except Exception as e:  # pylint: disable=broad-except
      if watchdog is not None and watchdog.stalled:
        logging.error("TensorFlow's error: %s", e)
        raise cluster_spec.TaskUnavailableError(
          _stall_message(watchdog.stalled, spec, local_task, bound, timeout)
        ) from e
      if not isinstance(e, tf.errors.OpError):
        raise
      restarted = _restarted_task(e, spec)
      lost = [restarted] if restarted else []
      if not lost and isinstance(e, _TASK_LOSS_ERRORS):
        lost = cluster_spec.unavailable_tasks(spec, skip=local_task)
      if not lost:
        raise
      logging.error("TensorFlow's error: %s", e)
      survivors = [
        t for t in cluster_spec.tasks(spec, local_task) if t not in lost
      ]
      if restarted:
        message = (
          "%s was restarted after a run with collective ops: the other tasks "
          "keep its former incarnation (%s: %s), and this run's failure "
          "aborted their collective ops"
          % (
            cluster_spec.describe(lost),
            type(e).__name__,
            cluster_checks.error_summary(e, "incarnation"),
          )
        )
        # Which tasks the failure reached first is a matter of timing: the
        # restarted one's collective ops may be aborted as well.
        restart = "restart %s too, and %s again" % (
          cluster_spec.describe(survivors),
          cluster_spec.describe(lost),
        )
      else:
        message = "lost %s during the run (%s: %s)" % (
          cluster_spec.describe(lost),
          type(e).__name__,
          cluster_checks.error_summary(e),
        )
        restart = "restart the task"
        if survivors and _uses_collectives(bound.get("mesh_impl", "auto")):
          restart += (
            " and %s too (the failure aborted their collective ops, which "
            "only a restart of the process resets)"
            % cluster_spec.describe(survivors)
          )
      raise cluster_spec.TaskUnavailableError(
        "%s. %s" % (message, _checkpoint_advice(bound, restart))
      ) from e
    finally:
      if watchdog is not None:
        watchdog.stop()

  # gin reads parameters with inspect.getfullargspec (see
  # estimator.eager_in_legacy_mode).
  wrapper.__signature__ = signature
  return wrapper
