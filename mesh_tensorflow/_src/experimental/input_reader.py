"""Input pipelines that give every mesh processor its slices of a batch.

PlacementMeshImplInputReader batches a dataset and cuts each batch into the
per-processor slices of a PlacementMeshImpl. SimdMeshImplInputReader serves
a SimdMeshImpl, whose processors each run their own copy of the program:
the global batch is read as sub-batches (one dataset per group of
processors sharing batch rows, placed on the host that feeds most of
them), and each processor receives only its slices.

Where the slices go depends on the SimdMeshImpl's backend:

- collective backend (CPU/GPU devices; runs here): inside
  `mesh_impl.replicate(computation)`, `reader.dequeue()` returns the calling
  replica's slices of the current step. The sub-batches are read once per
  step (the first replica to dequeue in a graph reads them; the others take
  their slices of the same batch).
- TPU backend (a `device_assignment`): as in mesh_tensorflow 0.1.21, an
  `InfeedQueue` whose enqueue ops a thread runs (`start_infeed_thread`) while
  `tf.compat.v1.tpu.replicate(..., infeed_queue=reader.infeed_queue)` runs the
  step. These graphs can be built without a TPU (the tests build them from a
  synthetic topology) but were never run here.

Datasets yield single examples (no batch dimension); each input's mtf Shape
begins with the same batch dimension.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple
import weakref

from absl import logging
import numpy as np
import tensorflow as tf

from mesh_tensorflow._src.shapes import Shape
from mesh_tensorflow._src.shapes import convert_to_shape

__all__ = [
  "PlacementMeshImplInputReader",
  "ProcessDevices",
  "SimdMeshImplInputReader",
  "SubBatchSlicer",
]

DatasetCreator = Callable[[], tf.data.Dataset]


def _host_device_to_id(device: str) -> int:
  """The task number of a device name ("/job:w/task:3/device:CPU:0" -> 3)."""
  task = tf.DeviceSpec.from_string(device).task
  return 0 if task is None else int(task)


def _host_id_to_tf_device(host_id: int, external_worker: bool) -> str:
  """The CPU device of TPU host `host_id` (job tpu_worker if external)."""
  if external_worker:
    return "/job:tpu_worker/task:%d/device:CPU:0" % host_id
  return "/task:%d/device:CPU:0" % host_id


def _host_of(device: str) -> str:
  """The CPU:0 device of the job and task of `device`."""
  spec = tf.DeviceSpec.from_string(device)
  return (
    tf.DeviceSpec(
      job=spec.job, replica=spec.replica, task=spec.task, device_type="CPU"
    )
    .replace(device_index=0)
    .to_string()
  )


def _on_tpu(simd_mesh_impl) -> bool:
  return simd_mesh_impl.device_assignment is not None


def _host_device(simd_mesh_impl, host_id: int, external_worker: bool) -> str:
  """The device where host `host_id` reads its datasets."""
  if _on_tpu(simd_mesh_impl):
    return _host_id_to_tf_device(host_id, external_worker)
  return ProcessDevices(simd_mesh_impl).host_devices[host_id]


def _make_iterator(dataset: tf.data.Dataset):
  """An eager (owned) iterator under TF2 behaviour, else an initializable one."""
  if tf.compat.v1.executing_eagerly_outside_functions():
    with tf.init_scope():
      return iter(dataset)
  return tf.compat.v1.data.make_initializable_iterator(dataset)


def _initializer(iterator):
  return getattr(iterator, "initializer", None)


def _as_list(tensors) -> list:
  if isinstance(tensors, (tuple, list)):
    return list(tensors)
  return [tensors]


def _check_input_shapes(mtf_input_shapes) -> List[Shape]:
  if not isinstance(mtf_input_shapes, list) or not mtf_input_shapes:
    raise ValueError(
      "mtf_input_shapes must be a non-empty list of mtf Shapes, got %r"
      % (mtf_input_shapes,)
    )
  shapes = [convert_to_shape(s) for s in mtf_input_shapes]
  batch_dim = shapes[0].dims[0]
  for shape in shapes[1:]:
    if shape.dims[0].size != batch_dim.size:
      raise ValueError(
        "every input shape must begin with the batch dimension %s; got %s"
        % (batch_dim, shape)
      )
  return shapes


class SubBatchSlicer:
  """Reads one sub-batch on a host and cuts it into processors' slices.

  Args:
    sub_batch_ds_creator: a function returning the batched dataset of this
      sub-batch.
    host_id: the host reading it.
    all_sub_batch_pnums: for each input, the logical pnums receiving slices
      of this sub-batch.
    simd_mesh_impl: the SimdMeshImpl.
    mtf_input_shapes: the mtf Shape of each input (of the global batch).
    external_worker: TPU only: the host is a task of job "tpu_worker".
    global_batch: the dataset yields the global batch (eval mode), not a
      sub-batch: slices keep their batch offsets.
  """

  def __init__(
    self,
    sub_batch_ds_creator: DatasetCreator,
    host_id: int,
    all_sub_batch_pnums: List[List[int]],
    simd_mesh_impl,
    mtf_input_shapes: List[Shape],
    external_worker: bool,
    global_batch: bool,
  ):
    if not isinstance(all_sub_batch_pnums, list) or not all_sub_batch_pnums:
      raise ValueError(
        "all_sub_batch_pnums must be a non-empty list (one list of pnums "
        "per input), got %r" % (all_sub_batch_pnums,)
      )
    if len(all_sub_batch_pnums) != len(mtf_input_shapes):
      raise ValueError(
        "%d lists of pnums for %d input shapes"
        % (len(all_sub_batch_pnums), len(mtf_input_shapes))
      )
    self._host_id = host_id
    self._all_sub_batch_pnums = all_sub_batch_pnums
    self._simd_mesh_impl = simd_mesh_impl
    self._mtf_input_shapes = [convert_to_shape(s) for s in mtf_input_shapes]
    self._global_batch = global_batch
    self._device = _host_device(simd_mesh_impl, host_id, external_worker)
    with tf.device(self._device):
      self._ds_iterator = _make_iterator(sub_batch_ds_creator())

  @property
  def initializer(self) -> Optional[tf.Operation]:
    """The iterator's initializer (a v1 graph op), or None under TF2."""
    return _initializer(self._ds_iterator)

  def get_slices(self) -> Iterator[Tuple[tf.Tensor, int, int]]:
    """Reads the next sub-batch and yields the slice of each processor.

    Yields:
      (slice, pnum, input_i): the tf.Tensor slice of input number input_i
      that logical processor pnum receives.

    Raises:
      ValueError: if the dataset yields another number of tensors than there
        are input shapes.
    """
    mesh_impl = self._simd_mesh_impl
    with tf.device(self._device):
      inputs = _as_list(self._ds_iterator.get_next())
      if len(inputs) != len(self._mtf_input_shapes):
        raise ValueError(
          "the dataset yields %d tensors but %d input shapes were given"
          % (len(inputs), len(self._mtf_input_shapes))
        )
      for input_i, (tensor, shape, pnums) in enumerate(
        zip(inputs, self._mtf_input_shapes, self._all_sub_batch_pnums)
      ):
        slice_shape = mesh_impl.slice_shape(shape)
        by_begin: Dict[Tuple[int, ...], tf.Tensor] = {}
        for pnum in pnums:
          begin = list(mesh_impl.slice_begin(shape, pnum))
          if not self._global_batch:
            begin[0] = 0  # the tensor holds this sub-batch only
          key = tuple(begin)
          if key not in by_begin:
            by_begin[key] = tf.slice(tensor, begin, slice_shape)
          yield by_begin[key], pnum, input_i


