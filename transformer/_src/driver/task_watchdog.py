"""A watchdog that notices a cluster task which stopped answering mid-run.

A worker that dies closes its connections, and the trainer's pending call
fails within seconds (cluster_failures.names_unavailable_tasks names the
task). A worker that is alive but stalled (a stopped process, SIGSTOP; a
machine that froze) keeps its connections open: the kernel still accepts and
acknowledges, but no answer comes, and TensorFlow's eager runtime waits for
it forever. TensorFlow 2.21 offers no way to end that wait: a
CancellationManager does not reach the remote parts of a function call, and
the remote calls have no deadline (both tried).

TaskWatchdog probes every task from a thread with a short-deadline gRPC call
to the task's worker service (`GetStatus`). The server answers it on the
first free thread of its inter-op pool, and a computing task frees those
between kernels, so a long step is not taken for a stall. A task all of
whose inter-op threads are held by kernels that never return (a hung read)
answers nothing either, and is taken for stalled; one whose hung kernel holds
fewer of them, or waits without a thread (a queue that never gets data),
answers as a healthy one does, and runs any other op: no probe tells it from
the tasks waiting for it (measured; see docs/tpu_and_multihost.md).
A task that answered no probe for `timeout` seconds is stalled. The watchdog
then shuts down this process's TCP connections to the cluster's tasks (found
in Linux's /proc), which fails the pending call as a lost connection does;
it repeats that until the run returns, as gRPC reconnects. Connections to
every task are cut, not only to the stalled ones: with collective ops the
other tasks wait for the stalled one's data, and the call returns only when
all its parts ended. Where that is not possible (no /proc) or the run has not
returned after `grace` seconds, the watchdog writes its message to stderr and
ends the process with status 1: checkpoints are written to a temporary
directory and named in the checkpoint state file by an atomic rename, so no
checkpoint is ever left half written.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
import sys
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple

from absl import logging

__all__ = ["TaskWatchdog", "close_connections", "task_answers"]

# The worker service method the probes call: its request message is empty.
_GET_STATUS = "/tensorflow.WorkerService/GetStatus"
# Seconds between two rounds of probes, and the longest one probe may take.
PROBE_INTERVAL_SECONDS = 1.0
PROBE_DEADLINE_SECONDS = 3.0
# Seconds the watchdog waits for the run to return after cutting the
# connections before it ends the process.
GRACE_SECONDS = 30.0
_TCP_TABLES = (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", None))
_TCP_LISTEN = "0A"


def task_answers(address: str, timeout: float) -> Optional[bool]:
  """Whether the TensorFlow server at `address` answers a status request.

  Example (no server listens on a freshly picked free port):
    >>> import socket
    >>> with socket.socket() as s:
    ...   s.bind(("localhost", 0))
    ...   port = s.getsockname()[1]
    >>> task_answers("localhost:%d" % port, timeout=1.0)
    False

  Args:
    address: the task's "host:port".
    timeout: seconds the answer may take.

  Returns:
    True if it answered; None if it accepted the connection (or was
    unreachable in another way) but gave no answer within `timeout`: a
    stalled process; False if the connection was refused (no process).
  """
  import grpc  # pylint: disable=g-import-not-at-top  (TensorFlow requires it)

  # A proxy from the environment must not stand in for the task.
  options = [("grpc.enable_http_proxy", 0)]
  with grpc.insecure_channel(address, options=options) as channel:
    try:
      channel.unary_unary(_GET_STATUS)(b"", timeout=timeout)
      return True
    except grpc.RpcError as e:
      if e.code() == grpc.StatusCode.UNAVAILABLE:
        return False
      return None


def _accepts(address: str, timeout: float) -> bool:
  """Whether the port at `address` accepts a TCP connection."""
  host, _, port = address.rpartition(":")
  try:
    with socket.create_connection((host.strip("[]"), int(port)), timeout):
      return True
  except OSError:
    return False


def _address_ips(address: str) -> Set[str]:
  host, _, _ = address.rpartition(":")
  host = host.strip("[]")
  try:
    infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
  except OSError:
    return set()
  return {_plain_ip(info[4][0]) for info in infos}


def _plain_ip(ip: str) -> str:
  """`ip` without an IPv6 zone, IPv4-mapped IPv6 addresses as IPv4."""
  parsed = ipaddress.ip_address(ip.split("%")[0])
  mapped = getattr(parsed, "ipv4_mapped", None)
  return str(mapped or parsed)


def _proc_ip(text: str, family: Optional[int]) -> str:
  """An IP of a /proc/net/tcp(6) line: 32-bit words in host byte order."""
  raw = b"".join(
    struct.pack("=I", int(text[i : i + 8], 16)) for i in range(0, len(text), 8)
  )
  return _plain_ip(socket.inet_ntop(family or socket.AF_INET6, raw))


def _connection_inodes(peers: Set[Tuple[str, int]]) -> Set[str]:
  """Socket inodes of this host's TCP connections to any (ip, port) of peers."""
  inodes = set()
  for path, family in _TCP_TABLES:
    try:
      with open(path) as f:
        lines = f.readlines()[1:]
    except OSError:
      continue
    for line in lines:
      fields = line.split()
      if len(fields) < 10 or fields[3] == _TCP_LISTEN:
        continue
      ip, port = fields[2].split(":")
      if (_proc_ip(ip, family), int(port, 16)) in peers:
        inodes.add(fields[9])
  return inodes


