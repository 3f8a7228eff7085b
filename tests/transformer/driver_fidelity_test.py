"""The driver behaves as the original's for TF1-era programs and launchers.

Legacy TF1 mode (after `tf.compat.v1.disable_v2_behavior()`) runs in a
subprocess, since the switch is process-wide; its numbers must equal the
same program's under TF2 behaviour.
"""

import functools
import inspect
import os
import textwrap

import gin
import numpy as np
import pytest
import tensorflow as tf

from tests.transformer import driver_test_util as dtu
from transformer import learning_rate_schedules
from transformer import utils
from transformer import vocabulary
from transformer._src.driver import run as run_lib
from transformer._src.driver import scoring as driver_scoring

tf1 = tf.compat.v1

# Trains 3 steps with get_estimator + train_model, scores, decodes, runs 3
# steps of the tpu_estimator_model_fn in a Session, and utils.run's train, eval
# and infer modes; prints the numbers as JSON. argv: "v1" or "v2", a model directory.
_PROGRAM = textwrap.dedent("""
    import json, os, sys
    sys.path[:0] = [%(repo)r]
    import tensorflow as tf
    if sys.argv[1] == "v1":
      tf.compat.v1.disable_v2_behavior()
    tf1 = tf.compat.v1
    from tests.transformer import driver_test_util as u
    from transformer import utils
    from transformer import vocabulary

    u.tiny_gin("utils.get_variable_dtype.activation_dtype = 'float32'")
    from tensorflow.python.eager import context
    with context.eager_mode():  # the driver's calls run eagerly
      tf.random.set_seed(1)
    x, y = u.reverse_data()
    def dataset_fn(sequence_length, vocabulary, dataset_split):
      del sequence_length, vocabulary, dataset_split
      return tf.data.Dataset.from_tensor_slices({"inputs": x, "targets": y})
    vocab = vocabulary.ByteVocabulary()
    est = utils.get_estimator(
        "bitransformer", vocab, "", "", sys.argv[2], u.BATCH, u.LENGTH, True,
        0.01, None, 100, None, None, None, None, False, None, 100, None)
    train = utils.train_model(est, vocab, u.LENGTH, u.BATCH, dataset_fn, 3,
                              None)
    scores = utils.compute_log_likelihoods(
        est, lambda: dataset_fn(None, None, None).take(4))
    decoded = utils.decode_strings(est, ["abc", "xyz"], vocab)

    model = utils.build_model("bitransformer", input_vocab_size=u.VOCAB,
                              output_vocab_size=u.VOCAB, layout_rules="",
                              mesh_shape="")
    model_fn = utils.tpu_estimator_model_fn(
        "bitransformer", model, None, sys.argv[2] + "_fn", False, "", "",
        u.BATCH, u.LENGTH, True, None, 100,
        learning_rate_schedule=lambda step: 0.01 + 0.0 * tf.cast(
            step, tf.float32), optimizer=None)
    with tf.Graph().as_default():
      tf1.set_random_seed(1)
      spec = model_fn({"inputs": tf.constant(x[:u.BATCH]),
                       "targets": tf.constant(y[:u.BATCH])}, None, "train")
      with tf1.Session() as session:
        session.run([tf1.global_variables_initializer(),
                     tf1.local_variables_initializer()])
        for hook in spec.hooks:
          hook.begin()
          hook.after_create_session(session, None)
        fn_losses = [float(session.run([spec.train_op, spec.loss])[1])
                     for _ in range(3)]

    # utils.run as a launcher calls it: train, eval, then infer from a file.
    import gin
    from transformer import dataset
    run_dir = sys.argv[2] + "_run"
    os.makedirs(run_dir)
    with open(os.path.join(run_dir, "inputs.txt"), "w") as f:
      f.write("abc\\nxyz\\n")
    decode_params = "mesh_tensorflow.transformer.utils.decode_from_file."
    gin.bind_parameter(decode_params + "input_filename",
                       os.path.join(run_dir, "inputs.txt"))
    gin.bind_parameter(decode_params + "output_filename",
                       os.path.join(run_dir, "decodes"))
    def eval_dataset_fn(sequence_length, vocabulary, dataset_split):
      del sequence_length, vocabulary, dataset_split
      return [dataset.EvalDataset(
          "rev", lambda: dataset_fn(None, None, None).take(16), None,
          [lambda targets, predictions: {"same": float(
              sum(t == p for t, p in zip(targets, predictions)))}])]
    def run(mode, **kwargs):
      return utils.run(
          None, None, None, None, run_dir, vocabulary=vocab,
          train_dataset_fn=dataset_fn, eval_dataset_fn=eval_dataset_fn,
          mode=mode, batch_size=u.BATCH, train_steps=3,
          sequence_length=u.LENGTH, mesh_shape="", layout_rules="",
          learning_rate_schedule=0.01, eval_checkpoint_step=-1, **kwargs)
    run_train = run("train")
    # eval: the metric_fns of decodes; perplexity_eval: teacher forced.
    run_eval = dict(run("eval")["rev"],
                    **run("perplexity_eval", perplexity_eval_steps=2)["rev"])
    run("infer")
    with open(os.path.join(run_dir, "decodes-3")) as f:
      run_infer = f.read()  # a decode may hold a newline byte
    print("RESULT " + json.dumps({
        "train_loss": train["loss"], "step": train["step"],
        "scores": scores, "decoded": decoded,
        "model_fn_losses": fn_losses,
        "run_train": {k: float(v) for k, v in run_train.items()},
        "run_eval": {k: float(v) for k, v in run_eval.items()},
        "run_infer": run_infer}))
""")


