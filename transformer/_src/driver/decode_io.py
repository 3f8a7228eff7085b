"""The text inputs and outputs of the decoding and scoring entry points.

Reading input lines from a file and writing output lines to one, encoding
strings into fixed-length id batches (`encode_inputs`,
`encode_delimited_lm`), and reading id rows from an input_fn's dataset
(`call_input_fn`, `feature_rows`). Decoding (decode.py) and scoring
(scoring.py) share them; transformer/utils.py re-exports the original's
names among them.
"""

from __future__ import annotations

import inspect
import os
from typing import (
  Any,
  Callable,
  Dict,
  Iterable,
  List,
  Optional,
  Sequence,
)

import gin
import numpy as np
import tensorflow as tf

from transformer._src.driver.config import SequenceLength
from transformer._src.driver.config import Vocabularies
from transformer._src.driver.config import inputs_vocabulary
from transformer._src.driver.config import targets_vocabulary

__all__ = [
  "call_input_fn",
  "check_required",
  "encode_delimited_lm",
  "encode_inputs",
  "feature_rows",
  "get_inputs_from_file",
  "write_lines_to_file",
]


def check_required(what: str, **params) -> None:
  for name, value in params.items():
    if value is gin.REQUIRED:
      raise ValueError("%s: parameter %r is required" % (what, name))


def get_inputs_from_file(
  input_filename: str, ignore_comments: bool = False
) -> List[str]:
  """Lines of input_filename (no trailing newline); '#' lines dropped if
  ignore_comments.

  Args:
    input_filename: a text file.
    ignore_comments: drop lines that start with "#".

  Returns:
    A list of strings, one per line, without the newline.
  """
  with tf.io.gfile.GFile(input_filename, "rb") as f:
    data = f.read()
  try:
    text = data.decode("utf-8")
  except UnicodeDecodeError as e:
    raise ValueError(
      "input file %s is not UTF-8 text: %s" % (input_filename, e)
    ) from e
  lines = text.split("\n")
  if lines and not lines[-1]:
    lines.pop()
  if ignore_comments:
    lines = [l for l in lines if not l.startswith("#")]
  return lines


def write_lines_to_file(lines: Iterable[Any], filename: str) -> None:
  """Writes lines (one per line) to filename, creating its directory.

  As the original, str() of each line is written with its newlines turned
  into spaces, so that one item stays one line.

  Args:
    lines: the lines (str() of each is written).
    filename: the output file; its directory is created.
  """
  directory = os.path.dirname(filename)
  if directory:
    tf.io.gfile.makedirs(directory)
  with tf.io.gfile.GFile(filename, "w") as f:
    # One write, even of nothing: GFile creates the file on its first write,
    # and no inputs must still give an (empty) output file.
    f.write("".join("%s\n" % str(line).replace("\n", " ") for line in lines))


def _fit(ids: List[int], length: int) -> List[int]:
  """ids truncated or zero-padded to length."""
  return ids[:length] + [0] * max(0, length - len(ids))


def _pad_to_batches(rows: List[List[int]], batch_size: int) -> np.ndarray:
  """rows plus copies of the first row up to a multiple of batch_size."""
  if rows:
    rows = rows + [rows[0]] * (-len(rows) % batch_size)
  return np.array(rows, dtype=np.int32)


