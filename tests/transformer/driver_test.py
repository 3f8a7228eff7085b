"""The TF2 driver (transformer/_src/driver/): training, checkpoints, eval.

A tiny Bitransformer (d_model 16, 1+1 layers) learns to reverse short random
id sequences held in memory, on virtual CPUs.
"""

import os
import shutil
import threading
import time

import gin
import numpy as np
import pytest
import tensorflow as tf

from tests.transformer import driver_test_util as dtu
from transformer import utils
from transformer._src.driver import checkpoints
from transformer._src.driver import estimator as driver
from transformer._src.driver import evaluation as driver_eval


@pytest.mark.slow
def test_train_loss_falls_and_checkpoint_format(tmp_path):
  est = dtu.estimator(
    tmp_path,
    master_dtype="bfloat16",
    save_checkpoints_steps=20,
    keep_checkpoint_max=2,
  )
  first = est.train(dtu.input_fn, 1)
  last = est.train(dtu.input_fn, 30)
  assert last["step"] == 30
  assert last["loss"] < first["loss"] * 0.9
  # Checkpoints: rotation keeps 2; the original's variable names and full
  # shapes.
  assert checkpoints.checkpoint_steps(str(tmp_path)) == [20, 30]
  listed = dict(tf.train.list_variables(str(tmp_path / "model.ckpt-30")))
  assert listed["global_step"] == []
  assert listed["shared/embedding"] == [128, 16]  # vocab padded to 128
  assert listed["encoder/block_000/layer_000/SelfAttention/q"] == [16, 16]
  assert listed["decoder/block_000/layer_002/DenseReluDense/wi/kernel"] == [
    16,
    32,
  ]
  assert "encoder/block_000/layer_000/SelfAttention/q_slot_v" in listed
  reader = tf.train.load_checkpoint(str(tmp_path / "model.ckpt-30"))
  dtypes = reader.get_variable_to_dtype_map()
  assert dtypes["shared/embedding"] == tf.bfloat16  # master dtype
  assert dtypes["global_step"] == tf.int64
  assert int(reader.get_tensor("global_step")) == 30
  assert os.path.exists(tmp_path / "operative_config.gin")
  # TensorBoard scalars: loss, learning rate and throughput per report.
  tags = {}
  for events in tf.io.gfile.glob(str(tmp_path / "events.out.tfevents*")):
    for event in tf.compat.v1.train.summary_iterator(events):
      for value in event.summary.value:
        tags.setdefault(value.tag, []).append(event.step)
        assert value.metadata.plugin_data.plugin_name == "scalars"
  assert sorted(tags["loss"]) == [1, 10, 20, 30]  # two train() calls
  assert set(tags) == {
    "loss",
    "learning_rate",
    "tokens_per_second",
    "steps_per_second",
  }


@pytest.mark.slow
def test_restore_on_other_layouts_gives_same_eval_loss(tmp_path):
  est = dtu.estimator(tmp_path, save_checkpoints_steps=0)
  est.train(dtu.input_fn, 10)
  trained = driver_eval.evaluate(est, dtu.eval_dataset())
  for mesh in [
    ("", ""),
    ("all:4", "batch:all"),
    ("rows:2;cols:2", "batch:cols,d_model:rows"),
  ]:
    other = dtu.estimator(tmp_path, mesh=mesh)
    metrics = driver_eval.evaluate(other, dtu.eval_dataset())
    np.testing.assert_allclose(metrics["loss"], trained["loss"], rtol=1e-5)
    assert metrics["token_accuracy"] == trained["token_accuracy"]


@pytest.mark.slow
def test_resume_continues_from_latest_checkpoint(tmp_path):
  est = dtu.estimator(tmp_path, save_checkpoints_steps=5)
  est.train(dtu.input_fn, 10)
  again = dtu.estimator(tmp_path, save_checkpoints_steps=5)
  out = again.train(dtu.input_fn, 15)
  assert out["step"] == 15
  assert checkpoints.checkpoint_steps(str(tmp_path))[-1] == 15


