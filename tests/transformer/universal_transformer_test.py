"""Tests for transformer/universal_transformer.py (UTLayerStack).

The original's numbers for five configurations are checked in
original_numbers_test.py. Here: k recurrence steps (and the vanilla passes)
equal a LayerStack of true layer norms with the layers repeated, sharing
one set of variables; the step signals and the ACT recurrence (basic and
accumulated, act_max_steps + 1 steps) against numpy; the gates against
numpy (including the second normalisation of a reused input list); the
variants give the same numbers on 1-device and 4-device meshes and every
variable gets a nonzero gradient.
"""

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
  position_start_index=None,
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

# The original's per-layer recipe: x + layer(layer_norm(x * mask)).
TRUE_NORM_BLOCK = [
  transformer.sublayer_mask_padding,
  transformer.sublayer_true_layer_norm,
  transformer.sublayer_call_layer,
  transformer.sublayer_residual,
]


def _true_norm_stack(layers):
  return transformer.LayerStack(
    layers,
    sublayers_initial=[],
    sublayers_per_layer=TRUE_NORM_BLOCK,
    sublayers_final=[transformer.sublayer_true_layer_norm],
  )


@pytest.mark.parametrize(
  "steps,inner,vanilla", [(1, 1, 0), (3, 1, 0), (1, 3, 0), (2, 2, 1)]
)
def test_passes_equal_a_layer_stack_of_repeated_layers(steps, inner, vanilla):
  names = []

  def build(mesh):
    layers = _layers()
    outputs = []
    a, _ = _encode_recording(
      mesh,
      _ut(
        layers,
        num_rec_steps=steps,
        num_inrecurrence_layers=inner,
        num_vanilla_transformer_layers=vanilla,
        mix_with_transformer_before_ut=vanilla > 0,
        mix_with_transformer_after_ut=vanilla > 0,
      ),
      outputs,
    )
    names.append(sorted(cmu.variables_by_name(mesh)))
    passes = steps * inner + 2 * vanilla
    b, _ = _encode(mesh, _true_norm_stack(layers * passes))
    names.append(len(outputs))
    return [a, b]

  a, b = mtu.run_program(build)
  num_outputs = names.pop()
  np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
  # One set of variables for all passes, named as the original's.
  assert names[0] == [
    "encoder/block_000/layer_000/SelfAttention/k",
    "encoder/block_000/layer_000/SelfAttention/o",
    "encoder/block_000/layer_000/SelfAttention/q",
    "encoder/block_000/layer_000/SelfAttention/v",
    "encoder/block_000/layer_000/layer_prepostprocess/layer_norm/"
    "layer_norm_bias",
    "encoder/block_000/layer_000/layer_prepostprocess/layer_norm/"
    "layer_norm_scale",
    "encoder/block_000/layer_001/DenseReluDense/wi/kernel",
    "encoder/block_000/layer_001/DenseReluDense/wo/kernel",
    "encoder/block_000/layer_001/layer_prepostprocess/layer_norm/"
    "layer_norm_bias",
    "encoder/block_000/layer_001/layer_prepostprocess/layer_norm/"
    "layer_norm_scale",
    "encoder/embedding",
    "encoder/layer_prepostprocess/layer_norm/layer_norm_bias",
    "encoder/layer_prepostprocess/layer_norm/layer_norm_scale",
  ]
  # The input, the first layer's output of every pass, the final output.
  assert num_outputs == 2 + steps * inner + 2 * vanilla


def _encode_recording(mesh, stack, layer_outputs):
  inputs = cmu.import_ids(mesh, IDS, ["batch", "length"])
  sequence_id = cmu.import_ids(mesh, SEQ, ["batch", "length"])
  return _encoder(stack).call_simple(
    inputs,
    None,
    False,
    mode="eval",
    sequence_id=sequence_id,
    layer_outputs=layer_outputs,
  )


# ----------------------------------------------------------------------------
# Timing signals


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


