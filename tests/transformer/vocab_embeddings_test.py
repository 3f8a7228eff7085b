"""Tests for transformer.vocab_embeddings against numpy formulations.

Variables are pre-created under the names the classes must use, with known
values (a class using other names or shapes would fail the name check or
the numbers). The multi-device runs compare results on the "all:4" and
"rows:2;cols:2" meshes (eager, once in tf.function), with vocab, d_model,
length or inner dims split, to the 1-device numbers.
"""

import types

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mesh_test_util as mtu
from transformer import vocab_embeddings
from transformer._src.layers import context as context_lib

tf1 = tf.compat.v1

BATCH = mtf.Dimension("batch", 2)
LENGTH = mtf.Dimension("length", 4)
D_MODEL = mtf.Dimension("d_model", 8)
VOCAB = mtf.Dimension("vocab", 32)
ENSEMBLE = mtf.Dimension("ensemble", 2)
D = D_MODEL.size
V = VOCAB.size

_RNG = np.random.RandomState(0)
IDS = _RNG.randint(0, V, size=(2, 4)).astype(np.int32)
IDS[0, :3] = [0, V - 1, 23]  # cluster edges of the adaptive tests
HIDDEN = _RNG.normal(size=(2, 4, D)).astype(np.float32)

VDT = mtf.VariableDType(tf.float32)


def _w(seed, *shape, scale=0.5):
  return (np.random.RandomState(seed).normal(size=shape) * scale).astype(
    np.float32
  )


def _context(mesh, mode="eval"):
  model = types.SimpleNamespace(
    model_dim=D_MODEL,
    ensemble_dims=[],
    ensemble_dim=None,
    fully_autoregressive=True,
    autoregressive=True,
    layout=None,
    mesh_shape=None,
    max_length_dim=LENGTH,
  )
  return context_lib.Context(
    model=model,
    mesh=mesh,
    batch_dims=[BATCH],
    length_dim=LENGTH,
    variable_dtype=VDT,
    mode=mode,
    losses=[],
  )


def _make_vars(mesh, values):
  """Pre-creates variables {name: (dims, numpy value)} in the current scope."""
  for name, (dims, value) in values.items():
    mtf.get_variable(
      mesh, name, dims, initializer=tf1.constant_initializer(value)
    )


def _var_shapes(graph):
  return {v.name: [d.size for d in v.shape.dims] for v in graph.all_variables}


def _run(
  make_embedding,
  variables,
  mesh_shape="",
  layout="",
  mode="eager",
  ids=IDS,
  hidden=HIDDEN,
  context_mode="eval",
  seen=None,
):
  """Builds `make_embedding(mesh)` in scope "tower"; returns (emb, logits)."""

  def build(mesh):
    with tf1.variable_scope("tower"):
      _make_vars(mesh, variables)
      embedding = make_embedding(mesh)
    ctx = _context(mesh, context_mode)
    ids_t = mtf.import_tf_tensor(mesh, ids, [BATCH, LENGTH])
    hidden_t = mtf.import_tf_tensor(mesh, hidden, [BATCH, LENGTH, D_MODEL])
    emb = embedding.ids_to_embedding(ids_t, ctx)
    logits = embedding.hidden_to_logits(hidden_t, ctx)
    assert emb.shape == mtf.Shape([BATCH, LENGTH, D_MODEL])
    assert set(logits.shape.dims) == {BATCH, LENGTH, VOCAB}
    logits = mtf.transpose(logits, [BATCH, LENGTH, VOCAB])
    if seen is not None:
      seen.update(_var_shapes(mesh.graph))
    return [emb, logits]

  return mtu.run_program(build, mesh_shape, layout, mode)


def _log_softmax(x, axis=-1):
  m = x.max(axis=axis, keepdims=True)
  return x - m - np.log(np.exp(x - m).sum(axis=axis, keepdims=True))


def _sigmoid(x):
  return 1.0 / (1.0 + np.exp(-x))


def _check_multi_mesh(make_embedding, variables, configs, mode="eager"):
  """Same numbers as 1-device on every (mesh_shape, layout) in configs."""
  expected = _run(make_embedding, variables, mode=mode)
  for mesh_shape, layout in configs:
    actual = _run(make_embedding, variables, mesh_shape, layout, mode)
    mtu.assert_all_close(
      actual, expected, msg="mesh %r layout %r" % (mesh_shape, layout)
    )


