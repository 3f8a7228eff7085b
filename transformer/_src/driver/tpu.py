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

Step 1 lives in tpu_connection.py, step 2 in tpu_mesh.py, steps 3 and 4 in
tpu_train_loop.py; this module holds step 5 and `setup_tpu`, which runs
steps 1 and 2 for `utils.run`.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence

import tensorflow as tf

from transformer._src.driver import mesh_impl_choice
from transformer._src.driver.tpu_connection import initialize_tpu
from transformer._src.driver.tpu_connection import resolve_tpu
from transformer._src.driver.tpu_mesh import TpuMeshPlan
from transformer._src.driver.tpu_mesh import plan_mesh
from transformer._src.driver.tpu_mesh import replica_host_devices
from transformer._src.driver.tpu_mesh import tpu_mesh_impl
from transformer._src.driver.tpu_train_loop import train

__all__ = [
  "TpuEstimator",
  "TpuSetup",
  "setup_tpu",
]


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
