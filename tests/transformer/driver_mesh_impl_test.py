"""The driver's mesh implementation choice: placement and SIMD agree.

The tiny Bitransformer of driver_test_util trains for a few steps on the
same mesh with PlacementMeshImpl and with SimdMeshImpl (collective backend
on virtual CPUs): step losses, eval metrics, greedy decodes and scores
match, checkpoints restore across the two, and a SavedModel exported from
a SIMD-trained checkpoint decodes as the SIMD estimator does.
"""

import numpy as np
import pytest
import tensorflow as tf

from mesh_tensorflow import placement_mesh_impl
from mesh_tensorflow import simd_mesh_impl
from tests.transformer import driver_test_util as dtu
from transformer import utils
from transformer import vocabulary as vocabulary_lib
from transformer._src.driver import evaluation as driver_eval
from transformer._src.driver import mesh_impl_choice

BYTES = vocabulary_lib.ByteVocabulary()
STRINGS = ["abc", "hello", "x", "revers"]
MESH_ALL_4 = ("all:4", "batch:all")
STEPS = 3


def _trained(model_dir, mesh, mesh_impl, vocabulary=None):
  """(estimator, [loss of steps 1..STEPS]) from seeded initial variables."""
  tf.random.set_seed(7)
  est = dtu.estimator(
    model_dir,
    mesh=mesh,
    vocabulary=vocabulary,
    save_checkpoints_steps=0,
    mesh_impl=mesh_impl,
  )
  losses = [
    est.train(dtu.input_fn, step)["loss"] for step in range(1, STEPS + 1)
  ]
  return est, losses


def test_unknown_mesh_impl_is_named():
  with pytest.raises(ValueError, match="unknown mesh_impl 'spmd'.*simd"):
    mesh_impl_choice.make_mesh_impl("spmd", "all:2", "batch:all")


def test_simd_mesh_larger_than_the_devices_is_named():
  with pytest.raises(
    ValueError, match="mesh_impl 'simd': mesh_shape .* needs 64 devices"
  ):
    mesh_impl_choice.make_mesh_impl("simd", "a:8;b:8", "")


def test_auto_is_placement_on_cpus_and_simd_collective_when_asked():
  assert mesh_impl_choice.resolve_mesh_impl("auto") == "placement"
  assert isinstance(
    mesh_impl_choice.make_mesh_impl("auto", *dtu.MESH_2X2),
    placement_mesh_impl.PlacementMeshImpl,
  )
  simd = mesh_impl_choice.make_mesh_impl("SIMD", *dtu.MESH_2X2)
  assert isinstance(simd, simd_mesh_impl.SimdMeshImpl)
  assert simd.devices == [
    d.name for d in tf.config.list_logical_devices("CPU")[:4]
  ]


def _pretend_devices(monkeypatch, kind, count):
  """Makes tf.config.list_logical_devices(kind) list `count` fake devices."""
  real = tf.config.list_logical_devices
  fake = [
    tf.config.LogicalDevice(
      "/job:localhost/replica:0/task:0/device:%s:%d" % (kind, i), kind
    )
    for i in range(count)
  ]

  def list_logical_devices(device_type=None):
    if device_type == kind:
      return list(fake)
    return real(device_type)

  monkeypatch.setattr(tf.config, "list_logical_devices", list_logical_devices)


def test_auto_is_simd_with_the_tpu_backend_on_a_tpu_host(monkeypatch):
  # No TPU here: the process is made to report 8 TPU cores. "auto" then
  # lowers with SimdMeshImpl's TPU backend (no local devices, no
  # collective backend), as "simd" does; "placement" stays on the CPUs.
  _pretend_devices(monkeypatch, "TPU", 8)
  assert mesh_impl_choice.resolve_mesh_impl("auto") == "simd"
  for name in ("auto", "simd"):
    mesh_impl = mesh_impl_choice.make_mesh_impl(name, *dtu.MESH_2X2)
    assert isinstance(mesh_impl, simd_mesh_impl.SimdMeshImpl)
    assert mesh_impl.devices is None
    assert not mesh_impl_choice.uses_collective_backend(mesh_impl)
    assert type(mesh_impl.backend).__name__ == "TpuBackend"
  placement = mesh_impl_choice.make_mesh_impl("placement", *dtu.MESH_2X2)
  assert isinstance(placement, placement_mesh_impl.PlacementMeshImpl)
  assert all("CPU" in d for d in placement.devices)


