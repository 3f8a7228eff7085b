"""Unitransformer: call_simple against numpy, decoding, helpers, ensembles."""

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mesh_test_util as mtu
from tests import meshes
from tests.transformer import core_model_util as cmu
from transformer import transformer

B, L, D, V = cmu.BATCH, cmu.LENGTH, cmu.D_MODEL, cmu.VOCAB
LAYERS = [
  ("DenseReluLayer", "block_000/layer_000"),
  ("RunningMeanLayer", "block_000/layer_001"),
]


def _lm(**kwargs):
  stack = transformer.make_layer_stack(
    [cmu.DenseReluLayer, cmu.RunningMeanLayer], num_layers=1
  )
  params = dict(
    d_model=D,
    input_vocab_size=V,
    output_vocab_size=V,
    autoregressive=True,
    max_length=L,
    vocab_divisor=cmu.VOCAB_DIVISOR,
  )
  params.update(kwargs)
  return transformer.Unitransformer(stack, **params)


def _targets(seed):
  targets = cmu.random_ids(seed, (B, L), low=0)
  targets[0, 4:] = 0  # padding
  targets[2, 1] = -targets[2, 1] - 1  # a masked (negative) target
  return targets


def _run(build_core, mesh_shape="", layout="", mode="eager"):
  """build_core(mesh) -> outputs; returns (outputs, {variable: value})."""
  names = []

  def build(mesh):
    outputs = list(build_core(mesh))
    variables = cmu.variables_by_name(mesh)
    names[:] = list(variables)
    return outputs + list(variables.values())

  out = mtu.run_program(build, mesh_shape, layout, mode)
  n = len(out) - len(names)
  return out[:n], dict(zip(names, out[n:]))


def _np_lm_logits(params, inputs, name="transformer", positions=True):
  hidden = cmu.np_tower(
    params,
    name,
    inputs,
    LAYERS,
    positions=name + "/positional_embedding" if positions else None,
  )
  return hidden @ params[name + "/logits/kernel"]


# ----------------------------------------------------------------------------
# Construction.


def test_vocab_padding_and_attributes():
  lm = _lm(vocab_divisor=128)
  assert lm.input_vocab_dim == mtf.Dimension("vocab", 128)
  assert _lm(vocab_divisor=None).output_vocab_dim == mtf.Dimension("vocab", V)
  assert _lm().output_vocab_dim == mtf.Dimension("vocab", cmu.VOCAB_PADDED)
  assert lm.model_dim == mtf.Dimension("d_model", D)
  assert lm.max_length_dim == mtf.Dimension("max_length", L)
  assert lm.fully_autoregressive and lm.ensemble_dims == []
  assert lm.ensemble_dim is None
  assert not _lm(input_full_attention=True).fully_autoregressive
  ens = _lm(ensemble=3)
  assert ens.ensemble_dims == [mtf.Dimension("ensemble", 3)]
  with pytest.raises(ValueError, match="output_vocab_size"):
    _lm(output_vocab_size=None)
  with pytest.raises(ValueError, match="input_full_attention"):
    _lm(autoregressive=False, output_vocab_size=None, input_full_attention=True)


def test_required_parameter_missing_names_it():
  gin.clear_config()
  stack = transformer.LayerStack([])
  with pytest.raises(Exception, match="max_length"):
    transformer.Unitransformer(
      stack, input_vocab_size=V, output_vocab_size=V, autoregressive=True
    )
  with pytest.raises(Exception, match="layers"):
    transformer.make_layer_stack()
  with pytest.raises(Exception, match="input_vocab_size"):
    transformer.make_bitransformer(output_vocab_size=V)


def test_loss_denominator():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "m")
  tgt = mtf.zeros(
    mesh, [mtf.Dimension("batch", B), mtf.Dimension("length", L)], tf.int32
  )
  assert _lm().loss_denominator(tgt, 3) == B * L * 3
  assert _lm(ensemble=2).loss_denominator(tgt, 1) == B * L / 2
  assert _lm(loss_denominator=7).loss_denominator(tgt, 2) == 7.0


