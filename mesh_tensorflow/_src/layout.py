"""Layout rules: how tensor dimensions are split over mesh dimensions.

Owns `LayoutRules`, `TensorLayout`, processor numbering and processor groups
(the device groups of collectives), and the split-size helpers models use to
peek at the layout. Pure Python: never imports TensorFlow.
"""

from __future__ import annotations

import numbers
from typing import Any, Iterable, Iterator, Sequence

from mesh_tensorflow._src import shapes

__all__ = [
  "LayoutRules",
  "TensorLayout",
  "convert_to_layout_rules",
  "pnum_to_group",
  "pnum_to_processor_coordinates",
  "pnum_to_processor_coordinates_nd",
  "processor_coordinates_to_pnum",
  "processor_coordinates_to_pnum_map_nd",
  "processor_groups",
  "split_error_message",
  "tensor_dim_to_mesh_dim_size",
  "tensor_dim_to_size_per_split",
]


_parse_pairs = shapes.parse_string_to_list_of_pairs


def _is_int(x: Any) -> bool:
  return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _validate_pair(pair: Any) -> tuple[str, str]:
  if (
    not isinstance(pair, (tuple, list))
    or len(pair) != 2
    or not all(isinstance(name, str) for name in pair)
  ):
    raise ValueError(
      f"Layout rule {pair!r} must be a (tensor_dim_name, mesh_dim_name) pair "
      "of strings"
    )
  return (pair[0], pair[1])


class LayoutRules:
  """A set of (tensor_dim_name, mesh_dim_name) rules, kept in the order given.

  `LayoutRules([("batch", "batch"), ("d_ff", "model")])` splits tensor dim
  `d_ff` over mesh dim `model`. Rules naming a mesh dim absent from the mesh
  are ignored, so one layout serves meshes of different ranks.
  """

  def __init__(self, pairs: Iterable[Any] | str):
    """Builds the rules.

    Args:
      pairs: (tensor_dim_name, mesh_dim_name) pairs; repeats are dropped. A
        string is parsed as `"batch:batch,d_ff:model"`.

    Raises:
      ValueError: if a pair is not two strings.
    """
    if isinstance(pairs, str):
      pairs = _parse_pairs(pairs)
    ordered = []
    for pair in pairs:
      pair = _validate_pair(pair)
      if pair not in ordered:
        ordered.append(pair)
    self._pairs = tuple(ordered)
    self._pair_set = frozenset(ordered)

  @property
  def pairs(self) -> tuple[tuple[str, str], ...]:
    """The rules in the order given."""
    return self._pairs

  def tensor_dimension_to_mesh_axis(
    self, tensor_dimension: Any, mesh_shape: Any
  ) -> int | None:
    """The mesh axis `tensor_dimension` is split over, or None.

    Args:
      tensor_dimension: a Dimension (or a dimension name).
      mesh_shape: anything `convert_to_shape` accepts.

    Returns:
      An int mesh axis, or None if no rule applies within `mesh_shape`.

    Raises:
      ValueError: if the tensor dim maps to more than one mesh dim of the mesh.
    """
    name = _dim_name(tensor_dimension)
    mesh_shape = shapes.convert_to_shape(mesh_shape)
    mesh_names = mesh_shape.dimension_names
    matches = [m for t, m in self._pairs if t == name and m in mesh_names]
    if not matches:
      return None
    if len(matches) > 1:
      raise ValueError(
        f"tensor dimension {name!r} maps to more than one mesh dimension "
        f"({', '.join(repr(m) for m in matches)}) of mesh {mesh_shape} under "
        f"rules {self!r}"
      )
    return mesh_names.index(matches[0])

  def tensor_layout(self, tensor_shape: Any, mesh_shape: Any) -> TensorLayout:
    """The TensorLayout of `tensor_shape` on `mesh_shape`.

    With rules `d_ff:model`, `Shape[batch=8, d_ff=64]` on `Shape[model=4]`
    -> `TensorLayout((None, 0))`.

    Args:
      tensor_shape: a Shape (or anything convert_to_shape accepts).
      mesh_shape: the mesh Shape.

    Returns:
      a TensorLayout: for each tensor axis, the mesh axis it is split over, or
      None.

    Raises:
      ValueError: if two tensor dims are laid out over the same mesh dim.
    """
    tensor_shape = shapes.convert_to_shape(tensor_shape)
    mesh_shape = shapes.convert_to_shape(mesh_shape)
    mesh_axes = [
      self.tensor_dimension_to_mesh_axis(d, mesh_shape) for d in tensor_shape
    ]
    mesh_axis_to_dim_name = {}
    for dim, mesh_axis in zip(tensor_shape, mesh_axes):
      if mesh_axis is None:
        continue
      mesh_name = mesh_shape[mesh_axis].name
      if mesh_axis in mesh_axis_to_dim_name:
        first = mesh_axis_to_dim_name[mesh_axis]
        raise ValueError(
          f"tensor dimensions {first!r} and {dim.name!r} of {tensor_shape} "
          f"are both laid out over mesh dimension {mesh_name!r} (rules "
          f"{(first, mesh_name)!r} and {(dim.name, mesh_name)!r}; mesh "
          f"{mesh_shape})"
        )
      mesh_axis_to_dim_name[mesh_axis] = dim.name
    return TensorLayout(mesh_axes)

  def mesh_dimension_name_to_tensor_dimension_names(
    self, mesh_dimension_name: str
  ) -> list[str]:
    """Tensor dim names laid out over `mesh_dimension_name`, in rule order.

    Args:
      mesh_dimension_name: a mesh dim name.

    Returns:
      a list of tensor dim names.
    """
    return [t for t, m in self._pairs if m == mesh_dimension_name]

  def unknown_mesh_dimensions(self, mesh_shape: Any) -> list[str]:
    """Sorted mesh dim names used by the rules but absent from `mesh_shape`.

    Args:
      mesh_shape: the mesh Shape (or anything convert_to_shape accepts).

    Returns:
      a sorted list of mesh dim names.
    """
    mesh_names = set(shapes.convert_to_shape(mesh_shape).dimension_names)
    return sorted({m for _, m in self._pairs} - mesh_names)

  def __iter__(self) -> Iterator[tuple[str, str]]:
    return iter(self._pairs)

  def __len__(self) -> int:
    return len(self._pairs)

  def __eq__(self, other: Any) -> bool:
    if not isinstance(other, LayoutRules):
      return NotImplemented
    return self._pair_set == other._pair_set

  def __hash__(self) -> int:
    return hash(self._pair_set)

  def __repr__(self) -> str:
    return f"LayoutRules({list(self._pairs)!r})"


