"""Extractive question answering (SQuAD 1.1 / 2.0) with BERT on a mesh.

SQuAD json -> `SquadExample`s (whitespace words, the answer's word span) ->
`InputFeatures` per document window ([CLS] question [SEP] window [SEP], the
answer's token span, which window holds each token's widest context) ->
start/end logits from a dense layer over BertModel's sequence output ->
the best-scoring answer text of each question, mapped back to the original
characters.
"""

from __future__ import annotations

import collections
import json
import math
from typing import Callable, Dict, List

from absl import logging
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.bert._src import data
from mesh_tensorflow.bert._src import estimator
from mesh_tensorflow.bert._src import model
from mesh_tensorflow.bert._src import tokenization

__all__ = [
  "FeatureWriter",
  "InputFeatures",
  "RawResult",
  "SquadExample",
  "check_is_max_context",
  "convert_examples_to_features",
  "create_model",
  "get_final_text",
  "improve_answer_span",
  "read_squad_examples",
  "padding_feature",
  "squad_feature_spec",
  "squad_model",
  "squad_results",
  "write_predictions",
]

RawResult = collections.namedtuple(
  "RawResult", ["unique_id", "start_logits", "end_logits"]
)

DocSpan = collections.namedtuple("DocSpan", ["start", "length"])

_PrelimPrediction = collections.namedtuple(
  "PrelimPrediction",
  ["feature_index", "start_index", "end_index", "start_logit", "end_logit"],
)
_NbestPrediction = collections.namedtuple(
  "NbestPrediction", ["text", "start_logit", "end_logit"]
)

FIRST_UNIQUE_ID = 1000000000


class SquadExample:
  """One question about one paragraph (start/end -1 when unanswerable).

  Args:
    qas_id: the question's id.
    question_text: the question.
    doc_tokens: the paragraph's whitespace-separated words.
    orig_answer_text: the answer text (training).
    start_position: the answer's first word (training).
    end_position: the answer's last word (training).
    is_impossible: whether the question has no answer (SQuAD 2.0).
  """

  def __init__(
    self,
    qas_id,
    question_text,
    doc_tokens,
    orig_answer_text=None,
    start_position=None,
    end_position=None,
    is_impossible=False,
  ):
    self.qas_id = qas_id
    self.question_text = question_text
    self.doc_tokens = doc_tokens
    self.orig_answer_text = orig_answer_text
    self.start_position = start_position
    self.end_position = end_position
    self.is_impossible = is_impossible

  def __str__(self):
    return self.__repr__()

  def __repr__(self):
    text = "qas_id: %s, question_text: %s, doc_tokens: [%s]" % (
      tokenization.printable_text(self.qas_id),
      tokenization.printable_text(self.question_text),
      " ".join(self.doc_tokens),
    )
    if self.start_position:
      text += ", start_position: %d, end_position: %d, is_impossible: %r" % (
        self.start_position,
        self.end_position,
        self.is_impossible,
      )
    return text


class InputFeatures:
  """The features of one document window of one example.

  Args:
    unique_id: the window's id (matches RawResult.unique_id).
    example_index: the example's index.
    doc_span_index: the window's index in the example.
    tokens: the window's word pieces with [CLS], question and [SEP]s.
    token_to_orig_map: {token index: document word index}.
    token_is_max_context: {token index: whether this window gives the token
      its widest context}.
    input_ids: the padded ids.
    input_mask: 1 for real tokens.
    segment_ids: 0 for the question part, 1 for the document part.
    start_position: the answer's first token (training; 0 if not here).
    end_position: the answer's last token (training; 0 if not here).
    is_impossible: whether the question has no answer.
  """

  def __init__(
    self,
    unique_id,
    example_index,
    doc_span_index,
    tokens,
    token_to_orig_map,
    token_is_max_context,
    input_ids,
    input_mask,
    segment_ids,
    start_position=None,
    end_position=None,
    is_impossible=None,
  ):
    self.unique_id = unique_id
    self.example_index = example_index
    self.doc_span_index = doc_span_index
    self.tokens = tokens
    self.token_to_orig_map = token_to_orig_map
    self.token_is_max_context = token_is_max_context
    self.input_ids = input_ids
    self.input_mask = input_mask
    self.segment_ids = segment_ids
    self.start_position = start_position
    self.end_position = end_position
    self.is_impossible = is_impossible


def _is_squad_whitespace(char: str) -> bool:
  return char in " \t\r\n" or ord(char) == 0x202F


