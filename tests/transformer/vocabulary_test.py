"""Tests for transformer.vocabulary: round trips in Python and TF, offline.

TFDS encoders are built from a tiny corpus in the test; get_tfds_vocabulary
reads a tiny TFDS builder class defined here (its info needs no data or
network). transformer.t2t_vocabulary is tested against a fake tensor2tensor
package put in sys.modules (tensor2tensor is not installed).
"""

import sys
import types

import gin
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from transformer import t2t_vocabulary
from transformer import vocabulary

TEXTS = ["hello world", "héllo wörld ✓", "", "a\nb\tc", "日本語のテキスト"]


# ----------------------------------------------------------------------------
# ByteVocabulary


@pytest.mark.parametrize("text", TEXTS)
def test_byte_vocabulary_round_trip_python_and_tf(text):
  vocab = vocabulary.ByteVocabulary()
  ids = vocab.encode(text)
  assert ids == [b + 3 for b in text.encode("utf-8")]
  assert vocab.decode(ids) == text
  tf_ids = vocab.encode_tf(tf.constant(text))
  assert tf_ids.dtype == tf.int32
  np.testing.assert_array_equal(tf_ids.numpy(), np.array(ids, np.int32))
  assert vocab.decode_tf(tf_ids).numpy().decode("utf-8") == text


def test_byte_vocabulary_special_ids():
  vocab = vocabulary.ByteVocabulary()
  assert vocab.vocab_size == 259
  assert (vocab.eos_id, vocab.unk_id) == (1, 2)
  hi = vocab.encode("hi")
  assert hi == [107, 108]
  # Stops at EOS, drops pad/unk and out-of-range ids.
  ids = [0] + hi[:1] + [2, 999] + hi[1:] + [1] + hi + [0, 0]
  assert vocab.decode(ids) == "hi"
  assert vocab.decode_tf(tf.constant(ids)).numpy() == b"hi"
  # Bytes that are not valid UTF-8 are dropped, in Python and TF alike.
  broken = vocab.encode("é")[:1] + hi
  assert vocab.decode(broken) == "hi"
  assert vocab.decode_tf(tf.constant(broken)).numpy() == b"hi"


def test_byte_vocabulary_in_tf_function_and_dataset():
  vocab = vocabulary.ByteVocabulary()

  @tf.function
  def round_trip(s):
    return vocab.decode_tf(vocab.encode_tf(s))

  assert round_trip(tf.constant("héllo")).numpy().decode() == "héllo"
  ds = tf.data.Dataset.from_tensor_slices(["ab", "cde"]).map(vocab.encode_tf)
  assert [x.tolist() for x in ds.as_numpy_iterator()] == [
    [100, 101],
    [102, 103, 104],
  ]


def test_byte_vocabulary_rejects_wrong_ranks():
  vocab = vocabulary.ByteVocabulary()
  with pytest.raises(ValueError, match="scalar"):
    vocab.encode_tf(tf.constant(["a", "b"]))
  with pytest.raises(ValueError, match="1-D"):
    vocab.decode_tf(tf.constant([[3, 4]]))


def test_base_vocabulary_is_abstract():
  base = vocabulary.Vocabulary()
  for call in (
    lambda: base.vocab_size,
    lambda: base.encode("a"),
    lambda: base.decode([3]),
    lambda: base.encode_tf("a"),
    lambda: base.decode_tf([3]),
  ):
    with pytest.raises(NotImplementedError):
      call()


# ----------------------------------------------------------------------------
# TFDSVocabulary


@pytest.fixture(scope="module")
def subword_encoder():
  return tfds.deprecated.text.SubwordTextEncoder.build_from_corpus(
    ["hello world", "hello there world", "the world says hello"],
    target_vocab_size=300,
  )


@pytest.mark.parametrize("text", ["hello world", "the world", "xyz hello!"])
def test_tfds_vocabulary_shifts_ids_and_round_trips(subword_encoder, text):
  vocab = vocabulary.TFDSVocabulary(subword_encoder)
  assert vocab.vocab_size == subword_encoder.vocab_size + 1
  ids = vocab.encode(text)
  assert ids == [i + 1 for i in subword_encoder.encode(text)]
  assert min(ids) >= 2  # 0 pad and 1 EOS are free
  assert vocab.decode(ids) == text
  assert vocab.decode(ids + [1] + ids + [0]) == text
  tf_ids = vocab.encode_tf(tf.constant(text))
  assert tf_ids.shape.as_list() == [len(ids)]
  assert tf_ids.numpy().tolist() == ids
  assert vocab.decode_tf(tf_ids).numpy().decode() == text


