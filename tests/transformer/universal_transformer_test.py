"""Tests for transformer/universal_transformer.py (UTLayerStack).

One recurrence step equals a plain (legacy) LayerStack with the same layers
and weights; k steps equal a LayerStack of the layers repeated k times;
weights are shared across steps; timing signals against numpy; ACT against
a numpy halting computation over the per-step states (update weights,
ponder steps, remainders, ponder loss, act_max_steps); the gated variants
give the same numbers on 1-device and 4-device meshes and every variable
gets a nonzero gradient.
"""

import functools

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mesh_test_util as mtu
from tests.transformer import core_model_util as cmu
from transformer import transformer
from transformer import transformer_layers as tl
from transformer import universal_transformer as ut
from transformer._src.layers.context import Context

B, L, D, H, K, F = 4, 8, 8, 2, 4, 8
SA = (tl.SelfAttention, {"num_heads": H, "key_value_size": K})
DRD = (tl.DenseReluDense, {"hidden_size": F})
IDS = cmu.random_ids(0, (B, L))
SEQ = np.array(
  [
    [1, 1, 1, 1, 1, 1, 0, 0],
    [1, 1, 1, 2, 2, 2, 2, 2],
    [1] * 8,
    [1, 2, 2, 3, 3, 3, 0, 0],
  ],
  np.int32,
)
X = np.random.RandomState(1).randn(B, L, D).astype(np.float32)
BATCH, LENGTH = mtf.Dimension("batch", B), mtf.Dimension("length", L)
D_MODEL = mtf.Dimension("d_model", D)

BASE = dict(
  act_type="basic",
  recurrence_type="basic",
  act_max_steps=3,
  act_epsilon=0.01,
  num_rec_steps=1,
  num_inrecurrence_layers=1,
  position_start_index=0,
  add_or_concat_timing_signal="add",
  step_timing_signal_type="sinusoid",
  add_position_timing_signal=False,
  add_step_timing_signal=False,
  mix_with_transformer_before_ut=False,
  mix_with_transformer_after_ut=False,
  gates_inputs="i",
  gate_ffn_layer="dense",
  use_gated_transformer=False,
  gating_type="highway",
)


def _layers(layers=(SA, DRD)):
  return transformer.make_layer_stack(list(layers), num_layers=1).layers


def _ut(layers=None, **kwargs):
  return ut.UTLayerStack(layers or _layers(), **dict(BASE, **kwargs))


def _encoder(stack):
  return transformer.Unitransformer(
    stack,
    d_model=D,
    input_vocab_size=cmu.VOCAB,
    output_vocab_size=None,
    autoregressive=False,
    max_length=L,
    name="encoder",
    vocab_divisor=cmu.VOCAB_DIVISOR,
    positional_embedding=False,
  )


def _encode(mesh, stack, seq=SEQ, mode="eval", compute_loss=False):
  inputs = cmu.import_ids(mesh, IDS, ["batch", "length"])
  sequence_id = cmu.import_ids(mesh, seq, ["batch", "length"])
  return _encoder(stack).call_simple(
    inputs, None, compute_loss, mode=mode, sequence_id=sequence_id
  )


class StubModel:
  model_dim = D_MODEL
  ensemble_dims = []
  ensemble_dim = None
  fully_autoregressive = False
  autoregressive = False


def _context(mesh, losses=None):
  return Context(
    StubModel(),
    mesh,
    [BATCH],
    LENGTH,
    mtf.VariableDType(tf.float32),
    mode="eval",
    losses=losses,
  )


def _import_x(mesh):
  return mtf.import_tf_tensor(
    mesh, tf.constant(X), mtf.Shape([BATCH, LENGTH, D_MODEL])
  )


# ----------------------------------------------------------------------------
# Equivalences with LayerStack


def test_one_step_equals_plain_layer_stack():
  names = []

  def build(mesh):
    layers = _layers()
    a, _ = _encode(mesh, _ut(layers))
    ut_names = sorted(cmu.variables_by_name(mesh))
    b, _ = _encode(
      mesh, transformer.LayerStack(layers, dropout_rate=0.0, norm_epsilon=1e-6)
    )
    names.extend([ut_names, sorted(cmu.variables_by_name(mesh))])
    return [a, b]

  a, b = mtu.run_program(build)
  np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
  assert names[0] == names[1]
  assert "encoder/block_000/layer_000/SelfAttention/q" in names[0]
  assert "encoder/block_000/layer_001/layer_norm/scale" in names[0]
  assert "encoder/final_layer_norm/scale" in names[0]


