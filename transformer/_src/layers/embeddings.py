"""Vocabulary embeddings and sinusoid positional tables of the transformer.

`VocabEmbedding` owns the table that maps token ids to d_model vectors and,
when the softmax shares it, hidden states back to vocabulary logits. Other
vocabulary classes (vocab_embeddings.py, adaptive_softmax.py) implement the
same interface; `get_vocab_embedding_cls` is the gin swap point.
`ensemble_list` and `scale_hidden` are helpers those classes share.
"""

from __future__ import annotations

import math
from typing import List

import gin
import tensorflow as tf

import mesh_tensorflow as mtf

__all__ = [
  "VocabEmbedding",
  "get_vocab_embedding_cls",
  "sinusoid_positional_embedding_weights",
]

_GIN_MODULE = "mesh_tensorflow.transformer.transformer"


@gin.configurable(module=_GIN_MODULE)
class VocabEmbedding:
  """A [ensemble..., vocab, d_model] table used for input and (maybe) softmax.

  The variable is `<scope>/<name>`. Logits are `hidden * d_model**-0.5`
  contracted with the table, so that a table initialised with stddev 1 gives
  unit-scale logits. With scale_variable_like_classifier_weights the table is
  initialised with stddev d_model**-0.5 instead and the embeddings are scaled
  up by d_model**0.5 (same function, different parameterisation).

  Example:
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> vocab_dim = mtf.Dimension("vocab", 16)
    >>> d_model = mtf.Dimension("d_model", 8)
    >>> emb = VocabEmbedding(converter.mesh, vocab_dim, d_model,
    ...                      mtf.VariableDType(), "embedding", None)
    >>> ids = converter.convert_np_array_to_mtf_tensor(
    ...     [[3, 5, 7, 1]], ["batch", "length"])
    >>> x = emb.ids_to_embedding(ids, None)  # the context is not used
    >>> logits = emb.hidden_to_logits(x, None)
    >>> x.shape, logits.shape
    (Shape[batch=1, length=4, d_model=8], Shape[batch=1, length=4, vocab=16])
    >>> lowering, table = converter.convert_mtf_tensor_to_tf_tensor(
    ...     emb.embedding_weights)
    >>> x_np = lowering.export_to_tf_tensor(x).numpy()
    >>> logits_np = lowering.export_to_tf_tensor(logits).numpy()
    >>> np.allclose(x_np, table.numpy()[[[3, 5, 7, 1]]])  # rows of the table
    True
    >>> np.allclose(logits_np, x_np @ table.numpy().T * 8**-0.5, atol=1e-6)
    True
  """

  def __init__(
    self,
    mesh: mtf.Mesh,
    vocab_dim: mtf.Dimension,
    output_dim: mtf.Dimension,
    variable_dtype,
    name: str,
    ensemble_dim,
    scale_variable_like_classifier_weights=False,
  ):
    """Creates the table variable.

    Args:
      mesh: the mtf.Mesh the variables live on.
      vocab_dim: the vocabulary Dimension.
      output_dim: the output Dimension (None: the input's model dim).
      variable_dtype: the mtf.VariableDType of the variables.
      name: the name (scope) of the variables, e.g. "embedding" or "softmax".
      ensemble_dim: an ensemble Dimension (one table per member) or None.
      scale_variable_like_classifier_weights: initialize the table with stddev
        d_model**-0.5 and scale the embeddings up by d_model**0.5 (see above).
    """
    self._vocab_dim = vocab_dim
    self._output_dim = output_dim
    self._scale_variable_like_classifier_weights = (
      scale_variable_like_classifier_weights
    )
    stddev = (
      output_dim.size**-0.5 if scale_variable_like_classifier_weights else 1.0
    )
    self._embedding_weights = mtf.layers.embedding_weights(
      mesh,
      vocab_dim,
      output_dim,
      variable_dtype,
      name=name,
      ensemble_dim=ensemble_dim,
      initializer=tf.compat.v1.random_normal_initializer(stddev=stddev),
    )

  @property
  def embedding_weights(self) -> mtf.Tensor:
    """The table [ensemble?, vocab, d_model]."""
    return self._embedding_weights

  def ids_to_embedding(self, ids: mtf.Tensor, context) -> mtf.Tensor:
    """Integer ids [...] -> embeddings [..., d_model].

    Args:
      ids: int token ids [batch..., length].
      context: the Context of the call (mesh, dims, mode, states...).

    Returns:
      The embeddings [batch..., length, d_model].
    """
    del context
    x = mtf.gather(self._embedding_weights, ids, self._vocab_dim)
    if self._scale_variable_like_classifier_weights:
      x *= self._output_dim.size**0.5
    return x

  def hidden_to_logits(self, hidden: mtf.Tensor, context) -> mtf.Tensor:
    """Hidden states [..., d_model] -> logits [..., vocab].

    Args:
      hidden: the hidden states [batch..., length, d_model].
      context: the Context of the call (mesh, dims, mode, states...).

    Returns:
      The logits [batch..., length, vocab].
    """
    del context
    if not self._scale_variable_like_classifier_weights:
      hidden *= self._output_dim.size**-0.5
    return mtf.einsum(
      [hidden, self._embedding_weights], reduced_dims=[self._output_dim]
    )


