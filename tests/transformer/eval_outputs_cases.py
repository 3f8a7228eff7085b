"""Evaluation runs of utils.eval_model whose written outputs are compared.

Each case calls `eval_model` of a utils module (the original package's or
this project's) on T5-style EvalDatasets and returns what the call left on
disk: the new files under the model directory with their text, and the
(step, tag, value) records of every event file. The original's records are
stored in data/original_eval_outputs.json (written by
data/make_original_eval_outputs.py with the original package);
eval_outputs_test.py runs the same cases with this project and compares.

Only TensorFlow and numpy are imported here, so the module runs with either
package. The "model" decodes each input by adding 1 to every id above EOS
(byte ids: "abc" -> "bcd"); the original is given a stub estimator whose
`predict` does that, this project a real Estimator whose predict_fn does it
on the mesh, so both go through their own decode path.
"""

import os

import numpy as np
import tensorflow as tf

BATCH_SIZE = 4
SPLIT = "validation"
CHECKPOINT_STEPS = (3, 5)
SEQUENCE_LENGTH = {"inputs": 12, "targets": 12}

# name: (inputs, targets, has metric_fns). 3 + 6 examples: the combined
# input has 9 rows, padded to 12.
TASKS = {
  "shout": (["abc", "hello", "x"], ["BCD", "hello", "Y"], True),
  "echo": (
    ["mesh", "tf", "zz top", "q", "two\nlines", "h\u00e9"],
    ["nftb", "ug", "{{!upq", "r", "uxp\nmjoft", "i\u00ea"],
    True,
  ),
  "quiet": (["unused"], ["unused"], False),
}


class CharVocabulary:
  """Byte ids + 3 (0 padding, 1 EOS); decoding stops at EOS."""

  vocab_size = 259
  eos_id = 1
  unk_id = 2

  def encode(self, text):
    return [b + 3 for b in text.encode("utf-8")]

  def decode(self, ids):
    out = []
    for i in ids:
      i = int(i)
      if i == 1:
        break
      if i >= 3:
        out.append(i - 3)
    return bytes(out).decode("utf-8", "replace")


VOCABULARY = CharVocabulary()


def shifted(ids):
  """The stub model's decode of one row of input ids."""
  ids = np.asarray(ids)
  return np.where(ids > 1, ids + 1, ids)


def _dataset_fn(name):
  inputs, targets, _ = TASKS[name]

  def dataset_fn(sequence_length=None):
    def examples():
      for x, y in zip(inputs, targets):
        yield {
          "inputs": np.array(VOCABULARY.encode(x) + [1], np.int32),
          "targets": np.array(VOCABULARY.encode(y) + [1], np.int32),
          "inputs_pretokenized": x,
          "targets_pretokenized": y,
        }

    ds = tf.data.Dataset.from_generator(
      examples,
      output_signature={
        "inputs": tf.TensorSpec([None], tf.int32),
        "targets": tf.TensorSpec([None], tf.int32),
        "inputs_pretokenized": tf.TensorSpec([], tf.string),
        "targets_pretokenized": tf.TensorSpec([], tf.string),
      },
    )
    if sequence_length is None:
      return ds

    def pad(ex):
      ex = dict(ex)
      for key in ("inputs", "targets"):
        length = sequence_length[key]
        v = ex[key][:length]
        ex[key] = tf.pad(v, [[0, length - tf.shape(v)[0]]])
        ex[key].set_shape([length])
      return ex

    return ds.map(pad)

  return dataset_fn


def postprocess(value, example=None, is_target=False):
  """Marks targets, lower-cases, and appends the example's input length."""
  return "%s%s/%d" % (
    "T:" if is_target else "P:",
    str(value).lower(),
    len(example["inputs"]),
  )


def exact_match(targets, predictions):
  same = [t[1:] == p[1:] for t, p in zip(targets, predictions)]
  return {"exact_match": 100.0 * float(np.mean(same))}


def lengths(targets, predictions):
  return {
    "mean_target_length": float(np.mean([len(t) for t in targets])),
    "num_predictions": float(len(predictions)),
  }


def precomputed_summary(targets, predictions):
  """A metric_fn returning a ready tf.Summary (written as it is)."""
  del targets
  summary = tf.compat.v1.Summary()
  summary.value.add(tag="precomputed/count", simple_value=len(predictions))
  return summary


def eval_dataset_fn_for(dataset_module, names=("shout", "echo", "quiet")):
  """An eval_dataset_fn returning EvalDatasets of `names`; records calls."""
  calls = []

  def eval_dataset_fn(sequence_length, vocabulary, dataset_split):
    calls.append(
      {"sequence_length": sequence_length, "dataset_split": dataset_split}
    )
    del vocabulary
    result = []
    for name in names:
      has_metrics = TASKS[name][2]
      result.append(
        dataset_module.EvalDataset(
          name,
          _dataset_fn(name),
          postprocess,
          [exact_match, lengths, precomputed_summary] if has_metrics else [],
        )
      )
    return result

  eval_dataset_fn.calls = calls
  return eval_dataset_fn


