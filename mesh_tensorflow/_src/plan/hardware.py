"""Hardware profiles for step-time estimates: peak FLOPs, memory, links.

A profile describes one device of a mesh (a TPU core or chip, a GPU, or a
virtual CPU device of this machine): its peak matmul throughput, its memory
and memory bandwidth, the bandwidth of its links to other devices, and how
many such devices a system can have. The published profiles use the vendors'
figures (dense matmul peaks, no sparsity); `this_machine` is measured, once
per process, by a short probe (a matmul, a memory copy, a chain of tiny ops).
"""

from __future__ import annotations

import collections.abc
import dataclasses
import os
import time
from typing import Dict, Iterator, Optional

GIB = 2**30


@dataclasses.dataclass(frozen=True)
class HardwareProfile:
  """One device kind: what the planner needs to estimate a step time.

  Example:
    >>> v3 = HARDWARE_PROFILES["tpu_v3"]
    >>> v3.peak_flops("bfloat16") / 1e12
    61.5
    >>> v3.hbm_bytes // GIB
    16

  Attributes:
    name: the key of the profile in HARDWARE_PROFILES.
    description: what the device is.
    peak_flops_bf16: dense bfloat16 matmul peak of one device (FLOP/s).
    peak_flops_f32: float32 matmul peak of one device (FLOP/s).
    hbm_bytes: memory of one device.
    hbm_bandwidth: memory bandwidth of one device (bytes/s).
    link_bandwidth: bytes/s one device sends to the others in a collective.
    max_devices: the most devices one system of this kind has (a TPU pod, an
      NVLink domain, or the virtual devices of this machine).
    shared_compute: True when the mesh's devices share one machine's cores
      and memory (virtual CPU devices): their work adds up instead of
      running in parallel.
    op_overhead_seconds: fixed cost of launching one TF op.
  """

  name: str
  description: str
  peak_flops_bf16: float
  peak_flops_f32: float
  hbm_bytes: int
  hbm_bandwidth: float
  link_bandwidth: float
  max_devices: int
  shared_compute: bool = False
  op_overhead_seconds: float = 0.0

  def peak_flops(self, dtype: str) -> float:
    """Matmul peak (FLOP/s) of one device for values of `dtype`.

    Args:
      dtype: a dtype name such as "bfloat16" or "float32".

    Returns:
      the bfloat16 peak for bfloat16 and float16, else the float32 one.
    """
    if dtype in ("bfloat16", "float16"):
      return self.peak_flops_bf16
    return self.peak_flops_f32

  def check_num_devices(self, num_devices: int, mesh_shape: str) -> None:
    """Raises ValueError if a mesh has more devices than this hardware.

    Args:
      num_devices: the number of processors of the mesh.
      mesh_shape: the mesh, for the message.

    Raises:
      ValueError: if num_devices exceeds max_devices.
    """
    if num_devices > self.max_devices:
      raise ValueError(
        "mesh %r has %d devices but hardware profile %r (%s) has at most %d; "
        "pick a smaller mesh or a profile with more devices "
        "(dataclasses.replace(profile, max_devices=...))"
        % (
          mesh_shape,
          num_devices,
          self.name,
          self.description,
          self.max_devices,
        )
      )


def _tpu(
  name: str,
  device: str,
  pod_size: int,
  peak_flops_bf16: float,
  hbm_gib: int,
  hbm_bandwidth: float,
  link_bandwidth: float,
) -> HardwareProfile:
  """A TPU device of a pod; float32 matmuls run at a quarter of the peak."""
  return HardwareProfile(
    name=name,
    description="%s (a pod has %d)" % (device, pod_size),
    peak_flops_bf16=peak_flops_bf16,
    peak_flops_f32=peak_flops_bf16 / 4,
    hbm_bytes=hbm_gib * GIB,
    hbm_bandwidth=hbm_bandwidth,
    link_bandwidth=link_bandwidth,
    max_devices=pod_size,
  )


def _nvlink_gpu(
  name: str,
  device: str,
  peak_flops_bf16: float,
  peak_flops_f32: float,
  hbm_bandwidth: float,
  link_bandwidth: float,
) -> HardwareProfile:
  """An 80 GB NVIDIA GPU of a node of 8 joined by NVLink."""
  return HardwareProfile(
    name=name,
    description="NVIDIA %s (8 per NVLink node)" % device,
    peak_flops_bf16=peak_flops_bf16,
    peak_flops_f32=peak_flops_f32,
    hbm_bytes=80 * 10**9,
    hbm_bandwidth=hbm_bandwidth,
    link_bandwidth=link_bandwidth,
    max_devices=8,
  )


