"""layout_for_step_time finds the layouts an exhaustive search finds."""

import dataclasses
import itertools

import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import auto_mtf
from mesh_tensorflow import plan as mtf_plan
from mesh_tensorflow._src.auto_mtf import step_time

HARDWARE = "tpu_v3"


def mlp_step(batch=64, d_in=128, hidden=512, d_out=64):
  """A two-layer MLP training step (SGD), built shape-only.

  Returns:
    (graph, loss).
  """
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  b = mtf.Dimension("batch", batch)
  i, h = mtf.Dimension("d_in", d_in), mtf.Dimension("hidden", hidden)
  o = mtf.Dimension("d_out", d_out)
  with tf.Graph().as_default():
    with mtf.variable_store(mtf.VariableStore()):
      x = mtf.zeros(mesh, [b, i])
      w1 = mtf.get_variable(mesh, "w1", [i, h])
      w2 = mtf.get_variable(mesh, "w2", [h, o])
      y = mtf.einsum([mtf.relu(mtf.einsum([x, w1], [b, h])), w2], [b, o])
      loss = mtf.reduce_mean(mtf.square(y))
      variables = graph.trainable_variables
      grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
      mtf.optimize.SgdOptimizer(0.1).apply_grads(grads, variables)
  return graph, loss


def _co_occurring(graph):
  """Pairs of dim names that share a tensor or an einsum."""
  groups = []
  for op in graph.operations:
    tensors = list(op.outputs)
    if isinstance(op, step_time.EinsumOperation):
      tensors += list(op.inputs)
      groups.append({d.name for t in tensors for d in t.shape.dims})
    groups.extend({d.name for d in t.shape.dims} for t in op.outputs)
  return groups


def exhaustive(graph, mesh_shape, loss, memory_cap=None, hardware=HARDWARE):
  """(best step time, its layouts, number planned): plans every layout."""
  mesh = mtf.convert_to_shape(mesh_shape)
  names = ["batch", "d_in", "hidden", "d_out"]
  groups = _co_occurring(graph)
  times = {}
  for choice in itertools.product([None] + mesh.dimension_names, repeat=4):
    assignment = {n: m for n, m in zip(names, choice) if m is not None}
    if any(
      len({assignment[n] for n in g if n in assignment})
      < len([n for n in g if n in assignment])
      for g in groups
    ):
      continue  # Two dims of one tensor or einsum on one mesh dim.
    rules = ";".join("%s:%s" % kv for kv in sorted(assignment.items()))
    try:
      plan = mtf_plan.plan_graph(
        graph, mesh_shape, rules, hardware, exported=[loss]
      )
    except ValueError:
      continue  # Does not divide.
    if memory_cap is not None and plan.memory_bytes > memory_cap:
      continue
    times[rules] = plan.estimated_step_time.total
  best = min(times.values())
  return best, {r for r, t in times.items() if t == best}, len(times)


@pytest.mark.parametrize("mesh_shape", ["m:4", "rows:2;cols:2"])
def test_same_best_layout_as_exhaustive_search(mesh_shape):
  graph, loss = mlp_step()
  best_time, best_layouts, _ = exhaustive(graph, mesh_shape, loss)
  found = auto_mtf.layout_for_step_time(
    graph, mesh_shape, HARDWARE, exported=[loss]
  )
  rules = ";".join("%s:%s" % kv for kv in found.layout_rules)
  assert rules in best_layouts
  assert found.plan.estimated_step_time.total == best_time


def test_memory_cap_changes_the_answer_as_in_exhaustive_search():
  # With slow links the replicated layout (no collective, most memory) is
  # fastest; a cap under its memory forces a split, and with it collectives.
  slow_links = dataclasses.replace(
    mtf_plan.HARDWARE_PROFILES["tpu_v3"], name="slow_links", link_bandwidth=1e6
  )
  graph, loss = mlp_step()
  _, free_layouts, _ = exhaustive(graph, "m:4", loss, hardware=slow_links)
  assert free_layouts == {""}
  cap = step_time.memory_bytes(graph, mtf.convert_to_shape("m:4"), "") - 1
  capped_time, capped_layouts, _ = exhaustive(
    graph, "m:4", loss, cap, hardware=slow_links
  )
  found = auto_mtf.layout_for_step_time(
    graph, "m:4", slow_links, memory_cap=cap, exported=[loss]
  )
  rules = ";".join("%s:%s" % kv for kv in found.layout_rules)
  assert rules in capped_layouts
  assert found.plan.estimated_step_time.total == capped_time
  assert found.plan.memory_bytes <= cap


def test_branch_and_bound_plans_fewer_layouts_than_exhaustive():
  graph, loss = mlp_step(batch=512, d_in=1024, hidden=4096, d_out=1024)
  _, best_layouts, num_layouts = exhaustive(graph, "rows:2;cols:2", loss)
  found = auto_mtf.layout_for_step_time(
    graph, "rows:2;cols:2", HARDWARE, exported=[loss]
  )
  rules = ";".join("%s:%s" % kv for kv in found.layout_rules)
  assert rules in best_layouts
  assert found.num_planned < num_layouts


def test_mesh_shape_search_keeps_the_fastest():
  graph, loss = mlp_step()
  found = auto_mtf.layout_and_mesh_shape_for_step_time(
    graph, 4, HARDWARE, exported=[loss]
  )
  for sizes in ([4], [2, 2]):
    mesh_shape = ";".join("mesh_%d:%d" % (i, s) for i, s in enumerate(sizes))
    best_time, _, _ = exhaustive(graph, mesh_shape, loss)
    assert found.plan.estimated_step_time.total <= best_time


def test_no_layout_under_the_cap_is_an_error():
  graph, loss = mlp_step()
  with pytest.raises(ValueError, match="memory cap of 10 bytes"):
    auto_mtf.layout_for_step_time(
      graph, "m:4", HARDWARE, memory_cap=10, exported=[loss]
    )


def test_too_many_devices_for_the_hardware_is_an_error():
  graph, loss = mlp_step()
  with pytest.raises(ValueError, match="at most 8"):
    auto_mtf.layout_for_step_time(graph, "m:16", "a100", exported=[loss])
