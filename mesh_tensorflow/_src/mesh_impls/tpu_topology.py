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
  - `auto_logical_to_physical_tpu`: the automatic choice for a grid of chips
    of --logical_cores_per_chip cores (identity for shapes the heuristic does
    not cover).
  - `physical_shape_3d_from_topology_proto_4d`: [x, y, z, core] -> [y*z, x,
    core] (--fold_xy: [x*y, z, core]), the 3-d form the heuristics use.

The flags --logical_cores_per_chip (default 2) and --fold_xy (default False)
are defined here, as the original's simd_mesh_impl defined them.

Pure Python (no TensorFlow).
"""

from __future__ import annotations

import numbers
from typing import Any, Callable, List, Optional, Sequence, Tuple

from absl import flags
from absl import logging

from mesh_tensorflow._src import layout as layout_lib
from mesh_tensorflow._src import shapes

__all__ = [
  "HierarchicalTiling",
  "auto_logical_to_physical_tpu",
  "physical_shape_3d_from_topology_proto_4d",
]

SizesAndStrides = Sequence[Tuple[int, int]]

# Command-line flags of the original's simd_mesh_impl, same names and
# defaults; read through flags.FLAGS[name].value, which is the default until
# the flags are parsed.
flags.DEFINE_integer(
  "logical_cores_per_chip",
  default=2,
  help="Cores per TPU chip that the mesh mapping counts as processors (2 "
  "on TPU v2/v3; 1 on chips seen as one core, e.g. v4 megacore).",
)
flags.DEFINE_bool(
  "fold_xy",
  default=False,
  help="Map a 3-d TPU torus [x, y, z] onto a 2-d grid of x*y rows and z "
  "columns instead of y*z rows and x columns.",
)


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


def _cores_per_chip_flag() -> int:
  """--logical_cores_per_chip (its default before flags are parsed)."""
  return int(flags.FLAGS["logical_cores_per_chip"].value)


def _fold_xy_flag() -> bool:
  """--fold_xy (its default before flags are parsed)."""
  return bool(flags.FLAGS["fold_xy"].value)


def physical_shape_3d_from_topology_proto_4d(
  mesh_shape: Sequence[int],
) -> List[int]:
  """Converts a TPU topology mesh shape [x, y, z, core] to a 3-d grid.

  [y*z, x, core] by default; [x*y, z, core] with --fold_xy (a 3-d torus seen
  as x*y rows of z chips).

  Example:
    >>> physical_shape_3d_from_topology_proto_4d([4, 2, 1, 2])
    [2, 4, 2]

  Args:
    mesh_shape: the 4 ints [x, y, z, cores per chip] of a TPU topology.

  Returns:
    the 3 ints [rows, columns, cores per chip].

  Raises:
    ValueError: if mesh_shape does not have 4 positive int entries.
  """
  mesh_shape = _check_sizes(mesh_shape, "topology mesh_shape")
  if len(mesh_shape) != 4:
    raise ValueError(
      f"Expected a 4-d topology mesh shape [x, y, z, core], got {mesh_shape}"
    )
  x, y, z, core = mesh_shape
  if _fold_xy_flag():
    return [x * y, z, core]
  return [y * z, x, core]


def _tile_chips_shape(
  tile_chips: int, p0: int, p1: int, num_logical_dims: int
) -> Tuple[int, int]:
  """(t0, t1): the rectangle of chips of each tile of the tiled layout.

  A whole column or row of chips when there are two logical dims and the
  tile has that many chips; otherwise about square, clamped to the grid.
  """
  if num_logical_dims == 2 and tile_chips == p0:
    return p0, 1
  if num_logical_dims == 2 and tile_chips == p1:
    return 1, p1
  t0 = 2 ** ((tile_chips.bit_length() - 1) // 2)
  t0 = max(min(t0, p0), tile_chips // p1)
  return t0, tile_chips // t0


def _auto_coordinates(
  logical_shape: List[int], p0: int, p1: int, cores: int
) -> List[Tuple[int, int, int]]:
  """(row, column, core) of each logical pnum on a p0 x p1 chip grid.

  One logical dim: chips along `_ring_2d(p0, p1)`, the cores of a chip
  consecutive. More: logical dim 0 picks a tile of chips (tiles along
  `_ring_2d` over the grid of tiles); the later dims are laid out the same
  way inside the tile.
  """
  num_cores = p0 * p1 * cores
  if len(logical_shape) == 1:
    ring = _ring_2d(p0, p1)
    return [ring[n // cores] + (n % cores,) for n in range(num_cores)]
  tile_cores = num_cores // logical_shape[0]
  t0, t1 = _tile_chips_shape(tile_cores // cores, p0, p1, len(logical_shape))
  inner = _auto_coordinates(logical_shape[1:], t0, t1, cores)
  tiles = _ring_2d(p0 // t0, p1 // t1)
  coordinates = []
  for n in range(num_cores):
    tile, position = divmod(n, tile_cores)
    row, column, core = inner[position]
    coordinates.append(
      (tiles[tile][0] * t0 + row, tiles[tile][1] * t1 + column, core)
    )
  return coordinates


def _fits_heuristic(
  logical_shape: List[int], physical_shape: List[int], cores_per_chip: int
) -> bool:
  """Whether the tiling heuristic covers these shapes (else: identity)."""
  if len(physical_shape) != 3 or not logical_shape:
    return False
  p0, p1, cores = physical_shape
  if cores != cores_per_chip or not (_is_power_of_2(p0) and _is_power_of_2(p1)):
    return False
  # Every tile must be a whole number of chips (true whenever the logical
  # sizes are powers of 2, as they are on such a grid).
  cores_left = p0 * p1 * cores
  for size in logical_shape[:-1]:
    cores_left //= size
    if cores_left % cores or not _is_power_of_2(cores_left // cores):
      return False
  return True


def auto_logical_to_physical_tpu(
  logical_shape: Sequence[int],
  physical_shape: Sequence[int],
  return_coordinates: bool = False,
  device_assignment=None,
) -> list:
  """A logical-to-physical mapping that keeps later logical dims close.

  Heuristic for a TPU mesh of p0 x p1 chips with --logical_cores_per_chip
  cores each (physical shape [p0, p1, cores], or a topology's [x, y, z,
  cores], first made 3-d by `physical_shape_3d_from_topology_proto_4d`), p0
  and p1 powers of 2. Logical dimensions of size 1 are dropped, then:
    - one logical dimension: the chips are walked along `_ring_2d(p0, p1)`,
      the cores of a chip consecutive, so the ring allreduce has only
      neighbour hops.
    - k >= 2 dimensions: the chip grid is cut into logical_shape[0] equal
      tiles of t0 x t1 chips (a whole column or row when k == 2 and it fits,
      otherwise roughly square); logical dim 0 selects the tile (tiles in
      `_ring_2d` order) and the later dims are laid out inside the tile the
      same way (recursively). Collectives over the later (usually
      model-parallel) dims thus stay inside a tile.
  Physical pnums are row-major over the 3-d shape; with one logical core
  per chip (--logical_cores_per_chip=1, e.g. TPU v4) they are the replicas
  of `device_assignment` at those chips, looked up as the original did
  (`processor_coordinates_to_pnum_map_nd`). Any other physical shape (not
  3-d/4-d, a number of cores per chip other than the flag's, a side that is
  not a power of 2) gets the identity mapping (the original returned its
  fallback function itself for a core count other than the flag's).

  Example:
    Each of the 4 tiles is one chip (logical dim 1 = its two cores); the
    tiles follow the chip ring (0, 0), (0, 1), (1, 1), (1, 0):

    >>> auto_logical_to_physical_tpu([4, 2], [2, 2, 2])
    [0, 1, 2, 3, 6, 7, 4, 5]

  Args:
    logical_shape: a list of ints (the mtf mesh shape).
    physical_shape: a list of ints, typically the topology's [x, y, z,
      cores] or [p0, p1, cores].
    return_coordinates: if True, return physical coordinates instead of pnums.
    device_assignment: the TPU device assignment; needed (and used) only with
      one logical core per chip.

  Returns:
    indexed by logical pnum: the physical pnum, or with return_coordinates
    the coordinate list in the 3-d physical shape (in the given physical
    shape when the heuristic does not apply).

  Raises:
    ValueError: if a size is not a positive int, the two shapes have
      different products, or one core per chip is asked for without a
      device_assignment.
  """
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
  if len(physical_shape) == 4:
    physical_shape = physical_shape_3d_from_topology_proto_4d(physical_shape)
  cores_per_chip = _cores_per_chip_flag()
  if not _fits_heuristic(logical_shape, physical_shape, cores_per_chip):
    if len(physical_shape) == 3 and logical_shape:
      logging.info(
        "auto_logical_to_physical_tpu: physical shape %s is not 2^a x 2^b "
        "chips x %d cores (--logical_cores_per_chip); using the identity "
        "mapping",
        physical_shape,
        cores_per_chip,
      )
    elif logical_shape:
      logging.warning(
        "auto_logical_to_physical_tpu: unrecognized TPU physical shape %s; "
        "using the identity mapping",
        physical_shape,
      )
    if return_coordinates:
      return [
        layout_lib.pnum_to_processor_coordinates(physical_shape, p)
        for p in range(num_cores)
      ]
    return list(range(num_cores))
  coordinates = [
    list(c) for c in _auto_coordinates(logical_shape, *physical_shape)
  ]
  if return_coordinates:
    return coordinates
  if cores_per_chip > 1:
    return [
      layout_lib.processor_coordinates_to_pnum(physical_shape, c)
      for c in coordinates
    ]
  if device_assignment is None:
    raise ValueError(
      "auto_logical_to_physical_tpu: with one logical core per chip "
      "(--logical_cores_per_chip=1) the physical pnums are the replicas of "
      "a device_assignment; pass one"
    )
  return layout_lib.processor_coordinates_to_pnum_map_nd(
    physical_shape, coordinates, device_assignment
  )
