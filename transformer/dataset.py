"""Input pipelines for the transformer: tf.data datasets of token-id features.

A dataset here yields dicts of 1-D integer features ("inputs", "targets");
id 0 is padding and id 1 is end-of-sequence (EOS). The functions read text or
pre-tokenized data (TFDS, text lines, TSV, TFRecord), encode it with a
`transformer.vocabulary.Vocabulary` and make fixed-length examples, either by
padding (`trim_and_pad_dataset`) or by packing several examples into one
(`pack_dataset`, which adds `<key>_segmentation` and `<key>_position`).

Unbatched datasets come out of every loader; the driver batches them. Nothing
here downloads: TFDS datasets must be prepared in the data_dir already,
except the offline builders of `transformer.datasets`, which generate their
data locally on first use.
"""

from __future__ import annotations

import collections
import os
from typing import Mapping, Optional, Sequence, Tuple, Union

from absl import logging
import gin
import tensorflow as tf

__all__ = [
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

_GIN_MODULE = "mesh_tensorflow.transformer.dataset"
_AUTOTUNE = tf.data.AUTOTUNE
EOS_ID = 1

Length = Union[int, Mapping[str, int]]

# A named evaluation dataset: `dataset_fn(sequence_length, vocabulary,
# dataset_split)` makes it, `postprocess_fn` turns decoded strings into what
# the `metric_fns(targets, predictions)` compare.
EvalDataset = collections.namedtuple(
    "EvalDataset", ["name", "dataset_fn", "postprocess_fn", "metric_fns"])


# ----------------------------------------------------------------------------
# Helpers.


def _length_of(length: Length, key: str, what: str) -> int:
  """The length for feature `key` when `length` is an int or a dict."""
  if isinstance(length, Mapping):
    if key not in length:
      raise ValueError("%s: no length given for feature %r (lengths: %r)"
                       % (what, key, dict(length)))
    value = length[key]
  else:
    value = length
  if not isinstance(value, int) or isinstance(value, bool) or value < 1:
    raise ValueError("%s: length of feature %r must be a positive int, got %r"
                     % (what, key, value))
  return value


def _vocabulary_for(vocabulary, key: str):
  """A (inputs, targets) vocabulary pair gives "inputs" the first one."""
  if isinstance(vocabulary, tuple):
    return vocabulary[0] if key == "inputs" else vocabulary[1]
  return vocabulary


def _check_keys(dataset: tf.data.Dataset, keys: Sequence[str],
                what: str) -> None:
  spec = dataset.element_spec
  if not isinstance(spec, Mapping):
    raise ValueError("%s: expected a dataset of feature dicts, got elements "
                     "%s" % (what, spec))
  for k in keys:
    if k not in spec:
      raise ValueError("%s: feature %r not found in the dataset; available "
                       "features: %s" % (what, k, sorted(spec)))


def _ensure_eos_trimmed(v: tf.Tensor, length: int) -> tf.Tensor:
  """`v` trimmed to `length`; a token in the last slot becomes EOS.

  Same result as padding to `length` and applying ensure_dataset_eos, but
  on an unpadded sequence (so it can run before packing).
  """
  v = v[:length]
  return tf.concat(
      [v[:length - 1], tf.clip_by_value(v[length - 1:length], 0, EOS_ID)], 0)


# ----------------------------------------------------------------------------
# Fixed-length examples: padding and packing.


@gin.configurable(module=_GIN_MODULE)
def pack_or_pad(dataset: tf.data.Dataset, length: Optional[Length],
                pack: bool = True,
                feature_keys: Optional[Sequence[str]] = None,
                ensure_eos: bool = False) -> tf.data.Dataset:
  """Packs (`pack_dataset`) or trims and pads a dataset to `length`.

  Args:
    dataset: a dataset of dicts of 1-D integer features.
    length: an int or a {feature: int} dict; falsy returns `dataset` as is.
    pack: pack several examples per output example, else pad each.
    feature_keys: the features to pack or pad (default: all).
    ensure_eos: make the last token of an example cut at `length` EOS
      (a sequence that fills `length` ends with EOS, never mid-sentence).

  Returns:
    a dataset of fixed-length examples.
  """
  if not length:
    return dataset
  if pack:
    if ensure_eos:
      keys = list(feature_keys or dataset.element_spec.keys())
      _check_keys(dataset, keys, "pack_or_pad")
      lengths = {k: _length_of(length, k, "pack_or_pad") for k in keys}

      def eos_fn(features):
        return {k: (_ensure_eos_trimmed(v, lengths[k]) if k in lengths else v)
                for k, v in features.items()}
      dataset = dataset.map(eos_fn, num_parallel_calls=_AUTOTUNE)
    return pack_dataset(dataset, length=length, keys=feature_keys)
  dataset = trim_and_pad_dataset(dataset, length=length,
                                 feature_keys=feature_keys)
  if ensure_eos:
    dataset = ensure_dataset_eos(dataset, feature_keys=feature_keys)
  return dataset


def ensure_dataset_eos(dataset: tf.data.Dataset,
                       feature_keys: Optional[Sequence[str]] = None
                      ) -> tf.data.Dataset:
  """Replaces the final token of each feature by EOS unless it is padding.

  For padded fixed-length examples: one whose sequence was cut ends in EOS.

  Example: [5, 6, 7] -> [5, 6, 1]; [5, 1, 0] -> [5, 1, 0].
  """
  def fn(features):
    out = {}
    for k, v in features.items():
      if feature_keys and k not in feature_keys:
        out[k] = v
      else:
        out[k] = tf.concat([v[:-1], tf.clip_by_value(v[-1:], 0, EOS_ID)], 0)
    return out
  return dataset.map(fn, num_parallel_calls=_AUTOTUNE)


def trim_and_pad_dataset(dataset: tf.data.Dataset, length: Length,
                         feature_keys: Optional[Sequence[str]] = None
                        ) -> tf.data.Dataset:
  """Trims and zero-pads the first axis of features to `length`.

  Args:
    dataset: a dataset of dicts.
    length: an int or a {feature: int} dict.
    feature_keys: the features to trim and pad (default: all).

  Example: length 4: [5, 6, 1] -> [5, 6, 1, 0]; [5, 6, 7, 8, 1] -> [5, 6, 7, 8].
  """
  def trim_and_pad(k, t):
    if feature_keys and k not in feature_keys:
      return t
    n = _length_of(length, k, "trim_and_pad_dataset")
    t = t[:n]
    extra_dims = [[0, 0]] * (t.shape.rank - 1)
    t = tf.pad(t, [[0, n - tf.shape(t)[0]]] + extra_dims)
    t.set_shape([n] + t.shape.as_list()[1:])
    return t
  return dataset.map(
      lambda x: {k: trim_and_pad(k, t) for k, t in x.items()},
      num_parallel_calls=_AUTOTUNE)


_FLUSH = "__pack_flush__"


@gin.configurable(module=_GIN_MODULE)
def pack_dataset(dataset: tf.data.Dataset, length: Length,
                 keys: Optional[Sequence[str]] = None,
                 use_custom_ops: bool = False) -> tf.data.Dataset:
  """Packs several examples into each fixed-length output example.

  Sequences are cut to `length`, then appended in order to the current output
  example while every feature still fits; otherwise that example is emitted
  (zero-padded) and a new one started. For each packed feature `k` two
  features are added: `k_segmentation` (1-based index of the source example
  within the packed one, 0 on padding; the same index for every feature, so
  inputs and targets segments match) and `k_position` (position within the
  source example, 0 on padding). Features not in `keys` are dropped, values
  become int32. Examples that are empty in every feature are skipped.
  Unlike the original, packing is greedy over the whole stream, not within
  batches of `length` examples.

  Example (length 10):
    {"inputs": [8, 7, 1], "targets": [4, 1]},
    {"inputs": [2, 3, 4, 1], "targets": [5, 6, 1]}
    -> {"inputs":              [8, 7, 1, 2, 3, 4, 1, 0, 0, 0],
        "inputs_segmentation": [1, 1, 1, 2, 2, 2, 2, 0, 0, 0],
        "inputs_position":     [0, 1, 2, 0, 1, 2, 3, 0, 0, 0],
        "targets":             [4, 1, 5, 6, 1, 0, 0, 0, 0, 0],
        "targets_segmentation":[1, 1, 2, 2, 2, 0, 0, 0, 0, 0],
        "targets_position":    [0, 1, 0, 1, 2, 0, 0, 0, 0, 0]}

  Args:
    dataset: a dataset of dicts of 1-D integer features.
    length: an int or a {feature: int} dict.
    keys: the features to pack (default: all).
    use_custom_ops: only False is supported (the original's tensor2tensor
      custom ops do not exist for TF2; the TF-ops packing is equivalent).

  Returns:
    a dataset of dicts of int32 [length] features.

  Raises:
    ValueError: a key missing from the dataset, a feature that is not 1-D
      integer, a bad length, or use_custom_ops=True.
  """
  if use_custom_ops:
    raise ValueError(
        "pack_dataset: use_custom_ops=True needs tensor2tensor's custom "
        "packing ops, which do not exist for TensorFlow 2; use "
        "use_custom_ops=False (the same packing with TF ops)")
  spec = dataset.element_spec
  keys = list(keys if keys is not None else
              (spec.keys() if isinstance(spec, Mapping) else []))
  _check_keys(dataset, keys, "pack_dataset")
  if not keys:
    raise ValueError("pack_dataset: no features to pack")
  for k in keys:
    if not spec[k].shape.is_compatible_with([None]):
      raise ValueError("pack_dataset: feature %r must be 1-D to be packed, "
                       "has shape %s" % (k, spec[k].shape))
    if not spec[k].dtype.is_integer:
      raise ValueError("pack_dataset: feature %r must be integer token ids "
                       "to be packed, has dtype %s (encode it first)"
                       % (k, spec[k].dtype.name))
  lengths = {k: _length_of(length, k, "pack_dataset") for k in keys}
  for k in keys:
    for suffix in ("_segmentation", "_position"):
      if k + suffix in keys:
        raise ValueError("pack_dataset: cannot pack both %r and %r (packing "
                         "%r adds %r)" % (k, k + suffix, k, k + suffix))

  def prepare(features):
    out = {k: tf.cast(features[k][:lengths[k]], tf.int32) for k in keys}
    out[_FLUSH] = tf.constant(False)
    return out
  flush = {k: tf.zeros([0], tf.int32) for k in keys}
  flush[_FLUSH] = tf.constant(True)
  dataset = dataset.map(prepare, num_parallel_calls=_AUTOTUNE)
  dataset = dataset.concatenate(tf.data.Dataset.from_tensors(flush))

  empty = {}
  out_lengths = {}
  for k in keys:
    for suffix in ("", "_segmentation", "_position"):
      empty[k + suffix] = tf.zeros([0], tf.int32)
      out_lengths[k + suffix] = lengths[k]
  initial_state = (empty, tf.constant(0, tf.int32))

  def step(state, example):
    partial, count = state
    sizes = {k: tf.size(example[k]) for k in keys}
    nonempty = tf.reduce_any(tf.stack([sizes[k] > 0 for k in keys]))
    fits = tf.reduce_all(tf.stack(
        [tf.size(partial[k]) + sizes[k] <= lengths[k] for k in keys]))
    emit = tf.logical_and(
        count > 0,
        tf.logical_or(example[_FLUSH],
                      tf.logical_and(nonempty, tf.logical_not(fits))))
    output = {}
    for name, value in partial.items():
      n = out_lengths[name]
      output[name] = tf.reshape(tf.pad(value, [[0, n - tf.size(value)]]),
                                [n])
    # Keep the partial example unless it was emitted (slicing, not tf.cond).
    keep = tf.where(emit, 0, 1)
    count = count * keep
    segment_id = count + 1
    new_partial = {}
    for k in keys:
      seq = example[k]
      kept = tf.size(partial[k]) * keep
      new_partial[k] = tf.concat([partial[k][:kept], seq], 0)
      new_partial[k + "_segmentation"] = tf.concat(
          [partial[k + "_segmentation"][:kept],
           tf.fill(tf.shape(seq), segment_id)], 0)
      new_partial[k + "_position"] = tf.concat(
          [partial[k + "_position"][:kept],
           tf.range(tf.size(seq), dtype=tf.int32)], 0)
    count = count + tf.cast(nonempty, tf.int32)
    return (new_partial, count), (emit, output)

  dataset = dataset.scan(initial_state, step)
  dataset = dataset.filter(lambda emit, output: emit)
  return dataset.map(lambda emit, output: output,
                     num_parallel_calls=_AUTOTUNE)


def pad_dataset_with_zeroed_out_examples(ds: tf.data.Dataset
                                        ) -> tf.data.Dataset:
  """`ds` followed by endless all-zero copies of its examples.

  Lets an evaluation run a whole number of full batches: zeroed examples are
  all padding, so they add nothing to the metrics.
  """
  def zero_out(features):
    return {k: tf.zeros_like(v) for k, v in features.items()}
  return ds.concatenate(ds.map(zero_out).repeat())


# ----------------------------------------------------------------------------
# Encoding text features.


def encode_dataset(dataset: tf.data.Dataset, vocabulary) -> tf.data.Dataset:
  """Encodes every (string) feature with `vocabulary.encode_tf` (no EOS).

  `vocabulary` may be an (inputs, targets) pair: "inputs" uses the first.
  """
  def fn(features):
    return {k: _vocabulary_for(vocabulary, k).encode_tf(v)
            for k, v in features.items()}
  return dataset.map(fn, num_parallel_calls=_AUTOTUNE)


def encode_all_features(dataset: tf.data.Dataset,
                        vocabulary) -> tf.data.Dataset:
  """Encodes every (string) feature and appends EOS; ids become int64.

  Example (ByteVocabulary): {"targets": "hi"} -> {"targets": [107, 108, 1]}.
  """
  def fn(features):
    out = {}
    for k, v in features.items():
      ids = tf.cast(_vocabulary_for(vocabulary, k).encode_tf(v), tf.int64)
      out[k] = tf.concat([ids, tf.constant([EOS_ID], tf.int64)], 0)
    return out
  return dataset.map(fn, num_parallel_calls=_AUTOTUNE)


def supervised_to_dict(dataset: tf.data.Dataset,
                       text2self: bool) -> tf.data.Dataset:
  """(inputs, targets) pairs -> {"inputs", "targets"} dicts.

  With text2self (language modelling) only {"targets": targets} is kept.
  """
  def fn(inputs, targets):
    if text2self:
      return {"targets": targets}
    return {"inputs": inputs, "targets": targets}
  return dataset.map(fn, num_parallel_calls=_AUTOTUNE)


# ----------------------------------------------------------------------------
# TFDS.


def _load_tfds(dataset_name: str, dataset_split: str,
               tfds_data_dir: Optional[str],
               as_supervised: bool = True) -> tf.data.Dataset:
  """tfds.load without network: prepared data or an offline builder.

  The offline builders of `transformer.datasets` generate their data into
  `tfds_data_dir` on first use; any other dataset must already be prepared
  there (this package never downloads).

  Raises:
    ValueError: TFDS does not know `dataset_name` or it is not prepared.
  """
  # pylint: disable=g-import-not-at-top
  import tensorflow_datasets as tfds
  from transformer import datasets as offline
  # pylint: enable=g-import-not-at-top
  try:
    builder = tfds.builder(dataset_name, data_dir=tfds_data_dir)
  except tfds.core.registered.DatasetNotFoundError:
    raise ValueError(
        "TFDS does not know dataset %r (data_dir=%r). Offline datasets of "
        "this package: %s; any other TFDS dataset must be prepared in the "
        "data_dir beforehand." % (dataset_name, tfds_data_dir,
                                  sorted(offline.OFFLINE_DATASETS))) from None
  if not builder.is_prepared():
    if isinstance(builder, offline.OfflineBuilder):
      offline.prepare(builder)
    else:
      raise ValueError(
          "TFDS dataset %r is not prepared in data_dir %r and this package "
          "never downloads; prepare it first (e.g. `tfds build %s "
          "--data_dir=...`) or use an offline dataset: %s"
          % (dataset_name, str(builder.data_dir), dataset_name,
             sorted(offline.OFFLINE_DATASETS)))
  if dataset_split not in builder.info.splits:
    raise ValueError("TFDS dataset %r has no split %r; splits: %s"
                     % (dataset_name, dataset_split,
                        sorted(builder.info.splits)))
  return builder.as_dataset(split=dataset_split, as_supervised=as_supervised,
                            shuffle_files=False)


@gin.configurable(module=_GIN_MODULE)
def pretokenized_tfds_dataset(dataset_name=gin.REQUIRED,
                              text2self=gin.REQUIRED,
                              tfds_data_dir=gin.REQUIRED,
                              dataset_split=gin.REQUIRED,
                              batch_size=None,
                              sequence_length=gin.REQUIRED,
                              vocabulary=None) -> tf.data.Dataset:
  """A TFDS dataset whose text features are already encoded, packed.

  TFDS encoders reserve 0 for padding but have no EOS, so ids are shifted up
  by one (as `TFDSVocabulary` does) and EOS=1 is appended. The train split
  repeats and shuffles.

  Args:
    dataset_name: TFDS name, e.g. "lm1b/subwords32k".
    text2self: keep only "targets" (language modelling).
    tfds_data_dir: TFDS data_dir.
    dataset_split: "train", "validation", ...
    batch_size: unused (the driver batches).
    sequence_length: int or {feature: int}.
    vocabulary: unused (the encoding is the dataset's).
  """
  del batch_size, vocabulary
  dataset = _load_tfds(dataset_name, dataset_split, tfds_data_dir)
  for spec in dataset.element_spec:
    if not spec.dtype.is_integer:
      raise ValueError(
          "pretokenized_tfds_dataset: dataset %r holds %s features, not "
          "token ids; use untokenized_tfds_dataset with a vocabulary"
          % (dataset_name, spec.dtype.name))
  if dataset_split == "train":
    dataset = dataset.repeat().shuffle(1000)

  def shift_and_append_eos(ids):
    ids = tf.cast(ids, tf.int64)
    return tf.concat([ids + 1, tf.constant([EOS_ID], tf.int64)], 0)

  def fn(inputs, targets):
    if text2self:
      return {"targets": shift_and_append_eos(targets)}
    return {"inputs": shift_and_append_eos(inputs),
            "targets": shift_and_append_eos(targets)}
  dataset = dataset.map(fn, num_parallel_calls=_AUTOTUNE)
  return pack_or_pad(dataset, sequence_length)


@gin.configurable(module=_GIN_MODULE)
def untokenized_tfds_dataset(dataset_name=gin.REQUIRED,
                             text2self=gin.REQUIRED,
                             tfds_data_dir=gin.REQUIRED,
                             dataset_split=gin.REQUIRED,
                             batch_size=None,
                             sequence_length=gin.REQUIRED,
                             vocabulary=gin.REQUIRED,
                             pack=gin.REQUIRED) -> tf.data.Dataset:
  """A TFDS dataset of (inputs, targets) strings, encoded, packed or padded.

  Strings are encoded with `vocabulary` (a pair for separate inputs and
  targets vocabularies) and get EOS appended. The train split repeats and
  shuffles.

  Example (gin):
    run.train_dataset_fn = @untokenized_tfds_dataset
    untokenized_tfds_dataset.dataset_name = "mtf_reverse"
    untokenized_tfds_dataset.text2self = False
    untokenized_tfds_dataset.tfds_data_dir = "/tmp/tfds"
    untokenized_tfds_dataset.pack = False
  """
  del batch_size
  dataset = _load_tfds(dataset_name, dataset_split, tfds_data_dir)
  if dataset_split == "train":
    dataset = dataset.repeat().shuffle(1000)
  dataset = supervised_to_dict(dataset, text2self)
  dataset = encode_all_features(dataset, vocabulary)
  return pack_or_pad(dataset, sequence_length, pack)


# ----------------------------------------------------------------------------
# Text lines and TSV files.


def _glob(pattern: str, what: str) -> list:
  files = sorted(tf.io.gfile.glob(pattern))
  if not files:
    raise ValueError("%s: no files match %r" % (what, pattern))
  return files


@gin.configurable(module=_GIN_MODULE)
def sample_from_text_line_datasets(glob_weight_list: Sequence[
    Tuple[str, float]], shuffle_buffer_size: int = 100000,
                                   prefetch: int = 1000) -> tf.data.Dataset:
  """Endless lines sampled from several file globs with the given weights.

  Example: sample_from_text_line_datasets([("a/*.txt", 0.9), ("b.txt", 0.1)])
  """
  if not glob_weight_list:
    raise ValueError("sample_from_text_line_datasets: glob_weight_list is "
                     "empty")
  globs, weights = zip(*glob_weight_list)
  datasets = [
      simple_text_line_dataset(g, shuffle_buffer_size).repeat().prefetch(
          prefetch) for g in globs]
  if len(datasets) == 1:
    return datasets[0]
  return tf.data.Dataset.sample_from_datasets(datasets, weights=list(weights))


@gin.configurable(module=_GIN_MODULE)
def make_text_line_dataset(glob=gin.REQUIRED) -> tf.data.Dataset:
  """Endless shuffled lines of the files matching `glob`."""
  return sample_from_text_line_datasets([(glob, 1.0)])


@gin.configurable(module=_GIN_MODULE)
def simple_text_line_dataset(glob=gin.REQUIRED,
                             shuffle_buffer_size: int = 100000
                            ) -> tf.data.Dataset:
  """The lines (tf.string, no newline) of the files matching `glob`, shuffled
  within a buffer (0 or None: in file order)."""
  dataset = tf.data.TextLineDataset(_glob(glob, "simple_text_line_dataset"))
  if shuffle_buffer_size:
    dataset = dataset.shuffle(shuffle_buffer_size)
  return dataset


@gin.configurable(module=_GIN_MODULE)
def packed_parallel_tsv_dataset(dataset=gin.REQUIRED,
                                dataset_split=gin.REQUIRED,
                                batch_size=None,
                                sequence_length=gin.REQUIRED,
                                vocabulary=gin.REQUIRED,
                                append_eos=True,
                                eos_id=1,
                                max_encoded_len=0) -> tf.data.Dataset:
  """Lines "inputs<TAB>targets" -> encoded, packed examples.

  Args:
    dataset: a dataset of tf.string lines (e.g. make_text_line_dataset()).
    dataset_split: "train" repeats the lines.
    batch_size: unused (the driver batches).
    sequence_length: int or {"inputs": n, "targets": m}.
    vocabulary: a Vocabulary or an (inputs, targets) pair.
    append_eos: append `eos_id` to both sequences.
    eos_id: the EOS id.
    max_encoded_len: if > 0, drop pairs with a sequence longer than this
      (after encoding, EOS included).
  """
  del batch_size
  if dataset_split == "train":
    dataset = dataset.repeat()

  def parse(line):
    fields = tf.io.decode_csv(line, record_defaults=["", ""],
                              field_delim="\t", use_quote_delim=False)
    return {"inputs": fields[0], "targets": fields[1]}

  def encode(features):
    out = {}
    for k in ("inputs", "targets"):
      ids = tf.cast(_vocabulary_for(vocabulary, k).encode_tf(features[k]),
                    tf.int64)
      if append_eos:
        ids = tf.concat([ids, tf.constant([eos_id], tf.int64)], 0)
      out[k] = ids
    return out
  dataset = dataset.map(parse, num_parallel_calls=_AUTOTUNE)
  dataset = dataset.map(encode, num_parallel_calls=_AUTOTUNE)
  if max_encoded_len:
    dataset = dataset.filter(lambda x: tf.logical_and(
        tf.size(x["inputs"]) <= max_encoded_len,
        tf.size(x["targets"]) <= max_encoded_len))
  return pack_dataset(dataset, sequence_length)


# ----------------------------------------------------------------------------
# Pre-tokenized TFRecord files.


def pretokenized_tfrecord_dataset(filenames: Sequence[str], text2self: bool,
                                  eos_included: bool, repeat: bool,
                                  batch_size, sequence_length: Length,
                                  vocab_shift: int = 0) -> tf.data.Dataset:
  """tf.train.Examples with int64 list features "inputs"/"targets", packed.

  Args:
    filenames: TFRecord files.
    text2self: read only "targets".
    eos_included: the stored sequences already end in EOS; else it is
      appended (after the shift).
    repeat: repeat the records endlessly.
    batch_size: unused (the driver batches).
    sequence_length: int or {feature: int}.
    vocab_shift: added to every stored id.
  """
  del batch_size
  dataset = tf.data.TFRecordDataset(list(filenames),
                                    buffer_size=64 * 1024 * 1024)
  if repeat:
    dataset = dataset.repeat()
  keys = ["targets"] if text2self else ["inputs", "targets"]
  spec = {k: tf.io.VarLenFeature(tf.int64) for k in keys}

  def decode(record):
    parsed = tf.io.parse_single_example(record, spec)
    out = {}
    for k in keys:
      ids = tf.sparse.to_dense(parsed[k]) + vocab_shift
      if not eos_included:
        ids = tf.concat([ids, tf.constant([EOS_ID], tf.int64)], 0)
      out[k] = ids
    return out
  dataset = dataset.map(decode, num_parallel_calls=_AUTOTUNE)
  return pack_or_pad(dataset, sequence_length)


@gin.configurable(module=_GIN_MODULE)
def pretokenized_t2t_dataset(dataset_name=gin.REQUIRED,
                             text2self=False,
                             data_dir=gin.REQUIRED,
                             dataset_split="train",
                             batch_size=None,
                             sequence_length=gin.REQUIRED,
                             vocabulary=None,
                             eos_included=True,
                             vocab_shift=0) -> tf.data.Dataset:
  """The TFRecord shards tensor2tensor's t2t-datagen wrote, packed.

  Reads `<data_dir>/<dataset_name>-<dataset_split>-*` (tensor2tensor itself is
  not imported; its datagen makes the files). The train split repeats and
  shuffles.

  Raises:
    ValueError: no file matches.
  """
  del vocabulary
  pattern = os.path.join(data_dir, "%s-%s-*" % (dataset_name, dataset_split))
  filenames = sorted(tf.io.gfile.glob(pattern))
  if not filenames:
    raise ValueError(
        "pretokenized_t2t_dataset: no files match %r; generate the %r data "
        "with tensor2tensor's t2t-datagen first" % (pattern, dataset_name))
  logging.info("pretokenized_t2t_dataset: %d files match %s",
               len(filenames), pattern)
  dataset = pretokenized_tfrecord_dataset(
      filenames=filenames, text2self=text2self, eos_included=eos_included,
      repeat=dataset_split == "train", batch_size=batch_size,
      sequence_length=sequence_length, vocab_shift=vocab_shift)
  if dataset_split == "train":
    dataset = dataset.shuffle(1000)
  return dataset
