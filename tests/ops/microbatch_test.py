"""Tests for mesh_tensorflow._src.ops.microbatch (serialize_training_step).

A two-layer MLP with a summed squared-error loss is run whole and in 2 and 4
microbatches on the 1-device mesh and on the 2x2 mesh (batch and hidden
split). Gradients, the summed outputs and the re-concatenated per-example
outputs must equal the unsplit model's and numpy's.
"""

import inspect

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mesh_test_util as mtu
from tests import meshes

BATCH = mtf.Dimension("batch", 8)
D_IN = mtf.Dimension("d_in", 4)
HIDDEN = mtf.Dimension("hidden", 6)
D_OUT = mtf.Dimension("d_out", 2)

_RNG = np.random.RandomState(0)
X = _RNG.normal(size=(8, 4)).astype(np.float32)
Y = _RNG.normal(size=(8, 2)).astype(np.float32)
W1 = _RNG.normal(size=(4, 6)).astype(np.float32)
W2 = _RNG.normal(size=(6, 2)).astype(np.float32)
SCALE = np.float32(0.5)  # a feature without the batch dimension


def np_model():
  """Per-example predictions, loss, hidden sum and gradients of W1, W2."""
  h_pre = X @ W1
  h = np.maximum(h_pre, 0.0)
  pred = SCALE * (h @ W2)
  err = pred - Y
  loss = np.sum(err**2)
  d_pred = 2.0 * err
  d_w2 = SCALE * h.T @ d_pred
  d_h = SCALE * d_pred @ W2.T * (h_pre > 0)
  d_w1 = X.T @ d_h
  return pred, loss, h.sum(), d_w1, d_w2


def model_fn(features):
  mesh = features["x"].mesh
  batch = features["x"].shape.dims[0]
  w1 = mtf.get_variable(
    mesh, "w1", [D_IN, HIDDEN], initializer=tf.constant_initializer(W1)
  )
  w2 = mtf.get_variable(
    mesh, "w2", [HIDDEN, D_OUT], initializer=tf.constant_initializer(W2)
  )
  # Trainable but unused by the loss: its gradient is None.
  mtf.get_variable(mesh, "unused", [D_OUT], initializer=tf.zeros_initializer())
  h = mtf.relu(mtf.einsum([features["x"], w1], output_shape=[batch, HIDDEN]))
  pred = mtf.einsum([h, w2], output_shape=[batch, D_OUT]) * features["scale"]
  loss = mtf.reduce_sum(mtf.square(pred - features["y"]))
  return {
    "loss": loss,
    "pred": pred,
    "hidden_sum": mtf.reduce_sum(h),
    "count": mtf.reduce_sum(mtf.ones(mesh, [batch], dtype=tf.int32)),
    "positive": mtf.greater(pred, 0.0),
  }


def _program(num_splits):
  def build(mesh):
    features = {
      "x": mtf.import_tf_tensor(mesh, X, [BATCH, D_IN]),
      "y": mtf.import_tf_tensor(mesh, Y, [BATCH, D_OUT]),
      "scale": mtf.constant(mesh, SCALE, shape=[]),
    }
    grads, outputs = mtf.serialize_training_step(
      features, model_fn, BATCH, num_splits
    )
    names = [v.name for v in mesh.graph.trainable_variables]
    assert names == ["w1", "w2", "unused"], names
    assert grads[2] is None
    assert sorted(outputs) == [
      "count",
      "hidden_sum",
      "loss",
      "positive",
      "pred",
    ]
    assert outputs["pred"].shape == mtf.Shape([BATCH, D_OUT])
    return [
      grads[0],
      grads[1],
      outputs["loss"],
      outputs["pred"],
      outputs["hidden_sum"],
      outputs["count"],
      outputs["positive"],
    ]

  return build


def test_signature():
  params = [
    (p.name, p.default)
    for p in inspect.signature(mtf.serialize_training_step).parameters.values()
  ]
  empty = inspect.Parameter.empty
  assert params == [
    ("features", empty),
    ("model_fn", empty),
    ("batch_dim", empty),
    ("num_splits", empty),
  ]


@meshes.parametrize(meshes.MICROBATCH)
def test_microbatches_match_unsplit_model(mesh_shape, layout):
  pred, loss, hidden_sum, d_w1, d_w2 = np_model()
  unsplit = mtu.run_program(_program(1), mesh_shape, layout)
  mtu.assert_all_close(
    unsplit[:5],
    [d_w1, d_w2, loss, pred, hidden_sum],
    rtol=1e-5,
    atol=1e-5,
    msg="unsplit",
  )
  for num_splits in (2, 4):
    out = mtu.run_program(_program(num_splits), mesh_shape, layout)
    mtu.assert_all_close(
      out[:5],
      unsplit[:5],
      rtol=1e-5,
      atol=1e-5,
      msg="num_splits=%d" % num_splits,
    )
    assert out[5].dtype == np.int32 and out[5] == 8
    assert out[6].dtype == np.bool_
    np.testing.assert_array_equal(out[6], pred > 0)


@pytest.mark.parametrize("mode", ["function", "graph"])
def test_modes(mode):
  pred, loss, hidden_sum, d_w1, d_w2 = np_model()
  out = mtu.run_program(
    _program(2), "rows:2;cols:2", "batch:rows;hidden:cols", mode
  )
  mtu.assert_all_close(
    out[:5],
    [d_w1, d_w2, loss, pred, hidden_sum],
    rtol=1e-5,
    atol=1e-5,
    msg=mode,
  )


def test_uses_while_loop_with_microbatch_dim():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  with mtf.variable_store(mtf.VariableStore()):
    _program(4)(mesh)
  loops = [
    op for op in graph.operations if isinstance(op, mtf.WhileLoopOperation)
  ]
  assert len(loops) == 1
  body_dims = {
    d
    for op in loops[0].body_operations
    for t in op.outputs
    for d in t.shape.dims
  }
  assert mtf.Dimension("microbatch", 4) in body_dims
  assert mtf.Dimension("batch", 2) in body_dims
  # Variables made by model_fn in the loop body were hoisted out of it.
  assert not [
    op for op in loops[0].body_operations if isinstance(op, mtf.Variable)
  ]


def _features(mesh):
  return {"x": mtf.zeros(mesh, [BATCH, D_IN])}


def test_batch_not_divisible_by_num_splits():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  with pytest.raises(
    ValueError,
    match=r"batch dimension 'batch' \(size 8\) "
    r"is not divisible by num_splits=3",
  ):
    mtf.serialize_training_step(_features(mesh), model_fn, BATCH, 3)


@pytest.mark.parametrize("num_splits", [1, 2])
def test_model_fn_without_loss(num_splits):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  with pytest.raises(ValueError, match=r"\"loss\""):
    mtf.serialize_training_step(
      _features(mesh), lambda f: {"logits": f["x"]}, BATCH, num_splits
    )


def test_other_bad_arguments():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  with pytest.raises(ValueError, match=r"non-empty dict"):
    mtf.serialize_training_step({}, model_fn, BATCH, 2)
  with pytest.raises(ValueError, match=r"num_splits must be a positive int"):
    mtf.serialize_training_step(_features(mesh), model_fn, BATCH, 0)
  with pytest.raises(ValueError, match=r"no feature has the batch dimension"):
    mtf.serialize_training_step(
      _features(mesh), model_fn, mtf.Dimension("other", 4), 2
    )
  with pytest.raises(ValueError, match=r"feature 'x' is not an mtf Tensor"):
    mtf.serialize_training_step({"x": X}, model_fn, BATCH, 2)
