"""Fixed-length examples: padding, packing and EOS handling of tf.data datasets.

A dataset here yields dicts of 1-D integer features ("inputs", "targets");
id 0 is padding and id 1 is end-of-sequence (EOS). `trim_and_pad_dataset`
pads every example to a fixed length; `pack_dataset` packs several examples
into one (adding `<key>_segmentation` and `<key>_position`).
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence, Union

import gin
import tensorflow as tf

_GIN_MODULE = "mesh_tensorflow.transformer.dataset"
_AUTOTUNE = tf.data.AUTOTUNE
EOS_ID = 1

Length = Union[int, Mapping[str, int]]


# ----------------------------------------------------------------------------
# Helpers.


def _length_of(length: Length, key: str, what: str) -> int:
  """The length for feature `key` when `length` is an int or a dict."""
  if isinstance(length, Mapping):
    if key not in length:
      raise ValueError(
        "%s: no length given for feature %r (lengths: %r)"
        % (what, key, dict(length))
      )
    value = length[key]
  else:
    value = length
  if not isinstance(value, int) or isinstance(value, bool) or value < 1:
    raise ValueError(
      "%s: length of feature %r must be a positive int, got %r"
      % (what, key, value)
    )
  return value


def _check_keys(
  dataset: tf.data.Dataset, keys: Sequence[str], what: str
) -> None:
  spec = dataset.element_spec
  if not isinstance(spec, Mapping):
    raise ValueError(
      "%s: expected a dataset of feature dicts, got elements %s" % (what, spec)
    )
  for k in keys:
    if k not in spec:
      raise ValueError(
        "%s: feature %r not found in the dataset; available "
        "features: %s" % (what, k, sorted(spec))
      )


def _ensure_eos_trimmed(v: tf.Tensor, length: int) -> tf.Tensor:
  """`v` trimmed to `length`; a token in the last slot becomes EOS.

  Same result as padding to `length` and applying ensure_dataset_eos, but
  on an unpadded sequence (so it can run before packing).
  """
  v = v[:length]
  return tf.concat(
    [v[: length - 1], tf.clip_by_value(v[length - 1 : length], 0, EOS_ID)], 0
  )


# ----------------------------------------------------------------------------
# Fixed-length examples: padding and packing.


@gin.configurable(module=_GIN_MODULE)
def pack_or_pad(
  dataset: tf.data.Dataset,
  length: Optional[Length],
  pack: bool = True,
  feature_keys: Optional[Sequence[str]] = None,
  ensure_eos: bool = False,
) -> tf.data.Dataset:
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
        return {
          k: (_ensure_eos_trimmed(v, lengths[k]) if k in lengths else v)
          for k, v in features.items()
        }

      dataset = dataset.map(eos_fn, num_parallel_calls=_AUTOTUNE)
    return pack_dataset(dataset, length=length, keys=feature_keys)
  dataset = trim_and_pad_dataset(
    dataset, length=length, feature_keys=feature_keys
  )
  if ensure_eos:
    dataset = ensure_dataset_eos(dataset, feature_keys=feature_keys)
  return dataset


def ensure_dataset_eos(
  dataset: tf.data.Dataset, feature_keys: Optional[Sequence[str]] = None
) -> tf.data.Dataset:
  """Replaces the final token of each feature by EOS unless it is padding.

  For padded fixed-length examples: one whose sequence was cut ends in EOS.

  Example:
    >>> dataset = tf.data.Dataset.from_tensor_slices(
    ...     {"targets": [[5, 6, 7], [5, 1, 0]]})
    >>> [x["targets"] for x in ensure_dataset_eos(dataset).as_numpy_iterator()]
    [array([5, 6, 1], dtype=int32), array([5, 1, 0], dtype=int32)]

  Args:
    dataset: a dataset of {feature: 1-D int tensor [length]} dicts, already
      padded or trimmed to a fixed length.
    feature_keys: the features to fix (default: all).

  Returns:
    The dataset with the last id of each chosen feature clipped to at most EOS
    (1): padding (0) and EOS stay, any other id becomes EOS.
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


