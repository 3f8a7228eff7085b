"""Tests for mesh_tensorflow._src.ops.conv (conv2d/3d, transposes, backprops).

Every case runs one mtf program with values and gradients (mtf.gradients of
sum(y * r), r random) and compares them with tf.nn.* under tf.GradientTape.
The same program runs on the 1-device, "all:4" and 2x2 meshes with batch,
in-channel ("c") and out-channel ("o") dims split, alone and together. The
spatial and filter dims may not be split (ValueError naming them).
"""

import inspect

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mesh_test_util as mtu
from tests import meshes

B = mtf.Dimension("b", 4)
E = mtf.Dimension("e", 2)
D = mtf.Dimension("d", 4)
H = mtf.Dimension("h", 6)
W = mtf.Dimension("w", 4)
C = mtf.Dimension("c", 4)
O = mtf.Dimension("o", 4)

_RNG = np.random.RandomState(0)


def _rand(*shape):
  return _RNG.uniform(-1.0, 1.0, size=shape).astype(np.float32)


def _fdims(*sizes):
  names = {2: ["fh", "fw"], 3: ["fd", "fh", "fw"]}[len(sizes)]
  return [mtf.Dimension(n, s) for n, s in zip(names, sizes)]


def _tf_reference(fn, x, f, r):
  """fn(x, f), and the gradients of sum(fn(x, f) * r) w.r.t. x and f."""
  xt, ft = tf.constant(x), tf.constant(f)
  with tf.GradientTape() as tape:
    tape.watch([xt, ft])
    y = fn(xt, ft)
    loss = tf.reduce_sum(y * r)
  gx, gf = tape.gradient(loss, [xt, ft])
  return [y.numpy(), gx.numpy(), gf.numpy()]


class Case:
  """One conv: mtf op class, shapes, numpy data and the tf.nn reference."""

  def __init__(self, op_cls, x_dims, f_dims, y_dims, strides, padding, tf_fn):
    self.op_cls, self.strides, self.padding = op_cls, strides, padding
    self.x_shape, self.f_shape = mtf.Shape(x_dims), mtf.Shape(f_dims)
    self.y_shape = mtf.Shape(y_dims)
    self.x = _rand(*self.x_shape.to_integer_list)
    self.f = _rand(*self.f_shape.to_integer_list)
    self.r = _rand(*self.y_shape.to_integer_list)
    nb = len(x_dims) - len(f_dims) + 1  # Number of batch dims.
    lead = self.x_shape.to_integer_list[:nb]

    def flat_fn(xt, ft):
      flat = tf.reshape(xt, [-1] + xt.shape.as_list()[nb:])
      y = tf_fn(flat, ft, strides, padding)
      return tf.reshape(y, lead + y.shape.as_list()[1:])

    self.expected = _tf_reference(flat_fn, self.x, self.f, self.r)

  def build(self, mesh):
    x = mtf.import_tf_tensor(mesh, self.x, self.x_shape)
    f = mtf.import_tf_tensor(mesh, self.f, self.f_shape)
    r = mtf.import_tf_tensor(mesh, self.r, self.y_shape)
    y = self.op_cls(x, f, self.strides, self.padding).outputs[0]
    assert y.shape == self.y_shape, (y.shape, self.y_shape)
    return [y] + mtf.gradients([mtf.reduce_sum(y * r)], [x, f])


def _conv2d_transpose(x, f, strides, padding):
  shape = x.shape.as_list()
  out = [shape[0], shape[1] * strides[1], shape[2] * strides[2], f.shape[2]]
  return tf.nn.conv2d_transpose(x, f, out, strides, padding)


def _conv3d_transpose(x, f, strides, padding):
  shape = x.shape.as_list()
  out = (
    [shape[0]]
    + [s * t for s, t in zip(shape[1:4], strides[1:4])]
    + [f.shape[3]]
  )
  return tf.nn.conv3d_transpose(x, f, out, strides, padding)


def _dim(d, size):
  return mtf.Dimension(d.name, size)