@pytest.mark.slow
def test_other_models_checkpoint_is_a_clear_error_and_kept(tmp_path):
  est = dtu.estimator(tmp_path, save_checkpoints_steps=0)
  est.train(dtu.input_fn, 2)
  before = sorted(os.listdir(tmp_path))
  dtu.tiny_gin()
  gin.parse_config("d_model = 32")  # another model
  model = utils.build_model(
    "bitransformer", input_vocab_size=dtu.VOCAB, output_vocab_size=dtu.VOCAB
  )
  other = driver.Estimator(
    "bitransformer", model, None, str(tmp_path), "", "", 8, dtu.LENGTH
  )
  with pytest.raises(ValueError, match="model.ckpt-2"):
    other.train(dtu.input_fn, 4)
  assert sorted(os.listdir(tmp_path)) == before


@pytest.mark.slow
def test_corrupt_latest_index_is_named_and_nothing_changes(tmp_path):
  est = dtu.estimator(tmp_path, mesh=("", ""), save_checkpoints_steps=1)
  est.train(dtu.input_fn, 2)
  index = tmp_path / "model.ckpt-2.index"
  index.write_bytes(b"not a checkpoint index")
  before = {
    p: (tmp_path / p).read_bytes()
    for p in os.listdir(tmp_path)
    if os.path.isfile(tmp_path / p)
  }
  again = dtu.estimator(tmp_path, mesh=("", ""), save_checkpoints_steps=1)
  with pytest.raises(ValueError, match="model.ckpt-2"):
    again.train(dtu.input_fn, 4)
  after = {
    p: (tmp_path / p).read_bytes()
    for p in os.listdir(tmp_path)
    if os.path.isfile(tmp_path / p)
  }
  assert after == before


def test_too_few_devices_is_a_clear_error():
  with pytest.raises(ValueError, match="--mesh_devices=64"):
    driver.mesh_devices_for("a:8;b:8")


def test_decode_and_score_shapes(tmp_path):
  est = dtu.estimator(tmp_path, mesh=("", ""), save_checkpoints_steps=0)
  est.train(dtu.input_fn, 1)
  x, y = dtu.reverse_data(3)
  decoded = driver_eval.decode_ids(est, x)
  assert len(decoded) == 3 and decoded[0].shape == (dtu.LENGTH,)
  scores = driver_eval.score_ids(est, x, y)
  assert scores.shape == (3,) and np.all(scores < 0)


def _checkpoint_values(path):
  reader = tf.train.load_checkpoint(str(path))
  return {
    name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
  }


@pytest.mark.slow
def test_outer_batch_split_gives_the_same_training_step(tmp_path):
  """outer_batch_size 2 on "outer_batch:rows" = the plain batch on rows."""
  dtu.estimator(tmp_path / "plain", save_checkpoints_steps=0).train(
    dtu.input_fn, 1
  )
  shutil.copytree(tmp_path / "plain", tmp_path / "outer")
  plain = dtu.estimator(tmp_path / "plain", save_checkpoints_steps=0)
  outer = dtu.estimator(
    tmp_path / "outer",
    save_checkpoints_steps=0,
    outer_batch_size=2,
    mesh=("rows:2;cols:2", "outer_batch:rows,heads:cols,d_ff:cols"),
    model_info_file=str(tmp_path / "info" / "model_info.txt"),
  )
  assert [d.name for d in outer.batch_dims()] == ["outer_batch", "batch"]
  assert [d.size for d in outer.batch_dims()] == [2, 4]
  plain_loss = plain.train(dtu.input_fn, 3)["loss"]
  outer_loss = outer.train(dtu.input_fn, 3)["loss"]
  np.testing.assert_allclose(outer_loss, plain_loss, rtol=1e-5)
  want = _checkpoint_values(tmp_path / "plain" / "model.ckpt-3")
  got = _checkpoint_values(tmp_path / "outer" / "model.ckpt-3")
  assert sorted(got) == sorted(want)
  for name in want:
    np.testing.assert_allclose(
      got[name], want[name], rtol=1e-4, atol=1e-6, err_msg=name
    )
  metrics = driver_eval.evaluate(outer, dtu.eval_dataset())
  np.testing.assert_allclose(
    metrics["loss"],
    driver_eval.evaluate(plain, dtu.eval_dataset())["loss"],
    rtol=1e-5,
  )
  info = (tmp_path / "info" / "model_info.txt").read_text()
  assert "shared/embedding Shape[vocab=128, d_model=16] 2048" in info
  assert "total parameters" in info


def test_outer_batch_size_must_divide_the_batch(tmp_path):
  with pytest.raises(ValueError, match="outer_batch_size 3"):
    dtu.estimator(tmp_path, outer_batch_size=3)


