"""Tests for mesh_tensorflow._src.ops.gather: one_hot, gather, mtf_range.

Every op runs on the 1-device mesh, the 4-device 1-d mesh and the 2x2 mesh,
with the one-hot / vocabulary dimension split and unsplit, against numpy.
"""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mesh_test_util as mtu
from tests import meshes

BATCH = mtf.Dimension("batch", 4)
LENGTH = mtf.Dimension("length", 2)
VOCAB = mtf.Dimension("vocab", 8)
HIDDEN = mtf.Dimension("hidden", 4)


_RNG = np.random.RandomState(0)
# Includes out-of-range indices (-1 and 8): one_hot gives all off_value.
IDS = _RNG.randint(-1, 9, size=(4, 2)).astype(np.int32)
IDS[0, 0], IDS[0, 1] = -1, 8
IDS_IN_RANGE = _RNG.randint(0, 8, size=(4, 2)).astype(np.int32)
W = _RNG.uniform(-1.0, 1.0, size=(8, 4)).astype(np.float32)
DY = _RNG.uniform(-1.0, 1.0, size=(4, 2, 4)).astype(np.float32)


def _np_one_hot(ids, depth, on=1.0, off=0.0):
  return np.where(ids[..., None] == np.arange(depth), on, off)


@meshes.parametrize(meshes.ONE_HOT_GATHER)
def test_one_hot_matches_numpy(mesh_shape, layout):
  def build(mesh):
    ids = mtf.import_tf_tensor(mesh, IDS, [BATCH, LENGTH])
    ids64 = mtf.cast(ids, tf.int64)
    return [
      mtf.one_hot(ids, VOCAB),
      mtf.one_hot(ids64, VOCAB, on_value=3, off_value=-1, dtype=tf.int32),
      mtf.one_hot(ids, VOCAB, on_value=0.5, off_value=0.25, dtype=tf.bfloat16),
    ]

  a, b, c = mtu.run_program(build, mesh_shape, layout)
  assert a.dtype == np.float32 and a.shape == (4, 2, 8)
  np.testing.assert_array_equal(a, _np_one_hot(IDS, 8))
  assert b.dtype == np.int32
  np.testing.assert_array_equal(b, _np_one_hot(IDS, 8, 3, -1))
  np.testing.assert_array_equal(
    c.astype(np.float32), _np_one_hot(IDS, 8, 0.5, 0.25)
  )


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
  x = mtf.import_tf_tensor(
    mesh, IDS.astype(np.float32), [BATCH, LENGTH], name="float_ids"
  )
  with pytest.raises(ValueError, match="float_ids.*integer"):
    mtf.one_hot(x, VOCAB)


def test_one_hot_rejects_existing_dimension():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  ids = mtf.import_tf_tensor(mesh, IDS, [BATCH, LENGTH])
  with pytest.raises(ValueError, match="length"):
    mtf.one_hot(ids, LENGTH)


@meshes.parametrize(meshes.ONE_HOT_GATHER)
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
    return [
      y,
      dw,
      mtf.one_hot(ids, VOCAB),
      mtf.mtf_range(mesh, VOCAB, tf.int32),
    ]

  y, dw, oh, r = mtu.run_program(
    build, "rows:2;cols:2", "batch:rows;vocab:cols", mode
  )
  np.testing.assert_allclose(y, W[IDS_IN_RANGE], rtol=1e-6)
  expected_dw = np.zeros_like(W)
  np.add.at(expected_dw, IDS_IN_RANGE, np.ones_like(DY))
  np.testing.assert_allclose(dw, expected_dw, rtol=1e-6)
  np.testing.assert_array_equal(oh, _np_one_hot(IDS_IN_RANGE, 8))
  np.testing.assert_array_equal(r, np.arange(8))


