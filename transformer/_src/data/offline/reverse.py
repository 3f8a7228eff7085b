"""mtf_reverse: reverse a random string of letters (algorithmic seq2seq)."""

from __future__ import annotations

import string

import numpy as np
import tensorflow_datasets as tfds

from transformer._src.data.offline.builder import OfflineBuilder

__all__ = ["MtfReverse", "reverse_examples"]

ALPHABET = string.ascii_lowercase
MIN_LENGTH = 4
MAX_LENGTH = 12
TRAIN_SIZE = 20000
VALIDATION_SIZE = 1000
_SEEDS = {"train": 1234, "validation": 5678}


def _random_strings(seed: int, count: int, exclude=frozenset()):
  """`count` distinct-from-`exclude` random letter strings, fixed by seed."""
  rng = np.random.RandomState(seed)
  out = []
  while len(out) < count:
    n = rng.randint(MIN_LENGTH, MAX_LENGTH + 1)
    s = "".join(ALPHABET[i] for i in rng.randint(0, len(ALPHABET), size=n))
    if s not in exclude:
      out.append(s)
  return out


def reverse_examples(split: str):
  """The (inputs, targets) string pairs of a split, in generation order.

  Validation strings never occur among the training inputs (held out).
  """
  train = _random_strings(_SEEDS["train"], TRAIN_SIZE)
  if split == "train":
    strings = train
  elif split == "validation":
    strings = _random_strings(
      _SEEDS["validation"], VALIDATION_SIZE, exclude=frozenset(train)
    )
  else:
    raise ValueError(
      "mtf_reverse has splits 'train' and 'validation', not %r" % (split,)
    )
  return [(s, s[::-1]) for s in strings]


class MtfReverse(OfflineBuilder):
  """Reverse a string of 4-12 lowercase letters: "abcd" -> "dcba"."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release."}

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
      builder=self,
      description=(
        "Algorithmic seq2seq task generated locally: inputs are random "
        "strings of %d-%d letters from %r, targets the same strings "
        "reversed. Train %d, validation %d examples (held out), fixed "
        "seeds."
        % (MIN_LENGTH, MAX_LENGTH, ALPHABET, TRAIN_SIZE, VALIDATION_SIZE)
      ),
      features=tfds.features.FeaturesDict(
        {
          "inputs": tfds.features.Text(),
          "targets": tfds.features.Text(),
        }
      ),
      supervised_keys=("inputs", "targets"),
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # nothing to download
    return {
      split: self._generate_examples(split) for split in ("train", "validation")
    }

  def _generate_examples(self, split):
    for i, (inputs, targets) in enumerate(reverse_examples(split)):
      yield i, {"inputs": inputs, "targets": targets}
