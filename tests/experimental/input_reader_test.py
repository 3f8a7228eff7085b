"""Tests for mesh_tensorflow.experimental.input_reader on CPU meshes.

The readers deliver each processor exactly its slice of each global batch
(checked against numpy), batch after batch: PlacementMeshImplInputReader on
placement meshes, SimdMeshImplInputReader on the SIMD collective backend
(eager-built tf.functions and a v1 graph with a Session). The original's
own test (one dataset per sub-batch when training, one in eval mode) is
repeated on a 2-processor CPU mesh. The TPU path is built from synthetic
topologies and inspected (not run).
"""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.experimental import input_reader
from transformer._src.driver import tpu_connection

BATCH, IO = 4, 8
EXAMPLES = np.arange(8 * IO, dtype=np.float32).reshape(8, IO)
LABELS = -EXAMPLES[:, :2]
SHAPES = [mtf.Shape([mtf.Dimension("batch", BATCH), mtf.Dimension("io", IO)])]
LABEL_SHAPES = SHAPES + [
  mtf.Shape([mtf.Dimension("batch", BATCH), mtf.Dimension("label", 2)])
]


def ds_creator():
  return tf.data.Dataset.from_tensor_slices((EXAMPLES, LABELS)).repeat()


def images_only():
  return tf.data.Dataset.from_tensor_slices(EXAMPLES).repeat()


def expected_slice(array, mesh_impl, shape, pnum):
  begin = mesh_impl.slice_begin(shape, pnum)
  size = mesh_impl.slice_shape(shape)
  return array[tuple(slice(b, b + s) for b, s in zip(begin, size))]


def simd(mesh_shape, layout):
  size = mtf.convert_to_shape(mesh_shape).size
  return mtf.simd_mesh_impl.SimdMeshImpl(
    mesh_shape, layout, devices=["/cpu:%d" % i for i in range(size)]
  )


@pytest.mark.parametrize(
  "mesh_shape,layout",
  [("rows:2;cols:2", "batch:rows;io:cols"), ("all:4", "io:all"), ("", "")],
  ids=["2x2", "all4_io", "one"],
)
def test_placement_reader_slices_each_batch(mesh_shape, layout):
  size = mtf.convert_to_shape(mesh_shape).size
  mesh_impl = mtf.placement_mesh_impl.PlacementMeshImpl(
    mesh_shape, layout, ["/cpu:%d" % i for i in range(size)]
  )
  reader = input_reader.PlacementMeshImplInputReader(
    mesh_impl, ds_creator, LABEL_SHAPES
  )
  reader.initialize(None)
  step = tf.function(
    lambda: reader.gpu_placement(lambda x, y: (x, y)), autograph=False
  )
  for batch in range(3):
    images, labels = step()
    rows = EXAMPLES[(batch % 2) * BATCH :][:BATCH]
    for pnum in range(size):
      np.testing.assert_array_equal(
        images[pnum], expected_slice(rows, mesh_impl, SHAPES[0], pnum)
      )
      np.testing.assert_array_equal(
        labels[pnum],
        expected_slice(-rows[:, :2], mesh_impl, LABEL_SHAPES[1], pnum),
      )


def _stateful_ds_creator():
  """Yields rows 0-1 of eye(4) on the first call, rows 2-3 on the second."""
  calls = []

  def creator():
    first = 2 * len(calls)
    calls.append(first)
    rows = np.eye(4, dtype=np.float32)[first : first + 2]
    return tf.data.Dataset.from_tensors(rows).repeat().unbatch()

  return creator, calls


@pytest.mark.parametrize("is_eval_mode", [False, True], ids=["train", "eval"])
def test_simd_reader_one_dataset_per_sub_batch(is_eval_mode):
  mesh_impl = simd("mesh_x:2;mesh_y:1", "batch:mesh_x;io:mesh_y")
  creator, calls = _stateful_ds_creator()
  shapes = [
    mtf.Shape([mtf.Dimension("batch", 4), mtf.Dimension("io", 4)]),
  ]
  reader = input_reader.SimdMeshImplInputReader(
    mesh_impl,
    creator,
    shapes,
    external_worker=False,
    is_eval_mode=is_eval_mode,
  )
  reader.start_infeed_thread(None, 1)
  core_0, core_1 = tf.function(
    lambda: mesh_impl.replicate(lambda: reader.dequeue()[0]), autograph=False
  )()
  eye = np.eye(4, dtype=np.float32)
  np.testing.assert_array_equal(core_0, eye[:2])
  if is_eval_mode:
    # One dataset of the global batch [e0, e1, e0, e1].
    assert len(calls) == 1
    np.testing.assert_array_equal(core_1, eye[:2])
  else:
    assert len(calls) == 2
    np.testing.assert_array_equal(core_1, eye[2:])


