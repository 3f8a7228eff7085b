"""Input pipelines: tf.data datasets of token-id features from text or ids.

The functions read text or pre-tokenized data (TFDS, text lines, TSV,
TFRecord) and encode it with a vocabulary (see vocabulary.py); unbatched
datasets come out of every loader, the driver batches them (and packs or pads
them with packing.py). Nothing here downloads: TFDS datasets must be prepared
in the data_dir already, except the offline builders (offline/), which
generate their data locally on first use.
"""

from __future__ import annotations

import collections
import os
from typing import Optional, Sequence, Tuple

from absl import logging
import gin
import tensorflow as tf
import tensorflow_datasets as tfds

from transformer._src.data import offline
from transformer._src.data.packing import EOS_ID
from transformer._src.data.packing import Length
from transformer._src.data.packing import pack_dataset
from transformer._src.data.packing import pack_or_pad

_GIN_MODULE = "mesh_tensorflow.transformer.dataset"
_AUTOTUNE = tf.data.AUTOTUNE

# A named evaluation dataset: `dataset_fn(sequence_length, vocabulary,
# dataset_split)` makes it, `postprocess_fn` turns decoded strings into what
# the `metric_fns(targets, predictions)` compare.
EvalDataset = collections.namedtuple(
  "EvalDataset", ["name", "dataset_fn", "postprocess_fn", "metric_fns"]
)


def _vocabulary_for(vocabulary, key: str):
  """A (inputs, targets) vocabulary pair gives "inputs" the first one."""
  if isinstance(vocabulary, tuple):
    return vocabulary[0] if key == "inputs" else vocabulary[1]
  return vocabulary


# ----------------------------------------------------------------------------
# Encoding text features.


def encode_dataset(dataset: tf.data.Dataset, vocabulary) -> tf.data.Dataset:
  """Encodes every (string) feature with `vocabulary.encode_tf` (no EOS).

  `vocabulary` may be an (inputs, targets) pair: "inputs" uses the first.

  Args:
    dataset: a dataset of {feature: scalar tf.string} dicts.
    vocabulary: a Vocabulary, or an (inputs, targets) pair of them.

  Returns:
    A dataset of {feature: 1-D int32 ids [length]} dicts, without EOS.
  """

  def fn(features):
    return {
      k: _vocabulary_for(vocabulary, k).encode_tf(v)
      for k, v in features.items()
    }

  return dataset.map(fn, num_parallel_calls=_AUTOTUNE)


def encode_all_features(
  dataset: tf.data.Dataset, vocabulary
) -> tf.data.Dataset:
  """Encodes every (string) feature and appends EOS; ids become int64.

  Example:
    >>> from transformer import vocabulary
    >>> dataset = tf.data.Dataset.from_tensors({"targets": "hi"})
    >>> dataset = encode_all_features(dataset, vocabulary.ByteVocabulary())
    >>> list(dataset.as_numpy_iterator())
    [{'targets': array([107, 108,   1])}]

  Args:
    dataset: a dataset of {feature: scalar tf.string} dicts.
    vocabulary: a Vocabulary, or an (inputs, targets) pair of them: "inputs" is
      encoded with the first, every other feature with the second.

  Returns:
    A dataset of {feature: 1-D int64 ids [length]} dicts, each ending in EOS
    (1).
  """

  def fn(features):
    out = {}
    for k, v in features.items():
      ids = tf.cast(_vocabulary_for(vocabulary, k).encode_tf(v), tf.int64)
      out[k] = tf.concat([ids, tf.constant([EOS_ID], tf.int64)], 0)
    return out

  return dataset.map(fn, num_parallel_calls=_AUTOTUNE)


def supervised_to_dict(
  dataset: tf.data.Dataset, text2self: bool
) -> tf.data.Dataset:
  """(inputs, targets) pairs -> {"inputs", "targets"} dicts.

  With text2self (language modelling) only {"targets": targets} is kept.

  Args:
    dataset: a dataset of (inputs, targets) tensor pairs, as TFDS's
      as_supervised gives.
    text2self: keep only the targets.

  Returns:
    A dataset of {"inputs": inputs, "targets": targets} dicts (or {"targets":
    targets}).
  """

  def fn(inputs, targets):
    if text2self:
      return {"targets": targets}
    return {"inputs": inputs, "targets": targets}

  return dataset.map(fn, num_parallel_calls=_AUTOTUNE)


# ----------------------------------------------------------------------------
# TFDS.


