"""Pictures of a layout: which slice of each tensor each processor holds.

The mesh is drawn as a grid of processors (rows: every mesh dimension but
the last, flattened; columns: the last mesh dimension), one grid per tensor.
Processors holding the same slice share a colour (SVG) or a letter (text);
the legend gives each slice's index ranges and size. Slices come from the
mesh implementation's own layout (`MeshImpl.slice_begin`), so the picture
shows what a lowering would place.
"""

from __future__ import annotations

import dataclasses
import os
import string
from typing import List, Optional, Sequence, Tuple
from xml.sax import saxutils

from mesh_tensorflow._src import layout as layout_lib
from mesh_tensorflow._src import mesh_impl as mesh_impl_lib
from mesh_tensorflow._src import shapes
from mesh_tensorflow._src.plan.planner import format_bytes

# Slices beyond this many are summarised in a legend line.
MAX_LEGEND_ROWS = 16
# A one-dimensional mesh wraps into rows of this many processors.
MAX_ROW_LENGTH = 16

_CELL_PIXELS = 28
_MIN_CELL_PIXELS = 10
_MAX_GRID_PIXELS = 640
_MARGIN = 12
_LINE = 16


@dataclasses.dataclass(frozen=True)
class TensorSlices:
  """Which slice of one tensor each processor of a mesh holds.

  Attributes:
    name: the tensor's name (a variable name, or "" for a bare shape).
    shape: the tensor's mtf.Shape.
    mesh_shape: the mesh's mtf.Shape.
    layout_rules: the layout rules the slices follow.
    slice_shape: the shape of every processor's slice.
    slice_begins: the distinct slices' offsets in the full tensor, sorted;
      slice k starts at slice_begins[k].
    processor_slices: for each processor number, the index k of its slice.
    bytes_per_element: the element size in bytes, or None if unknown.
  """

  name: str
  shape: shapes.Shape
  mesh_shape: shapes.Shape
  layout_rules: layout_lib.LayoutRules
  slice_shape: Tuple[int, ...]
  slice_begins: Tuple[Tuple[int, ...], ...]
  processor_slices: Tuple[int, ...]
  bytes_per_element: Optional[int] = None

  def slice_ranges(self, slice_index: int) -> str:
    """The index ranges of one slice, e.g. "batch[0:2] hidden[0:8]".

    Args:
      slice_index: which slice (an index into slice_begins).

    Returns:
      One `name[begin:end]` per tensor dimension, space-separated.
    """
    begin = self.slice_begins[slice_index]
    return " ".join(
      "%s[%d:%d]" % (dim.name, start, start + size)
      for dim, start, size in zip(self.shape.dims, begin, self.slice_shape)
    )

  def slice_bytes(self) -> Optional[int]:
    """The size of one slice in bytes (None if the element size is unknown).

    Returns:
      The slice's number of elements times bytes_per_element, or None.
    """
    if self.bytes_per_element is None:
      return None
    return shapes.list_product(self.slice_shape) * self.bytes_per_element


def tensor_slices(
  tensor_shape,
  mesh_shape,
  layout_rules,
  *,
  name: str = "",
  bytes_per_element: Optional[int] = None,
) -> TensorSlices:
  """Which slice of a tensor each processor of a mesh holds.

  Example:
    >>> s = tensor_slices("batch:4;hidden:8", "rows:2;cols:2", "batch:rows")
    >>> s.slice_shape, s.processor_slices
    ((2, 8), (0, 0, 1, 1))
    >>> s.slice_ranges(1)
    'batch[2:4] hidden[0:8]'

  Args:
    tensor_shape: the tensor's shape (an mtf.Shape or a string such as
      "batch:4;hidden:8").
    mesh_shape: the mesh shape (an mtf.Shape or a string).
    layout_rules: the layout rules (mtf.LayoutRules or a string).
    name: a name to print above the tensor's picture.
    bytes_per_element: the element size in bytes, for the legend's sizes.

  Returns:
    A TensorSlices.

  Raises:
    ValueError: a mesh dimension does not divide the tensor dimension split
      over it (the message names both).
  """
  impl = mesh_impl_lib.MeshImpl(mesh_shape, layout_rules)
  tensor_shape = shapes.convert_to_shape(tensor_shape)
  slice_shape = tuple(impl.slice_shape(tensor_shape))
  begins = [tuple(impl.slice_begin(tensor_shape, p)) for p in range(impl.size)]
  distinct = sorted(set(begins))
  index = {begin: k for k, begin in enumerate(distinct)}
  return TensorSlices(
    name=name,
    shape=tensor_shape,
    mesh_shape=impl.shape,
    layout_rules=impl.layout_rules,
    slice_shape=slice_shape,
    slice_begins=tuple(distinct),
    processor_slices=tuple(index[b] for b in begins),
    bytes_per_element=bytes_per_element,
  )


