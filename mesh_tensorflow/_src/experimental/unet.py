"""A 3-D U-Net whose spatial dimensions are split over the mesh.

Volumes [ct_resolution]^3 are stored as blocks (unet_data). Layout rules
split the block dimensions over mesh axes (by default `image_nx_block:rows,
image_ny_block:columns`, and the batch over `cores`); the blocked
convolutions exchange halos between neighbouring blocks, so the network
computes the same function on every mesh. With `sampled_2d_slices` the
network is 2-D, on image_c neighbouring z slices. Its hyperparameters are
the current `unet_hparams.Hparams`.
"""

from __future__ import annotations

from typing import List, Tuple

import tensorflow as tf

from mesh_tensorflow._src.experimental import unet_data
from mesh_tensorflow._src.experimental.unet_hparams import hparams
from mesh_tensorflow._src.graph import Tensor
from mesh_tensorflow._src.layers import blocked_conv
from mesh_tensorflow._src.layers import conv as conv_layers
from mesh_tensorflow._src.layers import losses
from mesh_tensorflow._src.layers import norms
from mesh_tensorflow._src.ops import broadcast_binary
from mesh_tensorflow._src.ops import einsum as einsum_ops
from mesh_tensorflow._src.ops import elementwise
from mesh_tensorflow._src.ops import io as io_ops
from mesh_tensorflow._src.ops import random as random_ops
from mesh_tensorflow._src.ops import reduce as reduce_ops
from mesh_tensorflow._src.ops import softmax as softmax_ops
from mesh_tensorflow._src.ops import tensor_ops
from mesh_tensorflow._src.ops import topk
from mesh_tensorflow._src.shapes import Dimension
from mesh_tensorflow._src.shapes import Shape
from mesh_tensorflow._src.variables import VariableDType

__all__ = [
  "conv_with_spatial_partition",
  "deconv_with_spatial_partition",
  "unet_with_spatial_partition",
]


def _blocked_conv(
  x,
  sampled_2d_slices,
  nx_dim,
  ny_dim,
  out_dim,
  size,
  stride,
  variable_dtype,
  name,
  transpose=False,
):
  """A size^n filter, stride^n (transposed) conv over x/y-blocked images."""
  if sampled_2d_slices:
    layer = (
      blocked_conv.conv2d_transpose_with_blocks
      if transpose
      else blocked_conv.conv2d_with_blocks
    )
    blocks = {"h_blocks_dim": nx_dim, "w_blocks_dim": ny_dim}
    n = 2
  else:
    layer = (
      blocked_conv.conv3d_transpose_with_blocks
      if transpose
      else blocked_conv.conv3d_with_blocks
    )
    blocks = {"d_blocks_dim": nx_dim, "h_blocks_dim": ny_dim}
    n = 3
  return layer(
    x,
    out_dim,
    filter_size=(size,) * n,
    strides=(stride,) * n,
    padding="SAME",
    variable_dtype=variable_dtype,
    name=name,
    **blocks,
  )


def conv_with_spatial_partition(
  x: Tensor,
  sampled_2d_slices: bool,
  image_nx_dim: Dimension,
  image_ny_dim: Dimension,
  n_filters: int,
  keep_p: float,
  with_batch_norm: bool,
  is_training: bool,
  odim_name: str,
  variable_dtype: VariableDType,
  name: str,
) -> Tuple[Tensor, list]:
  """A 3x3(x3) blocked convolution, batch norm, leaky ReLU and dropout.

  Args:
    x: the input [batch, nx, ny, sx, sy, (sz,) channels].
    sampled_2d_slices: 2-D (conv2d) instead of 3-D.
    image_nx_dim: the x blocks dimension.
    image_ny_dim: the y blocks dimension.
    n_filters: the number of output channels.
    keep_p: the dropout keep probability.
    with_batch_norm: whether to batch-normalize.
    is_training: training (dropout, batch statistics) or not.
    odim_name: the name of the output channels dimension.
    variable_dtype: the variables' VariableDType.
    name: the variable scope.

  Returns:
    (output, batch norm update ops).
  """
  out_dim = Dimension(odim_name, n_filters)
  x = _blocked_conv(
    x,
    sampled_2d_slices,
    image_nx_dim,
    image_ny_dim,
    out_dim,
    3,
    1,
    variable_dtype,
    name,
  )
  bn_update_ops = []
  if with_batch_norm:
    x, bn_update_ops = norms.batch_norm(
      x,
      is_training,
      momentum=0.90,
      epsilon=0.000001,
      dims_idx_start=0,
      dims_idx_end=-1,
      name=name,
    )
  x = elementwise.leaky_relu(x, 0.1)
  x = random_ops.dropout(x, is_training, keep_p)
  return x, bn_update_ops


