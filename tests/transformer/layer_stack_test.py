"""LayerStack, sublayers, ReversibleLayerStack and make_layer_stack."""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mesh_test_util as mtu
from tests import meshes
from tests.transformer import core_model_util as cmu
from transformer import transformer

B, L, D = cmu.BATCH, cmu.LENGTH, cmu.D_MODEL


def _encoder(layer_stack, name="encoder", **kwargs):
  kwargs.setdefault("positional_embedding", False)
  return transformer.Unitransformer(
    layer_stack,
    d_model=D,
    input_vocab_size=cmu.VOCAB,
    output_vocab_size=None,
    autoregressive=False,
    max_length=L,
    name=name,
    vocab_divisor=cmu.VOCAB_DIVISOR,
    **kwargs,
  )


def _run_encoder(
  make_stack,
  ids,
  sequence_id=None,
  mesh_shape="",
  layout="",
  mode="eager",
  extra_fn=None,
  **kwargs,
):
  """Runs an encoder; returns (hidden, {variable name: value}, extras)."""
  names = []

  def build(mesh):
    model = _encoder(make_stack(), **kwargs)
    inputs = cmu.import_ids(mesh, ids, ["batch", "length"])
    seq = (
      None
      if sequence_id is None
      else cmu.import_ids(mesh, sequence_id, ["batch", "length"])
    )
    layer_outputs = []
    hidden, _ = model.call_simple(
      inputs, None, False, sequence_id=seq, layer_outputs=layer_outputs
    )
    variables = cmu.variables_by_name(mesh)
    names[:] = list(variables)
    extras = extra_fn(mesh, hidden, layer_outputs) if extra_fn else []
    return [hidden] + list(variables.values()) + list(extras)

  out = mtu.run_program(build, mesh_shape, layout, mode)
  n = len(names)
  return out[0], dict(zip(names, out[1 : 1 + n])), out[1 + n :]


def _dense_stack(**kwargs):
  return lambda: transformer.LayerStack(
    transformer.make_layer_stack([cmu.DenseReluLayer], num_layers=2).layers,
    **kwargs,
  )


# ----------------------------------------------------------------------------
# Construction.


def test_default_and_legacy_sublayers():
  stack = transformer.LayerStack([])
  assert stack.sublayers_initial == [transformer.sublayer_dropout]
  assert stack.sublayers_per_layer == [
    transformer.sublayer_rms_norm,
    transformer.sublayer_call_layer,
    transformer.sublayer_dropout,
    transformer.sublayer_residual,
  ]
  assert stack.sublayers_final == [
    transformer.sublayer_rms_norm,
    transformer.sublayer_dropout,
  ]
  legacy = transformer.LayerStack(
    [], dropout_rate=0.1, norm_epsilon=1e-5, sublayers_final=[]
  )
  assert legacy.sublayers_initial == [transformer.sublayer_legacy_dropout]
  assert legacy.sublayers_per_layer == [
    transformer.sublayer_legacy_rms_norm,
    transformer.sublayer_call_layer,
    transformer.sublayer_legacy_dropout,
    transformer.sublayer_residual,
  ]
  assert legacy.sublayers_final == [
    transformer.sublayer_legacy_final_rms_norm,
    transformer.sublayer_legacy_dropout,
  ]
  assert (legacy.dropout_rate, legacy.norm_epsilon) == (0.1, 1e-5)


@pytest.mark.parametrize(
  "kwargs", [{"dropout_rate": 0.1}, {"norm_epsilon": 1e-6}]
)
def test_legacy_mode_needs_both_parameters(kwargs):
  with pytest.raises(ValueError, match="dropout_rate .* norm_epsilon"):
    transformer.LayerStack([], **kwargs)


def test_make_layer_stack_names_with_block_scope():
  stack = transformer.make_layer_stack(
    [
      cmu.DenseReluLayer,
      (cmu.RunningMeanLayer, "mean"),
      (cmu.DenseReluLayer, {"hidden_size": 3}),
      (cmu.DenseReluLayer, "wide", {"hidden_size": 5}),
    ],
    num_layers=2,
  )
  assert isinstance(stack, transformer.LayerStack)
  assert stack.num_layers == 8
  assert [l.name for l in stack.layers] == [
    "block_000/layer_000",
    "block_000/mean",
    "block_000/layer_002",
    "block_000/wide",
    "block_001/layer_000",
    "block_001/mean",
    "block_001/layer_002",
    "block_001/wide",
  ]
  assert [getattr(l, "hidden_size", None) for l in stack.layers[:4]] == [
    cmu.D_HIDDEN,
    None,
    3,
    5,
  ]
  assert stack.layers[0] is not stack.layers[4]