def test_tfds_vocabulary_with_byte_encoder_in_dataset():
  encoder = tfds.deprecated.text.ByteTextEncoder()
  vocab = vocabulary.TFDSVocabulary(encoder)
  ds = tf.data.Dataset.from_tensor_slices(["ok", "héllo"])
  ds = ds.map(lambda s: vocab.decode_tf(vocab.encode_tf(s)))
  assert [x.decode() for x in ds.as_numpy_iterator()] == ["ok", "héllo"]


class VHelperTinyTextDataset(tfds.core.GeneratorBasedBuilder):
  """A local builder whose info carries a subword encoder (no data needed)."""

  VERSION = tfds.core.Version("1.0.0")

  def _info(self):
    encoder = tfds.deprecated.text.SubwordTextEncoder.build_from_corpus(
      ["tiny corpus of words", "words words"], target_vocab_size=280
    )
    return tfds.core.DatasetInfo(
      builder=self,
      features=tfds.features.FeaturesDict(
        {"text": tfds.features.Text(encoder=encoder)}
      ),
      supervised_keys=("text", "text"),
    )

  def _split_generators(self, dl_manager):
    raise NotImplementedError("never prepared in tests")

  def _generate_examples(self):
    raise NotImplementedError("never prepared in tests")


def test_get_tfds_vocabulary_reads_builder_info(tmp_path, monkeypatch):
  monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path))
  vocab = vocabulary.get_tfds_vocabulary("v_helper_tiny_text_dataset")
  assert isinstance(vocab, vocabulary.TFDSVocabulary)
  assert vocab.decode(vocab.encode("tiny words")) == "tiny words"
  assert vocab.vocab_size == vocab.tfds_encoder.vocab_size + 1


def test_get_tfds_vocabulary_is_gin_configurable(tmp_path, monkeypatch):
  monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path))
  gin.clear_config()
  try:
    gin.parse_config(
      "mesh_tensorflow.transformer.vocabulary.get_tfds_vocabulary."
      "dataset_name = 'v_helper_tiny_text_dataset'"
    )
    vocab = vocabulary.get_tfds_vocabulary()
    assert vocab.decode(vocab.encode("corpus")) == "corpus"
  finally:
    gin.clear_config()
  with pytest.raises(Exception, match="dataset_name"):
    vocabulary.get_tfds_vocabulary()


# ----------------------------------------------------------------------------
# T2tVocabulary (tensor2tensor faked)


class _FakeSubwordTextEncoder:
  """Whitespace words as ids; 0 pad and 1 EOS reserved, like t2t's."""

  instances = []

  def __init__(self, filename):
    self.filename = filename
    self.words = ["<pad>", "<EOS>", "hello", "world", "the"]
    _FakeSubwordTextEncoder.instances.append(self)

  @property
  def vocab_size(self):
    return len(self.words)

  def encode(self, s):
    assert isinstance(s, str), s
    return [self.words.index(w) for w in s.split()]

  def decode(self, ids):
    return " ".join(self.words[i] for i in ids)


@pytest.fixture
def fake_t2t(monkeypatch):
  """Installs tensor2tensor.data_generators.text_encoder in sys.modules."""
  _FakeSubwordTextEncoder.instances = []
  package = types.ModuleType("tensor2tensor")
  generators = types.ModuleType("tensor2tensor.data_generators")
  text_encoder = types.ModuleType("tensor2tensor.data_generators.text_encoder")
  text_encoder.SubwordTextEncoder = _FakeSubwordTextEncoder
  generators.text_encoder = text_encoder
  package.data_generators = generators
  for module in (package, generators, text_encoder):
    monkeypatch.setitem(sys.modules, module.__name__, module)
  return _FakeSubwordTextEncoder


