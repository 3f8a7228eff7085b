"""SimdMeshImpl: the mesh as ONE program run by every processor (SPMD).

The lowered program is a single replica's program: a LaidOutTensor holds that
replica's one slice, the replica's processor number is a tensor
(`pnum_tensor`), and communication goes through a SimdBackend:

- backend "tpu" (simd_tpu.TpuBackend): the original TPU path; the caller runs
  the program under `tf.compat.v1.tpu.replicate` (TPUEstimator or similar).
- backend "collective" (simd_collective.CollectiveBackend): local devices
  (virtual CPUs, GPUs) and TF collective ops; run the program with
  `mesh_impl.replicate(computation)`.

Processor numbers: *logical* pnums number the mesh lexicographically (as
everywhere in mtf); *physical* pnums are replica ids. `logical_to_physical`
maps one to the other (a good map puts mesh neighbours on neighbouring chips).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from absl import logging
import gin
import numpy as np
import tensorflow as tf

from mesh_tensorflow._src import layout as layout_lib
from mesh_tensorflow._src import mesh_impl as mesh_impl_lib
from mesh_tensorflow._src.mesh_impls import simd_backend
from mesh_tensorflow._src.mesh_impls import simd_collective
from mesh_tensorflow._src.mesh_impls import simd_tpu
from mesh_tensorflow._src.mesh_impls import slice_variables
from mesh_tensorflow._src.shapes import convert_to_shape

__all__ = ["LaidOutTensor", "LaidOutVariable", "SimdMeshImpl"]

_REDUCE_FNS = {"SUM": None, "MAX": tf.reduce_max, "MIN": tf.reduce_min}


class LaidOutTensor:
  """The one slice of this replica (SIMD: a program sees only its own).

  Args:
    tensor_list: a list of exactly one tf.Tensor: this replica's slice.
  """

  def __init__(self, tensor_list: Sequence):
    tensor_list = list(tensor_list)
    if len(tensor_list) != 1:
      raise ValueError(
        "a SIMD LaidOutTensor holds exactly one tensor, got %d"
        % len(tensor_list)
      )
    self._tensor_list = tensor_list

  def __repr__(self) -> str:
    return "LaidOutTensor(%r)" % (self._tensor_list,)

  @property
  def tensor_list(self) -> list:
    """A list of one tf.Tensor: this replica's slice."""
    return self._tensor_list

  @property
  def one_slice(self) -> tf.Tensor:
    """This replica's slice (a tf.Tensor)."""
    return self._tensor_list[0]

  @property
  def all_slices(self) -> list:
    """A list of one tf.Tensor: this replica's slice."""
    return self._tensor_list

  @property
  def slice_shape(self) -> List[int]:
    """The shape of this replica's slice (a list of ints)."""
    return self.one_slice.shape.as_list()

  def to_laid_out_tensor(self) -> "LaidOutTensor":
    """Returns the tensor itself (it is already laid out).

    Returns:
      this LaidOutTensor.
    """
    return self

  @classmethod
  def from_tensor_list(cls, tensor_list) -> "LaidOutTensor":
    """Builds a LaidOutTensor from a one-element list of slices.

    Args:
      tensor_list: a list holding this replica's tf.Tensor slice.

    Returns:
      a LaidOutTensor holding it.
    """
    return cls(tensor_list)