def _run_program(mode, model_dir):
  return dtu.run_result_program(_PROGRAM % {"repo": dtu.REPO}, mode, model_dir)


@pytest.mark.slow
def test_legacy_tf1_mode_trains_scores_and_decodes_as_tf2(tmp_path):
  v2 = _run_program("v2", str(tmp_path / "v2"))
  v1 = _run_program("v1", str(tmp_path / "v1"))
  assert v1["step"] == v2["step"] == 3
  np.testing.assert_allclose(v1["train_loss"], v2["train_loss"], rtol=1e-6)
  np.testing.assert_allclose(v1["scores"], v2["scores"], rtol=1e-6)
  np.testing.assert_allclose(
    v1["model_fn_losses"], v2["model_fn_losses"], rtol=1e-6
  )
  assert v1["decoded"] == v2["decoded"]
  # utils.run: the same training, evaluation and decodes in both modes.
  assert v1["run_train"]["step"] == v2["run_train"]["step"] == 3
  assert sorted(v1["run_eval"]) == sorted(v2["run_eval"])
  assert "same" in v1["run_eval"] and len(v1["run_eval"]) > 1
  for name, value in v2["run_eval"].items():
    np.testing.assert_allclose(v1["run_eval"][name], value, rtol=1e-6)
  np.testing.assert_allclose(
    v1["run_train"]["loss"], v2["run_train"]["loss"], rtol=1e-6
  )
  assert v1["run_infer"] == v2["run_infer"] and v1["run_infer"]
  assert np.isfinite(v1["train_loss"]) and len(v1["decoded"]) == 2
  assert len(v1["scores"]) == 4 and all(s < 0 for s in v1["scores"])


def test_estimator_made_in_a_v1_graph_trains_eagerly(tmp_path):
  """As TF1 programs do: the driver's variables stay eager, so it trains."""
  if tf.__internal__.tf2.enabled():
    # Under TF2 behaviour a tf.Graph made by the caller is honoured: the
    # Estimator's global step is a variable of that graph.
    with tf.Graph().as_default() as graph:
      est = dtu.estimator(tmp_path, mesh=dtu.MESH_1)
      assert est.global_step.graph is graph
    return
  with tf.Graph().as_default() as graph:
    est = dtu.estimator(tmp_path, mesh=dtu.MESH_1)
    out = est.train(dtu.input_fn, 1)
    assert not graph.get_operations()  # nothing went into the caller's graph
  assert out["step"] == 1 and np.isfinite(out["loss"])
  assert int(est.global_step.numpy()) == 1


def test_schedule_of_a_python_step_is_a_tensor_in_a_v1_graph():
  with tf.Graph().as_default():
    rate = learning_rate_schedules.linear_decay_learning_rate(
      40, 100, initial_lr=0.001, offset=50
    )
    half = learning_rate_schedules.linear_decay_learning_rate(
      tf.constant(50), 100, initial_lr=0.001
    )
    assert isinstance(rate, tf.Tensor) and rate.dtype == tf.float32
    with tf1.Session() as session:
      np.testing.assert_allclose(
        session.run([rate, half]), [0.001, 0.0005], rtol=1e-6
      )
  # Eagerly, a Python step still gives a Python float.
  assert learning_rate_schedules.linear_decay_learning_rate(
    50, 100, initial_lr=0.001
  ) == pytest.approx(0.0005)