@meshes.parametrize(meshes.ONE_HOT_GATHER)
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
      mtf.gather(
        mtf.import_tf_tensor(mesh, w_int, [VOCAB, HIDDEN]), ids, VOCAB
      ),
      mtf.gather(
        mtf.import_tf_tensor(mesh, w_bool, [VOCAB, HIDDEN]), ids, VOCAB
      ),
      mtf.gather(w, ids, VOCAB, output_shape=[HIDDEN, LENGTH, BATCH]),
      # Shared batch dim: out[b] = per_batch[b, ids_b[b]].
      mtf.gather(
        mtf.import_tf_tensor(mesh, per_batch, [BATCH, VOCAB]),
        mtf.import_tf_tensor(mesh, ids_b, [BATCH]),
        VOCAB,
      ),
    ]

  row, g_int, g_bool, g_t, g_b = mtu.run_program(build, mesh_shape, layout)
  np.testing.assert_allclose(row, W[5], rtol=1e-6)
  assert g_int.dtype == np.int32
  np.testing.assert_array_equal(g_int, w_int[IDS_IN_RANGE])
  assert g_bool.dtype == np.bool_
  np.testing.assert_array_equal(g_bool, w_bool[IDS_IN_RANGE])
  np.testing.assert_allclose(g_t, W[IDS_IN_RANGE].transpose(2, 1, 0), rtol=1e-6)
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
  np.testing.assert_allclose(
    np.asarray(lowering.export_to_tf_tensor(y)), W[IDS_IN_RANGE], rtol=1e-6
  )
  allreduces = [k for k, _ in lowering.counters if k.startswith("allreduce")]
  assert bool(allreduces) == split


@meshes.parametrize(
  [
    ("", ""),
    ("all:4", "vocab:all"),
    ("rows:2;cols:2", "vocab:cols"),
    ("rows:2;cols:2", "batch:rows;vocab:cols"),
  ]
)
def test_range_matches_numpy(mesh_shape, layout):
  def build(mesh):
    return [
      mtf.mtf_range(mesh, VOCAB, dtype)
      for dtype in (tf.int32, tf.int64, tf.float32, tf.bfloat16)
    ] + [mtf.mtf_range(mesh, BATCH, tf.float32, name="batch_range")]

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
  outs = [
    mtf.one_hot(ids, VOCAB),
    mtf.gather(w, ids, VOCAB),
    mtf.mtf_range(mesh, VOCAB, tf.float32),
  ]
  impl = _TensorPnumMeshImpl(
    "rows:2;cols:2", "batch:rows;vocab:cols", mtu.DEVICES[:4]
  )
  lowering = mtf.Lowering(graph, {mesh: impl})
  oh, g, r = [np.asarray(lowering.export_to_tf_tensor(t)) for t in outs]
  np.testing.assert_array_equal(oh, _np_one_hot(IDS, 8))
  # Out-of-range ids gather zeros.
  np.testing.assert_allclose(g, _np_one_hot(IDS, 8) @ W, rtol=1e-6)
  np.testing.assert_array_equal(r, np.arange(8))


# ---------------------------------------------------------------------------
# gather lowers to tf.gather / a scatter-add when `dim` is not split, else to
# the one-hot einsum: values and gradients must equal numpy's and those of
# the one-hot einsum computed in the same program, on every layout.

EXTRA = mtf.Dimension("extra", 2)


# Per-batch tables for a gather whose weights share the batch dim with ids.
W_BATCHED = _RNG.uniform(-1.0, 1.0, size=(4, 8, 4)).astype(np.float32)
DY_EXTRA = _RNG.uniform(-1.0, 1.0, size=(4, 2, 2, 4)).astype(np.float32)


def _np_gather(w, ids):
  """w[ids] along axis 0, zeros for out-of-range ids (as one_hot @ w)."""
  valid = (ids >= 0) & (ids < w.shape[0])
  return np.where(valid[..., None], w[np.where(valid, ids, 0)], 0.0)


def _np_gather_grad(ids, dy, vocab):
  valid = (ids >= 0) & (ids < vocab)
  dw = np.zeros((vocab,) + dy.shape[ids.ndim :], dy.dtype)
  np.add.at(dw, ids[valid], dy[valid])
  return dw


def _one_hot_gather(w, ids, dim, output_shape=None):
  """The original's gather: einsum(one_hot(ids), w)."""
  return mtf.einsum(
    [mtf.one_hot(ids, dim, dtype=w.dtype), w],
    output_shape=output_shape,
    reduced_dims=[dim],
  )


