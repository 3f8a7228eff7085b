"""SimdMeshImpl: constructor, processor maps, groups, laid-out types, errors.

What needs no running replicas. The collective backend's behaviour (values,
variables, training) is in simd_collective_test.py.
"""

import inspect

from absl.testing import absltest
from absl.testing import parameterized
import gin
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import simd_mesh_impl
from mesh_tensorflow._src.mesh_impls import simd_backend
from mesh_tensorflow._src.mesh_impls import simd_collective

DEVICES = ["/cpu:%d" % i for i in range(8)]


class SignatureTest(absltest.TestCase):
  def test_signature_pinned(self):
    params = inspect.signature(simd_mesh_impl.SimdMeshImpl.__init__).parameters
    self.assertEqual(
      [(n, p.default) for n, p in params.items()],
      [
        ("self", inspect.Parameter.empty),
        ("shape", inspect.Parameter.empty),
        ("layout", inspect.Parameter.empty),
        ("devices", None),
        ("device_assignment", None),
        ("logical_to_physical", None),
        ("allreduce_in_bfloat16_max_group_size", 8),
        ("backend", None),
      ],
    )
    self.assertEqual(params["backend"].kind, inspect.Parameter.KEYWORD_ONLY)

  def test_facade_names(self):
    for name in [
      "SimdMeshImpl",
      "LaidOutTensor",
      "LaidOutVariable",
      "HierarchicalTiling",
      "auto_logical_to_physical_tpu",
      "physical_shape_3d_from_topology_proto_4d",
      "_ring_2d",
      "_logical_to_physical_v1",
      "_logical_1d_to_physical_subspace_auto",
    ]:
      self.assertTrue(hasattr(simd_mesh_impl, name), name)
    self.assertIs(mtf.simd_mesh_impl, simd_mesh_impl)
    impl = simd_mesh_impl.SimdMeshImpl("all:2", "", devices=DEVICES[:2])
    self.assertIs(impl.LaidOutTensor, simd_mesh_impl.LaidOutTensor)
    self.assertIs(impl.LaidOutVariable, simd_mesh_impl.LaidOutVariable)

  def test_gin_configurable_under_original_module(self):
    gin.clear_config()
    try:
      gin.parse_config(
        "mesh_tensorflow.simd_mesh_impl.SimdMeshImpl."
        "allreduce_in_bfloat16_max_group_size = 3"
      )
      impl = simd_mesh_impl.SimdMeshImpl("all:2", "", devices=DEVICES[:2])
      self.assertEqual(impl._allreduce_in_bfloat16_max_group_size, 3)  # pylint: disable=protected-access
    finally:
      gin.clear_config()


class ConstructionTest(parameterized.TestCase):
  def test_defaults_collective_backend_on_cpus(self):
    impl = simd_mesh_impl.SimdMeshImpl("rows:2;cols:2", "b:rows")
    self.assertIsInstance(impl.backend, simd_collective.CollectiveBackend)
    self.assertLen(impl.devices, 4)
    self.assertEqual(impl.logical_to_physical, [0, 1, 2, 3])
    self.assertFalse(impl.supports_control_dependencies)
    self.assertIsNone(impl.device_assignment)

  def test_device_count_mismatch(self):
    with self.assertRaisesRegex(ValueError, r"4 processors but 3 devices"):
      simd_mesh_impl.SimdMeshImpl("all:4", "", devices=DEVICES[:3])

  def test_too_few_local_devices(self):
    with self.assertRaisesRegex(ValueError, r"needs 16 devices"):
      simd_mesh_impl.SimdMeshImpl("all:16", "")

  @parameterized.parameters(
    ([0, 1, 2],),
    ([0, 1, 1, 2],),
    ([1, 2, 3, 4],),
    ([0, 1, 2, 3, 4],),
    (["a", "b", "c", "d"],),
  )
  def test_logical_to_physical_not_a_permutation(self, l2p):
    with self.assertRaisesRegex(ValueError, r"logical_to_physical"):
      simd_mesh_impl.SimdMeshImpl(
        "all:4", "", devices=DEVICES[:4], logical_to_physical=l2p
      )

  def test_unknown_backend(self):
    with self.assertRaisesRegex(ValueError, r"unknown SimdMeshImpl backend"):
      simd_mesh_impl.SimdMeshImpl(
        "all:2", "", devices=DEVICES[:2], backend="mpi"
      )

  def test_backend_instance(self):
    backend = simd_collective.CollectiveBackend(DEVICES[:2])
    impl = simd_mesh_impl.SimdMeshImpl("all:2", "", backend=backend)
    self.assertIs(impl.backend, backend)
    self.assertIsInstance(backend, simd_backend.SimdBackend)

  def test_tpu_backend_chosen_by_device_assignment(self):
    try:
      from mesh_tensorflow._src.mesh_impls import simd_tpu  # pylint: disable=g-import-not-at-top
    except ImportError:
      self.skipTest("no TPU backend module")
    impl = simd_mesh_impl.SimdMeshImpl("all:2", "", backend="tpu")
    self.assertIsInstance(impl.backend, simd_tpu.TpuBackend)
    self.assertIsNone(impl.devices)
    with self.assertRaises(NotImplementedError):
      impl.replicate(lambda: 0)