def _dim_name(tensor_dimension: Any) -> str:
  if isinstance(tensor_dimension, str):
    return tensor_dimension
  return shapes.convert_to_dimension(tensor_dimension).name


def convert_to_layout_rules(x: Any) -> LayoutRules:
  """Converts `x` to LayoutRules.

  `"batch:batch,d_ff:model"` -> `LayoutRules([('batch', 'batch'),
  ('d_ff', 'model')])`; `{}` and `[]` give empty rules.

  Args:
    x: LayoutRules, a string, a dict {tensor_dim_name: mesh_dim_name}, or an
      iterable of pairs.

  Returns:
    the LayoutRules.

  Raises:
    TypeError: if `x` is None.
  """
  if isinstance(x, LayoutRules):
    return x
  if x is None:
    raise TypeError("Cannot convert None to LayoutRules; use [] for no rules")
  if isinstance(x, dict):
    return LayoutRules(x.items())
  return LayoutRules(x)


class TensorLayout:
  """For each tensor axis, the mesh axis it is split over (or None).

  `TensorLayout((None, 0))`: axis 0 replicated, axis 1 split over mesh axis 0.
  Immutable and hashable; built without a mesh (as the original), so mesh axes
  are checked only against the number of mesh axes a caller asks about.

  Args:
    tensor_axis_to_mesh_axis: for each tensor axis, the int mesh axis it is
      split over, or None if it is not split.

  Raises:
    ValueError: if an entry is not None or a non-negative int, or if two tensor
      axes are split over the same mesh axis.
  """

  __slots__ = ("_tensor_axis_to_mesh_axis",)

  def __init__(self, tensor_axis_to_mesh_axis: Iterable[int | None]):
    axes = tuple(tensor_axis_to_mesh_axis)
    used = set()
    for mesh_axis in axes:
      if mesh_axis is None:
        continue
      if not _is_int(mesh_axis) or mesh_axis < 0:
        raise ValueError(
          f"TensorLayout entries must be None or non-negative ints, got "
          f"{mesh_axis!r} in {axes!r}"
        )
      if mesh_axis in used:
        raise ValueError(
          f"TensorLayout {axes!r} lays out two tensor axes over mesh axis "
          f"{mesh_axis}"
        )
      used.add(mesh_axis)
    self._tensor_axis_to_mesh_axis = tuple(
      None if a is None else int(a) for a in axes
    )

  @property
  def tensor_axis_to_mesh_axis(self) -> tuple[int | None, ...]:
    """For each tensor axis, its mesh axis (or None if not split)."""
    return self._tensor_axis_to_mesh_axis

  def __eq__(self, other) -> bool:
    if not isinstance(other, TensorLayout):
      return NotImplemented
    return self._tensor_axis_to_mesh_axis == other.tensor_axis_to_mesh_axis

  def __hash__(self) -> int:
    return hash(self._tensor_axis_to_mesh_axis)

  def __repr__(self) -> str:
    return "TensorLayout%s" % (self._tensor_axis_to_mesh_axis,)

  @property
  def is_fully_replicated(self) -> bool:
    """Whether no tensor axis is split (each processor has the whole)."""
    return all(a is None for a in self.tensor_axis_to_mesh_axis)

  def mesh_axis_to_tensor_axis(self, mesh_ndims: int) -> tuple[int | None, ...]:
    """For each mesh axis, the tensor axis split over it (or None).

    `TensorLayout((None, 0)).mesh_axis_to_tensor_axis(2)` -> `(1, None)`.
    Mesh axes from `mesh_ndims` on are left out, as in the original.

    Args:
      mesh_ndims: the number of mesh axes.

    Returns:
      a tuple with one entry per mesh axis: the tensor axis split over it, or
      None.
    """
    result = [None] * mesh_ndims
    for tensor_axis, mesh_axis in enumerate(self.tensor_axis_to_mesh_axis):
      if mesh_axis is not None and mesh_axis < mesh_ndims:
        result[mesh_axis] = tensor_axis
    return tuple(result)

  def __len__(self) -> int:
    return len(self.tensor_axis_to_mesh_axis)

  def __getitem__(self, key):
    return self.tensor_axis_to_mesh_axis[key]

  def __iter__(self) -> Iterator[int | None]:
    return iter(self.tensor_axis_to_mesh_axis)


