"""Lowering: turns an mtf Graph into TensorFlow ops for given mesh impls.

The Lowering walks the graph in creation order; each Operation lowers itself
through the MeshImpl of its mesh. Sums over split dimensions stay lazy
(LazyAllreduceSum) so that additions happen before the one allreduce.
"""

from __future__ import annotations

import os
import re
from typing import Dict, Optional, Union

from absl import logging
import tensorflow as tf

# Imported for its registration of Graph.rewrite_stack_variables (autostack).
from mesh_tensorflow._src import stacking  # noqa: F401  pylint: disable=unused-import
from mesh_tensorflow._src.graph import Graph
from mesh_tensorflow._src.graph import Mesh
from mesh_tensorflow._src.graph import Operation
from mesh_tensorflow._src.graph import Tensor
from mesh_tensorflow._src.mesh_impl import COLLECTIVE_KINDS
from mesh_tensorflow._src.mesh_impl import MeshImpl

_INVALID_SCOPE_CHARS = re.compile(r"[^A-Za-z0-9_.\-/]")


def _scope_name(op_name: str) -> str:
  name = _INVALID_SCOPE_CHARS.sub("_", op_name)
  if name and not re.match(r"[A-Za-z0-9.]", name[0]):
    name = "op" + name
  return name or "op"


