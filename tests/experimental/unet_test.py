"""Tests for mesh_tensorflow.experimental.unet.

The U-Net on synthetic volumes gives the same loss, metrics and predictions
on one device as with its spatial blocks split over a 2x2 mesh, a 1-d mesh
of 4, or the batch and one block dimension (placement meshes, and a SIMD
mesh of 4). The input pipeline reads what offline_data_aug writes.
"""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.experimental import offline_data_aug
from mesh_tensorflow.experimental import unet
from tests import mesh_test_util

# 2 volumes of 8^3 voxels as 4 x-blocks and 2 y-blocks; 2 levels.
HPARAMS = unet.Hparams(
  ct_resolution=8,
  batch_size_train=2,
  batch_size_eval=2,
  image_nx_block=4,
  image_ny_block=2,
  n_base_filters=2,
  network_depth=2,
  n_conv_per_block=1,
  dropout_keep_p=1.0,
  mtf_dtype="float32",
)

MESHES = [
  ("", ""),
  ("rows:2;columns:2", "image_nx_block:rows;image_ny_block:columns"),
  ("all:4", "image_nx_block:all"),
  ("rows:2;columns:2", "batch:rows;image_ny_block:columns"),
]


def synthetic_volumes(count, reso, seed=0):
  """Images with a bright liver ball holding a dark lesion, and labels."""
  rng = np.random.RandomState(seed)
  grid = np.stack(np.meshgrid(*[np.arange(reso)] * 3, indexing="ij"), -1)
  images, labels = [], []
  for _ in range(count):
    centre = rng.uniform(reso * 0.35, reso * 0.65, size=3)
    distance = np.linalg.norm(grid - centre, axis=-1)
    label = np.where(distance < reso * 0.35, 1.0, 0.0)
    label[distance < reso * 0.15] = 2.0
    image = 0.6 * (label == 1) + 0.2 * (label == 2)
    image = image + 0.05 * rng.randn(reso, reso, reso)
    images.append(image.astype(np.float32))
    labels.append(label.astype(np.float32))
  return np.stack(images), np.stack(labels)


def to_blocks(images, labels, hp):
  """The model's input layout: [batch, nx, sx, ny, sy, sz, c] + one-hot."""
  b, reso = images.shape[0], hp.ct_resolution
  blocks = [
    b,
    hp.image_nx_block,
    reso // hp.image_nx_block,
    hp.image_ny_block,
    reso // hp.image_ny_block,
    reso,
  ]
  one_hot = np.eye(hp.label_c, dtype=np.float32)[labels.astype(np.int64)]
  return images.reshape(blocks + [1]), one_hot.reshape(blocks + [hp.label_c])


def run_model(mesh_shape, layout, dataset_str, simd=False):
  images, labels = to_blocks(*synthetic_volumes(2, 8), HPARAMS)
  size = mtf.convert_to_shape(mesh_shape).size
  devices = ["/cpu:%d" % i for i in range(size)]

  def computation(image_slices, label_slices):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "my_mesh")
    preds, loss, metrics, _ = unet.unet_with_spatial_partition(
      mesh, mesh_impl, dataset_str, image_slices, label_slices
    )
    lowering = mtf.Lowering(graph, {mesh: mesh_impl})
    exported = [loss] + [metrics[k] for k in sorted(metrics)] + preds
    return [lowering.export_to_tf_tensor(t) for t in exported]

  with unet.hparams_scope(HPARAMS, layout=layout):
    image_shape, label_shape = unet.get_input_mtf_shapes(dataset_str)
    tf.random.set_seed(1)  # the same initial variables on every mesh
    with mtf.variable_store(mtf.VariableStore()):
      if simd:
        mesh_impl = mtf.simd_mesh_impl.SimdMeshImpl(
          mesh_shape, layout, devices=devices
        )

        def replica():
          return computation(
            [mesh_impl.slice(images, image_shape)],
            [mesh_impl.slice(labels, label_shape)],
          )

        outputs = tf.function(
          lambda: mesh_impl.replicate(replica), autograph=False
        )()[0]
      else:
        mesh_impl = mtf.placement_mesh_impl.PlacementMeshImpl(
          mesh_shape, layout, devices
        )
        outputs = computation(
          mesh_impl.make_slices(images, image_shape),
          mesh_impl.make_slices(labels, label_shape),
        )
  return [np.asarray(o) for o in outputs]


@pytest.fixture(scope="module")
def one_device_results():
  # unet_original_test runs the model in tf.compat.v1 graphs, on one device
  # and on a 2x2 mesh.
  mesh_test_util.skip_under_tf1("run_model runs the U-Net eagerly")
  return {mode: run_model("", "", mode) for mode in ("train", "eval")}


@pytest.mark.parametrize("dataset_str", ["train", "eval"])
@pytest.mark.parametrize(
  "mesh_shape,layout", MESHES[1:], ids=["2x2", "all4", "batch_rows"]
)
def test_same_results_on_every_mesh(
  one_device_results, mesh_shape, layout, dataset_str
):
  expected = one_device_results[dataset_str]
  got = run_model(mesh_shape, layout, dataset_str)
  assert np.isfinite(expected[0]) and expected[0] > 0
  for g, e in zip(got, expected):
    np.testing.assert_allclose(g, e, rtol=2e-4, atol=2e-5)


