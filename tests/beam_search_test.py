"""Tests for mesh_tensorflow.beam_search: beam_search and greedy_decode.

The model is a tiny hand-checkable "language model": a fixed transition table
gives the logits of the next token from the previous one (and, for the state
tests, from the two or three previous ones) over a vocabulary of 4 ids
(0 = start/padding, 1 = EOS, 2, 3), one table per batch row. Position -1 reads
as token 0. Results are compared with an exhaustive search over all sequences
(numpy), with step-by-step argmax, across meshes/layouts and TF modes.
"""

import inspect
import itertools

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import beam_search as bs
from tests import mesh_test_util as mtu
from tests import meshes

NUM_BATCH = 4
V = 4
BATCH = mtf.Dimension("batch", NUM_BATCH)
VOCAB = mtf.Dimension("vocab", V)
PREV = mtf.Dimension("prev", V)
PREV2 = mtf.Dimension("prev2", V)
PREV3 = mtf.Dimension("prev3", V)

_RNG = np.random.RandomState(1)
TABLE = (_RNG.normal(size=(NUM_BATCH, V, V)) * 2).astype(np.float32)
TABLE2 = (_RNG.normal(size=(NUM_BATCH, V, V, V)) * 2).astype(np.float32)
TABLE3 = (_RNG.normal(size=(NUM_BATCH, V, V)) * 2).astype(np.float32)


def _path_table(paths):
  """Bigram table whose argmax path from token 0 is paths[b] in row b.

  EOS is unlikely (logit -30) except where a path takes it; other logits are
  in [0, 1), the path's next token has logit 5.
  """
  table = np.zeros((NUM_BATCH, V, V), np.float32)
  rng = np.random.RandomState(2)
  for b, path in enumerate(paths):
    table[b] = rng.uniform(0, 1, size=(V, V))
    table[b, :, 1] = -30.0
    prev = 0
    for token in path:
      table[b, prev, token] = 5.0
      prev = token
  return table


# Every row's argmax path ends in EOS, at steps 2, 1, 2 and 1.
PATHS = [[2, 3, 1], [3, 1], [3, 2, 1], [2, 1]]
PATH_TABLE = _path_table(PATHS)


def _log_softmax(x):
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _penalty(length, alpha):
  return ((5.0 + length) / 6.0) ** alpha


def _token_at(ids, position, length_dim):
  """ids[..., position] (0 for position -1) as an mtf Tensor."""
  one_hot = mtf.one_hot(position, length_dim, dtype=ids.dtype)
  return mtf.reduce_sum(ids * one_hot, reduced_dim=length_dim)


def _bigram_logits_fn(table, beam_dim, length_dim):
  """logits[b, beam] = table[b, ids[b, beam, step - 1]]."""

  def logits_fn(step, ids, states):
    prev = _token_at(ids, step - 1, length_dim)
    logits = mtf.gather(
      table, prev, PREV, output_shape=[BATCH, beam_dim, VOCAB]
    )
    return logits, states

  return logits_fn


def _import_tables(mesh):
  return (
    mtf.import_tf_tensor(mesh, TABLE, [BATCH, PREV, VOCAB]),
    mtf.import_tf_tensor(mesh, TABLE2, [BATCH, PREV2, PREV, VOCAB]),
    mtf.import_tf_tensor(mesh, TABLE3, [BATCH, PREV3, VOCAB]),
  )


def _trigram_logits(table2, table3, prev3, prev2, prev, out_dims):
  """table2[b, prev2, prev] + 0.5 * table3[b, prev3]."""
  one_hots = [mtf.one_hot(prev2, PREV2), mtf.one_hot(prev, PREV)]
  logits = mtf.einsum([table2] + one_hots, output_shape=out_dims)
  return logits + 0.5 * mtf.gather(table3, prev3, PREV3, output_shape=out_dims)


def _np_trigram_logits(b, prev3, prev2, prev):
  return TABLE2[b, prev2, prev] + 0.5 * TABLE3[b, prev3]


# --------------------------------------------------------------- API
_REQUIRED = inspect.Parameter.empty


