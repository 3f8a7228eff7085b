"""Small programs calling the mesh API as tensor2tensor's mtf models call it.

tensor2tensor's Mesh TensorFlow models (mtf_transformer, mtf_transformer2,
mtf_image_transformer, mtf_resnet) were run against this package and the
original 0.1.21 (docs/porting.md, "Real client programs"). These programs
keep the calls where the two differed, written here with the original's
public API only so that the very same code runs on both:

- "spatial_blocks_own_dims": the image transformer passes the query's own
  block dimensions as memory_w_dim (memory_h_dim and memory_w_dim for the
  2-d layer); the original ignored them.
- "bfloat16_embedding_stack" and "bfloat16_matmuls": bfloat16 activations
  through gather, a broadcast positional add, an RMS norm, a residual
  dense-relu-dense block and logits, and the einsum shapes of their
  gradients; below float32 every sum rounds, so only the original's op
  sequence gives its numbers.

`run_program(mtf, name)` builds the program in a tf.compat.v1 graph on one
device, runs it in a Session and returns {output name: numpy array}: the
outputs and the gradients of a fixed scalar with respect to the input and to
every variable. data/make_t2t_style_original.py stored what the original
computed; t2t_style_original_test.py compares this package with it.
"""

from typing import Callable, Dict

import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1

B, L, D, H, V = 3, 6, 8, 12, 7


def _dims(mtf):
  return (
    mtf.Dimension("batch", B),
    mtf.Dimension("length", L),
    mtf.Dimension("d_model", D),
    mtf.Dimension("d_ff", H),
    mtf.Dimension("vocab", V),
  )


def _variable(mtf, mesh, name, dims, dtype):
  """A variable; run_program gives every variable its value."""
  return mtf.get_variable(
    mesh,
    name,
    mtf.Shape(dims),
    initializer=tf1.zeros_initializer(),
    activation_dtype=dtype,
  )


def _import(mtf, mesh, value, dims, dtype):
  return mtf.import_tf_tensor(
    mesh, tf.cast(tf.constant(value), dtype), mtf.Shape(dims)
  )


def _spatial_blocks_own_dims(mtf, mesh, rng):
  """1-d and 2-d spatial block attention with the query's dims as memory."""
  batch = mtf.Dimension("batch", 2)
  num_blocks, block = mtf.Dimension("num_wblocks", 3), mtf.Dimension("w", 4)
  nh, nw = mtf.Dimension("num_h_blocks", 2), mtf.Dimension("num_w_blocks", 2)
  h, w = mtf.Dimension("h", 2), mtf.Dimension("wd", 3)
  d_model = mtf.Dimension("d_model", 4)
  heads, d_kv = mtf.Dimension("heads", 2), mtf.Dimension("d_kv", 3)
  x1 = _import(
    mtf,
    mesh,
    rng.normal(size=[2, 3, 4, 4]).astype(np.float32),
    [batch, num_blocks, block, d_model],
    tf.float32,
  )
  x2 = _import(
    mtf,
    mesh,
    rng.normal(size=[2, 2, 2, 2, 3, 4]).astype(np.float32),
    [batch, nh, nw, h, w, d_model],
    tf.float32,
  )
  y1 = mtf.layers.local_self_attention_spatial_blocks(
    x1, d_kv, heads, True, memory_w_dim=block, mask_right=True, name="one_d"
  )
  y2 = mtf.layers.local_self_attention_spatial_blocks(
    x1, d_kv, heads, True, memory_w_dim=block, mask_right=False, name="both"
  )
  # The 2-d layer's softmax is not the original's (docs/design.md); only
  # that it runs with these arguments, and its shape, is checked.
  y3 = mtf.layers.local_2d_self_attention_spatial_blocks(
    x2, d_kv, heads, True, memory_h_dim=nh, memory_w_dim=nw, name="two_d"
  )
  return {"one_d": y1, "both": y2}, [x1], {"two_d_shape": y3}


def _bfloat16_embedding_stack(mtf, mesh, rng):
  """Embedding, positions, RMS norm, residual dense-relu-dense, logits."""
  batch, length, d_model, d_ff, vocab = _dims(mtf)
  dtype = tf.bfloat16
  ids = mtf.import_tf_tensor(
    mesh,
    tf.constant(rng.randint(0, V, size=[B, L]).astype(np.int32)),
    mtf.Shape([batch, length]),
  )
  embedding = _variable(mtf, mesh, "embedding", [vocab, d_model], dtype)
  positions = _variable(mtf, mesh, "positions", [length, d_model], dtype)
  x = mtf.gather(embedding, ids, vocab) + positions

  def rms_norm(x, name):
    scale = _variable(mtf, mesh, name, [d_model], dtype)
    variance = mtf.reduce_mean(mtf.square(x), reduced_dim=d_model)
    return x * mtf.rsqrt(variance + 1e-6) * scale

  wi = _variable(mtf, mesh, "wi", [d_model, d_ff], dtype)
  wo = _variable(mtf, mesh, "wo", [d_ff, d_model], dtype)
  hidden = mtf.relu(
    mtf.einsum([rms_norm(x, "scale0"), wi], reduced_dims=[d_model])
  )
  x += mtf.einsum([hidden, wo], reduced_dims=[d_ff])
  softmax = _variable(mtf, mesh, "softmax", [d_model, vocab], dtype)
  logits = mtf.einsum([rms_norm(x, "scale1"), softmax], reduced_dims=[d_model])
  return {"logits": logits}, [], {}


