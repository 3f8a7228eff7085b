"""Bitransformer and StudentTeacher against numpy; decoding; gin builders."""

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mesh_test_util as mtu
from tests.transformer import core_model_util as cmu
from transformer import transformer

B, L, D, V = cmu.BATCH, cmu.LENGTH, cmu.D_MODEL, cmu.VOCAB
ENC_LAYERS = [("DenseReluLayer", "block_000/layer_000")]
DEC_LAYERS = [
  ("RunningMeanLayer", "block_000/layer_000"),
  ("EncDecGateLayer", "block_000/layer_001"),
]


def _tower(layers, name, autoregressive):
  return transformer.Unitransformer(
    transformer.make_layer_stack(layers, num_layers=1),
    d_model=D,
    input_vocab_size=V,
    output_vocab_size=V if autoregressive else None,
    autoregressive=autoregressive,
    max_length=L,
    name=name,
    vocab_divisor=cmu.VOCAB_DIVISOR,
  )


def _bitransformer():
  return transformer.Bitransformer(
    _tower([cmu.DenseReluLayer], "encoder", False),
    _tower([cmu.RunningMeanLayer, cmu.EncDecGateLayer], "decoder", True),
  )


def _run(build_core, mesh_shape="", layout="", mode="eager"):
  names = []

  def build(mesh):
    outputs = list(build_core(mesh))
    variables = cmu.variables_by_name(mesh)
    names[:] = list(variables)
    return outputs + list(variables.values())

  out = mtu.run_program(build, mesh_shape, layout, mode)
  n = len(out) - len(names)
  return out[:n], dict(zip(names, out[n:]))


def _np_bitransformer(
  params, inputs, dec_inputs, enc_nonpad, dec_nonpad, prefix=""
):
  shared = dict(
    embedding=prefix + "shared/embedding",
    positions=prefix + "shared/positional_embedding",
  )
  enc = cmu.np_tower(
    params,
    prefix + "encoder",
    inputs,
    ENC_LAYERS,
    nonpadding=enc_nonpad,
    **shared,
  )
  dec = cmu.np_tower(
    params,
    prefix + "decoder",
    dec_inputs,
    DEC_LAYERS,
    nonpadding=dec_nonpad,
    enc=enc,
    enc_mask=enc_nonpad,
    **shared,
  )
  return dec @ params[prefix + "decoder/logits/kernel"]


def _data():
  inputs = cmu.random_ids(30, (B, L))
  inputs[1, 3:] = 0
  targets = cmu.random_ids(31, (B, L))
  targets[0, 4:] = 0
  targets[2, 2] = 1
  return inputs, targets


@pytest.mark.parametrize(
  "mesh_shape,layout,mode",
  [
    ("", "", "eager"),
    ("rows:2;cols:2", "batch:rows;vocab:cols", "function"),
    ("all:4", "d_model:all", "function"),
  ],
)
def test_call_simple_matches_numpy(mesh_shape, layout, mode):
  inputs, targets = _data()

  def build(mesh):
    return _bitransformer().call_simple(
      cmu.import_ids(mesh, inputs, ["batch", "length"]),
      cmu.import_ids(mesh, targets, ["batch", "length"]),
      compute_loss=True,
      mode="eval",
    )

  (logits, loss), params = _run(build, mesh_shape, layout, mode)
  assert sorted(params) == sorted(
    [
      "shared/embedding",
      "shared/positional_embedding",
      "encoder/block_000/layer_000/DenseReluLayer/wi",
      "encoder/block_000/layer_000/DenseReluLayer/wo",
      "encoder/block_000/layer_000/rms_norm/scale",
      "encoder/rms_norm/scale",
      "decoder/block_000/layer_000/RunningMeanLayer/scale",
      "decoder/block_000/layer_000/rms_norm/scale",
      "decoder/block_000/layer_001/EncDecGateLayer/gate",
      "decoder/block_000/layer_001/rms_norm/scale",
      "decoder/rms_norm/scale",
      "decoder/logits/kernel",
    ]
  )
  dec_inputs = np.concatenate(
    [np.zeros((B, 1), np.int32), targets[:, :-1]], 1
  ) * (targets != 0)
  expected = _np_bitransformer(
    params,
    inputs,
    dec_inputs,
    (inputs != 0).astype(np.float32),
    (targets != 0).astype(np.float32),
  )
  np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(loss, cmu.np_loss(expected, targets), rtol=1e-5)


