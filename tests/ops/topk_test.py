"""Tests for mesh_tensorflow._src.ops.topk: top_k, top_1, argmax, nth_*, sampling.

Every op is checked against tf.math.top_k / numpy on the 1-device mesh, the
4-device 1-d mesh and the 2x2 mesh, with the reduced dimension unsplit and
split (alone or with another dim split on the other mesh axis), on data with
ties, infinities and values beyond +-1e9, for k = 1 and the two algorithms
(k < 5: rounds of top-1; k >= 5: sort), including k larger than a shard.
"""

import inspect

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mesh_test_util as mtu
from tests import meshes

BATCH = mtf.Dimension("batch", 4)
VOCAB = mtf.Dimension("vocab", 8)
LENGTH = mtf.Dimension("length", 2)
SHAPE = [BATCH, VOCAB, LENGTH]  # The reduced dim is not the last one.
KS = [1, 3, 4, 6, 8]  # k=1; rounds (2 <= k < 5); sort (k >= 5); k = size.


_RNG = np.random.RandomState(0)
# Small integers: many ties. One row of extremes the original's 1e9-masking
# got wrong, one row of all-equal values.
X = _RNG.randint(0, 4, size=(4, 8, 2)).astype(np.float32)
X[1, :, 0] = [-np.inf, 2e9, -np.inf, -3e9, 2e9, -np.inf, 5.0, -1e10]
X[2, :, 1] = 7.0
X_INT = _RNG.randint(-3, 3, size=(4, 8, 2)).astype(np.int32)
DY = {k: _RNG.uniform(-1.0, 1.0, size=(4, 2, k)).astype(np.float32) for k in KS}


def _tf_top_k(x, k):
  """Reference: tf.math.top_k along axis 1, k last (the mtf output order)."""
  values, indices = tf.math.top_k(np.transpose(x, [0, 2, 1]), k)
  return values.numpy(), indices.numpy()


def _k_dim(k):
  return mtf.Dimension("k", k)


def _program(mesh):
  x = mtf.import_tf_tensor(mesh, X, SHAPE)
  x_int = mtf.import_tf_tensor(mesh, X_INT, SHAPE)
  outputs = []
  for k in KS:
    outputs.extend(mtf.top_k(x, VOCAB, _k_dim(k)))
  outputs.extend(mtf.top_k(x_int, VOCAB, _k_dim(3)))
  outputs.extend(mtf.top_k(x_int, VOCAB, _k_dim(6)))
  outputs.extend(mtf.top_1(x, VOCAB))
  outputs.append(mtf.argmax(x, VOCAB))
  outputs.append(mtf.argmax(x_int, VOCAB))
  for n in (0, 2, 7):
    outputs.append(mtf.nth_largest_element(x, n, VOCAB))
    outputs.append(mtf.nth_smallest_element(x, n, VOCAB))
  return outputs


def _expected():
  outputs = []
  for k in KS:
    outputs.extend(_tf_top_k(X, k))
  outputs.extend(_tf_top_k(X_INT, 3))
  outputs.extend(_tf_top_k(X_INT, 6))
  values, indices = _tf_top_k(X, 1)
  outputs.extend([values[..., 0], indices[..., 0]])
  outputs.append(indices[..., 0])
  outputs.append(_tf_top_k(X_INT, 1)[1][..., 0])
  ascending = np.sort(X, axis=1)
  for n in (0, 2, 7):
    outputs.append(ascending[:, 7 - n, :])
    outputs.append(ascending[:, n, :])
  return outputs


_REQUIRED = inspect.Parameter.empty


