"""tpu_estimator_model_fn and the streaming metrics, in tf.compat.v1 graphs.

The model_fn is driven as legacy code drove it without an Estimator: build
the EstimatorSpec in a graph, initialise, run the MtfRestoreHook's copy, then
run train_op / metric updates / predictions in a Session.
"""

import inspect

import gin
import numpy as np
import pytest
import tensorflow as tf

from tests.transformer import driver_test_util as dtu
from transformer import utils
from transformer import vocabulary
from transformer._src.driver import model_fn as driver_model_fn

tf1 = tf.compat.v1


def _model_fn(
  tmp_path, mesh=dtu.MESH_2X2, vocabulary=None, use_tpu=False, **kwargs
):
  dtu.tiny_gin("utils.get_variable_dtype.activation_dtype = 'float32'")
  mesh_shape, layout = mesh
  model = utils.build_model(
    "bitransformer",
    input_vocab_size=dtu.VOCAB,
    output_vocab_size=dtu.VOCAB,
    layout_rules=layout,
    mesh_shape=mesh_shape,
  )
  return utils.tpu_estimator_model_fn(
    "bitransformer",
    model,
    vocabulary,
    str(tmp_path),
    use_tpu,
    mesh_shape,
    layout,
    dtu.BATCH,
    dtu.LENGTH,
    True,
    None,
    100,
    learning_rate_schedule=lambda step: 0.01 + 0.0 * tf.cast(step, tf.float32),
    optimizer=None,
    **kwargs,
  )


def _start(session, specs):
  session.run(
    [tf1.global_variables_initializer(), tf1.local_variables_initializer()]
  )
  for spec in specs:
    for hook in spec.hooks:
      hook.begin()
      hook.after_create_session(session, None)


def test_train_eval_and_predict_in_one_v1_graph(tmp_path):
  x, y = dtu.reverse_data(dtu.BATCH)
  model_fn = _model_fn(tmp_path)
  with tf.Graph().as_default():
    features = {"inputs": tf.constant(x), "targets": tf.constant(y)}
    train = model_fn(features, None, "train")
    evaluate = model_fn(features, None, "eval")
    decode = model_fn({"inputs": tf.constant(x)}, None, "infer")
    assert train.mode == "train" and train.saver_listener is not None
    with tf1.Session() as session:
      _start(session, [train])
      losses = [session.run([train.train_op, train.loss])[1] for _ in range(30)]
      assert losses[-1] < 0.7 * losses[0]
      step = tf1.train.get_global_step()
      assert session.run(step) == 30
      # The saver listener copies trained slices into the masters, which
      # the eval and predict lowerings copy to their slices.
      train.saver_listener.begin()
      train.saver_listener.before_save(session, 30)
      _start(session, [evaluate, decode])
      updates = {k: v[1] for k, v in evaluate.eval_metric_ops.items()}
      values = {k: v[0] for k, v in evaluate.eval_metric_ops.items()}
      session.run(updates)
      metrics = session.run(values)
      outputs = session.run(decode.predictions)
  assert metrics["num_eval_tokens"] == dtu.BATCH * dtu.LENGTH
  assert metrics["max_targets_length"] == dtu.LENGTH
  assert 0 <= metrics["token_accuracy"] <= 1
  np.testing.assert_allclose(metrics["mean_label"], y.mean(), rtol=1e-6)
  assert metrics["neg_log_perplexity"] < 0
  assert outputs["outputs"].shape == (dtu.BATCH, dtu.LENGTH)
  np.testing.assert_array_equal(outputs["inputs"], x)


def test_scores_in_predict_mode_match_eval_perplexity(tmp_path):
  x, y = dtu.reverse_data(dtu.BATCH)
  model_fn = _model_fn(tmp_path, score_in_predict_mode=True)
  with tf.Graph().as_default():
    features = {"inputs": tf.constant(x), "targets": tf.constant(y)}
    evaluate = model_fn(features, None, "eval")
    score = model_fn(features, None, "infer")
    with tf1.Session() as session:
      _start(session, [evaluate, score])
      session.run({k: v[1] for k, v in evaluate.eval_metric_ops.items()})
      metrics = session.run(
        {k: v[0] for k, v in evaluate.eval_metric_ops.items()}
      )
      scores = session.run(score.predictions["scores"])
  assert scores.shape == (dtu.BATCH,)
  np.testing.assert_allclose(
    scores.sum(),
    metrics["neg_log_perplexity"] * metrics["num_eval_tokens"],
    rtol=1e-5,
  )