@pytest.mark.parametrize(
  "mesh_shape,layout",
  [
    ("rows:2;cols:2", "batch:rows;io:cols"),
    ("rows:2;cols:2", "io:rows"),
    ("all:4", "batch:all"),
  ],
  ids=["2x2", "2x2_io_rows", "all4_batch"],
)
@pytest.mark.parametrize("is_eval_mode", [False, True], ids=["train", "eval"])
def test_simd_reader_gives_each_replica_its_slices(
  mesh_shape, layout, is_eval_mode
):
  mesh_impl = simd(mesh_shape, layout)
  reader = input_reader.SimdMeshImplInputReader(
    mesh_impl,
    images_only if is_eval_mode else ds_creator,
    SHAPES if is_eval_mode else LABEL_SHAPES,
    external_worker=False,
    is_eval_mode=is_eval_mode,
  )
  if is_eval_mode:
    expected_batches = [EXAMPLES[:BATCH], EXAMPLES[BATCH:]]
  else:
    # Each sub-batch has its own dataset, read from its start.
    sub_batches = (
      2 if "batch:rows" in layout else (4 if "batch:all" in layout else 1)
    )
    size = BATCH // sub_batches
    expected_batches = [
      np.concatenate([EXAMPLES[step * size :][:size]] * sub_batches)
      for step in range(2)
    ]

  def two_steps():
    # Each replica dequeues twice: the second dequeue is the next batch.
    return [reader.dequeue()[0], reader.dequeue()[0]]

  outputs = tf.function(
    lambda: mesh_impl.replicate(two_steps), autograph=False
  )()
  for pnum, (first, second) in enumerate(outputs):
    for got, batch in zip((first, second), expected_batches):
      np.testing.assert_array_equal(
        got, expected_slice(batch, mesh_impl, SHAPES[0], pnum)
      )


def test_simd_reader_feeds_an_mtf_program():
  mesh_impl = simd("rows:2;cols:2", "batch:rows;io:cols")
  reader = input_reader.SimdMeshImplInputReader(
    mesh_impl, images_only, SHAPES, external_worker=False, is_eval_mode=True
  )

  def computation():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    (images,) = reader.dequeue()
    x = mtf.import_laid_out_tensor(
      mesh, mesh_impl.LaidOutTensor([images]), SHAPES[0]
    )
    total = mtf.reduce_sum(x * x, reduced_dim=SHAPES[0].dims[1])
    lowering = mtf.Lowering(graph, {mesh: mesh_impl})
    return lowering.export_to_tf_tensor(total)

  outputs = tf.function(
    lambda: mesh_impl.replicate(computation), autograph=False
  )()
  for got in outputs:
    np.testing.assert_allclose(got, (EXAMPLES[:BATCH] ** 2).sum(axis=1))


def test_simd_reader_in_a_v1_graph_session():
  with tf.Graph().as_default():
    mesh_impl = simd("rows:2;cols:2", "batch:rows;io:cols")
    reader = input_reader.SimdMeshImplInputReader(
      mesh_impl, ds_creator, LABEL_SHAPES, external_worker=False
    )
    outputs = mesh_impl.replicate(lambda: reader.dequeue())
    with tf.compat.v1.Session() as sess:
      reader.start_infeed_thread(sess)
      for step in range(3):
        results = sess.run(outputs)
        # Two sub-batches of 2 rows, each its own dataset.
        rows = EXAMPLES[(2 * step) % 8 :][:2]
        batch = np.concatenate([rows, rows])
        for pnum, (images, labels) in enumerate(results):
          np.testing.assert_array_equal(
            images, expected_slice(batch, mesh_impl, SHAPES[0], pnum)
          )
          np.testing.assert_array_equal(
            labels,
            expected_slice(-batch[:, :2], mesh_impl, LABEL_SHAPES[1], pnum),
          )


def test_placement_reader_in_a_v1_graph_session():
  with tf.Graph().as_default():
    mesh_impl = mtf.placement_mesh_impl.PlacementMeshImpl(
      "all:2", "batch:all", ["/cpu:0", "/cpu:1"]
    )
    reader = input_reader.PlacementMeshImplInputReader(
      mesh_impl, images_only, SHAPES, is_eval_mode=True
    )
    slices = reader.gpu_placement(lambda images: images)
    with tf.compat.v1.Session() as sess:
      reader.initialize(sess)
      first = sess.run(slices)
      second = sess.run(slices)
  np.testing.assert_array_equal(np.concatenate(first), EXAMPLES[:4])
  np.testing.assert_array_equal(np.concatenate(second), EXAMPLES[4:])


