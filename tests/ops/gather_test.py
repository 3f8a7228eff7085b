"""Tests for mesh_tensorflow._src.ops.gather: one_hot, gather, mtf_range.

Every op runs on the 1-device mesh, the 4-device 1-d mesh and the 2x2 mesh,
with the one-hot / vocabulary dimension split and unsplit, against numpy.
"""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mesh_test_util as mtu

BATCH = mtf.Dimension("batch", 4)
LENGTH = mtf.Dimension("length", 2)
VOCAB = mtf.Dimension("vocab", 8)
HIDDEN = mtf.Dimension("hidden", 4)

# (mesh_shape, layout): nothing split, one dim split (vocab or not), two dims.
MESH_LAYOUTS = [
    ("", ""),
    ("all:4", ""),
    ("all:4", "vocab:all"),
    ("all:4", "batch:all"),
    ("rows:2;cols:2", "vocab:rows"),
    ("rows:2;cols:2", "batch:rows;vocab:cols"),
    ("rows:2;cols:2", "vocab:rows;hidden:cols"),
    ("rows:2;cols:2", "batch:cols;hidden:rows"),
]
_IDS = ["%s|%s" % ml for ml in MESH_LAYOUTS]

_RNG = np.random.RandomState(0)
# Includes out-of-range indices (-1 and 8): one_hot gives all off_value.
IDS = _RNG.randint(-1, 9, size=(4, 2)).astype(np.int32)
IDS[0, 0], IDS[0, 1] = -1, 8
IDS_IN_RANGE = _RNG.randint(0, 8, size=(4, 2)).astype(np.int32)
W = _RNG.uniform(-1.0, 1.0, size=(8, 4)).astype(np.float32)
DY = _RNG.uniform(-1.0, 1.0, size=(4, 2, 4)).astype(np.float32)


def _np_one_hot(ids, depth, on=1.0, off=0.0):
  return np.where(ids[..., None] == np.arange(depth), on, off)


@pytest.mark.parametrize("mesh_shape,layout", MESH_LAYOUTS, ids=_IDS)
def test_one_hot_matches_numpy(mesh_shape, layout):
  def build(mesh):
    ids = mtf.import_tf_tensor(mesh, IDS, [BATCH, LENGTH])
    ids64 = mtf.cast(ids, tf.int64)
    return [
        mtf.one_hot(ids, VOCAB),
        mtf.one_hot(ids64, VOCAB, on_value=3, off_value=-1, dtype=tf.int32),
        mtf.one_hot(ids, VOCAB, on_value=0.5, off_value=0.25,
                    dtype=tf.bfloat16),
    ]
  a, b, c = mtu.run_program(build, mesh_shape, layout)
  assert a.dtype == np.float32 and a.shape == (4, 2, 8)
  np.testing.assert_array_equal(a, _np_one_hot(IDS, 8))
  assert b.dtype == np.int32
  np.testing.assert_array_equal(b, _np_one_hot(IDS, 8, 3, -1))
  np.testing.assert_array_equal(c.astype(np.float32),
                                _np_one_hot(IDS, 8, 0.5, 0.25))


def test_one_hot_shape_and_no_gradient():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  ids = mtf.import_tf_tensor(mesh, IDS, [BATCH, LENGTH])
  y = mtf.one_hot(ids, VOCAB, name="my_one_hot")
  assert y.shape == mtf.Shape([BATCH, LENGTH, VOCAB])
  assert isinstance(y.operation, mtf.OneHotOperation)
  assert not y.operation.has_gradient
  assert "vocab" in y.operation.splittable_dims


def test_one_hot_rejects_float_indices_naming_the_tensor():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.import_tf_tensor(mesh, IDS.astype(np.float32), [BATCH, LENGTH],
                           name="float_ids")
  with pytest.raises(ValueError, match="float_ids.*integer"):
    mtf.one_hot(x, VOCAB)


def test_one_hot_rejects_existing_dimension():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  ids = mtf.import_tf_tensor(mesh, IDS, [BATCH, LENGTH])
  with pytest.raises(ValueError, match="length"):
    mtf.one_hot(ids, LENGTH)


