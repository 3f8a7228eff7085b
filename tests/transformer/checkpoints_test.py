"""Tests of the driver's checkpoint layer (_src/driver/checkpoints.py,
checkpoint_restore.py and checkpoint_names.py).

Checkpoints must be standard TF V2 bundles with the original's names and full
shapes (tf.train.list_variables reads them), keep master dtypes (bf16), rotate
without ever losing the latest, survive a crash at any point of a save, and
fail loudly, changing nothing, on a corrupt or foreign checkpoint. Restoring
full-shape masters into another mesh shape or layout gives the same model.
"""

import os

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mesh_test_util as mtu
from transformer import transformer_layers  # noqa: F401  (gin registrations)
from transformer import utils
from transformer._src.driver import checkpoint_names
from transformer._src.driver import checkpoint_restore
from transformer._src.driver import checkpoints
from transformer._src.models import bitransformer


def _var(value, dtype=tf.float32):
  return tf.Variable(tf.constant(value, dtype))


def _values(variables):
  return {n: v.numpy().astype(np.float64) for n, v in variables.items()}


def _rng_vars(seed, names_shapes, dtype=tf.float32):
  rng = np.random.RandomState(seed)
  return {
    n: _var(rng.randn(*s).astype(np.float32), dtype)
    for n, s in names_shapes.items()
  }


SMALL = {
  "encoder/block_000/layer_000/SelfAttention/q": [8, 4],
  "encoder/block_001/layer_000/SelfAttention/q": [8, 4],
  "decoder/block_000/layer_001/DenseReluDense/wi/kernel": [8, 16],
  "shared/embedding": [128, 8],
}


def _dir_files(path):
  return sorted(os.listdir(path))


# ----------------------------------------------------------------------------
# Format.


def test_save_writes_exact_names_full_shapes_and_dtypes(tmp_path):
  model_dir = str(tmp_path / "model")
  variables = _rng_vars(0, SMALL)
  variables["encoder/rms_norm/scale"] = _var(np.ones([8]), tf.bfloat16)
  variables["global_step"] = _var(7, tf.int64)
  path = checkpoints.save(model_dir, 7, variables)
  assert path == model_dir + "/model.ckpt-7"
  assert _dir_files(model_dir) == [
    "checkpoint",
    "model.ckpt-7.data-00000-of-00001",
    "model.ckpt-7.index",
  ]
  listed = dict(tf.train.list_variables(path))
  assert listed == {n: v.shape.as_list() for n, v in variables.items()}
  reader = tf.train.load_checkpoint(model_dir)  # via the state file
  dtypes = reader.get_variable_to_dtype_map()
  assert dtypes["encoder/rms_norm/scale"] == tf.bfloat16
  assert dtypes["global_step"] == tf.int64
  assert dtypes["shared/embedding"] == tf.float32
  for name, var in variables.items():
    np.testing.assert_array_equal(
      np.asarray(reader.get_tensor(name)).astype(np.float64),
      var.numpy().astype(np.float64),
      err_msg=name,
    )
  assert checkpoint_restore.list_checkpoint_variables(model_dir)[
    "global_step"
  ] == (
    [],
    tf.int64,
  )


def test_state_file_is_what_tf_reads(tmp_path):
  model_dir = str(tmp_path)
  variables = {"w": _var(np.zeros([2]))}
  for step in (10, 20):
    checkpoints.save(model_dir, step, variables)
  text = open(os.path.join(model_dir, "checkpoint")).read()
  assert 'model_checkpoint_path: "model.ckpt-20"' in text  # relative paths
  state = tf.train.get_checkpoint_state(model_dir)
  assert state.model_checkpoint_path == model_dir + "/model.ckpt-20"
  assert list(state.all_model_checkpoint_paths) == [
    model_dir + "/model.ckpt-10",
    model_dir + "/model.ckpt-20",
  ]
  assert len(state.all_model_checkpoint_timestamps) == 2
  assert (
    tf.train.latest_checkpoint(model_dir)
    == checkpoints.latest_checkpoint(model_dir)
    == model_dir + "/model.ckpt-20"
  )
  assert checkpoints.all_checkpoints(model_dir) == [
    model_dir + "/model.ckpt-10",
    model_dir + "/model.ckpt-20",
  ]
  assert checkpoints.checkpoint_steps(model_dir) == [10, 20]
  assert (
    utils.get_step_from_checkpoint_path(
      checkpoints.latest_checkpoint(model_dir)
    )
    == 20
  )


