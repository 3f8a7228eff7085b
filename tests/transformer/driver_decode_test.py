"""Decoding and scoring entry points (transformer/_src/driver/decode.py,
scoring.py and decode_io.py).

Encoders are checked against hand-written id rows; decode/score functions
against each other and the files they write, on a tiny Bitransformer with
the byte vocabulary (one training step, so outputs vary with the input).
"""

import os

import numpy as np
import pytest
import tensorflow as tf

from tests.transformer import driver_test_util as dtu
from transformer import dataset as dataset_lib
from transformer import utils
from transformer import vocabulary as vocabulary_lib

BYTES = vocabulary_lib.ByteVocabulary()
STRINGS = ["abc", "hello", "x", "mesh tf", "zz", "revers"]  # < 8 bytes


def _ids(s):
  return [ord(c) + 3 for c in s]


# ----------------------------------------------------------------------------
# Encoders and files.


def test_encode_inputs_appends_eos_pads_and_fills_batches():
  got = utils.encode_inputs(["ab", "abcdef"], BYTES, "bitransformer", 3, 5)
  want = [_ids("ab") + [1, 0, 0], _ids("abcde"), _ids("ab") + [1, 0, 0]]
  np.testing.assert_array_equal(got, want)
  assert got.dtype == np.int32
  # An LM continues its input: no EOS.
  np.testing.assert_array_equal(
    utils.encode_inputs([" ab "], BYTES, "lm", 1, 4), [_ids("ab") + [0, 0]]
  )
  # An unscored prefix is encoded in front with negated ids.
  np.testing.assert_array_equal(
    utils.encode_inputs(["b"], BYTES, "lm", 1, 4, unscored_prefix="a"),
    [[-_ids("a")[0]] + _ids("b") + [0, 0]],
  )


def test_encode_delimited_lm_joins_input_and_target():
  got = utils.encode_delimited_lm(["ab"], ["c"], BYTES, 2, 8)
  row = _ids("ab") + [1] + _ids("c") + [1, 0, 0, 0]
  np.testing.assert_array_equal(got, [row, row])
  got = utils.encode_delimited_lm(
    ["ab"], ["c"], BYTES, 1, 8, include_final_eos=False
  )
  np.testing.assert_array_equal(got, [_ids("ab") + [1] + _ids("c") + [0] * 4])
  with pytest.raises(ValueError, match="1 inputs but 2 targets"):
    utils.encode_delimited_lm(["a"], ["b", "c"], BYTES, 1, 8)


def test_lines_round_trip_and_comments(tmp_path):
  path = str(tmp_path / "sub" / "lines.txt")
  utils.write_lines_to_file(["# note", "a b", ""], path)
  assert utils.get_inputs_from_file(path) == ["# note", "a b", ""]
  assert utils.get_inputs_from_file(path, ignore_comments=True) == ["a b", ""]


# ----------------------------------------------------------------------------
# With a model.


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
  """A checkpoint at step 1 of the tiny byte-vocabulary Bitransformer."""
  directory = tmp_path_factory.mktemp("model")
  est = dtu.estimator(
    directory, mesh=dtu.MESH_1, vocabulary=BYTES, save_checkpoints_steps=0
  )
  ids = utils.encode_inputs(STRINGS, BYTES, "bitransformer", 8, 8)
  est.train(
    lambda: (
      tf.data.Dataset.from_tensor_slices({"inputs": ids, "targets": ids})
      .repeat()
      .batch(8)
    ),
    1,
  )
  return directory


@pytest.fixture
def est(model_dir):
  return dtu.estimator(model_dir, mesh=dtu.MESH_1, vocabulary=BYTES)


def test_decode_from_file_writes_decodes_per_step(est, model_dir, tmp_path):
  inputs = tmp_path / "in.txt"
  inputs.write_text("\n".join(STRINGS) + "\n")
  out = str(tmp_path / "out" / "decodes")
  decodes = utils.decode_from_file(
    est,
    BYTES,
    "bitransformer",
    8,
    8,
    input_filename=str(inputs),
    output_filename=out,
    repeats=2,
  )
  assert decodes == [
    d for d in utils.decode_strings(est, STRINGS) for _ in range(2)
  ]
  assert utils.get_inputs_from_file(out + "-1") == decodes
  # decode() reads an input_fn of examples (or of batches) the same way.
  ids = utils.encode_inputs(STRINGS, BYTES, "bitransformer", 1, 8)
  examples = lambda: tf.data.Dataset.from_tensor_slices({"inputs": ids})
  assert utils.decode(est, examples, BYTES) == decodes[::2]
  assert (
    utils.decode(est, lambda params: examples().batch(4), BYTES) == decodes[::2]
  )


def _exact_match(targets, predictions):
  return {
    "exact_match": np.mean([t == p for t, p in zip(targets, predictions)])
  }


