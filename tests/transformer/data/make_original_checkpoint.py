"""Writes checkpoints with the original package and its numbers from them.

Run with the original mesh-tensorflow 0.1.21 (and TF 2.21, with the
conformance shims for the estimator names TF removed) first on PYTHONPATH,
from the repository root:

  PYTHONPATH=<shims>:<original>:. python \
      tests/transformer/data/make_original_checkpoint.py [CASE ...]

For each case of original_checkpoint_cases.py the original's own
utils.tpu_estimator_model_fn builds the training graph; its Saver (sharded,
relative paths, over tf.global_variables(): the mtf masters under their
names, the optimizer's slots and global_step), its MtfRestoreHook,
CheckpointSaverHook and MtfCheckpointSaverListener run as TPUEstimator ran
them, for TRAIN_STEPS steps, and write original_checkpoints/<case>/. Kept
are the files a restore reads (the state file, index and data); not the
meta graph, graph.pbtxt, operative gin config or event files.

From that checkpoint, restored as the Estimator restored (a
ChiefSessionCreator with the model_fn's scaffold, then the prediction /
evaluation hooks), the same model_fn computes: per-example scores
("score" mode), greedy and beam decodes (predict mode), the teacher-forced
eval loss and metrics, and the masters after MORE_STEPS further training
steps. They are stored in original_checkpoints.npz as "<case>/<key>".

The variables are resource variables and each training step reads its
variables before it writes them (see _reads_before_writes): the original's
step in a TF1 CPU session has no such order and its numbers vary from run
to run; on TPU it was one XLA program, which reads first.

TPUEstimatorSpec / EstimatorSpec are absent from TF 2.21: simple records of
their arguments stand in (the model_fn only constructs them).
"""

import os
import shutil
import sys

import numpy as np
import tensorflow as tf
from tensorflow.python.training import session_run_hook  # pylint: disable=g-direct-tensorflow-import

tf.compat.v1.disable_v2_behavior()
tf.compat.v1.enable_resource_variables()

import gin  # noqa: E402

import mesh_tensorflow as mtf  # noqa: E402
from mesh_tensorflow.transformer import utils  # noqa: E402
from tests import original_package  # noqa: E402
from tests.transformer import original_checkpoint_cases as cases  # noqa: E402

tf1 = tf.compat.v1
DATA = os.path.dirname(os.path.abspath(__file__))
OUT_DIR = os.path.join(DATA, "original_checkpoints")


class _Spec:
  """Stands in for (TPU)EstimatorSpec: keeps what the model_fn passed."""

  def __init__(self, mode=None, **kwargs):
    self.mode = mode
    self.__dict__.update(kwargs)


class _Bytes:
  """Encodes as ByteVocabulary (UTF-8 bytes + 3), which 0.1.21 lacks."""

  def encode(self, text):
    return cases.byte_ids(text, eos=False, length=len(text.encode("utf-8")))


_BYTES = _Bytes()


def _install_spec_stand_ins():
  """The estimator names TF 2.21 lacks, as the model_fn and hooks use them.

  The shims' SessionRunHook has no methods; it gets the no-op defaults of
  TF's session_run_hook.SessionRunHook, which the removed class had.
  """
  utils.tpu_estimator.TPUEstimatorSpec = _Spec
  utils.tf_estimator.EstimatorSpec = _Spec
  base = utils.tf_estimator.SessionRunHook
  for name in ("begin", "after_create_session", "before_run", "after_run"):
    if not hasattr(base, name):
      setattr(base, name, getattr(session_run_hook.SessionRunHook, name))


def _parse_gin(bindings):
  """The original's defaults.gin, then a case's bindings."""
  gin.clear_config()
  defaults = os.path.join(os.path.dirname(utils.__file__), "gin/defaults.gin")
  gin.parse_config_files_and_bindings(
    [defaults], bindings, finalize_config=False
  )


