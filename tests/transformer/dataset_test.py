"""Tests for transformer.dataset: packing, padding, encoding and file loaders.

Packing is checked against a plain-Python greedy packer; loaders run on
temporary files. No TFDS here (see offline_datasets_test.py).
"""

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mesh_test_util as mtu
from transformer import dataset
from transformer import utils
from transformer import vocabulary

BYTES = vocabulary.ByteVocabulary()


def _ds(examples, keys, dtype=tf.int64):
  """A dataset of dicts of 1-D int features from Python lists."""

  def gen():
    for ex in examples:
      yield {k: np.asarray(ex[k], dtype.as_numpy_dtype) for k in keys}

  return tf.data.Dataset.from_generator(
    gen, output_signature={k: tf.TensorSpec([None], dtype) for k in keys}
  )


def _to_lists(ds):
  return [
    {k: v.tolist() for k, v in ex.items()} for ex in ds.as_numpy_iterator()
  ]


def reference_pack(examples, keys, lengths, ensure_eos=False):
  """Greedy in-order packing, written independently of the TF version."""
  rows = []
  cur = None

  def flush():
    row = {}
    for k in keys:
      pad = [0] * (lengths[k] - len(cur[k]))
      row[k] = cur[k] + pad
      row[k + "_segmentation"] = cur[k + "_segmentation"] + pad
      row[k + "_position"] = cur[k + "_position"] + pad
    rows.append(row)

  for ex in examples:
    seqs = {k: list(ex[k])[: lengths[k]] for k in keys}
    if ensure_eos:
      for k in keys:
        if len(seqs[k]) == lengths[k]:
          seqs[k][-1] = min(seqs[k][-1], 1)
    if not any(seqs.values()):
      continue
    if cur is not None and any(
      len(cur[k]) + len(seqs[k]) > lengths[k] for k in keys
    ):
      flush()
      cur = None
    if cur is None:
      cur = {"n": 0}
      for k in keys:
        cur[k], cur[k + "_segmentation"], cur[k + "_position"] = [], [], []
    cur["n"] += 1
    for k in keys:
      cur[k] += seqs[k]
      cur[k + "_segmentation"] += [cur["n"]] * len(seqs[k])
      cur[k + "_position"] += list(range(len(seqs[k])))
  if cur is not None:
    flush()
  return rows


def _random_examples(
  seed, count, max_len, keys=("inputs", "targets"), empty_prob=0.1
):
  rng = np.random.RandomState(seed)
  out = []
  for _ in range(count):
    ex = {}
    for k in keys:
      n = 0 if rng.rand() < empty_prob else rng.randint(1, max_len + 1)
      ex[k] = rng.randint(1, 50, size=n).tolist()
    out.append(ex)
  return out


# ----------------------------------------------------------------------------
# pack_dataset


def test_pack_dataset_docstring_example():
  examples = [
    {"inputs": [8, 7, 1], "targets": [4, 1]},
    {"inputs": [2, 3, 4, 1], "targets": [5, 6, 1]},
  ]
  got = _to_lists(
    dataset.pack_dataset(_ds(examples, ["inputs", "targets"]), 10)
  )
  assert got == [
    {
      "inputs": [8, 7, 1, 2, 3, 4, 1, 0, 0, 0],
      "inputs_segmentation": [1, 1, 1, 2, 2, 2, 2, 0, 0, 0],
      "inputs_position": [0, 1, 2, 0, 1, 2, 3, 0, 0, 0],
      "targets": [4, 1, 5, 6, 1, 0, 0, 0, 0, 0],
      "targets_segmentation": [1, 1, 2, 2, 2, 0, 0, 0, 0, 0],
      "targets_position": [0, 1, 0, 1, 2, 0, 0, 0, 0, 0],
    }
  ]