# ----------------------------------------------------------------------------
# FactorizedVocabEmbedding

INNER = mtf.Dimension("inner_vocab", 4)
E1 = _w(1, V, 4)
E2 = _w(2, 4, D)
FACTORIZED_VARS = {
  "embedding1": ([VOCAB, INNER], E1),
  "embedding2": ([INNER, D_MODEL], E2),
}


def _factorized(mesh):
  return vocab_embeddings.FactorizedVocabEmbedding(
    mesh, VOCAB, D_MODEL, VDT, "embedding", None, inner_dimension_size=4
  )


def test_factorized_is_two_matmuls_with_spec_variables():
  seen = {}
  emb, logits = _run(_factorized, FACTORIZED_VARS, seen=seen)
  assert seen == {"tower/embedding1": [V, 4], "tower/embedding2": [4, D]}
  np.testing.assert_allclose(emb, E1[IDS] @ E2, rtol=1e-5, atol=1e-5)
  expected = (HIDDEN * D**-0.5) @ E2.T @ E1.T
  np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5)


def test_factorized_multi_mesh():
  _check_multi_mesh(
    _factorized,
    FACTORIZED_VARS,
    [
      ("all:4", "vocab:all"),
      ("all:4", "inner_vocab:all"),
      ("rows:2;cols:2", "vocab:rows;d_model:cols"),
      ("rows:2;cols:2", "batch:rows;d_model:cols"),
    ],
  )
  # Once inside a tf.function too.
  _check_multi_mesh(
    _factorized,
    FACTORIZED_VARS,
    [("rows:2;cols:2", "vocab:rows;d_model:cols")],
    "function",
  )


def test_factorized_fresh_variables_and_ensemble():
  seen = {}
  ensemble_ids = np.stack([IDS, IDS[::-1]])

  def build(mesh):
    emb = vocab_embeddings.FactorizedVocabEmbedding(
      mesh, VOCAB, D_MODEL, VDT, "emb", ENSEMBLE, inner_dimension_size=4
    )
    ids = mtf.import_tf_tensor(mesh, ensemble_ids, [ENSEMBLE, BATCH, LENGTH])
    x = emb.ids_to_embedding(ids, _context(mesh))
    seen.update(_var_shapes(mesh.graph))
    graph_vars = {v.name: v.outputs[0] for v in mesh.graph.all_variables}
    return [x, graph_vars["emb1"], graph_vars["emb2"]]

  x, e1, e2 = mtu.run_program(build)
  assert seen == {"emb1": [2, V, 4], "emb2": [2, 4, D]}
  for k in range(2):
    np.testing.assert_allclose(
      x[k], e1[k][ensemble_ids[k]] @ e2[k], rtol=1e-5, atol=1e-5
    )
  # Initializer stddev inner**-0.25 per factor.
  assert 0.4 < e1.std() < 1.1 and 0.4 < e2.std() < 1.1


def test_factorized_rejects_bad_inner_size():
  with pytest.raises(ValueError, match="inner_dimension_size"):
    mtu.run_program(
      lambda mesh: [
        vocab_embeddings.FactorizedVocabEmbedding(
          mesh, VOCAB, D_MODEL, VDT, "embedding", None, inner_dimension_size=0
        )
      ]
    )


# ----------------------------------------------------------------------------
# AdaptiveVocabEmbedding

T0 = _w(3, 24, D)
A11 = _w(4, 8, 4)
A12 = _w(5, 4, D)
ADAPTIVE_VARS = {
  "embedding_0": ([mtf.Dimension("vocab", 24), D_MODEL], T0),
  "embedding_11": ([mtf.Dimension("vocab", 8), INNER], A11),
  "embedding_12": ([INNER, D_MODEL], A12),
}
ADAPTIVE_CLUSTERS = [
  {"token_count": 24, "embedding_size": D},
  {"token_count": 8, "embedding_size": 4},
]


def _adaptive(mesh):
  return vocab_embeddings.AdaptiveVocabEmbedding(
    mesh, VOCAB, D_MODEL, VDT, "embedding", None, clusters=ADAPTIVE_CLUSTERS
  )


