"""Tests of variable stacking (Graph.rewrite_stack_variables / autostack)."""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mesh_test_util as mtu
from tests import meshes

B = mtf.Dimension("b", 4)
H = mtf.Dimension("h", 4)


def _sgd_program(mesh, num_vars=3, read_first=False):
  """x * w0 * w1 * ...; one SGD step on every w; returns (loss, grads, ws)."""
  x = mtf.import_tf_tensor(
    mesh, tf.reshape(tf.range(16, dtype=tf.float32), [4, 4]) / 10, [B, H]
  )
  ws = [
    mtf.get_variable(
      mesh, "w%d" % i, [H], initializer=tf.constant_initializer(0.1 * (i + 1))
    )
    for i in range(num_vars)
  ]
  if read_first:
    ws[0] = mtf.read_variable(ws[0])
  y = x
  for w in ws:
    y = y * w
  loss = mtf.reduce_sum(mtf.square(y))
  grads = mtf.gradients([loss], ws)
  updates = mesh.graph.combine_assignments(
    [mtf.assign_sub(w, g * 0.01) for w, g in zip(ws, grads)]
  )
  return loss, grads, updates


def _lower(mesh_shape, layout, **kwargs):
  with mtf.variable_store(mtf.VariableStore()) as store:
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    loss, grads, updates = _sgd_program(mesh, **kwargs)
    mesh_impl = mtu.mesh_impl_for(mesh_shape, layout)
    lowering = mtf.Lowering(graph, {mesh: mesh_impl})
    values = [lowering.export_to_tf_tensor(t).numpy() for t in [loss] + grads]
    lowering.copy_slices_to_masters()
    masters = {name: v.numpy() for name, v in store.masters.items()}
    return graph, values, masters


def _stacked(graph):
  return [op for op in graph.operations if isinstance(op, mtf.StackedVariable)]


@meshes.parametrize(
  [("all:4", "b:all"), ("all:4", "h:all"), ("rows:2;cols:2", "b:rows;h:cols")]
)
def test_stacking_keeps_results_and_masters(mesh_shape, layout):
  _, ref_values, ref_masters = _lower("", "")
  graph, values, masters = _lower(mesh_shape, layout)
  [stacked] = _stacked(graph)
  assert stacked.original_names == ["w0", "w1", "w2"]
  assert stacked.name == "stacked/w0"
  assert stacked.shape.to_integer_list == [3, 4]
  mtu.assert_all_close(values, ref_values)
  # Checkpoint names and values are those of the unstacked variables.
  assert sorted(masters) == ["w0", "w1", "w2"]
  for name in masters:
    np.testing.assert_allclose(masters[name], ref_masters[name], rtol=1e-6)
  # The SGD step really changed the masters.
  assert not np.allclose(masters["w0"], 0.1)


def test_no_stacking_on_one_processor():
  graph, _, _ = _lower("", "")
  assert not _stacked(graph)


def test_read_variable_prevents_stacking_of_that_variable():
  graph, values, _ = _lower("all:4", "b:all", read_first=True)
  [stacked] = _stacked(graph)
  assert stacked.original_names == ["w1", "w2"]
  _, ref_values, _ = _lower("", "", read_first=True)
  mtu.assert_all_close(values, ref_values)


def test_size_cap_splits_stacks():
  with mtf.variable_store(mtf.VariableStore()):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    _sgd_program(mesh, num_vars=5)
    graph.rewrite_stack_variables(
      max_combined_variable_size=2 * H.size,
      mesh_to_impl={mesh: mtu.mesh_impl_for("all:4", "b:all")},
    )
    sizes = [len(s.original_names) for s in _stacked(graph)]
    assert sizes == [2, 2]


def test_rewrite_twice_raises_but_lowering_twice_is_fine():
  with mtf.variable_store(mtf.VariableStore()):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    loss, _, _ = _sgd_program(mesh)
    impl = mtu.mesh_impl_for("all:4", "b:all")
    first = mtf.Lowering(graph, {mesh: impl}).export_to_tf_tensor(loss)
    second = mtf.Lowering(graph, {mesh: impl}).export_to_tf_tensor(loss)
    assert len(_stacked(graph)) == 1
    with pytest.raises(ValueError, match="once"):
      graph.rewrite_stack_variables()
  # Eager lowering ran the first SGD step, so the second loss is lower.
  assert second < first


def test_stacked_training_in_function_and_graph_modes():
  def build(mesh):
    loss, grads, updates = _sgd_program(mesh)
    return [loss] + grads

  ref = mtu.run_program(build, "", "", "eager")
  for mode in ("function", "graph"):
    mtu.assert_all_close(
      mtu.run_program(build, "rows:2;cols:2", "b:rows;h:cols", mode),
      ref,
      msg=mode,
    )