@pytest.mark.parametrize("length", [8, {"inputs": 6, "targets": 9}])
def test_pack_dataset_matches_python_reference(length):
  keys = ["inputs", "targets"]
  examples = _random_examples(0, 120, max_len=11)
  lengths = length if isinstance(length, dict) else {k: length for k in keys}
  ds = dataset.pack_dataset(_ds(examples, keys), length)
  for k in keys:
    for suffix in ("", "_segmentation", "_position"):
      spec = ds.element_spec[k + suffix]
      assert spec.shape == [lengths[k]] and spec.dtype == tf.int32
  got = _to_lists(ds)
  want = reference_pack(examples, keys, lengths)
  assert len(got) == len(want) and len(got) < len(examples)
  assert got == want
  # Every kept token survives, in order.
  flat = [t for row in got for t in row["targets"] if t]
  assert flat == [
    t for ex in examples for t in ex["targets"][: lengths["targets"]]
  ]


def test_pack_dataset_selected_keys_drop_others_and_cast():
  examples = [
    {"a": [1, 2], "b": [3], "c": [9, 9]},
    {"a": [4], "b": [5, 6], "c": [9]},
  ]
  ds = dataset.pack_dataset(
    _ds(examples, ["a", "b", "c"], tf.int32), 4, keys=["a", "b"]
  )
  got = _to_lists(ds)
  assert sorted(got[0]) == [
    "a",
    "a_position",
    "a_segmentation",
    "b",
    "b_position",
    "b_segmentation",
  ]
  assert got == reference_pack(examples, ["a", "b"], {"a": 4, "b": 4})


def test_pack_dataset_single_key_long_sequences_are_cut():
  examples = [
    {"targets": list(range(1, 13))},
    {"targets": [7, 8]},
    {"targets": [5] * 5},
  ]
  got = _to_lists(dataset.pack_dataset(_ds(examples, ["targets"]), 5))
  assert got == reference_pack(examples, ["targets"], {"targets": 5})
  assert got[0]["targets"] == [1, 2, 3, 4, 5]


def test_pack_dataset_is_deterministic_and_works_repeated():
  examples = _random_examples(1, 40, max_len=6, keys=("targets",))
  ds = dataset.pack_dataset(_ds(examples, ["targets"]).repeat(), 10)
  first = _to_lists(ds.take(15))
  assert first == _to_lists(ds.take(15))
  want = reference_pack(examples * 5, ["targets"], {"targets": 10})
  assert first == want[:15]


def test_pack_dataset_bad_input_errors():
  ds = _ds([{"inputs": [1]}], ["inputs"])
  with pytest.raises(ValueError, match="use_custom_ops"):
    dataset.pack_dataset(ds, 4, use_custom_ops=True)
  with pytest.raises(ValueError, match="'targets' not found"):
    dataset.pack_dataset(ds, 4, keys=["targets"])
  with pytest.raises(ValueError, match="'targets'"):
    dataset.pack_dataset(ds, {"inputs": 4, "targets": 4}, keys=["targets"])
  with pytest.raises(ValueError, match="no length given for feature 'inputs'"):
    dataset.pack_dataset(ds, {"targets": 4})
  strings = tf.data.Dataset.from_tensors({"text": tf.constant(["a"])})
  with pytest.raises(ValueError, match="'text' must be integer"):
    dataset.pack_dataset(strings, 4)
  clash = _ds([{"a": [1], "a_position": [2]}], ["a", "a_position"])
  with pytest.raises(ValueError, match="'a' and 'a_position'"):
    dataset.pack_dataset(clash, 4)
  two_d = tf.data.Dataset.from_tensors({"x": tf.zeros([2, 2], tf.int32)})
  with pytest.raises(ValueError, match="'x' must be 1-D"):
    dataset.pack_dataset(two_d, 4)


# ----------------------------------------------------------------------------
# pack_or_pad, trim_and_pad_dataset, ensure_dataset_eos


def test_pack_or_pad_pack_with_ensure_eos_matches_reference():
  keys = ["inputs", "targets"]
  examples = _random_examples(2, 60, max_len=9)
  got = _to_lists(
    dataset.pack_or_pad(_ds(examples, keys), 7, pack=True, ensure_eos=True)
  )
  lengths = {k: 7 for k in keys}
  assert got == reference_pack(examples, keys, lengths, ensure_eos=True)
  # A cut sequence ends in EOS.
  cut = [ex for ex in examples if len(ex["targets"]) >= 7]
  assert cut
  assert got != reference_pack(examples, keys, lengths)