def test_t2t_vocabulary_loads_lazily_once(fake_t2t):
  vocab = t2t_vocabulary.T2tVocabulary("/data/vocab.ende.32768")
  assert vocab.filepath == "/data/vocab.ende.32768"
  assert not fake_t2t.instances  # nothing read yet
  assert vocab.vocab_size == 5
  assert vocab.encode("hello world") == [2, 3]
  assert [e.filename for e in fake_t2t.instances] == ["/data/vocab.ende.32768"]
  assert vocab.subword_text_encoder is fake_t2t.instances[0]


def test_t2t_vocabulary_round_trips_in_python_and_tf(fake_t2t):
  vocab = t2t_vocabulary.T2tVocabulary("vocab")
  assert isinstance(vocab, vocabulary.Vocabulary)
  assert vocab.eos_id == 1
  ids = vocab.encode(b"the world")
  assert ids == [4, 3]  # t2t ids are used as they are, no shift
  assert vocab.decode(ids) == "the world"
  # Stops at the first EOS, drops padding.
  assert vocab.decode([2, 0, 3, 1, 4, 4]) == "hello world"
  tf_ids = vocab.encode_tf(tf.constant("hello the world"))
  assert tf_ids.dtype == tf.int32 and tf_ids.shape.rank == 1
  assert tf_ids.numpy().tolist() == [2, 4, 3]
  assert vocab.decode_tf(tf.constant([3, 2, 1, 4])).numpy() == b"world hello"
  ds = tf.data.Dataset.from_tensor_slices(["hello", "world the"])
  ds = ds.map(lambda s: vocab.decode_tf(vocab.encode_tf(s)))
  assert list(ds.as_numpy_iterator()) == [b"hello", b"world the"]
  assert len(fake_t2t.instances) == 1


def test_t2t_vocabulary_without_tensor2tensor_names_package_and_file(
  monkeypatch,
):
  monkeypatch.setitem(sys.modules, "tensor2tensor", None)  # import fails
  vocab = t2t_vocabulary.T2tVocabulary("/data/t2t/vocab.lm1b.en.32768")
  for use in (
    lambda: vocab.vocab_size,
    lambda: vocab.encode("hello"),
    lambda: vocab.decode([2, 3]),
  ):
    with pytest.raises(
      ImportError,
      match=r"tensor2tensor.*"
      r"'/data/t2t/vocab\.lm1b\.en\.32768'",
    ):
      use()


def test_get_t2t_vocabulary_joins_path_and_is_gin_configurable(fake_t2t):
  vocab = t2t_vocabulary.get_t2t_vocabulary("/data/t2t", "vocab.x.32768")
  assert isinstance(vocab, t2t_vocabulary.T2tVocabulary)
  assert vocab.filepath == "/data/t2t/vocab.x.32768"
  assert not fake_t2t.instances
  gin.clear_config()
  try:
    gin.parse_config(
      "import mesh_tensorflow.transformer.t2t_vocabulary\n"
      "mesh_tensorflow.transformer.t2t_vocabulary.get_t2t_vocabulary"
      ".data_dir = '/d'\n"
      "t2t_vocabulary.get_t2t_vocabulary.vocabulary_filename = 'v'\n"
    )
    vocab = t2t_vocabulary.get_t2t_vocabulary()
    assert vocab.filepath == "/d/v"
    assert vocab.decode(vocab.encode("hello")) == "hello"
  finally:
    gin.clear_config()
  with pytest.raises(RuntimeError, match="data_dir"):
    t2t_vocabulary.get_t2t_vocabulary()


def test_get_t2t_vocabulary_names_a_required_macro_left_unset():
  gin.clear_config()
  try:
    gin.parse_config(
      "import mesh_tensorflow.transformer.t2t_vocabulary\n"
      "T2T_DATA_DIR = %gin.REQUIRED\n"
      "t2t_vocabulary.get_t2t_vocabulary.data_dir = %T2T_DATA_DIR\n"
      "t2t_vocabulary.get_t2t_vocabulary.vocabulary_filename = 'v'\n"
    )
    with pytest.raises(ValueError, match="data_dir.*T2T_DATA_DIR"):
      t2t_vocabulary.get_t2t_vocabulary()
  finally:
    gin.clear_config()
