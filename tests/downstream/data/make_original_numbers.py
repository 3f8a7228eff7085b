"""Writes gpt_style_original.npz: the original package's numbers.

Run with the original mesh-tensorflow 0.1.21 (and TF 2.21) first on
PYTHONPATH, from the repository root:

  PYTHONPATH=<original>:. python tests/downstream/data/make_original_numbers.py

It runs tests/downstream/gpt_style_program.py on one device, in tf.compat.v1
graphs with TF2 behaviour (resource variables). Not in TF1 legacy mode: there
the original's lowered Adafactor updates (per variable, with no dependency on
the other variables' gradients) write reference variables in place while the
backward pass may still read them, so a few updated elements depend on
scheduling; this package gives the graph-mode numbers in both modes. GPT-style programs were written for mesh-tensorflow 0.1.18, whose
transformer.attention.attention accepted context=None; 0.1.21 reads
`context.train` for its dropout even at dropout_rate 0. Only here, for the
original, a context that is not training is passed instead of None (at rate
0 the dropout is the identity either way, so the numbers are the same).
The original's hooks derive from tf.estimator.SessionRunHook, which TF 2.21
no longer has (the environment's stand-in is empty): they get
tf.compat.v1.train.SessionRunHook's no-op methods.
"""

import os
import sys
import types

import numpy as np
import tensorflow as tf

import mesh_tensorflow as mtf  # noqa: E402
import mesh_tensorflow.transformer as mtf_transformer  # noqa: E402
from mesh_tensorflow.transformer import attention  # noqa: E402

sys.path.append(os.getcwd())
from tests import original_package  # noqa: E402
from tests.downstream import gpt_style_program  # noqa: E402


def _accept_no_context(attention_fn):
  not_training = types.SimpleNamespace(
    train=False, model=types.SimpleNamespace(layout=None, mesh_shape=None)
  )

  def wrapped(*args, **kwargs):
    if kwargs.get("context") is None:
      kwargs["context"] = not_training
    return attention_fn(*args, **kwargs)

  return wrapped


def main():
  original_package.require_original()
  attention.attention = _accept_no_context(attention.attention)
  base = tf.compat.v1.train.SessionRunHook
  for method in ("begin", "after_create_session", "before_run", "after_run",
                 "end"):  # fmt: skip
    if not hasattr(mtf.MtfRestoreHook, method):
      setattr(mtf.MtfRestoreHook, method, getattr(base, method))
  arrays = gpt_style_program.run(mtf, mtf_transformer, "", "")
  path = os.path.join(os.path.dirname(__file__), "gpt_style_original.npz")
  np.savez_compressed(path, **arrays)
  print("wrote %d arrays to %s" % (len(arrays), path))


if __name__ == "__main__":
  main()