def test_properties_and_unshared_embedding():
  model = _bitransformer()
  assert model.output_vocab_dim == mtf.Dimension("vocab", cmu.VOCAB_PADDED)
  assert model.z_loss == 1e-4
  inputs, targets = _data()

  def build(mesh):
    model = _bitransformer()
    model.shared_embedding = False
    return [
      model.call_simple(
        cmu.import_ids(mesh, inputs, ["batch", "length"]),
        cmu.import_ids(mesh, targets, ["batch", "length"]),
        compute_loss=False,
      )[0]
    ]

  _, params = _run(build)
  assert "shared/embedding" not in params
  assert "encoder/embedding" in params and "decoder/embedding" in params
  assert "decoder/positional_embedding" in params


def test_decode_agrees_with_teacher_forcing():
  """Greedy decoding is the teacher-forced argmax; beams do not score worse."""
  inputs, _ = _data()

  def build(mesh):
    model = _bitransformer()
    ids_in = cmu.import_ids(mesh, inputs, ["batch", "length"])
    outputs = []
    for beam_size in (1, 2):
      ids = model.decode(ids_in, beam_size=beam_size, alpha=0.0)
      logits, _ = model.call_simple(
        ids_in, ids, False, mode="infer", decoder_sequence_id=mtf.ones_like(ids)
      )
      outputs += [ids, logits]
    return outputs

  (greedy, greedy_logits, beam, beam_logits), _ = _run(build)
  assert greedy.shape == beam.shape == (B, L)

  def score(ids, logits, b):
    eos = np.flatnonzero(ids[b] == 1)
    if not eos.size:
      return None, L
    log_probs = cmu.np_log_softmax(logits[b, : eos[0] + 1])[0]
    return log_probs[np.arange(eos[0] + 1), ids[b, : eos[0] + 1]].sum(), eos[0]

  for b in range(B):
    greedy_score, end = score(greedy, greedy_logits, b)
    np.testing.assert_array_equal(
      greedy[b, : end + 1], greedy_logits[b, : end + 1].argmax(-1)
    )
    beam_score, _ = score(beam, beam_logits, b)
    if greedy_score is not None and beam_score is not None:
      assert beam_score >= greedy_score - 1e-4


def test_decode_rejects_sampling_with_beams():
  inputs, _ = _data()

  def build(mesh):
    return [
      _bitransformer().decode(
        cmu.import_ids(mesh, inputs, ["batch", "length"]),
        beam_size=2,
        temperature=0.5,
      )
    ]

  with pytest.raises(ValueError, match="temperature"):
    _run(build)