class ProcessDevices:
  """The devices, hosts and host ids of a SimdMeshImpl's processors.

  Lists are indexed by logical pnum. On the TPU backend they come from the
  device assignment (cores, their hosts' CPUs); on the collective backend
  from the mesh's devices (a device's host is the CPU:0 of its job and task;
  hosts are numbered in the order of their first processor).

  Args:
    simd_mesh_impl: a SimdMeshImpl.

  Raises:
    ValueError: if the hosts hold different numbers of processors.
  """

  def __init__(self, simd_mesh_impl) -> None:
    self._num_cores = simd_mesh_impl.size
    self._ordered_ordinals = []
    self._ordered_tpus = []
    self._ordered_hosts = []
    self._ordered_host_ids = []
    self._host_id_to_its_pnums = collections.defaultdict(list)
    assignment = simd_mesh_impl.device_assignment
    host_ids: Dict[str, int] = {}
    for pnum in range(self._num_cores):
      physical = simd_mesh_impl.l2p(pnum)
      if assignment is not None:
        ordinal = assignment.tpu_ordinal(replica=physical, logical_core=0)
        device = assignment.tpu_device(replica=physical)
        host = assignment.host_device(replica=physical)
        host_id = _host_device_to_id(host)
      else:
        device = simd_mesh_impl.devices[physical]
        host = _host_of(device)
        host_id = host_ids.setdefault(host, len(host_ids))
        ordinal = tf.DeviceSpec.from_string(device).device_index or 0
      self._ordered_ordinals.append(ordinal)
      self._ordered_tpus.append(device)
      self._ordered_hosts.append(host)
      self._ordered_host_ids.append(host_id)
      self._host_id_to_its_pnums[host_id].append(pnum)
    self._num_hosts = len(set(self._ordered_hosts))
    self._num_cores_per_host = self._num_cores // self._num_hosts
    if self._num_cores != self._num_hosts * self._num_cores_per_host:
      raise ValueError(
        "%d processors do not divide evenly over %d hosts: %s"
        % (self._num_cores, self._num_hosts, dict(self._host_id_to_its_pnums))
      )
    hosts = {}
    for host, host_id in zip(self._ordered_hosts, self._ordered_host_ids):
      hosts[host_id] = host
    self._host_devices = [hosts[i] for i in sorted(hosts)]
    logging.info(
      "ProcessDevices ordinals %s, devices %s, hosts %s, pnums by host %s",
      self._ordered_ordinals,
      self._ordered_tpus,
      self._ordered_hosts,
      dict(self._host_id_to_its_pnums),
    )

  @property
  def ordered_ordinals(self) -> List[int]:
    """The device ordinal (within its host) of each processor."""
    return self._ordered_ordinals

  @property
  def ordered_tpus(self) -> List[str]:
    """The device of each processor (a TPU core, or a CPU/GPU device)."""
    return self._ordered_tpus

  @property
  def ordered_hosts(self) -> List[str]:
    """The host CPU device of each processor."""
    return self._ordered_hosts

  @property
  def ordered_host_ids(self) -> List[int]:
    """The host id of each processor."""
    return self._ordered_host_ids

  @property
  def host_id_to_its_pnums(self) -> Dict[int, List[int]]:
    """The logical pnums of each host id."""
    return self._host_id_to_its_pnums

  @property
  def host_devices(self) -> List[str]:
    """The CPU device of each host, by host id."""
    return self._host_devices

  @property
  def num_cores(self) -> int:
    """The number of processors."""
    return self._num_cores

  @property
  def num_hosts(self) -> int:
    """The number of hosts."""
    return self._num_hosts

  @property
  def num_cores_per_host(self) -> int:
    """The number of processors of each host."""
    return self._num_cores_per_host