def test_process_devices_of_a_collective_mesh():
  devices = [
    "/job:localhost/replica:0/task:0/device:CPU:%d" % i for i in range(4)
  ]
  mesh_impl = mtf.simd_mesh_impl.SimdMeshImpl(
    "a:4", "", devices=devices, logical_to_physical=[3, 2, 1, 0]
  )
  p_dev = input_reader.ProcessDevices(mesh_impl)
  assert p_dev.ordered_tpus == devices[::-1]
  assert p_dev.ordered_ordinals == [3, 2, 1, 0]
  assert (
    p_dev.ordered_hosts == ["/job:localhost/replica:0/task:0/device:CPU:0"] * 4
  )
  assert (p_dev.num_cores, p_dev.num_hosts, p_dev.num_cores_per_host) == (
    4,
    1,
    4,
  )
  assert dict(p_dev.host_id_to_its_pnums) == {0: [0, 1, 2, 3]}


def _tpu_mesh(topology, mesh_shape, layout):
  assignment = tf.tpu.experimental.DeviceAssignment.build(
    topology, num_replicas=topology.num_tasks * topology.num_tpus_per_task
  )
  return mtf.simd_mesh_impl.SimdMeshImpl(
    mesh_shape, layout, None, assignment
  ), assignment


def test_process_devices_of_a_tpu_pod_slice():
  topology = tpu_connection.synthetic_topology([2, 2, 4, 1], num_hosts=4)
  mesh_impl, assignment = _tpu_mesh(topology, "rows:8;cols:2", "batch:rows")
  p_dev = input_reader.ProcessDevices(mesh_impl)
  assert (p_dev.num_cores, p_dev.num_hosts, p_dev.num_cores_per_host) == (
    16,
    4,
    4,
  )
  for pnum in range(16):
    assert p_dev.ordered_hosts[pnum] == assignment.host_device(replica=pnum)
    host_id = p_dev.ordered_host_ids[pnum]
    assert "/task:%d/" % host_id in p_dev.ordered_hosts[pnum]
  assert sorted(sum(p_dev.host_id_to_its_pnums.values(), [])) == list(range(16))


@pytest.mark.parametrize("is_eval_mode", [False, True], ids=["train", "eval"])
def test_tpu_infeed_graph(is_eval_mode):
  topology = tpu_connection.synthetic_topology([2, 2, 1, 2])
  with tf.Graph().as_default() as graph:
    mesh_impl, _ = _tpu_mesh(topology, "rows:4;cols:2", "batch:rows;io:cols")
    reader = input_reader.SimdMeshImplInputReader(
      mesh_impl,
      ds_creator,
      LABEL_SHAPES,
      external_worker=False,
      is_eval_mode=is_eval_mode,
    )
    assert reader.infeed_queue.number_of_tuple_elements == 2
    with pytest.raises(ValueError, match="collective backend"):
      reader.dequeue()
  enqueues = [
    op for op in graph.get_operations() if op.type == "InfeedEnqueueTuple"
  ]
  assert sorted(op.get_attr("device_ordinal") for op in enqueues) == list(
    range(8)
  )
  assert {op.device for op in enqueues} == {"/task:0/device:CPU:0"}
  for op in enqueues:  # each core receives its slice of images and labels
    assert [t.shape.as_list() for t in op.inputs] == [[1, 4], [1, 2]]
  reads = [op for op in graph.get_operations() if op.type == "IteratorGetNext"]
  assert len(reads) == (1 if is_eval_mode else 4)


def test_bad_input_shapes_are_named():
  mesh_impl = simd("all:2", "batch:all")
  with pytest.raises(ValueError, match="non-empty list"):
    input_reader.SimdMeshImplInputReader(mesh_impl, ds_creator, [])
  bad = [SHAPES[0], mtf.Shape([mtf.Dimension("batch", 2)])]
  with pytest.raises(ValueError, match="same batch|begin with the batch"):
    input_reader.SimdMeshImplInputReader(mesh_impl, ds_creator, bad)
  reader = input_reader.SimdMeshImplInputReader(
    mesh_impl, ds_creator, SHAPES, external_worker=False
  )
  with pytest.raises(ValueError, match="infeed_queue exists on the TPU"):
    _ = reader.infeed_queue
  with pytest.raises(ValueError, match="inside simd_mesh_impl.replicate"):
    reader.dequeue()
