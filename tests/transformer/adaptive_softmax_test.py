"""Tests for transformer.adaptive_softmax against a numpy full softmax.

The adaptive softmax's log-probabilities are log p(cluster) + log p(token |
cluster); its training loss, computed cluster by cluster from the hidden
states, must equal the cross-entropy of those log-probabilities (plus the
z-loss of each softmax evaluated), except for tail targets beyond a
cluster's projected length, which are left out.
"""

import types

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mesh_test_util as mtu
from transformer._src.layers import adaptive_softmax
from transformer._src.layers import context as context_lib

tf1 = tf.compat.v1

BATCH = mtf.Dimension("batch", 2)
LENGTH = mtf.Dimension("length", 4)
D_MODEL = mtf.Dimension("d_model", 8)
VOCAB = mtf.Dimension("vocab", 32)
INNER = mtf.Dimension("inner_vocab", 4)
D = D_MODEL.size
VDT = mtf.VariableDType(tf.float32)

_RNG = np.random.RandomState(3)
HIDDEN = _RNG.normal(size=(2, 4, D)).astype(np.float32)
IDS = np.array([[0, 19, 20, 31], [27, 28, 5, 12]], np.int32)
# Targets: padding 0, a masked -5, ids of all three clusters; sequence 1
# has three ids of the last cluster (more than its projected length 2).
TARGETS = np.array([[3, 21, 0, 30], [28, -5, 31, 29]], np.int32)
TARGETS_FEW = np.array([[3, 21, 0, 30], [28, -5, 31, 7]], np.int32)


def _w(seed, *shape):
  return (np.random.RandomState(seed).normal(size=shape) * 0.5).astype(
    np.float32
  )


T0, A11, A12, A21, A22 = (
  _w(10, 22, D),
  _w(11, 8, 4),
  _w(12, 4, D),
  _w(13, 4, 4),
  _w(14, 4, D),
)
VARIABLES = {
  "embedding_0": ([mtf.Dimension("vocab", 22), D_MODEL], T0),
  "embedding_11": ([mtf.Dimension("vocab", 8), INNER], A11),
  "embedding_12": ([INNER, D_MODEL], A12),
  "embedding_21": ([mtf.Dimension("vocab", 4), INNER], A21),
  "embedding_22": ([INNER, D_MODEL], A22),
}


def _clusters(last_factor=0.5):
  return [
    {"token_count": 20, "embedding_size": D},
    {"token_count": 8, "embedding_size": 4},
    {
      "token_count": 4,
      "embedding_size": 4,
      "length_projection_factor": last_factor,
    },
  ]


def _decoder(z_loss=0.0):
  return types.SimpleNamespace(
    z_loss=z_loss,
    loss_denominator=lambda targets, n: float(targets.shape.size * n),
  )


def _context(mesh, mode):
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


def _make(mesh, clusters):
  with tf1.variable_scope("decoder"):
    for name, (dims, value) in VARIABLES.items():
      mtf.get_variable(
        mesh, name, dims, initializer=tf1.constant_initializer(value)
      )
    return adaptive_softmax.AdaptiveSoftmaxVocabEmbedding(
      mesh, VOCAB, D_MODEL, VDT, "embedding", None, clusters=clusters
    )


# ----------------------------------------------------------------------------
# numpy reference


def _log_softmax(x):
  m = x.max(-1, keepdims=True)
  return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def _logsumexp(x):
  m = x.max(-1)
  return m + np.log(np.exp(x - m[..., None]).sum(-1))


def _cluster_logits(hidden):
  h = hidden.astype(np.float64) * D**-0.5
  return [h @ T0.T, h @ (A11 @ A12).T, h @ (A21 @ A22).T]


def _full_log_softmax(hidden):
  head, t1, t2 = [_log_softmax(x) for x in _cluster_logits(hidden)]
  return np.concatenate(
    [head[..., :20], t1 + head[..., 20:21], t2 + head[..., 21:22]], -1
  )


