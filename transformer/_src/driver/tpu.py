"""Cloud TPU: find the TPU, map the mesh onto it, run the driver's programs.

What TPUEstimator did for the original, on TF 2.21:

1. `resolve_tpu` / `initialize_tpu`: a TPUClusterResolver for the name (or
   grpc:// address) given as `tpu`, `tpu_zone`, `gcp_project`,
   `tpu_job_name`; a reachability check of its workers, the connection
   (`tf.config.experimental_connect_to_cluster`) and
   `tf.tpu.experimental.initialize_tpu_system`, whose result is the TPU
   Topology. Every failure is a `TpuConnectionError` naming the TPU.
2. `plan_mesh`: the mtf mesh onto the topology. Logical processors map to
   physical ones with `auto_logical_to_physical_tpu` (or a
   HierarchicalTiling spec) on the topology's 3-d form, as the original's
   flags --logical_cores_per_chip and --fold_xy say; replica r of the
   DeviceAssignment is the core of physical processor r, so the TPU
   backend's replica ids are the physical pnums SimdMeshImpl computes its
   collective groups with.
3. `ReplicatedTrainLoop`: `iterations_per_loop` training steps per call of
   ONE tf.function. Each host runs its own input pipeline on its CPU and
   feeds the replicas whose cores it owns (the per-host input of
   TPUEstimator); every replica runs the same step (the Estimator's
   `build_train_graph`, lowered by SimdMeshImpl), traced once for all
   replicas. On TPU the step is the computation of
   `tf.compat.v1.tpu.replicate` (as TPUStrategy.run does), replica r's
   input the batch of its host, and the steps are a host `tf.while_loop`
   around it; with SimdMeshImpl's collective backend (local CPUs/GPUs) the
   same step runs through `mesh_impl.replicate`, each replica taking its
   host's batch by its pnum, and the steps are unrolled (TF collectives
   cannot run inside a while loop). Each step also returns whether its loss
   and every replica's updated slices are finite; the loop ANDs the flags
   (the TPU's while loop stops after a non-finite step) and records the
   first non-finite step.
4. `train`: trains an Estimator with such a loop. Masters stay on the host
   CPU; checkpoints hold the masters under the same names as on CPU, so
   either side restores the other's. A non-finite step raises the
   Estimator's FloatingPointError before anything is saved.
5. `TpuEstimator`: an Estimator whose mesh_impl is the TPU's. Its
   evaluation, scoring and decoding programs are built by the Estimator's
   phases as on CPU, and `mesh_impl_choice.lower_on_tpu` runs each as the
   computation of `tf.compat.v1.tpu.replicate`, each host feeding its own
   replicas; all three run `iterations_per_loop` batches per call (a host
   while loop around the replicated program, traced once; see
   `evaluation.batch_loop_graph`).

Nothing here runs without a TPU except on the collective backend; the TPU
graphs can be built (not run) on CPU from a `synthetic_topology`.
"""

from __future__ import annotations

import inspect
import itertools
import os
import socket
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence
import urllib.parse

from absl import flags
from absl import logging
import gin
import numpy as np
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import simd_mesh_impl
from transformer._src.driver import estimator as driver
from transformer._src.driver import mesh_impl_choice

__all__ = [
  "ReplicatedTrainLoop",
  "TpuConnectionError",
  "TpuEstimator",
  "TpuMeshPlan",
  "TpuSetup",
  "initialize_tpu",
  "plan_mesh",
  "replica_host_devices",
  "resolve_tpu",
  "setup_tpu",
  "synthetic_topology",
  "tpu_mesh_impl",
  "train",
]


class TpuConnectionError(RuntimeError):
  """The TPU could not be resolved, reached or initialised."""


def _describe(tpu, tpu_zone, gcp_project) -> str:
  """The TPU and where it is, for error messages."""
  where = [f"zone {tpu_zone!r}"] if tpu_zone else []
  where += [f"project {gcp_project!r}"] if gcp_project else []
  return f"TPU {tpu!r}" + (f" ({', '.join(where)})" if where else "")


