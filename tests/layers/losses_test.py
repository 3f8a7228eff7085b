"""Tests for mtf.layers losses: softmax/sigmoid cross-entropy, weights_nonzero.

Values and gradients against tf.nn on 1-device, 4-device and 2x2 meshes,
including layouts that split the vocabulary dimension.
"""

import inspect

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mesh_test_util as mtu
from tests import meshes

BATCH = mtf.Dimension("batch", 4)
LENGTH = mtf.Dimension("length", 2)
VOCAB = mtf.Dimension("vocab", 8)

_RNG = np.random.RandomState(0)
LOGITS = (_RNG.standard_normal((4, 2, 8)) * 3.0).astype(np.float32)
TARGETS = _RNG.randint(0, 8, size=(4, 2)).astype(np.int32)
SOFT = _RNG.uniform(0.0, 1.0, size=(4, 2, 8)).astype(np.float32)
SOFT /= SOFT.sum(axis=-1, keepdims=True)
WEIGHTS = _RNG.uniform(0.5, 1.5, size=(4, 2)).astype(np.float32)
LABELS = _RNG.uniform(0.0, 1.0, size=(4, 2, 8)).astype(np.float32)
Z_LOSS = 1e-2


def _softmax_program(mesh):
  logits = mtf.import_tf_tensor(mesh, LOGITS, [BATCH, LENGTH, VOCAB])
  targets = mtf.import_tf_tensor(mesh, TARGETS, [BATCH, LENGTH])
  # Soft targets in another dimension order.
  soft = mtf.import_tf_tensor(
    mesh, SOFT.transpose(2, 0, 1), [VOCAB, BATCH, LENGTH]
  )
  w = mtf.import_tf_tensor(mesh, WEIGHTS, [BATCH, LENGTH])
  hard = mtf.layers.softmax_cross_entropy_with_logits(
    logits, targets, VOCAB, z_loss=Z_LOSS
  )
  soft_loss = mtf.layers.softmax_cross_entropy_with_logits(logits, soft, VOCAB)
  assert hard.shape == mtf.Shape([BATCH, LENGTH])
  assert soft_loss.shape == mtf.Shape([BATCH, LENGTH])
  [d_hard] = mtf.gradients([mtf.reduce_sum(hard * w)], [logits])
  [d_soft] = mtf.gradients([mtf.reduce_sum(soft_loss * w)], [logits])
  return [hard, soft_loss, d_hard, d_soft]


def _softmax_reference():
  logits = tf.constant(LOGITS)
  with tf.GradientTape(persistent=True) as tape:
    tape.watch(logits)
    log_z = tf.reduce_logsumexp(logits, axis=-1)
    hard = tf.nn.sparse_softmax_cross_entropy_with_logits(
      TARGETS, logits
    ) + Z_LOSS * tf.square(log_z)
    soft = tf.nn.softmax_cross_entropy_with_logits(SOFT, logits)
    hard_sum = tf.reduce_sum(hard * WEIGHTS)
    soft_sum = tf.reduce_sum(soft * WEIGHTS)
  return [
    hard.numpy(),
    soft.numpy(),
    tape.gradient(hard_sum, logits).numpy(),
    tape.gradient(soft_sum, logits).numpy(),
  ]


@meshes.parametrize(meshes.LOSSES)
def test_softmax_cross_entropy_values_and_gradients(mesh_shape, layout):
  got = mtu.run_program(_softmax_program, mesh_shape, layout)
  mtu.assert_all_close(
    got, _softmax_reference(), rtol=1e-5, atol=1e-5, msg=layout
  )


@pytest.mark.parametrize("mode", ["function", "graph"])
def test_softmax_cross_entropy_modes(mode):
  got = mtu.run_program(
    _softmax_program, "rows:2;cols:2", "batch:rows;vocab:cols", mode
  )
  mtu.assert_all_close(got, _softmax_reference(), rtol=1e-5, atol=1e-5)


# Out-of-range ids (-1, 8) have an all-zero one-hot: cross-entropy 0.
TARGETS_OUT_OF_RANGE = TARGETS.copy()
TARGETS_OUT_OF_RANGE[0, 0], TARGETS_OUT_OF_RANGE[2, 1] = -1, 8