def _model_fn(model_type, model_dir, **kwargs):
  model = utils.build_model(
    model_type,
    input_vocab_size=cases.VOCAB_SIZE,
    output_vocab_size=cases.VOCAB_SIZE,
    layout_rules=mtf.convert_to_layout_rules(""),
    mesh_shape=mtf.convert_to_shape(""),
  )
  return utils.tpu_estimator_model_fn(
    model_type,
    model,
    None,
    model_dir,
    False,
    mtf.convert_to_shape(""),
    mtf.convert_to_layout_rules(""),
    cases.BATCH,
    {"inputs": cases.LENGTH, "targets": cases.LENGTH},
    True,
    keep_checkpoint_max=1,
    save_checkpoints_steps=1000,
    learning_rate_schedule=cases.LEARNING_RATE,
    optimizer=mtf.optimize.AdafactorOptimizer,
    **kwargs,
  )


def _tf_features(arrays):
  return {k: tf.constant(v) for k, v in arrays.items()}


def _session(hooks, scaffold, **restore):
  """A session prepared as the Estimator's MonitoredSession prepared it."""
  for hook in hooks:
    hook.begin()
  session = tf1.train.ChiefSessionCreator(
    scaffold=scaffold, **restore
  ).create_session()
  for hook in hooks:
    hook.after_create_session(session, None)
  return session


_READS = ("ReadVariableOp", "ResourceGather")
_WRITES = ("AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp")


def _reads_before_writes(train_op):
  """Makes every variable write of train_op wait for its variable reads.

  One session.run of the original's train_op reads the variables (forward,
  backward, the optimizer's inputs, the global step) and writes them with
  nothing ordering the two, so on CPU a read may see a write of the same
  step and the results vary from run to run (on TPU the step was one XLA
  program, which reads before it writes). Control dependencies from every
  read that follows no write to every write give the step's one result.
  """
  closure, stack = set(), [train_op]
  while stack:
    op = stack.pop()
    if op not in closure:
      closure.add(op)
      stack.extend(t.op for t in op.inputs)
      stack.extend(op.control_inputs)
  writes = [op for op in closure if op.type in _WRITES]
  after_writes, stack = set(), list(writes)
  while stack:
    op = stack.pop()
    for consumer in [c for t in op.outputs for c in t.consumers()] + list(
      op._control_outputs  # pylint: disable=protected-access
    ):
      if consumer in closure and consumer not in after_writes:
        after_writes.add(consumer)
        stack.append(consumer)
  reads = [op for op in closure if op.type in _READS and op not in after_writes]
  for write in writes:
    write._add_control_inputs(reads)  # pylint: disable=protected-access


def _train(model_type, model_dir, steps, save):
  """Trains `steps` steps as TPUEstimator.train did; returns the masters."""
  graph = tf.Graph()
  with graph.as_default():
    tf1.set_random_seed(cases.SEED)
    tf1.train.get_or_create_global_step()
    spec = _model_fn(model_type, model_dir)(
      _tf_features(cases.features(model_type, cases.TRAIN_PAIRS)),
      None,
      "train",
      params={},
    )
    _reads_before_writes(spec.train_op)
    restore_hook, saver_hook, gin_hook = spec.training_chief_hooks
    hooks = [restore_hook, saver_hook, gin_hook] if save else [restore_hook]
    session = _session(hooks, tf1.train.Scaffold(), checkpoint_dir=model_dir)
    for _ in range(steps):
      session.run(spec.train_op)
    if save:
      saver_hook.end(session)  # the final checkpoint, after before_save
      masters = None
    else:
      listener = saver_hook._listeners[0]  # pylint: disable=protected-access
      listener.before_save(session, None)  # slices to masters
      variables = tf1.global_variables()
      masters = dict(
        zip([v.op.name for v in variables], session.run(variables))
      )
    session.close()
  return masters


def _predict(model_type, model_dir, arrays, score, gin_extra=""):
  """Predictions of the model_fn in predict (or score) mode."""
  if gin_extra:
    with gin.unlock_config():
      gin.parse_config(gin_extra)
  graph = tf.Graph()
  with graph.as_default():
    spec = _model_fn(model_type, model_dir, score_in_predict_mode=score)(
      _tf_features(arrays), None, "infer", params={}
    )
    session = _session(
      spec.prediction_hooks,
      spec.scaffold_fn(),
      checkpoint_filename_with_path=tf.train.latest_checkpoint(model_dir),
    )
    out = session.run(spec.predictions)
    session.close()
  return out


