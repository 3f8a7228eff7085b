"""PlacementMeshImpl: one TF device per processor (CPU, GPU, remote tasks).

Each processor's slice is an ordinary tf.Tensor placed with tf.device;
collectives are TF ops between devices (see collectives.py).
"""

from __future__ import annotations

from typing import Callable, List, Sequence

import tensorflow as tf

from mesh_tensorflow._src import graph_constants
from mesh_tensorflow._src import laid_out as laid_out_lib
from mesh_tensorflow._src import layout as layout_lib
from mesh_tensorflow._src import mesh_impl as mesh_impl_lib
from mesh_tensorflow._src.mesh_impls import collectives
from mesh_tensorflow._src.mesh_impls import slice_variables
from mesh_tensorflow._src.shapes import convert_to_shape

tf1 = tf.compat.v1


class LaidOutTensor:
  """One tf.Tensor per processor, indexed by pnum.

  Args:
    tensor_list: the slice of each processor, a tf.Tensor per processor number.
  """

  def __init__(self, tensor_list: Sequence):
    self._tensor_list = list(tensor_list)

  def __repr__(self) -> str:
    return "LaidOutTensor(%r)" % (self._tensor_list,)

  @property
  def tensor_list(self) -> list:
    """The list of slices, one tf.Tensor per processor number."""
    return self._tensor_list

  @property
  def all_slices(self) -> list:
    """The list of slices, one tf.Tensor per processor number."""
    return self._tensor_list

  @property
  def slice_shape(self) -> List[int]:
    """The shape of each slice (a list of ints)."""
    return self._tensor_list[0].shape.as_list()

  def to_laid_out_tensor(self) -> "LaidOutTensor":
    """Returns the tensor itself (it is already laid out).

    Returns:
      this LaidOutTensor.
    """
    return self

  @classmethod
  def from_tensor_list(cls, tensor_list) -> "LaidOutTensor":
    """Builds a LaidOutTensor from the slices of all processors.

    Args:
      tensor_list: one tf.Tensor per processor number.

    Returns:
      a LaidOutTensor holding `tensor_list`.
    """
    return cls(tensor_list)


def _same_device(a: str, b: str) -> bool:
  if not a or not b:
    return True
  spec_a = tf.DeviceSpec.from_string(a)
  spec_b = tf.DeviceSpec.from_string(b)
  return (spec_a.device_type or "CPU").upper() == (
    spec_b.device_type or "CPU"
  ).upper() and ((spec_a.device_index or 0) == (spec_b.device_index or 0))


# Stateful ops that a replica may share: reads of one (shared) variable.
_SHAREABLE_STATEFUL_OPS = frozenset(["ReadVariableOp", "VarHandleOp"])


def _operations(graph) -> list:
  """graph's operations in creation order.

  TF 2.21's Graph.operations is the graph's own list (no copy, unlike
  get_operations(), which other versions fall back to).
  """
  operations = getattr(graph, "operations", None)
  return operations if isinstance(operations, list) else graph.get_operations()


def _builds_stateful_ops(graph, first_op_count: int) -> bool:
  """Whether ops added to graph after it had first_op_count ops have effects.

  Reads of variables do not count (replicas may share them).
  """
  for op in _operations(graph)[first_op_count:]:
    # pylint: disable-next=protected-access
    if op._is_stateful and op.type not in _SHAREABLE_STATEFUL_OPS:
      return True
  return False


