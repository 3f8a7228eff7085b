"""Layouts (and mesh shapes) of least estimated step time under a memory cap.

Beyond the original auto_mtf, which minimizes peak memory: here the objective
is the planner's estimated step time on a hardware profile
(mesh_tensorflow.plan), subject to a per-device memory cap (parameters,
optimizer slots and peak activations).

The search is a branch and bound over the splittable dimensions, largest
einsum volume first: each dimension stays whole or takes a mesh dimension
that divides it and that no dimension sharing a tensor or an einsum with it
has taken. A
partial layout is pruned when a lower bound of its step time (the FLOPs of
the einsums, split as far as any completion could split them, at the best
peak of the profile) is no better than the best complete layout planned so
far.
Complete layouts over the memory cap are dropped before they are planned.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple

from mesh_tensorflow._src.auto_mtf.api import mesh_shape_iterator
from mesh_tensorflow._src.auto_mtf.valid_layouts import LayoutValidator
from mesh_tensorflow._src.graph import Graph
from mesh_tensorflow._src.layout import LayoutRules
from mesh_tensorflow._src.layout import convert_to_layout_rules
from mesh_tensorflow._src.mesh_impl import MeshImpl
from mesh_tensorflow._src.ops.einsum import EinsumOperation
from mesh_tensorflow._src.plan import counting
from mesh_tensorflow._src.plan.hardware import get_hardware_profile
from mesh_tensorflow._src.plan.planner import Plan
from mesh_tensorflow._src.plan.planner import plan_graph
from mesh_tensorflow._src.shapes import Dimension
from mesh_tensorflow._src.shapes import Shape
from mesh_tensorflow._src.shapes import convert_to_shape

Assignment = Dict[str, str]  # tensor dim name -> mesh dim name


@dataclasses.dataclass(frozen=True)
class StepTimeLayout:
  """The result of a step-time layout search.

  Attributes:
    layout_rules: the best layout found.
    mesh_shape: its mesh shape.
    plan: its Plan, with the estimated step time on the searched hardware.
    num_planned: how many layouts were planned (lowered shape-only).
    num_candidates: how many complete layouts the search space holds.
  """

  layout_rules: LayoutRules
  mesh_shape: Shape
  plan: Plan
  num_planned: int
  num_candidates: int


def _rules(assignment: Assignment) -> LayoutRules:
  return convert_to_layout_rules(sorted(assignment.items()))


def memory_bytes(graph: Graph, mesh_shape, layout_rules) -> int:
  """Per-device parameter, slot and peak activation bytes (no lowering).

  Args:
    graph: an mtf Graph.
    mesh_shape: the mesh shape.
    layout_rules: the layout rules.

  Returns:
    an int, as Plan.memory_bytes counts it.
  """
  mesh_impl = MeshImpl(mesh_shape, layout_rules)
  params, slots = counting.variable_bytes(graph, mesh_impl)
  return params + slots + counting.peak_activation_bytes(graph, mesh_impl)


class _Search:
  """Branch and bound over the assignments of one mesh shape."""

  def __init__(self, graph, mesh_shape, hw, memory_cap, exported):
    self.graph = graph
    self.mesh_shape = mesh_shape
    self.hw = hw
    self.memory_cap = memory_cap
    self.exported = exported
    validator = LayoutValidator(graph, mesh_shape)
    self.mesh_sizes = {d.name: d.size for d in mesh_shape.dims}
    # (dims, seconds per element of their product): a contraction is at
    # least a multiply and an add per element, a product a multiply.
    # Its FLOPs run at the peak of its dtype (or at the float32 one, if that
    # is higher: an einsum may lower to elementwise ops).
    # Only einsums the step needs: TF prunes the others (say the gradient of
    # a constant input).
    self.einsums = [
      (
        _union_dims(op),
        (2 if _contracts(op) else 1)
        / max(
          hw.peak_flops(op.outputs[0].dtype.name),
          hw.peak_flops("float32"),
        ),
      )
      for op in _needed_operations(graph, exported)
      if isinstance(op, EinsumOperation)
    ]
    volume = {}
    for dims, _ in self.einsums:
      v = _product(d.size for d in dims)
      for d in dims:
        volume[d.name] = volume.get(d.name, 0) + v
    self.dim_names = sorted(
      validator.splittable_mtf_dimension_names,
      key=lambda n: (-volume.get(n, 0), n),
    )
    self.options = {
      n: [m for m in self.mesh_sizes if validator.is_valid_assignment(n, m)]
      for n in self.dim_names
    }
    self.neighbours: Dict[str, Set[str]] = {n: set() for n in self.dim_names}
    groups = [[d.name for d in dims] for dims, _ in self.einsums]
    for op in graph.operations:
      groups.extend([d.name for d in t.shape.dims] for t in op.outputs)
    for names in groups:
      for n in names:
        if n in self.neighbours:
          self.neighbours[n].update(x for x in names if x != n)
    self.best: Optional[Tuple[float, Assignment, Plan]] = None
    self.num_planned = 0
    self.num_candidates = 0
    self.cache: Dict[Tuple, Optional[Plan]] = {}
    # Devices sharing one machine add up their work (see Plan.step_time).
    self.shared_factor = mesh_shape.size if hw.shared_compute else 1

  def lower_bound(self, assignment: Assignment, assigned: Set[str]) -> float:
    """Seconds no completion of `assignment` can beat (einsums only)."""
    total = 0.0
    for dims, seconds_per_element in self.einsums:
      used = {assignment[d.name] for d in dims if d.name in assignment}
      open_dims = any(d.name not in assigned for d in dims)
      split = _product(self.mesh_sizes[m] for m in used)
      if open_dims:
        split *= _product(
          s for m, s in self.mesh_sizes.items() if m not in used
        )
      total += seconds_per_element * _product(d.size for d in dims) / split
    return total * self.shared_factor

  def plan(self, assignment: Assignment) -> Optional[Plan]:
    key = tuple(sorted(assignment.items()))
    if key not in self.cache:
      rules = _rules(assignment)
      plan = None
      try:
        fits = (
          self.memory_cap is None
          or memory_bytes(self.graph, self.mesh_shape, rules) <= self.memory_cap
        )
        if fits:
          self.num_planned += 1
          plan = plan_graph(
            self.graph,
            self.mesh_shape,
            rules,
            self.hw,
            exported=self.exported,
          )
      except (ValueError, NotImplementedError):
        plan = None  # A layout some operation cannot lower.
      self.cache[key] = plan
    return self.cache[key]

  def consider(self, assignment: Assignment) -> None:
    self.num_candidates += 1
    plan = self.plan(assignment)
    if plan is None:
      return
    t = plan.estimated_step_time.total
    if self.best is None or t < self.best[0]:
      self.best = (t, dict(assignment), plan)

  def search(self, index: int, assignment: Assignment, assigned: Set[str]):
    if index == len(self.dim_names):
      self.consider(assignment)
      return
    name = self.dim_names[index]
    taken = {assignment[n] for n in self.neighbours[name] if n in assignment}
    children = [None] + [m for m in self.options[name] if m not in taken]
    bounds = []
    for m in children:
      if m is not None:
        assignment[name] = m
      bounds.append((self.lower_bound(assignment, assigned | {name}), m))
      assignment.pop(name, None)
    # Best bound first; on ties, splits before keeping the dimension whole.
    for bound, m in sorted(bounds, key=lambda b: (b[0], b[1] is None)):
      if self.best is not None and bound >= self.best[0]:
        continue
      if m is not None:
        assignment[name] = m
      self.search(index + 1, assignment, assigned | {name})
      assignment.pop(name, None)


def _union_dims(op) -> List[Dimension]:
  dims = []
  for t in list(op.inputs) + list(op.outputs):
    for d in t.shape.dims:
      if d not in dims:
        dims.append(d)
  return dims


def _needed_operations(graph: Graph, exported: Sequence) -> List:
  """Operations the exported tensors and the assignments depend on."""
  return counting.needed_in_order(
    graph.operations,
    [t.operation for t in exported]
    + [op for op in graph.operations if not op.outputs],
    lambda op: [t.operation for t in op.inputs],
  )


def _contracts(op) -> bool:
  output_dims = set(op.outputs[0].shape.dims)
  return any(d not in output_dims for d in _union_dims(op))


def _product(values: Iterable[int]) -> int:
  result = 1
  for v in values:
    result *= v
  return result


def layout_for_step_time(
  mtf_graph: Graph,
  mesh_shape,
  hardware,
  memory_cap: Optional[int] = None,
  exported: Sequence = (),
) -> StepTimeLayout:
  """The layout of least estimated step time on a mesh, under a memory cap.

  Example:
    >>> graph = mtf.Graph()
    >>> mesh = mtf.Mesh(graph, "mesh")
    >>> with tf.Graph().as_default():
    ...   x = mtf.zeros(mesh, "batch:64,d_in:512")
    ...   w = mtf.get_variable(mesh, "w", "d_in:512,d_out:2048")
    ...   y = mtf.reduce_sum(mtf.einsum([x, w], output_shape="batch:64,d_out:2048"))
    >>> found = layout_for_step_time(graph, "m:4", "tpu_v3", exported=[y])
    >>> found.layout_rules  # split the wide output: no collective needed
    LayoutRules([('d_out', 'm')])

  Args:
    mtf_graph: the mtf Graph of a step (see mesh_tensorflow.plan.plan_graph).
    mesh_shape: the mesh shape.
    hardware: a HardwareProfile or the name of one.
    memory_cap: optional per-device bytes a layout may use (parameters,
      optimizer slots and peak activations); default: no cap.
    exported: the tensors the step exports (its loss).

  Returns:
    a StepTimeLayout.

  Raises:
    ValueError: if no layout fits the memory cap, or for bad hardware.
  """
  hw = get_hardware_profile(hardware)
  mesh_shape = convert_to_shape(mesh_shape)
  hw.check_num_devices(mesh_shape.size, str(mesh_shape))
  search = _Search(mtf_graph, mesh_shape, hw, memory_cap, exported)
  search.search(0, {}, set())
  if search.best is None:
    raise ValueError(
      "no layout of the graph on mesh %s fits the memory cap of %s bytes "
      "per device" % (mesh_shape, memory_cap)
    )
  _, assignment, plan = search.best
  return StepTimeLayout(
    layout_rules=_rules(assignment),
    mesh_shape=mesh_shape,
    plan=plan,
    num_planned=search.num_planned,
    num_candidates=search.num_candidates,
  )


def layout_and_mesh_shape_for_step_time(
  mtf_graph: Graph,
  num_machines: int,
  hardware,
  memory_cap: Optional[int] = None,
  exported: Sequence = (),
  max_mesh_shape_dimensions: Optional[int] = 2,
) -> StepTimeLayout:
  """The mesh shape and layout of least estimated step time, under a cap.

  Tries the mesh shapes of mesh_shape_iterator (named "mesh_0", "mesh_1",
  ...) and keeps the fastest layout found (the first on ties).

  Args:
    mtf_graph: the mtf Graph of a step.
    num_machines: the number of devices, a power of two.
    hardware: a HardwareProfile or the name of one.
    memory_cap: optional per-device byte cap.
    exported: the tensors the step exports.
    max_mesh_shape_dimensions: the most mesh dimensions to try (None: any).

  Returns:
    a StepTimeLayout (num_planned and num_candidates over all mesh shapes).

  Raises:
    ValueError: if no mesh shape has a layout under the memory cap.
  """
  best = None
  planned = candidates = 0
  for sizes in mesh_shape_iterator(num_machines, max_mesh_shape_dimensions):
    mesh_shape = Shape(
      [Dimension("mesh_%d" % i, size) for i, size in enumerate(sizes)]
    )
    try:
      found = layout_for_step_time(
        mtf_graph, mesh_shape, hardware, memory_cap, exported
      )
    except ValueError as e:
      if "memory cap" not in str(e):
        raise
      continue
    planned += found.num_planned
    candidates += found.num_candidates
    if (
      best is None
      or found.plan.estimated_step_time.total
      < best.plan.estimated_step_time.total
    ):
      best = found
  if best is None:
    raise ValueError(
      "no mesh shape of %d devices has a layout under the memory cap of %s "
      "bytes per device" % (num_machines, memory_cap)
    )
  return dataclasses.replace(
    best, num_planned=planned, num_candidates=candidates
  )
