"""BERT's input data: tf.Example records, pipelines and an offline corpus.

The record formats are the original's (int64 features of fixed length);
the pipelines parse them into int32 batches. For tests and demos that must
run without downloads, `write_demo_data` writes a tiny WordPiece vocabulary,
pretraining records made from a generated corpus (masked-LM and
next-sentence targets, as Google BERT's create_pretraining_data), and a
generated sentence-classification set in the GLUE CoLA layout.
"""

from __future__ import annotations

import collections
import os
import random
from typing import Dict, Iterable, List, Mapping, Optional, Sequence

import tensorflow as tf

from mesh_tensorflow.bert._src import model
from mesh_tensorflow.bert._src import tokenization

__all__ = [
  "CLASSIFICATION_WORDS",
  "DemoData",
  "create_pretraining_features",
  "decode_record",
  "example_proto",
  "generate_classification_set",
  "generate_corpus",
  "pretraining_feature_spec",
  "record_dataset",
  "write_demo_data",
  "write_examples",
  "write_vocab",
]

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")

# Topics of the generated corpus: each document draws its nouns and verbs
# from one topic, so the words around a masked one predict it.
_TOPICS = {
  "farm": (("cow", "horse", "sheep", "farmer"), ("eats", "sees", "pulls")),
  "sea": (("fish", "boat", "crab", "sailor"), ("swims", "finds", "carries")),
  "city": (("car", "bus", "train", "driver"), ("stops", "passes", "drives")),
  "wood": (("tree", "bird", "fox", "hunter"), ("hides", "climbs", "watches")),
}
_PLACES = ("near", "under", "behind")
_ADJECTIVES = ("big", "small", "old", "young")

# Sentiment words of the generated classification set (label "1", "0").
CLASSIFICATION_WORDS = {
  "1": ("good", "great", "happy", "nice"),
  "0": ("bad", "sad", "awful", "poor"),
}


def _vocabulary_tokens() -> List[str]:
  words = set(_PLACES + _ADJECTIVES + ("the", "a", "is", "was", "very"))
  for nouns, verbs in _TOPICS.values():
    words.update(nouns + verbs)
  for sentiment_words in CLASSIFICATION_WORDS.values():
    words.update(sentiment_words)
  # A few word pieces, so that unknown words split ("trees" -> tree ##s).
  pieces = ["##s", "##ed", "##ing", "##er"]
  return list(SPECIAL_TOKENS) + [".", ",", "!"] + sorted(words) + pieces


def write_vocab(path: str) -> List[str]:
  """Writes the demo WordPiece vocabulary, one token per line.

  Args:
    path: the file to write.

  Returns:
    The tokens in id order ("[PAD]" is 0, "[UNK]" 1, "[CLS]" 2, "[SEP]" 3,
    "[MASK]" 4).
  """
  tokens = _vocabulary_tokens()
  with tf.io.gfile.GFile(path, "w") as f:
    f.write("\n".join(tokens) + "\n")
  return tokens


def generate_corpus(
  num_documents: int, sentences_per_document: int = 6, seed: int = 0
) -> List[List[str]]:
  """Documents of simple generated English sentences, one topic each.

  Args:
    num_documents: the number of documents.
    sentences_per_document: sentences per document.
    seed: the random seed (same seed, same corpus).

  Returns:
    A list of documents, each a list of sentences.
  """
  rng = random.Random(seed)
  topics = sorted(_TOPICS)
  documents = []
  for _ in range(num_documents):
    nouns, verbs = _TOPICS[rng.choice(topics)]
    sentences = []
    for _ in range(sentences_per_document):
      subject, obj = rng.sample(nouns, 2)
      sentences.append(
        "the %s %s %s the %s %s the %s ."
        % (
          rng.choice(_ADJECTIVES),
          subject,
          rng.choice(verbs),
          obj,
          rng.choice(_PLACES),
          rng.choice(nouns),
        )
      )
    documents.append(sentences)
  return documents


def generate_classification_set(
  num_examples: int, seed: int = 0
) -> List[tuple]:
  """(sentence, label) pairs: label "1" for a positive sentiment word.

  Args:
    num_examples: the number of examples.
    seed: the random seed.

  Returns:
    A list of (sentence, label) with labels "0" and "1" equally likely.
  """
  rng = random.Random(seed)
  nouns = sorted(n for topic in _TOPICS.values() for n in topic[0])
  examples = []
  for _ in range(num_examples):
    label = rng.choice(("0", "1"))
    sentence = "the %s %s %s very %s ." % (
      rng.choice(_ADJECTIVES),
      rng.choice(nouns),
      rng.choice(("is", "was")),
      rng.choice(CLASSIFICATION_WORDS[label]),
    )
    examples.append((sentence, label))
  return examples


def _truncate_pair(tokens_a: list, tokens_b: list, max_length: int) -> None:
  """Drops tokens from the longer list's end until both fit max_length."""
  while len(tokens_a) + len(tokens_b) > max_length:
    longer = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
    longer.pop()


