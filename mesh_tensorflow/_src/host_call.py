"""Writing mtf scalar summaries: create_host_call, remove_summaries.

`mtf.scalar_summary(name, x)` lowers to a float32 scalar and (when building a
graph: tf.compat.v1 graph mode or a tf.function trace) records `(name,
tensor)` in the graph collection SCALAR_SUMMARIES_COLLECTION_KEY.
`create_host_call` turns that collection into the `(fn, args)` pair that the
original handed to TPUEstimator as `host_call`; without TPUEstimator you call
`fn(*args)` yourself, in the same graph or tf.function as the lowering.
"""

from __future__ import annotations

from typing import Callable, List, Optional, Tuple
import weakref

import tensorflow as tf

from mesh_tensorflow._src.ops.summary import SCALAR_SUMMARIES_COLLECTION_KEY

tf1 = tf.compat.v1

# Where tf.summary (v2) ops built in a graph are collected.
_SUMMARY_V2_COLLECTION = tf1.GraphKeys._SUMMARY_COLLECTION  # pylint: disable=protected-access

_DATA_CLASS_SCALAR = (
  1  # tensorflow.core.framework.summary_pb2.DATA_CLASS_SCALAR
)


def _scalar_metadata():
  """What TensorBoard's scalar plugin writes; tf.summary.scalar itself
  needs the tensorboard package, tf.summary.write does not.
  """
  return tf1.SummaryMetadata(
    plugin_data=tf1.SummaryMetadata.PluginData(plugin_name="scalars"),
    data_class=_DATA_CLASS_SCALAR,
  )


def _current_step():
  # An explicitly set summary step wins over the process's global step.
  step = tf.summary.experimental.get_step()
  if step is None:
    step = tf1.train.get_global_step()
  if step is None:
    raise ValueError(
      "create_host_call: there is no global step; create one with "
      "tf.compat.v1.train.get_or_create_global_step() or set one with "
      "tf.summary.experimental.set_step(step)"
    )
  return step


# One file writer per directory: for eager (and tf.function) use, and per
# tf.compat.v1 graph. Eager writers must outlive the tf.functions that write
# with them, so they are kept for the life of the process.
_eager_writers = {}
_graph_writers = weakref.WeakKeyDictionary()


def _file_writer(model_dir: str):
  """(writer, made_in_a_v1_graph) for model_dir, created on first use."""
  with tf.init_scope():
    if tf.executing_eagerly():
      writers, in_graph = _eager_writers, False
    else:
      writers = _graph_writers.setdefault(tf1.get_default_graph(), {})
      in_graph = True
    writer = writers.get(model_dir)
    if writer is None:
      writer = tf.summary.create_file_writer(
        model_dir, filename_suffix=".host_call"
      )
      writers[model_dir] = writer
  return writer, in_graph


def create_host_call(
  model_dir: str,
) -> Optional[Tuple[Callable, List[tf.Tensor]]]:
  """(fn, args) writing the graph's mtf scalar summaries to model_dir.

  The summaries are those recorded by lowering `mtf.scalar_summary` ops in the
  current graph (a tf.compat.v1 Graph or the tf.function being traced; eager
  lowering records none). `args` are the global step and each summary value,
  reshaped to [1] as TPU host calls need (the step is
  tf.summary.experimental.get_step() when set, else the global step);
  `fn(*args)` writes one
  scalar summary per entry at that step with a file writer on
  `model_dir` (events files ending in ".host_call"; TensorBoard shows them
  as scalars) and flushes it. It returns an op to run in graph mode (None
  when eager). Call it under the same tf.compat.v1 Graph or tf.function as
  create_host_call.

  Example:
    >>> import os, shutil, tempfile
    >>> model_dir = tempfile.mkdtemp()
    >>> with tf.Graph().as_default():
    ...   _ = tf.compat.v1.train.get_or_create_global_step()
    ...   graph = mtf.Graph()
    ...   mesh = mtf.Mesh(graph, "my_mesh")
    ...   x = mtf.import_tf_tensor(mesh, tf.constant([1.0, 3.0]), "batch:2")
    ...   _ = mtf.scalar_summary("loss", mtf.reduce_mean(x))
    ...   mesh_impl = mtf.placement_mesh_impl.PlacementMeshImpl("", "", [""])
    ...   lowering = mtf.Lowering(graph, {mesh: mesh_impl})
    ...   fn, args = mtf.utils.create_host_call(model_dir)
    ...   write_op = fn(*args)  # run it with the training step
    ...   with tf.compat.v1.Session() as session:
    ...     session.run(tf.compat.v1.global_variables_initializer())
    ...     step_and_loss = session.run(args)
    ...     session.run(write_op)
    >>> step_and_loss
    [array([0]), array([2.], dtype=float32)]
    >>> [f.endswith(".host_call") for f in os.listdir(model_dir)]
    [True]
    >>> shutil.rmtree(model_dir)

  Args:
    model_dir: directory for the summary events files.

  Returns:
    None if no scalar summaries were recorded, else (fn, args).

  Raises:
    ValueError: if there are summaries but no global step (neither
      tf.compat.v1.train.get_global_step() nor tf.summary.experimental's).
  """
  graph = tf1.get_default_graph()
  summaries = graph.get_collection(SCALAR_SUMMARIES_COLLECTION_KEY)
  if not summaries:
    return None
  names = [name for name, _ in summaries]
  values = [tf.reshape(tf.cast(t, tf.float32), [1]) for _, t in summaries]
  step = tf.reshape(tf.cast(_current_step(), tf.int64), [1])

  def host_call_fn(global_step, *args):
    if len(args) != len(names):
      raise ValueError(
        "host call for summaries %s got %d values" % (names, len(args))
      )
    writer, in_graph = _file_writer(model_dir)
    step_value = tf.reshape(global_step, [-1])[0]
    # A writer made in a tf.compat.v1 graph must be initialised there; one
    # made eagerly (also for a tf.function) already is.
    init = [writer.init()] if in_graph else []
    with tf.control_dependencies(init), writer.as_default():
      written = [
        tf.summary.write(
          name,
          tf.reshape(value, [-1])[0],
          step=step_value,
          metadata=_scalar_metadata(),
        )
        for name, value in zip(names, args)
      ]
    with tf.control_dependencies(written):
      flushed = writer.flush()
    if tf.executing_eagerly():
      return None
    return tf.group(*written, flushed)

  return host_call_fn, [step] + values


def remove_summaries() -> None:
  """Removes the tf.summary (v2) ops collected in the default graph.

  Those ops were collected by summary calls made while building a graph; a
  driver that writes summaries another way (create_host_call) drops them so
  nothing runs them twice. The mtf scalar-summary collection is left alone.
  """
  graph = tf1.get_default_graph()
  del graph.get_collection_ref(_SUMMARY_V2_COLLECTION)[:]
