"""export_model: a SavedModel that decodes strings in a fresh process."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tests.transformer import driver_test_util as dtu
from transformer import utils
from transformer import vocabulary as vocabulary_lib

BYTES = vocabulary_lib.ByteVocabulary()
STRINGS = ["abc", "hello", "x", "mesh tf", "zz", "", "revers"]

LOAD_AND_DECODE = """
import json, sys
import tensorflow as tf
model = tf.saved_model.load(sys.argv[1])
serve = model.signatures["serving_default"]
out = serve(inputs=tf.constant(json.loads(sys.argv[2])))["outputs"]
print(json.dumps({
    "decodes": [s.decode("utf-8") for s in out.numpy().tolist()],
    "package_imported": any(m.split(".")[0] in ("transformer",
                                                "mesh_tensorflow")
                            for m in sys.modules)}))
"""


@pytest.mark.slow
def test_saved_model_decodes_like_the_driver_in_a_fresh_process(tmp_path):
  est = dtu.estimator(
    tmp_path / "model",
    mesh=dtu.MESH_2X2,
    vocabulary=BYTES,
    save_checkpoints_steps=0,
  )
  ids = utils.encode_inputs(
    STRINGS + ["more", "data"], BYTES, "bitransformer", 8, 8
  )
  reversed_ids = utils.encode_inputs(
    [s[::-1] for s in STRINGS + ["more", "data"]], BYTES, "bitransformer", 8, 8
  )
  est.train(
    lambda: (
      tf.data.Dataset.from_tensor_slices(
        {"inputs": ids, "targets": reversed_ids}
      )
      .repeat()
      .batch(8)
    ),
    20,
  )
  expected = utils.decode_strings(est, STRINGS)
  assert len(set(expected)) > 1  # the decodes depend on the input
  path = utils.export_model(
    est,
    str(tmp_path / "export"),
    BYTES,
    {"inputs": 8, "targets": 8},
    "bitransformer",
    batch_size=3,
  )
  assert os.path.basename(path) == "20"
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  env["TF_CPP_MIN_LOG_LEVEL"] = "2"
  proc = subprocess.run(
    [sys.executable, "-c", LOAD_AND_DECODE, path, json.dumps(STRINGS)],
    cwd=str(tmp_path),
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
    check=False,
  )
  assert proc.returncode == 0, proc.stderr
  result = json.loads(proc.stdout.strip().splitlines()[-1])
  assert not result["package_imported"]
  assert result["decodes"] == expected
  # A scoring signature gives the driver's log-likelihoods.
  targets = [s[::-1] for s in STRINGS]
  scores, _ = utils.score_from_strings(
    est,
    BYTES,
    "bitransformer",
    8,
    8,
    est.model_dir,
    -1,
    inputs=STRINGS,
    targets=targets,
    score_postprocess_fn=utils.save_scores,
  )
  score_path = utils.export_model(
    est,
    str(tmp_path / "export_score"),
    BYTES,
    {"inputs": 8, "targets": 8},
    "bitransformer",
    eval_with_score=True,
    batch_size=3,
  )
  serve = tf.saved_model.load(score_path).signatures["serving_default"]
  exported = serve(inputs=tf.constant(STRINGS), targets=tf.constant(targets))[
    "scores"
  ].numpy()
  np.testing.assert_allclose(exported, scores, rtol=1e-4)


def test_export_without_a_checkpoint_names_the_model_dir(tmp_path):
  est = dtu.estimator(tmp_path / "empty", mesh=("", ""), vocabulary=BYTES)
  with pytest.raises(ValueError, match="no checkpoint in .*empty"):
    utils.export_model(est, str(tmp_path / "export"), BYTES, 8, "bitransformer")
