"""Dimension and Shape: the named axes of tensors and meshes.

Owns `Dimension`, `Shape`, the conversions to them, and the `name:value` string
grammar used for mesh shapes and layouts. Pure Python: never imports TensorFlow.
"""

from __future__ import annotations

import collections
import numbers
import re
from typing import Any, Iterable, Iterator, Sequence

__all__ = [
  "Dimension",
  "Shape",
  "anonymous_shape",
  "combined_dimension",
  "convert_to_dimension",
  "convert_to_shape",
  "is_subsequence",
  "list_product",
  "verify_no_new_dims",
]

Dimension = collections.namedtuple("Dimension", ["name", "size"])
Dimension.__doc__ = """A named axis, e.g. `Dimension("batch", 8)`."""

# Separators between `name:value` tokens in the string grammar.
_TOKEN_SEPARATORS = re.compile(r"[,.;\s]+")


def _is_int(x: Any) -> bool:
  return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def convert_to_dimension(d: Any) -> Dimension | None:
  """Converts `d` to a validated Dimension.

  `("batch", 8)` -> `Dimension(name="batch", size=8)`; `None` -> `None`.

  Args:
    d: None, a Dimension, or a (name, size) pair.

  Returns:
    A Dimension with a `str` name and an `int` size, or None.

  Raises:
    TypeError: if `d` is not a pair (e.g. an int).
    ValueError: if the name is not a string or the size is not an integer.
  """
  if d is None:
    return None
  if not isinstance(d, Dimension):
    if not isinstance(d, (tuple, list)):
      raise TypeError(
        f"Cannot convert {d!r} of type {type(d).__name__} to a Dimension: "
        "expected a Dimension or a (name, size) pair"
      )
    if len(d) != 2:
      raise ValueError(
        f"Cannot convert {d!r} to a Dimension: expected a (name, size) pair"
      )
  name, size = d
  if not isinstance(name, str):
    raise ValueError(
      f"Dimension name must be a str, got {name!r} in {tuple(d)!r}"
    )
  if not _is_int(size):
    raise ValueError(
      f"Dimension size must be an int, got {size!r} in {tuple(d)!r}"
    )
  if isinstance(d, Dimension) and size.__class__ is int:
    return d
  return Dimension(name, int(size))