def _reverse_examples(strings):
  x = utils.encode_inputs(strings, BYTES, "bitransformer", 1, 8)
  y = utils.encode_inputs(
    [s[::-1] for s in strings], BYTES, "bitransformer", 1, 8
  )
  return {"inputs": x, "targets": y}


def test_decode_from_dataset_writes_files_and_metrics(est, tmp_path, capsys):
  examples = _reverse_examples(STRINGS)
  seen = {}

  def infer_dataset_fn(sequence_length, vocabulary, dataset_split):
    seen.update(length=sequence_length, split=dataset_split)
    return [
      dataset_lib.EvalDataset(
        "rev",
        lambda: tf.data.Dataset.from_tensor_slices(examples),
        lambda s, example=None, is_target=False: s.upper(),
        [_exact_match],
      )
    ]

  out_dir = str(tmp_path / "decodes")
  results = utils.decode_from_dataset(
    est,
    BYTES,
    "bitransformer",
    8,
    {"inputs": 8, "targets": 8},
    infer_dataset_fn=infer_dataset_fn,
    decode_output_dir=out_dir,
  )
  assert seen["split"] == "validation"
  predictions = utils.decode_strings(est, STRINGS)
  assert results == {"rev": predictions}
  read = lambda name: utils.get_inputs_from_file(os.path.join(out_dir, name))
  assert read("rev_predictions-1") == predictions
  assert read("rev_inputs") == STRINGS
  assert read("rev_targets") == [s[::-1] for s in STRINGS]
  want = np.mean(
    [p.upper() == s[::-1].upper() for p, s in zip(predictions, STRINGS)]
  )
  assert "decode rev (step 1): exact_match %.4f" % want in (
    capsys.readouterr().out
  )


def test_scores_agree_across_entry_points(est, model_dir, tmp_path):
  examples = _reverse_examples(STRINGS)
  dataset = lambda: tf.data.Dataset.from_tensor_slices(examples)
  scores = utils.compute_log_likelihoods(est, dataset)
  assert len(scores) == len(STRINGS) and all(s < 0 for s in scores)
  # Batching, padding and order do not change a row's score.
  alone = utils.compute_log_likelihoods(est, lambda: dataset().skip(3).take(1))
  np.testing.assert_allclose(alone, scores[3:4], rtol=1e-5)
  reversed_scores = utils.compute_log_likelihoods(
    est,
    lambda: tf.data.Dataset.from_tensor_slices(
      {k: v[::-1] for k, v in examples.items()}
    ),
  )
  np.testing.assert_allclose(reversed_scores, scores[::-1], rtol=1e-5)
  # The summed scores are the negative log-perplexity times the tokens.
  metrics = utils.evaluate_dataset(est, dataset(), est.sequence_length, 8)
  np.testing.assert_allclose(
    sum(scores),
    metrics["neg_log_perplexity"] * metrics["num_eval_tokens"],
    rtol=1e-5,
  )
  # The eval loss is the original's: each batch's summed cross-entropy over
  # all of its target positions (zero rows fill a batch up to the
  # estimator's batch size), averaged over the batches.
  positions = est.batch_size * est.sequence_length["targets"]
  in_fours = utils.evaluate_dataset(est, dataset(), est.sequence_length, 4)
  np.testing.assert_allclose(
    in_fours["loss"],
    np.mean([-sum(scores[:4]) / positions, -sum(scores[4:]) / positions]),
    rtol=1e-5,
  )
  np.testing.assert_allclose(
    metrics["loss"], -sum(scores) / positions, rtol=1e-5
  )
  for name in ("neg_log_perplexity", "token_accuracy", "num_eval_tokens"):
    assert in_fours[name] == pytest.approx(metrics[name], rel=1e-6), name
  # score_from_strings (save_scores writes files) and score_from_dataset.
  prefix = str(tmp_path / "scores" / "s")
  targets = [s[::-1] for s in STRINGS]
  # As the original's scoring: (scores, the model's target texts).
  saved, saved_targets = _score_strings(
    est,
    model_dir,
    STRINGS,
    targets,
    score_postprocess_fn=lambda r, v: utils.save_scores(r, v, prefix),
  )
  np.testing.assert_allclose(saved, scores, rtol=1e-5)
  assert saved_targets == targets
  assert [
    float(l) for l in utils.get_inputs_from_file(prefix + ".scores")
  ] == pytest.approx(scores, rel=1e-4)
  assert utils.get_inputs_from_file(prefix + ".targets") == saved_targets
  assert not os.path.exists(prefix + ".inputs")
  # One target for every input; and n targets per input, in turn.
  for inputs, n_targets, pairs in [
    (STRINGS[:3], targets[:1], STRINGS[:3]),
    (STRINGS[:2], targets[:4], [STRINGS[0]] * 2 + [STRINGS[1]] * 2),
  ]:
    got, _ = _score_strings(est, model_dir, inputs, n_targets)
    want, _ = _score_strings(
      est, model_dir, pairs, (n_targets * len(pairs))[: len(pairs)]
    )
    np.testing.assert_allclose(got, want, rtol=1e-6)
  from_dataset, _ = utils.score_from_dataset(
    est,
    BYTES,
    8,
    8,
    str(model_dir),
    -1,
    "validation",
    score_dataset_fn=lambda **_: dataset(),
    score_postprocess_fn=utils.save_scores,
  )
  np.testing.assert_allclose(from_dataset, scores, rtol=1e-5)
  # Without the EOS token the targets are shorter: a higher likelihood.
  no_eos, _ = utils.score_from_strings(
    est,
    BYTES,
    "bitransformer",
    8,
    8,
    str(model_dir),
    1,
    inputs=STRINGS,
    targets=[s[::-1] for s in STRINGS],
    score_postprocess_fn=utils.save_scores,
    score_eos=False,
  )
  assert all(a > b for a, b in zip(no_eos, scores))


