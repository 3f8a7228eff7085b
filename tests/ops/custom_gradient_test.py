"""Tests for mtf.custom_gradient and mtf.recompute_grad.

Gradients are checked against numpy on the 1-device mesh, the 4-device 1-d
mesh and the 2x2 mesh under several layouts; recompute_grad must give the same
gradients as the plain program while adding cloned forward operations.
"""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mesh_test_util as mtu
from tests import meshes

BATCH = mtf.Dimension("batch", 4)
D_IN = mtf.Dimension("d_in", 4)
HIDDEN = mtf.Dimension("hidden", 8)
D_OUT = mtf.Dimension("d_out", 4)

_RNG = np.random.RandomState(1)
X = _RNG.uniform(-1.0, 1.0, size=(4, 4)).astype(np.float32)
X = np.where(np.abs(X) < 0.1, X + 0.3, X).astype(np.float32)
V = _RNG.uniform(-1.0, 1.0, size=(4, 4)).astype(np.float32)
W1 = _RNG.uniform(-1.0, 1.0, size=(4, 8)).astype(np.float32)
W2 = _RNG.uniform(-1.0, 1.0, size=(8, 4)).astype(np.float32)


def _double_grad_fn(
  explicit_inputs, all_inputs, forward_operations, outputs, output_grads
):
  del explicit_inputs, forward_operations, outputs
  return [output_grads[0] * 2.0] + [None] * (len(all_inputs) - 1)


def _identity_double_grad(mesh):
  x = mtf.import_tf_tensor(mesh, X, [BATCH, D_IN])
  y = mtf.custom_gradient(mtf.identity, _double_grad_fn, [x])
  [dx] = mtf.gradients([mtf.reduce_sum(y * y)], [x])
  return [y, dx]


@pytest.mark.parametrize("mode", mtu.MODES)
def test_custom_gradient_replaces_gradient_modes(mode):
  y, dx = mtu.run_program(
    _identity_double_grad, "rows:2;cols:2", "batch:rows;d_in:cols", mode
  )
  np.testing.assert_allclose(y, X)
  # True gradient 2x; the custom one doubles it.
  np.testing.assert_allclose(dx, 4.0 * X, rtol=1e-6)


@meshes.parametrize(meshes.CUSTOM_GRADIENT)
def test_custom_gradient_with_implicit_input(mesh_shape, layout):
  seen = {}

  def build(mesh):
    v = mtf.get_variable(
      mesh, "v", [BATCH, D_IN], initializer=tf.constant_initializer(V)
    )
    x = mtf.import_tf_tensor(mesh, X, [BATCH, D_IN])

    def grad_fn(
      explicit_inputs, all_inputs, forward_operations, outputs, output_grads
    ):
      seen["explicit"] = list(explicit_inputs)
      seen["all"] = list(all_inputs)
      seen["num_forward"] = len(forward_operations)
      seen["outputs"] = list(outputs)
      dy = output_grads[0]
      x_, v_ = all_inputs
      return [dy * v_ * 2.0, dy * x_ * 3.0]

    y = mtf.custom_gradient(lambda t: t * v, grad_fn, [x])
    dx, dv = mtf.gradients([mtf.reduce_sum(y)], [x, v])
    seen["x"], seen["v"] = x, v
    return [y, dx, dv]

  y, dx, dv = mtu.run_program(build, mesh_shape, layout)
  assert seen["explicit"] == [seen["x"]]
  assert seen["all"] == [seen["x"], seen["v"]]
  assert seen["num_forward"] == 1
  np.testing.assert_allclose(y, X * V, rtol=1e-6)
  np.testing.assert_allclose(dx, 2.0 * V, rtol=1e-6)
  np.testing.assert_allclose(dv, 3.0 * X, rtol=1e-6)


def test_custom_gradient_multiple_outputs_and_unusable_internals():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.import_tf_tensor(mesh, X, [BATCH, D_IN])
  internal = {}

  def fn(t):
    internal["e"] = mtf.exp(t)
    return (internal["e"] * 2.0, t)

  def grad_fn(
    explicit_inputs, all_inputs, forward_operations, outputs, output_grads
  ):
    # grad_fn may build on fn's internals.
    return [output_grads[0] * internal["e"] * 2.0 + output_grads[1]]

  y, same = mtf.custom_gradient(fn, grad_fn, [x])
  assert isinstance(y.operation, mtf.CustomGradientOperation)
  assert not internal["e"].usable
  with pytest.raises(ValueError, match="internal to a custom_gradient"):
    mtf.exp(internal["e"])
  [dx] = mtf.gradients([mtf.reduce_sum(y + same)], [x])
  assert not internal["e"].usable
  with mtf.variable_store(mtf.VariableStore()):
    lowering = mtf.Lowering(
      graph, {mesh: mtu.mesh_impl_for("all:4", "d_in:all")}
    )
    got = [lowering.export_to_tf_tensor(t) for t in (y, same, dx)]
  mtu.assert_all_close(got, [2 * np.exp(X), X, 2 * np.exp(X) + 1])


def test_custom_gradient_errors():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.import_tf_tensor(mesh, X, [BATCH, D_IN])
  bad = mtf.custom_gradient(
    mtf.square, lambda **kw: [kw["output_grads"][0]] * 2, [x]
  )
  with pytest.raises(ValueError, match="returned 2 gradients for 1 inputs"):
    mtf.gradients([mtf.reduce_sum(bad)], [x])


