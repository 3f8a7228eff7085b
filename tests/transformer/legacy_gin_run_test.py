"""A TF1-era launcher: disable_v2_behavior(), gin, then utils.run on a mesh.

The program below is what a legacy client of the original does: it calls
`tf.compat.v1.disable_v2_behavior()` at start-up, configures
mesh_tensorflow.transformer.utils.run with a gin file and bindings (a tiny
Bitransformer on a 2x2 mesh of 4 virtual CPUs, an in-memory reverse task),
trains, then decodes a file in "infer" mode. It runs in subprocesses, as the
switch is process-wide; run with TF2 behaviour, the same program must train
to the same losses and write the same decodes.
"""

import textwrap

import numpy as np
import pytest

from tests.transformer import driver_test_util as dtu

# argv: "v1" or "v2", a work directory. Prints one RESULT line of JSON.
_PROGRAM = textwrap.dedent("""
    import json, os, sys
    import tensorflow as tf
    if sys.argv[1] == "v1":
      tf.compat.v1.disable_v2_behavior()
    import gin
    import numpy as np
    import mesh_tensorflow as mtf
    from mesh_tensorflow import utils as mtf_utils
    mtf_utils.configure_virtual_cpus(4)
    from mesh_tensorflow.transformer import utils

    @gin.configurable
    def reverse_task(sequence_length, vocabulary, dataset_split):
      del vocabulary
      rng = np.random.RandomState(0 if dataset_split == "train" else 1)
      x = rng.randint(3, 20, size=(64, sequence_length["targets"]))
      x[:, -1] = 1
      y = x.copy()
      y[:, :-1] = x[:, :-1][:, ::-1]
      return tf.data.Dataset.from_tensor_slices(
          {"inputs": x.astype(np.int32), "targets": y.astype(np.int32)})

    class DigitVocabulary:  # ids 3..19 <-> space-separated numbers
      vocab_size = 20
      def encode(self, s):
        return [int(t) for t in s.split()]
      def decode(self, ids):
        return " ".join(str(int(i)) for i in ids)

    @gin.configurable
    def digit_vocabulary():
      return DigitVocabulary()

    work = sys.argv[2]
    os.makedirs(work)
    with open(os.path.join(work, "inputs.txt"), "w") as f:
      f.write("3 4 5 6 7 8 9\\n19 18 17 16 15 14 13\\n5 5 6 6 7 7 8\\n")
    with open(os.path.join(work, "tiny.gin"), "w") as f:
      f.write('''
    num_layers = 1
    d_model = 16
    d_ff = 32
    num_heads = 2
    d_kv = 8
    dropout_rate = 0.0
    transformer.Unitransformer.max_length = 8
    utils.get_variable_dtype.activation_dtype = "float32"
    utils.run.vocabulary = @digit_vocabulary()
    utils.run.train_dataset_fn = @reverse_task
    utils.run.sequence_length = 8
    utils.run.batch_size = ("sequences_per_batch", 8)
    utils.run.mesh_shape = "rows:2;cols:2"
    utils.run.layout_rules = "batch:rows,heads:cols,d_ff:cols,vocab:cols"
    utils.run.learning_rate_schedule = 0.01
    utils.run.train_steps = 4
    utils.run.eval_checkpoint_step = -1
    ''')
    utils.parse_gin_defaults_and_flags(
        gin_files=[os.path.join(work, "tiny.gin")],
        gin_params=[
            "utils.decode_from_file.input_filename = %r"
            % os.path.join(work, "inputs.txt"),
            "utils.decode_from_file.output_filename = %r"
            % os.path.join(work, "decodes"),
        ],
        finalize_config=False)
    model_dir = os.path.join(work, "model")
    # The driver runs eagerly in both modes, as the original's Estimator ran
    # in a graph of its own: the program's graph seed does not reach it. The
    # eager seed makes both runs draw the same initial variables.
    from tensorflow.python.eager import context
    with context.eager_mode():
      tf.random.set_seed(1)
    train = utils.run(None, None, None, None, model_dir, mode="train")
    utils.run(None, None, None, None, model_dir, mode="infer")
    with open(os.path.join(work, "decodes-4")) as f:
      decodes = f.read().splitlines()
    print("RESULT " + json.dumps({
        "step": int(train["step"]), "loss": float(train["loss"]),
        "decodes": decodes,
        "tf2": tf.__internal__.tf2.enabled()}))
""")


def _run(mode, work):
  return dtu.run_result_program(_PROGRAM, mode, work, timeout=300)


@pytest.mark.slow
def test_gin_configured_run_trains_and_decodes_as_with_tf2(tmp_path):
  v2 = _run("v2", str(tmp_path / "v2"))
  v1 = _run("v1", str(tmp_path / "v1"))
  assert v2["tf2"] and not v1["tf2"]  # the switch took effect
  assert v1["step"] == v2["step"] == 4
  assert np.isfinite(v2["loss"])
  np.testing.assert_allclose(v1["loss"], v2["loss"], rtol=1e-6)
  # One decode per input line, each a sequence of ids, the same in both.
  assert len(v2["decodes"]) == 3
  assert all(d.split() for d in v2["decodes"])
  assert v1["decodes"] == v2["decodes"]
