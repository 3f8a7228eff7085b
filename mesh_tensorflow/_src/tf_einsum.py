"""A faster tf.einsum for the equations mtf lowers to, on one slice.

tf.einsum lowers every equation to BatchMatMul. For an elementwise product
("ab,ab->ab") that is a batch of a million 1x1 products (~70x slower than
tf.multiply on CPU); for batched dot products ("abc,abc->c", the gradient of
a scale vector) a batch of 1xK by Kx1 products after transposing both
operands (~5x slower than tf.multiply and tf.reduce_sum); and for a matmul
with a transposed operand ("ab,ac->bc") it copies the transpose first, where
MatMul's transpose flags cost nothing. `einsum` recognises those cases and
emits tf.multiply (and tf.reduce_sum) or tf.matmul; anything else goes to
tf.einsum. Below float32, where every sum rounds and the kernels round
theirs differently, an equation that sums is computed as the original
computed it: when one operand (or the output) has every label, the operands
broadcast to its label order are multiplied in turn and summed with
tf.reduce_sum; otherwise tf.einsum.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import tensorflow as tf

from mesh_tensorflow._src import graph_constants


def einsum(equation: str, *operands) -> tf.Tensor:
  """Same result as tf.einsum(equation, *operands); explicit "->" required.

  Example:
    >>> x = tf.constant([[1.0, 2.0], [3.0, 4.0]])
    >>> w = tf.constant([[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]])
    >>> y = einsum("ab,bc->ac", x, w)  # computed with tf.matmul
    >>> y.numpy()
    array([[1., 2., 3.],
           [3., 4., 7.]], dtype=float32)
    >>> np.allclose(y, tf.einsum("ab,bc->ac", x, w))
    True
    >>> np.allclose(einsum("ab,ab->ab", x, x), x * x)  # with tf.multiply
    True
  """
  inputs, output = equation.replace(" ", "").split("->")
  labels = inputs.split(",")
  operands = [tf.convert_to_tensor(x) for x in operands]
  result = None
  plain = len(operands) == len(labels) and _plain(labels + [output], operands)
  if plain and _rounds_sums(operands) and _sums(labels, output):
    return _multiply_and_sum(labels, output, operands)
  if plain:
    if len(operands) == 1:
      result = _unary(labels[0], output, operands[0])
    elif len(operands) == 2:
      result = _binary(labels[0], labels[1], output, *operands)
  if result is None:
    result = tf.einsum(equation, *operands)
  return result


def _rounds_sums(operands) -> bool:
  """Whether an operand's dtype is below float32 (bfloat16, float16)."""
  return any(x.dtype.is_floating and x.dtype.size < 4 for x in operands)


def _sums(labels: Sequence[str], output: str) -> bool:
  """Whether the equation sums over a label (one missing from the output)."""
  return bool(set("".join(labels)) - set(output))


def _multiply_and_sum(
  labels: Sequence[str], output: str, operands
) -> tf.Tensor:
  """The original's einsum of a slice: broadcast, multiply, reduce_sum.

  Used when some term holds every label (no memory is wasted by
  broadcasting to it); otherwise tf.einsum, again as the original did.
  """
  union = set("".join(labels))
  full = next((t for t in list(labels) + [output] if set(t) == union), None)
  if full is None:
    return tf.einsum("%s->%s" % (",".join(labels), output), *operands)
  product = None
  for term, x in zip(labels, operands):
    present = "".join(l for l in full if l in term)
    x = _reduce_and_transpose(term, present, x)
    if present != full:
      sizes = dict(zip(present, x.shape.as_list()))
      x = graph_constants.reshape(x, [sizes.get(l, 1) for l in full])
    product = x if product is None else tf.multiply(product, x)
  return _reduce_and_transpose(full, output, product)


def _plain(label_lists: Sequence[str], operands) -> bool:
  """No repeated label within a term, no ellipsis, fully static shapes."""
  for labels in label_lists:
    if "." in labels or len(set(labels)) != len(labels):
      return False
  return all(
    x.shape.rank is not None and x.shape.is_fully_defined() for x in operands
  )


