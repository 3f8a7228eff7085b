"""Random tensors and dropout whose values do not depend on the mesh layout.

Design (stronger than the original, which seeded each slice separately and so
gave different numbers on different layouts): every element is a pure function
of (key, its global linear index in the full tensor). A processor computes only
its own slice: it adds its slice begin to local coordinates, forms the int64
row-major global index and hashes `key + (index + 1) * 0x9E3779B97F4A7C15`
with the splitmix64 finaliser in uint64 arithmetic (wrapping multiply, xor,
logical shifts; kernels exist on CPU, in tf.function, in v1 graphs and under
XLA). The top bits of the hash become a uniform float in [0, 1): as many bits
as the dtype's significand (8 for bfloat16, 11 for float16, 24 for float32, 53
for float64), so values are exact and never reach 1. Normal values use
Box–Muller (cosine branch) on two independent streams, the second keyed by a
rehash of the key, computed in float64; truncated normals use the inverse
normal CDF on [Phi(-2), Phi(2)). No communication is needed, and the numbers
are bitwise identical on every mesh and layout.

The 64-bit key:
- `seed=` given: a deterministic mix of the seed and zlib.crc32 of the op name
  (names are deterministic: scope prefix + TF-style uniquifying). The op is
  then stateless: the same values every time the lowered program runs.
- no seed: a stateful `tf.random.uniform([], 0, 2**62, tf.int64)` is drawn once
  per lowering of the op, on the first processor's device, mixed with the
  crc32 of the op name, and that one scalar is shared by all processors. It is
  a new value each time the program runs (so dropout masks change at every
  step of a compiled training loop) and reproducible under
  `tf.random.set_seed`. Python `hash()` is never used (it varies per process).
  A backend whose processors run separate programs (SIMD) must make this scalar
  identical on all of them.
"""

from __future__ import annotations

import math
from typing import Callable, Optional
import zlib

import numpy as np
import tensorflow as tf

from mesh_tensorflow._src.graph import Mesh
from mesh_tensorflow._src.graph import Operation
from mesh_tensorflow._src.graph import Tensor
from mesh_tensorflow._src.ops import binary
from mesh_tensorflow._src.ops import broadcast_binary
from mesh_tensorflow._src.ops import elementwise
from mesh_tensorflow._src.shapes import convert_to_shape

_MASK64 = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15  # splitmix64 increment (odd, golden ratio).
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB
_SECOND_STREAM = 0xD1B54A32D192ED03  # rekeys the second Box–Muller stream.

# Supported TF samplers -> distribution. A table (not `fn == tf...` checks
# spread through the code) so the accepted set is explicit and documented.
_DISTRIBUTIONS = {
  tf.random.uniform: "uniform",
  tf.random.normal: "normal",
  tf.random.truncated_normal: "truncated_normal",
}
_KWARGS = {
  "uniform": ("minval", "maxval", "dtype", "seed", "name"),
  "normal": ("mean", "stddev", "dtype", "seed", "name"),
  "truncated_normal": ("mean", "stddev", "dtype", "seed", "name"),
}
_SIGNIFICAND_BITS = {
  tf.bfloat16: 8,
  tf.float16: 11,
  tf.float32: 24,
  tf.float64: 53,
}


def _mix64_py(z: int) -> int:
  """splitmix64 finaliser on a Python int (mod 2**64)."""
  z &= _MASK64
  z = ((z ^ (z >> 30)) * _MIX1) & _MASK64
  z = ((z ^ (z >> 27)) * _MIX2) & _MASK64
  return z ^ (z >> 31)


def _u64(value: int) -> tf.Tensor:
  return tf.constant(value & _MASK64, dtype=tf.uint64)


def _mix64(z: tf.Tensor) -> tf.Tensor:
  """splitmix64 finaliser on a uint64 tensor (wrapping arithmetic)."""
  shift = tf.bitwise.right_shift
  z = tf.bitwise.bitwise_xor(z, shift(z, _u64(30))) * _u64(_MIX1)
  z = tf.bitwise.bitwise_xor(z, shift(z, _u64(27))) * _u64(_MIX2)
  return tf.bitwise.bitwise_xor(z, shift(z, _u64(31)))


