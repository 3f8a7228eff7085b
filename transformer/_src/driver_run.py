"""utils.run and the driver entry points (train / eval / infer / score).

The gin-configurable functions here keep the original utils.py names,
parameters and gin module ("mesh_tensorflow.transformer.utils"); their
`estimator` argument is a driver.Estimator instead of a TPUEstimator.
transformer/utils.py re-exports them.
"""

from __future__ import annotations

import functools
import os
from typing import List, Optional, Sequence

from absl import flags
from absl import logging
import gin
import numpy as np
import tensorflow as tf

from transformer import learning_rate_schedules
from transformer import vocabulary as vocabulary_lib
from transformer._src import driver
from transformer._src import driver_eval
# utils imports this module at its end, after defining auto_train_steps.
from transformer.utils import auto_train_steps  # pylint: disable=g-bad-import-order
from transformer.utils import get_step_from_checkpoint_path  # pylint: disable=g-bad-import-order

_GIN_MODULE = "mesh_tensorflow.transformer.utils"

if "gin_file" not in flags.FLAGS:
  flags.DEFINE_multi_string(
      "gin_file", None, "gin files (searched under --gin_location_prefix and "
      "the package's configs/); configs/defaults.gin is always parsed first")
  flags.DEFINE_multi_string(
      "gin_param", None, "gin bindings, e.g. 'utils.run.train_steps = 100'")
  flags.DEFINE_list("gin_location_prefix", [],
                    "directories to search gin files in")

try:  # the demo's vocabulary in gin files: @vocabulary.ByteVocabulary()
  gin.external_configurable(vocabulary_lib.ByteVocabulary,
                            module="mesh_tensorflow.transformer.vocabulary")
except ValueError:  # already registered
  pass


def config_dir() -> str:
  """The directory holding defaults.gin and the gin tree."""
  package_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  for candidate in (os.path.join(package_dir, "gin"),
                    os.path.join(package_dir, "configs"),
                    os.path.join(os.path.dirname(package_dir), "configs")):
    if os.path.exists(os.path.join(candidate, "defaults.gin")):
      return candidate
  raise FileNotFoundError("cannot find defaults.gin near %s" % package_dir)


def parse_gin_defaults_and_flags(skip_unknown=False, finalize_config=True,
                                 *, gin_files: Optional[Sequence[str]] = None,
                                 gin_params: Optional[Sequence[str]] = None,
                                 gin_location_prefix=None) -> None:
  """Parses configs/defaults.gin, then --gin_file files, then --gin_param.

  Files are looked up as given, then under each gin_location_prefix and the
  package's config directory. Missing files and unknown bindings raise with
  the culprit named (gin's own errors, which name file and binding).

  Raises:
    FileNotFoundError: a gin file that exists nowhere on the search path.
  """
  if gin_files is None:
    gin_files = flags.FLAGS.gin_file if flags.FLAGS.is_parsed() else None
  if gin_params is None:
    gin_params = flags.FLAGS.gin_param if flags.FLAGS.is_parsed() else None
  if gin_location_prefix is None and flags.FLAGS.is_parsed():
    gin_location_prefix = flags.FLAGS.gin_location_prefix
  prefixes = list(gin_location_prefix or []) + [config_dir()]
  for prefix in prefixes:
    gin.add_config_file_search_path(prefix)
  files = [os.path.join(config_dir(), "defaults.gin")]
  for name in gin_files or []:
    files.append(_find_gin_file(name, prefixes))
  gin.parse_config_files_and_bindings(
      files, list(gin_params or []), skip_unknown=skip_unknown,
      finalize_config=finalize_config)


def _find_gin_file(name: str, prefixes: Sequence[str]) -> str:
  candidates = [name] + [os.path.join(p, name) for p in prefixes]
  if not name.endswith(".gin"):
    candidates += [c + ".gin" for c in candidates]
  for c in candidates:
    if tf.io.gfile.exists(c):
      return c
  raise FileNotFoundError("gin file %r not found (looked in: %s)"
                          % (name, ", ".join(["."] + list(prefixes))))


