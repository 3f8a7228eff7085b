"""The Mesh-TensorFlow paper's Transformer grid as gin files (configs/paper).

Each file parses after defaults.gin, names the paper's mesh and layout, and
builds its model shape-only (a v1 tf.Graph: nothing is allocated, so the
4.9B-parameter model builds in seconds). The language models' parameter
counts match the ones tensor2tensor's mtf_transformer_paper_lm hparams report
(params/10^9, two decimals); the translation models' match the count their
sizes give.
"""

import os

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from transformer import transformer
from transformer import utils

CONFIGS = os.path.join(
  os.path.dirname(__file__), os.pardir, os.pardir, "configs"
)
# The lm1b and WMT14 En-Fr subword vocabularies (~32k) padded to a multiple
# of 128, as the models pad them.
VOCAB = 32768
D_MODEL = 1024
LENGTH = 256

# Size name -> (d_ff, heads, mesh shape, params/10^9 as reported).
PAPER_LM = {
  "m1": (4096, 4, "batch:32", 0.14),
  "0": (8192, 8, "batch:32", 0.22),
  "1": (16384, 16, "model:4;batch:8", 0.37),
  "2": (32768, 32, "model:4;batch:8", 0.67),
  "3": (65536, 64, "model:8;batch:16", 1.28),
  "4": (131072, 128, "batch:16;model:32", 2.48),
  "5": (262144, 256, "batch:16;model:32", 4.90),
}
# Size name -> (d_ff, heads, mesh shape).
PAPER_TR = {
  "m1": (2048, 4, "batch:32"),
  "0": (4096, 8, "batch:32"),
  "1": (8192, 16, "model:4;batch:8"),
  "2": (16384, 32, "model:4;batch:8"),
  "3": (32768, 64, "model:8;batch:16"),
  "4": (65536, 128, "model:8;batch:16"),
}
LAYOUT = "batch:batch,vocab:model,d_ff:model,heads:model"


@pytest.fixture(autouse=True)
def _clean_gin():
  gin.clear_config()
  yield
  gin.clear_config()


def _parse(name):
  gin.parse_config_files_and_bindings(
    [
      os.path.join(CONFIGS, "defaults.gin"),
      os.path.join(CONFIGS, "paper", name + ".gin"),
    ],
    [],
  )


def _query(selector):
  value = gin.query_parameter(selector)
  if isinstance(value, gin.config.ConfigurableReference):
    value = value.scoped_configurable_fn()
  return value


def _parameter_count():
  """Builds the gin-configured model shape-only; its parameter count."""
  mesh_shape = mtf.convert_to_shape(_query("utils.run.mesh_shape"))
  layout_rules = mtf.convert_to_layout_rules(_query("utils.run.layout_rules"))
  model_type = _query("utils.run.model_type")
  with tf.Graph().as_default():
    with mtf.variable_store(mtf.VariableStore()):
      graph = mtf.Graph()
      mesh = mtf.Mesh(graph, "mesh")
      model = utils.build_model(
        model_type, VOCAB, VOCAB, layout_rules, mesh_shape
      )
      batch = mtf.Dimension("batch", 32)  # divides every batch mesh dim
      ids = mtf.zeros(
        mesh, mtf.Shape([batch, mtf.Dimension("length", LENGTH)]), tf.int32
      )
      inputs = ids
      if model_type == "lm":
        inputs = transformer.autoregressive_inputs(ids)
      model.call_simple(
        inputs,
        ids,
        compute_loss=True,
        variable_dtype=utils.get_variable_dtype(),
      )
      for variable in graph.all_variables:
        for dim in variable.shape.dims:
          mtf.tensor_dim_to_size_per_split(layout_rules, mesh_shape, dim)
      return sum(v.shape.size for v in graph.all_variables)


def _macro(name):
  return gin.query_parameter(name + "/macro.value")


def _check_common_bindings(name, d_ff, heads, mesh_shape):
  _parse(name)
  assert _macro("d_model") == D_MODEL
  assert _macro("d_ff") == d_ff
  assert _macro("num_heads") == heads
  assert _query("utils.run.mesh_shape") == mesh_shape
  assert _query("utils.run.layout_rules") == LAYOUT
  assert _query("utils.run.sequence_length") == {
    "inputs": LENGTH,
    "targets": LENGTH,
  }


@pytest.mark.parametrize("size", sorted(PAPER_LM))
def test_language_model_matches_the_paper(size):
  d_ff, heads, mesh_shape, billions = PAPER_LM[size]
  _check_common_bindings("lm_" + size, d_ff, heads, mesh_shape)
  assert _query("utils.run.model_type") == "lm"
  assert _macro("d_kv") == 256
  assert _query("utils.run.batch_size") == ("sequences_per_batch", 256)
  count = _parameter_count()
  per_layer = 4 * D_MODEL * heads * 256 + 2 * D_MODEL * d_ff + 2 * D_MODEL
  expected = 2 * VOCAB * D_MODEL + LENGTH * D_MODEL + 6 * per_layer + D_MODEL
  assert count == expected
  np.testing.assert_equal(round(count / 1e9, 2), billions)


@pytest.mark.parametrize("size", sorted(PAPER_TR))
def test_translation_model_matches_the_paper(size):
  d_ff, heads, mesh_shape = PAPER_TR[size]
  _check_common_bindings("tr_" + size, d_ff, heads, mesh_shape)
  assert _query("utils.run.model_type") == "bitransformer"
  assert _macro("d_kv") == 128
  assert _query("utils.run.batch_size") == ("sequences_per_batch", 128)
  attention = 4 * D_MODEL * heads * 128
  feed_forward = 2 * D_MODEL * d_ff
  encoder = 6 * (attention + feed_forward + 2 * D_MODEL) + D_MODEL
  decoder = 6 * (2 * attention + feed_forward + 3 * D_MODEL) + D_MODEL
  # One token and one positional embedding shared by both towers (as
  # shared_embedding shares them), and a separate softmax.
  embeddings = 2 * VOCAB * D_MODEL + LENGTH * D_MODEL
  assert _parameter_count() == encoder + decoder + embeddings
