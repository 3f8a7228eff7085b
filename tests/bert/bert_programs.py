"""BERT programs run identically against this package and the original.

Each program builds a tiny BERT (the original's BertConfig: 2 blocks,
hidden 16, vocabulary 50) from fixed features in a tf.compat.v1 graph, as
the original's run_pretraining and run_classifier model functions do, lays
it out on a mesh with PlacementMeshImpl and runs it in a Session:

- "pretraining_*": the masked-LM and next-sentence heads, their sum
  trained by bert.optimization.create_optimizer;
- "classifier_*": run_classifier.create_model's softmax classifier on the
  pooled output (not training: its own dropout would draw random numbers),
  trained the same way.

It calls the original's public API only, so the very same code runs on
both. `run_program(mtf, name)` returns numpy arrays: every variable's
initial value as its initializer draws it under a fixed graph seed
("init:<variable>"), then, from fixed values given to every trainable
variable but the biases (which stay 0) in the order of sorted names, the
losses and outputs of the model, the losses of each of three training steps
("step<k>:<output>") and every variable (slots too) after the first step
("first:<variable>": Adam's first step is at learning rate 0, so its slots
hold the clipped gradients) and after the last ("final:<variable>").
data/make_bert_original.py stored what the original computed;
bert_original_test.py compares this package with it.
"""

from typing import Dict

import numpy as np
import tensorflow as tf

from tests.program_variables import set_master_values

tf1 = tf.compat.v1

BATCH, SEQ, PRED, VOCAB, NUM_LABELS = 4, 8, 3, 50, 3
TRAIN_STEPS = 3
GRAPH_SEED = 1234

# run_pretraining's default layout rules.
BERT_LAYOUT = (
  "batch:batch,vocab:model,intermediate:model,num_heads:model,experts:batch"
)
MESHES = {
  "one_device": ("", ""),
  "2x2": ("batch:2;model:2", BERT_LAYOUT),
}

# name -> (head, optimizer, mesh, init_lr). Adam needs init_lr (here with
# one warmup step); Adafactor takes it (a learning rate tensor) or, without
# it, uses its own schedule.
PROGRAMS = {
  "pretraining_adam_one_device": ("pretraining", "adam", "one_device", 0.1),
  "pretraining_adam_2x2": ("pretraining", "adam", "2x2", 0.1),
  "pretraining_adafactor_one_device": (
    "pretraining",
    "adafactor",
    "one_device",
    None,
  ),
  "pretraining_adafactor_2x2": ("pretraining", "adafactor", "2x2", None),
  "pretraining_adafactor_init_lr_one_device": (
    "pretraining",
    "adafactor",
    "one_device",
    0.01,
  ),
  "classifier_adam_one_device": ("classifier", "adam", "one_device", 0.1),
  "classifier_adam_2x2": ("classifier", "adam", "2x2", 0.1),
}


def _config(bert_lib):
  return bert_lib.BertConfig(
    vocab_size=VOCAB,
    d_model=16,
    max_position_embeddings=16,
    num_blocks=2,
    layer_output_dropout_prob=0.0,
    attention_num_heads=4,
    attention_probs_dropout_prob=0.0,
    feedforward_intermediate_size=32,
    type_vocab_size=2,
  )


