"""End-to-end model tests: a T5-shaped Bitransformer and a decoder-only LM.

The layout promise for whole models: forward logits, loss and gradients are
the same (1e-5) on a 1-device mesh and on 2x2 meshes with model- and
data-parallel layouts. Weights are shared between the runs (one
VariableStore), so every difference is the lowering's. Also checks the
checkpoint variable names (the original's) and shape-only building of a
multi-billion-parameter model.
"""

import time

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
import mesh_tensorflow.transformer as mtf_transformer  # noqa: F401  (alias check below)
from tests import mesh_test_util as mtu
from tests import meshes
from transformer import transformer
from transformer import transformer_layers  # noqa: F401  (registers layers with gin)

VOCAB, BATCH, LENGTH, D_MODEL = 20, 4, 8, 16

# T5.1.0-style tiny model: legacy LayerStack (layer_norm / final_layer_norm),
# shared relative attention bias, no positional embeddings, shared embedding.
T5_GIN = """
make_layer_stack.num_layers = 2
encoder/make_layer_stack.layers = [
    @transformer_layers.SelfAttention, @transformer_layers.DenseReluDense]
decoder/make_layer_stack.layers = [
    @transformer_layers.SelfAttention, @transformer_layers.EncDecAttention,
    @transformer_layers.DenseReluDense]
LayerStack.dropout_rate = 0.0
LayerStack.norm_epsilon = 1e-6
Unitransformer.d_model = 16
Unitransformer.max_length = 8
Unitransformer.positional_embedding = False
Unitransformer.shared_embedding_and_softmax_weights = True
Unitransformer.z_loss = 1e-4
transformer_layers.SelfAttention.num_heads = 4
transformer_layers.SelfAttention.key_value_size = 4
transformer_layers.SelfAttention.relative_attention_type = "bias_shared"
transformer_layers.EncDecAttention.num_heads = 4
transformer_layers.EncDecAttention.key_value_size = 4
transformer_layers.DenseReluDense.hidden_size = 32
transformer_layers.DenseReluDense.dropout_rate = 0.0
make_bitransformer.input_vocab_size = 20
make_bitransformer.output_vocab_size = 20
"""


@pytest.fixture
def t5_gin():
  gin.clear_config()
  gin.parse_config(T5_GIN)
  yield
  gin.clear_config()


def _ids(seed, low=1):
  rng = np.random.RandomState(seed)
  ids = rng.randint(low, VOCAB, size=(BATCH, LENGTH)).astype(np.int32)
  ids[0, 6:] = 0  # padding at the end of one example
  return ids


INPUTS, TARGETS = _ids(0), _ids(1)


def _dims():
  return mtf.Dimension("batch", BATCH), mtf.Dimension("length", LENGTH)


def _run(build_fn, mesh_shape, layout, store):
  """Builds and lowers build_fn(mesh) in a tf.function, weights from store."""

  @tf.function(autograph=False)
  def fn():
    with mtf.variable_store(store):
      graph = mtf.Graph()
      mesh = mtf.Mesh(graph, "mesh")
      outputs = build_fn(mesh)
      lowering = mtf.Lowering(
        graph, {mesh: mtu.mesh_impl_for(mesh_shape, layout)}
      )
      return [lowering.export_to_tf_tensor(t) for t in outputs]

  return [t.numpy() for t in fn()]


def _bitransformer_program(mesh):
  batch, length = _dims()
  model = transformer.make_bitransformer()
  inputs = mtf.import_tf_tensor(mesh, tf.constant(INPUTS), [batch, length])
  targets = mtf.import_tf_tensor(mesh, tf.constant(TARGETS), [batch, length])
  logits, loss = model.call_simple(inputs, targets, compute_loss=True)
  weights = sorted(mesh.graph.trainable_variables, key=lambda v: v.name)
  grads = mtf.gradients([loss], [v.outputs[0] for v in weights])
  return [logits, loss] + grads


def _lm():
  return transformer.Unitransformer(
    layer_stack=transformer.make_layer_stack(
      layers=[
        transformer_layers.SelfAttention,
        transformer_layers.DenseReluDense,
      ],
      num_layers=2,
    ),
    d_model=D_MODEL,
    input_vocab_size=VOCAB,
    output_vocab_size=VOCAB,
    autoregressive=True,
    max_length=LENGTH,
  )


def _lm_program(mesh):
  batch, length = _dims()
  model = _lm()
  targets = mtf.import_tf_tensor(mesh, tf.constant(TARGETS), [batch, length])
  inputs = transformer.autoregressive_inputs(targets)
  logits, loss = model.call_simple(inputs, targets, compute_loss=True)
  weights = sorted(mesh.graph.trainable_variables, key=lambda v: v.name)
  grads = mtf.gradients([loss], [v.outputs[0] for v in weights])
  return [logits, loss] + grads


