"""plan_graph and plan_gin: memory, FLOPs, step time, errors."""

import dataclasses

import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import plan as mtf_plan

BATCH, D_IN, HIDDEN = 64, 32, 128


def mlp_step(optimizer):
  """A one-layer training step built shape-only; returns (graph, loss)."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  batch = mtf.Dimension("batch", BATCH)
  d_in, hidden = mtf.Dimension("d_in", D_IN), mtf.Dimension("hidden", HIDDEN)
  with tf.Graph().as_default():
    with mtf.variable_store(mtf.VariableStore()):
      x = mtf.zeros(mesh, [batch, d_in])
      w = mtf.get_variable(mesh, "w", [d_in, hidden])
      loss = mtf.reduce_mean(mtf.square(mtf.einsum([x, w], [batch, hidden])))
      [grad] = mtf.gradients([loss], [w])
      optimizer.apply_grads([grad], graph.trainable_variables)
  return graph, loss


def test_sgd_plan_by_hand():
  graph, loss = mlp_step(mtf.optimize.SgdOptimizer(0.1))
  plan = mtf_plan.plan_graph(graph, "m:4", "hidden:m", exported=[loss])
  kernel = D_IN * HIDDEN * 4
  assert plan.num_devices == 4
  assert plan.param_bytes == kernel // 4
  assert plan.slot_bytes == 0
  # Forward x.w and the kernel's gradient: two [64, 32] x [32, 32] matmuls.
  assert plan.matmul_flops == 2 * (2 * BATCH * D_IN * HIDDEN // 4)
  # The loss sums a hidden-split tensor: one allreduce of a float32 scalar.
  assert plan.collective_total_bytes["allreduce"] == 2 * 3 * 4
  assert plan.collective_bytes["allreduce"] == 2 * 3 * 4 / 4
  assert plan.estimated_step_time is None


def test_adam_slots_are_twice_the_parameters():
  graph, loss = mlp_step(mtf.optimize.AdamWeightDecayOptimizer(0.1))
  plan = mtf_plan.plan_graph(graph, "m:4", "hidden:m", exported=[loss])
  assert plan.slot_bytes == 2 * plan.param_bytes


def test_data_parallel_allreduces_the_gradient():
  graph, loss = mlp_step(mtf.optimize.SgdOptimizer(0.1))
  plan = mtf_plan.plan_graph(graph, "m:4", "batch:m", exported=[loss])
  kernel = D_IN * HIDDEN * 4
  assert plan.param_bytes == kernel
  assert plan.collective_total_bytes["allreduce"] == 2 * 3 * (kernel + 4)


def test_step_time_parts_and_profiles():
  graph, loss = mlp_step(mtf.optimize.SgdOptimizer(0.1))
  plan = mtf_plan.plan_graph(
    graph, "m:4", "batch:m", hardware="tpu_v3", exported=[loss]
  )
  t = plan.estimated_step_time
  assert t.total == pytest.approx(t.compute + t.communication + t.overhead)
  v3 = mtf_plan.HARDWARE_PROFILES["tpu_v3"]
  assert t.communication == pytest.approx(
    plan.communication_bytes / v3.link_bandwidth
  )
  assert t.compute >= plan.matmul_flops / v3.peak_flops("float32")
  # Faster hardware, faster step; devices sharing a machine add up.
  assert plan.step_time("h100").total < plan.step_time("tpu_v2").total
  shared = dataclasses.replace(v3, name="shared", shared_compute=True)
  assert plan.step_time(shared).total == pytest.approx(4 * t.total)


def test_to_text_names_every_figure():
  graph, loss = mlp_step(mtf.optimize.SgdOptimizer(0.1))
  plan = mtf_plan.plan_graph(
    graph, "m:4", "batch:m", hardware="a100", exported=[loss]
  )
  text = plan.to_text()
  for word in (
    "m:4 (4 devices)",
    "batch:m",
    "parameters",
    "optimizer slots",
    "activations",
    "FLOPs",
    "allreduce",
    "allconcat",
    "alltoall",
    "shift",
    "estimated step time on a100",
  ):
    assert word in text


def test_layout_that_does_not_divide_is_an_error():
  graph, loss = mlp_step(mtf.optimize.SgdOptimizer(0.1))
  with pytest.raises(ValueError, match="hidden.*128.*m.*3"):
    mtf_plan.plan_graph(graph, "m:3", "hidden:m", exported=[loss])


def test_unknown_hardware_is_an_error():
  graph, loss = mlp_step(mtf.optimize.SgdOptimizer(0.1))
  with pytest.raises(
    ValueError, match="unknown hardware profile 'tpu_v9'.*h100"
  ):
    mtf_plan.plan_graph(graph, "m:4", "", hardware="tpu_v9")


def test_mesh_larger_than_the_hardware_is_an_error():
  graph, _ = mlp_step(mtf.optimize.SgdOptimizer(0.1))
  with pytest.raises(ValueError, match="16 devices.*'h100'.*at most 8"):
    mtf_plan.plan_graph(graph, "m:16", "batch:m", hardware="h100")
  plan = mtf_plan.plan_graph(graph, "m:16", "batch:m")
  with pytest.raises(ValueError, match="at most 8"):
    plan.step_time("a100")


@pytest.mark.slow
def test_plan_gin_tiny_model():
  plan = mtf_plan.plan_gin(
    ["models/tiny.gin", "layouts/2x2_dp_mp.gin"],
    [],
    batch_size=8,
    sequence_length=32,
    hardware="tpu_v3",
  )
  assert plan.mesh_shape == "batch:2;model:4"
  assert plan.num_devices == 8
  # Adafactor: factored second moments, far smaller than the parameters.
  assert 0 < plan.slot_bytes < plan.param_bytes
  assert plan.collective_bytes["allreduce"] > 0
  assert plan.estimated_step_time.total > 0
  # Splitting d_ff, heads and vocab 4 ways shrinks the parameters.
  single = mtf_plan.plan_gin(
    ["models/tiny.gin"],
    [],
    mesh_shape="",
    layout_rules="",
    batch_size=8,
    sequence_length=32,
  )
  assert plan.param_bytes < single.param_bytes / 2
  assert single.communication_bytes == 0
