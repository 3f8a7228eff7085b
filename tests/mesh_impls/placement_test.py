"""Tests of PlacementMeshImpl, its collectives and the MeshImpl base helpers.

Everything runs on the 8 virtual CPUs of tests/conftest.py and is compared
with numpy. Per-processor inputs are random arrays, one per pnum, so a wrong
group, order or device shows up as a wrong number.
"""

import itertools

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow._src import layout as layout_lib
from mesh_tensorflow._src import mesh_impl as mesh_impl_lib
from mesh_tensorflow._src.mesh_impls import collectives
from mesh_tensorflow._src.mesh_impls import placement

DEVICES = ["/cpu:%d" % i for i in range(8)]

MESH_2X2 = "rows:2;cols:2"
MESH_2X4 = "rows:2;cols:4"
MESH_SHAPES = [MESH_2X2, MESH_2X4]

# Mesh axes to reduce over, for 2-d meshes.
REDUCE_AXES = [[0], [1], [0, 1]]

# Sizes: small (reduce-then-broadcast), large and divisible by every group
# size (sharded), large but not divisible by the group size (fallback).
SMALL = [3, 5]
LARGE = [128, 128]  # 16384 elements: the sharded threshold exactly.
LARGE_ODD = [16385]  # >= threshold, not divisible by 2, 4 or 8.
SIZES = [SMALL, LARGE, LARGE_ODD]

NP_REDUCTIONS = {"SUM": np.sum, "MAX": np.max, "MIN": np.min}


@pytest.fixture(params=["shared", "separate"])
def memory(request, monkeypatch):
  """Runs a test as on CPUs sharing host memory, and as on separate devices.

  Virtual CPUs share host memory, where collectives compute once and copy;
  "separate" makes the backend take the paths meant for devices with their
  own memories (sharded allreduce, per-device concat).
  """
  if request.param == "separate":
    monkeypatch.setattr(collectives, "share_host_memory", lambda devices: False)
  return request.param


def _impl(mesh_shape, layout=""):
  n = mtf.convert_to_shape(mesh_shape).size
  return placement.PlacementMeshImpl(mesh_shape, layout, DEVICES[:n])


def _per_processor(impl, shape, seed=0, dtype=np.float32):
  rng = np.random.RandomState(seed)
  return [rng.randn(*shape).astype(dtype) for _ in range(impl.size)]


def _laid_out(impl, arrays):
  tensors = []
  for a, d in zip(arrays, impl.devices):
    with tf.device(d):
      tensors.append(tf.constant(a))
  return placement.LaidOutTensor(tensors)


def _device_suffix(device):
  spec = tf.DeviceSpec.from_string(device)
  return "%s:%d" % (spec.device_type.upper(), spec.device_index)


def _assert_placed(impl, laid_out):
  for pnum, t in enumerate(laid_out.tensor_list):
    assert t.device.endswith(_device_suffix(impl.devices[pnum])), (
      pnum,
      t.device,
      impl.devices[pnum],
    )


def _groups(impl, mesh_axes):
  return layout_lib.processor_groups(impl.shape, list(mesh_axes))


def _coord(impl, pnum):
  return layout_lib.pnum_to_processor_coordinates(impl.shape, pnum)


def _values(laid_out):
  return [np.asarray(t) for t in laid_out.tensor_list]


# ------------------------------------------------------------------ allreduce


