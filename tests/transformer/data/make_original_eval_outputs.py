"""Writes original_eval_outputs.json: what the original eval_model wrote.

Run with the original mesh-tensorflow 0.1.21 (and TF 2.21) first on
PYTHONPATH, from the repository root:

  PYTHONPATH=<original>:. python tests/transformer/data/make_original_eval_outputs.py

Each case of tests/transformer/eval_outputs_cases.py is run in a fresh
model directory holding empty checkpoint files of CHECKPOINT_STEPS (the
original only lists their names), with a stub estimator whose `predict`
yields the stub model's decodes; the files, texts and event records the
original left are stored per case.
"""

import json
import os
import tempfile

import tensorflow as tf

# The original's eval_model writes with tf.summary.FileWriter: graph mode.
tf.compat.v1.disable_eager_execution()

from mesh_tensorflow.transformer import dataset as transformer_dataset  # noqa: E402
from mesh_tensorflow.transformer import utils  # noqa: E402
from tests import original_package  # noqa: E402
from tests.transformer import eval_outputs_cases as cases  # noqa: E402


class StubEstimator:
  """Yields {"inputs", "outputs"} per row of the input_fn's batches."""

  def __init__(self, sequence_length):
    self.sequence_length = sequence_length

  def predict(self, input_fn, checkpoint_path=None):
    del checkpoint_path
    for batch in cases.dataset_rows(input_fn({"batch_size": cases.BATCH_SIZE})):
      for row in batch["inputs"]:
        yield {"inputs": row, "outputs": cases.shifted(row)}


def main():
  original_package.require_original()
  results = {}
  for name, case in sorted(cases.CASES.items()):
    with tempfile.TemporaryDirectory() as model_dir:
      for step in cases.CHECKPOINT_STEPS:
        for suffix in (".index", ".data-00000-of-00001"):
          open(os.path.join(model_dir, "model.ckpt-%d%s" % (step, suffix)), "w")
      results[name] = case(utils, transformer_dataset, StubEstimator, model_dir)
    print("%s: %d outputs" % (name, len(results[name]["outputs"])))
  path = os.path.join(os.path.dirname(__file__), "original_eval_outputs.json")
  with open(path, "w", encoding="utf-8") as f:
    json.dump(results, f, indent=1, sort_keys=True, ensure_ascii=False)
    f.write("\n")
  print("wrote %s" % path)


if __name__ == "__main__":
  main()
