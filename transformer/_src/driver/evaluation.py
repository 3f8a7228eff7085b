"""Evaluation, scoring and decoding phases of the driver's Estimator.

Each phase is one compiled tf.function per batch shape that builds its mtf
graph when traced, over the Estimator's VariableStore and mesh. Metrics are
computed from exported per-token tensors, so they are exact sums over the
whole dataset (no streaming-metric variables); the reported "loss" is the
model's own loss per batch, averaged over the batches as the original's
Estimator.evaluate averaged it.
"""

from __future__ import annotations

import functools
import itertools
from typing import (
  Any,
  Callable,
  Dict,
  Iterable,
  List,
  Optional,
  Sequence,
  Tuple,
  Union,
)

import numpy as np
import tensorflow as tf

import mesh_tensorflow as mtf
from transformer._src.driver import mesh_impl_choice
from transformer._src.driver.config import clean_decodes
from transformer._src.layers.context import ModeKeys
from transformer._src.models.decoder_inputs import delimited_lm_inputs_mask
from transformer._src.models.unitransformer import Unitransformer

__all__ = [
  "batch_loop_graph",
  "batches_per_call",
  "decode_graph",
  "decode_ids",
  "decode_loop_graph",
  "evaluate",
  "score_ids",
  "scores_and_targets",
  "target_weights_on_mesh",
  "teacher_forced",
  "teacher_forced_graph",
  "teacher_forced_loop_graph",
]


def _static_batch_size(features: Dict[str, tf.Tensor]) -> int:
  """The batch size of [ensemble?, batch, length] features."""
  sizes = {int(v.shape[-2]) for v in features.values()}
  if len(sizes) != 1:
    raise ValueError(
      "features have different batch sizes: %s"
      % {k: v.shape for k, v in features.items()}
    )
  return sizes.pop()


def teacher_forced_graph(
  est, features: Dict[str, tf.Tensor], scoring: bool = False
):
  """Builds and lowers the teacher-forced model over tf `features`.

  Returns (lowering, loss, xent, predictions, targets, weights): the
  model's loss (scalar) and, per position of the targets the model reads,
  the cross-entropy, the argmax, the target id and where it counts (float
  0/1; see target_weights_on_mesh), each [ensemble?, batch, length]. The
  targets are the features' "targets", except for a "delimited_lm" fed
  inputs too: then each row's inputs and targets joined, inputs + targets
  long (Estimator.joined_features; scoring: also an "lm" fed inputs, as
  the original's "score" mode).
  """
  return est.lower_on_mesh(_teacher_forced_on_mesh, est, features, scoring)


def target_weights_on_mesh(targets: mtf.Tensor, model_type: str) -> mtf.Tensor:
  """Where a target counts in scores and metrics (float32 0/1), as the
  original's: ids > 0 and, for a "delimited_lm", not in an example's inputs
  part.

  Args:
    targets: int ids [..., length].
    model_type: the estimator's model type, e.g. "bitransformer".

  Returns:
    A float32 mtf.Tensor shaped as targets.
  """
  weights = mtf.cast(mtf.greater(targets, 0), tf.float32)
  if model_type == "delimited_lm":
    weights *= mtf.cast(
      mtf.logical_not(delimited_lm_inputs_mask(targets)), tf.float32
    )
  return weights