@pytest.mark.parametrize("steps,inner", [(3, 1), (1, 3), (2, 2)])
def test_steps_equal_a_layer_stack_of_repeated_layers(steps, inner):
  counts = []

  def build(mesh):
    layers = _layers()
    a, _ = _encode(
      mesh, _ut(layers, num_rec_steps=steps, num_inrecurrence_layers=inner)
    )
    counts.append(len(mesh.graph.all_variables))
    b, _ = _encode(
      mesh,
      transformer.LayerStack(
        layers * (steps * inner), dropout_rate=0.0, norm_epsilon=1e-6
      ),
    )
    counts.append(len(mesh.graph.all_variables))
    c, _ = _encode(mesh, _ut(layers))
    return [a, b, c]

  a, b, one_step = mtu.run_program(build)
  np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
  assert not np.allclose(a, one_step, atol=1e-3)
  # Weights are shared: as many variables as a single pass.
  assert counts == [10, 10]


def test_variable_count_does_not_depend_on_num_rec_steps():
  counts = {}
  for steps in (1, 4):
    for recurrence in ("highway", "act"):

      def build(mesh, steps=steps, recurrence=recurrence):
        _encode(
          mesh,
          _ut(
            recurrence_type=recurrence,
            num_rec_steps=steps,
            act_max_steps=steps,
            add_step_timing_signal=True,
            step_timing_signal_type="sinusoid",
          ),
        )
        counts[(steps, recurrence)] = sorted(cmu.variables_by_name(mesh))
        return []

      mtu.run_program(build)
  assert counts[(1, "highway")] == counts[(4, "highway")]
  assert counts[(1, "act")] == counts[(4, "act")]
  assert (
    "encoder/universal_transformer/transform_gate/w_i/kernel"
    in counts[(1, "highway")]
  )
  assert (
    "encoder/universal_transformer/act_halting/kernel" in counts[(1, "act")]
  )


# ----------------------------------------------------------------------------
# Timing signals


def _np_sinusoid(positions, d=D):
  n = d // 2
  inv = np.exp(np.arange(n) * -np.log(1e4) / (n - 1))
  t = np.asarray(positions, np.float64)[..., None] * inv
  return np.concatenate([np.sin(t), np.cos(t)], -1).astype(np.float32)


def test_timing_signals_match_numpy():
  """2 steps with position (start index 3) and step signals, against a
  LayerStack run on x + signal per step.
  """
  block = [
    functools.partial(transformer.sublayer_rms_norm, name="layer_norm"),
    transformer.sublayer_call_layer,
    transformer.sublayer_residual,
  ]

  def build(mesh):
    layers = _layers()
    x = _import_x(mesh)
    stack = _ut(
      layers,
      num_rec_steps=2,
      position_start_index=3,
      add_position_timing_signal=True,
      add_step_timing_signal=True,
    )
    out = stack.call(_context(mesh), x)
    plain = transformer.LayerStack(
      layers,
      sublayers_initial=[],
      sublayers_per_layer=block,
      sublayers_final=[],
    )
    y = x
    for step in range(2):
      signal = _np_sinusoid(np.arange(L) + 3) + _np_sinusoid(step)
      y = plain.call(
        _context(mesh),
        y
        + mtf.import_tf_tensor(
          mesh, tf.constant(signal), mtf.Shape([LENGTH, D_MODEL])
        ),
      )
    ref = transformer.sublayer_rms_norm(
      y, None, _context(mesh), name="final_layer_norm"
    )
    return [out, ref]

  out, ref = mtu.run_program(build)
  np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


def test_learned_step_signal_and_concat():
  def build(mesh):
    stack = _ut(
      num_rec_steps=2,
      add_step_timing_signal=True,
      step_timing_signal_type="learned",
      add_or_concat_timing_signal="concat",
    )
    out, _ = _encode(mesh, stack)
    return [
      out,
      mesh.graph.name_to_variable[
        "encoder/universal_transformer/step_embedding"
      ].outputs[0],
      mesh.graph.name_to_variable[
        "encoder/universal_transformer/timing_concat/kernel"
      ].outputs[0],
    ]

  out, table, kernel = mtu.run_program(build)
  assert table.shape == (2, D) and kernel.shape == (2 * D, D)
  assert out.shape == (B, L, D) and np.isfinite(out).all()


# ----------------------------------------------------------------------------
# ACT


