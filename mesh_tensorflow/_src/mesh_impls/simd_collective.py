"""CollectiveBackend: SimdMeshImpl replicas on local devices, TF collectives.

The single-replica program is traced ONCE, as a function of the replica's
physical pnum (an int32 input), and that one function is called on every
replica's device (`tf.device`); the replicas talk with TF's collective ops
(`CollectiveReduceV2`, `CollectiveGatherV2`, `CollectiveAllToAllV2`). Build,
lowering and tracing time therefore grow with the number of replicas only
by one call op per replica (see replica_calls.ReplicaCaller) and the replicas' slice
variables, not by the program. Grappler optimises that function once too
(optimize_once), and each call runs the optimised graph without inlining,
as a direct call where it can (a function of the call's device only).

- what differs between replicas is an input of the traced function: the pnum
  (collective group keys, rank orders and the like are looked up in constant
  tables by it), and the replica's slice variables and ordering token. The
  trace reads the variables and token of the first replica (its "template");
  each call passes its own replica's instead of the template's in the
  function's captured inputs. The slice variables of a program traced from
  eager code are passed packed: one input per variable for all the calls
  (see CollectiveBackend._pack_slices).
- every collective a device issues passes that device's *ordering token* (the
  handle of a per-device resource variable). tf.function's automatic control
  dependencies then order the collectives of one device in program order but
  leave the devices independent; without tokens it chains the collectives of
  all devices into one sequence and deadlocks (observed on TF 2.21).
- one group key per set of devices, and a fresh instance key per collective:
  every replica issues its collectives in the same order, so the n-th
  collective of each replica gets the same key (a process-wide base, advanced
  after each `replicate` call, plus a per-program counter).
- within a group, the collective ranks follow the device order (job, task,
  device type, index), whatever order the caller lists the group in; the
  results are permuted back into the caller's group order.

A program that needs its replica number as a Python int (it calls
`current_replica()` or `local_replica_pnums()`, e.g. to pick per-replica
Python inputs, or copies slices to masters inside the replica) is traced
once per replica instead, each copy under `tf.device` of its replica.

Chosen over a tf.distribute strategy's replica context: MirroredStrategy runs
its replicas in threads, and its cross-device ops do not offer all-to-all nor
arbitrary sub-groups (mesh rows/columns), which SimdMeshImpl needs.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple
import weakref

from absl import logging
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2
from tensorflow.python.eager import context  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.eager import record  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.framework import ops  # pylint: disable=g-direct-tensorflow-import

from mesh_tensorflow._src.mesh_impls import collective_ops
from mesh_tensorflow._src.mesh_impls import replica_calls
from mesh_tensorflow._src.mesh_impls import simd_backend

__all__ = ["CollectiveBackend", "default_devices"]


# Key spaces chosen far from tf.distribute's (which start near 1).
_GROUP_KEY_BASE = 1 << 22
_INSTANCE_KEY_BASE = 1 << 24


class _Keys:
  """Process-wide group and instance keys of the collective backend."""

  def __init__(self):
    self.lock = threading.RLock()
    self._group_keys: Dict[Tuple[str, ...], int] = {}
    self.next_instance_key = _INSTANCE_KEY_BASE

  def group_key(self, devices: Sequence[str]) -> int:
    members = tuple(sorted(devices))
    with self.lock:
      if members not in self._group_keys:
        self._group_keys[members] = _GROUP_KEY_BASE + len(self._group_keys)
      return self._group_keys[members]


_KEYS = _Keys()


def default_devices(num_devices: int) -> List[str]:
  """The first `num_devices` local GPUs if there are any, else CPUs.

  Raises:
    ValueError: if there are fewer such devices than num_devices.
  """
  gpus = [d.name for d in tf.config.list_logical_devices("GPU")]
  devices = gpus or [d.name for d in tf.config.list_logical_devices("CPU")]
  if len(devices) < num_devices:
    raise ValueError(
      "SimdMeshImpl needs %d devices but only %d local %s devices exist: "
      "pass `devices`, or create virtual CPUs before TensorFlow "
      "initialises with mesh_tensorflow.utils.configure_virtual_cpus"
      % (num_devices, len(devices), "GPU" if gpus else "CPU")
    )
  return devices[:num_devices]


@functools.lru_cache(maxsize=None)
def _device_sort_key(device: str):
  spec = tf.DeviceSpec.from_string(device)
  return (
    spec.job or "localhost",
    spec.replica or 0,
    spec.task or 0,
    (spec.device_type or "CPU").upper(),
    spec.device_index or 0,
  )


class _TraceEachReplica(Exception):
  """The program cannot be shared by the replicas: trace it per replica."""


# Ops that only read a resource variable: replicas may share what they read.
_RESOURCE_READS = frozenset(
  [
    "ReadVariableOp",
    "ResourceGather",
    "ResourceGatherNd",
    "VariableShape",
    "VarIsInitializedOp",
  ]
)


class _ReplicaContext:
  """State of the replica program being traced.

  Traced once for all replicas, `pnum` is None and the replica's pnum is the
  tensor `pnum_tensor` (an input of the traced function); traced per replica,
  `pnum` is that replica's pnum.
  """

  def __init__(self, pnum: Optional[int], key_base: int, template: int = 0):
    self.pnum = pnum
    self.pnum_tensor = None
    # The replica whose variables and token the shared trace reads.
    self.template = template
    self.key_base = key_base
    self.count = 0
    self.last_collective = None  # Legacy graphs: explicit ordering.
    # Shared trace: id(tensor of the template) -> (that tensor, that tensor
    # of each replica by pnum); what each call passes instead of it.
    self.per_replica: Dict[int, Tuple[Any, List[Any]]] = {}
    # Shared trace: id(template handle of a slice variable) -> the slice
    # variables (one per replica, which the calls may pass packed).
    self.slice_handles: Dict[int, Sequence[Any]] = {}
    # Shared trace: ids of the template handles of ordering tokens.
    self.token_handles = set()
    # The replica's ordering token (see CollectiveBackend._token).
    self.token = None

  def reserve_keys(self, n: int) -> int:
    first = self.key_base + self.count
    self.count += n
    return first

  def template_of(self, make: Callable[[int], Any], num_replicas: int):
    """make(template); each call of the shared trace uses make(its pnum)."""
    template = make(self.template)
    if id(template) not in self.per_replica:
      self.per_replica[id(template)] = (
        template,
        [make(p) for p in range(num_replicas)],
      )
    return template

  def replica_value(self, captured, pnum: int):
    """What replica pnum passes for the captured input `captured`."""
    entry = self.per_replica.get(id(captured))
    return captured if entry is None else entry[1][pnum]


class _Groups:
  """A replica's view of a partition of the replicas into equal groups.

  Lists indexed by physical pnum: the group's collective key, its members
  (in the caller's order), their collective ranks and, for all-to-all, the
  member of each rank.

  Args:
    groups: the partition (equal sizes).
    devices: the device of each physical pnum.
  """

  def __init__(self, groups: Sequence[Sequence[int]], devices: Sequence[str]):
    self.size = len(groups[0])
    num_replicas = len(devices)
    self.members: List[List[int]] = [[] for _ in range(num_replicas)]
    self.keys = [0] * num_replicas
    self.ranks: List[Tuple[int, ...]] = [()] * num_replicas
    self.by_rank: List[Tuple[int, ...]] = [()] * num_replicas
    for group in groups:
      group = list(group)
      order = sorted(
        range(len(group)), key=lambda i: _device_sort_key(devices[group[i]])
      )
      ranks = [0] * len(group)
      for rank, i in enumerate(order):
        ranks[i] = rank
      key = _KEYS.group_key([devices[p] for p in group])
      for p in group:
        self.members[p] = group
        self.keys[p] = key
        self.ranks[p] = tuple(ranks)
        self.by_rank[p] = tuple(order)
    self.in_device_order = all(list(r) == sorted(r) for r in self.ranks if r)


class CollectiveBackend(simd_backend.SimdBackend):
  """SimdBackend running the replicas on local devices with TF collectives.

  Example:
    Four replicas, each holding pnum + 1, sum within groups {0, 1}, {2, 3}:

    >>> backend = CollectiveBackend(["/cpu:0", "/cpu:1", "/cpu:2", "/cpu:3"])
    >>> def computation():
    ...   x = tf.cast(backend.replica_pnum(), tf.float32) + 1.0
    ...   return backend.allreduce_sum(x, [[0, 1], [2, 3]])
    >>> outputs = backend.replicate(computation, (), [0, 1, 2, 3])
    >>> [float(y) for y in outputs]
    [3.0, 3.0, 7.0, 7.0]
  """

  def __init__(
    self,
    devices: Sequence[str],
    *,
    timeout_seconds: float = 0.0,
    optimize_once: bool = True,
    direct_calls: bool = True,
  ):
    """Prepares collectives among `devices`.

    Args:
      devices: the device of each physical replica (index = physical pnum).
      timeout_seconds: abort a collective that waits longer (0 = never).
        For debugging hangs only: on TF 2.21 every execution of a collective
        with a timeout starts an OS thread that sleeps for the timeout
        (PosixEnv::SchedClosureAfter), so a program issuing thousands of
        collectives within one timeout exhausts the process's threads and
        TF aborts the process (std::system_error in std::thread).
      optimize_once: on local CPUs, optimise the shared trace of a replica
        program with Grappler once, not once per device when the step first
        runs (see optimize_once); False lets TensorFlow inline the program
        into the step once per device, as before.
      direct_calls: with optimize_once, call the optimised program as an op
        of its own type where it can, not with `StatefulPartitionedCall`
        (each device's first call then skips placement, partitioning and
        the graph passes; see optimize_once). False: the partitioned calls.
    """
    self._devices = list(devices)
    device_types = {
      (tf.DeviceSpec.from_string(d).device_type or "").upper()
      for d in self._devices
    }
    self._communication_hint = "nccl" if device_types == {"GPU"} else "auto"
    self._optimize_once = optimize_once and device_types == {"CPU"}
    self._direct_calls = direct_calls
    self._timeout = float(timeout_seconds)
    if self._timeout > 0:
      logging.warning(
        "CollectiveBackend(timeout_seconds=%g): TF holds one sleeping "
        "thread per collective execution for that long; many collectives "
        "within %g s can exhaust the process's threads and abort it. Use "
        "timeouts to debug hangs only.",
        self._timeout,
        self._timeout,
      )
    self._context = threading.local()
    self._tokens = weakref.WeakKeyDictionary()  # tf.Graph -> token variables
    self._eager_tokens = None
    # tf.Graph -> {key: tensor}: the constant inputs of collectives and the
    # replica's entries of constant tables, made once per graph, control-flow
    # context and replica (tracing speed).
    self._constants = weakref.WeakKeyDictionary()
    # Bodies and conditions of the while loops made by while_loop (which
    # may hold collectives).
    self._loop_graphs = weakref.WeakSet()
    # Partitions (tuples of tuples of pnums) -> their _Groups.
    self._group_cache: Dict[Tuple[Tuple[int, ...], ...], _Groups] = {}
    self._devices_are_local = None
    self._prepare_tokens()

  @property
  def num_replicas(self) -> int:
    return len(self._devices)

  @property
  def devices(self) -> List[str]:
    return list(self._devices)

  def device(self, physical_pnum: int) -> str:
    return self._devices[physical_pnum]

  @property
  def communication_hint(self) -> str:
    """The collectives' implementation: "nccl" on GPUs, else "auto" (ring)."""
    return self._communication_hint

  # ------------------------------------------------------ replica contexts
  def _stack(self) -> list:
    if not hasattr(self._context, "stack"):
      self._context.stack = []
    return self._context.stack

  def current_replica(self) -> Optional[int]:
    """Physical pnum of the replica being traced, or None outside replicate.

    Asked while the program is traced once for all replicas, it makes
    `replicate` trace the program once per replica instead.
    """
    stack = self._stack()
    if not stack:
      return None
    if stack[-1].pnum is None:
      raise _TraceEachReplica("the program asks for its pnum as a Python int")
    return stack[-1].pnum

  def _ctx(self, what: str) -> _ReplicaContext:
    stack = self._stack()
    if not stack:
      raise RuntimeError(
        "%s of the SimdMeshImpl collective backend needs a replica context: "
        "lower and run the mtf program inside mesh_impl.replicate("
        "computation)" % what
      )
    return stack[-1]

  @contextlib.contextmanager
  def replica_context(self, physical_pnum: int, key_base: int):
    ctx = _ReplicaContext(physical_pnum, key_base)
    self._stack().append(ctx)
    try:
      with tf.device(self._devices[physical_pnum]):
        yield ctx
    finally:
      self._stack().pop()

  def _prepare_tokens(self) -> None:
    """Creates the eager ordering tokens now, if eager: a tf.function that
    creates variables while tracing is traced twice.
    """
    if tf.executing_eagerly() and self._eager_tokens is None:
      self._eager_tokens = self._make_tokens()

  def replicate(
    self,
    computation: Callable,
    args: Sequence[Any],
    physical_pnums: Sequence[int],
  ) -> list:
    """Traces computation(*args) once, runs it on every replica.

    See SimdMeshImpl.replicate. The program is traced once as a function of
    the replica's pnum and called on each replica's device; if it asks for
    its pnum as a Python int (`current_replica`, `local_replica_pnums`), it
    is traced once per replica instead.

    Args:
      computation: the single-replica program.
      args: its arguments (the same for every replica).
      physical_pnums: the replicas to run, in the order of the result.

    Returns:
      the list of the replicas' outputs.
    """
    if tf.executing_eagerly():
      self._prepare_tokens()
      # Collectives need all replicas in one graph: trace a function.
      fn = tf.function(
        lambda: self.replicate(computation, args, physical_pnums),
        autograph=False,
      )
      return fn()
    if self._stack():
      raise RuntimeError("SimdMeshImpl.replicate cannot be nested")
    physical_pnums = [int(p) for p in physical_pnums]
    with _KEYS.lock:
      base = _KEYS.next_instance_key
      try:
        outputs, count = self._replicate_traced_once(
          computation, args, physical_pnums, base
        )
      except _TraceEachReplica as e:
        logging.info(
          "SimdMeshImpl: %s; tracing the replica program once per replica "
          "(%d times)",
          e,
          len(physical_pnums),
        )
        outputs, count = self._replicate_per_replica(
          computation, args, physical_pnums, base
        )
      _KEYS.next_instance_key = base + count
    return outputs

  def _replicate_traced_once(self, computation, args, physical_pnums, base):
    """(outputs, collective count): one trace called on every replica."""
    ctx = _ReplicaContext(None, base, template=physical_pnums[0])
    result = {}
    packing = self._can_pack()

    def program(pnum):
      ctx.pnum_tensor = pnum
      self._stack().append(ctx)
      try:
        with tf.variable_creator_scope(_create_as_is_outside_function):
          result["structure"] = computation(*args)
      finally:
        self._stack().pop()
      result["flat"] = tf.nest.flatten(result["structure"])
      if packing:
        # The calls of one device are ordered by its token (see _pack_slices).
        tf.compat.v1.get_default_graph().capture(self._token(ctx))
      # One output at least: its op stands for all the program's operations.
      return [x for x in result["flat"] if _is_tensor(x)] + [tf.constant(0)]

    traced = tf.function(program, autograph=False)
    # The trace's ops take the device of each call, none of their own.
    with tf.compat.v1.get_default_graph().device(None):
      concrete = traced.get_concrete_function(tf.TensorSpec([], tf.int32))
    _check_shared_resources_only_read(concrete, ctx)
    captured = list(concrete.captured_inputs)
    packed = self._pack_slices(ctx, captured) if packing else {}
    call_replica = replica_calls.ReplicaCaller(
      concrete,
      packed=[id(c) in packed for c in captured],
      written=[id(c) in ctx.token_handles for c in captured],
      optimize_on=(
        self._devices[physical_pnums[0]] if self._optimizes_once() else None
      ),
      direct=self._direct_calls,
    )
    outputs = []
    try:
      for pnum in physical_pnums:
        with tf.device(self._devices[pnum]):
          flat_outputs = call_replica(
            tf.constant(pnum, tf.int32),
            [
              packed[id(c)] if id(c) in packed else _shaped_input(ctx, c, pnum)
              for c in captured
            ],
          )
        call = flat_outputs[-1].op
        values = iter(flat_outputs[:-1])
        flat = [
          next(values)
          if _is_tensor(x)
          else (call if isinstance(x, tf.Operation) else x)
          for x in result["flat"]
        ]
        outputs.append(tf.nest.pack_sequence_as(result["structure"], flat))
    finally:
      call_replica.finish()
    return outputs, ctx.count

  def _replicate_per_replica(self, computation, args, physical_pnums, base):
    """(outputs, collective count): the program traced for each replica."""
    outputs, counts = [], []
    for pnum in physical_pnums:
      with self.replica_context(pnum, base) as ctx:
        outputs.append(computation(*args))
      counts.append(ctx.count)
    if len(set(counts)) > 1:
      raise RuntimeError(
        "replicas issued different numbers of collectives %s (replicas "
        "%s): the computation must build the same program on every "
        "replica" % (counts, list(physical_pnums))
      )
    return outputs, max(counts + [0])

  # --------------------------------------------------------------- tokens
  def _token(self, ctx: _ReplicaContext) -> tf.Tensor:
    """The ordering token (a resource handle) of ctx's replica's device."""
    if ctx.token is None:
      ctx.token = self._find_token(ctx)
    return ctx.token

  def _find_token(self, ctx: _ReplicaContext) -> tf.Tensor:
    """The token of `_token`, looked up (once per replica context)."""
    with tf.init_scope():
      if tf.executing_eagerly():
        if self._eager_tokens is None:
          self._eager_tokens = self._make_tokens()
        tokens = self._eager_tokens
      else:
        graph = tf.compat.v1.get_default_graph()
        tokens = self._tokens.get(graph)
        if tokens is None:
          tokens = self._make_tokens()
          self._tokens[graph] = tokens
    if ctx.pnum is not None:
      return tokens[ctx.pnum].handle
    handle = ctx.template_of(lambda p: tokens[p].handle, self.num_replicas)
    ctx.token_handles.add(id(handle))
    return handle

  def slice_handles_may_omit_shape(self) -> bool:
    """True in the shared trace of a program whose calls take packed slices.

    The packed handle takes its shape from its first component (the slice
    of pnum 0, which keeps its shape); calls that take a replica's slice
    unpacked, and programs traced per replica, get a handle with the shape
    in its place (`replica_calls.shaped_handle`). Only for devices of this process.
    """
    stack = self._stack()
    if not stack or stack[-1].pnum is not None or not self._can_pack():
      return False
    return self._local_devices()

  def _local_devices(self) -> bool:
    """Whether every replica's device is in this process."""
    if self._devices_are_local is None:
      here = tf.DeviceSpec.from_string(context.context().host_address_space())
      self._devices_are_local = all(
        getattr(spec, field) in (None, getattr(here, field))
        for spec in map(tf.DeviceSpec.from_string, self._devices)
        for field in ("job", "replica", "task")
      )
    return self._devices_are_local

  def _optimizes_once(self) -> bool:
    """Whether a shared trace's calls run it optimised once (optimize_once).

    When the calls may pass slices packed (_can_pack: two replicas or more,
    traced from eager code, no recording tape) on local devices: a legacy
    graph's session sets up the collectives it finds in its graph (not in a
    called function's), the tape needs the ordinary calls, and one
    replica's inlined call is optimised once already.
    """
    return self._optimize_once and self._can_pack() and self._local_devices()

  def _can_pack(self) -> bool:
    """Whether the calls of a shared trace may pass slices packed.

    Packed handles exist only for eager variables (the slices of a program
    traced from eager code), one per device; a recording gradient tape
    needs the ordinary calls (see replica_calls.ReplicaCaller).
    """
    if self.num_replicas < 2 or record.could_possibly_record():
      return False
    with tf.init_scope():
      return tf.executing_eagerly()

  def _pack_slices(self, ctx: _ReplicaContext, captured) -> Dict[int, Any]:
    """{id(template handle): packed handle} of the trace's slice variables.

    Each call of the shared trace would capture its replica's handle of
    every slice variable: one placeholder per variable and device in the
    step's graph. Packed (`ops.pack_eager_tensors`), the handles of one
    variable's slices are one eager tensor on a composite device, captured
    once and passed to every call; when the step runs, TensorFlow gives each
    call the handle on the call's device. The packed handle keeps the
    slices' shape and dtype, so the step is optimised as before.

    The calls only read the packed handle as far as automatic control
    dependencies know (they would otherwise run one after the other and
    wait for each other's collectives); the calls of one device are ordered
    by the device's ordering token, which every call takes, and ops using a
    slice directly are ordered with the calls by replica_calls (its automatic control
    dependencies resolver).
    """
    packed = {}
    graph = tf.compat.v1.get_default_graph()
    for c in captured:
      entry = ctx.per_replica.get(id(c))
      if entry is None or id(c) not in ctx.slice_handles:
        continue
      handles = entry[1]
      if not all(isinstance(h, ops.EagerTensor) for h in handles):
        continue
      if len({h.device for h in handles}) < len(handles):
        continue
      packed_slices = replica_calls.PACKED_SLICES.setdefault(
        graph, replica_calls.PackedSlices()
      )
      packed[id(c)] = packed_slices.pack(handles)
    return packed

  def _make_tokens(self) -> list:
    tokens = []
    for i, d in enumerate(self._devices):
      with tf.device(d):
        tokens.append(
          tf.Variable(
            0.0, trainable=False, name="mtf_collective_ordering_token_%d" % i
          )
        )
    return tokens

  def _constant(self, ctx: _ReplicaContext, value, dtype=tf.int32):
    """A constant on ctx's device, shared by the collectives there."""
    return self._cached(ctx, (value, dtype), lambda: tf.constant(value, dtype))

  def _cached(self, ctx: _ReplicaContext, key, make: Callable[[], Any]):
    """make(), made once per graph, control-flow context, replica and key."""
    graph = tf.compat.v1.get_default_graph()
    # pylint: disable-next=protected-access
    key = (ctx.pnum, id(graph._get_control_flow_context()), key)
    cache = self._constants.setdefault(graph, {})
    if key not in cache:
      cache[key] = make()
    return cache[key]

  # ------------------------------------------------------------- helpers
  def _groups(self, groups) -> _Groups:
    """The _Groups of a partition (cached: programs reuse a few)."""
    key = tuple(tuple(int(p) for p in g) for g in groups)
    found = self._group_cache.get(key)
    if found is None:
      simd_backend.check_groups(groups, self.num_replicas)
      found = self._group_cache[key] = _Groups(key, self._devices)
    return found

  def _mine(self, ctx: _ReplicaContext, values: Sequence, dtype=tf.int32):
    """values[pnum] of ctx's replica, as a tensor.

    A constant when traced per replica or when all replicas have the same
    value; else looked up in a constant table by the pnum tensor, once per
    table and graph (the collectives over one set of groups share it).
    """
    if ctx.pnum is not None:
      return self._constant(ctx, values[ctx.pnum], dtype)
    if all(v == values[0] for v in values):
      return self._constant(ctx, values[0], dtype)
    values = tuple(values)
    return self._cached(
      ctx,
      ("mine", values, dtype),
      lambda: tf.gather(self._constant(ctx, values, dtype), ctx.pnum_tensor),
    )

  def _run(self, op_fn: Callable, ctx: _ReplicaContext, groups: _Groups, key):
    """Builds one collective of this replica, ordered after its previous one."""
    _check_not_in_while_loop(self._loop_graphs)
    kwargs = dict(
      group_size=self._constant(ctx, groups.size),
      group_key=self._mine(ctx, groups.keys),
      instance_key=key,
      ordering_token=[self._token(ctx)],
      communication_hint=self.communication_hint,
      timeout_seconds=self._timeout,
    )
    deps = []
    legacy = not tf.inside_function()
    if (
      legacy
      and ctx.last_collective is not None
      and (ctx.last_collective.graph is tf.compat.v1.get_default_graph())
    ):
      deps = [ctx.last_collective]
    # An empty dependency scope is skipped (it costs as much as a full one).
    with tf.control_dependencies(deps) if deps else contextlib.nullcontext():
      out = op_fn(**kwargs)
    if legacy:
      ctx.last_collective = out.op
    return out

  def while_loop(self, cond: Callable, body: Callable, loop_vars, **kwargs):
    """A tf.while_loop whose body may issue collectives (in tf.function).

    Each replica runs a loop of its own. Lowered to the frames of TF1
    control flow (as tf.function does by default) the replicas' loops get
    different frames, and their collectives, keyed by frame, never meet;
    kept as a functional While op, every iteration calls the body as a
    function of its own and the n-th collectives of all replicas pair up.
    Legacy graphs keep TF1 loops, whose collectives are refused.

    Args:
      cond: the loop condition, a function of the loop tensors.
      body: the loop body, a function of the loop tensors.
      loop_vars: the initial loop tensors.
      **kwargs: further tf.while_loop arguments.

    Returns:
      the final loop tensors.
    """
    if not tf.inside_function():
      return tf.while_loop(cond, body, loop_vars, **kwargs)

    def in_loop_graph(fn):
      def traced(*args):
        self._loop_graphs.add(tf.compat.v1.get_default_graph())
        return fn(*args)

      return traced

    results = tf.while_loop(
      in_loop_graph(cond), in_loop_graph(body), loop_vars, **kwargs
    )
    _keep_functional(tf.nest.flatten(results))
    return results

  # ---------------------------------------------------------- collectives
  def replica_pnum(self) -> tf.Tensor:
    ctx = self._ctx("replica_pnum")
    if ctx.pnum is None:
      return ctx.pnum_tensor
    return tf.constant(ctx.pnum, dtype=tf.int32)

  def replica_variable(self, name: str, slice_variables: Sequence):
    """The slice variable of the replica being traced (see SimdBackend).

    In the shared trace, the template replica's; each call passes its own
    replica's variable in its place.
    """
    del name
    ctx = self._ctx("a variable read")
    if ctx.pnum is not None:
      return replica_calls.shaped_variable(slice_variables[ctx.pnum])
    handle = ctx.template_of(
      lambda p: slice_variables[p].handle, self.num_replicas
    )
    ctx.slice_handles[id(handle)] = slice_variables
    return slice_variables[ctx.template]

  def local_replica_pnums(self) -> Optional[List[int]]:
    pnum = self.current_replica()
    return None if pnum is None else [pnum]

  def allreduce_sum(self, x, groups):
    ctx = self._ctx("allreduce")
    groups = self._groups(groups)
    if groups.size == 1:
      return tf.identity(x)
    key = ctx.reserve_keys(1)
    encoded, decode = collective_ops.encode_for_sum(tf.convert_to_tensor(x))
    out = self._run(
      lambda **kw: collective_ops.collective_sum(encoded, **kw),
      ctx,
      groups,
      key,
    )
    return decode(out)

  def _gather_stacked(self, x, ctx, groups: _Groups) -> tf.Tensor:
    """[group size] + x.shape: x of every member, in group order."""
    key = ctx.reserve_keys(1)
    encoded, decode = collective_ops.encode_exact(x)
    gathered = self._run(
      lambda **kw: tf.raw_ops.CollectiveGatherV2(
        input=tf.expand_dims(encoded, self._constant(ctx, 0)), **kw
      ),
      ctx,
      groups,
      key,
    )
    gathered = tf.ensure_shape(
      decode(gathered), [groups.size] + x.shape.as_list()
    )
    if not groups.in_device_order:
      gathered = tf.gather(gathered, self._mine(ctx, groups.ranks))
    return gathered

  def all_gather(self, x, groups, axis: int):
    ctx = self._ctx("all_gather")
    groups = self._groups(groups)
    if groups.size == 1:
      return tf.identity(x)
    x = tf.convert_to_tensor(x)
    stacked = self._gather_stacked(x, ctx, groups)
    return collective_ops.merge_leading_axis(stacked, axis)

  def all_to_all(self, x, groups, split_axis: int, concat_axis: int):
    ctx = self._ctx("all_to_all")
    groups = self._groups(groups)
    n = groups.size
    if n == 1:
      return tf.identity(x)
    x = tf.convert_to_tensor(x)
    shape = x.shape.as_list()
    if shape[split_axis] % n:
      raise ValueError(
        "all_to_all: axis %d of size %d does not split into %d"
        % (split_axis, shape[split_axis], n)
      )
    piece = list(shape)
    piece[split_axis] //= n
    # [n] + piece shape: piece j is for the j-th group member.
    pieces = collective_ops.split_leading_axis(x, split_axis, n)
    if not groups.in_device_order:
      pieces = tf.gather(pieces, self._mine(ctx, groups.by_rank))
    key = ctx.reserve_keys(1)
    encoded, decode = collective_ops.encode_exact(pieces)
    received = self._run(
      lambda **kw: tf.raw_ops.CollectiveAllToAllV2(input=encoded, **kw),
      ctx,
      groups,
      key,
    )
    received = tf.ensure_shape(decode(received), [n] + piece)
    if not groups.in_device_order:
      received = tf.gather(received, self._mine(ctx, groups.ranks))
    return collective_ops.merge_leading_axis(received, concat_axis)

  def permute(self, x, source_target_pairs):
    """Sends x from each source to its target; replicas no pair targets get
    zeros.

    One all-gather per connected set of replicas (e.g. a mesh row for a
    shift along it), each target picking its source's piece: a single
    collective instead of one per pair, at the price of gathering the whole
    set (TF has no point-to-point collective outside XLA). Where the sets
    differ in size, one all-gather over all replicas.
    """
    ctx = self._ctx("permute")
    pairs = [(int(s), int(t)) for s, t in source_target_pairs]
    sources = [s for s, _ in pairs]
    targets = [t for _, t in pairs]
    if len(set(sources)) != len(sources) or len(set(targets)) != len(targets):
      raise ValueError(
        "permute: source_target_pairs %s repeat a source or a target" % (pairs,)
      )
    for p in sources + targets:
      if not 0 <= p < self.num_replicas:
        raise ValueError(
          "permute: replica %d of source_target_pairs %s is "
          "not in [0, %d)" % (p, pairs, self.num_replicas)
        )
    x = tf.convert_to_tensor(x)
    source_of = dict((t, s) for s, t in pairs)
    partition = _connected_replicas(pairs, self.num_replicas)
    if len(partition[0]) == 1:  # Every replica keeps its x or gets zeros.
      ctx.reserve_keys(1)  # Keeps every replica's key sequence aligned.
      keep = [source_of.get(p) == p for p in range(self.num_replicas)]
      return tf.where(self._mine(ctx, keep, tf.bool), x, tf.zeros_like(x))
    groups = self._groups(partition)
    stacked = self._gather_stacked(x, ctx, groups)
    index = [
      groups.members[p].index(source_of[p]) if p in source_of else -1
      for p in range(self.num_replicas)
    ]
    mine = self._mine(ctx, index)
    picked = tf.gather(stacked, tf.maximum(mine, 0))
    if min(index) >= 0:
      return picked
    return tf.where(mine >= 0, picked, tf.zeros_like(x))


def _shaped_input(ctx: _ReplicaContext, captured, pnum: int):
  """What the unpacked call of replica pnum passes for `captured`."""
  value = ctx.replica_value(captured, pnum)
  slices = ctx.slice_handles.get(id(captured))
  if slices is None:
    return value
  shaped = replica_calls.shaped_handle(slices[pnum])
  return value if shaped is None else shaped


def _connected_replicas(
  pairs: Sequence[Tuple[int, int]], num_replicas: int
) -> List[List[int]]:
  """The partition of the replicas into sets linked by pairs (sorted).

  Sets of unequal sizes are merged into one set of all replicas.
  """
  neighbours: Dict[int, set] = {}
  for s, t in pairs:
    neighbours.setdefault(s, set()).add(t)
    neighbours.setdefault(t, set()).add(s)
  partition, seen = [], set()
  for pnum in range(num_replicas):
    if pnum in seen:
      continue
    members, todo = {pnum}, [pnum]
    while todo:
      for q in neighbours.get(todo.pop(), ()):
        if q not in members:
          members.add(q)
          todo.append(q)
    seen |= members
    partition.append(sorted(members))
  if len({len(m) for m in partition}) > 1:
    return [list(range(num_replicas))]
  return partition


def _check_shared_resources_only_read(concrete, ctx: _ReplicaContext):
  """_TraceEachReplica if the program may change a resource it shares.

  Replicas sharing a resource the program writes (a variable other than
  their slices, a summary writer, an iterator) would each call the shared
  program with it; tf.function's automatic control dependencies would then
  run the calls one after the other, and the first would wait forever for
  the others' collectives. Traced per replica, only the writing ops are
  ordered.
  """
  graph = concrete.graph
  for external, internal in zip(
    graph.external_captures, graph.internal_captures
  ):
    if internal.dtype != tf.resource or id(external) in ctx.per_replica:
      continue
    for consumer in internal.consumers():
      if consumer.type not in _RESOURCE_READS:
        raise _TraceEachReplica(
          "the program changes a resource all replicas share (a %s op)"
          % consumer.type
        )


def _create_as_is_outside_function(next_creator, **kwargs):
  """Variable creator: variables made outside the trace are not lifted.

  mtf makes its variables under tf.init_scope, eagerly or in the outer
  graph; made as they are, tf.function need not trace the replica program a
  second time (as it does after lifting variables made by a first trace).
  """
  # Under tf.init_scope eagerly, the default graph is still the trace's.
  if tf.executing_eagerly() or not tf.inside_function():
    kwargs["experimental_enable_variable_lifting"] = False
  return next_creator(**kwargs)


def _is_tensor(x) -> bool:
  return isinstance(x, (tf.Tensor, tf.SparseTensor, tf.RaggedTensor))


def _keep_functional(loop_outputs: Sequence[tf.Tensor]) -> None:
  """Marks the While op making loop_outputs to run as a functional op."""
  for t in loop_outputs:
    op = t.op
    while op.type == "Identity" and op.inputs:
      op = op.inputs[0].op
    if op.type in ("While", "StatelessWhile"):
      # pylint: disable-next=protected-access
      op._set_attr(
        "_lower_using_switch_merge", attr_value_pb2.AttrValue(b=False)
      )
      return


def _check_not_in_while_loop(functional_loop_graphs=()) -> None:
  """NotImplementedError inside a tf.while_loop body or condition.

  On TF 2.21 collectives issued from the separate TF1-style (frame) while
  loops of the replicas never meet (collectives are keyed by frame), so the
  program would hang; fail while tracing instead. The functional loops of
  CollectiveBackend.while_loop (graphs in functional_loop_graphs) are fine.
  """
  message = (
    "the SimdMeshImpl collective backend cannot communicate inside "
    "a while loop (e.g. mtf.while_loop over split tensors): the "
    "replicas' loops are separate and their collectives would never "
    "meet"
  )
  graph = tf.compat.v1.get_default_graph()
  context = graph._get_control_flow_context()  # pylint: disable=protected-access
  while context is not None:  # tf.compat.v1 graphs
    if type(context).__name__ == "WhileContext":
      raise NotImplementedError(message)
    context = context.outer_context
  while graph is not None:  # tf.function (while_v2)
    if graph not in functional_loop_graphs and type(graph).__name__ in (
      "WhileBodyFuncGraph",
      "WhileCondFuncGraph",
    ):
      raise NotImplementedError(message)
    graph = getattr(graph, "outer_graph", None)
