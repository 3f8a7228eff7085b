"""BERT on a mesh: BertConfig, BertModel and their helpers.

The code lives in mesh_tensorflow/bert/_src/ (model.py, config.py,
checkpoint.py).
"""
# pylint: disable=g-importing-member,useless-import-alias

from mesh_tensorflow.bert._src.checkpoint import (
  get_assignment_map_from_checkpoint as get_assignment_map_from_checkpoint,
)
from mesh_tensorflow.bert._src.config import BertConfig as BertConfig
from mesh_tensorflow.bert._src.model import BertModel as BertModel
from mesh_tensorflow.bert._src.model import get_activation as get_activation
from mesh_tensorflow.bert._src.model import layer_norm as layer_norm

__all__ = [
  "BertConfig",
  "BertModel",
  "get_activation",
  "get_assignment_map_from_checkpoint",
  "layer_norm",
]