def _global_index(begin, slice_shape, full_shape) -> tf.Tensor:
  """int64 row-major index in the full tensor of every element of a slice."""
  rank = len(slice_shape)
  strides = [
    int(np.prod(full_shape[i + 1 :], dtype=np.int64)) for i in range(rank)
  ]
  index = tf.constant(0, dtype=tf.int64)
  for axis, (size, stride) in enumerate(zip(slice_shape, strides)):
    start = begin[axis]
    if isinstance(start, int):
      coords = tf.range(start, start + size, dtype=tf.int64)
    else:
      coords = tf.range(size, dtype=tf.int64) + tf.cast(start, tf.int64)
    index += tf.reshape(
      coords * stride, [1] * axis + [size] + [1] * (rank - axis - 1)
    )
  return tf.broadcast_to(index, slice_shape)


def _random_bits(key: tf.Tensor, index: tf.Tensor) -> tf.Tensor:
  """64 hashed bits (uint64) per element of `index`, for stream `key`."""
  counter = tf.bitcast(index + 1, tf.uint64)
  return _mix64(key + counter * _u64(_GAMMA))


def _unit_uniform(bits: tf.Tensor, num_bits: int, dtype) -> tf.Tensor:
  """The top num_bits of `bits` as a float of `dtype` in [0, 1), exactly."""
  top = tf.bitwise.right_shift(bits, _u64(64 - num_bits))
  return tf.cast(top, dtype) * tf.constant(2.0**-num_bits, dtype)


def _uniform_slice(key, index, dtype, minval, maxval) -> tf.Tensor:
  bits = _random_bits(key, index)
  if dtype.is_integer:
    if maxval is None:
      raise ValueError(
        "random_uniform with integer dtype %s needs maxval" % dtype.name
      )
    u = _unit_uniform(bits, 53, tf.float64)
    low = tf.cast(minval, tf.int64)
    span = tf.cast(maxval, tf.int64) - low
    offset = tf.cast(tf.floor(u * tf.cast(span, tf.float64)), tf.int64)
    return tf.cast(low + tf.minimum(offset, span - 1), dtype)
  if dtype not in _SIGNIFICAND_BITS:
    raise ValueError("random_uniform does not support dtype %s" % dtype.name)
  compute = tf.float64 if dtype == tf.float64 else tf.float32
  u = _unit_uniform(bits, _SIGNIFICAND_BITS[dtype], compute)
  maxval = 1.0 if maxval is None else maxval
  low = tf.cast(minval, compute)
  result = u * (tf.cast(maxval, compute) - low) + low
  return tf.cast(result, dtype)


def _normal_slice(key, index, dtype, mean, stddev, truncated) -> tf.Tensor:
  if not dtype.is_floating:
    raise ValueError(
      "random_normal needs a floating dtype, got %s" % dtype.name
    )
  u1 = _unit_uniform(_random_bits(key, index), 53, tf.float64)
  if truncated:
    low = 0.5 * math.erfc(2.0 / math.sqrt(2.0))  # Phi(-2)
    z = tf.math.ndtri(low + u1 * (1.0 - 2.0 * low))
  else:
    key2 = _mix64(tf.bitwise.bitwise_xor(key, _u64(_SECOND_STREAM)))
    u2 = _unit_uniform(_random_bits(key2, index), 53, tf.float64)
    radius = tf.sqrt(-2.0 * tf.math.log1p(-u1))  # 1 - u1 is in (0, 1].
    z = radius * tf.cos((2.0 * math.pi) * u2)
  result = z * tf.cast(stddev, tf.float64) + tf.cast(mean, tf.float64)
  return tf.cast(result, dtype)