class _StepInputs:
  """The slices read for successive steps in one graph, per logical pnum."""

  def __init__(self):
    self.steps: List[List[List[tf.Tensor]]] = []
    self.dequeued = collections.Counter()


class SimdMeshImplInputReader:
  """The input pipeline of a SimdMeshImpl (see the module docstring).

  Args:
    simd_mesh_impl: a SimdMeshImpl.
    ds_creator: a function returning a tf.data.Dataset of single examples:
      one tensor per input (a tensor or a tuple).
    mtf_input_shapes: a list of the mtf Shapes of the inputs (global batch);
      all begin with the same batch dimension. Reading is planned after the
      first shape: put the largest input first.
    ds_prefetch_size: the prefetch buffer of each sub-batch dataset.
    external_worker: TPU only: the hosts are tasks of job "tpu_worker" (a
      Cloud TPU); False for a local TPU system.
    is_eval_mode: read the global batch from one dataset (on the last host),
      so that every example is read once; otherwise each sub-batch has a
      dataset of its own (ds_creator is called once per sub-batch).

  Raises:
    ValueError: for an empty or inconsistent mtf_input_shapes.
  """

  def __init__(
    self,
    simd_mesh_impl,
    ds_creator: DatasetCreator,
    mtf_input_shapes: List[Shape],
    ds_prefetch_size: int = tf.data.experimental.AUTOTUNE,
    external_worker: bool = True,
    is_eval_mode: bool = False,
  ):
    self._mtf_input_shapes = _check_input_shapes(mtf_input_shapes)
    self._simd_mesh_impl = simd_mesh_impl
    self._p_dev = ProcessDevices(simd_mesh_impl)
    self._ds_creator = ds_creator
    self._ds_prefetch_size = ds_prefetch_size
    self._external_worker = external_worker
    self._is_eval_mode = is_eval_mode
    self._infeed_queue = None
    self._enqueue_ops = None
    self._infeed_thread = None
    self._graph_steps = weakref.WeakKeyDictionary()
    self._make_slicers()
    if _on_tpu(simd_mesh_impl):
      self._make_infeed_queue()

  # -------------------------------------------------------------- planning
  def _pnum_map(self, shape: Shape) -> np.ndarray:
    """Logical pnums by slice coordinates, then by replica of the slice.

    Element [c_0, ..., c_k, r] is the r-th processor holding the slice at
    block coordinates (c_0, ..., c_k) of the tensor.
    """
    mesh_impl = self._simd_mesh_impl
    slice_shape = mesh_impl.slice_shape(shape)
    blocks = [size // s for size, s in zip(shape.to_integer_list, slice_shape)]
    replicas = self._p_dev.num_cores // int(np.prod(blocks))
    holders = collections.defaultdict(list)
    for pnum in range(self._p_dev.num_cores):
      begin = mesh_impl.slice_begin(shape, pnum)
      holders[tuple(b // s for b, s in zip(begin, slice_shape))].append(pnum)
    pnum_map = np.zeros(blocks + [replicas], dtype=np.int64)
    for coordinates, pnums in holders.items():
      pnum_map[coordinates] = pnums
    logging.info("MTF pnum_map of %s: %s", shape, pnum_map.tolist())
    return pnum_map

  def _hosts_to_hold_ds(self, pnum_map: np.ndarray) -> List[int]:
    """For each sub-batch, the host feeding most of its processors.

    Ties go to the host holding the fewest datasets so far, then to the
    lowest host id.
    """
    num_hosts = self._p_dev.num_hosts
    datasets_per_host = [0] * num_hosts
    hosts = []
    for sub_batch_pnums in pnum_map:
      pnums_per_host = [0] * num_hosts
      for pnum in sub_batch_pnums.flatten():
        pnums_per_host[self._p_dev.ordered_host_ids[pnum]] += 1
      host = max(
        range(num_hosts),
        key=lambda h: (pnums_per_host[h], -datasets_per_host[h]),
      )
      datasets_per_host[host] += 1
      hosts.append(host)
    return hosts

  def _make_slicers(self) -> None:
    pnum_maps = [self._pnum_map(shape) for shape in self._mtf_input_shapes]
    batch_size = self._mtf_input_shapes[0].dims[0].size
    if self._is_eval_mode:
      hosts = [self._p_dev.num_hosts - 1]
    else:
      hosts = self._hosts_to_hold_ds(pnum_maps[0])
    self._dataset_hosts = hosts
    sub_batch_size = batch_size // len(hosts)
    if sub_batch_size * len(hosts) != batch_size:
      raise ValueError(
        "batch size %d does not divide into %d sub-batches"
        % (batch_size, len(hosts))
      )
    logging.info("MTF sub_batch_size: %d", sub_batch_size)

    def sub_batch_ds_creator():
      return (
        self._ds_creator()
        .batch(sub_batch_size, drop_remainder=True)
        .prefetch(self._ds_prefetch_size)
      )

    self._slicers = []
    for sub_batch_i, host_id in enumerate(hosts):
      if self._is_eval_mode:
        pnums = [m.flatten().tolist() for m in pnum_maps]
      else:
        pnums = [m[sub_batch_i, ...].flatten().tolist() for m in pnum_maps]
      self._slicers.append(
        SubBatchSlicer(
          sub_batch_ds_creator,
          host_id,
          pnums,
          self._simd_mesh_impl,
          self._mtf_input_shapes,
          self._external_worker,
          global_batch=self._is_eval_mode,
        )
      )
    self._input_initializers = [
      s.initializer for s in self._slicers if s.initializer is not None
    ]

  def _read_step(self) -> List[List[tf.Tensor]]:
    """Reads one batch: the slices of every input, by logical pnum."""
    slices = [
      [None] * len(self._mtf_input_shapes) for _ in range(self._p_dev.num_cores)
    ]
    for slicer in self._slicers:
      for tensor, pnum, input_i in slicer.get_slices():
        slices[pnum][input_i] = tensor
    missing = [p for p, inputs in enumerate(slices) if None in inputs]
    if missing:
      raise ValueError("processors %s receive no input slices" % missing)
    return slices

  # ------------------------------------------------- collective backend
  def dequeue(self) -> List[tf.Tensor]:
    """The calling replica's input slices for one step (collective backend).

    Call it inside `simd_mesh_impl.replicate(computation)`, once per step in
    each replica's computation; wrap each slice in
    `simd_mesh_impl.LaidOutTensor([slice])` and import it with
    `mtf.import_laid_out_tensor`. A replica's n-th dequeue in a graph returns
    its slices of the n-th batch read in that graph.

    Returns:
      a list of tf.Tensors, one slice per input.

    Raises:
      ValueError: on the TPU backend (its replicas dequeue from
        `infeed_queue`) or outside `replicate`.
    """
    if _on_tpu(self._simd_mesh_impl):
      raise ValueError(
        "on the TPU backend the replicas read infeed_queue (pass it to "
        "tf.compat.v1.tpu.replicate); dequeue() serves the collective backend"
      )
    physical = self._simd_mesh_impl.backend.current_replica()
    if physical is None:
      raise ValueError(
        "dequeue() needs a replica: call it inside "
        "simd_mesh_impl.replicate(computation)"
      )
    pnum = self._simd_mesh_impl.p2l(physical)
    graph = tf.compat.v1.get_default_graph()
    steps = self._graph_steps.setdefault(graph, _StepInputs())
    step = steps.dequeued[pnum]
    steps.dequeued[pnum] += 1
    if step == len(steps.steps):
      steps.steps.append(self._read_step())
    return list(steps.steps[step][pnum])

  # ---------------------------------------------------------- TPU backend
  def _make_infeed_queue(self) -> None:
    """Builds the InfeedQueue and the enqueue ops of every processor."""
    from tensorflow.python.tpu import tpu_feed  # pylint: disable=g-import-not-at-top,g-direct-tensorflow-import

    all_slices = self._read_step()
    first = all_slices[0]
    device = _host_id_to_tf_device(
      self._dataset_hosts[0], self._external_worker
    )
    with tf.device(device):
      self._infeed_queue = tpu_feed.InfeedQueue(
        number_of_tuple_elements=len(first),
        tuple_types=[t.dtype for t in first],
        tuple_shapes=[t.shape for t in first],
      )
      self._enqueue_ops = self._infeed_queue.generate_enqueue_ops(
        all_slices,
        tpu_ordinal_function=lambda pnum: self._p_dev.ordered_ordinals[pnum],
        placement_function=lambda pnum: self._p_dev.ordered_hosts[pnum],
      )

  @property
  def infeed_queue(self) -> Any:
    """The TPU InfeedQueue the replicated computation dequeues from.

    Raises:
      ValueError: on the collective backend (use dequeue()).
    """
    if self._infeed_queue is None:
      raise ValueError(
        "infeed_queue exists on the TPU backend only; on the collective "
        "backend call dequeue() inside simd_mesh_impl.replicate"
      )
    return self._infeed_queue

  @property
  def enqueue_ops(self) -> list:
    """TPU backend: the ops enqueueing one batch (run once per step)."""
    return list(self._enqueue_ops or [])

  def start_infeed_thread(
    self, sess, number_steps: int = -1, initial_wait_sec: float = 0.5
  ) -> None:
    """Initializes the datasets; on TPU, starts enqueueing in a thread.

    On the collective backend the steps read their batches themselves
    (dequeue()), so this only runs the iterators' initializers in a v1
    graph (nothing under TF2 behaviour, where sess may be None).

    Args:
      sess: a tf.compat.v1.Session (or None under TF2 behaviour).
      number_steps: TPU: the number of batches to enqueue; -1 forever.
      initial_wait_sec: TPU: seconds to wait before enqueueing.
    """
    if self._input_initializers:
      sess.run(self._input_initializers)
    if self._enqueue_ops is None:
      return

    def enqueue():
      time.sleep(initial_wait_sec)
      step = 0
      while number_steps <= 0 or step < number_steps:
        sess.run(self._enqueue_ops)
        step += 1

    self._infeed_thread = threading.Thread(target=enqueue, daemon=True)
    self._infeed_thread.start()


class PlacementMeshImplInputReader:
  """The input pipeline of a PlacementMeshImpl.

  Batches the dataset to the global batch size and cuts each batch into the
  processors' slices.

  Args:
    placement_mesh_impl: a PlacementMeshImpl.
    ds_creator: a function returning a tf.data.Dataset of single examples,
      one tensor per input (usually (image, label)).
    mtf_input_shapes: the mtf Shape of each input; the first dimension of
      the first is the batch.
    ds_prefetch_size: the prefetch buffer.
    is_eval_mode: keep the last, partial batch (otherwise dropped).
  """

  def __init__(
    self,
    placement_mesh_impl,
    ds_creator: DatasetCreator,
    mtf_input_shapes: List[Shape],
    ds_prefetch_size: int = tf.data.experimental.AUTOTUNE,
    is_eval_mode: bool = False,
  ):
    self._placement_mesh_impl = placement_mesh_impl
    self._mtf_input_shapes = _check_input_shapes(mtf_input_shapes)
    batch_size = self._mtf_input_shapes[0].dims[0].size
    dataset = (
      ds_creator()
      .batch(batch_size, drop_remainder=not is_eval_mode)
      .prefetch(ds_prefetch_size)
    )
    self._ds_iterator = _make_iterator(dataset)
    initializer = _initializer(self._ds_iterator)
    self._input_initializers = [] if initializer is None else [initializer]

  def initialize(self, sess) -> None:
    """Initializes the iterator in a v1 graph (nothing under TF2 behaviour).

    Args:
      sess: a tf.compat.v1.Session (or None under TF2 behaviour).
    """
    if self._input_initializers:
      sess.run(self._input_initializers)

  def gpu_placement(self, model_fn: Callable):
    """Reads a batch and calls model_fn with each input's slices.

    Args:
      model_fn: called as model_fn(slices_0, slices_1, ...), one list of
        per-processor tf.Tensors (by pnum) per input; usually (image, label).

    Returns:
      what model_fn returns.
    """
    inputs = _as_list(self._ds_iterator.get_next())
    laid_out = [
      self._placement_mesh_impl.make_slices(tensor, shape)
      for tensor, shape in zip(inputs, self._mtf_input_shapes)
    ]
    return model_fn(*laid_out)
