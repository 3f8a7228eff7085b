"""The TF2 driver (transformer/_src/driver*.py): training, checkpoints, eval.

A tiny Bitransformer (d_model 16, 1+1 layers) learns to reverse short random
id sequences held in memory, on virtual CPUs.
"""

import functools
import os

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from transformer import learning_rate_schedules
from transformer import utils
from transformer._src import checkpoints
from transformer._src import driver
from transformer._src import driver_eval

VOCAB = 20
LENGTH = 8
MESH_2X2 = ("rows:2;cols:2", "batch:rows,heads:cols,d_ff:cols,vocab:cols")


def _tiny_gin():
  gin.clear_config()
  gin.parse_config_files_and_bindings(
      [os.path.join(utils.config_dir(), "defaults.gin")], """
num_layers = 1
d_model = 16
d_ff = 32
num_heads = 2
d_kv = 8
dropout_rate = 0.0
transformer.Unitransformer.max_length = 8
""", finalize_config=False)


def _data(n=64, seed=0):
  rng = np.random.RandomState(seed)
  x = rng.randint(3, VOCAB, size=(n, LENGTH)).astype(np.int32)
  x[:, -1] = 1
  y = x.copy()
  y[:, :-1] = x[:, :-1][:, ::-1]
  return x, y


def _estimator(model_dir, mesh=MESH_2X2, master_dtype="float32",
               activation_dtype="float32", **kwargs):
  """A tiny Bitransformer estimator; float32 throughout by default (the
  defaults.gin bfloat16 activations round differently on other layouts)."""
  _tiny_gin()
  mesh_shape, layout = mesh
  model = utils.build_model("bitransformer", input_vocab_size=VOCAB,
                            output_vocab_size=VOCAB, layout_rules=layout,
                            mesh_shape=mesh_shape)
  schedule = functools.partial(
      learning_rate_schedules.constant_learning_rate, learning_rate=0.01,
      total_train_steps=100)
  return driver.Estimator(
      "bitransformer", model, None, str(model_dir), mesh_shape, layout, 8,
      LENGTH, learning_rate_schedule=schedule, log_every_steps=10,
      variable_dtype=utils.get_variable_dtype(
          master_dtype=master_dtype, activation_dtype=activation_dtype),
      **kwargs)


def _input_fn():
  x, y = _data()
  return tf.data.Dataset.from_tensor_slices(
      {"inputs": x, "targets": y}).repeat().batch(8, drop_remainder=True)


def _eval_dataset():
  x, y = _data(16, seed=1)
  return tf.data.Dataset.from_tensor_slices(
      {"inputs": x, "targets": y}).batch(8)


@pytest.mark.slow
def test_train_loss_falls_and_checkpoint_format(tmp_path):
  est = _estimator(tmp_path, master_dtype="bfloat16",
                   save_checkpoints_steps=20, keep_checkpoint_max=2)
  first = est.train(_input_fn, 1)
  last = est.train(_input_fn, 30)
  assert last["step"] == 30
  assert last["loss"] < first["loss"] * 0.9
  # Checkpoints: rotation keeps 2, names and full shapes as spec 13.
  assert checkpoints.checkpoint_steps(str(tmp_path)) == [20, 30]
  listed = dict(tf.train.list_variables(str(tmp_path / "model.ckpt-30")))
  assert listed["global_step"] == []
  assert listed["shared/embedding"] == [128, 16]  # vocab padded to 128
  assert listed["encoder/block_000/layer_000/SelfAttention/q"] == [16, 16]
  assert listed["decoder/block_000/layer_002/DenseReluDense/wi/kernel"] == [
      16, 32]
  assert "encoder/block_000/layer_000/SelfAttention/q_slot_v" in listed
  reader = tf.train.load_checkpoint(str(tmp_path / "model.ckpt-30"))
  dtypes = reader.get_variable_to_dtype_map()
  assert dtypes["shared/embedding"] == tf.bfloat16  # master dtype
  assert dtypes["global_step"] == tf.int64
  assert int(reader.get_tensor("global_step")) == 30
  assert os.path.exists(tmp_path / "operative_config.gin")
  assert tf.io.gfile.glob(str(tmp_path / "events.out.tfevents*"))


@pytest.mark.slow
def test_restore_on_other_layouts_gives_same_eval_loss(tmp_path):
  est = _estimator(tmp_path, save_checkpoints_steps=0)
  est.train(_input_fn, 10)
  trained = driver_eval.evaluate(est, _eval_dataset())
  for mesh in [("", ""), ("all:4", "batch:all"),
               ("rows:2;cols:2", "batch:cols,d_model:rows")]:
    other = _estimator(tmp_path, mesh=mesh)
    metrics = driver_eval.evaluate(other, _eval_dataset())
    np.testing.assert_allclose(metrics["loss"], trained["loss"], rtol=1e-5)
    assert metrics["token_accuracy"] == trained["token_accuracy"]


@pytest.mark.slow
def test_resume_continues_from_latest_checkpoint(tmp_path):
  est = _estimator(tmp_path, save_checkpoints_steps=5)
  est.train(_input_fn, 10)
  again = _estimator(tmp_path, save_checkpoints_steps=5)
  out = again.train(_input_fn, 15)
  assert out["step"] == 15
  assert checkpoints.checkpoint_steps(str(tmp_path))[-1] == 15


@pytest.mark.slow
def test_other_models_checkpoint_is_a_clear_error_and_kept(tmp_path):
  est = _estimator(tmp_path, save_checkpoints_steps=0)
  est.train(_input_fn, 2)
  before = sorted(os.listdir(tmp_path))
  _tiny_gin()
  gin.parse_config("d_model = 32")  # another model
  model = utils.build_model("bitransformer", input_vocab_size=VOCAB,
                            output_vocab_size=VOCAB)
  other = driver.Estimator("bitransformer", model, None, str(tmp_path), "",
                           "", 8, LENGTH)
  with pytest.raises(ValueError, match="model.ckpt-2"):
    other.train(_input_fn, 4)
  assert sorted(os.listdir(tmp_path)) == before


def test_too_few_devices_is_a_clear_error():
  with pytest.raises(ValueError, match="--mesh_devices=64"):
    driver.mesh_devices_for("a:8;b:8")


def test_decode_and_score_shapes(tmp_path):
  est = _estimator(tmp_path, mesh=("", ""), save_checkpoints_steps=0)
  est.train(_input_fn, 1)
  x, y = _data(3)
  decoded = driver_eval.decode_ids(est, x)
  assert len(decoded) == 3 and decoded[0].shape == (LENGTH,)
  scores = driver_eval.score_ids(est, x, y)
  assert scores.shape == (3,) and np.all(scores < 0)