class RandomOperation(Operation):
  """A random tensor from tf_fn's distribution, identical on any layout.

  Args:
    mesh: the Mesh.
    shape: the output Shape.
    tf_fn: tf.random.uniform, tf.random.normal or tf.random.truncated_normal
      (their tf.compat.v1 aliases are the same functions).
    **kwargs: as for tf_fn: minval/maxval or mean/stddev, dtype, seed, name
      (`name` also names the operation).
  """

  shared_by_clones = True  # A copy would have to draw the same values.

  def __init__(self, mesh: Mesh, shape, tf_fn: Callable, **kwargs):
    distribution = _DISTRIBUTIONS.get(tf_fn)
    if distribution is None:
      raise ValueError(
        "RandomOperation supports tf_fn in %s, got %r"
        % (sorted(f.__name__ for f in _DISTRIBUTIONS), tf_fn)
      )
    unknown = sorted(set(kwargs) - set(_KWARGS[distribution]))
    if unknown:
      raise TypeError(
        "%s got unexpected keyword arguments %s (allowed: %s)"
        % (tf_fn.__name__, unknown, _KWARGS[distribution])
      )
    seed = kwargs.get("seed")
    if seed is not None and (
      not isinstance(seed, (int, np.integer)) or isinstance(seed, bool)
    ):
      raise TypeError("random seed must be a Python int, got %r" % (seed,))
    super().__init__([], mesh=mesh, name=kwargs.get("name") or "random")
    self._tf_fn = tf_fn
    self._distribution = distribution
    self._kwargs = dict(kwargs)
    dtype = tf.as_dtype(kwargs.get("dtype") or tf.float32)
    self._outputs = [Tensor(self, convert_to_shape(shape), dtype)]

  @property
  def tf_fn(self) -> Callable:
    """The TF random function drawing each slice, e.g. tf.random.uniform."""
    return self._tf_fn

  @property
  def has_gradient(self) -> bool:
    return False

  def _name_hash(self) -> int:
    return zlib.crc32(self.name.encode("utf-8"))

  def _key(self, mesh_impl) -> tf.Tensor:
    """The op's uint64 key (see the module docstring)."""
    seed = self._kwargs.get("seed")
    if seed is not None:
      return _u64(_mix64_py(_mix64_py(int(seed) + _GAMMA) ^ self._name_hash()))
    draw = mesh_impl.first_processor_value(
      lambda: tf.random.uniform([], 0, 2**62, dtype=tf.int64)
    )
    return _mix64(
      tf.bitcast(draw, tf.uint64) + _u64(_mix64_py(self._name_hash()))
    )

  def lower(self, lowering) -> None:
    mesh_impl = lowering.mesh_impl(self)
    out = self.outputs[0]
    full_shape = out.shape.to_integer_list
    slice_shape = mesh_impl.slice_shape(out.shape)
    dtype = out.dtype
    kw = self._kwargs
    key = self._key(mesh_impl)

    if self._distribution == "uniform":

      def sample(index):
        return _uniform_slice(
          key, index, dtype, kw.get("minval", 0), kw.get("maxval")
        )
    else:
      truncated = self._distribution == "truncated_normal"

      def sample(index):
        return _normal_slice(
          key,
          index,
          dtype,
          kw.get("mean", 0.0),
          kw.get("stddev", 1.0),
          truncated,
        )

    def slice_fn(begin):
      return sample(_global_index(begin, slice_shape, full_shape))

    lowering.set_tensor_lowering(
      out,
      mesh_impl.slicewise(slice_fn, mesh_impl.laid_out_slice_begin(out.shape)),
    )


def random_uniform(mesh: Mesh, shape, **kwargs) -> Tensor:
  """Uniform values in [minval, maxval) (default [0, 1)), as tf.random.uniform.

  Example:
    The values do not depend on the mesh: one processor and two give the
    same tensor.

    >>> def uniform_on(converter):
    ...   u = mtf.random_uniform(converter.mesh, "batch:4;hidden:3",
    ...                          minval=-1.0, maxval=1.0, seed=1)
    ...   return converter.convert_mtf_tensor_to_np_array(u)
    >>> u = uniform_on(mtf.test_utils.NumpyConverter())
    >>> u.shape, bool(np.all((u >= -1.0) & (u < 1.0)))
    ((4, 3), True)
    >>> two_processors = mtf.test_utils.NumpyConverter(
    ...     mesh_shape="all:2", layout="batch:all", devices=["cpu:0", "cpu:1"])
    >>> np.array_equal(u, uniform_on(two_processors))
    True

  Args:
    mesh: the mtf Mesh.
    shape: the Shape of the result.

  Returns:
    an mtf Tensor of shape `shape` (dtype from the `dtype` keyword, default
    tf.float32); processors holding the same slice get the same values.
  """
  return RandomOperation(mesh, shape, tf.random.uniform, **kwargs).outputs[0]