def test_latest_checkpoint_of_empty_or_missing_dir_is_none(tmp_path):
  assert checkpoints.latest_checkpoint(str(tmp_path)) is None
  assert checkpoints.latest_checkpoint(str(tmp_path / "nope")) is None
  assert checkpoints.all_checkpoints(str(tmp_path / "nope")) == []
  assert checkpoints.checkpoint_steps(str(tmp_path / "nope")) == []


def test_latest_checkpoint_without_state_file_uses_highest_step(tmp_path):
  model_dir = str(tmp_path)
  variables = {"w": _var(np.zeros([2]))}
  checkpoints.save(model_dir, 3, variables)
  checkpoints.save(model_dir, 12, variables)
  os.remove(os.path.join(model_dir, "checkpoint"))
  assert (
    checkpoints.latest_checkpoint(model_dir) == model_dir + "/model.ckpt-12"
  )


def test_restore_reads_original_tf1_saver_checkpoints(tmp_path):
  """A TF1 Saver(sharded=True) bundle, as the original driver wrote; its
  state file holds absolute paths, stale after the directory moved.
  """
  rng = np.random.RandomState(3)
  values = {
    "decoder/block_000/layer_000/SelfAttention/k": rng.randn(4, 6),
    "decoder/logits/kernel": rng.randn(6, 5),
  }
  saved_dir = str(tmp_path / "old")
  os.makedirs(saved_dir)
  with tf.Graph().as_default():
    for name, value in sorted(values.items()):
      tf.compat.v1.get_variable(
        name, initializer=tf.constant(value, tf.bfloat16)
      )
    step = tf.compat.v1.train.get_or_create_global_step()
    saver = tf.compat.v1.train.Saver(sharded=True, max_to_keep=None)
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      sess.run(step.assign(42))
      saver.save(sess, saved_dir + "/model.ckpt", global_step=step)
  moved_dir = str(tmp_path / "moved")
  os.rename(saved_dir, moved_dir)
  latest = checkpoints.latest_checkpoint(moved_dir)
  assert latest == moved_dir + "/model.ckpt-42"
  targets = {n: _var(np.zeros(v.shape)) for n, v in values.items()}
  targets["global_step"] = _var(0, tf.int64)
  restored = checkpoint_restore.restore(moved_dir, targets)
  assert restored == sorted(targets)
  assert int(targets["global_step"].numpy()) == 42
  for name, value in values.items():
    expected = tf.cast(tf.constant(value, tf.bfloat16), tf.float32).numpy()
    np.testing.assert_array_equal(targets[name].numpy(), expected)


def test_restore_reads_multi_shard_bundles(tmp_path):
  """Data split over several files (one per host, as on TPU pods)."""
  prefix = str(tmp_path / "model.ckpt-8")
  parts = []
  for shard, (name, value) in enumerate([("a", [1.0, 2.0]), ("b", [3.0])]):
    part = (
      tf.raw_ops.ShardedFilename(
        basename=str(tmp_path / "tmp" / "part"), shard=shard, num_shards=2
      )
      .numpy()
      .decode()
    )
    tf.raw_ops.SaveV2(
      prefix=part,
      tensor_names=[name],
      shape_and_slices=[""],
      tensors=[tf.constant(value)],
    )
    parts.append(part)
  tf.raw_ops.MergeV2Checkpoints(
    checkpoint_prefixes=parts, destination_prefix=prefix
  )
  assert "model.ckpt-8.data-00001-of-00002" in _dir_files(tmp_path)
  targets = {"a": _var([0.0, 0.0]), "b": _var([0.0])}
  checkpoint_restore.restore(prefix, targets)
  np.testing.assert_array_equal(targets["a"].numpy(), [1.0, 2.0])
  np.testing.assert_array_equal(targets["b"].numpy(), [3.0])


# ----------------------------------------------------------------------------
# Restore: dtypes and errors.


def test_restore_casts_bf16_and_f32_per_variable(tmp_path):
  model_dir = str(tmp_path)
  value = np.array([1.5, -2.25, 3.140625], np.float32)  # exact in bf16
  checkpoints.save(
    model_dir, 1, {"a": _var(value, tf.bfloat16), "b": _var(value + 0.001)}
  )
  targets = {"a": _var(np.zeros(3)), "b": _var(np.zeros(3), tf.bfloat16)}
  checkpoint_restore.restore(model_dir + "/model.ckpt-1", targets)
  assert targets["a"].dtype == tf.float32
  np.testing.assert_array_equal(targets["a"].numpy(), value)
  np.testing.assert_array_equal(
    targets["b"].numpy(),
    tf.cast(tf.constant(value + 0.001), tf.bfloat16).numpy(),
  )


