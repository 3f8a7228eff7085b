"""The training step counter ("global step") in eager, tf.function, v1 graphs.

The original read `tf.compat.v1.train.get_or_create_global_step()`. On TF 2.21
that call only works in a v1 graph and at the top level of eager code: called
for the first time inside a tf.function it creates the variable in the
function graph and fails ("Tensor.op is undefined when eager execution is
enabled"), and under `tf.init_scope()` in a traced function its eager
collection is not kept, so a re-trace makes a second variable, which
tf.function rejects. `get_or_create_global_step` below works in all three
modes.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Optional

import tensorflow as tf

tf1 = tf.compat.v1

GLOBAL_STEP_NAME = "global_step"

_lock = threading.Lock()
_eager_global_step: Optional[tf.Variable] = None


@contextlib.contextmanager
def root_variable_scope():
  """Enters the top-level tf.compat.v1 variable scope (keeps name scopes)."""
  with tf1.variable_scope(
    tf1.VariableScope(reuse=None, name=""), auxiliary_name_scope=False
  ):
    yield


def get_or_create_global_step() -> tf.Variable:
  """The int64 scalar global step variable, created (at 0) on first use.

  Which variable:
    * tf.compat.v1 graph mode (the outermost context is a `tf.Graph`): the
      graph's standard global step
      (`tf.compat.v1.train.get_or_create_global_step` of that graph, in the
      GLOBAL_STEP and GLOBAL_VARIABLES collections, named `global_step`
      whatever the current variable scope), as in the original; so
      `tf.compat.v1.train.Saver` checkpoints it.
    * eager and tf.function (TF2 behaviour): one process-wide `tf.Variable`
      named `global_step` on `cpu:0`, created under `tf.init_scope()` the first
      time it is asked for (also from inside a tf.function trace) and reused by
      every later call and re-trace. A global step that top-level eager code
      already made with `tf.compat.v1.train.get_or_create_global_step()` is
      adopted; and once this function has been called at the top level of
      eager code, `tf.compat.v1.train.get_global_step()` returns the same
      variable there and in tf.functions traced afterwards. It is a plain
      tracked variable: a TF2 driver checkpoints it explicitly (e.g.
      `tf.train.Checkpoint(global_step=get_or_create_global_step(), ...)`) and
      increments it with `assign_add(1)` after each training step.

  Reading it inside a tf.function reads the current value at each call.

  Returns:
    The global step tf.Variable (int64, shape []).
  """
  with tf.init_scope():
    outer_is_eager = tf.executing_eagerly()
    if not outer_is_eager:
      graph = tf1.get_default_graph()
      step = tf1.train.get_global_step(graph)
      if step is None:
        with graph.as_default(), root_variable_scope():
          step = tf1.train.create_global_step(graph)
      return step
  top_level = tf.executing_eagerly()  # eager code, not a tf.function trace
  with _lock:
    return _eager_step(top_level)


def _eager_step(top_level: bool) -> tf.Variable:
  """The process-wide step; at the eager top level, synced with tf1's."""
  global _eager_global_step
  tf1_step = None
  if top_level:
    collection = tf1.get_collection_ref(tf1.GraphKeys.GLOBAL_STEP)
    tf1_step = collection[0] if collection else None
    if (
      _eager_global_step is None
      and isinstance(tf1_step, tf.Variable)
      and tf1_step.dtype == tf.int64
    ):
      _eager_global_step = tf1_step
  if _eager_global_step is None:
    with tf.init_scope(), tf.device("cpu:0"):
      _eager_global_step = tf.Variable(
        tf.constant(0, tf.int64),
        name=GLOBAL_STEP_NAME,
        trainable=False,
        aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
      )
  if top_level and tf1_step is None:
    tf1.add_to_collection(tf1.GraphKeys.GLOBAL_STEP, _eager_global_step)
  return _eager_global_step


def step_num() -> tf.Tensor:
  """The current global step as a float32 scalar tf.Tensor."""
  return tf.cast(get_or_create_global_step(), tf.float32)


__all__ = ["get_or_create_global_step", "root_variable_scope", "step_num"]
