"""An Adafactor training step on a placement mesh, run on either package.

`train` builds a small model with the original's public API only (layer
norms, a multi-head dense block split over heads, a feed-forward block split
over d_ff, an rms scale), sets every weight from a RandomState in the order
of the sorted names, trains it with Adafactor in a tf.compat.v1 graph, one
Session run per step that also fetches the loss (as an Estimator runs a
train op), and returns the losses and every processor's slice of every
variable and slot. The same code runs on the original mesh-tensorflow
0.1.21: data/make_replicas_original.py stored its numbers.

`unordered_reads` finds the reads of a variable that a step may run before
or after the variable's own update. The original makes a new read of a slice
variable at each use, so the backward pass reads a weight again to
propagate the gradient to the layer below, and nothing orders that read
with the weight's Adafactor update in the same run: which one TensorFlow
runs first varies from run to run, and so do the original's numbers.
"""

import collections
from typing import Dict, List, NamedTuple, Sequence, Tuple

import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1

BATCH, D_MODEL, HEADS, D_KV, D_FF = 4, 8, 2, 4, 16
STEPS = 3

# (mesh shape, layout): heads and d_ff split over one mesh axis, batch over
# the other (weights replicated over it); batch split four ways (every
# weight replicated on four processors).
MESH_LAYOUTS = (
  ("batch:2;model:2", "batch:batch;d_ff:model;heads:model"),
  ("batch:4", "batch:batch"),
)

_READS = ("ReadVariableOp", "ResourceGather")


class Run(NamedTuple):
  """What `train` returns.

  Attributes:
    losses: the loss of each step.
    slices: {variable or slot name: its slice on each processor}.
    begins: {variable or slot name: its slice's begin on each processor}.
    unordered: `unordered_reads` of the step (before `order_reads`).
  """

  losses: List[float]
  slices: Dict[str, List[np.ndarray]]
  begins: Dict[str, List[List[int]]]
  unordered: List[Tuple[str, str, str]]


def _is_write(op: tf.Operation) -> bool:
  return op.type in (
    "AssignVariableOp",
    "AssignAddVariableOp",
    "AssignSubVariableOp",
  ) or op.type.startswith(("ResourceApply", "ResourceScatter"))


def _resource(op: tf.Operation) -> str:
  """The name of the variable handle op a read or write acts on."""
  handle = op.inputs[0].op
  while handle.type == "Identity":
    handle = handle.inputs[0].op
  return handle.name


def unordered_reads(
  fetches: Sequence[tf.Operation],
) -> List[Tuple[str, str, str]]:
  """Variable reads that one run of `fetches` may run before or after a write.

  A read and a write of the same variable are ordered when one of them is an
  ancestor (through inputs or control inputs) of the other.

  Args:
    fetches: the ops one Session run runs (a train op, the loss's op).

  Returns:
    (variable handle, read op, write op) names, sorted.
  """
  ops = _ancestors_of_all(fetches)
  reads, writes = collections.defaultdict(list), collections.defaultdict(list)
  for op in ops:
    if op.type in _READS:
      reads[_resource(op)].append(op)
    elif _is_write(op):
      writes[_resource(op)].append(op)
  found = []
  for handle, handle_writes in writes.items():
    for write in handle_writes:
      before_write = _ancestors_of_all([write])
      for read in reads[handle]:
        if read not in before_write and write not in _ancestors_of_all([read]):
          found.append((handle, read.name, write.name))
  return sorted(found)


def _ancestors_of_all(ops: Sequence[tf.Operation]) -> set:
  seen, stack = set(ops), list(ops)
  while stack:
    op = stack.pop()
    for parent in [t.op for t in op.inputs] + list(op.control_inputs):
      if parent not in seen:
        seen.add(parent)
        stack.append(parent)
  return seen