@pytest.mark.parametrize("mesh_shape", MESH_SHAPES)
@pytest.mark.parametrize("mesh_axes", REDUCE_AXES)
@pytest.mark.parametrize("reduction", ["SUM", "MAX", "MIN"])
@pytest.mark.parametrize("size", SIZES, ids=["small", "large", "large_odd"])
def test_allreduce(mesh_shape, mesh_axes, reduction, size, memory):
  del memory
  impl = _impl(mesh_shape)
  xs = _per_processor(impl, size, seed=len(size) + len(mesh_axes))
  out = impl.allreduce(_laid_out(impl, xs), mesh_axes, reduction)
  _assert_placed(impl, out)
  got = _values(out)
  for group in _groups(impl, mesh_axes):
    expected = NP_REDUCTIONS[reduction](np.stack([xs[p] for p in group]), 0)
    for p in group:
      assert got[p].shape == tuple(size)
      np.testing.assert_allclose(
        got[p],
        expected,
        rtol=1e-5,
        atol=1e-5,
        err_msg="pnum %d group %s" % (p, group),
      )


def test_allreduce_no_axes_is_identity():
  impl = _impl(MESH_2X2)
  x = _laid_out(impl, _per_processor(impl, SMALL))
  assert impl.allreduce(x, [], "SUM") is x


def test_allreduce_int_dtype():
  impl = _impl(MESH_2X4)
  xs = [np.full([4], p, np.int32) for p in range(impl.size)]
  got = _values(impl.allreduce(_laid_out(impl, xs), [1], "SUM"))
  for p in range(impl.size):
    row = _coord(impl, p)[0]
    expected = sum(range(4 * row, 4 * row + 4))
    np.testing.assert_array_equal(got[p], [expected] * 4)


