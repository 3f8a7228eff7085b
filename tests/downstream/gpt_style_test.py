"""A GPT-style downstream program runs unchanged and gives the original's numbers.

gpt_style_program.py builds and runs the model the way GPT-style model_fns
do (tf.compat.v1 graph, MonitoredSession, MtfRestoreHook and
MtfCheckpointSaverListener); data/gpt_style_original.npz holds what
mesh-tensorflow 0.1.21 computed for it on one device. Checked: on the
1-device, 4-device and 2x2 meshes, logits, losses, every gradient, the
checkpointed variables after an Adam step and the decodes equal the
original's; Adafactor, the variants model (rotary embeddings, ReZero, gated
MLP, linear attention, mixture of experts, recompute_grad, custom_gradient,
two microbatches) and bfloat16 activations on the 2x2 mesh; the same in TF1
legacy mode in a fresh process; and, independently of the original, the
logits and losses against plain numpy and greedy decoding against the
argmax of teacher-forced logits.
"""

import os
import subprocess
import sys

import numpy as np
import pytest

import mesh_tensorflow as mtf
import mesh_tensorflow.transformer as mtf_transformer
from tests import meshes
from tests.downstream import gpt_style_model as gm
from tests.downstream import gpt_style_program as gp
from tests.downstream import gpt_style_reference as ref

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(os.path.dirname(_HERE))
TF1_ENV = os.environ.get("MTF_TEST_TF_MODE", "") == "v1"
ROWS_COLS = meshes.GPT_STYLE[-1]


@pytest.fixture(scope="module")
def original():
  with np.load(os.path.join(_HERE, "data", "gpt_style_original.npz")) as f:
    return dict(f)


def _assert_matches(got, expected, group, rtol=1e-4, atol=1e-5, skip=()):
  """got equals expected on every key of `group` (ints and names exactly)."""
  keys = sorted(
    k for k in expected if k.split("/")[0] == group and not k.startswith(skip)
  )
  assert keys
  assert set(keys) == {
    k for k in got if k.split("/")[0] == group and not k.startswith(skip)
  }
  for key in keys:
    want, have = expected[key], got[key]
    if want.dtype.kind in "US":
      assert str(have) == str(want), key
    elif np.issubdtype(want.dtype, np.integer):
      np.testing.assert_array_equal(have, want, err_msg=key)
    else:
      scale = max(1.0, float(np.abs(want).max(initial=0.0)))
      np.testing.assert_allclose(
        have, want, rtol=rtol, atol=atol * scale, err_msg=key
      )


@pytest.mark.slow
@meshes.parametrize(meshes.GPT_STYLE)
def test_training_and_decoding_match_the_original(original, mesh_shape, layout):
  got = gp.run(mtf, mtf_transformer, mesh_shape, layout, ("train", "predict"))
  _assert_matches(got, original, "train")
  _assert_matches(got, original, "predict")


@pytest.mark.slow
@pytest.mark.parametrize("group", ["adafactor", "variant"])
def test_less_common_paths_match_the_original(original, group):
  """Adafactor and the variants model, on the 2x2 mesh."""
  got = gp.run(mtf, mtf_transformer, *ROWS_COLS, groups=(group,))
  _assert_matches(got, original, group)


@pytest.mark.slow
def test_bfloat16_activations_match_the_original(original):
  """On one device the forward pass equals the original's, gradients nearly.

  (On split meshes bfloat16 partial sums round differently from one
  device's, in either package.) Gradients agree to a few bfloat16 roundings (both packages round the same
  maths in a different order). Updated variables are not compared: Adam's
  first step moves every element by about the learning rate in the sign of
  its gradient, which a rounding flips for near-zero gradients.
  """
  got = gp.run(mtf, mtf_transformer, "", "", groups=("bfloat16",))
  _assert_matches(
    got, original, "bfloat16", skip=("bfloat16/grad/", "bfloat16/after/")
  )
  _assert_matches(
    got,
    original,
    "bfloat16",
    rtol=3e-2,
    atol=3e-2,
    skip=(
      "bfloat16/after/",
      "bfloat16/logits",
      "bfloat16/loss",
      "bfloat16/mean",
      "bfloat16/max",
      "bfloat16/summaries",
      "bfloat16/variables",
    ),
  )


@pytest.mark.slow
@pytest.mark.skipif(TF1_ENV, reason="the TF1 pass runs the others in TF1 mode")
def test_tf1_legacy_mode_in_a_fresh_process(original, tmp_path):
  """tf.compat.v1.disable_v2_behavior() at start-up, then the same program."""
  path = str(tmp_path / "out.npz")
  env = dict(os.environ, PYTHONPATH=_ROOT, TF_CPP_MIN_LOG_LEVEL="2")
  result = subprocess.run(
    [
      sys.executable,
      os.path.join(_HERE, "gpt_style_program.py"),
      "v1",
      *ROWS_COLS,
      path,
      "train,predict",
    ],
    env=env,
    capture_output=True,
    text=True,
    timeout=900,
    check=False,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  with np.load(path) as f:
    got = dict(f)
  _assert_matches(got, original, "train")
  _assert_matches(got, original, "predict")


def test_logits_and_losses_equal_numpy(original):
  """The program computes the model it describes (reference data only)."""
  weights = ref.weights(str(original["train/variables"]))
  ids = gp.training_ids(gm.PARAMS)
  logits = ref.logits(weights, ids[:, :-1])
  np.testing.assert_allclose(original["train/logits"], logits, atol=1e-5)
  losses = ref.token_losses(logits, ids[:, 1:], gm.PARAMS["z_loss"])
  np.testing.assert_allclose(original["train/loss_batch"], losses, atol=1e-5)
  np.testing.assert_allclose(original["train/loss"], losses.mean(), atol=1e-5)
  np.testing.assert_array_equal(original["train/max_logits"], logits.argmax(-1))


def _prefix_lengths():
  return (gp.PROMPTS != 0).sum(-1)


def test_greedy_decode_is_the_argmax_of_teacher_forced_logits(original):
  weights = ref.weights(str(original["train/variables"]))
  greedy = original["predict/greedy"]
  np.testing.assert_array_equal(
    greedy[gp.PROMPTS != 0], gp.PROMPTS[gp.PROMPTS != 0]
  )
  predicted = ref.logits(weights, greedy).argmax(-1)
  for row, start in enumerate(_prefix_lengths()):
    np.testing.assert_array_equal(
      greedy[row, start:], predicted[row, start - 1 : -1], err_msg=str(row)
    )


def test_stopped_decode_follows_the_loop_rules(original):
  """Rows advance until all are done, then lose their prompts.

  A row is done with a new stop token, 4 new tokens or a full sequence;
  remove_partial_sequences shifts each left by its prompt's length.
  """
  greedy = original["predict/greedy"]
  starts = _prefix_lengths()
  length = greedy.shape[1]
  steps = 0
  while True:
    done = []
    for row, start in enumerate(starts):
      new = greedy[row, start : min(start + steps, length)]
      done.append(start + steps >= length or steps >= 4 or gp.STOP_TOKEN in new)
    if all(done):
      break
    steps += 1
  expected = np.zeros_like(greedy)
  for row, start in enumerate(starts):
    new = greedy[row, start : min(start + steps, length)]
    expected[row, : len(new)] = new
  np.testing.assert_array_equal(original["predict/stopped"], expected)


def test_slow_sampling_equals_cached_sampling(original):
  """The whole-sequence decode loop (no Context) gives the cached decode."""
  np.testing.assert_array_equal(
    original["predict/slow"], original["predict/greedy"]
  )