def get_estimator(model_type, vocabulary, mesh_shape, layout_rules,
                  model_dir, batch_size, sequence_length, autostack,
                  learning_rate_schedule, keep_checkpoint_max,
                  save_checkpoints_steps, optimizer, predict_fn,
                  variable_filter, ensemble_inputs, use_tpu, tpu_job_name,
                  iterations_per_loop, cluster, init_checkpoint=None,
                  mesh_devices=None, score_in_predict_mode=False,
                  *, log_every_steps: int = 100) -> driver.Estimator:
  """A driver.Estimator for the model (the TPUEstimator's replacement).

  use_tpu / tpu_job_name / cluster / iterations_per_loop are accepted for
  the original's signature; TPUs are not driven from here.
  """
  del predict_fn, ensemble_inputs, tpu_job_name, cluster, score_in_predict_mode
  del iterations_per_loop
  if use_tpu:
    logging.warning("use_tpu is ignored: the TF2 driver runs on the local "
                    "devices (PlacementMeshImpl)")
  from transformer import utils  # pylint: disable=g-import-not-at-top
  if vocabulary is None:
    raise ValueError("run.vocabulary is required (e.g. "
                     "run.vocabulary = @vocabulary.ByteVocabulary())")
  model = utils.build_model(
      model_type=model_type,
      input_vocab_size=utils.inputs_vocabulary(vocabulary).vocab_size,
      output_vocab_size=utils.targets_vocabulary(vocabulary).vocab_size,
      layout_rules=layout_rules, mesh_shape=mesh_shape)
  return driver.Estimator(
      model_type, model, vocabulary, model_dir, mesh_shape, layout_rules,
      batch_size, sequence_length, autostack=autostack,
      keep_checkpoint_max=keep_checkpoint_max,
      save_checkpoints_steps=save_checkpoints_steps,
      learning_rate_schedule=learning_rate_schedule, optimizer=optimizer,
      variable_filter=variable_filter, init_checkpoint=init_checkpoint,
      mesh_devices=mesh_devices, variable_dtype=utils.get_variable_dtype(),
      log_every_steps=log_every_steps)


def _filter_features(ex):
  return {k: v for k, v in ex.items() if k in driver.MODEL_FEATURES}


def _pad_to_length(ex, sequence_length):
  out = {}
  for k, v in ex.items():
    length = driver._feature_length(sequence_length, k)  # pylint: disable=protected-access
    v = tf.cast(v[:length], tf.int32)
    out[k] = tf.pad(v, [[0, length - tf.shape(v)[0]]])
    out[k].set_shape([length])
  return out


def train_model(estimator, vocabulary, sequence_length, batch_size,
                train_dataset_fn, train_steps, ensemble_inputs,
                dataset_split="train", skip_seen_data=False,
                seen_data_init_step=0, checkpoint_input_pipeline=False):
  """Trains until the global step is train_steps (resuming from model_dir).

  train_dataset_fn(sequence_length=, vocabulary=, dataset_split=) returns
  examples (dicts of int features, packed or padded to sequence_length).
  """
  del checkpoint_input_pipeline
  if ensemble_inputs:
    raise ValueError("ensemble_inputs=%r is not supported by the TF2 driver"
                     % (ensemble_inputs,))

  def input_fn():
    dataset = train_dataset_fn(sequence_length=sequence_length,
                               vocabulary=vocabulary,
                               dataset_split=dataset_split)
    dataset = dataset.map(_filter_features)
    dataset = dataset.map(functools.partial(
        _pad_to_length, sequence_length=estimator.sequence_length))
    dataset = dataset.repeat().batch(batch_size, drop_remainder=True)
    return dataset.prefetch(tf.data.AUTOTUNE)

  return estimator.train(input_fn, train_steps,
                         skip_seen_data=skip_seen_data,
                         seen_data_init_step=seen_data_init_step)


