"""A tiny Bitransformer and toy data shared by the driver tests.

The model (d_model 16, 1+1 layers, vocabulary 20) learns to reverse short
random id sequences held in memory; float32 throughout by default (the
defaults.gin bfloat16 activations round differently on other layouts).
"""

import functools
import json
import os
import subprocess
import sys

import gin
import numpy as np
import tensorflow as tf

from transformer import learning_rate_schedules
from transformer import utils
from transformer._src.driver import estimator as driver

VOCAB = 20
LENGTH = 8
BATCH = 8
MESH_2X2 = ("rows:2;cols:2", "batch:rows,heads:cols,d_ff:cols,vocab:cols")
MESH_1 = ("", "")
REPO = os.path.dirname(
  os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
)


def all_ops(graph):
  """The graph's ops and those of the functions it holds (while bodies)."""
  for op in graph.get_operations():
    yield op
  for function in graph._functions.values():  # pylint: disable=protected-access
    inner = getattr(function, "graph", None)
    if inner is not None:
      yield from all_ops(inner)


def run_result_program(program: str, *args: str, timeout: int = 600) -> dict:
  """Runs `python -c program args...` and returns its last RESULT line's JSON.

  For programs that must run in a process of their own (e.g. after
  tf.compat.v1.disable_v2_behavior(), which is process-wide): the program
  prints "RESULT " followed by a JSON object; the test fails with the end of
  its stderr if it exits non-zero or prints none.
  """
  env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2")
  out = subprocess.run(
    [sys.executable, "-c", program, *args],
    capture_output=True,
    text=True,
    env=env,
    timeout=timeout,
    check=False,
  )
  lines = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")]
  assert out.returncode == 0 and lines, out.stderr[-3000:]
  return json.loads(lines[-1][len("RESULT ") :])


def tiny_gin(extra: str = "") -> None:
  gin.clear_config()
  gin.parse_config_files_and_bindings(
    [os.path.join(utils.config_dir(), "defaults.gin")],
    """
num_layers = 1
d_model = 16
d_ff = 32
num_heads = 2
d_kv = 8
dropout_rate = 0.0
transformer.Unitransformer.max_length = 8
"""
    + extra,
    finalize_config=False,
  )


def reverse_data(n=64, seed=0):
  """(inputs, targets) int32 [n, LENGTH]: ids 3..19, EOS last, reversed."""
  rng = np.random.RandomState(seed)
  x = rng.randint(3, VOCAB, size=(n, LENGTH)).astype(np.int32)
  x[:, -1] = 1
  y = x.copy()
  y[:, :-1] = x[:, :-1][:, ::-1]
  return x, y


def estimator(
  model_dir,
  mesh=MESH_2X2,
  master_dtype="float32",
  activation_dtype="float32",
  vocabulary=None,
  gin_extra="",
  **kwargs,
) -> driver.Estimator:
  """A tiny Bitransformer estimator with a constant 0.01 learning rate."""
  tiny_gin(gin_extra)
  mesh_shape, layout = mesh
  vocab_size = vocabulary.vocab_size if vocabulary else VOCAB
  model = utils.build_model(
    "bitransformer",
    input_vocab_size=vocab_size,
    output_vocab_size=vocab_size,
    layout_rules=layout,
    mesh_shape=mesh_shape,
  )
  schedule = functools.partial(
    learning_rate_schedules.constant_learning_rate,
    learning_rate=0.01,
    total_train_steps=100,
  )
  kwargs.setdefault("learning_rate_schedule", schedule)
  return driver.Estimator(
    "bitransformer",
    model,
    vocabulary,
    str(model_dir),
    mesh_shape,
    layout,
    kwargs.pop("batch_size", BATCH),
    kwargs.pop("sequence_length", LENGTH),
    log_every_steps=10,
    variable_dtype=utils.get_variable_dtype(
      master_dtype=master_dtype, activation_dtype=activation_dtype
    ),
    **kwargs,
  )


def input_fn(batch=BATCH):
  x, y = reverse_data()
  return (
    tf.data.Dataset.from_tensor_slices({"inputs": x, "targets": y})
    .repeat()
    .batch(batch, drop_remainder=True)
  )


def eval_dataset(n=16):
  x, y = reverse_data(n, seed=1)
  return tf.data.Dataset.from_tensor_slices({"inputs": x, "targets": y}).batch(
    BATCH
  )