def test_signatures_match_the_original():
  expected = {
    mtf.top_k: [
      ("x", _REQUIRED),
      ("reduced_dim", _REQUIRED),
      ("k_dim", _REQUIRED),
      ("name", None),
    ],
    mtf.top_1: [("x", _REQUIRED), ("reduced_dim", _REQUIRED), ("name", None)],
    mtf.argmax: [("x", _REQUIRED), ("reduced_dim", _REQUIRED), ("name", None)],
    mtf.nth_largest_element: [
      ("x", _REQUIRED),
      ("n", _REQUIRED),
      ("reduced_dim", _REQUIRED),
      ("name", None),
    ],
    mtf.nth_smallest_element: [
      ("x", _REQUIRED),
      ("n", _REQUIRED),
      ("reduced_dim", _REQUIRED),
      ("name", None),
    ],
    mtf.sample_with_temperature: [
      ("logits", _REQUIRED),
      ("dim", _REQUIRED),
      ("temperature", 1.0),
      ("name", None),
    ],
    mtf.TopKOperation: [
      ("x", _REQUIRED),
      ("reduced_dim", _REQUIRED),
      ("k_dim", _REQUIRED),
      ("name", None),
    ],
  }
  for fn, params in expected.items():
    actual = [
      (p.name, p.default) for p in inspect.signature(fn).parameters.values()
    ]
    assert actual == params, fn


@meshes.parametrize(meshes.TOPK)
def test_values_match_tf_top_k_and_numpy(mesh_shape, layout):
  actual = mtu.run_program(_program, mesh_shape, layout)
  expected = _expected()
  assert len(actual) == len(expected)
  for i, (a, e) in enumerate(zip(actual, expected)):
    assert a.shape == e.shape, "output %d" % i
    assert a.dtype == e.dtype, "output %d: %s vs %s" % (i, a.dtype, e.dtype)
    np.testing.assert_array_equal(a, e, err_msg="output %d" % i)


def test_output_shapes_dtypes_and_splittability():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.import_tf_tensor(mesh, X, SHAPE)
  values, indices = mtf.top_k(x, VOCAB, _k_dim(6))
  assert values.shape == mtf.Shape([BATCH, LENGTH, _k_dim(6)])
  assert indices.shape == values.shape
  assert values.dtype == tf.float32 and indices.dtype == tf.int32
  op = values.operation
  assert isinstance(op, mtf.TopKOperation)
  assert op.outputs == [values, indices]
  assert "k" in op.unsplittable_dims and "vocab" in op.splittable_dims
  top, arg = mtf.top_1(x, VOCAB)
  assert top.shape == arg.shape == mtf.Shape([BATCH, LENGTH])
  assert mtf.nth_largest_element(x, 1, VOCAB).shape == mtf.Shape(
    [BATCH, LENGTH]
  )


def _gradient_program(mesh):
  x = mtf.import_tf_tensor(mesh, X, SHAPE)
  grads = []
  for k in (1, 3, 6):
    values, _ = mtf.top_k(x, VOCAB, _k_dim(k))
    dy = mtf.import_tf_tensor(mesh, DY[k], values.shape)
    grads.extend(mtf.gradients([values], [x], grad_ys=[dy]))
  top, _ = mtf.top_1(x, VOCAB)
  grads.extend(mtf.gradients([mtf.reduce_sum(top * 2.0)], [x]))
  nth = mtf.nth_largest_element(x, 2, VOCAB)
  grads.extend(mtf.gradients([mtf.reduce_sum(nth)], [x]))
  return grads


def _expected_gradients():
  x = tf.constant(X)
  expected = []
  with tf.GradientTape(persistent=True) as tape:
    tape.watch(x)
    xt = tf.transpose(x, [0, 2, 1])
    tops = {k: tf.math.top_k(xt, k)[0] for k in (1, 3, 6)}
    top_sum = tf.reduce_sum(tops[1] * 2.0)
    third_sum = tf.reduce_sum(tops[6][..., 2])
  for k in (1, 3, 6):
    expected.append(tape.gradient(tops[k], x, output_gradients=DY[k]))
  expected.append(tape.gradient(top_sum, x))
  expected.append(tape.gradient(third_sum, x))
  return [np.asarray(e) for e in expected]


@meshes.parametrize(meshes.TOPK)
def test_gradients_match_tf_gradient_tape(mesh_shape, layout):
  actual = mtu.run_program(_gradient_program, mesh_shape, layout)
  expected = _expected_gradients()
  for i, (a, e) in enumerate(zip(actual, expected)):
    np.testing.assert_allclose(
      a, e, rtol=1e-6, atol=1e-6, err_msg="gradient %d" % i
    )


