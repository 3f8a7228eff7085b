"""Quiet entry points: a run prints its own progress and results, not logs.

Started from `python -m transformer.main` or from a script that opts in (the
demo), TensorFlow is imported with its C++ start-up lines (oneDNN, CPU
features, absl's "before InitializeLog" notice) removed, TF_CPP_MIN_LOG_LEVEL
defaults to 3, and after argument parsing absl logs only warnings, TFDS shows
no progress bars and its log records below ERROR are dropped.

`-v N` / `--verbosity=N` with N >= 0 (absl's flag) or MTF_VERBOSE=1 keeps
every line. Importing the library from user code changes nothing.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tempfile
from typing import Iterator, Optional, Sequence

VERBOSE_ENV = "MTF_VERBOSE"
# A script sets this global to True before importing `transformer` to get the
# quiet TensorFlow start-up (`python -m transformer.main` gets it without).
OPT_IN_GLOBAL = "MTF_QUIET_STARTUP"
QUIET_TF_CPP_MIN_LOG_LEVEL = "3"
ENTRY_POINT_MODULES = ("transformer.main", "transformer.serve")

_VERBOSITY_FLAGS = ("-v", "--v", "-verbosity", "--verbosity")
# TF's C++ log lines ("I0000 00:00:1795.. 123 port.cc:153] ...") by severity.
_CPP_LOG_LINE = re.compile(r"^([IWEF])\d{4} \d\d:\d\d:\d+\.\d+ +\d+ \S+:\d+\] ")
_CPP_SEVERITIES = "IWEF"
_ABSL_PRE_INIT_NOTICE = "WARNING: All log messages before absl::InitializeLog()"


def _flag_verbosity(argv: Sequence[str]) -> Optional[int]:
  """The value of the last absl -v/--verbosity flag in argv, if any."""
  value = None
  for i, arg in enumerate(argv):
    name, has_value, text = arg.partition("=")
    if name not in _VERBOSITY_FLAGS:
      continue
    if not has_value:
      text = argv[i + 1] if i + 1 < len(argv) else ""
    try:
      value = int(text)
    except ValueError:
      value = 0  # absl will reject it; show everything meanwhile.
  return value


def verbose_requested(argv: Optional[Sequence[str]] = None) -> bool:
  """True if MTF_VERBOSE is set (not 0/false) or argv has verbosity >= 0.

  Args:
    argv: the command line arguments (default: sys.argv[1:]).

  Returns:
    Whether the entry point should keep every log line.
  """
  env = os.environ.get(VERBOSE_ENV, "").strip().lower()
  if env and env not in ("0", "false", "no", "off"):
    return True
  verbosity = _flag_verbosity(sys.argv[1:] if argv is None else argv)
  return verbosity is not None and verbosity >= 0


def _started_as_entry_point() -> bool:
  """`python -m transformer.main` (or .serve), or a script that opted in."""
  if getattr(sys.modules.get("__main__"), OPT_IN_GLOBAL, False):
    return True
  argv = getattr(sys, "orig_argv", [])  # Python >= 3.10
  for i, arg in enumerate(argv[:-1]):
    if arg == "-m":
      return argv[i + 1] in ENTRY_POINT_MODULES
  return False


def _is_noise(line: str, min_level: int) -> bool:
  match = _CPP_LOG_LINE.match(line)
  if match:
    return _CPP_SEVERITIES.index(match.group(1)) < min_level
  return min_level > 0 and line.startswith(_ABSL_PRE_INIT_NOTICE)


@contextlib.contextmanager
def _filtered_stderr(min_level: int) -> Iterator[None]:
  """Collects what is written to file descriptor 2 (C++ too), then replays it.

  Lines TensorFlow's C++ logging writes below `min_level` (0 info, 1
  warning, 2 error) are dropped; everything else reaches stderr.
  """
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile() as collected:
    os.dup2(collected.fileno(), 2)
    try:
      yield
    finally:
      sys.stderr.flush()
      os.dup2(saved, 2)
      os.close(saved)
      collected.seek(0)
      text = collected.read().decode("utf-8", errors="replace")
      kept = [
        line
        for line in text.splitlines(keepends=True)
        if not _is_noise(line, min_level)
      ]
      if kept:
        sys.stderr.write("".join(kept))
        sys.stderr.flush()


def import_tensorflow_for_entry_point() -> None:
  """Imports TensorFlow quietly if an entry point started this process.

  Called by the `transformer` package before it imports TensorFlow; a no-op
  when the package is imported by user code, when TensorFlow is already
  imported, or when verbose output was requested.
  """
  if (
    "tensorflow" in sys.modules
    or not _started_as_entry_point()
    or verbose_requested()
  ):
    return
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", QUIET_TF_CPP_MIN_LOG_LEVEL)
  try:
    min_level = int(os.environ["TF_CPP_MIN_LOG_LEVEL"])
  except ValueError:
    min_level = 0
  with _filtered_stderr(min_level):
    import tensorflow  # noqa: F401  # pylint: disable=g-import-not-at-top,unused-import


class _DropTfdsRecords(logging.Filter):
  """Drops TFDS's absl log records below ERROR (e.g. dataset_info.json)."""

  def filter(self, record: logging.LogRecord) -> bool:
    from_tfds = (os.sep + "tensorflow_datasets" + os.sep) in record.pathname
    return not from_tfds or record.levelno >= logging.ERROR


def quiet_libraries(verbose: bool) -> None:
  """After argument parsing: absl at WARNING, no TFDS bars or chatter.

  Args:
    verbose: keep everything (verbose_requested()); then this does nothing.
  """
  if verbose:
    return
  from absl import logging as absl_logging  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top,import-outside-toplevel

  absl_logging.set_verbosity(absl_logging.WARNING)
  tfds.disable_progress_bar()
  absl_logger = logging.getLogger("absl")
  if not any(isinstance(f, _DropTfdsRecords) for f in absl_logger.filters):
    absl_logger.addFilter(_DropTfdsRecords())
  logging.getLogger("tensorflow_datasets").setLevel(logging.ERROR)
