"""A user-defined mtf.Operation, written as downstream code writes one.

Downstream projects add ops by subclassing mtf.Operation: set `_outputs` in
the constructor, return input gradients from `gradient`, and in `lower` read
`lowering.tensors[...]`, call `lowering.mesh_impl(self)`, `slicewise`,
`tensor_dimension_to_mesh_axis` and `allreduce`, and finish with
`lowering.set_tensor_lowering`. The op below (double, then sum over a dim)
runs with mtf.Print, mtf.stop_gradient and mtf.shift in a tf.compat.v1
graph and Session on the three meshes, against numpy.
"""

import numpy as np
import tensorflow.compat.v1 as tf

import mesh_tensorflow as mtf
from tests import meshes

A, B = 4, 8
VALUES = np.arange(A * B, dtype=np.float32).reshape(A, B) / 10


class DoubleThenSum(mtf.Operation):
  """2 * x summed over `dim`; the gradient broadcasts 2 * dy back."""

  def __init__(self, x, dim, name=None):
    super().__init__([x], name=name or "double_then_sum")
    self._dim = dim
    self._outputs = [mtf.Tensor(self, x.shape - dim, x.dtype)]

  def gradient(self, grad_ys):
    return [mtf.broadcast(grad_ys[0], self.inputs[0].shape) * 2.0]

  def lower(self, lowering):
    mesh_impl = lowering.mesh_impl(self)
    x = self.inputs[0]
    axis = x.shape.dims.index(self._dim)
    laid_out_x = lowering.tensors[x].to_laid_out_tensor()
    y = mesh_impl.slicewise(
      lambda t: tf.reduce_sum(t * 2.0, axis=axis), laid_out_x
    )
    mesh_axis = mesh_impl.tensor_dimension_to_mesh_axis(self._dim)
    if mesh_axis is not None:
      y = mesh_impl.allreduce(y, [mesh_axis], "SUM")
    lowering.set_tensor_lowering(self.outputs[0], y)


@meshes.parametrize(
  meshes.trio(all_4=["a:all", "b:all"], rows_cols=["a:rows;b:cols"])
)
def test_custom_operation_lowers_and_differentiates(mesh_shape, layout):
  with tf.Graph().as_default():
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "my_mesh")
    a, b = mtf.Dimension("a", A), mtf.Dimension("b", B)
    w = mtf.get_variable(
      mesh, "w", [a, b], initializer=tf.constant_initializer(VALUES)
    )
    y = DoubleThenSum(w, b).outputs[0]
    y = mtf.Print(y, [y], "y=", summarize=4)
    loss = mtf.reduce_sum(mtf.square(y)) + mtf.reduce_sum(
      mtf.stop_gradient(w) * 0.5
    )
    shifted = mtf.shift(w, offset=1, dim=b, wrap=False)
    (grad,) = mtf.gradients([loss], [w])
    exported = [mtf.anonymize(t) for t in (y, grad, shifted)]
    shape = mtf.convert_to_shape(mesh_shape)
    mesh_impl = mtf.placement_mesh_impl.PlacementMeshImpl(
      shape, mtf.convert_to_layout_rules(layout), [""] * shape.size
    )
    lowering = mtf.Lowering(graph, {mesh: mesh_impl})
    outputs = [lowering.export_to_tf_tensor(t) for t in exported]
    with tf.Session() as session:
      session.run(tf.global_variables_initializer())
      session.run(lowering.copy_masters_to_slices())
      y_value, grad_value, shifted_value = session.run(outputs)
  want_y = 2 * VALUES.sum(1)
  np.testing.assert_allclose(y_value, want_y, rtol=1e-6)
  # d/dw of sum(y**2) is 2 * y * 2 per element (stop_gradient adds none).
  np.testing.assert_allclose(
    grad_value, np.broadcast_to(4 * want_y[:, None], (A, B)), rtol=1e-6
  )
  want_shifted = np.concatenate([np.zeros((A, 1)), VALUES[:, :-1]], 1)
  np.testing.assert_array_equal(shifted_value, want_shifted)
