"""Tests for mesh_tensorflow.utils.

BalancedVariablePlacer is checked where TF applies device functions (a
tf.compat.v1 graph) and through mtf variables eagerly; create_host_call in a
v1 graph, in a tf.function and eagerly, reading the events files back.
"""

import glob
import inspect
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import utils
from tests import mesh_test_util as mtu

tf1 = tf.compat.v1
_EMPTY = inspect.Parameter.empty
DEVICES = ["/cpu:0", "/cpu:1", "/cpu:2"]


@pytest.mark.parametrize(
  "fn,params",
  [
    (utils.BalancedVariablePlacer, [("devices", _EMPTY), ("init_usage", None)]),
    (
      utils.BalancedVariablePlacer.device_function,
      [("self", _EMPTY), ("var", _EMPTY)],
    ),
    (utils.create_host_call, [("model_dir", _EMPTY)]),
    (utils.topology_rank, [("topology", _EMPTY)]),
    (utils.remove_summaries, []),
    (utils.configure_virtual_cpus, [("num_cpus", _EMPTY)]),
  ],
)
def test_signature(fn, params):
  actual = [
    (p.name, p.default) for p in inspect.signature(fn).parameters.values()
  ]
  assert actual == params


def test_public_names():
  assert utils.SCALAR_SUMMARIES_COLLECTION_KEY == "mtf_scalar_summaries"
  assert set(utils.__all__) == {
    "BalancedVariablePlacer",
    "SCALAR_SUMMARIES_COLLECTION_KEY",
    "configure_virtual_cpus",
    "create_host_call",
    "outside_all_rewrites",
    "remove_summaries",
    "topology_rank",
  }
  assert mtf.utils is utils


# ------------------------------------------------------------------ placer
def _device_index(device):
  return int(tf.DeviceSpec.from_string(device).device_index)


def test_placer_balances_bytes_in_v1_graph():
  placer = utils.BalancedVariablePlacer(DEVICES)
  # float32 sizes 40, 12, 16, 80, 20 bytes; int64 [3] = 24 bytes.
  specs = [
    ([10], tf.float32),
    ([3], tf.float32),
    ([2, 2], tf.float32),
    ([20], tf.float32),
    ([5], tf.float32),
    ([3], tf.int64),
  ]
  with tf.Graph().as_default():
    with tf1.device(placer.device_function):
      variables = [
        tf1.get_variable(
          "v%d" % i, shape, dtype=dtype, initializer=tf1.zeros_initializer()
        )
        for i, (shape, dtype) in enumerate(specs)
      ]
      after = tf.constant(1.0, name="not_a_variable")
  # Least loaded wins, ties go to the earlier device:
  # v0 -> 0 (40,0,0); v1 -> 1 (40,12,0); v2 -> 2 (40,12,16); v3 -> 1
  # (40,92,16); v4 -> 2 (40,92,36); v5 -> 2 (40,92,60).
  assert [_device_index(v.device) for v in variables] == [0, 1, 2, 1, 2, 2]
  assert placer.usage == [40, 92, 60]
  # Non-variable ops follow the device chosen last.
  assert _device_index(after.device) == 2


def test_placer_init_usage_and_mtf_variables_in_v1_graph():
  placer = utils.BalancedVariablePlacer(DEVICES, init_usage=[0, 0, 100])
  with tf.Graph().as_default():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh", variable_placer=placer)
    sizes = [10, 3, 4, 20, 5]
    masters = []
    for i, n in enumerate(sizes):
      w = mtf.get_variable(
        mesh,
        "w%d" % i,
        [mtf.Dimension("d%d" % i, n)],
        initializer=tf.zeros_initializer(),
      )
      masters.append(w.operation.master)
    assert [_device_index(m.device) for m in masters] == [0, 1, 1, 1, 0]
    assert placer.usage == [60, 108, 100]
    # The placed masters still work in a lowered program.
    x = mtf.get_variable(mesh, "w0", [mtf.Dimension("d0", 10)])
    total = mtf.reduce_sum(x + 1.0)
    lowering = mtf.Lowering(graph, {mesh: mtu.mesh_impl_for("", "")})
    y = lowering.export_to_tf_tensor(total)
    config = tf1.ConfigProto(device_count={"CPU": 8})
    with tf1.Session(config=config) as sess:
      sess.run(tf1.global_variables_initializer())
      sess.run(lowering.copy_masters_to_slices())
      assert sess.run(y) == 10.0


