"""The driver's checkpoint files: mesh-independent TF V2 bundles, saving.

A checkpoint is `<model_dir>/model.ckpt-<step>.index` plus
`model.ckpt-<step>.data-00000-of-00001`, the standard TensorFlow "V2" bundle,
holding exactly the tensors it is given under their original full names
(`encoder/block_000/layer_000/SelfAttention/q`, `..._slot_vr`, `global_step`)
with their full, unsliced shapes and their master dtypes. Masters are
full-shape, so a checkpoint does not depend on the mesh shape or layout that
wrote it: restoring the masters and re-slicing them (a new lowering, or
`Lowering.copy_masters_to_slices`) gives the same model on any mesh.
`tf.train.list_variables` / `tf.train.load_checkpoint` read these files, and
checkpoint_restore reads them (and those written by the original, TF1
`Saver`, sharded) into variables.

Beside the bundles, the `checkpoint` state file (a CheckpointState text proto,
read and written with tf.train.get_checkpoint_state / update_checkpoint_state)
names the latest checkpoint and the ones kept.

Saving is atomic: tensors are written under a temporary directory inside
model_dir, the data file then the index are renamed into place, and only then
is the state file replaced (TF writes a temporary file and renames it). A
crash at any point leaves the previous latest checkpoint named and intact.

Values with inf or nan (a diverged model) are neither saved nor restored
unless allowed (`allow_non_finite_checkpoints`): a save that refuses writes
nothing, so rotation only ever deletes checkpoints older than a finite one.

In the driver, the variables saved are a VariableStore's masters and the
global step.

Example:
  >>> import tempfile
  >>> model_dir = tempfile.mkdtemp()
  >>> w = tf.Variable([[1.0, 2.0]])
  >>> step = tf.Variable(100, dtype=tf.int64)
  >>> path = save(model_dir, 100, {"decoder/w": w, "global_step": step},
  ...             keep_checkpoint_max=5)
  >>> os.path.basename(latest_checkpoint(model_dir))
  'model.ckpt-100'
  >>> sorted(tf.train.list_variables(path))
  [('decoder/w', [1, 2]), ('global_step', [])]
"""

from __future__ import annotations

import os
import re
import time
from typing import Iterable, List, Mapping, Optional, Sequence, Tuple
import uuid

from absl import logging
import gin
import tensorflow as tf
from tensorflow.python.util import deprecation  # pylint: disable=g-direct-tensorflow-import

__all__ = [
  "CHECKPOINT_BASENAME",
  "STATE_FILENAME",
  "all_checkpoints",
  "allow_non_finite_checkpoints",
  "checkpoint_prefix",
  "checkpoint_steps",
  "latest_checkpoint",
  "non_finite_names",
  "save",
]

CHECKPOINT_BASENAME = "model.ckpt"
STATE_FILENAME = "checkpoint"
_TMP_DIR_PREFIX = ".ckpt-tmp-"
INDEX_SUFFIX = ".index"
_STEP_RE = re.compile(r"^model\.ckpt-(\d+)\.index$")
MAX_NAMES_IN_ERROR = 10

gfile = tf.io.gfile
VariableMap = Mapping[str, tf.Variable]


# ----------------------------------------------------------------------------
# Paths and the state file.


def checkpoint_prefix(model_dir: str, step: int) -> str:
  """`<model_dir>/model.ckpt-<step>`: the prefix of step's bundle files."""
  return _join(model_dir, "%s-%d" % (CHECKPOINT_BASENAME, int(step)))


def _join(directory: str, name: str) -> str:
  return directory.rstrip("/") + "/" + name if directory else name


def _dirname(path: str) -> str:
  return path.rsplit("/", 1)[0] if "/" in path else ""


def _basename(path: str) -> str:
  return path.rsplit("/", 1)[-1]


def bundle_exists(prefix: str) -> bool:
  return gfile.exists(prefix + INDEX_SUFFIX)


def _bundle_files(prefix: str) -> List[str]:
  """The index and data files of the bundle at `prefix` that exist."""
  files = gfile.glob(prefix + ".data-?????-of-?????")
  if gfile.exists(prefix + INDEX_SUFFIX):
    files.append(prefix + INDEX_SUFFIX)
  return files


