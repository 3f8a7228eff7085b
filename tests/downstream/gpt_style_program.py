"""Runs the GPT-style model (gpt_style_model.py) the way its model_fn would.

One training step and one prediction, each in a tf.compat.v1 graph and a
MonitoredSession with the hooks a TPUEstimator model_fn hands over:
MtfRestoreHook (masters to slices after the weights are loaded) and a
CheckpointSaverHook with an MtfCheckpointSaverListener (slices to masters
before every save). Every variable is set from a RandomState seeded by its
name, so runs on different meshes, TF modes and packages share weights.

As a script, `python gpt_style_program.py MODE MESH_SHAPE LAYOUT OUT.npz
GROUP,...` (MODE "v1" calls tf.compat.v1.disable_v2_behavior() first, "graph" keeps TF2
behaviour) runs the program against whichever mesh_tensorflow is first on
sys.path and saves its outputs; `run` returns them as a dict of arrays.
"""

import json
import os
import sys
import tempfile
from typing import Dict
import zlib

import numpy as np

if __name__ == "__main__":
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  if sys.argv[1] == "v1":
    import tensorflow as _tf  # pylint: disable=g-import-not-at-top

    _tf.compat.v1.disable_v2_behavior()

import tensorflow.compat.v1 as tf  # noqa: E402  pylint: disable=g-import-not-at-top

# The partial sequences that prediction continues (0 is padding).
PROMPTS = np.array(
  [
    [3, 5, 7, 0, 0, 0, 0, 0],
    [2, 0, 0, 0, 0, 0, 0, 0],
    [9, 1, 4, 6, 11, 0, 0, 0],
    [13, 8, 0, 0, 0, 0, 0, 0],
  ],
  dtype=np.int32,
)
STOP_TOKEN = 5


def training_ids(params) -> np.ndarray:
  rng = np.random.RandomState(7)
  return rng.randint(
    1, params["n_vocab"], size=(params["batch_size"], params["n_ctx"] + 1)
  ).astype(np.int32)


def initial_value(name: str, shape) -> np.ndarray:
  """The value every run gives variable `name`: layer-norm gains near 1."""
  rng = np.random.RandomState(zlib.crc32(name.encode("utf-8")))
  value = 0.3 * np.asarray(rng.randn(*shape))
  if name.endswith("/g"):
    value += 1.0
  return value.astype(np.float32)


def _weight_loader(mtf_graph):
  """A Scaffold init_fn setting each master variable to its initial_value."""
  names = {v.name for v in mtf_graph.trainable_variables}

  def init_fn(unused_scaffold, session):
    for var in tf.global_variables():
      name = var.op.name
      if name in names:
        var.load(initial_value(name, var.shape.as_list()), session)

  return init_fn


def _mesh_impl(mtf, mesh_shape: str, layout: str):
  shape = mtf.convert_to_shape(mesh_shape)
  return mtf.placement_mesh_impl.PlacementMeshImpl(
    shape=shape,
    layout=mtf.convert_to_layout_rules(layout),
    devices=[""] * shape.size,
  )


def _monitored_session(lowering, mtf_graph, checkpoint_dir, mtf):
  saver = tf.train.Saver(
    tf.global_variables(), sharded=True, save_relative_paths=True
  )
  tf.add_to_collection(tf.GraphKeys.SAVERS, saver)
  saver_hook = tf.train.CheckpointSaverHook(
    checkpoint_dir,
    save_steps=1,
    saver=saver,
    listeners=[mtf.MtfCheckpointSaverListener(lowering)],
  )
  scaffold = tf.train.Scaffold(init_fn=_weight_loader(mtf_graph), saver=saver)
  return tf.train.SingularMonitoredSession(
    hooks=[mtf.MtfRestoreHook(lowering), saver_hook],
    scaffold=scaffold,
    checkpoint_dir=None,
  )


