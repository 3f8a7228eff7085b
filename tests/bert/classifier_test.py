"""Tests of run_classifier's data processors and features."""

import numpy as np

from mesh_tensorflow.bert import run_classifier
from mesh_tensorflow.bert import tokenization


def _write(path, rows):
  path.write_text("".join("\t".join(row) + "\n" for row in rows))


def test_mrpc_and_mnli_processors(tmp_path):
  mrpc = tmp_path / "mrpc"
  mrpc.mkdir()
  header = ["Quality", "#1 ID", "#2 ID", "#1 String", "#2 String"]
  _write(mrpc / "train.tsv", [header, ["1", "a", "b", "He ran.", "He ran!"]])
  _write(mrpc / "test.tsv", [header, ["x", "a", "b", "One.", "Two."]])
  (train,) = run_classifier.MrpcProcessor().get_train_examples(str(mrpc))
  assert (train.guid, train.text_a, train.text_b, train.label) == (
    "train-1",
    "He ran.",
    "He ran!",
    "1",
  )
  (test,) = run_classifier.MrpcProcessor().get_test_examples(str(mrpc))
  assert test.label == "0"

  mnli = tmp_path / "mnli"
  mnli.mkdir()
  row = ["7"] + ["-"] * 7 + ["A man sleeps.", "A person rests.", "entailment"]
  _write(mnli / "dev_matched.tsv", [["h"] * 11, row])
  (dev,) = run_classifier.MnliProcessor().get_dev_examples(str(mnli))
  assert (dev.guid, dev.text_b, dev.label) == (
    "dev_matched-7",
    "A person rests.",
    "entailment",
  )


def test_convert_single_example_pairs_and_padding(tmp_path):
  vocab = tmp_path / "vocab.txt"
  vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\na\nb\nc\n")
  tokenizer = tokenization.FullTokenizer(str(vocab))
  example = run_classifier.InputExample("g", "a a a a a", "b c", label="1")
  feature = run_classifier.convert_single_example(
    10, example, ["0", "1"], 8, tokenizer
  )
  # [CLS] a a a [SEP] b c [SEP]: the longer text loses tokens first.
  assert feature.input_ids == [2, 4, 4, 4, 3, 5, 6, 3]
  assert feature.segment_ids == [0, 0, 0, 0, 0, 1, 1, 1]
  assert feature.input_mask == [1] * 8
  assert feature.label_id == 1 and feature.is_real_example
  single = run_classifier.convert_single_example(
    10,
    run_classifier.InputExample("h", "b", label="0"),
    ["0", "1"],
    6,
    tokenizer,
  )
  assert single.input_ids == [2, 5, 3, 0, 0, 0]
  assert single.input_mask == [1, 1, 1, 0, 0, 0]
  padding = run_classifier.convert_single_example(
    0, run_classifier.PaddingInputExample(), ["0", "1"], 4, tokenizer
  )
  assert padding.input_ids == [0] * 4 and not padding.is_real_example
  features = run_classifier.convert_examples_to_features(
    [example, example], ["0", "1"], 8, tokenizer
  )
  batch = next(
    iter(
      run_classifier.input_fn_builder(features, 8, False, True)(
        {"batch_size": 2}
      )
    )
  )
  np.testing.assert_array_equal(batch["input_ids"][1], feature.input_ids)
  np.testing.assert_array_equal(batch["label_ids"], [1, 1])
