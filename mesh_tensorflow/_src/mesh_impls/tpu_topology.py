"""TPU topology helpers: mapping a logical mesh onto the physical TPU mesh.

SimdMeshImpl numbers processors twice: the LOGICAL pnum enumerates the mtf mesh
shape lexicographically, the PHYSICAL pnum is the TPU replica id. A
`logical_to_physical` list (a permutation of range(num_processors)) maps one to
the other; choosing it well puts the processors of each collective group close
together on the TPU interconnect. This module computes such permutations:

  - `_ring_2d(m, n)`: a snake ring visiting every cell of an m x n grid.
  - `_logical_1d_to_physical_subspace_auto` / `_logical_to_physical_v1`: map
    each logical mesh dimension to a strided sub-grid ("subspace") of the
    physical mesh and add up the per-dimension coordinates.
  - `HierarchicalTiling`: a named, hand-written tiling spec on top of those.
  - `auto_logical_to_physical_tpu`: the automatic choice for a chips x 2-cores
    TPU mesh (identity for shapes the heuristic does not cover).
  - `physical_shape_3d_from_topology_proto_4d`: [x, y, z, core] -> [y*z, x,
    core], the 3-d form the heuristics use.

Pure Python (no TensorFlow).
"""

from __future__ import annotations

import numbers
from typing import Any, Callable, List, Optional, Sequence, Tuple

from absl import logging

from mesh_tensorflow._src import layout as layout_lib
from mesh_tensorflow._src import shapes

__all__ = [
  "HierarchicalTiling",
  "auto_logical_to_physical_tpu",
  "physical_shape_3d_from_topology_proto_4d",
]

SizesAndStrides = Sequence[Tuple[int, int]]


def _is_int(x: Any) -> bool:
  return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _check_sizes(sizes: Any, what: str, allow_empty: bool = True) -> List[int]:
  """Returns `sizes` as a list of positive ints; ValueError naming `what`."""
  try:
    sizes = list(sizes)
  except TypeError:
    raise ValueError(
      f"{what} must be a list of positive integers, got {sizes!r}"
    ) from None
  if not sizes and not allow_empty:
    raise ValueError(f"{what} must not be empty")
  for i, s in enumerate(sizes):
    if not _is_int(s) or s <= 0:
      raise ValueError(
        f"{what} must be a list of positive integers; entry {i} "
        f"is {s!r} in {sizes}"
      )
  return [int(s) for s in sizes]


def _is_power_of_2(x: int) -> bool:
  return x > 0 and x & (x - 1) == 0


