"""Checkpoint names of a model whose stack has new blocks inserted.

flexible_ckpt_init_mapping (gin: utils.flexible_ckpt_init_mapping) maps the
names of a model with extra blocks to those of the checkpoint of the model
without them, for init_checkpoint_variable_mapping.

Example:
  >>> mapping = flexible_ckpt_init_mapping(new_layers={"decoder": [1]})
  >>> mapping("decoder/block_000/w"), mapping("decoder/block_001/w")
  ('decoder/block_000/w', None)
  >>> mapping("decoder/block_002/w"), mapping("encoder/block_002/w")
  ('decoder/block_001/w', 'encoder/block_002/w')
"""

from __future__ import annotations

import re
from typing import List, Mapping, Optional, Sequence, Tuple, Union

from transformer._src.driver import checkpoint_restore

__all__ = [
  "flexible_ckpt_init_mapping",
]

_BLOCK_RE = re.compile(r"^(.*?/)?block_(\d+)(?=/|$)")
_FLAT_LAYER_RE = re.compile(r"^(.*?/)?layer_(\d+)(?=/|$)")

NewLayers = Union[Sequence[int], Mapping[str, Sequence[int]], None]


def _split_numbered(name: str) -> Optional[Tuple[str, int, str, str]]:
  """(tower, index, rest, kind) of `<tower>/block_<i><rest>` or, without
  block scopes, `<tower>/layer_<i><rest>`; None for unnumbered names.
  """
  for kind, regex in (("block", _BLOCK_RE), ("layer", _FLAT_LAYER_RE)):
    match = regex.match(name)
    if match:
      return (
        (match.group(1) or "").rstrip("/"),
        int(match.group(2)),
        name[match.end() :],
        kind,
      )
  return None


def _numbered(tower: str, kind: str, index: int, rest: str) -> str:
  return "%s%s_%03d%s" % (tower + "/" if tower else "", kind, index, rest)


def _new_indices(new_layers: NewLayers, tower: str) -> List[int]:
  if new_layers is None:
    return []
  if isinstance(new_layers, Mapping):
    return sorted(int(i) for i in new_layers.get(tower, ()))
  return sorted(int(i) for i in new_layers)


def flexible_ckpt_init_mapping(
  ckpt_path: str = "",
  new_layers: NewLayers = None,
  return_mapping_fn: bool = True,
):
  """Maps model names to checkpoint names when blocks were inserted.

  The model has extra blocks (`<tower>/block_%03d`, or `<tower>/layer_%03d`
  in stacks without block scopes) at the indices `new_layers` (a list for
  every tower, or {tower: list}, e.g. {"decoder": [2]}); the other blocks
  keep their order, so model block i loads checkpoint block
  i - (number of new indices below i), and new blocks load nothing.

  Args:
    ckpt_path: the init checkpoint (needed when return_mapping_fn=False).
    new_layers: indices of the model's new blocks.
    return_mapping_fn: return a function (for init_checkpoint_variable_mapping)
      rather than a dict.

  Returns:
    fn(model name) -> checkpoint name (None for new blocks), or a dict
    {model name: checkpoint name} over the checkpoint's variables.

  Raises:
    ValueError: without ckpt_path when return_mapping_fn is False.
  """

  def mapping_fn(name: str) -> Optional[str]:
    parts = _split_numbered(name)
    if parts is None:
      return name
    tower, index, rest, kind = parts
    new = _new_indices(new_layers, tower)
    if index in new:
      return None
    old = index - sum(1 for i in new if i < index)
    return _numbered(tower, kind, old, rest)

  if return_mapping_fn:
    return mapping_fn
  if not ckpt_path:
    raise ValueError(
      "flexible_ckpt_init_mapping: ckpt_path is required when "
      "return_mapping_fn=False"
    )
  mapping = {}
  for ckpt_name in sorted(
    checkpoint_restore.list_checkpoint_variables(ckpt_path)
  ):
    parts = _split_numbered(ckpt_name)
    if parts is None:
      mapping[ckpt_name] = ckpt_name
      continue
    tower, old, rest, kind = parts
    new = set(_new_indices(new_layers, tower))
    index, seen = -1, -1
    while seen < old:  # The old-th model index that is not new.
      index += 1
      if index not in new:
        seen += 1
    mapping[_numbered(tower, kind, index, rest)] = ckpt_name
  return mapping
