"""Tests of SQuAD data handling and answers (mesh_tensorflow.bert.run_squad)."""

import inspect
import json

from absl import flags
from absl.testing import flagsaver
import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.bert import bert as bert_lib
from mesh_tensorflow.bert import run_squad
from mesh_tensorflow.bert import tokenization
from mesh_tensorflow.bert._src import squad
from mesh_tensorflow.bert._src import squad_answers
from mesh_tensorflow.bert._src import squad_features
from tests import mesh_test_util

VOCAB = (
  "[PAD] [UNK] [CLS] [SEP] who when was the leader john smith born in "
  "( ) - . 1895 1943 a city ##s big"
).split()

CONTEXT = "The leader was John Smith (1895-1943). John was born in a big city."


@pytest.fixture
def tokenizer(tmp_path):
  path = tmp_path / "vocab.txt"
  path.write_text("\n".join(VOCAB) + "\n")
  return tokenization.FullTokenizer(str(path))


@pytest.fixture
def squad_file(tmp_path):
  data = {
    "data": [
      {
        "paragraphs": [
          {
            "context": CONTEXT,
            "qas": [
              {
                "id": "q1",
                "question": "When was John Smith born?",
                "answers": [{"text": "1895", "answer_start": 27}],
              },
              {
                "id": "q2",
                "question": "Who was the leader?",
                "answers": [{"text": "John Smith", "answer_start": 15}],
              },
            ],
          }
        ]
      }
    ]
  }
  path = tmp_path / "train.json"
  path.write_text(json.dumps(data))
  return str(path)


def test_read_squad_examples(squad_file):
  examples = squad_features.read_squad_examples(squad_file, is_training=True)
  assert [e.qas_id for e in examples] == ["q1", "q2"]
  first = examples[0]
  assert first.doc_tokens[:5] == ["The", "leader", "was", "John", "Smith"]
  # The answer "1895" lies in the word "(1895-1943)."
  assert first.start_position == first.end_position == 5
  assert (examples[1].start_position, examples[1].end_position) == (3, 4)
  assert "qas_id: q1" in repr(first)


def _features(examples, tokenizer, max_seq_length, doc_stride, is_training):
  features = []
  squad_features.convert_examples_to_features(
    examples,
    tokenizer,
    max_seq_length,
    doc_stride,
    8,
    is_training,
    features.append,
  )
  return features


def test_answer_span_is_narrowed_to_the_answer_tokens(squad_file, tokenizer):
  examples = squad_features.read_squad_examples(squad_file, is_training=True)
  (feature,) = _features(examples[:1], tokenizer, 48, 16, True)
  answer = feature.tokens[feature.start_position : feature.end_position + 1]
  assert answer == ["1895"]
  assert feature.tokens[:2] == ["[CLS]", "when"]
  assert (
    feature.segment_ids[: len(feature.tokens)].count(1)
    == len(feature.tokens) - feature.tokens.index("[SEP]") - 1
  )
  assert len(feature.input_ids) == 48


def test_long_documents_are_split_into_overlapping_windows(
  squad_file, tokenizer
):
  examples = squad_features.read_squad_examples(squad_file, is_training=True)
  features = _features(examples[1:], tokenizer, 16, 4, True)
  assert len(features) > 2
  assert [f.unique_id for f in features] == list(
    range(
      squad_features.FIRST_UNIQUE_ID,
      squad_features.FIRST_UNIQUE_ID + len(features),
    )
  )
  # Each document piece is scored in exactly one window.
  num_pieces = sum(len(tokenizer.tokenize(w)) for w in examples[1].doc_tokens)
  best = [sum(f.token_is_max_context.values()) for f in features]
  assert sum(best) == num_pieces
  # Windows without the answer point at [CLS].
  answers = [(f.start_position, f.end_position) for f in features]
  assert (0, 0) in answers
  assert any(
    f.tokens[f.start_position : f.end_position + 1] == ["john", "smith"]
    for f in features
  )


def test_check_is_max_context():
  spans = [
    squad_features.DocSpan(0, 5),
    squad_features.DocSpan(3, 5),
    squad_features.DocSpan(6, 5),
  ]
  # Token 4 is the last of span 0 (context min(4, 0) = 0) and has one token
  # left, three right in span 1 (context 1): span 1 is its best.
  assert squad_features.check_is_max_context(spans, 1, 4)
  assert not squad_features.check_is_max_context(spans, 0, 4)
  assert squad_features.check_is_max_context(spans, 2, 9)


def test_get_final_text_restores_the_original_characters():
  get_final_text = squad_answers.get_final_text
  assert get_final_text("1895", "(1895-1943).", True) == "1895"
  assert get_final_text("john smith", "John Smith", True) == "John Smith"
  assert get_final_text("steve", "John Smith", True) == "John Smith"


def _answer_results(features):
  """RawResults whose logits point at "1895" (q1) and "john smith" (q2)."""
  results = []
  for feature in features:
    start = np.full(48, -5.0)
    end = np.full(48, -5.0)
    wanted = "1895" if feature.example_index == 0 else "john"
    first = feature.tokens.index(wanted, feature.tokens.index("[SEP]"))
    last = first + (1 if wanted == "john" else 0)
    start[first], end[last] = 5.0, 5.0
    results.append(
      squad_answers.RawResult(feature.unique_id, list(start), list(end))
    )
  return results


