"""Beam search with GNMT length penalties, and greedy decoding.

Both decoders run inside one mtf.while_loop and call the model through
`logits_fn(step_num, ids, states) -> (logits, new_states)`; step `i` writes
the chosen token at position `i` of the ids.

Beam search (https://arxiv.org/abs/1609.08144) keeps two sets of `beam`
sequences per batch row:
- alive: unfinished sequences, ranked by log probability;
- finished: sequences that produced EOS, ranked by the length-penalised score
  log_prob / ((5 + length) / 6) ** alpha.
Each step extends every alive sequence by every token, takes the top
2 * beam candidates (so that at least `beam` of them are not EOS), keeps the
best `beam` non-EOS ones as the new alive set, and merges the EOS ones into the
finished set (finished and candidates are concatenated along a "triple_beam"
dimension and the best `beam` kept). Fixed-size tensors are kept valid with
large negative scores (-INF) instead of masks, as in the original.
"""

from __future__ import annotations

from typing import Callable, Optional, Tuple

import gin
import tensorflow as tf

from mesh_tensorflow._src.graph import Tensor
from mesh_tensorflow._src.layout import tensor_dim_to_mesh_dim_size
from mesh_tensorflow._src.ops import binary
from mesh_tensorflow._src.ops import broadcast_binary
from mesh_tensorflow._src.ops import control
from mesh_tensorflow._src.ops import einsum as einsum_lib
from mesh_tensorflow._src.ops import elementwise
from mesh_tensorflow._src.ops import gather as gather_lib
from mesh_tensorflow._src.ops import io
from mesh_tensorflow._src.ops import reduce as reduce_lib
from mesh_tensorflow._src.ops import reshape as reshape_lib
from mesh_tensorflow._src.ops import softmax as softmax_lib
from mesh_tensorflow._src.ops import tensor_ops
from mesh_tensorflow._src.ops import topk
from mesh_tensorflow._src.shapes import Dimension
from mesh_tensorflow._src.shapes import Shape

# The id of the end-of-sentence token.
EOS_ID = 1
# A large score standing in for infinity (keeps arithmetic finite).
INF = 1.0 * 1e7


def compute_topk_scores_and_seq(
  sequences: Tensor,
  scores: Tensor,
  scores_to_gather: Tensor,
  flags: Tensor,
  beam_dim: Dimension,
  prefix: str = "default",
):
  """The `beam_dim.size` best sequences by `scores`, with their data.

  Args:
    sequences: [batch, old_beam, length] ids.
    scores: [batch, old_beam]; ranks the sequences.
    scores_to_gather: [batch, old_beam]; the scores returned (log probs for
      the alive set, penalised scores for the finished set).
    flags: [batch, old_beam] booleans (has the sequence reached EOS).
    beam_dim: the Dimension of the result (k = beam_dim.size).
    prefix: names the top-k operation ("<prefix>_topk").

  Returns:
    (topk_seq [batch, beam, length], topk_gathered_scores [batch, beam],
     topk_flags [batch, beam], selector [batch, beam, old_beam] float32
     one-hot of the chosen old beams).

  Example:
    The 2 best of 4 sequences:

    >>> converter = mtf.test_utils.NumpyConverter()
    >>> def to_mtf(value, names, dtype):
    ...   return converter.convert_np_array_to_mtf_tensor(value, names, dtype)
    >>> seq = to_mtf([[[5, 1], [6, 0], [7, 0], [8, 1]]],
    ...              ["batch", "old_beam", "length"], tf.int32)
    >>> scores = to_mtf([[0.1, 0.4, 0.3, 0.2]], ["batch", "old_beam"],
    ...                 tf.float32)
    >>> flags = to_mtf([[True, False, False, True]], ["batch", "old_beam"],
    ...                tf.bool)
    >>> top_seq, top_scores, top_flags, _ = compute_topk_scores_and_seq(
    ...     seq, scores, scores, flags, mtf.Dimension("beam", 2))
    >>> converter.convert_mtf_tensor_to_np_array(top_seq)
    array([[[6, 0],
            [7, 0]]], dtype=int32)
    >>> converter.convert_mtf_tensor_to_np_array(top_scores)
    array([[0.4, 0.3]], dtype=float32)
    >>> converter.convert_mtf_tensor_to_np_array(top_flags)
    array([[False, False]])
  """
  if sequences.shape.ndims != 3:
    raise ValueError(
      "compute_topk_scores_and_seq: sequences must have shape "
      "[batch, beam, length], got %s" % sequences.shape.to_string
    )
  old_beam_dim = sequences.shape.dims[1]
  _, topk_indices = topk.top_k(
    scores, old_beam_dim, beam_dim, name=prefix + "_topk"
  )
  selector = gather_lib.one_hot(topk_indices, old_beam_dim, dtype=tf.float32)

  def gather_beams(t):
    output_shape = Shape(
      [beam_dim if d == old_beam_dim else d for d in t.shape.dims]
    )
    return gather_lib.gather(
      t, topk_indices, old_beam_dim, output_shape=output_shape
    )

  return (
    gather_beams(sequences),
    gather_beams(scores_to_gather),
    gather_beams(flags),
    selector,
  )