@meshes.parametrize([("", ""), ("rows:2;cols:2", "batch:rows;hidden:cols")])
def test_recompute_grad_of_fn_creating_variables(mesh_shape, layout):
  """A layer called for the first time inside recompute_grad creates its
  variables there; they are hoisted out and get the plain gradients.
  """

  def build(mesh):
    x = mtf.import_tf_tensor(mesh, X, [BATCH, D_IN])

    def layer(t):
      w1 = mtf.get_variable(
        mesh, "w1", [D_IN, HIDDEN], initializer=tf.constant_initializer(W1)
      )
      w2 = mtf.get_variable(
        mesh, "w2", [HIDDEN, D_OUT], initializer=tf.constant_initializer(W2)
      )
      return _mlp(t, w1, w2), w1, w2

    y = mtf.recompute_grad(lambda t: layer(t)[0], [x])
    num_variables = len(mesh.graph.all_variables)
    _, w1, w2 = layer(x)  # Reuses the variables made inside recompute_grad.
    assert len(mesh.graph.all_variables) == num_variables == 2
    loss = mtf.reduce_sum(y * y)
    return [y] + mtf.gradients([loss], [x, w1, w2])

  mtu.assert_all_close(
    mtu.run_program(build, mesh_shape, layout, "function"), _mlp_expected()
  )


def _mlp(x, w1, w2):
  h = mtf.relu(mtf.einsum([x, w1], output_shape=[BATCH, HIDDEN]))
  return mtf.einsum([h, w2], output_shape=[BATCH, D_OUT])


def _mlp_program(recompute):
  def build(mesh):
    x = mtf.import_tf_tensor(mesh, X, [BATCH, D_IN])
    w1 = mtf.get_variable(
      mesh, "w1", [D_IN, HIDDEN], initializer=tf.constant_initializer(W1)
    )
    w2 = mtf.get_variable(
      mesh, "w2", [HIDDEN, D_OUT], initializer=tf.constant_initializer(W2)
    )
    if recompute:
      y = mtf.recompute_grad(lambda t: _mlp(t, w1, w2), [x])
    else:
      y = _mlp(x, w1, w2)
    loss = mtf.reduce_sum(y * y)
    return [y] + mtf.gradients([loss], [x, w1, w2])

  return build


def _mlp_expected():
  pre = X @ W1
  h = np.maximum(pre, 0)
  y = h @ W2
  dy = 2 * y
  dw2 = h.T @ dy
  dh = (dy @ W2.T) * (pre > 0)
  return [y, dh @ W1.T, X.T @ dh, dw2]


@meshes.parametrize(meshes.CUSTOM_GRADIENT)
def test_recompute_grad_matches_plain_gradients(mesh_shape, layout):
  plain = mtu.run_program(_mlp_program(False), mesh_shape, layout)
  recomputed = mtu.run_program(_mlp_program(True), mesh_shape, layout)
  mtu.assert_all_close(plain, _mlp_expected(), rtol=1e-4, atol=1e-4)
  mtu.assert_all_close(recomputed, plain, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("mode", ["function", "graph"])
def test_recompute_grad_modes(mode):
  got = mtu.run_program(
    _mlp_program(True), "rows:2;cols:2", "batch:rows;hidden:cols", mode
  )
  mtu.assert_all_close(got, _mlp_expected(), rtol=1e-4, atol=1e-4)


def _count_einsums(graph):
  return sum(isinstance(op, mtf.EinsumOperation) for op in graph.operations)


@pytest.mark.parametrize("control_dependencies", [True, False])
def test_recompute_grad_clones_forward_operations(control_dependencies):
  counts = {}
  for recompute in (False, True):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    x = mtf.import_tf_tensor(mesh, X, [BATCH, D_IN])
    w1 = mtf.import_tf_tensor(mesh, W1, [D_IN, HIDDEN])
    w2 = mtf.import_tf_tensor(mesh, W2, [HIDDEN, D_OUT])
    if recompute:
      y = mtf.recompute_grad(
        lambda t, w1=w1, w2=w2: _mlp(t, w1, w2),
        [x],
        control_dependencies=control_dependencies,
      )
    else:
      y = _mlp(x, w1, w2)
    loss = mtf.reduce_sum(y * y)
    forward_einsums = _count_einsums(graph)
    num_ops = len(graph.operations)
    grads = mtf.gradients([loss], [x, w1, w2])
    assert len(graph.operations) > num_ops
    counts[recompute] = _count_einsums(graph) - forward_einsums
    with mtf.variable_store(mtf.VariableStore()):
      lowering = mtf.Lowering(
        graph, {mesh: mtu.mesh_impl_for("all:4", "hidden:all")}
      )
      got = [lowering.export_to_tf_tensor(t) for t in [y] + grads]
    mtu.assert_all_close(got, _mlp_expected(), rtol=1e-4, atol=1e-4)
  # The backward pass of recompute_grad clones the two forward einsums.
  assert counts[True] == counts[False] + 2


@meshes.parametrize([("", ""), ("all:4", "d_in:all")])
def test_recompute_grad_reuses_random_values(mesh_shape, layout):
  def build(mesh):
    x = mtf.import_tf_tensor(mesh, X, [BATCH, D_IN])
    y = mtf.recompute_grad(
      lambda t: mtf.dropout(t * 3.0, is_training=True, keep_prob=0.5), [x]
    )
    [dx] = mtf.gradients([mtf.reduce_sum(y)], [x])
    return [y, dx]

  y, dx = mtu.run_program(build, mesh_shape, layout)
  # A fresh dropout mask on the backward pass would break dx == y / x.
  kept = y != 0
  assert 0 < kept.sum() < kept.size
  np.testing.assert_allclose(dx, np.where(kept, 6.0, 0.0), rtol=1e-6)