def _eval_datasets(eval_dataset_fn, sequence_length, vocabulary,
                   dataset_split):
  """[(name, dataset of examples)] from eval_dataset_fn's result."""
  result = eval_dataset_fn(sequence_length=sequence_length,
                           vocabulary=vocabulary, dataset_split=dataset_split)
  if isinstance(result, tf.data.Dataset):
    return [("eval", result)]
  out = []
  for item in result:
    if isinstance(item, tf.data.Dataset):
      out.append(("eval_%d" % len(out), item))
    else:
      out.append((item.name, item.dataset_fn()))
  return out


def evaluate_dataset(estimator, dataset, sequence_length, batch_size,
                     checkpoint_path=None, max_batches=None):
  """Teacher-forced metrics of examples in `dataset` (see driver_eval)."""
  dataset = dataset.map(_filter_features).map(functools.partial(
      _pad_to_length, sequence_length=sequence_length))
  dataset = dataset.batch(batch_size)
  return driver_eval.evaluate(estimator, dataset, checkpoint_path,
                              max_batches)


def eval_model(estimator, vocabulary, sequence_length, batch_size,
               dataset_split, model_dir, eval_dataset_fn, eval_summary_dir,
               eval_checkpoint_step, eval_with_score=False,
               output_eval_examples=True):
  """Evaluates checkpoints on every eval dataset; prints and summarises.

  Returns {dataset name: {metric: value}} for the last checkpoint.
  """
  del eval_with_score, output_eval_examples
  if eval_dataset_fn is None:
    raise ValueError("mode 'eval' needs run.eval_dataset_fn")
  datasets = _eval_datasets(eval_dataset_fn, sequence_length, vocabulary,
                            dataset_split)
  checkpoints = get_checkpoint_iterator(eval_checkpoint_step, model_dir)
  results = {}
  for path in checkpoints:
    step = get_step_from_checkpoint_path(path)
    for name, dataset in datasets:
      metrics = evaluate_dataset(estimator, dataset,
                                 estimator.sequence_length, batch_size, path)
      results[name] = metrics
      line = "eval %s (%s, step %d): %s" % (
          name, dataset_split, step, "  ".join(
              "%s %.4f" % kv for kv in sorted(metrics.items())))
      logging.info("%s", line)
      print(line, flush=True)
      summary_dir = eval_summary_dir or os.path.join(
          model_dir, "%s_%s" % (name, dataset_split))
      writer = tf.summary.create_file_writer(summary_dir)
      driver.write_scalars(writer, step, {
          "eval/" + k: v for k, v in metrics.items()})
      writer.close()
  return results


@gin.configurable(module=_GIN_MODULE)
def get_checkpoint_iterator(checkpoint_step, model_dir, skip_until=0,
                            stop_after=None, find_closest=True):
  """Checkpoint paths to evaluate: None -> the latest; "all" -> every one
  (after skip_until, up to stop_after); an int / list -> those steps (the
  closest existing one if find_closest).

  Unlike the original, None does not wait for future checkpoints.
  """
  index_files = tf.io.gfile.glob(os.path.join(model_dir,
                                              "model.ckpt-*.index"))
  steps = sorted(get_step_from_checkpoint_path(f) for f in index_files)
  if not steps:
    raise ValueError("no checkpoints (model.ckpt-*.index) in %r" % model_dir)
  path = lambda s: os.path.join(model_dir, "model.ckpt-%d" % s)
  if checkpoint_step is None:
    latest = driver._checkpoints().latest_checkpoint(model_dir)  # pylint: disable=protected-access
    return [latest or path(steps[-1])]
  if checkpoint_step == "all":
    return [path(s) for s in steps if s >= skip_until and
            (stop_after is None or s <= stop_after)]
  wanted = checkpoint_step if isinstance(checkpoint_step,
                                         (list, tuple)) else [checkpoint_step]
  out = []
  for w in wanted:
    w = int(w)
    if w in steps:
      out.append(path(w))
    elif find_closest:
      out.append(path(min(steps, key=lambda s: abs(s - w))))
    else:
      raise ValueError("no checkpoint for step %d in %r (have %s)"
                       % (w, model_dir, steps))
  return out