def _reference_loss(hidden, targets, z_loss=0.0, capacity=None):
  """Summed -log p(target) (+ z-losses) / (batch * length).

  capacity: the number of last-cluster targets per sequence that count; the
  last cluster's own terms are then divided by batch * capacity (the size of
  the targets it sees), as the original does.
  """
  full = _full_log_softmax(hidden)
  log_z = [_logsumexp(x) for x in _cluster_logits(hidden)]
  total = 0.0
  projected_total = 0.0
  for b in range(targets.shape[0]):
    seen_last = 0
    for t in range(targets.shape[1]):
      target = targets[b, t]
      if target <= 0:
        continue
      total += z_loss * log_z[0][b, t] ** 2  # the head softmax, always
      cluster = 0 if target < 20 else 1 if target < 28 else 2
      if cluster == 0:
        total += -full[b, t, target]
        continue
      # Head term -log p(cluster) plus tail term -log p(token | cluster).
      log_p_cluster = _log_softmax(_cluster_logits(hidden)[0])[
        b, t, 19 + cluster
      ]
      total += -log_p_cluster
      tail = z_loss * log_z[cluster][b, t] ** 2 - (
        full[b, t, target] - log_p_cluster
      )
      if cluster == 2 and capacity is not None:
        seen_last += 1
        if seen_last <= capacity:
          projected_total += tail
      else:
        total += tail
  result = total / targets.size
  if capacity is not None:
    result += projected_total / (targets.shape[0] * capacity)
  return result


# ----------------------------------------------------------------------------


def _run_eval(mesh_shape="", layout="", mode="eager", seen=None):
  def build(mesh):
    embedding = _make(mesh, _clusters())
    ctx = _context(mesh, "eval")
    ids = mtf.import_tf_tensor(mesh, IDS, [BATCH, LENGTH])
    hidden = mtf.import_tf_tensor(mesh, HIDDEN, [BATCH, LENGTH, D_MODEL])
    targets = mtf.import_tf_tensor(mesh, TARGETS_FEW, [BATCH, LENGTH])
    emb = embedding.ids_to_embedding(ids, ctx)
    log_probs = embedding.hidden_to_logits(hidden, ctx)
    loss = adaptive_softmax.adaptive_softmax_loss_fn(
      _decoder(), ctx, log_probs, targets, VOCAB
    )
    if seen is not None:
      seen.update(
        {
          v.name: [d.size for d in v.shape.dims]
          for v in mesh.graph.all_variables
        }
      )
    return [emb, mtf.transpose(log_probs, [BATCH, LENGTH, VOCAB]), loss]

  return mtu.run_program(build, mesh_shape, layout, mode)


def _run_train(
  targets,
  clusters,
  z_loss=0.0,
  mesh_shape="",
  layout="",
  mode="eager",
  context_length_dim=LENGTH,
):
  def build(mesh):
    embedding = _make(mesh, clusters)
    ctx = _context(mesh, "train")
    ctx.length_dim = context_length_dim
    hidden = mtf.import_tf_tensor(mesh, HIDDEN, [BATCH, LENGTH, D_MODEL])
    logits = embedding.hidden_to_logits(hidden, ctx)
    assert logits is hidden  # training: the loss_fn gets the hidden states
    assert ctx.cache[adaptive_softmax._CACHE_KEY] is embedding
    t = mtf.import_tf_tensor(mesh, targets, [BATCH, LENGTH])
    return [
      adaptive_softmax.adaptive_softmax_loss_fn(
        _decoder(z_loss), ctx, logits, t, VOCAB
      )
    ]

  return mtu.run_program(build, mesh_shape, layout, mode)[0]


