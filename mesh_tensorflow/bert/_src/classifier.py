"""Sentence(-pair) classification with BERT: data sets, features, model.

The GLUE/XNLI processors read a task's tsv files into `InputExample`s;
`convert_single_example` tokenizes one into fixed-length `InputFeatures`
([CLS] a [SEP] (b [SEP]), segment ids, mask); `create_model` puts a softmax
classifier on BertModel's pooled output.
"""

from __future__ import annotations

import collections
import csv
import os
from typing import Any, Callable, Dict, Iterable, List, Tuple, Union

from absl import logging
import numpy as np
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.bert._src import data
from mesh_tensorflow.bert._src import estimator
from mesh_tensorflow.bert._src import model
from mesh_tensorflow.bert._src.config import BertConfig
from mesh_tensorflow.bert._src.tokenization import convert_to_unicode
from mesh_tensorflow.bert._src.tokenization import printable_text

__all__ = [
  "ColaProcessor",
  "DataProcessor",
  "InputExample",
  "InputFeatures",
  "MnliProcessor",
  "MrpcProcessor",
  "PaddingInputExample",
  "XnliProcessor",
  "classification_metrics",
  "classifier_feature_spec",
  "classifier_model",
  "convert_examples_to_features",
  "convert_single_example",
  "create_model",
  "file_based_convert_examples_to_features",
  "file_based_input_fn_builder",
  "input_fn_builder",
  "pad_to_batches",
  "truncate_seq_pair",
]


class InputExample:
  """One example: one or two texts and (for train and dev) a label.

  Args:
    guid: a unique id.
    text_a: the (first) text, untokenized.
    text_b: the second text of a pair task (None: single text).
    label: the label string (None for test examples).
  """

  def __init__(self, guid, text_a, text_b=None, label=None) -> None:
    self.guid = guid
    self.text_a = text_a
    self.text_b = text_b
    self.label = label


class PaddingInputExample:
  """A fake example filling the last batch (weight 0 in the metrics).

  Fixed-size batches must cover every real example; padding examples give
  all-zero features with is_real_example False, where None could pass
  silently as data.
  """


class InputFeatures:
  """The fixed-length features of one example.

  Args:
    input_ids: the word-piece ids, zero-padded.
    input_mask: 1 for real tokens, 0 for padding.
    segment_ids: 0 for [CLS], text a and its [SEP]; 1 for text b and its.
    label_id: the label's index in the label list.
    is_real_example: False for PaddingInputExample.
  """

  def __init__(
    self, input_ids, input_mask, segment_ids, label_id, is_real_example=True
  ) -> None:
    self.input_ids = input_ids
    self.input_mask = input_mask
    self.segment_ids = segment_ids
    self.label_id = label_id
    self.is_real_example = is_real_example


class DataProcessor:
  """Reads one classification data set's splits into InputExamples."""

  def get_train_examples(self, data_dir) -> List[InputExample]:
    """The training examples.

    Args:
      data_dir: the data set's directory.

    Returns:
      A list of InputExample.
    """
    raise NotImplementedError()

  def get_dev_examples(self, data_dir) -> List[InputExample]:
    """The dev (evaluation) examples.

    Args:
      data_dir: the data set's directory.

    Returns:
      A list of InputExample.
    """
    raise NotImplementedError()

  def get_test_examples(self, data_dir) -> List[InputExample]:
    """The test (prediction) examples.

    Args:
      data_dir: the data set's directory.

    Returns:
      A list of InputExample.
    """
    raise NotImplementedError()

  def get_labels(self) -> List[str]:
    """The label strings, in label-id order.

    Returns:
      A list of str.
    """
    raise NotImplementedError()

  @classmethod
  def _read_tsv(cls, input_file, quotechar=None):
    """The rows of a tab-separated file."""
    with tf.io.gfile.GFile(input_file, "r") as f:
      return list(csv.reader(f, delimiter="\t", quotechar=quotechar))


def _examples(rows, make_example, skip_header=True):
  """make_example(index, row) for each row (after the header)."""
  examples = []
  for index, row in enumerate(rows):
    if skip_header and index == 0:
      continue
    example = make_example(index, row)
    if example is not None:
      examples.append(example)
  return examples


