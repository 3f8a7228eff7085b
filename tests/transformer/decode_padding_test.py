"""Decoding does not depend on how far the inputs are padded.

A small randomly initialised Bitransformer (and a decoder-only language
model) decodes the same examples padded to L and to 2L; greedy, beam and
sampled decodes must agree, greedy decodes must be the argmax of the
teacher-forced logits, and teacher-forced scores must not move either.
Through the driver, decode entry points and an exported SavedModel give the
same strings whatever inputs sequence_length pads the inputs to.
"""

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mesh_test_util as mtu
from tests import meshes
from tests.transformer import driver_test_util as dtu
from transformer import transformer
from transformer import transformer_layers
from transformer import utils
from transformer import vocabulary as vocabulary_lib

BATCH = 32
LENGTH = 8
VOCAB = 16
D_MODEL = 16
MESHES = meshes.mesh_layouts(
  (meshes.ONE_DEVICE, [""]),
  (meshes.ROWS_COLS, ["batch:rows;heads:cols;d_ff:cols;vocab:cols"]),
)
ATTENTION = dict(num_heads=4, key_value_size=4)
FFN = dict(hidden_size=32)


def _tower(layers, name, autoregressive):
  return transformer.Unitransformer(
    transformer.make_layer_stack(layers, num_layers=2),
    d_model=D_MODEL,
    input_vocab_size=VOCAB,
    output_vocab_size=VOCAB if autoregressive else None,
    autoregressive=autoregressive,
    max_length=4 * LENGTH,
    name=name,
    vocab_divisor=8,
  )


def _bitransformer():
  return transformer.Bitransformer(
    _tower(
      [
        (transformer_layers.SelfAttention, ATTENTION),
        (transformer_layers.DenseReluDense, FFN),
      ],
      "encoder",
      False,
    ),
    _tower(
      [
        (transformer_layers.SelfAttention, ATTENTION),
        (transformer_layers.EncDecAttention, ATTENTION),
        (transformer_layers.DenseReluDense, FFN),
      ],
      "decoder",
      True,
    ),
  )


def _language_model():
  return _tower(
    [
      (transformer_layers.SelfAttention, ATTENTION),
      (transformer_layers.DenseReluDense, FFN),
    ],
    "decoder",
    True,
  )


def _inputs(seed=0):
  """Random ids [BATCH, LENGTH] of lengths 1..LENGTH, zero padded."""
  rng = np.random.RandomState(seed)
  ids = rng.randint(2, VOCAB, size=(BATCH, LENGTH)).astype(np.int32)
  lengths = rng.randint(1, LENGTH + 1, size=BATCH)
  lengths[:2] = [1, LENGTH]
  ids[np.arange(LENGTH)[None, :] >= lengths[:, None]] = 0
  return ids


def _pad(ids, length):
  return np.pad(ids, [(0, 0), (0, length - ids.shape[1])])


def _import(mesh, array):
  dims = [
    mtf.Dimension("batch", array.shape[0]),
    mtf.Dimension("length", array.shape[1]),
  ]
  return mtf.import_fully_replicated(
    mesh, tf.constant(array, tf.int32), mtf.Shape(dims)
  )


def _run_seeded(build, mesh_shape, layout, seed=0):
  """Runs build with a fixed global seed: a program of the same ops draws
  the same initial variables and the same samples.
  """
  tf.random.set_seed(seed)
  return mtu.run_program(build, mesh_shape, layout, "eager")


def _decode_both_paddings(mesh_shape, layout, **decode_kwargs):
  """Decodes of the inputs padded to LENGTH and to 2 * LENGTH."""
  inputs = _inputs()

  def build(mesh):
    model = _bitransformer()
    return [
      model.decode(
        _import(mesh, _pad(inputs, length)),
        max_decode_length=LENGTH,
        **decode_kwargs,
      )
      for length in (LENGTH, 2 * LENGTH)
    ]

  return _run_seeded(build, mesh_shape, layout)


@meshes.parametrize(MESHES)
def test_greedy_decode_ignores_input_padding(mesh_shape, layout):
  short, long = _decode_both_paddings(mesh_shape, layout)
  assert short.shape == (BATCH, LENGTH)
  assert (short > 0).any()
  np.testing.assert_array_equal(short, long)


@meshes.parametrize(MESHES)
def test_beam_decode_ignores_input_padding(mesh_shape, layout):
  short, long = _decode_both_paddings(
    mesh_shape, layout, beam_size=3, alpha=0.6
  )
  assert short.shape == (BATCH, LENGTH)
  assert (short[:, 0] != 1).any()  # Not every beam ends at once.
  np.testing.assert_array_equal(short, long)


def test_sampled_decode_ignores_input_padding():
  """Sampling at temperature 1 with one seed draws the same tokens."""
  inputs = _inputs()

  def decode(length):
    def build(mesh):
      return [
        _bitransformer().decode(
          _import(mesh, _pad(inputs, length)),
          max_decode_length=LENGTH,
          temperature=1.0,
        )
      ]

    return _run_seeded(build, "", "")[0]

  short, long = decode(LENGTH), decode(2 * LENGTH)
  np.testing.assert_array_equal(short, long)