def test_placer_with_eager_mtf_variables():
  placer = utils.BalancedVariablePlacer(DEVICES[:2])
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh", variable_placer=placer)
  with mtf.variable_store(mtf.VariableStore()):
    a = mtf.get_variable(mesh, "a", [mtf.Dimension("a", 8)])
    b = mtf.get_variable(mesh, "b", [mtf.Dimension("b", 4)])
    c = mtf.get_variable(mesh, "c", [mtf.Dimension("c", 2)])
  assert [_device_index(t.operation.master.device) for t in (a, b, c)] == [
    0,
    1,
    1,
  ]
  assert placer.usage == [32, 24]


def test_placer_errors():
  with pytest.raises(ValueError, match=r"at least one device"):
    utils.BalancedVariablePlacer([])
  with pytest.raises(ValueError, match=r"init_usage has 1 entries for 3"):
    utils.BalancedVariablePlacer(DEVICES, init_usage=[5])
  placer = utils.BalancedVariablePlacer(DEVICES)
  with tf.Graph().as_default():
    with tf1.device(placer.device_function):
      with pytest.raises(ValueError, match=r"'unknown'.*fully known shape"):
        tf1.get_variable(
          "unknown",
          initializer=tf1.placeholder_with_default([1.0], shape=[None]),
          validate_shape=False,
        )


# --------------------------------------------------------------- host call
def _read_scalars(model_dir):
  """[(step, tag, value)] from every events file, and the number of files."""
  files = sorted(glob.glob(os.path.join(model_dir, "*")))
  found = []
  for path in files:
    assert path.endswith(".host_call")
    for record in tf.data.TFRecordDataset(path):
      event = tf1.Event.FromString(record.numpy())
      for value in event.summary.value:
        assert value.metadata.plugin_data.plugin_name == "scalars"
        found.append(
          (event.step, value.tag, float(tf.make_ndarray(value.tensor)))
        )
  return sorted(found), len(files)


def _lower_with_summaries():
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  x = mtf.import_tf_tensor(
    mesh, np.array([1.0, 2.0, 4.0], np.float32), [mtf.Dimension("n", 3)]
  )
  mtf.scalar_summary("total", mtf.reduce_sum(x))
  mtf.scalar_summary("count", mtf.constant(mesh, 3, dtype=tf.int32))
  mtf.Lowering(graph, {mesh: mtu.mesh_impl_for("", "")})


def test_create_host_call_in_v1_graph(tmp_path):
  model_dir = str(tmp_path)
  with tf.Graph().as_default():
    assert utils.create_host_call(model_dir) is None  # nothing recorded yet
    step = tf1.train.get_or_create_global_step()
    with mtf.variable_store(mtf.VariableStore()):
      _lower_with_summaries()
    fn, args = utils.create_host_call(model_dir)
    assert [a.shape.as_list() for a in args] == [[1], [1], [1]]
    write = fn(*args)
    increment = step.assign_add(5)
    with tf1.Session() as sess:
      sess.run(tf1.global_variables_initializer())
      sess.run(write)
      sess.run(increment)
      sess.run(write)
  assert _read_scalars(model_dir) == (
    [
      (0, "count", 3.0),
      (0, "total", 7.0),
      (5, "count", 3.0),
      (5, "total", 7.0),
    ],
    1,
  )


def test_create_host_call_in_tf_function(tmp_path):
  model_dir = str(tmp_path)
  step = tf.Variable(2, dtype=tf.int64)
  store = mtf.VariableStore()

  @tf.function(autograph=False)
  def train_step():
    with mtf.variable_store(store):
      _lower_with_summaries()
    fn, args = utils.create_host_call(model_dir)
    fn(*args)

  tf.summary.experimental.set_step(step)
  try:
    train_step()
    step.assign_add(1)
    train_step()
  finally:
    tf.summary.experimental.set_step(None)
  assert _read_scalars(model_dir) == (
    [
      (2, "count", 3.0),
      (2, "total", 7.0),
      (3, "count", 3.0),
      (3, "total", 7.0),
    ],
    1,
  )