def test_student_teacher_loss_and_initialize(tmp_path):
  inputs, targets = _data()
  teacher_store = mtf.VariableStore()
  # A teacher trained alone: its variables have no "teacher/" prefix.
  with mtf.variable_store(teacher_store):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    _bitransformer().call_simple(
      cmu.import_ids(mesh, inputs, ["batch", "length"]),
      cmu.import_ids(mesh, targets, ["batch", "length"]),
      False,
    )
  ckpt_path = str(tmp_path / "teacher")
  # The masters under their mtf names (the original's checkpoint names).
  _save_by_name(teacher_store.masters, ckpt_path)

  store = mtf.VariableStore()
  temperature, fraction = 2.0, 0.25
  # The soft loss counts once the global step exceeds distill_start_step (0);
  # other tests in this process may have left the global step at 0.
  mtf.optimize.get_or_create_global_step().assign(1)

  def build(mesh):
    st = transformer.StudentTeacher(
      _bitransformer(),
      _bitransformer(),
      temperature=temperature,
      fraction_soft=fraction,
      teacher_checkpoint=ckpt_path,
      initialize_student_weights=True,
    )
    ids_in = cmu.import_ids(mesh, inputs, ["batch", "length"])
    tgt = cmu.import_ids(mesh, targets, ["batch", "length"])
    logits, loss = st.call_simple(ids_in, tgt, True)
    trainable = sorted(v.name for v in mesh.graph.trainable_variables)
    build.trainable = trainable
    build.st = st
    variables = cmu.variables_by_name(mesh)
    build.names = list(variables)
    return [logits, loss] + list(variables.values())

  _run_with_store(store, build)
  assert build.trainable and all(
    n.startswith("student/") for n in build.trainable
  )
  with mtf.variable_store(store):
    build.st.initialize()
  for name, var in teacher_store.masters.items():
    np.testing.assert_array_equal(
      store.masters["teacher/" + name].numpy(), var.numpy()
    )
    np.testing.assert_array_equal(
      store.masters["student/" + name].numpy(), var.numpy()
    )
  out = _run_with_store(store, build)
  logits, loss, values = out[0], out[1], out[2:]
  params = dict(zip(build.names, values))
  dec_inputs = np.concatenate(
    [np.zeros((B, 1), np.int32), targets[:, :-1]], 1
  ) * (targets != 0)
  args = (
    inputs,
    dec_inputs,
    (inputs != 0).astype(np.float32),
    (targets != 0).astype(np.float32),
  )
  student = _np_bitransformer(params, *args, prefix="student/")
  teacher = _np_bitransformer(params, *args, prefix="teacher/")
  np.testing.assert_allclose(logits, student, rtol=1e-5, atol=1e-5)
  hard = cmu.np_loss(student, targets, z_loss=1e-4)
  soft_targets = np.exp(cmu.np_log_softmax(teacher / temperature)[0])
  log_probs, log_z = cmu.np_log_softmax(student / temperature)
  soft = -(soft_targets * log_probs).sum(-1) + 1e-4 * log_z**2
  soft = (soft * (targets > 0)).sum() / targets.size
  expected = (1 - fraction) * hard + temperature**2 * fraction * soft
  np.testing.assert_allclose(loss, expected, rtol=1e-5)


def _save_by_name(variables, path):
  """Writes a TF V2 checkpoint whose keys are the given names."""
  values = {name: var.numpy() for name, var in variables.items()}
  with tf.Graph().as_default():
    tf_vars = {
      name: tf.compat.v1.Variable(value, name="v%d" % i)
      for i, (name, value) in enumerate(sorted(values.items()))
    }
    saver = tf.compat.v1.train.Saver(tf_vars)
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      saver.save(sess, path)


def _run_with_store(store, build):
  with mtf.variable_store(store):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    outputs = build(mesh)
    lowering = mtf.Lowering(graph, {mesh: mtu.mesh_impl_for("", "")})
    return [np.asarray(lowering.export_to_tf_tensor(t)) for t in outputs]


def test_make_bitransformer_gin_scopes():
  gin.clear_config()
  try:
    gin.bind_parameter("encoder/make_layer_stack.layers", [cmu.DenseReluLayer])
    gin.bind_parameter(
      "decoder/make_layer_stack.layers",
      [cmu.RunningMeanLayer, cmu.EncDecGateLayer],
    )
    gin.bind_parameter("make_layer_stack.num_layers", 2)
    gin.bind_parameter("decoder/make_layer_stack.num_layers", 1)
    gin.bind_parameter("Unitransformer.d_model", D)
    gin.bind_parameter("Unitransformer.max_length", L)
    model = transformer.make_bitransformer(
      input_vocab_size=V, output_vocab_size=V + 3
    )
    assert isinstance(model, transformer.Bitransformer)
    assert model.encoder.name == "encoder" and not model.encoder.autoregressive
    assert model.encoder.output_vocab_dim is None
    assert model.decoder.autoregressive
    assert model.decoder.output_vocab_dim.size == 128
    assert [l.name for l in model.encoder.layer_stack.layers] == [
      "block_000/layer_000",
      "block_001/layer_000",
    ]
    assert [type(l).__name__ for l in model.decoder.layer_stack.layers] == [
      "RunningMeanLayer",
      "EncDecGateLayer",
    ]
    # Nested gin scopes: "student/encoder/..." (here: unscoped layers).
    gin.bind_parameter("make_layer_stack.layers", [cmu.DenseReluLayer])
    st = transformer.make_bi_student_teacher(
      input_vocab_size=V, output_vocab_size=V
    )
    assert isinstance(st, transformer.StudentTeacher)
    assert isinstance(st.teacher, transformer.Bitransformer)
  finally:
    gin.clear_config()


