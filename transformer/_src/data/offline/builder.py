"""Offline TFDS builders: base class, preparation, subword vocabularies."""

from __future__ import annotations

import inspect
import os
from typing import Dict, Iterable, Optional, Sequence

from etils import epath
import gin
import tensorflow as tf
import tensorflow_datasets as tfds
from tensorflow_datasets.core import utils as tfds_utils

from transformer._src.data import vocabulary as vocabulary_lib

__all__ = [
  "OFFLINE_DATASETS",
  "OfflineBuilder",
  "get_subword_vocabulary",
  "prepare",
]

# name -> builder class of every offline builder (filled on class creation).
OFFLINE_DATASETS: Dict[str, type] = {}


class OfflineBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """A GeneratorBasedBuilder whose data is generated locally, no download.

  Subclasses generate their examples from code or from files that every
  Python installation has; `prepare(builder)` writes them to the data_dir.
  """

  def __init_subclass__(cls, **kwargs):
    super().__init_subclass__(**kwargs)
    OFFLINE_DATASETS[cls.name] = cls

  @tfds_utils.classproperty
  @classmethod
  def code_path(cls) -> epath.Path:
    """The builder's source file.

    TFDS's own lookup touches the `importlib_resources` backport, which is
    not installed on Python >= 3.9 and made download_and_prepare fail.
    """
    return epath.Path(inspect.getfile(cls))


def prepare(builder: tfds.core.DatasetBuilder) -> tfds.core.DatasetBuilder:
  """Generates an offline builder's data into its data_dir (if not there).

  Raises:
    ValueError: `builder` is not an offline builder (it would download).
  """
  if not isinstance(builder, OfflineBuilder):
    raise ValueError(
      "prepare: %r is not an offline dataset of this package (%s); "
      "refusing to download it" % (builder.name, sorted(OFFLINE_DATASETS))
    )
  builder.download_and_prepare(
    download_config=tfds.download.DownloadConfig(try_download_gcs=False)
  )
  return builder


def _builder(dataset_name: str, data_dir: Optional[str]):
  try:
    return tfds.builder(dataset_name, data_dir=data_dir)
  except tfds.core.registered.DatasetNotFoundError:
    raise ValueError(
      "TFDS does not know dataset %r; offline datasets: %s"
      % (dataset_name, sorted(OFFLINE_DATASETS))
    ) from None


def _text_corpus(
  builder, split: str, keys: Sequence[str], max_chars: Optional[int]
) -> Iterable[str]:
  """The texts of `keys`, read in batches, until `max_chars` characters."""
  ds = builder.as_dataset(split=split, shuffle_files=False).batch(1024)
  chars = 0
  for batch in ds.as_numpy_iterator():
    for i in range(len(batch[keys[0]])):
      for k in keys:
        text = batch[k][i].decode("utf-8")
        yield text
        chars += len(text)
        if max_chars and chars >= max_chars:
          return


@gin.configurable(module="transformer.datasets")
def get_subword_vocabulary(
  dataset_name: str = gin.REQUIRED,
  data_dir: Optional[str] = None,
  target_vocab_size: int = 1000,
  split: str = "train",
  max_corpus_chars: Optional[int] = 300000,
) -> vocabulary_lib.TFDSVocabulary:
  """A subword vocabulary built offline from a dataset's text, cached.

  Builds a tfds.deprecated.text.SubwordTextEncoder from the text features of
  `split` (the first `max_corpus_chars` characters) and saves it as
  `<data_dir>/<dataset>/subwords_<target_vocab_size>.subwords`; later calls
  load that file. Offline datasets are generated first if needed.

  Example:
    >>> import tempfile
    >>> data_dir = tempfile.mkdtemp()
    >>> vocab = get_subword_vocabulary("mtf_reverse", data_dir=data_dir,
    ...                                target_vocab_size=300,
    ...                                max_corpus_chars=2000)
    Downloading and preparing dataset ...
    Dataset mtf_reverse downloaded and prepared to ...
    >>> vocab.decode(vocab.encode("Return the value."))
    'Return the value.'
    >>> sorted(os.listdir(os.path.join(data_dir, "mtf_reverse")))
    ['1.0.0', 'subwords_300.subwords']

  Raises:
    ValueError: unknown dataset, or a dataset without text features.
  """
  builder = _builder(dataset_name, data_dir)
  prefix = os.path.join(
    str(builder.data_dir_root),
    dataset_name.replace("/", "_"),
    "subwords_%d" % target_vocab_size,
  )
  encoder_cls = tfds.deprecated.text.SubwordTextEncoder
  if tf.io.gfile.exists(prefix + ".subwords"):
    return vocabulary_lib.TFDSVocabulary(encoder_cls.load_from_file(prefix))
  if not builder.is_prepared():
    prepare(builder)
  keys = [
    k
    for k, f in builder.info.features.items()
    if isinstance(f, tfds.features.Text)
  ]
  if not keys:
    raise ValueError(
      "get_subword_vocabulary: dataset %r has no text features" % dataset_name
    )
  encoder = encoder_cls.build_from_corpus(
    _text_corpus(builder, split, keys, max_corpus_chars),
    target_vocab_size=target_vocab_size,
    max_corpus_chars=max_corpus_chars,
  )
  tf.io.gfile.makedirs(os.path.dirname(prefix))
  tmp_prefix = prefix + ".tmp%d" % os.getpid()
  encoder.save_to_file(tmp_prefix)
  tf.io.gfile.rename(
    tmp_prefix + ".subwords", prefix + ".subwords", overwrite=True
  )
  return vocabulary_lib.TFDSVocabulary(encoder)