class LaidOutVariable:
  """Per-processor slice variables of one mtf Variable.

  Slices are named `<var.name>_slice_<pnum>`, live in the VariableStore (so a
  re-traced tf.function reuses them) and start as copies of the master. On a
  one-processor mesh with equal dtypes the master itself is the slice.

  When the mesh devices share host memory (CPUs of one task, e.g. virtual
  CPUs) processors holding the same slice share one slice variable, named
  after the first of them: it is read by all and updated once (an assignment
  takes the value of that first processor; replicas compute equal values). A
  variable that no layout splits then simply uses its master.

  Args:
    variable: the mtf Variable.
    mesh_impl: the PlacementMeshImpl the variable is lowered on.
  """

  def __init__(self, variable, mesh_impl: "PlacementMeshImpl"):
    self._variable = variable
    self._mesh_impl = mesh_impl
    shape = variable.shape
    master = variable.master  # None for a stacked variable.
    slice_shape = mesh_impl.slice_shape(shape)
    usable_master = (
      master is not None and variable.slice_dtype == variable.master_dtype
    )
    shared = mesh_impl.devices_share_host_memory
    if shared:
      self._slice_is_master = (
        usable_master
        and (slice_shape == shape.to_integer_list)
        and (
          collectives.share_host_memory(
            [mesh_impl.devices[0], variable.master_device]
          )
        )
      )
    else:
      self._slice_is_master = (
        mesh_impl.size == 1
        and usable_master
        and _same_device(mesh_impl.devices[0], variable.master_device)
      )
    if self._slice_is_master:
      self._slices = [master] * mesh_impl.size
    else:
      self._slices = []
      by_begin = {}
      for pnum in range(mesh_impl.size):
        begin = mesh_impl.slice_begin(shape, pnum)
        if shared and tuple(begin) in by_begin:
          self._slices.append(by_begin[tuple(begin)])
          continue
        device = mesh_impl.devices[pnum]
        key = "%s_slice_%d/%s/%s/%s" % (
          variable.name,
          pnum,
          device,
          begin,
          slice_shape,
        )
        slice_var = variable.store.get_or_create_slice(
          key, self._slice_creator(variable, pnum, device, begin, slice_shape)
        )
        by_begin[tuple(begin)] = slice_var
        self._slices.append(slice_var)
    self._laid_out_tensor = LaidOutTensor(self._slices)

  @staticmethod
  def _slice_creator(variable, pnum, device, begin, slice_shape):
    return slice_variables.slice_variable_creator(
      variable,
      "%s_slice_%d" % (variable.name, pnum),
      device,
      begin,
      slice_shape,
    )

  @property
  def slice_variables(self) -> list:
    """The tf.Variables holding the slices (one per distinct slice)."""
    return self._slices

  @property
  def laid_out_tensor(self) -> LaidOutTensor:
    """A LaidOutTensor reading the slice variables."""
    return self._laid_out_tensor

  @property
  def copy_master_to_slices(self) -> tf.Operation:
    """A tf op assigning the master variable's value to the slices."""
    if self._slice_is_master:
      return tf.group()
    master = self._variable.get_master()
    return self.assign_to_slices(
      lambda variable, slice_var, val: slice_var.assign(
        tf.cast(val, variable.slice_dtype)
      ),
      self._mesh_impl.make_slices(master, self._variable.shape),
    )

  @property
  def copy_slices_to_master(self) -> tf.Operation:
    """A tf op assigning the combined slices to the master variable."""
    if self._slice_is_master:
      return tf.group()
    slices = [
      tf.cast(s.read_value(), self._variable.master_dtype) for s in self._slices
    ]
    full = self._mesh_impl.combine_slices(
      slices, self._variable.shape, device=self._variable.master_device
    )
    return self._variable.assign_to_master(full)

  def assign_to_slices(self, assign_fn: Callable, values: Sequence):
    """Applies assign_fn(variable, slice_var, value) on each processor.

    A slice variable shared by several processors is assigned once, with the
    value of the first of them, after the values of the others are computed:
    in a legacy graph nothing else orders the other processors' reads of the
    shared variable before the assignment.

    Args:
      assign_fn: a function (variable, slice_var, value) returning a tf assign
        op.
      values: one tf.Tensor per processor number, the new value of its slice.

    Returns:
      a tf op (group) running all the assignments; None when executing
      eagerly (they have then run).
    """
    values = list(values)
    pnums_by_var = {}
    for pnum, slice_var in enumerate(self._slices):
      pnums_by_var.setdefault(id(slice_var), []).append(pnum)
    # Only legacy graphs need the ordering; tf.function orders reads and
    # writes of a variable by program order already.
    legacy_graph = not tf.executing_eagerly() and not tf.inside_function()
    ops = []
    for pnums in pnums_by_var.values():
      first = pnums[0]
      others = [
        values[p]
        for p in pnums[1:]
        if legacy_graph and isinstance(values[p], tf.Tensor)
      ]
      with tf.device(self._mesh_impl.devices[first]):
        with tf.control_dependencies(others):
          ops.append(
            assign_fn(self._variable, self._slices[first], values[first])
          )
    return tf.group(*[o for o in ops if o is not None])