def test_make_layer_stack_names_without_block_scope():
  stack = transformer.make_layer_stack(
    [cmu.DenseReluLayer, (cmu.RunningMeanLayer, "mean")],
    num_layers=2,
    block_scope=False,
    layer_stack_cls=transformer.ReversibleLayerStack,
  )
  assert isinstance(stack, transformer.ReversibleLayerStack)
  assert [l.name for l in stack.layers] == [
    "layer_000",
    "mean",
    "layer_002",
    "mean",
  ]


def test_make_layer_stack_rejects_bad_entry():
  with pytest.raises(ValueError, match="neither a name string nor a kwargs"):
    transformer.make_layer_stack([(cmu.DenseReluLayer, 3)], num_layers=1)


# ----------------------------------------------------------------------------
# Numerics and names.


@pytest.mark.parametrize("legacy", [False, True])
def test_layer_stack_matches_numpy_with_padding(legacy):
  ids = cmu.random_ids(0, (B, L))
  seq = np.ones((B, L), np.int32)
  seq[1, 4:] = 0
  seq[3, 2:] = 0
  kwargs = {"dropout_rate": 0.0, "norm_epsilon": 1e-6} if legacy else {}
  layer_outputs = []

  def extra(mesh, hidden, outputs):
    layer_outputs.append(len(outputs))
    return outputs

  hidden, params, outs = _run_encoder(
    _dense_stack(**kwargs), ids, seq, extra_fn=extra
  )
  norms = (
    ("layer_norm", "final_layer_norm") if legacy else ("rms_norm", "rms_norm")
  )
  expected_names = [
    "encoder/block_000/layer_000/DenseReluLayer/wi",
    "encoder/block_000/layer_000/DenseReluLayer/wo",
    "encoder/block_000/layer_000/%s/scale" % norms[0],
    "encoder/block_001/layer_000/DenseReluLayer/wi",
    "encoder/block_001/layer_000/DenseReluLayer/wo",
    "encoder/block_001/layer_000/%s/scale" % norms[0],
    "encoder/embedding",
    "encoder/%s/scale" % norms[1],
  ]
  assert sorted(params) == sorted(expected_names)
  assert params["encoder/embedding"].shape == (cmu.VOCAB_PADDED, D)
  assert params["encoder/%s/scale" % norms[1]].shape == (D,)
  expected = cmu.np_tower(
    params,
    "encoder",
    ids,
    [
      ("DenseReluLayer", "block_000/layer_000"),
      ("DenseReluLayer", "block_001/layer_000"),
    ],
    nonpadding=seq.astype(np.float32),
    norm_names=norms,
  )
  np.testing.assert_allclose(hidden, expected, rtol=1e-5, atol=1e-5)
  # layer_outputs: the stack input, every layer output but the last, final.
  assert layer_outputs == [3]
  np.testing.assert_allclose(outs[2], hidden, rtol=1e-6)


