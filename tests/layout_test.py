"""Tests for mesh_tensorflow._src.layout (pure Python, no TensorFlow)."""

import importlib
import importlib.util
import itertools
import pathlib
import re
import sys
import types

import pytest

_REPO = pathlib.Path(__file__).resolve().parents[1]


def _import_pure(module_name):
  """Imports a pure module of mesh_tensorflow._src, even without TensorFlow.

  mesh_tensorflow/__init__.py imports TensorFlow; when TensorFlow is missing,
  stub the packages so that only the pure modules run.
  """
  if (
    importlib.util.find_spec("tensorflow") is None
    and "mesh_tensorflow" not in sys.modules
  ):
    for name, path in (
      ("mesh_tensorflow", _REPO / "mesh_tensorflow"),
      ("mesh_tensorflow._src", _REPO / "mesh_tensorflow" / "_src"),
    ):
      package = types.ModuleType(name)
      package.__path__ = [str(path)]
      sys.modules[name] = package
  return importlib.import_module(f"mesh_tensorflow._src.{module_name}")


shapes = _import_pure("shapes")
layout = _import_pure("layout")
Dimension = shapes.Dimension
Shape = shapes.Shape
LayoutRules = layout.LayoutRules
TensorLayout = layout.TensorLayout

_MESH_SHAPES = [[], [1], [4], [2, 3], [3, 2], [2, 2, 2], [2, 1, 3], [1, 4, 2]]


# LayoutRules.


def test_layout_rules_keep_order_and_drop_repeats():
  rules = LayoutRules(
    [
      ("batch", "batch"),
      ["d_ff", "model"],
      ("batch", "batch"),
      ("heads", "model"),
    ]
  )
  assert list(rules) == [
    ("batch", "batch"),
    ("d_ff", "model"),
    ("heads", "model"),
  ]
  assert rules.pairs == tuple(rules)
  assert len(rules) == 3
  assert repr(rules) == (
    "LayoutRules([('batch', 'batch'), ('d_ff', 'model'), ('heads', 'model')])"
  )


def test_layout_rules_equality_ignores_order():
  a = LayoutRules([("x", "m"), ("y", "n")])
  b = LayoutRules([("y", "n"), ("x", "m"), ("x", "m")])
  assert a == b
  assert hash(a) == hash(b)
  assert a != LayoutRules([("x", "m")])
  assert a != [("x", "m"), ("y", "n")]
  assert len({a, b}) == 1


@pytest.mark.parametrize(
  "pair", [("a",), ("a", "b", "c"), ("a", 1), (1, "b"), "ab", None, ("a", None)]
)
def test_layout_rules_invalid_pair(pair):
  with pytest.raises(ValueError, match=re.escape(repr(pair))):
    LayoutRules([("ok", "ok"), pair])


@pytest.mark.parametrize(
  "x, expected",
  [
    ("batch:batch,d_ff:model", [("batch", "batch"), ("d_ff", "model")]),
    (
      "batch:batch;d_ff:model heads:model",
      [("batch", "batch"), ("d_ff", "model"), ("heads", "model")],
    ),
    ("", []),
    ([], []),
    ((), []),
    ({}, []),
    ({"d_ff": "model"}, [("d_ff", "model")]),
    ([("a", "b")], [("a", "b")]),
    ((("a", "b"), ("c", "d")), [("a", "b"), ("c", "d")]),
    ({("a", "b")}, [("a", "b")]),
  ],
)
def test_convert_to_layout_rules(x, expected):
  rules = layout.convert_to_layout_rules(x)
  assert isinstance(rules, LayoutRules)
  assert list(rules) == expected


def test_convert_to_layout_rules_identity_and_errors():
  rules = LayoutRules([("a", "b")])
  assert layout.convert_to_layout_rules(rules) is rules
  assert LayoutRules("a:b") == rules
  with pytest.raises(TypeError):
    layout.convert_to_layout_rules(None)
  with pytest.raises(ValueError, match="'a'"):
    layout.convert_to_layout_rules("a")


