"""NumpyConverter: numpy arrays in, mtf Tensors on a private mesh, numpy out.

A helper for unit tests of mtf code: it owns an mtf Graph and Mesh, turns
numpy arrays into constant mtf Tensors on that mesh, and lowers the graph on a
PlacementMeshImpl to get values back, eagerly or (inside a tf.compat.v1 Graph)
through a Session it keeps per TF graph.
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple
import weakref

import numpy as np
import tensorflow as tf

from mesh_tensorflow._src.graph import Graph
from mesh_tensorflow._src.graph import Mesh
from mesh_tensorflow._src.graph import Tensor
from mesh_tensorflow._src.lowering import Lowering
from mesh_tensorflow._src.mesh_impls.placement import PlacementMeshImpl
from mesh_tensorflow._src.ops import io
from mesh_tensorflow._src.shapes import Dimension
from mesh_tensorflow._src.shapes import Shape
from mesh_tensorflow._src.shapes import convert_to_shape

tf1 = tf.compat.v1


class NumpyConverter:
  """Converts between numpy arrays, mtf Tensors and tf Tensors.

  Example:
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> x = converter.convert_np_array_to_mtf_tensor(
    ...     np.arange(6).reshape(2, 3), dim_names=["batch", "length"])
    >>> y = mtf.cumsum(x, x.shape.dims[1])
    >>> converter.convert_mtf_tensor_to_np_array(y)
    array([[ 0,  1,  3],
           [ 3,  7, 12]], dtype=int32)

  Works eagerly, and inside `with tf.Graph().as_default():` (values are then
  computed with `converter.session`, initialising new variables first).
  """

  def __init__(
    self, *, mesh_shape="", layout="", devices: Optional[Sequence[str]] = None
  ):
    """Creates a graph and a mesh to build the tested program in.

    Args:
      mesh_shape: shape of the mesh the graph is lowered on (default one
        processor), e.g. "all:4".
      layout: layout rules for that mesh, e.g. "batch:all".
      devices: one device per processor (default: all on the default device).

    Raises:
      ValueError: if devices does not have one entry per processor.
    """
    self._graph = Graph()
    self._mesh = Mesh(self._graph, "mtf_mesh")
    self._mesh_shape = convert_to_shape(mesh_shape)
    self._layout = layout
    size = self._mesh_shape.size
    self._devices = list(devices) if devices is not None else [""] * size
    if len(self._devices) != size:
      raise ValueError(
        "NumpyConverter: %d devices for mesh %s of %d "
        "processors" % (len(self._devices), self._mesh_shape.to_string, size)
      )
    # tf.Graph -> (Session, names of variables it has initialised).
    self._sessions = weakref.WeakKeyDictionary()

  @property
  def graph(self) -> Graph:
    """The mtf Graph to build the tested program in."""
    return self._graph

  @property
  def mesh(self) -> Mesh:
    """The mtf Mesh of the graph."""
    return self._mesh

  @property
  def session(self) -> Optional[tf1.Session]:
    """The Session for the current tf.compat.v1 graph (None when eager)."""
    if tf.executing_eagerly():
      return None
    return self._session_for(tf1.get_default_graph())[0]

  def _session_for(self, tf_graph):
    entry = self._sessions.get(tf_graph)
    if entry is None:
      num_cpus = max(1, len(tf.config.list_logical_devices("CPU")))
      config = tf1.ConfigProto(
        device_count={"CPU": num_cpus}, allow_soft_placement=True
      )
      entry = (tf1.Session(graph=tf_graph, config=config), set())
      self._sessions[tf_graph] = entry
    return entry

  def convert_np_array_to_mtf_tensor(
    self, x, dim_names=None, dtype=tf.int32
  ) -> Tensor:
    """A constant mtf Tensor on `mesh` holding x.

    Args:
      x: a numpy array (or anything np.asarray accepts).
      dim_names: a name per axis of x; default "dim0", "dim1", ...
      dtype: the mtf dtype (default tf.int32, as in the original); None
        keeps x's dtype.

    Returns:
      an mtf Tensor of shape [(dim_names[i], x.shape[i]), ...].

    Raises:
      ValueError: if dim_names does not have one name per axis of x.
    """
    x = np.asarray(x)
    if dim_names is None:
      dim_names = ["dim%d" % i for i in range(x.ndim)]
    dim_names = list(dim_names)
    if len(dim_names) != x.ndim:
      raise ValueError(
        "NumpyConverter: %d dim_names %s for an array of rank "
        "%d (shape %s)" % (len(dim_names), dim_names, x.ndim, list(x.shape))
      )
    shape = Shape([Dimension(n, s) for n, s in zip(dim_names, x.shape)])
    if dtype is None:
      dtype = tf.as_dtype(x.dtype)
    return io.constant(self._mesh, x, shape=shape, dtype=dtype)

  def convert_mtf_tensor_to_tf_tensor(
    self, mtf_tensor: Tensor
  ) -> Tuple[Lowering, tf.Tensor]:
    """(lowering, tf tensor): lowers the whole graph and exports mtf_tensor.

    Args:
      mtf_tensor: an mtf Tensor of the converter's graph.

    Returns:
      (lowering, tf_tensor): the Lowering of the graph and the full tf.Tensor
      value of mtf_tensor.

    Raises:
      ValueError: if mtf_tensor belongs to another mtf Graph.
    """
    if (
      not isinstance(mtf_tensor, Tensor) or mtf_tensor.graph is not self._graph
    ):
      raise ValueError(
        "NumpyConverter: %r is not an mtf Tensor of this "
        "converter's graph" % (mtf_tensor,)
      )
    mesh_impl = PlacementMeshImpl(self._mesh_shape, self._layout, self._devices)
    lowering = Lowering(self._graph, {self._mesh: mesh_impl})
    return lowering, lowering.export_to_tf_tensor(mtf_tensor)

  def convert_mtf_tensor_to_np_array(self, x_mtf: Tensor) -> np.ndarray:
    """The value of x_mtf as a numpy array.

    Args:
      x_mtf: an mtf Tensor of the converter's graph.

    Returns:
      a numpy array of shape x_mtf.shape.
    """
    lowering, x_tf = self.convert_mtf_tensor_to_tf_tensor(x_mtf)
    if tf.executing_eagerly():
      return np.asarray(x_tf)
    tf_graph = x_tf.graph
    session, initialized = self._session_for(tf_graph)
    with tf_graph.as_default():
      new_vars = [
        v
        for v in tf1.global_variables() + tf1.local_variables()
        if v.name not in initialized
      ]
      if new_vars:
        session.run(tf1.variables_initializer(new_vars))
        initialized.update(v.name for v in new_vars)
      copy = lowering.copy_masters_to_slices()
    if copy is not None:
      session.run(copy)
    return np.asarray(session.run(x_tf))