def read_squad_examples(
  input_file: str, is_training: bool, version_2_with_negative: bool = False
) -> List[SquadExample]:
  """The SquadExamples of a SQuAD json file.

  In training, questions whose answer text cannot be found in its words
  are skipped (with a warning).

  Args:
    input_file: the json file.
    is_training: read the answers.
    version_2_with_negative: read "is_impossible" (SQuAD 2.0).

  Returns:
    A list of SquadExample.

  Raises:
    ValueError: a training question without exactly one answer.
  """
  with tf.io.gfile.GFile(input_file, "r") as f:
    entries = json.load(f)["data"]
  examples = []
  for entry in entries:
    for paragraph in entry["paragraphs"]:
      doc_tokens = []
      char_to_word = []
      after_space = True
      for char in paragraph["context"]:
        if _is_squad_whitespace(char):
          after_space = True
        else:
          if after_space:
            doc_tokens.append(char)
          else:
            doc_tokens[-1] += char
          after_space = False
        char_to_word.append(len(doc_tokens) - 1)
      for qa in paragraph["qas"]:
        start = end = answer_text = None
        impossible = False
        if is_training:
          if version_2_with_negative:
            impossible = qa["is_impossible"]
          if len(qa["answers"]) != 1 and not impossible:
            raise ValueError(
              "For training, each question should have exactly 1 answer."
            )
          if impossible:
            start, end, answer_text = -1, -1, ""
          else:
            answer = qa["answers"][0]
            answer_text = answer["text"]
            offset = answer["answer_start"]
            start = char_to_word[offset]
            end = char_to_word[offset + len(answer_text) - 1]
            found = " ".join(doc_tokens[start : end + 1])
            wanted = " ".join(tokenization.whitespace_tokenize(answer_text))
            if wanted not in found:
              logging.warning(
                "Could not find answer: '%s' vs. '%s'", found, wanted
              )
              continue
        examples.append(
          SquadExample(
            qas_id=qa["id"],
            question_text=qa["question"],
            doc_tokens=doc_tokens,
            orig_answer_text=answer_text,
            start_position=start,
            end_position=end,
            is_impossible=impossible,
          )
        )
  return examples


def improve_answer_span(
  doc_tokens, input_start, input_end, tokenizer, orig_answer_text
):
  """The narrowest token span inside [start, end] spelling the answer.

  A word answer "(1895-1943)." tokenized as "( 1895 - 1943 ) ." holds the
  answer "1895" exactly; when no sub-span matches the span is kept.

  Args:
    doc_tokens: the document's word pieces.
    input_start: the first piece of the answer's words.
    input_end: the last piece of the answer's words.
    tokenizer: the FullTokenizer.
    orig_answer_text: the answer text.

  Returns:
    (start, end) piece indices.
  """
  answer = " ".join(tokenizer.tokenize(orig_answer_text))
  for start in range(input_start, input_end + 1):
    for end in range(input_end, start - 1, -1):
      if " ".join(doc_tokens[start : end + 1]) == answer:
        return start, end
  return input_start, input_end


def check_is_max_context(doc_spans, cur_span_index, position) -> bool:
  """Whether span cur_span_index gives the token at position most context.

  A token's context in a span is min(left, right) tokens (+ 0.01 x the
  span's length to break ties); of the overlapping windows, the token is
  scored in the one where that is largest.

  Args:
    doc_spans: the DocSpans (start, length).
    cur_span_index: the span asked about.
    position: the token's index in the document.

  Returns:
    True if cur_span_index is the token's best span.
  """
  best_score, best_index = None, None
  for index, span in enumerate(doc_spans):
    end = span.start + span.length - 1
    if not span.start <= position <= end:
      continue
    score = min(position - span.start, end - position) + 0.01 * span.length
    if best_score is None or score > best_score:
      best_score, best_index = score, index
  return cur_span_index == best_index


def _doc_spans(num_tokens: int, max_tokens: int, stride: int) -> List[DocSpan]:
  spans = []
  start = 0
  while start < num_tokens:
    length = min(num_tokens - start, max_tokens)
    spans.append(DocSpan(start=start, length=length))
    if start + length == num_tokens:
      break
    start += min(length, stride)
  return spans