def get_inputs_from_file(input_filename, ignore_comments=False):
  """Lines of input_filename (no trailing newline); '#' lines dropped if
  ignore_comments."""
  with tf.io.gfile.GFile(input_filename, "r") as f:
    lines = f.read().split("\n")
  if lines and not lines[-1]:
    lines.pop()
  if ignore_comments:
    lines = [l for l in lines if not l.startswith("#")]
  return lines


def write_lines_to_file(lines, filename):
  """Writes lines (one per line) to filename, creating its directory."""
  directory = os.path.dirname(filename)
  if directory:
    tf.io.gfile.makedirs(directory)
  with tf.io.gfile.GFile(filename, "w") as f:
    for line in lines:
      f.write("%s\n" % line)


def _targets_vocab(vocabulary):
  return vocabulary[1] if isinstance(vocabulary, tuple) else vocabulary


def _inputs_vocab(vocabulary):
  return vocabulary[0] if isinstance(vocabulary, tuple) else vocabulary


def decode_strings(estimator, strings: Sequence[str], vocabulary=None,
                   checkpoint_path=None, **decode_kwargs) -> List[str]:
  """Decoded output strings for input strings (greedy unless configured)."""
  vocabulary = vocabulary or estimator.vocabulary
  length = estimator.sequence_length["inputs"]
  ids = driver_eval.encode_strings(_inputs_vocab(vocabulary), strings, length)
  outputs = driver_eval.decode_ids(estimator, ids,
                                   checkpoint_path=checkpoint_path,
                                   **decode_kwargs)
  return [_targets_vocab(vocabulary).decode([int(i) for i in row])
          for row in outputs]


@gin.configurable(module=_GIN_MODULE)
def decode(estimator, input_fn, vocabulary, checkpoint_path=None):
  """Decoded strings for input_fn() -> dataset of {"inputs": ids} rows."""
  rows = [ex["inputs"] for ex in input_fn().as_numpy_iterator()]
  if not rows:
    return []
  length = estimator.sequence_length["inputs"]
  ids = np.zeros([len(rows), length], np.int32)
  for i, r in enumerate(rows):
    ids[i, :min(len(r), length)] = r[:length]
  outputs = driver_eval.decode_ids(estimator, ids,
                                   checkpoint_path=checkpoint_path)
  return [_targets_vocab(vocabulary).decode([int(i) for i in row])
          for row in outputs]


@gin.configurable(module=_GIN_MODULE)
def decode_from_file(estimator, vocabulary, model_type, batch_size,
                     sequence_length, checkpoint_path=None,
                     input_filename=gin.REQUIRED,
                     output_filename=gin.REQUIRED, eos_id=1, repeats=1):
  """Decodes each line of input_filename into a line of output_filename
  (`<output_filename>-<step>` as the original wrote)."""
  del model_type, batch_size, sequence_length, eos_id
  for name, value in (("input_filename", input_filename),
                      ("output_filename", output_filename)):
    if value is gin.REQUIRED:
      raise ValueError("decode_from_file: parameter %r is required" % name)
  inputs = get_inputs_from_file(input_filename)
  inputs = [s for s in inputs for _ in range(repeats)]
  decodes = decode_strings(estimator, inputs, vocabulary, checkpoint_path)
  if checkpoint_path is None:
    checkpoint_path = estimator.latest_checkpoint()
  step = get_step_from_checkpoint_path(checkpoint_path)
  out = "%s-%d" % (output_filename, step)
  write_lines_to_file(decodes, out)
  logging.info("decode_from_file: %d lines -> %s", len(decodes), out)
  return decodes


