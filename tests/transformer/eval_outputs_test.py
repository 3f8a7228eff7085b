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

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests.transformer import driver_test_util as dtu
from tests.transformer import eval_outputs_cases as cases
from transformer import dataset as dataset_lib
from transformer import utils

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