class Shape:
  """An ordered list of distinct Dimensions.

  `Shape([("a", 2), ("b", 3)])` prints as `Shape[a=2, b=3]`. Shapes are
  immutable; operators return new Shapes. Like the original, Shape defines
  `__eq__` without `__hash__`, so it is unhashable.

  As in the original, a Dimension (name and size) may occur once only, but
  one name may be used by dimensions of different sizes: `[d_model=6,
  d_model=2]` is the shape of a kernel projecting d_model to a smaller
  d_model. Lookups by name (`get_dim_by_name`) find the first one; layout
  rules apply to both, so a name split over a mesh dimension can occur only
  once in a tensor; einsum tells them apart by size. Einsum and broadcasting
  binary ops still reject a name with two sizes across their operands
  unless an operand itself has both.
  """

  def __init__(self, dims: Iterable[Any]):
    """Builds a Shape.

    Args:
      dims: Dimensions or (name, size) pairs.

    Raises:
      ValueError: on a repeated Dimension (same name and size) or an invalid
        dimension.
    """
    converted = []
    for d in dims:
      d = convert_to_dimension(d)
      if d is None:
        raise ValueError("Shape dimensions must not be None")
      converted.append(d)
    self._dims = converted
    if len(set(converted)) != len(converted):
      repeated = next(d for i, d in enumerate(converted) if d in converted[:i])
      raise ValueError(
        f"Shape has duplicate dimension {repeated.name!r}: {self.to_string}"
      )

  @property
  def dims(self) -> list[Dimension]:
    """A copy of the list of Dimensions."""
    return list(self._dims)

  @property
  def ndims(self) -> int:
    """The number of dimensions."""
    return len(self._dims)

  @property
  def to_integer_list(self) -> list[int]:
    """The dimension sizes, as a list of ints."""
    return [d.size for d in self._dims]

  @property
  def size(self) -> int:
    """The number of elements (product of the dimension sizes)."""
    return list_product(self.to_integer_list)

  @property
  def to_string(self) -> str:
    """The shape as "Shape[name=size, ...]", as repr() prints it."""
    return "Shape[%s]" % ", ".join(f"{d.name}={d.size}" for d in self._dims)

  @property
  def cumprod(self) -> list[int]:
    """Exclusive cumulative product from the left.

    `Shape[a=2, b=3, c=4]` -> `[1, 2, 6]`.
    """
    result = []
    running = 1
    for d in self._dims:
      result.append(running)
      running *= d.size
    return result

  @property
  def dimension_names(self) -> list[str]:
    """The names of the dimensions, in order."""
    return [d.name for d in self._dims]

  def cumprod_to_tensor_axis(self, cumprod: int) -> int | None:
    """The largest tensor axis whose exclusive cumprod is `cumprod`.

    For `Shape[a=2, b=3]`, `cumprod_to_tensor_axis(2)` -> 1; 5 -> None.

    Args:
      cumprod: a product of dimension sizes.

    Returns:
      the int tensor axis, or None if no axis has that exclusive cumprod.
    """
    matches = [axis for axis, c in enumerate(self.cumprod) if c == cumprod]
    return matches[-1] if matches else None

  def rename_dimension(self, old_name: str, new_name: str) -> Shape:
    """Returns a copy with dimension `old_name` renamed (no-op if absent).

    Args:
      old_name: the name of a dimension.
      new_name: its new name.

    Returns:
      a new Shape.
    """
    return Shape(
      [
        Dimension(new_name, d.size) if d.name == old_name else d
        for d in self._dims
      ]
    )

  def resize_dimension(self, name: str, new_size: int) -> Shape:
    """Returns a copy with dimension `name` resized (no-op if absent).

    Args:
      name: the name of a dimension.
      new_size: its new size.

    Returns:
      a new Shape.
    """
    return Shape(
      [Dimension(name, new_size) if d.name == name else d for d in self._dims]
    )

  def get_dim_by_name(self, name: str) -> Dimension:
    """Returns the Dimension called `name`.

    Args:
      name: a dimension name.

    Returns:
      the Dimension.

    Raises:
      ValueError: if there is no such dimension.
    """
    for d in self._dims:
      if d.name == name:
        return d
    raise ValueError(f"{self.to_string} has no dimension named {name!r}")

  # Container protocol.

  def __len__(self) -> int:
    return len(self._dims)

  def __getitem__(self, key):
    """An int gives a Dimension; a slice gives a list of Dimensions."""
    return self._dims[key]

  def __iter__(self) -> Iterator[Dimension]:
    return iter(self._dims)

  def __contains__(self, item: Any) -> bool:
    if isinstance(item, (tuple, list)) and len(item) == 2:
      return tuple(item) in self._dims
    return False

  # Comparison: by the list of dims. No __hash__ (faithful to the original).

  def __eq__(self, other: Any) -> bool:
    if isinstance(other, Shape):
      return self._dims == other._dims
    if isinstance(other, (list, tuple)) and not isinstance(other, Dimension):
      try:
        return self._dims == Shape(other)._dims
      except (TypeError, ValueError):
        return False
    return NotImplemented

  __hash__ = None  # Explicit: Shape is unhashable.

  # Arithmetic: `+` appends, `-` removes.

  def __add__(self, other: Any) -> Shape:
    other_dims = _dims_of(other)
    if other_dims is None:
      return NotImplemented
    return Shape(self._dims + other_dims)

  def __radd__(self, other: Any) -> Shape:
    other_dims = _dims_of(other)
    if other_dims is None:
      return NotImplemented
    return Shape(other_dims + self._dims)

  def __sub__(self, other: Any) -> Shape:
    """Removes dims.

    A single Dimension must be present; a Shape or list tolerates absent dims;
    `None` removes nothing.
    """
    if other is None:
      return self
    if isinstance(other, Dimension):
      other = convert_to_dimension(other)
      if other not in self._dims:
        raise ValueError(
          f"Cannot subtract {other} from {self.to_string}: not present"
        )
      return Shape([d for d in self._dims if d != other])
    other_dims = _dims_of(other)
    if other_dims is None:
      return NotImplemented
    return Shape([d for d in self._dims if d not in other_dims])

  def __repr__(self) -> str:
    return self.to_string

  __str__ = __repr__


def _dims_of(x: Any) -> list[Dimension] | None:
  """Dims of a Shape, Dimension, or list/tuple of dims; None if unsupported."""
  if isinstance(x, Shape):
    return x.dims
  if isinstance(x, Dimension):
    return [convert_to_dimension(x)]
  if isinstance(x, (list, tuple)):
    return Shape(x).dims
  return None


def convert_to_shape(x: Any) -> Shape | None:
  """Converts `x` to a Shape.

  `"batch:8;model:4"` -> `Shape[batch=8, model=4]`; `[]` -> `Shape[]`.

  Args:
    x: None, a Shape, a string in the `name:size` grammar, or an iterable of
      Dimensions or (name, size) pairs.

  Returns:
    A Shape, or None if `x` is None.
  """
  if x is None:
    return None
  if isinstance(x, Shape):
    return x
  if isinstance(x, str):
    return Shape(parse_string_to_list_of_pairs(x, seconds_to_int=True))
  return Shape(x)