def test_adaptive_is_per_cluster_projection():
  seen = {}
  emb, logits = _run(_adaptive, ADAPTIVE_VARS, seen=seen)
  assert seen == {
    "tower/embedding_0": [24, D],
    "tower/embedding_11": [8, 4],
    "tower/embedding_12": [4, D],
  }
  table = np.concatenate([T0, A11 @ A12])
  np.testing.assert_allclose(emb, table[IDS], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(
    logits, (HIDDEN * D**-0.5) @ table.T, rtol=1e-5, atol=1e-5
  )


def test_adaptive_multi_mesh_and_split_vocab_error():
  _check_multi_mesh(
    _adaptive,
    ADAPTIVE_VARS,
    [
      ("all:4", "length:all"),
      ("all:4", "d_model:all"),
      ("rows:2;cols:2", "batch:rows;d_model:cols"),
    ],
  )
  with pytest.raises(ValueError, match="vocab"):
    _run(_adaptive, ADAPTIVE_VARS, "all:4", "vocab:all")


@pytest.mark.parametrize(
  "clusters, match",
  [
    ([{"token_count": 24}, {"token_count": 4}], "sum to 28"),
    ([{"token_count": 32, "length_projection_factor": 0.5}], "unknown keys"),
    ([{"embedding_size": 4}], "token_count"),
    ([{"token_count": 32, "embedding_size": 0}], "embedding_size"),
    ([], "non-empty"),
  ],
)
def test_adaptive_rejects_bad_clusters(clusters, match):
  with pytest.raises(ValueError, match=match):
    mtu.run_program(
      lambda mesh: [
        vocab_embeddings.AdaptiveVocabEmbedding(
          mesh, VOCAB, D_MODEL, VDT, "embedding", None, clusters=clusters
        )
      ]
    )


# ----------------------------------------------------------------------------
# MixtureOfSoftmaxes

K = 3
COMPONENTS = mtf.Dimension("softmax_components", K)
COPY = mtf.Dimension("_d_model_copy", D)
MOS_E = _w(6, V, D)
MOS_M = _w(7, K, D)
MOS_W = _w(8, K, D, D)
MOS_VARS = {
  "embedding_embedding_weights": ([VOCAB, D_MODEL], MOS_E),
  "embedding_mixture_weights": ([COMPONENTS, D_MODEL], MOS_M),
  "embedding_context_weights": ([COMPONENTS, COPY, D_MODEL], MOS_W),
}


def _mos(mesh):
  return vocab_embeddings.MixtureOfSoftmaxes(
    mesh, VOCAB, D_MODEL, VDT, "embedding", None, num_softmaxes=K
  )


def _mos_reference(hidden):
  h = hidden * D**-0.5
  prior = np.exp(_log_softmax(h @ MOS_M.T))  # [b, l, K]
  probs = 0.0
  for k in range(K):
    context = np.tanh(h @ MOS_W[k])
    probs = probs + prior[..., k : k + 1] * np.exp(
      _log_softmax(context @ MOS_E.T)
    )
  return np.log(probs)


def test_mixture_of_softmaxes_is_log_of_mixed_probabilities():
  seen = {}
  emb, logits = _run(_mos, MOS_VARS, seen=seen)
  assert seen == {
    "tower/embedding_embedding_weights": [V, D],
    "tower/embedding_mixture_weights": [K, D],
    "tower/embedding_context_weights": [K, D, D],
  }
  np.testing.assert_allclose(emb, MOS_E[IDS], rtol=1e-6)
  np.testing.assert_allclose(
    logits, _mos_reference(HIDDEN), rtol=1e-5, atol=1e-5
  )
  np.testing.assert_allclose(np.exp(logits).sum(-1), 1.0, rtol=1e-5)


def test_mixture_of_softmaxes_multi_mesh():
  _check_multi_mesh(
    _mos,
    MOS_VARS,
    [
      ("all:4", "vocab:all"),
      ("all:4", "d_model:all"),
      ("rows:2;cols:2", "vocab:rows;d_model:cols"),
      ("rows:2;cols:2", "batch:cols;vocab:rows"),
    ],
  )


# ----------------------------------------------------------------------------
# Mixtape

G = 4
F = 8  # frequent tokens: 0.25 * 32
EXTRA = 3
GATES3 = mtf.Dimension("gates", 3)
GATES4 = mtf.Dimension("gates", 4)
GATE_EMB = mtf.Dimension("gate_embedding", G)
FREQ = mtf.Dimension("vocab", F)
MT = {
  "E": _w(9, V, D),
  "W": _w(10, 4, D, D),
  "b": _w(11, 4, D),
  "P": _w(12, 3, G, D),
  "p": _w(13, 3, G),
  "u": _w(14, F, G),
  "q": _w(15, 3, D),
  "r": _w(16, F, 3),
}
MIXTAPE_VARS = {
  "embedding_embedding_weights": ([VOCAB, D_MODEL], MT["E"]),
  "embedding_context_weights": ([GATES4, COPY, D_MODEL], MT["W"]),
  "embedding_context_weights_bias": ([GATES4, D_MODEL], MT["b"]),
  "embedding_prior_weights": ([GATES3, GATE_EMB, D_MODEL], MT["P"]),
  "embedding_prior_weights_bias": ([GATES3, GATE_EMB], MT["p"]),
  "embedding_prior_vocab_vector": ([FREQ, GATE_EMB], MT["u"]),
  "embedding_prior_gates_vector": ([GATES3, D_MODEL], MT["q"]),
  "embedding_prior_bias": ([FREQ, GATES3], MT["r"]),
}


def _mixtape_factory(extra_ids=EXTRA, **kwargs):
  def make(mesh):
    return vocab_embeddings.Mixtape(
      mesh,
      VOCAB,
      D_MODEL,
      VDT,
      "embedding",
      None,
      extra_ids=extra_ids,
      gate_embedding_size=G,
      frequent_token_fraction=0.25,
      **kwargs,
    )

  return make


def _mixtape_reference(hidden, extra_ids):
  """Token by token: gates from the token's frequent slot or shared ones."""
  h = hidden * D**-0.5
  contexts = np.stack(
    [np.tanh(h @ MT["W"][k] + MT["b"][k]) for k in range(4)], -2
  )  # [b, l, 4, D]
  gate_context = np.tanh(np.einsum("bld,jgd->bljg", h, MT["P"]) + MT["p"])
  shared = np.einsum("bld,jd->blj", h, MT["q"])  # [b, l, 3]
  logits = np.zeros(hidden.shape[:2] + (V,), np.float64)
  for token in range(V):
    gate_logits = shared
    if token < F:
      gate_logits = (
        np.einsum("bljg,g->blj", gate_context, MT["u"][token])
        + shared
        + MT["r"][token]
      )
    g = _sigmoid(gate_logits)
    pi = np.stack(
      [
        g[..., 0] * g[..., 1],
        g[..., 0] * (1 - g[..., 1]),
        (1 - g[..., 0]) * g[..., 2],
        (1 - g[..., 0]) * (1 - g[..., 2]),
      ],
      -1,
    )
    component_logits = contexts @ MT["E"][token]  # [b, l, 4]
    logits[..., token] = (pi * component_logits).sum(-1)
  # The original then moves the first extra_ids logits to the end.
  return np.roll(logits, -extra_ids, axis=-1)


@pytest.mark.parametrize("extra_ids", [0, EXTRA])
def test_mixtape_matches_per_token_reference(extra_ids):
  seen = {}
  emb, logits = _run(_mixtape_factory(extra_ids), MIXTAPE_VARS, seen=seen)
  assert seen == {
    "tower/" + k: [d.size for d in dims]
    for k, (dims, _) in MIXTAPE_VARS.items()
  }
  np.testing.assert_allclose(emb, MT["E"][IDS], rtol=1e-6)
  np.testing.assert_allclose(
    logits, _mixtape_reference(HIDDEN, extra_ids), rtol=1e-4, atol=1e-5
  )


def test_mixtape_multi_mesh_and_split_vocab_error():
  _check_multi_mesh(
    _mixtape_factory(),
    MIXTAPE_VARS,
    [
      ("all:4", "length:all"),
      ("all:4", "d_model:all"),
      ("all:4", "gate_embedding:all"),
      ("rows:2;cols:2", "batch:rows;d_model:cols"),
    ],
  )
  with pytest.raises(ValueError, match="vocab"):
    _run(_mixtape_factory(), MIXTAPE_VARS, "all:4", "vocab:all")


def test_mixtape_gradients_reach_every_variable():
  def build(mesh):
    with tf1.variable_scope("tower"):
      _make_vars(mesh, MIXTAPE_VARS)
      embedding = _mixtape_factory()(mesh)
    hidden = mtf.import_tf_tensor(mesh, HIDDEN, [BATCH, LENGTH, D_MODEL])
    logits = embedding.hidden_to_logits(hidden, _context(mesh, "train"))
    loss = mtf.reduce_sum(mtf.square(logits))
    variables = [v.outputs[0] for v in mesh.graph.all_variables]
    grads = mtf.gradients([loss], variables)
    assert all(g is not None for g in grads)
    return grads

  for grad in mtu.run_program(build):
    assert np.all(np.isfinite(grad)) and np.abs(grad).max() > 0


def test_mixtape_dropout_and_noise_only_in_training():
  plain = _run(_mixtape_factory(), MIXTAPE_VARS, context_mode="train")[1]
  noisy = _mixtape_factory(dropout_rate=0.5, noise_std_dev=1.0)
  eval_logits = _run(noisy, MIXTAPE_VARS, context_mode="eval")[1]
  train_logits = _run(noisy, MIXTAPE_VARS, context_mode="train")[1]
  np.testing.assert_allclose(plain, eval_logits, rtol=1e-5, atol=1e-5)
  assert np.abs(train_logits - eval_logits).max() > 1e-2


def test_mixtape_gate_vectors_and_prior_bias_start_standard_normal():
  # As in the original: prior_vocab_vector, prior_gates_vector and
  # prior_bias use tf's random_normal_initializer() (stddev 1).
  def build(mesh):
    embedding = vocab_embeddings.Mixtape(
      mesh,
      mtf.Dimension("vocab", 800),
      mtf.Dimension("d_model", 400),
      VDT,
      "emb",
      None,
      gate_embedding_size=16,
      frequent_token_fraction=0.5,
    )
    return [
      embedding._prior_vocab_vector,
      embedding._prior_gates_vector,
      embedding._prior_bias,
    ]

  vocab_vector, gates_vector, prior_bias = mtu.run_program(build)
  assert vocab_vector.shape == (400, 16) and prior_bias.shape == (400, 3)
  for values in (vocab_vector, gates_vector, prior_bias):
    assert abs(values.std() - 1.0) < 0.1
    assert abs(values.mean()) < 0.1


@pytest.mark.parametrize(
  "kwargs, match",
  [
    ({"frequent_token_fraction": 0.01}, "frequent_token_fraction"),
    ({"frequent_token_fraction": 1.0}, "frequent_token_fraction"),
    ({"extra_ids": 40}, "extra_ids"),
    ({"dropout_rate": 1.0}, "dropout_rate"),
  ],
)
def test_mixtape_rejects_bad_arguments(kwargs, match):
  args = dict(gate_embedding_size=G, frequent_token_fraction=0.25)
  args.update(kwargs)
  with pytest.raises(ValueError, match=match):
    mtu.run_program(
      lambda mesh: [
        vocab_embeddings.Mixtape(
          mesh, VOCAB, D_MODEL, VDT, "embedding", None, **args
        )
      ]
    )


# ----------------------------------------------------------------------------
# Ensembles and gin


@pytest.mark.parametrize(
  "cls, kwargs, shapes",
  [
    (
      vocab_embeddings.MixtureOfSoftmaxes,
      {"num_softmaxes": 2},
      {
        "e_embedding_weights": [2, V, D],
        "e_mixture_weights": [2, 2, D],
        "e_context_weights": [2, 2, D, D],
      },
    ),
    (
      vocab_embeddings.Mixtape,
      {"gate_embedding_size": 2, "frequent_token_fraction": 0.5},
      {
        "e_embedding_weights": [2, V, D],
        "e_context_weights": [2, 4, D, D],
        "e_context_weights_bias": [2, 4, D],
        "e_prior_weights": [2, 3, 2, D],
        "e_prior_weights_bias": [2, 3, 2],
        "e_prior_vocab_vector": [2, 16, 2],
        "e_prior_gates_vector": [2, 3, D],
        "e_prior_bias": [2, 16, 3],
      },
    ),
  ],
)
def test_ensemble_variables_and_per_member_logits(cls, kwargs, shapes):
  seen = {}
  hidden = np.stack([HIDDEN, HIDDEN])
  hidden[1] *= 2.0

  def build(mesh):
    emb = cls(mesh, VOCAB, D_MODEL, VDT, "e", ENSEMBLE, **kwargs)
    h = mtf.import_tf_tensor(mesh, hidden, [ENSEMBLE, BATCH, LENGTH, D_MODEL])
    logits = emb.hidden_to_logits(h, _context(mesh))
    seen.update(_var_shapes(mesh.graph))
    return [mtf.transpose(logits, [ENSEMBLE, BATCH, LENGTH, VOCAB])]

  (logits,) = mtu.run_program(build)
  assert seen == shapes
  assert np.all(np.isfinite(logits))
  assert np.abs(logits[0] - logits[1]).max() > 1e-3


def test_gin_configurable_under_original_module():
  gin.clear_config()
  try:
    gin.parse_config(
      "mesh_tensorflow.transformer.vocab_embeddings."
      "FactorizedVocabEmbedding.inner_dimension_size = 4\n"
      "MixtureOfSoftmaxes.num_softmaxes = 3\n"
      "Mixtape.gate_embedding_size = 4\n"
      "AdaptiveVocabEmbedding.clusters = [{'token_count': 32}]\n"
    )
    seen = {}

    def build(mesh):
      for cls in (
        vocab_embeddings.FactorizedVocabEmbedding,
        vocab_embeddings.MixtureOfSoftmaxes,
        vocab_embeddings.Mixtape,
        vocab_embeddings.AdaptiveVocabEmbedding,
      ):
        with tf1.variable_scope(cls.__name__):
          cls(mesh, VOCAB, D_MODEL, VDT, "emb", None)
      seen.update(_var_shapes(mesh.graph))
      return []

    mtu.run_program(build)
  finally:
    gin.clear_config()
  assert seen["FactorizedVocabEmbedding/emb1"] == [V, 4]
  assert seen["MixtureOfSoftmaxes/emb_mixture_weights"] == [3, D]
  assert seen["Mixtape/emb_prior_vocab_vector"] == [3, 4]
  assert seen["AdaptiveVocabEmbedding/emb_0"] == [V, D]


@pytest.mark.parametrize(
  "cls, params, names",
  [
    (
      vocab_embeddings.FactorizedVocabEmbedding,
      {"inner_dimension_size": 4},
      ["embedding1", "embedding2"],
    ),
    (
      vocab_embeddings.MixtureOfSoftmaxes,
      {"num_softmaxes": 2},
      [
        "embedding_context_weights",
        "embedding_embedding_weights",
        "embedding_mixture_weights",
      ],
    ),
    (
      vocab_embeddings.AdaptiveVocabEmbedding,
      {"clusters": ADAPTIVE_CLUSTERS},
      ["embedding_0", "embedding_11", "embedding_12"],
    ),
    (
      vocab_embeddings.Mixtape,
      {"gate_embedding_size": 2, "frequent_token_fraction": 0.25},
      [
        "embedding_" + k
        for k in (
          "context_weights",
          "context_weights_bias",
          "embedding_weights",
          "prior_bias",
          "prior_gates_vector",
          "prior_vocab_vector",
          "prior_weights",
          "prior_weights_bias",
        )
      ],
    ),
  ],
)
def test_drop_in_for_unitransformer(cls, params, names):
  from transformer import transformer  # pylint: disable=g-import-not-at-top

  gin.clear_config()
  gin.bind_parameter(
    "mesh_tensorflow.transformer.transformer.get_vocab_embedding_cls.cls", cls
  )
  for key, value in params.items():
    gin.bind_parameter("%s.%s" % (cls.__name__, key), value)
  try:
    model = transformer.Unitransformer(
      transformer.LayerStack([]),
      d_model=D,
      input_vocab_size=V,
      output_vocab_size=V,
      autoregressive=True,
      max_length=4,
      shared_embedding_and_softmax_weights=True,
      vocab_divisor=V,
      positional_embedding=False,
    )
    seen = {}

    def build(mesh):
      ids = mtf.import_tf_tensor(mesh, IDS, [BATCH, LENGTH])
      logits, loss = model.call_simple(ids, ids, True, mode="eval")
      seen.update(_var_shapes(mesh.graph))
      return [mtf.transpose(logits, [BATCH, LENGTH, VOCAB]), loss]

    logits, loss = mtu.run_program(build)
  finally:
    gin.clear_config()
  # The stack's final norm plus the embedding's variables, nothing else.
  assert sorted(seen) == sorted(
    ["transformer/rms_norm/scale"] + ["transformer/" + n for n in names]
  )
  assert logits.shape == (2, 4, V) and np.all(np.isfinite(logits))
  assert np.isfinite(loss) and loss > 0