def _teacher_forced_on_mesh(est, features: Dict[str, tf.Tensor], scoring: bool):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  with mtf.variable_store(est.store):
    batch_size = _static_batch_size(features)
    mtf_features = est.joined_features(
      est.import_features(mesh, features, batch_size),
      "score" if scoring else ModeKeys.EVAL,
    )
    logits, loss = est.logits_and_loss(mtf_features, ModeKeys.EVAL)
    if isinstance(logits, tuple):
      logits = logits[0]
    logits = mtf.cast(logits, tf.float32)
    vocab_dim = logits.shape.dims[-1]
    targets = mtf_features["targets"]
    xent = mtf.layers.softmax_cross_entropy_with_logits(
      logits, targets, vocab_dim
    )
    predictions = mtf.argmax(logits, vocab_dim)
    weights = target_weights_on_mesh(targets, getattr(est, "model_type", None))
  lowering = mtf.Lowering(graph, {mesh: est.mesh_impl}, autostack=est.autostack)
  # [ensemble?, outer_batch?, batch, length] -> the features' batch shape.
  shape = tf.concat(
    [tf.shape(features["targets"])[:-1], [targets.shape.dims[-1].size]], 0
  )

  def export(tensor, dtype):
    return tf.reshape(
      tf.cast(lowering.export_to_tf_tensor(tensor), dtype), shape
    )

  return (
    lowering,
    tf.cast(lowering.export_to_tf_tensor(loss), tf.float32),
    export(xent, tf.float32),
    export(predictions, tf.int32),
    export(targets, tf.int32),
    export(weights, tf.float32),
  )


_TEACHER_FORCED_OUTPUTS = ("loss", "xent", "predictions", "targets", "weights")
_TEACHER_FORCED_DTYPES = (
  tf.float32,
  tf.float32,
  tf.int32,
  tf.int32,
  tf.float32,
)


def _build_phase(est, phase, graph_fn, names: Sequence[str]):
  """tf.function(*args) -> {name: output} of graph_fn(est, *args), which
  returns (lowering, *outputs); the trace records the lowering's variables
  in phase.
  """

  @tf.function(autograph=False)
  def fn(*args):
    lowering, *outputs = graph_fn(est, *args)
    phase.laid_out_variables = list(lowering.variables.values())
    return dict(zip(names, outputs))

  return fn


def build_teacher_forced(est, phase, scoring: bool = False):
  """tf.function(features) -> {"loss"} of the batch and {"xent",
  "predictions", "targets", "weights"} per target position (see
  teacher_forced_graph).
  """
  return _build_phase(
    est,
    phase,
    functools.partial(teacher_forced_graph, scoring=scoring),
    _TEACHER_FORCED_OUTPUTS,
  )


def _phase_name(base: str, scoring: bool) -> str:
  return base + ("_score" if scoring else "")


def teacher_forced(est, features: Dict[str, tf.Tensor], scoring: bool = False):
  """The model's loss, per-token cross-entropy and argmax predictions for one
  batch.

  Features are [batch, length]; with ensemble_inputs every ensemble member
  sees the batch, and the results are [ensemble, batch, length].
  """
  features = _with_ensemble(est, features)
  phase = est.phase_fn(
    _phase_name("teacher_forced", scoring),
    lambda p: build_teacher_forced(est, p, scoring),
  )
  return est.run_phase(phase, features)


def batch_loop_graph(
  est,
  graph_fn: Callable,
  features: Dict[str, tf.Tensor],
  num_batches: Union[int, tf.Tensor, None] = None,
  dtypes: Sequence[tf.DType] = (),
) -> tuple:
  """graph_fn's program over several batches, one after the other.

  The loop of one host call, as TPUEstimator ran iterations_per_loop batches
  per call. Unless the mesh runs on SimdMeshImpl's collective backend, the
  batches are the iterations of one host tf.while_loop around the program
  (on TPU, the replicated program), traced once, each batch's outputs
  written to TensorArrays (the outfeed of the loop); it runs the first
  num_batches batches only, so a last call with fewer batches takes the
  same trace, its missing batches filled in by the caller and never run
  (their outputs are zeros). On the collective backend (whose collectives
  cannot run in a while loop) the program is built for every batch and
  every batch runs.

  Args:
    est: the Estimator.
    graph_fn: graph_fn(est, features of one batch) -> (lowering, *outputs).
    features: {feature name: tensor [batches, ...]}.
    num_batches: how many of the batches to run (a Python int or an int32
      scalar tensor; None: all).
    dtypes: the dtype of each of graph_fn's outputs.

  Returns:
    (lowering, *outputs): a lowering of the program (for its variables) and
    each output of every batch, stacked ([batches, ...]).
  """
  size = int(next(iter(features.values())).shape[0])
  lowerings = []

  def one_batch(i):
    lowering, *outputs = graph_fn(est, {k: v[i] for k, v in features.items()})
    lowerings.append(lowering)
    return outputs

  if mesh_impl_choice.uses_collective_backend(est.mesh_impl):
    outputs = zip(*[one_batch(i) for i in range(size)])
    return (lowerings[0],) + tuple(tf.stack(out) for out in outputs)

  def body(i, *arrays):
    outputs = one_batch(i)
    return (i + 1,) + tuple(a.write(i, o) for a, o in zip(arrays, outputs))

  _, *arrays = tf.while_loop(
    lambda i, *_: i < (size if num_batches is None else num_batches),
    body,
    (tf.constant(0),) + tuple(tf.TensorArray(d, size) for d in dtypes),
  )
  return (lowerings[0],) + tuple(a.stack() for a in arrays)