def deconv_with_spatial_partition(
  x: Tensor,
  sampled_2d_slices: bool,
  image_nx_dim: Dimension,
  image_ny_dim: Dimension,
  n_filters: int,
  keep_p: float,
  is_training: bool,
  odim_name: str,
  variable_dtype: VariableDType,
  name: str,
) -> Tensor:
  """A 2x2(x2) stride-2 blocked transposed convolution and dropout.

  Args:
    x: the input [batch, nx, ny, sx, sy, (sz,) channels].
    sampled_2d_slices: 2-D instead of 3-D.
    image_nx_dim: the x blocks dimension.
    image_ny_dim: the y blocks dimension.
    n_filters: the number of output channels.
    keep_p: the dropout keep probability.
    is_training: training (dropout) or not.
    odim_name: the name of the output channels dimension.
    variable_dtype: the variables' VariableDType.
    name: the variable scope.

  Returns:
    the output, each spatial size doubled.
  """
  out_dim = Dimension(odim_name, n_filters)
  x = _blocked_conv(
    x,
    sampled_2d_slices,
    image_nx_dim,
    image_ny_dim,
    out_dim,
    2,
    2,
    variable_dtype,
    name,
    transpose=True,
  )
  return random_ops.dropout(x, is_training, keep_p)


def unet_with_spatial_partition(
  mesh, mesh_impl, dataset_str: str, images, labels
) -> Tuple[List[Tensor], Tensor, dict, list]:
  """Builds the U-Net on laid-out input batches: predictions, loss, metrics.

  The loss mixes a weighted cross-entropy (liver and lesion voxels weighted
  xen_liver_weight and xen_lesion_weight) and a soft dice loss of the lesion
  class (weight dice_loss_weight).

  Args:
    mesh: the mtf Mesh.
    mesh_impl: its mesh implementation (PlacementMeshImpl or SimdMeshImpl).
    dataset_str: "train" or "eval" (batch size; training mode).
    images: the laid-out image batch: a list of per-processor slices (a
      PlacementMeshImpl's) or a one-element list (a SimdMeshImpl replica's),
      of shape get_input_mtf_shapes(dataset_str)[0].
    labels: the laid-out one-hot labels, likewise.

  Returns:
    (preds, loss, eval_metrics, bn_update_ops): preds are the downsampled
    liver and lesion probabilities [batch, nx, ny, sx', sy', (sz')], the
    downsampled lesion label if output_ground_truth, and the lesion
    intersection and area sum per example; loss a scalar; eval_metrics a
    dict of scalars; bn_update_ops the batch norm update operations.
  """
  hp = hparams()
  is_training = dataset_str == "train"
  (
    batch_dim,
    nx_dim,
    ny_dim,
    sx_dim,
    sy_dim,
    sz_dim,
    image_c_dim,
    label_c_dim,
  ) = unet_data.input_dims(dataset_str, hp)
  images_shape, labels_shape = unet_data.get_input_mtf_shapes(dataset_str)
  dtype = tf.as_dtype(hp.mtf_dtype)
  variable_dtype = VariableDType(dtype, dtype, dtype)

  x = io_ops.import_laid_out_tensor(
    mesh, mesh_impl.LaidOutTensor(images), images_shape
  )
  x = elementwise.cast(x, dtype)
  t = io_ops.import_laid_out_tensor(
    mesh, mesh_impl.LaidOutTensor(labels), labels_shape
  )
  t = elementwise.cast(t, dtype)

  # Blocks first: [batch, nx, ny, sx, sy, (sz,) channels].
  spatial = [sx_dim, sy_dim] + ([] if hp.sampled_2d_slices else [sz_dim])
  x = einsum_ops.transpose(
    x, [batch_dim, nx_dim, ny_dim] + spatial + [image_c_dim]
  )
  t = einsum_ops.transpose(
    t, [batch_dim, nx_dim, ny_dim] + spatial + [label_c_dim]
  )

  def pool(op):
    return {
      ("max", True): conv_layers.max_pool2d,
      ("max", False): conv_layers.max_pool3d,
      ("avg", True): conv_layers.avg_pool2d,
      ("avg", False): conv_layers.avg_pool3d,
    }[op, hp.sampled_2d_slices]

  levels = []
  all_bn_update_ops = []
  for depth in range(hp.network_depth):
    for n_conv in range(hp.n_conv_per_block):
      first = depth == 0 and n_conv == 0  # No dropout in the first layer.
      x, bn_update_ops = conv_with_spatial_partition(
        x,
        hp.sampled_2d_slices,
        nx_dim,
        ny_dim,
        hp.n_base_filters * 2**depth,
        1.0 if first else hp.dropout_keep_p,
        hp.with_batch_norm,
        is_training,
        "conv_%d_%d" % (depth, n_conv),
        variable_dtype,
        "conv_down_%d_%d" % (depth, n_conv),
      )
      all_bn_update_ops.extend(bn_update_ops)
    levels.append(x)
    if depth < hp.network_depth - 1:
      x = pool("max")(x, ksize=(2,) * len(spatial))

  for depth in reversed(range(hp.network_depth - 1)):
    channels_name = "conv_%d_%d" % (depth, hp.n_conv_per_block - 1)
    x = deconv_with_spatial_partition(
      x,
      hp.sampled_2d_slices,
      nx_dim,
      ny_dim,
      hp.n_base_filters * 2**depth,
      hp.dropout_keep_p,
      is_training,
      channels_name,
      variable_dtype,
      "deconv_%d_0" % depth,
    )
    x = tensor_ops.concat([x, levels[depth]], concat_dim_name=channels_name)
    for n_conv in range(hp.n_conv_per_block):
      x, bn_update_ops = conv_with_spatial_partition(
        x,
        hp.sampled_2d_slices,
        nx_dim,
        ny_dim,
        hp.n_base_filters * 2**depth,
        hp.dropout_keep_p,
        hp.with_batch_norm,
        is_training,
        "conv_%d_%d" % (depth, n_conv),
        variable_dtype,
        "conv_up_%d_%d" % (depth, n_conv),
      )
      all_bn_update_ops.extend(bn_update_ops)

  # The last layer: a 1x1(x1) convolution to the classes, no dropout.
  y = _blocked_conv(
    x,
    hp.sampled_2d_slices,
    nx_dim,
    ny_dim,
    label_c_dim,
    1,
    1,
    variable_dtype,
    "final_conv_%d" % hp.label_c,
  )

  def scalar(value, scalar_dtype=dtype):
    # An mtf constant: no CPU-side constants on TPU.
    return io_ops.constant(mesh, value, shape=[], dtype=scalar_dtype)

  def is_class(t, k):
    return elementwise.cast(
      broadcast_binary.equal(t, scalar(k, tf.int32)), dtype
    )

  argmax_t = topk.argmax(t, label_c_dim)
  liver_t = is_class(argmax_t, 1)
  lesion_t = is_class(argmax_t, 2)
  argmax_y = topk.argmax(y, label_c_dim)
  lesion_y = is_class(argmax_y, 2)

  lesion_pred_ratio = reduce_ops.reduce_mean(lesion_y)
  lesion_label_ratio = reduce_ops.reduce_mean(lesion_t)
  accuracy = reduce_ops.reduce_mean(
    elementwise.cast(broadcast_binary.equal(argmax_y, argmax_t), dtype)
  )

  # Cross-entropy, liver and lesion voxels weighted up.
  pixel_loss = losses.softmax_cross_entropy_with_logits(y, t, label_c_dim)
  pixel_weight = (
    scalar(1)
    + liver_t * scalar(hp.xen_liver_weight - 1)
    + lesion_t * scalar(hp.xen_lesion_weight - hp.xen_liver_weight)
  )
  loss_xen = reduce_ops.reduce_mean(pixel_loss * pixel_weight)

  # Soft dice loss of the lesion class, per case and global.
  y_prob = softmax_ops.softmax(y, reduced_dim=label_c_dim)
  one_class = Dimension("label_c", 1)
  lesion_prob = reduce_ops.reduce_sum(
    tensor_ops.mtf_slice(y_prob, 2, 1, "label_c"), reduced_dim=one_class
  )
  per_case = Shape([batch_dim])
  prob_intersect = reduce_ops.reduce_sum(
    lesion_prob * lesion_t, output_shape=per_case
  )
  prob_area_sum = reduce_ops.reduce_sum(
    lesion_prob + lesion_t, output_shape=per_case
  )
  loss_dice_per_case = reduce_ops.reduce_mean(
    scalar(-2) * prob_intersect / (prob_area_sum + scalar(hp.dice_epsilon))
  )
  loss_dice_global = (
    scalar(-2)
    * reduce_ops.reduce_sum(prob_intersect)
    / (reduce_ops.reduce_sum(prob_area_sum) + scalar(hp.dice_epsilon))
  )
  loss_dice = (loss_dice_per_case + loss_dice_global) * scalar(0.5)
  loss = (
    scalar(hp.dice_loss_weight) * loss_dice
    + scalar(1 - hp.dice_loss_weight) * loss_xen
  )

  intersect = reduce_ops.reduce_sum(lesion_y * lesion_t, output_shape=per_case)
  area_sum = reduce_ops.reduce_sum(lesion_y + lesion_t, output_shape=per_case)
  dice_per_case = reduce_ops.reduce_mean(
    scalar(2) * intersect / (area_sum + scalar(0.000001))
  )
  dice_global = (
    scalar(2)
    * reduce_ops.reduce_sum(intersect)
    / (reduce_ops.reduce_sum(area_sum) + scalar(0.000001))
  )
  eval_metrics = {
    "lesion_pred_ratio": lesion_pred_ratio,
    "lesion_label_ratio": lesion_label_ratio,
    "accuracy_of_all_classes": accuracy,
    "lesion_dice_per_case": dice_per_case,
    "lesion_dice_global": dice_global,
    "loss_xen": loss_xen,
    "loss_dice": loss_dice,
    "loss_dice_per_case": loss_dice_per_case,
    "loss_dice_global": loss_dice_global,
  }

  ksize = (hp.pred_downsample,) * len(spatial)
  y_prob_downsampled = pool("avg")(y_prob, ksize=ksize)
  preds = [
    reduce_ops.reduce_sum(
      tensor_ops.mtf_slice(y_prob_downsampled, k, 1, "label_c"),
      reduced_dim=one_class,
    )
    for k in (1, 2)  # liver, lesion
  ]
  if hp.output_ground_truth:
    lesion_gt = tensor_ops.mtf_slice(t, 2, 1, "label_c")
    preds.append(
      reduce_ops.reduce_sum(
        pool("avg")(lesion_gt, ksize=ksize), reduced_dim=one_class
      )
    )
  preds.extend([intersect, area_sum])
  return preds, loss, eval_metrics, all_bn_update_ops
