"""Finding a Cloud TPU and connecting to it.

`resolve_tpu` builds a TPUClusterResolver for the name (or grpc:// address)
given as `tpu`, `tpu_zone`, `gcp_project`, `tpu_job_name` and checks that
its workers are reachable; `initialize_tpu` connects to the cluster and
initializes the TPU system, whose result is the TPU Topology. Every failure
is a `TpuConnectionError` naming the TPU. `synthetic_topology` makes a
Topology without a TPU, so the TPU graphs can be built (not run) on CPU.
Step 1 of the TPU driver (tpu.py).
"""

from __future__ import annotations

import itertools
import socket
from typing import List, Optional, Sequence
import urllib.parse

from absl import logging
import numpy as np
import tensorflow as tf

__all__ = [
  "TpuConnectionError",
  "initialize_tpu",
  "resolve_tpu",
  "synthetic_topology",
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
