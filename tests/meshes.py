"""Named sets of (mesh shape, layout) pairs that tests run mtf programs on.

Most tests run a program on the standard trio of meshes: one device (""),
four devices in a line ("all:4") and a 2x2 grid ("rows:2;cols:2"), each with
the layouts that split the dims of the ops or layers under test. Each family
of tests picks its named set here and parametrizes with `parametrize`, which
also names every case:

  @meshes.parametrize(meshes.BINARY_OPS)
  def test_add(mesh_shape, layout): ...

  @meshes.parametrize(meshes.BINARY_OPS, "mesh_layout")  # one (mesh, layout)
  def test_sub(mesh_layout): ...

A test that needs a layout or two more than its family's set passes them as
`extra`; ids are still made here. Sets on other meshes (or without the
1-device mesh) are built with `mesh_layouts`.
"""

from typing import List, Sequence, Tuple

import pytest

MeshLayout = Tuple[str, str]

ONE_DEVICE = ""
ALL_4 = "all:4"
ROWS_COLS = "rows:2;cols:2"


def mesh_layouts(*meshes: Tuple[str, Sequence[str]]) -> Tuple[MeshLayout, ...]:
  """Pairs each mesh shape with each of its layouts, in the order given.

  Example:
    mesh_layouts(("b:2;m:2", ["batch:b", "batch:b;d_ff:m"]),
                 ("all:4", ["batch:all"]))
    # (("b:2;m:2", "batch:b"), ("b:2;m:2", "batch:b;d_ff:m"),
    #  ("all:4", "batch:all"))

  Args:
    *meshes: (mesh shape, layouts on that mesh) pairs.

  Returns:
    The (mesh shape, layout) pairs.
  """
  return tuple(
    (mesh_shape, layout) for mesh_shape, layouts in meshes for layout in layouts
  )


def trio(
  all_4: Sequence[str] = (), rows_cols: Sequence[str] = ()
) -> Tuple[MeshLayout, ...]:
  """The 1-device mesh, then the given layouts on all:4 and on the 2x2 grid.

  Args:
    all_4: layouts on "all:4" ("" keeps every tensor replicated).
    rows_cols: layouts on "rows:2;cols:2".

  Returns:
    The (mesh shape, layout) pairs, starting with ("", "").
  """
  return mesh_layouts(
    (ONE_DEVICE, [""]), (ALL_4, all_4), (ROWS_COLS, rows_cols)
  )


def mesh_layout_id(mesh_shape: str, layout: str) -> str:
  """A test id such as "rows:2;cols:2|a:rows" or "one_device|replicated"."""
  return "%s|%s" % (mesh_shape or "one_device", layout or "replicated")


def ids(pairs: Sequence[MeshLayout]) -> List[str]:
  """The test ids of (mesh shape, layout) pairs."""
  return [mesh_layout_id(mesh_shape, layout) for mesh_shape, layout in pairs]


def parametrize(
  pairs: Sequence[MeshLayout],
  argnames: str = "mesh_shape,layout",
  *,
  extra: Sequence[MeshLayout] = (),
):
  """A pytest parametrize mark over (mesh shape, layout) pairs.

  Args:
    pairs: a named set of this module (or a slice of one).
    argnames: "mesh_shape,layout" passes the two strings as two arguments;
      a single name (e.g. "mesh_layout") passes each pair as one tuple.
    extra: pairs that this test runs on besides `pairs`.

  Returns:
    The mark, with one readable id per pair.
  """
  cases = list(pairs) + list(extra)
  return pytest.mark.parametrize(argnames, cases, ids=ids(cases))


