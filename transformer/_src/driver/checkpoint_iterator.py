"""Which checkpoints to evaluate, decode or export: get_checkpoint_iterator."""

from __future__ import annotations

import os
import time
from typing import Iterable, Iterator, Optional, Sequence, Union

from absl import logging
import gin

from transformer._src.driver import checkpoints

_GIN_MODULE = "mesh_tensorflow.transformer.utils"

# Which checkpoints to use: a step, a list of steps, -1 (the latest), "all"
# or None (every one, waiting for new ones).
CheckpointStep = Union[None, int, str, Sequence[int]]


def _checkpoint_path(model_dir, step: int) -> str:
  return os.path.join(model_dir, "model.ckpt-%d" % step)


def _wait_for_checkpoints(
  model_dir, skip_until, stop_after, last_step, timeout, poll_seconds
) -> Iterator[str]:
  """Existing checkpoints after skip_until in order, then new ones as they
  appear; ends after a step >= stop_after or last_step, or after timeout
  seconds without a new checkpoint (None: wait forever).
  """
  done = skip_until
  waited_since = time.monotonic()
  while True:
    new = [s for s in checkpoints.checkpoint_steps(model_dir) if s > done]
    for step in new:
      yield _checkpoint_path(model_dir, step)
      done = step
      for limit in (stop_after, last_step):
        if limit is not None and step >= limit:
          return
    if new:
      waited_since = time.monotonic()
      continue
    if timeout is not None and time.monotonic() - waited_since > timeout:
      logging.info(
        "No new checkpoint in %s for %s s; stopping", model_dir, timeout
      )
      return
    logging.info("Waiting for checkpoints after step %d in %s", done, model_dir)
    time.sleep(poll_seconds)


@gin.configurable(module=_GIN_MODULE)
def get_checkpoint_iterator(
  checkpoint_step: CheckpointStep,
  model_dir: str,
  skip_until: int = 0,
  stop_after: Optional[int] = None,
  find_closest: bool = True,
  *,
  last_step: Optional[int] = None,
  timeout: Optional[float] = None,
  poll_seconds: float = 5.0,
) -> Iterable[str]:
  """Checkpoint paths, in step order, from checkpoint_step.

  - an int: that step's checkpoint (the closest one if find_closest);
  - a list of ints: each of them likewise;
  - -1: the latest checkpoint (the `checkpoint` state file's);
  - "all": every checkpoint in model_dir with step > skip_until (and
    <= stop_after if given);
  - None: every checkpoint with step > skip_until, then each new one as
    training writes it (an iterator that waits), until one with step >=
    stop_after. Keyword-only additions: it also ends after a step >=
    last_step (training's last checkpoint; eval_model passes the run's
    train steps) or after `timeout` seconds without a new checkpoint.

  Args:
    checkpoint_step: an int step, a list of int steps, -1 (the latest
      checkpoint), "all" or None (every checkpoint, then each new one as it is
      written).
    model_dir: the directory holding model.ckpt-<step> checkpoints.
    skip_until: with "all" or None: skip checkpoints with step <= this.
    stop_after: with "all" or None: stop after the first checkpoint with step >=
      this.
    find_closest: for an int step without a checkpoint, use the checkpoint with
      the closest step (else raise).
    last_step: with None: stop after a checkpoint with step >= this (e.g. the
      training's last step).
    timeout: with None: stop when no new checkpoint appears within this many
      seconds (None: wait forever).
    poll_seconds: with None: how often to look for new checkpoints.

  Returns:
    An iterable of checkpoint paths in step order (a list, or a waiting iterator
    for None).

  Raises:
    ValueError: no checkpoints (except for None), or a step without a
      checkpoint when find_closest is False.
  """
  if checkpoint_step is None:
    return _wait_for_checkpoints(
      model_dir, skip_until, stop_after, last_step, timeout, poll_seconds
    )
  steps = checkpoints.checkpoint_steps(model_dir)
  if not steps:
    raise ValueError("no checkpoints (model.ckpt-*.index) in %r" % model_dir)
  if checkpoint_step == -1:
    latest = checkpoints.latest_checkpoint(model_dir)
    return [latest or _checkpoint_path(model_dir, steps[-1])]
  if checkpoint_step == "all":
    return [
      _checkpoint_path(model_dir, s)
      for s in steps
      if s > skip_until and (stop_after is None or s <= stop_after)
    ]
  wanted = (
    checkpoint_step
    if isinstance(checkpoint_step, (list, tuple))
    else [checkpoint_step]
  )
  out = []
  for w in wanted:
    w = int(w)
    if w in steps:
      out.append(_checkpoint_path(model_dir, w))
    elif find_closest:
      out.append(
        _checkpoint_path(model_dir, min(steps, key=lambda s: abs(s - w)))
      )
    else:
      raise ValueError(
        "no checkpoint for step %d in %r (have %s)" % (w, model_dir, steps)
      )
  return out