def test_restore_of_another_models_checkpoint_names_it_and_changes_nothing(
  tmp_path,
):
  model_dir = str(tmp_path)
  checkpoints.save(model_dir, 5, _rng_vars(0, SMALL))
  files = {
    f: open(os.path.join(model_dir, f), "rb").read()
    for f in _dir_files(model_dir)
  }
  # Same names, one shape differs: no variable may change.
  shapes = dict(SMALL, **{"shared/embedding": [256, 8]})
  targets = _rng_vars(1, shapes)
  before = _values(targets)
  with pytest.raises(
    ValueError,
    match=r"model\.ckpt-5.*shared/embedding.*"
    r"\[128, 8\].*\[256, 8\]",
  ):
    checkpoint_restore.restore(model_dir, targets)
  assert all(np.array_equal(before[n], v) for n, v in _values(targets).items())
  # Another model's names.
  other = {
    "decoder/block_000/layer_000/SelfAttention/q": _var(np.zeros([8, 4])),
    "transformer/block_000/layer_000/SelfAttention/q": _var(np.ones([8, 4])),
  }
  with pytest.raises(
    ValueError,
    match=r"model\.ckpt-5.*lacks 2 of its 2.*"
    r"decoder/block_000/layer_000/SelfAttention/q",
  ):
    checkpoint_restore.restore(model_dir, other)
  np.testing.assert_array_equal(
    other["transformer/block_000/layer_000/SelfAttention/q"].numpy(), 1.0
  )
  assert {
    f: open(os.path.join(model_dir, f), "rb").read()
    for f in _dir_files(model_dir)
  } == files


def test_restore_allow_missing_restores_the_rest(tmp_path):
  checkpoints.save(str(tmp_path), 1, {"a": _var([1.0, 2.0])})
  targets = {"a": _var([0.0, 0.0]), "new": _var([9.0])}
  assert checkpoint_restore.restore(
    str(tmp_path), targets, allow_missing=True
  ) == ["a"]
  np.testing.assert_array_equal(targets["a"].numpy(), [1.0, 2.0])
  np.testing.assert_array_equal(targets["new"].numpy(), [9.0])


def test_corrupt_index_is_a_value_error_naming_the_checkpoint(tmp_path):
  model_dir = str(tmp_path)
  checkpoints.save(model_dir, 3, {"a": _var([1.0, 2.0])})
  index = os.path.join(model_dir, "model.ckpt-3.index")
  with open(index, "wb") as f:
    f.write(b"this is not an sstable" * 4)
  target = {"a": _var([5.0, 5.0])}
  with pytest.raises(ValueError, match=r"model\.ckpt-3.*corrupt"):
    checkpoint_restore.restore(model_dir, target)
  np.testing.assert_array_equal(target["a"].numpy(), [5.0, 5.0])
  assert open(index, "rb").read() == b"this is not an sstable" * 4


def test_corrupt_data_is_a_value_error_and_changes_nothing(tmp_path):
  model_dir = str(tmp_path)
  checkpoints.save(
    model_dir, 3, {"a": _var(np.arange(64.0)), "b": _var(np.arange(64.0))}
  )
  data = os.path.join(model_dir, "model.ckpt-3.data-00000-of-00001")
  with open(data, "r+b") as f:
    f.truncate(100)  # "a" readable, "b" cut short
  target = {"a": _var(np.zeros(64)), "b": _var(np.zeros(64))}
  with pytest.raises(ValueError, match=r"model\.ckpt-3"):
    checkpoint_restore.restore(model_dir, target)
  assert not target["a"].numpy().any() and not target["b"].numpy().any()


def test_missing_checkpoint_errors_name_the_path(tmp_path):
  with pytest.raises(ValueError, match=r"no checkpoint in directory .*empty"):
    tmp_empty = tmp_path / "empty"
    tmp_empty.mkdir()
    checkpoint_restore.restore(str(tmp_empty), {"a": _var([1.0])})
  with pytest.raises(ValueError, match=r"model\.ckpt-9 not found"):
    checkpoint_restore.restore(
      str(tmp_path / "model.ckpt-9"), {"a": _var([1.0])}
    )