CASES = {
  "conv2d_same": Case(
    mtf.Conv2dOperation,
    [B, H, W, C],
    _fdims(3, 3) + [C, O],
    [B, H, W, O],
    [1, 1, 1, 1],
    "SAME",
    tf.nn.conv2d,
  ),
  "conv2d_valid_strided": Case(
    mtf.Conv2dOperation,
    [B, H, W, C],
    _fdims(3, 2) + [C, O],
    [B, _dim(H, 2), _dim(W, 3)] + [O],
    [1, 2, 1, 1],
    "VALID",
    tf.nn.conv2d,
  ),
  "conv2d_same_strided_two_batch_dims": Case(
    mtf.Conv2dOperation,
    [E, B, H, W, C],
    _fdims(2, 3) + [C, O],
    [E, B, _dim(H, 3), _dim(W, 2), O],
    [1, 2, 2, 1],
    "SAME",
    tf.nn.conv2d,
  ),
  "conv3d_same": Case(
    mtf.Conv3dOperation,
    [B, D, H, W, C],
    _fdims(3, 2, 3) + [C, O],
    [B, D, H, W, O],
    [1, 1, 1, 1, 1],
    "SAME",
    tf.nn.conv3d,
  ),
  "conv2d_transpose_same": Case(
    mtf.Conv2dTransposeOperation,
    [B, H, W, C],
    _fdims(3, 4) + [O, C],
    [B, _dim(H, 12), _dim(W, 8), O],
    [1, 2, 2, 1],
    "SAME",
    _conv2d_transpose,
  ),
  "conv2d_transpose_valid": Case(
    mtf.Conv2dTransposeOperation,
    [B, H, W, C],
    _fdims(2, 1) + [O, C],
    [B, _dim(H, 12), _dim(W, 8), O],
    [1, 2, 2, 1],
    "VALID",
    _conv2d_transpose,
  ),
  "conv3d_transpose_same": Case(
    mtf.Conv3dTransposeOperation,
    [B, D, H, W, C],
    _fdims(2, 2, 3) + [O, C],
    [B, _dim(D, 8), H, _dim(W, 8), O],
    [1, 2, 1, 2, 1],
    "SAME",
    _conv3d_transpose,
  ),
}


@meshes.parametrize(meshes.CONV_OPS)
def test_conv_values_and_gradients(mesh_shape, layout):
  names = sorted(CASES)

  def build(mesh):
    outs = []
    for name in names:
      outs += CASES[name].build(mesh)
    return outs

  out = mtu.run_program(build, mesh_shape, layout)
  for i, name in enumerate(names):
    mtu.assert_all_close(
      out[3 * i : 3 * i + 3],
      CASES[name].expected,
      rtol=1e-4,
      atol=1e-4,
      msg=name,
    )


@pytest.mark.parametrize("mode", mtu.MODES)
@meshes.parametrize([("", ""), ("rows:2;cols:2", "b:rows;c:cols")])
def test_conv_all_modes(mode, mesh_shape, layout):
  case = CASES["conv2d_valid_strided"]
  out = mtu.run_program(case.build, mesh_shape, layout, mode)
  mtu.assert_all_close(out, case.expected, rtol=1e-4, atol=1e-4)


@meshes.parametrize(
  [("", ""), ("all:4", "c:all"), ("rows:2;cols:2", "b:rows;o:cols")]
)
def test_conv2d_second_order_gradient(mesh_shape, layout):
  """d/df of sum(dL/dx * q): differentiates conv2d_backprop_input."""
  case = CASES["conv2d_same"]
  q = _rand(*case.x_shape.to_integer_list)
  xt, ft = tf.constant(case.x), tf.constant(case.f)
  with tf.GradientTape() as outer:
    outer.watch(ft)
    with tf.GradientTape() as inner:
      inner.watch(xt)
      loss = tf.reduce_sum(tf.nn.conv2d(xt, ft, 1, "SAME") ** 2)
    gx = inner.gradient(loss, xt)
    second = tf.reduce_sum(gx * q)
  expected = outer.gradient(second, ft).numpy()

  def build(mesh):
    x = mtf.import_tf_tensor(mesh, case.x, case.x_shape)
    f = mtf.import_tf_tensor(mesh, case.f, case.f_shape)
    qq = mtf.import_tf_tensor(mesh, q, case.x_shape)
    y = mtf.Conv2dOperation(x, f, [1, 1, 1, 1], "SAME").outputs[0]
    gx = mtf.gradients([mtf.reduce_sum(mtf.square(y))], [x])[0]
    return mtf.gradients([mtf.reduce_sum(gx * qq)], [f])

  mtu.assert_all_close(
    mtu.run_program(build, mesh_shape, layout), [expected], rtol=1e-4, atol=1e-3
  )