def test_constants_signatures_and_exports():
  assert bs.EOS_ID == 1 and bs.INF == 1e7 and isinstance(bs.INF, float)
  assert sorted(bs.__all__) == sorted(
    [
      "EOS_ID",
      "INF",
      "beam_search",
      "compute_topk_scores_and_seq",
      "greedy_decode",
    ]
  )
  assert mtf.beam_search is bs
  expected = {
    bs.beam_search: [
      ("logits_fn", _REQUIRED),
      ("initial_ids", _REQUIRED),
      ("alpha", _REQUIRED),
      ("states", None),
      ("eos_id", 1),
      ("stop_early", True),
      ("decode_length", None),
      ("use_tpu", True),
      ("dtype", tf.float32),
      ("layout", None),
      ("mesh_shape", None),
      ("num_prefilter", 2),
    ],
    bs.greedy_decode: [
      ("logits_fn", _REQUIRED),
      ("initial_ids", _REQUIRED),
      ("temperature", 0.0),
      ("initial_states", None),
      ("eos_id", 1),
      ("forced_ids", None),
      ("use_tpu", True),
    ],
    bs.compute_topk_scores_and_seq: [
      ("sequences", _REQUIRED),
      ("scores", _REQUIRED),
      ("scores_to_gather", _REQUIRED),
      ("flags", _REQUIRED),
      ("beam_dim", _REQUIRED),
      ("prefix", "default"),
    ],
  }
  for fn, params in expected.items():
    actual = [
      (p.name, p.default) for p in inspect.signature(fn).parameters.values()
    ]
    assert actual == params, fn


def test_gin_registration_under_original_module():
  # Binding to the defaults: harmless for other tests in this process.
  with gin.unlock_config():
    gin.bind_parameter(
      "mesh_tensorflow.beam_search.beam_search.num_prefilter", 2
    )
    gin.bind_parameter(
      "mesh_tensorflow.beam_search.greedy_decode.temperature", 0.0
    )
  assert (
    gin.query_parameter("mesh_tensorflow.beam_search.beam_search.num_prefilter")
    == 2
  )
  assert (
    gin.query_parameter("mesh_tensorflow.beam_search.greedy_decode.temperature")
    == 0.0
  )


def test_compute_topk_scores_and_seq():
  old_beam = mtf.Dimension("old_beam", 4)
  beam = mtf.Dimension("beam", 2)
  length = mtf.Dimension("length", 3)
  seq = np.arange(2 * 4 * 3, dtype=np.int32).reshape(2, 4, 3)
  scores = np.array([[0.1, 0.9, 0.5, 0.9], [3.0, 2.0, 1.0, 0.0]], np.float32)
  gathered = -scores
  flags = np.array([[True, False, True, False], [False, True, False, True]])

  def build(mesh):
    batch = mtf.Dimension("batch", 2)
    args = [
      mtf.import_tf_tensor(mesh, seq, [batch, old_beam, length]),
      mtf.import_tf_tensor(mesh, scores, [batch, old_beam]),
      mtf.import_tf_tensor(mesh, gathered, [batch, old_beam]),
      mtf.import_tf_tensor(mesh, flags, [batch, old_beam]),
    ]
    return list(bs.compute_topk_scores_and_seq(*args, beam, prefix="p"))

  for mesh_shape, layout in [
    ("", ""),
    ("rows:2;cols:2", "batch:rows;old_beam:cols"),
  ]:
    top_seq, top_scores, top_flags, selector = mtu.run_program(
      build, mesh_shape, layout
    )
    chosen = np.array([[1, 3], [0, 1]])  # Ties: the lower index first.
    rows = np.arange(2)[:, None]
    np.testing.assert_array_equal(top_seq, seq[rows, chosen])
    np.testing.assert_array_equal(top_scores, gathered[rows, chosen])
    np.testing.assert_array_equal(top_flags, flags[rows, chosen])
    np.testing.assert_array_equal(selector, np.eye(4)[chosen])


# ------------------------------------------------------ exhaustive search
def _exhaustive_best(b, length, alpha):
  """Best (score, ids) over all sequences ending in EOS, EOS at step t."""
  best = None
  for t in range(length):
    for prefix in itertools.product([0, 2, 3], repeat=t):
      seq = list(prefix) + [bs.EOS_ID]
      log_prob, prev = 0.0, 0
      for token in seq:
        log_prob += _log_softmax(TABLE[b, prev])[token]
        prev = token
      score = log_prob / _penalty(t + 1, alpha)
      if best is None or score > best[0]:
        best = (score, seq + [0] * (length - len(seq)))
  return best


