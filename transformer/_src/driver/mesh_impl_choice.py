"""The driver's choice of mesh implementation: placement or SIMD.

`utils.run.mesh_impl` (flag `--mesh_impl`) picks how the Estimator lowers
its mtf graphs:

- "placement": mtf.placement_mesh_impl.PlacementMeshImpl, one program that
  places every processor's slice on its device.
- "simd": mtf.simd_mesh_impl.SimdMeshImpl, one program per processor; on
  local CPUs/GPUs with the collective backend (NCCL on GPUs), on TPU hosts
  with the TPU backend.
- "auto" (the default): "simd" when the process sees TPUs, else "placement".

Both keep the variables' full-shape masters under the same names, so their
checkpoints are interchangeable. `lower_on_mesh` runs a graph-building
function the way the implementation needs (once, or once per replica).

Example (a sum over a batch split over 4 CPUs, with either implementation):
  >>> def lower_total(mesh_impl):
  ...   graph = mtf.Graph()
  ...   mesh = mtf.Mesh(graph, "mesh")
  ...   x = mtf.import_tf_tensor(mesh, tf.range(8.0), shape="batch:8")
  ...   total = mtf.reduce_sum(x)
  ...   lowering = mtf.Lowering(graph, {mesh: mesh_impl})
  ...   return lowering.export_to_tf_tensor(total)
  >>> cpus = ["cpu:%d" % i for i in range(4)]
  >>> for name in ("placement", "simd"):
  ...   mesh_impl = make_mesh_impl(name, "batch:4", "batch:batch", cpus)
  ...   run = tf.function(lambda: lower_on_mesh(mesh_impl, lower_total,
  ...                                           mesh_impl), autograph=False)
  ...   print(type(mesh_impl).__name__, float(run()))
  PlacementMeshImpl 28.0
  SimdMeshImpl 28.0
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence

import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import placement_mesh_impl
from mesh_tensorflow import simd_mesh_impl

__all__ = [
  "MESH_IMPLS",
  "is_simd",
  "lower_on_mesh",
  "lower_on_tpu",
  "make_mesh_impl",
  "mesh_devices_for",
  "replicate_from_hosts",
  "resolve_mesh_impl",
  "uses_collective_backend",
]

MESH_IMPLS = ("auto", "placement", "simd")


def resolve_mesh_impl(mesh_impl: str) -> str:
  """The implementation ("placement" or "simd") a mesh_impl setting names.

  Args:
    mesh_impl: "auto", "placement" or "simd" (any case).

  Returns:
    "placement" or "simd"; "auto" is "simd" when TPUs are visible.

  Raises:
    ValueError: for any other value.
  """
  name = str(mesh_impl).strip().lower()
  if name not in MESH_IMPLS:
    raise ValueError(
      "unknown mesh_impl %r; expected one of %s (run.mesh_impl or "
      "--mesh_impl)" % (mesh_impl, ", ".join(MESH_IMPLS))
    )
  if name == "auto":
    return "simd" if tf.config.list_logical_devices("TPU") else "placement"
  return name


def _mesh_text(mesh_shape: mtf.Shape) -> str:
  """The mesh shape as written in gin and flags: "rows:2;cols:2"."""
  return ";".join("%s:%d" % (d.name, d.size) for d in mesh_shape.dims)


def mesh_devices_for(
  mesh_shape, mesh_devices: Optional[Sequence[str]] = None
) -> List[str]:
  """The devices of a mesh's processors: mesh_devices, else the first N local.

  GPUs are used when there are enough of them, else (virtual) CPUs.

  Args:
    mesh_shape: an mtf.Shape or a string like "batch:4".
    mesh_devices: explicit device names, one per processor (None: local
      devices).

  Returns:
    A list of mesh_shape.size device names ([""] for an empty mesh).

  Raises:
    ValueError: if mesh_devices has the wrong length, or fewer local devices
      exist than the mesh has processors.
  """
  mesh_shape = mtf.convert_to_shape(mesh_shape)
  size = mesh_shape.size
  if mesh_devices:
    devices = list(mesh_devices)
    if len(devices) != size:
      raise ValueError(
        "mesh_devices has %d devices but mesh_shape %s has %d "
        "processors" % (len(devices), _mesh_text(mesh_shape), size)
      )
    return devices
  if not mesh_shape.dims:
    return [""]
  for kind in ("GPU", "CPU"):
    local = tf.config.list_logical_devices(kind)
    if len(local) >= size:
      return [d.name for d in local[:size]]
  raise ValueError(
    "mesh_shape %s needs %d devices but this process has %d CPU device(s); "
    "create virtual CPUs before TensorFlow starts (python -m transformer.main "
    "--mesh_devices=%d) or set run.mesh_devices"
    % (
      _mesh_text(mesh_shape),
      size,
      len(tf.config.list_logical_devices("CPU")),
      size,
    )
  )


def make_mesh_impl(
  mesh_impl: str,
  mesh_shape,
  layout_rules,
  mesh_devices: Optional[Sequence[str]] = None,
) -> mtf.MeshImpl:
  """The mesh implementation the driver lowers its graphs with.

  Args:
    mesh_impl: "auto", "placement" or "simd".
    mesh_shape: an mtf.Shape or a string like "batch:2;model:2".
    layout_rules: an mtf.LayoutRules or a string like "batch:batch".
    mesh_devices: the device of each processor (None: the first local GPUs,
      else CPUs; on a TPU host with "simd", the TPU replicas).

  Returns:
    A PlacementMeshImpl or a SimdMeshImpl.

  Raises:
    ValueError: an unknown mesh_impl, or a mesh larger than the devices.
  """
  name = resolve_mesh_impl(mesh_impl)
  mesh_shape = mtf.convert_to_shape(mesh_shape)
  layout_rules = mtf.convert_to_layout_rules(layout_rules)
  if name == "simd" and not mesh_devices:
    if tf.config.list_logical_devices("TPU"):
      return simd_mesh_impl.SimdMeshImpl(
        mesh_shape, layout_rules, backend="tpu"
      )
  try:
    devices = mesh_devices_for(mesh_shape, mesh_devices)
  except ValueError as e:
    raise ValueError("mesh_impl %r: %s" % (name, e)) from None
  if name == "placement":
    return placement_mesh_impl.PlacementMeshImpl(
      mesh_shape, layout_rules, devices
    )
  if devices == [""]:  # An empty mesh: one replica on the default device.
    devices = [tf.config.list_logical_devices("CPU")[0].name]
  return simd_mesh_impl.SimdMeshImpl(
    mesh_shape, layout_rules, devices, backend="collective"
  )


def is_simd(mesh_impl: mtf.MeshImpl) -> bool:
  """Whether mesh_impl runs one program per processor (SimdMeshImpl).

  Args:
    mesh_impl: a mesh implementation.

  Returns:
    True for a SimdMeshImpl.
  """
  return isinstance(mesh_impl, simd_mesh_impl.SimdMeshImpl)


def uses_collective_backend(mesh_impl: mtf.MeshImpl) -> bool:
  """Whether mesh_impl is a SimdMeshImpl on its collective backend.

  Its programs run as TF collectives of replicas it starts itself, which
  cannot run inside a host tf.while_loop (loops over such programs are
  unrolled); placement's and the TPU backend's programs can.

  Args:
    mesh_impl: a mesh implementation.

  Returns:
    True for the collective backend (local CPUs/GPUs).
  """
  return is_simd(mesh_impl) and hasattr(mesh_impl.backend, "replicate")


def replicate_from_hosts(
  mesh_impl: mtf.MeshImpl,
  computation: Callable,
  host_inputs: Sequence[Sequence[Any]],
  host_of_replica: Sequence[int],
) -> list:
  """computation on every replica; each replica reads its own host's inputs.

  The replica program is traced once. On TPU, replica r's inputs of
  `tf.compat.v1.tpu.replicate` are those of the host owning its core. With
  the collective backend and one host, those inputs are every replica's
  arguments; with several (simulated) hosts, every host's inputs are the
  arguments and each replica picks its host's by its replica number.

  Args:
    mesh_impl: a SimdMeshImpl.
    computation: takes the inputs of one host as positional arguments (any
      nests of tensors) and returns a list of tensors.
    host_inputs: the inputs of each host (the same structure on each).
    host_of_replica: for each physical replica, the index of its host in
      host_inputs.

  Returns:
    the outputs of each replica, in logical processor order.
  """
  size = mesh_impl.size
  if not uses_collective_backend(mesh_impl):
    outputs = tf.compat.v1.tpu.replicate(
      # tpu.replicate counts a bound method's `self` among its arguments.
      lambda *inputs: computation(*inputs),  # pylint: disable=unnecessary-lambda
      inputs=[list(host_inputs[h]) for h in host_of_replica],
      device_assignment=mesh_impl.device_assignment,
    )
    return [outputs[mesh_impl.l2p(i)] for i in range(size)]
  if len(host_inputs) == 1:
    return mesh_impl.replicate(computation, *host_inputs[0])
  per_host = [tf.nest.flatten(list(inputs)) for inputs in host_inputs]
  count = len(per_host[0])

  def picked(*every_hosts):
    host = tf.gather(
      tf.constant(list(host_of_replica), tf.int32),
      mesh_impl.backend.replica_pnum(),
    )
    flat = [
      tf.gather(tf.stack(every_hosts[i::count]), host) for i in range(count)
    ]
    return computation(*tf.nest.pack_sequence_as(list(host_inputs[0]), flat))

  return mesh_impl.replicate(picked, *[t for flat in per_host for t in flat])


def _after_all_replicas(per_replica: list) -> Any:
  """The first replica's result, each tensor waiting for every replica.

  Fetching any one of them then runs every collective on every replica (in
  a legacy graph a collective left out on one replica would stall the
  others).
  """
  everything = [
    x
    for result in per_replica
    for x in tf.nest.flatten(result)
    if isinstance(x, (tf.Tensor, tf.Operation))
  ]

  def wait(x):
    if not isinstance(x, tf.Tensor):
      return x
    with tf.control_dependencies(everything):
      return tf.identity(x)

  return tf.nest.map_structure(wait, per_replica[0])


def lower_on_mesh(
  mesh_impl: mtf.MeshImpl,
  build: Callable,
  *args,
  replica_hosts: Optional[Sequence[str]] = None,
) -> Any:
  """build(*args), which builds and lowers an mtf graph, run on mesh_impl.

  Placement: called once. SIMD with the collective backend: traced once and
  run by every replica (in a tf.function or a tf.compat.v1 graph; see
  SimdMeshImpl.replicate); the first replica's result is returned, each of
  its tensors made to wait for every tensor and op of every replica.
  Fetching any one of them then runs every collective on every replica (in a
  legacy graph a collective left out on one replica would stall the others);
  the replicas' exported tensors are equal. SIMD with the TPU backend:
  called once, as the computation of `tf.compat.v1.tpu.replicate` over the
  mesh's replicas (see `lower_on_tpu`). With replica_hosts, the tensors
  among args are copied once to each host, and each replica reads its own
  host's copy (see `lower_on_tpu`).

  Args:
    mesh_impl: the mesh implementation.
    build: a function lowering an mtf graph on mesh_impl; it returns tensors,
      ops and other objects (e.g. its mtf.Lowering) in any nest.
    *args: passed to build.
    replica_hosts: SIMD only: the host device feeding each physical replica
      (None: the tensors are every replica's input as they are).

  Returns:
    What build returns (the first replica's, for SIMD).
  """
  if not is_simd(mesh_impl):
    return build(*args)
  if not uses_collective_backend(mesh_impl):
    return lower_on_tpu(mesh_impl, build, *args, replica_hosts=replica_hosts)
  if len(set(replica_hosts or ())) > 1:
    return _lower_from_hosts(mesh_impl, build, args, replica_hosts)
  return _after_all_replicas(mesh_impl.replicate(build, *args))


def lower_on_tpu(
  mesh_impl: mtf.MeshImpl,
  build: Callable,
  *args,
  replica_hosts: Optional[Sequence[str]] = None,
) -> Any:
  """build(*args) as the computation of tf.compat.v1.tpu.replicate.

  For a SimdMeshImpl whose backend is the TPU's: the program is traced once
  and XLA runs it on every replica of the mesh's device assignment. The
  tensors among args (in any nest) become every replica's inputs (a batch
  read on the host and broadcast, as TPUEstimator's BROADCAST input did);
  with replica_hosts each is first copied once to every host, and replica
  r's input is the copy on its own host (a multi-host slice moves the batch
  once to each host). Other args are passed as they are.

  Args:
    mesh_impl: a SimdMeshImpl with the TPU backend.
    build: a function lowering an mtf graph on mesh_impl.
    *args: passed to build.
    replica_hosts: the host device feeding each physical replica (None: the
      tensors are every replica's input as they are).

  Returns:
    What build returns, its tensors those of logical processor 0's replica
    (tpu.replicate's outputs); its operations, which cannot leave the
    replicated computation, become a group of every replica's outputs.
  """
  return _lower_from_hosts(mesh_impl, build, args, replica_hosts)


def _lower_from_hosts(mesh_impl, build, args, replica_hosts):
  """build(*args) on every replica, its tensor args read from the hosts.

  See lower_on_tpu (TPU backend) and lower_on_mesh (collective backend).
  """
  flat_args = tf.nest.flatten(args)
  positions = [i for i, x in enumerate(flat_args) if isinstance(x, tf.Tensor)]
  on_tpu = not uses_collective_backend(mesh_impl)
  traced = []

  def computation(*tensors):
    flat = list(flat_args)
    for i, t in zip(positions, tensors):
      flat[i] = t
    result = build(*tf.nest.pack_sequence_as(args, flat))
    if not on_tpu:
      return result
    traced.append(result)
    return [x for x in tf.nest.flatten(result) if isinstance(x, tf.Tensor)]

  tensors = [flat_args[i] for i in positions]
  if replica_hosts is None:
    host_inputs, host_of_replica = [tensors], [0] * mesh_impl.size
  else:
    hosts = list(dict.fromkeys(replica_hosts))
    host_of_replica = [hosts.index(h) for h in replica_hosts]
    host_inputs = []
    for host in hosts:
      with tf.device(host):
        host_inputs.append([tf.identity(t) for t in tensors])
  outputs = replicate_from_hosts(
    mesh_impl, computation, host_inputs, host_of_replica
  )
  if not on_tpu:
    return _after_all_replicas(outputs)
  first = iter(outputs[0])
  everything = tf.group(*[t for replica in outputs for t in replica])

  def to_output(x):
    if isinstance(x, tf.Tensor):
      return next(first)
    return everything if isinstance(x, tf.Operation) else x

  return tf.nest.map_structure(to_output, traced[0])