def graph_slices(
  graph, mesh_shape, layout_rules, names: Optional[Sequence[str]] = None
) -> List[TensorSlices]:
  """The slices of a graph's variables, or of the tensors named, on a mesh.

  Without names: every variable, in creation order, sized as the
  per-processor copies are (the variables' slice dtype). A name picks a
  variable, else a tensor ("<operation>:<index>"), else the first output of
  an operation; the results follow the order of `names`.

  Args:
    graph: an mtf.Graph.
    mesh_shape: the mesh shape (an mtf.Shape or a string).
    layout_rules: the layout rules (mtf.LayoutRules or a string).
    names: variable, tensor or operation names (default: every variable).

  Returns:
    One TensorSlices per variable or tensor.

  Raises:
    ValueError: a name that no variable, tensor or operation of the graph
      has.
  """
  variables = {v.name: v for v in graph.all_variables}
  if names is None:
    names = list(variables)
  tensors = {}
  for op in graph.operations:
    for tensor in op.outputs:
      tensors.setdefault(tensor.name, tensor)
    if op.outputs:
      tensors.setdefault(op.name, op.outputs[0])
  unknown = [n for n in names if n not in variables and n not in tensors]
  if unknown:
    listed = sorted(variables)
    raise ValueError(
      "graph_slices: no variables, tensors or operations named %s; the "
      "graph's %d variables are %s%s"
      % (
        unknown,
        len(listed),
        ", ".join(listed[:10]),
        ", ..." if len(listed) > 10 else "",
      )
    )
  result = []
  for name in names:
    if name in variables:
      shape, dtype = variables[name].shape, variables[name].slice_dtype
    else:
      shape, dtype = tensors[name].shape, tensors[name].dtype
    result.append(
      tensor_slices(
        shape,
        mesh_shape,
        layout_rules,
        name=name,
        bytes_per_element=dtype.size,
      )
    )
  return result


@dataclasses.dataclass(frozen=True)
class _Grid:
  """Where processors sit in a picture: pnum -> (pnum // columns, % columns)."""

  rows: int
  columns: int
  row_title: str  # what the rows stand for ("" for a wrapped 1-D mesh)
  column_title: str
  row_heads: Tuple[str, ...]


def _grid(mesh_shape: shapes.Shape) -> _Grid:
  """The processor grid of a mesh.

  Rows are every mesh dimension but the last (flattened, row-major as
  processor numbers are), columns the last one; a one-dimensional mesh wraps
  into rows of at most MAX_ROW_LENGTH processors, headed by their first
  processor's offset.
  """
  dims = mesh_shape.dims
  if not dims:
    return _Grid(1, 1, "", "", ("",))
  if len(dims) == 1:
    columns = min(dims[0].size, MAX_ROW_LENGTH)
    while dims[0].size % columns:
      columns -= 1
    rows = dims[0].size // columns
    heads = (
      ("",) if rows == 1 else tuple("+%d" % (r * columns) for r in range(rows))
    )
    return _Grid(rows, columns, "", dims[0].name, heads)
  outer = dims[:-1]
  rows = shapes.list_product([d.size for d in outer])
  heads = []
  for r in range(rows):
    coordinates = layout_lib.pnum_to_processor_coordinates(
      shapes.Shape(outer), r
    )
    heads.append(
      ",".join("%s=%d" % (d.name, i) for d, i in zip(outer, coordinates))
    )
  title = ",".join(d.name for d in outer)
  return _Grid(rows, dims[-1].size, title, dims[-1].name + "=", tuple(heads))


def _shape_text(shape: shapes.Shape) -> str:
  return ";".join("%s:%d" % (d.name, d.size) for d in shape.dims)


def _labels(count: int) -> List[str]:
  """Short distinct labels: A..Z for up to 26 slices, else 0..count-1."""
  if count <= len(string.ascii_uppercase):
    return list(string.ascii_uppercase[:count])
  return [str(k) for k in range(count)]


def _summary(slices: TensorSlices) -> str:
  count = len(slices.slice_begins)
  holders = len(slices.processor_slices) // count
  size = "%d elements" % shapes.list_product(slices.slice_shape)
  if slices.slice_bytes() is not None:
    size += ", " + format_bytes(slices.slice_bytes())
  return "%d slice%s of %s (%s), each held by %d processor%s" % (
    count,
    "" if count == 1 else "s",
    list(slices.slice_shape),
    size,
    holders,
    "" if holders == 1 else "s",
  )