def test_best_beam_equals_exhaustive_search():
  """Beam 18 keeps every real prefix (<= 3**2 alive, 2*18 >= 9*4 candidates),
  so its best finished sequence must be the exhaustive optimum.
  """
  length = mtf.Dimension("length", 3)
  beam = mtf.Dimension("beam", 18)
  configs = [(0.0, True), (0.0, False), (0.6, True), (1.5, False)]

  def build(mesh):
    table, _, _ = _import_tables(mesh)
    ids = mtf.zeros(mesh, [BATCH, beam, length], tf.int32)
    outputs = []
    for alpha, stop_early in configs:
      outputs.extend(
        bs.beam_search(
          _bigram_logits_fn(table, beam, length),
          ids,
          alpha,
          stop_early=stop_early,
        )
      )
    return outputs

  results = mtu.run_program(build)
  for c, (alpha, _) in enumerate(configs):
    seqs, scores = results[2 * c], results[2 * c + 1]
    assert seqs.shape == (NUM_BATCH, 18, 3) and seqs.dtype == np.int32
    assert scores.shape == (NUM_BATCH, 18)
    for b in range(NUM_BATCH):
      score, seq = _exhaustive_best(b, 3, alpha)
      np.testing.assert_array_equal(seqs[b, 0], seq, err_msg=str((alpha, b)))
      np.testing.assert_allclose(scores[b, 0], score, rtol=1e-5)
      # Beams are sorted best first.
      assert np.all(np.diff(scores[b]) <= 0)


# ------------------------------------------------- states and meshes
def _state_program(
  beam_size, length_size, alpha, use_states, **beam_search_kwargs
):
  """The trigram model, reading the history from ids or from states."""
  beam = mtf.Dimension("beam", beam_size)
  length = mtf.Dimension("length", length_size)
  two = mtf.Dimension("two", 2)

  def build(mesh):
    _, table2, table3 = _import_tables(mesh)

    def logits_fn(step, ids, states):
      prev = _token_at(ids, step - 1, length)
      if use_states:
        prev2_state, prev3_state = states
        assert prev2_state.shape == mtf.Shape([BATCH, beam])
        assert prev3_state.shape == mtf.Shape([BATCH, beam, two])
        prev2 = prev2_state
        prev3 = mtf.cast(mtf.reduce_max(prev3_state, reduced_dim=two), tf.int32)
        # Next step: its prev2 is our prev, its prev3 is our prev2.
        new_states = [
          prev,
          mtf.broadcast(mtf.cast(prev2, tf.float32), [BATCH, beam, two]),
        ]
      else:
        prev2 = _token_at(ids, step - 2, length)
        prev3 = _token_at(ids, step - 3, length)
        new_states = states
      logits = _trigram_logits(
        table2, table3, prev3, prev2, prev, [BATCH, beam, VOCAB]
      )
      return logits, new_states

    ids = mtf.zeros(mesh, [BATCH, beam, length], tf.int32)
    states = None
    if use_states:
      states = [
        mtf.zeros(mesh, [BATCH, beam], tf.int32),
        mtf.zeros(mesh, [BATCH, beam, two], tf.float32),
      ]
    return list(
      bs.beam_search(logits_fn, ids, alpha, states=states, **beam_search_kwargs)
    )

  return build


_REFERENCE = []


def _reference_result():
  """The state program (beam 3, length 4) on one device, computed once."""
  if not _REFERENCE:
    _REFERENCE.append(mtu.run_program(_state_program(3, 4, 0.6, True)))
  return _REFERENCE[0]


