"""SQuAD answers: the best-scoring spans of the predicted logits, as text.

The start/end logits of each document window (`RawResult`) -> candidate
token spans of each question -> their text, mapped back to the original
characters (`get_final_text`) -> predictions.json and
nbest_predictions.json (and null_odds.json for SQuAD 2.0).
"""

from __future__ import annotations

import collections
import json
import math
from typing import Dict, List

from absl import logging
import tensorflow as tf

from mesh_tensorflow.bert._src import tokenization

__all__ = [
  "RawResult",
  "get_final_text",
  "squad_results",
  "write_predictions",
]

RawResult = collections.namedtuple(
  "RawResult", ["unique_id", "start_logits", "end_logits"]
)

_PrelimPrediction = collections.namedtuple(
  "PrelimPrediction",
  ["feature_index", "start_index", "end_index", "start_logit", "end_logit"],
)
_NbestPrediction = collections.namedtuple(
  "NbestPrediction", ["text", "start_logit", "end_logit"]
)


def squad_results(batches) -> List[RawResult]:
  """RawResults of predicted SQuAD batches.

  Args:
    batches: BertEstimator.predict_batches of a squad_model task.

  Returns:
    A RawResult per feature.
  """
  results = []
  for batch in batches:
    for unique_id, start, end in zip(
      batch["unique_ids"], batch["start_logits"], batch["end_logits"]
    ):
      results.append(
        RawResult(
          int(unique_id),
          [float(x) for x in start.flat],
          [float(x) for x in end.flat],
        )
      )
  return results


def _best_indexes(logits, n_best_size: int) -> List[int]:
  order = sorted(enumerate(logits), key=lambda x: x[1], reverse=True)
  return [index for index, _ in order[:n_best_size]]


def _softmax(scores) -> List[float]:
  if not scores:
    return []
  top = max(scores)
  exps = [math.exp(s - top) for s in scores]
  total = sum(exps)
  return [e / total for e in exps]


def _strip_spaces(text: str):
  """text without spaces, and {index there: index in text}."""
  chars, index_map = [], collections.OrderedDict()
  for i, char in enumerate(text):
    if char != " ":
      index_map[len(chars)] = i
      chars.append(char)
  return "".join(chars), index_map


def get_final_text(
  pred_text, orig_text, do_lower_case, verbose_logging: bool = False
) -> str:
  """The characters of orig_text that the normalized pred_text spans.

  pred_text comes from word pieces (lower-cased, punctuation split); it is
  located in orig_text's basic tokenization and mapped back character by
  character, so the answer keeps its original case and spacing. When that
  fails, orig_text is returned.

  Args:
    pred_text: the predicted text (pieces joined, "##" removed).
    orig_text: the original words of the predicted span.
    do_lower_case: the tokenizer's lower-casing.
    verbose_logging: log why a mapping failed.

  Returns:
    The answer text.
  """

  def fail(message, *args):
    if verbose_logging:
      logging.info(message, *args)
    return orig_text

  tok_text = " ".join(
    tokenization.BasicTokenizer(do_lower_case=do_lower_case).tokenize(orig_text)
  )
  start = tok_text.find(pred_text)
  if start == -1:
    return fail("Unable to find text: '%s' in '%s'", pred_text, orig_text)
  end = start + len(pred_text) - 1
  orig_ns, orig_ns_to_s = _strip_spaces(orig_text)
  tok_ns, tok_ns_to_s = _strip_spaces(tok_text)
  if len(orig_ns) != len(tok_ns):
    return fail(
      "Length not equal after stripping spaces: '%s' vs '%s'", orig_ns, tok_ns
    )
  tok_s_to_ns = {s: ns for ns, s in tok_ns_to_s.items()}
  positions = []
  for position in (start, end):
    ns = tok_s_to_ns.get(position)
    if ns is None or ns not in orig_ns_to_s:
      return fail("Couldn't map position %d", position)
    positions.append(orig_ns_to_s[ns])
  return orig_text[positions[0] : positions[1] + 1]