# Processor numbering: row-major over the mesh, last mesh axis fastest.


def _mesh_sizes(mesh_shape: Any) -> list[int]:
  """Sizes of a Shape, shape string, or list of ints / Dimensions."""
  if isinstance(mesh_shape, (shapes.Shape, str)):
    return shapes.convert_to_shape(mesh_shape).to_integer_list
  sizes = []
  for x in mesh_shape:
    if isinstance(x, (tuple, list)):
      sizes.append(shapes.convert_to_dimension(x).size)
    elif _is_int(x):
      sizes.append(int(x))
    else:
      raise ValueError(f"Invalid mesh shape {mesh_shape!r}: entry {x!r}")
  return sizes


def pnum_to_processor_coordinates(mesh_shape: Any, pnum: int) -> list[int]:
  """Coordinates of processor `pnum`; e.g. `([2, 3], 4)` -> `[1, 1]`.

  Args:
    mesh_shape: a Shape (or shape string) or a list of ints.
    pnum: a processor number in [0, mesh size).

  Returns:
    a list of ints: the coordinate of the processor along each mesh axis
    (row-major order).

  Raises:
    ValueError: if `pnum` is out of range.
  """
  sizes = _mesh_sizes(mesh_shape)
  if not 0 <= pnum < shapes.list_product(sizes):
    raise ValueError(f"pnum {pnum} out of range for mesh shape {sizes}")
  coords = []
  for size in reversed(sizes):
    coords.append(pnum % size)
    pnum //= size
  return coords[::-1]