def create_pretraining_features(
  documents: Sequence[Sequence[str]],
  tokenizer,
  max_seq_length: int,
  max_predictions_per_seq: int,
  masked_lm_prob: float = 0.15,
  seed: int = 0,
) -> List[Dict[str, list]]:
  """Masked-LM and next-sentence training examples from documents.

  Each consecutive sentence pair of a document gives one example: sentence B
  is the true next sentence (label 0) or, half of the time, a sentence of
  another document (label 1). Of the tokens (not [CLS]/[SEP]),
  masked_lm_prob are predicted: 80% replaced by [MASK], 10% by a random
  word, 10% kept.

  Args:
    documents: lists of sentences.
    tokenizer: a FullTokenizer.
    max_seq_length: the padded length of input_ids.
    max_predictions_per_seq: the padded number of masked positions.
    masked_lm_prob: the fraction of tokens to predict.
    seed: the random seed.

  Returns:
    A list of {feature name: list of ints (floats for masked_lm_weights)}
    with the features of pretraining_feature_spec.
  """
  rng = random.Random(seed)
  vocab_words = [t for t in tokenizer.vocab if t not in SPECIAL_TOKENS]
  tokenized = [[tokenizer.tokenize(s) for s in doc] for doc in documents]
  examples = []
  for doc_index, doc in enumerate(tokenized):
    for i in range(len(doc) - 1):
      tokens_a = list(doc[i])
      if len(tokenized) > 1 and rng.random() < 0.5:
        other = rng.choice([j for j in range(len(tokenized)) if j != doc_index])
        tokens_b = list(rng.choice(tokenized[other]))
        next_sentence_label = 1
      else:
        tokens_b = list(doc[i + 1])
        next_sentence_label = 0
      _truncate_pair(tokens_a, tokens_b, max_seq_length - 3)
      tokens = ["[CLS]"] + tokens_a + ["[SEP]"] + tokens_b + ["[SEP]"]
      segment_ids = [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1)
      candidates = [
        k for k, t in enumerate(tokens) if t not in ("[CLS]", "[SEP]")
      ]
      rng.shuffle(candidates)
      num_to_predict = min(
        max_predictions_per_seq,
        max(1, int(round(len(candidates) * masked_lm_prob))),
      )
      positions = sorted(candidates[:num_to_predict])
      labels = [tokens[k] for k in positions]
      for k in positions:
        draw = rng.random()
        if draw < 0.8:
          tokens[k] = "[MASK]"
        elif draw < 0.9:
          tokens[k] = rng.choice(vocab_words)
      input_ids = tokenizer.convert_tokens_to_ids(tokens)
      padding = max_seq_length - len(input_ids)
      prediction_padding = max_predictions_per_seq - len(positions)
      examples.append(
        {
          "input_ids": input_ids + [0] * padding,
          "input_mask": [1] * len(input_ids) + [0] * padding,
          "segment_ids": segment_ids + [0] * padding,
          "masked_lm_positions": positions + [0] * prediction_padding,
          "masked_lm_ids": tokenizer.convert_tokens_to_ids(labels)
          + [0] * prediction_padding,
          "masked_lm_weights": [1.0] * len(positions)
          + [0.0] * prediction_padding,
          "next_sentence_labels": [next_sentence_label],
        }
      )
  return examples


def example_proto(values: Mapping[str, Sequence]) -> tf.train.Example:
  """A tf.train.Example of {feature name: list of ints or floats}.

  Args:
    values: the features; a list starting with a float is a float_list.

  Returns:
    The tf.train.Example.
  """
  features = collections.OrderedDict()
  for name, feature_values in values.items():
    feature_values = list(feature_values)
    if feature_values and isinstance(feature_values[0], float):
      features[name] = tf.train.Feature(
        float_list=tf.train.FloatList(value=feature_values)
      )
    else:
      features[name] = tf.train.Feature(
        int64_list=tf.train.Int64List(value=[int(v) for v in feature_values])
      )
  return tf.train.Example(features=tf.train.Features(feature=features))


def write_examples(path: str, examples: Iterable[Mapping[str, list]]) -> int:
  """Writes feature dicts as tf.Example records (see example_proto).

  Args:
    path: the TFRecord file.
    examples: {feature name: list of ints or floats}.

  Returns:
    The number of records written.
  """
  count = 0
  with tf.io.TFRecordWriter(path) as writer:
    for example in examples:
      writer.write(example_proto(example).SerializeToString())
      count += 1
  return count


def pretraining_feature_spec(
  max_seq_length: int, max_predictions_per_seq: int
) -> Dict[str, tf.io.FixedLenFeature]:
  """The tf.Example features of a pretraining record.

  Args:
    max_seq_length: the length of input_ids, input_mask and segment_ids.
    max_predictions_per_seq: the length of the masked_lm_* features.

  Returns:
    {feature name: tf.io.FixedLenFeature}.
  """
  seq = [max_seq_length]
  pred = [max_predictions_per_seq]
  return {
    "input_ids": tf.io.FixedLenFeature(seq, tf.int64),
    "input_mask": tf.io.FixedLenFeature(seq, tf.int64),
    "segment_ids": tf.io.FixedLenFeature(seq, tf.int64),
    "masked_lm_positions": tf.io.FixedLenFeature(pred, tf.int64),
    "masked_lm_ids": tf.io.FixedLenFeature(pred, tf.int64),
    "masked_lm_weights": tf.io.FixedLenFeature(pred, tf.float32),
    "next_sentence_labels": tf.io.FixedLenFeature([1], tf.int64),
  }