def random_normal(mesh: Mesh, shape, **kwargs) -> Tensor:
  """Normal values (mean, stddev), as tf.random.normal.

  Example:
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> n = mtf.random_normal(converter.mesh, "batch:100;hidden:100",
    ...                       stddev=0.02, seed=1)
    >>> n_np = converter.convert_mtf_tensor_to_np_array(n)
    >>> round(float(n_np.std()), 3), bool(abs(n_np.mean()) < 0.001)
    (0.02, True)

  Args:
    mesh: the mtf Mesh.
    shape: the Shape of the result.

  Returns:
    an mtf Tensor of shape `shape` (dtype from the `dtype` keyword, default
    tf.float32); processors holding the same slice get the same values.
  """
  return RandomOperation(mesh, shape, tf.random.normal, **kwargs).outputs[0]


def dropout(
  x: Tensor,
  is_training: bool = True,
  keep_prob: Optional[float] = None,
  rate: Optional[float] = None,
  noise_shape=None,
  name: Optional[str] = None,
) -> Tensor:
  """Zeroes elements with probability rate; float x is rescaled by 1/keep_prob.

  Code written for mesh_tensorflow 0.1.18 and earlier, whose dropout had no
  `is_training` and always dropped, runs unchanged: `dropout(x, rate=0.1)`
  drops (is_training defaults to True), and `dropout(x, 0.9)` (0.1.18's
  positional keep_prob; a non-bool number where is_training goes) keeps 90%.

  Example:
    With the mask drawn over d_model only, whole columns are dropped; kept
    values are scaled by 1 / (1 - rate):

    >>> converter = mtf.test_utils.NumpyConverter()
    >>> x = mtf.ones(converter.mesh, "batch:3;d_model:8")
    >>> h = mtf.dropout(x, True, rate=0.5,
    ...                 noise_shape=mtf.convert_to_shape("d_model:8"))
    >>> h_np = converter.convert_mtf_tensor_to_np_array(h)
    >>> sorted(set(h_np.flatten().tolist())) in ([0.0, 2.0], [0.0], [2.0])
    True
    >>> bool(np.all(h_np == h_np[0]))  # every row has the same mask
    True
    >>> x is mtf.dropout(x, False, rate=0.5)  # not training: unchanged
    True

  Args:
    x: the input.
    is_training: a Python bool; when False, x is returned unchanged.
    keep_prob: probability of keeping an element (give this or `rate`).
    rate: probability of dropping an element (give this or `keep_prob`).
    noise_shape: optional Shape, a subset of x's dims: the mask is drawn on it
      and broadcast along the other dims of x.
    name: optional name prefix for the ops.

  Returns:
    a Tensor like x.

  Raises:
    ValueError: unless exactly one of keep_prob and rate is given, or if
      noise_shape has a dimension that x lacks.
  """
  if isinstance(is_training, float) and keep_prob is None and rate is None:
    is_training, keep_prob = True, is_training  # 0.1.18: dropout(x, keep_prob)
  if (keep_prob is None) == (rate is None):
    raise ValueError(
      "dropout needs exactly one of keep_prob and rate, got "
      "keep_prob=%r, rate=%r" % (keep_prob, rate)
    )
  if keep_prob is None:
    keep_prob = 1.0 - rate
  noise_shape = (
    x.shape if noise_shape is None else convert_to_shape(noise_shape)
  )
  for d in noise_shape.dims:
    if d not in x.shape.dims:
      raise ValueError(
        "dropout noise_shape dimension %s is not a dimension of "
        "x %s" % (d, x.to_string)
      )
  if not is_training or keep_prob == 1.0:
    return x
  name = name or "dropout"
  noise = random_uniform(
    x.mesh, noise_shape, dtype=tf.float32, name=name + "/noise"
  )
  mask = elementwise.cast(
    broadcast_binary.less(noise, float(keep_prob)), x.dtype
  )
  if x.dtype.is_floating:
    mask = mask * (1.0 / keep_prob)
  return binary.multiply(
    x, elementwise.stop_gradient(mask), output_shape=x.shape, name=name
  )


__all__ = ["RandomOperation", "dropout", "random_normal", "random_uniform"]