# ----------------------------------------------------------------------------
# call_simple.


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_call_simple_matches_numpy(mode):
  inputs, targets = cmu.random_ids(10, (B, L)), _targets(11)

  def build(mesh):
    lm = _lm(label_smoothing=0.1, z_loss=1e-3)
    return lm.call_simple(
      cmu.import_ids(mesh, inputs, ["batch", "length"]),
      cmu.import_ids(mesh, targets, ["batch", "length"]),
      compute_loss=True,
      mode=mode,
      num_microbatches=2,
    )

  (logits, loss), params = _run(build)
  assert sorted(params) == sorted(
    [
      "transformer/embedding",
      "transformer/positional_embedding",
      "transformer/logits/kernel",
      "transformer/rms_norm/scale",
    ]
    + [
      "transformer/%s/%s" % (n, v)
      for n, v in [
        ("block_000/layer_000", "DenseReluLayer/wi"),
        ("block_000/layer_000", "DenseReluLayer/wo"),
        ("block_000/layer_000", "rms_norm/scale"),
        ("block_000/layer_001", "RunningMeanLayer/scale"),
        ("block_000/layer_001", "rms_norm/scale"),
      ]
    ]
  )
  assert params["transformer/logits/kernel"].shape == (D, cmu.VOCAB_PADDED)
  assert params["transformer/positional_embedding"].shape == (L, D)
  expected = _np_lm_logits(params, inputs)
  np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)
  expected_loss = cmu.np_loss(
    expected,
    targets,
    0.1,
    1e-3 if mode == "train" else 0.0,
    denominator=B * L * 2,
  )
  np.testing.assert_allclose(loss, expected_loss, rtol=1e-5)


@meshes.parametrize(meshes.TRANSFORMER_MODELS)
def test_call_simple_same_on_every_mesh(mesh_shape, layout):
  inputs, targets = cmu.random_ids(12, (B, L)), _targets(13)

  def build(mesh):
    lm = _lm(label_smoothing=0.1)
    return lm.call_simple(
      cmu.import_ids(mesh, inputs, ["batch", "length"]),
      cmu.import_ids(mesh, targets, ["batch", "length"]),
      compute_loss=True,
    )

  (logits, loss), params = _run(build, mesh_shape, layout, "function")
  expected = _np_lm_logits(params, inputs)
  np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(
    loss, cmu.np_loss(expected, targets, 0.1, 1e-4), rtol=1e-5
  )


