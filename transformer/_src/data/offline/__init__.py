"""Offline demo datasets as TFDS builders (generated locally, never downloaded).

Importing this package registers the builders with TFDS, so afterwards
`tfds.builder(name, data_dir=...)` and `tfds.load(name, data_dir=...)` work
without network access; the first load generates the data in seconds.

- "mtf_reverse": an algorithmic seq2seq task — "inputs" a random string of
  4-12 lowercase letters, "targets" the same string reversed (exact-match
  accuracy measures it); train 20000 / validation 1000, fixed seeds.
- "mtf_stdlib_docs": a small language-modelling corpus — the docstring
  paragraphs of the Python standard library of the running interpreter
  (feature "text"); train / validation.

`get_subword_vocabulary` builds a subword vocabulary from a dataset offline
(tfds.deprecated.text.SubwordTextEncoder) and caches it in the data_dir;
`transformer.vocabulary.ByteVocabulary` needs nothing at all. The public
`transformer.dataset` module imports this package, so importing it (or
`transformer`) registers the builders.

Example:
  >>> import tempfile
  >>> import tensorflow_datasets as tfds
  >>> import transformer.dataset  # registers the builders
  >>> ds = tfds.load("mtf_reverse", split="validation",
  ...                data_dir=tempfile.mkdtemp())
  Downloading and preparing dataset ...
  Dataset mtf_reverse downloaded and prepared to ...
  >>> example = next(ds.as_numpy_iterator())
  >>> example["targets"] == example["inputs"][::-1]
  True
"""

from transformer._src.data.offline.builder import OFFLINE_DATASETS
from transformer._src.data.offline.builder import OfflineBuilder
from transformer._src.data.offline.builder import get_subword_vocabulary
from transformer._src.data.offline.builder import prepare
from transformer._src.data.offline.reverse import MtfReverse
from transformer._src.data.offline.stdlib_docs import MtfStdlibDocs

__all__ = [
  "MtfReverse",
  "MtfStdlibDocs",
  "OFFLINE_DATASETS",
  "OfflineBuilder",
  "get_subword_vocabulary",
  "prepare",
]