def test_pack_or_pad_pad_mode_and_ensure_eos():
  examples = [
    {"targets": [5, 6, 7, 8, 9]},
    {"targets": [5, 1]},
    {"targets": [5, 6, 7, 8]},
  ]
  ds = _ds(examples, ["targets"])
  assert _to_lists(dataset.pack_or_pad(ds, 4, pack=False)) == [
    {"targets": [5, 6, 7, 8]},
    {"targets": [5, 1, 0, 0]},
    {"targets": [5, 6, 7, 8]},
  ]
  assert _to_lists(dataset.pack_or_pad(ds, 4, pack=False, ensure_eos=True)) == [
    {"targets": [5, 6, 7, 1]},
    {"targets": [5, 1, 0, 0]},
    {"targets": [5, 6, 7, 1]},
  ]
  # No length: unchanged.
  assert dataset.pack_or_pad(ds, None) is ds


def test_pack_or_pad_is_gin_configurable_under_original_module():
  ds = _ds([{"targets": [5, 6]}, {"targets": [7]}], ["targets"])
  with gin.unlock_config():
    gin.parse_config(
      "mesh_tensorflow.transformer.dataset.pack_or_pad.pack = False"
    )
  try:
    got = _to_lists(dataset.pack_or_pad(ds, 4))
  finally:
    gin.clear_config()
  assert got == [{"targets": [5, 6, 0, 0]}, {"targets": [7, 0, 0, 0]}]
  for name in [
    "pack_or_pad",
    "pack_dataset",
    "pretokenized_tfds_dataset",
    "untokenized_tfds_dataset",
    "sample_from_text_line_datasets",
    "make_text_line_dataset",
    "simple_text_line_dataset",
    "packed_parallel_tsv_dataset",
    "pretokenized_t2t_dataset",
  ]:
    assert (
      gin.config._REGISTRY.get_match(  # pylint: disable=protected-access
        "mesh_tensorflow.transformer.dataset." + name
      )
      is not None
    ), name


def test_trim_and_pad_dataset_lengths_keys_and_2d():
  ds = tf.data.Dataset.from_tensors(
    {
      "a": tf.constant([1, 2, 3, 4, 5]),
      "b": tf.constant([1, 2]),
      "m": tf.ones([3, 2], tf.float32),
    }
  )
  got = next(
    dataset.trim_and_pad_dataset(
      ds, {"a": 3, "b": 4, "m": 5}
    ).as_numpy_iterator()
  )
  assert got["a"].tolist() == [1, 2, 3]
  assert got["b"].tolist() == [1, 2, 0, 0]
  np.testing.assert_array_equal(got["m"], [[1, 1]] * 3 + [[0, 0]] * 2)
  only_b = dataset.trim_and_pad_dataset(ds, 4, feature_keys=["b"])
  assert only_b.element_spec["b"].shape == [4]
  got = next(only_b.as_numpy_iterator())
  assert got["a"].tolist() == [1, 2, 3, 4, 5]
  assert got["b"].tolist() == [1, 2, 0, 0]


def test_ensure_dataset_eos():
  ds = tf.data.Dataset.from_tensors(
    {
      "a": tf.constant([5, 6, 7]),
      "b": tf.constant([5, 1, 0]),
      "c": tf.constant([5, 6, 7]),
    }
  )
  got = next(dataset.ensure_dataset_eos(ds).as_numpy_iterator())
  assert {k: v.tolist() for k, v in got.items()} == {
    "a": [5, 6, 1],
    "b": [5, 1, 0],
    "c": [5, 6, 1],
  }
  got = next(dataset.ensure_dataset_eos(ds, ["a"]).as_numpy_iterator())
  assert got["c"].tolist() == [5, 6, 7]


def test_pad_dataset_with_zeroed_out_examples():
  ds = tf.data.Dataset.from_tensor_slices({"x": [[1, 2], [3, 4]]})
  got = [
    ex["x"].tolist()
    for ex in dataset.pad_dataset_with_zeroed_out_examples(ds)
    .take(5)
    .as_numpy_iterator()
  ]
  assert got == [[1, 2], [3, 4], [0, 0], [0, 0], [0, 0]]