def _features(rng):
  """Fixed numpy features: padded sequences, two segments, masked tokens."""
  lengths = rng.randint(SEQ // 2, SEQ + 1, size=[BATCH])
  input_mask = (np.arange(SEQ)[None, :] < lengths[:, None]).astype(np.int32)
  segment_ids = (np.arange(SEQ)[None, :] >= lengths[:, None] // 2).astype(
    np.int32
  )
  positions = np.stack(
    [np.sort(rng.choice(n, size=PRED, replace=False)) for n in lengths]
  )
  weights = np.ones([BATCH, PRED], np.float32)
  weights[0, -1] = 0.0
  return {
    "input_ids": rng.randint(0, VOCAB, size=[BATCH, SEQ]).astype(np.int32)
    * input_mask,
    "input_mask": input_mask,
    "segment_ids": segment_ids * input_mask,
    "masked_lm_positions": positions.astype(np.int32),
    "masked_lm_ids": rng.randint(0, VOCAB, size=[BATCH, PRED]).astype(np.int32),
    "masked_lm_weights": weights,
    "labels": rng.randint(0, 2, size=[BATCH]).astype(np.int32),
    "label_ids": rng.randint(0, NUM_LABELS, size=[BATCH]).astype(np.int32),
  }


def _pretraining(mtf, bert_lib, mesh, inputs, mesh_shape, layout):
  """The run_pretraining model: returns (total loss, {name: output})."""
  model = bert_lib.BertModel(
    config=_config(bert_lib),
    is_training=True,
    input_ids=inputs["input_ids"],
    input_mask=inputs["input_mask"],
    token_type_ids=inputs["segment_ids"],
    layout=layout,
    mesh_shape=mesh_shape,
  )
  lm_loss, lm_example_loss, lm_logits = model.get_masked_lm_output(
    inputs["masked_lm_positions"],
    inputs["masked_lm_ids"],
    inputs["masked_lm_weights"],
  )
  ns_loss, ns_example_loss, ns_logits = model.get_next_sentence_output(
    inputs["labels"]
  )
  total_loss = mtf.anonymize(lm_loss + ns_loss)
  outputs = {
    "masked_lm_loss": lm_loss,
    "masked_lm_example_loss": mtf.anonymize(lm_example_loss),
    "masked_lm_logits": mtf.anonymize(lm_logits),
    "next_sentence_loss": ns_loss,
    "next_sentence_example_loss": mtf.anonymize(ns_example_loss),
    "next_sentence_logits": mtf.anonymize(ns_logits),
    "pooled_output": model.get_pooled_output(),
    "sequence_output": model.get_sequence_output(),
  }
  return total_loss + model.get_extra_loss(), outputs


def _classifier(mtf, run_classifier, mesh, inputs, mesh_shape, layout):
  """run_classifier.create_model: returns (loss, {name: output})."""
  del mesh
  # run_classifier's model_fn names the labels' dim "seq" too.
  num_labels_dim = mtf.Dimension("seq", NUM_LABELS)
  loss, per_example_loss, logits, probabilities = run_classifier.create_model(
    _config(run_classifier.bert_lib),
    False,
    inputs["input_ids"],
    inputs["input_mask"],
    inputs["segment_ids"],
    inputs["label_ids"],
    num_labels_dim,
    layout,
    mesh_shape,
  )
  outputs = {
    "per_example_loss": mtf.anonymize(per_example_loss),
    "logits": mtf.anonymize(logits),
    "probabilities": mtf.anonymize(probabilities),
  }
  return mtf.anonymize(loss), outputs


def _import_features(mtf, mesh, features):
  batch = mtf.Dimension("batch", BATCH)
  seq = mtf.Dimension("seq", SEQ)
  pred = mtf.Dimension("max_pred_seq", PRED)
  dims = {
    "input_ids": [batch, seq],
    "input_mask": [batch, seq],
    "segment_ids": [batch, seq],
    "masked_lm_positions": [batch, pred],
    "masked_lm_ids": [batch, pred],
    "masked_lm_weights": [batch, pred],
    "labels": [batch],
    "label_ids": [batch],
  }
  return {
    name: mtf.import_tf_tensor(mesh, tf.constant(features[name]), dims[name])
    for name in dims
  }


def run_program(mtf, name: str) -> Dict[str, np.ndarray]:
  """Builds and runs PROGRAMS[name]; returns {output name: numpy array}.

  Args:
    mtf: the mesh_tensorflow package under test (this one or the original).
    name: the program.

  Returns:
    "init:<variable>" (on one device: the master variables after their
    initializers ran), "<output>" (after setting every trainable variable
    but the biases to fixed values), "step<k>:loss" and
    "step<k>:learning_rate" (k = 0, 1, 2: the values each training step
    used), "first:<variable>" and "final:<variable>" (every variable,
    optimizer slots too, after the first and the last step).
  """
  # pylint: disable=g-import-not-at-top
  from mesh_tensorflow.bert import bert as bert_lib
  from mesh_tensorflow.bert import optimization
  from mesh_tensorflow.bert import run_classifier

  head, optimizer, mesh_name, init_lr = PROGRAMS[name]
  mesh_shape, layout = MESHES[mesh_name]
  rng = np.random.RandomState(sorted(PROGRAMS).index(name))
  features = _features(rng)
  graph = tf.Graph()
  with graph.as_default():
    tf1.set_random_seed(GRAPH_SEED)
    mtf_graph = mtf.Graph()
    mesh = mtf.Mesh(mtf_graph, "bert_mesh")
    mesh_shape = mtf.convert_to_shape(mesh_shape)
    layout = mtf.convert_to_layout_rules(layout)
    inputs = _import_features(mtf, mesh, features)
    if head == "pretraining":
      loss, outputs = _pretraining(
        mtf, bert_lib, mesh, inputs, mesh_shape, layout
      )
    else:
      loss, outputs = _classifier(
        mtf, run_classifier, mesh, inputs, mesh_shape, layout
      )
    learning_rate, update_ops = optimization.create_optimizer(
      loss,
      init_lr,
      num_train_steps=10,
      num_warmup_steps=1,
      optimizer=optimizer,
    )
    # Read before lowering, which stacks variables (their masters stay).
    names = sorted(v.name for v in mtf_graph.all_variables)
    trained = sorted(v.name for v in mtf_graph.trainable_variables)
    mesh_impl = mtf.placement_mesh_impl.PlacementMeshImpl(
      mesh_shape, layout, [""] * mesh_shape.size
    )
    lowering = mtf.Lowering(mtf_graph, {mesh: mesh_impl})
    fetches = {
      key: tf.cast(lowering.export_to_tf_tensor(value), tf.float32)
      for key, value in outputs.items()
    }
    tf_loss = tf.cast(lowering.export_to_tf_tensor(loss), tf.float32)
    fetches["loss"] = tf_loss
    train_op = tf.group([lowering.lowered_operation(op) for op in update_ops])
    global_step = tf1.train.get_global_step()
    next_step = tf1.assign_add(global_step, 1)
    step_fetches = {"loss": tf_loss}
    if learning_rate is not None:
      step_fetches["learning_rate"] = learning_rate
    # The trainable variables but the biases get fixed values; biases and
    # the optimizer's slots keep their zeros. (A random key bias would add
    # to every attention logit of a query the same number, which the
    # softmax cancels: only its rounding would be left in the gradients.)
    masters, set_values = set_master_values(
      names, [n for n in trained if not n.endswith("bias")], rng
    )
    copy_to_slices = lowering.copy_masters_to_slices()
    copy_to_masters = lowering.copy_slices_to_masters()
    with tf1.Session(graph=graph) as session:
      session.run(tf1.global_variables_initializer())
      results = {}
      if mesh_name == "one_device":  # (masters do not depend on the mesh)
        results = {"init:" + n: session.run(masters[n]) for n in names}
      session.run(set_values)
      session.run(copy_to_slices)
      results.update(session.run(fetches))
      for step in range(TRAIN_STEPS):
        for key, value in session.run(step_fetches).items():
          results["step%d:%s" % (step, key)] = value
        session.run(train_op)
        session.run(next_step)
        if step in (0, TRAIN_STEPS - 1):
          session.run(copy_to_masters)
          prefix = "first:" if step == 0 else "final:"
          for n in names:
            results[prefix + n] = session.run(masters[n])
  return {k: np.asarray(v) for k, v in results.items()}