@pytest.mark.parametrize("signal_type", ["learned", "sinusoid"])
def test_step_signal_matches_a_layer_stack_on_shifted_inputs(signal_type):
  """2 basic steps with the step signal: the block on x + signal(step)."""

  def build(mesh):
    layers = _layers()
    x = _import_x(mesh)
    stack = _ut(
      layers,
      num_rec_steps=2,
      add_step_timing_signal=True,
      add_position_timing_signal=True,  # never added by the recurrence
      step_timing_signal_type=signal_type,
    )
    out = stack.call(_context(mesh), x)
    block = transformer.LayerStack(
      layers,
      sublayers_initial=[],
      sublayers_per_layer=TRUE_NORM_BLOCK,
      sublayers_final=[],
    )
    y = x
    tables = []
    for step in range(2):
      if signal_type == "learned":
        table = mesh.graph.name_to_variable["layer_embedding"].outputs[0]
        tables.append(table)
        index = mtf.constant(mesh, step, dtype=tf.int32)
        signal = mtf.gather(table, index, table.shape.dims[0]) * np.sqrt(D)
      else:
        signal = mtf.import_tf_tensor(
          mesh, tf.constant(_np_timing_signal(step)), mtf.Shape([D_MODEL])
        )
      y = block.call(_context(mesh), y + signal)
    with tf.compat.v1.variable_scope("reference"):
      ref = mtf.layers.layer_norm(y, D_MODEL)
    return [out, ref] + tables[:1]

  out, ref, *table = mtu.run_program(build)
  np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)
  if table:
    assert table[0].shape == (2, D)


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
    by_step = _ut(position_start_index="step", num_rec_steps=4)
    learned = _ut(
      step_timing_signal_type="learned", recurrence_type="act", act_max_steps=5
    )
    concat = _ut(add_or_concat_timing_signal="concat")
    outs = [
      stack.add_position_timing_signal_func(context, x, 0),
      by_step.add_position_timing_signal_func(context, x, 3),
      stack.add_step_timing_signal_func(context, x, 1),
      learned.add_step_timing_signal_func(context, x, 3),
      learned.add_step_timing_signal_func(context, x, 5),  # past the end
      concat.add_position_timing_signal_func(context, x, 0),
    ]
    table = mesh.graph.name_to_variable["layer_embedding"].outputs[0]
    return outs + [table]

  pos, by_step, step, learned, past, concat, table = mtu.run_program(build)
  np.testing.assert_allclose(
    pos, X + _np_timing_signal(np.arange(L) + 2), atol=1e-5
  )
  # "step": positions start at length * step / num_steps = 8 * 3 / 4.
  np.testing.assert_allclose(
    by_step, X + _np_timing_signal(np.arange(L) + 6), atol=1e-5
  )
  np.testing.assert_allclose(step, X + _np_timing_signal(1), atol=1e-5)
  assert table.shape == (5, D)  # act_max_steps layers ("act")
  np.testing.assert_allclose(learned, X + table[3] * np.sqrt(D), atol=1e-5)
  np.testing.assert_allclose(past, X)
  assert concat.shape == (B, L, 2 * D)
  np.testing.assert_allclose(concat[..., :D], X)
  np.testing.assert_allclose(
    concat[..., D:],
    np.broadcast_to(_np_timing_signal(np.arange(L)), (B, L, D)),
    atol=1e-5,
  )


def test_concat_step_signal_is_projected_back():
  def build(mesh):
    stack = _ut(
      add_step_timing_signal=True,
      add_or_concat_timing_signal="concat",
      num_rec_steps=2,
    )
    out = stack.step_preprocess(_context(mesh), _import_x(mesh), 1)
    kernel = mesh.graph.name_to_variable["dense/kernel"].outputs[0]
    return [out, kernel]

  out, kernel = mtu.run_program(build)
  signal = np.broadcast_to(_np_timing_signal(1), (B, L, D))
  np.testing.assert_allclose(
    out, np.concatenate([X, signal], -1) @ kernel, rtol=1e-5, atol=1e-5
  )


# ----------------------------------------------------------------------------
# ACT


def _np_act(states, probs, max_steps, epsilon, accumulated):
  """states[k]: output of step k; probs[k]: halting probability at step k."""
  halting = np.zeros(probs[0].shape)
  remainders, n_updates = np.zeros_like(halting), np.zeros_like(halting)
  out = np.zeros_like(states[0])
  for step in range(max_steps + 1):
    p = probs[step]
    running = (halting < 1.0).astype(np.float64)
    proposed = halting + p * running
    new_halted = (proposed > 1 - epsilon) * running
    running = (proposed <= 1 - epsilon) * running
    halting = halting + p * running
    remainders = remainders + new_halted * (1 - halting)
    halting = halting + new_halted * remainders
    n_updates = n_updates + running + new_halted
    weight = (p * running + new_halted * remainders)[..., None]
    out = states[step] * weight + (out if accumulated else out * (1 - weight))
  return out, n_updates


