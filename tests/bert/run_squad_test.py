"""End to end: run_squad.main fine-tunes, then predicts, on offline SQuAD data.

The toy set is trivially learnable: each context is a generated sentence
with one sentiment word ("happy", "sad", ...) inserted at a random place,
and the answer to the one question is that word. A fresh tiny BERT trained
by run_squad.main must find it far more often than a random span would;
every predicted answer must be a span of its context.
"""

import json
import os
import random

from absl import flags
from absl.testing import flagsaver
import tensorflow as tf

from mesh_tensorflow.bert import demo_data
from mesh_tensorflow.bert import run_squad
from mesh_tensorflow.bert._src import data as bert_data
from tests import mesh_test_util

FLAGS = flags.FLAGS

SENTIMENT_WORDS = sorted(
  word for words in bert_data.CLASSIFICATION_WORDS.values() for word in words
)
QUESTION = "which word is good or bad ?"


def _squad_set(num_questions, seed):
  """SQuAD json: one paragraph per question, the answer a sentiment word."""
  rng = random.Random(seed)
  documents = demo_data.generate_corpus(num_questions, 1, seed=seed)
  paragraphs = []
  for index, (sentence,) in enumerate(documents):
    words = sentence.split()
    position = rng.randrange(len(words))
    answer = rng.choice(SENTIMENT_WORDS)
    words.insert(position, answer)
    context = " ".join(words)
    paragraphs.append(
      {
        "context": context,
        "qas": [
          {
            "id": "q%d" % index,
            "question": QUESTION,
            "answers": [
              {
                "text": answer,
                "answer_start": len(" ".join(words[:position] + [""])),
              }
            ],
          }
        ],
      }
    )
  return {
    "version": "1.1",
    "data": [{"title": "toy", "paragraphs": paragraphs}],
  }


def _write_json(path, value):
  with open(path, "w") as f:
    json.dump(value, f)
  return str(path)


def test_run_squad_trains_then_predicts_the_answers(tmp_path):
  if not FLAGS.is_parsed():
    FLAGS.mark_as_parsed()
  tf.random.set_seed(3)
  data = demo_data.write_demo_data(str(tmp_path / "data"), num_documents=4)
  train_set = _squad_set(128, seed=1)
  # 20 questions: padding features fill the last prediction batch of 8.
  predict_set = _squad_set(20, seed=2)
  output_dir = str(tmp_path / "squad")
  with flagsaver.flagsaver(
    vocab_file=data.vocab_file,
    bert_config_file=data.bert_config_file,
    output_dir=output_dir,
    train_file=_write_json(tmp_path / "train.json", train_set),
    predict_file=_write_json(tmp_path / "dev.json", predict_set),
    do_train=True,
    do_predict=True,
    max_seq_length=32,
    doc_stride=16,
    max_query_length=12,
    train_batch_size=16,
    predict_batch_size=8,
    learning_rate=1e-3,
    num_train_epochs=4.0,
    n_best_size=5,
    max_answer_length=4,
    mesh_shape="batch:2",
    layout="batch:batch",
  ):
    with mesh_test_util.as_tf1_program():
      run_squad.main([])
  with open(os.path.join(output_dir, "predictions.json")) as f:
    predictions = json.load(f)
  with open(os.path.join(output_dir, "nbest_predictions.json")) as f:
    nbest = json.load(f)
  assert not os.path.exists(os.path.join(output_dir, "null_odds.json"))
  paragraphs = predict_set["data"][0]["paragraphs"]
  assert sorted(predictions) == sorted(p["qas"][0]["id"] for p in paragraphs)
  correct = 0
  for paragraph in paragraphs:
    qa = paragraph["qas"][0]
    answer = predictions[qa["id"]]
    assert answer and answer in paragraph["context"]
    assert nbest[qa["id"]][0]["text"] == answer
    for entry in nbest[qa["id"]]:
      assert entry["text"] in paragraph["context"]
    correct += answer == qa["answers"][0]["text"]
  # A random span (up to 4 long) of a context's 11 words is the answer
  # about once in 40 tries; the sentiment words are easy to learn.
  assert correct / len(paragraphs) > 0.75, predictions