def test_corrupt_state_file_is_an_error_and_save_writes_nothing(tmp_path):
  model_dir = str(tmp_path)
  checkpoints.save(model_dir, 1, {"a": _var([1.0])})
  state = os.path.join(model_dir, "checkpoint")
  with open(state, "w") as f:
    f.write("garbage without a colon\n")
  with pytest.raises(ValueError, match=r"checkpoint state file .*checkpoint"):
    checkpoints.latest_checkpoint(model_dir)
  with pytest.raises(ValueError, match=r"checkpoint state file"):
    checkpoints.save(model_dir, 2, {"a": _var([2.0])})
  assert _dir_files(model_dir) == [
    "checkpoint",
    "model.ckpt-1.data-00000-of-00001",
    "model.ckpt-1.index",
  ]


def test_save_rejects_bad_arguments(tmp_path):
  model_dir = str(tmp_path / "m")
  with pytest.raises(ValueError, match="no variables"):
    checkpoints.save(model_dir, 1, {})
  with pytest.raises(ValueError, match="step must be >= 0"):
    checkpoints.save(model_dir, -1, {"a": _var([1.0])})
  with pytest.raises(ValueError, match="keep_checkpoint_max"):
    checkpoints.save(model_dir, 1, {"a": _var([1.0])}, keep_checkpoint_max=-2)
  with pytest.raises(ValueError, match="'a' is a .*not a tf.Variable"):
    checkpoints.save(model_dir, 1, {"a": tf.constant([1.0])})
  variables = {"a": _var([1.0])}

  @tf.function
  def in_graph():
    checkpoints.save(model_dir, 1, variables)
    return 0

  with pytest.raises(ValueError, match="runs eagerly"):
    in_graph()
  assert not os.path.exists(os.path.join(model_dir, "checkpoint"))


# ----------------------------------------------------------------------------
# Rotation and atomicity.


@pytest.mark.parametrize(
  "keep,expected_steps",
  [(None, [1, 2, 3, 4, 5]), (0, [1, 2, 3, 4, 5]), (1, [5]), (2, [4, 5])],
)
def test_rotation_deletes_the_oldest_never_the_latest(
  tmp_path, keep, expected_steps
):
  model_dir = str(tmp_path)
  var = _var(0.0)
  for step in range(1, 6):
    var.assign(float(step))
    checkpoints.save(model_dir, step, {"v": var}, keep_checkpoint_max=keep)
  assert checkpoints.checkpoint_steps(model_dir) == expected_steps
  assert [
    utils.get_step_from_checkpoint_path(p)
    for p in checkpoints.all_checkpoints(model_dir)
  ] == expected_steps
  assert len(_dir_files(model_dir)) == 1 + 2 * len(expected_steps)
  target = {"v": _var(-1.0)}
  checkpoint_restore.restore(model_dir, target)
  assert float(target["v"].numpy()) == 5.0


def test_saving_the_same_step_again_replaces_it(tmp_path):
  model_dir = str(tmp_path)
  var = _var([1.0, 2.0])
  checkpoints.save(model_dir, 4, {"v": var}, keep_checkpoint_max=1)
  var.assign([3.0, 4.0])
  checkpoints.save(model_dir, 4, {"v": var}, keep_checkpoint_max=1)
  assert checkpoints.all_checkpoints(model_dir) == [model_dir + "/model.ckpt-4"]
  target = {"v": _var([0.0, 0.0])}
  checkpoint_restore.restore(model_dir, target)
  np.testing.assert_array_equal(target["v"].numpy(), [3.0, 4.0])


class _Crash(Exception):
  pass


def test_crash_before_the_state_update_keeps_the_previous_latest(
  tmp_path, monkeypatch
):
  model_dir = str(tmp_path)
  var = _var([1.0, 1.0])
  checkpoints.save(model_dir, 10, {"v": var}, keep_checkpoint_max=1)

  def crash(*unused_args, **unused_kwargs):
    raise _Crash()

  monkeypatch.setattr(checkpoints, "_write_state", crash)
  var.assign([2.0, 2.0])
  with pytest.raises(_Crash):
    checkpoints.save(model_dir, 20, {"v": var}, keep_checkpoint_max=1)
  monkeypatch.undo()
  # The new bundle is complete but not latest; nothing was rotated away.
  assert checkpoints.checkpoint_steps(model_dir) == [10, 20]
  assert (
    checkpoints.latest_checkpoint(model_dir) == model_dir + "/model.ckpt-10"
  )
  target = {"v": _var([0.0, 0.0])}
  checkpoint_restore.restore(model_dir, target)
  np.testing.assert_array_equal(target["v"].numpy(), [1.0, 1.0])


