"""Offline TFDS builders (transformer/_src/data/offline/), network blocked.

The builders generate into a temporary data_dir while every socket connect /
DNS lookup raises, proving that nothing is downloaded.
"""

import socket
import string

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from transformer import dataset
from transformer import vocabulary
from transformer._src.data import offline as datasets
from transformer._src.data.offline import reverse
from transformer._src.data.offline import stdlib_docs

BYTES = vocabulary.ByteVocabulary()


class NetworkUsed(AssertionError):
  pass


def _no_network(*args, **kwargs):
  raise NetworkUsed("network access attempted: %r" % (args,))


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  """A fresh TFDS data_dir; sockets fail while the module's tests run."""
  with pytest.MonkeyPatch.context() as mp:
    mp.setattr(socket.socket, "connect", _no_network)
    mp.setattr(socket.socket, "connect_ex", _no_network)
    mp.setattr(socket, "create_connection", _no_network)
    mp.setattr(socket, "getaddrinfo", _no_network)
    mp.delenv("TFDS_DATA_DIR", raising=False)
    yield str(tmp_path_factory.mktemp("tfds"))


def _pairs(builder, split):
  """A split's (inputs, targets) pairs, read as one batch (fast)."""
  data = tfds.as_numpy(builder.as_dataset(split=split, batch_size=-1))
  return [
    (a.decode(), b.decode()) for a, b in zip(data["inputs"], data["targets"])
  ]


def test_network_is_blocked(data_dir):
  del data_dir
  with pytest.raises(NetworkUsed):
    socket.create_connection(("example.com", 80))


def test_builders_are_registered(data_dir):
  del data_dir  # blocks the network
  assert {"mtf_reverse", "mtf_stdlib_docs"} <= set(datasets.OFFLINE_DATASETS)
  assert "mtf_reverse" in tfds.list_builders(with_community_datasets=False)
  assert isinstance(tfds.builder("mtf_reverse"), datasets.MtfReverse)


def test_mtf_reverse_generates_and_loads_offline(data_dir):
  first = tfds.load(
    "mtf_reverse", split="validation", data_dir=data_dir, as_supervised=True
  )
  assert first.element_spec == (tf.TensorSpec([], tf.string),) * 2
  builder = tfds.builder("mtf_reverse", data_dir=data_dir)
  train, validation = _pairs(builder, "train"), _pairs(builder, "validation")
  assert (len(train), len(validation)) == (20000, 1000)
  for inputs, targets in train[:2000] + validation:
    assert targets == inputs[::-1]
    assert 4 <= len(inputs) <= 12
    assert set(inputs) <= set(string.ascii_lowercase)
  lengths = [len(i) for i, _ in train]
  assert (min(lengths), max(lengths)) == (4, 12)
  # Held out: no validation input occurs in training.
  assert not {i for i, _ in validation} & {i for i, _ in train}
  # Deterministic: the same examples as the generator function gives again.
  assert sorted(train) == sorted(reverse.reverse_examples("train"))
  assert sorted(validation) == sorted(reverse.reverse_examples("validation"))


def test_mtf_reverse_generation_is_byte_identical(data_dir, tmp_path):
  builder = tfds.builder("mtf_reverse", data_dir=data_dir)
  builder.download_and_prepare()
  other = datasets.prepare(tfds.builder("mtf_reverse", data_dir=str(tmp_path)))
  for split in ("train", "validation"):
    assert _pairs(builder, split) == _pairs(other, split)


def test_mtf_stdlib_docs_generates_and_loads_offline(data_dir):
  builder = tfds.builder("mtf_stdlib_docs", data_dir=data_dir)
  datasets.prepare(builder)
  data = {
    split: tfds.as_numpy(builder.as_dataset(split=split, batch_size=-1))["text"]
    for split in ("train", "validation")
  }
  train = [t.decode() for t in data["train"]]
  validation = [t.decode() for t in data["validation"]]
  assert len(train) > 1000 and len(validation) > 20
  assert 0.02 < len(validation) / (len(train) + len(validation)) < 0.1
  assert not set(train) & set(validation)
  assert all(len(t) >= 40 and "\n" not in t for t in train[:500])
  assert sorted(train + validation) == sorted(stdlib_docs.stdlib_paragraphs())
  # Supervised keys make it usable as a text2self (LM) dataset.
  lm = dataset.untokenized_tfds_dataset(
    "mtf_stdlib_docs",
    text2self=True,
    tfds_data_dir=data_dir,
    dataset_split="validation",
    sequence_length=64,
    vocabulary=BYTES,
    pack=True,
  )
  row = next(lm.as_numpy_iterator())
  assert sorted(row) == ["targets", "targets_position", "targets_segmentation"]
  assert row["targets"].shape == (64,)