@pytest.mark.parametrize(
  "epsilon,act_type",
  [(0.01, "basic"), (0.6, "basic"), (0.99, "basic"), (0.3, "accumulated")],
)
def test_act_matches_numpy(epsilon, act_type):
  max_steps = 3

  def build(mesh):
    stack = _ut(
      recurrence_type="act",
      act_type=act_type,
      act_max_steps=max_steps,
      act_epsilon=epsilon,
    )
    x = _import_x(mesh)
    out = stack.act_layer(_context(mesh), x, None)
    states = [x]
    for _ in range(max_steps + 1):
      states.append(
        stack.vanilla_transformer_layer(_context(mesh), states[-1], None)
      )
    var = mesh.graph.name_to_variable
    unit = "sigmoid_activation_for_pondering/"
    kernel = var[unit + "dense/kernel"].outputs[0]
    bias = var[unit + "dense_1/bias"].outputs[0]
    return [out, kernel, bias] + states

  out, kernel, bias, *states = mtu.run_program(build)
  assert kernel.shape == (D, 1) and bias.shape == (1,)
  probs = [_sigmoid(s @ kernel + bias)[..., 0] for s in states[:-1]]
  expected, n_updates = _np_act(
    states[1:], probs, max_steps, epsilon, act_type == "accumulated"
  )
  np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
  if epsilon == 0.99:  # Every position halts at the first step.
    assert (n_updates == 1).all()
  if epsilon == 0.01:  # Some positions take more than two steps.
    assert n_updates.max() > 2


def test_act_global_halts_whole_sequences():
  def build(mesh):
    stack = _ut(recurrence_type="act", act_type="global", act_max_steps=2)
    return [stack.act_layer(_context(mesh), _import_x(mesh), None)]

  (out,) = mtu.run_program(build)
  assert out.shape == (B, L, D) and np.isfinite(out).all()


# ----------------------------------------------------------------------------
# Gates


@pytest.mark.parametrize("gating_type", ["highway", "gru"])
def test_gating_matches_numpy(gating_type):
  mask = (SEQ != 0).astype(np.float32)

  def build(mesh):
    context, x = _context(mesh), _import_x(mesh)
    transformed = x * 2.0 - 1.0
    mtf_mask = mtf.import_tf_tensor(
      mesh, tf.constant(mask), mtf.Shape([BATCH, LENGTH])
    )
    stack = _ut(gating_type=gating_type)
    out = stack.gating(context, x, transformed, mtf_mask)
    again = stack.gating(context, x, transformed, mtf_mask)
    var = mesh.graph.name_to_variable
    num_gates = 2 if gating_type == "highway" else 3
    params = []
    for i in range(num_gates):
      params.append(var["dense_%d/kernel" % (2 * i) if i else "dense/kernel"])
      params.append(var["dense_%d/bias" % (2 * i + 1)])
    # The second call reuses the gates' variables.
    assert len(mesh.graph.all_variables) == 2 * num_gates + 2
    return [out, again] + [v.outputs[0] for v in params]

  out, again, *params = mtu.run_program(build)
  np.testing.assert_allclose(out, again)
  kernels, biases = params[0::2], params[1::2]

  def norm(t):
    return _np_layer_norm(t * mask[..., None])

  def gate(i, *normed):
    return _sigmoid(np.concatenate(normed, -1) @ kernels[i] + biases[i])

  x, t = X, X * 2.0 - 1.0
  # A second gate on the same input list normalises the inputs again.
  if gating_type == "highway":
    expected = x * gate(1, norm(norm(x))) + t * gate(0, norm(x))
  else:
    update = gate(0, norm(x), norm(t))
    reset = gate(1, norm(norm(x)), norm(norm(t)))
    candidate = gate(2, norm(reset * x), norm(t))
    expected = (1 - update) * t + update * candidate
  np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)