def processor_coordinates_to_pnum(mesh_shape: Any, coord: Sequence[int]) -> int:
  """Processor number at `coord`; e.g. `([2, 3], [1, 1])` -> 4.

  Args:
    mesh_shape: a Shape (or shape string) or a list of ints.
    coord: one int coordinate per mesh axis.

  Returns:
    the int processor number.

  Raises:
    ValueError: if `coord` has the wrong length or is out of range.
  """
  sizes = _mesh_sizes(mesh_shape)
  if len(coord) != len(sizes) or not all(
    0 <= c < s for c, s in zip(coord, sizes)
  ):
    raise ValueError(
      f"Processor coordinates {list(coord)} invalid for mesh shape {sizes}"
    )
  pnum = 0
  for c, size in zip(coord, sizes):
    pnum = pnum * size + c
  return pnum


def pnum_to_processor_coordinates_nd(
  mesh_shape: Any, pnum: int, device_assignment
) -> list[int]:
  """Physical coordinates of replica `pnum` under a TPU device assignment.

  Args:
    mesh_shape: unused (kept for the original's signature).
    pnum: a replica number.
    device_assignment: a tf.tpu.experimental.DeviceAssignment (or anything
      with its `coordinates(replica, logical_core)` method).

  Returns:
    the coordinates of the replica's first logical core, e.g. [x, y, z, core].
  """
  del mesh_shape
  return list(device_assignment.coordinates(pnum, 0))


def processor_coordinates_to_pnum_map_nd(
  mesh_shape: Any,
  logical_to_physical: Sequence[Sequence[int]],
  device_assignment,
) -> list[int]:
  """Replica numbers of the physical coordinates in `logical_to_physical`.

  Each replica's first core sits at physical (x, y, z) of the TPU topology;
  the replica found at the i-th coordinates of `logical_to_physical` is
  entry i. As the original, a coordinate [x, y, ...] is looked up by
  position x + y * mesh_shape[0] among the replicas numbered by physical
  position (x first, then y, then z), which is right for meshes whose first
  axis spans the topology's first axis and which have one z-plane.

  Args:
    mesh_shape: a Shape or list of ints (its first size is used).
    logical_to_physical: physical coordinates, one per logical processor.
    device_assignment: a tf.tpu.experimental.DeviceAssignment (or anything
      with `num_replicas`, `topology.mesh_shape` and `coordinates`).

  Returns:
    a list of replica numbers, one per logical processor.
  """
  sizes = _mesh_sizes(mesh_shape)
  hw_x, hw_y = [int(n) for n in device_assignment.topology.mesh_shape][:2]
  replica_at = [-1] * device_assignment.num_replicas
  for replica in range(device_assignment.num_replicas):
    x, y, z = list(device_assignment.coordinates(replica, 0))[:3]
    replica_at[x + hw_x * (y + hw_y * z)] = replica
  return [
    replica_at[coord[0] + coord[1] * sizes[0]] for coord in logical_to_physical
  ]


def _validate_group_dims(
  sizes: list[int], group_dims: Iterable[int]
) -> set[int]:
  group_dims = list(group_dims)
  for axis in group_dims:
    if not _is_int(axis) or not 0 <= axis < len(sizes):
      raise ValueError(
        f"Invalid mesh axis {axis!r} in group_dims {group_dims} for mesh "
        f"shape {sizes}"
      )
  return set(group_dims)


def pnum_to_group(mesh_shape: Any, group_dims: Iterable[int], pnum: int) -> int:
  """Index of the group (see `processor_groups`) containing `pnum`.

  `([2, 3], [1], 4)` -> 1: processors 3, 4, 5 form group 1.

  Args:
    mesh_shape: a Shape (or shape string) or a list of ints.
    group_dims: the mesh axes along which members of a group differ.
    pnum: a processor number.

  Returns:
    the int index of the group in processor_groups(mesh_shape, group_dims).
  """
  sizes = _mesh_sizes(mesh_shape)
  group_axes = _validate_group_dims(sizes, group_dims)
  coords = pnum_to_processor_coordinates(sizes, pnum)
  outer = [i for i in range(len(sizes)) if i not in group_axes]
  return processor_coordinates_to_pnum(
    [sizes[i] for i in outer], [coords[i] for i in outer]
  )