def test_untokenized_tfds_dataset_on_mtf_reverse(data_dir):
  ds = dataset.untokenized_tfds_dataset(
    "mtf_reverse",
    text2self=False,
    tfds_data_dir=data_dir,
    dataset_split="validation",
    sequence_length={"inputs": 13, "targets": 13},
    vocabulary=BYTES,
    pack=False,
  )
  rows = list(ds.as_numpy_iterator())
  assert len(rows) == 1000
  for row in rows[:50]:
    assert row["inputs"].shape == (13,) and row["targets"].shape == (13,)
    n = int(np.sum(row["inputs"] != 0))
    assert row["inputs"][n - 1] == 1  # EOS kept: 12 letters + EOS fit
    inputs, targets = BYTES.decode(row["inputs"]), BYTES.decode(row["targets"])
    assert targets == inputs[::-1] and len(inputs) == n - 1
  train = dataset.untokenized_tfds_dataset(
    "mtf_reverse",
    text2self=False,
    tfds_data_dir=data_dir,
    dataset_split="train",
    sequence_length=16,
    vocabulary=BYTES,
    pack=True,
  )
  batch = next(train.batch(8).as_numpy_iterator())
  assert batch["targets_segmentation"].shape == (8, 16)
  assert batch["targets_segmentation"].max() >= 2  # several per row


def test_unknown_dataset_name_is_a_clear_error(data_dir):
  with pytest.raises(ValueError, match="does not know dataset 'no_such_ds'"):
    dataset.untokenized_tfds_dataset(
      "no_such_ds",
      text2self=False,
      tfds_data_dir=data_dir,
      dataset_split="train",
      sequence_length=8,
      vocabulary=BYTES,
      pack=True,
    )
  with pytest.raises(ValueError, match="'mtf_reverse' holds string features"):
    dataset.pretokenized_tfds_dataset(
      "mtf_reverse",
      text2self=False,
      tfds_data_dir=data_dir,
      dataset_split="validation",
      sequence_length=8,
    )
  with pytest.raises(ValueError, match="'mtf_reverse' has no split 'test'"):
    dataset.pretokenized_tfds_dataset(
      "mtf_reverse",
      text2self=False,
      tfds_data_dir=data_dir,
      dataset_split="test",
      sequence_length=8,
    )


def test_unprepared_remote_dataset_is_not_downloaded(data_dir):
  with pytest.raises(
    ValueError, match="'mnist' is not prepared.*never downloads"
  ):
    dataset.untokenized_tfds_dataset(
      "mnist",
      text2self=False,
      tfds_data_dir=data_dir,
      dataset_split="train",
      sequence_length=8,
      vocabulary=BYTES,
      pack=True,
    )
  with pytest.raises(ValueError, match="refusing to download"):
    datasets.prepare(tfds.builder("mnist", data_dir=data_dir))


def test_subword_vocabulary_built_offline_and_cached(data_dir):
  vocab = datasets.get_subword_vocabulary(
    "mtf_reverse",
    data_dir=data_dir,
    target_vocab_size=300,
    max_corpus_chars=4000,
  )
  assert isinstance(vocab, vocabulary.TFDSVocabulary)
  assert tf.io.gfile.exists("%s/mtf_reverse/subwords_300.subwords" % data_dir)
  ids = vocab.encode("abcxyz")
  assert min(ids) >= 2 and vocab.decode(ids + [1, 0]) == "abcxyz"
  again = datasets.get_subword_vocabulary(
    "mtf_reverse", data_dir=data_dir, target_vocab_size=300
  )
  assert again.encode("abcxyz") == ids
  assert again.vocab_size == vocab.vocab_size
  with pytest.raises(ValueError, match="'nope'"):
    datasets.get_subword_vocabulary("nope", data_dir=data_dir)