@pytest.mark.parametrize("mode", mtu.MODES)
def test_three_modes_with_split_reduced_dim(mode):
  def build(mesh):
    x = mtf.import_tf_tensor(mesh, X, SHAPE)
    values3, indices3 = mtf.top_k(x, VOCAB, _k_dim(3))
    dy = mtf.import_tf_tensor(mesh, DY[3], values3.shape)
    [dx] = mtf.gradients([values3], [x], grad_ys=[dy])
    return [values3, indices3, *mtf.top_k(x, VOCAB, _k_dim(6)), dx]

  actual = mtu.run_program(
    build, "rows:2;cols:2", "vocab:rows;batch:cols", mode
  )
  expected = [*_tf_top_k(X, 3), *_tf_top_k(X, 6), _expected_gradients()[1]]
  for i, (a, e) in enumerate(zip(actual, expected)):
    np.testing.assert_allclose(
      a, e, rtol=1e-6, atol=1e-6, err_msg="%s output %d" % (mode, i)
    )


def test_split_reduced_dim_uses_allconcat():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.import_tf_tensor(mesh, X, SHAPE)
  outputs = [mtf.top_k(x, VOCAB, _k_dim(6))[0], mtf.top_1(x, VOCAB)[0]]
  lowering = mtf.Lowering(
    graph, {mesh: mtu.mesh_impl_for("all:4", "vocab:all")}
  )
  keys = [key for key, _ in lowering.counters]
  assert "allconcat/0/top_k" in keys
  for t in outputs:
    lowering.export_to_tf_tensor(t)


# ------------------------------------------------------------------ errors
def _graph_with_x():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  return graph, mesh, mtf.import_tf_tensor(mesh, X, SHAPE)


def test_k_larger_than_reduced_dim_raises():
  _, _, x = _graph_with_x()
  with pytest.raises(ValueError, match="k_dim.*vocab"):
    mtf.top_k(x, VOCAB, _k_dim(9))
  with pytest.raises(ValueError, match="k_dim"):
    mtf.top_k(x, VOCAB, _k_dim(0))
  with pytest.raises(ValueError, match="n must be"):
    mtf.nth_largest_element(x, 8, VOCAB)
  with pytest.raises(ValueError, match="n must be"):
    mtf.nth_smallest_element(x, -1, VOCAB)


def test_reduced_dim_not_in_tensor_raises():
  _, _, x = _graph_with_x()
  other = mtf.Dimension("other", 8)
  for fn in (
    lambda: mtf.top_k(x, other, _k_dim(2)),
    lambda: mtf.top_1(x, other),
    lambda: mtf.argmax(x, other),
    lambda: mtf.nth_largest_element(x, 0, other),
    lambda: mtf.sample_with_temperature(x, other),
  ):
    with pytest.raises(ValueError, match="other"):
      fn()
  with pytest.raises(ValueError, match="reduced_dim"):
    mtf.top_k(x, mtf.Dimension("vocab", 5), _k_dim(2))  # Wrong size.


def test_k_dim_already_in_tensor_raises():
  _, _, x = _graph_with_x()
  with pytest.raises(ValueError, match="k_dim.*length"):
    mtf.top_k(x, VOCAB, LENGTH)


def test_bool_input_and_negative_temperature_raise():
  _, mesh, x = _graph_with_x()
  with pytest.raises(ValueError, match="dtype"):
    mtf.top_k(mtf.cast(x, tf.bool), VOCAB, _k_dim(2))
  with pytest.raises(ValueError, match="temperature"):
    mtf.sample_with_temperature(x, VOCAB, -0.5)
  del mesh


def test_split_k_dim_raises_at_lowering():
  graph, mesh, x = _graph_with_x()
  values, _ = mtf.top_k(x, VOCAB, _k_dim(4))
  del values
  with pytest.raises(ValueError, match="'k'"):
    mtf.Lowering(graph, {mesh: mtu.mesh_impl_for("all:4", "k:all")})


# ----------------------------------------------------------------- sampling
SAMPLE_MESH_LAYOUTS = [
  ("", ""),
  ("all:4", "vocab:all"),
  ("rows:2;cols:2", "batch:rows;vocab:cols"),
  ("rows:2;cols:2", "length:rows;batch:cols"),
]


