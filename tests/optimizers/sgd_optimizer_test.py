"""SgdOptimizer, MomentumOptimizer and the Optimizer base class."""

import logging

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mesh_test_util as mtu
from tests import meshes
from tests.optimizers import optimizer_test_util as otu

SPECS = [
  ("w_ab", [("a", 8), ("b", 4)]),
  ("w_ac", [("a", 8), ("c", 3)]),
  ("w_b", [("b", 4)]),
]
# 1 device, and a 2x2 mesh splitting dim a over rows and b over cols.


@meshes.parametrize(meshes.OPTIMIZERS)
def test_sgd_matches_numpy(mesh_shape, layout):
  problem = otu.Problem(SPECS, steps=5)
  actual = otu.train(
    problem,
    lambda: mtf.optimize.SgdOptimizer(0.1),
    mesh_shape,
    layout,
    "function",
  )
  expected = otu.train_numpy(problem, otu.NpSgd(0.1))
  otu.assert_same_history(actual, expected, msg="sgd")


@meshes.parametrize(meshes.OPTIMIZERS)
def test_momentum_matches_numpy(mesh_shape, layout):
  problem = otu.Problem(SPECS, steps=5)
  actual = otu.train(
    problem,
    lambda: mtf.optimize.MomentumOptimizer(0.05, momentum=0.9),
    mesh_shape,
    layout,
    "function",
  )
  expected = otu.train_numpy(problem, otu.NpMomentum(0.05, 0.9))
  otu.assert_same_history(actual, expected, msg="momentum")
  assert "w_ab_momentum_v" in actual[-1]


def test_momentum_eager_and_graph_agree_with_numpy():
  problem = otu.Problem(SPECS[:2], steps=5)
  expected = otu.train_numpy(problem, otu.NpMomentum(0.05, 0.5))
  for mode in ("eager", "graph"):
    actual = otu.train(
      problem,
      lambda: mtf.optimize.MomentumOptimizer(0.05, 0.5),
      "rows:2;cols:2",
      "a:rows;b:cols",
      mode,
    )
    otu.assert_same_history(actual, expected, msg=mode)


def test_sgd_tf_scalar_learning_rate_in_eager():
  problem = otu.Problem(SPECS[:1], steps=5)
  actual = otu.train(
    problem, lambda: mtf.optimize.SgdOptimizer(tf.constant(0.2)), mode="eager"
  )
  otu.assert_same_history(actual, otu.train_numpy(problem, otu.NpSgd(0.2)))


def test_sgd_with_mtf_gradients_of_a_loss():
  """A real loss: 0.5 * sum((w x - y)^2) for a linear model."""
  rng = np.random.default_rng(3)
  x = rng.standard_normal((6, 4)).astype(np.float32)
  y = rng.standard_normal((6, 3)).astype(np.float32)
  w0 = rng.standard_normal((4, 3)).astype(np.float32)
  batch, d_in, d_out = (
    mtf.Dimension("batch", 6),
    mtf.Dimension("d_in", 4),
    mtf.Dimension("d_out", 3),
  )
  store = mtf.VariableStore()
  mesh_impl = mtu.mesh_impl_for("rows:2;cols:2", "batch:rows;d_in:cols")

  @tf.function(autograph=False)
  def step():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    with mtf.variable_store(store):
      w = mtf.get_variable(
        mesh, "w", [d_in, d_out], initializer=tf.constant_initializer(w0)
      )
      xs = mtf.import_tf_tensor(mesh, x, [batch, d_in])
      ys = mtf.import_tf_tensor(mesh, y, [batch, d_out])
      err = mtf.einsum([xs, w], output_shape=[batch, d_out]) - ys
      loss = mtf.reduce_sum(mtf.square(err)) * 0.5
      grads = mtf.gradients([loss], [w])
      mtf.optimize.SgdOptimizer(0.05).apply_grads(grads, [w.operation])
      lowering = mtf.Lowering(graph, {mesh: mesh_impl})
    lowering.copy_slices_to_masters()

  w_np = w0.astype(np.float64)
  for _ in range(5):
    step()
    w_np = w_np - 0.05 * x.T @ (x @ w_np - y)
    np.testing.assert_allclose(
      store.masters["w"].numpy(), w_np, rtol=1e-5, atol=1e-5
    )