def test_allreduce_inside_tf_function(memory):
  del memory
  impl = _impl(MESH_2X2)
  xs = _per_processor(impl, LARGE, seed=3)

  @tf.function(autograph=False)
  def fn():
    return impl.allreduce(_laid_out(impl, xs), [0, 1], "SUM").tensor_list

  got = [np.asarray(t) for t in fn()]
  for g in got:
    np.testing.assert_allclose(g, np.sum(xs, 0), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize(
  "size,sharded", [(SMALL, False), (LARGE, True), (LARGE_ODD, False)]
)
def test_allreduce_takes_sharded_path_only_when_it_should(
  size, sharded, memory, monkeypatch
):
  """The sharded path runs (so test_allreduce covers it) exactly when meant."""
  calls = []
  real = collectives.sharded_allreduce

  def spy(xs, devices, reduction_fn_string="SUM"):
    calls.append(len(xs))
    return real(xs, devices, reduction_fn_string)

  monkeypatch.setattr(collectives, "sharded_allreduce", spy)
  impl = _impl(MESH_2X4)
  xs = _per_processor(impl, size)
  got = _values(impl.allreduce(_laid_out(impl, xs), [0, 1], "SUM"))
  np.testing.assert_allclose(got[5], np.sum(xs, 0), rtol=1e-5, atol=1e-4)
  assert calls == ([8] if sharded and memory == "separate" else [])


def test_share_host_memory():
  assert collectives.share_host_memory(DEVICES)
  assert collectives.share_host_memory(["", "/cpu:1"])
  assert collectives.share_host_memory(
    ["/job:localhost/replica:0/task:0/device:CPU:0", "/cpu:3"]
  )
  assert not collectives.share_host_memory(["/cpu:0", "/gpu:0"])
  assert not collectives.share_host_memory(["/gpu:0", "/gpu:1"])
  assert not collectives.share_host_memory(
    ["/job:worker/task:0/cpu:0", "/job:worker/task:1/cpu:0"]
  )


def test_allreduce_unknown_reduction():
  impl = _impl(MESH_2X2)
  with pytest.raises(ValueError, match="PROD"):
    impl.allreduce(_laid_out(impl, _per_processor(impl, SMALL)), [0], "PROD")


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("size", SIZES, ids=["small", "large", "large_odd"])
def test_collectives_allreduce_direct(n, size):
  xs = [
    np.random.RandomState(i).randn(*size).astype(np.float32) for i in range(n)
  ]
  devices = DEVICES[:n]
  tensors = []
  for x, d in zip(xs, devices):
    with tf.device(d):
      tensors.append(tf.constant(x))
  for reduction in ["SUM", "MAX", "MIN"]:
    out = collectives.allreduce(tensors, devices, reduction)
    assert len(out) == n
    expected = NP_REDUCTIONS[reduction](np.stack(xs), 0)
    for t, d in zip(out, devices):
      assert t.device.endswith(_device_suffix(d))
      np.testing.assert_allclose(np.asarray(t), expected, rtol=1e-5, atol=1e-4)
    paths = [collectives.reduce_then_broadcast]
    if int(np.prod(size)) % n == 0:
      paths.append(collectives.sharded_allreduce)
    for path in paths:
      for t, d in zip(path(tensors, devices, reduction), devices):
        assert t.device.endswith(_device_suffix(d))
        np.testing.assert_allclose(
          np.asarray(t), expected, rtol=1e-5, atol=1e-4
        )


def test_module_level_aliases():
  xs = [tf.constant([1.0, 2.0]), tf.constant([3.0, 4.0])]
  devices = DEVICES[:2]
  for fn in [placement.allreduce_ring, placement.allreduce_ring_single_shard]:
    for t in fn(xs, devices, "SUM"):
      np.testing.assert_allclose(np.asarray(t), [4.0, 6.0])
  for t in placement.allconcat_ring(xs, devices, 0):
    np.testing.assert_allclose(np.asarray(t), [1.0, 2.0, 3.0, 4.0])
  for fn in [placement.alltoall_ring, placement.alltoall_pointtwise]:
    out = fn(xs, devices, 0, 0)
    np.testing.assert_allclose(np.asarray(out[0]), [1.0, 3.0])
    np.testing.assert_allclose(np.asarray(out[1]), [2.0, 4.0])


# ------------------------------------------------------- allconcat / alltoall


@pytest.mark.parametrize("mesh_shape", MESH_SHAPES)
@pytest.mark.parametrize("mesh_axis", [0, 1])
@pytest.mark.parametrize("concat_axis", [0, 1, 2])
def test_allconcat(mesh_shape, mesh_axis, concat_axis, memory):
  del memory
  impl = _impl(mesh_shape)
  xs = _per_processor(impl, [2, 3, 4], seed=concat_axis)
  out = impl.allconcat(_laid_out(impl, xs), mesh_axis, concat_axis)
  _assert_placed(impl, out)
  got = _values(out)
  for group in _groups(impl, [mesh_axis]):
    expected = np.concatenate([xs[p] for p in group], concat_axis)
    for p in group:
      np.testing.assert_array_equal(got[p], expected)


def _np_alltoall(xs, split_axis, concat_axis):
  n = len(xs)
  pieces = [np.split(x, n, axis=split_axis) for x in xs]
  return [
    np.concatenate([pieces[i][j] for i in range(n)], concat_axis)
    for j in range(n)
  ]


@pytest.mark.parametrize("mesh_shape", MESH_SHAPES)
@pytest.mark.parametrize("mesh_axis", [0, 1])
@pytest.mark.parametrize(
  "split_axis,concat_axis", [(0, 1), (1, 0), (2, 0), (0, 0), (1, 1), (2, 2)]
)
def test_alltoall(mesh_shape, mesh_axis, split_axis, concat_axis):
  impl = _impl(mesh_shape)
  xs = _per_processor(impl, [8, 4, 8], seed=split_axis * 3 + concat_axis)
  out = impl.alltoall(_laid_out(impl, xs), mesh_axis, split_axis, concat_axis)
  _assert_placed(impl, out)
  got = _values(out)
  for group in _groups(impl, [mesh_axis]):
    expected = _np_alltoall([xs[p] for p in group], split_axis, concat_axis)
    for j, p in enumerate(group):
      np.testing.assert_array_equal(got[p], expected[j])


def test_alltoall_then_back_is_identity():
  impl = _impl(MESH_2X4)
  xs = _per_processor(impl, [8, 8])
  x = _laid_out(impl, xs)
  y = impl.alltoall(impl.alltoall(x, 1, 0, 1), 1, 1, 0)
  for a, b in zip(_values(y), xs):
    np.testing.assert_array_equal(a, b)


# ------------------------------------------------- receive / shift / allsplit


@pytest.mark.parametrize(
  "mesh_shape,mesh_axis,source_pcoord",
  [
    (MESH_2X2, 0, [1, 0]),
    (MESH_2X2, 1, [None, 0]),
    (MESH_2X2, 0, [None, None]),
    (MESH_2X4, 1, [3, None, 0, 0]),
    (MESH_2X4, 1, [1, 2, 3, 0]),
    (MESH_2X4, 0, [None, 0]),
  ],
)
def test_receive(mesh_shape, mesh_axis, source_pcoord):
  impl = _impl(mesh_shape)
  xs = _per_processor(impl, [2, 3])
  out = impl.receive(_laid_out(impl, xs), mesh_axis, source_pcoord)
  _assert_placed(impl, out)
  got = _values(out)
  for p in range(impl.size):
    coord = _coord(impl, p)
    source = source_pcoord[coord[mesh_axis]]
    if source is None:
      expected = np.zeros_like(xs[p])
    else:
      coord[mesh_axis] = source
      expected = xs[layout_lib.processor_coordinates_to_pnum(impl.shape, coord)]
    np.testing.assert_array_equal(got[p], expected)


@pytest.mark.parametrize("mesh_shape", MESH_SHAPES)
@pytest.mark.parametrize("mesh_axis", [0, 1])
@pytest.mark.parametrize("offset", [-5, -1, 0, 1, 2, 3, 4])
@pytest.mark.parametrize("wrap", [True, False])
def test_shift_by_n_processors(mesh_shape, mesh_axis, offset, wrap):
  impl = _impl(mesh_shape)
  xs = _per_processor(impl, [3], seed=abs(offset))
  out = impl.shift_by_n_processors(_laid_out(impl, xs), mesh_axis, offset, wrap)
  _assert_placed(impl, out)
  got = _values(out)
  n = impl.shape[mesh_axis].size
  for p in range(impl.size):
    coord = _coord(impl, p)
    source = coord[mesh_axis] - offset
    if wrap:
      source %= n
    if 0 <= source < n:
      coord[mesh_axis] = source
      expected = xs[layout_lib.processor_coordinates_to_pnum(impl.shape, coord)]
    else:
      expected = np.zeros_like(xs[p])
    np.testing.assert_array_equal(got[p], expected, err_msg="pnum %d" % p)


@pytest.mark.parametrize("mesh_shape", MESH_SHAPES)
@pytest.mark.parametrize("mesh_axis", [0, 1])
@pytest.mark.parametrize("split_axis", [0, 1])
def test_allsplit(mesh_shape, mesh_axis, split_axis):
  impl = _impl(mesh_shape)
  xs = _per_processor(impl, [8, 4])
  out = impl.allsplit(_laid_out(impl, xs), mesh_axis, split_axis)
  _assert_placed(impl, out)
  got = _values(out)
  n = impl.shape[mesh_axis].size
  for p in range(impl.size):
    piece = np.split(xs[p], n, axis=split_axis)[_coord(impl, p)[mesh_axis]]
    np.testing.assert_array_equal(got[p], piece)


def test_allsplit_with_tensor_which():
  """`which` given as int tensors (as a SIMD backend would have)."""
  impl = _impl(MESH_2X4)
  xs = _per_processor(impl, [4, 8])
  which = placement.LaidOutTensor(
    [tf.constant(3 - _coord(impl, p)[1]) for p in range(impl.size)]
  )
  got = _values(impl.allsplit(_laid_out(impl, xs), 1, 1, which=which))
  for p in range(impl.size):
    np.testing.assert_array_equal(
      got[p], np.split(xs[p], 4, axis=1)[3 - _coord(impl, p)[1]]
    )


def test_allconcat_then_allsplit_is_identity():
  impl = _impl(MESH_2X4)
  xs = _per_processor(impl, [2, 5])
  y = impl.allsplit(impl.allconcat(_laid_out(impl, xs), 1, 0), 1, 0)
  for a, b in zip(_values(y), xs):
    np.testing.assert_array_equal(a, b)


# ------------------------------------------------ processor coordinates etc.


@pytest.mark.parametrize("mesh_shape", MESH_SHAPES)
def test_laid_out_pnum_and_pcoord(mesh_shape):
  impl = _impl(mesh_shape)
  assert impl.laid_out_pnum().tensor_list == list(range(impl.size))
  for mesh_axis in range(impl.ndims):
    pcoords = impl.laid_out_pcoord(mesh_axis).tensor_list
    for p in range(impl.size):
      expected = _coord(impl, p)[mesh_axis]
      assert pcoords[p] == expected
      assert impl.pcoord(p, mesh_axis) == expected
      assert int(impl.pcoord(tf.constant(p), mesh_axis)) == expected


LAYOUT_CASES = [
  # (mesh shape, layout, tensor shape): splitting 0, 1 and 2 dims.
  (MESH_2X2, "", "a:4;b:6"),
  (MESH_2X2, "a:rows", "a:4;b:6"),
  (MESH_2X2, "b:cols", "a:4;b:6;c:3"),
  (MESH_2X2, "a:cols;b:rows", "a:4;b:6"),
  (MESH_2X2, "a:rows;c:cols", "a:4;b:3;c:2"),
  (MESH_2X4, "", "a:2;b:3"),
  (MESH_2X4, "b:cols", "a:3;b:8"),
  (MESH_2X4, "a:rows", "a:4;b:5"),
  (MESH_2X4, "a:cols;b:rows", "a:8;b:2"),
  (MESH_2X4, "b:rows;c:cols", "a:3;b:2;c:4"),
]


def _np_slice(x, begin, size):
  return x[tuple(slice(b, b + s) for b, s in zip(begin, size))]


def _mesh_dim_size(mesh_shape, name):
  shape = mtf.convert_to_shape(mesh_shape)
  return shape.dims[shape.dimension_names.index(name)].size


def _expected_split(layout, tensor_shape):
  rules = mtf.convert_to_layout_rules(layout)
  return [
    name
    for name in mtf.convert_to_shape(tensor_shape).dimension_names
    if any(t == name for t, _ in rules)
  ]


@pytest.mark.parametrize("mesh_shape,layout,tensor_shape", LAYOUT_CASES)
def test_slice_shape_begin_and_slice_num(mesh_shape, layout, tensor_shape):
  impl = _impl(mesh_shape, layout)
  shape = mtf.convert_to_shape(tensor_shape)
  mesh = mtf.convert_to_shape(mesh_shape)
  split = _expected_split(layout, tensor_shape)
  rules = dict(mtf.convert_to_layout_rules(layout))
  expected_slice = [
    d.size // _mesh_dim_size(mesh, rules[d.name]) if d.name in split else d.size
    for d in shape.dims
  ]
  assert impl.slice_shape(shape) == expected_slice
  assert impl.slice_size(shape) == int(np.prod(expected_slice))
  assert impl.laid_out_size(shape) == int(np.prod(expected_slice)) * impl.size

  begins = [impl.slice_begin(shape, p) for p in range(impl.size)]
  for p, begin in enumerate(begins):
    coord = _coord(impl, p)
    for d, b, s in zip(shape.dims, begin, expected_slice):
      if d.name in split:
        assert b == coord[mesh.dimension_names.index(rules[d.name])] * s
      else:
        assert b == 0
  # The distinct slices tile the tensor exactly.
  covered = np.zeros(shape.to_integer_list, np.int32)
  for begin in set(tuple(b) for b in begins):
    _np_slice(covered, begin, expected_slice)[...] += 1
  np.testing.assert_array_equal(covered, 1)
  assert len(set(tuple(b) for b in begins)) == int(
    np.prod([_mesh_dim_size(mesh, rules[n]) for n in split])
  )

  laid_out_begins = impl.laid_out_slice_begin(shape).tensor_list
  assert [list(b) for b in laid_out_begins] == begins
  nums = impl.laid_out_slice_num(shape).tensor_list
  for p, q in itertools.product(range(impl.size), repeat=2):
    assert (int(nums[p]) == int(nums[q])) == (begins[p] == begins[q]), (p, q)
  assert sorted(set(int(n) for n in nums)) == list(range(len(set(nums))))


@pytest.mark.parametrize("mesh_shape,layout,tensor_shape", LAYOUT_CASES)
def test_make_and_combine_slices_round_trip(mesh_shape, layout, tensor_shape):
  impl = _impl(mesh_shape, layout)
  shape = mtf.convert_to_shape(tensor_shape)
  x = np.random.RandomState(1).randn(*shape.to_integer_list).astype(np.float32)
  slices = impl.make_slices(tf.constant(x), shape)
  assert len(slices) == impl.size
  size = impl.slice_shape(shape)
  for p, s in enumerate(slices):
    np.testing.assert_array_equal(
      np.asarray(s), _np_slice(x, impl.slice_begin(shape, p), size)
    )
  for device in [None, DEVICES[3]]:
    full = impl.combine_slices(slices, shape, device=device)
    np.testing.assert_array_equal(np.asarray(full), x)
    # `device` places the concats; a replicated tensor is just slice 0.
    if device is not None and _expected_split(layout, tensor_shape):
      assert full.device.endswith(_device_suffix(device))


def test_scalar_slices_import_and_export():
  impl = _impl(MESH_2X4, "a:rows")
  slices = impl.make_slices(tf.constant(2.5), mtf.Shape([]))
  assert len(slices) == 8
  assert float(impl.combine_slices(slices, mtf.Shape([]))) == 2.5
  x = _mtf_tensor("")
  laid_out = impl.import_tf_tensor(x, tf.constant(1.5))
  _assert_placed(impl, laid_out)
  assert [float(t) for t in laid_out.tensor_list] == [1.5] * 8
  assert float(impl.export_to_tf_tensor(x, laid_out)) == 1.5


def test_slice_shape_not_divisible():
  impl = _impl(MESH_2X4, "b:cols")
  with pytest.raises(ValueError, match="'b'"):
    impl.slice_shape("a:2;b:6")


def _mtf_tensor(tensor_shape, dtype=tf.float32):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  shape = mtf.convert_to_shape(tensor_shape)
  return mtf.import_tf_tensor(
    mesh, tf.zeros(shape.to_integer_list, dtype), shape
  )


@pytest.mark.parametrize("mesh_shape,layout,tensor_shape", LAYOUT_CASES)
def test_import_export_round_trip(mesh_shape, layout, tensor_shape):
  impl = _impl(mesh_shape, layout)
  x = _mtf_tensor(tensor_shape)
  value = (
    np.random.RandomState(2).randn(*x.shape.to_integer_list).astype(np.float32)
  )
  laid_out = impl.import_tf_tensor(x, value)
  assert isinstance(laid_out, placement.LaidOutTensor)
  assert laid_out.slice_shape == impl.slice_shape(x.shape)
  assert laid_out.all_slices is laid_out.tensor_list
  assert laid_out.to_laid_out_tensor() is laid_out
  _assert_placed(impl, laid_out)
  for p, s in enumerate(laid_out.tensor_list):
    np.testing.assert_array_equal(
      np.asarray(s),
      _np_slice(value, impl.slice_begin(x.shape, p), impl.slice_shape(x.shape)),
    )
  np.testing.assert_array_equal(
    np.asarray(impl.export_to_tf_tensor(x, laid_out)), value
  )


def test_import_export_int_and_function_mode():
  impl = _impl(MESH_2X4, "a:rows;b:cols")
  x = _mtf_tensor("a:4;b:8", tf.int32)
  value = np.arange(32, dtype=np.int32).reshape(4, 8)

  @tf.function(autograph=False)
  def fn():
    laid_out = impl.import_tf_tensor(x, tf.constant(value))
    for p, t in enumerate(laid_out.tensor_list):
      assert t.device.endswith(_device_suffix(impl.devices[p]))
    return impl.export_to_tf_tensor(x, laid_out)

  np.testing.assert_array_equal(np.asarray(fn()), value)


def test_placement_needs_one_device_per_processor():
  with pytest.raises(ValueError, match="4 processors"):
    placement.PlacementMeshImpl(MESH_2X2, "", DEVICES[:3])


def test_slicewise_places_and_returns_tuples():
  impl = _impl(MESH_2X4)
  xs = _per_processor(impl, [2])
  x = _laid_out(impl, xs)
  out = impl.slicewise(lambda t, c: t * c, x, 3.0)
  _assert_placed(impl, out)
  for a, b in zip(_values(out), xs):
    np.testing.assert_allclose(a, b * 3.0)
  plus, minus = impl.slicewise(lambda t: (t + 1.0, t - 1.0), x)
  _assert_placed(impl, plus)
  _assert_placed(impl, minus)
  for a, b, c in zip(_values(plus), _values(minus), xs):
    np.testing.assert_allclose(a, c + 1.0)
    np.testing.assert_allclose(b, c - 1.0)


# ----------------------------------------------------------- random / Print


@pytest.mark.parametrize(
  "mesh_shape,layout",
  [
    (MESH_2X2, ""),
    (MESH_2X2, "a:rows"),
    (MESH_2X2, "b:cols"),
    (MESH_2X4, "a:cols"),
    (MESH_2X4, "a:cols;b:rows"),
  ],
)
def test_random_replicas_agree(mesh_shape, layout):
  impl = _impl(mesh_shape, layout)
  shape = mtf.convert_to_shape("a:8;b:6")
  tf.random.set_seed(7)
  out = impl.random(shape, tf.random.uniform, {"dtype": tf.float32})
  _assert_placed(impl, out)
  got = _values(out)
  assert list(got[0].shape) == impl.slice_shape(shape)
  begins = [tuple(impl.slice_begin(shape, p)) for p in range(impl.size)]
  for p, q in itertools.product(range(impl.size), repeat=2):
    if begins[p] == begins[q]:
      np.testing.assert_array_equal(got[p], got[q])
    else:
      assert not np.array_equal(got[p], got[q]), (p, q)
  full = np.asarray(impl.export_to_tf_tensor(_mtf_tensor(shape), out))
  assert full.shape == (8, 6)
  assert len(np.unique(full)) == full.size  # distinct slices really differ


def test_print_returns_x_unchanged(capfd):
  del capfd  # tf.print writes to the process's stderr.
  impl = _impl(MESH_2X2)
  xs = _per_processor(impl, [2, 2])
  x = _laid_out(impl, xs)
  y = impl.Print(x, [tf.constant([1, 2])], "hello")
  assert isinstance(y, placement.LaidOutTensor)
  assert len(y.tensor_list) == impl.size
  _assert_placed(impl, y)
  for a, b in zip(_values(y), xs):
    np.testing.assert_array_equal(a, b)
  # The base class only warns and returns x itself.
  assert mesh_impl_lib.MeshImpl.Print(impl, x, [], "msg") is x


# ------------------------------------------------------ MeshImpl base helpers


def test_broadcast_slice():
  old = mtf.convert_to_shape("a:2;b:3")
  new = mtf.convert_to_shape("b:3;c:4;a:2")
  x = np.random.RandomState(0).randn(2, 3).astype(np.float32)
  got = mesh_impl_lib.broadcast_slice(tf.constant(x), old, new, [3, 4, 2])
  expected = np.broadcast_to(x.T[:, None, :], [3, 4, 2])
  np.testing.assert_array_equal(np.asarray(got), expected)
  # Slice sizes, not tensor sizes, are used for the new dims.
  got = mesh_impl_lib.broadcast_slice(tf.constant(x[:1]), old, new, [3, 2, 1])
  np.testing.assert_array_equal(
    np.asarray(got), np.broadcast_to(x[:1].T[:, None, :], [3, 2, 1])
  )
  # Pure transpose, pure broadcast, identity.
  perm = mesh_impl_lib.broadcast_slice(
    tf.constant(x), old, mtf.convert_to_shape("b:3;a:2"), [3, 2]
  )
  np.testing.assert_array_equal(np.asarray(perm), x.T)
  bcast = mesh_impl_lib.broadcast_slice(
    tf.constant(x), old, mtf.convert_to_shape("c:4;a:2;b:3"), [4, 2, 3]
  )
  np.testing.assert_array_equal(
    np.asarray(bcast), np.broadcast_to(x, [4, 2, 3])
  )
  t = tf.constant(x)
  assert mesh_impl_lib.broadcast_slice(t, old, old, [2, 3]) is t
  with pytest.raises(ValueError, match="'a'"):
    mesh_impl_lib.broadcast_slice(
      t, old, mtf.convert_to_shape("b:3;c:4"), [3, 4]
    )


def test_broadcast_impl():
  impl = _impl(MESH_2X2, "a:rows;c:cols")
  old = mtf.convert_to_shape("a:4;b:3")
  new = mtf.convert_to_shape("c:2;b:3;a:4")
  value = np.random.RandomState(0).randn(4, 3).astype(np.float32)
  x = impl.import_tf_tensor(_mtf_tensor(old), value)
  y = impl.broadcast_impl(x, old, new)
  _assert_placed(impl, y)
  full = impl.combine_slices(y.tensor_list, new)
  np.testing.assert_array_equal(
    np.asarray(full), np.broadcast_to(value.T[None], [2, 3, 4])
  )


@pytest.mark.parametrize(
  "mesh_shape,layout,tensor_shape,expected",
  [
    (MESH_2X2, "", "a:2;b:4;c:8", [None, None]),
    (MESH_2X2, "b:cols", "a:2;b:4;c:8", [None, 2]),
    (MESH_2X2, "c:rows;a:cols", "a:2;b:4;c:8", [8, 1]),
    (MESH_2X4, "a:rows;b:cols", "a:2;b:4", [1, 2]),
    (MESH_2X4, "x:rows", "a:2;b:4", [None, None]),
  ],
)
def test_mesh_axis_to_cumprod(mesh_shape, layout, tensor_shape, expected):
  impl = _impl(mesh_shape, layout)
  assert impl.mesh_axis_to_cumprod(tensor_shape) == expected
  assert (
    impl.mesh_axis_to_cumprod(mtf.convert_to_shape(tensor_shape)) == expected
  )


def test_pnum_groups_and_layout_queries():
  impl = _impl(MESH_2X4, "a:cols")
  assert mesh_impl_lib.pnum_groups(impl.shape, [1]) == [
    [0, 1, 2, 3],
    [4, 5, 6, 7],
  ]
  assert mesh_impl_lib.pnum_groups(impl.shape, [0]) == [
    [0, 4],
    [1, 5],
    [2, 6],
    [3, 7],
  ]
  assert impl.tensor_dimension_to_mesh_axis(mtf.Dimension("a", 8)) == 1
  assert impl.tensor_dimension_to_mesh_axis(mtf.Dimension("b", 8)) is None
  assert tuple(impl.tensor_layout("b:2;a:4")) == (None, 1)
  assert impl.ndims == 2 and impl.size == 8
  assert impl.supports_control_dependencies
