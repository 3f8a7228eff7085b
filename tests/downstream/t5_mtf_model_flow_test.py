"""T5's MtfModel flow: transformer.utils called exactly as MtfModel calls it.

T5 (t5/models/mtf_model.py) drives mesh_tensorflow.transformer.utils through
a fixed sequence of calls: tpu_mesh_shape / compute_batch_size in its
constructor; gin bindings of utils.get_variable_dtype and get_estimator with
its full keyword set in `estimator`; train_model with positional arguments in
`train`; infer_model after binding utils.decode_from_file's files in
`predict`; score_from_strings with a save_scores partial in `score`;
score_with_estimator and decode with positional arguments in `eval`;
export_model in `export`. `MtfModelFlow` below makes those calls the same way
(positions, keywords, gin selectors) on a tiny gin-configured Bitransformer
with the byte vocabulary; the tests check what each returns or writes
against the others and against the estimator's own outputs.
"""

import functools
import os
import shutil

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import optimize
from mesh_tensorflow.transformer import dataset as transformer_dataset
from mesh_tensorflow.transformer import learning_rate_schedules
from mesh_tensorflow.transformer import utils as mtf_utils
from mesh_tensorflow.transformer import vocabulary as vocabulary_lib
from tests.transformer import driver_test_util as dtu

pytestmark = pytest.mark.slow

BYTES = vocabulary_lib.ByteVocabulary()
LENGTH = {"inputs": 8, "targets": 8}
WORDS = ["abc", "hello", "x", "mesh tf", "zz", "revers", "q", "ok"]


def _examples(split=None):
  """The toy task: every word, inputs and targets equal (byte ids + EOS)."""
  del split
  ids = mtf_utils.encode_inputs(WORDS, BYTES, "bitransformer", len(WORDS), 8)
  return tf.data.Dataset.from_tensor_slices({"inputs": ids, "targets": ids})


def parse_operative_config(model_dir):
  """What MtfModel does before eval, predict, score and export."""
  with gin.unlock_config():
    gin.parse_config_file(os.path.join(model_dir, "operative_config.gin"))


def train_dataset_fn(sequence_length, vocabulary, dataset_split):
  """A dataset_fn with the arguments train_model passes (by keyword)."""
  assert sequence_length == LENGTH and vocabulary is BYTES
  return _examples(dataset_split)


