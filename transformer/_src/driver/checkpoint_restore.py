"""Reading and restoring the driver's checkpoints (see checkpoints).

list_checkpoint_variables lists a checkpoint's tensors; restore assigns a
model's variables the tensors of the same names (the driver's resume), and
init_from_checkpoint another model's tensors, selected and renamed as the
original's init_checkpoint options say. Both read the bundles checkpoints.save
writes and those of the original (TF1 `Saver`, sharded), and check every name
and shape before assigning anything, so a failed restore changes no variable
and touches no file.

Example:
  >>> import tempfile
  >>> model_dir = tempfile.mkdtemp()
  >>> w = tf.Variable([[1.0, 2.0]])
  >>> _ = checkpoints.save(model_dir, 100, {"decoder/w": w})
  >>> _ = w.assign([[0.0, 0.0]])
  >>> restore(model_dir, {"decoder/w": w})  # the latest checkpoint
  ['decoder/w']
  >>> w.numpy()
  array([[1., 2.]], dtype=float32)
"""

from __future__ import annotations

import re
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from absl import logging
import tensorflow as tf

from transformer._src.driver import checkpoints

__all__ = [
  "init_from_checkpoint",
  "list_checkpoint_variables",
  "restore",
]


def _resolve(path: str) -> str:
  """A checkpoint prefix from a prefix or a model directory.

  Raises:
    ValueError: if there is no checkpoint there.
  """
  if not path:
    raise ValueError("no checkpoint path given")
  if checkpoints.gfile.isdir(path):
    latest = checkpoints.latest_checkpoint(path)
    if latest is None:
      raise ValueError("no checkpoint in directory %s" % path)
    return latest
  if path.endswith(checkpoints.INDEX_SUFFIX):
    path = path[: -len(checkpoints.INDEX_SUFFIX)]
  if not checkpoints.bundle_exists(path):
    raise ValueError(
      "checkpoint %s not found (no %s%s)"
      % (path, path, checkpoints.INDEX_SUFFIX)
    )
  return path


def list_checkpoint_variables(
  path: str,
) -> Dict[str, Tuple[List[int], tf.DType]]:
  """{name: (shape, dtype)} of a checkpoint (prefix or model directory).

  Raises:
    ValueError: naming the checkpoint if it is missing or its index corrupt.
  """
  prefix = _resolve(path)
  try:
    reader = tf.train.load_checkpoint(prefix)
    shapes = reader.get_variable_to_shape_map()
    dtypes = reader.get_variable_to_dtype_map()
  except (tf.errors.OpError, RuntimeError, ValueError) as e:
    raise ValueError(
      "cannot read checkpoint %s: corrupt or unreadable index "
      "(%s)" % (prefix, _first_line(e))
    ) from e
  return {name: (list(shapes[name]), dtypes[name]) for name in shapes}


def _first_line(error: Exception) -> str:
  text = getattr(error, "message", None) or str(error)
  return text.strip().splitlines()[0] if text.strip() else type(error).__name__


def _read_tensors(
  prefix: str, ckpt_names: Sequence[str], dtypes: Sequence[tf.DType]
) -> List[tf.Tensor]:
  if not ckpt_names:
    return []
  try:
    with tf.device("/cpu:0"):
      return list(
        tf.raw_ops.RestoreV2(
          prefix=prefix,
          tensor_names=list(ckpt_names),
          shape_and_slices=[""] * len(ckpt_names),
          dtypes=list(dtypes),
        )
      )
  except tf.errors.OpError as e:
    raise ValueError(
      "cannot read checkpoint %s: corrupt or missing data "
      "(%s)" % (prefix, _first_line(e))
    ) from e


def _load(
  prefix: str,
  pairs: Sequence[Tuple[str, str]],
  variables: checkpoints.VariableMap,
  contents: Mapping[str, Tuple[List[int], tf.DType]],
  allow_non_finite: Optional[bool] = None,
) -> None:
  """Reads every (variable name, checkpoint name) pair, then assigns all.

  Shapes were checked by the caller; values are cast to each variable's dtype.
  Nothing is assigned unless everything was read (and is finite, unless
  allow_non_finite).
  """
  ckpt_names = [c for _, c in pairs]
  values = _read_tensors(
    prefix, ckpt_names, [contents[c][1] for c in ckpt_names]
  )
  checkpoints.check_finite(
    "checkpoint %s" % prefix, dict(zip(ckpt_names, values)), allow_non_finite
  )
  casts = []
  for (name, ckpt_name), value in zip(pairs, values):
    var = variables[name]
    try:
      casts.append(tf.cast(value, var.dtype))
    except (TypeError, ValueError, tf.errors.OpError) as e:
      raise ValueError(
        "checkpoint %s: cannot cast %s (%s) to the dtype %s of variable %s"
        % (prefix, ckpt_name, value.dtype.name, var.dtype.name, name)
      ) from e
  for (name, _), value in zip(pairs, casts):
    variables[name].assign(value)


def _shape_problems(
  prefix: str,
  pairs: Sequence[Tuple[str, str]],
  variables: checkpoints.VariableMap,
  contents: Mapping[str, Tuple[List[int], tf.DType]],
) -> List[str]:
  problems = []
  for name, ckpt_name in pairs:
    want = variables[name].shape.as_list()
    have = contents[ckpt_name][0]
    if want != have:
      what = name if name == ckpt_name else "%s (from %s)" % (name, ckpt_name)
      problems.append(
        "%s: checkpoint shape %s, variable shape %s" % (what, have, want)
      )
  return problems