def test_write_predictions(squad_file, tokenizer, tmp_path):
  examples = squad_features.read_squad_examples(squad_file, is_training=False)
  features = _features(examples, tokenizer, 48, 16, False)
  predictions = squad_answers.write_predictions(
    examples,
    features,
    _answer_results(features),
    n_best_size=3,
    max_answer_length=5,
    do_lower_case=True,
    output_prediction_file=str(tmp_path / "p.json"),
    output_nbest_file=str(tmp_path / "n.json"),
    output_null_log_odds_file=str(tmp_path / "null.json"),
  )
  assert predictions == {"q1": "1895", "q2": "John Smith"}
  with open(tmp_path / "p.json") as f:
    assert json.load(f) == predictions
  with open(tmp_path / "n.json") as f:
    nbest = json.load(f)
  assert nbest["q1"][0]["text"] == "1895"
  assert nbest["q1"][0]["probability"] > 0.99
  assert not (tmp_path / "null.json").exists()


def test_run_squad_functions_keep_the_original_signatures_and_read_flags(
  squad_file, tokenizer, tmp_path
):
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()
  signature = inspect.signature(run_squad.write_predictions)
  assert list(signature.parameters) == [
    "all_examples",
    "all_features",
    "all_results",
    "n_best_size",
    "max_answer_length",
    "do_lower_case",
    "output_prediction_file",
    "output_nbest_file",
    "output_null_log_odds_file",
  ]
  assert list(inspect.signature(run_squad.read_squad_examples).parameters) == [
    "input_file",
    "is_training",
  ]
  assert list(inspect.signature(run_squad.get_final_text).parameters) == [
    "pred_text",
    "orig_text",
    "do_lower_case",
  ]
  assert list(inspect.signature(run_squad.create_model).parameters) == [
    "bert_config",
    "is_training",
    "input_ids",
    "input_mask",
    "segment_ids",
  ]
  examples = run_squad.read_squad_examples(squad_file, False)
  features = _features(examples, tokenizer, 48, 16, False)
  paths = [str(tmp_path / name) for name in ("p.json", "n.json", "null.json")]
  with flagsaver.flagsaver(version_2_with_negative=True):
    predictions = run_squad.write_predictions(
      examples, features, _answer_results(features), 3, 5, True, *paths
    )
  assert predictions == {"q1": "1895", "q2": "John Smith"}
  # SQuAD 2.0: the null answer's score minus the best one's, per question.
  with open(paths[2]) as f:
    null_odds = json.load(f)
  assert sorted(null_odds) == ["q1", "q2"]
  assert all(odds < 0 for odds in null_odds.values())


def test_squad_model_logits_and_loss():
  mesh_test_util.skip_under_tf1("eager run")
  config = bert_lib.BertConfig(
    vocab_size=len(VOCAB),
    d_model=16,
    num_blocks=1,
    attention_num_heads=2,
    feedforward_intermediate_size=16,
    max_position_embeddings=16,
  )
  build = squad.squad_model(config, "", "")
  features = {
    "input_ids": tf.constant(np.arange(32).reshape([2, 16]) % 20),
    "input_mask": tf.ones([2, 16], tf.int32),
    "segment_ids": tf.zeros([2, 16], tf.int32),
    "start_positions": tf.constant([3, 4]),
    "end_positions": tf.constant([5, 4]),
  }
  with mtf.variable_store(mtf.VariableStore()):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "bert_mesh")
    outputs = build(mesh, features, False)
    lowering = mtf.Lowering(graph, {mesh: mesh_test_util.mesh_impl_for("", "")})
    values = {
      k: lowering.export_to_tf_tensor(v).numpy() for k, v in outputs.items()
    }
    names = [v.name for v in graph.all_variables]
  assert values["start_logits"].shape == (2, 16)
  log_softmax = lambda x: x - np.log(np.sum(np.exp(x), -1, keepdims=True))
  start = log_softmax(values["start_logits"].astype(np.float64))
  end = log_softmax(values["end_logits"].astype(np.float64))
  expected = -(start[[0, 1], [3, 4]].mean() + end[[0, 1], [5, 4]].mean()) / 2
  np.testing.assert_allclose(values["loss"], expected, rtol=1e-4)
  assert "cls/squad/output/kernel" in names


def test_validate_flags_or_throw():
  if not flags.FLAGS.is_parsed():
    flags.FLAGS.mark_as_parsed()
  config = bert_lib.BertConfig(10, max_position_embeddings=512)
  with pytest.raises(ValueError, match="At least one of `do_train`"):
    run_squad.validate_flags_or_throw(config)
  with flagsaver.flagsaver(
    do_predict=True,
    predict_file="x.json",
    max_seq_length=64,
    max_query_length=64,
  ):
    with pytest.raises(ValueError, match="must be greater than max_query"):
      run_squad.validate_flags_or_throw(config)
