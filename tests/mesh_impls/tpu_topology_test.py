"""Tests of the TPU topology helpers (pure Python, no TensorFlow needed)."""

import inspect
import itertools
import pathlib
import subprocess
import sys
import textwrap

import pytest

from mesh_tensorflow._src import layout as layout_lib
from mesh_tensorflow._src import shapes
from mesh_tensorflow._src.mesh_impls import tpu_topology
from mesh_tensorflow._src.mesh_impls.tpu_topology import HierarchicalTiling
from mesh_tensorflow._src.mesh_impls.tpu_topology import (
  _logical_1d_to_physical_subspace_auto,
)
from mesh_tensorflow._src.mesh_impls.tpu_topology import _logical_to_physical_v1
from mesh_tensorflow._src.mesh_impls.tpu_topology import _ring_2d
from mesh_tensorflow._src.mesh_impls.tpu_topology import (
  auto_logical_to_physical_tpu,
)
from mesh_tensorflow._src.mesh_impls.tpu_topology import (
  physical_shape_3d_from_topology_proto_4d,
)

_REPO = pathlib.Path(__file__).resolve().parents[2]


def _assert_permutation(l2p, n):
  assert sorted(l2p) == list(range(n)), l2p
  assert all(isinstance(p, int) for p in l2p)


def _is_neighbour(a, b):
  return sum(abs(x - y) for x, y in zip(a, b)) == 1


def _divisors(n):
  return [d for d in range(1, n + 1) if n % d == 0]


