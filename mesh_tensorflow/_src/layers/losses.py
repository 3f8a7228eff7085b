"""Loss functions: softmax and sigmoid cross-entropy, non-padding weights."""

from __future__ import annotations

import tensorflow as tf

from mesh_tensorflow._src.graph import Tensor
from mesh_tensorflow._src.ops import binary
from mesh_tensorflow._src.ops import elementwise
from mesh_tensorflow._src.ops import gather as gather_lib
from mesh_tensorflow._src.ops import reduce as reduce_lib
from mesh_tensorflow._src.ops import softmax as softmax_lib
from mesh_tensorflow._src.ops.slicewise import cwise
from mesh_tensorflow._src.shapes import Dimension
from mesh_tensorflow._src.shapes import convert_to_dimension


def _dim_names(dims) -> list:
  return sorted(d.name for d in dims)


def softmax_cross_entropy_with_logits(
  logits: Tensor, targets: Tensor, vocab_dim: Dimension, z_loss: float = 0.0
) -> Tensor:
  """Per-example softmax cross-entropy, -sum(targets * log_softmax(logits)).

  Hard targets: an integer Tensor with the dims of logits other than
  vocab_dim (values in [0, vocab_dim.size)). Soft targets: a float Tensor
  with the dims of logits. With z_loss != 0, z_loss * log(Z)**2 is added,
  where Z is the softmax partition function. vocab_dim may be split.

  Example:
    With the vocabulary split over two processors:

    >>> converter = mtf.test_utils.NumpyConverter(
    ...     mesh_shape="all:2", layout="vocab:all", devices=["cpu:0", "cpu:1"])
    >>> logits_np = np.random.RandomState(0).randn(2, 3, 4).astype(np.float32)
    >>> logits = converter.convert_np_array_to_mtf_tensor(
    ...     logits_np, ["batch", "length", "vocab"], dtype=tf.float32)
    >>> ids = converter.convert_np_array_to_mtf_tensor(
    ...     [[0, 3, 1], [2, 2, 0]], ["batch", "length"])
    >>> vocab = logits.shape.dims[2]
    >>> loss = softmax_cross_entropy_with_logits(logits, ids, vocab)
    >>> loss.shape
    Shape[batch=2, length=3]
    >>> np.allclose(converter.convert_mtf_tensor_to_np_array(loss),
    ...             tf.nn.sparse_softmax_cross_entropy_with_logits(
    ...                 [[0, 3, 1], [2, 2, 0]], logits_np))
    True

  Args:
    logits: a floating mtf Tensor with vocab_dim.
    targets: integer ids (dims of logits but vocab_dim) or float probabilities
      (the dims of logits).
    vocab_dim: the vocabulary Dimension of logits.
    z_loss: the coefficient of the log(Z)**2 auxiliary loss.

  Returns:
    a Tensor of shape logits.shape - vocab_dim.

  Raises:
    ValueError: if vocab_dim is not in logits or the targets' dims do not
      match.
  """
  vocab_dim = convert_to_dimension(vocab_dim)
  if vocab_dim not in logits.shape.dims:
    raise ValueError(
      "softmax_cross_entropy_with_logits: vocab_dim %s is not a "
      "dimension of logits %s" % (vocab_dim, logits.shape.to_string)
    )
  if targets.dtype.is_integer:
    expected = [d for d in logits.shape.dims if d != vocab_dim]
    if set(targets.shape.dims) != set(expected):
      raise ValueError(
        "softmax_cross_entropy_with_logits: hard (integer) targets %s must "
        "have the dimensions of logits %s other than vocab_dim %s, i.e. %s"
        % (
          targets.shape.to_string,
          logits.shape.to_string,
          vocab_dim,
          _dim_names(expected),
        )
      )
    log_z = softmax_lib.reduce_logsumexp(logits, vocab_dim)
    # -sum(one_hot(targets) * log_softmax) is log_z - logits[targets]: a
    # gather, without the [..., vocab]-sized one-hot, product and sum (and
    # their gradients). An out-of-range target has an all-zero one-hot, so
    # its cross-entropy is 0.
    target_logits = gather_lib.gather(
      logits, targets, vocab_dim, output_shape=log_z.shape
    )
    vocab_size = vocab_dim.size

    def in_range_fn(t):
      return tf.cast(tf.logical_and(t >= 0, t < vocab_size), logits.dtype)

    in_range = cwise(
      in_range_fn, [targets], output_dtype=logits.dtype, name="targets_in_range"
    )
    loss = binary.multiply(
      log_z - target_logits, in_range, output_shape=log_z.shape
    )
  else:
    if set(targets.shape.dims) != set(logits.shape.dims):
      raise ValueError(
        "softmax_cross_entropy_with_logits: soft (float) targets %s must "
        "have the dimensions of logits %s"
        % (targets.shape.to_string, logits.shape.to_string)
      )
    if targets.dtype != logits.dtype:
      targets = elementwise.cast(targets, logits.dtype)
    log_z = softmax_lib.reduce_logsumexp(logits, vocab_dim)
    log_softmax = logits - log_z
    loss = elementwise.negative(
      reduce_lib.reduce_sum(log_softmax * targets, reduced_dim=vocab_dim)
    )
  if z_loss != 0:
    loss += z_loss * elementwise.square(log_z)
  return loss


