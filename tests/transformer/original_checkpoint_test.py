"""Checkpoints the original 0.1.21 package wrote run here unchanged.

data/original_checkpoints/<case>/ was written by the original's own
tpu_estimator_model_fn, Saver and checkpoint hooks after TRAIN_STEPS
training steps, and data/original_checkpoints.npz holds what the original
computed from it (data/make_original_checkpoint.py; the cases are in
original_checkpoint_cases.py). This package's driver restores that directory
through its public paths (utils.infer_model / decode_from_file,
score_from_strings / score_from_dataset, eval_model, run(mode="train")) and
must give the same decodes, scores, eval metrics and, resuming training from
the checkpoint's global step, the same variables. The checkpoint our driver
then writes restores with the original's Saver settings.
"""

import functools
import os
import shutil

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests.transformer import original_checkpoint_cases as cases
from transformer import dataset as dataset_lib
from transformer import utils
from transformer import vocabulary as vocabulary_lib
from transformer._src.driver import checkpoint_evaluation
from transformer._src.driver import eval_outputs

DATA = os.path.join(os.path.dirname(__file__), "data")
CASES = sorted(cases.CASES)
# The bfloat16 cases repeat the float32 Bitransformer's paths: marked slow.
QUICK_CASES = [
  pytest.param(c, marks=pytest.mark.slow) if "bf16" in c else c for c in CASES
]


class _IdsVocabulary(vocabulary_lib.ByteVocabulary):
  """Bytes in; out, every id as a number, so decodes compare exactly."""

  def decode(self, ids):
    return " ".join(str(int(i)) for i in ids)


VOCAB = _IdsVocabulary()


@pytest.fixture(scope="module")
def reference():
  path = os.path.join(DATA, "original_checkpoints.npz")
  with np.load(path) as arrays:
    return dict(arrays)


def _expected(reference, case):
  prefix = case + "/"
  return {
    k[len(prefix) :]: v for k, v in reference.items() if k.startswith(prefix)
  }


def _bundle_files(directory):
  """{name: bytes} of the checkpoint files the original wrote."""
  return {
    name: open(os.path.join(directory, name), "rb").read()
    for name in sorted(os.listdir(directory))
    if name.startswith("model.ckpt-%d." % cases.TRAIN_STEPS)
  }


@pytest.fixture
def model_dir(request, tmp_path):
  """A copy of the original's checkpoint directory of request.param."""
  source = os.path.join(DATA, "original_checkpoints", request.param)
  target = str(tmp_path / request.param)
  shutil.copytree(source, target)
  original_files = _bundle_files(target)
  yield target
  assert _bundle_files(target) == original_files, "the checkpoint changed"


def _gin(case, extra=""):
  gin.clear_config()
  gin.parse_config_files_and_bindings(
    [os.path.join(utils.config_dir(), "defaults.gin")],
    cases.CASES[case][1] + extra,
    finalize_config=False,
  )


@pytest.fixture(autouse=True)
def _clear_gin():
  yield
  gin.clear_config()


def _estimator(case, model_dir):
  model_type = cases.CASES[case][0]
  return utils.get_estimator(
    model_type,
    VOCAB,
    "",
    "",
    model_dir,
    cases.BATCH,
    cases.LENGTH,
    True,
    cases.LEARNING_RATE,
    None,
    1000,
    mtf.optimize.AdafactorOptimizer,
    None,
    None,
    None,
    False,
    None,
    100,
    None,
  )


def _tolerances(case):
  """rtol and atol: float32 activations to float32 rounding (also with
  bfloat16 masters); bfloat16 activations to about two bfloat16 ulps (the
  eval loss differs from the original's by one, and a few trained elements
  by a bfloat16-rounded Adafactor step: cause not found).
  """
  if cases.bf16_activations(case):
    return {"rtol": 1e-2, "atol": 4e-3}
  return {"rtol": 1e-5, "atol": 1e-6}