@gin.configurable(module=_GIN_MODULE)
def get_vocab_embedding_cls(cls: type = VocabEmbedding) -> type:
  """The vocabulary-embedding class models build (a gin swap point).

  Returns:
    `cls`.
  """
  return cls


def sinusoid_positional_embedding_weights(
  mesh: mtf.Mesh,
  max_length_dim: mtf.Dimension,
  model_dim: mtf.Dimension,
  dtype,
  min_timescale: float = 1.0,
  max_timescale: float = 1.0e4,
) -> mtf.Tensor:
  """The fixed [max_length, d_model] sinusoid table (no variable).

  Channel i < d/2 holds sin(p * w_i), channel d/2 + i holds cos(p * w_i),
  with w_i = min_timescale * (min/max timescale)**(i / (d/2 - 1)) (the
  tensor2tensor formula).
  An odd d_model gets one trailing zero channel.

  Example:
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> table = sinusoid_positional_embedding_weights(
    ...     converter.mesh, mtf.Dimension("max_length", 4),
    ...     mtf.Dimension("d_model", 6), tf.float32)
    >>> table.shape
    Shape[max_length=4, d_model=6]
    >>> w = 1e4 ** -(np.arange(3) / 2)  # d/2 = 3 timescales from 1 to 1e4
    >>> p = np.arange(4)[:, np.newaxis]
    >>> np.allclose(converter.convert_mtf_tensor_to_np_array(table),
    ...             np.concatenate([np.sin(p * w), np.cos(p * w)], axis=1))
    True

  Args:
    mesh: the mtf.Mesh.
    max_length_dim: the positions Dimension.
    model_dim: the model Dimension (d_model).
    dtype: the dtype of the table.
    min_timescale: the shortest wavelength's timescale.
    max_timescale: the longest wavelength's timescale.

  Returns:
    A [max_length, d_model] tensor of `dtype`.

  Raises:
    ValueError: if d_model is smaller than 2.
  """
  dtype = tf.as_dtype(dtype)
  num_timescales = model_dim.size // 2
  if num_timescales < 1:
    raise ValueError(
      "sinusoid_positional_embedding_weights: %s needs at least "
      "2 channels" % (model_dim,)
    )
  timescales_dim = mtf.Dimension(model_dim.name, num_timescales)
  increment = math.log(float(max_timescale) / float(min_timescale)) / max(
    float(num_timescales - 1), 1.0
  )
  position = mtf.range(mesh, max_length_dim, dtype=tf.float32)
  inv_timescales = mtf.exp(
    mtf.range(mesh, timescales_dim, dtype=tf.float32) * -increment
  ) * (float(min_timescale))
  scaled_time = position * inv_timescales
  signal = mtf.concat(
    [mtf.sin(scaled_time), mtf.cos(scaled_time)], model_dim.name
  )
  if model_dim.size % 2:
    signal = mtf.pad(signal, [0, 1], model_dim.name)
  return mtf.cast(signal, dtype)


def ensemble_list(ensemble_dim) -> List[mtf.Dimension]:
  """ensemble_dim (None, a Dimension, or a list of them) as a list.

  Args:
    ensemble_dim: the ensemble dims given to a vocabulary class.

  Returns:
    a list of mtf.Dimensions.
  """
  if ensemble_dim is None:
    return []
  if isinstance(ensemble_dim, mtf.Dimension):
    return [ensemble_dim]
  if isinstance(ensemble_dim, (list, tuple)):
    return [mtf.convert_to_dimension(d) for d in ensemble_dim]
  return [mtf.convert_to_dimension(ensemble_dim)]


def scale_hidden(hidden: mtf.Tensor, output_dim: mtf.Dimension) -> mtf.Tensor:
  """hidden * d_model**-0.5, as VocabEmbedding does before its softmax.

  Args:
    hidden: the hidden states [..., output_dim].
    output_dim: the d_model Dimension.

  Returns:
    the scaled hidden states.
  """
  return hidden * (output_dim.size**-0.5)