@meshes.parametrize(MESHES)
def test_greedy_decode_is_teacher_forced_argmax(mesh_shape, layout):
  """An independent check: each decoded token is the argmax of the
  teacher-forced logits given the tokens before it (inputs padded long).
  """
  inputs = _pad(_inputs(), 2 * LENGTH)

  def build(mesh):
    model = _bitransformer()
    ids_in = _import(mesh, inputs)
    decoded = model.decode(ids_in, max_decode_length=LENGTH)
    logits, _ = model.call_simple(
      ids_in,
      decoded,
      compute_loss=False,
      mode="infer",
      decoder_sequence_id=mtf.ones_like(decoded),
    )
    return [decoded, logits]

  decoded, logits = _run_seeded(build, mesh_shape, layout)
  for b in range(BATCH):
    eos = np.flatnonzero(decoded[b] == 1)
    end = eos[0] + 1 if eos.size else LENGTH
    np.testing.assert_array_equal(
      decoded[b, :end], logits[b, :end].argmax(-1), err_msg=b
    )


@meshes.parametrize(MESHES)
def test_teacher_forced_scores_ignore_input_padding(mesh_shape, layout):
  inputs = _inputs()
  targets = _inputs(seed=1)

  def build(mesh):
    model = _bitransformer()
    outputs = []
    for length in (LENGTH, 2 * LENGTH):
      logits, loss = model.call_simple(
        _import(mesh, _pad(inputs, length)),
        _import(mesh, targets),
        compute_loss=True,
        mode="eval",
      )
      outputs += [logits, loss]
    return outputs

  short_logits, short_loss, long_logits, long_loss = _run_seeded(
    build, mesh_shape, layout
  )
  np.testing.assert_allclose(short_logits, long_logits, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(short_loss, long_loss, rtol=1e-6)


@meshes.parametrize(MESHES)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_language_model_continuation_ignores_prompt_padding(
  mesh_shape, layout, temperature
):
  """A prompt followed by more zeros continues the same way."""
  prompts = _inputs(seed=2)
  steps = 4

  def continue_prompts(length):
    def build(mesh):
      return [
        _language_model().sample_autoregressive(
          _import(mesh, _pad(prompts, length)),
          temperature=temperature,
          max_steps=steps,
          stop_at_token=None,
        )
      ]

    return _run_seeded(build, mesh_shape, layout)[0]

  short = continue_prompts(2 * LENGTH)
  long = continue_prompts(3 * LENGTH)
  lengths = (prompts > 0).sum(-1)
  np.testing.assert_array_equal(
    np.where(prompts > 0, short[:, :LENGTH], 0), prompts
  )
  for b in range(BATCH):
    end = lengths[b] + steps
    np.testing.assert_array_equal(short[b, :end], long[b, :end], err_msg=b)
    assert not short[b, end:].any() and not long[b, end:].any()


# ----------------------------------------------------------------------------
# Through the driver: decode entry points and the exported SavedModel.

BYTES = vocabulary_lib.ByteVocabulary()
STRINGS = ["abc", "hello", "x", "mesh tf", "zz", "", "revers", "q"]


def _driver_estimator(model_dir, inputs_length):
  """The tiny byte-vocabulary estimator reading inputs of inputs_length.

  Decodes are as long as the inputs unless max_decode_length says
  otherwise: it is 8 here, so that only the padding of the inputs differs.
  """
  return dtu.estimator(
    model_dir,
    mesh=dtu.MESH_1,
    vocabulary=BYTES,
    save_checkpoints_steps=0,
    sequence_length={"inputs": inputs_length, "targets": 8},
    gin_extra="transformer.Unitransformer.max_length = 16\n"
    "Bitransformer.decode.max_decode_length = 8",
  )


@pytest.fixture(scope="module")
def trained_model_dir(tmp_path_factory):
  """A checkpoint after a few steps of learning to reverse STRINGS."""
  model_dir = tmp_path_factory.mktemp("model")
  est = _driver_estimator(model_dir, 8)
  ids = utils.encode_inputs(STRINGS, BYTES, "bitransformer", 8, 8)
  reversed_ids = utils.encode_inputs(
    [s[::-1] for s in STRINGS], BYTES, "bitransformer", 8, 8
  )
  est.train(
    lambda: (
      tf.data.Dataset.from_tensor_slices(
        {"inputs": ids, "targets": reversed_ids}
      )
      .repeat()
      .batch(8)
    ),
    10,
  )
  return model_dir


@pytest.mark.slow
def test_driver_decodes_ignore_the_inputs_sequence_length(trained_model_dir):
  decodes = {}
  for length in (8, 16):
    est = _driver_estimator(trained_model_dir, length)
    ids = utils.encode_inputs(STRINGS, BYTES, "bitransformer", 1, length)
    assert ids.shape == (len(STRINGS), length)
    dataset = tf.data.Dataset.from_tensor_slices({"inputs": ids})
    decodes[length] = utils.decode(est, lambda *_, ds=dataset: ds, BYTES)
    assert utils.decode_strings(est, STRINGS) == decodes[length]
  assert len(set(decodes[8])) > 1  # The decodes depend on the input.
  assert decodes[8] == decodes[16]


@pytest.mark.slow
def test_saved_model_decodes_ignore_the_inputs_sequence_length(
  trained_model_dir, tmp_path
):
  decodes = {}
  for length in (8, 16):
    est = _driver_estimator(trained_model_dir, length)
    path = utils.export_model(
      est,
      str(tmp_path / ("export_%d" % length)),
      BYTES,
      {"inputs": length, "targets": 8},
      "bitransformer",
      batch_size=len(STRINGS),
    )
    serve = tf.saved_model.load(path).signatures["serving_default"]
    out = serve(inputs=tf.constant(STRINGS))["outputs"].numpy()
    decodes[length] = [s.decode("utf-8") for s in out.tolist()]
  assert decodes[8] == utils.decode_strings(
    _driver_estimator(trained_model_dir, 8), STRINGS
  )
  assert len(set(decodes[8])) > 1  # The decodes depend on the input.
  assert decodes[8] == decodes[16]
