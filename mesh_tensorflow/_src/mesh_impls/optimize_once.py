"""A traced function optimised by Grappler once, for calls on many devices.

When a `tf.function` first runs, TensorFlow inlines the functions its graph
calls and optimises the whole graph with Grappler (about 0.5 ms a node for
all passes together). SimdMeshImpl's collective backend calls one replica
program per device, so its body is optimised once per device: at 64 devices
most of a step's first run. `optimize_function` runs Grappler on the body
once and returns a copy of the function holding the optimised graph, marked
not to be inlined (nor specialised); called with Grappler turned off
(`calls_config`), each device's call then only places, partitions and
builds its executor for that graph.

Grappler is given the body as an inlining caller's graph would hold it, so
that it rewrites it as it would there:

- every node is on a device of the calls (rewrites depend on the device
  type); the devices are removed again afterwards;
- a resource input is an `_Arg` node with the handle's dtype and shape
  (`_handle_dtypes`, `_handle_shapes`), as TensorFlow gives a function's
  resource arguments;
- any other input is a `PlaceholderWithDefault` of the input's static
  shape: Grappler knows its shape, not its value (a `Placeholder` would be
  a feed of unknown shape); an attribute of its own keeps passes from
  merging two of them;
- the outputs are `_Retval` nodes; they and the function's control outputs
  (its side effects: assignments, collectives) are the nodes Grappler
  keeps.

Calling the optimised copy with a `StatefulPartitionedCall` makes each
device's call instantiate it as a multi-device function: copy it into a
graph, run the pre- and post-placement passes (XLA's among them), place and
partition it, copy it again for the device, optimise it with TensorFlow's
classic graph optimiser and build its executor. When `direct` is set, the
copy is instead called as an op of its own type (a direct call), which
TensorFlow runs as a function of the call's device only: it skips the
passes, placement and partitioning (about two thirds of a call's first
run). Of those, only oneDNN's layout pass (`MklLayoutRewritePass`, on when
oneDNN is) changes what runs: it makes `MatMul`, `Einsum` and `Softmax` of
float32 the oneDNN kernels. The direct copy has these rewrites made in
advance (`_MKL_RENAMES`, as the pass makes them), and `direct` is set only
for bodies whose every op is one of those or of `_KEPT_BY_LAYOUT_PASS`,
ops the pass was seen to leave as they are (other ops, or other dtypes of
the renamed ones, keep the partitioned calls).

Use: `optimized = optimize_function(concrete, config, "/cpu:0")`, add
`optimized.function` to the caller's graph and, if `optimized.direct`, make
ops of type `optimized.function.name` (only attributes starting with `_`),
else call it with `StatefulPartitionedCall` and `calls_config(config)` as
each call's config_proto (see simd_collective).
"""

from __future__ import annotations

from typing import List, NamedTuple, Optional

from absl import logging
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2
from tensorflow.core.framework import graph_pb2
from tensorflow.core.framework import node_def_pb2
from tensorflow.core.protobuf import config_pb2
from tensorflow.core.protobuf import device_properties_pb2
from tensorflow.core.protobuf import meta_graph_pb2
from tensorflow.python.client import pywrap_tf_session  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.eager import context  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.eager.polymorphic_function import atomic_function  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.grappler import cluster as grappler_cluster  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.grappler import tf_optimizer  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.ops import handle_data_util  # pylint: disable=g-direct-tensorflow-import
from tensorflow.python.util import _pywrap_util_port  # pylint: disable=g-direct-tensorflow-import

__all__ = ["calls_config", "optimize_function"]

