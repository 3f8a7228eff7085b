"""Property test: the layout never changes the numbers a program computes.

Hypothesis generates small random mtf programs (elementwise ops, broadcasting
add/multiply, einsum contractions, reductions, reshapes that merge, split or
rename dims, transposes, broadcasts, casts), a final reduction and the
gradients of a scalar loss with respect to every input. Each program runs on
one device as the reference and on the 4-processor meshes ("all:4" and
"rows:2;cols:2") under random valid layouts, as CPUs sharing host memory
and as devices with separate memories (the backend's collectives differ);
all outputs must agree.
"""

import contextlib
import dataclasses
from typing import Dict, List, Optional, Tuple
from unittest import mock

from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
import numpy as np
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow._src.mesh_impls import collectives
from tests import mesh_test_util as mtu
from tests import meshes

SIZES = [2, 4, 8]
MAX_RANK = 4
MAX_SIZE = 512  # elements of any tensor (and of an einsum's union shape)

UNARY = {
  "tanh": mtf.tanh,
  "sigmoid": mtf.sigmoid,
  "sin": mtf.sin,
  "cos": mtf.cos,
  "negative": mtf.negative,
  # exp and square are applied to bounded values so that long chains of
  # them cannot overflow.
  "exp_tanh": lambda x: mtf.exp(mtf.tanh(x)),
  "square_sin": lambda x: mtf.square(mtf.sin(x)),
  "square": mtf.square,
}

OP_KINDS = [
  "unary",
  "binary",
  "einsum",
  "reduce",
  "merge",
  "split",
  "rename",
  "transpose",
  "broadcast",
  "cast",
]


@dataclasses.dataclass
class Program:
  """A replayable mtf program: inputs, then ops that append one tensor each."""

  inputs: List[Tuple[List[Tuple[str, int]], int]]  # (dims, numpy seed)
  ops: List[tuple]

  def sinks(self) -> List[int]:
    """Indices of the tensors no op consumes (every input reaches one)."""
    used = set()
    for op in self.ops:
      used.update(_operands(op))
    n = len(self.inputs) + len(self.ops)
    return [i for i in range(n) if i not in used]


def _operands(op: tuple) -> List[int]:
  kind = op[0]
  if kind in ("binary", "einsum"):
    return [op[1], op[2]]
  return [op[1]]


def _apply(tensors: List[mtf.Tensor], op: tuple) -> mtf.Tensor:
  """Builds one op of a Program on top of `tensors`."""
  kind = op[0]
  x = tensors[op[1]]
  if kind == "unary":
    return UNARY[op[2]](x)
  if kind == "binary":
    y = tensors[op[2]]
    return mtf.add(x, y) if op[3] == "add" else mtf.multiply(x, y)
  if kind == "einsum":
    y = tensors[op[2]]
    contracted, out_names = op[3], op[4]
    dims = {d.name: d for d in x.shape.dims + y.shape.dims}
    out = mtf.einsum([x, y], output_shape=[dims[n] for n in out_names])
    return out * (1.0 / dims[contracted].size)  # a mean stays bounded
  if kind == "reduce":
    dim = x.shape.dims[x.shape.dimension_names.index(op[3])]
    if op[2] == "sum":
      return mtf.reduce_sum(x, reduced_dim=dim) * (1.0 / dim.size)
    return mtf.reduce_max(x, reduced_dim=dim)
  if kind == "merge":
    pos, name = op[2], op[3]
    a, b = x.shape.dims[pos], x.shape.dims[pos + 1]
    return mtf.replace_dimensions(
      x, [a, b], mtf.Dimension(name, a.size * b.size)
    )
  if kind == "split":
    pos, new_dims = op[2], op[3]
    return mtf.replace_dimensions(
      x, x.shape.dims[pos], [mtf.Dimension(n, s) for n, s in new_dims]
    )
  if kind == "rename":
    return mtf.rename_dimension(x, op[2], op[3])
  if kind == "transpose":
    dims = {d.name: d for d in x.shape.dims}
    return mtf.transpose(x, [dims[n] for n in op[2]])
  if kind == "broadcast":
    (name, size), pos = op[2], op[3]
    dims = list(x.shape.dims)
    dims.insert(pos, mtf.Dimension(name, size))
    return mtf.broadcast(x, dims)
  if kind == "cast":
    return mtf.cast(mtf.cast(x, tf.float64), tf.float32)
  raise ValueError("unknown op %r" % (op,))


def _build(program: Program, mesh: mtf.Mesh):
  """Builds the program on `mesh`; returns (all tensors, input tensors)."""
  tensors = []
  for dims, seed in program.inputs:
    shape = mtf.Shape([mtf.Dimension(n, s) for n, s in dims])
    value = (
      np.random.RandomState(seed)
      .uniform(-1.5, 1.5, shape.to_integer_list)
      .astype(np.float32)
    )
    tensors.append(mtf.import_tf_tensor(mesh, tf.constant(value), shape))
  inputs = list(tensors)
  for op in program.ops:
    tensors.append(_apply(tensors, op))
  return tensors, inputs


