"""Offline data for BERT: a tiny vocabulary, corpus and classification set.

Lets pretraining and fine-tuning run with no download (tests, demos):
`python -m mesh_tensorflow.bert.demo_data DIR` (or write_demo_data(DIR))
writes DIR/vocab.txt, DIR/bert_config.json, DIR/pretrain.tfrecord and the
CoLA-layout set DIR/classifier/{train,dev,test}.tsv. The code lives in
mesh_tensorflow/bert/_src/data.py.
"""
# pylint: disable=g-importing-member,useless-import-alias

import sys

from mesh_tensorflow.bert._src.data import DemoData as DemoData
from mesh_tensorflow.bert._src.data import (
  create_pretraining_features as create_pretraining_features,
)
from mesh_tensorflow.bert._src.data import (
  generate_classification_set as generate_classification_set,
)
from mesh_tensorflow.bert._src.data import generate_corpus as generate_corpus
from mesh_tensorflow.bert._src.data import write_demo_data as write_demo_data
from mesh_tensorflow.bert._src.data import write_examples as write_examples
from mesh_tensorflow.bert._src.data import write_vocab as write_vocab

__all__ = [
  "DemoData",
  "create_pretraining_features",
  "generate_classification_set",
  "generate_corpus",
  "write_demo_data",
  "write_examples",
  "write_vocab",
]

if __name__ == "__main__":
  if len(sys.argv) != 2:
    sys.exit("usage: python -m mesh_tensorflow.bert.demo_data DIR")
  for path in write_demo_data(sys.argv[1]):
    print(path)