def test_gin_file_found_on_gins_own_search_path(tmp_path, monkeypatch):
  (tmp_path / "launcher").mkdir()
  (tmp_path / "launcher" / "tiny.gin").write_text("d_model = 24\n")
  monkeypatch.chdir(tmp_path)  # not found relative to the working directory
  gin.add_config_file_search_path(str(tmp_path / "launcher"))
  utils.parse_gin_defaults_and_flags(
    gin_files=["tiny.gin"], finalize_config=False
  )
  assert gin.query_parameter("%d_model") == 24
  with pytest.raises(OSError, match="no_such.gin"):
    utils.parse_gin_defaults_and_flags(
      gin_files=["no_such.gin"], finalize_config=False
    )


def test_init_checkpoint_restores_the_global_step(tmp_path):
  """Fine-tuning goes on from the pretrained step, as the original's did."""
  pretrained = dtu.estimator(tmp_path / "pretrained", mesh=dtu.MESH_1)
  pretrained.train(dtu.input_fn, 3)
  finetune = dtu.estimator(
    tmp_path / "finetune",
    mesh=dtu.MESH_1,
    init_checkpoint=pretrained.latest_checkpoint(),
  )
  # train_steps counts from the pretrained step: 2 fine-tuning steps.
  out = finetune.train(dtu.input_fn, 5)
  assert out["step"] == 5
  assert finetune.latest_checkpoint().endswith("model.ckpt-5")
  assert not os.path.exists(tmp_path / "finetune" / "model.ckpt-2.index")
  # Nothing left to train when train_steps <= the pretrained step (from 0,
  # 3 steps would run and report their loss).
  again = dtu.estimator(
    tmp_path / "again",
    mesh=dtu.MESH_1,
    init_checkpoint=pretrained.latest_checkpoint(),
  )
  assert again.train(dtu.input_fn, 3) == {"step": 3}
  # ... but model_dir then holds the pretrained weights at the pretrained
  # step, as the original's session-start save left them.
  assert again.latest_checkpoint().endswith("model.ckpt-3")
  pretrained_values = dict(tf.train.list_variables(pretrained.model_dir))
  for name, shape in tf.train.list_variables(again.model_dir):
    assert pretrained_values[name] == shape
    np.testing.assert_array_equal(
      tf.train.load_variable(again.model_dir, name),
      tf.train.load_variable(pretrained.model_dir, name),
    )


class _Chars:
  """A vocabulary whose ids 3.. are the letters a..; 0 pads, 1 is EOS."""

  vocab_size = dtu.VOCAB

  def decode(self, ids):
    return "".join(chr(ord("a") + i - 3) for i in ids if i >= 3)


def _results():
  return [
    {
      "inputs": np.array([3, 4, 1, 0]),
      "targets": np.array([5, 1, 0, 0]),
      "scores": -1.5,
    },
    {
      "inputs": np.array([6, 1, 0, 0]),
      "targets": np.array([3, 4, 5, 1]),
      "scores": -0.25,
    },
  ]


def test_save_scores_returns_and_writes_what_the_original_did(tmp_path):
  prefix = str(tmp_path / "out")
  scores, inputs, targets = utils.save_scores(_results(), _Chars(), prefix)
  assert scores == [-1.5, -0.25]
  assert inputs == ["ab", "d"] and targets == ["c", "abc"]
  read = lambda suffix: utils.get_inputs_from_file(prefix + suffix)
  assert read(".scores") == ["-1.5", "-0.25"]
  assert read(".targets") == ["c", "abc"]
  assert read(".lengths") == ["2", "4"]  # ids before the first padding
  assert read(".inputs") == ["ab", "d"]
  lm = [{k: v for k, v in r.items() if k != "inputs"} for r in _results()]
  assert utils.save_scores(lm, _Chars()) == ([-1.5, -0.25], ["c", "abc"])
  assert utils.save_scores(lm, _Chars(), save_example_text=False) == [
    -1.5,
    -0.25,
  ]
  with pytest.raises(ValueError, match="No examples"):
    utils.save_scores([], _Chars())