@pytest.mark.parametrize(
  "layout,culprit",
  [("h:all", "h"), ("w:all", "w"), ("fh:all", "fh"), ("fw:all", "fw")],
)
def test_split_spatial_or_filter_dim_raises(layout, culprit):
  case = CASES["conv2d_same"]
  with pytest.raises(ValueError, match="dimension '%s'" % culprit):
    mtu.run_program(case.build, "all:4", layout)


def test_split_spatial_dim_of_conv3d_transpose_raises():
  case = CASES["conv3d_transpose_same"]
  with pytest.raises(ValueError, match="dimension 'd'"):
    mtu.run_program(case.build, "rows:2;cols:2", "d:rows;b:cols")


def _lower(build, mesh_shape, layout):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  outs = build(mesh)
  mesh_impl = mtu.mesh_impl_for(mesh_shape, layout)
  return mtf.Lowering(graph, {mesh: mesh_impl}), outs


def test_lazy_allreduce_and_counters():
  x_shape, f_shape = mtf.Shape([B, H, W, C]), mtf.Shape(_fdims(3, 3) + [C, O])

  def build(mesh):
    x = mtf.zeros(mesh, x_shape)
    f = mtf.zeros(mesh, f_shape)
    y = mtf.Conv2dOperation(x, f, [1, 1, 1, 1], "SAME").outputs[0]
    dx = mtf.conv2d_backprop_input(x_shape, f, y, [1, 1, 1, 1], "SAME")
    df = mtf.conv2d_backprop_filter(x, f_shape, y, [1, 1, 1, 1], "SAME")
    return [y, dx, df]

  lowering, (y, dx, df) = _lower(build, "rows:2;cols:2", "c:rows;b:cols")
  assert isinstance(lowering.tensors[y], mtf.LazyAllreduceSum)
  assert lowering.tensors[y].mesh_axes == (0,)
  assert not isinstance(lowering.tensors[dx], mtf.LazyAllreduceSum)
  assert lowering.tensors[df].mesh_axes == (1,)  # Batch split on cols.
  keys = {k for k, _ in lowering.counters}
  assert {
    "conv2d/forward",
    "conv2d/backprop_input",
    "conv2d/backprop_filter",
  } <= keys
  lowering, (y, dx, df) = _lower(build, "all:4", "o:all")
  assert not isinstance(lowering.tensors[y], mtf.LazyAllreduceSum)
  assert lowering.tensors[dx].mesh_axes == (0,)
  assert not isinstance(lowering.tensors[df], mtf.LazyAllreduceSum)


def test_splittable_dims():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, [B, H, W, C])
  f = mtf.zeros(mesh, _fdims(3, 3) + [C, O])
  op = mtf.Conv2dOperation(x, f, [1, 1, 1, 1], "SAME")
  assert op.unsplittable_dims == {"h", "w", "fh", "fw"}
  assert op.splittable_dims == {"b", "c", "o"}
  t = mtf.Conv2dTransposeOperation(
    mtf.zeros(mesh, [B, H, W, O]), f, [1, 2, 2, 1], "SAME"
  )
  assert t.unsplittable_dims == {"h", "w", "fh", "fw"}
  back = mtf.conv2d_backprop_input(
    x.shape, f, op.outputs[0], [1, 1, 1, 1], "SAME"
  ).operation
  assert back.unsplittable_dims == frozenset()
  assert isinstance(back, mtf.Conv2or3dBackpropInputOperation)