class MtfModelFlow:
  """The transformer.utils calls of T5's MtfModel, in its order and form."""

  def __init__(self, model_dir, batch_size, mesh_shape=None, layout_rules=""):
    tpu = None
    mesh_shape = mesh_shape or (
      mtf_utils.tpu_mesh_shape("v2-8", 1) if tpu else ""
    )
    self._learning_rate_schedule = functools.partial(
      learning_rate_schedules.constant_learning_rate,
      learning_rate=0.01,
      total_train_steps=100,
    )
    self._optimizer = optimize.AdafactorOptimizer
    self._sequence_length = LENGTH
    self._model_dir = model_dir
    self._model_type = "bitransformer"
    self._layout_rules = mtf.convert_to_layout_rules(layout_rules)
    self._mesh_shape = mtf.convert_to_shape(mesh_shape)
    if isinstance(batch_size, int):
      self.batch_size = batch_size
    else:
      self.batch_size = mtf_utils.compute_batch_size(
        self._sequence_length, self._mesh_shape, self._layout_rules, batch_size
      )
    self._gin_bindings = None

  def estimator(
    self,
    vocabulary,
    init_checkpoint=None,
    disable_tpu=False,
    score_in_predict_mode=False,
    sequence_length=None,
  ):
    with gin.unlock_config():
      gin.bind_parameter("utils.get_variable_dtype.slice_dtype", "float32")
      gin.bind_parameter("utils.get_variable_dtype.activation_dtype", "float32")
    with gin.unlock_config():
      gin.parse_config(self._gin_bindings)
    return mtf_utils.get_estimator(
      model_type=self._model_type,
      vocabulary=vocabulary,
      layout_rules=self._layout_rules,
      mesh_shape=mtf.Shape([]) if disable_tpu else self._mesh_shape,
      mesh_devices=None,
      model_dir=self._model_dir,
      batch_size=self.batch_size,
      sequence_length=sequence_length or self._sequence_length,
      autostack=True,
      learning_rate_schedule=self._learning_rate_schedule,
      keep_checkpoint_max=None,
      save_checkpoints_steps=5000,
      optimizer=self._optimizer,
      predict_fn=None,
      variable_filter=None,
      ensemble_inputs=None,
      use_tpu=None,
      tpu_job_name=None,
      iterations_per_loop=100,
      cluster=None,
      init_checkpoint=init_checkpoint,
      score_in_predict_mode=score_in_predict_mode,
    )

  def train(self, steps, init_checkpoint=None):
    mtf_utils.train_model(
      self.estimator(BYTES, init_checkpoint),
      BYTES,
      self._sequence_length,
      self.batch_size,
      train_dataset_fn,
      steps,
      None,
      dataset_split="train",
    )

  def _eval_input_fn(self, params):
    del params
    ds = _examples().batch(self.batch_size, drop_remainder=False)
    return transformer_dataset.trim_and_pad_dataset(ds, length=self.batch_size)

  def eval_predictions(self, checkpoint_step, eval_with_score=False):
    estimator = self.estimator(
      BYTES,
      score_in_predict_mode=eval_with_score,
      sequence_length=self._sequence_length,
    )
    checkpoint_path = os.path.join(
      self._model_dir, "model.ckpt-{}".format(checkpoint_step)
    )
    if eval_with_score:
      # Scoring returns (scores, targets): its results hold no inputs.
      outputs, _ = mtf_utils.score_with_estimator(
        estimator, self._eval_input_fn, checkpoint_step, self._model_dir, BYTES
      )
      return outputs
    return [
      tf.compat.as_text(d)
      for d in mtf_utils.decode(
        estimator, self._eval_input_fn, BYTES, checkpoint_path
      )
    ]

  def predict(self, input_file, output_file, checkpoint_steps):
    with gin.unlock_config():
      gin.bind_parameter("Bitransformer.decode.beam_size", 1)
      gin.bind_parameter("Bitransformer.decode.temperature", 0.0)
      gin.bind_parameter("Bitransformer.decode.sampling_keep_top_k", -1)
      gin.bind_parameter("utils.decode_from_file.input_filename", input_file)
      gin.bind_parameter("utils.decode_from_file.output_filename", output_file)
    mtf_utils.infer_model(
      self.estimator(BYTES),
      BYTES,
      self._sequence_length,
      self.batch_size,
      self._model_type,
      self._model_dir,
      checkpoint_steps,
    )

  def score(self, inputs, targets, scores_file, checkpoint_steps):
    estimator = self.estimator(BYTES, score_in_predict_mode=True)
    score_postprocess_fn = functools.partial(
      mtf_utils.save_scores, scores_filename=scores_file
    )
    return mtf_utils.score_from_strings(
      estimator=estimator,
      vocabulary=BYTES,
      model_type=self._model_type,
      batch_size=self.batch_size,
      sequence_length=self._sequence_length,
      model_dir=self._model_dir,
      eval_checkpoint_step=checkpoint_steps,
      inputs=inputs,
      targets=targets,
      score_postprocess_fn=score_postprocess_fn,
    )

  def export(self, export_dir, checkpoint_step, eval_with_score=False):
    estimator = self.estimator(
      BYTES, disable_tpu=True, score_in_predict_mode=eval_with_score
    )
    return mtf_utils.export_model(
      estimator,
      export_dir,
      BYTES,
      self._sequence_length,
      self._model_type,
      batch_size=self.batch_size,
      checkpoint_path=os.path.join(
        self._model_dir, "model.ckpt-" + str(checkpoint_step)
      ),
      eval_with_score=eval_with_score,
    )


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """Two training steps of MtfModelFlow on the 2x2 mesh, batch from tokens."""
  model_dir = str(tmp_path_factory.mktemp("t5flow"))
  dtu.tiny_gin()
  model = MtfModelFlow(
    model_dir,
    ("tokens_per_batch", 64),
    "rows:2;cols:2",
    "batch:rows;heads:cols;d_ff:cols;vocab:cols",
  )
  model.train(2)
  yield model
  gin.clear_config()


def test_batch_size_from_tokens_per_batch(trained):
  assert trained.batch_size == 8  # 64 tokens / 8 per example


def test_training_writes_the_checkpoint_and_operative_config(trained):
  assert tf.train.latest_checkpoint(trained._model_dir).endswith("-2")
  assert os.path.exists(
    os.path.join(trained._model_dir, "operative_config.gin")
  )


def test_decode_and_predict_agree(trained, tmp_path):
  decodes = trained.eval_predictions(2)
  # Predicting starts from the operative config alone, as MtfModel does.
  gin.clear_config()
  parse_operative_config(trained._model_dir)
  assert len(decodes) == len(WORDS)
  input_file = tmp_path / "inputs.txt"
  input_file.write_text("\n".join(WORDS) + "\n")
  output_file = str(tmp_path / "predictions")
  trained.predict(str(input_file), output_file, 2)
  assert mtf_utils.get_inputs_from_file(output_file + "-2") == decodes


def test_eval_scores_equal_string_scores_and_files(trained, tmp_path):
  eval_scores = trained.eval_predictions(2, eval_with_score=True)
  scores_file = str(tmp_path / "scores")
  scores, targets = trained.score(WORDS, WORDS, scores_file, 2)
  np.testing.assert_allclose(eval_scores, scores, rtol=1e-5, atol=1e-5)
  assert list(targets) == WORDS
  assert all(s < 0 for s in scores)
  written = [float(x) for x in open(scores_file + ".scores").read().split()]
  np.testing.assert_allclose(written, scores, rtol=1e-5, atol=1e-5)


