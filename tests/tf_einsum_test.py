"""tf_einsum.einsum (the per-slice einsum of MeshImpl) against tf.einsum,
and the shared-host-memory shortcuts of the placement backend.
"""

import random

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow._src import tf_einsum
from mesh_tensorflow._src.mesh_impls import collectives
from mesh_tensorflow._src.mesh_impls import placement
from tests import meshes

SIZES = dict(zip("abcdef", [2, 3, 4, 5, 6, 7]))


def _operand(labels, rng):
  return tf.constant(
    rng.standard_normal([SIZES[l] for l in labels]), tf.float32
  )


@pytest.mark.parametrize(
  "equation",
  [
    "ab,bc->ac",
    "ab,ac->bc",
    "ac,bc->ab",
    "ab,cb->ca",
    "ba,cb->ac",
    "ab,ab->ab",
    "ab,b->ab",
    "b,ab->ba",
    "ab,cd->abcd",
    "ab,->ab",
    "abc,acd->abd",
    "abc,adc->abd",
    "abc,abd->acd",
    "abc,cd->abd",
    "abcd,cde->abe",
    "abc,bc->a",
    "abc,b->ca",
    "ab,bc->ca",
    "ab->ba",
    "abc->b",
    "abc->",
    "ab,ba->ab",
    "abc,cab->cab",
    "ab,bcd->acd",
    "ab,cd->ad",
    "abc,bcd->ad",
    "abc,dbc->ad",
    "ab,bc,cd->ad",
    "abc,abc->c",
    "abc,abc->ab",
    "abc,cab->b",
    "abc,bca->",
    "ab,ba->b",
    "abc,cb->c",
  ],
)
def test_einsum_matches_tf_einsum(equation):
  rng = np.random.default_rng(0)
  labels = equation.split("->")[0].split(",")
  operands = [_operand(l, rng) for l in labels]
  expected = tf.einsum(equation, *operands).numpy()
  got = tf_einsum.einsum(equation, *operands).numpy()
  assert got.shape == expected.shape
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_einsum_random_equations():
  rng = random.Random(1)
  nrng = np.random.default_rng(1)
  for _ in range(200):
    letters = rng.sample("abcdef", rng.randint(1, 5))
    la = "".join(rng.sample(letters, rng.randint(0, len(letters))))
    lb = "".join(rng.sample(letters, rng.randint(0, len(letters))))
    pool = sorted(set(la) | set(lb))
    lo = "".join(rng.sample(pool, rng.randint(0, len(pool))))
    equation = "%s,%s->%s" % (la, lb, lo)
    a, b = _operand(la, nrng), _operand(lb, nrng)
    np.testing.assert_allclose(
      tf_einsum.einsum(equation, a, b).numpy(),
      tf.einsum(equation, a, b).numpy(),
      rtol=1e-4,
      atol=1e-4,
      err_msg=equation,
    )


def test_einsum_emits_matmul_and_multiply():
  a = tf.TensorSpec([4, 8], tf.float32)
  b = tf.TensorSpec([4, 6], tf.float32)

  def op_types(equation, *specs):
    fn = tf.function(lambda *xs: tf_einsum.einsum(equation, *xs))
    graph = fn.get_concrete_function(*specs).graph
    return {op.type for op in graph.get_operations()}

  types = op_types("ab,ac->bc", a, b)  # x^T dy: a transposed matmul
  assert "MatMul" in types and "Einsum" not in types
  assert "Transpose" not in types
  types = op_types("ab,ab->ab", a, a)
  assert "Mul" in types and "Einsum" not in types
  c = tf.TensorSpec([4, 5, 8], tf.float32)
  types = op_types("abc,abc->c", c, c)  # batched dot products
  assert "Mul" in types and "Sum" in types
  assert "Einsum" not in types and "BatchMatMulV2" not in types


def test_share_host_memory():
  assert collectives.share_host_memory(["/cpu:0", "/cpu:3", "cpu:1"])
  assert collectives.share_host_memory(
    ["/job:localhost/replica:0/task:0/device:CPU:0", "/cpu:2"]
  )
  assert not collectives.share_host_memory(["/cpu:0", "/gpu:0"])
  assert not collectives.share_host_memory(
    ["/job:worker/task:0/cpu:0", "/job:worker/task:1/cpu:0"]
  )


@pytest.mark.parametrize(
  "mesh_shape,layout,distinct",
  [
    ("all:4", "batch:all", 1),  # replicated: the master itself
    ("all:4", "hidden:all", 4),
    ("rows:2;cols:2", "batch:rows;hidden:cols", 2),
  ],
)
def test_replicated_slices_share_one_variable(mesh_shape, layout, distinct):
  """On virtual CPUs, equal slices are one tf.Variable, updated once."""
  impl = placement.PlacementMeshImpl(
    mesh_shape, layout, ["/cpu:%d" % i for i in range(4)]
  )
  w0 = np.arange(32, dtype=np.float32).reshape(4, 8)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  hidden = mtf.Dimension("hidden", 8)
  with mtf.variable_store(mtf.VariableStore()):
    w = mtf.get_variable(
      mesh, "w", [mtf.Dimension("d", 4), hidden], initializer=w0
    )
    mtf.assign_sub(w, mtf.ones(mesh, w.shape) * 2.0)
    lowering = mtf.Lowering(graph, {mesh: impl})  # Eager: assigns now.
  slices = lowering.variables[w.operation].slice_variables
  assert len(slices) == 4
  assert len({id(s) for s in slices}) == distinct
  full = impl.combine_slices([s.read_value() for s in slices], w.shape)
  np.testing.assert_array_equal(full.numpy(), w0 - 2.0)


@meshes.parametrize(
  [
    ("all:4", "b:all"),
    ("rows:2;cols:2", "b:rows;c:cols"),
    ("rows:2;cols:2", "b:cols"),
  ]
)
def test_reduce_first_lazy_sums(mesh_shape, layout):
  """Size-keeping linear ops on lazy sums run after the allreduce, same values."""
  impl = placement.PlacementMeshImpl(
    mesh_shape, layout, ["/cpu:%d" % i for i in range(4)]
  )
  rng = np.random.default_rng(3)
  x = rng.standard_normal([4, 6]).astype(np.float32)
  w = rng.standard_normal([4, 8]).astype(np.float32)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  b, c, d = mtf.Dimension("b", 4), mtf.Dimension("c", 6), mtf.Dimension("d", 8)
  mx = mtf.import_tf_tensor(mesh, x, [b, c])
  mw = mtf.import_tf_tensor(mesh, w, [b, d])
  g = mtf.einsum([mx, mw], output_shape=[c, d])  # contracts b: lazy
  scaled = g * 0.5  # reduce first
  chained = mtf.reshape(scaled * 2.0, [mtf.Dimension("cd", 48)])
  both = scaled + g  # continues the laziness
  total = mtf.reduce_sum(scaled, output_shape=[d])
  lowering = mtf.Lowering(graph, {mesh: impl})
  split_b = "b:" in layout
  assert (
    isinstance(lowering.tensors[scaled], placement.ReduceFirstLazySum)
    == split_b
  )
  xw = x.T @ w
  got = [
    lowering.export_to_tf_tensor(t).numpy()
    for t in (scaled, chained, both, total)
  ]
  expected = [0.5 * xw, xw.reshape(48), 1.5 * xw, 0.5 * xw.sum(0)]
  for a, e in zip(got, expected):
    np.testing.assert_allclose(a, e, rtol=1e-5, atol=1e-5)