def test_tensor_dimension_to_mesh_axis():
  rules = layout.convert_to_layout_rules("batch:batch,d_ff:model")
  mesh = shapes.convert_to_shape("batch:2;model:4")
  assert rules.tensor_dimension_to_mesh_axis(Dimension("batch", 8), mesh) == 0
  assert rules.tensor_dimension_to_mesh_axis(Dimension("d_ff", 8), mesh) == 1
  assert (
    rules.tensor_dimension_to_mesh_axis(Dimension("d_model", 8), mesh) is None
  )
  assert rules.tensor_dimension_to_mesh_axis("d_ff", "model:4;batch:2") == 0
  assert rules.tensor_dimension_to_mesh_axis(("d_ff", 3), [("model", 4)]) == 0


def test_rules_for_absent_mesh_dims_are_ignored():
  rules = layout.convert_to_layout_rules(
    "batch:batch,d_ff:model,heads:model,experts:expert_dim"
  )
  mesh = Shape([("model", 4)])
  assert (
    rules.tensor_dimension_to_mesh_axis(Dimension("batch", 8), mesh) is None
  )
  assert (
    rules.tensor_dimension_to_mesh_axis(Dimension("experts", 8), mesh) is None
  )
  assert rules.tensor_layout("batch:8,d_ff:16,experts:4", mesh) == TensorLayout(
    (None, 0, None)
  )
  assert rules.tensor_layout("batch:8", []) == TensorLayout((None,))
  assert rules.unknown_mesh_dimensions(mesh) == ["batch", "expert_dim"]
  assert rules.unknown_mesh_dimensions("batch:2,model:2,expert_dim:2") == []
  assert rules.unknown_mesh_dimensions([]) == ["batch", "expert_dim", "model"]


def test_one_tensor_dim_over_two_mesh_dims_raises():
  rules = LayoutRules([("batch", "b1"), ("batch", "b2")])
  # Only one of the two mesh dims present: fine.
  assert (
    rules.tensor_dimension_to_mesh_axis(Dimension("batch", 8), "b2:2,model:2")
    == 0
  )
  with pytest.raises(ValueError, match=r"tensor dimension 'batch'.*'b1', 'b2'"):
    rules.tensor_dimension_to_mesh_axis(Dimension("batch", 8), "b1:2.b2:2")
  with pytest.raises(ValueError, match="'batch'"):
    rules.tensor_layout("batch:8", "b1:2.b2:2")


def test_two_tensor_dims_over_one_mesh_dim_raises():
  rules = layout.convert_to_layout_rules("d_ff:model,heads:model")
  with pytest.raises(ValueError) as e:
    rules.tensor_layout("heads:8,d_model:4,d_ff:16", "model:4")
  message = str(e.value)
  assert message.startswith(
    "tensor dimensions 'heads' and 'd_ff' of "
    "Shape[heads=8, d_model=4, d_ff=16] are both laid out over mesh "
    "dimension 'model' (rules "
  )
  assert "('heads', 'model')" in message and "('d_ff', 'model')" in message
  assert "Shape[model=4]" in message
  # Each alone is fine.
  assert rules.tensor_layout("heads:8,d_model:4", "model:4") == TensorLayout(
    (0, None)
  )


@pytest.mark.parametrize(
  "mesh", ["", "model:2", "batch:2;model:2", "model:2;batch:2"]
)
def test_tensor_layout_matches_per_dim_axes(mesh):
  rules = layout.convert_to_layout_rules("batch:batch,d_ff:model")
  tensor_shape = shapes.convert_to_shape("batch:4,length:3,d_ff:8")
  result = rules.tensor_layout(tensor_shape, mesh)
  assert result.tensor_axis_to_mesh_axis == tuple(
    rules.tensor_dimension_to_mesh_axis(d, mesh) for d in tensor_shape
  )


def test_mesh_dimension_name_to_tensor_dimension_names():
  rules = layout.convert_to_layout_rules("d_ff:model,batch:batch,heads:model")
  assert rules.mesh_dimension_name_to_tensor_dimension_names("model") == [
    "d_ff",
    "heads",
  ]
  assert rules.mesh_dimension_name_to_tensor_dimension_names("batch") == [
    "batch"
  ]
  assert rules.mesh_dimension_name_to_tensor_dimension_names("nope") == []


# TensorLayout.


