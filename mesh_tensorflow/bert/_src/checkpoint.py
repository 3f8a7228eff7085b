"""Which variables of a model a checkpoint initializes (by name)."""

from __future__ import annotations

import collections
import re

from absl import logging
import tensorflow as tf

__all__ = ["get_assignment_map_from_checkpoint"]

# Optimizer state and the step are not model weights: a fine-tuning run does
# not take them from its init_checkpoint.
_NON_MODEL_VARIABLE_MARKERS = ("global_step", "adam_", "slot_")


def get_assignment_map_from_checkpoint(tvars, init_checkpoint: str):
  """Which model variables a checkpoint can initialize (same names).

  Optimizer slots ("adam_", "slot_") and the global step are left out: a
  fine-tuning run starts them afresh.

  Args:
    tvars: variables with a `name` (tf or mtf variables; a ":0" suffix is
      ignored).
    init_checkpoint: a checkpoint prefix.

  Returns:
    (assignment_map, initialized_variable_names): an OrderedDict {checkpoint
    name: variable name} of the matched names, in checkpoint order, and a
    dict with each matched name and its ":0" form mapped to 1.
  """
  model_names = set()
  for var in tvars:
    name = re.sub(r":\d+$", "", var.name)
    if not any(marker in name for marker in _NON_MODEL_VARIABLE_MARKERS):
      model_names.add(name)
  logging.info("init_checkpoint: %s", init_checkpoint)
  assignment_map = collections.OrderedDict()
  initialized_variable_names = {}
  for name, _ in tf.train.list_variables(init_checkpoint):
    if name in model_names:
      assignment_map[name] = name
      initialized_variable_names[name] = 1
      initialized_variable_names[name + ":0"] = 1
  return assignment_map, initialized_variable_names