def _outputs(program: Program, mesh: mtf.Mesh) -> List[mtf.Tensor]:
  tensors, inputs = _build(program, mesh)
  last = tensors[-1]
  final = mtf.reduce_sum(last, output_shape=last.shape.dims[:1])
  sinks = [tensors[i] for i in program.sinks()]
  loss = None
  for k, t in enumerate(sinks):
    term = mtf.reduce_sum(mtf.square(t) * (float(k + 1) / t.size))
    loss = term if loss is None else loss + term
  grads = mtf.gradients([loss], inputs)
  return sinks + [final, loss] + grads


def _all_shapes(program: Program) -> List[mtf.Shape]:
  """Shapes of every tensor the test lowers (gradients included)."""
  graph = mtf.Graph()
  _outputs(program, mtf.Mesh(graph, "mesh"))
  return [t.shape for op in graph.operations for t in op.outputs]


def _eligible(kind: str, tensors: List[mtf.Tensor], i: int) -> bool:
  x = tensors[i]
  rank = x.shape.ndims
  if kind in ("reduce", "merge", "transpose"):
    return rank >= 2
  if kind == "split":
    return rank < MAX_RANK and any(d.size >= 4 for d in x.shape.dims)
  if kind == "broadcast":
    return rank < MAX_RANK and x.size * 2 <= MAX_SIZE
  if kind in ("rename", "einsum"):
    return rank >= 1
  return True