def test_states_follow_their_beams():
  """Reading the history from reordered states == reading it from ids."""
  with_states = _reference_result()
  from_ids = mtu.run_program(_state_program(3, 4, 0.6, False))
  np.testing.assert_array_equal(with_states[0], from_ids[0])
  np.testing.assert_allclose(with_states[1], from_ids[1], rtol=1e-6)
  # And it is a real beam search: the best beam is a valid, scored sequence.
  for b in range(NUM_BATCH):
    seq = with_states[0][b, 0]
    history = [0, 0, 0]
    log_prob = 0.0
    for t, token in enumerate(seq):
      logits = _np_trigram_logits(b, *history[-3:])
      log_prob += _log_softmax(logits)[token]
      history.append(token)
      if token == bs.EOS_ID:
        assert np.all(seq[t + 1 :] == 0)
        np.testing.assert_allclose(
          with_states[1][b, 0], log_prob / _penalty(t + 1, 0.6), rtol=1e-5
        )
        break


@meshes.parametrize(meshes.BEAM_SEARCH[1:])
def test_same_results_on_every_mesh(mesh_shape, layout):
  expected = _reference_result()
  actual = mtu.run_program(_state_program(3, 4, 0.6, True), mesh_shape, layout)
  np.testing.assert_array_equal(actual[0], expected[0])
  np.testing.assert_allclose(actual[1], expected[1], rtol=1e-6)


@pytest.mark.parametrize("mode", ["function", "graph"])
def test_beam_search_in_tf_function_and_v1_graph(mode):
  expected = _reference_result()
  actual = mtu.run_program(
    _state_program(3, 4, 0.6, True),
    "rows:2;cols:2",
    "batch:rows;vocab:cols",
    mode,
  )
  np.testing.assert_array_equal(actual[0], expected[0])
  np.testing.assert_allclose(actual[1], expected[1], rtol=1e-6)


def test_prefilter_path_with_layout_and_mesh_shape():
  """With num_prefilter = the shard's vocabulary it equals the plain path."""
  plain = _reference_result()
  prefiltered = mtu.run_program(
    _state_program(
      3,
      4,
      0.6,
      True,
      layout="batch:rows;vocab:cols",
      mesh_shape="rows:2;cols:2",
      num_prefilter=2,
    ),
    "rows:2;cols:2",
    "batch:rows;vocab:cols",
  )
  np.testing.assert_array_equal(prefiltered[0], plain[0])
  np.testing.assert_allclose(prefiltered[1], plain[1], rtol=1e-6)
  # use_tpu=False ignores layout/mesh_shape; num_prefilter=1 is lossy but
  # still returns well-formed beams.
  no_tpu = mtu.run_program(
    _state_program(
      3,
      4,
      0.6,
      True,
      use_tpu=False,
      layout="vocab:cols",
      mesh_shape="rows:2;cols:2",
      num_prefilter=1,
    )
  )
  np.testing.assert_array_equal(no_tpu[0], plain[0])
  lossy = mtu.run_program(
    _state_program(
      3,
      4,
      0.6,
      True,
      layout="vocab:cols",
      mesh_shape="rows:2;cols:2",
      num_prefilter=1,
    )
  )
  assert lossy[0].shape == plain[0].shape
  assert np.all((lossy[0] >= 0) & (lossy[0] < V))


# --------------------------------------------------------------- EOS
def test_eos_ends_sequences_and_decode_length_caps_steps():
  beam = mtf.Dimension("beam", 3)
  length = mtf.Dimension("length", 4)

  def build(mesh):
    table, _, _ = _import_tables(mesh)
    ids = mtf.zeros(mesh, [BATCH, beam, length], tf.int32)
    fn = _bigram_logits_fn(table, beam, length)
    full = bs.beam_search(fn, ids, 0.6, stop_early=False)
    short = bs.beam_search(fn, ids, 0.6, decode_length=2, stop_early=False)
    return list(full) + list(short)

  seqs, scores, short_seqs, short_scores = mtu.run_program(build)
  for b in range(NUM_BATCH):
    for k in range(3):
      if scores[b, k] <= -bs.INF / 2:
        continue  # An unused finished slot.
      seq = list(seqs[b, k])
      assert bs.EOS_ID in seq
      end = seq.index(bs.EOS_ID)
      assert seq[end + 1 :] == [0] * (3 - end)
  assert np.all(short_seqs[..., 2:] == 0)
  # Within two steps the best finished sequence is the exhaustive one.
  for b in range(NUM_BATCH):
    score, seq = _exhaustive_best(b, 2, 0.6)
    np.testing.assert_array_equal(short_seqs[b, 0, :2], seq)
    np.testing.assert_allclose(short_scores[b, 0], score, rtol=1e-5)