def _title(slices: TensorSlices) -> str:
  layout = ",".join(
    "%s:%s" % (t, m)
    for t, m in slices.layout_rules
    if t in slices.shape.dimension_names
    and m in slices.mesh_shape.dimension_names
  )
  prefix = slices.name + " " if slices.name else ""
  return "%s[%s] on mesh %s, layout %s" % (
    prefix,
    _shape_text(slices.shape),
    _shape_text(slices.mesh_shape) or "(one processor)",
    layout or "(replicated)",
  )


def _legend_lines(slices: TensorSlices, labels: Sequence[str]) -> List[str]:
  count = len(slices.slice_begins)
  shown = min(count, MAX_LEGEND_ROWS)
  width = max(len(label) for label in labels[:shown])
  lines = [
    "%s  %s" % (labels[k].rjust(width), slices.slice_ranges(k))
    for k in range(shown)
  ]
  if count > shown:
    lines.append("... and %d more slices of the same size" % (count - shown))
  return lines


def text_picture(slices: Sequence[TensorSlices]) -> str:
  """A terminal picture: per tensor, the processor grid and a legend.

  Example:
    >>> s = tensor_slices("batch:4;hidden:8", "rows:2;cols:2", "batch:rows")
    >>> print(text_picture([s]))
    [batch:4;hidden:8] on mesh rows:2;cols:2, layout batch:rows
    2 slices of [2, 8] (16 elements), each held by 2 processors
       cols= 0 1
      rows=0 A A
      rows=1 B B
    A  batch[0:2] hidden[0:8]
    B  batch[2:4] hidden[0:8]

  Args:
    slices: TensorSlices of the tensors to draw (all on the same mesh or
      not).

  Returns:
    The picture as text, one block per tensor, blank-line separated.
  """
  blocks = []
  for s in slices:
    grid = _grid(s.mesh_shape)
    labels = _labels(len(s.slice_begins))
    width = max(len(label) for label in labels + [str(grid.columns - 1)])
    head_width = 2 + max(
      [len(grid.column_title)] + [len(h) for h in grid.row_heads]
    )
    lines = [_title(s), _summary(s)]
    lines.append(
      grid.column_title.rjust(head_width)
      + " "
      + " ".join(str(c).rjust(width) for c in range(grid.columns))
    )
    for r, head in enumerate(grid.row_heads):
      cells = [
        labels[s.processor_slices[r * grid.columns + c]].rjust(width)
        for c in range(grid.columns)
      ]
      lines.append(("  " + head).ljust(head_width) + " " + " ".join(cells))
    lines.extend(_legend_lines(s, labels))
    blocks.append("\n".join(line.rstrip() for line in lines))
  return "\n\n".join(blocks)


def _colour(slice_index: int, count: int) -> str:
  """A fill colour per slice: hues spread by the golden angle."""
  if count == 1:
    return "hsl(210, 45%, 70%)"
  hue = (slice_index * 137.508) % 360
  lightness = 62 if slice_index % 2 == 0 else 74
  return "hsl(%.1f, 65%%, %d%%)" % (hue, lightness)