def teacher_forced_loop_graph(
  est,
  features: Dict[str, tf.Tensor],
  num_batches: Union[int, tf.Tensor, None] = None,
  scoring: bool = False,
) -> tuple:
  """The teacher-forced program of several batches in one host call.

  See batch_loop_graph (on TPU, a host while loop around the replicated
  program, traced once).

  Args:
    est: the Estimator.
    features: {feature name: int tensor [batches, ensemble?, batch,
      length]}.
    num_batches: how many of the batches to run (None: all).
    scoring: the features are scored (see teacher_forced_graph).

  Returns:
    (lowering, losses, xent, predictions, targets, weights): a lowering of
    the program (for its variables), the model's loss of each batch
    ([batches]), and the per-target outputs of teacher_forced_graph of each
    batch.
  """
  return batch_loop_graph(
    est,
    functools.partial(teacher_forced_graph, scoring=scoring),
    features,
    num_batches,
    _TEACHER_FORCED_DTYPES,
  )


def build_teacher_forced_loop(est, phase, scoring: bool = False):
  """tf.function(features [batches, ...], num_batches) -> {"loss"
  [batches], "xent", "predictions"}.
  """
  return _build_phase(
    est,
    phase,
    functools.partial(teacher_forced_loop_graph, scoring=scoring),
    _TEACHER_FORCED_OUTPUTS,
  )


def _with_ensemble(est, features: Dict[str, tf.Tensor]):
  """[batch, length] features; with ensemble_inputs, one copy per member."""
  features = {k: tf.convert_to_tensor(v) for k, v in features.items()}
  if est.ensemble_inputs:
    features = {
      k: tf.tile(v[tf.newaxis], [est.ensemble_inputs, 1, 1])
      for k, v in features.items()
    }
  return features


def batches_per_call(est) -> int:
  """How many batches evaluation, scoring and decoding run per host call.

  An estimator's `batches_per_call` attribute (TpuEstimator: its
  iterations_per_loop, as TPUEstimator ran that many per call), else 1.

  Args:
    est: the Estimator (or a TpuEstimator).

  Returns:
    a positive int.
  """
  return int(getattr(est, "batches_per_call", 1))


def _run_in_calls(
  est, phase, batches: Iterable[Dict[str, Any]], to_features=dict
):
  """(batch, outputs) of each batch, batches_per_call batches per call.

  phase.fn(features [batches, ...], num_batches) is a loop phase (see
  batch_loop_graph). Every call is given as many batches as the first
  (batches_per_call, or all of them if fewer), so that every call takes
  the one trace: the last call's missing batches are zero batches its loop
  does not run (the collective backend runs them; their outputs are
  dropped).

  Args:
    est: the Estimator.
    phase: the loop phase.
    batches: feature dicts of one shape.
    to_features: the program's features of a batch.

  Yields:
    (batch, {output name: array}) of each batch, in order.
  """
  size = None
  for group in _in_groups(batches, batches_per_call(est)):
    size = size or len(group)
    stacked = [to_features(b) for b in group]
    stacked += [{k: tf.zeros_like(v) for k, v in stacked[0].items()}] * (
      size - len(group)
    )
    features = {k: tf.stack([b[k] for b in stacked]) for k in stacked[0]}
    outputs = est.run_phase(phase, features, tf.constant(len(group)))
    outputs = {k: v.numpy() for k, v in outputs.items()}
    for i, batch in enumerate(group):
      yield batch, {k: v[i] for k, v in outputs.items()}


