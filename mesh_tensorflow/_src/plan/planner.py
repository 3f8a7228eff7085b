"""The planner: memory, FLOPs, communication and step time of a layout.

plan_graph lowers an mtf graph shape-only (see counting.py) for a mesh shape
and layout rules and returns a Plan: per-device parameter, optimizer-slot and
peak activation bytes, FLOPs and memory traffic per step, the bytes each kind
of collective sends, and, for a hardware profile, an estimated step time.
plan_gin builds a gin-configured Transformer training step (model, loss,
gradients, optimizer) shape-only and plans it.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Optional, Sequence, Tuple, Union

import tensorflow as tf

from mesh_tensorflow._src import graph as graph_lib
from mesh_tensorflow._src import layout as layout_lib
from mesh_tensorflow._src import variables
from mesh_tensorflow._src.mesh_impl import COLLECTIVE_KINDS
from mesh_tensorflow._src.mesh_impl import MeshImpl
from mesh_tensorflow._src.ops import gradients
from mesh_tensorflow._src.ops import io
from mesh_tensorflow._src.optimizers import adafactor
from mesh_tensorflow._src.optimizers import base
from mesh_tensorflow._src.plan import counting
from mesh_tensorflow._src.plan.hardware import HardwareProfile
from mesh_tensorflow._src.plan.hardware import get_hardware_profile
from mesh_tensorflow._src.shapes import Dimension
from mesh_tensorflow._src.shapes import Shape
from mesh_tensorflow._src.shapes import convert_to_shape

HardwareLike = Union[str, HardwareProfile]


@dataclasses.dataclass(frozen=True)
class StepTime:
  """An estimated step time and its parts, in seconds.

  Attributes:
    hardware: the profile's name.
    compute: time of the processor's TF ops, each limited by peak FLOPs or by
      memory bandwidth, whichever is slower (a roofline).
    communication: collective bytes over link bandwidth.
    overhead: per-op launch cost.
    total: their sum (no overlap assumed).
  """

  hardware: str
  compute: float
  communication: float
  overhead: float
  total: float


@dataclasses.dataclass(frozen=True)
class Plan:
  """Per-device costs of one training step under one layout.

  All figures are per device (processor) and per step.

  Attributes:
    mesh_shape: the mesh shape, e.g. "rows:2;cols:2".
    layout_rules: the layout rules, e.g. "batch:rows;d_ff:cols".
    num_devices: the number of processors of the mesh.
    param_bytes: trainable variables (the largest slice: replicas count).
    slot_bytes: other variables: optimizer slots, counters.
    activation_bytes: estimated peak of live activations.
    flops: floating point operations (matmuls count 2 per multiply-add).
    matmul_flops: the part of flops done by matmuls and einsums.
    bytes_accessed: bytes the TF ops read and write (memory traffic).
    num_ops: the TF ops of one processor's program.
    collective_bytes: {kind: bytes a device sends}, kinds "allreduce",
      "allconcat", "alltoall", "shift" (the average over devices).
    collective_total_bytes: {kind: bytes sent by all devices}, exactly as the
      Lowering's "collective_bytes/<kind>" counters give them.
    dtype: the dtype of most matmul FLOPs (picks the profile's peak).
    hardware: the profile of estimated_step_time, if one was given.
    estimated_step_time: the step-time estimate on `hardware`, or None.
    op_costs: the TF ops' costs, grouped (see counting.OpCost).
  """

  mesh_shape: str
  layout_rules: str
  num_devices: int
  param_bytes: int
  slot_bytes: int
  activation_bytes: int
  flops: int
  matmul_flops: int
  bytes_accessed: int
  num_ops: int
  collective_bytes: Dict[str, float]
  collective_total_bytes: Dict[str, int]
  dtype: str
  hardware: Optional[HardwareProfile] = None
  estimated_step_time: Optional[StepTime] = None
  op_costs: Tuple[counting.OpCost, ...] = dataclasses.field(
    default=(), repr=False
  )

  @property
  def memory_bytes(self) -> int:
    """Parameters, slots and peak activations of one device."""
    return self.param_bytes + self.slot_bytes + self.activation_bytes

  @property
  def communication_bytes(self) -> float:
    """Bytes one device sends per step, all collectives together."""
    return sum(self.collective_bytes.values())

  def step_time(self, hardware: HardwareLike) -> StepTime:
    """Estimated step time on a hardware profile.

    Each TF op takes max(FLOPs / peak, bytes / memory bandwidth); the
    collectives take their bytes over the link bandwidth; each op costs the
    profile's launch overhead. On a profile whose devices share one machine
    (this_machine: virtual CPU devices), every device's work adds up.

    Args:
      hardware: a HardwareProfile or the name of one in HARDWARE_PROFILES.

    Returns:
      a StepTime.

    Raises:
      ValueError: for an unknown profile, or a mesh with more devices than the
        profile has.
    """
    hw = get_hardware_profile(hardware)
    hw.check_num_devices(self.num_devices, self.mesh_shape)
    compute = 0.0
    for cost in self.op_costs:
      flops_time = cost.flops / hw.peak_flops(
        cost.dtype if cost.matmul else "float32"
      )
      memory_time = cost.bytes_accessed / hw.hbm_bandwidth
      compute += max(flops_time, memory_time)
    communication = self.communication_bytes / hw.link_bandwidth
    overhead = self.num_ops * hw.op_overhead_seconds
    if hw.shared_compute:
      compute *= self.num_devices
      communication *= self.num_devices
      overhead *= self.num_devices
    return StepTime(
      hardware=hw.name,
      compute=compute,
      communication=communication,
      overhead=overhead,
      total=compute + communication + overhead,
    )

  def fits(self, hardware: HardwareLike) -> bool:
    """Whether one device's memory holds the step's memory_bytes.

    Args:
      hardware: a HardwareProfile or the name of one.

    Returns:
      a bool.
    """
    return self.memory_bytes <= get_hardware_profile(hardware).hbm_bytes

  def to_text(self) -> str:
    """A readable per-device report of the plan.

    Returns:
      a multi-line string.
    """
    lines = [
      "mesh %s (%d devices), layout %s"
      % (
        self.mesh_shape or "(one device)",
        self.num_devices,
        self.layout_rules or "(replicated)",
      ),
      "per device, per step:",
      "  parameters       %s" % format_bytes(self.param_bytes),
      "  optimizer slots  %s" % format_bytes(self.slot_bytes),
      "  activations      %s (estimated peak)"
      % format_bytes(self.activation_bytes),
      "  memory total     %s" % format_bytes(self.memory_bytes),
      "  FLOPs            %.4g (matmuls %.4g, %s)"
      % (self.flops, self.matmul_flops, self.dtype),
      "  memory traffic   %s in %d TF ops"
      % (format_bytes(self.bytes_accessed), self.num_ops),
      "  collectives (bytes sent):",
    ]
    for kind in COLLECTIVE_KINDS:
      lines.append(
        "    %-10s %s" % (kind, format_bytes(self.collective_bytes[kind]))
      )
    if self.estimated_step_time is not None:
      t = self.estimated_step_time
      hw = self.hardware
      lines.append(
        "estimated step time on %s (%s): %s"
        % (hw.name, hw.description, format_seconds(t.total))
      )
      lines.append(
        "  compute %s, communication %s, op overhead %s"
        % (
          format_seconds(t.compute),
          format_seconds(t.communication),
          format_seconds(t.overhead),
        )
      )
      if self.memory_bytes > hw.hbm_bytes:
        lines.append(
          "  DOES NOT FIT: %s per device, %s has %s"
          % (
            format_bytes(self.memory_bytes),
            hw.name,
            format_bytes(hw.hbm_bytes),
          )
        )
    return "\n".join(lines)


def format_bytes(n: float) -> str:
  """A byte count with a binary unit, e.g. "1.50 MiB".

  Example:
    >>> format_bytes(1536 * 1024)
    '1.50 MiB'

  Args:
    n: a number of bytes.

  Returns:
    a string.
  """
  for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
    if abs(n) < 1024 or unit == "TiB":
      return ("%d %s" % (n, unit)) if unit == "B" else "%.2f %s" % (n, unit)
    n /= 1024
  return "%.2f TiB" % n


def format_seconds(seconds: float) -> str:
  """Seconds with a readable unit, e.g. "12.3 ms".

  Args:
    seconds: a duration.

  Returns:
    a string.
  """
  if seconds >= 1:
    return "%.3g s" % seconds
  if seconds >= 1e-3:
    return "%.3g ms" % (seconds * 1e3)
  return "%.3g us" % (seconds * 1e6)


def _single_mesh(graph):
  meshes = []
  for op in graph.operations:
    mesh = getattr(op, "mesh", None)
    if mesh is not None and mesh not in meshes:
      meshes.append(mesh)
  if len(meshes) != 1:
    raise ValueError(
      "plan_graph needs a graph on exactly one mesh (pass mesh=...); "
      "found %d: %s" % (len(meshes), [m.name for m in meshes])
    )
  return meshes[0]


def check_layout(graph, mesh_shape, layout_rules) -> None:
  """Raises ValueError if some tensor of graph cannot take the layout.

  Args:
    graph: an mtf Graph.
    mesh_shape: the mesh Shape.
    layout_rules: the LayoutRules.

  Raises:
    ValueError: naming the tensor, the dimension, the rule and the mesh.
  """
  for op in graph.operations:
    for tensor in op.outputs:
      for dim in tensor.shape.dims:
        try:
          layout_lib.tensor_dim_to_size_per_split(layout_rules, mesh_shape, dim)
        except ValueError as e:
          raise ValueError(
            "layout %r does not fit mesh %r: tensor %s of operation %r: %s"
            % (
              _rules_string(layout_rules),
              _mesh_string(mesh_shape),
              tensor.shape.to_string,
              op.name,
              e,
            )
          ) from None


def _main_dtype(op_costs) -> str:
  by_dtype = {}
  for cost in op_costs:
    if cost.matmul:
      by_dtype[cost.dtype] = by_dtype.get(cost.dtype, 0) + cost.flops
  if not by_dtype:
    return "float32"
  return max(by_dtype, key=by_dtype.get)


def plan_graph(
  graph,
  mesh_shape,
  layout_rules,
  hardware: Optional[HardwareLike] = None,
  *,
  exported: Sequence = (),
  mesh=None,
) -> Plan:
  """Plans one step of an mtf graph on a mesh shape and layout, shape-only.

  The graph should hold the whole step (for training: loss, gradients and
  the optimizer's updates, whose slot variables then count as slot_bytes).
  It is lowered shape-only, by the code a SimdMeshImpl runs, into a scratch
  TF graph that never runs; its collective counts are the Lowering's own.

  Example:
    >>> graph = mtf.Graph()
    >>> mesh = mtf.Mesh(graph, "mesh")
    >>> batch, d_in = mtf.Dimension("batch", 64), mtf.Dimension("d_in", 32)
    >>> d_out = mtf.Dimension("d_out", 16)
    >>> with tf.Graph().as_default():  # shape-only: no weight is allocated
    ...   x = mtf.zeros(mesh, [batch, d_in])
    ...   w = mtf.get_variable(mesh, "w", [d_in, d_out])
    ...   loss = mtf.reduce_sum(mtf.einsum([x, w], output_shape=[batch, d_out]))
    ...   [dw] = mtf.gradients([loss], [w])
    ...   _ = mtf.assign_sub(w, dw)
    >>> plan = plan_graph(graph, "all:4", "batch:all", exported=[loss])
    >>> plan.param_bytes  # the whole 32x16 float32 kernel on every device
    2048
    >>> plan.collective_bytes["allreduce"]  # 2 * 3/4 of dw, plus the loss
    3078.0
    >>> plan.step_time("tpu_v3").total < 1e-3
    True

  Args:
    graph: the mtf Graph of the step.
    mesh_shape: the mesh shape (a string such as "rows:4;cols:2" or a Shape).
    layout_rules: the layout rules (a string or LayoutRules).
    hardware: optional HardwareProfile or profile name for the estimate.
    exported: mtf Tensors the step exports to TF (its loss): pending sums in
      them are reduced, as an export does.
    mesh: the Mesh to plan, when the graph has several.

  Returns:
    a Plan.

  Raises:
    ValueError: a layout that does not divide a dimension, an unknown hardware
      profile, or a mesh with more devices than the profile has.
  """
  mesh_shape = convert_to_shape(mesh_shape)
  layout_rules = layout_lib.convert_to_layout_rules(layout_rules)
  hw = None if hardware is None else get_hardware_profile(hardware)
  if hw is not None:
    hw.check_num_devices(mesh_shape.size, _mesh_string(mesh_shape))
  check_layout(graph, mesh_shape, layout_rules)
  if mesh is None:
    mesh = _single_mesh(graph)
  layout_impl = MeshImpl(mesh_shape, layout_rules)
  param_bytes, slot_bytes = counting.variable_bytes(graph, layout_impl)
  activation_bytes = counting.peak_activation_bytes(graph, layout_impl)
  lowered = counting.lower_shape_only(
    graph, mesh, mesh_shape, layout_rules, exported=exported
  )
  op_costs = lowered.op_costs
  num_devices = mesh_shape.size
  plan = Plan(
    mesh_shape=_mesh_string(mesh_shape),
    layout_rules=_rules_string(layout_rules),
    num_devices=num_devices,
    param_bytes=param_bytes,
    slot_bytes=slot_bytes,
    activation_bytes=activation_bytes,
    flops=sum(c.flops for c in op_costs),
    matmul_flops=sum(c.flops for c in op_costs if c.matmul),
    bytes_accessed=sum(c.bytes_accessed for c in op_costs),
    num_ops=sum(c.count for c in op_costs),
    collective_bytes={
      k: v / num_devices for k, v in lowered.collective_total_bytes.items()
    },
    collective_total_bytes=dict(lowered.collective_total_bytes),
    dtype=_main_dtype(op_costs),
    op_costs=op_costs,
  )
  if hw is None:
    return plan
  return dataclasses.replace(
    plan, hardware=hw, estimated_step_time=plan.step_time(hw)
  )


def _rules_string(layout_rules) -> str:
  return ";".join("%s:%s" % pair for pair in layout_rules)


def _mesh_string(mesh_shape) -> str:
  return ";".join("%s:%d" % (d.name, d.size) for d in mesh_shape.dims)


def _query_gin(selector, default=None):
  import gin  # pylint: disable=g-import-not-at-top

  try:
    value = gin.query_parameter(selector)
  except ValueError:
    return default
  if isinstance(value, gin.config.ConfigurableReference):
    fn = value.scoped_configurable_fn
    value = fn() if value.evaluate else fn
  return value


def _gin_sequence_length(value) -> int:
  if isinstance(value, dict):
    return max(value.values())
  return int(value)


def _gin_batch_size(value, sequence_length: int) -> int:
  if isinstance(value, (tuple, list)):
    kind, amount = value
    if kind == "tokens_per_batch":
      return max(1, amount // sequence_length)
    return int(amount)
  return int(value)


@dataclasses.dataclass(frozen=True)
class GinStep:
  """A gin-configured Transformer training step, built shape-only.

  Attributes:
    graph: the mtf Graph of the step (model, loss, gradients, updates).
    mesh: the Mesh it is built on.
    loss: the loss Tensor (what the step exports).
    mesh_shape: the mesh Shape to lay it out on.
    layout_rules: the LayoutRules to lay it out by.
  """

  graph: graph_lib.Graph
  mesh: graph_lib.Mesh
  loss: graph_lib.Tensor
  mesh_shape: Shape
  layout_rules: layout_lib.LayoutRules

  def plan(self, hardware: Optional[HardwareLike] = None) -> Plan:
    """Plans the step (plan_graph) on its mesh shape and layout.

    Args:
      hardware: optional HardwareProfile or profile name for the estimate.

    Returns:
      a Plan.
    """
    return plan_graph(
      self.graph,
      self.mesh_shape,
      self.layout_rules,
      hardware,
      exported=[self.loss],
      mesh=self.mesh,
    )


def build_gin_step(
  gin_files: Sequence[str],
  gin_params: Sequence[str] = (),
  mesh_shape=None,
  layout_rules=None,
  batch_size: Optional[int] = None,
  sequence_length: Optional[int] = None,
  *,
  vocab_size: int = 32128,
  optimizer=None,
) -> GinStep:
  """Builds a training step of a gin-configured Transformer, shape-only.

  Parses configs/defaults.gin, gin_files and gin_params as the driver does
  (the gin config is replaced, and stays parsed afterwards), then builds the
  model of `utils.run.model_type` with its loss, gradients and optimizer
  updates in a scratch tf.Graph (no weight is allocated).

  Args:
    gin_files: gin files, as --gin_file takes them (e.g. "models/bi_base.gin").
    gin_params: gin bindings, as --gin_param takes them.
    mesh_shape: the mesh shape; default: the gin binding utils.run.mesh_shape.
    layout_rules: the layout; default: the binding utils.run.layout_rules.
    batch_size: sequences per step; default from utils.run.batch_size.
    sequence_length: tokens per sequence; default from
      utils.run.sequence_length.
    vocab_size: the input and output vocabulary size.
    optimizer: an mtf.optimize.Optimizer, class or factory; default: the
      binding utils.run.optimizer, else AdafactorOptimizer (the driver's).

  Returns:
    a GinStep.
  """
  # Imported here: the transformer package is built on mesh_tensorflow.
  import gin  # pylint: disable=g-import-not-at-top

  from transformer import transformer  # pylint: disable=g-import-not-at-top
  from transformer import utils  # pylint: disable=g-import-not-at-top

  gin.clear_config()
  utils.parse_gin_defaults_and_flags(
    finalize_config=False,
    gin_files=list(gin_files),
    gin_params=list(gin_params),
  )
  model_type = _query_gin("utils.run.model_type", "bitransformer")
  if mesh_shape is None:
    mesh_shape = _query_gin("utils.run.mesh_shape", "")
  if layout_rules is None:
    layout_rules = _query_gin("utils.run.layout_rules", "")
  mesh_shape = convert_to_shape(mesh_shape)
  layout_rules = layout_lib.convert_to_layout_rules(layout_rules)
  if sequence_length is None:
    sequence_length = _gin_sequence_length(
      _query_gin("utils.run.sequence_length", 512)
    )
  if batch_size is None:
    batch_size = _gin_batch_size(
      _query_gin("utils.run.batch_size", ("tokens_per_batch", 2**16)),
      sequence_length,
    )
  if optimizer is None:
    optimizer = (
      _query_gin("utils.run.optimizer") or adafactor.AdafactorOptimizer
    )
  with tf.Graph().as_default():
    with variables.variable_store(variables.VariableStore()):
      graph = graph_lib.Graph()
      mesh = graph_lib.Mesh(graph, "mesh")
      model = utils.build_model(
        model_type, vocab_size, vocab_size, layout_rules, mesh_shape
      )
      shape = [
        Dimension("batch", batch_size),
        Dimension("length", sequence_length),
      ]
      ids = io.import_tf_tensor(
        mesh, tf.zeros([batch_size, sequence_length], tf.int32), shape
      )
      inputs = (
        transformer.autoregressive_inputs(ids) if model_type == "lm" else ids
      )
      _, loss = model.call_simple(
        inputs,
        ids,
        compute_loss=True,
        mode="train",
        variable_dtype=utils.get_variable_dtype(),
      )
      trainable = graph.trainable_variables
      grads = gradients.gradients([loss], [v.outputs[0] for v in trainable])
      if not isinstance(optimizer, base.Optimizer):
        optimizer = optimizer()
      optimizer.apply_grads(grads, trainable)
  return GinStep(graph, mesh, loss, mesh_shape, layout_rules)


def plan_gin(
  gin_files: Sequence[str],
  gin_params: Sequence[str] = (),
  mesh_shape=None,
  layout_rules=None,
  batch_size: Optional[int] = None,
  sequence_length: Optional[int] = None,
  hardware: Optional[HardwareLike] = None,
  *,
  vocab_size: int = 32128,
  optimizer=None,
) -> Plan:
  """Plans a training step of a gin-configured Transformer, shape-only.

  Builds the step with build_gin_step (the gin config is replaced, and
  stays parsed afterwards) and plans it with plan_graph.

  Args:
    gin_files: gin files, as --gin_file takes them (e.g. "models/bi_base.gin").
    gin_params: gin bindings, as --gin_param takes them.
    mesh_shape: the mesh shape; default: the gin binding utils.run.mesh_shape.
    layout_rules: the layout; default: the binding utils.run.layout_rules.
    batch_size: sequences per step; default from utils.run.batch_size.
    sequence_length: tokens per sequence; default from
      utils.run.sequence_length.
    hardware: optional HardwareProfile or profile name for the estimate.
    vocab_size: the input and output vocabulary size.
    optimizer: an mtf.optimize.Optimizer, class or factory; default: the
      binding utils.run.optimizer, else AdafactorOptimizer (the driver's).

  Returns:
    a Plan.

  Raises:
    ValueError: as plan_graph.
  """
  return build_gin_step(
    gin_files,
    gin_params,
    mesh_shape,
    layout_rules,
    batch_size,
    sequence_length,
    vocab_size=vocab_size,
    optimizer=optimizer,
  ).plan(hardware)
