"""export_model: a TF2 SavedModel that decodes (or scores) strings.

The SavedModel holds the model's masters (float32, full shape, one device)
and one `serving_default` signature:

- decoding (default): {"inputs": string [n]} -> {"outputs": string [n]};
- scoring (eval_with_score=True): {"inputs": string [n], "targets": string
  [n]} -> {"scores": float32 [n]}, the log-likelihood of each target.

Strings are encoded with the vocabulary (EOS appended, truncated / padded to
the sequence length), run in chunks of batch_size rows, and decoded ids are
turned back into text. It reloads with `tf.saved_model.load(path)` in a
fresh process without this package's Python code.
"""

from __future__ import annotations

import os
from typing import Optional

from absl import logging
import tensorflow as tf

import mesh_tensorflow as mtf
from transformer._src.driver import estimator as driver
from transformer._src.driver import evaluation as driver_eval
from transformer._src.driver.config import SequenceLength
from transformer._src.driver.config import Vocabularies

__all__ = ["export_model"]


def _encode(vocab, strings: tf.Tensor, length: int) -> tf.Tensor:
  """string [n] -> int32 [n, length]: ids, EOS, zero padding."""
  ids = tf.map_fn(
    vocab.encode_tf,
    strings,
    fn_output_signature=tf.RaggedTensorSpec([None], tf.int32, ragged_rank=0),
  )
  ids = ids[:, : length - 1]
  eos = tf.ones([tf.shape(strings)[0], 1], tf.int32)
  ids = tf.concat([ids, tf.RaggedTensor.from_tensor(eos)], axis=1)
  return ids.to_tensor(default_value=0, shape=[None, length])


def _in_chunks(fn, arrays, batch_size: int, output_spec: tf.TensorSpec):
  """fn over [batch_size, ...] chunks of arrays (zero-padded), rows [n]."""
  n = tf.shape(arrays[0])[0]
  padded = (n + batch_size - 1) // batch_size * batch_size
  chunks = [
    tf.reshape(
      tf.pad(a, [[0, padded - n], [0, 0]]), [-1, batch_size, a.shape[1]]
    )
    for a in arrays
  ]
  outputs = tf.map_fn(
    lambda c: fn(*c), tuple(chunks), fn_output_signature=output_spec
  )
  return tf.reshape(outputs, tf.concat([[padded], tf.shape(outputs)[2:]], 0))[
    :n
  ]


class _ServingModule(tf.Module):
  """Tracks the variables and holds the serving function."""

  def __init__(
    self, est: driver.Estimator, vocabulary, phase_fn, eval_with_score: bool
  ):
    super().__init__(name="mtf_transformer")
    self.store = est.store
    self._phase_fn = phase_fn
    inputs_vocab = (
      vocabulary[0] if isinstance(vocabulary, tuple) else vocabulary
    )
    targets_vocab = (
      vocabulary[1] if isinstance(vocabulary, tuple) else vocabulary
    )
    lengths = est.sequence_length
    batch_size = est.batch_size
    strings = tf.TensorSpec([None], tf.string)

    @tf.function(input_signature=[strings], autograph=False)
    def decode(inputs):
      ids = _encode(inputs_vocab, inputs, lengths["inputs"])
      outputs = _in_chunks(
        self._phase_fn,
        [ids],
        batch_size,
        tf.TensorSpec([batch_size, None], tf.int32),
      )
      text = tf.map_fn(
        targets_vocab.decode_tf,
        outputs,
        fn_output_signature=tf.TensorSpec([], tf.string),
      )
      return {"outputs": text}

    @tf.function(input_signature=[strings, strings], autograph=False)
    def score(inputs, targets):
      target_ids = _encode(targets_vocab, targets, lengths["targets"])

      def row_scores(input_chunk, target_chunk):
        out = self._phase_fn({"inputs": input_chunk, "targets": target_chunk})
        return -tf.reduce_sum(out["xent"] * out["weights"], axis=-1)

      scores = _in_chunks(
        row_scores,
        [_encode(inputs_vocab, inputs, lengths["inputs"]), target_ids],
        batch_size,
        tf.TensorSpec([batch_size], tf.float32),
      )
      return {"scores": scores}

    self.serve = score if eval_with_score else decode


@driver.eager_in_legacy_mode
def export_model(
  estimator: driver.Estimator,
  export_dir: str,
  vocabulary: Vocabularies,
  sequence_length: SequenceLength,
  model_type: str,
  eval_with_score: bool = False,
  batch_size: int = 1,
  checkpoint_path: Optional[str] = None,
) -> str:
  """Writes a SavedModel to `<export_dir>/<step>`; returns its path.

  Uses checkpoint_path (default: the latest checkpoint in the estimator's
  model_dir) on a one-device mesh. eval_with_score exports a scoring
  signature instead of a decoder.

  Args:
    estimator: the driver.Estimator holding the model and its variables.
    export_dir: the SavedModel goes to <export_dir>/<step>.
    vocabulary: a Vocabulary, or an (inputs, targets) pair of them.
    sequence_length: an int, or a {"inputs": n, "targets": m} dict: the feature
      lengths in tokens.
    model_type: unused (the estimator's model is exported).
    eval_with_score: score the targets instead of decoding.
    batch_size: the batch size of the exported signature.
    checkpoint_path: the checkpoint to export (default: the latest in the
      estimator's model_dir).

  Returns:
    The path of the written SavedModel directory.

  Raises:
    ValueError: no checkpoint to export.
  """
  del model_type
  if checkpoint_path is None:
    checkpoint_path = estimator.latest_checkpoint()
  if checkpoint_path is None:
    raise ValueError(
      "export_model: no checkpoint in %r to export" % estimator.model_dir
    )
  dtype = mtf.VariableDType(
    tf.float32, tf.float32, estimator.variable_dtype.activation_dtype
  )
  est = driver.Estimator(
    estimator.model_type,
    estimator.model,
    vocabulary,
    estimator.model_dir,
    "",
    "",
    batch_size,
    sequence_length,
    autostack=False,
    variable_dtype=dtype,
    mesh_devices=["/cpu:0"],
    predict_fn=estimator.predict_fn,
    mesh_impl="placement",  # one device, whatever the training mesh ran on
  )
  est.prepare(checkpoint_path)
  lengths = est.sequence_length
  if eval_with_score:
    phase = est.phase_fn(
      "teacher_forced_score",
      lambda p: driver_eval.build_teacher_forced(est, p, scoring=True),
    )
    example = (
      {
        k: tf.zeros([batch_size, lengths[k]], tf.int32)
        for k in ("inputs", "targets")
      },
    )
  else:
    phase = est.phase_fn(
      "decode", lambda p: driver_eval.build_decode(est, p, {})
    )
    example = (tf.zeros([batch_size, lengths["inputs"]], tf.int32),)
  est.run_phase(phase, *example)  # traces, restores the checkpoint
  module = _ServingModule(est, vocabulary, phase.fn, eval_with_score)
  path = os.path.join(export_dir, str(int(est.global_step.numpy())))
  tf.io.gfile.makedirs(export_dir)
  tf.saved_model.save(
    module, path, signatures={"serving_default": module.serve}
  )
  logging.info("Exported SavedModel to %s", path)
  return path