def test_eval_dataset_namedtuple():
  ev = dataset.EvalDataset("reverse", len, str, [])
  assert ev._fields == ("name", "dataset_fn", "postprocess_fn", "metric_fns")
  assert ev.name == "reverse" and ev.dataset_fn is len


# ----------------------------------------------------------------------------
# Encoding


def test_encode_dataset_and_encode_all_features():
  ds = tf.data.Dataset.from_tensors(
    {"inputs": tf.constant("ab"), "targets": tf.constant("c")}
  )
  got = next(dataset.encode_dataset(ds, BYTES).as_numpy_iterator())
  assert got["inputs"].tolist() == BYTES.encode("ab")
  assert got["targets"].tolist() == BYTES.encode("c")
  got = next(dataset.encode_all_features(ds, BYTES).as_numpy_iterator())
  assert got["inputs"].dtype == np.int64
  assert got["inputs"].tolist() == BYTES.encode("ab") + [1]
  assert got["targets"].tolist() == BYTES.encode("c") + [1]


class _ShiftVocab(vocabulary.Vocabulary):
  """Bytes shifted by a different offset, to tell two vocabularies apart."""

  def encode_tf(self, s):
    return BYTES.encode_tf(s) + 100


def test_encoding_with_a_vocabulary_pair():
  ds = tf.data.Dataset.from_tensors(
    {"inputs": tf.constant("a"), "targets": tf.constant("a")}
  )
  got = next(
    dataset.encode_all_features(ds, (BYTES, _ShiftVocab())).as_numpy_iterator()
  )
  assert got["inputs"].tolist() == [BYTES.encode("a")[0], 1]
  assert got["targets"].tolist() == [BYTES.encode("a")[0] + 100, 1]
  got = next(
    dataset.encode_dataset(ds, (_ShiftVocab(), BYTES)).as_numpy_iterator()
  )
  assert got["inputs"].tolist() == [BYTES.encode("a")[0] + 100]


def test_supervised_to_dict():
  ds = tf.data.Dataset.from_tensors((tf.constant("x"), tf.constant("y")))
  assert next(dataset.supervised_to_dict(ds, False).as_numpy_iterator()) == {
    "inputs": b"x",
    "targets": b"y",
  }
  assert next(dataset.supervised_to_dict(ds, True).as_numpy_iterator()) == {
    "targets": b"y"
  }


# ----------------------------------------------------------------------------
# Text lines and TSV


@pytest.fixture
def text_files(tmp_path):
  a = tmp_path / "a.txt"
  a.write_text("one\ntwo\nthree\n")
  b = tmp_path / "b.txt"
  b.write_text("four\n")
  return tmp_path


def test_simple_text_line_dataset(text_files):
  ds = dataset.simple_text_line_dataset(
    str(text_files / "*.txt"), shuffle_buffer_size=0
  )
  assert list(ds.as_numpy_iterator()) == [b"one", b"two", b"three", b"four"]
  shuffled = dataset.simple_text_line_dataset(str(text_files / "*.txt"))
  assert sorted(shuffled.as_numpy_iterator()) == [
    b"four",
    b"one",
    b"three",
    b"two",
  ]
  with pytest.raises(ValueError, match="no files match .*nothing"):
    dataset.simple_text_line_dataset(str(text_files / "nothing*"))


def test_make_and_sample_text_line_datasets(text_files):
  lines = list(
    dataset.make_text_line_dataset(str(text_files / "a.txt"))
    .take(9)
    .as_numpy_iterator()
  )
  assert sorted(lines) == sorted([b"one", b"two", b"three"] * 3)
  sampled = dataset.sample_from_text_line_datasets(
    [(str(text_files / "a.txt"), 1.0), (str(text_files / "b.txt"), 0.0)],
    shuffle_buffer_size=10,
    prefetch=2,
  )
  assert set(sampled.take(20).as_numpy_iterator()) == {b"one", b"two", b"three"}
  mixed = dataset.sample_from_text_line_datasets(
    [(str(text_files / "a.txt"), 0.5), (str(text_files / "b.txt"), 0.5)]
  )
  assert b"four" in set(mixed.take(40).as_numpy_iterator())


