"""Tests for mesh_tensorflow.tpu_variables (ReplicatedVariable).

Outside a TPU replicate context the variable proxies its first variable
(eager, tf.function and v1 graph). Inside `tf.compat.v1.tpu.replicate` only
graph construction is checked: running it needs a TPU.
"""

import inspect

import numpy as np
import pytest
import tensorflow as tf

from mesh_tensorflow import tpu_variables

tf1 = tf.compat.v1
ReplicatedVariable = tpu_variables.ReplicatedVariable


def _variables(n=2):
  return [
    tf.Variable([1.0 + 10 * i, 2.0 + 10 * i], name="w_slice_%d" % i)
    for i in range(n)
  ]


def test_signatures():
  def params(fn):
    return [
      (p.name, p.default) for p in inspect.signature(fn).parameters.values()
    ]

  empty = inspect.Parameter.empty
  assert params(ReplicatedVariable) == [("name", empty), ("variables", empty)]
  assert params(ReplicatedVariable.assign) == [
    ("self", empty),
    ("value", empty),
    ("use_locking", None),
    ("name", None),
    ("read_value", False),
  ]
  for method in (ReplicatedVariable.assign_add, ReplicatedVariable.assign_sub):
    assert params(method) == [
      ("self", empty),
      ("delta", empty),
      ("use_locking", None),
      ("name", None),
      ("read_value", True),
    ]


def test_properties_eager():
  slices = _variables()
  w = ReplicatedVariable("w", slices)
  assert isinstance(w, tf.__internal__.types.Tensor)
  assert w.name == "w"
  assert w.dtype == tf.float32
  assert w.shape == tf.TensorShape([2]) and w.get_shape() == w.shape
  assert w.get() is slices[0]
  assert w.variables == slices
  assert w.constraint is None
  assert w.initializer is None  # eager variables are initialised already
  assert w.handle is slices[0].handle
  assert "replicas=2" in repr(w)


def test_read_and_assign_proxy_first_variable_eager():
  slices = _variables()
  w = ReplicatedVariable("w", slices)
  np.testing.assert_array_equal(w.read_value(), [1.0, 2.0])
  np.testing.assert_array_equal(tf.convert_to_tensor(w), [1.0, 2.0])
  np.testing.assert_array_equal(tf.add(w, 1.0), [2.0, 3.0])
  np.testing.assert_array_equal(w.assign_add([1.0, 1.0]), [2.0, 3.0])
  np.testing.assert_array_equal(w.assign_sub([0.5, 0.5]), [1.5, 2.5])
  w.assign([7.0, 8.0])
  np.testing.assert_array_equal(w.read_value(), [7.0, 8.0])
  np.testing.assert_array_equal(
    w.assign([5.0, 6.0], read_value=True), [5.0, 6.0]
  )
  w.assign_add([1.0, 1.0], read_value=False)
  np.testing.assert_array_equal(slices[0].numpy(), [6.0, 7.0])
  # The other replicas' variables are untouched outside a replicate context.
  np.testing.assert_array_equal(slices[1].numpy(), [11.0, 12.0])


def test_in_tf_function():
  slices = _variables()
  w = ReplicatedVariable("w", slices)

  @tf.function
  def step():
    w.assign_add([1.0, 1.0], read_value=False)
    return tf.identity(w) * 2.0

  np.testing.assert_array_equal(step(), [4.0, 6.0])
  np.testing.assert_array_equal(step(), [6.0, 8.0])
  np.testing.assert_array_equal(slices[1].numpy(), [11.0, 12.0])


def test_v1_graph():
  with tf.Graph().as_default() as graph:
    slices = _variables(3)
    w = ReplicatedVariable("w", slices)
    assert w.graph is graph
    assert w.op is slices[0].op
    assert w.to_proto().variable_name == slices[0].name
    plus_one = tf.add(w, 1.0)
    update = w.assign_add([1.0, 1.0])
    with tf1.Session() as sess:
      sess.run(w.initializer)  # initialises every replica's variable
      np.testing.assert_array_equal(sess.run(plus_one), [2.0, 3.0])
      np.testing.assert_array_equal(sess.run(update), [2.0, 3.0])
      np.testing.assert_array_equal(sess.run(w.read_value()), [2.0, 3.0])
      np.testing.assert_array_equal(sess.run(slices[2]), [21.0, 22.0])


def test_inside_tpu_replicate_uses_replicated_handle():
  """Graph construction only: executing a replicated graph needs a TPU."""
  with tf.Graph().as_default():
    slices = _variables(2)
    w = ReplicatedVariable("w", slices)
    seen = {}

    def computation():
      handle = w.handle
      seen["handle"] = handle
      seen["same_handle"] = w.handle is handle  # cached per context
      value = w.read_value()
      seen["read"] = value
      seen["converted"] = tf.convert_to_tensor(w)
      seen["assign"] = w.assign([0.0, 0.0])
      seen["assign_add"] = w.assign_add([1.0, 1.0])
      return value + 1.0

    tf1.tpu.replicate(computation, inputs=[[], []])
    handle = seen["handle"]
    assert handle.op.type == "TPUReplicatedInput"
    assert [t.op for t in handle.op.inputs] == [s.handle.op for s in slices]
    assert seen["same_handle"]
    assert seen["read"].op.type == "ReadVariableOp"
    assert seen["read"].op.inputs[0] is handle
    assert seen["converted"].op.inputs[0] is handle
    assert seen["assign"].type == "AssignVariableOp"
    # read_value=True: a read of the replicated handle after the update.
    assert seen["assign_add"].op.inputs[0] is handle
    assert [op.type for op in seen["assign_add"].op.control_inputs] == [
      "AssignAddVariableOp"
    ]
    # Outside the replicate context the first variable is used again.
    assert w.handle is slices[0].handle


def test_errors():
  with pytest.raises(ValueError, match=r"'w' needs at least one variable"):
    ReplicatedVariable("w", [])
  with pytest.raises(ValueError, match=r"variable 1 .* dtype int32"):
    ReplicatedVariable("w", [tf.Variable([1.0]), tf.Variable([1])])
  with pytest.raises(ValueError, match=r"variable 1 .* shape \(2,\)"):
    ReplicatedVariable("w", [tf.Variable([1.0]), tf.Variable([1.0, 2.0])])
