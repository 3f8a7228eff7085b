"""SQuAD json -> examples -> document windows -> TFRecord features.

SQuAD json -> `SquadExample`s (whitespace words, the answer's word span) ->
`InputFeatures` per document window ([CLS] question [SEP] window [SEP], the
answer's token span, which window holds each token's widest context) ->
tf.Example records (`FeatureWriter`) of the fields `squad_feature_spec`
reads back.
"""

from __future__ import annotations

import collections
import json
from typing import Dict, List

from absl import logging
import tensorflow as tf

from mesh_tensorflow.bert._src import data
from mesh_tensorflow.bert._src import tokenization

__all__ = [
  "FIRST_UNIQUE_ID",
  "DocSpan",
  "FeatureWriter",
  "InputFeatures",
  "SquadExample",
  "check_is_max_context",
  "convert_examples_to_features",
  "improve_answer_span",
  "padding_feature",
  "read_squad_examples",
  "squad_feature_spec",
]

DocSpan = collections.namedtuple("DocSpan", ["start", "length"])

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
  ) -> None:
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
  ) -> None:
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

  def __init__(self, filename, is_training) -> None:
    self.filename = filename
    self.is_training = is_training
    self.num_features = 0
    self._writer = tf.io.TFRecordWriter(filename)

  def process_feature(self, feature) -> None:
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

  def close(self) -> None:
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