def test_crash_while_writing_tensors_keeps_the_previous_latest(
  tmp_path, monkeypatch
):
  model_dir = str(tmp_path)
  var = _var([1.0, 1.0])
  checkpoints.save(model_dir, 10, {"v": var})
  write_bundle = checkpoints._write_bundle

  def write_then_crash(prefix, names, variables):
    write_bundle(prefix, names, variables)
    raise _Crash()

  monkeypatch.setattr(checkpoints, "_write_bundle", write_then_crash)
  var.assign([2.0, 2.0])
  with pytest.raises(_Crash):
    checkpoints.save(model_dir, 20, {"v": var})
  monkeypatch.undo()
  leftovers = [f for f in _dir_files(model_dir) if f.startswith(".ckpt-tmp-")]
  assert len(leftovers) == 1
  assert checkpoints.checkpoint_steps(model_dir) == [10]
  assert (
    checkpoints.latest_checkpoint(model_dir) == model_dir + "/model.ckpt-10"
  )
  assert tf.train.latest_checkpoint(model_dir) == model_dir + "/model.ckpt-10"
  # The next save clears the leftovers.
  checkpoints.save(model_dir, 30, {"v": var})
  assert _dir_files(model_dir) == [
    "checkpoint",
    "model.ckpt-10.data-00000-of-00001",
    "model.ckpt-10.index",
    "model.ckpt-30.data-00000-of-00001",
    "model.ckpt-30.index",
  ]


@pytest.mark.parametrize("crash_on", [".data-", ".index"])
def test_crash_while_moving_files_leaves_no_new_index(
  tmp_path, monkeypatch, crash_on
):
  """Data is renamed first, the index last: a bundle whose index exists is
  complete, and a crash mid-move leaves the previous latest in place.
  """
  model_dir = str(tmp_path)
  var = _var([1.0])
  checkpoints.save(model_dir, 1, {"v": var})
  real_rename = tf.io.gfile.rename

  def rename_or_crash(src, dst, overwrite=False):
    if crash_on in _basename_of(dst) and "model.ckpt-2" in dst:
      raise _Crash()
    real_rename(src, dst, overwrite=overwrite)

  monkeypatch.setattr(checkpoints.gfile, "rename", rename_or_crash)
  with pytest.raises(_Crash):
    checkpoints.save(model_dir, 2, {"v": var})
  monkeypatch.undo()
  assert checkpoints.checkpoint_steps(model_dir) == [1]
  assert checkpoints.latest_checkpoint(model_dir) == model_dir + "/model.ckpt-1"


def _basename_of(path):
  return path.rsplit("/", 1)[-1]


# ----------------------------------------------------------------------------
# init_checkpoint.


def test_init_from_checkpoint_with_filter_mapping_and_should_load(tmp_path):
  model_dir = str(tmp_path)
  source = _rng_vars(0, SMALL)
  source["encoder/block_000/layer_000/SelfAttention/q_slot_vr"] = _var(
    np.ones([4])
  )
  checkpoints.save(model_dir, 100, source)
  # The new model renamed its encoder tower "transformer".
  names = {
    "transformer/block_000/layer_000/SelfAttention/q": [8, 4],
    "transformer/block_001/layer_000/SelfAttention/q": [8, 4],
    "decoder/block_000/layer_001/DenseReluDense/wi/kernel": [8, 16],
    "shared/embedding": [128, 8],
    "transformer/block_000/layer_000/SelfAttention/q_slot_vr": [4],
  }
  targets = _rng_vars(1, names)
  before = _values(targets)

  def mapping(name):
    return name.replace("transformer/", "encoder/")

  loaded = checkpoint_restore.init_from_checkpoint(
    model_dir,
    targets,
    variable_filter=r"^encoder/|embedding$",
    name_mapping=mapping,
    should_load=lambda name: "_slot_" not in name and "block_001" not in name,
  )
  assert loaded == {
    "transformer/block_000/layer_000/SelfAttention/q": "encoder/block_000/layer_000/SelfAttention/q",
    "shared/embedding": "shared/embedding",
  }
  after = _values(targets)
  for name in names:
    if name in loaded:
      np.testing.assert_array_equal(
        after[name], source[loaded[name]].numpy(), err_msg=name
      )
    else:
      np.testing.assert_array_equal(after[name], before[name], err_msg=name)