class XnliProcessor(DataProcessor):
  """XNLI (Chinese): MultiNLI training translation, XNLI dev set."""

  def __init__(self) -> None:
    self.language = "zh"

  def get_train_examples(self, data_dir) -> List[InputExample]:
    """The examples of multinli/multinli.train.<language>.tsv.

    Args:
      data_dir: the data set's directory.

    Returns:
      A list of InputExample.
    """
    path = os.path.join(
      data_dir, "multinli", "multinli.train.%s.tsv" % self.language
    )

    def make(index, row):
      label = convert_to_unicode(row[2])
      if label == "contradictory":
        label = "contradiction"
      return InputExample(
        guid="train-%d" % index,
        text_a=convert_to_unicode(row[0]),
        text_b=convert_to_unicode(row[1]),
        label=label,
      )

    return _examples(self._read_tsv(path), make)

  def get_dev_examples(self, data_dir) -> List[InputExample]:
    """The examples of xnli.dev.tsv in this processor's language.

    Args:
      data_dir: the data set's directory.

    Returns:
      A list of InputExample.
    """

    def make(index, row):
      if convert_to_unicode(row[0]) != self.language:
        return None
      return InputExample(
        guid="dev-%d" % index,
        text_a=convert_to_unicode(row[6]),
        text_b=convert_to_unicode(row[7]),
        label=convert_to_unicode(row[1]),
      )

    return _examples(
      self._read_tsv(os.path.join(data_dir, "xnli.dev.tsv")), make
    )

  def get_labels(self) -> List[str]:
    """contradiction, entailment, neutral.

    Returns:
      The labels.
    """
    return ["contradiction", "entailment", "neutral"]


class _GlueProcessor(DataProcessor):
  """A GLUE task: one tsv file per split, made into examples per row."""

  # {split: (file name, set type of the example ids)}.
  FILES = {
    "train": ("train.tsv", "train"),
    "dev": ("dev.tsv", "dev"),
    "test": ("test.tsv", "test"),
  }

  def _split(self, data_dir, split):
    file_name, set_type = self.FILES[split]
    rows = self._read_tsv(os.path.join(data_dir, file_name))
    return self._create_examples(rows, set_type)

  def get_train_examples(self, data_dir):
    """The examples of the training file (train.tsv).

    Args:
      data_dir: the data set's directory.

    Returns:
      A list of InputExample.
    """
    return self._split(data_dir, "train")

  def get_dev_examples(self, data_dir):
    """The examples of the dev file (dev.tsv; MNLI: dev_matched.tsv).

    Args:
      data_dir: the data set's directory.

    Returns:
      A list of InputExample.
    """
    return self._split(data_dir, "dev")

  def get_test_examples(self, data_dir):
    """The examples of the test file (test.tsv; MNLI: test_matched.tsv).

    Their labels are placeholders (the first label).

    Args:
      data_dir: the data set's directory.

    Returns:
      A list of InputExample.
    """
    return self._split(data_dir, "test")

  def _create_examples(self, lines, set_type):
    raise NotImplementedError()


class MnliProcessor(_GlueProcessor):
  """MultiNLI (GLUE): train.tsv, dev_matched.tsv, test_matched.tsv."""

  FILES = {
    "train": ("train.tsv", "train"),
    "dev": ("dev_matched.tsv", "dev_matched"),
    "test": ("test_matched.tsv", "test"),
  }

  def get_labels(self) -> List[str]:
    """The labels contradiction, entailment, neutral.

    Returns:
      The labels.
    """
    return ["contradiction", "entailment", "neutral"]

  def _create_examples(self, lines, set_type):
    def make(index, row):
      del index
      return InputExample(
        guid="%s-%s" % (set_type, convert_to_unicode(row[0])),
        text_a=convert_to_unicode(row[8]),
        text_b=convert_to_unicode(row[9]),
        label=(
          "contradiction" if set_type == "test" else convert_to_unicode(row[-1])
        ),
      )

    return _examples(lines, make)


class MrpcProcessor(_GlueProcessor):
  """MRPC (GLUE): paraphrase pairs in train.tsv, dev.tsv, test.tsv."""

  def get_labels(self) -> List[str]:
    """The labels "0" and "1".

    Returns:
      The labels.
    """
    return ["0", "1"]

  def _create_examples(self, lines, set_type):
    def make(index, row):
      return InputExample(
        guid="%s-%s" % (set_type, index),
        text_a=convert_to_unicode(row[3]),
        text_b=convert_to_unicode(row[4]),
        label="0" if set_type == "test" else convert_to_unicode(row[0]),
      )

    return _examples(lines, make)