def test_t5_shaped_bitransformer_variable_names():
  """make_bitransformer with the real layers: the original's names."""
  from transformer import transformer_layers as tl  # pylint: disable=g-import-not-at-top

  inputs, targets = _data()
  gin.clear_config()
  try:
    gin.bind_parameter(
      "encoder/make_layer_stack.layers", [tl.SelfAttention, tl.DenseReluDense]
    )
    gin.bind_parameter(
      "decoder/make_layer_stack.layers",
      [tl.SelfAttention, tl.EncDecAttention, tl.DenseReluDense],
    )
    gin.bind_parameter("make_layer_stack.num_layers", 2)
    gin.bind_parameter("LayerStack.dropout_rate", 0.0)
    gin.bind_parameter("LayerStack.norm_epsilon", 1e-6)
    gin.bind_parameter("Unitransformer.d_model", D)
    gin.bind_parameter("Unitransformer.max_length", L)
    gin.bind_parameter("Unitransformer.positional_embedding", False)
    gin.bind_parameter("transformer_layers.SelfAttention.num_heads", 2)
    gin.bind_parameter("transformer_layers.SelfAttention.key_value_size", 4)
    gin.bind_parameter(
      "transformer_layers.SelfAttention.relative_attention_type", "bias_shared"
    )
    gin.bind_parameter("transformer_layers.DenseReluDense.hidden_size", 12)

    def build(mesh):
      model = transformer.make_bitransformer(
        input_vocab_size=V, output_vocab_size=V
      )
      return model.call_simple(
        cmu.import_ids(mesh, inputs, ["batch", "length"]),
        cmu.import_ids(mesh, targets, ["batch", "length"]),
        True,
      )

    (logits, loss), params = _run(build)
  finally:
    gin.clear_config()
  assert logits.shape == (B, L, 128) and np.isfinite(loss)
  shapes = {k: v.shape for k, v in params.items()}
  assert shapes["shared/embedding"] == (128, D)
  assert shapes["decoder/logits/kernel"] == (D, 128)
  assert shapes["encoder/final_layer_norm/scale"] == (D,)
  assert shapes["decoder/final_layer_norm/scale"] == (D,)
  for tower, layers in (
    ("encoder", ["SelfAttention", "DenseReluDense"]),
    ("decoder", ["SelfAttention", "EncDecAttention", "DenseReluDense"]),
  ):
    for block in range(2):
      for n, cls in enumerate(layers):
        prefix = "%s/block_%03d/layer_%03d/" % (tower, block, n)
        assert shapes[prefix + "layer_norm/scale"] == (D,)
        if cls == "DenseReluDense":
          assert shapes[prefix + "DenseReluDense/wi/kernel"] == (D, 12)
          assert shapes[prefix + "DenseReluDense/wo/kernel"] == (12, D)
        else:
          for var in "qkv":
            assert shapes[prefix + cls + "/" + var] == (D, 8)
          assert shapes[prefix + cls + "/o"] == (8, D)
  assert (
    "encoder/block_000/layer_000/SelfAttention/relative_attention_bias"
    in shapes
  )
  assert not any(
    k.startswith(("encoder/embedding", "decoder/embedding")) for k in shapes
  )
