"""MeshImpl: the interface between mtf operations and a mesh backend.

Operations only call the methods defined here (slice shapes, slicewise,
collectives, import/export). Backends (placement, SIMD) implement the
communication primitives and know nothing about operations.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence

from absl import logging
import tensorflow as tf

from mesh_tensorflow._src import graph_constants
from mesh_tensorflow._src import laid_out as laid_out_lib
from mesh_tensorflow._src import layout as layout_lib
from mesh_tensorflow._src import tf_einsum
from mesh_tensorflow._src.shapes import Shape
from mesh_tensorflow._src.shapes import convert_to_shape
from mesh_tensorflow._src.shapes import list_product


class MeshImpl:
  """How one mesh (its shape and layout rules) is realised on devices.

  Instantiable, as the original's base class: a bare MeshImpl answers layout
  questions (slice shapes, tensor layouts); its communication primitives
  raise NotImplementedError until a backend (placement, SIMD) overrides them.

  Example:
    >>> mesh_impl = MeshImpl("rows:2;cols:2", "batch:rows;hidden:cols")
    >>> mesh_impl.size
    4
    >>> shape = mtf.convert_to_shape("batch:6;hidden:8")
    >>> mesh_impl.tensor_layout(shape)  # mesh axis of each tensor axis
    TensorLayout(0, 1)
    >>> mesh_impl.slice_shape(shape)  # each processor holds a [3, 4] slice
    [3, 4]
  """

  def __init__(self, shape, layout_rules, *, strict_layout_rules: bool = False):
    """Checks the layout rules against the mesh shape.

    Args:
      shape: the mesh shape, e.g. "rows:2;cols:2".
      layout_rules: e.g. "batch:rows;hidden:cols".
      strict_layout_rules: raise ValueError for rules naming mesh dims absent
        from this mesh (a typo guard). By default such rules are ignored, as
        in the original, so layouts written for bigger meshes still work.
    """
    self._shape = convert_to_shape(shape)
    self._layout_rules = layout_lib.convert_to_layout_rules(layout_rules)
    unknown = self._layout_rules.unknown_mesh_dimensions(self._shape)
    if unknown and strict_layout_rules:
      bad = [r for r in self._layout_rules if r[1] in unknown]
      raise ValueError(
        "layout rules %s name mesh dimensions %s that are not "
        "in mesh %s" % (bad, unknown, self._shape.to_string)
      )
    if unknown:
      # Faithful to the original: rules naming mesh dims absent from this mesh
      # are ignored (a layout written for a bigger mesh still works), but say so.
      logging.info(
        "layout rules %r name mesh dimensions %s that are not in "
        "mesh %s; those rules are ignored.",
        self._layout_rules,
        unknown,
        self._shape.to_string,
      )

  # ------------------------------------------------- communication counts
  def set_collective_counter(
    self, add_counter_fn: Optional[Callable[[str, int], None]]
  ) -> None:
    """Routes the byte counts of later collectives to `add_counter_fn`.

    A Lowering installs its own counter while it lowers, so its counters hold
    the bytes every collective it asked for sends (see count_collective).

    Args:
      add_counter_fn: a function (counter name, value), or None to stop
        counting.
    """
    self._collective_counter = add_counter_fn

  def count_collective(
    self,
    kind: str,
    slice_tensor,
    mesh_axes: Sequence[int],
    num_transfers: Optional[int] = None,
  ) -> None:
    """Counts the bytes a collective sends, summed over all processors.

    Backends call this from their allreduce, allconcat, alltoall and receive.
    The counter "collective_bytes/<kind>" grows by collective_total_bytes.

    Args:
      kind: "allreduce", "allconcat", "alltoall" or "shift".
      slice_tensor: one processor's input slice (a tf.Tensor: its static
        shape and dtype give the slice bytes).
      mesh_axes: the mesh axes spanning each group of the collective.
      num_transfers: for "shift", how many processors send their slice.
    """
    counter = getattr(self, "_collective_counter", None)
    if counter is None:
      return
    slice_bytes = slice_tensor.shape.num_elements() * slice_tensor.dtype.size
    group_size = list_product([self._shape[a].size for a in mesh_axes])
    counter(
      "collective_bytes/%s" % kind,
      collective_total_bytes(
        kind, slice_bytes, group_size, self.size, num_transfers
      ),
    )

  @property
  def shape(self) -> Shape:
    """The mesh Shape: one named Dimension per mesh axis."""
    return self._shape

  @property
  def ndims(self) -> int:
    """The number of mesh axes."""
    return self._shape.ndims

  @property
  def layout_rules(self) -> layout_lib.LayoutRules:
    """The LayoutRules mapping tensor dim names to mesh dim names."""
    return self._layout_rules

  @property
  def size(self) -> int:
    """The number of processors (the product of the mesh dimension sizes)."""
    return self._shape.size

  @property
  def supports_control_dependencies(self) -> bool:
    """Whether tf control dependencies may be used between lowered ops."""
    return True

  def while_loop(self, cond: Callable, body: Callable, loop_vars, **kwargs):
    """The tf while loop running a lowered mtf.while_loop (tf.while_loop).

    A mesh implementation whose processors communicate inside the loop may
    need a particular kind of loop (see SimdMeshImpl).

    Args:
      cond: the loop condition, a function of the loop tensors.
      body: the loop body, a function of the loop tensors.
      loop_vars: the initial loop tensors.
      **kwargs: further tf.while_loop arguments (e.g. maximum_iterations).

    Returns:
      the final loop tensors.
    """
    return tf.while_loop(cond, body, loop_vars, **kwargs)

  # ---------------------------------------------------------------- layouts
  def tensor_dimension_to_mesh_axis(self, tensor_dimension) -> Optional[int]:
    """The mesh axis a tensor dimension is split on, or None.

    Args:
      tensor_dimension: an mtf Dimension.

    Returns:
      the int index of the mesh axis the layout rules assign to the dimension,
      or None if no rule for it names a dimension of this mesh.
    """
    return self._layout_rules.tensor_dimension_to_mesh_axis(
      tensor_dimension, self._shape
    )

  def tensor_layout(self, arg) -> layout_lib.TensorLayout:
    """TensorLayout of an mtf Tensor or a Shape.

    Args:
      arg: an mtf Tensor or a Shape (or anything convert_to_shape accepts).

    Returns:
      the TensorLayout: for each tensor axis, the mesh axis it is split on, or
      None.
    """
    shape = arg.shape if hasattr(arg, "operation") else convert_to_shape(arg)
    return self._layout_rules.tensor_layout(shape, self._shape)

  def mesh_axis_to_cumprod(self, tensor_shape) -> List[Optional[int]]:
    """For each mesh axis, the exclusive cumprod of the tensor axis split on it.

    Two layouts split a flattened tensor the same way along a mesh axis iff
    these numbers agree; reshape uses that to decide on communication.

    Args:
      tensor_shape: the Shape of an mtf tensor.

    Returns:
      a list with one entry per mesh axis: the product of the sizes of the
      tensor dimensions before the one split on that axis, or None if no
      dimension is split on it.
    """
    tensor_shape = convert_to_shape(tensor_shape)
    ta2ma = self.tensor_layout(tensor_shape).mesh_axis_to_tensor_axis(
      self.ndims
    )
    cumprod = tensor_shape.cumprod
    return [None if ta is None else cumprod[ta] for ta in ta2ma]

  def slice_shape(self, tensor_shape) -> List[int]:
    """Per-processor slice shape; ValueError if a split does not divide.

    Args:
      tensor_shape: the Shape of an mtf tensor.

    Returns:
      a list of ints: the shape of each processor's slice (split dimensions
      divided by their mesh dimension's size).

    Raises:
      ValueError: if a mesh dimension size does not divide the tensor dimension
        split on it.
    """
    tensor_shape = convert_to_shape(tensor_shape)
    result = []
    for dim, mesh_axis in zip(
      tensor_shape.dims, self.tensor_layout(tensor_shape)
    ):
      if mesh_axis is None:
        result.append(dim.size)
        continue
      mesh_dim = self._shape.dims[mesh_axis]
      if dim.size % mesh_dim.size:
        raise ValueError(layout_lib.split_error_message(dim, mesh_dim))
      result.append(dim.size // mesh_dim.size)
    return result

  def slice_begin(self, tensor_shape, pnum: int) -> List[int]:
    """Offsets of processor `pnum`'s slice within the full tensor.

    Args:
      tensor_shape: the Shape of an mtf tensor.
      pnum: the processor number.

    Returns:
      a list of ints, one per tensor dimension: where the slice of processor
      `pnum` starts in the full tensor.
    """
    return self.slice_begins(tensor_shape, [pnum])[0]

  def slice_begins(self, tensor_shape, pnums: Sequence[int]) -> List[List[int]]:
    """slice_begin of each of `pnums`, the tensor's layout worked out once.

    Args:
      tensor_shape: the Shape of an mtf tensor.
      pnums: processor numbers.

    Returns:
      a list with, for each of pnums, the offsets of its slice.
    """
    tensor_shape = convert_to_shape(tensor_shape)
    layout = self.tensor_layout(tensor_shape)
    sizes = self.slice_shape(tensor_shape)
    begins = []
    for pnum in pnums:
      coords = layout_lib.pnum_to_processor_coordinates(self._shape, pnum)
      begins.append(
        [
          0 if ma is None else coords[ma] * size
          for ma, size in zip(layout, sizes)
        ]
      )
    return begins

  def slice_size(self, tensor_shape) -> int:
    """The number of elements of each processor's slice of a tensor.

    Args:
      tensor_shape: the Shape of an mtf tensor.

    Returns:
      an int: the product of slice_shape(tensor_shape).
    """
    return list_product(self.slice_shape(tensor_shape))

  def laid_out_size(self, tensor_shape) -> int:
    """The number of elements of a tensor summed over all processors.

    Args:
      tensor_shape: the Shape of an mtf tensor.

    Returns:
      an int: slice_size times the number of processors (replicas count).
    """
    return self.slice_size(tensor_shape) * self.size

  # ------------------------------------------------------- derived utilities
  def slicewise_delay_allreduce(self, fn: Callable, *inputs):
    """Like slicewise, but keeps compatible lazy sums lazy (fn must be linear).

    Args:
      fn: a function of tf.Tensors, linear in each argument, applied to the
        slices.

    Returns:
      a LazyAllreduceSum if the inputs are compatible lazy sums (the sum is
      reduced later, once), else the LaidOutTensor slicewise(fn, ...) returns.
    """
    if laid_out_lib.compatible_lazy_allreduce_sums(inputs):
      first = inputs[0]
      return laid_out_lib.LazyAllreduceSum(
        self,
        self.slicewise(fn, *[x.laid_out_input for x in inputs]),
        first.mesh_axes,
        add_counter_fn=first.add_counter_fn,
      )
    return self.slicewise(
      fn, *laid_out_lib.convert_args_to_laid_out_tensors(inputs)
    )

  def Print(self, x, data: Sequence, message: str, **kwargs):  # pylint: disable=invalid-name
    """Prints `data` and `message` when `x` is computed (a no-op by default).

    Args:
      x: a LaidOutTensor to pass through.
      data: a list of LaidOutTensors to print.
      message: a string printed before the data.

    Returns:
      the LaidOutTensor `x` (with the print attached, where supported).
    """
    del data, message, kwargs
    logging.warning("Print not implemented for %s", type(self).__name__)
    return x

  def first_processor_value(self, fn: Callable[[], tf.Tensor]) -> tf.Tensor:
    """fn() as computed by processor 0, usable on every processor.

    For stateful fns (a random draw) whose value all processors must share.
    Here fn runs once, on the first device; a backend whose processors run
    separate programs (SIMD) runs it on each and broadcasts processor 0's.

    Args:
      fn: a function of no arguments returning a tf.Tensor.

    Returns:
      a tf.Tensor holding processor 0's value of fn(), available to all
      processors.
    """
    devices = getattr(self, "devices", None) or [None]
    with tf.device(devices[0]):
      return fn()

  def pcoord(self, pnum, mesh_axis: int):
    """Coordinate of processor `pnum` (an int or an int tensor) on mesh_axis.

    Args:
      pnum: the processor number, a Python int or an int32 tf scalar.
      mesh_axis: the index of the mesh axis.

    Returns:
      the coordinate of the processor along the axis, of the same kind as
      `pnum`.
    """
    divisor = list_product(self._shape.to_integer_list[mesh_axis + 1 :])
    modulus = self._shape[mesh_axis].size
    if isinstance(pnum, int):
      return (pnum // divisor) % modulus
    return tf.math.floormod(tf.math.floordiv(pnum, divisor), modulus)

  def laid_out_pcoord(self, mesh_axis: int):
    """LaidOutTensor of each processor's coordinate along `mesh_axis`.

    Args:
      mesh_axis: the index of the mesh axis.

    Returns:
      a LaidOutTensor of int32 scalars: each processor's coordinate along the
      axis.
    """
    return self.slicewise(
      lambda pnum: self.pcoord(pnum, mesh_axis), self.laid_out_pnum()
    )

  def laid_out_slice_num(self, tensor_shape: Shape) -> Any:
    """LaidOutTensor of ints, equal exactly for processors with equal slices.

    Args:
      tensor_shape: the Shape of an mtf tensor.

    Returns:
      a LaidOutTensor of int32 scalars; two processors hold equal slices exactly
      when their numbers are equal.
    """
    tensor_shape = convert_to_shape(tensor_shape)
    split_axes = [
      ma for ma in self.tensor_layout(tensor_shape) if ma is not None
    ]

    def slice_num_fn(pnum):
      num = 0
      for ma in sorted(split_axes):
        num = num * self._shape[ma].size + self.pcoord(pnum, ma)
      return num

    return self.slicewise(slice_num_fn, self.laid_out_pnum())

  def laid_out_slice_begin(self, tensor_shape: Shape) -> Any:
    """LaidOutTensor of each processor's slice_begin (lists, or int tensors).

    Args:
      tensor_shape: the Shape of an mtf tensor.

    Returns:
      a LaidOutTensor of int32 vectors: each processor's slice_begin.
    """
    tensor_shape = convert_to_shape(tensor_shape)
    sizes = self.slice_shape(tensor_shape)
    tensor_layout = self.tensor_layout(tensor_shape)

    def begin_fn(pnum):
      begin = [
        0 if ma is None else self.pcoord(pnum, ma) * size
        for ma, size in zip(tensor_layout, sizes)
      ]
      return begin if isinstance(pnum, int) else tf.stack(begin)

    return self.slicewise(begin_fn, self.laid_out_pnum())

  def allsplit(self, x, mesh_axis: int, split_axis: int, which=None):
    """Keeps, on each processor, the piece of `x` its coordinate selects.

    No communication: every processor already holds the whole of `split_axis`.

    Args:
      x: a LaidOutTensor replicated along `mesh_axis`.
      mesh_axis: the index of the mesh axis to split on.
      split_axis: the index of the slice axis to split.
      which: optional LaidOutTensor of int32 scalars: which piece each processor
        keeps; defaults to its coordinate along `mesh_axis`.

    Returns:
      a LaidOutTensor whose slices are 1/n of `x`'s along `split_axis` (n the
      mesh dimension's size).
    """
    if which is None:
      which = self.laid_out_pcoord(mesh_axis)
    num_splits = self._shape[mesh_axis].size

    def split_fn(t, w):
      # as_list: TF1 (legacy) TensorShapes index to Dimension objects.
      size = t.shape.as_list()[split_axis] // num_splits
      if isinstance(w, int):
        begin = [0] * t.shape.rank
        begin[split_axis] = w * size
        sizes = t.shape.as_list()
        sizes[split_axis] = size
        return tf.slice(t, begin, sizes)
      begin = tf.one_hot(split_axis, t.shape.rank, dtype=tf.int32) * w * size
      sizes = t.shape.as_list()
      sizes[split_axis] = size
      return tf.slice(t, begin, sizes)

    return self.slicewise(split_fn, x, which)

  def shift_by_n_processors(self, x, mesh_axis: int, offset: int, wrap: bool):
    """Each processor receives x from the processor `offset` before it.

    Args:
      x: a LaidOutTensor.
      mesh_axis: the index of the mesh axis to shift along.
      offset: how many processors to shift by (negative shifts the other way).
      wrap: if True, the shift wraps around the axis; if False, processors with
        no source receive zeros.

    Returns:
      a LaidOutTensor with the shifted slices.
    """
    n = self._shape[mesh_axis].size
    source_pcoord = []
    for i in range(n):
      c = i - offset
      if c != c % n:
        if wrap:
          c %= n
        else:
          c = None
      source_pcoord.append(c)
    return self.receive(x, mesh_axis, source_pcoord)

  def broadcast_impl(
    self, old_slices: Any, old_shape: Shape, new_shape: Shape
  ) -> Any:
    """Broadcasts each slice from old_shape to new_shape (no communication).

    Args:
      old_slices: a LaidOutTensor laid out for `old_shape`.
      old_shape: the Shape of the input tensor.
      new_shape: the Shape to broadcast to; it contains every dimension of
        `old_shape`.

    Returns:
      a LaidOutTensor laid out for `new_shape`.
    """
    old_shape = convert_to_shape(old_shape)
    new_shape = convert_to_shape(new_shape)
    new_slice_shape = self.slice_shape(new_shape)
    return self.slicewise(
      lambda x: broadcast_slice(x, old_shape, new_shape, new_slice_shape),
      old_slices,
    )

  def make_slices(self, tf_tensor, tensor_shape) -> List[tf.Tensor]:
    """Cuts a full tf tensor into the per-processor slices (list by pnum).

    Args:
      tf_tensor: a tf.Tensor with the full shape of `tensor_shape`.
      tensor_shape: the mtf Shape of the tensor.

    Returns:
      a list of tf.Tensors, the slice of each processor, indexed by processor
      number.
    """
    tensor_shape = convert_to_shape(tensor_shape)
    sizes = self.slice_shape(tensor_shape)
    return [
      static_slice(tf_tensor, self.slice_begin(tensor_shape, pnum), sizes)
      for pnum in range(self.size)
    ]

  def combine_slices(
    self,
    slices: Sequence[tf.Tensor],
    tensor_shape,
    device: Optional[str] = None,
  ) -> tf.Tensor:
    """Inverse of make_slices: concatenates split axes, drops replicas.

    Args:
      slices: the per-processor slices, indexed by processor number.
      tensor_shape: the mtf Shape of the full tensor.
      device: optional device to assemble the full tensor on.

    Returns:
      the full tf.Tensor of shape `tensor_shape`.
    """
    tensor_shape = convert_to_shape(tensor_shape)
    if tensor_shape.ndims == 0:
      return slices[0]
    ta2ma = self.tensor_layout(tensor_shape).mesh_axis_to_tensor_axis(
      self.ndims
    )
    with tf.device(device):
      current = list(slices)
      for mesh_axis in reversed(range(self.ndims)):
        n = self._shape[mesh_axis].size
        groups = [current[i : i + n] for i in range(0, len(current), n)]
        tensor_axis = ta2ma[mesh_axis]
        if tensor_axis is None:
          current = [g[0] for g in groups]
        else:
          current = [tf.concat(g, tensor_axis) for g in groups]
      return current[0]

  def einsum(self, equation: str, *slices):
    """tf.einsum on slices; products and matmuls use tf.multiply/tf.matmul.

    Args:
      equation: a tf.einsum equation over the slices.

    Returns:
      a LaidOutTensor: einsum of the corresponding slices on each processor.
    """
    return tf_einsum.einsum(equation, *slices)

  # ------------------------------------------------------ backend primitives
  def slicewise(self, fn: Callable, *inputs):
    """Applies fn to corresponding slices; returns LaidOutTensor(s).

    Args:
      fn: a function of tf.Tensors applied to corresponding slices of the inputs
        (LaidOutTensors, or values used as they are).

    Returns:
      a LaidOutTensor, or a tuple of them if fn returns a tuple.
    """
    raise NotImplementedError("%s.slicewise" % type(self).__name__)

  def allreduce(self, x, mesh_axes: Sequence[int], reduction_fn_string: str):
    """Reduces ("SUM", "MAX", "MIN") over the groups spanning mesh_axes.

    Args:
      x: a LaidOutTensor.
      mesh_axes: the indices of the mesh axes to reduce over.
      reduction_fn_string: "SUM", "MAX" or "MIN".

    Returns:
      a LaidOutTensor whose slices hold the reduction over each group of
      processors spanning `mesh_axes`.
    """
    raise NotImplementedError("%s.allreduce" % type(self).__name__)

  def allconcat(self, x, mesh_axis: int, concat_axis: int):
    """Concatenates the slices of a group along concat_axis on every member.

    Args:
      x: a LaidOutTensor.
      mesh_axis: the index of the mesh axis to gather along.
      concat_axis: the index of the slice axis to concatenate on.

    Returns:
      a LaidOutTensor whose slices are the concatenation of the group's slices.
    """
    raise NotImplementedError("%s.allconcat" % type(self).__name__)

  def alltoall(self, x, mesh_axis: int, split_axis: int, concat_axis: int):
    """Splits along split_axis, exchanges pieces, concatenates on concat_axis.

    Args:
      x: a LaidOutTensor.
      mesh_axis: the index of the mesh axis to exchange along.
      split_axis: the slice axis split into pieces sent to the group.
      concat_axis: the slice axis the received pieces are concatenated on.

    Returns:
      a LaidOutTensor with the exchanged slices.
    """
    raise NotImplementedError("%s.alltoall" % type(self).__name__)

  def receive(self, x, mesh_axis: int, source_pcoord: Sequence[Optional[int]]):
    """Processor i along mesh_axis gets the slice of source_pcoord[i] (or 0s).

    Args:
      x: a LaidOutTensor.
      mesh_axis: the index of the mesh axis.
      source_pcoord: for each coordinate along the axis, the coordinate to
        receive from, or None to receive zeros.

    Returns:
      a LaidOutTensor with the received slices.
    """
    raise NotImplementedError("%s.receive" % type(self).__name__)

  def laid_out_pnum(self) -> Any:
    """LaidOutTensor of processor numbers.

    Returns:
      a LaidOutTensor of int32 scalars: each processor's number.
    """
    raise NotImplementedError("%s.laid_out_pnum" % type(self).__name__)

  def export_to_tf_tensor(self, x, laid_out_x) -> tf.Tensor:
    """The full tf.Tensor for mtf Tensor x.

    Args:
      x: the mtf Tensor.
      laid_out_x: its LaidOutTensor.

    Returns:
      the full tf.Tensor of shape x.shape.
    """
    raise NotImplementedError("%s.export_to_tf_tensor" % type(self).__name__)

  def import_tf_tensor(self, x, tf_x: tf.Tensor):
    """LaidOutTensor holding the slices of tf_x for mtf Tensor x.

    Args:
      x: the mtf Tensor the slices are for.
      tf_x: a tf.Tensor of shape x.shape.

    Returns:
      a LaidOutTensor holding each processor's slice of `tf_x`.
    """
    raise NotImplementedError("%s.import_tf_tensor" % type(self).__name__)


COLLECTIVE_KINDS = ("allreduce", "allconcat", "alltoall", "shift")


def collective_total_bytes(
  kind: str,
  slice_bytes: int,
  group_size: int,
  num_processors: int,
  num_transfers: Optional[int] = None,
) -> int:
  """Bytes a collective sends, summed over all processors (an exact int).

  The usual bandwidth-optimal algorithms: a ring allreduce sends 2(n-1)/n of
  the slice from every member of a group of n; an allconcat (all-gather)
  sends every slice to the n-1 other members; an alltoall keeps 1/n of each
  slice and sends the rest; a shift sends whole slices, once per transfer.

  Example:
    >>> collective_total_bytes("allreduce", 1024, 4, 8)  # 2 groups of 4
    12288
    >>> collective_total_bytes("shift", 1024, 4, 8, num_transfers=6)
    6144

  Args:
    kind: one of COLLECTIVE_KINDS.
    slice_bytes: the bytes of one processor's input slice.
    group_size: n, the processors in each group.
    num_processors: all processors of the mesh.
    num_transfers: for "shift", the number of processors that send.

  Returns:
    an int.

  Raises:
    ValueError: for an unknown kind.
  """
  num_groups = num_processors // group_size
  if kind == "allreduce":
    return 2 * (group_size - 1) * slice_bytes * num_groups
  if kind == "allconcat":
    return (group_size - 1) * slice_bytes * num_processors
  if kind == "alltoall":
    return (group_size - 1) * slice_bytes * num_groups
  if kind == "shift":
    return slice_bytes * (num_transfers or 0)
  raise ValueError(
    "unknown collective %r; expected one of %s" % (kind, COLLECTIVE_KINDS)
  )


def shift_transfers(
  mesh_shape: Sequence[int],
  mesh_axis: int,
  source_pcoord: Sequence[Optional[int]],
) -> int:
  """How many processors receive a slice from another one in a receive.

  Args:
    mesh_shape: the mesh dimension sizes.
    mesh_axis: the mesh axis of the receive.
    source_pcoord: for each coordinate along the axis, the coordinate it
      receives from, or None.

  Returns:
    an int: the processors whose source is another processor.
  """
  moving = sum(
    1 for i, source in enumerate(source_pcoord) if source not in (None, i)
  )
  return moving * list_product(mesh_shape) // mesh_shape[mesh_axis]


def static_slice(
  x: tf.Tensor, begin: Sequence[int], sizes: Sequence[int]
) -> tf.Tensor:
  """tf.slice with Python int lists; also works for scalars (empty lists)."""
  if not sizes:
    # tf.slice would read the empty lists as float tensors and fail.
    return tf.identity(x)
  return tf.slice(x, begin, sizes)


def broadcast_slice(
  x: tf.Tensor,
  old_shape: Shape,
  new_shape: Shape,
  new_slice_shape: Sequence[int],
) -> tf.Tensor:
  """Transposes and broadcasts one slice from old_shape's dims to new_shape's."""
  if old_shape == new_shape:
    return x
  old_names = old_shape.dimension_names
  new_names = new_shape.dimension_names
  missing = [n for n in old_names if n not in new_names]
  if missing:
    raise ValueError(
      "cannot broadcast %s to %s: dimension %r is missing"
      % (old_shape.to_string, new_shape.to_string, missing[0])
    )
  perm = [old_names.index(n) for n in new_names if n in old_names]
  if perm != sorted(perm):
    x = tf.transpose(x, graph_constants.constant(perm))
  if len(perm) < len(new_names):
    x = graph_constants.reshape(
      x,
      [s if n in old_names else 1 for n, s in zip(new_names, new_slice_shape)],
    )
    x = tf.broadcast_to(x, graph_constants.constant(list(new_slice_shape)))
  return x


def pnum_groups(mesh_shape, mesh_axes: Sequence[int]) -> List[List[int]]:
  """Processor groups that communicate in a collective over mesh_axes."""
  return layout_lib.processor_groups(mesh_shape, list(mesh_axes))