def test_init_from_checkpoint_errors(tmp_path):
  checkpoints.save(str(tmp_path), 1, {"w": _var(np.zeros([2, 3]))})
  target = {"w": _var(np.ones([3, 2])), "u": _var([1.0])}
  with pytest.raises(
    ValueError,
    match=r"model\.ckpt-1.*w: checkpoint shape "
    r"\[2, 3\], variable shape \[3, 2\]",
  ):
    checkpoint_restore.init_from_checkpoint(str(tmp_path), target)
  np.testing.assert_array_equal(target["w"].numpy(), np.ones([3, 2]))
  with pytest.raises(ValueError, match="bad variable_filter regex"):
    checkpoint_restore.init_from_checkpoint(str(tmp_path), target, "(")
  # Everything filtered out: nothing loaded, no error.
  assert (
    checkpoint_restore.init_from_checkpoint(str(tmp_path), target, "^x") == {}
  )


def test_flexible_ckpt_init_mapping_skips_new_blocks(tmp_path):
  model_dir = str(tmp_path)
  ckpt = {
    "decoder/block_%03d/layer_000/SelfAttention/q" % b: _var(
      np.full([2], float(b))
    )
    for b in range(3)
  }
  ckpt["decoder/rms_norm/scale"] = _var([7.0])
  ckpt["encoder/block_000/layer_001/DenseReluDense/wi/kernel"] = _var([8.0])
  checkpoints.save(model_dir, 1, ckpt)
  fn = checkpoint_names.flexible_ckpt_init_mapping(
    new_layers={"decoder": [1, 3]}
  )
  assert fn("decoder/block_000/layer_000/SelfAttention/q") == (
    "decoder/block_000/layer_000/SelfAttention/q"
  )
  assert fn("decoder/block_001/layer_000/SelfAttention/q") is None
  assert fn("decoder/block_002/layer_000/SelfAttention/q_slot_vr") == (
    "decoder/block_001/layer_000/SelfAttention/q_slot_vr"
  )
  assert fn("decoder/block_004/layer_000/SelfAttention/q") == (
    "decoder/block_002/layer_000/SelfAttention/q"
  )
  assert fn("encoder/block_001/layer_001/DenseReluDense/wi/kernel") == (
    "encoder/block_001/layer_001/DenseReluDense/wi/kernel"
  )
  assert fn("decoder/rms_norm/scale") == "decoder/rms_norm/scale"
  flat = checkpoint_names.flexible_ckpt_init_mapping(new_layers=[0])
  assert flat("transformer/layer_002/DenseReluDense/wo/kernel") == (
    "transformer/layer_001/DenseReluDense/wo/kernel"
  )
  assert flat("block_001/layer_000/x") == "block_000/layer_000/x"
  as_dict = checkpoint_names.flexible_ckpt_init_mapping(
    model_dir, new_layers={"decoder": [1, 3]}, return_mapping_fn=False
  )
  assert as_dict == {
    "decoder/block_000/layer_000/SelfAttention/q": "decoder/block_000/layer_000/SelfAttention/q",
    "decoder/block_002/layer_000/SelfAttention/q": "decoder/block_001/layer_000/SelfAttention/q",
    "decoder/block_004/layer_000/SelfAttention/q": "decoder/block_002/layer_000/SelfAttention/q",
    "decoder/rms_norm/scale": "decoder/rms_norm/scale",
    "encoder/block_000/layer_001/DenseReluDense/wi/kernel": "encoder/block_000/layer_001/DenseReluDense/wi/kernel",
  }
  # End to end: a 5-block decoder initialised from the 3-block one.
  model = {
    "decoder/block_%03d/layer_000/SelfAttention/q" % b: _var([-1.0, -1.0])
    for b in range(5)
  }
  checkpoint_restore.init_from_checkpoint(model_dir, model, name_mapping=fn)
  assert [
    float(model["decoder/block_%03d/layer_000/SelfAttention/q" % b].numpy()[0])
    for b in range(5)
  ] == [0.0, -1.0, 1.0, -1.0, 2.0]
  with pytest.raises(ValueError, match="ckpt_path is required"):
    checkpoint_names.flexible_ckpt_init_mapping(return_mapping_fn=False)


# ----------------------------------------------------------------------------
# Mesh independence.

BATCH, D_IN, HIDDEN, D_OUT = 4, 8, 16, 8
X = np.random.RandomState(7).randn(BATCH, D_IN).astype(np.float32)
MLP_DTYPE = mtf.VariableDType(tf.bfloat16, tf.float32, tf.float32)