def test_variables_embeddings_and_log_probabilities():
  seen = {}
  emb, log_probs, loss = _run_eval(seen=seen)
  assert seen == {
    "decoder/" + k: [d.size for d in dims] for k, (dims, _) in VARIABLES.items()
  }
  table = np.concatenate([T0[:20], A11 @ A12, A21 @ A22])
  np.testing.assert_allclose(emb, table[IDS], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(
    log_probs, _full_log_softmax(HIDDEN), rtol=1e-5, atol=1e-5
  )
  np.testing.assert_allclose(np.exp(log_probs).sum(-1), 1.0, rtol=1e-5)
  # Outside training the loss_fn takes the log-probabilities as logits.
  np.testing.assert_allclose(
    loss, _reference_loss(HIDDEN, TARGETS_FEW), rtol=1e-5
  )


@pytest.mark.parametrize("z_loss", [0.0, 0.01])
def test_training_loss_equals_full_softmax_cross_entropy(z_loss):
  loss = _run_train(TARGETS, _clusters(last_factor=1.0), z_loss=z_loss)
  np.testing.assert_allclose(
    loss, _reference_loss(HIDDEN, TARGETS, z_loss), rtol=1e-5
  )


def test_length_projection_keeps_the_first_targets_of_a_cluster():
  # At most 2 targets of the last cluster per sequence: nothing dropped, but
  # that cluster's terms are divided by batch * 2 (its targets' size).
  loss = _run_train(TARGETS_FEW, _clusters(last_factor=0.5))
  np.testing.assert_allclose(
    loss, _reference_loss(HIDDEN, TARGETS_FEW, capacity=2), rtol=1e-5
  )
  # Three in sequence 1: the third one's tail term is left out.
  loss = _run_train(TARGETS, _clusters(last_factor=0.5), z_loss=0.01)
  np.testing.assert_allclose(
    loss, _reference_loss(HIDDEN, TARGETS, 0.01, capacity=2), rtol=1e-5
  )
  assert not np.isclose(loss, _reference_loss(HIDDEN, TARGETS, 0.01))


def test_projected_length_rounds_up():
  # ceil(0.3 * 4) = 2 slots per sequence: TARGETS_FEW loses nothing.
  loss = _run_train(TARGETS_FEW, _clusters(last_factor=0.3))
  np.testing.assert_allclose(
    loss, _reference_loss(HIDDEN, TARGETS_FEW, capacity=2), rtol=1e-5
  )


@pytest.mark.parametrize(
  "context_length_dim", [None, mtf.Dimension("memory_length", 4)]
)
def test_loss_uses_the_targets_length_dim_when_the_context_has_another(
  context_length_dim,
):
  # As in the original, a context whose length_dim is not the targets' one
  # (or that has none) falls back to the targets' dim named "length".
  loss = _run_train(
    TARGETS,
    _clusters(last_factor=0.5),
    z_loss=0.01,
    context_length_dim=context_length_dim,
  )
  np.testing.assert_allclose(
    loss, _reference_loss(HIDDEN, TARGETS, 0.01, capacity=2), rtol=1e-5
  )


@pytest.mark.parametrize(
  "mesh_shape, layout",
  [
    ("all:4", "length:all"),
    ("all:4", "d_model:all"),
    ("all:4", "inner_vocab:all"),
    ("rows:2;cols:2", "batch:rows;d_model:cols"),
  ],
)
def test_multi_mesh_same_numbers(mesh_shape, layout):
  expected = _run_eval(mode="eager")
  expected_loss = _run_train(TARGETS, _clusters(), 0.01, mode="eager")
  actual = _run_eval(mesh_shape, layout, "eager")
  mtu.assert_all_close(actual, expected, msg="%s %s" % (mesh_shape, layout))
  actual_loss = _run_train(
    TARGETS, _clusters(), 0.01, mesh_shape, layout, "eager"
  )
  np.testing.assert_allclose(actual_loss, expected_loss, rtol=1e-5)


def test_loss_fn_needs_the_adaptive_embedding():
  def build(mesh):
    ctx = _context(mesh, "train")
    hidden = mtf.import_tf_tensor(mesh, HIDDEN, [BATCH, LENGTH, D_MODEL])
    targets = mtf.import_tf_tensor(mesh, TARGETS, [BATCH, LENGTH])
    return [
      adaptive_softmax.adaptive_softmax_loss_fn(
        _decoder(), ctx, hidden, targets, VOCAB
      )
    ]

  with pytest.raises(ValueError, match="AdaptiveSoftmaxVocabEmbedding"):
    mtu.run_program(build)


def test_shared_params_embedding_is_found():
  def build(mesh):
    embedding = _make(mesh, _clusters(1.0))
    ctx = _context(mesh, "train")
    ctx.shared_params = {"embedding": embedding}
    hidden = mtf.import_tf_tensor(mesh, HIDDEN, [BATCH, LENGTH, D_MODEL])
    targets = mtf.import_tf_tensor(mesh, TARGETS, [BATCH, LENGTH])
    return [
      adaptive_softmax.adaptive_softmax_loss_fn(
        _decoder(), ctx, hidden, targets, VOCAB
      )
    ]

  (loss,) = mtu.run_program(build)
  np.testing.assert_allclose(loss, _reference_loss(HIDDEN, TARGETS), rtol=1e-5)


@pytest.mark.parametrize(
  "clusters, match",
  [
    (
      [{"token_count": 32, "length_projection_factor": 0.0}],
      "length_projection_factor",
    ),
    ([{"token_count": 16}, {"token_count": 8}], "sum to 24"),
  ],
)
def test_rejects_bad_clusters(clusters, match):
  with pytest.raises(ValueError, match=match):
    mtu.run_program(
      lambda mesh: [
        adaptive_softmax.AdaptiveSoftmaxVocabEmbedding(
          mesh, VOCAB, D_MODEL, VDT, "embedding", None, clusters=clusters
        )
      ]
    )


def test_gin_configurable_under_original_module():
  gin.clear_config()
  try:
    gin.parse_config(
      "mesh_tensorflow.transformer.adaptive_softmax."
      "AdaptiveSoftmaxVocabEmbedding.clusters = "
      "[{'token_count': 24}, {'token_count': 8, 'embedding_size': 2}]"
    )
    shapes = {}

    def build(mesh):
      adaptive_softmax.AdaptiveSoftmaxVocabEmbedding(
        mesh, VOCAB, D_MODEL, VDT, "emb", None
      )
      shapes.update(
        {
          v.name: [d.size for d in v.shape.dims]
          for v in mesh.graph.all_variables
        }
      )
      return []

    mtu.run_program(build)
    fn = gin.get_configurable(
      "mesh_tensorflow.transformer.adaptive_softmax.adaptive_softmax_loss_fn"
    )
    assert fn is adaptive_softmax.adaptive_softmax_loss_fn
  finally:
    gin.clear_config()
  assert shapes == {"emb_0": [25, D], "emb_11": [8, 2], "emb_12": [2, D]}


def test_with_unitransformer_train_loss_equals_eval_cross_entropy():
  from transformer import transformer  # pylint: disable=g-import-not-at-top

  inputs = np.array([[5, 21, 30, 2], [28, 29, 7, 31]], np.int32)
  gin.clear_config()
  gin.bind_parameter(
    "mesh_tensorflow.transformer.transformer.get_vocab_embedding_cls.cls",
    adaptive_softmax.AdaptiveSoftmaxVocabEmbedding,
  )
  gin.bind_parameter(
    "AdaptiveSoftmaxVocabEmbedding.clusters", _clusters(last_factor=1.0)
  )
  try:
    model = transformer.Unitransformer(
      transformer.LayerStack([]),
      d_model=D,
      input_vocab_size=32,
      output_vocab_size=32,
      autoregressive=True,
      max_length=4,
      shared_embedding_and_softmax_weights=True,
      z_loss=0.0,
      vocab_divisor=32,
      loss_fn=adaptive_softmax.adaptive_softmax_loss_fn,
      positional_embedding=False,
    )

    def build(mesh):
      ids = mtf.import_tf_tensor(mesh, inputs, [BATCH, LENGTH])
      targets = mtf.import_tf_tensor(mesh, TARGETS, [BATCH, LENGTH])
      hidden, train_loss = model.call_simple(ids, targets, True, mode="train")
      log_probs, eval_loss = model.call_simple(ids, targets, True, mode="eval")
      names = sorted(v.name for v in mesh.graph.all_variables)
      assert "transformer/embedding_0" in names, names
      assert hidden.shape.dims[-1] == D_MODEL
      return [
        train_loss,
        eval_loss,
        mtf.reduce_logsumexp(log_probs, reduced_dim=VOCAB),
      ]

    train_loss, eval_loss, log_z = mtu.run_program(build)
  finally:
    gin.clear_config()
  np.testing.assert_allclose(log_z, 0.0, atol=1e-5)
  np.testing.assert_allclose(train_loss, eval_loss, rtol=1e-5)
  assert train_loss > 0.1


def test_training_gradients_match_full_softmax_gradients():
  # Same function of (hidden, weights) computed two ways: the gradients of
  # the cluster-by-cluster loss equal those of the full log-softmax loss.
  def build(mesh):
    embedding = _make(mesh, _clusters(last_factor=1.0))
    hidden = mtf.import_tf_tensor(mesh, HIDDEN, [BATCH, LENGTH, D_MODEL])
    targets = mtf.import_tf_tensor(mesh, TARGETS, [BATCH, LENGTH])
    train_ctx, eval_ctx = _context(mesh, "train"), _context(mesh, "eval")
    train_loss = adaptive_softmax.adaptive_softmax_loss_fn(
      _decoder(),
      train_ctx,
      embedding.hidden_to_logits(hidden, train_ctx),
      targets,
      VOCAB,
    )
    eval_loss = adaptive_softmax.adaptive_softmax_loss_fn(
      _decoder(),
      eval_ctx,
      embedding.hidden_to_logits(hidden, eval_ctx),
      targets,
      VOCAB,
    )
    xs = [hidden] + [v.outputs[0] for v in mesh.graph.all_variables]
    train_grads = mtf.gradients([train_loss], xs)
    eval_grads = mtf.gradients([eval_loss], xs)
    assert all(g is not None for g in train_grads + eval_grads)
    return train_grads + eval_grads

  grads = mtu.run_program(build)
  half = len(grads) // 2
  mtu.assert_all_close(grads[:half], grads[half:], rtol=1e-4, atol=1e-6)
  assert np.abs(grads[0]).max() > 1e-3