def _evaluate(model_type, model_dir):
  """The eval loss and metrics of EVAL_PAIRS (one batch)."""
  graph = tf.Graph()
  with graph.as_default():
    tf1.train.get_or_create_global_step()
    spec = _model_fn(model_type, model_dir)(
      _tf_features(cases.features(model_type, cases.EVAL_PAIRS)),
      None,
      "eval",
      params={},
    )
    metric_fn, tensors = spec.eval_metrics
    metrics = metric_fn(*tensors)
    scaffold = tf1.train.Scaffold()
    session = _session(
      spec.evaluation_hooks,
      scaffold,
      checkpoint_filename_with_path=tf.train.latest_checkpoint(model_dir),
    )
    loss, _ = session.run([spec.loss, {k: v[1] for k, v in metrics.items()}])
    values = session.run({k: v[0] for k, v in metrics.items()})
    session.close()
  values["loss"] = loss
  return values


def _keep_checkpoint_files_only(model_dir):
  for name in os.listdir(model_dir):
    path = os.path.join(model_dir, name)
    keep = name == "checkpoint" or name.endswith(".index") or ".data-" in name
    if os.path.isdir(path):
      shutil.rmtree(path)
    elif not keep:
      os.remove(path)


def run_case(name):
  model_type, bindings = cases.CASES[name]
  model_dir = os.path.join(OUT_DIR, name)
  if os.path.exists(model_dir):
    shutil.rmtree(model_dir)
  os.makedirs(model_dir)
  _parse_gin(bindings)
  _train(model_type, model_dir, cases.TRAIN_STEPS, save=True)
  _keep_checkpoint_files_only(model_dir)
  out = {}
  scores = _predict(
    model_type,
    model_dir,
    cases.features(model_type, cases.SCORE_PAIRS),
    score=True,
  )
  out["scores"] = scores["scores"]
  if model_type == "lm":
    # score_from_strings with inputs: each input an unscored prefix of its
    # target (negated ids), encoded as the original's encode_inputs does.
    prefixed = utils.encode_inputs(
      [t for _, t in cases.SCORE_PAIRS],
      _BYTES,
      model_type,
      cases.BATCH,
      cases.LENGTH,
      unscored_prefix=[i for i, _ in cases.SCORE_PAIRS],
    )
    out["prefix_scores"] = _predict(
      model_type, model_dir, {"targets": prefixed}, score=True
    )["scores"]
    # Examples with inputs: the original's "score" mode joins them.
    out["joined_scores"] = _predict(
      model_type,
      model_dir,
      cases.features("bitransformer", cases.SCORE_PAIRS),
      score=True,
    )["scores"]
  inputs = {"inputs": cases.decode_inputs(model_type)}
  out["greedy"] = _predict(model_type, model_dir, inputs, False)["outputs"]
  if model_type == "bitransformer":
    out["beam"] = _predict(
      model_type,
      model_dir,
      inputs,
      False,
      "Bitransformer.decode.beam_size = %d" % cases.BEAM_SIZE,
    )["outputs"]
    _parse_gin(bindings)
  for key, value in _evaluate(model_type, model_dir).items():
    out["eval/" + key] = np.asarray(value)
  masters = _train(model_type, model_dir, cases.MORE_STEPS, save=False)
  for key, value in masters.items():
    out["trained/" + key] = np.asarray(value).astype(np.float32)
  gin.clear_config()
  return out


def main(names):
  """Runs the cases named (default: all) and stores their arrays; the
  other cases' arrays already in the file are kept.
  """
  original_package.require_original()
  _install_spec_stand_ins()
  path = os.path.join(DATA, "original_checkpoints.npz")
  names = names or sorted(cases.CASES)
  arrays = {}
  if os.path.exists(path):
    with np.load(path) as stored:
      arrays = {k: v for k, v in stored.items() if k.split("/")[0] not in names}
  for name in names:
    for key, value in run_case(name).items():
      arrays["%s/%s" % (name, key)] = value
    print("%s: written" % name)
  np.savez_compressed(path, **arrays)
  print("wrote %d arrays to %s" % (len(arrays), path))


if __name__ == "__main__":
  main(sys.argv[1:])