# ------------------------------------------------------------------- ops
# Binary ops over dims a, b and c.
BINARY_OPS = trio(
  all_4=["", "a:all", "b:all"],
  rows_cols=[
    "a:rows",
    "b:cols",
    "a:rows;b:cols",
    "a:cols;b:rows;c:none",
    "b:rows;c:cols",
  ],
)
# Reduced dims split on all:4 and on rows, cols or both of the 2x2 mesh.
REDUCE_OPS = trio(
  all_4=["", "a:all", "b:all"],
  rows_cols=[
    "a:rows",
    "b:cols",
    "a:rows;b:cols",
    "b:rows;c:cols",
    "a:cols;c:rows",
  ],
)
# Import and export of tensors of dims a and b.
IO_OPS = trio(
  all_4=["", "a:all", "b:all"],
  rows_cols=["a:rows", "b:cols", "a:rows;b:cols", "a:cols;b:rows"],
)
# The operated dim ("n" or "s") of the tensor ops is never split.
TENSOR_OPS = trio(
  all_4=["", "a:all", "c:all"],
  rows_cols=["a:rows", "a:rows;c:cols", "c:rows;a:cols"],
)
# Variables of dims a and b.
VARIABLES = trio(
  all_4=["", "a:all", "b:all"],
  rows_cols=["a:rows", "a:rows;b:cols", "a:cols;b:rows"],
)
# Dims batch and hidden of elementwise ops: none, one or two split.
ELEMENTWISE_OPS = trio(
  all_4=["", "batch:all", "hidden:all"],
  rows_cols=[
    "batch:rows",
    "hidden:cols",
    "batch:rows;hidden:cols",
    "batch:cols;hidden:rows",
  ],
)
# Random ops: 0, 1 and 2 dims split (including the innermost, length).
RANDOM_OPS = trio(
  all_4=["", "batch:all", "hidden:all"],
  rows_cols=[
    "length:rows",
    "batch:rows;hidden:cols",
    "hidden:rows;length:cols",
    "batch:cols",
  ],
)
# Every way to lay out a [batch, io] x [io, hidden] matmul on the trio.
MATMUL = trio(
  all_4=["", "batch:all", "io:all", "hidden:all"],
  rows_cols=[
    "batch:rows",
    "io:cols",
    "hidden:rows",
    "batch:rows;io:cols",
    "batch:rows;hidden:cols",
    "io:rows;hidden:cols",
    "io:cols;hidden:rows",
    "batch:cols;io:rows",
  ],
)
# Embedding lookups: ids [batch, length], tables [vocab, hidden]; nothing,
# one dim (vocab or not) or two dims split.
ONE_HOT_GATHER = trio(
  all_4=["", "vocab:all", "batch:all"],
  rows_cols=[
    "vocab:rows",
    "batch:rows;vocab:cols",
    "vocab:rows;hidden:cols",
    "batch:cols;hidden:rows",
  ],
)
# mtf.gather, with tf.gather where the gathered dim is whole; extra is a dim
# the tables have beyond [vocab, hidden].
# mtf.gather (tf.gather where the gathered dim is whole); extra is a dim the
# tables have beyond [vocab, hidden].
GATHER = trio(
  all_4=["", "vocab:all", "batch:all", "hidden:all"],
  rows_cols=[
    "vocab:rows",
    "hidden:rows",
    "batch:rows;hidden:cols",
    "batch:cols;hidden:rows",
    "batch:rows;length:cols",
    "length:rows;hidden:cols",
    "batch:rows;vocab:cols",
    "vocab:rows;hidden:cols",
    "vocab:rows;batch:cols",
    "batch:rows;extra:cols",
  ],
)
TOPK = trio(
  # On all:4, a vocab shard holds 2 < k values for k >= 3.
  all_4=["", "vocab:all", "batch:all"],
  rows_cols=[
    "vocab:rows;batch:cols",
    "length:rows;vocab:cols",
    "batch:rows;length:cols",
  ],
)
# Sequence (n) and feature (a, c) dims of cumsum, top-k over n, shifts.
SEQUENCE_OPS = trio(
  all_4=["", "n:all", "a:all"],
  rows_cols=["n:rows;a:cols", "a:rows;n:cols", "a:rows;c:cols"],
)
SHIFT_OPS = trio(
  all_4=["", "a:all", "n:all"],
  rows_cols=[
    "a:rows;c:cols",
    "n:rows",
    "n:cols",
    "a:rows;n:cols",
    "n:rows;a:cols",
  ],
)
# While loops and conditionals over batch, n and m: nothing split, batch
# split, contracted dims split.
CONTROL_OPS = trio(
  all_4=["", "batch:all", "n:all", "m:all"],
  rows_cols=["batch:rows;n:cols", "n:rows;m:cols"],
)
# One layout per mesh of CONTROL_OPS, run in every execution mode.
CONTROL_OPS_PER_MESH = trio(all_4=["n:all"], rows_cols=["n:rows;m:cols"])
# Convolutions: batch b, channels c, out-channels o, spatial e.
CONV_OPS = trio(
  all_4=["b:all", "c:all", "o:all"],
  rows_cols=[
    "b:rows;c:cols",
    "c:rows;o:cols",
    "o:rows;b:cols",
    "e:rows;b:cols",
  ],
)
POOL_OPS = trio(
  all_4=["b:all", "c:all"], rows_cols=["b:rows;c:cols", "e:rows;c:cols"]
)
# Halo exchange over the blocks dim nb.
HALO = trio(
  all_4=["nb:all"],
  rows_cols=["a:rows;c:cols", "nb:rows;c:cols", "a:rows;nb:cols"],
)
CUSTOM_GRADIENT = trio(
  all_4=["batch:all", "hidden:all", "d_in:all"],
  rows_cols=["batch:rows;hidden:cols", "d_in:rows;d_out:cols"],
)
MICROBATCH = trio(
  rows_cols=["batch:rows;hidden:cols", "hidden:rows;d_out:cols"]
)