@pytest.mark.slow
def test_ensemble_inputs_feed_each_member_its_own_batch(tmp_path):
  est = dtu.estimator(
    tmp_path,
    save_checkpoints_steps=0,
    ensemble_inputs=2,
    gin_extra="transformer.Unitransformer.ensemble = 2",
  )
  assert [d.name for d in est.batch_dims()] == ["ensemble", "batch"]
  first = est.train(lambda: dtu.input_fn().batch(2, drop_remainder=True), 1)
  last = est.train(lambda: dtu.input_fn().batch(2, drop_remainder=True), 20)
  assert last["loss"] < first["loss"]
  listed = dict(tf.train.list_variables(str(tmp_path / "model.ckpt-20")))
  assert listed["shared/embedding"] == [2, 128, 16]
  assert listed["encoder/block_000/layer_000/SelfAttention/q"] == [2, 16, 16]
  metrics = driver_eval.evaluate(est, dtu.eval_dataset())
  # Every member sees the eval batch: twice the target tokens.
  assert metrics["num_eval_tokens"] == 2 * 16 * dtu.LENGTH
  assert np.isfinite(metrics["loss"])


def test_predict_fn_replaces_the_models_decoding(tmp_path):
  calls = []

  def echo_inputs(model, features, variable_dtype):
    calls.append((model, sorted(features), variable_dtype))
    return features["inputs"]

  est = dtu.estimator(
    tmp_path, mesh=("", ""), save_checkpoints_steps=0, predict_fn=echo_inputs
  )
  est.train(dtu.input_fn, 1)
  x, _ = dtu.reverse_data(3)
  decoded = driver_eval.decode_ids(est, x)
  np.testing.assert_array_equal(np.stack(decoded), x)
  assert calls and calls[0][0] is est.model and calls[0][1] == ["inputs"]


def _fake_checkpoints(model_dir, steps):
  step = tf.Variable(0, dtype=tf.int64)
  for s in steps:
    step.assign(s)
    checkpoints.save(str(model_dir), s, {"global_step": step})


def test_get_checkpoint_iterator_steps_lists_latest_and_all(tmp_path):
  _fake_checkpoints(tmp_path, [10, 20, 30])
  path = lambda s: os.path.join(str(tmp_path), "model.ckpt-%d" % s)
  it = utils.get_checkpoint_iterator
  assert it(20, str(tmp_path)) == [path(20)]
  assert it(24, str(tmp_path)) == [path(20)]  # closest
  assert it([9, 31], str(tmp_path)) == [path(10), path(30)]
  assert it(-1, str(tmp_path)) == [path(30)]  # latest
  assert it("all", str(tmp_path)) == [path(10), path(20), path(30)]
  assert it("all", str(tmp_path), skip_until=10, stop_after=20) == [path(20)]
  with pytest.raises(ValueError, match="no checkpoint for step 24"):
    it(24, str(tmp_path), find_closest=False)
  with pytest.raises(ValueError, match="no checkpoints"):
    it(-1, str(tmp_path / "empty"))


def test_get_checkpoint_iterator_none_waits_for_new_checkpoints(tmp_path):
  _fake_checkpoints(tmp_path, [10, 20])
  path = lambda s: os.path.join(str(tmp_path), "model.ckpt-%d" % s)
  paths = utils.get_checkpoint_iterator(
    None, str(tmp_path), skip_until=10, stop_after=40, poll_seconds=0.05
  )
  assert next(paths) == path(20)
  writer = threading.Timer(0.3, _fake_checkpoints, (tmp_path, [30, 40, 50]))
  writer.start()
  rest = list(paths)  # waits for 30 and 40, stops at stop_after
  writer.join()
  assert rest == [path(30), path(40)]
  # last_step ends it as well; a timeout ends a wait with no new checkpoint.
  assert list(
    utils.get_checkpoint_iterator(
      None, str(tmp_path), last_step=20, poll_seconds=0.05
    )
  ) == [path(10), path(20)]
  start = time.monotonic()
  assert (
    list(
      utils.get_checkpoint_iterator(
        None, str(tmp_path), skip_until=50, timeout=0.2, poll_seconds=0.05
      )
    )
    == []
  )
  assert time.monotonic() - start < 5
