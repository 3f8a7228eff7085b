"""The driver's steps run with fewer Grappler passes and the same values.

`estimator.step_graph_rewrites` turns off, for the driver's step calls only,
Grappler passes that change no value of its steps (they cost much of the
first run of a step with many devices). Training the tiny Bitransformer of
driver_test_util with and without it must give the same losses and the same
variables, bit for bit, and the process's own call options must be left as
they were.
"""

import contextlib

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import config_pb2
from tensorflow.core.protobuf import rewriter_config_pb2
from tensorflow.python.eager import context  # pylint: disable=g-direct-tensorflow-import

from tests.transformer import driver_test_util as dtu
from transformer._src.driver import estimator as driver

STEPS = 3
OFF = rewriter_config_pb2.RewriterConfig.OFF


def _rewrites_of_this_thread() -> rewriter_config_pb2.RewriterConfig:
  config = config_pb2.ConfigProto()
  config.ParseFromString(
    context.context().function_call_options.config_proto_serialized
  )
  return config.graph_options.rewrite_options


def test_scope_turns_the_passes_off_and_restores_the_options():
  before = context.context().function_call_options
  outside = _rewrites_of_this_thread()
  with driver.step_graph_rewrites():
    inside = _rewrites_of_this_thread()
  assert context.context().function_call_options is before
  assert inside.layout_optimizer == OFF
  assert inside.remapping == OFF
  assert inside.disable_tfg_optimizer
  assert (
    inside.memory_optimization == rewriter_config_pb2.RewriterConfig.NO_MEM_OPT
  )
  # The passes that change values, or save time in every step, stay as the
  # process has them.
  assert inside.dependency_optimization == outside.dependency_optimization
  assert inside.disable_model_pruning == outside.disable_model_pruning
  assert inside.arithmetic_optimization == outside.arithmetic_optimization
  assert inside.constant_folding == outside.constant_folding
  assert inside.meta_optimizer_iterations == outside.meta_optimizer_iterations


def _train(model_dir, mesh_impl, activation_dtype):
  """([loss of steps 1..STEPS], {checkpoint key: value}) from a fixed seed."""
  tf.random.set_seed(11)
  est = dtu.estimator(
    model_dir,
    save_checkpoints_steps=0,
    mesh_impl=mesh_impl,
    activation_dtype=activation_dtype,
  )
  losses = [
    est.train(dtu.input_fn, step)["loss"] for step in range(1, STEPS + 1)
  ]
  est.save()
  reader = tf.train.load_checkpoint(str(model_dir))
  values = {
    name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()
  }
  return losses, values


@pytest.mark.parametrize(
  "mesh_impl, activation_dtype",
  [
    ("placement", "float32"),
    ("placement", "bfloat16"),
    ("simd", "float32"),
  ],
)
def test_training_is_bit_identical_with_the_passes_off(
  tmp_path, monkeypatch, mesh_impl, activation_dtype
):
  fewer = _train(tmp_path / "fewer", mesh_impl, activation_dtype)
  monkeypatch.setattr(driver, "step_graph_rewrites", contextlib.nullcontext)
  every = _train(tmp_path / "every", mesh_impl, activation_dtype)
  assert fewer[0] == every[0]
  assert sorted(fewer[1]) == sorted(every[1])
  for name, value in every[1].items():
    np.testing.assert_array_equal(fewer[1][name], value, err_msg=name)