def test_predictions_are_the_originals_texts_or_ids(tmp_path):
  """Off TPU, with a vocabulary that decodes in the graph, predictions are
  texts; with use_tpu, ids. predict_batch_size keeps the first rows;
  scoring predicts the targets the model read and their scores.
  """
  vocab = vocabulary.ByteVocabulary()
  x, y = dtu.reverse_data(dtu.BATCH)
  got = {}
  for use_tpu in (False, True):
    for score in (False, True):
      model_fn = _model_fn(
        tmp_path / str(use_tpu),
        vocabulary=vocab,
        use_tpu=use_tpu,
        score_in_predict_mode=score,
      )
      with tf.Graph().as_default():
        tf1.set_random_seed(5)  # the same weights in every graph
        features = {"inputs": tf.constant(x), "predict_batch_size": 3}
        if score:
          features["targets"] = tf.constant(y)
        spec = model_fn(features, None, "infer")
        with tf1.Session() as session:
          _start(session, [spec])
          got[use_tpu, score] = session.run(spec.predictions)
  ids, texts = got[True, False], got[False, False]
  assert sorted(texts) == ["inputs", "outputs"]
  assert ids["inputs"].shape == (3, dtu.LENGTH)
  np.testing.assert_array_equal(ids["inputs"], x[:3])
  for key in ("inputs", "outputs"):
    want = [vocab.decode(row.tolist()) for row in ids[key]]
    assert [t.decode("utf-8") for t in texts[key]] == want
  scored_ids, scored_texts = got[True, True], got[False, True]
  assert sorted(scored_ids) == ["scores", "targets"]
  np.testing.assert_array_equal(scored_ids["targets"], y)
  np.testing.assert_array_equal(scored_texts["scores"], scored_ids["scores"])
  assert [t.decode("utf-8") for t in scored_texts["targets"]] == [
    vocab.decode(row.tolist()) for row in y
  ]


def test_unknown_mode_is_named(tmp_path):
  model_fn = _model_fn(tmp_path, mesh=("", ""))
  x, y = dtu.reverse_data(dtu.BATCH)
  with tf.Graph().as_default():
    with pytest.raises(ValueError, match="unknown mode 'training'"):
      model_fn(
        {"inputs": tf.constant(x), "targets": tf.constant(y)}, None, "training"
      )


def test_metric_sum_and_max_accumulate():
  with tf.Graph().as_default():
    values = tf1.placeholder(tf.float32, [None])
    total, add = utils.metric_sum(values)
    largest, update = utils.metric_max(values, name="biggest")
    assert "biggest" in largest.name
    assert total in tf1.local_variables()
    with tf1.Session() as session:
      session.run(tf1.local_variables_initializer())
      for batch in ([1.0, 2.0], [4.0], [-3.0, 0.5]):
        session.run([add, update], {values: batch})
      assert session.run([total, largest]) == [4.5, 4.0]