def _teacher_forced_each(
  est, batches: Iterable[Dict[str, np.ndarray]], scoring: bool = False
):
  """teacher_forced's outputs, as arrays, of each [batch, length] batch;
  batches_per_call batches per call.
  """
  if batches_per_call(est) == 1:
    for batch in batches:
      out = teacher_forced(est, batch, scoring)
      yield {k: v.numpy() for k, v in out.items()}
    return
  phase = est.phase_fn(
    _phase_name("teacher_forced_loop", scoring),
    lambda p: build_teacher_forced_loop(est, p, scoring),
  )
  for _, out in _run_in_calls(
    est, phase, batches, lambda batch: _with_ensemble(est, batch)
  ):
    yield out


def _in_groups(iterable, size: int):
  """Lists of `size` consecutive items (the last one may be shorter)."""
  group = []
  for item in iterable:
    group.append(item)
    if len(group) == size:
      yield group
      group = []
  if group:
    yield group


def evaluate(
  est,
  dataset: tf.data.Dataset,
  checkpoint_path: Optional[str] = None,
  max_batches: Optional[int] = None,
) -> Dict[str, float]:
  """Teacher-forced loss, token accuracy and exact-match over `dataset`.

  "loss" is the original's eval loss: the model's own loss of each batch
  (its summed cross-entropy divided by all of the batch's target positions,
  padding and the zero rows that fill the last batch included), averaged
  over the batches as Estimator.evaluate averaged it. The cross-entropy per
  target token is -neg_log_perplexity. A target token counts where
  target_weights_on_mesh says (ids > 0, not in a delimited_lm's inputs;
  a delimited_lm's targets are its joined inputs and targets); a row
  counts (for sequence_accuracy) where it has any target token, and is
  exactly right when every counted token is predicted. As the original's,
  "mean_label" (the mean target id, a checksum of the data) and
  "max_targets_length" (the most target tokens of a row) are there too. The
  batches run batches_per_call(est) per host call (see batch_loop_graph).
  """
  est.prepare(checkpoint_path)
  xent_sum = loss_sum = 0.0
  num_batches = 0
  tokens = correct_tokens = sequences = correct_sequences = 0
  label_sum = max_targets_length = 0
  # Zero rows fill the last batch (no target tokens, so they do not count)
  # and keep one traced shape.
  batches = (
    {
      k: _pad_rows(v.numpy(), est.batch_size)
      for k, v in batch.items()
      if k in ("inputs", "targets")
      or k.endswith(("_segmentation", "_position"))
    }
    for batch in itertools.islice(dataset, max_batches)
  )
  for out in _teacher_forced_each(est, batches):
    loss_sum += float(out["loss"])
    num_batches += 1
    xent, targets = out["xent"], out["targets"]
    weights = out["weights"] > 0
    right = (out["predictions"] == targets) | ~weights
    xent_sum += float(np.sum(xent * weights))
    tokens += int(weights.sum())
    label_sum += int(np.sum(targets * weights))
    max_targets_length = max(
      max_targets_length, int(weights.sum(axis=-1).max(initial=0))
    )
    correct_tokens += int((right & weights).sum())
    rows = weights.any(axis=-1)
    sequences += int(rows.sum())
    correct_sequences += int((right.all(axis=-1) & rows).sum())
  if not tokens:
    raise ValueError("evaluate: the eval dataset has no target tokens")
  return {
    "loss": loss_sum / num_batches,
    "neg_log_perplexity": -xent_sum / tokens,
    "token_accuracy": correct_tokens / tokens,
    "sequence_accuracy": correct_sequences / max(sequences, 1),
    "mean_label": label_sum / tokens,
    "num_eval_tokens": float(tokens),
    "max_targets_length": float(max_targets_length),
    "num_eval_sequences": float(sequences),
  }