# The vendors' figures, in the helpers' argument order: TPUs (name, device,
# pod size, bfloat16 peak, HBM GiB, HBM bytes/s, link bytes/s) and GPUs
# (name, device, bfloat16 peak, float32 peak, HBM bytes/s, link bytes/s).
_PUBLISHED = (
  _tpu("tpu_v2", "TPU v2 core", 512, 22.5e12, 8, 350e9, 62e9),
  _tpu("tpu_v3", "TPU v3 core", 2048, 61.5e12, 16, 450e9, 82e9),
  _tpu("tpu_v4", "TPU v4 chip, one TF device", 4096, 275e12, 32, 1200e9, 270e9),
  _nvlink_gpu("a100", "A100 80GB SXM", 312e12, 19.5e12, 2039e9, 300e9),
  _nvlink_gpu("h100", "H100 SXM", 989e12, 67e12, 3350e9, 450e9),
)

THIS_MACHINE = "this_machine"
# Virtual CPU devices of this machine a mesh may use.
_THIS_MACHINE_MAX_DEVICES = 64


def _best_seconds(fn, repeats: int) -> float:
  fn()  # Trace and warm up.
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    best = min(best, time.perf_counter() - start)
  return best


def measure_this_machine(matmul_size: int = 1024) -> HardwareProfile:
  """Measures this machine: matmul peaks, memory bandwidth, op overhead.

  Takes a second or two: a float32 and a bfloat16 matmul of
  matmul_size^2 matrices, a pass over a 64 MiB tensor, and a chain of 200
  tiny ops, each in a tf.function, best of a few runs. The mesh's devices
  are taken to be virtual CPU devices sharing this machine's cores and
  memory, which also carries the collectives (at memory bandwidth).

  Args:
    matmul_size: the side of the probe's square matrices.

  Returns:
    a HardwareProfile named "this_machine".
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  n = matmul_size
  peaks = {}
  for dtype in (tf.float32, tf.bfloat16):
    a = tf.random.uniform([n, n], dtype=tf.float32)
    a = tf.cast(a, dtype)
    matmul = tf.function(lambda a=a: tf.reduce_sum(tf.matmul(a, a)[:1, :1]))
    seconds = _best_seconds(lambda f=matmul: f().numpy(), 5)
    peaks[dtype.name] = 2 * n**3 / seconds
  elements = 16 * 2**20
  big = tf.random.uniform([elements])
  scale = tf.function(lambda: tf.reduce_sum((big * 1.5)[:1]))
  seconds = _best_seconds(lambda: scale().numpy(), 5)
  memory_bandwidth = 2 * 4 * elements / seconds
  num_ops = 200

  @tf.function
  def chain(x, y):
    for _ in range(num_ops):  # Dependent ops on inputs: nothing to fold.
      x = x * y
    return x

  small = tf.ones([4])
  op_seconds = _best_seconds(lambda: chain(small, small).numpy(), 5) / num_ops
  try:
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  except (ValueError, OSError, AttributeError):
    memory = 8 * GIB
  return HardwareProfile(
    name=THIS_MACHINE,
    description="this machine (%d CPUs), measured: virtual devices share it"
    % (os.cpu_count() or 1),
    peak_flops_bf16=peaks["bfloat16"],
    peak_flops_f32=peaks["float32"],
    hbm_bytes=memory,
    hbm_bandwidth=memory_bandwidth,
    link_bandwidth=memory_bandwidth,
    max_devices=_THIS_MACHINE_MAX_DEVICES,
    shared_compute=True,
    op_overhead_seconds=op_seconds,
  )


class HardwareProfiles(collections.abc.Mapping):
  """Name -> HardwareProfile; "this_machine" is measured on first access."""

  def __init__(self, profiles):
    self._profiles: Dict[str, Optional[HardwareProfile]] = {
      p.name: p for p in profiles
    }
    self._profiles[THIS_MACHINE] = None

  def __getitem__(self, name: str) -> HardwareProfile:
    if name not in self._profiles:
      raise KeyError(
        "unknown hardware profile %r; known profiles: %s"
        % (name, ", ".join(self._profiles))
      )
    if self._profiles[name] is None:
      self._profiles[name] = measure_this_machine()
    return self._profiles[name]

  def __iter__(self) -> Iterator[str]:
    return iter(self._profiles)

  def __len__(self) -> int:
    return len(self._profiles)


HARDWARE_PROFILES = HardwareProfiles(_PUBLISHED)


def get_hardware_profile(hardware) -> HardwareProfile:
  """A HardwareProfile from a profile or a profile name.

  Args:
    hardware: a HardwareProfile, or a key of HARDWARE_PROFILES.

  Returns:
    the HardwareProfile.

  Raises:
    ValueError: for an unknown name, listing the known ones.
  """
  if isinstance(hardware, HardwareProfile):
    return hardware
  try:
    return HARDWARE_PROFILES[hardware]
  except KeyError as e:
    raise ValueError(e.args[0]) from None
