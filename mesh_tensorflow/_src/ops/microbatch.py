"""serialize_training_step: gradient accumulation over microbatches.

The batch dimension of every feature is viewed as [batch / k, microbatch=k]
(a reshape that keeps the batch split, so no communication) and an mtf
while_loop runs the model on one microbatch per iteration, gathering
microbatch i with a one-hot einsum. Gradients and scalar outputs are
accumulators (summed over iterations); outputs carrying the batch dimension
are scattered back into their microbatch position, so the sum re-assembles
the full batch. Microbatch i holds the examples b with b % k == i.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Tuple

import tensorflow as tf

from mesh_tensorflow._src.graph import Tensor
from mesh_tensorflow._src.ops import broadcast_binary
from mesh_tensorflow._src.ops import control
from mesh_tensorflow._src.ops import einsum as einsum_lib
from mesh_tensorflow._src.ops import elementwise
from mesh_tensorflow._src.ops import gather as gather_lib
from mesh_tensorflow._src.ops import gradients as gradients_lib
from mesh_tensorflow._src.ops import io
from mesh_tensorflow._src.ops import reshape as reshape_lib
from mesh_tensorflow._src.shapes import Dimension
from mesh_tensorflow._src.shapes import convert_to_dimension

MICROBATCH_DIM_NAME = "microbatch"


def _check_arguments(features, batch_dim: Dimension, num_splits) -> None:
  if not isinstance(features, dict) or not features:
    raise ValueError(
      "serialize_training_step: features must be a non-empty "
      "dict of mtf Tensors, got %r" % (features,)
    )
  for key, value in features.items():
    if not isinstance(value, Tensor):
      raise ValueError(
        "serialize_training_step: feature %r is not an mtf "
        "Tensor: %r" % (key, value)
      )
  if (
    not isinstance(num_splits, int)
    or isinstance(num_splits, bool)
    or num_splits < 1
  ):
    raise ValueError(
      "serialize_training_step: num_splits must be a positive "
      "int, got %r" % (num_splits,)
    )
  if batch_dim.size % num_splits:
    raise ValueError(
      "serialize_training_step: batch dimension %r (size %d) is not "
      "divisible by num_splits=%d"
      % (batch_dim.name, batch_dim.size, num_splits)
    )
  if not any(batch_dim in v.shape.dims for v in features.values()):
    raise ValueError(
      "serialize_training_step: no feature has the batch dimension %s "
      "(features: %s)"
      % (batch_dim, {k: v.shape.to_string for k, v in features.items()})
    )
  for key, value in features.items():
    if MICROBATCH_DIM_NAME in value.shape.dimension_names:
      raise ValueError(
        "serialize_training_step: feature %r already has a "
        "dimension named %r, which microbatching needs"
        % (key, MICROBATCH_DIM_NAME)
      )


def _check_outputs(outputs) -> None:
  if not isinstance(outputs, dict) or "loss" not in outputs:
    keys = sorted(outputs) if isinstance(outputs, dict) else outputs
    raise ValueError(
      "serialize_training_step: model_fn must return a dict "
      'with a "loss" entry, got %r' % (keys,)
    )
  for key, value in outputs.items():
    if not isinstance(value, Tensor):
      raise ValueError(
        "serialize_training_step: model_fn output %r is not "
        "an mtf Tensor: %r" % (key, value)
      )


def _variable_gradients(graph, loss: Tensor) -> List[Optional[Tensor]]:
  return gradients_lib.gradients(
    [loss], [v.outputs[0] for v in graph.trainable_variables]
  )


def serialize_training_step(
  features: Dict[str, Tensor], model_fn: Callable, batch_dim, num_splits: int
) -> Tuple[List[Optional[Tensor]], Dict[str, Tensor]]:
  """Runs model_fn on num_splits microbatches in sequence; sums gradients.

  Example:
    Two microbatches of 2 give the gradients of the whole batch of 4:

    >>> converter = mtf.test_utils.NumpyConverter()
    >>> x_np = np.arange(8.0, dtype=np.float32).reshape([4, 2])
    >>> x = converter.convert_np_array_to_mtf_tensor(
    ...     x_np, ["batch", "d"], dtype=tf.float32)
    >>> def model_fn(features):
    ...   w = mtf.get_variable(converter.mesh, "w", "d:2",
    ...                        initializer=tf.ones_initializer())
    ...   y = mtf.reduce_sum(features["x"] * w, reduced_dim=w.shape.dims[0])
    ...   return {"loss": mtf.reduce_sum(mtf.square(y)), "y": y}
    >>> grads, outputs = mtf.serialize_training_step(
    ...     {"x": x}, model_fn, x.shape.dims[0], 2)
    >>> [v.name for v in converter.graph.trainable_variables]  # grads order
    ['w']
    >>> converter.convert_mtf_tensor_to_np_array(outputs["y"])
    array([ 1.,  5.,  9., 13.], dtype=float32)
    >>> dw = converter.convert_mtf_tensor_to_np_array(grads[0])
    >>> np.allclose(dw, 2 * x_np.T @ (x_np @ np.ones(2)))
    True

  Args:
    features: dict of mtf Tensors; those with batch_dim are split into
      microbatches, the others are passed whole to every call.
    model_fn: features dict -> dict of mtf Tensors with a "loss" entry. It is
      traced once (inside an mtf while_loop when num_splits > 1); variables
      it creates are hoisted out of the loop.
    batch_dim: the batch Dimension.
    num_splits: number of microbatches; must divide batch_dim.size (and each
      microbatch must still divide over the mesh axis splitting the batch).

  Returns:
    (grads, outputs): grads aligned with graph.trainable_variables (summed
    over microbatches; None for a variable the loss does not depend on), and
    model_fn's outputs, where outputs with the (microbatch-sized) batch
    dimension are concatenated back to full batch order and all others are
    summed over microbatches. Loss terms should therefore be sums over
    examples for the gradients to match the unsplit model.

  Raises:
    ValueError: if batch_dim.size is not divisible by num_splits, no feature
      has batch_dim, or model_fn does not return a dict with "loss".
  """
  batch_dim = convert_to_dimension(batch_dim)
  _check_arguments(features, batch_dim, num_splits)
  first = next(iter(features.values()))
  mesh, graph = first.mesh, first.graph

  if num_splits == 1:
    outputs = model_fn(dict(features))
    _check_outputs(outputs)
    return _variable_gradients(graph, outputs["loss"]), dict(outputs)

  microbatch_dim = Dimension(MICROBATCH_DIM_NAME, num_splits)
  small_batch_dim = Dimension(batch_dim.name, batch_dim.size // num_splits)
  # Filled while the body is traced: output keys, dtypes and which gradients
  # exist (the loop can only accumulate tensors, not None).
  traced = {}

  def select(t: Tensor, index: Tensor) -> Tensor:
    if batch_dim not in t.shape.dims:
      return t
    split = reshape_lib.replace_dimensions(
      t, batch_dim, [small_batch_dim, microbatch_dim]
    )
    return gather_lib.gather(split, index, microbatch_dim)

  def scatter(t: Tensor, index: Tensor) -> Tensor:
    """t in the microbatch's batch positions, zeros elsewhere."""
    if small_batch_dim not in t.shape.dims:
      return t
    spread_shape = reshape_lib.replace_dimensions(
      t.shape, small_batch_dim, [small_batch_dim, microbatch_dim]
    )
    mask = gather_lib.one_hot(index, microbatch_dim, dtype=t.dtype)
    spread = einsum_lib.einsum([t, mask], output_shape=spread_shape)
    return reshape_lib.replace_dimensions(
      spread, [small_batch_dim, microbatch_dim], batch_dim
    )

  def cond_fn(index):
    return broadcast_binary.less(index, num_splits)

  def body_fn(index):
    outputs = model_fn({k: select(v, index) for k, v in features.items()})
    _check_outputs(outputs)
    grads = _variable_gradients(graph, outputs["loss"])
    keys = list(outputs)
    traced["keys"] = keys
    traced["dtypes"] = [outputs[k].dtype for k in keys]
    traced["has_grad"] = [g is not None for g in grads]
    accumulated = []
    for k in keys:
      t = outputs[k]
      if t.dtype == tf.bool:  # Summing needs numbers; cast back afterwards.
        t = elementwise.cast(t, tf.int32)
      accumulated.append(scatter(t, index))
    accumulated.extend(g for g in grads if g is not None)
    return [index + 1] + accumulated

  loop_outputs = control.while_loop(
    cond_fn,
    body_fn,
    [io.constant(mesh, 0, shape=[], dtype=tf.int32)],
    has_accumulators=True,
  )
  keys = traced["keys"]
  output_values = loop_outputs[1 : 1 + len(keys)]
  grad_values = iter(loop_outputs[1 + len(keys) :])
  outputs = {}
  for k, dtype, value in zip(keys, traced["dtypes"], output_values):
    if dtype == tf.bool:
      value = elementwise.cast(value, tf.bool)
    outputs[k] = value
  grads = [next(grad_values) if has else None for has in traced["has_grad"]]
  return grads, outputs


__all__ = ["serialize_training_step"]
