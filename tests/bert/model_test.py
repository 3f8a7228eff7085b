"""Tests of mesh_tensorflow.bert.bert: BertModel on meshes, heads, config."""

import json

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.bert import bert as bert_lib
from mesh_tensorflow.bert._src import model as model_src
from tests import mesh_test_util
from tests import meshes

BATCH, SEQ, PRED, VOCAB = 4, 8, 3, 50

# The variables of a 2-block pretraining model, named as the original's.
ORIGINAL_NAMES = (
  [
    "bert/embeddings/word_embeddings",
    "bert/embeddings/token_type_embeddings",
    "bert/embeddings/position_embeddings",
    "bert/embeddings/layer_norm/scale",
    "bert/embeddings/layer_norm/bias",
  ]
  + [
    "bert/encoder/block_%d/%s" % (block, name)
    for block in range(2)
    for name in [
      "attention/query/kernel",
      "attention/query/bias",
      "attention/key/kernel",
      "attention/key/bias",
      "attention/value/kernel",
      "attention/value/bias",
      "attention/output/kernel",
      "attention/output/bias",
      "attention/layer_norm/scale",
      "attention/layer_norm/bias",
      "feedforward/dense_1/kernel",
      "feedforward/dense_1/bias",
      "feedforward/dense_2/kernel",
      "feedforward/dense_2/bias",
      "feedforward/layer_norm/scale",
      "feedforward/layer_norm/bias",
    ]
  ]
  + [
    "bert/pooler/dense/kernel",
    "bert/pooler/dense_1/bias",
    "cls/predictions/transform/dense/kernel",
    "cls/predictions/transform/dense_1/bias",
    "cls/predictions/transform/layer_norm/scale",
    "cls/predictions/transform/layer_norm/bias",
    "cls/predictions/output_bias",
    "cls/seq_relationship/kernel",
    "cls/seq_relationship/bias",
  ]
)


def _config(**overrides):
  fields = dict(
    vocab_size=VOCAB,
    d_model=16,
    num_blocks=2,
    attention_num_heads=4,
    feedforward_intermediate_size=32,
    max_position_embeddings=16,
    type_vocab_size=2,
  )
  fields.update(overrides)
  return bert_lib.BertConfig(**fields)


def _features():
  rng = np.random.RandomState(0)
  mask = (np.arange(SEQ)[None, :] < rng.randint(4, SEQ + 1, [BATCH, 1])).astype(
    np.int32
  )
  return {
    "input_ids": rng.randint(5, VOCAB, [BATCH, SEQ]) * mask,
    "input_mask": mask,
    "segment_ids": (np.arange(SEQ)[None, :] >= SEQ // 2) * mask,
    "masked_lm_positions": rng.randint(1, 4, [BATCH, PRED]),
    "masked_lm_ids": rng.randint(5, VOCAB, [BATCH, PRED]),
    "masked_lm_weights": np.array(
      [[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 1]], np.float32
    ),
    "next_sentence_labels": np.array([0, 1, 1, 0]),
  }


def _pretraining_losses(
  mesh, config, is_training=False, mesh_shape="", layout=""
):
  """[total, masked-LM, next-sentence, extra] losses of BertModel's heads."""
  batch = mtf.Dimension("batch", BATCH)
  seq = mtf.Dimension("seq", SEQ)
  pred = mtf.Dimension("max_pred_seq", PRED)
  dims = {
    "input_ids": [batch, seq],
    "input_mask": [batch, seq],
    "segment_ids": [batch, seq],
    "masked_lm_positions": [batch, pred],
    "masked_lm_ids": [batch, pred],
    "masked_lm_weights": [batch, pred],
    "next_sentence_labels": [batch],
  }
  features = {
    name: mtf.import_tf_tensor(mesh, tf.constant(value), mtf.Shape(dims[name]))
    for name, value in _features().items()
  }
  model = bert_lib.BertModel(
    config=config,
    is_training=is_training,
    input_ids=features["input_ids"],
    input_mask=features["input_mask"],
    token_type_ids=features["segment_ids"],
    mesh_shape=mesh_shape,
    layout=layout,
  )
  mlm_loss, _, _ = model.get_masked_lm_output(
    features["masked_lm_positions"],
    features["masked_lm_ids"],
    features["masked_lm_weights"],
  )
  nsp_loss, _, _ = model.get_next_sentence_output(
    features["next_sentence_labels"]
  )
  extra = model.get_extra_loss()
  if not isinstance(extra, mtf.Tensor):
    extra = mtf.zeros(mesh, mtf.Shape([]))
  return [mlm_loss + nsp_loss, mlm_loss, nsp_loss, extra]


def _run(store, build, mesh_shape, layout):
  """build(mesh) lowered on a placement mesh over a shared variable store."""
  with mtf.variable_store(store):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "bert_mesh")
    outputs = build(mesh)
    lowering = mtf.Lowering(
      graph, {mesh: mesh_test_util.mesh_impl_for(mesh_shape, layout)}
    )
    return [np.asarray(lowering.export_to_tf_tensor(t)) for t in outputs]