@gin.configurable(module=_GIN_MODULE)
def infer_model(estimator, vocabulary, sequence_length, batch_size,
                model_type, model_dir, eval_checkpoint_step,
                checkpoint_paths=None, decode_fn=decode_from_file):
  """Runs decode_fn for each checkpoint to evaluate."""
  if checkpoint_paths is None:
    checkpoint_paths = get_checkpoint_iterator(eval_checkpoint_step,
                                               model_dir)
  for path in checkpoint_paths:
    decode_fn(estimator, vocabulary, model_type, batch_size,
              sequence_length, checkpoint_path=path)


@gin.configurable(module=_GIN_MODULE)
def save_scores(results, vocabulary, scores_filename=None,
                save_example_text=True):
  """Writes scores (one per line) to scores_filename + ".scores" and, with
  save_example_text, the example texts; returns the scores."""
  scores = [float(r["scores"]) for r in results]
  if scores_filename is not None:
    write_lines_to_file(["%f" % s for s in scores],
                        scores_filename + ".scores")
    if save_example_text:
      for key in ("inputs", "targets"):
        if key in results[0]:
          write_lines_to_file(
              [_targets_vocab(vocabulary).decode(list(r[key]))
               if key == "targets" else
               _inputs_vocab(vocabulary).decode(list(r[key]))
               for r in results], "%s.%s" % (scores_filename, key))
  return scores


@gin.configurable(module=_GIN_MODULE)
def score_from_strings(estimator, vocabulary, model_type, batch_size,
                       sequence_length, model_dir, eval_checkpoint_step,
                       inputs=gin.REQUIRED, targets=gin.REQUIRED,
                       score_postprocess_fn=gin.REQUIRED, eos_id=1,
                       score_eos=True):
  """Log-likelihoods of targets given inputs, passed to score_postprocess_fn.

  Returns whatever score_postprocess_fn returns (save_scores: the scores).
  """
  del batch_size, sequence_length
  for name, value in (("inputs", inputs), ("targets", targets),
                      ("score_postprocess_fn", score_postprocess_fn)):
    if value is gin.REQUIRED:
      raise ValueError("score_from_strings: parameter %r is required" % name)
  if isinstance(inputs, str):
    inputs = get_inputs_from_file(inputs)
  if isinstance(targets, str):
    targets = get_inputs_from_file(targets)
  if len(inputs) != len(targets):
    raise ValueError("score_from_strings: %d inputs but %d targets"
                     % (len(inputs), len(targets)))
  length = estimator.sequence_length
  input_ids = (None if model_type in ("lm", "delimited_lm") else
               driver_eval.encode_strings(_inputs_vocab(vocabulary), inputs,
                                          length["inputs"], eos_id))
  target_ids = driver_eval.encode_strings(_targets_vocab(vocabulary), targets,
                                          length["targets"], eos_id)
  if not score_eos:
    target_ids[target_ids == eos_id] = 0
  path = get_checkpoint_iterator(eval_checkpoint_step, model_dir)[-1]
  scores = driver_eval.score_ids(estimator, input_ids, target_ids, path)
  results = [{"scores": s, "targets": t} for s, t in zip(scores, target_ids)]
  if input_ids is not None:
    for r, i in zip(results, input_ids):
      r["inputs"] = i
  return score_postprocess_fn(results, vocabulary)


def _resolve_learning_rate_schedule(schedule, total_train_steps):
  if isinstance(schedule, (list, tuple)):
    schedule = functools.partial(
        learning_rate_schedules.product_learning_rate, factors=list(schedule))
  if callable(schedule):
    schedule = functools.partial(schedule,
                                 total_train_steps=total_train_steps)
  return schedule