def parse_string_to_list_of_pairs(
  s: str, seconds_to_int: bool = False
) -> list[tuple[str, Any]]:
  """Parses `name:value` tokens separated by `,`, `.`, `;` or whitespace.

  `"b1:2.b2:2"` -> `[("b1", "2"), ("b2", "2")]` (ints if `seconds_to_int`).

  Args:
    s: the string; `""` gives `[]`.
    seconds_to_int: whether to convert each value to an int.

  Returns:
    A list of (name, value) pairs.

  Raises:
    ValueError: on a malformed token or (with `seconds_to_int`) a non-integer
      value.
  """
  pairs = []
  for token in _TOKEN_SEPARATORS.split(s):
    if not token:
      continue
    parts = token.split(":")
    if len(parts) != 2 or not parts[0] or not parts[1]:
      raise ValueError(
        f"Invalid token {token!r} in {s!r}: expected name:value with exactly "
        "one ':'"
      )
    name, value = parts
    if seconds_to_int:
      try:
        value = int(value)
      except ValueError:
        raise ValueError(
          f"Invalid token {token!r} in {s!r}: value {value!r} is not an integer"
        ) from None
    pairs.append((name, value))
  return pairs


def combined_dimension(
  dims: Sequence[Any], name: str | None = None
) -> Dimension:
  """One Dimension whose size is the product of `dims`' sizes.

  `[a=2, b=3]` -> `Dimension("a", 6)`.

  Args:
    dims: Dimensions or (name, size) pairs.
    name: the new name; defaults to the first dimension's name.

  Returns:
    A Dimension.

  Raises:
    ValueError: if `dims` is empty and no name is given.
  """
  dims = [convert_to_dimension(d) for d in dims]
  if name is None:
    if not dims:
      raise ValueError("combined_dimension of no dims needs a name")
    name = dims[0].name
  return Dimension(name, list_product(d.size for d in dims))


def anonymous_shape(shape: Any) -> Shape:
  """Same sizes, names `_anonymous_0`, `_anonymous_1`, ...

  `Shape[a=2, b=3]` -> `Shape[_anonymous_0=2, _anonymous_1=3]`.

  Args:
    shape: a Shape (or anything convert_to_shape accepts).

  Returns:
    a Shape with anonymous dimension names and the same sizes.
  """
  shape = convert_to_shape(shape)
  return Shape(
    [Dimension(f"_anonymous_{i}", d.size) for i, d in enumerate(shape)]
  )


def names_with_several_sizes(shapes: Iterable[Shape | None]) -> set[str]:
  """The names that one of `shapes` itself gives to dimensions of two sizes.

  Operations that combine shapes treat a name with two sizes across their
  operands as a mistake, unless an operand already has both (a deliberate
  `[d_model=6, d_model=2]`).

  Example:
    >>> names_with_several_sizes([Shape([("a", 2)]), Shape([("b", 2), ("b", 3)])])
    {'b'}

  Args:
    shapes: Shapes (None entries are skipped).

  Returns:
    a set of dimension names.
  """
  names = set()
  for shape in shapes:
    if shape is None:
      continue
    seen = set()
    for name in shape.dimension_names:
      if name in seen:
        names.add(name)
      seen.add(name)
  return names


def is_subsequence(short_seq: Sequence[Any], long_seq: Sequence[Any]) -> bool:
  """Whether `short_seq` appears in `long_seq` in order (gaps allowed).

  `is_subsequence([1, 3], [1, 2, 3])` -> True; `([3, 1], [1, 2, 3])` -> False.

  Args:
    short_seq: a sequence.
    long_seq: a sequence.

  Returns:
    a bool.
  """
  remaining = iter(long_seq)
  return all(any(x == y for y in remaining) for x in short_seq)


def list_product(l: Iterable[int]) -> int:
  """Product of the elements; 1 for an empty iterable.

  Args:
    l: an iterable of ints.

  Returns:
    an int.
  """
  result = 1
  for x in l:
    result *= x
  return result


def verify_no_new_dims(input_shapes: Sequence[Any], output_shape: Any) -> None:
  """ValueError if output_shape has a dimension no input has.

  Args:
    input_shapes: the Shapes of the inputs.
    output_shape: the Shape of the output.

  Raises:
    ValueError: if a dimension of output_shape is in no input shape.
  """
  all_dims = set()
  for s in input_shapes:
    all_dims.update(convert_to_shape(s).dims)
  for d in convert_to_shape(output_shape).dims:
    if d not in all_dims:
      raise ValueError(
        "output dimension %s is not in any input shape %s"
        % (d, [convert_to_shape(s).to_string for s in input_shapes])
      )
