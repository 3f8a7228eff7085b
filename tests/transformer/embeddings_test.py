"""VocabEmbedding and get_vocab_embedding_cls."""

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mesh_test_util as mtu
from transformer import transformer


@pytest.mark.parametrize("scale_like_classifier", [False, True])
def test_vocab_embedding_matches_numpy(scale_like_classifier):
  ids = np.array([[1, 4, 0], [7, 7, 2]], np.int32)
  hidden = np.random.RandomState(0).randn(2, 3, 4).astype(np.float32)

  def build(mesh):
    vocab, d_model = mtf.Dimension("vocab", 8), mtf.Dimension("d_model", 4)
    batch, length = mtf.Dimension("batch", 2), mtf.Dimension("length", 3)
    emb = transformer.VocabEmbedding(
      mesh,
      vocab,
      d_model,
      mtf.VariableDType(tf.float32),
      "embedding",
      None,
      scale_variable_like_classifier_weights=scale_like_classifier,
    )
    x = emb.ids_to_embedding(
      mtf.import_fully_replicated(
        mesh, tf.constant(ids), mtf.Shape([batch, length])
      ),
      None,
    )
    logits = emb.hidden_to_logits(
      mtf.import_fully_replicated(
        mesh, tf.constant(hidden), mtf.Shape([batch, length, d_model])
      ),
      None,
    )
    table = mesh.graph.name_to_variable["embedding"].outputs[0]
    return [x, logits, table]

  x, logits, table = mtu.run_program(build, "all:4", "vocab:all")
  assert table.shape == (8, 4)
  factor = 2.0 if scale_like_classifier else 1.0
  np.testing.assert_allclose(x, table[ids] * factor, rtol=1e-6)
  np.testing.assert_allclose(
    logits,
    hidden * (1.0 if scale_like_classifier else 0.5) @ table.T,
    rtol=1e-5,
    atol=1e-6,
  )
  # Initial stddev 1 (or d_model**-0.5): check the scale roughly.
  assert 0.2 < table.std() * factor < 2.5


def test_get_vocab_embedding_cls_is_a_gin_swap_point():
  class Other(transformer.VocabEmbedding):
    pass

  assert transformer.get_vocab_embedding_cls() is transformer.VocabEmbedding
  with gin.unlock_config():
    gin.bind_parameter("get_vocab_embedding_cls.cls", Other)
  try:
    assert transformer.get_vocab_embedding_cls() is Other
  finally:
    gin.clear_config()
