"""Tests for mesh_tensorflow.experimental.model_executor (and offline_data_aug).

The TF2 train/eval loop on a 2x2 mesh of virtual CPUs: a few steps lower the
training loss on synthetic volumes, checkpoints hold the full variables under
their mtf names and a second run resumes from them, evaluation saves the
predictions and scores them, and summaries are written. offline_data_aug
writes augmented records that the U-Net's pipeline reads, also from its
command line.
"""

import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from mesh_tensorflow.experimental import model_executor
from mesh_tensorflow.experimental import offline_data_aug
from mesh_tensorflow.experimental import unet
from tests.experimental import unet_test

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))


def write_volumes(directory, count=4, reso=8):
  images, labels = unet_test.synthetic_volumes(count, reso, seed=2)
  # Stored as raw intensities (the eval pipeline maps x -> x / 1024 + 0.5).
  for i, (image, label) in enumerate(zip(images, labels)):
    offline_data_aug.save_to_tfrecord(
      (image - 0.5) * 1024.0, label, 0, i, str(directory), "scan"
    )
  return str(directory / "scan-0-*.tfrecords")


def train(root, **changes):
  pattern = str(root / "scan-0-*.tfrecords")
  hparams = unet.Hparams(
    **{
      **vars(unet_test.HPARAMS),
      "with_batch_norm": False,
      "layout": "image_nx_block:rows;image_ny_block:columns",
      "train_file_pattern": pattern,
      "eval_file_pattern": pattern,
      "n_dataset_read_interleave": 1,
    }
  )
  options = model_executor.ExecutorOptions(
    **{
      **dict(
        use_tpu=False,
        lr=0.05,
        num_train_iterations_per_loop=6,
        num_eval_iterations_per_loop=2,
        num_training_loops=1,
        mesh_shape="rows:2, columns:2",
        checkpoint_dir=str(root / "ckpt"),
        save_checkpoints_steps=4,
        summary_dir=str(root / "summaries"),
        pred_output_dir=str(root / "preds"),
      ),
      **changes,
    }
  )
  return model_executor.run(options, hparams)


@pytest.mark.slow
def test_train_checkpoint_evaluate_and_resume(tmp_path):
  write_volumes(tmp_path)
  history = train(tmp_path)

  # A few steps lower the loss.
  losses = history["train_loss"]
  assert len(losses) == 6 and all(np.isfinite(losses))
  assert np.mean(losses[-2:]) < np.mean(losses[:2])

  # Checkpoints at steps 4 and 6 hold the full variables under mtf names.
  checkpoint_dir = str(tmp_path / "ckpt")
  latest = tf.train.latest_checkpoint(checkpoint_dir)
  assert latest.endswith("model.ckpt-6")
  names = dict(tf.train.list_variables(latest))
  # The full kernel [fd, fh, fw, in, out], not a slice.
  assert names["conv_down_0_0/kernel"] == [3, 3, 3, 1, 2]
  assert names["global_step"] == []
  steps = sorted(
    int(p.split("-")[-1].split(".")[0])
    for p in os.listdir(checkpoint_dir)
    if p.startswith("model.ckpt-") and p.endswith(".index")
  )
  assert steps == [4, 6]

  # Evaluation: 2 steps x 2 volumes of liver, lesion and label cubes of
  # (8 / 2)^3, scored; summaries written.
  assert len(history["eval_loss"]) == 2
  saved = sorted(os.listdir(tmp_path / "preds"))
  assert len(saved) == 12
  assert np.load(tmp_path / "preds" / saved[0]).shape == (4, 4, 4)
  assert len(history["dice_global"]) == 1
  assert 0.0 <= history["dice_global"][0] <= 1.0
  assert os.listdir(tmp_path / "summaries")

  # A second run resumes from step 6 (not from scratch).
  again = train(
    tmp_path,
    num_train_iterations_per_loop=1,
    num_eval_iterations_per_loop=0,
    summary_dir="",
  )
  assert tf.train.latest_checkpoint(checkpoint_dir).endswith("model.ckpt-7")
  assert again["train_loss"][0] < np.mean(losses[:2])


def test_mesh_context_places_processors_on_local_devices():
  context = model_executor.MeshContext(
    None, False, "rows:2, columns:2", unet.get_layout()
  )
  mesh_impl = context.mesh_impl
  assert [d[-5:] for d in mesh_impl.devices] == [
    "CPU:0",
    "CPU:1",
    "CPU:2",
    "CPU:3",
  ]
  graph, mesh, impl = context.create_graph_mesh_and_mesh_impl()
  assert mesh.graph is graph and impl.shape == mesh_impl.shape
  assert context.device_assignment is None and context.num_cores is None
  with pytest.raises(NotImplementedError, match="transformer.main --tpu"):
    model_executor.run(model_executor.ExecutorOptions(use_tpu=True))


def test_offline_data_aug_writes_augmented_records(tmp_path):
  # Synthetic lesions need 32 voxels or more (blobs of reso // 32).
  pattern = write_volumes(tmp_path, count=2, reso=32)
  out = tmp_path / "out"
  paths = offline_data_aug.augment(
    offline_data_aug.Options(
      input_file_pattern=pattern,
      output_folder=str(out),
      ct_resolution=32,
      num_data_aug=3,
      process_no=5,
      gen_fake_probability=1.0,
    )
  )
  assert [os.path.basename(p) for p in paths] == [
    "augmented-5-0.tfrecords",
    "augmented-5-1.tfrecords",
    "augmented-5-2.tfrecords",
  ]
  with unet.hparams_scope(
    unet_test.HPARAMS,
    ct_resolution=32,
    eval_file_pattern=str(out / "*.tfrecords"),
  ):
    dataset = unet.get_dataset_creator("eval")()
  for image, label in dataset.take(3):
    assert image.shape == (4, 8, 2, 16, 32, 1)
    assert np.all(np.sum(label, axis=-1) == 1.0)  # valid one-hot classes


@pytest.mark.slow
def test_offline_data_aug_command_line(tmp_path):
  pattern = write_volumes(tmp_path, count=1, reso=32)
  out = tmp_path / "cli"
  result = subprocess.run(
    [
      sys.executable,
      "-m",
      "mesh_tensorflow.experimental.offline_data_aug",
      "--input_file_pattern=" + pattern,
      "--output_folder=" + str(out),
      "--ct_resolution=32",
      "--num_data_aug=2",
      "--process_no=1",
    ],
    cwd=_REPO,
    env={**os.environ, "PYTHONPATH": _REPO},
    capture_output=True,
    text=True,
    timeout=300,
    check=False,
  )
  assert result.returncode == 0, result.stderr[-2000:]
  assert sorted(os.listdir(out)) == [
    "augmented-1-0.tfrecords",
    "augmented-1-1.tfrecords",
  ]


def test_flags_carry_the_original_names_and_defaults():
  from absl import flags  # pylint: disable=g-import-not-at-top

  flag_values = flags.FlagValues()
  model_executor.define_flags(flag_values)
  offline_data_aug.define_flags(flag_values)  # shares ct_resolution
  flag_values(["executor", "--use_tpu=false", "--ct_resolution=32"])
  options = model_executor.ExecutorOptions.from_flags(flag_values)
  assert options == model_executor.ExecutorOptions(use_tpu=False)
  assert options.mesh_shape == "rows:4, columns:4, cores:2"
  assert unet.Hparams.from_flags(flag_values).ct_resolution == 32
  assert flag_values["process_no"].default is None
  assert flag_values["output_file_prefix"].default == "augmented"
