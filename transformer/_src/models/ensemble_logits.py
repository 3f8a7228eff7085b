"""Ensemble logit reducers: [ensemble, ..., vocab] logits to [..., vocab].

An ensemble Unitransformer fed one batch for all its members combines their
logits with `reduce_ensemble_logits`, by default the log of the members'
mean probability.
"""

from __future__ import annotations

import gin

import mesh_tensorflow as mtf

__all__ = [
  "reduce_ensemble_logits",
  "reduce_ensemble_logits_mean_logit",
  "reduce_ensemble_logits_mean_prob",
  "reduce_ensemble_logits_select",
]

_GIN_MODULE = "mesh_tensorflow.transformer.transformer"


@gin.configurable(module=_GIN_MODULE)
def reduce_ensemble_logits_select(
  logits: mtf.Tensor,
  ensemble_dim: mtf.Dimension,
  vocab_dim: mtf.Dimension,
  model_id: int = 0,
) -> mtf.Tensor:
  """The logits of ensemble member model_id.

  Args:
    logits: the members' logits [ensemble, batch..., length, vocab].
    ensemble_dim: the ensemble Dimension (reduced).
    vocab_dim: the vocabulary Dimension (unused).
    model_id: the index of the member whose logits are returned.

  Returns:
    Logits [batch..., length, vocab].
  """
  del vocab_dim
  return mtf.gather(logits, model_id, ensemble_dim)


@gin.configurable(module=_GIN_MODULE)
def reduce_ensemble_logits_mean_prob(
  logits: mtf.Tensor, ensemble_dim: mtf.Dimension, vocab_dim: mtf.Dimension
) -> mtf.Tensor:
  """log of the members' mean probability (floored at 1e-20).

  Args:
    logits: the members' logits [ensemble, batch..., length, vocab].
    ensemble_dim: the ensemble Dimension (reduced).
    vocab_dim: the vocabulary Dimension.

  Returns:
    Log-probabilities [batch..., length, vocab].
  """
  probs = mtf.softmax(logits, reduced_dim=vocab_dim)
  probs = mtf.reduce_mean(probs, reduced_dim=ensemble_dim)
  return mtf.log(mtf.maximum(probs, 1e-20))


@gin.configurable(module=_GIN_MODULE)
def reduce_ensemble_logits_mean_logit(
  logits: mtf.Tensor, ensemble_dim: mtf.Dimension, vocab_dim: mtf.Dimension
) -> mtf.Tensor:
  """The members' mean logit.

  Args:
    logits: the members' logits [ensemble, batch..., length, vocab].
    ensemble_dim: the ensemble Dimension (reduced).
    vocab_dim: the vocabulary Dimension (unused).

  Returns:
    Logits [batch..., length, vocab].
  """
  del vocab_dim
  return mtf.reduce_mean(logits, reduced_dim=ensemble_dim)


@gin.configurable(module=_GIN_MODULE)
def reduce_ensemble_logits(
  logits: mtf.Tensor,
  ensemble_dim: mtf.Dimension,
  vocab_dim: mtf.Dimension,
  reduce_fn=reduce_ensemble_logits_mean_prob,
) -> mtf.Tensor:
  """Combines [ensemble, ..., vocab] logits into [..., vocab] by reduce_fn.

  Args:
    logits: the members' logits [ensemble, batch..., length, vocab].
    ensemble_dim: the ensemble Dimension (reduced).
    vocab_dim: the vocabulary Dimension.
    reduce_fn: called as reduce_fn(logits, ensemble_dim, vocab_dim), e.g.
      reduce_ensemble_logits_mean_prob.

  Returns:
    Logits [batch..., length, vocab].
  """
  return reduce_fn(logits, ensemble_dim, vocab_dim)