@meshes.parametrize(meshes.TRANSFORMER_MODELS[1:])
def test_layer_stack_same_on_every_mesh(mesh_shape, layout):
  ids = cmu.random_ids(1, (B, L))
  hidden, params, _ = _run_encoder(
    _dense_stack(), ids, mesh_shape=mesh_shape, layout=layout, mode="function"
  )
  expected = cmu.np_tower(
    params,
    "encoder",
    ids,
    [
      ("DenseReluLayer", "block_000/layer_000"),
      ("DenseReluLayer", "block_001/layer_000"),
    ],
  )
  np.testing.assert_allclose(hidden, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
  "stack_cls", [transformer.LayerStack, transformer.ReversibleLayerStack]
)
def test_recompute_grads_gives_the_same_gradients(stack_cls):
  """Both variants in one graph share their variables (same names)."""
  ids = cmu.random_ids(2, (B, L))
  per_layer = None
  if stack_cls is transformer.ReversibleLayerStack:
    per_layer = [
      transformer.sublayer_rms_norm,
      transformer.sublayer_call_layer,
      transformer.sublayer_dropout,
    ]
  num_vars = []

  def build(mesh):
    inputs = cmu.import_ids(mesh, ids, ["batch", "length"])
    outputs = []
    for recompute in (False, True):
      layers = transformer.make_layer_stack(
        [cmu.DenseReluLayer, cmu.RunningMeanLayer], num_layers=2
      ).layers
      stack = stack_cls(
        layers, sublayers_per_layer=per_layer, recompute_grads=recompute
      )
      hidden, _ = _encoder(stack).call_simple(inputs, None, False)
      graph = mesh.graph
      variables = sorted(graph.trainable_variables, key=lambda v: v.name)
      num_vars.append(len(variables))
      loss = mtf.reduce_sum(mtf.square(hidden))
      grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
      outputs += [hidden] + grads
    params = cmu.variables_by_name(mesh)
    num_vars.append(list(params))
    return outputs + list(params.values())

  out = mtu.run_program(build, "", "", "eager")
  n = num_vars[0]
  assert num_vars[1] == n == 12
  plain, recomputed = out[: n + 1], out[n + 1 : 2 * n + 2]
  for a, b in zip(plain, recomputed):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  params = dict(zip(num_vars[2], out[2 * n + 2 :]))
  layers = [
    ("DenseReluLayer", "block_000/layer_000"),
    ("RunningMeanLayer", "block_000/layer_001"),
    ("DenseReluLayer", "block_001/layer_000"),
    ("RunningMeanLayer", "block_001/layer_001"),
  ]
  if stack_cls is transformer.LayerStack:
    expected = cmu.np_tower(params, "encoder", ids, layers)
  else:
    expected = _np_reversible(params, ids, layers)
  np.testing.assert_allclose(plain[0], expected, rtol=1e-5, atol=1e-5)


def _np_reversible(params, ids, layers):
  x = params["encoder/embedding"][ids]
  x1, x2 = x, x
  for kind, name in layers:
    h = cmu.np_rms_norm(x2, params["encoder/%s/rms_norm/scale" % name])
    f = cmu.np_layer(kind, params, "encoder/%s/%s" % (name, kind), h)
    x1, x2 = x2, x1 + f
  return cmu.np_rms_norm(x1 + x2, params["encoder/rms_norm/scale"])


# ----------------------------------------------------------------------------
# Other sublayers.


