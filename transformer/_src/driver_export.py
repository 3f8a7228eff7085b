"""export_model: a TF2 SavedModel that decodes strings to strings.

The SavedModel holds the model's masters (float32, full shape, one device)
and a `serving_default` signature: {"inputs": string [n]} ->
{"outputs": string [n]}. Inputs are encoded with the vocabulary (EOS
appended, truncated / padded to sequence_length["inputs"]), decoded in
chunks of batch_size rows, and the ids decoded back to text. It reloads with
`tf.saved_model.load(path)` in a fresh process without this package's
Python code.
"""

from __future__ import annotations

import os

from absl import logging
import tensorflow as tf

import mesh_tensorflow as mtf
from transformer._src import driver
from transformer._src import driver_eval

__all__ = ["export_model"]


class _ServingModule(tf.Module):
  """Tracks the variables and holds the serving function."""

  def __init__(self, est: driver.Estimator, vocabulary, decode_fn):
    super().__init__(name="mtf_transformer")
    self.store = est.store
    self._decode_fn = decode_fn
    inputs_vocab = vocabulary[0] if isinstance(vocabulary, tuple) else vocabulary
    targets_vocab = (vocabulary[1] if isinstance(vocabulary, tuple)
                     else vocabulary)
    length = est.sequence_length["inputs"]
    batch_size = est.batch_size

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)],
                 autograph=False)
    def serve(inputs):
      ids = tf.map_fn(inputs_vocab.encode_tf, inputs,
                      fn_output_signature=tf.RaggedTensorSpec(
                          [None], tf.int32, ragged_rank=0))
      ids = ids[:, :length - 1]
      eos = tf.ones([tf.shape(inputs)[0], 1], tf.int32)
      ids = tf.concat([ids, tf.RaggedTensor.from_tensor(eos)], axis=1)
      ids = ids.to_tensor(default_value=0, shape=[None, length])
      n = tf.shape(ids)[0]
      padded = (n + batch_size - 1) // batch_size * batch_size
      ids = tf.pad(ids, [[0, padded - n], [0, 0]])
      chunks = tf.reshape(ids, [-1, batch_size, length])
      outputs = tf.map_fn(self._decode_fn, chunks,
                          fn_output_signature=tf.TensorSpec(
                              [batch_size, None], tf.int32))
      outputs = tf.reshape(outputs, [padded, -1])[:n]
      text = tf.map_fn(targets_vocab.decode_tf, outputs,
                       fn_output_signature=tf.TensorSpec([], tf.string))
      return {"outputs": text}

    self.serve = serve


def export_model(estimator, export_dir, vocabulary, sequence_length,
                 model_type, eval_with_score=False, batch_size=1,
                 checkpoint_path=None):
  """Writes a SavedModel of the decoder to export_dir; returns its path.

  Uses checkpoint_path (default: the latest checkpoint in the estimator's
  model_dir, written by training) on a one-device mesh.

  Raises:
    ValueError: no checkpoint to export, or eval_with_score (not supported).
  """
  del model_type
  if eval_with_score:
    raise ValueError("export_model: eval_with_score=True (a scoring "
                     "signature) is not supported; export a decoder")
  if checkpoint_path is None:
    checkpoint_path = estimator.latest_checkpoint()
  if checkpoint_path is None:
    raise ValueError("export_model: no checkpoint in %r to export"
                     % estimator.model_dir)
  dtype = mtf.VariableDType(tf.float32, tf.float32,
                            estimator.variable_dtype.activation_dtype)
  est = driver.Estimator(
      estimator.model_type, estimator.model, vocabulary,
      estimator.model_dir, "", "", batch_size, sequence_length,
      autostack=False, variable_dtype=dtype, mesh_devices=["/cpu:0"])
  est.prepare(checkpoint_path)
  length = est.sequence_length["inputs"]
  phase = est.phase_fn("decode", lambda p: driver_eval._build_decode(  # pylint: disable=protected-access
      est, p, {}))
  example = tf.zeros([batch_size, length], tf.int32)
  est.run_phase(phase, example)  # traces, restores the checkpoint
  module = _ServingModule(est, vocabulary, phase.fn)
  path = os.path.join(export_dir, str(int(est.global_step.numpy())))
  tf.io.gfile.makedirs(export_dir)
  tf.saved_model.save(module, path,
                      signatures={"serving_default": module.serve})
  logging.info("Exported SavedModel to %s", path)
  return path