def test_none_gradient_warns_and_skips_the_variable(caplog):
  problem = otu.Problem(SPECS[:2], steps=2)
  with caplog.at_level(logging.WARNING):
    actual = otu.train(
      problem,
      lambda: mtf.optimize.SgdOptimizer(0.1),
      mode="eager",
      grad_none=("w_ac",),
    )
  np.testing.assert_array_equal(actual[-1]["w_ac"], problem.init["w_ac"])
  assert not np.allclose(actual[-1]["w_ab"], problem.init["w_ab"])
  assert any(
    "w_ac" in r.getMessage() and "None" in r.getMessage()
    for r in caplog.records
  )


def _graph_with_variables():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  with mtf.variable_store(mtf.VariableStore()):
    w = mtf.get_variable(
      mesh, "w", [mtf.Dimension("a", 4)], initializer=tf.zeros_initializer()
    )
    v = mtf.get_variable(
      mesh, "v", [mtf.Dimension("a", 4)], initializer=tf.zeros_initializer()
    )
  return graph, mesh, w, v


def test_all_none_gradients_give_no_operations():
  graph, _, w, v = _graph_with_variables()
  assert (
    mtf.optimize.SgdOptimizer(0.1).apply_grads(
      [None, None], [w.operation, v.operation]
    )
    == []
  )


def test_apply_grads_combines_assignments_by_assign_fn():
  graph, _, w, v = _graph_with_variables()
  with mtf.variable_store(mtf.VariableStore()):
    ops = mtf.optimize.MomentumOptimizer(0.1, 0.9).apply_grads(
      [w * 1.0, v * 1.0], [w.operation, v.operation]
    )
  # One Assign for the velocities (assign), one for the weights (assign_add).
  assert len(ops) == 2
  assert all(isinstance(op, mtf.Assign) for op in ops)
  assert sorted(len(op.variables) for op in ops) == [2, 2]
  assert all(op in graph.operations for op in ops)


@pytest.mark.parametrize(
  "optimizer",
  [
    mtf.optimize.SgdOptimizer(0.1),
    mtf.optimize.MomentumOptimizer(0.1, 0.9),
    mtf.optimize.AdamWeightDecayOptimizer(0.1),
    mtf.optimize.AdafactorOptimizer(learning_rate=0.1, decay_rate=0.9),
  ],
)
def test_non_variable_is_a_value_error_naming_it(optimizer):
  _, _, w, _ = _graph_with_variables()
  with pytest.raises(ValueError, match=r"mtf\.Variable.*'w:0'"):
    optimizer.apply_grads([w * 1.0], [w])  # the output Tensor, not a Variable
  with pytest.raises(ValueError, match="not_a_variable"):
    optimizer.apply_grads([w * 1.0], ["not_a_variable"])
  with pytest.raises(ValueError, match="not_a_variable"):
    optimizer.apply_grad(w * 1.0, "not_a_variable")


def test_mismatched_lists_and_shapes_are_value_errors():
  _, mesh, w, v = _graph_with_variables()
  opt = mtf.optimize.SgdOptimizer(0.1)
  with pytest.raises(ValueError, match="2 gradients for 1 variables"):
    opt.apply_grads([w, v], [w.operation])
  other = mtf.zeros(mesh, [mtf.Dimension("b", 4)])
  with pytest.raises(ValueError, match="variable w has shape"):
    opt.apply_grads([other], [w.operation])


def test_base_optimizer_apply_grad_is_not_implemented():
  _, _, w, _ = _graph_with_variables()
  with pytest.raises(ValueError, match="does not implement apply_grad"):
    mtf.optimize.Optimizer().apply_grads([w * 1.0], [w.operation])


def test_learning_rate_properties():
  assert mtf.optimize.SgdOptimizer(0.3).lr == 0.3
  opt = mtf.optimize.MomentumOptimizer(0.3, 0.7)
  assert (opt.lr, opt.momentum) == (0.3, 0.7)