class ReduceFirstLazySum(laid_out_lib.LazyAllreduceSum):
  """A lazy sum of fn(partial sums), computed as fn(allreduce(partial sums)).

  fn is linear and does not shrink its input (a scalar multiply, a reshape).
  On devices sharing host memory the allreduce moves no data, so applying fn
  after it, once per processor group, beats applying it to all n partial sums.
  On other devices each one applies fn to its copy of the reduced value: the
  same work as before the allreduce, and the same rounding as on shared
  memory, so a mesh computes the same values whether its devices are in one
  task or spread over several. Continuing the laziness (`laid_out_input`)
  applies fn to the partials.
  """

  def __init__(
    self,
    mesh_impl: "PlacementMeshImpl",
    fn: Callable,
    source: laid_out_lib.LazyAllreduceSum,
    probe: tf.Tensor,
  ):
    self._fn = fn
    self._source = source
    self._probe = probe  # fn of processor 0's partial sum: gives the shape.
    self._partials = None
    super().__init__(
      mesh_impl, None, source.mesh_axes, add_counter_fn=source.add_counter_fn
    )

  @property
  def laid_out_input(self):
    if self._partials is None:
      self._partials = self.mesh_impl.slicewise(
        self._fn, self._source.laid_out_input
      )
    return self._partials

  @laid_out_input.setter
  def laid_out_input(self, value):
    del value  # Set to None by LazyAllreduceSum.__init__; computed on demand.

  @property
  def slice_shape(self):
    return self._probe.shape.as_list()

  def to_laid_out_tensor(self):
    if self._reduced is None:
      reduced = self._source.to_laid_out_tensor()
      if self.mesh_impl.devices_share_host_memory:
        self._reduced = self.mesh_impl.apply_once_per_group(
          self._fn, reduced, self.mesh_axes
        )
      else:
        self._reduced = self.mesh_impl.slicewise(self._fn, reduced)
    return self._reduced


