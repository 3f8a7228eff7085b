"""Pictures of a layout: slices per processor, SVG and text forms."""

import xml.etree.ElementTree as ElementTree

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import placement_mesh_impl
from mesh_tensorflow._src.plan import picture
from tests import meshes

BINARY_SHAPE = "a:4;b:4;c:2"
MATMUL_SHAPE = "batch:4;io:8;hidden:4"


def _num_processors(mesh_shape):
  return mtf.convert_to_shape(mesh_shape).size


def _lowered_slices(tensor_shape, mesh_shape, layout):
  """The slices a placement lowering gives each processor of an arange."""
  tensor_shape = mtf.convert_to_shape(tensor_shape)
  value = np.arange(tensor_shape.size, dtype=np.float32).reshape(
    tensor_shape.to_integer_list
  )
  mesh_impl = placement_mesh_impl.PlacementMeshImpl(
    mesh_shape, layout, [""] * _num_processors(mesh_shape)
  )
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.import_tf_tensor(mesh, tf.constant(value), tensor_shape)
  lowering = mtf.Lowering(graph, {mesh: mesh_impl})
  return value, [t.numpy() for t in lowering.tensors[x].tensor_list]


@meshes.parametrize(meshes.BINARY_OPS)
def test_slices_are_the_ones_a_lowering_places(mesh_shape, layout):
  value, lowered = _lowered_slices(BINARY_SHAPE, mesh_shape, layout)
  slices = picture.tensor_slices(BINARY_SHAPE, mesh_shape, layout)
  assert len(slices.processor_slices) == len(lowered)
  for pnum, laid_out in enumerate(lowered):
    begin = slices.slice_begins[slices.processor_slices[pnum]]
    index = tuple(
      slice(b, b + size) for b, size in zip(begin, slices.slice_shape)
    )
    np.testing.assert_array_equal(laid_out, value[index])