class _State:
  """What the state file says: latest path, kept paths and their times."""

  def __init__(
    self,
    latest: Optional[str],
    paths: List[str],
    timestamps: List[float],
    last_preserved: float = 0.0,
  ):
    self.latest = latest
    self.paths = paths
    self.timestamps = timestamps
    self.last_preserved = last_preserved


def _read_state(model_dir: str) -> Optional[_State]:
  """The state file of model_dir (tf.train.get_checkpoint_state), or None.

  Raises:
    ValueError: if the state file exists but cannot be parsed (training on
      from scratch would then overwrite a model; better stop).
  """
  state_file = _join(model_dir, STATE_FILENAME)
  if not gfile.exists(state_file):
    return None
  try:
    proto = tf.compat.v1.train.get_checkpoint_state(model_dir)
  except ValueError:  # No model_checkpoint_path in it.
    proto = None
  except UnicodeDecodeError as e:  # Binary garbage.
    raise ValueError(
      "checkpoint state file %s is not a text CheckpointState (%s); "
      "restore it or delete it to use the newest model.ckpt-<step> bundle"
      % (state_file, e)
    ) from e
  if proto is None:  # TF logs the parse error and returns None.
    raise ValueError(
      "checkpoint state file %s cannot be parsed as a "
      "CheckpointState" % state_file
    )
  paths = list(proto.all_model_checkpoint_paths)
  timestamps = list(proto.all_model_checkpoint_timestamps)
  if len(timestamps) != len(paths):
    timestamps = [0.0] * len(paths)
  return _State(
    proto.model_checkpoint_path,
    paths,
    timestamps,
    proto.last_preserved_timestamp,
  )


def _absolute(model_dir: str, path: str) -> str:
  """A path of the state file (tf.train.get_checkpoint_state joined relative
  ones to model_dir); a stale absolute path that no longer exists (model_dir
  was moved) is looked up in model_dir by basename.
  """
  if not bundle_exists(path) and bundle_exists(
    _join(model_dir, _basename(path))
  ):
    return _join(model_dir, _basename(path))
  return path


def _relative(model_dir: str, path: str) -> str:
  return _basename(path) if _dirname(path) == model_dir.rstrip("/") else path


def _write_state(model_dir: str, state: _State) -> None:
  """Replaces the state file (tf.train.update_checkpoint_state writes a
  temporary file, then renames it: atomic). Paths inside model_dir are
  written relative to it, so a moved model_dir stays readable.
  """

  def name(path):
    # TF writes paths as given under an absolute model_dir and makes them
    # relative to a relative one.
    return _relative(model_dir, path) if os.path.isabs(model_dir) else path

  # TF marks the function deprecated in favour of CheckpointManager, which
  # cannot write the original's relative paths; its warning is noise here.
  with deprecation.silence():
    tf.compat.v1.train.update_checkpoint_state(
      model_dir,
      name(state.latest),
      [name(p) for p in state.paths],
      all_model_checkpoint_timestamps=state.timestamps,
      last_preserved_timestamp=state.last_preserved,
    )


def latest_checkpoint(model_dir: str) -> Optional[str]:
  """The prefix of the latest complete checkpoint in model_dir, or None.

  The state file's `model_checkpoint_path` if its index exists; else the
  newest listed checkpoint that exists; with no state file, the highest step
  among complete `model.ckpt-<step>` bundles (a crash before the first state
  write).

  Raises:
    ValueError: if the state file is unreadable.
  """
  if not gfile.isdir(model_dir):
    return None
  state = _read_state(model_dir)
  if state is None:
    steps = checkpoint_steps(model_dir)
    return checkpoint_prefix(model_dir, steps[-1]) if steps else None
  candidates = ([state.latest] if state.latest else []) + state.paths[::-1]
  for i, path in enumerate(candidates):
    path = _absolute(model_dir, path)
    if bundle_exists(path):
      if i:
        logging.warning(
          "checkpoint %s named by %s/%s is missing; using %s",
          candidates[0],
          model_dir,
          STATE_FILENAME,
          path,
        )
      return path
  return None


def all_checkpoints(model_dir: str) -> List[str]:
  """Prefixes of the kept checkpoints the state file lists, oldest first."""
  state = _read_state(model_dir) if gfile.isdir(model_dir) else None
  if state is None:
    return []
  paths = [_absolute(model_dir, p) for p in state.paths]
  return [p for p in paths if bundle_exists(p)]