def resolve_tpu(
  tpu: str,
  tpu_zone: Optional[str] = None,
  gcp_project: Optional[str] = None,
  tpu_job_name: Optional[str] = None,
  *,
  connect_timeout_seconds: float = 20.0,
) -> tf.distribute.cluster_resolver.TPUClusterResolver:
  """A TPUClusterResolver for `tpu`, after checking its workers answer.

  For instance `resolve_tpu("my-tpu", "us-central2-b", "my-project")` on a
  GCE VM, `resolve_tpu("local")` on a TPU VM, or
  `resolve_tpu("grpc://10.0.0.2:8470")` (they need a TPU, so they are not run
  as examples here).

  Args:
    tpu: the TPU's name, "local" (the TPU VM's own chips) or a grpc://
      address.
    tpu_zone: the GCE zone of a named TPU (None: the VM's zone).
    gcp_project: the GCP project of a named TPU (None: the VM's project).
    tpu_job_name: the TPU workers' job name (None: "worker").
    connect_timeout_seconds: how long each worker's port may take to accept a
      TCP connection.

  Returns:
    the resolver.

  Raises:
    TpuConnectionError: naming the TPU, if it cannot be resolved or one of its
      workers does not accept connections (connecting to an unreachable
      worker would otherwise wait forever).
  """
  what = _describe(tpu, tpu_zone, gcp_project)
  job = tpu_job_name or "worker"
  if not tpu:
    raise TpuConnectionError("no TPU given: set --tpu to a TPU name")
  try:
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(
      tpu=tpu, zone=tpu_zone, project=gcp_project, job_name=job
    )
    cluster = resolver.cluster_spec().as_dict()
  except Exception as e:  # pylint: disable=broad-except
    raise TpuConnectionError(f"cannot resolve {what}: {e}") from e
  for address in _addresses(cluster.get(job, [])):
    _check_reachable(address, what, connect_timeout_seconds)
  return resolver


def _addresses(tasks) -> List[str]:
  if isinstance(tasks, dict):
    return [tasks[k] for k in sorted(tasks)]
  return list(tasks)


def _check_reachable(address: str, what: str, timeout: float) -> None:
  """TpuConnectionError unless host:port accepts a TCP connection."""
  parsed = urllib.parse.urlsplit("//" + address.split("://")[-1])
  try:
    with socket.create_connection((parsed.hostname, parsed.port), timeout):
      pass
  except (OSError, ValueError, TypeError) as e:
    raise TpuConnectionError(
      f"{what} is unreachable: worker {address} does not accept "
      f"connections ({e}). Check the name, zone and project, that the TPU "
      "is READY (gcloud compute tpus tpu-vm list) and that this VM is in "
      "its network."
    ) from e


def initialize_tpu(
  resolver: tf.distribute.cluster_resolver.TPUClusterResolver,
  tpu: str = "",
) -> tf.tpu.experimental.Topology:
  """Connects to the resolver's cluster and initialises its TPU system.

  Args:
    resolver: from `resolve_tpu`.
    tpu: the TPU's name, for error messages.

  Returns:
    the TPU Topology (mesh shape [x, y, z, cores per chip], the cores of each
    host).

  Raises:
    TpuConnectionError: naming the TPU, if no TPU answers.
  """
  name = tpu or resolver.master() or "local"
  try:
    if resolver.master():
      tf.config.experimental_connect_to_cluster(resolver)
    topology = tf.tpu.experimental.initialize_tpu_system(resolver)
  except (tf.errors.OpError, RuntimeError, ValueError) as e:
    raise TpuConnectionError(
      f"cannot initialise TPU {name!r}: {str(e).splitlines()[0]}"
    ) from e
  logging.info(
    "TPU %r: topology %s, %d host(s) with %d cores each",
    name,
    list(topology.mesh_shape),
    topology.num_tasks,
    topology.num_tpus_per_task,
  )
  return topology


def synthetic_topology(
  mesh_shape: Sequence[int], num_hosts: int = 1
) -> tf.tpu.experimental.Topology:
  """A Topology as a TPU slice of that shape reports it (no TPU needed).

  Cores are numbered z, y, x, core (slowest to fastest) and cut into
  `num_hosts` equal runs, one per host, as each host of a slice owns a block
  of neighbouring chips. Examples: a v3-8 is `synthetic_topology([2, 2, 1,
  2])` (4 chips, 2 cores each, 1 host); a v4-32 is
  `synthetic_topology([2, 2, 4, 1], num_hosts=4)` (16 chips of one megacore
  each, 4 chips per host).

  Args:
    mesh_shape: [x, y, z, cores per chip].
    num_hosts: the number of hosts; must divide the number of cores.

  Returns:
    a tf.tpu.experimental.Topology.

  Raises:
    ValueError: for a mesh_shape that is not 4 positive ints, or a num_hosts
      that does not divide the cores.
  """
  mesh_shape = [int(s) for s in mesh_shape]
  if len(mesh_shape) != 4 or min(mesh_shape) < 1:
    raise ValueError(
      f"TPU mesh_shape must be 4 positive ints [x, y, z, cores], got "
      f"{mesh_shape}"
    )
  x, y, z, cores = mesh_shape
  coordinates = [
    [i, j, k, c]
    for k, j, i, c in itertools.product(
      range(z), range(y), range(x), range(cores)
    )
  ]
  if num_hosts < 1 or len(coordinates) % num_hosts:
    raise ValueError(
      f"{num_hosts} hosts do not divide the {len(coordinates)} cores of "
      f"TPU mesh {mesh_shape}"
    )
  per_host = len(coordinates) // num_hosts
  device_coordinates = np.array(coordinates, np.int32).reshape(
    [num_hosts, per_host, 4]
  )
  return tf.tpu.experimental.Topology(
    mesh_shape=mesh_shape, device_coordinates=device_coordinates
  )


