"""The GPT-style model lowered eagerly, as GPT-style unit tests do it.

Those tests enable eager execution, build the mtf graph, lower it with
PlacementMeshImpl(shape=[], layout={}, devices=[""]) and read the exported
tensors directly, with the variables' own random initial values. Checked
here on the three meshes: the greedy decode equals the argmax of the
logits the same model gives the decoded sequence (teacher forcing), and the
logits of every mesh equal the 1-device mesh's when the variables start
from the same values (tf.random.set_seed before each build).
"""

import os

import numpy as np
import pytest
import tensorflow as tf
import tensorflow.compat.v1 as tf1

import mesh_tensorflow as mtf
from mesh_tensorflow import placement_mesh_impl
import mesh_tensorflow.transformer as mtf_transformer
from tests import meshes
from tests.downstream import gpt_style_model as gm
from tests.downstream import gpt_style_program as gp

pytestmark = pytest.mark.skipif(
  os.environ.get("MTF_TEST_TF_MODE", "") == "v1",
  reason="eager execution, which TF1 legacy mode does not have",
)


def _decode_and_score(mesh_shape, layout):
  """(greedy decode, logits of the decode) of one eager lowering."""
  tf.random.set_seed(1)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "my_mesh")
  dims = gm.Dims(mtf, gm.PARAMS)
  variable_dtype = mtf.VariableDType(tf.float32, tf.float32, tf.float32)
  shape = mtf.Shape([dims.batch, dims.sequence])
  inputs = mtf.import_fully_replicated(
    mesh, tf.constant(gp.PROMPTS), shape, name="inputs"
  )
  bias = gm.causal_bias(mtf, mesh, dims, variable_dtype)
  greedy = gm.sample_autoregressive(
    mtf, mtf_transformer, inputs, dims, gm.PARAMS, bias, variable_dtype
  )
  with tf1.variable_scope("gpt2", reuse=tf1.AUTO_REUSE):
    logits, _, _ = gm.model(
      mtf,
      mtf_transformer,
      greedy,
      None,
      dims,
      gm.PARAMS,
      bias,
      variable_dtype,
    )
  if mesh_shape:
    mesh_shape = mtf.convert_to_shape(mesh_shape)
    layout = mtf.convert_to_layout_rules(layout)
    devices = [""] * mesh_shape.size
  else:
    mesh_shape, layout, devices = [], {}, [""]
  mesh_impl = placement_mesh_impl.PlacementMeshImpl(
    shape=mesh_shape, layout=layout, devices=devices
  )
  lowering = mtf.Lowering(graph, {mesh: mesh_impl})
  return (
    np.asarray(lowering.export_to_tf_tensor(greedy)),
    np.asarray(lowering.export_to_tf_tensor(logits)),
  )


@pytest.fixture(scope="module")
def one_device():
  return _decode_and_score("", "")


@meshes.parametrize(meshes.GPT_STYLE)
def test_eager_greedy_decode_is_the_teacher_forced_argmax(
  one_device, mesh_shape, layout
):
  greedy, logits = _decode_and_score(mesh_shape, layout)
  prompt = gp.PROMPTS != 0
  np.testing.assert_array_equal(greedy[prompt], gp.PROMPTS[prompt])
  predicted = logits.argmax(-1)
  for row, start in enumerate(prompt.sum(-1)):
    np.testing.assert_array_equal(
      greedy[row, start:], predicted[row, start - 1 : -1], err_msg=str(row)
    )
  np.testing.assert_array_equal(greedy, one_device[0])
  np.testing.assert_allclose(logits, one_device[1], rtol=1e-5, atol=1e-5)
