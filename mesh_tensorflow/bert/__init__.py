"""mesh_tensorflow.bert: BERT on a mesh, its pretraining and fine-tuning.

Modules (imported on demand, as the original's package):
  bert: BertConfig and BertModel (attention, feed-forward and
    mixture-of-experts blocks; masked-LM and next-sentence heads).
  optimization: create_optimizer (Adam with weight decay, warmup and linear
    decay).
  tokenization: WordPiece tokenization (FullTokenizer).
  run_pretraining, run_classifier, run_squad: the command-line drivers
    (absl flags), running on the TF2 driver of mesh_tensorflow.transformer.
"""