def sigmoid_cross_entropy_with_logits(
  logits: Tensor, targets: Tensor
) -> Tensor:
  """Elementwise sigmoid cross-entropy (numerically stable form).

  Example:
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> logits_np = np.array([[-50.0, -1.0, 0.0, 2.0]], dtype=np.float32)
    >>> labels_np = np.array([[0.0, 1.0, 0.5, 1.0]], dtype=np.float32)
    >>> logits, labels = [
    ...     converter.convert_np_array_to_mtf_tensor(a, ["batch", "d"], None)
    ...     for a in (logits_np, labels_np)]
    >>> loss = sigmoid_cross_entropy_with_logits(logits, labels)
    >>> expected = tf.nn.sigmoid_cross_entropy_with_logits(labels_np, logits_np)
    >>> np.allclose(converter.convert_mtf_tensor_to_np_array(loss), expected)
    True

  Args:
    logits: a floating mtf Tensor.
    targets: an mtf Tensor of labels in [0, 1], shaped like logits.

  Returns:
    an mtf Tensor shaped like logits: the loss of each element.

  Raises:
    ValueError: if the shapes differ.
  """
  if logits.shape != targets.shape:
    raise ValueError(
      "sigmoid_cross_entropy_with_logits: logits shape %s must "
      "equal targets shape %s"
      % (logits.shape.to_string, targets.shape.to_string)
    )
  x = logits
  z = (
    targets if targets.dtype == x.dtype else elementwise.cast(targets, x.dtype)
  )
  return (
    elementwise.relu(x)
    - x * z
    + elementwise.log(1.0 + elementwise.exp(-elementwise.mtf_abs(x)))
  )


def weights_nonzero(targets: Tensor, dtype=tf.float32) -> Tensor:
  """1 where targets != 0, else 0 (e.g. to mask padding), of `dtype`.

  Example:
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> target_ids = converter.convert_np_array_to_mtf_tensor(
    ...     [[5, 7, 0, 0]], ["batch", "length"])
    >>> converter.convert_mtf_tensor_to_np_array(weights_nonzero(target_ids))
    array([[1., 1., 0., 0.]], dtype=float32)

  Args:
    targets: an mtf Tensor (e.g. target ids, 0 for padding).
    dtype: the tf.DType of the result.

  Returns:
    an mtf Tensor shaped like targets.
  """
  dtype = tf.as_dtype(dtype)

  def fn(t):
    return tf.cast(tf.not_equal(t, 0), dtype)

  return cwise(fn, [targets], output_dtype=dtype, name="weights_nonzero")


__all__ = [
  "sigmoid_cross_entropy_with_logits",
  "softmax_cross_entropy_with_logits",
  "weights_nonzero",
]
