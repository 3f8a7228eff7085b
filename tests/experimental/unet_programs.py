"""The experimental U-Net run identically against this package and the original.

Each program builds `unet.unet_with_spatial_partition` (tiny: 8x8 CT
slices or 8x8x8 / 4x4x4 volumes in 2x2 blocks, 2 levels, 2 base filters,
float32 (and the default bfloat16), no dropout) from
fixed images and labels given as laid-out slices, as the original's
model_executor does, trains it as model_executor does (Adafactor at a
learning rate tensor, then the batch-norm updates) and runs it in a
tf.compat.v1 Session, on one device and on a 2x2 mesh with the original's
default layout.

The original read the U-Net's settings from absl flags defined by its unet
module; this package takes them from `unet.hparams_scope` (its entry points
define the same flags). `run_program` sets them whichever way the package
under test reads them, and otherwise calls the original's public API only.
It returns numpy arrays: the master variables' initial values under a fixed
graph seed ("init:<variable>"), then, from fixed values given to every
trainable variable in the order of sorted names, the loss, predictions and
eval metrics, the loss of each of three training steps ("step<k>:loss") and
every variable (Adafactor slots and batch-norm moving averages too) after
them ("final:<variable>"). data/make_unet_original.py stored what the
original computed; unet_original_test.py compares this package with it.
"""

import contextlib
from typing import Dict

import numpy as np
import tensorflow as tf

from tests.program_variables import set_master_values

tf1 = tf.compat.v1

TRAIN_STEPS = 3
GRAPH_SEED = 1234

# The U-Net's flags (names of the original's) for a tiny 2-d model.
SETTINGS = dict(
  sampled_2d_slices=True,
  ct_resolution=8,
  batch_size_train=2,
  batch_size_eval=2,
  image_nx_block=2,
  image_ny_block=2,
  image_c=1,
  label_c=3,
  pred_downsample=2,
  n_base_filters=2,
  network_depth=2,
  n_conv_per_block=2,
  with_batch_norm=True,
  dropout_keep_p=1.0,
  mtf_dtype="float32",
)

# The original's default layout (its "layout" flag) on a 1x2x2 mesh.
DEFAULT_LAYOUT = "batch:cores, image_nx_block:rows, image_ny_block:columns"
MESHES = {
  "one_device": ("", ""),
  "2x2": ("cores:1;rows:2;columns:2", DEFAULT_LAYOUT),
}

# name -> (mesh, changes to SETTINGS).
PROGRAMS = {
  "unet_2d_one_device": ("one_device", {}),
  "unet_2d_2x2": ("2x2", {}),
  "unet_2d_bfloat16_one_device": ("one_device", {"mtf_dtype": "bfloat16"}),
  "unet_3d_one_device": ("one_device", {"sampled_2d_slices": False}),
  "unet_3d_2x2": ("2x2", {"sampled_2d_slices": False, "ct_resolution": 4}),
}


@contextlib.contextmanager
def _settings(unet, settings):
  """The U-Net's settings in force: hparams_scope, or the original's flags."""
  if hasattr(unet, "hparams_scope"):
    with unet.hparams_scope(**settings):
      yield
    return
  flag_values = unet.FLAGS
  if not flag_values.is_parsed():
    flag_values(["unet_programs"])
  saved = {name: flag_values[name].value for name in settings}
  for name, value in settings.items():
    setattr(flag_values, name, value)
  try:
    yield
  finally:
    for name, value in saved.items():
      setattr(flag_values, name, value)


def _data(rng, settings):
  """Images [batch, x, y, (z,) c] and one-hot labels (label_c channels)."""
  size = settings["ct_resolution"]
  spatial = [size] * (2 if settings["sampled_2d_slices"] else 3)
  batch = [settings["batch_size_train"]]
  images = rng.normal(size=batch + spatial + [settings["image_c"]])
  classes = rng.randint(0, settings["label_c"], size=batch + spatial)
  labels = np.eye(settings["label_c"])[classes]
  return images.astype(np.float32), labels.astype(np.float32)


