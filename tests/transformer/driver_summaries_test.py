"""TensorBoard event files written by Estimator.train read back as scalars.

The values are read with TensorFlow alone (no tensorboard package): the
files are TFRecords of tf.compat.v1.Event protos, and each value is what
TensorBoard's scalar plugin reads, a rank-0 float tensor per tag and step,
tagged with the "scalars" plugin.
"""

import math
import re

import numpy as np
import pytest
import tensorflow as tf

from tests.transformer import driver_test_util as dtu

PROGRESS = re.compile(
  r"^step (\d+)/\d+  loss ([\d.]+)  lr ([\d.e-]+)", re.MULTILINE
)


def _read_scalars(log_dir):
  """{tag: {step: value}} from every event file in log_dir."""
  scalars = {}
  files = tf.io.gfile.glob(str(log_dir / "events.out.tfevents*"))
  assert files, "no event files in %s" % log_dir
  for path in files:
    records = [r.numpy() for r in tf.data.TFRecordDataset(path)]
    events = [tf.compat.v1.Event.FromString(r) for r in records]
    assert events[0].file_version.startswith("brain.Event:")
    for event in events:
      for value in event.summary.value:
        assert value.metadata.plugin_data.plugin_name == "scalars"
        array = tf.make_ndarray(value.tensor)
        assert array.shape == () and array.dtype == np.float32, value.tag
        scalars.setdefault(value.tag, {})[event.step] = float(array)
  return scalars


@pytest.mark.slow
def test_train_summaries_hold_the_logged_loss_and_learning_rate(
  tmp_path, capsys
):
  est = dtu.estimator(tmp_path, save_checkpoints_steps=0)  # reports every 10
  last = est.train(dtu.input_fn, 30)
  printed = {
    int(step): (float(loss), float(lr))
    for step, loss, lr in PROGRESS.findall(capsys.readouterr().out)
  }
  scalars = _read_scalars(tmp_path)

  assert set(scalars) == {
    "loss",
    "learning_rate",
    "tokens_per_second",
    "steps_per_second",
  }
  assert sorted(scalars["loss"]) == sorted(printed) == [10, 20, 30]
  for tag, values in scalars.items():
    assert all(math.isfinite(v) for v in values.values()), tag
  for step, (loss, lr) in printed.items():
    # The progress line rounds to 4 decimals (loss) and 3 digits (lr).
    assert scalars["loss"][step] == pytest.approx(loss, abs=5e-5)
    assert scalars["learning_rate"][step] == pytest.approx(lr, rel=1e-3)
  assert scalars["loss"][30] == pytest.approx(last["loss"], rel=1e-6)
  assert list(scalars["learning_rate"].values()) == [pytest.approx(0.01)] * 3
  assert scalars["loss"][30] < scalars["loss"][10]
  assert all(v > 0 for v in scalars["tokens_per_second"].values())