def _assert_same(out, base, where):
  assert len(out) == len(base)
  for i, (a, b) in enumerate(zip(out, base)):
    scale = max(1.0, float(np.abs(b).max()))
    np.testing.assert_allclose(
      a, b, rtol=1e-5, atol=1e-5 * scale, err_msg="output %d on %s" % (i, where)
    )


_BASELINES = {}


def _baseline(program):
  """(store, 1-device outputs) of program, computed once per module."""
  if program not in _BASELINES:
    store = mtf.VariableStore()
    _BASELINES[program] = store, _run(program, "", "", store)
  return _BASELINES[program]


@meshes.parametrize(meshes.T5_MODEL)
def test_bitransformer_same_numbers_on_every_layout(t5_gin, mesh_shape, layout):
  store, base = _baseline(_bitransformer_program)
  out = _run(_bitransformer_program, mesh_shape, layout, store)
  _assert_same(out, base, meshes.mesh_layout_id(mesh_shape, layout))
  logits, loss = base[0], float(base[1])
  assert logits.shape == (BATCH, LENGTH, 128)  # vocab padded to 128
  assert np.isfinite(loss) and loss > 0
  assert any(np.abs(g).max() > 0 for g in base[2:])


@meshes.parametrize(meshes.T5_MODEL[:2])
def test_decoder_only_lm_same_numbers_on_every_layout(
  t5_gin, mesh_shape, layout
):
  store, base = _baseline(_lm_program)
  out = _run(_lm_program, mesh_shape, layout, store)
  _assert_same(out, base, meshes.mesh_layout_id(mesh_shape, layout))


def _prompts():
  prompt = np.zeros((BATCH, LENGTH), np.int32)
  for row, n in enumerate([2, 0, 3, 1]):
    prompt[row, :n] = TARGETS[row, :n]
  return prompt


@meshes.parametrize(meshes.T5_DECODE)
def test_lm_greedy_decoding_equals_teacher_forced_argmax(
  t5_gin, mesh_shape, layout
):
  """Incremental decoding (cached keys/values) = the full causal forward."""
  prompt = _prompts()

  def build(mesh):
    batch, length = _dims()
    lm = _lm()
    partial = mtf.import_tf_tensor(mesh, tf.constant(prompt), [batch, length])
    ids = lm.sample_autoregressive(partial, stop_at_token=None)
    logits, _ = lm.call_simple(
      transformer.autoregressive_inputs(ids), None, False, mode="infer"
    )
    return [ids, logits]

  tf.random.set_seed(3)
  ids, logits = _run(build, mesh_shape, layout, mtf.VariableStore())
  for row, n in enumerate((prompt != 0).sum(-1)):
    np.testing.assert_array_equal(ids[row, :n], prompt[row, :n])
    np.testing.assert_array_equal(
      ids[row, n:], logits[row, n:].argmax(-1), err_msg="row %d" % row
    )


def test_lm_beam_search_with_one_beam_equals_greedy(t5_gin):
  # EOS never wins, so the single beam cannot end early.
  gin.bind_parameter("mesh_tensorflow.beam_search.beam_search.eos_id", 10**6)

  def build(mesh):
    batch, length = _dims()
    lm = _lm()
    beam = mtf.Dimension("beam", 1)
    beams = lm.beam_search(
      mtf.zeros(mesh, [batch, beam, length], tf.int32),
      decode_length=LENGTH,
      alpha=0.0,
    )
    greedy = lm.sample_autoregressive(
      mtf.zeros(mesh, [batch, length], tf.int32), stop_at_token=None
    )
    return [beams, greedy]

  tf.random.set_seed(4)
  beams, greedy = _run(build, "", "", mtf.VariableStore())
  np.testing.assert_array_equal(beams, greedy)


@meshes.parametrize(meshes.T5_DECODE)
def test_bitransformer_greedy_decode_equals_teacher_forced_argmax(
  t5_gin, mesh_shape, layout
):
  def build(mesh):
    batch, length = _dims()
    model = transformer.make_bitransformer()
    inputs = mtf.import_tf_tensor(mesh, tf.constant(INPUTS), [batch, length])
    decoded = model.decode(inputs)  # greedy, stops at EOS (id 1)
    # Teacher forcing on the decoded ids: logits[t] sees decoded[:t].
    logits, _ = model.call_simple(inputs, decoded, False, mode="infer")
    return [decoded, logits]

  tf.random.set_seed(5)
  decoded, logits = _run(build, mesh_shape, layout, mtf.VariableStore())
  assert decoded.shape == (BATCH, LENGTH)
  # All rows step together until every row has produced EOS; later
  # positions stay 0.
  ends = [list(row).index(1) + 1 if 1 in row else LENGTH for row in decoded]
  steps = max(ends)
  np.testing.assert_array_equal(
    decoded[:, :steps], logits[:, :steps].argmax(-1)
  )
  np.testing.assert_array_equal(decoded[:, steps:], 0)