class ColaProcessor(_GlueProcessor):
  """CoLA (GLUE): single sentences; only test.tsv has a header."""

  def get_labels(self) -> List[str]:
    """The labels "0" and "1".

    Returns:
      The labels.
    """
    return ["0", "1"]

  def _create_examples(self, lines, set_type):
    is_test = set_type == "test"

    def make(index, row):
      return InputExample(
        guid="%s-%s" % (set_type, index),
        text_a=convert_to_unicode(row[1] if is_test else row[3]),
        text_b=None,
        label="0" if is_test else convert_to_unicode(row[1]),
      )

    return _examples(lines, make, skip_header=is_test)


def truncate_seq_pair(tokens_a: list, tokens_b: list, max_length: int) -> None:
  """Shortens the longer list (from its end) until both fit max_length.

  Taking from the longer text keeps more of a short one, where each token
  carries more.

  Args:
    tokens_a: the first tokens (changed in place).
    tokens_b: the second tokens (changed in place).
    max_length: the largest total length.
  """
  while len(tokens_a) + len(tokens_b) > max_length:
    (tokens_a if len(tokens_a) > len(tokens_b) else tokens_b).pop()


def convert_single_example(
  ex_index, example, label_list, max_seq_length, tokenizer
) -> InputFeatures:
  """The InputFeatures of one example.

  Args:
    ex_index: the example's index (the first 5 are logged).
    example: an InputExample or PaddingInputExample.
    label_list: the label strings.
    max_seq_length: the padded length.
    tokenizer: a FullTokenizer.

  Returns:
    The InputFeatures.
  """
  if isinstance(example, PaddingInputExample):
    zeros = [0] * max_seq_length
    return InputFeatures(
      input_ids=list(zeros),
      input_mask=list(zeros),
      segment_ids=list(zeros),
      label_id=0,
      is_real_example=False,
    )
  label_map = {label: i for i, label in enumerate(label_list)}
  tokens_a = tokenizer.tokenize(example.text_a)
  tokens_b = tokenizer.tokenize(example.text_b) if example.text_b else None
  if tokens_b:
    truncate_seq_pair(tokens_a, tokens_b, max_seq_length - 3)
  else:
    tokens_a = tokens_a[: max_seq_length - 2]
  tokens = ["[CLS]"] + tokens_a + ["[SEP]"]
  segment_ids = [0] * len(tokens)
  if tokens_b:
    tokens += tokens_b + ["[SEP]"]
    segment_ids += [1] * (len(tokens_b) + 1)
  input_ids = tokenizer.convert_tokens_to_ids(tokens)
  padding = [0] * (max_seq_length - len(input_ids))
  label_id = label_map[example.label]
  if ex_index < 5:
    logging.info("*** Example ***")
    logging.info("guid: %s", example.guid)
    logging.info("tokens: %s", " ".join(printable_text(t) for t in tokens))
    logging.info("input_ids: %s", " ".join(str(i) for i in input_ids))
    logging.info("label: %s (id = %d)", example.label, label_id)
  return InputFeatures(
    input_ids=input_ids + padding,
    input_mask=[1] * len(input_ids) + padding,
    segment_ids=segment_ids + padding,
    label_id=label_id,
    is_real_example=True,
  )


def convert_examples_to_features(
  examples, label_list, max_seq_length, tokenizer
) -> List[InputFeatures]:
  """convert_single_example of each example.

  Args:
    examples: InputExamples (or PaddingInputExamples).
    label_list: the label strings.
    max_seq_length: the padded length.
    tokenizer: a FullTokenizer.

  Returns:
    A list of InputFeatures.
  """
  return [
    convert_single_example(i, example, label_list, max_seq_length, tokenizer)
    for i, example in enumerate(examples)
  ]


def _feature_dict(feature: InputFeatures) -> Dict[str, list]:
  return collections.OrderedDict(
    [
      ("input_ids", feature.input_ids),
      ("input_mask", feature.input_mask),
      ("segment_ids", feature.segment_ids),
      ("label_ids", [feature.label_id]),
      ("is_real_example", [int(feature.is_real_example)]),
    ]
  )