def checkpoint_steps(model_dir: str) -> List[int]:
  """Sorted steps of the complete `model.ckpt-<step>` bundles in model_dir."""
  if not gfile.isdir(model_dir):
    return []
  steps = []
  for name in gfile.listdir(model_dir):
    match = _STEP_RE.match(name.rstrip("/"))
    if match:
      steps.append(int(match.group(1)))
  return sorted(steps)


# ----------------------------------------------------------------------------
# Non-finite values.


@gin.configurable(module="mesh_tensorflow.transformer.utils")
def allow_non_finite_checkpoints(allow: bool = False) -> bool:
  """Whether checkpoints with inf/nan values may be saved and restored.

  A diverged model's weights are inf/nan: saving them would rotate the last
  good checkpoints away, and restoring them would train on from garbage. Both
  refuse unless this is bound True (`--gin_param=
  "allow_non_finite_checkpoints.allow = True"`), e.g. to inspect a diverged
  checkpoint.

  Args:
    allow: allow non-finite values.

  Returns:
    allow.
  """
  return bool(allow)


def non_finite_names(tensors: Mapping[str, object]) -> List[str]:
  """The sorted names of the float tensors (or variables) holding inf or nan.

  Args:
    tensors: {name: tf.Tensor, tf.Variable or array}.

  Returns:
    The names whose values are not all finite.
  """
  bad = []
  for name in sorted(tensors):
    value = tf.convert_to_tensor(tensors[name])
    if value.dtype.is_floating and not bool(
      tf.reduce_all(tf.math.is_finite(value))
    ):
      bad.append(name)
  return bad


def names_text(names: Iterable[str]) -> str:
  names = list(names)
  shown = ", ".join(names[:MAX_NAMES_IN_ERROR])
  if len(names) > MAX_NAMES_IN_ERROR:
    shown += ", ... (%d in all)" % len(names)
  return shown


def check_finite(
  what: str, tensors: Mapping[str, object], allow: Optional[bool]
) -> None:
  """Raises ValueError naming the non-finite tensors unless allowed."""
  if allow is None:
    allow = allow_non_finite_checkpoints()
  bad = non_finite_names(tensors)
  if not bad:
    return
  if allow:
    logging.warning(
      "%s: %d tensors hold inf/nan: %s", what, len(bad), names_text(bad)
    )
    return
  raise ValueError(
    "%s: %d of %d tensors hold inf/nan values: %s (a diverged model; bind "
    "allow_non_finite_checkpoints.allow = True to use them anyway)"
    % (what, len(bad), len(tensors), names_text(bad))
  )


# ----------------------------------------------------------------------------
# Saving.


def _remove_stale_temporaries(model_dir: str) -> None:
  """Deletes what an interrupted save left behind (one writer per model_dir)."""
  for name in gfile.listdir(model_dir):
    name = name.rstrip("/")
    path = _join(model_dir, name)
    if name.startswith(_TMP_DIR_PREFIX):
      logging.info("removing %s left by an interrupted save", path)
      gfile.rmtree(path)
    elif name.startswith(STATE_FILENAME + ".tmp-"):
      gfile.remove(path)


def _write_bundle(
  prefix: str, names: Sequence[str], values: Sequence[tf.Tensor]
) -> None:
  with tf.device("/cpu:0"):
    tf.raw_ops.SaveV2(
      prefix=prefix,
      tensor_names=list(names),
      shape_and_slices=[""] * len(names),
      tensors=list(values),
    )


def _move_bundle(src: str, dst: str) -> None:
  """Renames bundle src to dst: data files first, the index last.

  An index only ever appears next to the data it describes, so a bundle is
  complete as soon as its index exists. An existing bundle at dst (the same
  step saved again) loses its index first so it is never read half-replaced.
  """
  if gfile.exists(dst + INDEX_SUFFIX):
    gfile.remove(dst + INDEX_SUFFIX)
  for old in gfile.glob(dst + ".data-?????-of-?????"):
    gfile.remove(old)
  for data in gfile.glob(src + ".data-?????-of-?????"):
    gfile.rename(data, dst + data[len(src) :], overwrite=True)
  gfile.rename(src + INDEX_SUFFIX, dst + INDEX_SUFFIX, overwrite=True)


def _delete_bundle(prefix: str) -> None:
  """Deletes a bundle, its index first (so it is never seen incomplete)."""
  for path in sorted(
    _bundle_files(prefix), key=lambda p: not p.endswith(INDEX_SUFFIX)
  ):
    gfile.remove(path)