def _load_tfds(
  dataset_name: str,
  dataset_split: str,
  tfds_data_dir: Optional[str],
  as_supervised: bool = True,
) -> tf.data.Dataset:
  """tfds.load without network: prepared data or an offline builder.

  The offline builders (offline/) generate their data into
  `tfds_data_dir` on first use; any other dataset must already be prepared
  there (this package never downloads).

  Raises:
    ValueError: TFDS does not know `dataset_name` or it is not prepared.
  """
  try:
    builder = tfds.builder(dataset_name, data_dir=tfds_data_dir)
  except tfds.core.registered.DatasetNotFoundError:
    raise ValueError(
      "TFDS does not know dataset %r (data_dir=%r). Offline datasets of "
      "this package: %s; any other TFDS dataset must be prepared in the "
      "data_dir beforehand."
      % (dataset_name, tfds_data_dir, sorted(offline.OFFLINE_DATASETS))
    ) from None
  if not builder.is_prepared():
    if isinstance(builder, offline.OfflineBuilder):
      offline.prepare(builder)
    else:
      raise ValueError(
        "TFDS dataset %r is not prepared in data_dir %r and this package "
        "never downloads; prepare it first (e.g. `tfds build %s "
        "--data_dir=...`) or use an offline dataset: %s"
        % (
          dataset_name,
          str(builder.data_dir),
          dataset_name,
          sorted(offline.OFFLINE_DATASETS),
        )
      )
  if dataset_split not in builder.info.splits:
    raise ValueError(
      "TFDS dataset %r has no split %r; splits: %s"
      % (dataset_name, dataset_split, sorted(builder.info.splits))
    )
  return builder.as_dataset(
    split=dataset_split, as_supervised=as_supervised, shuffle_files=False
  )


