"""The SQuAD model: start and end logits over BertModel's sequence output.

The logits come from a dense layer over each token's output; the loss is
the cross-entropy of the answer's start and end positions (see
squad_features for the inputs, squad_answers for turning logits into
answers).
"""

from __future__ import annotations

from typing import Callable, Tuple, Union

import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow.bert._src import estimator
from mesh_tensorflow.bert._src import model
from mesh_tensorflow.bert._src.config import BertConfig

__all__ = ["create_model", "squad_model"]


def create_model(
  bert_config: BertConfig,
  is_training: bool,
  input_ids: mtf.Tensor,
  input_mask: mtf.Tensor,
  segment_ids: mtf.Tensor,
  mesh_shape: Union[str, mtf.Shape] = "",
  layout: Union[str, mtf.LayoutRules] = "",
) -> Tuple[mtf.Tensor, mtf.Tensor]:
  """Start and end logits over seq from BertModel's sequence output.

  Args:
    bert_config: the BertConfig.
    is_training: whether training (dropout).
    input_ids: int mtf.Tensor [batch, seq].
    input_mask: int mtf.Tensor [batch, seq].
    segment_ids: int mtf.Tensor [batch, seq].
    mesh_shape: the mtf.Shape (for mixture-of-experts layers).
    layout: the mtf.LayoutRules (for mixture-of-experts layers).

  Returns:
    (start_logits, end_logits), each [batch, seq].
  """
  bert = model.BertModel(
    config=bert_config,
    is_training=is_training,
    input_ids=input_ids,
    input_mask=input_mask,
    token_type_ids=segment_ids,
    mesh_shape=mesh_shape,
    layout=layout,
  )
  class_dim = mtf.Dimension("class", 2)
  logits = mtf.layers.dense(
    bert.get_sequence_output(),
    reduced_dims=[bert.model_dim],
    new_dims=[class_dim],
    kernel_initializer=tf.compat.v1.truncated_normal_initializer(stddev=0.02),
    name="cls/squad/output",
  )
  start_logits, end_logits = mtf.unstack(logits, dim=class_dim)
  return start_logits, end_logits


def squad_model(bert_config, mesh_shape, layout_rules) -> Callable:
  """build(mesh, features, is_training) of SQuAD, for a TaskModel.

  The loss is the mean of the start and end positions' cross-entropies over
  seq (training features only); outputs "start_logits" and "end_logits"
  [batch, seq] and "unique_ids".

  Args:
    bert_config: the BertConfig.
    mesh_shape: the mtf.Shape (or string) of the mesh.
    layout_rules: the mtf.LayoutRules (or string).

  Returns:
    The build function.
  """

  def build(mesh, features, is_training):
    batch_size, seq_length = features["input_ids"].shape.as_list()
    batch_dim = mtf.Dimension("batch", batch_size)
    seq_dim = mtf.Dimension("seq", seq_length)

    def feature(name, dims):
      return estimator.import_feature(mesh, features[name], dims, name)

    start_logits, end_logits = create_model(
      bert_config,
      is_training,
      feature("input_ids", [batch_dim, seq_dim]),
      feature("input_mask", [batch_dim, seq_dim]),
      feature("segment_ids", [batch_dim, seq_dim]),
      mesh_shape=mesh_shape,
      layout=layout_rules,
    )
    outputs = {
      "start_logits": mtf.anonymize(start_logits),
      "end_logits": mtf.anonymize(end_logits),
    }
    losses = []
    for logits, name in (
      (start_logits, "start_positions"),
      (end_logits, "end_positions"),
    ):
      if name in features:
        positions = mtf.one_hot(feature(name, [batch_dim]), seq_dim)
        log_probs = mtf.log_softmax(logits, seq_dim)
        losses.append(
          -mtf.reduce_mean(
            mtf.reduce_sum(positions * log_probs, reduced_dim=seq_dim)
          )
        )
    if losses:
      outputs["loss"] = mtf.anonymize(mtf.add_n(losses) / float(len(losses)))
    else:
      outputs["loss"] = mtf.zeros(mesh, mtf.Shape([]))
    return outputs

  return build