def test_checkpoint_is_the_originals_format():
  """What the original's Saver wrote: its names, dtypes and state file."""
  for case in CASES:
    directory = os.path.join(DATA, "original_checkpoints", case)
    text = open(os.path.join(directory, "checkpoint")).read()
    assert 'model_checkpoint_path: "model.ckpt-%d"' % cases.TRAIN_STEPS in text
    reader = tf.train.load_checkpoint(directory)
    assert reader.get_tensor("global_step") == cases.TRAIN_STEPS
    dtypes = reader.get_variable_to_dtype_map()
    masters = {n for n in dtypes if n != "global_step" and "_slot_" not in n}
    want = tf.bfloat16 if "bf16" in case else tf.float32
    assert {dtypes[n] for n in masters} == {want}
    assert any(".data-00001-of-00002" in n for n in os.listdir(directory))


def _decode_from_file(est, case, model_dir, tmp_path):
  model_type = cases.CASES[case][0]
  input_file = str(tmp_path / "inputs.txt")
  with open(input_file, "w") as f:
    f.write("\n".join(cases.DECODE_INPUTS) + "\n")
  output = str(tmp_path / "decodes")
  utils.infer_model(
    est,
    VOCAB,
    cases.LENGTH,
    cases.BATCH,
    model_type,
    model_dir,
    -1,
    decode_fn=functools.partial(
      utils.decode_from_file, input_filename=input_file, output_filename=output
    ),
  )
  return utils.get_inputs_from_file("%s-%d" % (output, cases.TRAIN_STEPS))


def _ids_text(rows):
  return [" ".join(str(int(i)) for i in row) for row in rows]


@pytest.mark.parametrize("model_dir", QUICK_CASES, indirect=True)
def test_greedy_decodes_are_the_originals(reference, model_dir, tmp_path):
  case = os.path.basename(model_dir)
  _gin(case)
  est = _estimator(case, model_dir)
  got = _decode_from_file(est, case, model_dir, tmp_path)
  assert got == _ids_text(_expected(reference, case)["greedy"])


@pytest.mark.slow
@pytest.mark.parametrize(
  "model_dir",
  [c for c in CASES if cases.CASES[c][0] == "bitransformer"],
  indirect=True,
)
def test_beam_decodes_are_the_originals(reference, model_dir, tmp_path):
  case = os.path.basename(model_dir)
  _gin(case, "Bitransformer.decode.beam_size = %d" % cases.BEAM_SIZE)
  est = _estimator(case, model_dir)
  got = _decode_from_file(est, case, model_dir, tmp_path)
  want = _ids_text(_expected(reference, case)["beam"])
  assert got == want


def _score_pairs(est, model_type, model_dir):
  """score_from_strings of SCORE_PAIRS with the latest checkpoint."""
  return utils.score_from_strings(
    est,
    VOCAB,
    model_type,
    cases.BATCH,
    cases.LENGTH,
    model_dir,
    -1,
    inputs=[i for i, _ in cases.SCORE_PAIRS],
    targets=[t for _, t in cases.SCORE_PAIRS],
    score_postprocess_fn=utils.save_scores,
  )


def _score_dataset(est, model_dir, features):
  """score_from_dataset of the latest checkpoint over int features."""
  return utils.score_from_dataset(
    est,
    VOCAB,
    cases.BATCH,
    cases.LENGTH,
    model_dir,
    -1,
    "validation",
    score_dataset_fn=lambda **_: tf.data.Dataset.from_tensor_slices(features),
    score_postprocess_fn=utils.save_scores,
  )