class Lowering:
  """Lowers every operation of `graph` through `mesh_to_impl`.

  Example:
    >>> graph = mtf.Graph()
    >>> mesh = mtf.Mesh(graph, "my_mesh")
    >>> x = mtf.import_tf_tensor(mesh, tf.ones([4, 3]), "batch:4;d_model:3")
    >>> y = mtf.reduce_sum(x, reduced_dim=x.shape.dims[1])
    >>> mesh_impl = mtf.placement_mesh_impl.PlacementMeshImpl(
    ...     "all:2", "batch:all", ["cpu:0", "cpu:1"])
    >>> lowering = mtf.Lowering(graph, {mesh: mesh_impl})
    >>> lowering.export_to_tf_tensor(y).numpy()
    array([3., 3., 3., 3.], dtype=float32)

  Args:
    graph: the mtf Graph to lower.
    mesh_to_impl: a dict {Mesh: MeshImpl} giving the implementation of each
      mesh.
    autostack: whether to stack same-shape variables first
      (Graph.rewrite_stack_variables) for speed.
    log_file: optional file to log the variable sizes to.
  """

  def __init__(
    self,
    graph: Graph,
    mesh_to_impl: Dict[Mesh, "object"],
    autostack: bool = True,
    log_file: Optional[str] = None,
  ):
    self.mesh_to_impl = mesh_to_impl
    self.graph = graph
    if autostack:
      self.autostack()
    self._counters = []
    for mesh_impl in mesh_to_impl.values():
      # Collectives performed later (a lazy sum realised by an export) count
      # here too, until another Lowering takes the mesh impl over.
      if hasattr(mesh_impl, "set_collective_counter"):
        mesh_impl.set_collective_counter(self.add_counter)
    self.tensors = {}
    self.operations = {}
    self.variables = {}
    for op in graph.operations:
      with tf.name_scope(_scope_name(op.name)):
        op.lower(self)
      for out in op.outputs:
        self.add_counter(
          "output/%s" % type(op).__name__, self.laid_out_size(out)
        )
        self.add_counter("output_unique/%s" % type(op).__name__, out.size)
    log_variable_sizes(
      graph.trainable_variables,
      "Trainable Variables",
      verbose=True,
      mesh_to_impl=mesh_to_impl,
      log_file=log_file,
    )
    untrainable = [
      v for v in graph.all_variables if v not in set(graph.trainable_variables)
    ]
    log_variable_sizes(
      untrainable,
      "Untrainable Variables",
      verbose=False,
      mesh_to_impl=mesh_to_impl,
      log_file=log_file,
    )
    logging.vlog(1, "Counters:\n%s", pretty_print_counters(self._counters))

  def mesh_impl(self, m: Union[Mesh, Tensor, Operation]) -> MeshImpl:
    """MeshImpl for a Mesh, or for the mesh of a Tensor or Operation.

    Args:
      m: a Mesh, or an mtf Tensor or Operation.

    Returns:
      the MeshImpl of that mesh.
    """
    mesh = m if isinstance(m, Mesh) else m.mesh
    try:
      return self.mesh_to_impl[mesh]
    except KeyError:
      raise ValueError(
        "mesh %r has no MeshImpl in mesh_to_impl (meshes: %s)"
        % (mesh, list(self.mesh_to_impl))
      ) from None

  def export_to_tf_tensor(self, x: Tensor) -> tf.Tensor:
    """The full TF tensor for mtf Tensor x.

    Args:
      x: an mtf Tensor of the graph.

    Returns:
      a tf.Tensor of shape x.shape.
    """
    mesh_impl = self.mesh_impl(x)
    return mesh_impl.export_to_tf_tensor(
      x, self.tensors[x].to_laid_out_tensor()
    )

  def lowered_operation(
    self, op: Union[Operation, Tensor]
  ) -> Union[tf.Operation, tf.Tensor]:
    """The TF op (e.g. tf.group for Assign) an mtf Operation lowered to.

    Args:
      op: an mtf Operation of the graph (or one of its output Tensors).

    Returns:
      the TF operation or tensor it lowered to.
    """
    if isinstance(op, Tensor):
      return self.export_to_tf_tensor(op)
    if op not in self.operations:
      raise ValueError(
        "operation %s has no lowered TF operation (only "
        "Assign-like operations do)" % op.name
      )
    return self.operations[op]

  def _group_copies(self, copy_ops):
    copy_ops = [c for c in copy_ops if c is not None]
    if os.environ.get("MTF_SEQUENCE_MODE", "") == "1" and copy_ops:
      last = None
      for c in copy_ops:
        deps = [last] if last is not None else []
        with tf.control_dependencies(deps):
          last = tf.group(c)
      return last
    return tf.group(*copy_ops)

  def copy_masters_to_slices(self) -> Optional[tf.Operation]:
    """Op that copies every master variable into its per-processor slices.

    Returns:
      a tf op (group) in graph mode; None when executing eagerly (the copies
      have then run).
    """
    return self._group_copies(
      [v.copy_master_to_slices for v in self.variables.values()]
    )

  def copy_slices_to_masters(self) -> Optional[tf.Operation]:
    """Op that writes the per-processor slices back into the masters.

    Returns:
      a tf op (group) in graph mode; None when executing eagerly (the copies
      have then run).
    """
    return self._group_copies(
      [v.copy_slices_to_master for v in self.variables.values()]
    )

  def add_counter(self, key: str, value: int) -> None:
    """Adds `value` to the counter `key` (communication and compute counts).

    Args:
      key: the counter name, "/"-separated.
      value: the amount to add.
    """
    self._counters.append((key, value))

  @property
  def counters(self) -> Dict[str, int]:
    """The counters recorded by add_counter: a dict {name: value}."""
    return self._counters

  def collective_bytes(self) -> Dict[str, int]:
    """Bytes sent by each kind of collective, summed over all processors.

    From the "collective_bytes/<kind>" counters the mesh impls add for every
    allreduce, allconcat, alltoall and shift (receive) the lowering asked for.

    Returns:
      a dict {kind: bytes} with every kind of mesh_impl.COLLECTIVE_KINDS.
    """
    totals = dict.fromkeys(COLLECTIVE_KINDS, 0)
    for key, value in self._counters:
      if key.startswith("collective_bytes/"):
        kind = key[len("collective_bytes/") :]
        totals[kind] = totals.get(kind, 0) + value
    return totals

  def laid_out_size(self, tensor: Tensor) -> int:
    """The number of elements of a tensor summed over all processors.

    Args:
      tensor: an mtf Tensor.

    Returns:
      an int.
    """
    return self.mesh_impl(tensor).laid_out_size(tensor.shape)

  def set_tensor_lowering(self, tensor: Tensor, laid_out_tensor) -> None:
    """Records the laid-out value of a tensor (checks its slice shape).

    Args:
      tensor: an mtf Tensor output by the operation being lowered.
      laid_out_tensor: its LaidOutTensor (or lazy laid-out tensor).
    """
    self.verify_slice_shapes(tensor, laid_out_tensor)
    self.tensors[tensor] = laid_out_tensor

  def verify_slice_shapes(self, tensor: Tensor, laid_out_tensor) -> None:
    """Checks that the slices have the shape the layout implies.

    Args:
      tensor: an mtf Tensor.
      laid_out_tensor: its laid-out value.

    Raises:
      ValueError: if a slice has another shape.
    """
    mesh_impl = self.mesh_impl(tensor)
    correct = mesh_impl.slice_shape(tensor.shape)
    actual = list(laid_out_tensor.slice_shape)
    if actual != correct:
      raise ValueError(
        "wrong slice shape for %s: expected %s, got %s"
        % (tensor.to_string, correct, actual)
      )

  def autostack(self) -> None:
    """Stacks small same-shape variables (see Graph.rewrite_stack_variables).

    The slice-size cap is 2**27 when the variables have at least 65536 slices
    in total, else 2**16. A graph is rewritten once; lowering it again (say in
    a re-traced tf.function) reuses the rewritten graph.
    """
    if self.graph.stacked_variables_rewritten:
      return
    num_slices = sum(
      self.mesh_impl(v).size
      for v in self.graph.all_variables
      if v.mesh in self.mesh_to_impl
    )
    max_combined_slice_size = 2**27 if num_slices >= 2**16 else 2**16
    self.graph.rewrite_stack_variables(
      max_combined_slice_size=max_combined_slice_size,
      mesh_to_impl=self.mesh_to_impl,
    )