def _ring_2d(m: int, n: int) -> List[Tuple[int, int]]:
  """A ring (closed walk of neighbour steps) over the cells of an m x n grid.

  For even m the cycle starts at (0, 0), runs along row 0, snakes back and
  forth over columns 1..n-1 two rows at a time, and returns to (0, 0) up
  column 0. For m = n = 4 (cell -> step):

      0 -- 1 -- 2 -- 3
      |              |
     15    6 -- 5 -- 4
      |    |
     14    7 -- 8 -- 9
      |              |
     13 --12 --11 --10

  For odd m and even n the same cycle is built on the transposed grid. A grid
  of odd size (m and n odd) has no such cycle (it is bipartite with an odd
  number of cells); it gets a row-by-row snake path, whose steps are still all
  between neighbours but whose end is not next to its start. A 1 x n or m x 1
  grid gives the straight line.

  Example:
    >>> _ring_2d(2, 2)
    [(0, 0), (0, 1), (1, 1), (1, 0)]
    >>> _ring_2d(1, 3)
    [(0, 0), (0, 1), (0, 2)]

  Args:
    m: number of rows, a positive int.
    n: number of columns, a positive int.

  Returns:
    a list of the m*n (row, column) pairs in ring order.

  Raises:
    ValueError: if m or n is not a positive int.
  """
  m, n = _check_sizes([m, n], "_ring_2d grid shape (m, n)")
  if m == 1:
    return [(0, j) for j in range(n)]
  if n == 1:
    return [(i, 0) for i in range(m)]
  if m % 2 == 0:
    ring = [(0, 0)]
    for pair in range(m // 2):
      ring.extend((2 * pair, j) for j in range(1, n))
      ring.extend((2 * pair + 1, j) for j in range(n - 1, 0, -1))
    ring.extend((i, 0) for i in range(m - 1, 0, -1))
    return ring
  if n % 2 == 0:
    return [(i, j) for j, i in _ring_2d(n, m)]
  logging.warning(
    "_ring_2d: grid %dx%d has odd size; no closed ring exists, "
    "using a snake path",
    m,
    n,
  )
  path = []
  for i in range(m):
    cols = range(n) if i % 2 == 0 else range(n - 1, -1, -1)
    path.extend((i, j) for j in cols)
  return path


def _logical_1d_to_physical_subspace_auto(
  sizes_and_strides: SizesAndStrides, physical_shape: Optional[Sequence[int]]
) -> List[List[int]]:
  """Maps a 1-d logical mesh onto a strided sub-grid of the physical mesh.

  `sizes_and_strides` lists one (size, stride) pair per physical axis; the
  sub-grid ("subspace") holds the points whose coordinate on axis i is a
  multiple of stride_i below size_i * stride_i. E.g. [(2, 16), (4, 1)] is
  {(0, 0), (0, 1), (0, 2), (0, 3), (16, 0), (16, 1), (16, 2), (16, 3)}.

  Order (heuristic, for fast allreduce along the logical dimension): when the
  first two axes both have size > 1, they are merged and walked along
  `_ring_2d(size_0, size_1)`, as the slower-varying part; the remaining axes
  vary faster, lexicographically. Otherwise the sub-grid is enumerated
  lexicographically. Coordinates are finally multiplied by the strides.

  Example:
    >>> _logical_1d_to_physical_subspace_auto([(2, 1), (2, 1)], None)
    [[0, 0], [0, 1], [1, 1], [1, 0]]

  Args:
    sizes_and_strides: a list of (size, stride) pairs, one per physical axis.
    physical_shape: unused (kept for the `fn_1d` signature).

  Returns:
    a list of physical coordinate lists, one per logical index.

  Raises:
    ValueError: if a size or stride is not a positive int.
  """
  del physical_shape
  pairs = [tuple(p) for p in sizes_and_strides]
  for p in pairs:
    if len(p) != 2:
      raise ValueError(
        f"sizes_and_strides entry {p!r} is not a (size, stride) "
        f"pair in {sizes_and_strides!r}"
      )
  sizes = _check_sizes([p[0] for p in pairs], "sizes in sizes_and_strides")
  strides = _check_sizes([p[1] for p in pairs], "strides in sizes_and_strides")
  ndims = len(sizes)
  n = shapes.list_product(sizes)
  coords = []
  if ndims >= 2 and sizes[0] > 1 and sizes[1] > 1:
    ring = _ring_2d(sizes[0], sizes[1])
    merged = [sizes[0] * sizes[1]] + sizes[2:]
    for i in range(n):
      c = layout_lib.pnum_to_processor_coordinates(merged, i)
      coords.append(list(ring[c[0]]) + c[1:])
  else:
    coords = [
      layout_lib.pnum_to_processor_coordinates(sizes, i) for i in range(n)
    ]
  return [[c * s for c, s in zip(coord, strides)] for coord in coords]


def _logical_to_physical_v1(
  sizes_and_strides: Sequence[SizesAndStrides],
  physical_shape: Sequence[int],
  fn_1d: Callable[..., List[List[int]]] = (
    _logical_1d_to_physical_subspace_auto
  ),
) -> List[List[int]]:
  """Maps an m-d logical mesh onto an n-d physical mesh, axis by axis.

  `sizes_and_strides[k]` (n (size, stride) pairs) is the physical sub-grid of
  logical dimension k; its size is the product of the sizes. `fn_1d` orders
  each sub-grid, and the physical coordinate of a logical processor is the sum
  over k of the coordinate its k-th logical coordinate gets in sub-grid k. The
  sub-grids must tile the physical mesh: the result is checked to be a
  permutation.

  Example:
    A logical 2x2 mesh onto a physical 2x2 one:

    >>> _logical_to_physical_v1([[(2, 1), (1, 1)], [(1, 1), (2, 1)]], [2, 2])
    [[0, 0], [0, 1], [1, 0], [1, 1]]

  Args:
    sizes_and_strides: one list of (size, stride) pairs per logical dimension.
    physical_shape: a list of ints.
    fn_1d: maps (sizes_and_strides of one dimension, physical_shape) to the
      list of its coordinates, like `_logical_1d_to_physical_subspace_auto`.

  Returns:
    a list of physical coordinate lists, indexed by logical pnum.

  Raises:
    ValueError: if the sizes do not multiply to the physical size, a sub-grid
      has the wrong number of axes, or the result is not a permutation.
  """
  physical_shape = _check_sizes(physical_shape, "physical_shape")
  pndims = len(physical_shape)
  sizes_and_strides = [list(l) for l in sizes_and_strides]
  for k, l in enumerate(sizes_and_strides):
    if len(l) != pndims:
      raise ValueError(
        f"sizes_and_strides[{k}] = {l} has {len(l)} (size, stride) pairs; "
        f"physical_shape {physical_shape} has {pndims} axes"
      )
  logical_shape = [
    shapes.list_product(
      _check_sizes([p[0] for p in l], f"sizes of sizes_and_strides[{k}]")
    )
    for k, l in enumerate(sizes_and_strides)
  ]
  n = shapes.list_product(physical_shape)
  if shapes.list_product(logical_shape) != n:
    raise ValueError(
      f"logical size {shapes.list_product(logical_shape)} (logical shape "
      f"{logical_shape} from sizes_and_strides={sizes_and_strides}) does "
      f"not match physical size {n} of physical_shape {physical_shape}"
    )
  layouts = [fn_1d(l, physical_shape) for l in sizes_and_strides]
  logging.debug(
    "_logical_to_physical_v1 physical_shape=%s sizes_and_strides=%s layouts=%s",
    physical_shape,
    sizes_and_strides,
    layouts,
  )
  result = []
  for pnum in range(n):
    coord = [0] * pndims
    for k, c in enumerate(
      layout_lib.pnum_to_processor_coordinates(logical_shape, pnum)
    ):
      for axis in range(pndims):
        coord[axis] += layouts[k][c][axis]
    result.append(coord)
  seen = set()
  for coord in result:
    if not all(0 <= c < s for c, s in zip(coord, physical_shape)):
      raise ValueError(
        f"logical_to_physical coordinate {coord} is outside physical_shape "
        f"{physical_shape}; sizes_and_strides={sizes_and_strides}"
      )
    seen.add(layout_lib.processor_coordinates_to_pnum(physical_shape, coord))
  if len(seen) != n:
    raise ValueError(
      f"sizes_and_strides={sizes_and_strides} do not tile physical_shape "
      f"{physical_shape}: some physical processors are used twice "
      f"(coordinates {result})"
    )
  return result


class HierarchicalTiling:
  """A logical mesh tiled onto the physical mesh by a hand-written spec.

  `spec[k] = (name, projected_shape)` describes logical dimension k: the shape
  (one int per physical axis) that dimension covers when projected onto the
  physical mesh and compacted. Strides are implied: the LAST logical dimension
  is the innermost tile (stride 1), and each earlier dimension strides over the
  tiles of all later ones. The first entry's shape may be None, meaning
  "whatever is left": physical_shape divided axis-wise by the others.

  Example:
    Each model group is a 2x1x2 block of neighbouring cores; batch takes
    what is left of the physical shape [4, 4, 2]:

    >>> tiling = HierarchicalTiling([("batch", None), ("model", [2, 1, 2])],
    ...                             [4, 4, 2])
    >>> tiling
    HierarchicalTiling(spec=[('batch', [2, 4, 1]), ('model', [2, 1, 2])],
                       physical_shape=[4, 4, 2])
    >>> tiling.mesh_shape
    Shape[batch=8, model=4]
    >>> tiling.logical_to_physical[:4]  # cores (0|1, 0, 0|1): pnums of group 0
    [0, 1, 8, 9]
  """

  def __init__(
    self,
    spec: Sequence[Tuple[str, Optional[Sequence[int]]]],
    physical_shape: Sequence[int],
  ):
    """Builds the tiling.

    Args:
      spec: a list of (name, list-of-ints or None) pairs; only the first may
        be None.
      physical_shape: a list of ints.

    Raises:
      ValueError: if a projected shape has the wrong length, a None is not in
        first position, the first entry cannot be inferred exactly, or the
        projected shapes do not multiply to physical_shape.
    """
    physical_shape = _check_sizes(physical_shape, "physical_shape")
    self._names = [p[0] for p in spec]
    projected = [None if p[1] is None else list(p[1]) for p in spec]
    for k, s in enumerate(projected):
      if s is None:
        if k != 0:
          raise ValueError(
            f"HierarchicalTiling spec entry {k} ({self._names[k]!r}) has no "
            f"shape; only the first entry may be None. spec={spec}"
          )
        continue
      _check_sizes(s, f"projected shape of {self._names[k]!r}")
      if len(s) != len(physical_shape):
        raise ValueError(
          f"HierarchicalTiling: projected shape {s} of {self._names[k]!r} "
          f"has {len(s)} axes; physical_shape {physical_shape} has "
          f"{len(physical_shape)}"
        )
    if projected and projected[0] is None:
      first = []
      for axis, size in enumerate(physical_shape):
        inner = shapes.list_product(s[axis] for s in projected[1:])
        if size % inner:
          raise ValueError(
            f"HierarchicalTiling: cannot infer {self._names[0]!r}: physical "
            f"axis {axis} (size {size}) is not divisible by {inner}, the "
            f"product of the other entries; spec={spec} "
            f"physical_shape={physical_shape}"
          )
        first.append(size // inner)
      projected[0] = first
    # Strides: the last logical dim is innermost.
    strides = [1] * len(physical_shape)
    sizes_and_strides = []
    for s in reversed(projected):
      sizes_and_strides.append(list(zip(s, strides)))
      strides = [a * b for a, b in zip(strides, s)]
    sizes_and_strides.reverse()
    if strides != physical_shape:
      raise ValueError(
        f"HierarchicalTiling spec multiplies to {strides} per physical axis, "
        f"not physical_shape {physical_shape}; spec={spec}"
      )
    self._projected_shapes = projected
    self._physical_shape = physical_shape
    self._physical_coordinates = _logical_to_physical_v1(
      sizes_and_strides, physical_shape
    )
    self._logical_to_physical = [
      layout_lib.processor_coordinates_to_pnum(physical_shape, c)
      for c in self._physical_coordinates
    ]
    self._mesh_shape = shapes.Shape(
      [
        shapes.Dimension(name, shapes.list_product(s))
        for name, s in zip(self._names, projected)
      ]
    )

  def __repr__(self) -> str:
    spec = list(zip(self._names, self._projected_shapes))
    return (
      f"HierarchicalTiling(spec={spec}, physical_shape={self._physical_shape})"
    )

  @property
  def logical_to_physical(self) -> List[int]:
    """Physical pnum of each logical pnum (a permutation)."""
    return list(self._logical_to_physical)

  @property
  def mesh_shape(self) -> shapes.Shape:
    """The logical mesh shape: one Dimension per spec entry."""
    return self._mesh_shape

  @classmethod
  def spec_to_mesh_shape(
    cls,
    spec: Sequence[Tuple[str, Optional[Sequence[int]]]],
    num_processors: int,
  ) -> shapes.Shape:
    """The mesh shape of `spec`, without knowing the physical shape.

    Example:
      >>> HierarchicalTiling.spec_to_mesh_shape(
      ...     [("b", None), ("m", [2, 1, 2])], 32)
      Shape[b=8, m=4]

    Args:
      spec: as in the constructor.
      num_processors: the total number of processors.

    Returns:
      a Shape.

    Raises:
      ValueError: if the sizes cannot multiply to num_processors.
    """
    if not _is_int(num_processors) or num_processors <= 0:
      raise ValueError(
        f"num_processors must be a positive int, got {num_processors!r}"
      )
    names = [p[0] for p in spec]
    sizes = []
    for k, (name, s) in enumerate(spec):
      if s is None:
        if k != 0:
          raise ValueError(
            f"spec entry {k} ({name!r}) has no shape; only the first entry "
            f"may be None. spec={spec}"
          )
        sizes.append(None)
      else:
        sizes.append(
          shapes.list_product(_check_sizes(s, f"projected shape of {name!r}"))
        )
    if sizes and sizes[0] is None:
      inner = shapes.list_product(sizes[1:])
      if num_processors % inner:
        raise ValueError(
          f"cannot infer {names[0]!r}: num_processors {num_processors} is "
          f"not divisible by {inner}, the product of the other entries; "
          f"spec={spec}"
        )
      sizes[0] = num_processors // inner
    if shapes.list_product(sizes) != num_processors:
      raise ValueError(
        f"spec sizes {sizes} multiply to {shapes.list_product(sizes)}, not "
        f"num_processors {num_processors}; spec={spec}"
      )
    return shapes.Shape(
      [shapes.Dimension(name, s) for name, s in zip(names, sizes)]
    )


def physical_shape_3d_from_topology_proto_4d(
  mesh_shape: Sequence[int],
) -> List[int]:
  """Converts a TPU topology mesh shape [x, y, z, core] to [y*z, x, core].

  Example:
    >>> physical_shape_3d_from_topology_proto_4d([4, 2, 1, 2])
    [2, 4, 2]

  Args:
    mesh_shape: the 4 ints [x, y, z, cores per chip] of a TPU topology.

  Returns:
    the 3 ints [y * z, x, cores per chip].

  Raises:
    ValueError: if mesh_shape does not have 4 positive int entries.
  """
  mesh_shape = _check_sizes(mesh_shape, "topology mesh_shape")
  if len(mesh_shape) != 4:
    raise ValueError(
      f"Expected a 4-d topology mesh shape [x, y, z, core], got {mesh_shape}"
    )
  x, y, z, core = mesh_shape
  return [y * z, x, core]


def _chip_ring_layout(
  num_cores: int, p0: int, p1: int
) -> List[Tuple[int, int, int]]:
  """1-d logical mesh: the two cores of a chip, chips in `_ring_2d` order."""
  ring = _ring_2d(p0, p1)
  return [ring[pnum // 2] + (pnum % 2,) for pnum in range(num_cores)]


def _tile_shape(
  logical_shape: List[int], p0: int, p1: int
) -> Optional[Tuple[int, int]]:
  """(t0, t1) chips per tile for the tiled layout, or None if none fits."""
  num_cores = shapes.list_product(logical_shape)
  cores_per_tile = num_cores // logical_shape[0]
  if cores_per_tile % 2:
    return None
  tile_chips = cores_per_tile // 2
  if not _is_power_of_2(tile_chips):
    return None
  if len(logical_shape) == 2 and tile_chips == p0:
    t0, t1 = p0, 1  # one column of chips per tile
  elif len(logical_shape) == 2 and tile_chips == p1:
    t0, t1 = 1, p1  # one row of chips per tile
  else:  # roughly square, clamped to fit the chip grid
    t0 = 2 ** ((tile_chips.bit_length() - 1) // 2)
    t0 = max(min(t0, p0), -(-tile_chips // p1))
    t1 = tile_chips // t0
  if t0 * t1 != tile_chips or p0 % t0 or p1 % t1:
    return None
  return t0, t1


def _tiled_layout(
  logical_shape: List[int], p0: int, p1: int, t0: int, t1: int
) -> List[Tuple[int, int, int]]:
  """k-d logical mesh (k >= 2): logical dim 0 picks a t0 x t1 tile of chips.

  Tiles are visited along `_ring_2d` over the (p0/t0) x (p1/t1) tile grid.
  Inside a tile, the lexicographic index over the later logical dims walks the
  two cores of a chip, then the chips along `_ring_2d(t0, t1)`.
  """
  num_cores = shapes.list_product(logical_shape)
  cores_per_tile = num_cores // logical_shape[0]
  tile_ring = _ring_2d(p0 // t0, p1 // t1)
  chip_ring = _ring_2d(t0, t1)
  result = []
  for pnum in range(num_cores):
    tile, within = divmod(pnum, cores_per_tile)
    ti, tj = tile_ring[tile]
    ci, cj = chip_ring[within // 2]
    result.append((ti * t0 + ci, tj * t1 + cj, within % 2))
  return result


def auto_logical_to_physical_tpu(
  logical_shape: Sequence[int],
  physical_shape: Sequence[int],
  return_coordinates: bool = False,
  device_assignment=None,
) -> list:
  """A logical-to-physical mapping that keeps later logical dims close.

  Heuristic for a TPU mesh of p0 x p1 chips with 2 cores each (physical shape
  [p0, p1, 2], or the topology's [x, y, 1, 2], first converted to [y, x, 2]),
  p0 and p1 powers of 2. Logical dimensions of size 1 are dropped, then:
    - one logical dimension: the chips are walked along `_ring_2d(p0, p1)`,
      both cores of a chip being consecutive, so the ring allreduce has only
      neighbour hops.
    - k >= 2 dimensions: the chip grid is cut into logical_shape[0] equal
      tiles of t0 x t1 chips (a whole column or row when k == 2 and it fits,
      otherwise roughly square); logical dim 0 selects the tile (tiles in
      `_ring_2d` order) and the later dims, lexicographically, fill the tile
      (cores of a chip, then chips along `_ring_2d(t0, t1)`). Collectives
      over the later (usually model-parallel) dims thus stay inside a tile.
  Any other physical shape (not 3-d/4-d, a 4-d z != 1, cores != 2, a chip
  count that is not a power of 2) or a tiling that does not fit gets the
  identity mapping.

  Example:
    Each of the 4 tiles is one chip (logical dim 1 = its two cores); the
    tiles follow the chip ring (0, 0), (0, 1), (1, 1), (1, 0):

    >>> auto_logical_to_physical_tpu([4, 2], [2, 2, 2])
    [0, 1, 2, 3, 6, 7, 4, 5]

  Args:
    logical_shape: a list of ints (the mtf mesh shape).
    physical_shape: a list of ints, typically the topology's [x, y, 1, cores]
      or [p0, p1, cores].
    return_coordinates: if True, return physical coordinates instead of pnums.
    device_assignment: accepted for the original's signature and unused: the
      original needs it only for chips with one logical core (its
      logical_cores_per_chip flag), which this heuristic maps by identity.

  Returns:
    indexed by logical pnum: the physical pnum (row-major over the 3-d
    physical shape, or over the given physical shape when the heuristic does
    not apply), or with return_coordinates the coordinate list in that shape.

  Raises:
    ValueError: if a size is not a positive int or the two shapes have
      different products.
  """
  del device_assignment  # See Args.
  logical_shape = _check_sizes(logical_shape, "logical_shape")
  physical_shape = _check_sizes(
    physical_shape, "physical_shape", allow_empty=False
  )
  num_cores = shapes.list_product(physical_shape)
  if shapes.list_product(logical_shape) != num_cores:
    raise ValueError(
      f"logical_shape {logical_shape} (product "
      f"{shapes.list_product(logical_shape)}) and physical_shape "
      f"{physical_shape} (product {num_cores}) must have the same product"
    )
  logical_shape = [s for s in logical_shape if s != 1]
  if len(physical_shape) == 4 and physical_shape[2] == 1:
    physical_shape = physical_shape_3d_from_topology_proto_4d(physical_shape)

  def _identity() -> list:
    pnums = list(range(num_cores))
    if return_coordinates:
      return [
        layout_lib.pnum_to_processor_coordinates(physical_shape, p)
        for p in pnums
      ]
    return pnums

  if len(physical_shape) != 3:
    logging.warning(
      "auto_logical_to_physical_tpu: unrecognized TPU physical "
      "shape %s; using the identity mapping",
      physical_shape,
    )
    return _identity()
  p0, p1, cores = physical_shape
  if cores != 2 or not (_is_power_of_2(p0) and _is_power_of_2(p1)):
    logging.info(
      "auto_logical_to_physical_tpu: physical shape %s is not "
      "2^a x 2^b chips x 2 cores; using the identity mapping",
      physical_shape,
    )
    return _identity()
  if not logical_shape:  # a single core
    return _identity()
  if len(logical_shape) == 1:
    coords = _chip_ring_layout(num_cores, p0, p1)
  else:
    tile = _tile_shape(logical_shape, p0, p1)
    if tile is None:
      logging.info(
        "auto_logical_to_physical_tpu: no tiling of %s fits %s; "
        "using the identity mapping",
        logical_shape,
        physical_shape,
      )
      return _identity()
    coords = _tiled_layout(logical_shape, p0, p1, *tile)
  coords = [list(c) for c in coords]
  if return_coordinates:
    return coords
  return [
    layout_lib.processor_coordinates_to_pnum(physical_shape, c) for c in coords
  ]