def dataset_rows(dataset):
  """The elements of a dataset as numpy dicts, eagerly or in a session."""
  if tf.executing_eagerly():
    return list(dataset.as_numpy_iterator())
  element = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
  rows = []
  with tf.compat.v1.Session() as session:
    while True:
      try:
        rows.append(session.run(element))
      except tf.errors.OutOfRangeError:
        return rows


def make_score_fn(calls):
  """A score_with_estimator_fn: minus the number of target tokens per row."""

  def score_fn(
    estimator, input_fn, eval_checkpoint_step, model_dir, vocabulary, **kw
  ):
    del estimator, model_dir, vocabulary
    calls.append({"step": int(eval_checkpoint_step), **kw})
    scores = []
    for batch in dataset_rows(input_fn({"batch_size": BATCH_SIZE})):
      scores.extend(-float(np.sum(t > 0)) for t in batch["targets"])
    return scores[: kw.get("num_examples")], None

  return score_fn


def written_outputs(model_dir, before):
  """{relative path: text or [[step, tag, kind, value], ...]} of new files.

  Event files (their names hold a time and host) are keyed as
  "<dir>/events"; their records sorted; simple values as float32.
  """
  out = {}
  for root, _, files in os.walk(model_dir):
    for name in files:
      path = os.path.join(root, name)
      rel = os.path.relpath(path, model_dir)
      if rel in before:
        continue
      if ".tfevents." in name:
        key = os.path.join(os.path.dirname(rel), "events")
        out.setdefault(key, []).extend(_event_records(path))
        out[key].sort()
      else:
        with open(path, encoding="utf-8") as f:
          out[rel] = f.read()
  return out


def _event_records(path):
  records = []
  for event in tf.compat.v1.train.summary_iterator(path):
    for value in event.summary.value:
      if value.HasField("simple_value"):
        records.append(
          [event.step, value.tag, "simple_value", float(value.simple_value)]
        )
      else:
        array = tf.make_ndarray(value.tensor)
        if array.dtype.kind in "SO":
          shown = np.vectorize(lambda b: b.decode("utf-8"))(array).tolist()
        else:
          shown = array.tolist()
        records.append([event.step, value.tag, "tensor", shown])
  return records


def existing_files(model_dir):
  return {
    os.path.relpath(os.path.join(root, name), model_dir)
    for root, _, files in os.walk(model_dir)
    for name in files
  }


# ----------------------------------------------------------------------------
# The cases: each is (name, fn(utils, dataset_module, estimator_fn,
# model_dir) -> {"outputs", ...}); estimator_fn(sequence_length) returns the
# estimator (the original's stub or a real one).


def _run(utils, model_dir, estimator, eval_dataset_fn, *args, **kwargs):
  before = existing_files(model_dir)
  returned = utils.eval_model(
    estimator,
    VOCABULARY,
    kwargs.pop("sequence_length", SEQUENCE_LENGTH),
    BATCH_SIZE,
    SPLIT,
    model_dir,
    eval_dataset_fn,
    *args,
    **kwargs,
  )
  return {
    "outputs": written_outputs(model_dir, before),
    "returned_none": returned is None,
    "dataset_fn_calls": eval_dataset_fn.calls,
  }


def decode_case(utils, dataset_module, estimator_fn, model_dir):
  """Two checkpoints, default summary dir, examples written."""
  return _run(
    utils,
    model_dir,
    estimator_fn(SEQUENCE_LENGTH),
    eval_dataset_fn_for(dataset_module),
    None,
    list(CHECKPOINT_STEPS),
  )


def score_case(utils, dataset_module, estimator_fn, model_dir):
  """eval_with_score, sequence_length None (a callable estimator), suffix."""
  built = []
  score_calls = []

  def estimator(sequence_length=None):
    built.append(dict(sequence_length))
    return estimator_fn(sequence_length)

  result = _run(
    utils,
    model_dir,
    estimator,
    eval_dataset_fn_for(dataset_module),
    None,
    CHECKPOINT_STEPS[-1],
    sequence_length=None,
    eval_with_score=True,
    eval_dir_suffix="scored",
    score_with_estimator_fn=make_score_fn(score_calls),
  )
  result.update(estimator_built_with=built, score_calls=score_calls)
  return result


def summary_dir_case(utils, dataset_module, estimator_fn, model_dir):
  """An explicit summary dir and suffix, no example files, one dataset."""
  return _run(
    utils,
    model_dir,
    estimator_fn(SEQUENCE_LENGTH),
    eval_dataset_fn_for(dataset_module, names=("quiet", "shout")),
    os.path.join(model_dir, "my_summaries"),
    CHECKPOINT_STEPS[0],
    output_eval_examples=False,
    eval_dir_suffix="sfx",
  )


def no_metrics_case(utils, dataset_module, estimator_fn, model_dir):
  """Only datasets without metric_fns: nothing is evaluated or written."""
  return _run(
    utils,
    model_dir,
    estimator_fn(SEQUENCE_LENGTH),
    eval_dataset_fn_for(dataset_module, names=("quiet",)),
    None,
    CHECKPOINT_STEPS[0],
  )


CASES = {
  "decode": decode_case,
  "score": score_case,
  "summary_dir": summary_dir_case,
  "no_metrics": no_metrics_case,
}