def test_tensor_layout_value_type():
  tl = TensorLayout([None, 1, 0])
  assert tl.tensor_axis_to_mesh_axis == (None, 1, 0)
  assert tl == TensorLayout((None, 1, 0))
  assert hash(tl) == hash(TensorLayout((None, 1, 0)))
  assert tl != TensorLayout((None, 0, 1))
  assert len(tl) == 3
  assert tl[1] == 1 and tl[0] is None
  assert list(tl) == [None, 1, 0]
  assert "(None, 1, 0)" in repr(tl)
  assert not tl.is_fully_replicated
  assert TensorLayout((None, None)).is_fully_replicated
  assert TensorLayout(()).is_fully_replicated
  with pytest.raises(AttributeError):
    tl.tensor_axis_to_mesh_axis = (None,)


@pytest.mark.parametrize(
  "axes, mesh_ndims, expected",
  [
    ((None, 1, 0), 2, (2, 1)),
    ((None, 1, 0), 3, (2, 1, None)),
    ((None, None), 2, (None, None)),
    ((2,), 3, (None, None, 0)),
    ((), 0, ()),
  ],
)
def test_mesh_axis_to_tensor_axis(axes, mesh_ndims, expected):
  assert TensorLayout(axes).mesh_axis_to_tensor_axis(mesh_ndims) == expected


def test_tensor_layout_invalid():
  with pytest.raises(ValueError, match="mesh axis 0"):
    TensorLayout((0, None, 0))
  with pytest.raises(ValueError, match="-1"):
    TensorLayout((-1,))
  with pytest.raises(ValueError, match="'x'"):
    TensorLayout(("x",))


def test_mesh_axis_to_tensor_axis_leaves_out_axes_past_mesh_ndims():
  # As the original: a layout is built without a mesh, and asking about fewer
  # mesh axes than it uses leaves the others out instead of failing.
  assert TensorLayout((0, 2, 1)).mesh_axis_to_tensor_axis(0) == ()
  assert TensorLayout((0, 2, 1)).mesh_axis_to_tensor_axis(2) == (0, 2)
  assert TensorLayout((2,)).mesh_axis_to_tensor_axis(2) == (None, None)


# Processor numbering and groups.


def _all_coordinates(sizes):
  return [list(c) for c in itertools.product(*[range(s) for s in sizes])]


@pytest.mark.parametrize("sizes", _MESH_SHAPES)
def test_pnum_round_trip(sizes):
  coords = _all_coordinates(sizes)
  # Row-major, last axis fastest: pnum order is itertools.product order.
  for pnum, coord in enumerate(coords):
    assert layout.pnum_to_processor_coordinates(sizes, pnum) == coord
    assert layout.processor_coordinates_to_pnum(sizes, coord) == pnum
  mesh = Shape([(f"m{i}", s) for i, s in enumerate(sizes)])
  for pnum, coord in enumerate(coords):
    assert layout.pnum_to_processor_coordinates(mesh, pnum) == coord
    assert layout.processor_coordinates_to_pnum(mesh, coord) == pnum


def test_pnum_examples_and_errors():
  assert layout.pnum_to_processor_coordinates([2, 3], 4) == [1, 1]
  assert layout.pnum_to_processor_coordinates("a:2,b:3", 5) == [1, 2]
  assert layout.processor_coordinates_to_pnum([2, 3], [1, 0]) == 3
  with pytest.raises(ValueError, match="6"):
    layout.pnum_to_processor_coordinates([2, 3], 6)
  with pytest.raises(ValueError):
    layout.pnum_to_processor_coordinates([2, 3], -1)
  with pytest.raises(ValueError):
    layout.processor_coordinates_to_pnum([2, 3], [0, 3])
  with pytest.raises(ValueError):
    layout.processor_coordinates_to_pnum([2, 3], [0])


def _subsets(n):
  return [
    list(c) for k in range(n + 1) for c in itertools.combinations(range(n), k)
  ]


_GROUP_CASES = [
  (sizes, group_dims)
  for sizes in [[2, 3], [2, 2, 2], [3, 1, 2], [4]]
  for group_dims in _subsets(len(sizes))
]