def _np_act(states, probs, max_steps, epsilon):
  """states[k]: output of step k; probs[k]: halting probability at step k."""
  halting = np.zeros(probs[0].shape)
  remainders, n, halted = (np.zeros_like(halting) for _ in range(3))
  out = np.zeros_like(states[0])
  for step in range(max_steps):
    p, running = probs[step], 1.0 - halted
    if step == max_steps - 1:
      new_halted = running
    else:
      new_halted = (halting + p * running > 1 - epsilon) * running
    still = running - new_halted
    halting = halting + p * still
    remainder = new_halted * (1 - halting)
    remainders += remainder
    update = (p * still + remainder)[..., None]
    n += running
    halted += new_halted
    out = states[step] * update + out * (1 - update)
  return out, n, remainders


@pytest.mark.parametrize(
  "bias_init,max_steps", [(1.0, 4), (-1.0, 3), (-10.0, 3), (10.0, 3)]
)
def test_act_matches_numpy(bias_init, max_steps):
  def build(mesh):
    stack = _ut(
      recurrence_type="act",
      act_max_steps=max_steps,
      act_halting_bias_init=bias_init,
      act_loss_weight=0.5,
    )
    context = _context(mesh, losses=[])
    x = _import_x(mesh)
    out, n, r = stack.ut_act(context, x)
    states = [x]
    for step in range(max_steps):
      states.append(stack.ut_step(_context(mesh), states[-1], step))
    var = mesh.graph.name_to_variable
    kernel = var["universal_transformer/act_halting/kernel"].outputs[0]
    bias = var["universal_transformer/act_halting/bias"].outputs[0]
    return [out, n, r, context.losses[0], kernel, bias] + states

  out, n, r, loss, kernel, bias, *states = mtu.run_program(build)
  probs = [1 / (1 + np.exp(-(s @ kernel + bias))) for s in states[:-1]]
  e_out, e_n, e_r = _np_act(states[1:], probs, max_steps, 0.01)
  np.testing.assert_allclose(n, e_n, atol=1e-6)
  np.testing.assert_allclose(r, e_r, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(out, e_out, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(loss, 0.5 * np.mean(e_n + e_r), rtol=1e-5)
  assert n.min() >= 1 and n.max() <= max_steps
  assert r.min() >= 0 and r.max() <= 1
  if bias_init == -10.0:  # Never halts by itself: stopped at act_max_steps.
    assert (n == max_steps).all()
  if bias_init == 10.0:  # Halts after the first step.
    assert (n == 1).all()


def test_act_ponder_loss_reaches_the_model_loss():
  def build(mesh):
    stack = _ut(recurrence_type="act", act_max_steps=2)
    _, loss = _encode(mesh, stack, compute_loss=True)
    return [loss]

  (loss,) = mtu.run_program(build)
  # weight 0.01 * mean(steps + remainder), steps + remainder in [1, 3].
  assert 0.01 <= loss <= 0.03


# ----------------------------------------------------------------------------
# Variants on meshes, gradients


VARIANTS = {
  "highway": dict(
    recurrence_type="highway",
    num_rec_steps=2,
    gates_inputs="ist",
    add_step_timing_signal=True,
    add_position_timing_signal=True,
    couple_carry_transform_gates=False,
  ),
  "skip": dict(
    recurrence_type="skip",
    num_rec_steps=2,
    gates_inputs="st",
    gate_ffn_layer="dense_relu_dense",
    use_gated_transformer=True,
    gating_type="gru",
  ),
  "act": dict(
    recurrence_type="act",
    act_max_steps=3,
    act_halting_bias_init=-0.5,
    add_step_timing_signal=True,
    step_timing_signal_type="learned",
    mix_with_transformer_before_ut=True,
    mix_with_transformer_after_ut=True,
    num_vanilla_transformer_layers=1,
    use_gated_transformer=True,
  ),
}


def _run_variant(variant, mesh_shape="", layout="", grads=False):
  names = []

  def build(mesh):
    # The same initial weights on every mesh; set here, as a TF1 pass run
    # builds its own graph.
    tf.random.set_seed(2024)
    out, loss = _encode(
      mesh,
      _ut(**VARIANTS[variant]),
      mode="train" if grads else "eval",
      compute_loss=True,
    )
    variables = cmu.variables_by_name(mesh)
    names[:] = list(variables)
    result = [out]
    if grads:
      objective = mtf.reduce_sum(mtf.square(out))
      if loss is not None:
        objective += loss
      result += mtf.gradients([objective], list(variables.values()))
    return result

  out = mtu.run_program(build, mesh_shape, layout)
  return out[0], names, out[1:]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_variants_same_numbers_on_meshes(variant):
  reference, _, _ = _run_variant(variant)
  assert np.isfinite(reference).all()
  for mesh_shape, layout in [
    ("all:4", "batch:all"),
    ("all:4", "d_ff:all"),
    ("rows:2;cols:2", "batch:rows;heads:cols"),
  ]:
    out, _, _ = _run_variant(variant, mesh_shape, layout)
    np.testing.assert_allclose(
      out,
      reference,
      rtol=1e-5,
      atol=1e-5,
      err_msg="%s %s" % (mesh_shape, layout),
    )


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_gradients_reach_every_variable(variant):
  _, names, grads = _run_variant(variant, grads=True)
  assert len(grads) == len(names)
  for name, g in zip(names, grads):
    assert np.abs(g).max() > 0, name
  if variant == "act":
    assert any(n.startswith("encoder/vanilla_before_000/") for n in names)
    assert any(n.startswith("encoder/vanilla_after_000/") for n in names)
    assert "encoder/block_000/layer_000/gating/w_gate/kernel" in names


# ----------------------------------------------------------------------------
# Configuration


def test_missing_and_invalid_parameters_are_named():
  # gin itself reports unbound REQUIRED parameters.
  with pytest.raises(RuntimeError, match="num_rec_steps"):
    ut.UTLayerStack(_layers(), **dict(BASE, num_rec_steps=gin.REQUIRED))
  with pytest.raises(ValueError, match="recurrence_type 'lstm'"):
    _ut(recurrence_type="lstm")
  with pytest.raises(ValueError, match="act_type 'global'"):
    _ut(act_type="global")
  with pytest.raises(ValueError, match="gates_inputs"):
    _ut(gates_inputs="x")
  with pytest.raises(ValueError, match="act_epsilon"):
    _ut(act_epsilon=1.5)
  with pytest.raises(ValueError, match="num_rec_steps must be an int >= 1"):
    _ut(num_rec_steps=0)


def test_gin_registration():
  gin.clear_config()
  try:
    bindings = ["import mesh_tensorflow.transformer.universal_transformer"]
    bindings += [
      "mesh_tensorflow.transformer.universal_transformer."
      "UTLayerStack.%s = %r" % kv
      for kv in BASE.items()
    ]
    bindings += ["UTLayerStack.num_rec_steps = 5"]
    gin.parse_config("\n".join(bindings))
    stack = ut.UTLayerStack(_layers())
    assert stack.num_rec_steps == 5 and stack.act_epsilon == 0.01
  finally:
    gin.clear_config()


# ----------------------------------------------------------------------------
# The original's building blocks


def _np_timing_signal(positions, d=D, min_timescale=1.0, max_timescale=1e4):
  n = d // 2
  increment = np.log(max_timescale / min_timescale) / max(n - 1, 1)
  inv = min_timescale * np.exp(np.arange(n) * -increment)
  t = np.asarray(positions, np.float64)[..., None] * inv
  return np.concatenate([np.sin(t), np.cos(t)], -1).astype(np.float32)


def _np_layer_norm(x, eps=1e-6):
  x = x - x.mean(-1, keepdims=True)
  return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)


def _sigmoid(x):
  return 1.0 / (1.0 + np.exp(-x))


def test_get_timing_signal_1d_matches_numpy():
  def build(mesh):
    stack, context = _ut(), _context(mesh)
    return [
      stack.get_timing_signal_1d(context, LENGTH, D_MODEL, start_index=3),
      stack.get_timing_signal_1d(context, LENGTH, D_MODEL, 2.0, 100.0),
    ]

  a, b = mtu.run_program(build)
  np.testing.assert_allclose(a, _np_timing_signal(np.arange(L) + 3), atol=1e-5)
  np.testing.assert_allclose(
    b, _np_timing_signal(np.arange(L), D, 2.0, 100.0), atol=1e-5
  )
  with pytest.raises(NotImplementedError):
    mtu.run_program(
      lambda mesh: [
        _ut().get_timing_signal_1d(
          _context(mesh), LENGTH, mtf.Dimension("d_model", 7)
        )
      ]
    )


def test_timing_signal_funcs_match_numpy():
  def build(mesh):
    context, x = _context(mesh), _import_x(mesh)
    stack = _ut(position_start_index=2, num_rec_steps=2)
    learned = _ut(
      step_timing_signal_type="learned", recurrence_type="act", act_max_steps=5
    )
    concat = _ut(add_or_concat_timing_signal="concat")
    outs = [
      stack.add_position_timing_signal_func(context, x, 0),
      stack.add_step_timing_signal_func(context, x, 1),
      learned.add_step_timing_signal_func(context, x, 3),
      concat.add_position_timing_signal_func(context, x, 0),
    ]
    table = mesh.graph.name_to_variable["layer_embedding"].outputs[0]
    return outs + [table]

  pos, step, learned, concat, table = mtu.run_program(build)
  np.testing.assert_allclose(
    pos, X + _np_timing_signal(np.arange(L) + 2), atol=1e-5
  )
  np.testing.assert_allclose(step, X + _np_timing_signal(1), atol=1e-5)
  assert table.shape == (5, D)  # act_max_steps layers ("act")
  np.testing.assert_allclose(learned, X + table[3] * np.sqrt(D), atol=1e-5)
  assert concat.shape == (B, L, 2 * D)
  np.testing.assert_allclose(concat[..., :D], X)
  np.testing.assert_allclose(
    concat[..., D:],
    np.broadcast_to(_np_timing_signal(np.arange(L)), (B, L, D)),
    atol=1e-5,
  )


@pytest.mark.parametrize("gating_type", ["highway", "gru"])
def test_gating_matches_numpy(gating_type):
  mask = (SEQ != 0).astype(np.float32)

  def build(mesh):
    context, x = _context(mesh), _import_x(mesh)
    transformed = x * 2.0 - 1.0
    mtf_mask = mtf.import_tf_tensor(
      mesh, tf.constant(mask), mtf.Shape([BATCH, LENGTH])
    )
    out = _ut(gating_type=gating_type).gating(context, x, transformed, mtf_mask)
    params = [
      v.outputs[0]
      for v in mesh.graph.all_variables
      if v.name.startswith("dense")
    ]
    return [out] + params

  out, *params = mtu.run_program(build)
  # In creation order: each gate's kernel, then its bias.
  kernels, biases = params[0::2], params[1::2]

  def gate(i, *inputs):
    normed = [_np_layer_norm(t * mask[..., None]) for t in inputs]
    return _sigmoid(np.concatenate(normed, -1) @ kernels[i] + biases[i])

  x, t = X, X * 2.0 - 1.0
  if gating_type == "highway":
    expected = x * gate(1, x) + t * gate(0, x)
  else:
    update, reset = gate(0, x, t), gate(1, x, t)
    candidate = gate(2, reset * x, t)
    expected = (1 - update) * t + update * candidate
  np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)