def _gather_program(mesh):
  """(gathers, their one-hot twins, gradients of both) for several shapes."""
  w = mtf.import_tf_tensor(mesh, W, [VOCAB, HIDDEN])
  w_t = mtf.import_tf_tensor(mesh, W.T, [HIDDEN, VOCAB])
  w_b = mtf.import_tf_tensor(mesh, W_BATCHED, [BATCH, VOCAB, HIDDEN])
  ids = mtf.import_tf_tensor(mesh, IDS, [BATCH, LENGTH])  # Out-of-range too.
  dy = mtf.import_tf_tensor(mesh, DY, [BATCH, LENGTH, HIDDEN])
  dy_t = mtf.import_tf_tensor(
    mesh, DY.transpose(2, 1, 0), [HIDDEN, LENGTH, BATCH]
  )
  dy_extra = mtf.import_tf_tensor(
    mesh, DY_EXTRA, [BATCH, EXTRA, LENGTH, HIDDEN]
  )
  cases = [  # (weights, output_shape, dy)
    (w, None, dy),
    (w_t, [HIDDEN, LENGTH, BATCH], dy_t),  # dim not first, permuted output
    (w_b, None, dy),  # batch shared by weights and ids: a batched gather
    (w, [BATCH, EXTRA, LENGTH, HIDDEN], dy_extra),  # broadcast output dim
  ]
  outs = []
  for weights, output_shape, grad in cases:
    y = mtf.gather(weights, ids, VOCAB, output_shape=output_shape)
    y_ref = _one_hot_gather(weights, ids, VOCAB, output_shape=output_shape)
    [dw] = mtf.gradients([y], [weights], grad_ys=[grad])
    [dw_ref] = mtf.gradients([y_ref], [weights], grad_ys=[grad])
    outs += [y, y_ref, dw, dw_ref]
  return outs


@pytest.mark.parametrize("mode", mtu.MODES)
@meshes.parametrize(meshes.GATHER)
def test_gather_matches_numpy_and_one_hot_einsum(mesh_shape, layout, mode):
  outs = mtu.run_program(_gather_program, mesh_shape, layout, mode)
  expected_y = _np_gather(W, IDS)
  expected_dw = _np_gather_grad(IDS, DY, 8)
  expected_b = np.stack([_np_gather(W_BATCHED[b], IDS[b]) for b in range(4)])
  expected_dw_b = np.stack(
    [_np_gather_grad(IDS[b], DY[b], 8) for b in range(4)]
  )
  expected = [
    (expected_y, expected_dw),
    (expected_y.transpose(2, 1, 0), expected_dw.T),
    (expected_b, expected_dw_b),
    (
      np.broadcast_to(expected_y[:, None], (4, 2, 2, 4)),
      _np_gather_grad(IDS, DY_EXTRA.sum(axis=1), 8),
    ),
  ]
  for i, (y_np, dw_np) in enumerate(expected):
    y, y_ref, dw, dw_ref = outs[4 * i : 4 * i + 4]
    # Gathering copies rows: exactly the one-hot einsum's values.
    np.testing.assert_array_equal(y, y_ref, err_msg="case %d" % i)
    np.testing.assert_allclose(y, y_np, rtol=1e-6, err_msg="case %d" % i)
    np.testing.assert_allclose(
      dw, dw_ref, rtol=1e-5, atol=1e-6, err_msg="case %d" % i
    )
    np.testing.assert_allclose(
      dw, dw_np, rtol=1e-5, atol=1e-6, err_msg="case %d" % i
    )