def score_ids(
  est,
  inputs: Optional[np.ndarray],
  targets: np.ndarray,
  checkpoint_path: Optional[str] = None,
) -> np.ndarray:
  """Log-likelihood of each target row: the sum over the targets that count
  (ids > 0; for a "delimited_lm", not in its inputs parts).
  """
  return scores_and_targets(est, inputs, targets, checkpoint_path)[0]


def scores_and_targets(
  est,
  inputs: Optional[np.ndarray],
  targets: np.ndarray,
  checkpoint_path: Optional[str] = None,
) -> Tuple[np.ndarray, np.ndarray]:
  """score_ids, and the target rows the model read.

  The model reads the given targets, except that a "delimited_lm" given
  inputs reads each row's inputs and targets joined (the original's score
  predictions returned those as "targets").

  Args:
    est: the Estimator.
    inputs: int ids [n, inputs length], or None.
    targets: int ids [n, targets length].
    checkpoint_path: the checkpoint to score with (default: the latest).

  Returns:
    (scores [n] float, targets [n, length] int32 as the model read them).
  """
  est.prepare(checkpoint_path)
  scores, read_targets = [], []
  batches = _batches(est, {"inputs": inputs, "targets": targets})
  for out in _teacher_forced_each(est, batches, scoring=True):
    row = -np.sum(out["xent"] * out["weights"], axis=-1)
    rows = out["targets"]
    if row.ndim == 2:  # ensemble_inputs: the members' mean log-likelihood
      row, rows = row.mean(axis=0), rows[0]
    scores.append(row)
    read_targets.append(rows)
  if not scores:
    return np.zeros([0], np.float32), np.zeros([0, 0], np.int32)
  n = len(targets)
  return np.concatenate(scores)[:n], np.concatenate(read_targets)[:n]


def _pad_rows(array: np.ndarray, rows: int) -> np.ndarray:
  """array [n, ...] padded with zero rows to [rows, ...] (n <= rows)."""
  array = np.asarray(array, np.int32)
  if len(array) > rows:
    raise ValueError(
      "a batch of %d rows exceeds the batch size %d" % (len(array), rows)
    )
  return np.concatenate(
    [array, np.zeros((rows - len(array),) + array.shape[1:], np.int32)]
  )


def _batches(est, arrays: Dict[str, Optional[np.ndarray]]):
  """{key: [batch_size, length] int32} of each batch; zero rows pad the
  last.
  """
  arrays = {
    k: np.asarray(v, np.int32) for k, v in arrays.items() if v is not None
  }
  total = len(next(iter(arrays.values())))
  b = est.batch_size
  for start in range(0, total, b):
    yield {k: _pad_rows(v[start : start + b], b) for k, v in arrays.items()}


def decode_graph(est, inputs: tf.Tensor, **decode_kwargs):
  """Builds and lowers decoding of int inputs [batch, length].

  Returns (lowering, outputs [batch, length] int32); a Unitransformer's
  outputs are [batch, length + targets length], the continuations of its
  prompts. Every id after a row's first EOS is padding (clean_decodes), as
  the original's predictions were. The Estimator's
  predict_fn(model=, features=, variable_dtype=) replaces the model's own
  decoding when given.
  """
  # inputs is an argument (not captured), so that on TPU it becomes the
  # replicated computation's input.
  return est.lower_on_mesh(_decode_on_mesh, est, inputs, decode_kwargs)