def test_ffn_layer_multi_inputs_dense_relu_dense_and_postprocess():
  def build(mesh):
    context, x = _context(mesh), _import_x(mesh)
    stack = _ut()
    out = stack.ffn_layer_multi_inputs(
      context,
      None,
      [x, x * 3.0],
      ffn_layer_type="dense_relu_dense",
      postprocess=True,
    )
    return [out] + [v.outputs[0] for v in mesh.graph.all_variables]

  # In creation order: each dense layer's kernel, then its bias.
  out, k0, b0, k1, b1, *_ = mtu.run_program(build)
  hidden = np.maximum(np.concatenate([X, X * 3.0], -1) @ k0 + b0, 0.0)
  expected = _np_layer_norm(hidden @ k1 + b1)
  np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)
  with pytest.raises(ValueError, match="Unknown ffn_layer type"):
    mtu.run_program(
      lambda mesh: [
        _ut().ffn_layer_multi_inputs(
          _context(mesh), None, [_import_x(mesh)], ffn_layer_type="conv"
        )
      ]
    )


def test_original_signatures_delegate():
  """act_layer, vanilla_transformer_layer, ut_basic and ut_highway with the
  original's (x, mask) and (state, inputs, memory) arguments, each in its own
  program with the same initial weights as the method it delegates to.
  """

  def run(make_stack, method):
    def build(mesh):
      tf.random.set_seed(7)  # In build: a TF1 pass run has its own graph.
      return [method(make_stack(), _context(mesh), _import_x(mesh))]

    return mtu.run_program(build)[0]

  act = functools.partial(_ut, recurrence_type="act")
  basic = functools.partial(_ut, num_rec_steps=2)
  highway = functools.partial(_ut, recurrence_type="highway", num_rec_steps=2)
  pairs = [
    (
      act,
      lambda s, c, x: s.act_layer(c, x, None),
      lambda s, c, x: s.ut_act(c, x)[0],
    ),
    (
      basic,
      lambda s, c, x: s.vanilla_transformer_layer(c, x, None),
      lambda s, c, x: s.transition(c, x),
    ),
    (
      basic,
      lambda s, c, x: s.ut_basic(c, x, None),
      lambda s, c, x: s.ut_step(c, s.ut_step(c, x, 0), 1),
    ),
    (
      highway,
      lambda s, c, x: s.ut_highway(c, (x, x, x), None),
      lambda s, c, x: s.ut_highway(c, x, None),
    ),
  ]
  for make_stack, original, ours in pairs:
    np.testing.assert_allclose(
      run(make_stack, original), run(make_stack, ours), rtol=1e-6, atol=1e-6
    )