def encode_inputs(
  inputs: Sequence[str],
  vocabulary: Vocabularies,
  model_type: str,
  batch_size: int,
  sequence_length: SequenceLength,
  eos_id: int = 1,
  unscored_prefix: Optional[Sequence[str]] = None,
) -> np.ndarray:
  """Encodes input strings for decoding or scoring.

  Each string is encoded with the inputs vocabulary; the line's
  unscored_prefix is encoded in front with negated ids (context the score
  skips); EOS ends
  the ids unless model_type is "lm" (an LM continues its input). Rows are
  truncated / zero-padded to sequence_length, and copies of the first row
  pad the list to a whole number of batches.

  Example:
    >>> from transformer import vocabulary
    >>> encode_inputs(["ab"], vocabulary.ByteVocabulary(), "bitransformer",
    ...               batch_size=2, sequence_length=4)
    array([[100, 101,   1,   0],
           [100, 101,   1,   0]], dtype=int32)

  Args:
    inputs: the input strings.
    vocabulary: a Vocabulary, or an (inputs, targets) pair of them.
    model_type: "bitransformer", "lm", "delimited_lm", "aligned" or
      "bi_student_teacher".
    batch_size: the number of sequences per batch.
    sequence_length: the length of each row in tokens (int).
    eos_id: the EOS id (1).
    unscored_prefix: one string per input, encoded in front of it with negated
      ids, which scoring skips (None: no prefixes). A single string is the
      prefix of every input.

  Returns:
    int32 array [ceil(n / batch_size) * batch_size, sequence_length].
  """
  vocab = inputs_vocabulary(vocabulary)
  rows = []
  if isinstance(unscored_prefix, str):
    unscored_prefix = [unscored_prefix] * len(inputs)
  for line_num, line in enumerate(inputs):
    ids = list(vocab.encode(line.strip()))
    if unscored_prefix:
      prefix = unscored_prefix[line_num].strip()
      ids = [-i for i in vocab.encode(prefix)] + ids
    if model_type != "lm":
      ids.append(eos_id)
    rows.append(_fit(ids, sequence_length))
  return _pad_to_batches(rows, batch_size)


def encode_delimited_lm(
  inputs: Sequence[str],
  targets: Sequence[str],
  vocabulary: Vocabularies,
  batch_size: int,
  sequence_length: SequenceLength,
  eos_id: int = 1,
  include_final_eos: bool = True,
) -> np.ndarray:
  """Encodes (input, target) string pairs as one delimited LM sequence.

  Each row is input ids, EOS, target ids (and a final EOS if
  include_final_eos), truncated / zero-padded to sequence_length; copies of
  the first row pad the list to a whole number of batches.

  Args:
    inputs: the input strings.
    targets: the target strings, one per input.
    vocabulary: a Vocabulary, or an (inputs, targets) pair of them.
    batch_size: the number of sequences per batch.
    sequence_length: the length of each row in tokens (int).
    eos_id: the EOS id (1).
    include_final_eos: append EOS after the target ids.

  Returns:
    int32 array [ceil(n / batch_size) * batch_size, sequence_length].

  Raises:
    ValueError: if inputs and targets differ in number.
  """
  if len(inputs) != len(targets):
    raise ValueError(
      "encode_delimited_lm: %d inputs but %d targets"
      % (len(inputs), len(targets))
    )
  rows = []
  for x, y in zip(inputs, targets):
    ids = (
      list(inputs_vocabulary(vocabulary).encode(x.strip()))
      + [eos_id]
      + list(targets_vocabulary(vocabulary).encode(y.strip()))
    )
    if include_final_eos:
      ids.append(eos_id)
    rows.append(_fit(ids, sequence_length))
  return _pad_to_batches(rows, batch_size)


def call_input_fn(input_fn: Callable, estimator) -> tf.data.Dataset:
  """input_fn() or, for the original's input_fn(params), with batch_size."""
  if inspect.signature(input_fn).parameters:
    return input_fn({"batch_size": estimator.batch_size})
  return input_fn()


def feature_rows(
  dataset: tf.data.Dataset, keys: Sequence[str], lengths: Dict[str, int]
) -> Dict[str, np.ndarray]:
  """{key: int32 [n, length]} from a dataset of examples or batches."""
  rows = {k: [] for k in keys}
  for element in dataset.as_numpy_iterator():
    for k in keys:
      if k not in element:
        raise ValueError(
          "the dataset has no %r feature (it has %s)" % (k, sorted(element))
        )
      value = np.asarray(element[k])
      for row in value if value.ndim == 2 else [value]:
        rows[k].append(_fit([int(i) for i in row], lengths[k]))
  return {
    k: np.array(v, np.int32).reshape([-1, lengths[k]]) for k, v in rows.items()
  }