@pytest.mark.parametrize("model_dir", QUICK_CASES, indirect=True)
def test_scores_are_the_originals(reference, model_dir):
  case = os.path.basename(model_dir)
  model_type = cases.CASES[case][0]
  expected = _expected(reference, case)["scores"]
  _gin(case)
  est = _estimator(case, model_dir)
  if model_type == "lm":
    features = cases.features(model_type, cases.SCORE_PAIRS)
    scores, _ = _score_dataset(est, model_dir, features)
  else:
    # As the original's: (scores, target texts), inputs or not.
    scores, _ = _score_pairs(est, model_type, model_dir)
  # Per-example scores match to float32 rounding even with bfloat16
  # activations (the original's computation order, with TensorFlow's default
  # graph rewrites on as the original ran).
  np.testing.assert_allclose(scores, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("model_dir", ["lm"], indirect=True)
def test_lm_scores_with_inputs_are_the_originals(reference, model_dir):
  """An LM scores each target string after its input, which it reads
  unscored; examples of a dataset with inputs it reads joined.
  """
  _gin("lm")
  est = _estimator("lm", model_dir)
  scores, targets = _score_pairs(est, "lm", model_dir)
  expected = _expected(reference, "lm")
  np.testing.assert_allclose(
    scores, expected["prefix_scores"], rtol=1e-5, atol=1e-6
  )
  # The target texts are the model's targets' positive ids (no EOS for an
  # LM's strings).
  assert targets == [
    " ".join(str(b + 3) for b in t.encode()) for _, t in cases.SCORE_PAIRS
  ]
  # Examples with inputs are joined and all their tokens scored.
  features = cases.features("bitransformer", cases.SCORE_PAIRS)
  joined, _ = _score_dataset(est, model_dir, features)
  np.testing.assert_allclose(
    joined, expected["joined_scores"], rtol=1e-5, atol=1e-6
  )


@pytest.mark.parametrize("model_dir", QUICK_CASES, indirect=True)
def test_eval_metrics_are_the_originals(reference, model_dir):
  case = os.path.basename(model_dir)
  model_type = cases.CASES[case][0]
  expected = _expected(reference, case)
  _gin(case)
  est = _estimator(case, model_dir)
  features = cases.features(model_type, cases.EVAL_PAIRS)

  def eval_dataset_fn(sequence_length, vocabulary, dataset_split):
    del sequence_length, vocabulary, dataset_split
    return [
      dataset_lib.EvalDataset(
        "pairs",
        lambda: tf.data.Dataset.from_tensor_slices(features),
        None,
        [],
      )
    ]

  # perplexity_eval, one batch: what the original's Estimator.evaluate gave.
  results = checkpoint_evaluation.perplexity_eval(
    est,
    VOCAB,
    est.sequence_length,
    cases.BATCH,
    "validation",
    model_dir,
    eval_dataset_fn,
    None,
    -1,
    1,
  )["pairs"]
  # "loss" is the original's eval loss, the model's own loss (divided by
  # every target position, padding included), not the cross-entropy per
  # target token that -neg_log_perplexity is.
  for key in eval_outputs.PERPLEXITY_METRICS:
    np.testing.assert_allclose(
      results[key],
      expected["eval/" + key],
      err_msg=key,
      **_tolerances(case),
    )
  shutil.rmtree(
    os.path.join(model_dir, "eval_pairs_validation_%d" % cases.BATCH)
  )


def _train_dataset_fn(model_type):
  features = cases.features(model_type, cases.TRAIN_PAIRS)

  def dataset_fn(sequence_length, vocabulary, dataset_split):
    del sequence_length, vocabulary, dataset_split
    return tf.data.Dataset.from_tensor_slices(features)

  return dataset_fn


@pytest.mark.slow
@pytest.mark.parametrize("model_dir", CASES, indirect=True)
def test_training_resumes_from_the_checkpoint_as_the_original(
  reference, model_dir
):
  case = os.path.basename(model_dir)
  model_type = cases.CASES[case][0]
  expected = _expected(reference, case)
  _gin(case)
  last_step = cases.TRAIN_STEPS + cases.MORE_STEPS
  result = utils.run(
    None,
    None,
    None,
    None,
    model_dir,
    model_type=model_type,
    vocabulary=VOCAB,
    train_dataset_fn=_train_dataset_fn(model_type),
    mode="train",
    batch_size=cases.BATCH,
    train_steps=last_step,
    sequence_length=cases.LENGTH,
    mesh_shape="",
    layout_rules="",
    learning_rate_schedule=cases.LEARNING_RATE,
    optimizer=mtf.optimize.AdafactorOptimizer,
  )
  assert result["step"] == last_step
  path = os.path.join(model_dir, "model.ckpt-%d" % last_step)
  reader = tf.train.load_checkpoint(path)
  assert reader.get_tensor("global_step") == last_step
  trained = {
    k[len("trained/") :]: v
    for k, v in expected.items()
    if k.startswith("trained/")
  }
  dtypes = reader.get_variable_to_dtype_map()
  original = tf.train.load_checkpoint(
    os.path.join(model_dir, "model.ckpt-%d" % cases.TRAIN_STEPS)
  )
  assert dtypes == original.get_variable_to_dtype_map()
  assert set(dtypes) == set(trained)
  for name, value in sorted(trained.items()):
    got = np.asarray(reader.get_tensor(name)).astype(np.float32)
    if name == "global_step":
      assert int(got) == int(value)
      continue
    tolerances = _tolerances(case)
    if dtypes[name] == tf.bfloat16:  # may round to a neighbouring bfloat16
      tolerances["rtol"] = 2.0**-7
    if cases.bf16_activations(case):
      # Adafactor scales each update by its gradient's running RMS, so an
      # element of a tiny, bfloat16-rounded gradient may move by up to a
      # step (learning rate x parameter scale) more or less; the rest
      # agree to a bfloat16 ulp.
      close = np.isclose(got, value, **tolerances)
      assert close.mean() >= 0.95, name
      np.testing.assert_allclose(
        got, value, atol=2 * cases.LEARNING_RATE, err_msg=name
      )
    else:
      np.testing.assert_allclose(got, value, **tolerances, err_msg=name)
  _original_saver_restores(path, original)


def _original_saver_restores(path, original_reader):
  """The original's Saver (its var_list: the checkpoint's names) reads path."""
  shapes = original_reader.get_variable_to_shape_map()
  dtypes = original_reader.get_variable_to_dtype_map()
  want = tf.train.load_checkpoint(path)
  with tf.Graph().as_default():
    variables = [
      tf.compat.v1.get_variable(
        name,
        shape=shapes[name],
        dtype=dtypes[name],
        initializer=tf.compat.v1.zeros_initializer(),
      )
      for name in sorted(shapes)
    ]
    saver = tf.compat.v1.train.Saver(
      variables, sharded=True, save_relative_paths=True
    )
    with tf.compat.v1.Session() as session:
      saver.restore(session, path)
      values = session.run(variables)
  for variable, value in zip(variables, values):
    name = variable.op.name
    np.testing.assert_array_equal(value, want.get_tensor(name), err_msg=name)


@pytest.mark.parametrize("model_dir", QUICK_CASES, indirect=True)
def test_model_fn_eval_loss_and_metrics_are_the_originals(reference, model_dir):
  """utils.tpu_estimator_model_fn in a tf.compat.v1 graph, restored by a
  Saver as the Estimator's scaffold restored: the eval loss (the model's
  loss) and every streaming metric the original reported.
  """
  case = os.path.basename(model_dir)
  model_type = cases.CASES[case][0]
  expected = _expected(reference, case)
  _gin(case)
  model = utils.build_model(
    model_type,
    input_vocab_size=cases.VOCAB_SIZE,
    output_vocab_size=cases.VOCAB_SIZE,
    layout_rules="",
    mesh_shape="",
  )
  model_fn = utils.tpu_estimator_model_fn(
    model_type,
    model,
    None,
    model_dir,
    False,
    "",
    "",
    cases.BATCH,
    cases.LENGTH,
    True,
    None,
    1000,
  )
  features = cases.features(model_type, cases.EVAL_PAIRS)
  with tf.Graph().as_default():
    tf.compat.v1.train.get_or_create_global_step()
    spec = model_fn(
      {k: tf.constant(v) for k, v in features.items()}, None, "eval"
    )
    saver = tf.compat.v1.train.Saver(sharded=True)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.local_variables_initializer())
      saver.restore(session, tf.train.latest_checkpoint(model_dir))
      for hook in spec.hooks:
        hook.begin()
        hook.after_create_session(session, None)
      loss, _ = session.run(
        [spec.loss, {k: v[1] for k, v in spec.eval_metric_ops.items()}]
      )
      metrics = session.run({k: v[0] for k, v in spec.eval_metric_ops.items()})
  metrics["loss"] = loss
  want = {k[len("eval/") :]: v for k, v in expected.items() if "eval/" in k}
  assert set(metrics) == set(want)
  for key, value in sorted(want.items()):
    np.testing.assert_allclose(
      metrics[key], value, err_msg=key, **_tolerances(case)
    )
