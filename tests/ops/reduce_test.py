"""Tests for mesh_tensorflow._src.ops.reduce: reductions and softmax."""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow._src.laid_out import LazyAllreduceSum
from mesh_tensorflow._src.ops import softmax as softmax_lib
from tests import mesh_test_util as mtu
from tests import meshes

A = mtf.Dimension("a", 4)
B = mtf.Dimension("b", 8)
C = mtf.Dimension("c", 2)
SHAPE = [A, B, C]


_RNG = np.random.RandomState(2)
X = _RNG.randn(4, 8, 2).astype(np.float32)
# Values with ties for max/min gradients.
X_TIES = np.round(_RNG.randn(4, 8, 2)).astype(np.float32)
BOOLS = _RNG.rand(4, 8, 2) > 0.3


def _reduce_program(mesh):
  x = mtf.import_tf_tensor(mesh, X, SHAPE)
  bools = mtf.import_tf_tensor(mesh, BOOLS, SHAPE)
  outs = [
    mtf.reduce_sum(x),
    mtf.reduce_sum(x, output_shape=[A]),
    mtf.reduce_sum(x, output_shape=[C, A]),  # transposed order
    mtf.reduce_sum(x, reduced_dim=B),
    mtf.reduce_sum(x, output_shape=[C, B]),
    mtf.reduce_mean(x),
    mtf.reduce_mean(x, output_shape=[B]),
    mtf.reduce_mean(x, reduced_dim=A),
    mtf.reduce_max(x),
    mtf.reduce_max(x, output_shape=[C, A]),
    mtf.reduce_max(x, reduced_dim=B),
    mtf.reduce_min(x, output_shape=[B]),
    mtf.reduce_min(x, reduced_dim=C),
    mtf.reduce_all(bools),
    mtf.reduce_all(bools, output_shape=[A]),
    mtf.reduce_any(bools, output_shape=[C, B]),
    mtf.reduce_any(bools, reduced_dim=B),
    mtf.reduce_sum(x, output_shape=[A, C], reduced_dim=B),
    mtf.reduce_max(x, output_shape=[C, A], reduced_dim=B),
  ]
  return outs


def _reduce_expected():
  x, bools = X, BOOLS
  return [
    x.sum(),
    x.sum((1, 2)),
    x.sum(1).T,
    x.sum(1),
    x.sum(0).T,
    x.mean(),
    x.mean((0, 2)),
    x.mean(0),
    x.max(),
    x.max(1).T,
    x.max(1),
    x.min((0, 2)),
    x.min(2),
    bools.all(),
    bools.all((1, 2)),
    bools.any(0).T,
    bools.any(1),
    x.sum(1),
    x.max(1).T,
  ]


def _check_reduce_shapes(outs):
  want = [
    [],
    ["a"],
    ["c", "a"],
    ["a", "c"],
    ["c", "b"],
    [],
    ["b"],
    ["b", "c"],
    [],
    ["c", "a"],
    ["a", "c"],
    ["b"],
    ["a", "b"],
    [],
    ["a"],
    ["c", "b"],
    ["a", "c"],
    ["a", "c"],
    ["c", "a"],
  ]
  assert [o.shape.dimension_names for o in outs] == want
  assert outs[13].dtype == tf.bool and outs[16].dtype == tf.bool