def test_simd_on_gpus_builds_nccl_collectives(monkeypatch):
  # No GPU here: the process is made to report 4 GPUs. The driver's SIMD
  # mesh takes them (GPUs before CPUs), and the all-reduce its replicas
  # trace asks for NCCL (built, not run); placement takes them too.
  _pretend_devices(monkeypatch, "GPU", 4)
  assert mesh_impl_choice.resolve_mesh_impl("auto") == "placement"
  mesh_impl = mesh_impl_choice.make_mesh_impl("simd", *dtu.MESH_2X2)
  assert [
    tf.DeviceSpec.from_string(d).device_type for d in mesh_impl.devices
  ] == ["GPU"] * 4
  assert mesh_impl.backend.communication_hint == "nccl"

  @tf.function(autograph=False)
  def sums():
    return mesh_impl.replicate(
      lambda: mesh_impl.backend.allreduce_sum(
        tf.cast(mesh_impl.pnum_tensor, tf.float32), [[0, 1, 2, 3]]
      )
    )

  reduces = [
    op
    for op in dtu.all_ops(sums.get_concrete_function().graph)
    if op.type == "CollectiveReduceV2"
  ]
  assert reduces
  assert {op.get_attr("communication_hint") for op in reduces} == {b"nccl"}
  placement = mesh_impl_choice.make_mesh_impl("placement", *dtu.MESH_2X2)
  assert placement.devices == mesh_impl.devices


@pytest.mark.skipif(
  not tf.config.list_logical_devices("GPU"), reason="needs GPUs"
)
def test_simd_collectives_use_nccl_on_gpus():
  gpus = tf.config.list_logical_devices("GPU")
  mesh_impl = mesh_impl_choice.make_mesh_impl(
    "simd", "all:%d" % len(gpus), "batch:all"
  )
  assert mesh_impl.backend.communication_hint == "nccl"
  sums = mesh_impl.replicate(
    lambda: mesh_impl.backend.allreduce_sum(
      tf.cast(mesh_impl.pnum_tensor, tf.float32) + 1.0,
      [list(range(len(gpus)))],
    )
  )
  n = len(gpus)
  np.testing.assert_allclose([s.numpy() for s in sums], [n * (n + 1) / 2] * n)


@pytest.mark.slow
def test_simd_matches_placement_and_checkpoints_restore_across(tmp_path):
  placement, placement_losses = _trained(
    tmp_path / "placement", dtu.MESH_2X2, "placement", BYTES
  )
  simd, simd_losses = _trained(tmp_path / "simd", dtu.MESH_2X2, "simd", BYTES)
  assert isinstance(simd.mesh_impl, simd_mesh_impl.SimdMeshImpl)
  np.testing.assert_allclose(simd_losses, placement_losses, rtol=1e-5)
  assert placement_losses[-1] < placement_losses[0]

  placement_metrics = driver_eval.evaluate(placement, dtu.eval_dataset())
  simd_metrics = driver_eval.evaluate(simd, dtu.eval_dataset())
  for name, value in placement_metrics.items():
    np.testing.assert_allclose(simd_metrics[name], value, rtol=1e-5)
  x, y = dtu.reverse_data(5, seed=2)
  np.testing.assert_array_equal(
    driver_eval.decode_ids(simd, x), driver_eval.decode_ids(placement, x)
  )
  np.testing.assert_allclose(
    driver_eval.score_ids(simd, x, y),
    driver_eval.score_ids(placement, x, y),
    rtol=1e-5,
  )
  simd_decodes = utils.decode_strings(simd, STRINGS)
  assert simd_decodes == utils.decode_strings(placement, STRINGS)

  # A SIMD checkpoint read by placement, and the other way round.
  for model_dir, mesh_impl in (("simd", "placement"), ("placement", "simd")):
    other = dtu.estimator(
      tmp_path / model_dir, vocabulary=BYTES, mesh_impl=mesh_impl
    )
    metrics = driver_eval.evaluate(other, dtu.eval_dataset())
    np.testing.assert_allclose(metrics["loss"], simd_metrics["loss"], rtol=1e-5)

  # The SavedModel of the SIMD-trained checkpoint decodes the same.
  path = utils.export_model(
    simd,
    str(tmp_path / "export"),
    BYTES,
    {"inputs": dtu.LENGTH, "targets": dtu.LENGTH},
    "bitransformer",
    batch_size=2,
  )
  serve = tf.saved_model.load(path).signatures["serving_default"]
  outputs = serve(inputs=tf.constant(STRINGS))["outputs"].numpy()
  assert [s.decode("utf-8") for s in outputs] == simd_decodes


@pytest.mark.slow
def test_simd_matches_placement_on_a_1d_mesh(tmp_path):
  placement, placement_losses = _trained(
    tmp_path / "placement", MESH_ALL_4, "placement"
  )
  simd, simd_losses = _trained(tmp_path / "simd", MESH_ALL_4, "simd")
  np.testing.assert_allclose(simd_losses, placement_losses, rtol=1e-5)
  placement_metrics = driver_eval.evaluate(placement, dtu.eval_dataset())
  simd_metrics = driver_eval.evaluate(simd, dtu.eval_dataset())
  np.testing.assert_allclose(
    simd_metrics["loss"], placement_metrics["loss"], rtol=1e-5
  )
  assert simd_metrics["token_accuracy"] == placement_metrics["token_accuracy"]
