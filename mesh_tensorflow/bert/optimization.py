"""BERT's optimizer: create_optimizer and clip_by_global_norm.

The code lives in mesh_tensorflow/bert/_src/optimization.py.
"""
# pylint: disable=g-importing-member,useless-import-alias

from mesh_tensorflow.bert._src.optimization import (
  clip_by_global_norm as clip_by_global_norm,
)
from mesh_tensorflow.bert._src.optimization import (
  create_optimizer as create_optimizer,
)
from mesh_tensorflow.bert._src.optimization import (
  learning_rate_at as learning_rate_at,
)

__all__ = ["clip_by_global_norm", "create_optimizer", "learning_rate_at"]
