"""Variable scopes for layers, with default names uniquified per mtf Graph.

`tf.compat.v1.variable_scope(None, default_name="dense")` uniquifies against a
process-wide (eager) or per-tf.Graph store, so rebuilding the same mtf program
(every eager step, every tf.function trace) would name variables "dense_1",
"dense_2", ... and lose them. Layers use `layer_variable_scope` instead: a
default name is made unique among the layers of one mtf Graph only, so every
rebuild of a program names its variables the same way.
"""

from __future__ import annotations

import contextlib
from typing import Dict, Optional
import weakref

import tensorflow as tf

from mesh_tensorflow._src.graph import Graph
from mesh_tensorflow._src.graph import current_variable_scope_name

tf1 = tf.compat.v1

# mtf Graph -> {full scope name: times handed out as a default}.
_default_names_used: "weakref.WeakKeyDictionary[Graph, Dict[str, int]]" = (
  weakref.WeakKeyDictionary()
)


def _scope_in_use(graph: Graph, full_name: str) -> bool:
  prefix = full_name + "/"
  return any(n.startswith(prefix) for n in graph.name_to_variable)


def unique_default_name(graph: Graph, default_name: str) -> str:
  """`default_name`, or `default_name_<k>` if this graph already used it.

  Example:
    >>> graph = mtf.Graph()
    >>> unique_default_name(graph, "dense")
    'dense'
    >>> unique_default_name(graph, "dense")
    'dense_1'
    >>> unique_default_name(mtf.Graph(), "dense")  # counted per graph
    'dense'
  """
  used = _default_names_used.setdefault(graph, {})
  outer = current_variable_scope_name()
  k = 0
  while True:
    candidate = default_name if k == 0 else "%s_%d" % (default_name, k)
    full = outer + "/" + candidate if outer else candidate
    if full not in used and not _scope_in_use(graph, full):
      used[full] = 1
      return candidate
    k += 1


@contextlib.contextmanager
def layer_variable_scope(graph: Graph, name: Optional[str], default_name: str):
  """tf.compat.v1.variable_scope(name), or a per-graph unique default name.

  Example:
    >>> mesh = mtf.Mesh(mtf.Graph(), "my_mesh")
    >>> for name in [None, None, "out"]:
    ...   with layer_variable_scope(mesh.graph, name, "dense"):
    ...     _ = mtf.get_variable(mesh, "kernel", "d:2")
    >>> [v.name for v in mesh.graph.trainable_variables]
    ['dense/kernel', 'dense_1/kernel', 'out/kernel']
  """
  if name is None:
    name = unique_default_name(graph, default_name)
  with tf1.variable_scope(name) as scope:
    yield scope


__all__ = []