def write_predictions(
  all_examples,
  all_features,
  all_results,
  n_best_size,
  max_answer_length,
  do_lower_case,
  output_prediction_file,
  output_nbest_file,
  output_null_log_odds_file,
  version_2_with_negative: bool = False,
  null_score_diff_threshold: float = 0.0,
  verbose_logging: bool = False,
) -> Dict[str, str]:
  """Writes each question's best answer and n-best list as json.

  Candidate spans pair the n_best_size highest start and end logits of each
  window (in the document part, end >= start, at most max_answer_length
  tokens, the start token at its widest context); a span scores start +
  end logit. With version_2_with_negative the empty answer competes with
  score null = the [CLS] logits, and wins when null - best exceeds
  null_score_diff_threshold (the differences go to
  output_null_log_odds_file).

  Args:
    all_examples: the SquadExamples.
    all_features: their InputFeatures.
    all_results: RawResults of the features.
    n_best_size: candidates per logit list and answers per question.
    max_answer_length: the longest answer in tokens.
    do_lower_case: the tokenizer's lower-casing.
    output_prediction_file: {qas_id: answer} json.
    output_nbest_file: {qas_id: n-best list} json.
    output_null_log_odds_file: {qas_id: null score difference} json
      (SQuAD 2.0).
    version_2_with_negative: allow unanswerable questions.
    null_score_diff_threshold: see above.
    verbose_logging: log failed text mappings.

  Returns:
    {qas_id: answer text}.
  """
  features_of = collections.defaultdict(list)
  for feature in all_features:
    features_of[feature.example_index].append(feature)
  result_of = {result.unique_id: result for result in all_results}
  predictions = collections.OrderedDict()
  nbest_of = collections.OrderedDict()
  null_odds = collections.OrderedDict()
  for example_index, example in enumerate(all_examples):
    features = features_of[example_index]
    prelim = []
    score_null = 1000000.0
    null_feature, null_start, null_end = 0, 0.0, 0.0
    for feature_index, feature in enumerate(features):
      result = result_of[feature.unique_id]
      if version_2_with_negative:
        score = result.start_logits[0] + result.end_logits[0]
        if score < score_null:
          score_null, null_feature = score, feature_index
          null_start, null_end = result.start_logits[0], result.end_logits[0]
      for start in _best_indexes(result.start_logits, n_best_size):
        for end in _best_indexes(result.end_logits, n_best_size):
          if (
            start >= len(feature.tokens)
            or end >= len(feature.tokens)
            or start not in feature.token_to_orig_map
            or end not in feature.token_to_orig_map
            or not feature.token_is_max_context.get(start, False)
            or end < start
            or end - start + 1 > max_answer_length
          ):
            continue
          prelim.append(
            _PrelimPrediction(
              feature_index,
              start,
              end,
              result.start_logits[start],
              result.end_logits[end],
            )
          )
    if version_2_with_negative:
      prelim.append(_PrelimPrediction(null_feature, 0, 0, null_start, null_end))
    prelim.sort(key=lambda p: p.start_logit + p.end_logit, reverse=True)
    seen = set()
    nbest = []
    for pred in prelim:
      if len(nbest) >= n_best_size:
        break
      if pred.start_index > 0:
        feature = features[pred.feature_index]
        pieces = feature.tokens[pred.start_index : pred.end_index + 1]
        first = feature.token_to_orig_map[pred.start_index]
        last = feature.token_to_orig_map[pred.end_index]
        tok_text = " ".join(pieces).replace(" ##", "").replace("##", "")
        tok_text = " ".join(tok_text.strip().split())
        text = get_final_text(
          tok_text,
          " ".join(example.doc_tokens[first : last + 1]),
          do_lower_case,
          verbose_logging,
        )
        if text in seen:
          continue
      else:
        text = ""
      seen.add(text)
      nbest.append(_NbestPrediction(text, pred.start_logit, pred.end_logit))
    if version_2_with_negative and "" not in seen:
      nbest.append(_NbestPrediction("", null_start, null_end))
    if not nbest:
      nbest.append(_NbestPrediction("empty", 0.0, 0.0))
    probabilities = _softmax([e.start_logit + e.end_logit for e in nbest])
    nbest_json = [
      collections.OrderedDict(
        [
          ("text", entry.text),
          ("probability", probability),
          ("start_logit", entry.start_logit),
          ("end_logit", entry.end_logit),
        ]
      )
      for entry, probability in zip(nbest, probabilities)
    ]
    if not version_2_with_negative:
      predictions[example.qas_id] = nbest_json[0]["text"]
    else:
      best = next((e for e in nbest if e.text), None)
      best_score = best.start_logit + best.end_logit if best else 0.0
      difference = score_null - best_score
      null_odds[example.qas_id] = difference
      predictions[example.qas_id] = (
        ""
        if difference > null_score_diff_threshold or best is None
        else best.text
      )
    nbest_of[example.qas_id] = nbest_json
  outputs = [
    (output_prediction_file, predictions),
    (output_nbest_file, nbest_of),
  ]
  if version_2_with_negative:
    outputs.append((output_null_log_odds_file, null_odds))
  for path, value in outputs:
    with tf.io.gfile.GFile(path, "w") as f:
      f.write(json.dumps(value, indent=4) + "\n")
  return predictions