def test_temperature_zero_is_argmax():
  def build(mesh):
    x = mtf.import_tf_tensor(mesh, X, SHAPE)
    return [
      mtf.sample_with_temperature(x, VOCAB, 0.0),
      mtf.sample_with_temperature(x, VOCAB, temperature=0),
    ]

  for mesh_shape, layout in SAMPLE_MESH_LAYOUTS[:2]:
    a, b = mtu.run_program(build, mesh_shape, layout)
    expected = _tf_top_k(X, 1)[1][..., 0]
    assert a.dtype == np.int32
    np.testing.assert_array_equal(a, expected)
    np.testing.assert_array_equal(b, expected)


def _sample_program(mesh):
  logits = mtf.import_tf_tensor(mesh, X * 0.5, SHAPE)
  temperature = mtf.constant(mesh, 0.7, dtype=tf.float32)
  return [
    mtf.sample_with_temperature(logits, VOCAB),
    mtf.sample_with_temperature(logits, VOCAB, 0.7, name="s2"),
    mtf.sample_with_temperature(logits, VOCAB, temperature, name="s3"),
  ]


def test_samples_identical_across_meshes_and_layouts():
  mtu.skip_under_tf1(
    "eager op seeds under tf.random.set_seed (a new tf.Graph draws "
    "its own op seeds)"
  )
  mtu.skip_under_simd(
    "eager op seeds under tf.random.set_seed; in the SIMD "
    "tf.function the draw's op seed depends on its "
    "position in the traced graph"
  )
  results = []
  for mesh_shape, layout in SAMPLE_MESH_LAYOUTS:
    tf.random.set_seed(1234)
    results.append(mtu.run_program(_sample_program, mesh_shape, layout))
  for result in results:
    assert result[0].shape == (4, 2) and result[0].dtype == np.int32
    for a, e in zip(result, results[0]):
      np.testing.assert_array_equal(a, e)
  # Same key and name: a scalar-tensor temperature equals the float one.
  for mesh_shape, layout in SAMPLE_MESH_LAYOUTS[:1]:
    tf.random.set_seed(99)
    a = mtu.run_program(
      lambda m: [
        mtf.sample_with_temperature(
          mtf.import_tf_tensor(m, X, SHAPE), VOCAB, 0.7, name="t"
        )
      ],
      mesh_shape,
      layout,
    )
    tf.random.set_seed(99)
    b = mtu.run_program(
      lambda m: [
        mtf.sample_with_temperature(
          mtf.import_tf_tensor(m, X, SHAPE),
          VOCAB,
          mtf.constant(m, 0.7),
          name="t",
        )
      ],
      mesh_shape,
      layout,
    )
    np.testing.assert_array_equal(a[0], b[0])
  # Never-seen infinities: -inf logits are never sampled.
  for result in results:
    assert np.all(
      np.isfinite(np.take_along_axis(X, result[0][:, None, :], axis=1))
    )


DRAWS = mtf.Dimension("draws", 40000)
SAMPLE_VOCAB = mtf.Dimension("vocab", 4)
SAMPLE_LOGITS = np.array([1.0, -0.5, 0.3, 2.0], np.float32)


@pytest.mark.parametrize("temperature", [1.0, 0.5, 2.5])
def test_sample_frequencies_match_softmax(temperature):
  """Empirical frequencies of 40000 independent draws vs softmax(logits/T).

  Each frequency is a binomial proportion with standard error
  sqrt(p (1 - p) / N) <= 0.0025; we allow 5 standard errors per category
  (a correct sampler fails with probability < 1e-5 per test; the seed is
  fixed, so the test is deterministic anyway). A sampler ignoring the
  temperature would be off by >= 0.05 here, far beyond the tolerance.
  """

  def build(mesh):
    logits = mtf.broadcast(
      mtf.import_tf_tensor(mesh, SAMPLE_LOGITS, [SAMPLE_VOCAB]),
      [DRAWS, SAMPLE_VOCAB],
    )
    return [mtf.sample_with_temperature(logits, SAMPLE_VOCAB, temperature)]

  tf.random.set_seed(7)
  (ids,) = mtu.run_program(build, "all:4", "draws:all")
  freq = np.bincount(ids, minlength=4) / ids.size
  p = np.exp(SAMPLE_LOGITS / temperature)
  p /= p.sum()
  tolerance = 5 * np.sqrt(p * (1 - p) / ids.size)
  assert np.all(np.abs(freq - p) <= tolerance), (freq, p, tolerance)
