"""Tests for mesh_tensorflow.test_utils (NumpyConverter)."""

import inspect

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import test_utils

_EMPTY = inspect.Parameter.empty


@pytest.mark.parametrize(
  "fn,params",
  [
    (
      test_utils.NumpyConverter.convert_np_array_to_mtf_tensor,
      [
        ("self", _EMPTY),
        ("x", _EMPTY),
        ("dim_names", None),
        ("dtype", tf.int32),
      ],
    ),
    (
      test_utils.NumpyConverter.convert_mtf_tensor_to_np_array,
      [("self", _EMPTY), ("x_mtf", _EMPTY)],
    ),
    (
      test_utils.NumpyConverter.convert_mtf_tensor_to_tf_tensor,
      [("self", _EMPTY), ("mtf_tensor", _EMPTY)],
    ),
  ],
)
def test_signature(fn, params):
  actual = [
    (p.name, p.default) for p in inspect.signature(fn).parameters.values()
  ]
  assert actual == params


def test_round_trip_eager():
  converter = test_utils.NumpyConverter()
  assert converter.session is None
  x_np = np.arange(6).reshape(2, 3)
  x = converter.convert_np_array_to_mtf_tensor(x_np)
  assert x.mesh is converter.mesh and x.graph is converter.graph
  assert x.shape == mtf.Shape(
    [mtf.Dimension("dim0", 2), mtf.Dimension("dim1", 3)]
  )
  assert x.dtype == tf.int32  # the default, as in the original
  out = converter.convert_mtf_tensor_to_np_array(x)
  assert out.dtype == np.int32
  np.testing.assert_array_equal(out, x_np)
  y = mtf.cumsum(x, x.shape.dims[1])
  np.testing.assert_array_equal(
    converter.convert_mtf_tensor_to_np_array(y), np.cumsum(x_np, axis=1)
  )
  lowering, y_tf = converter.convert_mtf_tensor_to_tf_tensor(y)
  assert isinstance(lowering, mtf.Lowering)
  np.testing.assert_array_equal(y_tf.numpy(), np.cumsum(x_np, axis=1))


def test_dim_names_dtype_and_scalars():
  converter = test_utils.NumpyConverter()
  x_np = np.linspace(0.0, 1.0, 12, dtype=np.float64).reshape(3, 4)
  x = converter.convert_np_array_to_mtf_tensor(
    x_np, dim_names=["batch", "length"], dtype=tf.float32
  )
  assert x.shape.dimension_names == ["batch", "length"]
  assert x.dtype == tf.float32
  kept = converter.convert_np_array_to_mtf_tensor(x_np, dtype=None)
  assert kept.dtype == tf.float64
  scalar = converter.convert_np_array_to_mtf_tensor(
    np.float32(2.5), dtype=tf.float32
  )
  assert scalar.shape.ndims == 0
  total = mtf.reduce_sum(x) + scalar
  np.testing.assert_allclose(
    converter.convert_mtf_tensor_to_np_array(total), x_np.sum() + 2.5, rtol=1e-6
  )
  np.testing.assert_allclose(
    converter.convert_mtf_tensor_to_np_array(kept), x_np
  )


def test_round_trip_v1_graph_with_variables():
  x_np = np.arange(8, dtype=np.float32).reshape(2, 4)
  with tf.Graph().as_default() as tf_graph:
    converter = test_utils.NumpyConverter()
    x = converter.convert_np_array_to_mtf_tensor(
      x_np, dim_names=["b", "n"], dtype=tf.float32
    )
    w = mtf.get_variable(
      converter.mesh, "w", x.shape, initializer=tf.ones_initializer()
    )
    y = x * w + 1.0
    np.testing.assert_array_equal(
      converter.convert_mtf_tensor_to_np_array(y), x_np + 1.0
    )
    session = converter.session
    assert isinstance(session, tf.compat.v1.Session)
    assert session.graph is tf_graph
    # A second conversion reuses the session and keeps variable values.
    master = w.operation.master
    session.run(master.assign(tf.fill([2, 4], 2.0)))
    np.testing.assert_array_equal(
      converter.convert_mtf_tensor_to_np_array(y), 2.0 * x_np + 1.0
    )
    assert converter.session is session


def test_multi_device_mesh():
  x_np = np.arange(16, dtype=np.int32).reshape(4, 4)
  converter = test_utils.NumpyConverter(
    mesh_shape="rows:2;cols:2",
    layout="b:rows;n:cols",
    devices=["/cpu:0", "/cpu:1", "/cpu:2", "/cpu:3"],
  )
  x = converter.convert_np_array_to_mtf_tensor(x_np, dim_names=["b", "n"])
  y = mtf.reduce_sum(x, reduced_dim=x.shape.dims[1])
  np.testing.assert_array_equal(
    converter.convert_mtf_tensor_to_np_array(y), x_np.sum(axis=1)
  )
  with tf.Graph().as_default():
    converter = test_utils.NumpyConverter(
      mesh_shape="all:2", layout="n:all", devices=["/cpu:0", "/cpu:1"]
    )
    x = converter.convert_np_array_to_mtf_tensor(x_np, dim_names=["b", "n"])
    np.testing.assert_array_equal(
      converter.convert_mtf_tensor_to_np_array(mtf.cumsum(x, "n")),
      np.cumsum(x_np, axis=1),
    )


def test_errors():
  converter = test_utils.NumpyConverter()
  with pytest.raises(
    ValueError,
    match=r"1 dim_names \['a'\] for an array of "
    r"rank 2",
  ):
    converter.convert_np_array_to_mtf_tensor(np.zeros((2, 3)), dim_names=["a"])
  other = test_utils.NumpyConverter()
  x = other.convert_np_array_to_mtf_tensor(np.zeros((2,)))
  with pytest.raises(ValueError, match=r"not an mtf Tensor of this converter"):
    converter.convert_mtf_tensor_to_np_array(x)
  with pytest.raises(ValueError, match=r"1 devices for mesh"):
    test_utils.NumpyConverter(mesh_shape="all:2", devices=["/cpu:0"])