@meshes.parametrize(
  [
    ("", ""),
    ("all:4", "batch:all"),
    ("all:4", "vocab:all"),
    ("rows:2;cols:2", "batch:rows;hidden:cols"),
  ]
)
def test_gather_dtypes_match_one_hot_einsum(mesh_shape, layout):
  w_int = (W * 100).astype(np.int32)

  def build(mesh):
    outs = []
    for ids_dtype in (tf.int64, tf.uint8):
      ids = mtf.cast(
        mtf.import_tf_tensor(mesh, IDS_IN_RANGE, [BATCH, LENGTH]), ids_dtype
      )
      for w_np, dtype in ((W, tf.bfloat16), (w_int, tf.int32)):
        w = mtf.cast(mtf.import_tf_tensor(mesh, w_np, [VOCAB, HIDDEN]), dtype)
        outs += [mtf.gather(w, ids, VOCAB), _one_hot_gather(w, ids, VOCAB)]
      w16 = mtf.cast(
        mtf.import_tf_tensor(mesh, W, [VOCAB, HIDDEN]), tf.bfloat16
      )
      dy = mtf.cast(
        mtf.import_tf_tensor(mesh, DY, [BATCH, LENGTH, HIDDEN]), tf.bfloat16
      )
      outs += mtf.gradients([mtf.gather(w16, ids, VOCAB)], [w16], grad_ys=[dy])
    return outs

  outs = mtu.run_program(build, mesh_shape, layout)
  for i in range(2):
    g16, r16, g_int, r_int, dw16 = outs[5 * i : 5 * i + 5]
    assert g16.dtype == tf.bfloat16.as_numpy_dtype
    np.testing.assert_array_equal(
      g16.astype(np.float32), r16.astype(np.float32)
    )
    assert g_int.dtype == np.int32
    np.testing.assert_array_equal(g_int, r_int)
    np.testing.assert_array_equal(g_int, w_int[IDS_IN_RANGE])
    dy16 = DY.astype(tf.bfloat16.as_numpy_dtype).astype(np.float32)
    np.testing.assert_allclose(
      dw16.astype(np.float32),
      _np_gather_grad(IDS_IN_RANGE, dy16, 8),
      rtol=2e-2,
      atol=2e-2,
    )


@meshes.parametrize(
  [
    ("", ""),
    ("all:4", "batch:all"),
    ("all:4", "vocab:all"),
    ("rows:2;cols:2", "batch:rows;hidden:cols"),
  ]
)
def test_gather_second_order_gradient(mesh_shape, layout):
  c_np = _RNG.uniform(-1.0, 1.0, size=(8, 4)).astype(np.float32)

  def build(mesh):
    w = mtf.import_tf_tensor(mesh, W, [VOCAB, HIDDEN])
    ids = mtf.import_tf_tensor(mesh, IDS, [BATCH, LENGTH])
    dy = mtf.import_tf_tensor(mesh, DY, [BATCH, LENGTH, HIDDEN])
    c = mtf.import_tf_tensor(mesh, c_np, [VOCAB, HIDDEN])
    [dw] = mtf.gradients([mtf.gather(w, ids, VOCAB)], [w], grad_ys=[dy])
    # d(sum(dw * c)) / d dy = c gathered at ids.
    return mtf.gradients([mtf.reduce_sum(dw * c)], [dy])

  [ddy] = mtu.run_program(build, mesh_shape, layout)
  np.testing.assert_allclose(ddy, _np_gather(c_np, IDS), rtol=1e-6)


@meshes.parametrize(
  [
    ("", ""),
    ("all:4", "hidden:all"),
    ("all:4", "vocab:all"),
    ("rows:2;cols:2", "batch:rows;hidden:cols"),
  ]
)
def test_gather_scalar_index_gradient(mesh_shape, layout):
  def build(mesh):
    w = mtf.import_tf_tensor(mesh, W, [VOCAB, HIDDEN])
    w_b = mtf.import_tf_tensor(mesh, W_BATCHED, [BATCH, VOCAB, HIDDEN])
    index = mtf.import_tf_tensor(mesh, np.int32(3), [])
    outs = []
    for y, x in (
      (mtf.gather(w, 5, VOCAB), w),
      (mtf.gather(w, index, VOCAB), w),
      (mtf.gather(w_b, index, VOCAB), w_b),
    ):
      dy = mtf.cast(mtf.range(mesh, HIDDEN, tf.int32), tf.float32) + 1.0
      outs += [y] + mtf.gradients([y * dy], [x])
    return outs

  row5, dw5, row3, dw3, rows_b, dw_b = mtu.run_program(
    build, mesh_shape, layout
  )
  dy = np.arange(1.0, 5.0, dtype=np.float32)
  np.testing.assert_array_equal(row5, W[5])
  np.testing.assert_array_equal(dw5, _np_gather_grad(np.int32(5), dy, 8))
  np.testing.assert_array_equal(row3, W[3])
  np.testing.assert_array_equal(dw3, _np_gather_grad(np.int32(3), dy, 8))
  np.testing.assert_array_equal(rows_b, W_BATCHED[:, 3])
  expected = np.zeros_like(W_BATCHED)
  expected[:, 3] = dy
  np.testing.assert_array_equal(dw_b, expected)