@pytest.mark.slow
def test_same_results_on_a_simd_mesh(one_device_results):
  mesh_shape, layout = MESHES[1]
  got = run_model(mesh_shape, layout, "train", simd=True)
  for g, e in zip(got, one_device_results["train"]):
    np.testing.assert_allclose(g, e, rtol=2e-4, atol=2e-5)


def test_prediction_shapes(one_device_results):
  preds = one_device_results["eval"][10:]
  # liver, lesion and ground-truth lesion, downsampled by 2; per-case terms.
  for pred in preds[:3]:
    assert pred.shape == (2, 4, 2, 1, 2, 4)
  assert preds[3].shape == preds[4].shape == (2,)
  assert np.all((preds[0] >= 0) & (preds[0] <= 1))


def test_dataset_reads_offline_records(tmp_path):
  images, labels = synthetic_volumes(3, 8, seed=1)
  for i, (image, label) in enumerate(zip(images, labels)):
    offline_data_aug.save_to_tfrecord(image, label, 0, i, str(tmp_path), "v")
  pattern = str(tmp_path / "v-0-*.tfrecords")
  with unet.hparams_scope(
    HPARAMS, eval_file_pattern=pattern, train_file_pattern=pattern
  ):
    image_shape, label_shape = unet.get_input_mtf_shapes("eval")
    eval_ds = unet.get_dataset_creator("eval")()
    train_ds = unet.get_dataset_creator("train")()
  got = list(eval_ds.take(3).as_numpy_iterator())
  expected_images, expected_labels = to_blocks(
    np.clip(images / 1024.0 + 0.5, 0, 1), labels, HPARAMS
  )
  for (image, label), e_image, e_label in zip(
    got, expected_images, expected_labels
  ):
    assert image.shape == tuple(image_shape.to_integer_list[1:])
    assert label.shape == tuple(label_shape.to_integer_list[1:])
    np.testing.assert_allclose(image, e_image, rtol=1e-6)
    np.testing.assert_array_equal(label, e_label)
  # Training examples are flipped/rotated copies: same voxel multiset.
  image, label = next(iter(train_ds))
  assert image.shape == tuple(image_shape.to_integer_list[1:])
  assert any(
    np.allclose(np.sort(image.numpy().ravel()), np.sort(v.ravel()))
    for v in images
  )


def test_flags_carry_the_original_names_and_defaults():
  from absl import flags  # pylint: disable=g-import-not-at-top

  flag_values = flags.FlagValues()
  unet.define_flags(flag_values)
  flag_values(["unet", "--ct_resolution=64", "--layout=batch:all"])
  hp = unet.Hparams.from_flags(flag_values)
  assert hp == unet.Hparams(ct_resolution=64, layout="batch:all")
  assert flag_values["mtf_dtype"].default == "bfloat16"
  assert flag_values["n_base_filters"].default == 32


def test_bad_dataset_str():
  with pytest.raises(ValueError, match="'train' or 'eval'"):
    unet.get_input_mtf_shapes("test")


def run_2d(mesh_shape, layout):
  """The 2-D model (sampled_2d_slices) on random slices: loss and metrics."""
  hp = unet.Hparams(**{**vars(HPARAMS), "sampled_2d_slices": True})
  rng = np.random.RandomState(3)
  with unet.hparams_scope(hp, layout=layout):
    image_shape, label_shape = unet.get_input_mtf_shapes("train")
    images = rng.rand(*image_shape.to_integer_list).astype(np.float32)
    classes = rng.randint(0, 3, size=label_shape.to_integer_list[:-1])
    labels = np.eye(3, dtype=np.float32)[classes]
    size = mtf.convert_to_shape(mesh_shape).size
    mesh_impl = mtf.placement_mesh_impl.PlacementMeshImpl(
      mesh_shape, layout, ["/cpu:%d" % i for i in range(size)]
    )
    tf.random.set_seed(1)
    with mtf.variable_store(mtf.VariableStore()):
      graph = mtf.Graph()
      mesh = mtf.Mesh(graph, "my_mesh")
      preds, loss, metrics, _ = unet.unet_with_spatial_partition(
        mesh,
        mesh_impl,
        "train",
        mesh_impl.make_slices(images, image_shape),
        mesh_impl.make_slices(labels, label_shape),
      )
      lowering = mtf.Lowering(graph, {mesh: mesh_impl})
      exported = [loss, metrics["accuracy_of_all_classes"], preds[1]]
      return image_shape, [
        np.asarray(lowering.export_to_tf_tensor(t)) for t in exported
      ]


def test_2d_slices_model_same_results_on_2x2():
  image_shape, expected = run_2d("", "")
  assert image_shape.to_integer_list == [2, 4, 2, 2, 4, 1]  # no z blocks
  _, got = run_2d(*MESHES[1])
  for g, e in zip(got, expected):
    np.testing.assert_allclose(g, e, rtol=2e-4, atol=2e-5)