def test_norm_and_rezero_sublayers_match_numpy():
  ids = cmu.random_ids(3, (B, L))

  def final_norm(x, layer_stack, context):
    return transformer.sublayer_rms_norm_subsampled(
      x, layer_stack, context, percentage=50.0
    )

  def rezero(x, layer_stack, context):
    return transformer.sublayer_rezero(
      x, layer_stack, context, initial_value=0.5
    )

  def make_stack():
    layers = transformer.make_layer_stack(
      [cmu.DenseReluLayer], num_layers=1
    ).layers
    return transformer.LayerStack(
      layers,
      sublayers_initial=[transformer.sublayer_true_layer_norm],
      sublayers_per_layer=[
        transformer.sublayer_scale_norm,
        transformer.sublayer_call_layer,
        rezero,
        transformer.sublayer_clip_activation_gradient,
        transformer.sublayer_annealed_dropout,
        transformer.sublayer_residual,
      ],
      sublayers_final=[final_norm],
    )

  hidden, params, _ = _run_encoder(make_stack, ids)
  prefix = "encoder/block_000/layer_000/"
  assert sorted(params) == sorted(
    [
      prefix + "DenseReluLayer/wi",
      prefix + "DenseReluLayer/wo",
      prefix + "rezero_weight",
      prefix + "scale_norm/scale",
      "encoder/embedding",
      "encoder/layer_norm_subsampled/scale",
      "encoder/true_layer_norm/layer_prepostprocess/layer_norm/layer_norm_bias",
      "encoder/true_layer_norm/layer_prepostprocess/layer_norm/layer_norm_scale",
    ]
  )
  assert params[prefix + "scale_norm/scale"].shape == ()
  assert params[prefix + "rezero_weight"] == 0.5
  x = params["encoder/embedding"][ids]
  mean = x.mean(-1, keepdims=True)
  var = np.square(x - mean).mean(-1, keepdims=True)
  x = (x - mean) / np.sqrt(var + 1e-6) * params[
    "encoder/true_layer_norm/layer_prepostprocess/layer_norm/layer_norm_scale"
  ] + params[
    "encoder/true_layer_norm/layer_prepostprocess/layer_norm/layer_norm_bias"
  ]
  h = x / np.sqrt(np.square(x).mean(-1, keepdims=True) + 1e-6)
  h *= params[prefix + "scale_norm/scale"]
  y = cmu.np_layer("DenseReluLayer", params, prefix + "DenseReluLayer", h)
  x = x + 0.5 * y
  half = x[..., : D // 2]
  expected = (
    x
    / np.sqrt(np.square(half).mean(-1, keepdims=True) + 1e-6)
    * params["encoder/layer_norm_subsampled/scale"]
  )
  np.testing.assert_allclose(hidden, expected, rtol=1e-5, atol=1e-5)


def test_dropout_sublayer_broadcasts_over_length():
  ids = cmu.random_ids(4, (B, L))

  def dropout(x, layer_stack, context):
    return transformer.sublayer_dropout(
      x, layer_stack, context, dropout_rate=0.5
    )

  def build(mesh):
    model = _encoder(
      transformer.LayerStack(
        [], sublayers_initial=[dropout], sublayers_final=[]
      )
    )
    inputs = cmu.import_ids(mesh, ids, ["batch", "length"])
    train, _ = model.call_simple(inputs, None, False, mode="train")
    infer, _ = model.call_simple(inputs, None, False, mode="infer")
    return [train, infer]

  train, infer = mtu.run_program(build)
  ratio = train / infer
  np.testing.assert_allclose(ratio, np.broadcast_to(ratio[:, :1], ratio.shape))
  assert set(np.unique(np.round(ratio, 5))) == {0.0, 2.0}


def test_layer_stack_rejects_misshaped_layer_output():
  class Widen(transformer.TransformerLayer):
    def call(self, context, x):
      return mtf.broadcast(x, [mtf.Dimension("extra", 2)] + x.shape.dims)

  def make_stack():
    return transformer.make_layer_stack(
      [(Widen, "wide")], num_layers=1, block_scope=False
    )

  with pytest.raises(ValueError, match="layer wide .Widen. returned shape"):
    _run_encoder(make_stack, cmu.random_ids(5, (B, L)))


class _AuxLossLayer(transformer.TransformerLayer):
  """y = x * w; appends 0.01 * sum(y^2) to context.losses (as MoE does)."""

  def call(self, context, x):
    w = mtf.get_variable(
      x.mesh,
      "w",
      [context.model.model_dim],
      initializer=tf.constant_initializer(0.5),
      dtype=context.variable_dtype,
    )
    y = x * w
    if context.losses is not None:
      context.losses.append(mtf.reduce_sum(mtf.square(y)) * 0.01)
    return y


@pytest.mark.skipif(
  mtu.TF1_ENV,
  reason="compares two runs seeded with tf.random.set_seed, "
  "which MTF_TEST_TF_MODE=v1's graph runs do not see",
)
def test_recompute_grads_keeps_aux_losses_and_creates_variables_inside():
  """Layers first called under recompute create their variables there; their
  aux losses still reach the loss, with the plain gradients.
  """
  ids = cmu.random_ids(3, (B, L))
  results = []
  for recompute in (False, True):

    def build(mesh, recompute=recompute):
      inputs = cmu.import_ids(mesh, ids, ["batch", "length"])
      stack = transformer.LayerStack(
        transformer.make_layer_stack(
          [_AuxLossLayer, cmu.DenseReluLayer], num_layers=2
        ).layers,
        recompute_grads=recompute,
      )
      _, loss = _encoder(stack).call_simple(inputs, None, True)
      variables = sorted(mesh.graph.trainable_variables, key=lambda v: v.name)
      grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
      # The final norm's scale does not reach the aux losses: no gradient.
      return [loss] + [g for g in grads if g is not None]

    tf.random.set_seed(11)
    results.append(mtu.run_program(build, "", "", "eager"))
  plain, recomputed = results
  assert len(plain) == len(recomputed) > 1
  assert float(plain[0]) > 0
  for a, b in zip(plain, recomputed):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