def decode_record(record, name_to_features) -> Dict[str, tf.Tensor]:
  """Parses one serialized tf.Example; int64 features become int32.

  Args:
    record: a scalar string tensor.
    name_to_features: {feature name: tf.io.FixedLenFeature}.

  Returns:
    {feature name: tensor}.
  """
  example = tf.io.parse_single_example(record, name_to_features)
  return {
    name: tf.cast(t, tf.int32) if t.dtype == tf.int64 else t
    for name, t in example.items()
  }


def record_dataset(
  input_files,
  name_to_features,
  batch_size: int,
  is_training: bool,
  drop_remainder: bool = True,
  seed: Optional[int] = None,
) -> tf.data.Dataset:
  """Batches of parsed records; repeated and shuffled for training.

  Args:
    input_files: a TFRecord file or a list of them.
    name_to_features: {feature name: tf.io.FixedLenFeature}.
    batch_size: the batch size.
    is_training: repeat forever and shuffle (else one pass in order).
    drop_remainder: drop a last partial batch.
    seed: the shuffle seed (None: random).

  Returns:
    A tf.data.Dataset of {feature name: tensor [batch, ...]}.
  """
  if isinstance(input_files, str):
    input_files = [input_files]
  dataset = tf.data.TFRecordDataset(list(input_files))
  if is_training:
    dataset = dataset.repeat().shuffle(buffer_size=100, seed=seed)
  dataset = dataset.map(lambda r: decode_record(r, name_to_features))
  return dataset.batch(batch_size, drop_remainder=drop_remainder)


DemoData = collections.namedtuple(
  "DemoData",
  ["vocab_file", "bert_config_file", "pretraining_file", "classifier_dir"],
)


def write_demo_data(
  directory: str,
  max_seq_length: int = 32,
  max_predictions_per_seq: int = 5,
  num_documents: int = 64,
  num_classification_examples: int = 256,
  seed: int = 0,
) -> DemoData:
  """Writes a complete offline BERT setup to directory.

  vocab.txt, bert_config.json (a tiny model for the vocabulary: 2 blocks,
  d_model 32, 4 heads, no dropout), pretrain.tfrecord (from generate_corpus)
  and classifier/{train,dev,test}.tsv (generate_classification_set in the
  GLUE CoLA layout, read by run_classifier's ColaProcessor: train and dev
  rows "source<TAB>label<TAB><TAB>sentence", test "index<TAB>sentence"
  after a header).

  Args:
    directory: where to write (created if missing).
    max_seq_length: the length of the pretraining records.
    max_predictions_per_seq: masked positions per pretraining record.
    num_documents: documents of the pretraining corpus.
    num_classification_examples: training examples of the classification
      set (dev and test have a quarter as many each).
    seed: the random seed.

  Returns:
    A DemoData of the written paths.
  """
  tf.io.gfile.makedirs(directory)
  vocab_file = os.path.join(directory, "vocab.txt")
  tokens = write_vocab(vocab_file)
  config = model.BertConfig(
    vocab_size=len(tokens),
    d_model=32,
    num_blocks=2,
    attention_num_heads=4,
    feedforward_intermediate_size=64,
    max_position_embeddings=max(64, max_seq_length),
    type_vocab_size=2,
    layer_output_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
  )
  bert_config_file = os.path.join(directory, "bert_config.json")
  with tf.io.gfile.GFile(bert_config_file, "w") as f:
    f.write(config.to_json_string())
  tokenizer = tokenization.FullTokenizer(vocab_file)
  pretraining_file = os.path.join(directory, "pretrain.tfrecord")
  write_examples(
    pretraining_file,
    create_pretraining_features(
      generate_corpus(num_documents, seed=seed),
      tokenizer,
      max_seq_length,
      max_predictions_per_seq,
      seed=seed,
    ),
  )
  classifier_dir = os.path.join(directory, "classifier")
  tf.io.gfile.makedirs(classifier_dir)
  num_other = max(1, num_classification_examples // 4)
  splits = {
    "train": generate_classification_set(num_classification_examples, seed),
    "dev": generate_classification_set(num_other, seed + 1),
    "test": generate_classification_set(num_other, seed + 2),
  }
  for split, examples in splits.items():
    if split == "test":
      lines = ["index\tsentence"]
      lines += ["%d\t%s" % (i, s) for i, (s, _) in enumerate(examples)]
    else:
      lines = ["demo\t%s\t\t%s" % (label, s) for s, label in examples]
    path = os.path.join(classifier_dir, split + ".tsv")
    with tf.io.gfile.GFile(path, "w") as f:
      f.write("\n".join(lines) + "\n")
  return DemoData(
    vocab_file, bert_config_file, pretraining_file, classifier_dir
  )
