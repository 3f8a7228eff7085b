"""Training progress: the progress lines and TensorBoard scalars.

`TrainProgress` prints one line per logged step (step, loss, learning rate,
steps and tokens per second, ETA); `write_scalars` writes the same figures
as TensorBoard scalar summaries.
"""

from __future__ import annotations

import time
from typing import Dict

import tensorflow as tf
from tensorflow.core.framework import summary_pb2

__all__ = ["TrainProgress", "write_scalars"]


def write_scalars(writer, step: int, scalars: Dict[str, float]) -> None:
  """TensorBoard scalar summaries, written without the tensorboard package.

  tf.summary.scalar lives in tensorboard, which is not a dependency; the
  core tf.summary.write with the scalar plugin's metadata writes the same
  event records.
  """
  metadata = summary_pb2.SummaryMetadata()
  metadata.plugin_data.plugin_name = "scalars"
  with writer.as_default(step=step):
    for name, value in scalars.items():
      tf.summary.write(
        name, tf.constant(value, tf.float32), step=step, metadata=metadata
      )
  writer.flush()


class TrainProgress:
  """Progress lines: step, loss, learning rate, steps/s, tokens/s, ETA."""

  def __init__(self, step: int, max_steps: int, every: int):
    self.max_steps = max_steps
    self.every = every
    self.last_step = step
    self.last_time = time.perf_counter()
    self.tokens = 0

  def add_tokens(self, n: int) -> None:
    self.tokens += n

  def due(self, step: int) -> bool:
    return step % self.every == 0

  def report(self, step: int, loss: float, lr: float) -> Dict[str, float]:
    now = time.perf_counter()
    seconds = max(now - self.last_time, 1e-9)
    steps_per_second = (step - self.last_step) / seconds
    tokens_per_second = self.tokens / seconds
    remaining = max(self.max_steps - step, 0)
    eta = remaining / steps_per_second if steps_per_second > 0 else 0.0
    line = (
      "step %d/%d  loss %.4f  lr %.3g  %.2f steps/s  %.0f tokens/s  "
      "ETA %s"
      % (
        step,
        self.max_steps,
        loss,
        lr,
        steps_per_second,
        tokens_per_second,
        _format_seconds(eta),
      )
    )
    # One line on stdout (not also logged: absl would print it twice).
    print(line, flush=True)
    self.last_step, self.last_time, self.tokens = step, now, 0
    return {
      "steps_per_second": steps_per_second,
      "tokens_per_second": tokens_per_second,
    }


def _format_seconds(seconds: float) -> str:
  seconds = int(round(seconds))
  hours, rest = divmod(seconds, 3600)
  minutes, seconds = divmod(rest, 60)
  if hours:
    return "%dh%02dm%02ds" % (hours, minutes, seconds)
  return "%dm%02ds" % (minutes, seconds)