def test_eos_id_argument():
  """With eos_id=3, sequences end at token 3 instead of 1."""
  beam = mtf.Dimension("beam", 3)
  length = mtf.Dimension("length", 4)

  def build(mesh):
    table, _, _ = _import_tables(mesh)
    ids = mtf.zeros(mesh, [BATCH, beam, length], tf.int32)
    return list(
      bs.beam_search(_bigram_logits_fn(table, beam, length), ids, 0.0, eos_id=3)
    )

  seqs, scores = mtu.run_program(build)
  for b in range(NUM_BATCH):
    seq = list(seqs[b, 0])
    assert 3 in seq and seq[seq.index(3) + 1 :] == [0] * (3 - seq.index(3))
    assert scores[b, 0] < 0


# ------------------------------------------------------------- greedy
def _np_greedy(length, forced=None, trigram=False, table=TABLE):
  """Step-by-step argmax; stops once every row holds EOS (as greedy_decode)."""
  ids = np.zeros((NUM_BATCH, length), np.int32)
  for step in range(length):
    if np.all((ids == bs.EOS_ID).any(axis=1)):
      break
    for b in range(NUM_BATCH):
      history = [0, 0, 0] + list(ids[b, :step])
      if trigram:
        logits = _np_trigram_logits(b, *history[-3:])
      else:
        logits = table[b, history[-1]]
      token = int(np.argmax(logits))
      if forced is not None and forced[b, step]:
        token = forced[b, step]
      ids[b, step] = token
  return ids


def _greedy_program(
  length_size, temperature=0.0, forced=None, use_states=False, np_table=TABLE
):
  length = mtf.Dimension("length", length_size)

  def build(mesh):
    _, table2, table3 = _import_tables(mesh)
    table = mtf.import_tf_tensor(mesh, np_table, [BATCH, PREV, VOCAB])

    def logits_fn(step, ids, states):
      prev = _token_at(ids, step - 1, length)
      if not use_states:
        return mtf.gather(
          table, prev, PREV, output_shape=[BATCH, VOCAB]
        ), states
      prev2, prev3 = states
      logits = _trigram_logits(
        table2, table3, prev3, prev2, prev, [BATCH, VOCAB]
      )
      return logits, [prev, prev2]

    ids = mtf.zeros(mesh, [BATCH, length], tf.int32)
    forced_ids = (
      None
      if forced is None
      else mtf.import_tf_tensor(mesh, forced, [BATCH, length])
    )
    states = None
    if use_states:
      states = [mtf.zeros(mesh, [BATCH], tf.int32)] * 2
    return [
      bs.greedy_decode(
        logits_fn,
        ids,
        temperature=temperature,
        initial_states=states,
        forced_ids=forced_ids,
      )
    ]

  return build


@meshes.parametrize(meshes.BEAM_SEARCH[:4])
def test_greedy_is_step_by_step_argmax(mesh_shape, layout):
  (ids,) = mtu.run_program(_greedy_program(6), mesh_shape, layout)
  np.testing.assert_array_equal(ids, _np_greedy(6))
  (ids,) = mtu.run_program(
    _greedy_program(5, use_states=True), mesh_shape, layout
  )
  np.testing.assert_array_equal(ids, _np_greedy(5, trigram=True))


def test_greedy_stops_when_every_row_has_eos_and_forced_ids():
  expected = _np_greedy(6, table=PATH_TABLE)
  (ids,) = mtu.run_program(_greedy_program(6, np_table=PATH_TABLE))
  np.testing.assert_array_equal(ids, expected)
  for b, path in enumerate(PATHS):
    np.testing.assert_array_equal(ids[b, : len(path)], path)
  # Rows 1 and 3 have EOS at step 1 but are written at step 2 too (the loop
  # runs until every row has EOS); then the loop stops, leaving zeros.
  assert np.all(ids[:, 3:] == 0)
  forced = np.zeros((NUM_BATCH, 6), np.int32)
  forced[:, 0] = 3
  forced[1, 1] = 2
  (ids,) = mtu.run_program(_greedy_program(6, forced=forced))
  np.testing.assert_array_equal(ids, _np_greedy(6, forced=forced))
  assert np.all(ids[:, 0] == 3) and ids[1, 1] == 2