@pytest.mark.parametrize("mesh_shape,layout", MESH_LAYOUTS, ids=_IDS)
def test_gather_values_and_gradient(mesh_shape, layout):
  def build(mesh):
    w = mtf.import_tf_tensor(mesh, W, [VOCAB, HIDDEN])
    ids = mtf.import_tf_tensor(mesh, IDS_IN_RANGE, [BATCH, LENGTH])
    y = mtf.gather(w, ids, VOCAB)
    dy = mtf.import_tf_tensor(mesh, DY, [BATCH, LENGTH, HIDDEN])
    [dw] = mtf.gradients([y], [w], grad_ys=[dy])
    return [y, dw]
  y, dw = mtu.run_program(build, mesh_shape, layout)
  np.testing.assert_allclose(y, W[IDS_IN_RANGE], rtol=1e-6)
  expected_dw = np.zeros_like(W)
  np.add.at(expected_dw, IDS_IN_RANGE, DY)
  np.testing.assert_allclose(dw, expected_dw, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", mtu.MODES)
def test_gather_modes_with_split_vocab(mode):
  def build(mesh):
    w = mtf.import_tf_tensor(mesh, W, [VOCAB, HIDDEN])
    ids = mtf.import_tf_tensor(mesh, IDS_IN_RANGE, [BATCH, LENGTH])
    y = mtf.gather(w, ids, VOCAB)
    [dw] = mtf.gradients([y], [w])
    return [y, dw, mtf.one_hot(ids, VOCAB), mtf.mtf_range(mesh, VOCAB,
                                                          tf.int32)]
  y, dw, oh, r = mtu.run_program(build, "rows:2;cols:2",
                                 "batch:rows;vocab:cols", mode)
  np.testing.assert_allclose(y, W[IDS_IN_RANGE], rtol=1e-6)
  expected_dw = np.zeros_like(W)
  np.add.at(expected_dw, IDS_IN_RANGE, np.ones_like(DY))
  np.testing.assert_allclose(dw, expected_dw, rtol=1e-6)
  np.testing.assert_array_equal(oh, _np_one_hot(IDS_IN_RANGE, 8))
  np.testing.assert_array_equal(r, np.arange(8))


@pytest.mark.parametrize("mesh_shape,layout", MESH_LAYOUTS, ids=_IDS)
def test_gather_variants(mesh_shape, layout):
  w_int = (W * 100).astype(np.int32)
  w_bool = W > 0
  per_batch = _RNG.uniform(-1, 1, size=(4, 8)).astype(np.float32)
  ids_b = np.array([7, 0, 3, 5], np.int32)

  def build(mesh):
    w = mtf.import_tf_tensor(mesh, W, [VOCAB, HIDDEN])
    ids = mtf.import_tf_tensor(mesh, IDS_IN_RANGE, [BATCH, LENGTH])
    return [
        mtf.gather(w, 5, VOCAB),  # Python int index -> one row.
        mtf.gather(mtf.import_tf_tensor(mesh, w_int, [VOCAB, HIDDEN]), ids,
                   VOCAB),
        mtf.gather(mtf.import_tf_tensor(mesh, w_bool, [VOCAB, HIDDEN]), ids,
                   VOCAB),
        mtf.gather(w, ids, VOCAB, output_shape=[HIDDEN, LENGTH, BATCH]),
        # Shared batch dim: out[b] = per_batch[b, ids_b[b]].
        mtf.gather(mtf.import_tf_tensor(mesh, per_batch, [BATCH, VOCAB]),
                   mtf.import_tf_tensor(mesh, ids_b, [BATCH]), VOCAB),
    ]
  row, g_int, g_bool, g_t, g_b = mtu.run_program(build, mesh_shape, layout)
  np.testing.assert_allclose(row, W[5], rtol=1e-6)
  assert g_int.dtype == np.int32
  np.testing.assert_array_equal(g_int, w_int[IDS_IN_RANGE])
  assert g_bool.dtype == np.bool_
  np.testing.assert_array_equal(g_bool, w_bool[IDS_IN_RANGE])
  np.testing.assert_allclose(g_t, W[IDS_IN_RANGE].transpose(2, 1, 0),
                             rtol=1e-6)
  np.testing.assert_allclose(g_b, per_batch[np.arange(4), ids_b], rtol=1e-6)


def test_gather_errors():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  w = mtf.import_tf_tensor(mesh, W, [VOCAB, HIDDEN])
  ids = mtf.import_tf_tensor(mesh, IDS_IN_RANGE, [BATCH, LENGTH])
  with pytest.raises(ValueError, match="batch"):
    mtf.gather(w, ids, BATCH)
  with pytest.raises(ValueError, match="indices"):
    mtf.gather(w, [1, 2], VOCAB)


@pytest.mark.parametrize("split", [False, True])
def test_gather_communicates_only_when_vocab_is_split(split):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  w = mtf.import_tf_tensor(mesh, W, [VOCAB, HIDDEN])
  ids = mtf.import_tf_tensor(mesh, IDS_IN_RANGE, [BATCH, LENGTH])
  y = mtf.gather(w, ids, VOCAB)
  layout = "vocab:all" if split else "batch:all"
  lowering = mtf.Lowering(graph, {mesh: mtu.mesh_impl_for("all:4", layout)})
  np.testing.assert_allclose(np.asarray(lowering.export_to_tf_tensor(y)),
                             W[IDS_IN_RANGE], rtol=1e-6)
  allreduces = [k for k, _ in lowering.counters if k.startswith("allreduce")]
  assert bool(allreduces) == split


@pytest.mark.parametrize("mesh_shape,layout", [
    ("", ""), ("all:4", "vocab:all"), ("rows:2;cols:2", "vocab:cols"),
    ("rows:2;cols:2", "batch:rows;vocab:cols")], ids=str)
def test_range_matches_numpy(mesh_shape, layout):
  def build(mesh):
    return [mtf.mtf_range(mesh, VOCAB, dtype)
            for dtype in (tf.int32, tf.int64, tf.float32, tf.bfloat16)] + [
                mtf.mtf_range(mesh, BATCH, tf.float32, name="batch_range")]
  outs = mtu.run_program(build, mesh_shape, layout)
  for out, dtype in zip(outs, (np.int32, np.int64, np.float32)):
    assert out.dtype == dtype
    np.testing.assert_array_equal(out, np.arange(8))
  assert outs[3].dtype == tf.bfloat16.as_numpy_dtype
  np.testing.assert_array_equal(outs[3].astype(np.float32), np.arange(8))
  np.testing.assert_array_equal(outs[4], np.arange(4))


def test_range_operation_properties():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  r = mtf.mtf_range(mesh, VOCAB, tf.int32, name="positions")
  assert isinstance(r.operation, mtf.RangeOperation)
  assert r.shape == mtf.Shape([VOCAB])
  assert r.dtype == tf.int32
  assert r.operation.name == "positions"
  assert not r.operation.has_gradient


class _TensorPnumMeshImpl(mtf.placement_mesh_impl.PlacementMeshImpl):
  """Processor numbers as int tensors, as a SIMD backend provides them."""

  def laid_out_pnum(self):
    return self.LaidOutTensor([tf.constant(p) for p in range(self.size)])


def test_tensor_processor_numbers():
  """The int-tensor branches (pcoord / slice begin as tensors) agree."""
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  ids = mtf.import_tf_tensor(mesh, IDS, [BATCH, LENGTH])
  w = mtf.import_tf_tensor(mesh, W, [VOCAB, HIDDEN])
  outs = [mtf.one_hot(ids, VOCAB), mtf.gather(w, ids, VOCAB),
          mtf.mtf_range(mesh, VOCAB, tf.float32)]
  impl = _TensorPnumMeshImpl("rows:2;cols:2", "batch:rows;vocab:cols",
                             mtu.DEVICES[:4])
  lowering = mtf.Lowering(graph, {mesh: impl})
  oh, g, r = [np.asarray(lowering.export_to_tf_tensor(t)) for t in outs]
  np.testing.assert_array_equal(oh, _np_one_hot(IDS, 8))
  # Out-of-range ids gather zeros.
  np.testing.assert_allclose(g, _np_one_hot(IDS, 8) @ W, rtol=1e-6)
  np.testing.assert_array_equal(r, np.arange(8))