@gin.configurable(module=_GIN_MODULE)
def run(tpu_job_name, tpu, gcp_project, tpu_zone, model_dir,
        model_type="bitransformer", vocabulary=None, train_dataset_fn=None,
        eval_dataset_fn=None, dataset_split="train", autostack=True,
        eval_checkpoint_step=None, export_checkpoint_step=None,
        export_path="", mode="train", iterations_per_loop=100,
        save_checkpoints_steps=5000, keep_checkpoint_max=None,
        eval_summary_dir=None, batch_size=("tokens_per_replica", 2048),
        train_steps=auto_train_steps, total_run_steps=None,
        sequence_length=None, mesh_shape=gin.REQUIRED, mesh_devices=None,
        layout_rules=gin.REQUIRED, learning_rate_schedule=None,
        optimizer=None, predict_fn=None, variable_filter=None,
        perplexity_eval_steps=100, init_checkpoint=None,
        ensemble_inputs=None, train_model_fn=train_model,
        skip_seen_data=False, seen_data_init_step=0,
        output_eval_examples=True, checkpoint_input_pipeline=False):
  """Runs mode ("train", "eval", "infer", "score_from_strings", "export",
  ...) as configured by gin; returns the mode's result.

  """
  from transformer import utils  # pylint: disable=g-import-not-at-top
  del tpu_job_name, gcp_project, tpu_zone, perplexity_eval_steps
  if tpu:
    logging.warning("run: tpu=%r is ignored (no TPU driver in TF2 mode)", tpu)
  for name, value in (("mesh_shape", mesh_shape),
                      ("layout_rules", layout_rules)):
    if value is gin.REQUIRED:
      raise ValueError("run: parameter %r is required" % name)
  if sequence_length is None:
    raise ValueError("run: sequence_length is required")
  if isinstance(sequence_length, int):
    sequence_length = {"inputs": sequence_length, "targets": sequence_length}
  if isinstance(batch_size, (tuple, list)):
    batch_size = utils.compute_batch_size(sequence_length, mesh_shape,
                                          layout_rules, batch_size)
  if train_steps is None:
    train_steps = utils.auto_train_steps
  if callable(train_steps):
    train_steps = train_steps(batch_size, sequence_length)
  learning_rate_schedule = _resolve_learning_rate_schedule(
      learning_rate_schedule, train_steps)
  estimator = get_estimator(
      model_type, vocabulary, mesh_shape, layout_rules, model_dir,
      batch_size, sequence_length, autostack, learning_rate_schedule,
      keep_checkpoint_max, save_checkpoints_steps, optimizer, predict_fn,
      variable_filter, ensemble_inputs, False, None, iterations_per_loop,
      None, init_checkpoint=init_checkpoint, mesh_devices=mesh_devices)
  if mode == "train":
    if train_dataset_fn is None:
      raise ValueError("mode 'train' needs run.train_dataset_fn")
    return train_model_fn(estimator, vocabulary, sequence_length, batch_size,
                          train_dataset_fn, total_run_steps or train_steps,
                          ensemble_inputs, dataset_split=dataset_split,
                          skip_seen_data=skip_seen_data,
                          seen_data_init_step=seen_data_init_step,
                          checkpoint_input_pipeline=checkpoint_input_pipeline)
  if mode in ("eval", "evaluate", "score_eval", "perplexity_eval"):
    return eval_model(estimator, vocabulary, sequence_length, batch_size,
                      dataset_split, model_dir, eval_dataset_fn,
                      eval_summary_dir, eval_checkpoint_step,
                      output_eval_examples=output_eval_examples)
  if mode == "infer":
    return infer_model(estimator, vocabulary, sequence_length, batch_size,
                       model_type, model_dir, eval_checkpoint_step)
  if mode == "score_from_strings":
    return score_from_strings(estimator, vocabulary, model_type, batch_size,
                              sequence_length, model_dir,
                              eval_checkpoint_step)
  if mode in ("export", "export_infer", "export_score"):
    from transformer._src import driver_export  # pylint: disable=g-import-not-at-top
    checkpoint_path = (None if export_checkpoint_step is None else
                       get_checkpoint_iterator(export_checkpoint_step,
                                               model_dir)[-1])
    return driver_export.export_model(
        estimator, export_path or os.path.join(model_dir, "export"),
        vocabulary, sequence_length, model_type,
        eval_with_score=(mode == "export_score"),
        checkpoint_path=checkpoint_path)
  raise ValueError("run: unknown mode %r; expected train, eval, infer, "
                   "score_from_strings, export, export_infer or export_score"
                   % (mode,))