def file_based_convert_examples_to_features(
  examples, label_list, max_seq_length, tokenizer, output_file
) -> None:
  """Writes the examples' features to a TFRecord file of tf.Examples.

  Args:
    examples: InputExamples (or PaddingInputExamples).
    label_list: the label strings.
    max_seq_length: the padded length.
    tokenizer: a FullTokenizer.
    output_file: the TFRecord file.
  """
  data.write_examples(
    output_file,
    (
      _feature_dict(f)
      for f in convert_examples_to_features(
        examples, label_list, max_seq_length, tokenizer
      )
    ),
  )


def classifier_feature_spec(seq_length: int) -> Dict:
  """The tf.Example features of a classification record.

  Args:
    seq_length: the padded length.

  Returns:
    {feature name: tf.io.FixedLenFeature}.
  """
  return {
    "input_ids": tf.io.FixedLenFeature([seq_length], tf.int64),
    "input_mask": tf.io.FixedLenFeature([seq_length], tf.int64),
    "segment_ids": tf.io.FixedLenFeature([seq_length], tf.int64),
    "label_ids": tf.io.FixedLenFeature([], tf.int64),
    "is_real_example": tf.io.FixedLenFeature([], tf.int64),
  }


def file_based_input_fn_builder(
  input_file, seq_length, is_training, drop_remainder
) -> Callable:
  """input_fn(params) -> batches of a classification TFRecord file.

  Args:
    input_file: the TFRecord file.
    seq_length: the padded length.
    is_training: repeat and shuffle.
    drop_remainder: drop a last partial batch.

  Returns:
    input_fn(params) -> tf.data.Dataset, with params["batch_size"].
  """

  def input_fn(params):
    return data.record_dataset(
      input_file,
      classifier_feature_spec(seq_length),
      params["batch_size"],
      is_training,
      drop_remainder=drop_remainder,
    )

  return input_fn


def input_fn_builder(
  features: List[InputFeatures],
  seq_length: int,
  is_training: bool,
  drop_remainder: bool,
) -> Callable[[Dict[str, Any]], tf.data.Dataset]:
  """input_fn(params) -> batches of in-memory InputFeatures (small sets).

  Args:
    features: a list of InputFeatures.
    seq_length: the padded length.
    is_training: repeat and shuffle.
    drop_remainder: drop a last partial batch.

  Returns:
    input_fn(params) -> tf.data.Dataset, with params["batch_size"].
  """
  columns = {
    "input_ids": [f.input_ids for f in features],
    "input_mask": [f.input_mask for f in features],
    "segment_ids": [f.segment_ids for f in features],
    "label_ids": [f.label_id for f in features],
  }

  def input_fn(params):
    tensors = {
      name: tf.constant(np.array(values, np.int32))
      for name, values in columns.items()
    }
    for name in ("input_ids", "input_mask", "segment_ids"):
      tensors[name] = tf.reshape(tensors[name], [len(features), seq_length])
    dataset = tf.data.Dataset.from_tensor_slices(tensors)
    if is_training:
      dataset = dataset.repeat().shuffle(buffer_size=100)
    return dataset.batch(params["batch_size"], drop_remainder=drop_remainder)

  return input_fn