# ---------------------------------------------------------------- layers
DENSE = trio(
  all_4=["batch:all", "d_model:all", "hidden:all"],
  rows_cols=[
    "batch:rows;hidden:cols",
    "d_model:rows;hidden:cols",
    "batch:cols;d_model:rows",
  ],
)
LAYERS_MISC = trio(
  all_4=["batch:all"],
  rows_cols=["batch:rows;hidden:cols", "d_model:rows;hidden:cols"],
)
NORMS = trio(
  all_4=["batch:all", "d_model:all"],
  rows_cols=[
    "batch:rows;d_model:cols",
    "length:rows;d_model:cols",
    "batch:rows;length:cols",
  ],
)
LOSSES = trio(
  all_4=["vocab:all", "batch:all"],
  rows_cols=["batch:rows;vocab:cols", "vocab:rows;length:cols"],
)
ATTENTION = trio(
  all_4=["batch:all", "heads:all", "length:all"],
  rows_cols=[
    "batch:rows;heads:cols",
    "length:rows;d_kv:cols",
    "memory_length:rows;d_model:cols",
  ],
)
LOCAL_ATTENTION = trio(
  all_4=["length:all"],
  rows_cols=[
    "batch:rows;heads:cols",
    "length:rows;heads:cols",
    "d_kv:rows;length:cols",
  ],
)
# Blocks nb, nh, nw of 2-d local attention.
SPATIAL_ATTENTION = trio(
  all_4=["nb:all"],
  rows_cols=[
    "batch:rows;heads:cols",
    "nb:rows;d_kv:cols;nh:rows",
    "nh:rows;nw:cols",
    "nb:cols;nh:cols;nw:rows",
  ],
)
CONV_LAYERS = trio(
  all_4=["c:all", "o:all"], rows_cols=["b:rows;c:cols", "o:rows;b:cols"]
)
# Blocks hb, wb, db of blocked convolutions.
BLOCKED_CONV_LAYERS = trio(
  all_4=["hb:all"],
  rows_cols=[
    "hb:rows;wb:cols",
    "db:rows;hb:cols",
    "wb:rows;o:cols",
    "b:rows;c:cols",
  ],
)

# ----------------------------------------------------------------- other
BEAM_SEARCH = trio(
  all_4=["batch:all"],
  # The last splits the dim the candidates' top-k reduces over.
  rows_cols=[
    "batch:rows",
    "batch:rows;vocab:cols",
    "batch:cols;beam_and_vocab:rows",
  ],
)
# Optimizer updates of variables of dims a and b.
OPTIMIZERS = trio(rows_cols=["a:rows;b:cols"])