def _decode_on_mesh(est, inputs: tf.Tensor, decode_kwargs):
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  with mtf.variable_store(est.store):
    mtf_inputs = est.import_features(
      mesh, {"inputs": inputs}, int(inputs.shape[-2]), training=False
    )["inputs"]
    model = est.model
    if est.predict_fn is not None:
      outputs = est.predict_fn(
        model=model,
        features={"inputs": mtf_inputs},
        variable_dtype=est.variable_dtype,
      )
    elif isinstance(model, Unitransformer):
      # The prompt is followed by room for the targets: the samples (the
      # continuation, prompt removed) may be up to inputs + targets long.
      length_dim = mtf_inputs.shape.dims[-1]
      mtf_inputs = mtf.pad(
        mtf_inputs, [0, est.sequence_length["targets"]], length_dim.name
      )
      outputs = model.sample_autoregressive(
        mtf_inputs,
        variable_dtype=est.variable_dtype,
        remove_partial_sequences=True,
        **decode_kwargs,
      )
    else:
      outputs = model.decode(
        mtf_inputs, variable_dtype=est.variable_dtype, **decode_kwargs
      )
  lowering = mtf.Lowering(graph, {mesh: est.mesh_impl}, autostack=est.autostack)
  outputs = tf.cast(lowering.export_to_tf_tensor(outputs), tf.int32)
  return lowering, clean_decodes(outputs)


def build_decode(est, phase, decode_kwargs):
  """tf.function(inputs [batch, length]) -> decoded ids [batch, length]."""

  @tf.function(autograph=False)
  def fn(inputs):
    lowering, outputs = decode_graph(est, inputs, **decode_kwargs)
    phase.laid_out_variables = list(lowering.variables.values())
    return outputs

  return fn


def decode_loop_graph(
  est,
  features: Dict[str, tf.Tensor],
  num_batches: Union[int, tf.Tensor, None] = None,
  **decode_kwargs,
) -> tuple:
  """Decoding of several batches of inputs in one host call.

  See batch_loop_graph (on TPU, a host while loop around the replicated
  decode, traced once) and decode_graph.

  Args:
    est: the Estimator.
    features: {"inputs": int tensor [batches, batch, length]}.
    num_batches: how many of the batches to decode (None: all).
    **decode_kwargs: passed to the model's decode.

  Returns:
    (lowering, outputs [batches, batch, length] int32).
  """
  return batch_loop_graph(
    est,
    lambda est, batch: decode_graph(est, batch["inputs"], **decode_kwargs),
    features,
    num_batches,
    (tf.int32,),
  )


def decode_ids(
  est,
  inputs: np.ndarray,
  *,
  checkpoint_path: Optional[str] = None,
  **decode_kwargs,
) -> List[np.ndarray]:
  """Decoded id rows for encoded input rows [n, length] (greedy by default;
  decode_kwargs go to model.decode, e.g. beam_size=4). The batches run
  batches_per_call(est) per host call (see batch_loop_graph).
  """
  est.prepare(checkpoint_path)
  key = "decode:%s" % sorted(decode_kwargs.items())
  batches = _batches(est, {"inputs": inputs})
  if batches_per_call(est) == 1:
    phase = est.phase_fn(key, lambda p: build_decode(est, p, decode_kwargs))
    outputs = [
      est.run_phase(phase, tf.constant(batch["inputs"])).numpy()
      for batch in batches
    ]
  else:
    phase = est.phase_fn(
      "loop " + key,
      lambda p: _build_phase(
        est,
        p,
        functools.partial(decode_loop_graph, **decode_kwargs),
        ("outputs",),
      ),
    )
    outputs = [out["outputs"] for _, out in _run_in_calls(est, phase, batches)]
  return list(np.concatenate(outputs)[: len(inputs)]) if outputs else []


def encode_strings(
  vocabulary, strings: Sequence[str], length: int, eos_id: int = 1
) -> np.ndarray:
  """Rows of ids (EOS appended, truncated to length, zero padded)."""
  rows = np.zeros([len(strings), length], np.int32)
  for i, s in enumerate(strings):
    ids = list(vocabulary.encode(s))[: length - 1] + [eos_id]
    rows[i, : len(ids)] = ids
  return rows