BERT_MESHES = meshes.trio(
  all_4=["batch:all", "vocab:all;num_heads:all;intermediate:all"],
  rows_cols=[
    "batch:rows;vocab:cols;intermediate:cols;num_heads:cols",
    "batch:cols;hidden:rows",
  ],
)


@pytest.fixture(scope="module")
def one_device_losses():
  """The losses on one device, with the store whose weights every mesh uses."""
  mesh_test_util.skip_under_tf1("eager placement runs over a shared store")
  store = mtf.VariableStore()
  losses = _run(store, lambda m: _pretraining_losses(m, _config()), "", "")
  return store, losses


@meshes.parametrize(BERT_MESHES)
def test_loss_is_the_same_on_every_mesh_and_layout(
  one_device_losses, mesh_shape, layout
):
  store, expected = one_device_losses
  actual = _run(
    store,
    lambda m: _pretraining_losses(
      m, _config(), mesh_shape=mesh_shape, layout=layout
    ),
    mesh_shape,
    layout,
  )
  np.testing.assert_allclose(actual, expected, rtol=2e-6, atol=2e-6)
  # An untrained model predicts nearly uniformly over the padded vocabulary.
  assert abs(expected[1] - np.log(128)) < 0.1
  assert abs(expected[2] - np.log(2)) < 0.1


def test_variables_have_the_original_names(one_device_losses):
  store, _ = one_device_losses
  assert sorted(store.masters) == sorted(ORIGINAL_NAMES)
  assert store.masters["bert/embeddings/word_embeddings"].shape == (128, 16)


def test_masked_lm_loss_is_the_weighted_mean_of_cross_entropies():
  mesh_test_util.skip_under_tf1("eager run")
  store = mtf.VariableStore()

  def build(mesh):
    model = bert_lib.BertModel(
      _config(num_blocks=1),
      False,
      mtf.import_tf_tensor(
        mesh, tf.constant(_features()["input_ids"]), "batch:4;seq:8"
      ),
    )
    features = _features()
    shape = mtf.Shape([mtf.Dimension("batch", 4), mtf.Dimension("pred", 3)])
    loss, per_example, logits = model.get_masked_lm_output(
      *[
        mtf.import_tf_tensor(mesh, tf.constant(features[name]), shape)
        for name in (
          "masked_lm_positions",
          "masked_lm_ids",
          "masked_lm_weights",
        )
      ]
    )
    return [loss, per_example, logits]

  loss, per_example, logits = _run(store, build, "", "")
  features = _features()
  log_z = np.log(np.sum(np.exp(logits.astype(np.float64)), -1))
  picked = np.take_along_axis(logits, features["masked_lm_ids"][..., None], -1)
  expected = log_z - picked[..., 0] + 1e-4 * log_z**2  # with the z-loss
  np.testing.assert_allclose(per_example, expected, rtol=1e-4)
  weights = features["masked_lm_weights"]
  np.testing.assert_allclose(
    loss, np.sum(weights * expected) / (np.sum(weights) + 1e-5), rtol=1e-4
  )


def test_moe_blocks_and_relative_attention_bias_build_and_train():
  mesh_test_util.skip_under_tf1("eager run")
  config = _config(
    block_layers="attention,moe,feedforward",
    num_blocks=1,
    position_signal="relative_attention_bias",
    moe_num_experts=4,
    moe_intermediate_size=8,
    residual_structure="direct",
  )
  store = mtf.VariableStore()
  losses = _run(
    store,
    lambda m: _pretraining_losses(m, config, is_training=True),
    "",
    "",
  )
  assert np.all(np.isfinite(losses))
  assert losses[3] > 0  # the experts' load-balancing loss
  names = set(store.masters)
  assert "bert/encoder/relative_attention_bias" in names
  assert "bert/embeddings/position_embeddings" not in names
  assert any(n.startswith("bert/encoder/block_0/moe/") for n in names)
  assert "bert/layer_norm/scale" in names  # "direct": the final norm