def _mlp(mesh, step=False):
  """relu(x w1 + b) w2 with a bf16-master w1; `step` adds w <- 0.5 w + 0.1."""
  batch = mtf.Dimension("batch", BATCH)
  d_in, hidden = mtf.Dimension("d_in", D_IN), mtf.Dimension("hidden", HIDDEN)
  d_out = mtf.Dimension("d_out", D_OUT)
  init = tf.compat.v1.random_normal_initializer(stddev=0.5)
  with tf.compat.v1.variable_scope("mlp"):
    w1 = mtf.get_variable(
      mesh, "w1", [d_in, hidden], initializer=init, dtype=MLP_DTYPE
    )
    b = mtf.get_variable(mesh, "b", [hidden], initializer=init)
    w2 = mtf.get_variable(mesh, "w2", [hidden, d_out], initializer=init)
  if step:
    return [mtf.assign(w, w * 0.5 + 0.1) for w in (w1, b, w2)]
  x = mtf.import_fully_replicated(mesh, tf.constant(X), [batch, d_in])
  h = mtf.relu(mtf.einsum([x, w1], output_shape=[batch, hidden]) + b)
  return [mtf.einsum([h, w2], output_shape=[batch, d_out])]


def _lower(store, build_fn, mesh_shape, layout):
  with mtf.variable_store(store):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    outputs = build_fn(mesh)
    lowering = mtf.Lowering(
      graph, {mesh: mtu.mesh_impl_for(mesh_shape, layout)}
    )
    return lowering, outputs


def _run(store, build_fn, mesh_shape, layout):
  lowering, outputs = _lower(store, build_fn, mesh_shape, layout)
  return [
    lowering.export_to_tf_tensor(t).numpy()
    for t in outputs
    if isinstance(t, mtf.Tensor)
  ]


@pytest.mark.parametrize(
  "mesh_shape,layout",
  [("all:4", "hidden:all"), ("all:4", "d_in:all;d_out:all"), ("", "")],
)
def test_restore_mtf_program_on_another_mesh(tmp_path, mesh_shape, layout):
  """Step on 2x2 (slices updated), sync to masters, save; restore in a fresh
  store on another mesh: same outputs (1e-6) and the checkpoint's values.
  """
  mtu.skip_under_simd("placement lowering in eager mode")
  store_a = mtf.VariableStore()
  mesh_a, layout_a = "rows:2;cols:2", "batch:rows;hidden:cols"
  lowering, _ = _lower(
    store_a, lambda m: _mlp(m, step=True), mesh_a, layout_a
  )  # eager: the assignments ran
  lowering.copy_slices_to_masters()
  step = tf.Variable(tf.constant(1, tf.int64))
  path = checkpoints.save(
    str(tmp_path), 1, dict(store_a.masters, global_step=step)
  )
  # The f32 slices of the bf16 master w1 now hold more precision than the
  # checkpoint; re-slice from the masters, as a restore does.
  lowering.copy_masters_to_slices()
  (y_a,) = _run(store_a, _mlp, mesh_a, layout_a)
  assert dict(tf.train.list_variables(path)) == {
    "global_step": [],
    "mlp/w1": [D_IN, HIDDEN],
    "mlp/b": [HIDDEN],
    "mlp/w2": [HIDDEN, D_OUT],
  }
  assert (
    tf.train.load_checkpoint(path).get_variable_to_dtype_map()["mlp/w1"]
    == tf.bfloat16
  )
  reader = tf.train.load_checkpoint(path)
  params = {
    n: np.asarray(reader.get_tensor(n)).astype(np.float32)
    for n in ("mlp/w1", "mlp/b", "mlp/w2")
  }
  expected = (
    np.maximum(X @ params["mlp/w1"] + params["mlp/b"], 0) @ params["mlp/w2"]
  )
  np.testing.assert_allclose(y_a, expected, rtol=1e-5, atol=1e-5)

  store_b = mtf.VariableStore()
  lowering_b, _ = _lower(store_b, _mlp, mesh_shape, layout)  # slices exist
  (y_fresh,) = _run(store_b, _mlp, mesh_shape, layout)
  assert not np.allclose(y_fresh, y_a, atol=1e-3)
  restored = checkpoint_restore.restore(path, store_b.masters)
  assert restored == ["mlp/b", "mlp/w1", "mlp/w2"]
  lowering_b.copy_masters_to_slices()
  (y_b,) = _run(store_b, _mlp, mesh_shape, layout)
  np.testing.assert_allclose(y_b, y_a, rtol=1e-6, atol=1e-6)