@gin.configurable(module=_GIN_MODULE)
def pretokenized_tfds_dataset(
  dataset_name=gin.REQUIRED,
  text2self=gin.REQUIRED,
  tfds_data_dir=gin.REQUIRED,
  dataset_split=gin.REQUIRED,
  batch_size=None,
  sequence_length=gin.REQUIRED,
  vocabulary=None,
) -> tf.data.Dataset:
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

  Returns:
    A dataset of packed examples (features and their _segmentation and _position
    features, each 1-D of its sequence length).

  Raises:
    ValueError: if the dataset's features are not integer token ids.
  """
  del batch_size, vocabulary
  dataset = _load_tfds(dataset_name, dataset_split, tfds_data_dir)
  for spec in dataset.element_spec:
    if not spec.dtype.is_integer:
      raise ValueError(
        "pretokenized_tfds_dataset: dataset %r holds %s features, not "
        "token ids; use untokenized_tfds_dataset with a vocabulary"
        % (dataset_name, spec.dtype.name)
      )
  if dataset_split == "train":
    dataset = dataset.repeat().shuffle(1000)

  def shift_and_append_eos(ids):
    ids = tf.cast(ids, tf.int64)
    return tf.concat([ids + 1, tf.constant([EOS_ID], tf.int64)], 0)

  def fn(inputs, targets):
    if text2self:
      return {"targets": shift_and_append_eos(targets)}
    return {
      "inputs": shift_and_append_eos(inputs),
      "targets": shift_and_append_eos(targets),
    }

  dataset = dataset.map(fn, num_parallel_calls=_AUTOTUNE)
  return pack_or_pad(dataset, sequence_length)


@gin.configurable(module=_GIN_MODULE)
def untokenized_tfds_dataset(
  dataset_name=gin.REQUIRED,
  text2self=gin.REQUIRED,
  tfds_data_dir=gin.REQUIRED,
  dataset_split=gin.REQUIRED,
  batch_size=None,
  sequence_length=gin.REQUIRED,
  vocabulary=gin.REQUIRED,
  pack=gin.REQUIRED,
) -> tf.data.Dataset:
  """A TFDS dataset of (inputs, targets) strings, encoded, packed or padded.

  Strings are encoded with `vocabulary` (a pair for separate inputs and
  targets vocabularies) and get EOS appended. The train split repeats and
  shuffles.

  In gin, `run.train_dataset_fn = @untokenized_tfds_dataset` makes the driver
  call it with the run's split, sequence length and vocabulary.

  Example (gin; the offline dataset is generated on first use):
    >>> import tempfile
    >>> from transformer import vocabulary
    >>> _ = gin.parse_config('''
    ... untokenized_tfds_dataset.dataset_name = "mtf_reverse"
    ... untokenized_tfds_dataset.text2self = False
    ... untokenized_tfds_dataset.pack = False
    ... ''')
    >>> dataset = untokenized_tfds_dataset(
    ...     tfds_data_dir=tempfile.mkdtemp(), dataset_split="validation",
    ...     sequence_length=16, vocabulary=vocabulary.ByteVocabulary())
    Downloading and preparing dataset ...
    Dataset mtf_reverse downloaded and prepared to ...
    >>> gin.clear_config()
    >>> example = next(dataset.as_numpy_iterator())
    >>> sorted(example), example["inputs"].shape
    (['inputs', 'targets'], (16,))
    >>> vocab = vocabulary.ByteVocabulary()
    >>> vocab.decode(example["inputs"]), vocab.decode(example["targets"])
    ('ueguxglar', 'ralgxugeu')

  Args:
    dataset_name: the TFDS name, e.g. "mtf_reverse" or "lm1b".
    text2self: keep only "targets" (language modelling).
    tfds_data_dir: the TFDS data_dir.
    dataset_split: the dataset split, e.g. "train" or "validation"; "train"
      repeats and shuffles.
    batch_size: unused (the driver batches).
    sequence_length: an int or a {feature: int} dict: the length of each
      example.
    vocabulary: a Vocabulary, or an (inputs, targets) pair of them.
    pack: pack several examples into each sequence (else trim and pad each one).

  Returns:
    A dataset of {feature: 1-D int ids of its sequence length} dicts (packed
    examples also carry _segmentation and _position features).
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
def sample_from_text_line_datasets(
  glob_weight_list: Sequence[Tuple[str, float]],
  shuffle_buffer_size: int = 100000,
  prefetch: int = 1000,
) -> tf.data.Dataset:
  """Endless lines sampled from several file globs with the given weights.

  Example:
    >>> import tempfile
    >>> folder = tempfile.mkdtemp()
    >>> for name in ["a1", "a2", "b"]:  # one line per file: its name
    ...   with open(os.path.join(folder, name + ".txt"), "w") as f:
    ...     _ = f.write(name)
    >>> lines = sample_from_text_line_datasets(
    ...     [(os.path.join(folder, "a*.txt"), 0.9),
    ...      (os.path.join(folder, "b.txt"), 0.1)])
    >>> sorted(set(lines.take(500).as_numpy_iterator()))  # "b" 1 time in 10
    [b'a1', b'a2', b'b']

  Args:
    glob_weight_list: (file pattern, weight) pairs; each line is drawn from a
      pattern with probability proportional to its weight.
    shuffle_buffer_size: size of each pattern's shuffle buffer (0: in file
      order).
    prefetch: lines prefetched per pattern.

  Returns:
    An endless tf.string dataset of lines.

  Raises:
    ValueError: if `glob_weight_list` is empty.
  """
  if not glob_weight_list:
    raise ValueError(
      "sample_from_text_line_datasets: glob_weight_list is empty"
    )
  globs, weights = zip(*glob_weight_list)
  datasets = [
    simple_text_line_dataset(g, shuffle_buffer_size).repeat().prefetch(prefetch)
    for g in globs
  ]
  if len(datasets) == 1:
    return datasets[0]
  return tf.data.Dataset.sample_from_datasets(datasets, weights=list(weights))


@gin.configurable(module=_GIN_MODULE)
def make_text_line_dataset(glob=gin.REQUIRED) -> tf.data.Dataset:
  """Endless shuffled lines of the files matching `glob`.

  Args:
    glob: a file pattern, e.g. "/data/train-*.txt".

  Returns:
    An endless tf.string dataset of the matching files' lines.
  """
  return sample_from_text_line_datasets([(glob, 1.0)])


@gin.configurable(module=_GIN_MODULE)
def simple_text_line_dataset(
  glob=gin.REQUIRED, shuffle_buffer_size: int = 100000
) -> tf.data.Dataset:
  """The lines (tf.string, no newline) of the files matching `glob`, shuffled
  within a buffer (0 or None: in file order).

  Args:
    glob: a file pattern, e.g. "/data/train-*.txt".
    shuffle_buffer_size: size of the shuffle buffer (0 or None: in file order).

  Returns:
    A finite tf.string dataset of the lines.
  """
  dataset = tf.data.TextLineDataset(_glob(glob, "simple_text_line_dataset"))
  if shuffle_buffer_size:
    dataset = dataset.shuffle(shuffle_buffer_size)
  return dataset