def trim_and_pad_dataset(
  dataset: tf.data.Dataset,
  length: Length,
  feature_keys: Optional[Sequence[str]] = None,
) -> tf.data.Dataset:
  """Trims and zero-pads the first axis of features to `length`.

  Args:
    dataset: a dataset of dicts.
    length: an int or a {feature: int} dict.
    feature_keys: the features to trim and pad (default: all).

  Example:
    >>> dataset = tf.data.Dataset.from_generator(
    ...     lambda: iter([{"targets": [5, 6, 1]},
    ...                   {"targets": [5, 6, 7, 8, 1]}]),
    ...     output_signature={"targets": tf.TensorSpec([None], tf.int32)})
    >>> dataset = trim_and_pad_dataset(dataset, 4)
    >>> [x["targets"] for x in dataset.as_numpy_iterator()]
    [array([5, 6, 1, 0], dtype=int32), array([5, 6, 7, 8], dtype=int32)]

  Returns:
    The dataset with each chosen feature's first axis cut or zero-padded to
    exactly its length (a static shape).
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
    num_parallel_calls=_AUTOTUNE,
  )


_FLUSH = "__pack_flush__"


@gin.configurable(module=_GIN_MODULE)
def pack_dataset(
  dataset: tf.data.Dataset,
  length: Length,
  keys: Optional[Sequence[str]] = None,
  use_custom_ops: bool = False,
) -> tf.data.Dataset:
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

  Example (two examples packed into one of length 10):
    >>> dataset = tf.data.Dataset.from_generator(
    ...     lambda: iter([{"inputs": [8, 7, 1], "targets": [4, 1]},
    ...                   {"inputs": [2, 3, 4, 1], "targets": [5, 6, 1]}]),
    ...     output_signature={"inputs": tf.TensorSpec([None], tf.int32),
    ...                       "targets": tf.TensorSpec([None], tf.int32)})
    >>> packed = list(pack_dataset(dataset, 10).as_numpy_iterator())
    >>> len(packed)
    1
    >>> for name, ids in sorted(packed[0].items()):
    ...   print("%-20s %s" % (name, ids))
    inputs               [8 7 1 2 3 4 1 0 0 0]
    inputs_position      [0 1 2 0 1 2 3 0 0 0]
    inputs_segmentation  [1 1 1 2 2 2 2 0 0 0]
    targets              [4 1 5 6 1 0 0 0 0 0]
    targets_position     [0 1 0 1 2 0 0 0 0 0]
    targets_segmentation [1 1 2 2 2 0 0 0 0 0]

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
      "use_custom_ops=False (the same packing with TF ops)"
    )
  spec = dataset.element_spec
  keys = list(
    keys
    if keys is not None
    else (spec.keys() if isinstance(spec, Mapping) else [])
  )
  _check_keys(dataset, keys, "pack_dataset")
  if not keys:
    raise ValueError("pack_dataset: no features to pack")
  for k in keys:
    if not spec[k].shape.is_compatible_with([None]):
      raise ValueError(
        "pack_dataset: feature %r must be 1-D to be packed, "
        "has shape %s" % (k, spec[k].shape)
      )
    if not spec[k].dtype.is_integer:
      raise ValueError(
        "pack_dataset: feature %r must be integer token ids "
        "to be packed, has dtype %s (encode it first)" % (k, spec[k].dtype.name)
      )
  lengths = {k: _length_of(length, k, "pack_dataset") for k in keys}
  for k in keys:
    for suffix in ("_segmentation", "_position"):
      if k + suffix in keys:
        raise ValueError(
          "pack_dataset: cannot pack both %r and %r (packing "
          "%r adds %r)" % (k, k + suffix, k, k + suffix)
        )

  def prepare(features):
    out = {k: tf.cast(features[k][: lengths[k]], tf.int32) for k in keys}
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
    fits = tf.reduce_all(
      tf.stack([tf.size(partial[k]) + sizes[k] <= lengths[k] for k in keys])
    )
    emit = tf.logical_and(
      count > 0,
      tf.logical_or(
        example[_FLUSH], tf.logical_and(nonempty, tf.logical_not(fits))
      ),
    )
    output = {}
    for name, value in partial.items():
      n = out_lengths[name]
      output[name] = tf.reshape(tf.pad(value, [[0, n - tf.size(value)]]), [n])
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
        [
          partial[k + "_segmentation"][:kept],
          tf.fill(tf.shape(seq), segment_id),
        ],
        0,
      )
      new_partial[k + "_position"] = tf.concat(
        [
          partial[k + "_position"][:kept],
          tf.range(tf.size(seq), dtype=tf.int32),
        ],
        0,
      )
    count = count + tf.cast(nonempty, tf.int32)
    return (new_partial, count), (emit, output)

  dataset = dataset.scan(initial_state, step)
  dataset = dataset.filter(lambda emit, output: emit)
  return dataset.map(lambda emit, output: output, num_parallel_calls=_AUTOTUNE)


def pad_dataset_with_zeroed_out_examples(
  ds: tf.data.Dataset,
) -> tf.data.Dataset:
  """`ds` followed by endless all-zero copies of its examples.

  Lets an evaluation run a whole number of full batches: zeroed examples are
  all padding, so they add nothing to the metrics.

  Args:
    ds: a finite dataset of {feature: tensor} dicts.

  Returns:
    An endless dataset: the examples of `ds`, then its examples with every
    feature replaced by zeros of the same shape and dtype, repeated.
  """

  def zero_out(features):
    return {k: tf.zeros_like(v) for k, v in features.items()}

  return ds.concatenate(ds.map(zero_out).repeat())