# Name suffix of the optimised copy of a function.
SUFFIX = "_optimized_once"
# Attribute that tells the input placeholders apart (see the module doc).
_INPUT_ATTR = "_optimize_once_input"
_RETVAL_PREFIX = "optimize_once_retval_"
# The kernel label oneDNN's layout pass gives the ops it renames.
_MKL_LABEL = b"MklNameChangeOp"
# Ops (of float32, attribute T) oneDNN's layout pass renames: their names then.
_MKL_RENAMES = {
  "MatMul": "_MklMatMul",
  "Einsum": "_MklEinsum",
  "Softmax": "_MklSoftmax",
}
# Ops oneDNN's layout pass was seen to leave unchanged (TF 2.21, its log at
# TF_CPP_VMODULE=mkl_layout_pass=2: the benchmark's transformer step, and a
# float32 function of each of these ops, in which it renamed only MatMul,
# BatchMatMulV2, Einsum, Softmax and Transpose). A body with any other op
# keeps the partitioned calls.
_KEPT_BY_LAYOUT_PASS = frozenset(
  """
  _Arg _Retval Placeholder NoOp Identity Const
  Abs Add AddN AddV2 All Any ArgMax AssignAddVariableOp AssignSubVariableOp
  AssignVariableOp BroadcastArgs BroadcastTo Cast Ceil
  CollectiveAllToAllV2 CollectiveGatherV2 CollectiveReduceV2 Cos
  DivNoNan EnsureShape Equal Exp ExpandDims Fill Floor FloorDiv FloorMod
  GatherV2 Greater GreaterEqual Less LessEqual Log LogicalAnd LogicalNot
  LogicalOr Max Maximum Mean Min Minimum Mul Neg NotEqual OneHot Pack Pow
  Prod Range ReadVariableOp RealDiv Reciprocal Relu ReluGrad Reshape Rsqrt
  Select SelectV2 Shape Sigmoid Sign Sin Slice Sqrt Square Squeeze
  StopGradient StridedSlice Sub Sum Tanh Tile Unpack ZerosLike
  """.split()
)


class Optimized(NamedTuple):
  """A function optimised once (see the module).

  Attributes:
    function: the optimised copy (an AtomicFunction registered in the eager
      context).
    direct: whether to call it directly (an op of its own type), not with
      `StatefulPartitionedCall`.
  """

  function: object
  direct: bool


def calls_config(config_proto: bytes) -> bytes:
  """The serialized ConfigProto `config_proto` with Grappler turned off."""
  config = config_pb2.ConfigProto()
  config.ParseFromString(config_proto)
  config.graph_options.rewrite_options.disable_meta_optimizer = True
  return config.SerializeToString()


def optimize_function(
  concrete, config_proto: bytes, device: str, direct: bool = True
) -> Optional[Optimized]:
  """The optimised, not inlined copy of a traced function (see the module).

  Args:
    concrete: the traced function (a ConcreteFunction).
    config_proto: the serialized ConfigProto of its calls (the Grappler
      passes to run).
    device: a device of the calls (its type matters).
    direct: whether the copy may be made for direct calls (see the module).

  Returns:
    the copy, to be added to the callers' graph, and how to call it; or None
    if the optimised graph needs functions the original does not (then call
    the original).
  """
  graph = concrete.graph
  forward = concrete._delayed_rewrite_functions.forward()  # pylint: disable=protected-access
  name = forward.cached_definition.signature.name + SUFFIX
  full_device = _full_device_name(device)
  body = graph.as_graph_def()
  known_functions = {f.signature.name for f in body.library.function}
  input_index = {t.op.name: i for i, t in enumerate(graph.inputs)}
  placed = set()
  added = []
  for node in body.node:
    if node.device:
      placed.add(node.name)
    else:
      node.device = full_device
    i = input_index.get(node.name)
    if i is not None:
      added += _as_input(node, graph.inputs[i], i)
  body.node.extend(added)
  keep = [op.name for op in graph.control_outputs]
  for i, t in enumerate(graph.outputs):
    node = body.node.add(
      name=_RETVAL_PREFIX + str(i),
      op="_Retval",
      input=[t.name],
      device=full_device,
    )
    node.attr["T"].type = t.dtype.as_datatype_enum
    node.attr["index"].i = i
    keep.append(node.name)
  meta = meta_graph_pb2.MetaGraphDef()
  meta.graph_def.CopyFrom(body)
  meta.collection_def["train_op"].node_list.value.extend(keep)
  config = config_pb2.ConfigProto()
  config.ParseFromString(config_proto)
  cluster = grappler_cluster.Cluster(
    devices=[
      device_properties_pb2.NamedDevice(
        name=full_device,
        properties=device_properties_pb2.DeviceProperties(
          type=tf.DeviceSpec.from_string(full_device).device_type
        ),
      )
    ]
  )
  try:
    optimized = tf_optimizer.OptimizeGraph(
      config, meta, verbose=False, cluster=cluster
    )
  finally:
    cluster.Shutdown()
  if not _uses_only(optimized, known_functions):
    logging.info("%s: Grappler made new functions; calling the original", name)
    return None
  function_graph = _function_graph(optimized, body, graph, placed, full_device)
  direct = (
    direct
    and not body.library.function
    and _for_direct_calls(function_graph[0], _pywrap_util_port.IsMklEnabled())
  )
  return Optimized(_register(name, function_graph, graph, forward), direct)