class PlacementMeshImpl(mesh_impl_lib.MeshImpl):
  """Mesh implementation with one TF device per processor.

  Example:
    >>> mesh_impl = PlacementMeshImpl("rows:2;cols:2", "batch:rows;hidden:cols",
    ...                               ["/cpu:0", "/cpu:1", "/cpu:2", "/cpu:3"])
    >>> graph = mtf.Graph()
    >>> mesh = mtf.Mesh(graph, "my_mesh")
    >>> x = mtf.import_tf_tensor(
    ...     mesh, tf.reshape(tf.range(8.0), [2, 4]), "batch:2;hidden:4")
    >>> lowering = mtf.Lowering(graph, {mesh: mesh_impl})
    >>> [s.numpy().tolist() for s in lowering.tensors[x].tensor_list]
    [[[0.0, 1.0]], [[2.0, 3.0]], [[4.0, 5.0]], [[6.0, 7.0]]]

  Args:
    shape: the mesh shape, e.g. "rows:2;cols:2".
    layout: the layout rules, e.g. "batch:rows;hidden:cols".
    devices: one TensorFlow device string per processor.
    strict_layout_rules: raise ValueError for layout rules naming mesh dims
      absent from this mesh (by default they are ignored).
  """

  LaidOutTensor = LaidOutTensor
  LaidOutVariable = LaidOutVariable

  def __init__(
    self,
    shape,
    layout,
    devices: Sequence[str],
    *,
    strict_layout_rules: bool = False,
  ):
    super().__init__(shape, layout, strict_layout_rules=strict_layout_rules)
    devices = list(devices)
    if len(devices) != self.size:
      raise ValueError(
        "mesh %s has %d processors but %d devices were given: "
        "%s" % (self.shape.to_string, self.size, len(devices), devices)
      )
    self._devices = devices
    self._share_host_memory = collectives.share_host_memory(devices)
    self.copy_master_to_slice_ops = []

  @property
  def devices(self) -> List[str]:
    """The TensorFlow device of each processor, by processor number."""
    return self._devices

  @property
  def devices_share_host_memory(self) -> bool:
    """True iff all devices are CPUs of one task (e.g. virtual CPUs).

    Then moving a tensor between devices costs no copy, so collectives compute
    once and share the result, and replicated variable slices are shared.
    """
    return self._share_host_memory

  def slicewise(self, fn: Callable, *inputs):
    """Calls fn once per device on the corresponding slices.

    In a graph on devices sharing host memory, processors whose slices are
    the very same tensors (replicas: a shared slice variable, a reduced sum)
    or equal constants of graph_constants share the result of the first of
    them, unless fn builds stateful ops (other than variable reads):
    replicated work is built and run once.
    """
    n = self.size
    args = []
    for x in inputs:
      if hasattr(x, "to_laid_out_tensor"):
        x = x.to_laid_out_tensor()
      args.append(x.tensor_list if isinstance(x, LaidOutTensor) else [x] * n)
    share = self._share_host_memory and n > 1 and not tf.executing_eagerly()
    if share:
      graph = tf1.get_default_graph()
      first_op_count = len(_operations(graph))
      # A shared constant (one per device) counts as one value.
      value_keys = graph_constants.value_keys(graph)
    else:
      value_keys = {}
    by_args = {}
    results = []
    for pnum, device in enumerate(self._devices):
      slice_args = [a[pnum] for a in args]
      key = tuple(value_keys.get(id(a), id(a)) for a in slice_args)
      if share and key in by_args:
        results.append(by_args[key])
        continue
      with tf.device(device):
        results.append(fn(*slice_args))
      if share and pnum == 0:
        share = not _builds_stateful_ops(graph, first_op_count)
      by_args[key] = results[-1]
    if isinstance(results[0], tuple):
      return tuple(LaidOutTensor(list(r)) for r in zip(*results))
    return LaidOutTensor(results)

  def slicewise_delay_allreduce(self, fn: Callable, *inputs):
    """As MeshImpl's, but fn may run after the allreduce.

    With one lazy input and an fn that keeps the size, the result is a
    ReduceFirstLazySum: still lazy, but fn then runs on the reduced value
    (once per processor group on devices sharing host memory) instead of on
    every partial sum. Every mesh does so, whatever its devices, so the
    rounding of the result does not depend on how devices map to tasks.
    """
    if (
      len(inputs) == 1
      and isinstance(inputs[0], laid_out_lib.LazyAllreduceSum)
      and inputs[0].mesh_axes
    ):
      x = inputs[0]
      if isinstance(x, ReduceFirstLazySum):
        inner_fn, source, before = x._fn, x._source, x._probe  # pylint: disable=protected-access
      else:
        inner_fn, source = None, x
        before = x.laid_out_input.to_laid_out_tensor().tensor_list[0]
      with tf.device(self._devices[0]):
        probe = fn(before)  # Pruned from graphs unless used.
      if (
        isinstance(probe, tf.Tensor)
        and probe.shape.num_elements() is not None
        and probe.shape.num_elements() >= before.shape.num_elements()
      ):
        composed = fn if inner_fn is None else (lambda t: fn(inner_fn(t)))
        return ReduceFirstLazySum(self, composed, source, probe)
    return super().slicewise_delay_allreduce(fn, *inputs)

  def apply_once_per_group(self, fn: Callable, x, mesh_axes):
    """fn of a tensor equal within each group over mesh_axes, run once per group.

    The first processor of a group computes fn; the others take its result.

    Args:
      fn: a function of one tf.Tensor.
      x: a LaidOutTensor whose slices are equal within each group.
      mesh_axes: the indices of the mesh axes spanning each group.

    Returns:
      a LaidOutTensor whose slice on each processor is fn of its group's slice.
    """
    return self._per_group(
      x,
      mesh_axes,
      lambda xs, devs: collectives.compute_then_broadcast(fn, xs[0], devs),
    )

  def _per_group(self, x, mesh_axes, group_fn):
    """Runs group_fn(slices, devices) on every processor group; reassembles.

    In a graph on devices sharing host memory, a group whose slices are the
    very same tensors as an earlier group's (replicas over the other mesh
    axes) takes that group's results: group_fn builds no stateful ops.
    """
    x = x.to_laid_out_tensor()
    out = [None] * self.size
    reuse = self._share_host_memory and not tf.executing_eagerly()
    by_slices = {}
    for group in layout_lib.processor_groups(self.shape, list(mesh_axes)):
      slices = [x.tensor_list[p] for p in group]
      key = tuple(id(s) for s in slices)
      results = by_slices.get(key) if reuse else None
      if results is None:
        results = group_fn(slices, [self._devices[p] for p in group])
        by_slices[key] = results
      for p, r in zip(group, results):
        out[p] = r
    return LaidOutTensor(out)

  def allreduce(self, x, mesh_axes, reduction_fn_string: str):
    if not mesh_axes:
      return x.to_laid_out_tensor()
    x = x.to_laid_out_tensor()
    self.count_collective("allreduce", x.tensor_list[0], mesh_axes)
    return self._per_group(
      x,
      mesh_axes,
      lambda xs, devs: collectives.allreduce(xs, devs, reduction_fn_string),
    )

  def allconcat(self, x, mesh_axis: int, concat_axis: int):
    x = x.to_laid_out_tensor()
    self.count_collective("allconcat", x.tensor_list[0], [mesh_axis])
    return self._per_group(
      x,
      [mesh_axis],
      lambda xs, devs: collectives.allconcat(xs, devs, concat_axis),
    )

  def alltoall(self, x, mesh_axis: int, split_axis: int, concat_axis: int):
    x = x.to_laid_out_tensor()
    self.count_collective("alltoall", x.tensor_list[0], [mesh_axis])
    return self._per_group(
      x,
      [mesh_axis],
      lambda xs, devs: collectives.alltoall(xs, devs, split_axis, concat_axis),
    )

  def receive(self, x, mesh_axis: int, source_pcoord):
    x = x.to_laid_out_tensor()
    shape = self.shape.to_integer_list
    self.count_collective(
      "shift",
      x.tensor_list[0],
      [mesh_axis],
      num_transfers=mesh_impl_lib.shift_transfers(
        shape, mesh_axis, source_pcoord
      ),
    )
    out = []
    for pnum, device in enumerate(self._devices):
      coord = layout_lib.pnum_to_processor_coordinates(shape, pnum)
      source = source_pcoord[coord[mesh_axis]]
      with tf.device(device):
        if source is None:
          out.append(tf.zeros_like(x.tensor_list[pnum]))
        else:
          coord[mesh_axis] = source
          src_pnum = layout_lib.processor_coordinates_to_pnum(shape, coord)
          out.append(tf.identity(x.tensor_list[src_pnum]))
    return LaidOutTensor(out)

  def laid_out_pnum(self) -> LaidOutTensor:
    return LaidOutTensor(list(range(self.size)))

  def random(self, shape, tf_fn: Callable, kwargs):
    """tf_fn(slice_shape, **kwargs) once per distinct slice; replicas agree.

    Args:
      shape: the Shape of the random tensor.
      tf_fn: a TF random function taking the slice shape first, e.g.
        tf.random.uniform.
      kwargs: a dict of further keyword arguments of `tf_fn`.

    Returns:
      a LaidOutTensor of the random slices.
    """
    shape = convert_to_shape(shape)
    slice_shape = self.slice_shape(shape)
    by_begin = {}
    out = []
    for pnum, device in enumerate(self._devices):
      begin = tuple(self.slice_begin(shape, pnum))
      with tf.device(device):
        if begin not in by_begin:
          by_begin[begin] = tf_fn(slice_shape, **kwargs)
          out.append(by_begin[begin])
        else:
          out.append(tf.identity(by_begin[begin]))
    return LaidOutTensor(out)

  def Print(self, x, data: Sequence, message: str, **kwargs) -> LaidOutTensor:  # pylint: disable=invalid-name
    """Prints `data` (tf tensors) on the first device when x is computed."""
    x = x.to_laid_out_tensor()
    first = x.tensor_list[0]
    with tf.device(self._devices[0]):
      print_op = tf.print(message, *data, **kwargs)
      with tf.control_dependencies([print_op]):
        first = tf.identity(first)
    return LaidOutTensor([first] + x.tensor_list[1:])

  def export_to_tf_tensor(self, x, laid_out_x) -> tf.Tensor:
    return self.combine_slices(laid_out_x.all_slices, x.shape)

  def import_tf_tensor(self, x, tf_x: tf.Tensor) -> LaidOutTensor:
    shape = x.shape
    sizes = self.slice_shape(shape)
    tf_x = tf.convert_to_tensor(tf_x)
    slices = []
    for pnum, device in enumerate(self._devices):
      with tf.device(device):
        slices.append(
          mesh_impl_lib.static_slice(tf_x, self.slice_begin(shape, pnum), sizes)
        )
    return LaidOutTensor(slices)


# The original's module-level collective helpers, kept under their names.
allreduce_ring = collectives.allreduce
allconcat_ring = collectives.allconcat
alltoall_ring = collectives.alltoall
alltoall_pointtwise = collectives.alltoall


def allreduce_ring_single_shard(
  xs, devices, reduction_fn_string: str = "SUM"
) -> list:
  """Reduces tensors on devices, then broadcasts the result back to each device.

  Args:
    xs: one tf.Tensor per device, all of one shape.
    devices: the device of each tensor.
    reduction_fn_string: "SUM", "MAX" or "MIN".

  Returns:
    a list with the reduced tf.Tensor on each device.
  """
  return collectives.reduce_then_broadcast(xs, devices, reduction_fn_string)


__all__ = [
  "LaidOutTensor",
  "LaidOutVariable",
  "PlacementMeshImpl",
  "ReduceFirstLazySum",
  "allconcat_ring",
  "allreduce_ring",
  "allreduce_ring_single_shard",
  "alltoall_pointtwise",
  "alltoall_ring",
]