@meshes.parametrize(meshes.MATMUL)
def test_slices_follow_the_mesh_impl_and_tile_the_tensor(mesh_shape, layout):
  slices = picture.tensor_slices(MATMUL_SHAPE, mesh_shape, layout)
  mesh_impl = mtf.MeshImpl(mesh_shape, layout)
  tensor_shape = mtf.convert_to_shape(MATMUL_SHAPE)
  assert list(slices.slice_shape) == mesh_impl.slice_shape(tensor_shape)
  for pnum, k in enumerate(slices.processor_slices):
    assert list(slices.slice_begins[k]) == mesh_impl.slice_begin(
      tensor_shape, pnum
    )
  # The distinct slices cover every element exactly once.
  covered = np.zeros(tensor_shape.to_integer_list, dtype=int)
  for begin in slices.slice_begins:
    covered[
      tuple(slice(b, b + n) for b, n in zip(begin, slices.slice_shape))
    ] += 1
  np.testing.assert_array_equal(covered, 1)
  holders = np.bincount(slices.processor_slices)
  assert set(holders) == {_num_processors(mesh_shape) // len(holders)}


def test_slice_ranges_and_bytes():
  slices = picture.tensor_slices(
    "vocab:64;d_model:8",
    "batch:2;model:4",
    "vocab:model",
    name="embedding",
    bytes_per_element=4,
  )
  assert slices.processor_slices == (0, 1, 2, 3, 0, 1, 2, 3)
  assert slices.slice_ranges(2) == "vocab[32:48] d_model[0:8]"
  assert slices.slice_bytes() == 16 * 8 * 4


def test_indivisible_split_names_the_dims():
  with pytest.raises(ValueError, match="hidden.*model"):
    picture.tensor_slices("hidden:6", "model:4", "hidden:model")


def _cells(svg_text):
  root = ElementTree.fromstring(svg_text)
  return [e for e in root.iter() if e.get("class") == "cell"]


@pytest.mark.parametrize(
  "mesh_shape,layout",
  [
    ("", ""),
    ("all:4", "batch:all"),
    ("rows:2;cols:2", "batch:rows;io:cols"),
    ("x:2;y:2;z:2", "batch:x;hidden:z"),
    ("batch:32", "io:batch"),
  ],
)
def test_svg_is_xml_with_one_cell_per_processor(mesh_shape, layout):
  shape = "batch:4;io:32;hidden:4"
  tensors = [
    picture.tensor_slices(shape, mesh_shape, layout, name="w<&>"),
    picture.tensor_slices("batch:4", mesh_shape, ""),
  ]
  cells = _cells(picture.svg_picture(tensors))
  n = _num_processors(mesh_shape)
  assert len(cells) == 2 * n
  for t, tensor in enumerate(tensors):
    panel = cells[t * n : (t + 1) * n]
    assert [int(c.get("data-pnum")) for c in panel] == list(range(n))
    assert tuple(int(c.get("data-slice")) for c in panel) == (
      tensor.processor_slices
    )
    # One fill colour per slice.
    fills = {}
    for c in panel:
      fills.setdefault(int(c.get("data-slice")), set()).add(c.get("fill"))
    assert all(len(f) == 1 for f in fills.values())
    assert len({f.pop() for f in fills.values()}) == len(tensor.slice_begins)


def test_text_picture_grid_and_legend():
  slices = picture.tensor_slices(
    "a:8;b:8", "x:2;y:2;z:2", "a:x,b:z", name="kernel", bytes_per_element=2
  )
  lines = picture.text_picture([slices]).splitlines()
  assert lines[0] == "kernel [a:8;b:8] on mesh x:2;y:2;z:2, layout a:x,b:z"
  assert lines[1] == (
    "4 slices of [4, 4] (16 elements, 32 B), each held by 2 processors"
  )
  grid = [line.split()[1:] for line in lines[3:7]]
  assert [line.split()[0] for line in lines[3:7]] == [
    "x=0,y=0",
    "x=0,y=1",
    "x=1,y=0",
    "x=1,y=1",
  ]
  letters = [letter for row in grid for letter in row]
  assert letters == ["ABCD"[k] for k in slices.processor_slices]
  assert lines[7:] == [
    "A  a[0:4] b[0:4]",
    "B  a[0:4] b[4:8]",
    "C  a[4:8] b[0:4]",
    "D  a[4:8] b[4:8]",
  ]


def test_text_picture_long_legend_is_summarised():
  slices = picture.tensor_slices("vocab:64", "batch:32", "vocab:batch")
  text = picture.text_picture([slices])
  assert "... and 16 more slices of the same size" in text
  # A 1-D mesh of 32 wraps into two rows of 16, headed by their offsets.
  rows = [line.split() for line in text.splitlines() if line.startswith("  +")]
  assert rows[0][0] == "+0" and rows[1][0] == "+16"
  assert rows[1][1:] == [str(k) for k in range(16, 32)]


def _graph_with_variables():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  dtype = mtf.VariableDType(tf.bfloat16, tf.float32, tf.bfloat16)
  vocab, d_model = mtf.Dimension("vocab", 16), mtf.Dimension("d_model", 4)
  embedding = mtf.get_variable(mesh, "embedding", [vocab, d_model], dtype=dtype)
  scale = mtf.get_variable(mesh, "scale", [d_model], dtype=dtype)
  scaled = mtf.multiply(embedding, scale, name="scaled")
  return graph, scaled


def test_graph_slices_of_variables():
  graph, _ = _graph_with_variables()
  everything = picture.graph_slices(graph, "model:4", "vocab:model")
  assert [s.name for s in everything] == ["embedding", "scale"]
  embedding, scale = everything
  assert embedding.slice_shape == (4, 4)
  assert embedding.slice_bytes() == 4 * 4 * 4  # float32 slices
  assert scale.processor_slices == (0, 0, 0, 0)
  only = picture.graph_slices(graph, "model:4", "vocab:model", names=["scale"])
  assert [s.name for s in only] == ["scale"]


def test_graph_slices_of_named_tensors():
  graph, scaled = _graph_with_variables()
  by_op, by_tensor, variable = picture.graph_slices(
    graph,
    "model:2",
    "vocab:model",
    names=["scaled", scaled.name, "embedding"],
  )
  assert by_op.name == "scaled" and by_tensor.name == scaled.name
  for s in (by_op, by_tensor):
    assert s.shape == scaled.shape
    assert s.slice_ranges(1) == "vocab[8:16] d_model[0:4]"
    assert s.bytes_per_element == 2  # the bfloat16 activation
  assert variable.name == "embedding"
  with pytest.raises(ValueError, match="no variables, tensors or.*missing"):
    picture.graph_slices(graph, "model:4", "", names=["missing"])


def test_write_picture(tmp_path):
  slices = [picture.tensor_slices("a:4", "m:2", "a:m")]
  svg_path = tmp_path / "layout.svg"
  picture.write_picture(str(svg_path), slices)
  assert len(_cells(svg_path.read_text())) == 2
  text_path = tmp_path / "layout.txt"
  picture.write_picture(str(text_path), slices)
  assert text_path.read_text() == picture.text_picture(slices) + "\n"


def test_png_needs_matplotlib(tmp_path):
  path = tmp_path / "layout.png"
  slices = [picture.tensor_slices("a:4", "m:2", "a:m")]
  try:
    import matplotlib  # noqa: F401  # pylint: disable=g-import-not-at-top
  except ImportError:
    with pytest.raises(ImportError, match="matplotlib.*svg"):
      picture.write_picture(str(path), slices)
  else:
    picture.write_picture(str(path), slices)
    assert path.read_bytes().startswith(b"\x89PNG")
