"""mesh_tensorflow.utils: small helpers used by mtf programs and drivers."""

import contextlib

import tensorflow as tf

from mesh_tensorflow._src.ops.summary import SCALAR_SUMMARIES_COLLECTION_KEY


@contextlib.contextmanager
def outside_all_rewrites():
  """Escapes control-flow (and TPU rewrite) contexts: no control deps inside."""
  with tf.control_dependencies(None):
    yield


__all__ = ["SCALAR_SUMMARIES_COLLECTION_KEY", "outside_all_rewrites"]
