"""Decoder inputs made from targets.

`autoregressive_inputs` shifts targets right by one (packed sequences start
with 0), `shift_targets` is its deprecated predecessor, and
`delimited_lm_inputs_mask` marks the inputs parts of delimited LM sequences.
"""

from __future__ import annotations

import gin

import mesh_tensorflow as mtf

__all__ = [
  "autoregressive_inputs",
  "delimited_lm_inputs_mask",
  "shift_targets",
]

_GIN_MODULE = "mesh_tensorflow.transformer.transformer"


@gin.configurable(module=_GIN_MODULE)
def shift_targets(
  targets: mtf.Tensor, bos_id: int = 0, eos_id: int = 1
) -> mtf.Tensor:
  """Deprecated (use autoregressive_inputs): targets shifted right by one.

  The EOS shifted in from a previous packed sequence becomes 0; with bos_id,
  a 0 in front of a nonzero target becomes bos_id.

  Args:
    targets: int target ids [batch..., length].
    bos_id: the id put in front of each sequence (0: none).
    eos_id: the EOS id (an EOS shifted in from the previous packed sequence
      becomes 0).

  Returns:
    int ids shaped as targets.
  """
  length_dim = targets.shape.dims[-1]
  shifted = mtf.shift(targets, offset=1, dim=length_dim, wrap=False)
  shifted *= mtf.to_int32(mtf.not_equal(shifted, eos_id))
  if bos_id:
    shifted += (
      mtf.to_int32(
        mtf.logical_and(mtf.equal(shifted, 0), mtf.not_equal(targets, 0))
      )
      * bos_id
    )
  return shifted


def autoregressive_inputs(targets: mtf.Tensor, sequence_id=None) -> mtf.Tensor:
  """Decoder inputs from targets: shifted right by one along length.

  Packed sequences (sequence_id a Tensor) start with 0; negative target ids
  (masked from the loss) are fed as their absolute value.

  Example (two packed sequences):
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> targets = converter.convert_np_array_to_mtf_tensor(
    ...     [[5, 6, 1, 7, 1]], ["batch", "length"])
    >>> sequence_id = converter.convert_np_array_to_mtf_tensor(
    ...     [[1, 1, 1, 2, 2]], ["batch", "length"])
    >>> inputs = autoregressive_inputs(targets, sequence_id)
    >>> converter.convert_mtf_tensor_to_np_array(inputs)
    array([[0, 5, 6, 0, 7]], dtype=int32)

  Args:
    targets: int target ids [batch..., length].
    sequence_id: int packed-sequence ids [batch..., length], or None for
      unpacked targets.

  Returns:
    int inputs, shaped as targets.
  """
  length_dim = targets.shape.dims[-1]
  inputs = mtf.shift(targets, offset=1, dim=length_dim, wrap=False)
  if isinstance(sequence_id, mtf.Tensor):
    inputs *= mtf.to_int32(
      mtf.equal(
        sequence_id,
        mtf.shift(sequence_id, offset=1, dim=length_dim, wrap=False),
      )
    )
  return mtf.abs(inputs)


def delimited_lm_inputs_mask(ids: mtf.Tensor, eos_id: int = 1) -> mtf.Tensor:
  """Boolean mask of the "inputs" parts of delimited LM sequences.

  ids hold packed [inputs, EOS, targets, EOS, inputs, EOS, ...]: a position is
  in an inputs part when an even number of EOS precede it.

  Args:
    ids: int ids [batch..., length] of delimited LM sequences.
    eos_id: the EOS id that delimits the parts.

  Returns:
    A boolean Tensor shaped as ids.
  """
  length_dim = ids.shape.dims[-1]
  eos_before = mtf.cumsum(
    mtf.to_int32(mtf.equal(ids, eos_id)), length_dim, exclusive=True
  )
  return mtf.equal(mtf.mod(eos_before, 2), 0)