def _loss_from_logits(logits, targets, z_loss):
  """Numpy: sum over non-padding targets of CE + z_loss * logsumexp^2,
  divided by the number of target positions (padding included): the
  original's default loss denominator, constant for any padding.
  """
  logits = logits.astype(np.float64)
  lse = np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1))
  lse += logits.max(-1)
  picked = np.take_along_axis(logits, targets[..., None], -1)[..., 0]
  per_token = lse - picked + z_loss * lse**2
  weights = (targets > 0).astype(np.float64)
  return (per_token * weights).sum() / targets.size


def test_bitransformer_loss_matches_logits(t5_gin):
  logits, loss = _baseline(_bitransformer_program)[1][:2]
  np.testing.assert_allclose(
    float(loss), _loss_from_logits(logits, TARGETS, 1e-4), rtol=1e-5
  )


T5_VARIABLES = {
  "shared/embedding": [128, D_MODEL],
  "encoder/final_layer_norm/scale": [D_MODEL],
  "decoder/final_layer_norm/scale": [D_MODEL],
}
for _tower, _layers in (
  ("encoder", ["SelfAttention", "DenseReluDense"]),
  ("decoder", ["SelfAttention", "EncDecAttention", "DenseReluDense"]),
):
  for _block in range(2):
    for _index, _cls in enumerate(_layers):
      _prefix = "%s/block_%03d/layer_%03d/" % (_tower, _block, _index)
      T5_VARIABLES[_prefix + "layer_norm/scale"] = [D_MODEL]
      if _cls == "DenseReluDense":
        T5_VARIABLES[_prefix + "DenseReluDense/wi/kernel"] = [D_MODEL, 32]
        T5_VARIABLES[_prefix + "DenseReluDense/wo/kernel"] = [32, D_MODEL]
      else:
        for _w in "qkv":
          T5_VARIABLES[_prefix + "%s/%s" % (_cls, _w)] = [D_MODEL, 16]
        T5_VARIABLES[_prefix + "%s/o" % _cls] = [16, D_MODEL]
  T5_VARIABLES[
    "%s/block_000/layer_000/SelfAttention/relative_attention_bias" % _tower
  ] = [4, 32]


def test_t5_variable_names_and_shapes(t5_gin):
  names = {}

  def build(mesh):
    out = _bitransformer_program(mesh)
    names.update(
      {v.name: v.shape.to_integer_list for v in mesh.graph.all_variables}
    )
    return out[:2]

  _run(build, "", "", mtf.VariableStore())
  assert names == T5_VARIABLES


def test_mesh_tensorflow_transformer_is_the_same_module():
  import mesh_tensorflow.transformer.transformer as aliased  # pylint: disable=g-import-not-at-top

  assert aliased is transformer


def test_shape_only_build_of_a_multi_billion_parameter_model():
  """Graph building allocates nothing: a ~5B-parameter model builds fast."""
  gin.clear_config()
  try:
    gin.parse_config(
      T5_GIN.replace(
        "make_layer_stack.num_layers = 2", "make_layer_stack.num_layers = 24"
      )
      .replace("Unitransformer.d_model = 16", "Unitransformer.d_model = 1024")
      .replace(
        "DenseReluDense.hidden_size = 32", "DenseReluDense.hidden_size = 65536"
      )
      .replace(
        "Unitransformer.max_length = 8", "Unitransformer.max_length = 512"
      )
    )
    start = time.time()
    with tf.Graph().as_default():
      with mtf.variable_store(mtf.VariableStore()):
        graph = mtf.Graph()
        mesh = mtf.Mesh(graph, "mesh")
        batch = mtf.Dimension("batch", 128)
        length = mtf.Dimension("length", 512)
        ids = mtf.zeros(mesh, [batch, length], tf.int32)
        model = transformer.make_bitransformer()
        logits, loss = model.call_simple(ids, ids, compute_loss=True)
        num_params = sum(v.size for v in graph.all_variables)
    elapsed = time.time() - start
  finally:
    gin.clear_config()
  assert logits.shape.to_integer_list == [128, 512, 128]
  assert loss.shape.ndims == 0
  assert num_params > 5e9, num_params
  # Generous bound: building must not touch the 20 GB of weights.
  assert elapsed < 120, elapsed


def test_heads_not_divisible_by_mesh_split_names_the_dim(t5_gin):
  gin.parse_config(
    "transformer_layers.SelfAttention.num_heads = 3\n"
    "transformer_layers.EncDecAttention.num_heads = 3"
  )
  with pytest.raises(ValueError, match="heads"):
    _run(
      _bitransformer_program, "b:2;m:2", "batch:b;heads:m", mtf.VariableStore()
    )


def test_unknown_layer_class_in_gin_names_it():
  gin.clear_config()
  try:
    with pytest.raises(Exception, match="NoSuchLayer"):
      gin.parse_config(
        "make_layer_stack.layers = [@transformer_layers.NoSuchLayer]"
      )
  finally:
    gin.clear_config()


def test_missing_required_gin_parameter_names_it():
  gin.clear_config()
  with pytest.raises(Exception, match="input_vocab_size"):
    transformer.make_bitransformer()