def test_bad_arguments_raise_value_errors():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, [B, H, W, C])
  f = mtf.zeros(mesh, _fdims(3, 3) + [C, O])
  big = mtf.zeros(mesh, _fdims(7, 3) + [C, O])
  with pytest.raises(
    ValueError,
    match="'fh' \\(size 7\\) is larger than input dimension 'h' \\(size 6\\)",
  ):
    mtf.Conv2dOperation(x, big, [1, 1, 1, 1], "VALID")
  mtf.Conv2dOperation(x, big, [1, 1, 1, 1], "SAME")  # SAME is fine.
  with pytest.raises(ValueError, match="padding must be 'SAME' or 'VALID'"):
    mtf.Conv2dOperation(x, f, [1, 1, 1, 1], "same")
  with pytest.raises(ValueError, match="padding must be 'SAME' or 'VALID'"):
    mtf.Conv3dTransposeOperation(
      mtf.zeros(mesh, [B, D, H, W, C]),
      mtf.zeros(mesh, _fdims(2, 2, 2) + [O, C]),
      [1, 2, 2, 2, 1],
      "FULL",
    )
  with pytest.raises(ValueError, match="strides"):
    mtf.Conv2dOperation(x, f, [1, 1, 1], "SAME")
  with pytest.raises(ValueError, match="batch and channels must be 1"):
    mtf.Conv2dOperation(x, f, [2, 1, 1, 1], "SAME")
  with pytest.raises(ValueError, match="in-channels"):
    mtf.Conv2dOperation(
      x, mtf.zeros(mesh, _fdims(3, 3) + [O, C]), [1, 1, 1, 1], "SAME"
    )
  with pytest.raises(ValueError, match="filter .* must have 4 dims"):
    mtf.Conv2dOperation(
      x, mtf.zeros(mesh, _fdims(3, 3, 3) + [C, O]), [1, 1, 1, 1], "SAME"
    )
  # A VALID transposed conv with a filter larger than the stride cannot give
  # input x stride outputs.
  with pytest.raises(ValueError, match="along 'h'"):
    mtf.Conv2dTransposeOperation(
      mtf.zeros(mesh, [B, H, W, O]), f, [1, 2, 2, 1], "VALID"
    )
  with pytest.raises(ValueError, match="conv_dimension must be 2 or 3"):
    mtf.Conv2or3dBackpropInputOperation(
      4, False, x.shape, f, x, [1, 1, 1, 1], "SAME"
    )
  with pytest.raises(ValueError, match="output dimension 'h' has size 6"):
    mtf.conv2d_backprop_filter(
      x, f.shape, mtf.zeros(mesh, [B, H, W, O]), [1, 2, 1, 1], "SAME"
    )


def test_signatures_and_names():
  def params(fn):
    return [
      (p.name, p.default) for p in inspect.signature(fn).parameters.values()
    ]

  empty = inspect.Parameter.empty
  for cls in (
    mtf.Conv2dOperation,
    mtf.Conv3dOperation,
    mtf.Conv2dTransposeOperation,
    mtf.Conv3dTransposeOperation,
  ):
    assert params(cls.__init__) == [
      ("self", empty),
      ("conv_input", empty),
      ("conv_filter", empty),
      ("strides", empty),
      ("padding", empty),
      ("name", None),
    ]
  assert params(mtf.Conv2or3dBackpropInputOperation.__init__) == [
    ("self", empty),
    ("conv_dimension", empty),
    ("is_transpose", empty),
    ("input_shape", empty),
    ("conv_filter", empty),
    ("dy", empty),
    ("strides", empty),
    ("padding", empty),
    ("name", None),
  ]
  assert params(mtf.Conv2or3dBackpropFilterOperation.__init__) == [
    ("self", empty),
    ("conv_dimension", empty),
    ("is_transpose", empty),
    ("conv_input", empty),
    ("filter_shape", empty),
    ("dy", empty),
    ("strides", empty),
    ("padding", empty),
    ("name", None),
  ]
  for fn in (
    mtf.conv2d_backprop_input,
    mtf.conv3d_backprop_input,
    mtf.conv2d_transpose_backprop_input,
    mtf.conv3d_transpose_backprop_input,
  ):
    assert params(fn) == [
      ("input_shape", empty),
      ("conv_filter", empty),
      ("dy", empty),
      ("strides", empty),
      ("padding", empty),
      ("name", None),
    ]
  for fn in (
    mtf.conv2d_backprop_filter,
    mtf.conv3d_backprop_filter,
    mtf.conv2d_transpose_backprop_filter,
    mtf.conv3d_transpose_backprop_filter,
  ):
    assert params(fn) == [
      ("conv_input", empty),
      ("filter_shape", empty),
      ("dy", empty),
      ("strides", empty),
      ("padding", empty),
      ("name", None),
    ]
  # The raw TF functions the original leaked into mtf.*.
  assert (
    "input_sizes" in inspect.signature(mtf.conv3d_backprop_input_v2).parameters
  )
  assert (
    "filter_sizes"
    in inspect.signature(mtf.conv3d_backprop_filter_v2).parameters
  )
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.zeros(mesh, [B, H, W, C])
  f = mtf.zeros(mesh, _fdims(3, 3) + [C, O])
  assert mtf.Conv2dOperation(x, f, [1, 1, 1, 1], "SAME").name == "conv2d"
  assert mtf.Conv2dOperation(x, f, [1, 1, 1, 1], "SAME", name="c2").name == "c2"