@pytest.mark.parametrize("mode", mtu.MODES)
@meshes.parametrize(
  meshes.LOSSES, extra=[("rows:2;cols:2", "length:rows;batch:cols")]
)
def test_softmax_cross_entropy_hard_targets_equal_one_hot_soft_targets(
  mesh_shape, layout, mode
):
  """Hard targets (a gather) give what their one-hots as soft targets give,
  out-of-range ids and targets in another dimension order included.
  """

  def build(mesh):
    logits = mtf.import_tf_tensor(mesh, LOGITS, [BATCH, LENGTH, VOCAB])
    targets = mtf.import_tf_tensor(
      mesh, TARGETS_OUT_OF_RANGE.T, [LENGTH, BATCH]
    )
    w = mtf.import_tf_tensor(mesh, WEIGHTS, [BATCH, LENGTH])
    hard = mtf.layers.softmax_cross_entropy_with_logits(
      logits, targets, VOCAB, z_loss=Z_LOSS
    )
    soft = mtf.layers.softmax_cross_entropy_with_logits(
      logits, mtf.one_hot(targets, VOCAB), VOCAB, z_loss=Z_LOSS
    )
    assert hard.shape == soft.shape == mtf.Shape([BATCH, LENGTH])
    [d_hard] = mtf.gradients([mtf.reduce_sum(hard * w)], [logits])
    [d_soft] = mtf.gradients([mtf.reduce_sum(soft * w)], [logits])
    return [hard, soft, d_hard, d_soft]

  hard, soft, d_hard, d_soft = mtu.run_program(build, mesh_shape, layout, mode)
  np.testing.assert_allclose(hard, soft, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(d_hard, d_soft, rtol=1e-5, atol=1e-6)
  log_z = np.log(np.exp(LOGITS.astype(np.float64)).sum(-1))
  expected = Z_LOSS * log_z**2
  in_range = (TARGETS_OUT_OF_RANGE >= 0) & (TARGETS_OUT_OF_RANGE < 8)
  target_logits = np.take_along_axis(
    LOGITS, np.where(in_range, TARGETS_OUT_OF_RANGE, 0)[..., None], -1
  )
  expected += np.where(in_range, log_z - target_logits[..., 0], 0.0)
  np.testing.assert_allclose(hard, expected, rtol=1e-5, atol=1e-5)


def test_softmax_cross_entropy_bfloat16_logits():
  def build(mesh):
    logits = mtf.cast(
      mtf.import_tf_tensor(mesh, LOGITS, [BATCH, LENGTH, VOCAB]), tf.bfloat16
    )
    targets = mtf.import_tf_tensor(mesh, TARGETS, [BATCH, LENGTH])
    loss = mtf.layers.softmax_cross_entropy_with_logits(logits, targets, VOCAB)
    assert loss.dtype == tf.bfloat16
    return [mtf.cast(loss, tf.float32)]

  [loss] = mtu.run_program(build, "all:4", "vocab:all")
  expected = tf.nn.sparse_softmax_cross_entropy_with_logits(
    TARGETS, LOGITS
  ).numpy()
  np.testing.assert_allclose(loss, expected, rtol=0.1, atol=0.1)


def test_softmax_cross_entropy_errors():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  logits = mtf.zeros(mesh, [BATCH, LENGTH, VOCAB])
  other = mtf.Dimension("other", 8)
  fn = mtf.layers.softmax_cross_entropy_with_logits
  with pytest.raises(ValueError, match="vocab_dim.*other.*not a dimension"):
    fn(logits, mtf.zeros(mesh, [BATCH, LENGTH], dtype=tf.int32), other)
  with pytest.raises(ValueError, match="hard.*batch=4.*other than vocab_dim"):
    fn(logits, mtf.zeros(mesh, [BATCH], dtype=tf.int32), VOCAB)
  with pytest.raises(ValueError, match="hard"):
    fn(logits, mtf.zeros(mesh, [BATCH, LENGTH, VOCAB], dtype=tf.int32), VOCAB)
  with pytest.raises(ValueError, match="soft.*targets.*length"):
    fn(logits, mtf.zeros(mesh, [BATCH, VOCAB]), VOCAB)


def _sigmoid_program(mesh):
  logits = mtf.import_tf_tensor(mesh, LOGITS, [BATCH, LENGTH, VOCAB])
  labels = mtf.import_tf_tensor(mesh, LABELS, [BATCH, LENGTH, VOCAB])
  loss = mtf.layers.sigmoid_cross_entropy_with_logits(logits, labels)
  [dl] = mtf.gradients([mtf.reduce_sum(loss * loss)], [logits])
  return [loss, dl]


@meshes.parametrize(meshes.LOSSES[:4])
def test_sigmoid_cross_entropy_values_and_gradients(mesh_shape, layout):
  logits = tf.constant(LOGITS)
  with tf.GradientTape() as tape:
    tape.watch(logits)
    loss = tf.nn.sigmoid_cross_entropy_with_logits(LABELS, logits)
    total = tf.reduce_sum(loss * loss)
  expected = [loss.numpy(), tape.gradient(total, logits).numpy()]
  got = mtu.run_program(_sigmoid_program, mesh_shape, layout)
  mtu.assert_all_close(got, expected, rtol=1e-5, atol=1e-5, msg=layout)


def test_sigmoid_cross_entropy_shape_mismatch():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  with pytest.raises(ValueError, match="logits shape.*targets shape.*length"):
    mtf.layers.sigmoid_cross_entropy_with_logits(
      mtf.zeros(mesh, [BATCH, LENGTH]), mtf.zeros(mesh, [LENGTH, BATCH])
    )


def test_weights_nonzero():
  ids = np.array([[0, 3], [5, 0], [0, 0], [1, 2]], dtype=np.int32)

  def build(mesh):
    t = mtf.import_tf_tensor(mesh, ids, [BATCH, LENGTH])
    w = mtf.layers.weights_nonzero(t)
    w16 = mtf.layers.weights_nonzero(t, dtype=tf.bfloat16)
    assert w.dtype == tf.float32 and w16.dtype == tf.bfloat16
    assert w.shape == t.shape
    return [w, mtf.cast(w16, tf.float32)]

  for mesh_shape, layout in [
    ("", ""),
    ("rows:2;cols:2", "batch:rows;length:cols"),
  ]:
    got = mtu.run_program(build, mesh_shape, layout)
    expected = (ids != 0).astype(np.float32)
    mtu.assert_all_close(got, [expected, expected], msg=layout)


def _params(fn):
  return [
    (p.name, p.default) for p in inspect.signature(fn).parameters.values()
  ]


def test_signatures():
  e = inspect.Parameter.empty
  assert _params(mtf.layers.softmax_cross_entropy_with_logits) == [
    ("logits", e),
    ("targets", e),
    ("vocab_dim", e),
    ("z_loss", 0.0),
  ]
  assert _params(mtf.layers.sigmoid_cross_entropy_with_logits) == [
    ("logits", e),
    ("targets", e),
  ]
  assert _params(mtf.layers.weights_nonzero) == [
    ("targets", e),
    ("dtype", tf.float32),
  ]
