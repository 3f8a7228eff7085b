"""One trainer per model_dir: a lock file naming the host and pid holding it.

Two trainers writing one model_dir would interleave their checkpoints in one
state file and delete each other's saves in progress. A trainer therefore
creates `<model_dir>/trainer.lock` (exclusively: the create fails if the
file exists) holding `host=<hostname> pid=<pid> ...`, and removes it when it
stops. A second trainer finds the file and refuses, naming the holder.

A lock left by a process that died (kill -9, a crash of the machine) is
stale: if the holder ran on this host and its pid no longer exists, the
lock is taken over with a warning. A lock held on another host cannot be
checked from here; the error says which file to delete if that holder is
gone. Readers (eval, infer, export) never take the lock.

The lock is re-entrant within a process (one trainer may train, evaluate and
train on), and only local directories are locked: object stores such as
gs:// have no exclusive create, so they are left unlocked with a warning.

Example:
  >>> import tempfile
  >>> model_dir = tempfile.mkdtemp()
  >>> with ModelDirLock(model_dir):
  ...   print(holder(model_dir)["pid"] == str(os.getpid()))
  True
  >>> print(holder(model_dir))
  None
"""

from __future__ import annotations

import atexit
import errno
import os
import socket
import threading
import time
from typing import Dict, Optional

from absl import logging

__all__ = ["LOCK_FILENAME", "ModelDirLock", "ModelDirLockedError", "holder"]

LOCK_FILENAME = "trainer.lock"

# Locks this process holds: {lock file path: hold count}.
_held: Dict[str, int] = {}
_held_mutex = threading.Lock()


class ModelDirLockedError(RuntimeError):
  """Another live trainer holds the model_dir's lock."""


def _lock_path(model_dir: str) -> str:
  return os.path.join(os.path.abspath(model_dir), LOCK_FILENAME)


def _is_local(model_dir: str) -> bool:
  return "://" not in model_dir


def holder(model_dir: str) -> Optional[Dict[str, str]]:
  """Who holds model_dir's lock: {"host", "pid", "started"}, or None.

  Args:
    model_dir: the model directory.

  Returns:
    The lock file's fields, or None if there is no lock file.
  """
  try:
    with open(_lock_path(model_dir), encoding="utf-8", errors="replace") as f:
      text = f.read()
  except FileNotFoundError:
    return None
  fields = {}
  for item in text.split():
    key, _, value = item.partition("=")
    fields[key] = value
  return fields


def _describe(fields: Dict[str, str]) -> str:
  return "pid %s on host %s (since %s)" % (
    fields.get("pid", "?"),
    fields.get("host", "?"),
    fields.get("started", "?"),
  )


def _process_exists(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # Exists, owned by another user.
    return True
  return True


def _stale(fields: Dict[str, str]) -> bool:
  """Whether the lock's holder ran on this host and has exited."""
  if fields.get("host") != socket.gethostname():
    return False
  try:
    pid = int(fields.get("pid", ""))
  except ValueError:
    return True  # Unreadable (a crash while the file was being written).
  return pid != os.getpid() and not _process_exists(pid)


def _create(path: str) -> bool:
  """Creates the lock file exclusively; False if it exists."""
  try:
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
  except FileExistsError:
    return False
  with os.fdopen(fd, "w", encoding="utf-8") as f:
    f.write(
      "host=%s pid=%d started=%s\n"
      % (
        socket.gethostname(),
        os.getpid(),
        time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
      )
    )
  return True


def acquire(model_dir: str) -> None:
  """Takes model_dir's lock for this process (re-entrant).

  Args:
    model_dir: the model directory (created if missing).

  Raises:
    ModelDirLockedError: naming the holder, if another live process holds it.
  """
  if not _is_local(model_dir):
    logging.warning(
      "%s is not a local directory: one trainer per model_dir is not "
      "enforced there",
      model_dir,
    )
    return
  path = _lock_path(model_dir)
  with _held_mutex:
    if path in _held:
      _held[path] += 1
      return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    for _ in range(3):
      if _create(path):
        _held[path] = 1
        return
      fields = holder(model_dir)
      if fields is None:
        continue  # Released meanwhile.
      if (
        fields.get("pid") == str(os.getpid())
        and fields.get("host") == socket.gethostname()
      ):
        # Left by this process (e.g. a lock not released after an error).
        _held[path] = 1
        return
      if not _stale(fields):
        raise ModelDirLockedError(
          "model_dir %s is in use by another trainer: %s holds %s. Two "
          "trainers on one model_dir overwrite each other's checkpoints; use "
          "another --model_dir, or stop that trainer (if it is gone, delete "
          "%s)" % (model_dir, _describe(fields), path, path)
        )
      logging.warning(
        "taking over the stale lock %s of %s, which no longer runs",
        path,
        _describe(fields),
      )
      try:
        os.remove(path)
      except OSError as e:
        if e.errno != errno.ENOENT:
          raise
    raise ModelDirLockedError("could not take the lock %s" % path)


def release(model_dir: str) -> None:
  """Releases one hold of model_dir's lock; the file goes with the last.

  Args:
    model_dir: the model directory.
  """
  if not _is_local(model_dir):
    return
  path = _lock_path(model_dir)
  with _held_mutex:
    count = _held.get(path, 0)
    if count > 1:
      _held[path] = count - 1
      return
    if not count:
      return
    del _held[path]
    fields = holder(model_dir)
    if fields and fields.get("pid") == str(os.getpid()):
      try:
        os.remove(path)
      except FileNotFoundError:
        pass


@atexit.register
def _release_all() -> None:
  with _held_mutex:
    paths = list(_held)
    _held.clear()
  for path in paths:
    try:
      os.remove(path)
    except OSError:
      pass


class ModelDirLock:
  """A context manager holding model_dir's trainer lock.

  Args:
    model_dir: the model directory.
  """

  def __init__(self, model_dir: str):
    self.model_dir = model_dir

  def __enter__(self) -> "ModelDirLock":
    acquire(self.model_dir)
    return self

  def __exit__(self, *exc_info) -> None:
    release(self.model_dir)