def test_relative_position_buckets():
  mesh_test_util.skip_under_tf1("eager run")

  def build(mesh):
    relative = mtf.import_tf_tensor(
      mesh, tf.constant([0, -1, 1, -7, -8, -200, 200]), "n:7"
    )
    return [model_src.relative_position_bucket(relative)]

  (buckets,) = _run(mtf.VariableStore(), build, "", "")
  # Memory before the query (negative) uses buckets 0-15, after it 16-31;
  # distances from 8 on share logarithmic buckets, up to the last one.
  np.testing.assert_array_equal(buckets, [0, 1, 17, 7, 8, 15, 31])


def test_layer_norm_matches_numpy():
  mesh_test_util.skip_under_tf1("eager run")
  x = np.random.RandomState(1).randn(3, 5).astype(np.float32)

  def build(mesh):
    t = mtf.import_tf_tensor(mesh, tf.constant(x), "a:3;d:5")
    d = t.shape.dims[1]
    return [
      bert_lib.layer_norm(t, d),
      bert_lib.layer_norm(t, d, subtract_mean=False, use_bias=False),
    ]

  centred, scaled = _run(mtf.VariableStore(), build, "", "")
  c = x - x.mean(-1, keepdims=True)
  np.testing.assert_allclose(
    centred, c / np.sqrt((c**2).mean(-1, keepdims=True) + 1e-6), rtol=1e-5
  )
  np.testing.assert_allclose(
    scaled, x / np.sqrt((x**2).mean(-1, keepdims=True) + 1e-6), rtol=1e-5
  )


def test_config_reads_google_bert_json(tmp_path):
  path = tmp_path / "bert_config.json"
  path.write_text(
    json.dumps(
      {
        "vocab_size": 30522,
        "hidden_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 512,
        "hidden_act": "gelu",
        "hidden_dropout_prob": 0.2,
        "type_vocab_size": 2,
      }
    )
  )
  config = bert_lib.BertConfig.from_json_file(str(path))
  assert (config.d_model, config.num_blocks, config.attention_num_heads) == (
    128,
    2,
    2,
  )
  assert config.feedforward_intermediate_size == 512
  assert config.layer_output_dropout_prob == 0.2
  assert config.block_layers == ["attention", "feedforward"]
  again = bert_lib.BertConfig.from_dict(json.loads(config.to_json_string()))
  assert again.to_dict() == config.to_dict()


def test_config_rejects_unknown_choices():
  with pytest.raises(ValueError, match="position_signal"):
    bert_lib.BertConfig(10, position_signal="sinusoid")
  with pytest.raises(ValueError, match="residual_structure"):
    bert_lib.BertConfig(10, residual_structure="pre")


def test_get_activation():
  assert bert_lib.get_activation("GELU") is mtf.gelu
  assert bert_lib.get_activation("relu") is mtf.relu
  assert bert_lib.get_activation("linear") is None
  assert bert_lib.get_activation("") is None
  assert bert_lib.get_activation(mtf.tanh) is mtf.tanh
  with pytest.raises(ValueError, match="Unsupported activation: swish"):
    bert_lib.get_activation("swish")


def test_assignment_map_skips_optimizer_slots_and_step(tmp_path):
  with tf.Graph().as_default():
    variables = {
      name: tf.compat.v1.get_variable(name, [2])
      for name in ["bert/w", "bert/w/adam_m", "global_step", "cls/b"]
    }
    saver = tf.compat.v1.train.Saver(list(variables.values()))
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      prefix = saver.save(sess, str(tmp_path / "model.ckpt"))

  class Var:
    def __init__(self, name):
      self.name = name

  model_vars = [Var(n) for n in ["bert/w:0", "bert/w/adam_m:0", "global_step"]]
  assignment, initialized = bert_lib.get_assignment_map_from_checkpoint(
    model_vars, prefix
  )
  assert dict(assignment) == {"bert/w": "bert/w"}
  assert initialized == {"bert/w": 1, "bert/w:0": 1}
