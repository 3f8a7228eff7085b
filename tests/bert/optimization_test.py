"""Tests of mesh_tensorflow.bert.optimization against numpy."""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.bert import optimization
from tests import mesh_test_util


def _numpy_learning_rate(step, init_lr, total, warmup):
  if warmup and step < warmup:
    return init_lr * step / warmup
  return init_lr * (1.0 - min(step, total) / total)


@pytest.mark.parametrize("warmup", [0, 10])
def test_learning_rate_warms_up_then_decays_linearly(warmup):
  mesh_test_util.skip_under_tf1("eager values")
  for step in [0, 1, 5, 10, 11, 50, 99, 100, 150]:
    actual = optimization.learning_rate_at(
      tf.constant(step, tf.int64), 2e-3, 100, warmup
    )
    np.testing.assert_allclose(
      float(actual), _numpy_learning_rate(step, 2e-3, 100, warmup), rtol=1e-6
    )


def _one_step(optimizer_name, clip_gradients, init_lr=0.5):
  """One create_optimizer step on w (bias excluded from weight decay).

  At global step 0 without warmup: rate init_lr.
  """
  x = np.array([[3.0, -4.0], [1.0, 2.0]], np.float32)
  # The eager global step lives as long as the process: other tests in the
  # same worker may have advanced it.
  tf.compat.v1.train.get_or_create_global_step().assign(0)

  def build(mesh):
    data = mtf.import_tf_tensor(mesh, tf.constant(x), "n:2;d:2")
    with tf.compat.v1.variable_scope("layer"):
      w = mtf.get_variable(
        mesh, "w", "d:2", initializer=tf.compat.v1.ones_initializer()
      )
      b = mtf.get_variable(
        mesh, "bias", "d:2", initializer=tf.compat.v1.ones_initializer()
      )
    loss = mtf.reduce_sum(data * w + b)
    _, updates = optimization.create_optimizer(
      loss,
      init_lr,
      num_train_steps=100,
      num_warmup_steps=0,
      optimizer=optimizer_name,
      clip_gradients=clip_gradients,
    )
    return [mtf.depend(w, updates), mtf.depend(b, updates)]

  return mesh_test_util.run_program(build)


@pytest.mark.parametrize("clip_gradients", [False, True])
def test_adam_step_with_weight_decay_and_clipping(clip_gradients):
  mesh_test_util.skip_under_tf1("eager run")
  new_w, new_b = _one_step("adam", clip_gradients)
  grad_w, grad_b = np.array([4.0, -2.0]), np.array([2.0, 2.0])
  if clip_gradients:
    norm = np.sqrt(np.sum(grad_w**2) + np.sum(grad_b**2))
    grad_w, grad_b = grad_w / norm, grad_b / norm

  def adam(g):  # first step: m = 0.1 g, v = 0.001 g**2
    return 0.1 * g / (np.sqrt(0.001 * g**2) + 1e-6)

  np.testing.assert_allclose(new_w, 1 - 0.5 * (adam(grad_w) + 0.01), rtol=1e-5)
  np.testing.assert_allclose(new_b, 1 - 0.5 * adam(grad_b), rtol=1e-5)


def test_adafactor_step_moves_against_the_gradient():
  mesh_test_util.skip_under_tf1("eager run")
  new_w, _ = _one_step("adafactor", False, init_lr=0.1)
  assert new_w[0] < 1.0 < new_w[1]


def test_create_optimizer_errors():
  mesh = mtf.Mesh(mtf.Graph(), "mesh")
  loss = mtf.zeros(mesh, mtf.Shape([]))
  with pytest.raises(ValueError, match="Adam does not have a default"):
    optimization.create_optimizer(loss, None, 10, 0)
  with pytest.raises(ValueError, match="unknown optimizer 'sgd'"):
    optimization.create_optimizer(loss, 0.1, 10, 0, optimizer="sgd")


def test_clip_by_global_norm():
  mesh_test_util.skip_under_tf1("eager run")

  def build(mesh):
    a = mtf.import_tf_tensor(mesh, tf.constant([3.0, 0.0]), "a:2")
    b = mtf.import_tf_tensor(mesh, tf.constant([4.0]), "b:1")
    (ca, none, cb), norm = optimization.clip_by_global_norm([a, None, b], 1.0)
    assert none is None
    return [ca, cb, norm]

  ca, cb, norm = mesh_test_util.run_program(build, "all:2", "a:all")
  np.testing.assert_allclose(norm, 5.0)
  np.testing.assert_allclose(ca, [0.6, 0.0], rtol=1e-6)
  np.testing.assert_allclose(cb, [0.8], rtol=1e-6)
