"""Tests of mesh_tensorflow.bert.tokenization (Google BERT's WordPiece)."""

from absl.testing import flagsaver
import pytest

from mesh_tensorflow.bert import tokenization

VOCAB = [
  "[UNK]",
  "[CLS]",
  "[SEP]",
  "[unused0]",
  "want",
  "##want",
  "##ed",
  "wa",
  "un",
  "runn",
  "##ing",
  ",",
  "low",
  "lowest",
  "!",
  "hello",
  "你",
]


@pytest.fixture
def vocab_file(tmp_path):
  path = tmp_path / "vocab.txt"
  path.write_text("".join(token + "\n" for token in VOCAB))
  return str(path)


def test_full_tokenizer(vocab_file):
  tokenizer = tokenization.FullTokenizer(vocab_file)
  tokens = tokenizer.tokenize("UNwant\u00e9d,running")
  assert tokens == ["un", "##want", "##ed", ",", "runn", "##ing"]
  assert tokenizer.convert_tokens_to_ids(tokens) == [8, 5, 6, 11, 9, 10]
  assert tokenizer.convert_ids_to_tokens([8, 5]) == ["un", "##want"]


def test_basic_tokenizer_lower_and_cased():
  lower = tokenization.BasicTokenizer(do_lower_case=True)
  assert lower.tokenize(" \tHeLLo!how  \n Are yoU?  ") == [
    "hello",
    "!",
    "how",
    "are",
    "you",
    "?",
  ]
  assert lower.tokenize("H\u00e9llo") == ["hello"]
  cased = tokenization.BasicTokenizer(do_lower_case=False)
  assert cased.tokenize(" \tHeLLo!how  \n Are yoU?  ") == [
    "HeLLo",
    "!",
    "how",
    "Are",
    "yoU",
    "?",
  ]


def test_basic_tokenizer_splits_cjk_and_drops_control_characters():
  tokenizer = tokenization.BasicTokenizer()
  assert tokenizer.tokenize("ah\u535a\u63a8zz") == [
    "ah",
    "\u535a",
    "\u63a8",
    "zz",
  ]
  assert tokenizer.tokenize("a\x00b\ufffdc\u200bd e") == ["abcd", "e"]
  assert tokenizer.tokenize(b"bytes \xc3\xa9t\xc3\xa9") == ["bytes", "ete"]


def test_wordpiece_tokenizer():
  vocab = {token: i for i, token in enumerate(VOCAB)}
  tokenizer = tokenization.WordpieceTokenizer(vocab=vocab)
  assert tokenizer.tokenize("") == []
  assert tokenizer.tokenize("unwanted running") == [
    "un",
    "##want",
    "##ed",
    "runn",
    "##ing",
  ]
  assert tokenizer.tokenize("unwantedX running") == ["[UNK]", "runn", "##ing"]
  short = tokenization.WordpieceTokenizer(vocab, max_input_chars_per_word=3)
  assert short.tokenize("want low") == ["[UNK]", "low"]


def test_preserve_unused_tokens_flag(vocab_file):
  tokenizer = tokenization.FullTokenizer(vocab_file)
  assert tokenizer.tokenize("[unused0] want") == [
    "[UNK]",
    "[UNK]",
    "[UNK]",
    "want",
  ]
  with flagsaver.flagsaver(preserve_unused_tokens=True):
    assert tokenizer.tokenize("[unused0] want") == ["[unused0]", "want"]


def test_load_vocab_keeps_first_ids(tmp_path):
  path = tmp_path / "v.txt"
  path.write_text("a\nb\na\n\nc\n")
  vocab = tokenization.load_vocab(str(path))
  assert list(vocab.items()) == [("a", 0), ("b", 1), ("", 2), ("c", 3)]


def test_unicode_helpers():
  assert tokenization.convert_to_unicode(b"\xc3\xa9") == "\u00e9"
  assert tokenization.printable_text("x") == "x"
  assert tokenization.whitespace_tokenize("  a b\n") == ["a", "b"]
  with pytest.raises(ValueError, match="Unsupported string type"):
    tokenization.convert_to_unicode(3)


def test_validate_case_matches_checkpoint():
  tokenization.validate_case_matches_checkpoint(True, None)
  tokenization.validate_case_matches_checkpoint(
    True, "gs://x/uncased_L-12_H-768_A-12/bert_model.ckpt"
  )
  tokenization.validate_case_matches_checkpoint(False, "/my/model.ckpt")
  with pytest.raises(ValueError, match="--do_lower_case=False"):
    tokenization.validate_case_matches_checkpoint(
      True, "/x/cased_L-12_H-768_A-12/bert_model.ckpt"
    )
  with pytest.raises(ValueError, match="seems to be a lowercased model"):
    tokenization.validate_case_matches_checkpoint(
      False, "/x/uncased_L-24_H-1024_A-16/bert_model.ckpt"
    )