def test_highway_recurrence_matches_numpy():
  """s * (1 - g) + t * g, g = sigmoid([norm(s), norm(t), norm(i)] W + b)."""

  def build(mesh):
    stack = _ut(recurrence_type="highway", gates_inputs="its")
    x = _import_x(mesh)
    inputs = x * 0.5
    out = stack.ut_highway(_context(mesh), (x, inputs, None), None)
    transformed = stack.vanilla_transformer_layer(_context(mesh), x, None)
    var = mesh.graph.name_to_variable
    return [
      out,
      transformed,
      var["dense/kernel"].outputs[0],
      var["dense_1/bias"].outputs[0],
    ]

  out, t, kernel, bias = mtu.run_program(build)
  assert kernel.shape == (3 * D, D)
  # The inputs in the original's order: state, transformed, inputs.
  normed = [_np_layer_norm(v) for v in (X, t, X * 0.5)]
  g = _sigmoid(np.concatenate(normed, -1) @ kernel + bias)
  np.testing.assert_allclose(out, X * (1 - g) + t * g, rtol=1e-4, atol=1e-5)


def test_ffn_layer_multi_inputs_dense_relu_dense_and_postprocess():
  def build(mesh):
    context, x = _context(mesh), _import_x(mesh)
    stack = _ut()
    inputs = [x * 3.0]
    out = stack.ffn_layer_multi_inputs(
      context,
      None,
      inputs,
      ffn_layer_type="dense_relu_dense",
      preprocess=True,
      postprocess=True,
    )
    return [out, inputs[0]] + [
      v.outputs[0]
      for v in mesh.graph.all_variables
      if "layer_norm" not in v.name
    ]

  out, normed, wi, wo = mtu.run_program(build)
  # The caller's list now holds the normalised input.
  np.testing.assert_allclose(normed, _np_layer_norm(X * 3.0), atol=1e-5)
  expected = _np_layer_norm(np.maximum(normed @ wi, 0.0) @ wo)
  np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)
  with pytest.raises(ValueError, match="Unknown ffn_layer type"):
    mtu.run_program(
      lambda mesh: [
        _ut().ffn_layer_multi_inputs(
          _context(mesh), None, [_import_x(mesh)], ffn_layer_type="conv"
        )
      ]
    )


# ----------------------------------------------------------------------------
# Variants on meshes, gradients


VARIANTS = {
  "highway": dict(
    recurrence_type="highway",
    num_rec_steps=2,
    gates_inputs="ist",
    add_step_timing_signal=True,
    step_timing_signal_type="learned",
    couple_carry_transform_gates=False,
    use_gated_transformer=True,
  ),
  "gru": dict(
    num_rec_steps=2,
    add_step_timing_signal=True,
    add_or_concat_timing_signal="concat",
    use_gated_transformer=True,
    gating_type="gru",
  ),
  "act": dict(
    recurrence_type="act",
    act_max_steps=3,
    add_step_timing_signal=True,
    step_timing_signal_type="learned",
    mix_with_transformer_before_ut=True,
    mix_with_transformer_after_ut=True,
    num_vanilla_transformer_layers=1,
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
  if variant == "highway":
    # Per-step highway gates; the residual gates shared by all passes.
    assert "encoder/dense_7/bias" in names
    assert "encoder/block_000/layer_000/SelfAttention/dense_3/bias" in names
    assert "encoder/block_000/layer_000/SelfAttention/dense_4/kernel" not in (
      names
    )
  if variant == "act":
    assert "encoder/layer_embedding" in names
    assert "encoder/sigmoid_activation_for_pondering/dense_1/bias" in names


# ----------------------------------------------------------------------------
# Configuration


def test_missing_and_invalid_parameters_are_named():
  # gin itself reports unbound REQUIRED parameters.
  with pytest.raises(RuntimeError, match="num_rec_steps"):
    ut.UTLayerStack(_layers(), **dict(BASE, num_rec_steps=gin.REQUIRED))
  with pytest.raises(ValueError, match="recurrence_type 'lstm'"):
    _ut(recurrence_type="lstm")
  with pytest.raises(ValueError, match="act_type 'dynamic'"):
    _ut(act_type="dynamic")
  with pytest.raises(ValueError, match="gating_type"):
    _ut(gating_type="lstm")
  with pytest.raises(ValueError, match="position_start_index"):
    _ut(position_start_index="middle")


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