# ----------------------------------------------------------- transformer
# Attention core functions: q, k, v [batch, length or memory_length, heads,
# d_kv].
TRANSFORMER_ATTENTION = trio(
  all_4=["heads:all", "d_kv:all", "memory_length:all"],
  rows_cols=["batch:rows;heads:cols", "length:rows;d_model:cols"],
)
# Attention layers and their parameters: heads or d_model split.
ATTENTION_LAYERS = trio(
  all_4=["heads:all", "d_model:all"], rows_cols=["batch:rows;heads:cols"]
)
# Incremental decoding, one split mesh besides the 1-device mesh.
ATTENTION_DECODING = trio(rows_cols=["batch:rows;heads:cols"])
# Talking-heads (key kh, softmax sh and value vh heads) and bilinear
# attention.
ATTENTION_VARIANTS = trio(
  all_4=["d_model:all", "kh:all;vh:all"],
  rows_cols=["batch:rows;heads:cols", "d_model:cols", "batch:rows;sh:cols"],
)
# Feed-forward layers: d_ff (hidden) and d_model split.
DENSE_LAYERS = trio(
  all_4=["d_ff:all", "d_model:all"],
  rows_cols=["batch:rows;d_ff:cols", "d_model:cols", "batch:rows;d_model:cols"],
)
EVOLVED_TRANSFORMER = trio(
  all_4=["batch:all", "d_ff:all"],
  rows_cols=["batch:rows;heads:cols", "batch:rows;d_ff:cols"],
)
FIXUP_LAYERS = trio(
  all_4=["batch:all", "d_ff:all"], rows_cols=["batch:rows;heads:cols"]
)
MEMORY_LAYERS = trio(
  all_4=["batch:all", "n_heads:all"], rows_cols=["batch:rows;n_heads:cols"]
)
# Convolution and local-attention layers of the transformer.
TRANSFORMER_CONV_LAYERS = trio(
  all_4=["d_model:all"], rows_cols=["batch:rows;d_model:cols", "batch:rows"]
)
# Whole models (Unitransformer, LayerStack): batch, d_model or vocab split.
TRANSFORMER_MODELS = trio(
  all_4=["batch:all", "d_model:all", "vocab:all"],
  rows_cols=["batch:rows;vocab:cols", "batch:rows;d_model:cols"],
)
# Mixture-of-experts layers on meshes that split experts; results on the
# split meshes are compared with the 1-device mesh's.
MOE = trio(
  all_4=["experts:all"],
  rows_cols=["batch:rows;experts:rows", "experts:rows;expert_hidden:cols"],
)
# The 1-device mesh and one split of MOE, for the slower MoE comparisons.
MOE_2X2 = trio(rows_cols=["batch:rows;experts:rows"])
# The T5 (gin-configured) model on the original's b:2;m:2 mesh and on all:4.
T5_MODEL = mesh_layouts(
  ("b:2;m:2", ["batch:b;heads:m;d_ff:m;vocab:m", "batch:b;d_ff:m"]),
  (ALL_4, ["heads:all;d_ff:all", "batch:all"]),
)
T5_DECODE = mesh_layouts(
  (ONE_DEVICE, [""]), ("b:2;m:2", ["batch:b;heads:m;d_ff:m;vocab:m"])
)
# The planner's programs (tests/plan): a matmul contracting c, a shift and a
# cumsum along n, a reshape that moves a's split to n2: layouts that need
# each kind of collective (allreduce, shift, allconcat, alltoall).
PLAN = trio(
  all_4=["", "a:all", "n:all", "c:all", "a:all;n2:all"],
  rows_cols=[
    "a:rows;n:cols",
    "c:rows;n:cols",
    "a:rows;c:cols;n2:rows",
    "n:rows;c:cols",
  ],
)
# GPT-style downstream programs (tests/downstream): model parallel over heads
# and vocab, with data parallelism on the 2x2 grid.
GPT_STYLE = trio(
  all_4=["heads:all;vocab:all"], rows_cols=["batch:rows;heads:cols;vocab:cols"]
)
