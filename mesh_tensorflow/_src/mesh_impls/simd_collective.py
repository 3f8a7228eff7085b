"""CollectiveBackend: SimdMeshImpl replicas on local devices, TF collectives.

The same single-replica program is traced once per replica inside ONE
tf.function (or tf.compat.v1 graph), each copy under `tf.device` of its
replica and a replica context that makes `replica_pnum()` that replica's
constant. The replicas talk with TF's collective ops (`CollectiveReduceV2`,
`CollectiveGatherV2`, `CollectiveAllToAllV2`), set up the way tf.distribute
sets them up on TF 2.21:

- every collective a device issues passes that device's *ordering token* (the
  handle of a per-device resource variable). tf.function's automatic control
  dependencies then order the collectives of one device in program order but
  leave the devices independent; without tokens it chains the collectives of
  all devices into one sequence and deadlocks (observed on TF 2.21).
- one group key per set of devices, and a fresh instance key per collective:
  every replica issues its collectives in the same order, so the n-th
  collective of each replica gets the same key (a process-wide base, advanced
  after each `replicate` call, plus a per-replica counter).
- within a group, the collective ranks follow the device order (job, task,
  device type, index), whatever order the caller lists the group in; the
  results are permuted back into the caller's group order.

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

from mesh_tensorflow._src.mesh_impls import simd_backend

__all__ = ["CollectiveBackend", "default_devices"]

# dtypes the CPU/GPU collective kernels take.
_NATIVE_DTYPES = (tf.float32, tf.float16, tf.float64, tf.int32, tf.int64)

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


class _ReplicaContext:
  """State of one replica while its program is traced."""

  def __init__(self, pnum: int, key_base: int):
    self.pnum = pnum
    self.key_base = key_base
    self.count = 0
    self.last_collective = None  # Legacy graphs: explicit ordering.

  def reserve_keys(self, n: int) -> int:
    first = self.key_base + self.count
    self.count += n
    return first


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

  def __init__(self, devices: Sequence[str], *, timeout_seconds: float = 0.0):
    """Prepares collectives among `devices`.

    Args:
      devices: the device of each physical replica (index = physical pnum).
      timeout_seconds: abort a collective that waits longer (0 = never).
        For debugging hangs only: on TF 2.21 every execution of a collective
        with a timeout starts an OS thread that sleeps for the timeout
        (PosixEnv::SchedClosureAfter), so a program issuing thousands of
        collectives within one timeout exhausts the process's threads and
        TF aborts the process (std::system_error in std::thread).
    """
    self._devices = list(devices)
    device_types = {
      (tf.DeviceSpec.from_string(d).device_type or "").upper()
      for d in self._devices
    }
    self._communication_hint = "nccl" if device_types == {"GPU"} else "auto"
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
    # tf.Graph -> {key: tensor}: the constant inputs of collectives, made once
    # per graph, control-flow context and replica (tracing speed).
    self._constants = weakref.WeakKeyDictionary()
    # Bodies and conditions of the while loops made by while_loop (which
    # may hold collectives).
    self._loop_graphs = weakref.WeakSet()
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
    """Physical pnum of the replica being traced, or None outside replicate."""
    stack = self._stack()
    return stack[-1].pnum if stack else None

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
    """Traces computation(*args) once per replica; see SimdMeshImpl.replicate.

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
    with _KEYS.lock:
      base = _KEYS.next_instance_key
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
      _KEYS.next_instance_key = base + max(counts + [0])
    return outputs

  # --------------------------------------------------------------- tokens
  def _token(self, pnum: int) -> tf.Tensor:
    """The ordering token (a resource handle) of replica pnum's device."""
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
    return tokens[pnum].handle

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

  def _constant(self, ctx: _ReplicaContext, value: int) -> tf.Tensor:
    """An int32 constant on ctx's device, shared by the collectives there."""
    graph = tf.compat.v1.get_default_graph()
    # pylint: disable-next=protected-access
    key = (ctx.pnum, id(graph._get_control_flow_context()), value)
    cache = self._constants.setdefault(graph, {})
    if key not in cache:
      cache[key] = tf.constant(value, tf.int32)
    return cache[key]

  # ------------------------------------------------------------- helpers
  def _my_group(self, groups, pnum: int) -> List[int]:
    groups = simd_backend.check_groups(groups, self.num_replicas)
    for g in groups:
      if pnum in g:
        return g
    raise ValueError("replica %d is in no group of %s" % (pnum, groups))

  def _ranks(self, group: Sequence[int]) -> List[int]:
    """Collective rank of each group member (ranks follow device order)."""
    order = sorted(
      range(len(group)), key=lambda i: _device_sort_key(self._devices[group[i]])
    )
    ranks = [0] * len(group)
    for rank, i in enumerate(order):
      ranks[i] = rank
    return ranks

  def _run(self, op_fn: Callable, ctx: _ReplicaContext, group, key: int):
    """Builds one collective of this replica, ordered after its previous one."""
    _check_not_in_while_loop(self._loop_graphs)
    devices = [self._devices[p] for p in group]
    kwargs = dict(
      group_size=self._constant(ctx, len(group)),
      group_key=self._constant(ctx, _KEYS.group_key(devices)),
      instance_key=key,
      ordering_token=[self._token(ctx.pnum)],
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
    with tf.control_dependencies(deps):
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
    return tf.constant(self._ctx("replica_pnum").pnum, dtype=tf.int32)

  def replica_variable(self, name: str, slice_variables: Sequence):
    del name
    return slice_variables[self._ctx("a variable read").pnum]

  def local_replica_pnums(self) -> Optional[List[int]]:
    pnum = self.current_replica()
    return None if pnum is None else [pnum]

  def allreduce_sum(self, x, groups):
    ctx = self._ctx("allreduce")
    group = self._my_group(groups, ctx.pnum)
    if len(group) == 1:
      return tf.identity(x)
    key = ctx.reserve_keys(1)
    encoded, decode = _encode_for_sum(tf.convert_to_tensor(x))
    out = self._run(
      lambda **kw: tf.raw_ops.CollectiveReduceV2(
        input=encoded, merge_op="Add", final_op="Id", **kw
      ),
      ctx,
      group,
      key,
    )
    return decode(out)

  def _gather_stacked(self, x, ctx, group) -> tf.Tensor:
    """[len(group)] + x.shape: x of every member, in group order."""
    key = ctx.reserve_keys(1)
    encoded, decode = _encode_exact(x)
    gathered = self._run(
      lambda **kw: tf.raw_ops.CollectiveGatherV2(
        input=tf.expand_dims(encoded, self._constant(ctx, 0)), **kw
      ),
      ctx,
      group,
      key,
    )
    gathered = tf.ensure_shape(
      decode(gathered), [len(group)] + x.shape.as_list()
    )
    ranks = self._ranks(group)
    if ranks != sorted(ranks):
      gathered = tf.gather(gathered, ranks)
    return gathered

  def all_gather(self, x, groups, axis: int):
    ctx = self._ctx("all_gather")
    group = self._my_group(groups, ctx.pnum)
    if len(group) == 1:
      return tf.identity(x)
    x = tf.convert_to_tensor(x)
    stacked = self._gather_stacked(x, ctx, group)
    return _merge_leading_axis(stacked, axis)

  def all_to_all(self, x, groups, split_axis: int, concat_axis: int):
    ctx = self._ctx("all_to_all")
    group = self._my_group(groups, ctx.pnum)
    n = len(group)
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
    pieces = _split_leading_axis(x, split_axis, n)
    ranks = self._ranks(group)
    identity = ranks == sorted(ranks)
    if not identity:
      by_rank = [0] * n
      for member, rank in enumerate(ranks):
        by_rank[rank] = member
      pieces = tf.gather(pieces, by_rank)
    key = ctx.reserve_keys(1)
    encoded, decode = _encode_exact(pieces)
    received = self._run(
      lambda **kw: tf.raw_ops.CollectiveAllToAllV2(input=encoded, **kw),
      ctx,
      group,
      key,
    )
    received = tf.ensure_shape(decode(received), [n] + piece)
    if not identity:
      received = tf.gather(received, ranks)
    return _merge_leading_axis(received, concat_axis)

  def permute(self, x, source_target_pairs):
    """Sends x from each source to its target; replicas no pair targets get
    zeros.

    One all-gather per connected set of replicas (e.g. a mesh row for a
    shift along it), each target picking its source's piece: a single
    collective instead of one per pair, at the price of gathering the whole
    set (TF has no point-to-point collective outside XLA).
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
    me = ctx.pnum
    group = _connected_replicas(pairs, me)
    source = dict((t, s) for s, t in pairs).get(me)
    if len(group) == 1:
      ctx.reserve_keys(1)  # Keeps every replica's key sequence aligned.
      return tf.identity(x) if source == me else tf.zeros_like(x)
    stacked = self._gather_stacked(x, ctx, group)
    if source is None:
      return tf.zeros_like(x)
    return stacked[group.index(source)]


def _connected_replicas(
  pairs: Sequence[Tuple[int, int]], pnum: int
) -> List[int]:
  """The replicas linked to pnum through pairs (sorted; [pnum] if none)."""
  neighbours: Dict[int, set] = {}
  for s, t in pairs:
    neighbours.setdefault(s, set()).add(t)
    neighbours.setdefault(t, set()).add(s)
  seen, todo = {pnum}, [pnum]
  while todo:
    for q in neighbours.get(todo.pop(), ()):
      if q not in seen:
        seen.add(q)
        todo.append(q)
  return sorted(seen)


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


# ------------------------------------------------------------ dtype codecs
def _encode_exact(x: tf.Tensor):
  """(tensor of a native collective dtype, decode fn), bit-exact."""
  dtype = x.dtype
  if dtype in _NATIVE_DTYPES:
    return x, lambda y: y
  if dtype == tf.bool:
    return tf.cast(x, tf.int32), lambda y: tf.cast(y, tf.bool)
  if dtype in (tf.bfloat16,):
    return tf.cast(x, tf.float32), lambda y: tf.cast(y, dtype)
  if dtype in (tf.int8, tf.int16, tf.uint8, tf.uint16):
    return tf.cast(x, tf.int32), lambda y: tf.cast(y, dtype)
  if dtype == tf.uint32:
    return tf.cast(x, tf.int64), lambda y: tf.cast(y, dtype)
  if dtype == tf.uint64:
    return (tf.bitcast(x, tf.int64), lambda y: tf.bitcast(y, tf.uint64))
  if dtype.is_complex:
    return (
      tf.stack([tf.math.real(x), tf.math.imag(x)], -1),
      lambda y: tf.complex(y[..., 0], y[..., 1]),
    )
  raise TypeError("collective backend cannot transfer dtype %s" % dtype.name)


def _encode_for_sum(x: tf.Tensor):
  """(tensor of a native dtype, decode fn) for a sum (bfloat16 sums in f32)."""
  dtype = x.dtype
  if dtype in _NATIVE_DTYPES:
    return x, lambda y: y
  if dtype == tf.bool:  # Logical or, as a sum of 0/1.
    return tf.cast(x, tf.int32), lambda y: y > 0
  if dtype == tf.uint64:  # Two's complement sums wrap exactly like uint64.
    return tf.bitcast(x, tf.int64), lambda y: tf.bitcast(y, tf.uint64)
  if dtype.is_integer:
    wide = tf.int64 if dtype.size >= 4 else tf.int32
    return tf.cast(x, wide), lambda y: tf.cast(y, dtype)
  if dtype.is_floating:
    return tf.cast(x, tf.float32), lambda y: tf.cast(y, dtype)
  if dtype.is_complex:
    return _encode_exact(x)
  raise TypeError("collective backend cannot sum dtype %s" % dtype.name)


# --------------------------------------------------------- axis plumbing
def _merge_leading_axis(stacked: tf.Tensor, axis: int) -> tf.Tensor:
  """[n, d0, .., dk] -> concatenation of the n pieces along `axis`."""
  n = stacked.shape.as_list()[0]
  rest = stacked.shape.as_list()[1:]
  if not rest:
    raise ValueError("cannot concatenate scalars; stack them instead")
  if axis:
    perm = list(range(1, axis + 1)) + [0] + list(range(axis + 1, len(rest) + 1))
    stacked = tf.transpose(stacked, perm)
  new_shape = list(rest)
  new_shape[axis] *= n
  return tf.reshape(stacked, new_shape)


def _split_leading_axis(x: tf.Tensor, axis: int, n: int) -> tf.Tensor:
  """x -> [n] + x.shape with axis divided by n (piece j = j-th block)."""
  shape = x.shape.as_list()
  split_shape = shape[:axis] + [n, shape[axis] // n] + shape[axis + 1 :]
  y = tf.reshape(x, split_shape)
  if axis:
    perm = [axis] + list(range(axis)) + list(range(axis + 1, len(split_shape)))
    y = tf.transpose(y, perm)
  return y