def _factorizations(n, max_len):
  """All ordered factorizations of n into 1..max_len factors >= 1."""
  result = [[n]]
  if max_len > 1:
    for d in _divisors(n):
      for rest in _factorizations(n // d, max_len - 1):
        result.append([d] + rest)
  return result


# Signatures (the facade re-exports these names).


def test_signatures():
  def params(fn):
    return [
      (p.name, p.default) for p in inspect.signature(fn).parameters.values()
    ]

  empty = inspect.Parameter.empty
  assert params(_ring_2d) == [("m", empty), ("n", empty)]
  assert params(_logical_1d_to_physical_subspace_auto) == [
    ("sizes_and_strides", empty),
    ("physical_shape", empty),
  ]
  assert params(_logical_to_physical_v1) == [
    ("sizes_and_strides", empty),
    ("physical_shape", empty),
    ("fn_1d", _logical_1d_to_physical_subspace_auto),
  ]
  assert params(HierarchicalTiling) == [
    ("spec", empty),
    ("physical_shape", empty),
  ]
  assert params(HierarchicalTiling.spec_to_mesh_shape) == [
    ("spec", empty),
    ("num_processors", empty),
  ]
  assert params(physical_shape_3d_from_topology_proto_4d) == [
    ("mesh_shape", empty)
  ]
  assert params(auto_logical_to_physical_tpu) == [
    ("logical_shape", empty),
    ("physical_shape", empty),
    ("return_coordinates", False),
    ("device_assignment", None),
  ]


def test_module_does_not_import_tensorflow():
  script = textwrap.dedent(f"""
      import builtins, importlib, sys, types
      real_import = builtins.__import__
      def guarded(name, *args, **kwargs):
        if name == "tensorflow" or name.startswith("tensorflow."):
          raise ImportError("tensorflow import attempted: " + name)
        return real_import(name, *args, **kwargs)
      builtins.__import__ = guarded
      package_dir = {str(_REPO / "mesh_tensorflow")!r}
      for name, path in (("mesh_tensorflow", package_dir),
                         ("mesh_tensorflow._src", package_dir + "/_src"),
                         ("mesh_tensorflow._src.mesh_impls",
                          package_dir + "/_src/mesh_impls")):
        package = types.ModuleType(name)
        package.__path__ = [path]
        sys.modules[name] = package
      t = importlib.import_module(
          "mesh_tensorflow._src.mesh_impls.tpu_topology")
      assert t.auto_logical_to_physical_tpu([4, 4], [2, 4, 2])
      assert "tensorflow" not in sys.modules
  """)
  result = subprocess.run(
    [sys.executable, "-c", script], capture_output=True, text=True, check=False
  )
  assert result.returncode == 0, result.stderr


# _ring_2d.


@pytest.mark.parametrize("m,n", list(itertools.product(range(1, 9), repeat=2)))
def test_ring_2d_visits_every_cell_once_by_neighbour_steps(m, n):
  ring = _ring_2d(m, n)
  assert sorted(ring) == sorted(itertools.product(range(m), range(n)))
  for a, b in zip(ring, ring[1:]):
    assert _is_neighbour(a, b), (a, b, ring)
  assert ring[0] == (0, 0)
  if m * n % 2 == 0 and m > 1 and n > 1:
    # A closed ring: the last cell is next to the first.
    assert _is_neighbour(ring[-1], ring[0]), ring


def test_ring_2d_even_rows_layout():
  # The documented 4x4 ring.
  step = {cell: i for i, cell in enumerate(_ring_2d(4, 4))}
  grid = [[step[(i, j)] for j in range(4)] for i in range(4)]
  assert grid == [[0, 1, 2, 3], [15, 6, 5, 4], [14, 7, 8, 9], [13, 12, 11, 10]]
  assert _ring_2d(2, 2) == [(0, 0), (0, 1), (1, 1), (1, 0)]
  assert _ring_2d(1, 3) == [(0, 0), (0, 1), (0, 2)]
  assert _ring_2d(3, 1) == [(0, 0), (1, 0), (2, 0)]


@pytest.mark.parametrize(
  "m,n", [(0, 2), (2, -1), (2.0, 2), ("2", 2), (True, 2)]
)
def test_ring_2d_rejects_bad_sizes(m, n):
  with pytest.raises(ValueError, match="_ring_2d"):
    _ring_2d(m, n)


# _logical_1d_to_physical_subspace_auto.


def test_subspace_auto_docstring_example():
  coords = _logical_1d_to_physical_subspace_auto([(2, 16), (4, 1)], None)
  assert sorted(map(tuple, coords)) == sorted(
    (a, b) for a in (0, 16) for b in range(4)
  )
  # The first two axes are merged and walked as a ring.
  assert coords == [
    [0, 0],
    [0, 1],
    [0, 2],
    [0, 3],
    [16, 3],
    [16, 2],
    [16, 1],
    [16, 0],
  ]


@pytest.mark.parametrize(
  "sizes",
  [
    [1],
    [8],
    [2, 2],
    [1, 4],
    [4, 1],
    [2, 3],
    [2, 2, 2],
    [1, 2, 2],
    [4, 2, 3],
    [3, 3, 2],
  ],
)
def test_subspace_auto_covers_the_strided_subspace(sizes):
  strides = [1 + i for i in range(len(sizes))]
  coords = _logical_1d_to_physical_subspace_auto(
    list(zip(sizes, strides)), [s * t for s, t in zip(sizes, strides)]
  )
  expected = sorted(
    tuple(c * t for c, t in zip(coord, strides))
    for coord in itertools.product(*[range(s) for s in sizes])
  )
  assert sorted(map(tuple, coords)) == expected
  if len(sizes) >= 2 and sizes[0] > 1 and sizes[1] > 1:
    # Outer part follows the ring: consecutive blocks are neighbours.
    inner = shapes.list_product(sizes[2:])
    outer = [
      tuple(c // t for c, t in zip(coords[i][:2], strides[:2]))
      for i in range(0, len(coords), inner)
    ]
    assert outer == _ring_2d(sizes[0], sizes[1])
  else:
    assert [
      tuple(c // t for c, t in zip(coord, strides)) for coord in coords
    ] == list(itertools.product(*[range(s) for s in sizes]))


def test_subspace_auto_rejects_bad_pairs():
  with pytest.raises(ValueError, match="strides"):
    _logical_1d_to_physical_subspace_auto([(2, 0)], None)
  with pytest.raises(ValueError, match="sizes"):
    _logical_1d_to_physical_subspace_auto([(-2, 1)], None)
  with pytest.raises(ValueError, match="pair"):
    _logical_1d_to_physical_subspace_auto([(2, 1, 1)], None)


# _logical_to_physical_v1.


def test_logical_to_physical_v1_example():
  coords = _logical_to_physical_v1([[(2, 1), (1, 1)], [(1, 1), (2, 1)]], [2, 2])
  assert coords == [[0, 0], [0, 1], [1, 0], [1, 1]]
  # Docstring-style example: logical 2x8 onto physical 2x8 (strided).
  coords = _logical_to_physical_v1([[(2, 1), (1, 8)], [(1, 2), (8, 1)]], [2, 8])
  pnums = [layout_lib.processor_coordinates_to_pnum([2, 8], c) for c in coords]
  assert pnums == list(range(16))


def test_logical_to_physical_v1_custom_fn_1d():
  calls = []

  def fn_1d(sizes_and_strides, physical_shape):
    calls.append((list(sizes_and_strides), list(physical_shape)))
    return _logical_1d_to_physical_subspace_auto(
      sizes_and_strides, physical_shape
    )[::-1]

  coords = _logical_to_physical_v1([[(4, 1)]], [4], fn_1d=fn_1d)
  assert coords == [[3], [2], [1], [0]]
  assert calls == [([(4, 1)], [4])]


def test_logical_to_physical_v1_errors():
  with pytest.raises(ValueError, match="does not match physical size 8"):
    _logical_to_physical_v1([[(2, 1), (2, 1)]], [2, 4])
  with pytest.raises(ValueError, match="has 1 .size, stride. pairs"):
    _logical_to_physical_v1([[(4, 1)]], [2, 2])
  with pytest.raises(ValueError, match="do not tile"):
    # Both logical dims claim stride 1 on the same axis.
    _logical_to_physical_v1([[(2, 1)], [(2, 1)]], [4])
  with pytest.raises(ValueError, match="outside physical_shape"):
    _logical_to_physical_v1([[(2, 1)], [(2, 4)]], [4])
  with pytest.raises(ValueError, match="physical_shape"):
    _logical_to_physical_v1([[(2, 1)]], [0])


# HierarchicalTiling.


def _tiling_specs(physical_shape, max_dims=3):
  """Every spec that splits each physical axis into nested factors."""
  ndims = len(physical_shape)
  per_axis = [_factorizations(s, max_dims) for s in physical_shape]
  specs = []
  for k in range(1, max_dims + 1):
    choices = [[f for f in fs if len(f) == k] for fs in per_axis]
    for combo in itertools.product(*choices):
      spec = [(f"d{i}", [combo[a][i] for a in range(ndims)]) for i in range(k)]
      specs.append(spec)
  return specs


@pytest.mark.parametrize(
  "physical_shape", [[4], [2, 2], [2, 4, 2], [3, 2, 2], [4, 4, 2]]
)
def test_hierarchical_tiling_exhaustive(physical_shape):
  n = shapes.list_product(physical_shape)
  specs = _tiling_specs(physical_shape)
  assert specs
  for spec in specs:
    tiling = HierarchicalTiling(spec, physical_shape)
    _assert_permutation(tiling.logical_to_physical, n)
    sizes = [shapes.list_product(s) for _, s in spec]
    assert tiling.mesh_shape == shapes.Shape(
      [shapes.Dimension(name, s) for (name, _), s in zip(spec, sizes)]
    )
    assert HierarchicalTiling.spec_to_mesh_shape(spec, n) == tiling.mesh_shape
    # The last logical dim is the innermost tile: its groups are the
    # row-major blocks of its projected shape at the origin.
    last = spec[-1][1]
    group0 = sorted(tiling.logical_to_physical[: sizes[-1]])
    block = sorted(
      layout_lib.processor_coordinates_to_pnum(physical_shape, c)
      for c in itertools.product(*[range(s) for s in last])
    )
    assert group0 == block
    # Same tiling with the first shape inferred.
    inferred = HierarchicalTiling(
      [(spec[0][0], None)] + spec[1:], physical_shape
    )
    assert inferred.logical_to_physical == tiling.logical_to_physical
    assert inferred.mesh_shape == tiling.mesh_shape
    # A returned list is a copy.
    tiling.logical_to_physical.append(-1)
    _assert_permutation(tiling.logical_to_physical, n)


def test_hierarchical_tiling_example():
  tiling = HierarchicalTiling(
    [("batch", None), ("model", [2, 1, 2])], [4, 4, 2]
  )
  assert tiling.mesh_shape == shapes.convert_to_shape("batch:8;model:4")
  assert repr(tiling) == (
    "HierarchicalTiling(spec=[('batch', [2, 4, 1]), "
    "('model', [2, 1, 2])], physical_shape=[4, 4, 2])"
  )
  l2p = tiling.logical_to_physical
  # Each model group is a 2x1x2 block of cores: rows 2k..2k+1 of axis 0,
  # one column of axis 1, both cores.
  assert l2p[:4] == [0, 1, 8, 9]
  for g in range(8):
    coords = [
      layout_lib.pnum_to_processor_coordinates([4, 4, 2], p)
      for p in l2p[4 * g : 4 * g + 4]
    ]
    assert len({(c[0] // 2, c[1]) for c in coords}) == 1
    assert sorted((c[0] % 2, c[2]) for c in coords) == [
      (0, 0),
      (0, 1),
      (1, 0),
      (1, 1),
    ]
  # The batch dim walks the 2x4 block grid along a ring.
  block_starts = [
    layout_lib.pnum_to_processor_coordinates([4, 4, 2], l2p[4 * g])
    for g in range(8)
  ]
  assert [(c[0] // 2, c[1]) for c in block_starts] == _ring_2d(2, 4)


def test_hierarchical_tiling_errors():
  with pytest.raises(ValueError, match="multiplies to"):
    HierarchicalTiling([("a", [2, 2]), ("b", [2, 1])], [4, 4])
  with pytest.raises(ValueError, match="only the first entry may be None"):
    HierarchicalTiling([("a", [2, 2]), ("b", None)], [4, 4])
  with pytest.raises(ValueError, match="cannot infer 'a'.*axis 1"):
    HierarchicalTiling([("a", None), ("b", [2, 3])], [4, 4])
  with pytest.raises(ValueError, match="'b' has 2 axes"):
    HierarchicalTiling([("a", None), ("b", [2, 2])], [4, 4, 2])
  with pytest.raises(ValueError, match="projected shape of 'b'"):
    HierarchicalTiling([("a", None), ("b", [2, 0])], [4, 4])
  with pytest.raises(ValueError, match="physical_shape"):
    HierarchicalTiling([("a", None)], [4, -4])


def test_spec_to_mesh_shape():
  spec = [("batch", None), ("model", [2, 1, 2])]
  assert HierarchicalTiling.spec_to_mesh_shape(spec, 32) == (
    shapes.convert_to_shape("batch:8;model:4")
  )
  assert HierarchicalTiling.spec_to_mesh_shape(
    [("a", [2, 2]), ("b", [1, 3])], 12
  ) == shapes.convert_to_shape("a:4;b:3")
  with pytest.raises(ValueError, match="num_processors 30"):
    HierarchicalTiling.spec_to_mesh_shape(spec, 30)
  with pytest.raises(ValueError, match="not num_processors 16"):
    HierarchicalTiling.spec_to_mesh_shape([("a", [2, 2]), ("b", [2])], 16)
  with pytest.raises(ValueError, match="only the first"):
    HierarchicalTiling.spec_to_mesh_shape([("a", [2]), ("b", None)], 4)
  with pytest.raises(ValueError, match="num_processors"):
    HierarchicalTiling.spec_to_mesh_shape(spec, 0)


# physical_shape_3d_from_topology_proto_4d.


def test_physical_shape_3d_from_topology_proto_4d():
  assert physical_shape_3d_from_topology_proto_4d([4, 2, 1, 2]) == [2, 4, 2]
  assert physical_shape_3d_from_topology_proto_4d([2, 2, 2, 2]) == [4, 2, 2]
  assert physical_shape_3d_from_topology_proto_4d((8, 16, 1, 2)) == [16, 8, 2]
  with pytest.raises(ValueError, match=r"\[x, y, z, core\]"):
    physical_shape_3d_from_topology_proto_4d([4, 4, 2])
  with pytest.raises(ValueError, match="entry 2"):
    physical_shape_3d_from_topology_proto_4d([4, 4, 0, 2])


# auto_logical_to_physical_tpu.

# Physical shapes where the heuristic applies, as 3-d [p0, p1, 2] or 4-d
# topology [x, y, 1, 2].
_TILED_PHYSICAL = [
  [1, 1, 2],
  [2, 1, 2],
  [1, 2, 2],
  [2, 2, 2],
  [2, 4, 2],
  [4, 2, 2],
  [4, 4, 2],
  [8, 4, 2],
  [8, 8, 2],
  [2, 2, 1, 2],
  [4, 8, 1, 2],
  [8, 8, 1, 2],
  [2, 2, 2, 2],  # z > 1: [y*z, x, cores], as in the original
]


def _physical_3d(physical_shape):
  if len(physical_shape) == 4:
    x, y, z, c = physical_shape
    return [y * z, x, c]
  return list(physical_shape)


def _logical_shapes(n, max_len=3):
  return _factorizations(n, max_len)


@pytest.mark.parametrize(
  "physical_shape", _TILED_PHYSICAL, ids=[str(s) for s in _TILED_PHYSICAL]
)
def test_auto_is_a_permutation_and_keeps_later_dims_close(physical_shape):
  n = shapes.list_product(physical_shape)
  p3 = _physical_3d(physical_shape)
  for logical_shape in _logical_shapes(n):
    l2p = auto_logical_to_physical_tpu(logical_shape, physical_shape)
    _assert_permutation(l2p, n)
    coords = auto_logical_to_physical_tpu(
      logical_shape, physical_shape, return_coordinates=True
    )
    assert [
      layout_lib.processor_coordinates_to_pnum(p3, c) for c in coords
    ] == l2p
    dims = [s for s in logical_shape if s != 1]
    if len(dims) == 1:
      # One ring over the chips, cores of a chip adjacent.
      chips = [tuple(c[:2]) for c in coords[::2]]
      assert chips == _ring_2d(p3[0], p3[1])
      assert all(
        coords[i][:2] == coords[i + 1][:2]
        and [coords[i][2], coords[i + 1][2]] == [0, 1]
        for i in range(0, n, 2)
      )
    elif len(dims) >= 2:
      # Each value of the first dim owns a rectangle of whole chips.
      per_tile = n // dims[0]
      for t in range(dims[0]):
        tile = coords[t * per_tile : (t + 1) * per_tile]
        chips = {tuple(c[:2]) for c in tile}
        assert len(chips) * 2 == per_tile
        rows = {c[0] for c in chips}
        cols = {c[1] for c in chips}
        assert len(rows) * len(cols) == len(chips)
        assert max(rows) - min(rows) + 1 == len(rows)
        assert max(cols) - min(cols) + 1 == len(cols)


def test_auto_examples():
  assert auto_logical_to_physical_tpu([4, 2], [2, 2, 2]) == [
    0,
    1,
    2,
    3,
    6,
    7,
    4,
    5,
  ]
  assert auto_logical_to_physical_tpu([8], [2, 2, 2]) == [
    0,
    1,
    2,
    3,
    6,
    7,
    4,
    5,
  ]
  # [x, y, 1, 2] is first turned into [y, x, 2].
  coords = auto_logical_to_physical_tpu(
    [4], [2, 1, 1, 2], return_coordinates=True
  )
  assert coords == [[0, 0, 0], [0, 0, 1], [0, 1, 0], [0, 1, 1]]
  # Two logical dims, tile = one whole row of chips (tile_chips == p1).
  l2p = auto_logical_to_physical_tpu([2, 8], [2, 4, 2])
  assert sorted(l2p[:8]) == list(range(8))
  # Tile = one whole column of chips (tile_chips == p0).
  coords = auto_logical_to_physical_tpu(
    [2, 8], [4, 2, 2], return_coordinates=True
  )
  assert {c[1] for c in coords[:8]} == {0}
  assert {c[1] for c in coords[8:]} == {1}
  # Size-1 logical dims are ignored.
  assert auto_logical_to_physical_tpu(
    [1, 4, 1, 2], [2, 2, 2]
  ) == auto_logical_to_physical_tpu([4, 2], [2, 2, 2])


# Fallback paths: the original returned a function object (`return
# _default_value` without a call) for cores != 2, and called
# pnum_to_processor_coordinates without the shape for return_coordinates.
_FALLBACK_PHYSICAL = [
  [4, 4, 1],  # one core per chip
  [2, 2, 4],  # four cores per chip
  [3, 2, 2],  # p0 not a power of 2
  [2, 6, 2],  # p1 not a power of 2
  [2, 2, 1, 4],  # 4-d, 4 cores
  [3, 1, 1, 2],  # 4-d, y*z = 1, x = 3
  [8, 2],  # 2-d
  [16],  # 1-d
  [2, 2, 2, 2, 2],  # 5-d
]


@pytest.mark.parametrize(
  "physical_shape", _FALLBACK_PHYSICAL, ids=[str(s) for s in _FALLBACK_PHYSICAL]
)
def test_auto_fallback_is_identity(physical_shape):
  n = shapes.list_product(physical_shape)
  effective = physical_shape
  if len(physical_shape) == 4:
    effective = physical_shape_3d_from_topology_proto_4d(physical_shape)
  for logical_shape in _logical_shapes(n, 2):
    l2p = auto_logical_to_physical_tpu(logical_shape, physical_shape)
    assert l2p == list(range(n))
    coords = auto_logical_to_physical_tpu(
      logical_shape, physical_shape, return_coordinates=True
    )
    assert coords == [
      layout_lib.pnum_to_processor_coordinates(effective, p) for p in range(n)
    ]
    assert all(isinstance(c, list) and len(c) == len(effective) for c in coords)


def test_auto_single_core():
  assert auto_logical_to_physical_tpu([1], [1, 1, 1, 1]) == [0]
  assert auto_logical_to_physical_tpu([], [1, 1, 1]) == [0]
  assert auto_logical_to_physical_tpu(
    [1, 1], [1, 1, 1], return_coordinates=True
  ) == [[0, 0, 0]]


def test_tile_chips_shape_choices():
  # Whole column / whole row when the tile has as many chips as p0 / p1.
  assert tpu_topology._tile_chips_shape(4, 4, 2, 2) == (4, 1)
  assert tpu_topology._tile_chips_shape(2, 4, 2, 2) == (1, 2)
  # Otherwise roughly square, clamped to the grid.
  assert tpu_topology._tile_chips_shape(4, 8, 8, 2) == (2, 2)
  assert tpu_topology._tile_chips_shape(8, 8, 2, 3) == (4, 2)
  assert tpu_topology._tile_chips_shape(2, 4, 4, 3) == (1, 2)
  assert tpu_topology._tile_chips_shape(2, 1, 4, 3) == (1, 2)
  assert tpu_topology._tile_chips_shape(16, 2, 16, 2) == (1, 16)


@pytest.mark.parametrize(
  "logical_shape,physical_shape,match",
  [
    ([4, 4], [2, 2, 2], "same product"),
    ([0, 4], [2, 2, 1], "logical_shape"),
    ([4, -1], [2, 2, 1], "logical_shape"),
    ([4, 2], [2, 2.0, 2], "physical_shape"),
    ([4], [], "physical_shape"),
    ("ab", [2, 2, 2], "logical_shape"),
    (4, [2, 2], "logical_shape"),
  ],
)
def test_auto_errors(logical_shape, physical_shape, match):
  with pytest.raises(ValueError, match=match):
    auto_logical_to_physical_tpu(logical_shape, physical_shape)