def train_step(
  mtf,
  mtf_transformer,
  mesh_shape,
  layout,
  optimizer="adam",
  variant=False,
  activation_dtype=tf.float32,
):
  """Forward outputs, gradients and the variables after one update.

  With `variant`, the model is gpt_style_variants.variant_model, trained in two
  microbatches (mtf.serialize_training_step).
  """
  from tests.downstream import gpt_style_model as gm  # pylint: disable=g-import-not-at-top
  from tests.downstream import gpt_style_variants as gv  # pylint: disable=g-import-not-at-top

  params = gv.VARIANT_PARAMS if variant else gm.PARAMS
  ids = training_ids(params)
  out = {}
  with tf.Graph().as_default():
    global_step = tf.train.get_or_create_global_step()
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "my_mesh")
    dims = gm.Dims(mtf, params)
    variable_dtype = mtf.VariableDType(
      master_dtype=tf.float32,
      slice_dtype=tf.float32,
      activation_dtype=activation_dtype,
    )
    feature_shape = mtf.Shape([dims.batch, dims.sequence])
    features = {}
    for key, value in (("inputs", ids[:, :-1]), ("labels", ids[:, 1:])):
      tensor = tf.reshape(
        tf.cast(value, tf.int32), feature_shape.to_integer_list
      )
      features[key] = mtf.import_fully_replicated(
        mesh, tensor, feature_shape, name=key
      )
    bias = gm.causal_bias(mtf, mesh, dims, variable_dtype)
    var_grads = None
    if variant:
      num_microbatches = 2

      def serialized_fn(features):
        with tf.variable_scope("gpt2"):
          outputs = gv.variant_model(
            mtf,
            mtf_transformer,
            features["inputs"],
            features["labels"],
            dims,
            params,
            bias,
            variable_dtype,
            mtf.convert_to_shape(mesh_shape),
            mtf.convert_to_layout_rules(layout),
            num_microbatches,
          )
        return dict(zip(("logits", "loss", "loss_batch"), outputs))

      var_grads, outputs = mtf.serialize_training_step(
        features, serialized_fn, dims.batch, num_microbatches
      )
      logits, loss, loss_batch = (
        outputs["logits"],
        outputs["loss"],
        outputs["loss_batch"],
      )
    else:
      with mtf.utils.outside_all_rewrites():
        with tf.variable_scope("gpt2"):
          logits, loss, loss_batch = gm.model(
            mtf,
            mtf_transformer,
            features["inputs"],
            features["labels"],
            dims,
            params,
            bias,
            variable_dtype,
          )
    update_ops, var_grads = gm.train_ops(
      mtf, mesh, loss, params, variable_dtype, optimizer, var_grads
    )
    mtf.scalar_summary("loss", loss)
    exported = {
      "logits": mtf.anonymize(logits),
      "loss_batch": mtf.anonymize(loss_batch),
      "mean_logits": mtf.anonymize(
        mtf.reduce_mean(logits, reduced_dim=dims.vocab)
      ),
      "max_logits": mtf.anonymize(mtf.argmax(logits, dims.vocab)),
    }
    trainable = graph.trainable_variables
    grad_names = {}
    for var, grad in zip(trainable, var_grads):
      grad_names["grad/" + var.name] = mtf.anonymize(grad)
    variables = json.dumps(
      sorted((v.name, v.shape.to_integer_list) for v in graph.all_variables)
    )
    lowering = mtf.Lowering(graph, {mesh: _mesh_impl(mtf, mesh_shape, layout)})
    tf_loss = tf.cast(lowering.export_to_tf_tensor(loss), tf.float32)
    tf_outputs = {
      k: lowering.export_to_tf_tensor(v)
      for k, v in list(exported.items()) + list(grad_names.items())
    }
    summaries = tf.get_collection(mtf.utils.SCALAR_SUMMARIES_COLLECTION_KEY)
    # A TPU host_call reshapes each to [1].
    assert all(t.shape.is_compatible_with([]) for _, t in summaries)
    mtf.utils.remove_summaries()
    tf_update_ops = [lowering.lowered_operation(op) for op in update_ops]
    tf_update_ops.append(tf.assign_add(global_step, 1))
    train_op = tf.group(tf_update_ops)
    checkpoint_dir = tempfile.mkdtemp()
    with _monitored_session(lowering, graph, checkpoint_dir, mtf) as session:
      values = session.run(dict(tf_outputs, loss=tf_loss))
      session.run(train_op)
    reader = tf.train.load_checkpoint(checkpoint_dir)
    for var in trainable:
      out["after/" + var.name] = reader.get_tensor(var.name)
    out["summaries"] = np.array(sorted(name for name, _ in summaries))
  out.update(values)
  out["variables"] = np.array(variables)
  return out