def _lowered_op_types(layout):
  """TF op types of gather's forward and gradient lowered in a tf.function."""

  @tf.function(autograph=False)
  def fn():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    w = mtf.import_tf_tensor(mesh, W, [VOCAB, HIDDEN])
    ids = mtf.import_tf_tensor(mesh, IDS, [BATCH, LENGTH])
    y = mtf.gather(w, ids, VOCAB)
    [dw] = mtf.gradients([y], [w])
    lowering = mtf.Lowering(graph, {mesh: mtu.mesh_impl_for("all:4", layout)})
    return [lowering.export_to_tf_tensor(t) for t in (y, dw)]

  graph = fn.get_concrete_function().graph
  return {op.type for op in graph.get_operations()}


def test_gather_lowers_to_tf_gather_unless_dim_is_split():
  unsplit = _lowered_op_types("batch:all")
  assert "GatherV2" in unsplit and "ScatterNd" in unsplit
  assert "OneHot" not in unsplit
  split = _lowered_op_types("vocab:all")
  assert "OneHot" in split
  assert "GatherV2" not in split and "ScatterNd" not in split


@pytest.mark.parametrize(
  "mesh_shape,layout,reduced",
  [
    ("all:4", "", False),
    ("all:4", "hidden:all", False),
    ("all:4", "vocab:all", False),
    ("all:4", "batch:all", True),
    ("rows:2;cols:2", "length:rows;hidden:cols", True),
  ],
  ids=str,
)
def test_gather_gradient_allreduces_only_partial_sums(
  mesh_shape, layout, reduced
):
  """The gradient sums over the processors that split the dims of ids that
  weights lack; splitting vocab or weights' other dims needs no sum.
  """
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  w = mtf.import_tf_tensor(mesh, W, [VOCAB, HIDDEN])
  ids = mtf.import_tf_tensor(mesh, IDS, [BATCH, LENGTH])
  y = mtf.gather(w, ids, VOCAB)
  dy = mtf.import_tf_tensor(mesh, DY, [BATCH, LENGTH, HIDDEN])
  [dw] = mtf.gradients([y], [w], grad_ys=[dy])
  lowering = mtf.Lowering(graph, {mesh: mtu.mesh_impl_for(mesh_shape, layout)})
  np.testing.assert_allclose(
    np.asarray(lowering.export_to_tf_tensor(dw)),
    _np_gather_grad(IDS, DY, 8),
    rtol=1e-5,
    atol=1e-6,
  )
  allreduces = [k for k, _ in lowering.counters if k.startswith("allreduce")]
  assert bool(allreduces) == reduced


def test_gather_rejects_bad_indices():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  w = mtf.import_tf_tensor(mesh, W, [VOCAB, HIDDEN])
  float_ids = mtf.import_tf_tensor(
    mesh, IDS.astype(np.float32), [BATCH, LENGTH], name="float_ids"
  )
  with pytest.raises(ValueError, match="float_ids.*integer"):
    mtf.gather(w, float_ids, VOCAB)
  vocab_ids = mtf.import_tf_tensor(mesh, np.zeros(8, np.int32), [VOCAB])
  with pytest.raises(ValueError, match="vocab"):
    mtf.gather(w, vocab_ids, VOCAB)
  with pytest.raises(ValueError, match="disagree"):
    mtf.gather(
      w,
      mtf.import_tf_tensor(mesh, IDS, [BATCH, LENGTH]),
      VOCAB,
      output_shape=[BATCH, HIDDEN],
    )