def test_greedy_equals_beam_search_with_beam_one():
  """Table where each row's argmax path ends in EOS and early EOS is unlikely.

  Then the single alive beam follows the argmax path and the finished set's
  best is that path (alpha = 0: any other finished sequence has lower log
  probability). Greedy keeps writing after a row's EOS until every row has
  one; compare up to the first EOS.
  """
  table, paths = PATH_TABLE, PATHS
  length = mtf.Dimension("length", 4)
  beam = mtf.Dimension("beam", 1)

  def build(mesh):
    t = mtf.import_tf_tensor(mesh, table, [BATCH, PREV, VOCAB])
    beam_ids = mtf.zeros(mesh, [BATCH, beam, length], tf.int32)
    seqs, _ = bs.beam_search(_bigram_logits_fn(t, beam, length), beam_ids, 0.0)

    def greedy_logits_fn(step, ids, states):
      prev = _token_at(ids, step - 1, length)
      return mtf.gather(t, prev, PREV, output_shape=[BATCH, VOCAB]), states

    greedy = bs.greedy_decode(
      greedy_logits_fn, mtf.zeros(mesh, [BATCH, length], tf.int32)
    )
    return [seqs, greedy]

  for mesh_shape, layout in [("", ""), ("rows:2;cols:2", "batch:rows")]:
    seqs, greedy = mtu.run_program(build, mesh_shape, layout)
    for b, path in enumerate(paths):
      expected = path + [0] * (4 - len(path))
      np.testing.assert_array_equal(seqs[b, 0], expected)
      np.testing.assert_array_equal(greedy[b, : len(path)], path)


def test_sampled_greedy_is_identical_across_meshes():
  mtu.skip_under_tf1(
    "eager op seeds under tf.random.set_seed (a new tf.Graph draws "
    "its own op seeds)"
  )
  mtu.skip_under_simd(
    "eager op seeds under tf.random.set_seed; in the SIMD tf.function the "
    "draw's op seed depends on its position in the traced graph"
  )
  results = []
  for mesh_shape, layout in meshes.BEAM_SEARCH[:4]:
    tf.random.set_seed(5)
    results.append(
      mtu.run_program(_greedy_program(6, temperature=1.0), mesh_shape, layout)[
        0
      ]
    )
  for ids in results[1:]:
    np.testing.assert_array_equal(ids, results[0])
  assert np.all((results[0] >= 0) & (results[0] < V))


# -------------------------------------------------------------- errors
def test_bad_inputs_raise_value_error():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  length = mtf.Dimension("length", 3)
  table = mtf.import_tf_tensor(mesh, TABLE, [BATCH, PREV, VOCAB])
  empty_beam = mtf.Dimension("beam", 0)
  with pytest.raises(ValueError, match="beam size.*beam"):
    bs.beam_search(
      _bigram_logits_fn(table, empty_beam, length),
      mtf.zeros(mesh, [BATCH, empty_beam, length], tf.int32),
      0.6,
    )
  beam = mtf.Dimension("beam", 2)
  with pytest.raises(ValueError, match="integers"):
    bs.beam_search(
      _bigram_logits_fn(table, beam, length),
      mtf.zeros(mesh, [BATCH, beam, length]),
      0.6,
    )
  with pytest.raises(ValueError, match="batch, beam, length"):
    bs.beam_search(
      _bigram_logits_fn(table, beam, length),
      mtf.zeros(mesh, [BATCH, length], tf.int32),
      0.6,
    )
  ids = mtf.zeros(mesh, [BATCH, beam, length], tf.int32)
  with pytest.raises(ValueError, match="logits"):
    bs.beam_search(
      lambda i, ids, s: (mtf.zeros(mesh, [BATCH, VOCAB]), s), ids, 0.6
    )
  one = mtf.Dimension("vocab", 1)
  with pytest.raises(ValueError, match="at least 2"):
    bs.beam_search(
      lambda i, ids, s: (mtf.zeros(mesh, [BATCH, beam, one]), s), ids, 0.6
    )
  with pytest.raises(ValueError, match="integers"):
    bs.greedy_decode(
      lambda i, ids, s: (None, s), mtf.zeros(mesh, [BATCH, length])
    )