@meshes.parametrize(meshes.REDUCE_OPS, "mesh_layout")
def test_reduce_values(mesh_layout):
  def build(mesh):
    outs = _reduce_program(mesh)
    _check_reduce_shapes(outs)
    return outs

  got = mtu.run_program(build, *mesh_layout)
  mtu.assert_all_close(got, _reduce_expected(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", mtu.MODES)
def test_reduce_three_modes(mode):
  got = mtu.run_program(_reduce_program, "rows:2;cols:2", "a:rows;b:cols", mode)
  mtu.assert_all_close(got, _reduce_expected(), rtol=1e-5, atol=1e-5)


def test_reduce_to_same_shape_is_identity():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.import_tf_tensor(mesh, X, SHAPE)
  for fn in (mtf.reduce_sum, mtf.reduce_mean, mtf.reduce_max, mtf.reduce_min):
    assert fn(x, output_shape=SHAPE) is x


def test_scalar_default_and_operation_fields():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.import_tf_tensor(mesh, X, SHAPE)
  y = mtf.reduce_sum(x)
  assert y.shape == mtf.Shape([])
  assert isinstance(y.operation, mtf.ReduceOperation)
  assert y.operation.reduction_fn_string == "SUM"
  assert mtf.reduce_max(x).operation.reduction_fn_string == "MAX"
  assert mtf.reduce_min(x).operation.reduction_fn_string == "MIN"
  assert mtf.reduce_sum(x, name="total").operation.name == "total"
  assert mtf.reduction_fn("SUM") is tf.reduce_sum
  with pytest.raises(ValueError, match="PROD"):
    mtf.reduction_fn("PROD")


# Gradients.


def _grad_program(mesh):
  x = mtf.import_tf_tensor(mesh, X, SHAPE)
  t = mtf.import_tf_tensor(mesh, X_TIES, SHAPE)
  w_ac = mtf.import_tf_tensor(mesh, X[:, 0, :].copy(), [A, C])
  w_b = mtf.import_tf_tensor(mesh, X[0, :, 0].copy(), [B])
  loss = (
    mtf.reduce_sum(mtf.reduce_sum(x, reduced_dim=B) * w_ac)
    + mtf.reduce_sum(mtf.reduce_mean(x, output_shape=[B]) * w_b)
    + mtf.reduce_sum(x * x) * 0.5
  )
  loss_max = mtf.reduce_sum(mtf.reduce_max(t, output_shape=[C, A]) * w_ac)
  loss_min = mtf.reduce_sum(mtf.reduce_min(t, output_shape=[B]) * w_b)
  return mtf.gradients([loss], [x]) + mtf.gradients([loss_max + loss_min], [t])


def _grad_expected():
  w_ac = X[:, 0, :]
  w_b = X[0, :, 0]
  dx = w_ac[:, None, :] + w_b[None, :, None] / 8.0 + X
  t = X_TIES
  max_mask = (t == t.max(1, keepdims=True)).astype(np.float32)
  min_mask = (t == t.min((0, 2), keepdims=True)).astype(np.float32)
  dt = max_mask * w_ac[:, None, :] + min_mask * w_b[None, :, None]
  return [dx, dt]


@meshes.parametrize(meshes.REDUCE_OPS, "mesh_layout")
def test_reduce_gradients(mesh_layout):
  got = mtu.run_program(_grad_program, *mesh_layout)
  mtu.assert_all_close(got, _grad_expected(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", mtu.MODES)
def test_reduce_gradients_three_modes(mode):
  got = mtu.run_program(_grad_program, "rows:2;cols:2", "b:rows;c:cols", mode)
  mtu.assert_all_close(got, _grad_expected(), rtol=1e-5, atol=1e-5)


# logsumexp / softmax.


def _softmax_reference(x, axis, extra_logit=None):
  x = x.astype(np.float64)
  if extra_logit is None:
    lse = np.log(np.exp(x).sum(axis))
  else:
    extra = np.broadcast_to(extra_logit, np.delete(x.shape, axis)).astype(
      np.float64
    )
    lse = np.log(np.exp(x).sum(axis) + np.exp(extra))
  log_sm = x - np.expand_dims(lse, axis)
  return lse, log_sm, np.exp(log_sm)


@meshes.parametrize(meshes.REDUCE_OPS, "mesh_layout")
def test_logsumexp_softmax(mesh_layout):
  big = X * 30.0  # needs the max-subtraction for stability in float32
  extra = X[:, 0, :].copy()

  def build(mesh):
    x = mtf.import_tf_tensor(mesh, big, SHAPE)
    e = mtf.import_tf_tensor(mesh, extra, [A, C])
    outs = [
      mtf.reduce_logsumexp(x, B),
      mtf.log_softmax(x, B),
      mtf.softmax(x, B),
      mtf.reduce_logsumexp(x, A),
      mtf.softmax(x, A),
      mtf.reduce_logsumexp(x, B, extra_logit=0.0),
      mtf.log_softmax(x, B, extra_logit=0.0),
      mtf.softmax(x, B, extra_logit=0.0),
      mtf.softmax(x, B, extra_logit=e),
    ]
    # The result of reduce_logsumexp has the reduced shape.
    assert outs[0].shape == mtf.Shape([A, C])
    assert outs[1].shape == x.shape and outs[2].shape == x.shape
    return outs

  got = mtu.run_program(build, *mesh_layout)
  lse_b, log_sm_b, sm_b = _softmax_reference(big, 1)
  lse_a, _, sm_a = _softmax_reference(big, 0)
  lse_e, log_sm_e, sm_e = _softmax_reference(big, 1, 0.0)
  _, _, sm_t = _softmax_reference(big, 1, extra)
  want = [lse_b, log_sm_b, sm_b, lse_a, sm_a, lse_e, log_sm_e, sm_e, sm_t]
  mtu.assert_all_close(got, want, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(got[2].sum(1), 1.0, rtol=1e-5)


@meshes.parametrize(meshes.REDUCE_OPS, "mesh_layout")
def test_softmax_gradients(mesh_layout):
  w = X[::-1].copy()

  def build(mesh):
    x = mtf.import_tf_tensor(mesh, X, SHAPE)
    wt = mtf.import_tf_tensor(mesh, w, SHAPE)
    loss = (
      mtf.reduce_sum(mtf.softmax(x, B) * wt)
      + mtf.reduce_sum(mtf.log_softmax(x, A, extra_logit=1.0) * wt)
      + mtf.reduce_sum(mtf.reduce_logsumexp(x, C))
    )
    return mtf.gradients([loss], [x])

  [got] = mtu.run_program(build, *mesh_layout)
  x = tf.constant(X)
  with tf.GradientTape() as tape:
    tape.watch(x)
    loss = (
      tf.reduce_sum(tf.nn.softmax(x, axis=1) * w)
      + tf.reduce_sum(
        (
          x
          - tf.math.log(
            tf.reduce_sum(tf.exp(x), 0, keepdims=True) + tf.exp(1.0)
          )
        )
        * w
      )
      + tf.reduce_sum(tf.reduce_logsumexp(x, axis=2))
    )
  np.testing.assert_allclose(
    got, tape.gradient(loss, x).numpy(), rtol=1e-4, atol=1e-5
  )


@pytest.mark.parametrize("mode", mtu.MODES)
@meshes.parametrize(meshes.REDUCE_OPS, "mesh_layout")
def test_softmax_equals_exp_log_softmax(mesh_layout, mode):
  """The fused softmax (any reduced dim, split or not) and its gradient
  against exp(log_softmax(x)), the original's formulation.
  """
  w = X[::-1].copy()

  def build(mesh):
    x = mtf.import_tf_tensor(mesh, X * 10.0, SHAPE)
    wt = mtf.import_tf_tensor(mesh, w, SHAPE)
    outs = []
    for dim in (A, B, C):
      fused = mtf.softmax(x, dim)
      composite = mtf.exp(mtf.log_softmax(x, dim))
      assert isinstance(fused.operation, softmax_lib.SoftmaxOperation)
      outs += [fused, composite]
      outs += mtf.gradients([mtf.reduce_sum(fused * fused * wt)], [x])
      outs += mtf.gradients([mtf.reduce_sum(composite * composite * wt)], [x])
    return outs

  got = mtu.run_program(build, *mesh_layout, mode)
  for i in range(0, len(got), 2):
    np.testing.assert_allclose(got[i], got[i + 1], rtol=1e-5, atol=1e-6)


def test_softmax_bfloat16_and_fused_kernel():
  def build(mesh):
    x = mtf.cast(mtf.import_tf_tensor(mesh, X, SHAPE), tf.bfloat16)
    y = mtf.softmax(x, C)
    assert y.dtype == tf.bfloat16
    return [mtf.cast(y, tf.float32)]

  [got] = mtu.run_program(build, "all:4", "a:all")
  np.testing.assert_allclose(
    got, _softmax_reference(X, 2)[2], rtol=1e-2, atol=1e-2
  )

  @tf.function(autograph=False)
  def fn():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    x = mtf.import_tf_tensor(mesh, X, SHAPE)
    outs = [mtf.softmax(x, C), mtf.softmax(x, A)]
    lowering = mtf.Lowering(graph, {mesh: mtu.mesh_impl_for("", "")})
    return [lowering.export_to_tf_tensor(t) for t in outs]

  types = [op.type for op in fn.get_concrete_function().graph.get_operations()]
  # One fused kernel for the last dim; no transposes for another.
  assert types.count("Softmax") == 1 and "Transpose" not in types


@meshes.parametrize(
  [("", ""), ("all:4", "d1:all"), ("rows:2;cols:2", "d0:rows;d3:cols")]
)
def test_softmax_over_last_dim_of_six_dims(mesh_shape, layout):
  """Slices of more than 5 dims (local 2-d attention logits): the fused
  kernel must still work (TF's oneDNN softmax takes at most 5 dims).
  """
  dims = [mtf.Dimension("d%d" % i, n) for i, n in enumerate([2, 4, 1, 2, 3, 5])]
  rng = np.random.RandomState(7)
  x_np = rng.randn(*[d.size for d in dims]).astype(np.float32)
  w_np = rng.randn(*x_np.shape).astype(np.float32)

  def build(mesh):
    x = mtf.import_tf_tensor(mesh, x_np, dims)
    y = mtf.softmax(x, dims[-1])
    loss = mtf.reduce_sum(y * mtf.import_tf_tensor(mesh, w_np, dims))
    return [y] + mtf.gradients([loss], [x])

  y, dx = mtu.run_program(build, mesh_shape, layout)
  want = _softmax_reference(x_np, 5)[2]
  np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)
  dot = (w_np * want).sum(-1, keepdims=True)
  np.testing.assert_allclose(dx, want * (w_np - dot), rtol=1e-4, atol=1e-6)


def test_softmax_rejects_missing_dim():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.import_tf_tensor(mesh, X, SHAPE)
  with pytest.raises(ValueError, match="softmax.*d"):
    mtf.softmax(x, mtf.Dimension("d", 3))


# The allreduce paths and lazy sums.


def _lowering_for(build, mesh_shape, layout):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  outs = build(mesh)
  lowering = mtf.Lowering(graph, {mesh: mtu.mesh_impl_for(mesh_shape, layout)})
  return lowering, outs


def _allreduce_counters(lowering):
  return [(k, v) for k, v in lowering.counters if k.startswith("allreduce")]


@pytest.mark.parametrize(
  "mesh_shape,layout,axes",
  [
    ("all:4", "b:all", [0]),
    ("rows:2;cols:2", "b:rows", [0]),
    ("rows:2;cols:2", "b:cols", [1]),
    ("rows:2;cols:2", "b:rows;c:cols", [0, 1]),
  ],
)
def test_reduce_sum_over_split_dim_is_lazy(mesh_shape, layout, axes):
  x2 = X * 2.0 + 1.0

  def build(mesh):
    a = mtf.import_tf_tensor(mesh, X, SHAPE)
    b = mtf.import_tf_tensor(mesh, x2, SHAPE)
    sa = mtf.reduce_sum(a, output_shape=[A])
    sb = mtf.reduce_sum(b, output_shape=[A])
    return [sa, sb, sa + sb, (sa + sb) * 3.0]

  with tf.device("/cpu:0"):
    lowering, (sa, sb, total, scaled) = _lowering_for(build, mesh_shape, layout)
    for t in (sa, sb, total, scaled):
      assert isinstance(lowering.tensors[t], LazyAllreduceSum), t
      assert list(lowering.tensors[t].mesh_axes) == axes
    assert not _allreduce_counters(lowering)
    got = lowering.export_to_tf_tensor(total).numpy()
    # Exporting `total` performs exactly one allreduce (of the summed value).
    assert len(_allreduce_counters(lowering)) == 1
    assert _allreduce_counters(lowering)[0][0] == (
      "allreduce/%s/reduce_op" % axes
    )
    np.testing.assert_allclose(got, (X + x2).sum((1, 2)), rtol=1e-5)
    np.testing.assert_allclose(
      lowering.export_to_tf_tensor(scaled).numpy(),
      3 * (X + x2).sum((1, 2)),
      rtol=1e-5,
    )


def test_reduce_sum_over_unsplit_dim_is_not_lazy():
  def build(mesh):
    x = mtf.import_tf_tensor(mesh, X, SHAPE)
    return [mtf.reduce_sum(x, output_shape=[B])]

  lowering, (y,) = _lowering_for(build, "all:4", "b:all")
  assert not isinstance(lowering.tensors[y], LazyAllreduceSum)
  np.testing.assert_allclose(
    lowering.export_to_tf_tensor(y).numpy(), X.sum((0, 2)), rtol=1e-5
  )


def test_reduce_max_allreduces_immediately():
  def build(mesh):
    x = mtf.import_tf_tensor(mesh, X, SHAPE)
    return [
      mtf.reduce_max(x, output_shape=[A]),
      mtf.reduce_min(x, output_shape=[C]),
    ]

  lowering, (y, z) = _lowering_for(build, "rows:2;cols:2", "a:rows;b:cols")
  keys = [k for k, _ in _allreduce_counters(lowering)]
  assert keys == ["allreduce/[1]/reduce_op", "allreduce/[0, 1]/reduce_op"]
  np.testing.assert_allclose(
    lowering.export_to_tf_tensor(y).numpy(), X.max((1, 2))
  )
  np.testing.assert_allclose(
    lowering.export_to_tf_tensor(z).numpy(), X.min((0, 1))
  )


@meshes.parametrize(
  [
    ("all:4", "b:all"),
    ("rows:2;cols:2", "b:rows;c:cols"),
    ("rows:2;cols:2", "a:rows;b:cols"),
    ("rows:2;cols:2", "b:cols"),
  ]
)
def test_reduce_over_lazy_einsum_result(mesh_shape, layout):
  w_value = _RNG.randn(8, 2).astype(np.float32)

  def build(mesh):
    x = mtf.import_tf_tensor(mesh, X, SHAPE)
    w = mtf.import_tf_tensor(mesh, w_value, [B, C])
    # Contracts b (split) -> a lazy sum over b's mesh axis.
    y = mtf.einsum([x, w], output_shape=[A, C])
    # Then a sum over c: both allreduces fuse into one.
    return [
      y,
      mtf.reduce_sum(y, output_shape=[A]),
      mtf.reduce_sum(y),
      mtf.reduce_max(y, output_shape=[A]),
    ]

  lowering, (y, s_a, s, m) = _lowering_for(build, mesh_shape, layout)
  want_y = np.einsum("abc,bc->ac", X, w_value)
  for t, want in (
    (s_a, want_y.sum(1)),
    (s, want_y.sum()),
    (m, want_y.max(1)),
    (y, want_y),
  ):
    np.testing.assert_allclose(
      lowering.export_to_tf_tensor(t).numpy(), want, rtol=1e-4, atol=1e-4
    )
  lazy = lowering.tensors[s_a]
  assert isinstance(lazy, LazyAllreduceSum)
  mesh_impl = lowering.mesh_impl(y)
  want_axes = sorted(
    {mesh_impl.tensor_dimension_to_mesh_axis(d) for d in (B, C)} - {None}
  )
  assert list(lazy.mesh_axes) == want_axes


def test_lazy_sums_values_on_all_meshes():
  def build(mesh):
    a = mtf.import_tf_tensor(mesh, X, SHAPE)
    b = mtf.import_tf_tensor(mesh, X * X, SHAPE)
    w = mtf.import_tf_tensor(mesh, X[0].copy(), [B, C])
    e = mtf.einsum([a, w], output_shape=[A])
    return [
      mtf.reduce_sum(a, output_shape=[A])
      + mtf.reduce_sum(b, output_shape=[A])
      + e,
      mtf.reduce_sum(e) - mtf.reduce_sum(a),
    ]

  want = [
    (X + X * X).sum((1, 2)) + np.einsum("abc,bc->a", X, X[0]),
    np.einsum("abc,bc->", X, X[0]) - X.sum(),
  ]
  for mesh_layout in meshes.REDUCE_OPS:
    got = mtu.run_program(build, *mesh_layout)
    mtu.assert_all_close(got, want, rtol=1e-4, atol=1e-4, msg=str(mesh_layout))


# Errors.


def test_positional_output_shape_raises_type_error():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.import_tf_tensor(mesh, X, SHAPE)
  for fn in (
    mtf.reduce_sum,
    mtf.reduce_mean,
    mtf.reduce_max,
    mtf.reduce_min,
    mtf.reduce_all,
    mtf.reduce_any,
  ):
    with pytest.raises(TypeError):
      fn(x, [A])


def test_reduced_dim_not_in_x_raises():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.import_tf_tensor(mesh, X, SHAPE)
  d = mtf.Dimension("d", 3)
  for fn in (mtf.reduce_sum, mtf.reduce_mean, mtf.reduce_max, mtf.reduce_min):
    with pytest.raises(ValueError, match="'d'"):
      fn(x, reduced_dim=d)
  with pytest.raises(ValueError, match="'b'"):
    mtf.reduce_sum(x, reduced_dim=mtf.Dimension("b", 3))


def test_output_dim_not_in_x_raises():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.import_tf_tensor(mesh, X, SHAPE)
  for fn in (mtf.reduce_sum, mtf.reduce_mean, mtf.reduce_max, mtf.reduce_min):
    with pytest.raises(ValueError, match="'z'"):
      fn(x, output_shape=[A, mtf.Dimension("z", 2)])
    with pytest.raises(ValueError, match="'a'"):
      fn(x, output_shape=[mtf.Dimension("a", 3)])


def test_output_shape_and_reduced_dim_must_agree():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.import_tf_tensor(mesh, X, SHAPE)
  with pytest.raises(ValueError, match="reduced_dim"):
    mtf.reduce_sum(x, output_shape=[A], reduced_dim=B)