def test_save_scores_to_tfrecords_and_the_lazy_scorer_write_shards(
  tmp_path, monkeypatch
):
  prefix = str(tmp_path / "scores")
  utils.save_scores_to_tfrecords(_results(), _Chars(), prefix, shard_idx=3)
  records = [
    tf.train.Example.FromString(r.numpy())
    for r in tf.data.TFRecordDataset(prefix + "_3.tfrecord")
  ]
  feature = lambda r, k: r.features.feature[k]
  assert [feature(r, "input").bytes_list.value[0] for r in records] == [
    b"ab",
    b"d",
  ]
  assert [feature(r, "target").bytes_list.value[0] for r in records] == [
    b"c",
    b"abc",
  ]
  np.testing.assert_allclose(
    [feature(r, "score").float_list.value[0] for r in records], [-1.5, -0.25]
  )
  # The lazy scorer post-processes in shards of num_examples_per_shard.
  results = _results() * 3
  monkeypatch.setattr(
    driver_scoring,
    "score_with_estimator",
    lambda *args, **kwargs: args[5](results, args[4]),
  )
  shards = []
  utils.score_with_estimator_lazy(
    None,
    None,
    None,
    None,
    _Chars(),
    score_postprocess_fn=lambda r, v, shard_idx: shards.append(
      (shard_idx, len(r))
    ),
    num_examples_per_shard=4,
  )
  assert shards == [(0, 4), (1, 2)]


def test_eval_model_and_run_signatures_follow_the_original():
  params = inspect.signature(utils.eval_model).parameters
  names = list(params)
  assert names[names.index("output_eval_examples") + 1 :][:2] == [
    "eval_dir_suffix",
    "score_with_estimator_fn",
  ]
  assert params["score_with_estimator_fn"].default is (
    utils.score_with_estimator
  )
  assert params["max_batches"].kind is inspect.Parameter.KEYWORD_ONLY
  assert (
    inspect.signature(utils.run).parameters["eval_dir_suffix"].default is None
  )
  for fn in (utils.score_from_strings, utils.score_from_dataset):
    assert (
      inspect.signature(fn).parameters["score_with_estimator_fn"].default
      is utils.score_with_estimator
    )


def test_one_process_runs_keep_tensorflows_graph_rewrites(tmp_path):
  """Without a cluster the driver leaves Grappler's arithmetic optimizer on.

  It is on in TensorFlow (and was for the original); turning it off for the
  process changed how bfloat16 activations round, so scores of a checkpoint
  the original wrote differed from its own by a bfloat16 ulp. Only cluster
  runs turn it off (their rewrites would depend on the task layout).
  """
  before = tf.config.optimizer.get_experimental_options()
  dtu.tiny_gin("")
  utils.get_estimator(
    model_type="bitransformer",
    vocabulary=vocabulary.ByteVocabulary(),
    mesh_shape="",
    layout_rules="",
    model_dir=str(tmp_path),
    batch_size=2,
    sequence_length={"inputs": 8, "targets": 8},
    autostack=True,
    learning_rate_schedule=0.01,
    keep_checkpoint_max=None,
    save_checkpoints_steps=100,
    optimizer=None,
    predict_fn=None,
    variable_filter=None,
    ensemble_inputs=None,
    use_tpu=False,
    tpu_job_name=None,
    iterations_per_loop=100,
    cluster=None,
  )
  after = tf.config.optimizer.get_experimental_options()
  assert after.get("arithmetic_optimization") == before.get(
    "arithmetic_optimization"
  )
  assert after.get("arithmetic_optimization") is not False


class _EstimatorBuilt(Exception):
  """Raised by the stand-in get_estimator once run has built its arguments."""


def test_run_builds_the_estimator_per_mode_as_the_original(monkeypatch):
  # The original's run: ensemble_inputs only in training (None otherwise);
  # score_in_predict_mode for every mode naming "score".
  built = {}

  def record(*args, **kwargs):
    bound = inspect.signature(utils.get_estimator).bind(*args, **kwargs)
    built.update(bound.arguments)
    raise _EstimatorBuilt()

  monkeypatch.setattr(run_lib, "get_estimator", record)
  expected = {
    "train": (3, False),
    "infer": (None, False),
    "perplexity_eval": (None, False),
    "score_from_dataset": (None, True),
    "score_from_strings": (None, True),
    "export_score": (None, True),
    "export_infer": (None, False),
  }
  run = functools.partial(
    utils.run,
    None,
    None,
    None,
    None,
    "/tmp/unused_model_dir",
    mesh_shape="",
    layout_rules="",
    sequence_length=8,
    batch_size=8,
    train_steps=1,
  )
  for mode, (ensemble_inputs, scores) in expected.items():
    built.clear()
    with pytest.raises(_EstimatorBuilt):
      run(mode=mode, ensemble_inputs=3)
    assert built["ensemble_inputs"] == ensemble_inputs, mode
    assert built.get("score_in_predict_mode", False) == scores, mode
  with pytest.raises(ValueError, match='requires dataset_split=="train"'):
    run(mode="train", dataset_split="validation")
