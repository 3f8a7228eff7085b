"""Tests of the named (mesh shape, layout) sets and their test ids."""

import mesh_tensorflow as mtf
from tests import meshes

NAMED_SETS = {
  name: value
  for name, value in vars(meshes).items()
  if name.isupper() and isinstance(value, tuple)
}


def test_trio_starts_on_one_device_then_all_4_then_rows_cols():
  assert meshes.trio(all_4=["", "a:all"], rows_cols=["a:rows"]) == (
    ("", ""),
    ("all:4", ""),
    ("all:4", "a:all"),
    ("rows:2;cols:2", "a:rows"),
  )


def test_mesh_layouts_on_other_meshes():
  assert meshes.mesh_layouts(
    ("b:2;m:2", ["batch:b", "d_ff:m"]), ("all:4", ["batch:all"])
  ) == (("b:2;m:2", "batch:b"), ("b:2;m:2", "d_ff:m"), ("all:4", "batch:all"))


def test_ids_are_readable():
  assert meshes.ids([("", ""), ("all:4", ""), ("rows:2;cols:2", "a:rows")]) == [
    "one_device|replicated",
    "all:4|replicated",
    "rows:2;cols:2|a:rows",
  ]


def test_parametrize_adds_extra_pairs_and_their_ids():
  mark = meshes.parametrize(
    meshes.OPTIMIZERS, "mesh_layout", extra=[("all:4", "a:all")]
  )
  assert mark.args == (
    "mesh_layout",
    [("", ""), ("rows:2;cols:2", "a:rows;b:cols"), ("all:4", "a:all")],
  )
  assert mark.kwargs["ids"] == [
    "one_device|replicated",
    "rows:2;cols:2|a:rows;b:cols",
    "all:4|a:all",
  ]


def test_every_named_set_has_distinct_valid_pairs():
  assert len(NAMED_SETS) > 20
  for name, pairs in NAMED_SETS.items():
    assert len(set(pairs)) == len(pairs), name
    for mesh_shape, layout in pairs:
      mesh = mtf.convert_to_shape(mesh_shape)
      rules = mtf.convert_to_layout_rules(layout)
      mesh_dims = {dim.name for dim in mesh.dims}
      assert all(
        mesh_dim in mesh_dims | {"none"} for _, mesh_dim in rules.pairs
      ), (name, layout)
