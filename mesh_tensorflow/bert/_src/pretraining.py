"""BERT pretraining on a mesh: the masked-LM + next-sentence graph, metrics.

`pretraining_model` is the graph the original's run_pretraining model_fn
built (total loss = masked-LM loss + next-sentence loss, plus the
mixture-of-experts loss in training), as a TaskModel build function;
`pretraining_metrics` reduces its exported outputs to the original's eval
metrics.
"""

from __future__ import annotations

from typing import Callable, Dict, Iterable

import numpy as np

import mesh_tensorflow as mtf
from mesh_tensorflow.bert._src import estimator
from mesh_tensorflow.bert._src import model

__all__ = ["pretraining_metrics", "pretraining_model"]


def pretraining_model(
  bert_config: model.BertConfig, mesh_shape, layout_rules
) -> Callable:
  """build(mesh, features, is_training) of pretraining, for a TaskModel.

  Features are the pretraining records' (data.pretraining_feature_spec),
  batched. Outputs: "loss" (masked-LM + next-sentence), "objective" (plus
  the mixture-of-experts loss), "masked_lm_loss", "next_sentence_loss",
  "masked_lm_example_loss" and "masked_lm_predictions" [batch,
  max_pred_seq], "next_sentence_example_loss" and
  "next_sentence_predictions" [batch].

  Args:
    bert_config: the BertConfig.
    mesh_shape: the mtf.Shape (or string) of the mesh.
    layout_rules: the mtf.LayoutRules (or string).

  Returns:
    The build function.
  """
  mesh_shape = mtf.convert_to_shape(mesh_shape)
  layout_rules = mtf.convert_to_layout_rules(layout_rules)

  def build(mesh, features, is_training):
    batch_size, seq_length = features["input_ids"].shape.as_list()
    max_predictions = features["masked_lm_positions"].shape.as_list()[1]
    batch_dim = mtf.Dimension("batch", batch_size)
    seq_dim = mtf.Dimension("seq", seq_length)
    pred_dim = mtf.Dimension("max_pred_seq", max_predictions)

    def feature(name, dims):
      return estimator.import_feature(mesh, features[name], dims, name)

    bert = model.BertModel(
      config=bert_config,
      is_training=is_training,
      input_ids=feature("input_ids", [batch_dim, seq_dim]),
      input_mask=feature("input_mask", [batch_dim, seq_dim]),
      token_type_ids=feature("segment_ids", [batch_dim, seq_dim]),
      layout=layout_rules,
      mesh_shape=mesh_shape,
    )
    mlm_loss, mlm_example_loss, mlm_logits = bert.get_masked_lm_output(
      feature("masked_lm_positions", [batch_dim, pred_dim]),
      feature("masked_lm_ids", [batch_dim, pred_dim]),
      feature("masked_lm_weights", [batch_dim, pred_dim]),
    )
    nsp_loss, nsp_example_loss, nsp_logits = bert.get_next_sentence_output(
      feature("next_sentence_labels", [batch_dim])
    )
    total_loss = mlm_loss + nsp_loss
    return {
      "loss": mtf.anonymize(total_loss),
      "objective": total_loss + bert.get_extra_loss(),
      "masked_lm_loss": mtf.anonymize(mlm_loss),
      "next_sentence_loss": mtf.anonymize(nsp_loss),
      "masked_lm_example_loss": mtf.anonymize(mlm_example_loss),
      "masked_lm_predictions": mtf.anonymize(
        mtf.argmax(mlm_logits, bert.vocab_dim)
      ),
      "next_sentence_example_loss": mtf.anonymize(nsp_example_loss),
      "next_sentence_predictions": mtf.anonymize(
        mtf.argmax(nsp_logits, nsp_logits.shape.dims[-1])
      ),
    }

  return build


def pretraining_metrics(batches: Iterable[Dict[str, np.ndarray]]):
  """The original's pretraining eval metrics over predicted batches.

  Args:
    batches: BertEstimator.predict_batches of a pretraining_model task.

  Returns:
    {"masked_lm_accuracy", "masked_lm_loss", "next_sentence_accuracy",
    "next_sentence_loss"} (masked-LM figures weighted by
    masked_lm_weights), as floats.
  """
  sums = dict.fromkeys(
    ["mlm_right", "mlm_loss", "mlm_weight", "nsp_right", "nsp_loss", "nsp"],
    0.0,
  )
  for batch in batches:
    weights = batch["masked_lm_weights"].astype(np.float64)
    right = batch["masked_lm_predictions"] == batch["masked_lm_ids"]
    sums["mlm_right"] += float(np.sum(weights * right))
    sums["mlm_loss"] += float(np.sum(weights * batch["masked_lm_example_loss"]))
    sums["mlm_weight"] += float(np.sum(weights))
    labels = np.reshape(batch["next_sentence_labels"], [-1])
    sums["nsp_right"] += float(
      np.sum(batch["next_sentence_predictions"] == labels)
    )
    sums["nsp_loss"] += float(np.sum(batch["next_sentence_example_loss"]))
    sums["nsp"] += labels.size
  mlm_weight = max(sums["mlm_weight"], 1e-12)
  count = max(sums["nsp"], 1.0)
  return {
    "masked_lm_accuracy": sums["mlm_right"] / mlm_weight,
    "masked_lm_loss": sums["mlm_loss"] / mlm_weight,
    "next_sentence_accuracy": sums["nsp_right"] / count,
    "next_sentence_loss": sums["nsp_loss"] / count,
  }