def save(
  model_dir: str,
  step: int,
  variables: VariableMap,
  *,
  keep_checkpoint_max: Optional[int] = None,
  allow_non_finite: Optional[bool] = None,
) -> str:
  """Writes `model.ckpt-<step>` with exactly `variables` and makes it latest.

  Args:
    model_dir: directory of the checkpoints (created if missing).
    step: the global step; names the checkpoint.
    variables: {full original name: tf.Variable}, e.g. a VariableStore's
      masters plus "global_step"; saved with their full shapes and dtypes.
    keep_checkpoint_max: keep at most this many checkpoints listed in the
      state file, deleting the oldest; None or 0 keeps all. The new (latest)
      one is never deleted.
    allow_non_finite: save inf/nan values too (None: as
      allow_non_finite_checkpoints() says, by default False). Refusing them
      means only finite checkpoints are written, so rotation never deletes
      the newest finite one.

  Returns:
    The new checkpoint's prefix, `<model_dir>/model.ckpt-<step>`.

  Raises:
    ValueError: on an empty/invalid variable map, a negative step or
      keep_checkpoint_max, non-finite values (unless allowed; nothing is
      written then), or when not executing eagerly.
  """
  if not tf.executing_eagerly():
    raise ValueError(
      "checkpoints.save runs eagerly (outside tf.function and "
      "tf.compat.v1 graphs); got a graph context"
    )
  step = int(step)
  if step < 0:
    raise ValueError("checkpoints.save: step must be >= 0, got %d" % step)
  if keep_checkpoint_max is not None and int(keep_checkpoint_max) < 0:
    raise ValueError(
      "checkpoints.save: keep_checkpoint_max must be None or "
      ">= 0, got %r" % (keep_checkpoint_max,)
    )
  if not variables:
    raise ValueError("checkpoints.save: no variables to save in %s" % model_dir)
  for name, var in variables.items():
    if not isinstance(name, str) or not name:
      raise ValueError(
        "checkpoints.save: variable names must be non-empty "
        "strings, got %r" % (name,)
      )
    if not isinstance(var, tf.Variable):
      raise ValueError(
        "checkpoints.save: %r is a %s, not a tf.Variable"
        % (name, type(var).__name__)
      )
  names = sorted(variables)
  values = [variables[n].read_value() for n in names]
  check_finite(
    "checkpoints.save of step %d to %s" % (step, model_dir),
    dict(zip(names, values)),
    allow_non_finite,
  )
  gfile.makedirs(model_dir)
  state = _read_state(model_dir)  # ValueError before writing anything.
  _remove_stale_temporaries(model_dir)

  prefix = checkpoint_prefix(model_dir, step)
  tmp_dir = _join(model_dir, "%s%s" % (_TMP_DIR_PREFIX, uuid.uuid4().hex))
  gfile.makedirs(tmp_dir)
  tmp_prefix = _join(tmp_dir, _basename(prefix))
  _write_bundle(tmp_prefix, names, values)
  _move_bundle(tmp_prefix, prefix)
  gfile.rmtree(tmp_dir)

  _update_state(model_dir, state, prefix, keep_checkpoint_max)
  logging.info("saved %d tensors to %s", len(names), prefix)
  return prefix


def _update_state(
  model_dir: str,
  state: Optional[_State],
  prefix: str,
  keep_checkpoint_max: Optional[int],
) -> None:
  """Names prefix latest, then deletes checkpoints beyond the limit."""
  kept: List[Tuple[str, float]] = []
  last_preserved = 0.0
  if state is not None:
    last_preserved = state.last_preserved
    for path, stamp in zip(state.paths, state.timestamps):
      path = _absolute(model_dir, path)
      if path != prefix and bundle_exists(path):
        kept.append((path, stamp))
  kept.append((prefix, time.time()))
  doomed: List[str] = []
  if keep_checkpoint_max:
    excess = max(0, len(kept) - int(keep_checkpoint_max))
    doomed = [path for path, _ in kept[:excess]]
    kept = kept[excess:]
  _write_state(
    model_dir,
    _State(prefix, [p for p, _ in kept], [s for _, s in kept], last_preserved),
  )
  for path in doomed:  # Only after the state no longer names them.
    logging.info("deleting old checkpoint %s", path)
    _delete_bundle(path)