def test_shared_softmax_and_sinusoid_positions():
  inputs, targets = cmu.random_ids(14, (B, L)), _targets(15)

  def build(mesh):
    lm = _lm(
      shared_embedding_and_softmax_weights=True,
      sinusoid_positional_embedding=True,
      z_loss=0.0,
    )
    return lm.call_simple(
      cmu.import_ids(mesh, inputs, ["batch", "length"]),
      cmu.import_ids(mesh, targets, ["batch", "length"]),
      compute_loss=True,
    )

  (logits, loss), params = _run(build)
  assert "transformer/logits/kernel" not in params
  assert "transformer/positional_embedding" not in params
  pos = (
    np.arange(L)[:, None]
    * np.exp(np.arange(D // 2) * -(np.log(1e4) / (D // 2 - 1)))[None, :]
  )
  table = np.concatenate([np.sin(pos), np.cos(pos)], -1)
  emb = params["transformer/embedding"]
  x = emb[inputs] + table
  params["table"] = table
  hidden = cmu.np_tower(
    params, "transformer", inputs, LAYERS, positions="table"
  )
  expected = hidden * D**-0.5 @ emb.T
  np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(loss, cmu.np_loss(expected, targets), rtol=1e-5)
  del x


def test_sinusoid_table():
  def build(mesh):
    return [
      transformer.sinusoid_positional_embedding_weights(
        mesh,
        mtf.Dimension("max_length", 5),
        mtf.Dimension("d_model", 7),
        tf.float32,
        min_timescale=2.0,
        max_timescale=100.0,
      )
    ]

  (table,), _ = _run(build)
  inc = np.log(100.0 / 2.0) / 2
  scaled = np.arange(5)[:, None] * 2.0 * np.exp(-inc * np.arange(3))[None]
  expected = np.concatenate(
    [np.sin(scaled), np.cos(scaled), np.zeros((5, 1))], -1
  )
  np.testing.assert_allclose(table, expected, rtol=1e-5, atol=1e-6)


def test_no_positional_embedding_loss_fn_and_targets_only():
  inputs = cmu.random_ids(16, (B, L))
  targets = np.array([[5, 1, 6, 7, 1, 0]] * B, np.int32)
  seen = []

  def loss_fn(decoder, context, logits, targets, vocab_dim):
    assert decoder.name == "hooked" and context.train
    seen.append(vocab_dim)
    return mtf.reduce_sum(logits) * 0.0 + 3.0

  def build(mesh):
    ids = cmu.import_ids(mesh, inputs, ["batch", "length"])
    tgt = cmu.import_ids(mesh, targets, ["batch", "length"])
    plain = _lm(
      positional_embedding=False, loss_on_targets_only=True, name="plain"
    )
    hooked = _lm(positional_embedding=False, loss_fn=loss_fn, name="hooked")
    return list(plain.call_simple(ids, tgt, True, mode="eval")) + [
      hooked.call_simple(ids, tgt, True)[1]
    ]

  (logits, loss, hooked_loss), params = _run(build)
  assert "plain/positional_embedding" not in params
  assert seen == [mtf.Dimension("vocab", cmu.VOCAB_PADDED)]
  np.testing.assert_allclose(hooked_loss, 3.0)
  expected = _np_lm_logits(params, inputs, "plain", positions=False)
  np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)
  # Only the targets part (after the first EOS, up to the second) counts.
  only_targets = np.where([[0, 0, 1, 1, 1, 0]] * B, targets, 0)
  np.testing.assert_allclose(
    loss, cmu.np_loss(expected, only_targets, denominator=B * L), rtol=1e-5
  )


def test_token_dropout_replaces_tokens_by_zero_in_training():
  inputs = cmu.random_ids(17, (B, L))

  def build(mesh):
    lm = _lm(token_dropout_rate=0.999999)
    ids = cmu.import_ids(mesh, inputs, ["batch", "length"])
    dropped, _ = lm.call_simple(ids, None, False, mode="train")
    kept, _ = lm.call_simple(ids, None, False, mode="eval")
    zeros, _ = lm.call_simple(mtf.zeros_like(ids), None, False, mode="eval")
    return [dropped, kept, zeros]

  (dropped, kept, zeros), params = _run(build)
  np.testing.assert_allclose(
    kept, _np_lm_logits(params, inputs), rtol=1e-5, atol=1e-5
  )
  np.testing.assert_allclose(dropped, zeros, rtol=1e-6, atol=1e-6)


def test_input_full_attention_priorities():
  targets = np.array(
    [
      [5, 6, 1, 7, 8, 1],
      [4, 1, 9, 1, 3, 1],
      [5, 6, 1, 7, 8, 1],
      [2, 3, 4, 1, 5, 1],
    ],
    np.int32,
  )
  captured = []

  class Probe(transformer.TransformerLayer):
    def call(self, context, x):
      captured.append(context.read_priority)
      captured.append(context.write_priority)
      return x

  def build(mesh):
    lm = transformer.Unitransformer(
      transformer.make_layer_stack([Probe], num_layers=1),
      d_model=D,
      input_vocab_size=V,
      output_vocab_size=V,
      autoregressive=True,
      max_length=L,
      input_full_attention=True,
      vocab_divisor=8,
    )
    tgt = cmu.import_ids(mesh, targets, ["batch", "length"])
    lm.call_simple(transformer.autoregressive_inputs(tgt), tgt, False)
    return captured

  (read, write), _ = _run(build)
  eos_before = np.cumsum(targets == 1, -1) - (targets == 1)
  region = eos_before % 2 == 0
  region[:, 1:] |= region[:, :-1]
  np.testing.assert_array_equal(read, np.arange(L) * (~region))
  np.testing.assert_array_equal(write, read)


# ----------------------------------------------------------------------------
# Helpers.


def test_shift_and_mask_helpers():
  targets = np.array(
    [
      [5, 6, 1, 7, 1, 0],
      [-3, 4, 1, 2, 2, 1],
      [1, 2, 3, 4, 5, 6],
      [9, 9, 9, 1, 1, 1],
    ],
    np.int32,
  )
  seq = np.array(
    [
      [1, 1, 1, 2, 2, 0],
      [1, 1, 1, 1, 1, 1],
      [1, 2, 2, 3, 3, 3],
      [1, 1, 1, 1, 2, 3],
    ],
    np.int32,
  )

  def build(mesh):
    tgt = cmu.import_ids(mesh, targets, ["batch", "length"])
    sid = cmu.import_ids(mesh, seq, ["batch", "length"])
    return [
      transformer.autoregressive_inputs(tgt),
      transformer.autoregressive_inputs(tgt, sequence_id=sid),
      transformer.shift_targets(tgt, bos_id=3),
      mtf.to_int32(transformer.delimited_lm_inputs_mask(tgt)),
    ]

  (plain, packed, shifted, mask), _ = _run(build)
  shift = np.concatenate([np.zeros((B, 1), np.int32), targets[:, :-1]], 1)
  np.testing.assert_array_equal(plain, np.abs(shift))
  same = np.concatenate([np.zeros((B, 1), bool), seq[:, 1:] == seq[:, :-1]], 1)
  np.testing.assert_array_equal(packed, np.abs(shift) * same)
  expected = shift * (shift != 1)
  expected += 3 * ((expected == 0) & (targets != 0))
  np.testing.assert_array_equal(shifted, expected)
  eos_before = np.cumsum(targets == 1, -1) - (targets == 1)
  np.testing.assert_array_equal(mask, (eos_before % 2 == 0).astype(np.int32))


def test_reduce_ensemble_logits():
  logits = np.random.RandomState(0).randn(3, 2, 5).astype(np.float32)

  def build(mesh):
    ens, vocab = mtf.Dimension("ensemble", 3), mtf.Dimension("vocab", 5)
    x = mtf.import_fully_replicated(
      mesh,
      tf.constant(logits),
      mtf.Shape([ens, mtf.Dimension("batch", 2), vocab]),
    )
    return [
      transformer.reduce_ensemble_logits(x, ens, vocab),
      transformer.reduce_ensemble_logits(
        x, ens, vocab, reduce_fn=transformer.reduce_ensemble_logits_mean_logit
      ),
      transformer.reduce_ensemble_logits_select(x, ens, vocab, model_id=2),
    ]

  (mean_prob, mean_logit, select), _ = _run(build)
  probs = np.exp(cmu.np_log_softmax(logits)[0]).mean(0)
  np.testing.assert_allclose(mean_prob, np.log(probs), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(mean_logit, logits.mean(0), rtol=1e-6)
  np.testing.assert_allclose(select, logits[2])


@pytest.mark.parametrize(
  "mesh_shape,layout", [("", ""), ("rows:2;cols:2", "ensemble:rows;vocab:cols")]
)
def test_ensemble_call_simple(mesh_shape, layout):
  inputs, targets = cmu.random_ids(18, (B, L)), _targets(19)

  def build(mesh):
    lm = _lm(ensemble=2, z_loss=0.0)
    return lm.call_simple(
      cmu.import_ids(mesh, inputs, ["batch", "length"]),
      cmu.import_ids(mesh, targets, ["batch", "length"]),
      compute_loss=True,
    )

  (logits, loss), params = _run(build, mesh_shape, layout, "function")
  assert params["transformer/embedding"].shape == (2, cmu.VOCAB_PADDED, D)
  assert params["transformer/rms_norm/scale"].shape == (2, D)
  member_logits = []
  for e in range(2):
    member = {k: v[e] for k, v in params.items()}
    member_logits.append(_np_lm_logits(member, inputs))
  member_logits = np.stack(member_logits)
  probs = np.exp(cmu.np_log_softmax(member_logits)[0]).mean(0)
  np.testing.assert_allclose(logits, np.log(probs), rtol=1e-4, atol=1e-5)
  # The denominator counts the broadcast targets [ensemble, batch, length]
  # divided by the ensemble size: each member gets its own mean loss.
  expected_loss = sum(
    cmu.np_loss(m, targets, denominator=B * L) for m in member_logits
  )
  np.testing.assert_allclose(loss, expected_loss, rtol=1e-5)


# ----------------------------------------------------------------------------
# Decoding.


def _prompt():
  prompt = np.zeros((B, L), np.int32)
  for row, n in enumerate([2, 0, 3, 1]):
    prompt[row, :n] = cmu.random_ids(20 + row, (n,))
  return prompt


def _greedy_matches_teacher_forcing(ids, logits, prompt):
  lengths = (prompt != 0).sum(-1)
  for b in range(B):
    np.testing.assert_array_equal(ids[b, : lengths[b]], prompt[b, : lengths[b]])
    np.testing.assert_array_equal(
      ids[b, lengths[b] :], logits[b, lengths[b] :].argmax(-1)
    )


@pytest.mark.parametrize(
  "mesh_shape,layout,mode",
  [("", "", "eager"), ("rows:2;cols:2", "batch:rows;vocab:cols", "eager")],
)
def test_greedy_sampling_reproduces_teacher_forced_argmax(
  mesh_shape, layout, mode
):
  prompt = _prompt()

  def build(mesh):
    lm = _lm()
    partial = cmu.import_ids(mesh, prompt, ["batch", "length"])
    ids = lm.sample_autoregressive(partial, stop_at_token=None)
    removed = lm.sample_autoregressive(
      partial, stop_at_token=None, remove_partial_sequences=True
    )
    top1 = lm.sample_autoregressive(
      partial, stop_at_token=None, temperature=1.0, sampling_keep_top_k=1
    )
    logits, _ = lm.call_simple(
      transformer.autoregressive_inputs(ids), None, False, mode="infer"
    )
    return [ids, removed, top1, logits]

  (ids, removed, top1, logits), params = _run(build, mesh_shape, layout, mode)
  _greedy_matches_teacher_forcing(ids, logits, prompt)
  np.testing.assert_allclose(
    logits,
    _np_lm_logits(
      params,
      np.abs(np.concatenate([np.zeros((B, 1), np.int32), ids[:, :-1]], 1)),
    ),
    rtol=1e-5,
    atol=1e-5,
  )
  np.testing.assert_array_equal(top1, ids)
  for b, n in enumerate((prompt != 0).sum(-1)):
    np.testing.assert_array_equal(removed[b, : L - n], ids[b, n:])
    np.testing.assert_array_equal(removed[b, L - n :], 0)


def _run_with_store(store, build):
  """Eager run on one device whose variables live in `store`."""
  with mtf.variable_store(store):
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    outputs = build(mesh)
    lowering = mtf.Lowering(graph, {mesh: mtu.mesh_impl_for("", "")})
    return [np.asarray(lowering.export_to_tf_tensor(t)) for t in outputs]


def test_sampling_stops_and_never_end():
  """Rows stop after a new stop token; never_end forbids it."""
  prompt = _prompt()

  def sample(**kwargs):
    def build(mesh):
      partial = cmu.import_ids(mesh, prompt, ["batch", "length"])
      return [_lm().sample_autoregressive(partial, **kwargs)]

    return _run_with_store(store, build)[0]

  # Row 1 has no prompt: with its first token as the stop token it stops at
  # once. Id 0 is padding, never a stop token: draw weights until it is not.
  tf.random.set_seed(7)
  for _ in range(20):
    store = mtf.VariableStore()
    free = sample(stop_at_token=None)
    if free[1, 0] != 0:
      break
  stop = int(free[1, 0])
  assert stop != 0
  stopped = sample(stop_at_token=stop)
  never = sample(stop_at_token=stop, never_end=True, max_steps=3)
  lengths = (prompt != 0).sum(-1)
  # All rows step together (one position each) until every row is done.
  steps = []
  for b in range(B):
    new = np.flatnonzero(free[b, lengths[b] :] == stop)
    steps.append(new[0] + 1 if new.size else L - lengths[b])
  for b in range(B):
    end = lengths[b] + max(steps)
    np.testing.assert_array_equal(stopped[b, :end], free[b, :end])
    np.testing.assert_array_equal(stopped[b, end:], 0)
  for b in range(B):
    generated = never[b, lengths[b] :]
    assert stop not in generated[:3]
    np.testing.assert_array_equal(generated[3:], 0)
    np.testing.assert_array_equal(
      never[b, : lengths[b]], prompt[b, : lengths[b]]
    )


def test_beam_search_with_one_beam_is_greedy():
  """With an EOS id that never wins, one beam follows the argmax path.

  (With a reachable EOS, beam search returns the best *finished* sequence,
  which can end at an EOS that greedy decoding ranked second.)
  """

  def build(mesh):
    lm = _lm()
    batch, beam = mtf.Dimension("batch", B), mtf.Dimension("beam", 1)
    length = mtf.Dimension("length", L)
    beams = lm.beam_search(
      mtf.zeros(mesh, [batch, beam, length], tf.int32),
      decode_length=L,
      alpha=0.0,
    )
    greedy = lm.sample_autoregressive(
      mtf.zeros(mesh, [batch, length], tf.int32), stop_at_token=None
    )
    return [beams, greedy]

  gin.clear_config()
  gin.bind_parameter("mesh_tensorflow.beam_search.beam_search.eos_id", 10**6)
  try:
    (beams, greedy), _ = _run(build)
  finally:
    gin.clear_config()
  assert beams.shape == (B, L)
  np.testing.assert_array_equal(beams, greedy)
