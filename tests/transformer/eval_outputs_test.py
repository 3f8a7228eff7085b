"""utils.eval_model and run's eval modes write what the original wrote.

The eval_model cases of eval_outputs_cases.py run here with a real
Estimator (a predict_fn decodes as the original's stub model did) and are
compared with the original package's own outputs of the same cases,
data/original_eval_outputs.json: the same new files under the model
directory, the same text in each, and the same (step, tag, value) event
records. perplexity_eval's directories and tags follow the original's
Estimator.evaluate(name=...): `<model_dir>/eval_<name>_<split>_<examples>`.
"""

import json
import os
import random

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests.transformer import driver_test_util as dtu
from tests.transformer import eval_outputs_cases as cases
from transformer import dataset as dataset_lib
from transformer import utils
from transformer._src.driver import estimator as driver

ORIGINAL = os.path.join(
  os.path.dirname(__file__), "data", "original_eval_outputs.json"
)


def _shift_predict_fn(model, features, variable_dtype):
  """The stub model's decode on the mesh: every id above EOS plus one."""
  del model, variable_dtype
  inputs = features["inputs"]
  return inputs + mtf.cast(mtf.greater(inputs, 1), inputs.dtype)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
  """Checkpoints at CHECKPOINT_STEPS of a tiny model with byte ids."""
  path = str(tmp_path_factory.mktemp("evalfaith"))
  est = dtu.estimator(
    path, mesh=dtu.MESH_1, vocabulary=cases.VOCABULARY, save_checkpoints_steps=0
  )
  for step in cases.CHECKPOINT_STEPS:
    est.train(dtu.input_fn, step)
    est.save()
  return path


def _estimator_fn(model_dir):
  def estimator_fn(sequence_length):
    return dtu.estimator(
      model_dir,
      mesh=dtu.MESH_1,
      vocabulary=cases.VOCABULARY,
      batch_size=cases.BATCH_SIZE,
      sequence_length=sequence_length,
      predict_fn=_shift_predict_fn,
    )

  return estimator_fn


def _fresh_copy(model_dir, tmp_path):
  """model_dir's checkpoints in a directory of their own."""
  out = str(tmp_path / "model")
  os.makedirs(out)
  for name in os.listdir(model_dir):
    if name.startswith(("model.ckpt-", "checkpoint")):
      tf.io.gfile.copy(os.path.join(model_dir, name), os.path.join(out, name))
  return out


def _rounded(result):
  """Event values as float32 (what an event record holds)."""
  for key, value in result["outputs"].items():
    if key.endswith("events"):
      for record in value:
        if record[2] == "simple_value":
          record[3] = float(np.float32(record[3]))
  return result


@pytest.mark.parametrize("case", sorted(cases.CASES))
def test_eval_model_writes_the_originals_outputs(case, model_dir, tmp_path):
  with open(ORIGINAL, encoding="utf-8") as f:
    want = json.load(f)[case]
  directory = _fresh_copy(model_dir, tmp_path)
  got = cases.CASES[case](
    utils, dataset_lib, _estimator_fn(directory), directory
  )
  got = json.loads(json.dumps(_rounded(got)))
  assert sorted(got["outputs"]) == sorted(want["outputs"])
  for name, text in want["outputs"].items():
    assert got["outputs"][name] == text, name
  for key in ("dataset_fn_calls", "estimator_built_with", "score_calls"):
    assert got.get(key) == want.get(key), key
  # The original returned None; this returns the metrics (None when no
  # dataset has metric_fns, as the original did nothing then).
  assert got["returned_none"] == (case == "no_metrics")


class _IdVocabulary:
  """Ids 3..19 as letters (the toy reverse task's vocabulary)."""

  vocab_size = dtu.VOCAB

  def encode(self, text):
    return [ord(c) - ord("a") + 3 for c in text]

  def decode(self, ids):
    return "".join(chr(int(i) - 3 + ord("a")) for i in ids if int(i) >= 3)