def _length_penalty(length: Tensor, alpha, dtype) -> Tensor:
  """((5 + length) / 6) ** alpha for an int scalar Tensor `length`."""
  base = (elementwise.cast(length, dtype) + 5.0) * (1.0 / 6.0)
  return elementwise.mtf_pow(base, alpha)


def _vocab_dim(
  logits: Tensor, batch_dim: Dimension, beam_dim: Dimension
) -> Dimension:
  others = [d for d in logits.shape.dims if d not in (batch_dim, beam_dim)]
  if (
    len(others) != 1
    or batch_dim not in logits.shape.dims
    or beam_dim not in logits.shape.dims
  ):
    raise ValueError(
      "beam_search: logits_fn must return logits of shape "
      "[%s, %s, vocab], got %s" % (batch_dim, beam_dim, logits.shape.to_string)
    )
  return others[0]


@gin.configurable(module="mesh_tensorflow.beam_search")
def beam_search(
  logits_fn: Callable,
  initial_ids: Tensor,
  alpha,
  states=None,
  eos_id: int = EOS_ID,
  stop_early: bool = True,
  decode_length=None,
  use_tpu: bool = True,
  dtype=tf.float32,
  layout=None,
  mesh_shape=None,
  num_prefilter: int = 2,
) -> Tuple[Tensor, Tensor]:
  """Beam search with length penalties.

  Args:
    logits_fn: (step_num int32 scalar Tensor, ids [batch, beam, length],
      states list) -> (logits [batch, beam, vocab], new_states list of
      Tensors shaped like the states).
    initial_ids: integer Tensor [batch, beam, length], normally zeros (step i
      adds the chosen token at position i).
    alpha: length penalty exponent (0 = plain log probability).
    states: optional list of Tensors with the beam dimension; they are
      reordered with the beams after every step.
    eos_id: end-of-sentence id.
    stop_early: stop once no alive sequence can beat the finished ones.
    decode_length: optional int32 scalar Tensor (or int): at most this many
      steps (default and cap: the length dimension).
    use_tpu: with `layout` and `mesh_shape`, take the prefilter path below.
    dtype: float dtype of the scores.
    layout: optional layout rules; with mesh_shape, the vocabulary's split
      count S under them selects a two-stage top-k: first the best
      `num_prefilter` tokens per (beam, vocabulary shard), then the best
      2 * beam of those. Exact unless more than num_prefilter of the best
      candidates share a beam and shard.
    mesh_shape: optional mesh shape (see layout).
    num_prefilter: candidates kept per (beam, vocabulary shard); 0 or None
      means 2 * beam. Capped at the shard's vocabulary size.

  Returns:
    (sequences [batch, beam, length], scores [batch, beam]): the finished
    sequences with their penalised scores, best first; a batch row with no
    finished sequence gets its alive sequences and their log probs instead.

  Raises:
    ValueError: for initial_ids not [batch, beam, length] integers, a beam
      of size 0, or logits not [batch, beam, vocab] with vocab >= 2.

  Example:
    A model that always favours token 3 first and EOS (1) after it:

    >>> converter = mtf.test_utils.NumpyConverter()
    >>> mesh = converter.mesh
    >>> batch, beam = mtf.Dimension("batch", 1), mtf.Dimension("beam", 2)
    >>> length, vocab = mtf.Dimension("length", 3), mtf.Dimension("vocab", 4)
    >>> def logits_fn(step_num, ids, states):
    ...   favoured = 3 - 2 * mtf.minimum(step_num, 1)
    ...   logits = 5.0 * mtf.one_hot(favoured, vocab)
    ...   return logits + mtf.zeros(mesh, [batch, beam, vocab]), states
    >>> seqs, scores = mtf.beam_search.beam_search(
    ...     logits_fn, mtf.zeros(mesh, [batch, beam, length], tf.int32),
    ...     alpha=0.6)
    >>> converter.convert_mtf_tensor_to_np_array(seqs)
    array([[[3, 1, 0],
            [3, 0, 1]]], dtype=int32)
    >>> scores_np = converter.convert_mtf_tensor_to_np_array(scores)
    >>> log_p = 5.0 - np.log(np.exp(5.0) + 3)  # log prob of a favoured token
    >>> penalty = ((5.0 + 2) / 6) ** 0.6  # for length 2, alpha 0.6
    >>> np.allclose(scores_np[0, 0], 2 * log_p / penalty)
    True
  """
  if not isinstance(initial_ids, Tensor) or initial_ids.shape.ndims != 3:
    raise ValueError(
      "beam_search: initial_ids must be an mtf Tensor "
      "[batch, beam, length], got %r" % (initial_ids,)
    )
  if not initial_ids.dtype.is_integer:
    raise ValueError(
      "beam_search: initial_ids %s must be integers, got %s"
      % (initial_ids.name, initial_ids.dtype.name)
    )
  batch_dim, beam_dim, length_dim = initial_ids.shape.dims
  if beam_dim.size < 1:
    raise ValueError(
      "beam_search: the beam size must be >= 1, got beam "
      "dimension %s" % (beam_dim,)
    )
  dtype = tf.as_dtype(dtype)
  mesh = initial_ids.mesh
  ids_dtype = initial_ids.dtype
  states = list(states or [])
  batch_by_beam = Shape([batch_dim, beam_dim])
  double_beam = Dimension("double_beam", 2 * beam_dim.size)
  old_beam_dim = Dimension("old_beam", beam_dim.size)
  use_prefilter = use_tpu and layout is not None and mesh_shape is not None

  # Only beam 0 is alive at first: the others start at log prob -INF.
  initial_log_probs = reduce_lib.broadcast(
    gather_lib.one_hot(
      io.constant(mesh, 0, dtype=tf.int32),
      beam_dim,
      on_value=0.0,
      off_value=-INF,
      dtype=dtype,
    ),
    batch_by_beam,
  )
  max_length = io.constant(mesh, length_dim.size, dtype=tf.int32)
  if decode_length is None:
    decode_length = max_length
  else:
    if not isinstance(decode_length, Tensor):
      decode_length = io.constant(mesh, int(decode_length), dtype=tf.int32)
    decode_length = binary.minimum(
      elementwise.cast(decode_length, tf.int32), max_length
    )

  def top_candidates(curr_scores, vocab_dim):
    """Best 2*beam of [batch, beam, vocab]: (scores, beam index, token)."""
    if use_prefilter:
      return prefiltered_candidates(curr_scores, vocab_dim)
    beam_and_vocab = Dimension("beam_and_vocab", beam_dim.size * vocab_dim.size)
    flat = reshape_lib.reshape(
      curr_scores, [batch_dim, beam_and_vocab], name="flatten_scores"
    )
    top_scores, top_flat = topk.top_k(flat, beam_and_vocab, double_beam)
    return (top_scores, top_flat // vocab_dim.size, top_flat % vocab_dim.size)

  def prefiltered_candidates(curr_scores, vocab_dim):
    num_shards = tensor_dim_to_mesh_dim_size(layout, mesh_shape, vocab_dim)
    if vocab_dim.size % num_shards:
      raise ValueError(
        "beam_search: vocabulary %s does not divide into %d "
        "shards of mesh %r" % (vocab_dim, num_shards, mesh_shape)
      )
    major = Dimension(vocab_dim.name, num_shards)
    minor = Dimension("minor_vocab", vocab_dim.size // num_shards)
    prefilter = Dimension(
      "prefilter", min(num_prefilter or double_beam.size, minor.size)
    )
    combined = Dimension(
      "combined", beam_dim.size * major.size * prefilter.size
    )
    scores = reshape_lib.reshape(
      curr_scores, [batch_dim, beam_dim, major, minor]
    )
    scores, minor_ids = topk.top_k(scores, minor, prefilter)
    scores = reshape_lib.reshape(scores, [batch_dim, combined])
    minor_ids = reshape_lib.reshape(minor_ids, [batch_dim, combined])
    top_scores, top_combined = topk.top_k(scores, combined, double_beam)
    top_minor = gather_lib.gather(
      minor_ids, top_combined, combined, output_shape=[batch_dim, double_beam]
    )
    per_beam = major.size * prefilter.size
    top_major = (top_combined % per_beam) // prefilter.size
    return (
      top_scores,
      top_combined // per_beam,
      top_major * minor.size + top_minor,
    )

  def grow_topk(i, alive_seq, alive_log_probs, states):
    """Top 2*beam one-token extensions of the alive sequences."""
    logits, new_states = logits_fn(i, alive_seq, states)
    new_states = list(new_states or [])
    vocab_dim = _vocab_dim(logits, batch_dim, beam_dim)
    if vocab_dim.size < 2:
      raise ValueError(
        "beam_search: the vocabulary %s must have at least 2 ids" % (vocab_dim,)
      )
    logits = einsum_lib.transpose(
      elementwise.cast(logits, dtype), [batch_dim, beam_dim, vocab_dim]
    )
    log_probs = softmax_lib.log_softmax(logits, vocab_dim) + alive_log_probs
    length_penalty = _length_penalty(i + 1, alpha, dtype)
    curr_scores = log_probs / length_penalty
    top_scores, top_beam_index, top_ids = top_candidates(curr_scores, vocab_dim)
    top_log_probs = top_scores * length_penalty
    first_selector = gather_lib.one_hot(
      top_beam_index, beam_dim, dtype=tf.float32
    )
    top_seq = gather_lib.gather(
      alive_seq,
      top_beam_index,
      beam_dim,
      output_shape=[batch_dim, double_beam, length_dim],
    )
    top_ids = elementwise.cast(top_ids, ids_dtype)
    top_seq += top_ids * gather_lib.one_hot(i, length_dim, dtype=ids_dtype)
    top_finished = broadcast_binary.equal(top_ids, eos_id)
    return (
      top_seq,
      top_log_probs,
      top_scores,
      top_finished,
      new_states,
      first_selector,
    )

  def grow_alive(curr_seq, curr_scores, curr_log_probs, curr_finished):
    curr_scores += elementwise.cast(curr_finished, dtype) * -INF
    return compute_topk_scores_and_seq(
      curr_seq,
      curr_scores,
      curr_log_probs,
      curr_finished,
      beam_dim,
      "grow_alive",
    )

  def grow_finished(
    finished_seq,
    finished_scores,
    finished_flags,
    curr_seq,
    curr_scores,
    curr_finished,
  ):
    curr_scores += (1.0 - elementwise.cast(curr_finished, dtype)) * -INF

    def concat(a, b):
      a = reshape_lib.rename_dimension(a, beam_dim.name, "triple_beam")
      b = reshape_lib.rename_dimension(b, double_beam.name, "triple_beam")
      return tensor_ops.concat([a, b], "triple_beam")

    scores = concat(finished_scores, curr_scores)
    return compute_topk_scores_and_seq(
      concat(finished_seq, curr_seq),
      scores,
      scores,
      concat(finished_flags, curr_finished),
      beam_dim,
      "grow_finished",
    )

  def body(
    i,
    alive_seq,
    alive_log_probs,
    finished_seq,
    finished_scores,
    finished_flags,
    *states,
  ):
    (
      top2k_seq,
      top2k_log_probs,
      top2k_scores,
      top2k_finished,
      new_states,
      first_selector,
    ) = grow_topk(i, alive_seq, alive_log_probs, list(states))
    alive_seq, alive_log_probs, _, second_selector = grow_alive(
      top2k_seq, top2k_scores, top2k_log_probs, top2k_finished
    )
    finished_seq, finished_scores, finished_flags, _ = grow_finished(
      finished_seq,
      finished_scores,
      finished_flags,
      top2k_seq,
      top2k_scores,
      top2k_finished,
    )
    if len(new_states) != len(states):
      raise ValueError(
        "beam_search: logits_fn returned %d states for %d"
        % (len(new_states), len(states))
      )
    gathered_states = []
    if new_states:
      # [batch, old_beam, beam]: which old beam each new beam continues.
      selector = einsum_lib.einsum(
        [
          reshape_lib.rename_dimension(
            first_selector, beam_dim.name, old_beam_dim.name
          ),
          second_selector,
        ],
        output_shape=[batch_dim, old_beam_dim, beam_dim],
      )
      for state in new_states:
        if beam_dim not in state.shape.dims:
          raise ValueError(
            "beam_search: state %s has no beam dimension %s"
            % (state.to_string, beam_dim)
          )
        gathered_states.append(
          einsum_lib.einsum(
            [
              reshape_lib.rename_dimension(
                state, beam_dim.name, old_beam_dim.name
              ),
              elementwise.cast(selector, state.dtype),
            ],
            output_shape=state.shape,
          )
        )
    return [
      i + 1,
      alive_seq,
      alive_log_probs,
      finished_seq,
      finished_scores,
      finished_flags,
    ] + gathered_states

  def cond(
    i,
    unused_alive_seq,
    alive_log_probs,
    unused_finished_seq,
    finished_scores,
    finished_flags,
    *unused_states,
  ):
    in_range = broadcast_binary.less(i, decode_length)
    if not stop_early:
      return in_range
    # No alive sequence can score better than its current log prob with the
    # largest length penalty (scores are negative and alpha >= 0).
    best_alive_bound = gather_lib.gather(
      alive_log_probs, 0, beam_dim
    ) / _length_penalty(decode_length, alpha, dtype)
    flags = elementwise.cast(finished_flags, dtype)
    # Unfinished entries count as 0, above any (negative) finished score.
    lowest_finished = reduce_lib.reduce_min(
      finished_scores * flags, reduced_dim=beam_dim
    )
    any_finished = reduce_lib.reduce_any(finished_flags, reduced_dim=beam_dim)
    lowest_finished += (1.0 - elementwise.cast(any_finished, dtype)) * -INF
    bound_is_met = reduce_lib.reduce_all(
      broadcast_binary.greater(lowest_finished, best_alive_bound)
    )
    return broadcast_binary.logical_and(
      in_range, elementwise.logical_not(bound_is_met)
    )

  loop_inputs = [
    io.constant(mesh, 0, dtype=tf.int32),
    initial_ids,
    initial_log_probs,
    initial_ids,
    io.constant(mesh, -INF, batch_by_beam, dtype=dtype),
    io.constant(mesh, False, batch_by_beam, dtype=tf.bool),
  ] + states
  (
    _,
    alive_seq,
    alive_log_probs,
    finished_seq,
    finished_scores,
    finished_flags,
  ) = control.while_loop(cond, body, loop_inputs)[:6]

  # A batch row where nothing finished returns its alive sequences.
  any_finished = reduce_lib.reduce_any(finished_flags, reduced_dim=beam_dim)
  return (
    binary.where(any_finished, finished_seq, alive_seq),
    binary.where(any_finished, finished_scores, alive_log_probs),
  )


@gin.configurable(module="mesh_tensorflow.beam_search")
def greedy_decode(
  logits_fn: Callable,
  initial_ids: Tensor,
  temperature=0.0,
  initial_states=None,
  eos_id: int = EOS_ID,
  forced_ids: Optional[Tensor] = None,
  use_tpu: bool = True,
) -> Tensor:
  """Greedy (temperature 0) or sampled decoding, one token per step.

  Stops when every row of ids contains eos_id or all positions are written.

  Args:
    logits_fn: (step_num int32 scalar Tensor, ids [..., length], states
      list) -> (logits [..., vocab], new_states list).
    initial_ids: integer Tensor [..., length], normally zeros.
    temperature: 0.0 for argmax; otherwise sample from
      softmax(logits / temperature) (see mtf.sample_with_temperature).
    initial_states: optional list of loop-carried Tensors.
    eos_id: end-of-sentence id.
    forced_ids: optional Tensor like initial_ids; where nonzero, its id is
      used instead of the decoded one.
    use_tpu: accepted for compatibility (ignored).

  Returns:
    ids [..., length].

  Example:
    A model that always favours token 3 first and EOS (1) after it:

    >>> converter = mtf.test_utils.NumpyConverter()
    >>> mesh = converter.mesh
    >>> batch, length = mtf.Dimension("batch", 2), mtf.Dimension("length", 3)
    >>> vocab = mtf.Dimension("vocab", 4)
    >>> def logits_fn(step_num, ids, states):
    ...   favoured = 3 - 2 * mtf.minimum(step_num, 1)
    ...   logits = 5.0 * mtf.one_hot(favoured, vocab)
    ...   return logits + mtf.zeros(mesh, [batch, vocab]), states
    >>> ids = mtf.beam_search.greedy_decode(
    ...     logits_fn, mtf.zeros(mesh, [batch, length], tf.int32))
    >>> converter.convert_mtf_tensor_to_np_array(ids)
    array([[3, 1, 0],
           [3, 1, 0]], dtype=int32)
  """
  del use_tpu
  if not isinstance(initial_ids, Tensor) or initial_ids.shape.ndims < 1:
    raise ValueError(
      "greedy_decode: initial_ids must be an mtf Tensor "
      "[..., length], got %r" % (initial_ids,)
    )
  if not initial_ids.dtype.is_integer:
    raise ValueError(
      "greedy_decode: initial_ids %s must be integers, got %s"
      % (initial_ids.name, initial_ids.dtype.name)
    )
  length_dim = initial_ids.shape.dims[-1]
  mesh = initial_ids.mesh
  ids_dtype = initial_ids.dtype
  num_steps = io.constant(mesh, length_dim.size, dtype=tf.int32)

  def cond(step_num, prev_ids, *unused_states):
    done = broadcast_binary.equal(step_num, num_steps)
    has_eos = reduce_lib.reduce_any(
      broadcast_binary.equal(prev_ids, eos_id), reduced_dim=length_dim
    )
    all_have_eos = reduce_lib.reduce_all(has_eos)
    return elementwise.logical_not(
      broadcast_binary.logical_or(done, all_have_eos)
    )

  def body(step_num, ids, *states):
    logits, new_states = logits_fn(step_num, ids, list(states))
    vocab_dim = logits.shape.dims[-1]
    new_ids = elementwise.cast(
      topk.sample_with_temperature(logits, vocab_dim, temperature), ids_dtype
    )
    if forced_ids is not None:
      forced = gather_lib.gather(forced_ids, step_num, length_dim)
      new_ids = forced + new_ids * elementwise.cast(
        broadcast_binary.equal(forced, 0), ids_dtype
      )
    ids += new_ids * gather_lib.one_hot(step_num, length_dim, dtype=ids_dtype)
    return [step_num + 1, ids] + list(new_states or [])

  loop_inputs = [io.constant(mesh, 0, dtype=tf.int32), initial_ids]
  loop_inputs += list(initial_states or [])
  return control.while_loop(cond, body, loop_inputs)[1]


__all__ = [
  "EOS_ID",
  "INF",
  "beam_search",
  "compute_topk_scores_and_seq",
  "greedy_decode",
]