def convert_examples_to_features(
  examples,
  tokenizer,
  max_seq_length,
  doc_stride,
  max_query_length,
  is_training,
  output_fn,
) -> None:
  """Calls output_fn with the InputFeatures of each window of each example.

  Long documents are cut into windows of up to max_seq_length - question
  - 3 tokens, doc_stride apart. In training, a window without the answer
  (or an unanswerable question) gets start = end = 0 ([CLS]).

  Args:
    examples: the SquadExamples.
    tokenizer: the FullTokenizer.
    max_seq_length: the padded length.
    doc_stride: tokens between window starts.
    max_query_length: questions are cut to this many tokens.
    is_training: compute the answer positions.
    output_fn: called with each InputFeatures.
  """
  unique_id = FIRST_UNIQUE_ID
  for example_index, example in enumerate(examples):
    query = tokenizer.tokenize(example.question_text)[:max_query_length]
    piece_to_word, word_to_piece, pieces = [], [], []
    for word_index, word in enumerate(example.doc_tokens):
      word_to_piece.append(len(pieces))
      for piece in tokenizer.tokenize(word):
        piece_to_word.append(word_index)
        pieces.append(piece)
    answer_start = answer_end = None
    if is_training and example.is_impossible:
      answer_start = answer_end = -1
    if is_training and not example.is_impossible:
      answer_start = word_to_piece[example.start_position]
      if example.end_position < len(example.doc_tokens) - 1:
        answer_end = word_to_piece[example.end_position + 1] - 1
      else:
        answer_end = len(pieces) - 1
      answer_start, answer_end = improve_answer_span(
        pieces, answer_start, answer_end, tokenizer, example.orig_answer_text
      )
    spans = _doc_spans(len(pieces), max_seq_length - len(query) - 3, doc_stride)
    for span_index, span in enumerate(spans):
      tokens = ["[CLS]"] + query + ["[SEP]"]
      segment_ids = [0] * len(tokens)
      token_to_orig_map, token_is_max_context = {}, {}
      for i in range(span.length):
        piece_index = span.start + i
        token_to_orig_map[len(tokens)] = piece_to_word[piece_index]
        token_is_max_context[len(tokens)] = check_is_max_context(
          spans, span_index, piece_index
        )
        tokens.append(pieces[piece_index])
      tokens.append("[SEP]")
      segment_ids += [1] * (span.length + 1)
      input_ids = tokenizer.convert_tokens_to_ids(tokens)
      padding = [0] * (max_seq_length - len(input_ids))
      start_position = end_position = None
      if is_training:
        start_position = end_position = 0
        span_end = span.start + span.length - 1
        if not example.is_impossible and (
          span.start <= answer_start and answer_end <= span_end
        ):
          offset = len(query) + 2 - span.start
          start_position = answer_start + offset
          end_position = answer_end + offset
      if example_index < 20:
        logging.info(
          "unique_id %d, example %d, span %d: %s",
          unique_id,
          example_index,
          span_index,
          " ".join(tokenization.printable_text(t) for t in tokens),
        )
      output_fn(
        InputFeatures(
          unique_id=unique_id,
          example_index=example_index,
          doc_span_index=span_index,
          tokens=tokens,
          token_to_orig_map=token_to_orig_map,
          token_is_max_context=token_is_max_context,
          input_ids=input_ids + padding,
          input_mask=[1] * len(input_ids) + padding,
          segment_ids=segment_ids + padding,
          start_position=start_position,
          end_position=end_position,
          is_impossible=example.is_impossible,
        )
      )
      unique_id += 1


class FeatureWriter:
  """Writes InputFeatures to a TFRecord file of tf.Examples.

  Args:
    filename: the TFRecord file.
    is_training: also write start_positions, end_positions, is_impossible.
  """

  def __init__(self, filename, is_training):
    self.filename = filename
    self.is_training = is_training
    self.num_features = 0
    self._writer = tf.io.TFRecordWriter(filename)

  def process_feature(self, feature):
    """Writes one InputFeatures.

    Args:
      feature: the InputFeatures.
    """
    self.num_features += 1
    values = collections.OrderedDict(
      [
        ("unique_ids", [feature.unique_id]),
        ("input_ids", feature.input_ids),
        ("input_mask", feature.input_mask),
        ("segment_ids", feature.segment_ids),
      ]
    )
    if self.is_training:
      values["start_positions"] = [feature.start_position]
      values["end_positions"] = [feature.end_position]
      values["is_impossible"] = [int(bool(feature.is_impossible))]
    self._writer.write(data.example_proto(values).SerializeToString())

  def close(self):
    """Closes the file."""
    self._writer.close()