def _draw_op(
  draw,
  kind: str,
  i: int,
  tensors: List[mtf.Tensor],
  known: Dict[str, int],
  step: int,
) -> Optional[tuple]:
  """One op of `kind` on tensors[i], or None if it would not fit."""
  x = tensors[i]
  names = x.shape.dimension_names
  if kind == "binary":
    j = draw(st.integers(0, len(tensors) - 1))
    union = {d.name: d.size for d in x.shape.dims + tensors[j].shape.dims}
    if len(union) <= MAX_RANK and np.prod(list(union.values())) <= MAX_SIZE:
      return ("binary", i, j, draw(st.sampled_from(["add", "multiply"])))
    return None
  if kind == "einsum":
    partners = [
      j
      for j, y in enumerate(tensors)
      if j != i and set(names) & set(y.shape.dimension_names)
    ]
    if not partners:
      return None
    j = draw(st.sampled_from(partners))
    y = tensors[j]
    shared = [n for n in names if n in y.shape.dimension_names]
    union = {d.name: d.size for d in x.shape.dims + y.shape.dims}
    contracted = draw(st.sampled_from(shared))
    out_names = draw(st.permutations([n for n in union if n != contracted]))
    if len(out_names) <= MAX_RANK and np.prod(list(union.values())) <= MAX_SIZE:
      return ("einsum", i, j, contracted, list(out_names))
    return None
  if kind == "reduce":
    return (
      "reduce",
      i,
      draw(st.sampled_from(["sum", "max"])),
      draw(st.sampled_from(names)),
    )
  if kind == "merge":
    return ("merge", i, draw(st.integers(0, len(names) - 2)), "m%d" % step)
  if kind == "split":
    pos = draw(
      st.sampled_from([p for p, d in enumerate(x.shape.dims) if d.size >= 4])
    )
    size = x.shape.dims[pos].size
    first = draw(
      st.sampled_from([s for s in SIZES if s < size and size % s == 0])
    )
    return (
      "split",
      i,
      pos,
      [("s%da" % step, first), ("s%db" % step, size // first)],
    )
  if kind == "rename":
    return ("rename", i, draw(st.sampled_from(names)), "r%d" % step)
  if kind == "transpose":
    return ("transpose", i, list(draw(st.permutations(names))))
  if kind == "broadcast":
    choices = [
      (n, s)
      for n, s in sorted(known.items())
      if n not in names and x.size * s <= MAX_SIZE
    ]
    new_dim = draw(st.sampled_from(choices + [("b%d" % step, 2)]))
    return ("broadcast", i, new_dim, draw(st.integers(0, len(names))))
  if kind == "cast":
    return ("cast", i)
  return None


@st.composite
def programs(draw) -> Program:
  """Random small programs; shapes are read back from a throwaway graph."""
  num_base = draw(st.integers(3, 4))
  base = [("d%d" % i, draw(st.sampled_from(SIZES))) for i in range(num_base)]
  known = dict(base)
  inputs = []
  for k in range(draw(st.integers(2, 4))):
    dims = draw(
      st.lists(st.sampled_from(base), min_size=1, max_size=3, unique=True)
    )
    inputs.append((dims, k))
  program = Program(inputs, [])
  graph = mtf.Graph()
  tensors, _ = _build(program, mtf.Mesh(graph, "mesh"))

  for step in range(draw(st.integers(3, 8))):
    kind = draw(st.sampled_from(OP_KINDS))
    eligible = [i for i in range(len(tensors)) if _eligible(kind, tensors, i)]
    op = None
    if eligible:
      i = draw(st.sampled_from(eligible))
      op = _draw_op(draw, kind, i, tensors, known, step)
    if op is None:  # Not applicable here: an elementwise op instead.
      i = draw(st.integers(0, len(tensors) - 1))
      op = ("unary", i, draw(st.sampled_from(sorted(UNARY))))
    program.ops.append(op)
    tensors.append(_apply(tensors, op))
    for d in tensors[-1].shape.dims:
      known.setdefault(d.name, d.size)
  return program


def layouts(shapes: List[mtf.Shape], mesh_shape: str):
  """Random valid layouts for a program whose tensors have `shapes`.

  Every tensor dim name goes to at most one mesh dim; a mesh dim may take
  several names, provided no tensor holds two of them (so that reshapes can
  move a split from one tensor axis to another, i.e. alltoall).
  """
  mesh = mtf.convert_to_shape(mesh_shape)
  sizes = {}
  together = {}
  for shape in shapes:
    for d in shape.dims:
      sizes[d.name] = d.size
      together.setdefault(d.name, set()).update(shape.dimension_names)

  @st.composite
  def strategy(draw):
    rules = []
    taken = set()
    for k, mesh_dim in enumerate(mesh.dims):
      candidates = [
        n
        for n in sorted(sizes)
        if sizes[n] % mesh_dim.size == 0 and n not in taken
      ]
      candidates = draw(st.permutations(candidates))
      chosen = []
      for n in candidates:
        if any(n in together[c] for c in chosen):
          continue
        # The first mesh dim always splits something; the rest may not.
        if (k == 0 and not chosen) or draw(st.booleans()):
          chosen.append(n)
      rules.extend((n, mesh_dim.name) for n in chosen)
      taken.update(chosen)
    return rules

  return strategy()


def _run(
  program: Program, mesh_shape: str, layout, separate_memory: bool = False
) -> List[np.ndarray]:
  """Runs on virtual CPUs; separate_memory: as if they did not share memory.

  The placement backend takes different collective paths on devices with
  their own memories; pretending so exercises those paths too.
  """
  patch = (
    mock.patch.object(collectives, "share_host_memory", lambda devices: False)
    if separate_memory
    else contextlib.nullcontext()
  )
  with patch:
    return mtu.run_program(
      lambda mesh: _outputs(program, mesh), mesh_shape, layout, mode="eager"
    )


def _check(
  program: Program,
  data,
  shapes: List[mtf.Shape],
  mesh_shape: str,
  separate_memory: bool,
  reference: List[np.ndarray],
) -> None:
  """Runs `program` under a drawn layout; compares with the reference."""
  layout = data.draw(
    layouts(shapes, mesh_shape),
    label="layout on %s%s"
    % (mesh_shape, " (separate memory)" * separate_memory),
  )
  actual = _run(program, mesh_shape, layout, separate_memory)
  assert len(actual) == len(reference)
  for k, (a, r) in enumerate(zip(actual, reference)):
    # Outputs near zero by cancellation get an absolute tolerance scaled by
    # the output's magnitude.
    scale = max(1.0, float(np.max(np.abs(r)))) if r.size else 1.0
    np.testing.assert_allclose(
      a,
      r,
      rtol=1e-4,
      atol=1e-5 * scale,
      err_msg="output %d on %s (separate memory: %s) with layout %s"
      % (k, mesh_shape, separate_memory, layout),
    )


# The SIMD pass (MTF_TEST_MESH_IMPL=simd) runs half the programs: its
# replicas trace each program four times.
@settings(
  max_examples=20 if mtu.SIMD_ENV else 40,
  deadline=None,
  derandomize=True,
  database=None,
  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(program=programs(), data=st.data())
def test_layouts_never_change_results(program, data):
  reference = _run(program, "", [])
  for value in reference:
    assert np.all(np.isfinite(value))
  shapes = _all_shapes(program)
  # Separate memory only changes the placement backend's collectives.
  for separate_memory in [False] if mtu.SIMD_ENV else [False, True]:
    for mesh_shape in [meshes.ALL_4, meshes.ROWS_COLS]:
      _check(program, data, shapes, mesh_shape, separate_memory, reference)


def test_reduce_sum_twice_over_one_split_dim():
  """Found by the property test: sum over d0, broadcast back to d0, sum again.

  The first sum is still a pending (lazy) allreduce over the mesh axis d0 is
  split on when the second sum over that axis is lowered; merging the two
  into one allreduce undercounted by the mesh dim size.
  """
  program = Program(
    inputs=[([("d0", 8), ("d1", 8)], 0), ([("d1", 8)], 1)],
    ops=[
      ("reduce", 0, "sum", "d0"),
      ("cast", 0),
      ("broadcast", 2, ("d0", 8), 1),
    ],
  )
  reference = _run(program, "", [])
  for separate_memory in [False, True]:
    for mesh_shape, layout in [
      ("all:4", [("d0", "all")]),
      ("rows:2;cols:2", [("d0", "rows"), ("d1", "cols")]),
    ]:
      mtu.assert_all_close(
        _run(program, mesh_shape, layout, separate_memory),
        reference,
        rtol=1e-4,
        msg="%s %s" % (mesh_shape, layout),
      )