class LaidOutVariable:
  """Slice variables of one mtf Variable: one per PHYSICAL processor.

  Slice `<var.name>_slice_<physical_pnum>` lives on that replica's device and
  in the VariableStore (re-traced functions reuse it). It starts as a copy of
  its part of the master (eagerly and in tf.function; in a legacy graph as
  zeros, then copy_master_to_slices). The replica's program reads and assigns
  the variable the backend picks for it (`SimdBackend.replica_variable`).

  Args:
    variable: the mtf Variable.
    mesh_impl: the SimdMeshImpl the variable is lowered on.
  """

  def __init__(self, variable, mesh_impl: "SimdMeshImpl"):
    self._variable = variable
    self._mesh_impl = mesh_impl
    shape = variable.shape
    slice_shape = mesh_impl.slice_shape(shape)
    backend = mesh_impl.backend
    begins = mesh_impl.slice_begins(
      shape, [mesh_impl.p2l(pnum) for pnum in range(mesh_impl.size)]
    )
    devices = [backend.device(pnum) for pnum in range(mesh_impl.size)]
    names = [
      "%s_slice_%d" % (variable.name, pnum) for pnum in range(mesh_impl.size)
    ]
    self._slices = variable.store.get_or_create_slices(
      [
        "simd:%s/%s/%s/%s" % (name, device, begin, slice_shape)
        for name, device, begin in zip(names, devices, begins)
      ],
      slice_variables.slice_variables_creator(
        variable,
        names,
        devices,
        begins,
        slice_shape,
        omit_shapes=backend.slice_handles_may_omit_shape(),
      ),
    )
    self._replica_variable = backend.replica_variable(
      variable.name, self._slices
    )
    self._laid_out_tensor = LaidOutTensor([self._replica_variable])

  @property
  def slice_variables(self) -> list:
    """The slice variables, indexed by physical pnum."""
    return self._slices

  @property
  def laid_out_tensor(self) -> LaidOutTensor:
    """A LaidOutTensor reading this replica's slice variable."""
    return self._laid_out_tensor

  def _local_pnums(self) -> List[int]:
    pnums = self._mesh_impl.backend.local_replica_pnums()
    return list(range(self._mesh_impl.size)) if pnums is None else pnums

  @property
  def copy_master_to_slices(self) -> tf.Operation:
    """Op copying the master into the slices this program may write."""
    variable, mesh_impl = self._variable, self._mesh_impl
    master = variable.get_master()
    sizes = mesh_impl.slice_shape(variable.shape)
    by_begin = {}
    ops = []
    for pnum in self._local_pnums():
      begin = tuple(mesh_impl.slice_begin(variable.shape, mesh_impl.p2l(pnum)))
      if begin not in by_begin:
        by_begin[begin] = tf.cast(
          mesh_impl_lib.static_slice(master, list(begin), sizes),
          variable.slice_dtype,
        )
      with tf.device(mesh_impl.backend.device(pnum)):
        ops.append(self._slices[pnum].assign(by_begin[begin]))
    return tf.group(*ops)

  @property
  def copy_slices_to_master(self) -> tf.Operation:
    """Op writing the slices back into the master.

    Built for all replicas (outside the replicated computation), it combines
    all slices; inside a collective-backend replica it writes that replica's
    part (if it is the first holder of that part).
    """
    variable, mesh_impl = self._variable, self._mesh_impl
    shape = variable.shape
    local = mesh_impl.backend.local_replica_pnums()
    if local is None:
      slices = [
        tf.cast(
          self._slices[mesh_impl.l2p(i)].read_value(), variable.master_dtype
        )
        for i in range(mesh_impl.size)
      ]
      full = mesh_impl.combine_slices(
        slices, shape, device=variable.master_device
      )
      return variable.assign_to_master(full)
    sizes = mesh_impl.slice_shape(shape)
    ops = []
    for pnum in local:
      logical = mesh_impl.p2l(pnum)
      begin = mesh_impl.slice_begin(shape, logical)
      if logical != _first_holder(mesh_impl, shape, logical):
        continue
      value = tf.cast(self._slices[pnum].read_value(), variable.master_dtype)
      if not sizes:
        ops.append(variable.master.assign(value))
        continue
      index = tuple(slice(b, b + s) for b, s in zip(begin, sizes))
      ops.append(variable.master[index].assign(value))
    return tf.group(*ops)

  def assign_to_slices(self, assign_fn: Callable, values: Sequence):
    """assign_fn(variable, this replica's variable, value); values = [one].

    Args:
      assign_fn: a function (variable, slice_var, value) returning a tf assign
        op.
      values: a list of one tf.Tensor: the new value of this replica's slice.

    Returns:
      what assign_fn returns (the assignment).
    """
    values = list(values)
    return assign_fn(self._variable, self._replica_variable, values[0])


def _first_holder(mesh_impl, shape, logical_pnum: int) -> int:
  """The smallest logical pnum holding the same slice as logical_pnum."""
  layout = mesh_impl.tensor_layout(shape)
  used = {ma for ma in layout if ma is not None}
  coords = layout_lib.pnum_to_processor_coordinates(
    mesh_impl.shape.to_integer_list, logical_pnum
  )
  coords = [c if ma in used else 0 for ma, c in enumerate(coords)]
  return layout_lib.processor_coordinates_to_pnum(
    mesh_impl.shape.to_integer_list, coords
  )