def processor_groups(
  mesh_shape: Any, group_dims: Iterable[int]
) -> list[list[int]]:
  """Processors grouped so that members differ only along `group_dims`.

  `([2, 3], [1])` -> `[[0, 1, 2], [3, 4, 5]]`; `([2, 3], [0])` ->
  `[[0, 3], [1, 4], [2, 5]]`. Groups are ordered by first pnum; each group is
  in row-major order of its coordinates along `group_dims`.

  Args:
    mesh_shape: a Shape (or shape string) or a list of ints.
    group_dims: the mesh axes along which members of a group differ.

  Returns:
    a list of groups, each a list of processor numbers.
  """
  sizes = _mesh_sizes(mesh_shape)
  group_axes = _validate_group_dims(sizes, group_dims)
  num_groups = shapes.list_product(
    s for i, s in enumerate(sizes) if i not in group_axes
  )
  groups = [[] for _ in range(num_groups)]
  for pnum in range(shapes.list_product(sizes)):
    groups[pnum_to_group(sizes, group_axes, pnum)].append(pnum)
  return groups


# Split sizes, used by models to peek at the layout while building the graph.


def split_error_message(tensor_dim: Any, mesh_dim: Any) -> str:
  """The error for a tensor dim that does not divide over a mesh dim.

  `(Dimension("heads", 6), Dimension("model", 4))` -> "dimension 'heads'
  (size 6) does not divide over mesh dim 'model' (size 4) under rule
  ('heads', 'model')".
  """
  tensor_dim = shapes.convert_to_dimension(tensor_dim)
  mesh_dim = shapes.convert_to_dimension(mesh_dim)
  return (
    f"dimension {tensor_dim.name!r} (size {tensor_dim.size}) does not divide "
    f"over mesh dim {mesh_dim.name!r} (size {mesh_dim.size}) under rule "
    f"{(tensor_dim.name, mesh_dim.name)!r}"
  )


def _split_mesh_dim(
  layout: Any, mesh_shape: Any, tensor_dim: Any
) -> shapes.Dimension | None:
  layout_rules = convert_to_layout_rules(layout)
  mesh_shape = shapes.convert_to_shape(mesh_shape)
  mesh_axis = layout_rules.tensor_dimension_to_mesh_axis(tensor_dim, mesh_shape)
  return None if mesh_axis is None else mesh_shape[mesh_axis]


def tensor_dim_to_mesh_dim_size(
  layout: Any, mesh_shape: Any, tensor_dim: Any
) -> int:
  """Number of pieces `tensor_dim` is split into (1 if unsplit).

  `("d_ff:model", "model:4", Dimension("d_ff", 64))` -> 4.

  Args:
    layout: layout rules (LayoutRules or anything convert_to_layout_rules
      accepts).
    mesh_shape: the mesh Shape (or anything convert_to_shape accepts).
    tensor_dim: a Dimension.

  Returns:
    the int number of pieces.
  """
  mesh_dim = _split_mesh_dim(layout, mesh_shape, tensor_dim)
  return 1 if mesh_dim is None else mesh_dim.size


def tensor_dim_to_size_per_split(
  layout: Any, mesh_shape: Any, tensor_dim: Any
) -> int:
  """Size of each piece of `tensor_dim`.

  `("d_ff:model", "model:4", Dimension("d_ff", 64))` -> 16.

  Args:
    layout: layout rules (LayoutRules or anything convert_to_layout_rules
      accepts).
    mesh_shape: the mesh Shape (or anything convert_to_shape accepts).
    tensor_dim: a Dimension.

  Returns:
    the int size of each piece.

  Raises:
    ValueError: if the mesh dim size does not divide the tensor dim size.
  """
  tensor_dim = shapes.convert_to_dimension(tensor_dim)
  mesh_dim = _split_mesh_dim(layout, mesh_shape, tensor_dim)
  if mesh_dim is None:
    return tensor_dim.size
  if tensor_dim.size % mesh_dim.size:
    raise ValueError(split_error_message(tensor_dim, mesh_dim))
  return tensor_dim.size // mesh_dim.size