def _for_direct_calls(graph_def: graph_pb2.GraphDef, mkl: bool) -> bool:
  """Readies graph_def's nodes for direct calls if it can (see the module).

  Args:
    graph_def: the optimised body; with `mkl`, its ops that oneDNN's layout
      pass would rename are renamed (when it returns True).
    mkl: whether oneDNN's layout pass runs (oneDNN is on).

  Returns:
    whether the body may be called directly.
  """
  renamed = []
  for node in graph_def.node:
    if node.op in _MKL_RENAMES:
      dtype = node.attr["T"].type if "T" in node.attr else None
      if dtype != tf.float32.as_datatype_enum or "_kernel" in node.attr:
        return False
      renamed.append(node)
    elif node.op not in _KEPT_BY_LAYOUT_PASS:
      return False
  if mkl:
    for node in renamed:
      node.op = _MKL_RENAMES[node.op]
      node.attr["_kernel"].s = _MKL_LABEL
  return True


def _full_device_name(device: str) -> str:
  """`device` with job, replica, task and index (Grappler's device names)."""
  spec = tf.DeviceSpec.from_string(device)
  if spec.job is None:
    spec = tf.DeviceSpec(job="localhost", replica=0, task=0).make_merged_spec(
      spec
    )
  return spec.replace(
    replica=spec.replica or 0,
    task=spec.task or 0,
    device_index=spec.device_index or 0,
  ).to_string()


def _as_input(node, tensor, index: int) -> List[node_def_pb2.NodeDef]:
  """Rewrites the placeholder `node` of input `index` (see the module doc).

  Returns:
    the nodes to add to the body for it.
  """
  dtype = tensor.dtype.as_datatype_enum
  if tensor.dtype == tf.resource:
    node.op = "_Arg"
    node.ClearField("attr")
    node.attr["T"].type = dtype
    node.attr["index"].i = index
    data = handle_data_util.get_resource_handle_data(tensor)
    if data.is_set and data.shape_and_type:
      node.attr["_handle_dtypes"].list.type.extend(
        [x.dtype for x in data.shape_and_type]
      )
      node.attr["_handle_shapes"].list.shape.extend(
        [x.shape for x in data.shape_and_type]
      )
    return []
  default = node_def_pb2.NodeDef(
    name="%s/%s_default" % (node.name, _INPUT_ATTR),
    op="Const",
    device=node.device,
  )
  default.attr["dtype"].type = dtype
  value = default.attr["value"].tensor
  value.dtype = dtype
  if tensor.shape.rank is not None:
    for size in tensor.shape.as_list():
      value.tensor_shape.dim.add(size=size or 0)
  node.op = "PlaceholderWithDefault"
  node.input.append(default.name)
  for n in (node, default):
    n.attr[_INPUT_ATTR].i = index
  return [default]


