"""TensorBoard event files of training and perplexity_eval read back.

The values are read with TensorFlow alone (no tensorboard package): the
files are TFRecords of tf.compat.v1.Event protos. Training's values are
what TensorBoard's scalar plugin reads, a rank-0 float tensor per tag and
step, tagged with the "scalars" plugin; evaluation's are simple_value
scalars, as the original's FileWriter wrote them.
"""

import math
import re

import numpy as np
import pytest
import tensorflow as tf

from tests.transformer import driver_test_util as dtu
from transformer._src.driver import checkpoint_evaluation
from transformer._src.driver import evaluation as driver_eval

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


def _read_simple_values(log_dir):
  """{tag: {step: value}} of the simple_value scalars in log_dir's events."""
  scalars = {}
  for path in tf.io.gfile.glob(str(log_dir / "events.out.tfevents*")):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        if value.HasField("simple_value"):
          scalars.setdefault(value.tag, {})[event.step] = value.simple_value
  return scalars


def test_perplexity_eval_summaries_hold_the_originals_eval_loss(tmp_path):
  model_dir = tmp_path / "model"
  est = dtu.estimator(model_dir, mesh=dtu.MESH_1, save_checkpoints_steps=0)
  est.train(dtu.input_fn, 1)
  # 11 rows: two batches, the second filled up with 5 zero rows; every
  # other row's targets end in padding.
  x, y = dtu.reverse_data(11, seed=2)
  y[::2, 5:] = 0

  def perplexity_eval(steps):
    return checkpoint_evaluation.perplexity_eval(
      est,
      None,
      est.sequence_length,
      dtu.BATCH,
      "validation",
      str(model_dir),
      None,
      lambda **_: tf.data.Dataset.from_tensor_slices(
        {"inputs": x, "targets": y}
      ),
      -1,
      steps,
    )["eval"]

  results = perplexity_eval(2)
  # Estimator.evaluate(name="eval_validation_16") of the original.
  scalars = _read_simple_values(model_dir / "eval_eval_validation_16")
  assert scalars == {
    k: {1: pytest.approx(v, rel=1e-6)}
    for k, v in results.items()
    if k != "num_eval_sequences"
  }
  # The original's eval loss: the model's loss of each batch (its summed
  # cross-entropy over every position of the batch, padding and filler
  # rows included), averaged over the batches. Scores are the rows' summed
  # log-likelihoods.
  scores = driver_eval.score_ids(est, x, y)
  positions = dtu.BATCH * dtu.LENGTH
  batch_losses = [-scores[:8].sum() / positions, -scores[8:].sum() / positions]
  assert results["loss"] == pytest.approx(np.mean(batch_losses), rel=1e-5)
  # The cross-entropy per target token stays -neg_log_perplexity.
  assert results["neg_log_perplexity"] == pytest.approx(
    scores.sum() / (y > 0).sum(), rel=1e-5
  )
  assert results["num_eval_tokens"] == (y > 0).sum()
  # perplexity_eval_steps: exactly that many batches, all-zero examples
  # following the data as in the original; their batches' losses are zero,
  # and no other metric sees them.
  four = perplexity_eval(4)
  assert (model_dir / "eval_eval_validation_32").is_dir()
  assert four["loss"] == pytest.approx(sum(batch_losses) / 4, rel=1e-5)
  assert {k: v for k, v in four.items() if k != "loss"} == {
    k: pytest.approx(v, rel=1e-6) for k, v in results.items() if k != "loss"
  }
