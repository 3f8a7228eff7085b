"""Models and data of the checkpoints the original package wrote.

data/make_original_checkpoint.py trains each case under the original
mesh-tensorflow 0.1.21 (its own tpu_estimator_model_fn, saver and hooks),
writes the checkpoint to data/original_checkpoints/<case>/ and the numbers
the original computes from it to data/original_checkpoints.npz;
original_checkpoint_test.py restores the directory with this package's
driver. Everything here is plain Python, gin text and numpy, so both
packages read it.

Token ids are UTF-8 bytes + 3 (0 pad, 1 EOS), as ByteVocabulary encodes.
"""

import numpy as np

LENGTH = 8
BATCH = 4
VOCAB_SIZE = 259  # 256 bytes + pad, EOS, unknown
TRAIN_STEPS = 20  # the original trained this many steps: model.ckpt-20
MORE_STEPS = 2  # further steps from the checkpoint, on TRAIN_PAIRS
LEARNING_RATE = 0.05
SEED = 5

# Macros and bindings over the defaults.gin of each package.
_TINY = """
num_layers = 1
d_model = 8
d_ff = 16
num_heads = 2
d_kv = 4
dropout_rate = 0.0
Unitransformer.max_length = 16
"""


def _dtypes(master: str, activation: str) -> str:
  """get_variable_dtype bindings: master and activation dtypes by name."""
  return f"""
utils.get_variable_dtype.master_dtype = "{master}"
utils.get_variable_dtype.slice_dtype = "float32"
utils.get_variable_dtype.activation_dtype = "{activation}"
"""


# name -> (model_type, gin bindings). "bf16" keeps bfloat16 masters and
# activations, as the T5 gin files train (slices stay float32);
# "bf16_masters" keeps bfloat16 masters with float32 activations.
CASES = {
  "bitransformer": ("bitransformer", _TINY + _dtypes("float32", "float32")),
  "bitransformer_bf16": (
    "bitransformer",
    _TINY + _dtypes("bfloat16", "bfloat16"),
  ),
  "bitransformer_bf16_masters": (
    "bitransformer",
    _TINY + _dtypes("bfloat16", "float32"),
  ),
  "lm": ("lm", _TINY + _dtypes("float32", "float32")),
  # An LM trained on (input, target) pairs joined into one sequence.
  "delimited_lm": ("delimited_lm", _TINY + _dtypes("float32", "float32")),
}

# One batch each: the training batch, the scored pairs, the eval pairs and
# the inputs to decode.
TRAIN_PAIRS = [("abc", "cba"), ("hello", "olleh"), ("mesh", "hsem"), ("x", "x")]
SCORE_PAIRS = [("abc", "cba"), ("tf", "ft"), ("zzz", "zz"), ("mesh", "abc")]
EVAL_PAIRS = [("hello", "olleh"), ("ab", "ba"), ("xyz", "zyx"), ("q", "qq")]
DECODE_INPUTS = ["abc", "hello", "x", "mesh tf"]
BEAM_SIZE = 2


def bf16_activations(name: str) -> bool:
  """Whether case `name` computes in bfloat16 (rounds in its own order)."""
  return 'activation_dtype = "bfloat16"' in CASES[name][1]


def byte_ids(text: str, eos: bool = True, length: int = LENGTH) -> list:
  """text's ids (bytes + 3), with EOS if asked, padded/cut to length."""
  ids = [b + 3 for b in text.encode("utf-8")] + ([1] if eos else [])
  ids = ids[:length]
  return ids + [0] * (length - len(ids))


def features(model_type: str, pairs) -> dict:
  """int32 [BATCH, LENGTH] features of (input, target) text pairs.

  A Bitransformer and a delimited LM read "inputs" and "targets" (the
  delimited LM joins them); an LM only "targets" (the target text, with
  EOS).
  """
  out = {"targets": np.array([byte_ids(t) for _, t in pairs], np.int32)}
  if model_type != "lm":
    out["inputs"] = np.array([byte_ids(i) for i, _ in pairs], np.int32)
  return out


def decode_inputs(model_type: str) -> np.ndarray:
  """int32 [BATCH, LENGTH] ids of DECODE_INPUTS (an LM's prompt: no EOS; a
  delimited LM's ends with the EOS that ends its inputs part).
  """
  eos = model_type != "lm"
  return np.array([byte_ids(s, eos=eos) for s in DECODE_INPUTS], np.int32)