def _score_strings(est, model_dir, inputs, targets, **kwargs):
  """score_from_strings of the bitransformer's latest checkpoint."""
  kwargs.setdefault("score_postprocess_fn", utils.save_scores)
  return utils.score_from_strings(
    est,
    BYTES,
    "bitransformer",
    8,
    8,
    str(model_dir),
    None,
    inputs=inputs,
    targets=targets,
    **kwargs,
  )


def test_scoring_errors_name_the_problem(est, model_dir):
  for inputs, targets, message in [
    (["a", "b"], ["a", "b", "c"], r"inputs \(2\) must divide .* \(3\)"),
    (["a", "b", "c"], ["a", "b"], "3 inputs but 2 targets"),
  ]:
    with pytest.raises(ValueError, match=message):
      _score_strings(est, model_dir, inputs, targets)
  empty = lambda: tf.data.Dataset.from_tensor_slices({"targets": [[1]]})
  two = lambda **_: [
    dataset_lib.EvalDataset(n, empty, None, []) for n in ("first", "second")
  ]
  with pytest.raises(ValueError, match="first.*second"):
    utils.score_from_dataset(
      est,
      BYTES,
      8,
      8,
      str(model_dir),
      None,
      "validation",
      score_dataset_fn=two,
      score_postprocess_fn=utils.save_scores,
    )
  with pytest.raises(RuntimeError, match="score_postprocess_fn"):  # gin's
    utils.score_from_dataset(
      est, BYTES, 8, 8, str(model_dir), None, "validation", score_dataset_fn=two
    )


def test_eval_model_gives_metric_fns_the_greedy_decodes(
  est, model_dir, tmp_path, capsys
):
  examples = _reverse_examples(STRINGS)
  dataset = lambda: tf.data.Dataset.from_tensor_slices(examples)
  eval_dataset_fn = lambda **_: [
    dataset_lib.EvalDataset("rev", dataset, None, [_exact_match])
  ]
  summary_dir = str(tmp_path / "summaries")

  def eval_model(batch_size=8, **kwargs):
    return utils.eval_model(
      est,
      BYTES,
      8,
      batch_size,
      "validation",
      str(model_dir),
      eval_dataset_fn,
      summary_dir,
      -1,
      **kwargs,
    )["rev"]

  # As the original: only the metric_fns' results; the targets (no
  # "targets_pretokenized" here) are the decoded target ids.
  predictions = utils.decode_strings(est, STRINGS)
  assert eval_model() == {
    "exact_match": np.mean([p == s[::-1] for p, s in zip(predictions, STRINGS)])
  }
  read = lambda name: utils.get_inputs_from_file(
    os.path.join(summary_dir, name)
  )
  assert read("rev_1_predictions") == predictions
  assert read("rev_targets") == [s[::-1] for s in STRINGS]
  assert read("rev_inputs") == []  # no "inputs_pretokenized"
  assert "eval rev (step 1):" in capsys.readouterr().out
  assert tf.io.gfile.glob(os.path.join(summary_dir, "events.out.tfevents*"))
  # max_batches: only the first batches' examples are decoded and judged.
  assert eval_model(4, max_batches=1) == {
    "exact_match": np.mean(
      [p == s[::-1] for p, s in zip(predictions[:4], STRINGS)]
    )
  }
  assert read("rev_1_predictions") == predictions[:4]
  # eval_with_score: as in the original, the metric_fns get the scores as
  # their predictions (so no score equals a target string).
  assert eval_model(eval_with_score=True) == {"exact_match": 0.0}
  scores = [float(s) for s in read("rev_1_predictions")]
  np.testing.assert_allclose(
    scores, utils.compute_log_likelihoods(est, dataset), rtol=1e-5
  )