def squad_feature_spec(seq_length: int, is_training: bool) -> Dict:
  """The tf.Example features of a SQuAD record.

  Args:
    seq_length: the padded length.
    is_training: include the answer positions.

  Returns:
    {feature name: tf.io.FixedLenFeature}.
  """
  spec = {
    "unique_ids": tf.io.FixedLenFeature([], tf.int64),
    "input_ids": tf.io.FixedLenFeature([seq_length], tf.int64),
    "input_mask": tf.io.FixedLenFeature([seq_length], tf.int64),
    "segment_ids": tf.io.FixedLenFeature([seq_length], tf.int64),
  }
  if is_training:
    spec["start_positions"] = tf.io.FixedLenFeature([], tf.int64)
    spec["end_positions"] = tf.io.FixedLenFeature([], tf.int64)
  return spec


def create_model(
  bert_config,
  is_training,
  input_ids,
  input_mask,
  segment_ids,
  mesh_shape="",
  layout="",
):
  """Start and end logits over seq from BertModel's sequence output.

  Args:
    bert_config: the BertConfig.
    is_training: whether training (dropout).
    input_ids: int mtf.Tensor [batch, seq].
    input_mask: int mtf.Tensor [batch, seq].
    segment_ids: int mtf.Tensor [batch, seq].
    mesh_shape: the mtf.Shape (for mixture-of-experts layers).
    layout: the mtf.LayoutRules (for mixture-of-experts layers).

  Returns:
    (start_logits, end_logits), each [batch, seq].
  """
  bert = model.BertModel(
    config=bert_config,
    is_training=is_training,
    input_ids=input_ids,
    input_mask=input_mask,
    token_type_ids=segment_ids,
    mesh_shape=mesh_shape,
    layout=layout,
  )
  class_dim = mtf.Dimension("class", 2)
  logits = mtf.layers.dense(
    bert.get_sequence_output(),
    reduced_dims=[bert.model_dim],
    new_dims=[class_dim],
    kernel_initializer=tf.compat.v1.truncated_normal_initializer(stddev=0.02),
    name="cls/squad/output",
  )
  start_logits, end_logits = mtf.unstack(logits, dim=class_dim)
  return start_logits, end_logits


def squad_model(bert_config, mesh_shape, layout_rules) -> Callable:
  """build(mesh, features, is_training) of SQuAD, for a TaskModel.

  The loss is the mean of the start and end positions' cross-entropies over
  seq (training features only); outputs "start_logits" and "end_logits"
  [batch, seq] and "unique_ids".

  Args:
    bert_config: the BertConfig.
    mesh_shape: the mtf.Shape (or string) of the mesh.
    layout_rules: the mtf.LayoutRules (or string).

  Returns:
    The build function.
  """

  def build(mesh, features, is_training):
    batch_size, seq_length = features["input_ids"].shape.as_list()
    batch_dim = mtf.Dimension("batch", batch_size)
    seq_dim = mtf.Dimension("seq", seq_length)

    def feature(name, dims):
      return estimator.import_feature(mesh, features[name], dims, name)

    start_logits, end_logits = create_model(
      bert_config,
      is_training,
      feature("input_ids", [batch_dim, seq_dim]),
      feature("input_mask", [batch_dim, seq_dim]),
      feature("segment_ids", [batch_dim, seq_dim]),
      mesh_shape=mesh_shape,
      layout=layout_rules,
    )
    outputs = {
      "start_logits": mtf.anonymize(start_logits),
      "end_logits": mtf.anonymize(end_logits),
    }
    losses = []
    for logits, name in (
      (start_logits, "start_positions"),
      (end_logits, "end_positions"),
    ):
      if name in features:
        positions = mtf.one_hot(feature(name, [batch_dim]), seq_dim)
        log_probs = mtf.log_softmax(logits, seq_dim)
        losses.append(
          -mtf.reduce_mean(
            mtf.reduce_sum(positions * log_probs, reduced_dim=seq_dim)
          )
        )
    if losses:
      outputs["loss"] = mtf.anonymize(mtf.add_n(losses) / float(len(losses)))
    else:
      outputs["loss"] = mtf.zeros(mesh, mtf.Shape([]))
    return outputs

  return build


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


def padding_feature(unique_id: int, seq_length: int) -> InputFeatures:
  """An all-padding feature filling the last prediction batch.

  Args:
    unique_id: its id (no example refers to it).
    seq_length: the padded length.

  Returns:
    The InputFeatures.
  """
  zeros = [0] * seq_length
  return InputFeatures(
    unique_id, -1, 0, [], {}, {}, list(zeros), list(zeros), list(zeros)
  )