@pytest.mark.parametrize("sizes, group_dims", _GROUP_CASES)
def test_processor_groups_brute_force(sizes, group_dims):
  coords = _all_coordinates(sizes)
  groups = layout.processor_groups(sizes, group_dims)
  # A partition of all processors.
  assert sorted(p for g in groups for p in g) == list(range(len(coords)))
  group_size = shapes.list_product(sizes[i] for i in group_dims)
  assert all(len(g) == group_size for g in groups)
  outer = [i for i in range(len(sizes)) if i not in group_dims]
  for g in groups:
    # Members agree on every non-group axis.
    assert len({tuple(coords[p][i] for i in outer) for p in g}) == 1
    # Row-major order of the coordinates along group_dims.
    along = [tuple(coords[p][i] for i in group_dims) for p in g]
    assert along == sorted(along)
  # Any two processors agreeing on the non-group axes share a group.
  for p, q in itertools.combinations(range(len(coords)), 2):
    same = all(coords[p][i] == coords[q][i] for i in outer)
    assert same == (
      layout.pnum_to_group(sizes, group_dims, p)
      == layout.pnum_to_group(sizes, group_dims, q)
    )
  # Groups ordered by first pnum; pnum_to_group indexes into groups.
  assert [g[0] for g in groups] == sorted(g[0] for g in groups)
  for index, g in enumerate(groups):
    for p in g:
      assert layout.pnum_to_group(sizes, group_dims, p) == index


@pytest.mark.parametrize(
  "sizes, group_dims, expected",
  [
    ([2, 3], [1], [[0, 1, 2], [3, 4, 5]]),
    ([2, 3], [0], [[0, 3], [1, 4], [2, 5]]),
    ([2, 3], [], [[0], [1], [2], [3], [4], [5]]),
    ([2, 3], [0, 1], [[0, 1, 2, 3, 4, 5]]),
    ([2, 3], [1, 0], [[0, 1, 2, 3, 4, 5]]),
    ([2, 2, 2], [0, 2], [[0, 1, 4, 5], [2, 3, 6, 7]]),
    ([], [], [[0]]),
  ],
)
def test_processor_groups_examples(sizes, group_dims, expected):
  assert layout.processor_groups(sizes, group_dims) == expected
  mesh = Shape([(f"m{i}", s) for i, s in enumerate(sizes)])
  assert layout.processor_groups(mesh, group_dims) == expected


@pytest.mark.parametrize("group_dims", [[2], [-1], ["a"]])
def test_processor_groups_invalid_axis(group_dims):
  with pytest.raises(ValueError, match="group_dims"):
    layout.processor_groups([2, 3], group_dims)


# Split sizes.


@pytest.mark.parametrize(
  "rules, mesh, dim, splits, per_split",
  [
    ("d_ff:model", "model:4", ("d_ff", 64), 4, 16),
    ("d_ff:model", "batch:2;model:4", ("d_ff", 64), 4, 16),
    ("d_ff:model", "batch:2", ("d_ff", 64), 1, 64),
    ("d_ff:model", "model:4", ("d_model", 6), 1, 6),
    ([("batch", "batch")], [("batch", 8)], ("batch", 8), 8, 1),
    ({}, "model:4", ("d_ff", 7), 1, 7),
    ("", [], ("d_ff", 7), 1, 7),
  ],
)
def test_split_sizes(rules, mesh, dim, splits, per_split):
  dim = Dimension(*dim)
  assert layout.tensor_dim_to_mesh_dim_size(rules, mesh, dim) == splits
  assert layout.tensor_dim_to_size_per_split(rules, mesh, dim) == per_split
  rules = layout.convert_to_layout_rules(rules)
  mesh = shapes.convert_to_shape(mesh)
  assert layout.tensor_dim_to_mesh_dim_size(rules, mesh, dim) == splits


def test_split_error_message():
  expected = (
    "dimension 'heads' (size 6) does not divide over mesh dim "
    "'model' (size 4) under rule ('heads', 'model')"
  )
  assert (
    layout.split_error_message(Dimension("heads", 6), Dimension("model", 4))
    == expected
  )
  assert (
    layout.tensor_dim_to_mesh_dim_size(
      "heads:model", "model:4", Dimension("heads", 6)
    )
    == 4
  )
  with pytest.raises(ValueError) as e:
    layout.tensor_dim_to_size_per_split(
      "batch:batch,heads:model", "batch:2,model:4", Dimension("heads", 6)
    )
  assert str(e.value) == expected
