"""Operation orders (schedules) that keep peak memory low.

The layout optimizer measures memory under one schedule, computed here:
'NAIVE' runs operations in graph order; 'LIST' is a greedy topological sort
that always runs, among the ready operations, the one that frees the most
bytes right away (its inputs it is the last user of, minus its outputs that
are used or final), ties broken by operation name.
"""

from __future__ import annotations

import collections
import heapq
from typing import Dict, List, Sequence, Set

from mesh_tensorflow._src.auto_mtf.graph_interface import GraphInterface


def minimize_peak_memory(
  graph: GraphInterface, scheduler_alg: str
) -> Sequence[int]:
  """A schedule of the graph's operations.

  Args:
    graph: a GraphInterface.
    scheduler_alg: 'NAIVE' (graph order) or 'LIST' (greedy list heuristic).

  Returns:
    operation indices (into graph.get_all_operation_names()) in run order.

  Raises:
    NotImplementedError: scheduler_alg is neither 'NAIVE' nor 'LIST'.
  """
  if scheduler_alg == "NAIVE":
    return range(graph.get_num_operations())
  if scheduler_alg == "LIST":
    return _list_schedule(graph)
  raise NotImplementedError(
    "{} is not a scheduler algorithm. It should be one of NAIVE or LIST.".format(
      scheduler_alg
    )
  )


def _list_schedule(graph: GraphInterface) -> List[int]:
  """The greedy list schedule (see the module docstring)."""
  operation_names = list(graph.get_all_operation_names())
  operation_ids = {name: i for i, name in enumerate(operation_names)}
  inputs = {
    name: list(graph.get_operation_input_names(name))
    for name in operation_names
  }
  outputs = {
    name: list(graph.get_operation_output_names(name))
    for name in operation_names
  }
  # An operation that reads a tensor twice is one user of it.
  users: Dict[str, Set[str]] = collections.defaultdict(set)
  for name in operation_names:
    for tensor_name in inputs[name]:
      users[tensor_name].add(name)
  unmet_inputs = {name: len(set(inputs[name])) for name in operation_names}

  def frees_when_last_user(tensor_name: str) -> bool:
    return len(users[tensor_name]) == 1 and not graph.is_tensor_final(
      tensor_name
    )

  bytes_freed = {}
  for name in operation_names:
    freed = sum(
      graph.get_tensor_size(t) for t in inputs[name] if frees_when_last_user(t)
    )
    freed -= sum(
      graph.get_tensor_size(t)
      for t in outputs[name]
      if users[t] or graph.is_tensor_final(t)
    )
    bytes_freed[name] = freed

  # A heap with lazy updates: an entry whose value is stale is skipped.
  ready = [(-bytes_freed[n], n) for n in operation_names if not unmet_inputs[n]]
  heapq.heapify(ready)
  schedule = []
  while ready:
    negative_freed, name = heapq.heappop(ready)
    if bytes_freed[name] != -negative_freed:
      continue
    schedule.append(operation_ids[name])
    bytes_freed[name] = None
    for tensor_name in outputs[name]:
      for user in users[tensor_name]:
        unmet_inputs[user] -= 1
        if not unmet_inputs[user]:
          heapq.heappush(ready, (-bytes_freed[user], user))
    for tensor_name in inputs[name]:
      if name not in users[tensor_name]:
        continue  # A second read of the same tensor.
      users[tensor_name].remove(name)
      if not frees_when_last_user(tensor_name):
        continue
      (last_user,) = users[tensor_name]
      bytes_freed[last_user] += graph.get_tensor_size(tensor_name)
      if not unmet_inputs[last_user]:
        heapq.heappush(ready, (-bytes_freed[last_user], last_user))
  return schedule