def _model_loss(mtf, mesh, rng):
  batch = mtf.Dimension("batch", BATCH)
  d_model = mtf.Dimension("d_model", D_MODEL)
  heads = mtf.Dimension("heads", HEADS)
  d_kv = mtf.Dimension("d_kv", D_KV)
  d_ff = mtf.Dimension("d_ff", D_FF)
  x = mtf.import_tf_tensor(
    mesh,
    tf.constant(rng.randn(BATCH, D_MODEL).astype(np.float32)),
    mtf.Shape([batch, d_model]),
  )
  h = mtf.layers.layer_norm(x, d_model, name="ln1")
  a = mtf.layers.dense(h, [heads, d_kv], activation=mtf.relu, name="q")
  h += mtf.layers.dense(a, d_model, reduced_dims=[heads, d_kv], name="o")
  h = mtf.layers.layer_norm(h, d_model, name="ln2")
  f = mtf.layers.dense(h, d_ff, activation=mtf.relu, name="wi")
  y = mtf.layers.dense(f, d_model, reduced_dims=[d_ff], name="wo")
  scale = mtf.get_variable(
    mesh, "rms_scale", [d_model], initializer=tf1.ones_initializer()
  )
  y *= mtf.rsqrt(mtf.reduce_mean(mtf.square(y), reduced_dim=d_model) + 1e-6)
  return mtf.reduce_mean(mtf.square(y * scale + x - 0.5))


def train(mtf, mesh_shape: str, layout: str, order_reads: bool = False) -> Run:
  """Trains STEPS steps on a placement mesh of virtual CPUs.

  Args:
    mtf: the mesh_tensorflow package to run.
    mesh_shape: the mesh shape, e.g. "batch:2;model:2".
    layout: the layout rules.
    order_reads: make every read of a variable in the step run before the
      variable's updates (how the original's numbers were recorded: without
      it its numbers vary from run to run).

  Returns:
    the losses, slices and unordered reads (a Run).
  """
  rng = np.random.RandomState(0)
  with tf.Graph().as_default():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    loss = _model_loss(mtf, mesh, rng)
    variables = list(graph.trainable_variables)
    grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
    optimizer = mtf.optimize.AdafactorOptimizer(
      learning_rate=0.01, min_dim_size_to_factor=4
    )
    updates = optimizer.apply_grads(grads, variables)
    shape = mtf.convert_to_shape(mesh_shape)
    mesh_impl = mtf.placement_mesh_impl.PlacementMeshImpl(
      shape,
      mtf.convert_to_layout_rules(layout),
      ["/cpu:%d" % i for i in range(shape.size)],
    )
    lowering = mtf.Lowering(graph, {mesh: mesh_impl})
    tf_loss = lowering.export_to_tf_tensor(loss)
    step = tf1.train.get_or_create_global_step()
    with tf.control_dependencies(
      [lowering.lowered_operation(u) for u in updates]
    ):
      train_op = tf1.assign_add(step, 1).op
    unordered = unordered_reads([train_op, tf_loss.op])
    if order_reads:
      for _, read, write in unordered:
        tf1.get_default_graph().get_operation_by_name(write)._add_control_input(  # pylint: disable=protected-access
          tf1.get_default_graph().get_operation_by_name(read)
        )
    slices = {
      v.name: laid_out.laid_out_tensor.all_slices
      for v, laid_out in lowering.variables.items()
    }
    begins = {
      v.name: [mesh_impl.slice_begin(v.shape, p) for p in range(shape.size)]
      for v in lowering.variables
    }
    set_weights = [
      v.assign_to_master(
        tf.constant(0.3 * rng.randn(*v.shape.to_integer_list), tf.float32)
      )
      for v in sorted(variables, key=lambda v: v.name)
    ]
    config = tf1.ConfigProto(device_count={"CPU": 8})
    with tf1.Session(config=config) as session:
      session.run(tf1.global_variables_initializer())
      session.run(set_weights)
      session.run(lowering.copy_masters_to_slices())
      losses = [session.run([tf_loss, train_op])[0] for _ in range(STEPS)]
      values = session.run(slices)
  return Run(losses, values, begins, unordered)