def test_packed_parallel_tsv_dataset(tmp_path):
  pairs = [("ab", "xyz"), ("cde", "w"), ("f", "uv"), ("ghijklm", "t")]
  path = tmp_path / "data.tsv"
  path.write_text("".join("%s\t%s\n" % p for p in pairs))
  lines = dataset.simple_text_line_dataset(str(path), shuffle_buffer_size=0)
  got = _to_lists(
    dataset.packed_parallel_tsv_dataset(
      lines, "validation", sequence_length=8, vocabulary=BYTES
    )
  )
  examples = [
    {"inputs": BYTES.encode(i) + [1], "targets": BYTES.encode(t) + [1]}
    for i, t in pairs
  ]
  assert got == reference_pack(
    examples, ["inputs", "targets"], {"inputs": 8, "targets": 8}
  )
  filtered = _to_lists(
    dataset.packed_parallel_tsv_dataset(
      lines,
      "validation",
      sequence_length=8,
      vocabulary=BYTES,
      append_eos=False,
      max_encoded_len=3,
    )
  )
  examples = [
    {"inputs": BYTES.encode(i), "targets": BYTES.encode(t)}
    for i, t in pairs
    if len(i) <= 3 and len(t) <= 3
  ]
  assert filtered == reference_pack(
    examples, ["inputs", "targets"], {"inputs": 8, "targets": 8}
  )
  train = dataset.packed_parallel_tsv_dataset(
    lines, "train", sequence_length=8, vocabulary=BYTES
  )
  assert len(list(train.take(10))) == 10  # repeats


# ----------------------------------------------------------------------------
# Pre-tokenized TFRecords


def _write_records(path, rows):
  with tf.io.TFRecordWriter(str(path)) as w:
    for row in rows:
      feats = {
        k: tf.train.Feature(int64_list=tf.train.Int64List(value=v))
        for k, v in row.items()
      }
      w.write(
        tf.train.Example(
          features=tf.train.Features(feature=feats)
        ).SerializeToString()
      )


def test_pretokenized_tfrecord_dataset(tmp_path):
  rows = [
    {"inputs": [3, 4], "targets": [5]},
    {"inputs": [6], "targets": [7, 8]},
  ]
  path = tmp_path / "x.tfrecord"
  _write_records(path, rows)
  got = _to_lists(
    dataset.pretokenized_tfrecord_dataset(
      [str(path)],
      text2self=False,
      eos_included=False,
      repeat=False,
      batch_size=None,
      sequence_length=8,
      vocab_shift=10,
    )
  )
  examples = [
    {k: [t + 10 for t in v] + [1] for k, v in r.items()} for r in rows
  ]
  assert got == reference_pack(
    examples, ["inputs", "targets"], {"inputs": 8, "targets": 8}
  )
  lm = _to_lists(
    dataset.pretokenized_tfrecord_dataset(
      [str(path)],
      text2self=True,
      eos_included=True,
      repeat=False,
      batch_size=None,
      sequence_length=3,
    )
  )
  assert lm == reference_pack(rows, ["targets"], {"targets": 3})


def test_pretokenized_t2t_dataset(tmp_path):
  _write_records(
    tmp_path / "my_problem-dev-00000-of-00001",
    [{"inputs": [3, 1], "targets": [4, 1]}],
  )
  got = _to_lists(
    dataset.pretokenized_t2t_dataset(
      "my_problem",
      data_dir=str(tmp_path),
      dataset_split="dev",
      sequence_length=4,
    )
  )
  assert got == reference_pack(
    [{"inputs": [3, 1], "targets": [4, 1]}],
    ["inputs", "targets"],
    {"inputs": 4, "targets": 4},
  )
  with pytest.raises(ValueError, match="my_problem-train-.*t2t-datagen"):
    dataset.pretokenized_t2t_dataset(
      "my_problem", data_dir=str(tmp_path), sequence_length=4
    )