def svg_picture(slices: Sequence[TensorSlices]) -> str:
  """An SVG picture: per tensor, the processor grid coloured by slice.

  Every processor is one `<rect class="cell">` carrying `data-pnum` and
  `data-slice` attributes and a tooltip; the legend lists each slice's
  colour, index ranges and size.

  Example:
    >>> s = tensor_slices("batch:4;hidden:8", "rows:2;cols:2", "batch:rows")
    >>> svg = svg_picture([s])
    >>> svg.startswith("<svg"), svg.count('class="cell"')
    (True, 4)

  Args:
    slices: TensorSlices of the tensors to draw.

  Returns:
    The SVG document as a string.
  """
  parts = []
  y = _MARGIN
  width = 0
  for s in slices:
    grid = _grid(s.mesh_shape)
    rows, columns = grid.rows, grid.columns
    cell = max(
      _MIN_CELL_PIXELS,
      min(_CELL_PIXELS, _MAX_GRID_PIXELS // max(rows, columns)),
    )
    labels = _labels(len(s.slice_begins))
    count = len(s.slice_begins)
    parts.append(_svg_text(_MARGIN, y + 12, _title(s), bold=True))
    parts.append(_svg_text(_MARGIN, y + 12 + _LINE, _summary(s)))
    y += 2 * _LINE + 4
    left = _MARGIN + _text_pixels(max(grid.row_heads, key=len)) + 8
    if grid.column_title:
      parts.append(_svg_text(left, y + 10, "%s \u2192" % grid.column_title))
      y += _LINE
    for r, head in enumerate(grid.row_heads):
      parts.append(_svg_text(_MARGIN, y + r * cell + cell // 2 + 4, head))
    for pnum, k in enumerate(s.processor_slices):
      r, c = divmod(pnum, columns)
      coordinates = layout_lib.pnum_to_processor_coordinates(s.mesh_shape, pnum)
      tooltip = "processor %d %s: %s" % (
        pnum,
        coordinates,
        s.slice_ranges(k),
      )
      parts.append(
        '<rect class="cell" data-pnum="%d" data-slice="%d" x="%d" y="%d" '
        'width="%d" height="%d" fill="%s" stroke="white"><title>%s</title>'
        "</rect>"
        % (
          pnum,
          k,
          left + c * cell,
          y + r * cell,
          cell,
          cell,
          _colour(k, count),
          saxutils.escape(tooltip),
        )
      )
      if cell >= 18 and len(labels[k]) <= 2:
        parts.append(
          _svg_text(
            left + c * cell + cell // 2,
            y + r * cell + cell // 2 + 4,
            labels[k],
            anchor="middle",
          )
        )
    width = max(width, left + columns * cell + _MARGIN)
    y += rows * cell + 8
    for k, line in enumerate(_legend_lines(s, labels)):
      if k < min(count, MAX_LEGEND_ROWS):
        parts.append(
          '<rect x="%d" y="%d" width="12" height="12" fill="%s"/>'
          % (_MARGIN, y, _colour(k, count))
        )
      parts.append(_svg_text(_MARGIN + 18, y + 10, line))
      width = max(width, _MARGIN + 18 + _text_pixels(line))
      y += _LINE
    y += _LINE
  for s in slices:
    width = max(
      width,
      _MARGIN + _text_pixels(_title(s)),
      _MARGIN + _text_pixels(_summary(s)),
    )
  return "\n".join(
    [
      '<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" '
      'font-family="monospace" font-size="12">' % (width + _MARGIN, y),
      *parts,
      "</svg>",
    ]
  )


def _text_pixels(text: str) -> int:
  """The width of text in the picture's 12px monospace font (~0.6 em)."""
  return int(len(text) * 7.3) + 1


def _svg_text(x: int, y: int, text: str, *, bold=False, anchor=None) -> str:
  attributes = ' font-weight="bold"' if bold else ""
  if anchor:
    attributes += ' text-anchor="%s"' % anchor
  return '<text x="%d" y="%d"%s>%s</text>' % (
    x,
    y,
    attributes,
    saxutils.escape(text),
  )


def write_picture(path: str, slices: Sequence[TensorSlices]) -> None:
  """Writes the picture to `path`: .svg, .png (needs matplotlib) or text.

  Args:
    path: the output file; its extension picks the format (".svg", ".png";
      any other extension gets the text form).
    slices: TensorSlices of the tensors to draw.

  Raises:
    ImportError: a .png path without matplotlib installed.
  """
  extension = os.path.splitext(path)[1].lower()
  if extension == ".png":
    _write_png(path, slices)
    return
  text = svg_picture(slices) if extension == ".svg" else text_picture(slices)
  with open(path, "w", encoding="utf-8") as f:
    f.write(text + "\n")


def _write_png(path: str, slices: Sequence[TensorSlices]) -> None:
  """The SVG picture's grids and legends drawn with matplotlib."""
  try:
    from matplotlib import colors  # pylint: disable=g-import-not-at-top
    from matplotlib import figure  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError(
      "writing %s needs matplotlib (pip install matplotlib); "
      "write an .svg picture instead, which needs nothing" % path
    ) from e
  fig = figure.Figure(figsize=(8, 3.2 * max(len(slices), 1)))
  for i, s in enumerate(slices):
    grid = _grid(s.mesh_shape)
    rows, columns = grid.rows, grid.columns
    count = len(s.slice_begins)
    axes = fig.add_subplot(len(slices), 1, i + 1)
    for pnum, k in enumerate(s.processor_slices):
      r, c = divmod(pnum, columns)
      hue = 0.6 if count == 1 else (k * 137.508) % 360 / 360
      value = 0.95 if k % 2 == 0 else 0.8
      axes.add_patch(
        _rectangle(c, rows - 1 - r, colors.hsv_to_rgb((hue, 0.55, value)))
      )
    axes.set_xlim(0, columns)
    axes.set_ylim(0, rows)
    axes.set_aspect("equal")
    axes.set_xticks([])
    axes.set_yticks([])
    axes.set_xlabel(grid.column_title)
    axes.set_ylabel(grid.row_title)
    axes.set_title("%s\n%s" % (_title(s), _summary(s)), fontsize=8)
  fig.tight_layout()
  fig.savefig(path)


def _rectangle(x, y, colour):
  from matplotlib import patches  # pylint: disable=g-import-not-at-top

  return patches.Rectangle((x, y), 1, 1, facecolor=colour, edgecolor="white")