def test_create_host_call_eager_and_errors(tmp_path):
  with mtf.variable_store(mtf.VariableStore()):
    _lower_with_summaries()  # eager lowering records no summaries
  assert utils.create_host_call(str(tmp_path)) is None
  with tf.Graph().as_default():
    with mtf.variable_store(mtf.VariableStore()):
      _lower_with_summaries()
    with pytest.raises(ValueError, match=r"no global step"):
      utils.create_host_call(str(tmp_path))
    tf1.train.get_or_create_global_step()
    fn, _ = utils.create_host_call(str(tmp_path / "eager"))
  # The host function itself also runs eagerly on fed values.
  assert (
    fn(tf.constant([7], tf.int64), tf.constant([1.5]), tf.constant([2.0]))
    is None
  )
  assert _read_scalars(str(tmp_path / "eager")) == (
    [(7, "count", 2.0), (7, "total", 1.5)],
    1,
  )
  with pytest.raises(ValueError, match=r"got 1 values"):
    fn(tf.constant([7], tf.int64), tf.constant([1.5]))


def test_remove_summaries(tmp_path):
  with tf.Graph().as_default() as graph:
    writer = tf.summary.create_file_writer(str(tmp_path))
    with writer.as_default():
      tf.summary.write("x", 1.0, step=0)
    assert graph.get_collection("_SUMMARY_V2")
    with mtf.variable_store(mtf.VariableStore()):
      _lower_with_summaries()
    utils.remove_summaries()
    assert not graph.get_collection("_SUMMARY_V2")
    # mtf scalar summaries are not touched.
    assert len(graph.get_collection(utils.SCALAR_SUMMARIES_COLLECTION_KEY)) == 2


# ---------------------------------------------------------------- topology
def _topology():
  coords = np.array(
    [
      [[x, y, 0, core] for x in range(2) for core in range(2)] for y in range(2)
    ],
    np.int32,
  )
  return tf.tpu.experimental.Topology(
    mesh_shape=[2, 2, 1, 2], device_coordinates=coords
  )


def test_topology_rank():
  topology = _topology()
  assert utils.topology_rank(topology) == 4
  assert utils.topology_rank(topology.serialized()) == 4
  assert utils.topology_rank([4, 4, 2]) == 3
  with pytest.raises(ValueError, match=r"topology_rank: expected"):
    utils.topology_rank(7)


# ------------------------------------------------------------ virtual CPUs
_FRESH_PROCESS_PROGRAM = """
import tensorflow as tf
from mesh_tensorflow import utils
print(utils.configure_virtual_cpus(3))
print(len(tf.config.list_logical_devices("CPU")))
try:
  utils.configure_virtual_cpus(5)
except RuntimeError as e:
  print("RuntimeError", "already initialised with 3" in str(e))
print(utils.configure_virtual_cpus(2))
"""


def test_configure_virtual_cpus_in_a_fresh_process():
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = dict(os.environ, PYTHONPATH=root, TF_CPP_MIN_LOG_LEVEL="2")
  out = subprocess.run(
    [sys.executable, "-c", _FRESH_PROCESS_PROGRAM],
    env=env,
    capture_output=True,
    text=True,
    check=True,
  )
  assert out.stdout.splitlines() == [
    "['/cpu:0', '/cpu:1', '/cpu:2']",
    "3",
    "RuntimeError True",
    "['/cpu:0', '/cpu:1']",
  ]


def test_configure_virtual_cpus_after_initialisation():
  num_cpus = len(tf.config.list_logical_devices("CPU"))  # Initialises TF.
  assert utils.configure_virtual_cpus(num_cpus) == [
    "/cpu:%d" % i for i in range(num_cpus)
  ]
  with pytest.raises(
    RuntimeError, match="cannot create %d virtual CPU" % (num_cpus + 1)
  ):
    utils.configure_virtual_cpus(num_cpus + 1)
  with pytest.raises(ValueError, match="at least 1"):
    utils.configure_virtual_cpus(0)