def _bfloat16_matmuls(mtf, mesh, rng):
  """A dense layer, a batched dot product and an outer product."""
  batch, length, d_model, d_ff, _ = _dims(mtf)
  dtype = tf.bfloat16
  x = _import(
    mtf,
    mesh,
    rng.normal(size=[B, L, D]).astype(np.float32) * 2,
    [batch, length, d_model],
    dtype,
  )
  w = _variable(mtf, mesh, "w", [d_model, d_ff], dtype)
  v = _variable(mtf, mesh, "v", [d_model], dtype)
  dense = mtf.einsum([x, w], reduced_dims=[d_model])
  dots = mtf.einsum([x, x * v], reduced_dims=[d_model])
  outer = mtf.einsum([x, v], output_shape=[batch, length, d_model])
  return {"dense": dense, "dots": dots, "outer": outer}, [x], {}


PROGRAMS: Dict[str, Callable] = {
  "spatial_blocks_own_dims": _spatial_blocks_own_dims,
  "bfloat16_embedding_stack": _bfloat16_embedding_stack,
  "bfloat16_matmuls": _bfloat16_matmuls,
}


def run_program(mtf, name: str) -> Dict[str, np.ndarray]:
  """Runs PROGRAMS[name] on one device; returns {output name: array}.

  Outputs are float32 (bfloat16 values converted exactly): "y:<name>" for
  each output, "grad:x<i>" for each input and "grad:<variable>" for each
  variable (that the outputs use), of the sum of every output times fixed
  weights;
  shape-only outputs give "shape:<name>".

  Args:
    mtf: the mesh_tensorflow package under test.
    name: the program.
  """
  rng = np.random.RandomState(sorted(PROGRAMS).index(name))
  graph = tf.Graph()
  with graph.as_default():
    mtf_graph = mtf.Graph()
    mesh = mtf.Mesh(mtf_graph, "mesh")
    outputs, inputs, shapes = PROGRAMS[name](mtf, mesh, rng)
    loss = None
    for key in sorted(outputs):
      y = outputs[key]
      weights = rng.normal(size=y.shape.to_integer_list).astype(np.float32)
      term = mtf.reduce_sum(
        y * _import(mtf, mesh, weights, y.shape.dims, y.dtype)
      )
      loss = term if loss is None else loss + term
    variables = mtf_graph.trainable_variables
    grads = mtf.gradients(
      [loss], list(inputs) + [v.outputs[0] for v in variables]
    )
    mesh_impl = mtf.placement_mesh_impl.PlacementMeshImpl(
      mtf.Shape([]), mtf.LayoutRules([]), [""]
    )
    lowering = mtf.Lowering(mtf_graph, {mesh: mesh_impl})
    fetches = {}
    for key, y in outputs.items():
      fetches["y:" + key] = lowering.export_to_tf_tensor(y)
    for i, g in enumerate(grads[: len(inputs)]):
      fetches["grad:x%d" % i] = lowering.export_to_tf_tensor(g)
    for v, g in zip(variables, grads[len(inputs) :]):
      if g is not None:
        fetches["grad:" + v.name] = lowering.export_to_tf_tensor(g)
    fetches = {k: tf.cast(t, tf.float32) for k, t in fetches.items()}
    # Every variable (also those layers make) gets its value by name order.
    names = {v.name for v in mtf_graph.all_variables}
    masters = [v for v in tf1.global_variables() if v.op.name in names]
    with tf1.Session(graph=graph) as session:
      session.run(tf1.global_variables_initializer())
      for v in sorted(masters, key=lambda v: v.op.name):
        value = rng.normal(size=v.shape.as_list()) * 0.5
        if "scale" in v.op.name:
          value = 1.0 + value * 0.2
        v.load(value.astype(np.float32), session)
      session.run(lowering.copy_masters_to_slices())
      results = session.run(fetches)
  for key, y in shapes.items():
    results["shape:" + key] = np.array(y.shape.to_integer_list)
  return results
