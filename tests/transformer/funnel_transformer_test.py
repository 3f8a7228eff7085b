"""Tests for transformer/funnel_transformer.py.

FunnelTransformerLayerStack against a numpy Funnel-Transformer encoder
(pooling after the first submodule of a block, mean, max and min pooling,
packed sequences, shared weights of repeated layers), pooled output lengths and
layer outputs, the same numbers on 1-device and 4-device meshes, nonzero
gradients for every variable, BitransformerFunnel wiring (decoder attends to
the pooled encoder output with strided sequence ids), the context after a
call (pooled length, positions 0..n-1) and decoding.
"""

import functools

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mesh_test_util as mtu
from tests.transformer import core_model_util as cmu
from transformer import funnel_transformer as ft
from transformer import transformer
from transformer import transformer_layers as tl

B, L, D, H, K, F = 4, 8, 8, 2, 4, 8
VOCAB = cmu.VOCAB
SA = (tl.SelfAttention, {"num_heads": H, "key_value_size": K})
DRD = (tl.DenseReluDense, {"hidden_size": F})
IDS = cmu.random_ids(0, (B, L))
SEQ = np.array(
  [
    [1, 1, 1, 1, 1, 1, 0, 0],
    [1, 1, 1, 2, 2, 2, 2, 2],
    [1, 1, 1, 1, 1, 1, 1, 1],
    [1, 2, 2, 3, 3, 3, 0, 0],
  ],
  np.int32,
)


def _stack(layers, block_param_size, block_repeat_size, **kwargs):
  cls = functools.partial(
    ft.FunnelTransformerLayerStack,
    n_blocks=len(block_param_size),
    block_param_size=block_param_size,
    block_repeat_size=block_repeat_size,
    **kwargs,
  )
  return transformer.make_layer_stack(
    layers, layer_stack_cls=cls, num_layers=sum(block_param_size)
  )


def _encoder(stack, name="encoder"):
  return transformer.Unitransformer(
    stack,
    d_model=D,
    input_vocab_size=VOCAB,
    output_vocab_size=None,
    autoregressive=False,
    max_length=L,
    name=name,
    vocab_divisor=cmu.VOCAB_DIVISOR,
    positional_embedding=False,
  )


def _run(
  make_stack, seq=SEQ, mesh_shape="", layout="", mode="eager", grads=False
):
  """(hidden, {variable: value}, layer output shapes, grads)."""
  names, shapes = [], []

  def build(mesh):
    inputs = cmu.import_ids(mesh, IDS, ["batch", "length"])
    sequence_id = (
      None if seq is None else cmu.import_ids(mesh, seq, ["batch", "length"])
    )
    layer_outputs = []
    hidden, _ = _encoder(make_stack()).call_simple(
      inputs,
      None,
      False,
      mode="train" if grads else "eval",
      sequence_id=sequence_id,
      layer_outputs=layer_outputs,
    )
    shapes[:] = [t.shape.to_integer_list for t in layer_outputs]
    variables = cmu.variables_by_name(mesh)
    names[:] = list(variables)
    out = [hidden] + list(variables.values())
    if grads:
      out += mtf.gradients(
        [mtf.reduce_sum(mtf.square(hidden))], list(variables.values())
      )
    return out

  out = mtu.run_program(build, mesh_shape, layout, mode)
  n = len(names)
  return out[0], dict(zip(names, out[1 : n + 1])), shapes, out[n + 1 :]


# ----------------------------------------------------------------------------
# numpy reference


