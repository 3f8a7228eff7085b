"""End to end: pretraining then fine-tuning on the offline demo data.

run_pretraining.main trains a tiny BERT on the generated corpus (its masked
LM loss falls well below that of a uniform guess) and writes a checkpoint
that run_classifier.main fine-tunes from (model weights only: the step and
optimizer slots start afresh) to beat chance on the generated set. In the
legacy pass (MTF_TEST_TF_MODE=v1) the mains run in graph mode, as a script
that called tf.compat.v1.disable_v2_behavior() first (the original's did)
runs them.
"""

import math
import os

from absl import flags
from absl.testing import flagsaver
import numpy as np
import pytest
import tensorflow as tf

from mesh_tensorflow.bert import demo_data
from mesh_tensorflow.bert import run_classifier
from mesh_tensorflow.bert import run_pretraining
from tests import mesh_test_util

FLAGS = flags.FLAGS

SEQ, PRED = 32, 5


def _read_results(path):
  with open(path) as f:
    return {
      key: float(value)
      for key, value in (
        line.strip().split(" = ") for line in f if line.strip()
      )
    }


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
  """Demo data and a pretraining run of 40 steps on a 2-device mesh."""
  if not FLAGS.is_parsed():
    FLAGS.mark_as_parsed()
  mesh_test_util.eager_seed(1)
  root = tmp_path_factory.mktemp("bert")
  data = demo_data.write_demo_data(
    str(root / "data"), max_seq_length=SEQ, max_predictions_per_seq=PRED
  )
  output_dir = str(root / "pretrain")
  with flagsaver.flagsaver(
    bert_config_file=data.bert_config_file,
    input_train_files=data.pretraining_file,
    input_eval_files=data.pretraining_file,
    output_dir=output_dir,
    max_seq_length=SEQ,
    max_predictions_per_seq=PRED,
    mode="train_and_eval",
    train_batch_size=8,
    eval_batch_size=8,
    learning_rate=1e-3,
    num_train_steps=40,
    num_warmup_steps=4,
    steps_per_eval=40,
    max_eval_steps=6,
    save_checkpoints_steps=1000,
    mesh_shape="batch:2",
    layout="batch:batch",
  ):
    with mesh_test_util.as_tf1_program():
      run_pretraining.main([])
  return data, output_dir


def test_pretraining_lowers_the_masked_lm_loss(pretrained):
  _, output_dir = pretrained
  results = _read_results(os.path.join(output_dir, "eval_results_40.txt"))
  assert results["global_step"] == 40
  # An untrained model is close to a uniform guess over the padded
  # vocabulary (log 128 = 4.85); the generated corpus is far more regular.
  assert results["masked_lm_loss"] < 0.7 * math.log(128)
  assert results["masked_lm_accuracy"] > 0.2
  names = dict(tf.train.list_variables(output_dir))
  assert names["bert/embeddings/word_embeddings"] == [128, 32]
  assert "bert/embeddings/word_embeddings/adam_m" in names
  assert "cls/seq_relationship/kernel" in names


def test_classifier_fine_tunes_from_the_pretraining_checkpoint(
  pretrained, tmp_path
):
  data, pretrain_dir = pretrained
  tf.random.set_seed(2)
  output_dir = str(tmp_path / "classifier")
  with flagsaver.flagsaver(
    data_dir=data.classifier_dir,
    task_name="cola",
    vocab_file=data.vocab_file,
    bert_config_file=data.bert_config_file,
    output_dir=output_dir,
    init_checkpoint=pretrain_dir,
    max_seq_length=SEQ,
    do_train=True,
    do_eval=True,
    do_predict=True,
    train_batch_size=16,
    eval_batch_size=16,
    predict_batch_size=16,
    learning_rate=3e-4,
    num_train_epochs=6.0,
    mesh_shape="batch:2",
    layout="batch:batch",
  ):
    with mesh_test_util.as_tf1_program():
      run_classifier.main([])
  results = _read_results(os.path.join(output_dir, "eval_results.txt"))
  # 256 examples / 16 per batch * 6 epochs: the step starts from 0, not
  # from the pretraining checkpoint's 40.
  assert results["global_step"] == 96
  assert results["eval_accuracy"] > 0.75  # chance: 0.5
  with open(os.path.join(output_dir, "test_results.tsv")) as f:
    rows = [[float(p) for p in line.split("\t")] for line in f]
  assert len(rows) == 64  # every test example, no padding
  np.testing.assert_allclose(np.sum(rows, axis=1), 1.0, rtol=1e-5)
  # The pretrained weights were the starting point: rows of the padded
  # vocabulary that no input uses change only by weight decay (< 0.1%).
  name = "bert/embeddings/word_embeddings"
  fine_tuned = tf.train.load_checkpoint(output_dir).get_tensor(name)
  pretrained = tf.train.load_checkpoint(pretrain_dir).get_tensor(name)
  np.testing.assert_allclose(fine_tuned[100:], pretrained[100:], rtol=1e-3)
  assert not np.allclose(fine_tuned[5:50], pretrained[5:50], rtol=1e-3)
  assert "output_weights" in dict(tf.train.list_variables(output_dir))
