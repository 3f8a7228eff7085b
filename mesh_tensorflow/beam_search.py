"""mesh_tensorflow.beam_search: beam search and greedy decoding (facade)."""
# pylint: disable=g-importing-member,useless-import-alias

from mesh_tensorflow._src.beam_search import EOS_ID as EOS_ID
from mesh_tensorflow._src.beam_search import INF as INF
from mesh_tensorflow._src.beam_search import beam_search as beam_search
from mesh_tensorflow._src.beam_search import (
  compute_topk_scores_and_seq as compute_topk_scores_and_seq,
)
from mesh_tensorflow._src.beam_search import greedy_decode as greedy_decode

__all__ = [
  "EOS_ID",
  "INF",
  "beam_search",
  "compute_topk_scores_and_seq",
  "greedy_decode",
]