@gin.configurable(module=_GIN_MODULE)
def packed_parallel_tsv_dataset(
  dataset=gin.REQUIRED,
  dataset_split=gin.REQUIRED,
  batch_size=None,
  sequence_length=gin.REQUIRED,
  vocabulary=gin.REQUIRED,
  append_eos=True,
  eos_id=1,
  max_encoded_len=0,
) -> tf.data.Dataset:
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

  Returns:
    A dataset of packed examples: {"inputs", "targets", "inputs_segmentation",
    "inputs_position", "targets_segmentation", "targets_position"}, each a 1-D
    int tensor of its sequence length.
  """
  del batch_size
  if dataset_split == "train":
    dataset = dataset.repeat()

  def parse(line):
    fields = tf.io.decode_csv(
      line, record_defaults=["", ""], field_delim="\t", use_quote_delim=False
    )
    return {"inputs": fields[0], "targets": fields[1]}

  def encode(features):
    out = {}
    for k in ("inputs", "targets"):
      ids = tf.cast(
        _vocabulary_for(vocabulary, k).encode_tf(features[k]), tf.int64
      )
      if append_eos:
        ids = tf.concat([ids, tf.constant([eos_id], tf.int64)], 0)
      out[k] = ids
    return out

  dataset = dataset.map(parse, num_parallel_calls=_AUTOTUNE)
  dataset = dataset.map(encode, num_parallel_calls=_AUTOTUNE)
  if max_encoded_len:
    dataset = dataset.filter(
      lambda x: tf.logical_and(
        tf.size(x["inputs"]) <= max_encoded_len,
        tf.size(x["targets"]) <= max_encoded_len,
      )
    )
  return pack_dataset(dataset, sequence_length)


# ----------------------------------------------------------------------------
# Pre-tokenized TFRecord files.


def pretokenized_tfrecord_dataset(
  filenames: Sequence[str],
  text2self: bool,
  eos_included: bool,
  repeat: bool,
  batch_size,
  sequence_length: Length,
  vocab_shift: int = 0,
) -> tf.data.Dataset:
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

  Returns:
    A dataset of packed examples (features and their _segmentation and _position
    features, each 1-D of its sequence length).
  """
  del batch_size
  dataset = tf.data.TFRecordDataset(
    list(filenames), buffer_size=64 * 1024 * 1024
  )
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
def pretokenized_t2t_dataset(
  dataset_name=gin.REQUIRED,
  text2self=False,
  data_dir=gin.REQUIRED,
  dataset_split="train",
  batch_size=None,
  sequence_length=gin.REQUIRED,
  vocabulary=None,
  eos_included=True,
  vocab_shift=0,
) -> tf.data.Dataset:
  """The TFRecord shards tensor2tensor's t2t-datagen wrote, packed.

  Reads `<data_dir>/<dataset_name>-<dataset_split>-*` (tensor2tensor itself is
  not imported; its datagen makes the files). The train split repeats and
  shuffles.

  Args:
    dataset_name: the t2t problem name that prefixes the shards, e.g.
      "languagemodel_lm1b32k".
    text2self: read only "targets" (language modelling).
    data_dir: the directory holding the shards.
    dataset_split: "train" (repeated and shuffled), "dev", ...
    batch_size: unused (the driver batches).
    sequence_length: an int or a {feature: int} dict: the packed length.
    vocabulary: unused (the shards hold ids already).
    eos_included: the stored sequences already end in EOS; else it is appended.
    vocab_shift: added to every stored id (e.g. 1 for encoders whose ids start
      at 0).

  Returns:
    A dataset of packed examples (features and their _segmentation and _position
    features, each 1-D of its sequence length).

  Raises:
    ValueError: no file matches.
  """
  del vocabulary
  pattern = os.path.join(data_dir, "%s-%s-*" % (dataset_name, dataset_split))
  filenames = sorted(tf.io.gfile.glob(pattern))
  if not filenames:
    raise ValueError(
      "pretokenized_t2t_dataset: no files match %r; generate the %r data "
      "with tensor2tensor's t2t-datagen first" % (pattern, dataset_name)
    )
  logging.info(
    "pretokenized_t2t_dataset: %d files match %s", len(filenames), pattern
  )
  dataset = pretokenized_tfrecord_dataset(
    filenames=filenames,
    text2self=text2self,
    eos_included=eos_included,
    repeat=dataset_split == "train",
    batch_size=batch_size,
    sequence_length=sequence_length,
    vocab_shift=vocab_shift,
  )
  if dataset_split == "train":
    dataset = dataset.shuffle(1000)
  return dataset
