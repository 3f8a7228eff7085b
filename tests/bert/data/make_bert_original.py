"""Writes bert_original.npz: the original package's BERT numbers.

Run with the original mesh-tensorflow 0.1.21 (and TF 2.21) first on
PYTHONPATH, from the repository root:

  PYTHONPATH=<original>:. python tests/bert/data/make_bert_original.py

It runs every program of tests/bert/bert_programs.py (tf.compat.v1 graphs
and Sessions) and stores output `<key>` of program `<name>` as
`<name>/<key>`.
"""

import os
import sys

import mesh_tensorflow as mtf

sys.path.append(os.getcwd())
from tests import original_package  # noqa: E402
from tests.bert import bert_programs  # noqa: E402


def main():
  original_package.require_original()
  original_package.record_outputs(
    os.path.join(os.path.dirname(__file__), "bert_original.npz"),
    sorted(bert_programs.PROGRAMS),
    lambda name: bert_programs.run_program(mtf, name),
  )


if __name__ == "__main__":
  main()