class ProcessorMapsTest(absltest.TestCase):
  def setUp(self):
    super().setUp()
    self.l2p = [2, 0, 3, 1]
    self.impl = simd_mesh_impl.SimdMeshImpl(
      "rows:2;cols:2",
      "a:rows;b:cols",
      devices=DEVICES[:4],
      logical_to_physical=self.l2p,
    )

  def test_l2p_p2l_inverse(self):
    for logical in range(4):
      self.assertEqual(self.impl.l2p(logical), self.l2p[logical])
      self.assertEqual(self.impl.p2l(self.impl.l2p(logical)), logical)

  def test_group_assignment_in_physical_ids(self):
    # Logical groups over rows (axis 0): [[0, 2], [1, 3]]; over cols [[0, 1],
    # [2, 3]]; over both [[0, 1, 2, 3]].
    self.assertEqual(
      self.impl._create_group_assignment([0]),  # pylint: disable=protected-access
      [[2, 3], [0, 1]],
    )
    self.assertEqual(
      self.impl._create_group_assignment([1]),  # pylint: disable=protected-access
      [[2, 0], [3, 1]],
    )
    self.assertEqual(
      self.impl._create_group_assignment([0, 1]),  # pylint: disable=protected-access
      [[2, 0, 3, 1]],
    )

  def test_check_groups(self):
    with self.assertRaisesRegex(ValueError, "not a partition"):
      simd_backend.check_groups([[0, 1], [1, 2]], 4)
    with self.assertRaisesRegex(ValueError, "unequal sizes"):
      simd_backend.check_groups([[0, 1, 2], [3]], 4)


class LaidOutTensorTest(absltest.TestCase):
  def test_exactly_one_slice(self):
    t = tf.zeros([2, 3])
    laid_out = simd_mesh_impl.LaidOutTensor([t])
    self.assertIs(laid_out.one_slice, t)
    self.assertEqual(laid_out.all_slices, [t])
    self.assertEqual(laid_out.tensor_list, [t])
    self.assertEqual(laid_out.slice_shape, [2, 3])
    self.assertIs(laid_out.to_laid_out_tensor(), laid_out)
    self.assertIsInstance(
      simd_mesh_impl.LaidOutTensor.from_tensor_list([t]),
      simd_mesh_impl.LaidOutTensor,
    )
    with self.assertRaisesRegex(ValueError, "exactly one"):
      simd_mesh_impl.LaidOutTensor([t, t])

  def test_slicewise_outside_replicate(self):
    impl = simd_mesh_impl.SimdMeshImpl("all:2", "", devices=DEVICES[:2])
    out = impl.slicewise(
      lambda a, b: a + b, simd_mesh_impl.LaidOutTensor([tf.ones([2])]), 2.0
    )
    self.assertEqual(out.one_slice.numpy().tolist(), [3.0, 3.0])
    pair = impl.slicewise(
      lambda a: (a, -a), simd_mesh_impl.LaidOutTensor([tf.ones([1])])
    )
    self.assertLen(pair, 2)

  def test_collectives_need_replica_context(self):
    impl = simd_mesh_impl.SimdMeshImpl("all:2", "", devices=DEVICES[:2])
    with self.assertRaisesRegex(RuntimeError, "replicate"):
      impl.laid_out_pnum()

  def test_bad_reduction(self):
    impl = simd_mesh_impl.SimdMeshImpl("all:2", "", devices=DEVICES[:2])
    with self.assertRaisesRegex(ValueError, "PROD"):
      impl.allreduce(simd_mesh_impl.LaidOutTensor([tf.ones([2])]), [0], "PROD")


if __name__ == "__main__":
  absltest.main()
