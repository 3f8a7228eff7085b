"""Writes t2t_style_original.npz: the original package's numbers.

Run with the original mesh-tensorflow 0.1.21 (and TF 2.21) first on
PYTHONPATH, from the repository root:

  PYTHONPATH=<original>:. python tests/downstream/data/make_t2t_style_original.py

It runs every program of tests/downstream/t2t_style_programs.py (one device,
a tf.compat.v1 graph and Session) and stores output `<key>` of program
`<name>` as `<name>/<key>`.
"""

import os
import sys

import mesh_tensorflow as mtf

sys.path.append(os.getcwd())
from tests import original_package  # noqa: E402
from tests.downstream import t2t_style_programs  # noqa: E402


def main():
  original_package.require_original()
  original_package.record_outputs(
    os.path.join(os.path.dirname(__file__), "t2t_style_original.npz"),
    sorted(t2t_style_programs.PROGRAMS),
    lambda name: t2t_style_programs.run_program(mtf, name),
  )


if __name__ == "__main__":
  main()