def create_model(
  bert_config: BertConfig,
  is_training: bool,
  input_ids: mtf.Tensor,
  input_mask: mtf.Tensor,
  segment_ids: mtf.Tensor,
  labels: mtf.Tensor,
  num_labels_dim: mtf.Dimension,
  layout: Union[str, mtf.LayoutRules],
  mesh_shape: Union[str, mtf.Shape],
) -> Tuple[mtf.Tensor, mtf.Tensor, mtf.Tensor, mtf.Tensor]:
  """A softmax classifier on BertModel's pooled output.

  Adds the variables output_weights [num_labels, hidden] and output_bias
  [num_labels]; the pooled output gets dropout 0.1 in training.

  Args:
    bert_config: the BertConfig.
    is_training: whether training (dropout).
    input_ids: int mtf.Tensor [batch, seq].
    input_mask: int mtf.Tensor [batch, seq].
    segment_ids: int mtf.Tensor [batch, seq].
    labels: int mtf.Tensor [batch] of label ids.
    num_labels_dim: the mtf.Dimension of the labels.
    layout: the mtf.LayoutRules.
    mesh_shape: the mtf.Shape.

  Returns:
    (loss (mean cross-entropy plus the mixture-of-experts loss),
    per_example_loss [batch], logits [batch, labels], probabilities [batch,
    labels]).
  """
  bert = model.BertModel(
    config=bert_config,
    is_training=is_training,
    input_ids=input_ids,
    input_mask=input_mask,
    token_type_ids=segment_ids,
    layout=layout,
    mesh_shape=mesh_shape,
  )
  pooled = bert.get_pooled_output()
  hidden_dim = pooled.shape[-1]
  mesh = input_ids.mesh
  output_weights = mtf.get_variable(
    mesh,
    "output_weights",
    shape=[num_labels_dim, hidden_dim],
    initializer=tf.compat.v1.truncated_normal_initializer(stddev=0.02),
  )
  output_bias = mtf.get_variable(
    mesh,
    "output_bias",
    shape=[num_labels_dim],
    initializer=tf.compat.v1.zeros_initializer(),
  )
  with tf.compat.v1.variable_scope("loss"):
    pooled = mtf.dropout(pooled, is_training, keep_prob=0.9)
    logits = (
      mtf.einsum([pooled, output_weights], reduced_dims=[hidden_dim])
      + output_bias
    )
    probabilities = mtf.softmax(logits, reduced_dim=num_labels_dim)
    per_example_loss = mtf.layers.softmax_cross_entropy_with_logits(
      logits, labels, vocab_dim=num_labels_dim
    )
    loss = mtf.reduce_mean(per_example_loss) + bert.get_extra_loss()
  return loss, per_example_loss, logits, probabilities


def classifier_model(
  bert_config, num_labels: int, mesh_shape, layout_rules
) -> Callable:
  """build(mesh, features, is_training) of classification, for a TaskModel.

  Outputs: "loss", "per_example_loss" [batch], "predictions" [batch] and
  "probabilities" [batch, num_labels].

  Args:
    bert_config: the BertConfig.
    num_labels: the number of labels.
    mesh_shape: the mtf.Shape (or string) of the mesh.
    layout_rules: the mtf.LayoutRules (or string).

  Returns:
    The build function.
  """
  mesh_shape = mtf.convert_to_shape(mesh_shape)
  layout_rules = mtf.convert_to_layout_rules(layout_rules)

  def build(mesh, features, is_training):
    batch_size, seq_length = features["input_ids"].shape.as_list()
    batch_dim = mtf.Dimension("batch", batch_size)
    seq_dim = mtf.Dimension("seq", seq_length)
    labels_dim = mtf.Dimension("num_labels", num_labels)

    def feature(name, dims):
      return estimator.import_feature(mesh, features[name], dims, name)

    loss, per_example_loss, logits, probabilities = create_model(
      bert_config,
      is_training,
      feature("input_ids", [batch_dim, seq_dim]),
      feature("input_mask", [batch_dim, seq_dim]),
      feature("segment_ids", [batch_dim, seq_dim]),
      feature("label_ids", [batch_dim]),
      labels_dim,
      layout_rules,
      mesh_shape,
    )
    return {
      "loss": mtf.anonymize(loss),
      "per_example_loss": mtf.anonymize(per_example_loss),
      "predictions": mtf.anonymize(mtf.argmax(logits, labels_dim)),
      "probabilities": mtf.anonymize(probabilities),
    }

  return build


def classification_metrics(
  batches: Iterable[Dict[str, np.ndarray]],
) -> Dict[str, float]:
  """eval_accuracy and eval_loss over real (not padding) examples.

  Args:
    batches: BertEstimator.predict_batches of a classifier_model task.

  Returns:
    {"eval_accuracy", "eval_loss"}.
  """
  right = loss = count = 0.0
  for batch in batches:
    weights = batch.get("is_real_example")
    labels = batch["label_ids"]
    if weights is None:
      weights = np.ones_like(labels)
    weights = weights.astype(np.float64)
    right += float(np.sum(weights * (batch["predictions"] == labels)))
    loss += float(np.sum(weights * batch["per_example_loss"]))
    count += float(np.sum(weights))
  count = max(count, 1e-12)
  return {"eval_accuracy": right / count, "eval_loss": loss / count}


def pad_to_batches(examples: list, batch_size: int) -> int:
  """Appends PaddingInputExamples until batch_size divides len(examples).

  Args:
    examples: the examples (changed in place).
    batch_size: the batch size.

  Returns:
    The number of real examples.
  """
  real = len(examples)
  while len(examples) % batch_size:
    examples.append(PaddingInputExample())
  return real