class TpuMeshPlan(NamedTuple):
  """Where each processor of an mtf mesh runs on a TPU slice.

  Attributes:
    mesh_shape: the mtf mesh shape.
    topology: the TPU topology.
    physical_shape: the 3-d grid of chips and cores the mapping works on:
      [y*z, x, cores], or [x*y, z, cores] with --fold_xy (as the original).
    logical_to_physical: the physical pnum of each logical pnum.
    device_assignment: replica r = the core of physical pnum r (row-major
      over physical_shape); with --logical_cores_per_chip=1 on one-core
      chips, TF's default assignment, which the mapping then names.
  """

  mesh_shape: mtf.Shape
  topology: Any
  physical_shape: List[int]
  logical_to_physical: List[int]
  device_assignment: Any


def _mesh_string(shape: mtf.Shape) -> str:
  """'batch:4;model:2', the form mesh_shape is given in."""
  return ";".join(f"{d.name}:{d.size}" for d in shape.dims)


def _topology_coordinates(
  physical_shape: List[int], tpu_mesh: List[int], pnum: int
) -> List[int]:
  """[x, y, z, core] of physical pnum (row-major over the 3-d physical_shape).

  The 3-d rows are the topology's y*z (z slower), or x*y (y slower) with
  --fold_xy; see physical_shape_3d_from_topology_proto_4d.
  """
  row, column, core = [int(c) for c in np.unravel_index(pnum, physical_shape)]
  x_size, y_size = tpu_mesh[0], tpu_mesh[1]
  if flags.FLAGS["fold_xy"].value:
    return [row % x_size, row // x_size, column, core]
  return [column, row % y_size, row // y_size, core]


def plan_mesh(
  mesh_shape,
  topology: tf.tpu.experimental.Topology,
  hierarchical_tiling_spec=None,
  *,
  tpu_name: str = "",
) -> TpuMeshPlan:
  """Maps the mtf mesh onto the TPU topology: one processor per core.

  Example:
    Mesh "batch:8" on a v3-8 walks the chips along a ring, two cores per
    chip:

    >>> plan = plan_mesh("batch:8", synthetic_topology([2, 2, 1, 2]))
    >>> plan.logical_to_physical
    [0, 1, 2, 3, 6, 7, 4, 5]

  Args:
    mesh_shape: an mtf.Shape or its string.
    topology: the TPU topology (`initialize_tpu` or `synthetic_topology`).
    hierarchical_tiling_spec: optional HierarchicalTiling spec (used when the
      topology has z == 1, as in the original); default: the automatic
      mapping.
    tpu_name: the TPU's name, for error messages.

  Returns:
    a TpuMeshPlan.

  Raises:
    ValueError: naming the mesh and the topology, if the mesh's size is not
      the number of cores, or the tiling spec does not give the mesh shape.
  """
  mesh_shape = mtf.convert_to_shape(mesh_shape)
  tpu_mesh = [int(s) for s in topology.mesh_shape]
  num_cores = topology.num_tasks * topology.num_tpus_per_task
  where = f"TPU {tpu_name!r} " if tpu_name else "the TPU "
  if mesh_shape.size != num_cores:
    raise ValueError(
      f"mesh_shape {_mesh_string(mesh_shape)!r} has {mesh_shape.size} "
      f"processors but {where}(topology {tpu_mesh}: x, y, z, cores per "
      f"chip) has {num_cores} cores on {topology.num_tasks} host(s); use a "
      f"mesh of {num_cores} processors, e.g. 'batch:{num_cores}'"
    )
  sizes = mesh_shape.to_integer_list
  physical_shape = simd_mesh_impl.physical_shape_3d_from_topology_proto_4d(
    tpu_mesh
  )
  if hierarchical_tiling_spec is not None and tpu_mesh[2] > 1:
    logging.warning(
      "hierarchical_tiling_spec is ignored on %s(topology %s, z > 1): the "
      "automatic mapping places the mesh, as in the original",
      where,
      tpu_mesh,
    )
  device_assignment = None
  if hierarchical_tiling_spec is not None and tpu_mesh[2] == 1:
    tiling = simd_mesh_impl.HierarchicalTiling(
      hierarchical_tiling_spec, physical_shape
    )
    if tiling.mesh_shape.to_integer_list != sizes:
      raise ValueError(
        f"hierarchical_tiling_spec {hierarchical_tiling_spec} gives mesh "
        f"{_mesh_string(tiling.mesh_shape)!r} on {where}(physical shape "
        f"{physical_shape}), not mesh_shape {_mesh_string(mesh_shape)!r}"
      )
    logical_to_physical = tiling.logical_to_physical
  elif flags.FLAGS["logical_cores_per_chip"].value == 1 == tpu_mesh[3]:
    # One core per chip: as the original, the mapping names replicas of
    # TF's default device assignment (TPUEstimator's).
    device_assignment = tf.tpu.experimental.DeviceAssignment.build(
      topology, num_replicas=num_cores
    )
    logical_to_physical = simd_mesh_impl.auto_logical_to_physical_tpu(
      sizes, physical_shape, device_assignment=device_assignment
    )
  else:
    logical_to_physical = simd_mesh_impl.auto_logical_to_physical_tpu(
      sizes, physical_shape
    )
  try:
    if device_assignment is None:
      # Replica r is the core of physical pnum r.
      core_assignment = np.array(
        [
          [_topology_coordinates(physical_shape, tpu_mesh, p)]
          for p in range(mesh_shape.size)
        ],
        np.int32,
      )
      device_assignment = tf.tpu.experimental.DeviceAssignment(
        topology, core_assignment
      )
  except ValueError as e:
    raise ValueError(
      f"cannot place mesh {_mesh_string(mesh_shape)!r} on {where}(topology "
      f"{tpu_mesh}): {e}"
    ) from e
  return TpuMeshPlan(
    mesh_shape,
    topology,
    list(physical_shape),
    list(logical_to_physical),
    device_assignment,
  )


def tpu_mesh_impl(plan: TpuMeshPlan, layout_rules):
  """SimdMeshImpl lowering to TPU replicas as `plan` places them.

  Args:
    plan: from plan_mesh.
    layout_rules: the layout rules (mtf.LayoutRules or string).

  Returns:
    a SimdMeshImpl with the TPU backend.
  """
  return simd_mesh_impl.SimdMeshImpl(
    plan.mesh_shape,
    layout_rules,
    device_assignment=plan.device_assignment,
    logical_to_physical=plan.logical_to_physical,
    backend="tpu",
  )


def replica_host_devices(mesh_impl, job: Optional[str] = None) -> List[str]:
  """The host CPU that feeds each physical replica.

  TPU backend: the host owning the replica's core. Collective backend: the
  CPU of the local host (one host).

  Args:
    mesh_impl: a SimdMeshImpl.
    job: the TPU workers' job name (None: the device assignment's default).

  Returns:
    a device name per physical pnum.
  """
  assignment = mesh_impl.device_assignment
  if assignment is not None:
    return [
      assignment.host_device(replica=r, job=job) for r in range(mesh_impl.size)
    ]
  return ["/device:CPU:0"] * mesh_impl.size


def _ordered_unique(items: Sequence[str]) -> List[str]:
  return list(dict.fromkeys(items))


class ReplicatedTrainLoop:
  """`iterations_per_loop` training steps of an Estimator per call.

  The Estimator's mesh_impl must be a SimdMeshImpl (TPU or collective
  backend). See the module docstring.

  Example (collective backend on 2 virtual CPUs, a tiny LM):
    >>> import tempfile
    >>> from transformer import transformer as tr
    >>> from transformer import transformer_layers as tl
    >>> from transformer._src.driver.estimator import Estimator
    >>> model = tr.Unitransformer(
    ...     layer_stack=tr.LayerStack([tl.DenseReluDense(hidden_size=8)]),
    ...     d_model=8, input_vocab_size=16, output_vocab_size=16,
    ...     autoregressive=True, max_length=4)
    >>> estimator = Estimator(
    ...     "lm", model, None, tempfile.mkdtemp(), "batch:2", "batch:batch",
    ...     4, 4, mesh_impl="simd", mesh_devices=["cpu:0", "cpu:1"])
    >>> estimator.initialize()  # restore the latest checkpoint, else init
    >>> loop = ReplicatedTrainLoop(estimator, iterations_per_loop=2)
    >>> def input_fn(*_):
    ...   batch = {"targets": tf.ones([4, 4], tf.int32)}
    ...   return tf.data.Dataset.from_tensors(batch).repeat()
    >>> out = loop.run(loop.make_iterators(input_fn))  # 2 steps in one call
    >>> int(out["step"]), bool(np.isfinite(out["loss"]))
    (2, True)

  Args:
    estimator: the driver.Estimator (model, variables, global step).
    iterations_per_loop: steps per call of `run`.
    replica_hosts: the host device feeding each physical replica (default:
      replica_host_devices(mesh_impl, job)).
    job: the TPU workers' job name.
  """

  def __init__(
    self,
    estimator,
    iterations_per_loop: int = 1,
    replica_hosts: Optional[Sequence[str]] = None,
    job: Optional[str] = None,
  ):
    mesh_impl = estimator.mesh_impl
    if not isinstance(mesh_impl, simd_mesh_impl.SimdMeshImpl):
      raise ValueError(
        "ReplicatedTrainLoop needs an Estimator whose mesh_impl is a "
        f"SimdMeshImpl, got {type(mesh_impl).__name__}"
      )
    if int(iterations_per_loop) < 1:
      raise ValueError(
        f"iterations_per_loop must be >= 1, got {iterations_per_loop!r}"
      )
    self.estimator = estimator
    self.mesh_impl = mesh_impl
    self.iterations_per_loop = int(iterations_per_loop)
    self.on_tpu = mesh_impl.device_assignment is not None
    if replica_hosts is None:
      replica_hosts = replica_host_devices(mesh_impl, job)
    self.replica_hosts = list(replica_hosts)
    if len(self.replica_hosts) != mesh_impl.size:
      raise ValueError(
        f"{len(self.replica_hosts)} replica hosts given for a mesh of "
        f"{mesh_impl.size} processors"
      )
    self.hosts = _ordered_unique(self.replica_hosts)
    # Masters (and the global step) live on the first host's CPU.
    self.master_device = self.hosts[0]
    self.laid_out_variables = None  # set by the first trace of a step
    self._run = tf.function(self._loop, autograph=False)
    self._copy_fns = {}

  def make_iterators(
    self, input_fn: Callable[..., tf.data.Dataset], skip: int = 0
  ) -> list:
    """One iterator per host over that host's own input pipeline.

    Args:
      input_fn: returns the dataset of global batches. Called once per host,
        on that host's CPU, with a tf.distribute.InputContext if it takes an
        argument; every host must produce the same batches (each replica
        takes its slice of the global batch, as with the original's
        broadcast input).
      skip: the number of batches to skip first (data seen before a
        restart).

    Returns:
      the iterators, in the order of `self.hosts`.
    """
    takes_context = _takes_an_argument(input_fn)
    iterators = []
    for h, host in enumerate(self.hosts):
      with tf.device(host):
        if takes_context:
          context = tf.distribute.InputContext(
            num_input_pipelines=len(self.hosts),
            input_pipeline_id=h,
            num_replicas_in_sync=self.mesh_impl.size,
          )
          dataset = input_fn(context)
        else:
          dataset = input_fn()
        if skip:
          dataset = dataset.skip(skip)
        if tf.executing_eagerly():
          iterators.append(iter(dataset))
        else:  # a legacy graph (building the program without running it)
          iterators.append(tf.compat.v1.data.make_one_shot_iterator(dataset))
    return iterators

  def run(self, iterators: list, iterations: Optional[int] = None):
    """Runs `iterations` (default iterations_per_loop) steps; one call.

    Args:
      iterators: from make_iterators.
      iterations: the number of steps (a Python int).

    Returns:
      {"loss", "learning_rate"} of the last step, the new "step", "finite"
      (whether every step's loss and variables were finite) and the
      "diverged_step" and "diverged_loss" of the first non-finite step (-1
      and 0 if none).
    """
    return self._run(iterators, iterations or self.iterations_per_loop)

  def trace(self, iterators: list, iterations: Optional[int] = None):
    """Builds the loop without running it: creates every variable.

    Eagerly, traces the tf.function; in a legacy graph (e.g. to inspect the
    TPU program on a machine without TPU), adds the loop to that graph.

    Args:
      iterators: from make_iterators.
      iterations: the number of steps (a Python int).

    Returns:
      the concrete function, or in a legacy graph the loop's outputs.
    """
    iterations = iterations or self.iterations_per_loop
    if not tf.executing_eagerly():
      return self._loop(iterators, iterations)
    return self._run.get_concrete_function(iterators, iterations)

  # ------------------------------------------------------------ one step
  def replica_step(self, features: Dict[str, tf.Tensor]) -> List[tf.Tensor]:
    """One replica's training step: [loss, learning_rate, finite].

    The same function runs under tpu.replicate and mesh_impl.replicate.
    `finite` says whether the loss and this replica's slices after the
    step's updates are free of inf and nan (the Estimator's guard).

    Args:
      features: the global batch, {feature name: int tensor}.

    Returns:
      [loss, learning_rate, finite]: float32, float32 and bool scalars.
    """
    lowering, loss, updates, learning_rate = self.estimator.lower_train_step(
      features
    )
    laid_out = list(lowering.variables.values())
    if self.laid_out_variables is None:
      self.laid_out_variables = laid_out
    with tf.control_dependencies(updates):
      # This replica's slices, read after the updates.
      slices = [
        tf.convert_to_tensor(v.laid_out_tensor.one_slice) for v in laid_out
      ]
      finite = driver.all_finite([loss] + slices)
      return [tf.identity(loss), tf.identity(learning_rate), finite]

  def replicate_step(self, host_batches: Sequence[Dict]) -> list:
    """All replicas' step; each replica reads the batch of its own host.

    The replica program is traced once (see
    mesh_impl_choice.replicate_from_hosts): on TPU, replica r's input is the
    batch of the host owning its core; with the collective backend, each
    replica picks its host's batch by its pnum.

    Args:
      host_batches: the features of each host, in the order of `self.hosts`.

    Returns:
      [loss, learning_rate, finite] of each replica, in logical order.
    """
    return mesh_impl_choice.replicate_from_hosts(
      self.mesh_impl,
      self.replica_step,
      [[batch] for batch in host_batches],
      [self.hosts.index(h) for h in self.replica_hosts],
    )

  def _host_batches(self, iterators: list) -> List[Dict]:
    """Each host's next batch, read on that host (order of `self.hosts`)."""
    batches = []
    for host, iterator in zip(self.hosts, iterators):
      with tf.device(host):
        batches.append(driver.model_features(iterator.get_next()))
    return batches

  def _one_step(self, iterators: list, state: "_LoopState") -> "_LoopState":
    """One step of every replica; the state after it."""
    outputs = self.replicate_step(self._host_batches(iterators))
    loss, learning_rate = outputs[0][0], outputs[0][1]
    finite = tf.reduce_all(tf.stack([replica[2] for replica in outputs]))
    deps = [t for replica in outputs for t in replica]
    with tf.control_dependencies(deps):
      step = self.estimator.global_step.assign_add(1)
    first_bad = state.finite & tf.logical_not(finite)
    return _LoopState(
      loss,
      learning_rate,
      step,
      state.finite & finite,
      tf.where(first_bad, step, state.diverged_step),
      tf.where(first_bad, loss, state.diverged_loss),
    )

  def _loop(self, iterators: list, iterations: int):
    step_dtype = self.estimator.global_step.dtype
    with tf.device(self.master_device):
      zero = tf.constant(0.0)
      state = _LoopState(
        zero,
        zero,
        tf.constant(0, step_dtype),
        tf.constant(True),
        tf.constant(-1, step_dtype),
        zero,
      )
      if not self.on_tpu or iterations == 1:
        # Unrolled: the collective backend cannot run in a while loop. A
        # non-finite step does not stop the loop's later steps (nothing of
        # them is saved: the host raises).
        for _ in range(iterations):
          state = self._one_step(iterators, state)
      else:
        # Stops after the first non-finite step.
        def body(i, *state):
          return (i + 1,) + tuple(self._one_step(iterators, _LoopState(*state)))

        state = _LoopState(
          *tf.while_loop(
            lambda i, *state: (i < iterations) & _LoopState(*state).finite,
            body,
            (tf.constant(0),) + tuple(state),
          )[1:]
        )
    return state._asdict()

  # ------------------------------------------------- masters <-> slices
  def copy(self, what: str) -> None:
    """Runs copy_master_to_slices or copy_slices_to_master of every variable.

    Args:
      what: "copy_master_to_slices" or "copy_slices_to_master".
    """
    with tf.device(self.master_device):
      driver.copy_laid_out_variables(
        self.laid_out_variables, what, self._copy_fns
      )


class _LoopState(NamedTuple):
  """What the step loop carries from step to step and returns.

  Attributes:
    loss: the last step's loss.
    learning_rate: the last step's learning rate.
    step: the global step after the last step.
    finite: whether every step so far was finite (loss and every replica's
      variables).
    diverged_step: the global step of the first non-finite step (-1: none).
    diverged_loss: that step's loss.
  """

  loss: tf.Tensor
  learning_rate: tf.Tensor
  step: tf.Tensor
  finite: tf.Tensor
  diverged_step: tf.Tensor
  diverged_loss: tf.Tensor


def _takes_an_argument(fn: Callable) -> bool:
  try:
    params = inspect.signature(fn).parameters.values()
  except (TypeError, ValueError):
    return False
  return any(
    p.default is p.empty
    and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    for p in params
  )


def train(
  estimator,
  input_fn: Callable[..., tf.data.Dataset],
  max_steps: int,
  iterations_per_loop: int = 100,
  *,
  replica_hosts: Optional[Sequence[str]] = None,
  job: Optional[str] = None,
  skip_seen_data: bool = False,
  seen_data_init_step: int = 0,
) -> Dict[str, float]:
  """Trains `estimator` (SimdMeshImpl) to max_steps, iterations_per_loop
  steps per host call; resumes from model_dir and checkpoints like
  Estimator.train.

  Checkpoints are written when a loop crosses a multiple of
  save_checkpoints_steps (loops are not split for them, as with
  TPUEstimator) and at the end.

  Args:
    estimator: the driver.Estimator, its mesh_impl a SimdMeshImpl.
    input_fn: the dataset of global training batches (see
      ReplicatedTrainLoop.make_iterators).
    max_steps: the global step to stop at.
    iterations_per_loop: steps per host call (the last loop may be shorter).
    replica_hosts: see ReplicatedTrainLoop.
    job: the TPU workers' job name.
    skip_seen_data: skip the batches the steps since seen_data_init_step
      consumed, so a resumed run sees new data.
    seen_data_init_step: the step from which the consumed data is counted.

  Returns:
    {"loss", "learning_rate", "step"} of the last step.

  Raises:
    FloatingPointError: if a step's loss or updated variables are not finite
      (before any checkpoint of them is written).
  """
  tf.io.gfile.makedirs(estimator.model_dir)
  loop = ReplicatedTrainLoop(
    estimator, iterations_per_loop, replica_hosts=replica_hosts, job=job
  )
  iterators = loop.make_iterators(input_fn)
  loop.trace(iterators)
  with tf.io.gfile.GFile(
    os.path.join(estimator.model_dir, "operative_config.gin"), "w"
  ) as f:
    f.write(gin.operative_config_str())
  estimator.initialize()
  loop.copy("copy_master_to_slices")
  step = int(estimator.global_step.numpy())
  result = {"step": step}
  if step >= max_steps:
    logging.info("Global step %d >= train steps %d", step, max_steps)
    return result
  if skip_seen_data and step > seen_data_init_step:
    iterators = loop.make_iterators(input_fn, skip=step - seen_data_init_step)
  writer = tf.summary.create_file_writer(estimator.model_dir)
  save_every = estimator.save_checkpoints_steps
  while step < max_steps:
    out = loop.run(iterators, min(iterations_per_loop, max_steps - step))
    previous, step = step, int(out["step"].numpy())
    result = {
      "loss": float(out["loss"].numpy()),
      "learning_rate": float(out["learning_rate"].numpy()),
      "step": step,
    }
    if not out["finite"].numpy():
      # Named by their checkpoint names in the masters, which then refuse
      # to be saved (checkpoints.save), as in Estimator.train.
      loop.copy("copy_slices_to_master")
      raise estimator.non_finite_error(
        int(out["diverged_step"].numpy()),
        float(out["diverged_loss"].numpy()),
      )
    logging.info(
      "step %d/%d  loss %.4f  lr %.3g",
      step,
      max_steps,
      result["loss"],
      result["learning_rate"],
    )
    driver.write_scalars(
      writer,
      step,
      {"loss": result["loss"], "learning_rate": result["learning_rate"]},
    )
    crossed = save_every and step // save_every > previous // save_every
    if crossed or step >= max_steps:
      loop.copy("copy_slices_to_master")
      estimator.save()
  writer.close()
  return result


class TpuSetup(NamedTuple):
  """A connected, initialised TPU and the mesh's place on it.

  Attributes:
    tpu: the TPU's name or address.
    resolver: its TPUClusterResolver.
    plan: the TpuMeshPlan of the mesh.
    job: the job name of the TPU hosts' devices (None on a TPU VM's own
      chips).
  """

  tpu: str
  resolver: Any
  plan: TpuMeshPlan
  job: Optional[str]

  @property
  def mesh_devices(self) -> List[str]:
    """The TPU core of each physical processor."""
    return [
      self.plan.device_assignment.tpu_device(replica=r, job=self.job)
      for r in range(self.plan.mesh_shape.size)
    ]


def setup_tpu(
  tpu: str,
  tpu_zone: Optional[str],
  gcp_project: Optional[str],
  tpu_job_name: Optional[str],
  mesh_shape,
  hierarchical_tiling_spec=None,
) -> TpuSetup:
  """Resolves, connects and initialises the TPU; maps the mesh onto it.

  Args:
    tpu: the TPU's name, "local" or a grpc:// address.
    tpu_zone: the zone of a named TPU.
    gcp_project: the project of a named TPU.
    tpu_job_name: the job name of the TPU workers (None: "worker").
    mesh_shape: the mtf mesh shape.
    hierarchical_tiling_spec: optional; see plan_mesh.

  Returns:
    a TpuSetup.

  Raises:
    TpuConnectionError: if the TPU cannot be reached or initialised.
    ValueError: if the mesh does not fit the TPU.
  """
  resolver = resolve_tpu(tpu, tpu_zone, gcp_project, tpu_job_name)
  topology = initialize_tpu(resolver, tpu)
  plan = plan_mesh(mesh_shape, topology, hierarchical_tiling_spec, tpu_name=tpu)
  job = resolver.get_job_name() if resolver.master() else None
  return TpuSetup(tpu, resolver, plan, job)


class TpuEstimator:
  """An Estimator whose programs run on the TPU of a TpuSetup.

  Its mesh_impl becomes SimdMeshImpl's TPU backend (as placed by the plan,
  re-planned with the estimator's hierarchical_tiling_spec if it has one)
  and `train` runs `iterations_per_loop` steps per host call (`train`
  above); evaluation, scoring and decoding run `iterations_per_loop`
  batches per host call (`batches_per_call`, see
  evaluation.batch_loop_graph). Their programs are lowered by
  `lower_on_mesh`, under tf.compat.v1.tpu.replicate, each host feeding its
  own replicas. Every other attribute is the wrapped Estimator's.

  Args:
    estimator: the driver.Estimator.
    setup: from setup_tpu.
    iterations_per_loop: training steps (and evaluation, scoring and
      decoding batches) per host call.
    replica_hosts: the host device feeding each physical replica (default:
      replica_host_devices(mesh_impl, setup.job)).
  """

  def __init__(
    self,
    estimator,
    setup: TpuSetup,
    iterations_per_loop: int,
    *,
    replica_hosts: Optional[Sequence[str]] = None,
  ):
    spec = estimator.hierarchical_tiling_spec
    if spec is not None:
      setup = setup._replace(
        plan=plan_mesh(
          setup.plan.mesh_shape, setup.plan.topology, spec, tpu_name=setup.tpu
        )
      )
    estimator.mesh_impl = tpu_mesh_impl(setup.plan, estimator.layout_rules)
    self.estimator = estimator
    self.setup = setup
    self.iterations_per_loop = int(iterations_per_loop)
    if replica_hosts is None:
      replica_hosts = replica_host_devices(estimator.mesh_impl, setup.job)
    self.replica_hosts = list(replica_hosts)

  def __getattr__(self, name: str):
    return getattr(self.estimator, name)

  @property
  def batches_per_call(self) -> int:
    """Evaluation, scoring and decoding batches per host call.

    iterations_per_loop, as TPUEstimator's evaluation loop ran (its
    prediction loop ran on until the input ended; the outputs are the same).
    """
    return self.iterations_per_loop

  def lower_on_mesh(self, build: Callable, *args):
    """build(*args) on the TPU's replicas, each host feeding its own.

    See mesh_impl_choice.lower_on_mesh: the tensors among args are copied
    once to each host of `replica_hosts`, and each replica reads its host's
    copy.

    Args:
      build: a function lowering an mtf graph on the mesh_impl.
      *args: passed to build.

    Returns:
      What build returns (logical processor 0's replica's tensors).
    """
    return mesh_impl_choice.lower_on_mesh(
      self.mesh_impl, build, *args, replica_hosts=self.replica_hosts
    )

  def train(
    self,
    input_fn: Callable[..., tf.data.Dataset],
    max_steps: int,
    *,
    skip_seen_data: bool = False,
    seen_data_init_step: int = 0,
  ) -> Dict[str, float]:
    """Trains on the TPU; the arguments are those of Estimator.train.

    Args:
      input_fn: the dataset of global training batches.
      max_steps: the global step to stop at.
      skip_seen_data: skip the batches consumed since seen_data_init_step.
      seen_data_init_step: the step from which consumed data is counted.

    Returns:
      {"loss", "learning_rate", "step"} of the last step.
    """
    return train(
      self.estimator,
      input_fn,
      max_steps,
      self.iterations_per_loop,
      replica_hosts=self.replica_hosts,
      job=self.setup.job,
      skip_seen_data=skip_seen_data,
      seen_data_init_step=seen_data_init_step,
    )