def _reverse_dataset(n=11, seed=2):
  x, y = dtu.reverse_data(n, seed=seed)
  y[::2, 5:] = 0
  return tf.data.Dataset.from_tensor_slices({"inputs": x, "targets": y})


def _run(model_dir, mode, **kwargs):
  dtu.tiny_gin("utils.get_variable_dtype.activation_dtype = 'float32'")
  kwargs.setdefault("sequence_length", dtu.LENGTH)
  kwargs.setdefault(
    "train_dataset_fn", lambda **_: _reverse_dataset(64, seed=0)
  )
  return utils.run(
    None,
    None,
    None,
    None,
    model_dir,
    vocabulary=_IdVocabulary(),
    mode=mode,
    batch_size=dtu.BATCH,
    train_steps=2,
    mesh_shape="",
    layout_rules="",
    learning_rate_schedule=0.01,
    eval_checkpoint_step=-1,
    **kwargs,
  )


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("evalfaith_run"))
  _run(path, "train")
  return path


def _records(directory):
  files = tf.io.gfile.glob(os.path.join(directory, "events.out.tfevents*"))
  assert len(files) == 1, files
  return cases.written_outputs(directory, set())["events"]


def test_perplexity_eval_writes_estimator_evaluates_dir_and_tags(
  run_dir, tmp_path
):
  directory = _fresh_copy(run_dir, tmp_path)
  seen = []

  def dataset_fn():
    # The original seeded Python's and TensorFlow's generators before each
    # evaluation.
    seen.append((random.random(), float(tf.random.uniform([]))))
    return _reverse_dataset()

  results = _run(
    directory,
    "perplexity_eval",
    eval_dataset_fn=lambda **_: [
      dataset_lib.EvalDataset("rev", dataset_fn, None, [])
    ],
    dataset_split="validation",
    perplexity_eval_steps=3,
    eval_dir_suffix="sfx",
  )["rev"]
  # Estimator.evaluate(name="rev_validation_24_sfx") wrote to eval_<name>.
  new_dirs = sorted(
    d
    for d in os.listdir(directory)
    if os.path.isdir(os.path.join(directory, d))
  )
  assert new_dirs == ["eval_rev_validation_24_sfx"]
  records = _records(os.path.join(directory, new_dirs[0]))
  scalars = {
    tag: value for step, tag, kind, value in records if kind != "tensor"
  }
  assert {r[0] for r in records} == {2}
  assert sorted(scalars) == sorted(
    [
      "loss",
      "neg_log_perplexity",
      "token_accuracy",
      "sequence_accuracy",
      "mean_label",
      "num_eval_tokens",
      "max_targets_length",
    ]
  )
  for tag, value in scalars.items():
    assert value == pytest.approx(results[tag], rel=1e-6), tag
  assert [r[1:] for r in records if r[2] == "tensor"] == [
    ["checkpoint_path", "tensor", os.path.join(directory, "model.ckpt-2")]
  ]
  # The metrics: three batches of 8, the 11 examples then all-zero ones.
  x, y = dtu.reverse_data(11, seed=2)
  y[::2, 5:] = 0
  weights = y > 0
  assert scalars["num_eval_tokens"] == weights.sum()
  assert scalars["max_targets_length"] == weights.sum(axis=-1).max()
  assert scalars["mean_label"] == pytest.approx(y[weights].mean(), rel=1e-6)
  est = dtu.estimator(directory, mesh=dtu.MESH_1)
  scores = utils.compute_log_likelihoods(
    est, lambda: _reverse_dataset(), os.path.join(directory, "model.ckpt-2")
  )
  positions = dtu.BATCH * dtu.LENGTH
  batch_losses = [-sum(scores[:8]) / positions, -sum(scores[8:]) / positions, 0]
  assert scalars["loss"] == pytest.approx(np.mean(batch_losses), rel=1e-5)
  assert scalars["neg_log_perplexity"] == pytest.approx(
    sum(scores) / weights.sum(), rel=1e-5
  )
  assert seen == [_seeded_draws()]