def test_export_serves_the_same_decodes(trained, tmp_path):
  path = trained.export(str(tmp_path / "export"), 2)
  if isinstance(path, bytes):
    path = path.decode()
  loaded = tf.saved_model.load(path)
  serve = loaded.signatures["serving_default"]
  out = serve(tf.constant(WORDS))
  (outputs,) = [v for k, v in out.items() if "output" in k]
  got = [tf.compat.as_text(x) for x in outputs.numpy()]
  assert got == trained.eval_predictions(2)


def test_finetune_continues_the_pretrained_run(trained, tmp_path):
  """MtfModel.finetune: train to step + 1 from init_checkpoint elsewhere.

  The global step and the optimizer slots come from the checkpoint too, so
  this equals continuing the pretrained run itself for one step.
  """
  pretrained = tf.train.latest_checkpoint(trained._model_dir)
  layout = "batch:rows;heads:cols;d_ff:cols;vocab:cols"
  finetuned = MtfModelFlow(str(tmp_path / "ft"), 8, "rows:2;cols:2", layout)
  finetuned.train(2 + 1, init_checkpoint=pretrained)
  continued_dir = str(tmp_path / "continued")
  shutil.copytree(trained._model_dir, continued_dir)
  continued = MtfModelFlow(continued_dir, 8, "rows:2;cols:2", layout)
  continued.train(2 + 1)
  want = tf.train.load_checkpoint(os.path.join(continued_dir, "model.ckpt-3"))
  got = tf.train.load_checkpoint(
    os.path.join(finetuned._model_dir, "model.ckpt-3")
  )
  before = tf.train.load_checkpoint(pretrained)
  names = [n for n, _ in tf.train.list_variables(pretrained)]
  assert "shared/embedding" in names
  for name in names:
    np.testing.assert_allclose(
      got.get_tensor(name), want.get_tensor(name), rtol=1e-6, err_msg=name
    )
  assert not np.array_equal(
    got.get_tensor("shared/embedding"), before.get_tensor("shared/embedding")
  )


def _t5_eval_dataset_fn(sequence_length, vocabulary, dataset_split):
  """T5's mesh_eval_dataset_fn form: one EvalDataset per task, examples
  with pretokenized texts, a dataset_fn taking sequence_length.
  """
  del vocabulary, dataset_split

  def dataset_fn(sequence_length=sequence_length):
    ds = _examples().map(
      lambda ex: dict(
        ex,
        inputs_pretokenized=tf.strings.reduce_join(
          tf.strings.unicode_encode(
            tf.boolean_mask(ex["inputs"] - 3, ex["inputs"] > 2), "UTF-8"
          )
        ),
      )
    )
    return ds.map(
      lambda ex: dict(ex, targets_pretokenized=ex["inputs_pretokenized"])
    )

  def accuracy(targets, predictions):
    return {
      "accuracy": 100.0
      * np.mean([t == p for t, p in zip(targets, predictions)])
    }

  return [
    transformer_dataset.EvalDataset(
      "words",
      dataset_fn,
      lambda s, example=None, is_target=False: s,
      [accuracy],
    ),
    transformer_dataset.EvalDataset("no_metrics", dataset_fn, None, []),
  ]


def test_eval_model_as_mtf_model_eval_calls_it(trained, tmp_path):
  """MtfModel.eval: eval_model with a callable estimator, its summary_dir."""
  summary_dir = str(tmp_path / "summaries")
  built = []

  def estimator_fn(sequence_length=None):
    built.append(sequence_length)
    return trained.estimator(BYTES, sequence_length=sequence_length)

  mtf_utils.eval_model(
    estimator_fn,
    BYTES,
    None,  # the lengths of the longest example
    trained.batch_size,
    "validation",
    trained._model_dir,
    _t5_eval_dataset_fn,
    summary_dir,
    2,
  )
  # WORDS are at most 7 bytes: 8 ids with EOS.
  assert built == [{"inputs": 8, "targets": 8}]
  decodes = trained.eval_predictions(2)

  def read(name):
    return mtf_utils.get_inputs_from_file(os.path.join(summary_dir, name))

  assert read("words_2_predictions") == decodes
  assert read("words_targets") == WORDS
  assert read("words_inputs") == ["b%r" % w for w in WORDS]
  assert not tf.io.gfile.glob(os.path.join(summary_dir, "no_metrics*"))
  (events,) = tf.io.gfile.glob(os.path.join(summary_dir, "events.*"))
  values = [
    (e.step, v.tag, v.simple_value)
    for e in tf.compat.v1.train.summary_iterator(events)
    for v in e.summary.value
  ]
  accuracy = 100.0 * np.mean([d == w for d, w in zip(decodes, WORDS)])
  assert values == [(2, "eval/words/accuracy", pytest.approx(accuracy))]