def _uses_only(graph_def: graph_pb2.GraphDef, functions) -> bool:
  """Whether the nodes of graph_def call no function outside `functions`."""
  new = {f.signature.name for f in graph_def.library.function} - set(functions)
  if not new:
    return True
  for node in graph_def.node:
    if node.op in new:
      return False
    for value in node.attr.values():
      names = [value.func.name] if value.HasField("func") else []
      names += [f.name for f in value.list.func]
      if new.intersection(names):
        return False
  return True


def _function_graph(optimized, body, graph, placed, device):
  """The optimised graph with placeholders for inputs, ready to import.

  Returns:
    (GraphDef, [name of each input placeholder], [output tensor names]).
  """
  result = graph_pb2.GraphDef()
  result.versions.CopyFrom(body.versions)
  result.library.CopyFrom(body.library)
  outputs = {}
  nodes = {}
  for node in optimized.node:
    if node.op == "_Retval" and node.name.startswith(_RETVAL_PREFIX):
      outputs[node.attr["index"].i] = node.input[0]
      continue
    new = result.node.add()
    new.CopyFrom(node)
    if new.device == device and new.name not in placed:
      new.device = ""
    nodes[new.name] = new
  input_names = []
  for t in graph.inputs:
    name = t.op.name
    placeholder = nodes.get(name)
    if placeholder is None or (
      placeholder.op != "_Arg" and _INPUT_ATTR not in placeholder.attr
    ):
      # Folded into the body or removed: the calls still pass the input.
      while name in nodes:
        name += "_unused"
      placeholder = nodes[name] = result.node.add(name=name)
    placeholder.op = "Placeholder"
    del placeholder.input[:]
    placeholder.ClearField("attr")
    placeholder.attr["dtype"].type = t.dtype.as_datatype_enum
    placeholder.attr["shape"].shape.CopyFrom(t.shape.as_proto())
    input_names.append(placeholder.name)
  output_names = [outputs[i] for i in range(len(graph.outputs))]
  return result, input_names, output_names


def _register(name, function_graph, graph, forward):
  """Makes the function of `function_graph` and registers it (eager context).

  Returns:
    its AtomicFunction.
  """
  graph_def, input_names, output_names = function_graph
  importing = tf.Graph()
  with importing.as_default():
    tf.graph_util.import_graph_def(graph_def, name="")
  inputs = set(input_names)
  control_outputs = [op.name for op in graph.control_outputs]
  with importing._c_graph.get() as c_graph:  # pylint: disable=protected-access
    fn = pywrap_tf_session.TF_GraphToFunction_wrapper(
      c_graph,
      name,
      False,
      [
        op._c_op  # pylint: disable=protected-access
        for op in importing.get_operations()
        if op.name not in inputs
      ],
      [
        importing.get_tensor_by_name(n + ":0")._as_tf_output()  # pylint: disable=protected-access
        for n in input_names
      ],
      [
        importing.get_tensor_by_name(
          n if ":" in n else n + ":0"
        )._as_tf_output()  # pylint: disable=protected-access
        for n in output_names
      ],
      [
        tf.compat.as_bytes(a.name)
        for a in forward.cached_definition.signature.output_arg
      ],
      [
        importing.get_operation_by_name(n)._c_op  # pylint: disable=protected-access
        for n in control_outputs
      ],
      [tf.compat.as_bytes(n) for n in control_outputs],
      None,
      "",
    )
  try:
    for attr in ("_noinline", "_nospecialize"):
      pywrap_tf_session.TF_FunctionSetAttrValueProto(
        fn, attr, attr_value_pb2.AttrValue(b=True).SerializeToString()
      )
    bound = context.context()
    bound.add_c_function(fn)
  finally:
    pywrap_tf_session.TF_DeleteFunction(fn)
  return atomic_function.AtomicFunction(
    name, bound, forward.function_type, children=forward.children
  )