def test_public_names():
  assert sorted(dataset.__all__) == sorted(
    [
      "EvalDataset",
      "encode_all_features",
      "encode_dataset",
      "ensure_dataset_eos",
      "make_text_line_dataset",
      "pack_dataset",
      "pack_or_pad",
      "packed_parallel_tsv_dataset",
      "pad_dataset_with_zeroed_out_examples",
      "pretokenized_t2t_dataset",
      "pretokenized_tfds_dataset",
      "pretokenized_tfrecord_dataset",
      "sample_from_text_line_datasets",
      "simple_text_line_dataset",
      "supervised_to_dict",
      "trim_and_pad_dataset",
      "untokenized_tfds_dataset",
    ]
  )
  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow.transformer import dataset as alias

  assert alias is dataset


# ----------------------------------------------------------------------------
# text2text -> text2self on the mesh, decoded features


def _text2self(features, packed):
  def build(mesh):
    mtf_features = {
      k: mtf.import_tf_tensor(
        mesh,
        tf.constant(v, tf.int32),
        mtf.Shape(
          [
            mtf.Dimension("batch", v.shape[0]),
            mtf.Dimension("length", v.shape[1]),
          ]
        ),
      )
      for k, v in features.items()
    }
    out = utils._dynamic_text2self(mtf_features)  # pylint: disable=protected-access
    assert sorted(out) == (
      ["targets", "targets_position", "targets_segmentation"]
      if packed
      else ["targets"]
    )
    assert all(
      t.shape.dimension_names == ["batch", "length"] for t in out.values()
    )
    return [out[k] for k in sorted(out)]

  return mtu.run_program(build)


def test_dynamic_text2self_unpacked_joins_inputs_then_targets():
  inputs = np.array([[7, 8, 0], [5, 0, 0]])
  targets = np.array([[3, 4, 1], [9, 1, 0]])
  (joined,) = _text2self({"inputs": inputs, "targets": targets}, packed=False)
  np.testing.assert_array_equal(
    joined, [[7, 8, 3, 4, 1, 0], [5, 9, 1, 0, 0, 0]]
  )


def test_dynamic_text2self_packed_joins_each_segment():
  # Two packed examples: inputs (7 8 | 5), targets (3 1 | 9 4 1).
  features = {
    "inputs": np.array([[7, 8, 5, 0]]),
    "inputs_segmentation": np.array([[1, 1, 2, 0]]),
    "inputs_position": np.array([[0, 1, 0, 0]]),
    "targets": np.array([[3, 1, 9, 4, 1, 0]]),
    "targets_segmentation": np.array([[1, 1, 2, 2, 2, 0]]),
    "targets_position": np.array([[0, 1, 0, 1, 2, 0]]),
  }
  targets, position, segmentation = _text2self(features, packed=True)
  np.testing.assert_array_equal(targets, [[7, 8, 3, 1, 5, 9, 4, 1, 0, 0]])
  np.testing.assert_array_equal(segmentation, [[1, 1, 1, 1, 2, 2, 2, 2, 0, 0]])
  np.testing.assert_array_equal(position, [[0, 1, 2, 3, 0, 1, 2, 3, 0, 0]])


class _SpellingVocabulary:
  """decode(ids) spells the ids, e.g. [5, 6] -> "5 6"."""

  def decode(self, ids):
    return " ".join(str(i) for i in ids)


def test_maybe_add_pretokenized_features_decodes_missing_text():
  examples = [
    {"inputs": np.array([4, 5, 0]), "targets": np.array([6, -7, -8, 0])},
    {"targets": np.array([9]), "targets_pretokenized": "kept"},
  ]
  out = utils._maybe_add_pretokenized_features(  # pylint: disable=protected-access
    examples, (_SpellingVocabulary(), _SpellingVocabulary())
  )
  assert out is examples
  assert examples[0]["inputs_pretokenized"] == "4 5"
  assert examples[0]["targets_pretokenized"] == "6"
  assert examples[0]["targets_neg_pretokenized"] == "7 8"
  assert "inputs_neg_pretokenized" not in examples[0]
  assert examples[1] == {
    "targets": examples[1]["targets"],
    "targets_pretokenized": "kept",
  }