@driver.eager_in_legacy_mode
def _seeded_draws():
  """A draw of Python's and TensorFlow's generators seeded with 12345."""
  random.seed(12345)
  tf.random.set_seed(12345)
  return random.random(), float(tf.random.uniform([]))


def test_perplexity_eval_falls_back_to_the_training_data(run_dir, tmp_path):
  directory = _fresh_copy(run_dir, tmp_path)
  results = _run(directory, "perplexity_eval", perplexity_eval_steps=2)
  # As the original: an EvalDataset "eval" of train_dataset_fn's split.
  assert list(results) == ["eval"]
  assert os.path.isdir(os.path.join(directory, "eval_eval_train_16"))
  with pytest.raises(ValueError, match="eval_dataset_fn and train_dataset_fn"):
    _run(directory, "perplexity_eval", train_dataset_fn=None)


def test_run_eval_modes_write_the_split_eval_dir(run_dir, tmp_path):
  directory = _fresh_copy(run_dir, tmp_path)
  texts = [["abc", "cba"], ["hello", "olleh"], ["x", "x"]]

  def dataset_fn(sequence_length=None):
    del sequence_length
    return tf.data.Dataset.from_tensor_slices(
      {
        "inputs": [_pad(t[0]) for t in texts],
        "targets": [_pad(t[1]) for t in texts],
        "targets_pretokenized": [t[1] for t in texts],
      }
    )

  def count(targets, predictions):
    return {"count": float(len(targets) + len(predictions))}

  eval_dataset_fn = lambda **_: [
    dataset_lib.EvalDataset("rev", dataset_fn, None, [count]),
    dataset_lib.EvalDataset("skipped", dataset_fn, None, []),
  ]
  # eval: with sequence_length None, the estimator is built inside
  # eval_model with the examples' lengths (run passes its estimator_fn).
  decoded = _run(
    directory,
    "eval",
    sequence_length=None,
    eval_dataset_fn=eval_dataset_fn,
    dataset_split="validation",
  )
  assert decoded == {"rev": {"count": 6.0}}
  summary_dir = os.path.join(directory, "validation_eval")
  assert sorted(os.listdir(summary_dir))[1:] == [
    "rev_2_predictions",
    "rev_inputs",
    "rev_targets",
  ]
  with open(os.path.join(summary_dir, "rev_targets")) as f:
    assert f.read() == "cba\nolleh\nx\n"
  assert _records(summary_dir) == [[2, "eval/rev/count", "simple_value", 6.0]]
  # score_eval: the same directory, with eval_dir_suffix appended.
  scored = _run(
    directory,
    "score_eval",
    eval_dataset_fn=eval_dataset_fn,
    dataset_split="validation",
    eval_dir_suffix="scores",
  )
  assert scored == {"rev": {"count": 6.0}}
  with open(
    os.path.join(directory, "validation_eval_scores", "rev_2_predictions")
  ) as f:
    scores = [float(s) for s in f.read().split()]
  assert len(scores) == 3 and all(s < 0 for s in scores)


def _pad(text):
  ids = _IdVocabulary().encode(text) + [1]
  return ids + [0] * (dtu.LENGTH - len(ids))


def test_eval_model_without_eval_dataset_fn_or_callable_estimator(run_dir):
  est = dtu.estimator(run_dir, mesh=dtu.MESH_1)
  with pytest.raises(ValueError, match="eval_dataset_fn"):
    utils.eval_model(est, None, 8, 8, "validation", run_dir, None, None, -1)
  with pytest.raises(ValueError, match="A callable must be passed"):
    utils.eval_model(
      est, None, None, 8, "validation", run_dir, lambda **_: [], None, -1
    )