def test_gin_bindings_reach_the_runs_estimator(tmp_path):
  dtu.tiny_gin()
  gin.parse_config("""
utils.tpu_estimator_model_fn.outer_batch_size = 2
utils.tpu_estimator_model_fn.init_variable_filter = "encoder/.*"
""")
  est = utils.get_estimator(
    "bitransformer",
    _vocab(),
    "",
    "",
    str(tmp_path),
    dtu.BATCH,
    dtu.LENGTH,
    True,
    None,
    None,
    100,
    None,
    None,
    None,
    None,
    False,
    None,
    100,
    None,
  )
  assert est.outer_batch_size == 2
  assert est.init_variable_filter == "encoder/.*"
  assert [d.size for d in est.batch_dims()] == [2, dtu.BATCH // 2]
  # predict_fn is deny-listed, as in the original.
  with pytest.raises(ValueError, match="predict_fn"):
    gin.parse_config("utils.tpu_estimator_model_fn.predict_fn = None")


class _vocab:  # noqa: N801  pylint: disable=invalid-name
  vocab_size = dtu.VOCAB


def test_model_fn_module_exports():
  assert utils.tpu_estimator_model_fn is driver_model_fn.tpu_estimator_model_fn
  assert utils.metric_sum is driver_model_fn.metric_sum


@pytest.mark.slow
def test_simd_model_fn_trains_and_evaluates_like_placement(tmp_path):
  x, y = dtu.reverse_data(dtu.BATCH)
  results = {}
  for mesh_impl in ("placement", "simd"):
    model_fn = _model_fn(tmp_path / mesh_impl, mesh_impl=mesh_impl)
    with tf.Graph().as_default():
      tf1.set_random_seed(3)
      features = {"inputs": tf.constant(x), "targets": tf.constant(y)}
      train = model_fn(features, None, "train")
      evaluate = model_fn(features, None, "eval")
      with tf1.Session() as session:
        _start(session, [train])
        losses = [
          session.run([train.train_op, train.loss])[1] for _ in range(3)
        ]
        train.saver_listener.begin()
        train.saver_listener.before_save(session, 3)
        _start(session, [evaluate])
        results[mesh_impl] = losses + [session.run(evaluate.loss)]
  np.testing.assert_allclose(results["simd"], results["placement"], rtol=1e-5)


def test_simd_model_fn_decodes_in_a_v1_graph_like_placement(tmp_path):
  # The replica program is traced as one function, so its decoding while
  # loops are functional While ops, whose collectives the replicas share
  # (see CollectiveBackend.while_loop), in a v1 graph too.
  x, _ = dtu.reverse_data(dtu.BATCH)
  outputs = {}
  for mesh_impl in ("placement", "simd"):
    model_fn = _model_fn(tmp_path / mesh_impl, mesh_impl=mesh_impl)
    with tf.Graph().as_default():
      tf1.set_random_seed(3)
      decode = model_fn({"inputs": tf.constant(x)}, None, "infer")
      with tf1.Session() as session:
        _start(session, [decode])
        outputs[mesh_impl] = session.run(decode.predictions)["outputs"]
  assert outputs["simd"].shape == (dtu.BATCH, dtu.LENGTH)
  np.testing.assert_array_equal(outputs["simd"], outputs["placement"])


def test_weight_decay_checkpoint_is_accepted_and_changes_nothing(tmp_path):
  # The original's last parameter; its released code never reads it.
  names = [
    name
    for name, param in inspect.signature(
      utils.tpu_estimator_model_fn
    ).parameters.items()
    if param.kind != param.KEYWORD_ONLY  # ours follow the original's
  ]
  assert names[-2:] == ["hierarchical_tiling_spec", "weight_decay_checkpoint"]
  assert (
    inspect.signature(utils.tpu_estimator_model_fn)
    .parameters["weight_decay_checkpoint"]
    .default
    is None
  )
  x, y = dtu.reverse_data(dtu.BATCH)
  losses = []
  for kwargs in ({}, {"weight_decay_checkpoint": str(tmp_path / "absent")}):
    model_fn = _model_fn(tmp_path / str(len(losses)), **kwargs)
    with tf.Graph().as_default():
      tf1.set_random_seed(7)
      features = {"inputs": tf.constant(x), "targets": tf.constant(y)}
      train = model_fn(features, None, "train")
      with tf1.Session() as session:
        _start(session, [train])
        losses.append(
          [session.run([train.train_op, train.loss])[1] for _ in range(3)]
        )
  np.testing.assert_allclose(losses[1], losses[0], rtol=1e-6)
  try:
    gin.parse_config(
      "utils.tpu_estimator_model_fn.weight_decay_checkpoint = '/tmp/ckpt'"
    )
  finally:
    gin.clear_config()


def test_global_step_made_in_a_graph_can_be_read_on_a_tpu(tmp_path):
  # An Estimator whose variables go to the current graph (as
  # tpu_estimator_model_fn's, or to build the TPU program without running it)
  # makes the graph's global step a resource variable, as TPUEstimator did:
  # a TPU computation reads no ref variable, legacy mode's default kind.
  with tf.Graph().as_default():
    est = dtu.estimator(
      tmp_path, mesh=dtu.MESH_1, variables_in_current_graph=True
    )
    assert est.global_step is tf.compat.v1.train.get_global_step()
    assert "Resource" in type(est.global_step).__name__
    (step,) = tf.compat.v1.tpu.replicate(
      lambda: est.global_step.read_value() + 1, [[]]
    )
    assert step[0].dtype == tf.int64
