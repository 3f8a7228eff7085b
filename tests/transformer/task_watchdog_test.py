"""The stall watchdog against real sockets and one worker process.

A listening socket that never accepts stands in for a stalled task: the
kernel completes the TCP handshake, but no gRPC answer ever comes, as with a
SIGSTOPped `transformer.serve`; a `transformer.serve` process is a task that
answers. A run that cutting the connections does not end is ended with its
process (in a subprocess here). The end-to-end runs (a SIGSTOPped worker of
a real cluster, placement and SIMD) are in multihost_test.py.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time

import pytest
import tensorflow as tf

from tests.transformer import multihost_test
from transformer._src.driver import cluster_failures
from transformer._src.driver import cluster_spec
from transformer._src.driver import task_watchdog

REPO = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)


@contextlib.contextmanager
def _silent_task():
  """The address of a port that accepts connections but never answers."""
  with socket.socket() as listener:
    listener.bind(("localhost", 0))
    listener.listen(16)
    yield "localhost:%d" % listener.getsockname()[1]


@pytest.fixture(name="server_address", scope="module")
def fixture_server_address(tmp_path_factory):
  """A `transformer.serve` task: it answers (stopped with the module).

  A process of its own: a server in the test process would listen on its
  port until the process ends.
  """
  address = "localhost:%d" % cluster_spec.free_local_ports(1)[0]
  server = multihost_test.Worker(
    [address], 0, str(tmp_path_factory.mktemp("server"))
  )
  yield address
  server.stop()


def test_task_answers_tells_answering_stalled_and_absent_tasks(
  server_address,
):
  assert task_watchdog.task_answers(server_address, 5.0) is True
  with _silent_task() as address:
    start = time.monotonic()
    assert task_watchdog.task_answers(address, 1.0) is None
    assert time.monotonic() - start < 5
  port = cluster_spec.free_local_ports(1)[0]
  assert task_watchdog.task_answers("localhost:%d" % port, 1.0) is False


def test_close_connections_ends_a_blocked_receive():
  with _silent_task() as address:
    with socket.create_connection(
      ("localhost", int(address.split(":")[1]))
    ) as connection:
      assert task_watchdog.close_connections([address]) == 1
      # The blocked receive a cut connection ends (no data: end of stream).
      connection.settimeout(5)
      assert connection.recv(1) == b""
    # No connection left to that port.
    assert task_watchdog.close_connections([address]) == 0


def test_watchdog_leaves_an_answering_task_alone(server_address):
  tasks = [("/job:worker/task:0", server_address)]
  with task_watchdog.TaskWatchdog(tasks, 1.0, str, interval=0.2) as watchdog:
    time.sleep(2.5)
  assert watchdog.stalled == []


def _run(
  model_dir,
  cluster=None,  # pylint: disable=redefined-outer-name
  cluster_timeout=60.0,
  *,
  stall_timeout=None,
  mesh_impl="placement",
  wait=30.0,
):
  """A stand-in for utils.run waiting on a task, as a remote call does."""
  del model_dir, cluster_timeout, stall_timeout, mesh_impl
  host, port = cluster.split(",")[-1].split(":")
  with socket.create_connection((host, int(port))) as connection:
    connection.settimeout(wait)
    try:
      if connection.recv(1) == b"":
        raise tf.errors.UnavailableError(None, None, "Socket closed")
    except socket.timeout:
      return "waited"
  return "answered"


def test_stalled_task_fails_the_run_naming_it(tmp_path, server_address):
  run = cluster_failures.names_unavailable_tasks(_run)
  with _silent_task() as address:
    addresses = "%s,%s" % (server_address, address)
    start = time.monotonic()
    with pytest.raises(cluster_spec.TaskUnavailableError) as raised:
      run(str(tmp_path), addresses, stall_timeout=2.0)
    seconds = time.monotonic() - start
  assert str(raised.value) == (
    "task /job:worker/task:1 at %s stopped responding during the run: no "
    "answer to a health check for 2 s (a stopped or hung process; "
    "stall_timeout sets how long to wait). No checkpoint was written yet; "
    "resume or restart the task and run again to resume from it." % address
  )
  assert isinstance(raised.value.__cause__, tf.errors.UnavailableError)
  # Two seconds of silence, probes a second apart taking up to one second
  # each; the rest is slack for a loaded machine.
  assert seconds < 15, seconds


def test_stall_timeout_defaults_to_cluster_timeout_and_zero_turns_it_off(
  tmp_path, server_address
):
  run = cluster_failures.names_unavailable_tasks(_run)
  with _silent_task() as address:
    addresses = "%s,%s" % (server_address, address)
    # With collective ops the other tasks are named too.
    with pytest.raises(
      cluster_spec.TaskUnavailableError,
      match=r"for 2 s .* restart the task and task /job:worker/task:0 at %s "
      r"too \(their collective ops may still hold the stalled run's state"
      % server_address,
    ):
      run(str(tmp_path), addresses, 2.0, mesh_impl="simd")
    assert run(str(tmp_path), addresses, 2.0, stall_timeout=0, wait=5) == (
      "waited"
    )


# A run that a cut connection does not end: the watchdog ends the process.
STUCK_RUN = """
import socket, sys, time
from transformer._src.driver import task_watchdog
with socket.socket() as listener:
  listener.bind(("localhost", 0))
  listener.listen(16)
  address = "localhost:%d" % listener.getsockname()[1]
  task_watchdog.TaskWatchdog(
    [("/job:worker/task:0", address)],
    1.0,
    lambda stalled: "stalled: %s" % stalled,
    interval=0.2,
    grace=1.0,
  ).start()
  time.sleep(60)
print("not ended")
"""


def test_watchdog_ends_a_process_the_cut_does_not_unblock():
  start = time.monotonic()
  ended = subprocess.run(
    [sys.executable, "-c", STUCK_RUN],
    env=dict(os.environ, PYTHONPATH=REPO),
    capture_output=True,
    text=True,
    timeout=120,
    check=False,
  )
  assert ended.returncode == 1, ended.stdout + ended.stderr
  assert "not ended" not in ended.stdout
  assert (
    ended.stderr.strip()
    .splitlines()[-1]
    .startswith("stalled: [('/job:worker/task:0', 'localhost:")
  ), ended.stderr
  assert time.monotonic() - start < 60