def predict(mtf, mtf_transformer, mesh_shape, layout):
  """Greedy continuations of PROMPTS: cached, with stop token / top-k, slow."""
  from tests.downstream import gpt_style_model as gm  # pylint: disable=g-import-not-at-top

  params = gm.PARAMS
  with tf.Graph().as_default():
    tf.train.get_or_create_global_step()
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "my_mesh")
    dims = gm.Dims(mtf, params)
    variable_dtype = mtf.VariableDType(tf.float32)
    shape = mtf.Shape([dims.batch, dims.sequence])
    inputs = mtf.import_fully_replicated(
      mesh, tf.constant(PROMPTS), shape, name="inputs"
    )
    bias = gm.causal_bias(mtf, mesh, dims, variable_dtype)
    greedy = gm.sample_autoregressive(
      mtf,
      mtf_transformer,
      inputs,
      dims,
      params,
      bias,
      variable_dtype,
      temperature=0.0,
    )
    stopped = gm.sample_autoregressive(
      mtf,
      mtf_transformer,
      inputs,
      dims,
      params,
      bias,
      variable_dtype,
      stop_at_token=STOP_TOKEN,
      max_steps=4,
      temperature=0.0,
      remove_partial_sequences=True,
      sampling_keep_top_k=2,
    )
    slow = gm.sample_autoregressive(
      mtf,
      mtf_transformer,
      inputs,
      dims,
      params,
      bias,
      variable_dtype,
      temperature=0.0,
      slow_sampling=True,
    )
    exported = {
      "greedy": mtf.anonymize(greedy),
      "slow": mtf.anonymize(slow),
      "stopped": mtf.anonymize(stopped),
      "inputs": mtf.anonymize(inputs),
    }
    lowering = mtf.Lowering(
      graph, {mesh: _mesh_impl(mtf, mesh_shape, layout)}, autostack=True
    )
    outputs = {k: lowering.export_to_tf_tensor(v) for k, v in exported.items()}
    scaffold = tf.train.Scaffold(init_fn=_weight_loader(graph))
    with tf.train.SingularMonitoredSession(
      hooks=[mtf.MtfRestoreHook(lowering)], scaffold=scaffold
    ) as session:
      return session.run(outputs)


GROUPS = ("train", "adafactor", "variant", "bfloat16", "predict")


def run(
  mtf, mtf_transformer, mesh_shape: str, layout: str, groups=GROUPS
) -> Dict[str, np.ndarray]:
  """The outputs of the program's `groups`, keyed "<group>/<output>".

  "train" is the model with Adam, "adafactor" the variables after an
  Adafactor step instead, "variant" the variants model, "bfloat16" the
  model with bfloat16 activations (GPT-style programs' "bfloat16"
  precision), "predict" the decodes.
  """
  steps = {
    "train": lambda: train_step(mtf, mtf_transformer, mesh_shape, layout),
    "adafactor": lambda: train_step(
      mtf, mtf_transformer, mesh_shape, layout, "adafactor"
    ),
    "variant": lambda: train_step(
      mtf, mtf_transformer, mesh_shape, layout, variant=True
    ),
    "bfloat16": lambda: train_step(
      mtf, mtf_transformer, mesh_shape, layout, activation_dtype=tf.bfloat16
    ),
    "predict": lambda: predict(mtf, mtf_transformer, mesh_shape, layout),
  }
  out = {}
  for group in groups:
    for key, value in steps[group]().items():
      if group == "adafactor" and not key.startswith("after/"):
        continue
      out[group + "/" + key] = np.asarray(value)
  return out


def main(argv):
  _, mode, mesh_shape, layout, path, groups = argv
  del mode  # Applied at import.
  # Last, so that the package under test is whichever PYTHONPATH names.
  sys.path.append(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  )
  import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top
  import mesh_tensorflow.transformer as mtf_transformer  # pylint: disable=g-import-not-at-top

  np.savez(
    path, **run(mtf, mtf_transformer, mesh_shape, layout, groups.split(","))
  )


if __name__ == "__main__":
  main(sys.argv)
