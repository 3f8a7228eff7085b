"""Legacy-graph session hooks that keep master variables and slices in sync.

In a tf.compat.v1 training loop, masters are what a Saver writes, while
training updates the slices. These hooks copy slices to masters before each
save and masters to slices after a session is created (restore or init).
"""

from __future__ import annotations

import tensorflow as tf

tf1 = tf.compat.v1


class MtfCheckpointSaverListener(tf1.train.CheckpointSaverListener):
  """Runs lowering.copy_slices_to_masters() before every checkpoint save.

  Args:
    lowering: the Lowering whose variables are saved.
  """

  def __init__(self, lowering) -> None:
    self._op = lowering.copy_slices_to_masters()

  def begin(self) -> None:
    pass

  def before_save(self, session, global_step_value) -> None:
    """Copies the slices into the masters, so the checkpoint holds them.

    Args:
      session: the tf.compat.v1.Session.
      global_step_value: the global step of the checkpoint.
    """
    del global_step_value
    session.run(self._op)

  def after_save(self, session, global_step_value) -> None:
    """Does nothing (the slices are unchanged by saving).

    Args:
      session: the tf.compat.v1.Session.
      global_step_value: the global step of the checkpoint.
    """
    pass

  def end(self, session, global_step_value) -> None:
    """Does nothing at the end of training.

    Args:
      session: the tf.compat.v1.Session.
      global_step_value: the global step of the checkpoint.
    """
    pass


class MtfRestoreHook(tf1.train.SessionRunHook):
  """Runs lowering.copy_masters_to_slices() once the session exists.

  Args:
    lowering: the Lowering whose variables are restored.
  """

  def __init__(self, lowering) -> None:
    self._lowering = lowering
    self._op = None

  def begin(self) -> None:
    with tf1.name_scope("mtf_restore_hook"):
      self._op = self._lowering.copy_masters_to_slices()

  def after_create_session(self, session, coord) -> None:
    """Copies the (restored or initialised) masters into the slices.

    Args:
      session: the tf.compat.v1.Session.
      coord: the thread coordinator (unused).
    """
    del coord
    session.run(self._op)


__all__ = ["MtfCheckpointSaverListener", "MtfRestoreHook"]