# A T5-shaped tiny Bitransformer, master dtype from utils.get_variable_dtype.
T5_GIN = """
make_layer_stack.num_layers = 2
encoder/make_layer_stack.layers = [
    @transformer_layers.SelfAttention, @transformer_layers.DenseReluDense]
decoder/make_layer_stack.layers = [
    @transformer_layers.SelfAttention, @transformer_layers.EncDecAttention,
    @transformer_layers.DenseReluDense]
Unitransformer.d_model = 8
Unitransformer.max_length = 4
Unitransformer.positional_embedding = False
transformer_layers.SelfAttention.num_heads = 4
transformer_layers.SelfAttention.key_value_size = 2
transformer_layers.SelfAttention.relative_attention_type = "bias_shared"
transformer_layers.EncDecAttention.num_heads = 4
transformer_layers.EncDecAttention.key_value_size = 2
transformer_layers.DenseReluDense.hidden_size = 12
transformer_layers.DenseReluDense.dropout_rate = 0.0
"""
VOCAB, T_BATCH, T_LENGTH = 20, 2, 4
IDS = np.random.RandomState(11).randint(1, VOCAB, size=(2, T_BATCH, T_LENGTH))


def _t5_loss(mesh, mesh_shape, layout):
  model = bitransformer.make_bitransformer(
    input_vocab_size=VOCAB,
    output_vocab_size=VOCAB,
    mesh_shape=mesh_shape,
    layout=layout,
  )
  dims = [mtf.Dimension("batch", T_BATCH), mtf.Dimension("length", T_LENGTH)]
  inputs, targets = (
    mtf.import_fully_replicated(
      mesh, tf.constant(ids, tf.int32), mtf.Shape(dims)
    )
    for ids in IDS
  )
  _, loss = model.call_simple(
    inputs,
    targets,
    compute_loss=True,
    mode="eval",
    variable_dtype=utils.get_variable_dtype(),
  )
  return [loss]


def test_transformer_checkpoint_names_dtypes_and_other_meshes(tmp_path):
  mtu.skip_under_simd("placement lowering in eager mode")
  gin.clear_config()
  gin.parse_config(T5_GIN)
  try:
    store_a = mtf.VariableStore()
    mesh_a, layout_a = "b:2;m:2", "batch:b;heads:m;d_ff:m"
    (loss_a,) = _run(
      store_a, lambda m: _t5_loss(m, mesh_a, layout_a), mesh_a, layout_a
    )
    path = checkpoints.save(
      str(tmp_path),
      0,
      dict(store_a.masters, global_step=tf.Variable(tf.constant(0, tf.int64))),
    )
    listed = dict(tf.train.list_variables(path))
    dtypes = tf.train.load_checkpoint(path).get_variable_to_dtype_map()
    assert listed["shared/embedding"] == [128, 8]  # vocab padded to 128
    assert listed["encoder/block_000/layer_000/SelfAttention/q"] == [8, 8]
    assert listed[
      "encoder/block_000/layer_000/SelfAttention/relative_attention_bias"
    ] == [4, 32]
    assert listed["decoder/block_001/layer_001/EncDecAttention/o"] == [8, 8]
    assert listed["decoder/block_001/layer_002/DenseReluDense/wi/kernel"] == [
      8,
      12,
    ]
    assert listed["decoder/rms_norm/scale"] == [8]
    assert not any("_slice_" in n for n in listed)
    assert {dtypes[n] for n in listed if n != "global_step"} == {tf.bfloat16}
    assert listed.keys() == set(store_a.masters) | {"global_step"}

    for mesh_b, layout_b in [("all:4", "heads:all;d_ff:all"), ("", "")]:
      store_b = mtf.VariableStore()
      lowering_b, (fresh,) = _lower(
        store_b,
        lambda m, s=mesh_b, l=layout_b: _t5_loss(m, s, l),
        mesh_b,
        layout_b,
      )
      assert abs(lowering_b.export_to_tf_tensor(fresh).numpy() - loss_a) > 1e-3
      checkpoint_restore.restore(path, store_b.masters)
      lowering_b.copy_masters_to_slices()
      (loss_b,) = _run(
        store_b,
        lambda m, s=mesh_b, l=layout_b: _t5_loss(m, s, l),
        mesh_b,
        layout_b,
      )
      np.testing.assert_allclose(
        loss_b,
        loss_a,
        rtol=1e-5,
        atol=1e-5,
        err_msg="mesh %r layout %r" % (mesh_b, layout_b),
      )
  finally:
    gin.clear_config()