def pretty_print_counters(counters) -> str:
  """Totals of (key, value) counters by every "/"-separated key prefix.

  Args:
    counters: a list of (key, value) pairs.

  Returns:
    a multi-line string with one total per key prefix.
  """
  totals = {}
  for key, value in counters:
    parts = key.split("/")
    for i in range(1, len(parts) + 1):
      prefix = "/".join(parts[:i])
      totals[prefix] = totals.get(prefix, 0) + value
  return "\n".join("%s: %d" % (k, totals[k]) for k in sorted(totals))


def log_variable_sizes(
  var_list,
  tag: str,
  verbose: bool = True,
  mesh_to_impl=None,
  log_file: Optional[str] = None,
) -> None:
  """Logs the sizes of mtf variables (and per-processor sizes if known).

  Args:
    var_list: the mtf Variables.
    tag: a title for the log lines.
    verbose: whether to log each variable.
    mesh_to_impl: optional dict {Mesh: MeshImpl}, for per-processor sizes.
    log_file: optional file to append the log to.
  """
  if not var_list:
    return
  lines = []
  total = 0
  for v in sorted(var_list, key=lambda v: v.name):
    total += v.shape.size
    if verbose:
      line = "Variable %-60s size %-12d shape %s" % (
        v.name,
        v.shape.size,
        v.shape.to_string,
      )
      if mesh_to_impl is not None and v.mesh in mesh_to_impl:
        line += " slice_size %d" % mesh_to_impl[v.mesh].slice_size(v.shape)
      lines.append(line)
  lines.append("%s count: %d total size: %d" % (tag, len(var_list), total))
  text = "\n".join(lines)
  logging.vlog(1, "%s", text)
  if log_file:
    with tf.io.gfile.GFile(log_file, "a") as f:
      f.write(text + "\n")


__all__ = ["Lowering", "log_variable_sizes", "pretty_print_counters"]