def _softmax(x):
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _np_pool(x, kind, size=2):
  x = x.reshape(x.shape[0], x.shape[1] // size, size, *x.shape[2:])
  return {"mean": x.mean, "max": x.max, "min": x.min}[kind](2)


def _np_attention(p, prefix, hq, hkv, seq_q, seq_kv):
  def heads(h, name):
    return (h @ p[prefix + name]).reshape(h.shape[0], h.shape[1], H, K)

  q, k, v = heads(hq, "/q"), heads(hkv, "/k"), heads(hkv, "/v")
  logits = np.einsum("blhk,bmhk->bhlm", q, k)
  logits += np.where(
    seq_q[:, None, :, None] == seq_kv[:, None, None, :], 0.0, -1e9
  )
  o = np.einsum("bhlm,bmhk->blhk", _softmax(logits), v)
  return o.reshape(hq.shape[0], hq.shape[1], H * K) @ p[prefix + "/o"]


def _np_funnel(
  p, kinds, block_param_size, block_repeat_size, seq, pooling="mean"
):
  """kinds: the TransformerLayer class names of one layer (the submodules).

  Each layer j of block b runs block_repeat_size[b] times in a row under
  funnel_block_<b>/param_idx_<j>/submodule_<s>; in blocks after the first,
  the output of the first submodule is pooled and the sequence ids strided.
  """
  x = p["encoder/embedding"][IDS]
  seq = np.ones((B, L), np.int32) if seq is None else seq
  for block, (n_param, n_repeat) in enumerate(
    zip(block_param_size, block_repeat_size)
  ):
    for param in range(n_param):
      for repeat in range(n_repeat):
        for sub, kind in enumerate(kinds):
          name = "funnel_block_%03d/param_idx_%03d/submodule_%03d" % (
            block,
            param,
            sub,
          )
          prefix = "encoder/%s/%s" % (name, kind)
          npad = (seq != 0).astype(np.float32)[..., None]
          h = cmu.np_rms_norm(x, p["encoder/%s/rms_norm/scale" % name]) * npad
          if kind == "SelfAttention":
            y = _np_attention(p, prefix, h, h, seq, seq)
          else:
            y = (
              np.maximum(h @ p[prefix + "/wi/kernel"], 0)
              @ p[prefix + "/wo/kernel"]
            )
          x = x + y
          if block > 0 and param == 0 and repeat == 0 and sub == 0:
            x, seq = _np_pool(x, pooling), seq[:, ::2]
  npad = (seq != 0).astype(np.float32)[..., None]
  return cmu.np_rms_norm(x, p["encoder/rms_norm/scale"]) * npad


# ----------------------------------------------------------------------------
# Numerics


@pytest.mark.parametrize("pooling_type", ["mean", "max", "min"])
def test_funnel_encoder_matches_numpy(pooling_type):
  sizes, repeats = [1, 1, 1], [1, 1, 1]
  hidden, params, shapes, _ = _run(
    lambda: _stack([SA, DRD], sizes, repeats, pooling_type=pooling_type)
  )
  assert hidden.shape == (B, L // 4, D)
  expected = _np_funnel(
    params,
    ["SelfAttention", "DenseReluDense"],
    sizes,
    repeats,
    SEQ,
    pooling_type,
  )
  np.testing.assert_allclose(hidden, expected, rtol=1e-5, atol=1e-5)
  # Stack input, every layer output but the last, then the final output.
  assert [s[1] for s in shapes] == [8, 8, 8, 4, 4, 2, 2]
  assert all(s[0] == B and s[2] == D for s in shapes)
  assert sorted(params) == sorted(
    ["encoder/embedding", "encoder/rms_norm/scale"]
    + [
      "encoder/funnel_block_%03d/param_idx_000/submodule_000/"
      "SelfAttention/%s" % (b, v)
      for b in range(3)
      for v in "qkvo"
    ]
    + [
      "encoder/funnel_block_%03d/param_idx_000/submodule_001/"
      "DenseReluDense/%s/kernel" % (b, v)
      for b in range(3)
      for v in ("wi", "wo")
    ]
    + [
      "encoder/funnel_block_%03d/param_idx_000/submodule_%03d/rms_norm/"
      "scale" % (b, s)
      for b in range(3)
      for s in range(2)
    ]
  )


def test_funnel_repeated_layers_share_weights_and_match_numpy():
  sizes, repeats = [2, 1], [1, 2]
  hidden, params, shapes, _ = _run(
    lambda: _stack([SA, DRD], sizes, repeats), seq=None
  )
  assert hidden.shape == (B, L // 2, D)
  # 3 distinct layers of 2 submodules each.
  assert len([n for n in params if n.endswith("SelfAttention/q")]) == 3
  expected = _np_funnel(
    params, ["SelfAttention", "DenseReluDense"], sizes, repeats, None
  )
  np.testing.assert_allclose(hidden, expected, rtol=1e-5, atol=1e-5)
  assert len(shapes) == 2 + 2 * (2 + 2) - 1


def test_funnel_pools_the_output_of_a_first_non_attention_layer():
  sizes, repeats = [1, 1], [1, 1]
  hidden, params, _, _ = _run(
    lambda: _stack([DRD, SA], sizes, repeats, pooling_type="max")
  )
  expected = _np_funnel(
    params, ["DenseReluDense", "SelfAttention"], sizes, repeats, SEQ, "max"
  )
  assert hidden.shape == (B, L // 2, D)
  np.testing.assert_allclose(hidden, expected, rtol=1e-5, atol=1e-5)


def test_funnel_pooling_size_4_and_one_block_is_a_plain_stack():
  hidden, params, _, _ = _run(
    lambda: _stack([SA, DRD], [1, 1], [1, 1], pooling_size=4)
  )
  assert hidden.shape == (B, 2, D)
  one, params1, _, _ = _run(lambda: _stack([SA, DRD], [2], [1]))
  assert one.shape == (B, L, D)
  np.testing.assert_allclose(
    one,
    _np_funnel(params1, ["SelfAttention", "DenseReluDense"], [2], [1], SEQ),
    rtol=1e-5,
    atol=1e-5,
  )


@pytest.mark.parametrize(
  "mesh_shape,layout",
  [
    ("all:4", "batch:all"),
    ("all:4", "d_ff:all"),
    ("rows:2;cols:2", "batch:rows;heads:cols"),
  ],
)
def test_funnel_same_numbers_on_meshes(mesh_shape, layout):
  make = lambda: _stack([SA, DRD], [1, 1, 1], [1, 2, 1])
  hidden, params, _, _ = _run(make, mesh_shape=mesh_shape, layout=layout)
  expected = _np_funnel(
    params, ["SelfAttention", "DenseReluDense"], [1, 1, 1], [1, 2, 1], SEQ
  )
  np.testing.assert_allclose(hidden, expected, rtol=1e-5, atol=1e-5)


def test_funnel_gradients_reach_every_variable():
  _, params, _, grads = _run(
    lambda: _stack([SA, DRD], [1, 1], [1, 1]), grads=True
  )
  assert len(grads) == len(params)
  for name, g in zip(params, grads):
    assert np.abs(g).max() > 0, name


# ----------------------------------------------------------------------------
# Errors and configuration


def test_funnel_rejects_bad_configurations():
  layers = transformer.make_layer_stack([SA, DRD], num_layers=2).layers
  make = functools.partial(ft.FunnelTransformerLayerStack, layers, 2)
  with pytest.raises(ValueError, match="block_param_size"):
    make([1], [1, 1])
  with pytest.raises(ValueError, match="block_repeat_size"):
    make([1, 1], [1, 0])
  with pytest.raises(ValueError, match="pooling_type 'median'"):
    make([1, 1], [1, 1], pooling_type="median")
  with pytest.raises(ValueError, match="got 4 layers .* needs 6"):
    make([2, 1], [1, 1])
  # gin itself reports unbound REQUIRED parameters.
  with pytest.raises(RuntimeError, match="n_blocks"):
    ft.FunnelTransformerLayerStack(layers)


def test_funnel_rejects_indivisible_length_and_causal_towers():
  with pytest.raises(
    ValueError, match="length.*does not divide into pools of size 16"
  ):
    _run(lambda: _stack([SA, DRD], [1, 1, 1], [1, 1, 1], pooling_size=4))

  def causal(mesh):
    lm = transformer.Unitransformer(
      _stack([SA, DRD], [1, 1], [1, 1]),
      d_model=D,
      input_vocab_size=VOCAB,
      output_vocab_size=VOCAB,
      autoregressive=True,
      max_length=L,
    )
    lm.call_simple(cmu.import_ids(mesh, IDS, ["batch", "length"]), None, False)
    return []

  with pytest.raises(ValueError, match="causal attention"):
    mtu.run_program(causal)


def test_context_after_call_describes_the_pooled_sequence():
  stack = _stack([SA, DRD], [1, 1], [1, 1])
  assert stack.context is None

  def build(mesh):
    inputs = cmu.import_ids(mesh, IDS, ["batch", "length"])
    sequence_id = cmu.import_ids(mesh, SEQ, ["batch", "length"])
    _encoder(stack).call_simple(
      inputs, None, False, mode="eval", sequence_id=sequence_id
    )
    assert stack.context.length_dim == mtf.Dimension("length", L // 2)
    return [stack.context.position, stack.context.sequence_id]

  position, sequence_id = mtu.run_program(build)
  # The first positions (not the window starts) and each window's first id.
  np.testing.assert_array_equal(
    np.broadcast_to(position, (B, L // 2)),
    np.broadcast_to(np.arange(L // 2), (B, L // 2)),
  )
  np.testing.assert_array_equal(sequence_id, SEQ[:, ::2])


def test_gin_registration():
  gin.clear_config()
  try:
    gin.parse_config("""
        import mesh_tensorflow.transformer.funnel_transformer
        mesh_tensorflow.transformer.funnel_transformer.FunnelTransformerLayerStack.n_blocks = 2
        FunnelTransformerLayerStack.block_param_size = [1, 1]
        FunnelTransformerLayerStack.block_repeat_size = [1, 3]
        FunnelTransformerLayerStack.pooling_type = "max"
    """)
    layers = transformer.make_layer_stack([SA, DRD], num_layers=2).layers
    stack = ft.FunnelTransformerLayerStack(layers)
    assert (stack.n_blocks, stack.block_repeat_size, stack.pooling_type) == (
      2,
      [1, 3],
      "max",
    )
    gin.parse_config("BitransformerFunnel.shared_embedding = False")
    assert not ft.BitransformerFunnel(None, None).shared_embedding
  finally:
    gin.clear_config()


# ----------------------------------------------------------------------------
# BitransformerFunnel


def _bitransformer(sizes, cls=ft.BitransformerFunnel):
  encoder = _encoder(_stack([SA, DRD], sizes, [1] * len(sizes)))
  decoder = transformer.Unitransformer(
    transformer.make_layer_stack(
      [SA, (tl.EncDecAttention, {"num_heads": H, "key_value_size": K}), DRD],
      num_layers=1,
    ),
    d_model=D,
    input_vocab_size=VOCAB,
    output_vocab_size=VOCAB,
    autoregressive=True,
    max_length=L,
    name="decoder",
    vocab_divisor=cmu.VOCAB_DIVISOR,
    positional_embedding=False,
  )
  return cls(encoder, decoder)


def test_bitransformer_funnel_decoder_attends_to_pooled_encoder():
  targets = cmu.random_ids(5, (B, L))
  targets[0, 6:] = 0
  inputs = IDS * (SEQ > 0)
  pooled_seq = np.minimum(inputs, 1)[:, ::4]  # each window's first id

  def build(mesh):
    ids = cmu.import_ids(mesh, inputs, ["batch", "length"])
    tgt = cmu.import_ids(mesh, targets, ["batch", "length"])
    model = _bitransformer([1, 1, 1])
    logits, loss = model.call_simple(ids, tgt, True, mode="eval")
    # The same decoder fed by hand with the pooled encoder output.
    shared = model._shared_params(mesh, mtf.VariableDType(tf.float32))
    enc, _ = model.encoder.call_simple(
      ids,
      None,
      False,
      mode="eval",
      sequence_id=mtf.minimum(ids, 1),
      shared_params=shared,
    )
    rename = mtf.layers.rename_length_to_memory_length
    enc_seq = cmu.import_ids(mesh, pooled_seq, ["batch", "memory_length"])
    tgt_seq = mtf.minimum(tgt, 1)
    logits2, _ = model.decoder.call_simple(
      transformer.autoregressive_inputs(tgt, sequence_id=tgt_seq),
      tgt,
      False,
      mode="eval",
      sequence_id=tgt_seq,
      encoder_output=rename(enc),
      encoder_sequence_id=enc_seq,
      shared_params=shared,
    )
    return [logits, loss, logits2, enc]

  logits, loss, logits2, enc = mtu.run_program(build)
  assert enc.shape == (B, 2, D)
  assert logits.shape == (B, L, cmu.VOCAB_PADDED)
  assert np.isfinite(loss)
  np.testing.assert_allclose(logits, logits2, rtol=1e-5, atol=1e-5)


def test_bitransformer_funnel_without_pooling_equals_bitransformer():
  targets = cmu.random_ids(6, (B, L))

  def build(mesh):
    ids = cmu.import_ids(mesh, IDS, ["batch", "length"])
    tgt = cmu.import_ids(mesh, targets, ["batch", "length"])
    out = []
    for cls in (ft.BitransformerFunnel, transformer.Bitransformer):
      out += list(_bitransformer([2], cls).call_simple(ids, tgt, True))
    return out

  a, la, b, lb = mtu.run_program(build)
  np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(la, lb, rtol=1e-6)


def test_bitransformer_funnel_decode_shapes():
  def build(mesh):
    ids = cmu.import_ids(mesh, IDS, ["batch", "length"])
    model = _bitransformer([1, 1])
    return [
      model.decode(ids, max_decode_length=6),
      model.decode(ids, beam_size=2, max_decode_length=6),
    ]

  greedy, beams = mtu.run_program(build)
  assert greedy.shape == beams.shape == (B, 6)
  assert greedy.min() >= 0 and greedy.max() < cmu.VOCAB_PADDED


def test_bitransformer_funnel_greedy_decode_is_self_consistent():
  """Greedy decoding picks the argmax of the teacher-forced logits."""
  tf.random.set_seed(1)

  def build(mesh):
    ids = cmu.import_ids(mesh, IDS, ["batch", "length"])
    model = _bitransformer([1, 1])
    decoded = model.decode(ids, max_decode_length=L)
    logits, _ = model.call_simple(
      ids, decoded, False, mode="eval", decoder_sequence_id=1
    )
    return [decoded, mtf.argmax(logits, logits.shape.dims[-1])]

  decoded, argmax = mtu.run_program(build)
  assert decoded.shape == (B, L)
  for b in range(B):
    ends = np.nonzero(decoded[b] == 1)[0]
    stop = ends[0] + 1 if len(ends) else L
    np.testing.assert_array_equal(decoded[b, :stop], argmax[b, :stop])