def close_connections(addresses: Sequence[str]) -> Optional[int]:
  """Shuts down this process's TCP connections to the tasks at `addresses`.

  A call of TensorFlow's runtime waiting for an answer over one of them then
  fails (UnavailableError, "Socket closed"), as if the task had died.

  Args:
    addresses: "host:port" of each task.

  Returns:
    The number of connections shut down, or None where this process's
    sockets cannot be listed (no Linux /proc).
  """
  if not os.path.isdir("/proc/self/fd"):
    return None
  peers = set()
  for address in addresses:
    port = int(address.rpartition(":")[2])
    peers.update((ip, port) for ip in _address_ips(address))
  inodes = _connection_inodes(peers)
  closed = 0
  for fd in os.listdir("/proc/self/fd"):
    try:
      target = os.readlink("/proc/self/fd/%s" % fd)
    except OSError:
      continue
    if not (target.startswith("socket:[") and target[8:-1] in inodes):
      continue
    try:
      # A duplicate of the descriptor: shutting it down ends the connection
      # for every descriptor of it; closing it leaves the runtime's open.
      with socket.socket(fileno=os.dup(int(fd))) as duplicate:
        # The runtime may have reused the number for another file since.
        if str(os.fstat(duplicate.fileno()).st_ino) != target[8:-1]:
          continue
        duplicate.shutdown(socket.SHUT_RDWR)
      closed += 1
    except OSError:
      continue
  return closed


class TaskWatchdog:
  """Probes a cluster's tasks from a thread; acts when one stops answering.

  A task is stalled when it answered no probe for `timeout` seconds while
  its port accepted connections (or after it had answered once): a task
  that never came up is left to the start-up checks. Then `stalled` lists
  the stalled tasks, and the watchdog cuts the connections to every task
  (see the module docstring) until stop() is called, or ends the process
  after `grace` seconds, writing message() to stderr.

  Use as a context manager around the run:
    with TaskWatchdog(tasks, timeout=60.0, message=...) as watchdog:
      ...  # a stall makes the pending call fail; watchdog.stalled says why
  """

  def __init__(
    self,
    tasks: Sequence[Tuple[str, str]],
    timeout: float,
    message: Callable[[List[Tuple[str, str]]], str],
    *,
    interval: float = PROBE_INTERVAL_SECONDS,
    grace: float = GRACE_SECONDS,
  ):
    """Prepares the watchdog; it runs between start() and stop().

    Args:
      tasks: [(task name, "host:port")] of the tasks to watch.
      timeout: seconds a task may go without answering.
      message: called with the stalled tasks; returns the error to write
        when the process has to be ended.
      interval: seconds between two rounds of probes.
      grace: seconds the run gets to return after a stall was found.
    """
    self.tasks = list(tasks)
    self.timeout = float(timeout)
    self.stalled: List[Tuple[str, str]] = []
    self._message = message
    self._interval = interval
    self._grace = grace
    self._stopped = threading.Event()
    self._thread = threading.Thread(
      target=self._watch, name="mesh_tensorflow-task-watchdog", daemon=True
    )

  def __enter__(self) -> "TaskWatchdog":
    self.start()
    return self

  def __exit__(self, *unused_exc_info) -> None:
    self.stop()

  def start(self) -> None:
    """Starts probing in a daemon thread."""
    self._thread.start()

  def stop(self) -> None:
    """Stops the thread (the run returned)."""
    self._stopped.set()
    if (
      self._thread.is_alive() and self._thread is not threading.current_thread()
    ):
      self._thread.join()

  def _watch(self) -> None:
    silent_since: Dict[str, float] = {}
    answered: Set[str] = set()
    deadline = min(PROBE_DEADLINE_SECONDS, max(self.timeout / 2, 0.1))
    while not self._stopped.wait(self._interval):
      for task, address in self.tasks:
        started = time.monotonic()
        answer = task_answers(address, deadline)
        if answer:
          answered.add(task)
          silent_since.pop(task, None)
        elif task in answered or (
          answer is None and _accepts(address, deadline)
        ):
          silent_since.setdefault(task, started)
      now = time.monotonic()
      stalled = [
        (task, address)
        for task, address in self.tasks
        if task in silent_since and now - silent_since[task] >= self.timeout
      ]
      if stalled and not self._stopped.is_set():
        self.stalled = stalled
        self._end_run()
        return

  def _end_run(self) -> None:
    """Cuts the connections until stop(); ends the process after grace."""
    logging.error(
      "%s answered no health check for %g s: ending the run",
      ", ".join(task for task, _ in self.stalled),
      self.timeout,
    )
    addresses = [address for _, address in self.tasks]
    ends = time.monotonic() + self._grace
    while time.monotonic() < ends:
      if close_connections(addresses) is None:
        break
      if self._stopped.wait(0.5):
        return
    sys.stderr.write("%s\n" % self._message(self.stalled))
    sys.stderr.flush()
    os._exit(1)  # pylint: disable=protected-access