def _reduce_and_transpose(labels: str, keep: str, x: tf.Tensor) -> tf.Tensor:
  """Sums x over labels not in `keep`, then orders the rest as in `keep`."""
  reduced = [i for i, l in enumerate(labels) if l not in keep]
  if reduced:
    x = tf.reduce_sum(x, axis=graph_constants.constant(reduced))
    labels = "".join(l for l in labels if l in keep)
  perm = [labels.index(l) for l in keep if l in labels]
  if perm != sorted(perm):
    x = tf.transpose(x, graph_constants.constant(perm))
  return x


def _unary(labels: str, output: str, x: tf.Tensor) -> Optional[tf.Tensor]:
  if set(output) - set(labels):
    return None
  return _reduce_and_transpose(labels, output, x)


def _binary(
  la: str, lb: str, lo: str, a: tf.Tensor, b: tf.Tensor
) -> Optional[tf.Tensor]:
  if set(lo) - set(la) - set(lb):
    return None
  # A label in one operand only and not in the output is summed away first.
  keep_a = "".join(l for l in la if l in lo or l in lb)
  keep_b = "".join(l for l in lb if l in lo or l in la)
  if keep_a != la:
    a, la = _reduce_and_transpose(la, keep_a, a), keep_a
  if keep_b != lb:
    b, lb = _reduce_and_transpose(lb, keep_b, b), keep_b
  contracted = [l for l in la if l in lb and l not in lo]
  if not contracted:
    return _broadcast_multiply(la, lb, lo, a, b)
  if set(la) == set(lb):
    # Batched dot products (no free label in either operand): multiply, sum.
    return _reduce_and_transpose(la, lo, _broadcast_multiply(la, lb, la, a, b))
  return _matmul(la, lb, lo, a, b, contracted)


def _broadcast_multiply(la, lb, lo, a, b) -> tf.Tensor:
  """Product when nothing is contracted: align both to lo, then multiply."""

  def align(labels, x):
    order = "".join(l for l in lo if l in labels)
    x = _reduce_and_transpose(labels, order, x)
    # Missing leading dims need no size-1 axes: tf.multiply broadcasts them.
    if not lo.endswith(order):
      sizes = dict(zip(order, x.shape.as_list()))
      x = graph_constants.reshape(x, [sizes.get(l, 1) for l in lo])
    return x

  return tf.multiply(align(la, a), align(lb, b))


def _split(labels: str, first: List[str], second: List[str]) -> Optional[bool]:
  """False if labels == first + second, True if second + first, else None."""
  if list(labels) == first + second:
    return False
  if list(labels) == second + first:
    return True
  return None


def _matmul(la, lb, lo, a, b, contracted) -> Optional[tf.Tensor]:
  """tf.matmul when a reshape (no copy) brings both operands to matrices."""
  batch = [l for l in lo if l in la and l in lb]
  nb = len(batch)
  if list(la[:nb]) != batch or list(lb[:nb]) != batch or list(lo[:nb]) != batch:
    return None
  free_a = [l for l in la[nb:] if l not in contracted]
  free_b = [l for l in lb[nb:] if l not in contracted]
  contracted_b = [l for l in lb[nb:] if l in contracted]
  if contracted_b != contracted:
    return None
  transpose_a = _split(la[nb:], free_a, contracted)
  transpose_b = _split(lb[nb:], contracted, free_b)
  swap = _split(lo[nb:], free_a, free_b)
  if transpose_a is None or transpose_b is None or swap is None:
    return None
  sizes = dict(zip(la, a.shape.as_list()))
  sizes.update(zip(lb, b.shape.as_list()))

  def prod(ls):
    n = 1
    for l in ls:
      n *= sizes[l]
    return n

  batch_shape = [sizes[l] for l in batch]
  m, k, n = prod(free_a), prod(contracted), prod(free_b)
  a = graph_constants.reshape(
    a, batch_shape + ([k, m] if transpose_a else [m, k])
  )
  b = graph_constants.reshape(
    b, batch_shape + ([n, k] if transpose_b else [k, n])
  )
  if swap:  # out = (a b)^T = b^T a^T
    y = tf.matmul(
      b, a, transpose_a=not transpose_b, transpose_b=not transpose_a
    )
  else:
    y = tf.matmul(a, b, transpose_a=transpose_a, transpose_b=transpose_b)
  return graph_constants.reshape(y, [sizes[l] for l in lo])