@gin.configurable(module="mesh_tensorflow.simd_mesh_impl")
class SimdMeshImpl(mesh_impl_lib.MeshImpl):
  """Mesh implementation running one program per processor (SPMD).

  Example (collective backend, 4 virtual CPUs):
    A sum over a batch split four ways; every processor returns the total:

    >>> mesh_impl = SimdMeshImpl(
    ...     "all:4", "batch:all", devices=["cpu:%d" % i for i in range(4)])
    >>> def computation():
    ...   graph = mtf.Graph()
    ...   mesh = mtf.Mesh(graph, "mesh")
    ...   x = mtf.import_tf_tensor(mesh, tf.range(8.0), shape="batch:8")
    ...   total = mtf.reduce_sum(x)
    ...   lowering = mtf.Lowering(graph, {mesh: mesh_impl})
    ...   return lowering.export_to_tf_tensor(total)
    >>> step = tf.function(
    ...     lambda: mesh_impl.replicate(computation), autograph=False)
    >>> [float(total) for total in step()]  # one output per processor
    [28.0, 28.0, 28.0, 28.0]
  """

  LaidOutTensor = LaidOutTensor
  LaidOutVariable = LaidOutVariable

  def __init__(
    self,
    shape,
    layout,
    devices=None,
    device_assignment=None,
    logical_to_physical=None,
    allreduce_in_bfloat16_max_group_size=8,
    *,
    backend=None,
  ) -> None:
    """Maps logical processors to replicas and checks the layout rules.

    Args:
      shape: the mesh shape, e.g. "rows:2;cols:2".
      layout: the layout rules, e.g. "batch:rows;hidden:cols".
      devices: collective backend: the device of each physical processor
        (default: the first `size` local GPUs, else CPUs). Ignored, with a
        warning, by the TPU backend.
      device_assignment: TPU backend: a tf.tpu.experimental.DeviceAssignment.
      logical_to_physical: a permutation of range(size): the physical pnum
        (replica id) of each logical pnum. Default: the identity.
      allreduce_in_bfloat16_max_group_size: bfloat16 sums over larger groups
        are done in float32.
      backend: "tpu", "collective", a SimdBackend, or None ("tpu" if a
        device_assignment is given, else "collective").

    Raises:
      ValueError: for a logical_to_physical that is not a permutation, or a
        number of devices other than the mesh size.
    """
    super().__init__(shape, layout)
    size = self.size
    if logical_to_physical is None:
      logical_to_physical = list(range(size))
    else:
      try:
        logical_to_physical = [int(i) for i in logical_to_physical]
      except (TypeError, ValueError):
        raise ValueError(
          "logical_to_physical %r is not a list of ints (mesh %s)"
          % (logical_to_physical, self.shape.to_string)
        ) from None
      if sorted(logical_to_physical) != list(range(size)):
        raise ValueError(
          "logical_to_physical %s is not a permutation of range(%d) "
          "(mesh %s has %d processors)"
          % (logical_to_physical, size, self.shape.to_string, size)
        )
    self._logical_to_physical = logical_to_physical
    # mesh axes -> the groups of _create_group_assignment (asked per
    # collective; computing them walks all processors).
    self._group_assignments: Dict[Tuple[int, ...], List[List[int]]] = {}
    self._physical_to_logical = [0] * size
    for logical, physical in enumerate(logical_to_physical):
      self._physical_to_logical[physical] = logical
    self._device_assignment = device_assignment
    self._allreduce_in_bfloat16_max_group_size = (
      allreduce_in_bfloat16_max_group_size
    )
    if backend is None:
      backend = "tpu" if device_assignment is not None else "collective"
    self._devices = None
    if isinstance(backend, simd_backend.SimdBackend):
      self._backend = backend
    elif backend == "collective":
      if devices is None:
        devices = simd_collective.default_devices(size)
      devices = list(devices)
      if len(devices) != size:
        raise ValueError(
          "mesh %s has %d processors but %d devices were given: %s"
          % (self.shape.to_string, size, len(devices), devices)
        )
      self._devices = devices
      self._backend = simd_collective.CollectiveBackend(devices)
    elif backend == "tpu":
      if devices is not None:
        logging.warning("SimdMeshImpl ignores `devices` on the TPU backend")
      self._backend = simd_tpu.TpuBackend(
        num_replicas=size,
        device_assignment=device_assignment,
        allreduce_in_bfloat16_max_group_size=(
          allreduce_in_bfloat16_max_group_size
        ),
      )
    else:
      raise ValueError(
        "unknown SimdMeshImpl backend %r; expected 'tpu', "
        "'collective' or a SimdBackend" % (backend,)
      )
    self.graph_device_function_stacks = []
    self.copy_master_to_slice_ops = []

  # ------------------------------------------------------------ properties
  @property
  def backend(self) -> simd_backend.SimdBackend:
    """The SimdBackend running the collectives (TPU or CPU/GPU replicas)."""
    return self._backend

  @property
  def devices(self) -> Optional[List[str]]:
    """The collective backend's devices by physical pnum (None on TPU)."""
    return None if self._devices is None else list(self._devices)

  @property
  def device_assignment(self) -> Any:
    """The TPU device assignment given to the constructor, or None."""
    return self._device_assignment

  @property
  def logical_to_physical(self) -> List[int]:
    """For each logical processor number, its physical replica number."""
    return list(self._logical_to_physical)

  @property
  def supports_control_dependencies(self) -> bool:
    return False

  def l2p(self, logical_pnum: int) -> int:
    """The physical processor number of a logical one.

    Args:
      logical_pnum: the logical processor number (index in the mesh).

    Returns:
      the physical processor (replica) number.
    """
    return self._logical_to_physical[logical_pnum]

  def p2l(self, physical_pnum: int) -> int:
    """The logical processor number of a physical one.

    Args:
      physical_pnum: the physical processor (replica) number.

    Returns:
      the logical processor number (index in the mesh).
    """
    return self._physical_to_logical[physical_pnum]

  @property
  def pnum_tensor(self) -> tf.Tensor:
    """This replica's LOGICAL pnum, an int32 scalar tensor."""
    physical = self._backend.replica_pnum()
    if self._logical_to_physical == list(range(self.size)):
      return physical
    return tf.gather(tf.constant(self._physical_to_logical, tf.int32), physical)

  # -------------------------------------------------------------- running
  def replicate(self, computation: Callable, *args) -> list:
    """Runs `computation(*args)` on every processor; collective backend only.

    `computation` is traced once, as a function of the processor number
    (`pnum_tensor` is its input), and that function is called on every
    processor's device: tracing time does not grow with the mesh. A
    computation asking for its processor as a Python int (the backend's
    `current_replica()`) is traced once per processor instead, each under
    `tf.device` of that processor. Call it inside a tf.function or a
    tf.compat.v1 graph (called eagerly, it traces and runs a tf.function
    itself). Lower the mtf graph inside `computation`; the graph itself may
    be built there or once outside. Tensors in the result are each
    processor's own; other objects (an mtf.Lowering, say) are the trace's,
    shared by all, and operations are the processor's whole program.

    Args:
      computation: builds (or lowers) and returns one replica's outputs.
      *args: passed to every call.

    Returns:
      the list of the outputs of every processor, in logical pnum order.
    """
    if not hasattr(self._backend, "replicate"):
      raise NotImplementedError(
        "the %s backend does not run replicas itself; run the program "
        "under tf.compat.v1.tpu.replicate" % type(self._backend).__name__
      )
    return self._backend.replicate(
      computation, args, [self.l2p(i) for i in range(self.size)]
    )

  def while_loop(self, cond: Callable, body: Callable, loop_vars, **kwargs):
    """The backend's tf while loop (collectives may run inside it).

    Args:
      cond: the loop condition, a function of the loop tensors.
      body: the loop body, a function of the loop tensors.
      loop_vars: the initial loop tensors.
      **kwargs: further tf.while_loop arguments (e.g. maximum_iterations).

    Returns:
      the final loop tensors.
    """
    return self._backend.while_loop(cond, body, loop_vars, **kwargs)

  # ---------------------------------------------------------------- groups
  def _create_group_assignment(self, mesh_axes) -> List[List[int]]:
    """Physical pnums of the processor groups spanning mesh_axes."""
    key = tuple(mesh_axes)
    if key not in self._group_assignments:
      groups = layout_lib.processor_groups(self.shape, list(mesh_axes))
      self._group_assignments[key] = [
        [self.l2p(p) for p in group] for group in groups
      ]
    return [list(group) for group in self._group_assignments[key]]

  # ------------------------------------------------------------ primitives
  def slicewise(self, fn: Callable, *inputs):
    """fn on this replica's slices; non-LaidOut arguments are passed as is."""
    args = []
    for x in inputs:
      if hasattr(x, "to_laid_out_tensor"):
        x = x.to_laid_out_tensor()
      args.append(x.one_slice if isinstance(x, LaidOutTensor) else x)
    result = fn(*args)
    if isinstance(result, tuple):
      return tuple(LaidOutTensor([r]) for r in result)
    return LaidOutTensor([result])

  def allreduce(self, x, mesh_axes, reduction_fn_string: str):
    if reduction_fn_string not in _REDUCE_FNS:
      raise ValueError(
        "unknown reduction %r; expected one of %s"
        % (reduction_fn_string, sorted(_REDUCE_FNS))
      )
    x = x.to_laid_out_tensor()
    if not mesh_axes:
      return x
    groups = self._create_group_assignment(mesh_axes)
    t = x.one_slice
    self.count_collective("allreduce", t, mesh_axes)
    if reduction_fn_string == "SUM":
      dtype = t.dtype
      if (
        dtype == tf.bfloat16
        and len(groups[0]) > self._allreduce_in_bfloat16_max_group_size
      ):
        t = tf.cast(t, tf.float32)
      return LaidOutTensor(
        [tf.cast(self._backend.allreduce_sum(t, groups), dtype)]
      )
    gathered = self._backend.all_gather(tf.expand_dims(t, 0), groups, 0)
    return LaidOutTensor([_REDUCE_FNS[reduction_fn_string](gathered, 0)])

  def allconcat(self, x, mesh_axis: int, concat_axis: int, stack=False):
    """Concatenation (or stack) along concat_axis over the mesh_axis group.

    Args:
      x: the LaidOutTensor (or lazy tensor) to concatenate.
      mesh_axis: the mesh axis whose processors' slices are concatenated.
      concat_axis: the tensor axis to concatenate (or stack) along.
      stack: if True, stacks the slices on a new axis `concat_axis` instead of
        concatenating.
    """
    x = x.to_laid_out_tensor()
    t = x.one_slice
    if stack:
      t = tf.expand_dims(t, concat_axis)
    if self.shape[mesh_axis].size == 1:
      return LaidOutTensor([t])
    self.count_collective("allconcat", t, [mesh_axis])
    groups = self._create_group_assignment([mesh_axis])
    return LaidOutTensor([self._backend.all_gather(t, groups, concat_axis)])

  def alltoall(self, x, mesh_axis: int, split_axis: int, concat_axis: int):
    x = x.to_laid_out_tensor()
    if self.shape[mesh_axis].size == 1:
      return x
    self.count_collective("alltoall", x.one_slice, [mesh_axis])
    groups = self._create_group_assignment([mesh_axis])
    return LaidOutTensor(
      [self._backend.all_to_all(x.one_slice, groups, split_axis, concat_axis)]
    )

  def receive(self, x, mesh_axis: int, source_pcoord):
    """Processor i along mesh_axis gets the slice of source_pcoord[i]."""
    x = x.to_laid_out_tensor()
    shape = self.shape.to_integer_list
    pairs = []
    for pnum in range(self.size):
      coord = layout_lib.pnum_to_processor_coordinates(shape, pnum)
      source = source_pcoord[coord[mesh_axis]]
      if source is None:
        continue
      coord[mesh_axis] = source
      src = layout_lib.processor_coordinates_to_pnum(shape, coord)
      pairs.append((self.l2p(src), self.l2p(pnum)))
    if not pairs:
      return LaidOutTensor([tf.zeros_like(x.one_slice)])
    self.count_collective(
      "shift",
      x.one_slice,
      [mesh_axis],
      num_transfers=mesh_impl_lib.shift_transfers(
        shape, mesh_axis, source_pcoord
      ),
    )
    return LaidOutTensor([self._backend.permute(x.one_slice, pairs)])

  def laid_out_pnum(self) -> LaidOutTensor:
    return LaidOutTensor([self.pnum_tensor])

  def first_processor_value(self, fn: Callable[[], tf.Tensor]) -> tf.Tensor:
    value = tf.convert_to_tensor(fn())
    groups = [[self.l2p(i) for i in range(self.size)]]
    if self.size == 1:
      return value
    return tf.unstack(
      self._backend.all_gather(tf.expand_dims(value, 0), groups, 0)
    )[0]

  def random(self, shape, tf_fn: Callable, kwargs):
    """tf_fn(slice_shape, **kwargs), equal on processors holding one slice.

    Drawn on each processor, kept on coordinate 0 of every mesh axis the
    tensor is not split on and summed over those axes.

    Args:
      shape: the Shape of the random tensor.
      tf_fn: a TF random function taking the slice shape first, e.g.
        tf.random.uniform.
      kwargs: a dict of further keyword arguments of `tf_fn`.

    Returns:
      a LaidOutTensor of this replica's random slice.
    """
    shape = convert_to_shape(shape)
    slice_shape = self.slice_shape(shape)
    value = tf_fn(slice_shape, **kwargs)
    used = {ma for ma in self.tensor_layout(shape) if ma is not None}
    replicated = [
      ma
      for ma in range(self.ndims)
      if ma not in used and self.shape[ma].size > 1
    ]
    if not replicated:
      return LaidOutTensor([value])
    pnum = self.pnum_tensor
    keep = tf.reduce_all(
      tf.stack([tf.equal(self.pcoord(pnum, ma), 0) for ma in replicated])
    )
    value = tf.where(keep, value, tf.zeros_like(value))
    return self.allreduce(LaidOutTensor([value]), replicated, "SUM")

  def slice(self, tf_tensor, tensor_shape) -> tf.Tensor:
    """This replica's slice of a full tf tensor (offsets gathered by pnum).

    Args:
      tf_tensor: a tf.Tensor with the full shape.
      tensor_shape: its mtf Shape.

    Returns:
      the tf.Tensor slice of this replica.
    """
    tensor_shape = convert_to_shape(tensor_shape)
    tf_tensor = tf.convert_to_tensor(tf_tensor)
    sizes = self.slice_shape(tensor_shape)
    if sizes == tensor_shape.to_integer_list:
      return tf.identity(tf_tensor)
    begins = np.array(
      [self.slice_begin(tensor_shape, p) for p in range(self.size)],
      dtype=np.int32,
    )
    begin = tf.gather(tf.constant(begins), self.pnum_tensor)
    return tf.slice(tf_tensor, begin, sizes)

  def import_tf_tensor(self, x, tf_x: tf.Tensor) -> LaidOutTensor:
    return LaidOutTensor([self.slice(tf_x, x.shape)])

  def export_to_tf_tensor(self, x, laid_out_x) -> tf.Tensor:
    """The full tensor on every replica, gathered over its split mesh axes.

    One all-gather however many axes the tensor is split on. (The original
    raised NotImplementedError unless x was replicated.)
    """
    t = laid_out_x.to_laid_out_tensor().one_slice
    split = [
      (tensor_axis, mesh_axis)
      for tensor_axis, mesh_axis in enumerate(self.tensor_layout(x.shape))
      if mesh_axis is not None and self.shape[mesh_axis].size > 1
    ]
    if not split:
      return t
    mesh_axes = sorted(m for _, m in split)
    groups = self._create_group_assignment(mesh_axes)
    # Members are in row-major order of their coordinates along mesh_axes.
    gathered = self._backend.all_gather(tf.expand_dims(t, 0), groups, 0)
    blocks = [self.shape[m].size for m in mesh_axes]
    gathered = tf.reshape(gathered, blocks + t.shape.as_list())
    block_dim = {m: i for i, m in enumerate(mesh_axes)}
    split_by = dict(split)
    perm = []
    for tensor_axis in range(t.shape.rank):
      if tensor_axis in split_by:
        perm.append(block_dim[split_by[tensor_axis]])
      perm.append(len(blocks) + tensor_axis)
    return tf.reshape(tf.transpose(gathered, perm), x.shape.to_integer_list)
