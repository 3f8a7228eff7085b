"""text2text features turned into text2self ones, on the mesh.

A "delimited_lm" model is a language model trained on text2text data: each
example's inputs and targets are joined into one targets sequence (inputs
first). `dynamic_text2self` does this on mtf features, packed or not, so a
text2text dataset (tokenized and packed as usual) feeds such a model.
"""

from __future__ import annotations

from typing import Dict

from absl import logging
import tensorflow as tf

import mesh_tensorflow as mtf

__all__ = ["dynamic_text2self"]


def _segments_and_positions(features: Dict[str, mtf.Tensor], prefix: str):
  """(segmentation, position) of features[prefix]: the packed ones, or for
  unpacked data segment 1 on the nonzero ids and positions 0, 1, ...
  """
  ids = features[prefix]
  if prefix + "_segmentation" in features:
    return (features[prefix + "_segmentation"], features[prefix + "_position"])
  segmentation = mtf.cast(mtf.not_equal(ids, 0), tf.int32)
  length_dim = ids.shape.dims[-1]
  position = mtf.range(ids.mesh, length_dim, dtype=tf.int32) * segmentation
  return segmentation, position


def dynamic_text2self(
  mtf_features: Dict[str, mtf.Tensor],
) -> Dict[str, mtf.Tensor]:
  """Joins each example's inputs and targets into new targets.

  Within every segment (packed example) the inputs come first, then the
  targets; the segments follow each other from the start of the sequence
  and the rest is padding. The new length is inputs length + targets length
  (named "length").

  Example:
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> inputs = converter.convert_np_array_to_mtf_tensor(
    ...     [[4, 5, 1, 0]], ["batch", "length"])
    >>> targets = converter.convert_np_array_to_mtf_tensor(
    ...     [[6, 1, 0, 0]], ["batch", "length"])
    >>> joined = dynamic_text2self({"inputs": inputs, "targets": targets})
    >>> converter.convert_mtf_tensor_to_np_array(joined["targets"])
    array([[4, 5, 1, 6, 1, 0, 0, 0]], dtype=int32)

  Args:
    mtf_features: "inputs" and "targets" [batch..., length] and, for packed
      data, "inputs_segmentation", "inputs_position",
      "targets_segmentation" and "targets_position".

  Returns:
    {"targets"} (unpacked) or {"targets", "targets_segmentation",
    "targets_position"} (packed), each [batch..., length].
  """
  logging.info("dynamic_text2self: joining inputs and targets into targets")
  inputs = mtf_features["inputs"]
  targets = mtf_features["targets"]
  mesh = targets.mesh
  inputs_length_dim = inputs.shape.dims[-1]
  targets_length_dim = targets.shape.dims[-1]
  packed = "inputs_segmentation" in mtf_features
  inputs_segmentation, inputs_position = _segments_and_positions(
    mtf_features, "inputs"
  )
  targets_segmentation, targets_position = _segments_and_positions(
    mtf_features, "targets"
  )

  # Per segment id (0 is padding and gets length 0): the number of inputs
  # and targets tokens. There are fewer segments than targets positions.
  segments_dim = mtf.Dimension("segments", targets_length_dim.size)
  segment_ids = mtf.range(mesh, segments_dim, dtype=tf.int32)
  is_real_segment = mtf.cast(mtf.not_equal(segment_ids, 0), tf.int32)

  def segment_lengths(segmentation, length_dim):
    counts = mtf.reduce_sum(
      mtf.one_hot(segmentation, segments_dim, dtype=tf.int32),
      reduced_dim=length_dim,
    )
    return counts * is_real_segment

  inputs_lengths = segment_lengths(inputs_segmentation, inputs_length_dim)
  joined_lengths = inputs_lengths + segment_lengths(
    targets_segmentation, targets_length_dim
  )
  joined_length_dim = mtf.Dimension(
    "joined_length", inputs_length_dim.size + targets_length_dim.size
  )
  # Where each segment starts in the joined sequence; padding (segment 0)
  # starts past the end, so its tokens go nowhere.
  segment_starts = mtf.cumsum(joined_lengths, segments_dim, exclusive=True)
  segment_starts += joined_length_dim.size * (1 - is_real_segment)
  # A segment's targets follow its inputs.
  targets_position += mtf.gather(
    inputs_lengths, targets_segmentation, segments_dim
  )
  joined_range = mtf.range(mesh, joined_length_dim, dtype=tf.int32)

  def placement(segmentation, position):
    destination = position + mtf.gather(
      segment_starts, segmentation, segments_dim
    )
    return mtf.cast(mtf.equal(joined_range, destination), tf.int32)

  inputs_placement = placement(inputs_segmentation, inputs_position)
  targets_placement = placement(targets_segmentation, targets_position)
  output_shape = targets.shape.dims[:-1] + [joined_length_dim]

  def join(from_inputs, from_targets):
    joined = mtf.einsum(
      [from_inputs, inputs_placement], output_shape=output_shape
    ) + mtf.einsum([from_targets, targets_placement], output_shape=output_shape)
    return mtf.rename_dimension(joined, joined_length_dim.name, "length")

  result = {"targets": join(inputs, targets)}
  if packed:
    result["targets_segmentation"] = join(
      inputs_segmentation, targets_segmentation
    )
    result["targets_position"] = join(inputs_position, targets_position)
  return result