def restore(
  path: str,
  variables: checkpoints.VariableMap,
  *,
  allow_missing: bool = False,
  allow_non_finite: Optional[bool] = None,
) -> List[str]:
  """Assigns each variable the checkpoint tensor of the same name.

  Values are cast to the variable's dtype (bfloat16 checkpoints into float32
  variables and back). Checkpoint tensors without a variable are ignored.
  Every name and shape is checked before any assignment, so on error no
  variable changes (and no file is touched).

  Args:
    path: a checkpoint prefix (`.../model.ckpt-<step>`) or a model directory
      (its latest checkpoint). Original TF1 (sharded) bundles work too.
    variables: {full name: tf.Variable}.
    allow_missing: skip variables the checkpoint lacks instead of failing.
    allow_non_finite: restore inf/nan values too (None: as
      allow_non_finite_checkpoints() says, by default False).

  Returns:
    The sorted names of the restored variables.

  Raises:
    ValueError: naming the checkpoint and the variables, if the checkpoint is
      missing or corrupt, lacks variables (unless allow_missing), or holds
      them with other shapes (e.g. model_dir holds another model), or holds
      inf/nan values (unless allowed).
  """
  prefix = _resolve(path)
  contents = list_checkpoint_variables(prefix)
  names = sorted(variables)
  missing = [n for n in names if n not in contents]
  if missing and not allow_missing:
    raise ValueError(
      "checkpoint %s does not match the model: it lacks %d of its %d "
      "variables: %s (is this model_dir holding another model's "
      "checkpoints?)"
      % (prefix, len(missing), len(names), checkpoints.names_text(missing))
    )
  if missing:
    logging.warning(
      "checkpoint %s lacks %d variables, left as they are: %s",
      prefix,
      len(missing),
      checkpoints.names_text(missing),
    )
  pairs = [(n, n) for n in names if n in contents]
  problems = _shape_problems(prefix, pairs, variables, contents)
  if problems:
    raise ValueError(
      "checkpoint %s does not match the model: %d variables have other "
      "shapes: %s"
      % (
        prefix,
        len(problems),
        "; ".join(problems[: checkpoints.MAX_NAMES_IN_ERROR]),
      )
    )
  _load(prefix, pairs, variables, contents, allow_non_finite)
  logging.info("restored %d variables from %s", len(pairs), prefix)
  return [n for n, _ in pairs]


def init_from_checkpoint(
  path: str,
  variables: checkpoints.VariableMap,
  variable_filter: Optional[str] = None,
  name_mapping: Optional[Callable[[str], Optional[str]]] = None,
  *,
  should_load: Optional[Callable[[str], bool]] = None,
) -> Dict[str, str]:
  """Initialises variables from another model's checkpoint (init_checkpoint).

  As the original driver: checkpoint names are kept if they match the regex
  `variable_filter` (re.search; the original's `init_variable_filter`);
  model variables are kept if `should_load(name)`; each kept variable loads
  the checkpoint tensor `name_mapping(name)` (model name -> checkpoint name;
  the original's `init_checkpoint_variable_mapping`; identity by default;
  None means "do not load") if that tensor was kept. Everything else keeps
  its value.

  Args:
    path: a checkpoint prefix or a directory (its latest checkpoint).
    variables: {full model name: tf.Variable}.
    variable_filter: regex over checkpoint names; None or "" keeps all.
    name_mapping: model variable name -> checkpoint name (or None).
    should_load: model variable name -> whether to load it.

  Returns:
    {model variable name: checkpoint name} of what was loaded.

  Raises:
    ValueError: if the checkpoint is missing/corrupt, the filter is not a
      valid regex, a selected tensor's shape differs from its variable's, or
      a selected tensor holds inf/nan (unless allow_non_finite_checkpoints();
      nothing is assigned then).
  """
  prefix = _resolve(path)
  contents = list_checkpoint_variables(prefix)
  ckpt_names = set(contents)
  if variable_filter:
    try:
      pattern = re.compile(variable_filter)
    except re.error as e:
      raise ValueError(
        "init_from_checkpoint: bad variable_filter regex %r: "
        "%s" % (variable_filter, e)
      ) from e
    ckpt_names = {n for n in ckpt_names if pattern.search(n)}
  pairs = []
  for name in sorted(variables):
    if should_load is not None and not should_load(name):
      continue
    ckpt_name = name_mapping(name) if name_mapping is not None else name
    if ckpt_name is not None and ckpt_name in ckpt_names:
      pairs.append((name, ckpt_name))
  problems = _shape_problems(prefix, pairs, variables, contents)
  if problems:
    raise ValueError(
      "init_from_checkpoint %s: %d variables have other "
      "shapes: %s"
      % (
        prefix,
        len(problems),
        "; ".join(problems[: checkpoints.MAX_NAMES_IN_ERROR]),
      )
    )
  _load(prefix, pairs, variables, contents)
  loaded = dict(pairs)
  unused = sorted(ckpt_names - set(loaded.values()))
  not_loaded = sorted(set(variables) - set(loaded))
  logging.info("initialised %d variables from %s", len(loaded), prefix)
  if unused:
    logging.info(
      "variables in %s not loaded: %s", prefix, checkpoints.names_text(unused)
    )
  if not_loaded:
    logging.info(
      "variables not initialised from %s: %s",
      prefix,
      checkpoints.names_text(not_loaded),
    )
  return loaded