def _blocked(array, settings):
  """[batch, x, y, ...] as [batch, nx, sx, ny, sy, ...] (the input layout)."""
  nx, ny = settings["image_nx_block"], settings["image_ny_block"]
  b, x, y = array.shape[:3]
  return array.reshape([b, nx, x // nx, ny, y // ny] + list(array.shape[3:]))


def run_program(mtf, name: str) -> Dict[str, np.ndarray]:
  """Builds and runs PROGRAMS[name]; returns {output name: numpy array}.

  Args:
    mtf: the mesh_tensorflow package under test (this one or the original).
    name: the program.

  Returns:
    "init:<variable>" (on one device), "loss", "pred<i>" (the predictions),
    "metric:<name>" (the eval metrics), "step<k>:loss" (k = 0, 1, 2) and
    "final:<variable>".
  """
  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow.experimental import unet

  mesh_name, changes = PROGRAMS[name]
  settings = dict(SETTINGS, **changes)
  mesh_shape, layout = MESHES[mesh_name]
  rng = np.random.RandomState(sorted(PROGRAMS).index(name))
  images, labels = _data(rng, settings)
  graph = tf.Graph()
  with graph.as_default(), _settings(unet, settings):
    tf1.set_random_seed(GRAPH_SEED)
    global_step = tf1.train.get_or_create_global_step()
    mtf_graph = mtf.Graph()
    mesh = mtf.Mesh(mtf_graph, "unet_mesh")
    mesh_shape = mtf.convert_to_shape(mesh_shape)
    mesh_impl = mtf.placement_mesh_impl.PlacementMeshImpl(
      mesh_shape,
      mtf.convert_to_layout_rules(layout),
      [""] * mesh_shape.size,
    )
    image_shape, label_shape = unet.get_input_mtf_shapes("train")
    image_slices = mesh_impl.make_slices(
      tf.constant(_blocked(images, settings)), image_shape
    )
    label_slices = mesh_impl.make_slices(
      tf.constant(_blocked(labels, settings)), label_shape
    )
    preds, loss, metrics, bn_update_ops = unet.unet_with_spatial_partition(
      mesh, mesh_impl, "train", image_slices, label_slices
    )
    variables = mtf_graph.trainable_variables
    grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
    learning_rate = 0.01 * tf.pow(
      0.5, tf.floor(tf.cast(global_step, tf.float32) / 2.0)
    )
    optimizer = mtf.optimize.AdafactorOptimizer(learning_rate=learning_rate)
    update_ops = optimizer.apply_grads(grads, variables)
    # Read before lowering, which stacks variables (their masters stay).
    names = sorted(v.name for v in mtf_graph.all_variables)
    trained = sorted(v.name for v in variables)
    lowering = mtf.Lowering(mtf_graph, {mesh: mesh_impl})
    fetches = {"loss": lowering.export_to_tf_tensor(loss)}
    for i, pred in enumerate(preds):
      fetches["pred%d" % i] = lowering.export_to_tf_tensor(pred)
    for key, value in metrics.items():
      fetches["metric:" + key] = lowering.export_to_tf_tensor(value)
    fetches = {k: tf.cast(t, tf.float32) for k, t in fetches.items()}
    # model_executor groups both; apart, no update races a read.
    bn_update_op = tf.group(
      [lowering.lowered_operation(op) for op in bn_update_ops]
    )
    train_op = tf.group([lowering.lowered_operation(op) for op in update_ops])
    next_step = tf1.assign_add(global_step, 1)
    masters, set_values = set_master_values(names, trained, rng)
    # (bfloat16 values are read as float32, exactly.)
    values = {n: tf.cast(masters[n], tf.float32) for n in names}
    copy_to_slices = lowering.copy_masters_to_slices()
    copy_to_masters = lowering.copy_slices_to_masters()
    with tf1.Session(graph=graph) as session:
      session.run(tf1.global_variables_initializer())
      results = {}
      if mesh_name == "one_device":
        results = {"init:" + n: session.run(values[n]) for n in names}
      session.run(set_values)
      session.run(copy_to_slices)
      results.update(session.run(fetches))
      for step in range(TRAIN_STEPS):
        results["step%d:loss" % step] = session.run(fetches["loss"])
        session.run(bn_update_op)
        session.run(train_op)
        session.run(next_step)
      session.run(copy_to_masters)
      for n in names:
        results["final:" + n] = session.run(values[n])
  return {k: np.asarray(v) for k, v in results.items()}
