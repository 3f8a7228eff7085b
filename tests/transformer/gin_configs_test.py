"""The gin files in configs/ and the model-building helpers of utils.py.

Every file parses (after defaults.gin, as the driver does). Every model file
builds its graph shape-only — in a v1 tf.Graph, so variables are graph nodes
and nothing is allocated — with layouts/single, with a model-parallel layout,
and every layout with bi_base and tiny; each mtf tensor's layout is checked
against the mesh with the pure layout functions (no devices). Every problem
file parses with model files and binds its data and vocabulary without
touching data or the network.
"""

import inspect
import os
import re
import socket
import sys

import gin
import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
import mesh_tensorflow.transformer.utils as mtf_utils
from transformer import moe
from transformer import transformer
from transformer import transformer_layers
from transformer import utils

CONFIGS = os.path.join(
  os.path.dirname(__file__), os.pardir, os.pardir, "configs"
)
DEFAULTS = os.path.join(CONFIGS, "defaults.gin")
VOCAB, VOCAB_PADDED = 32100, 32128


def _gin_files(subdir=""):
  root = os.path.join(CONFIGS, subdir)
  found = []
  for dirpath, _, filenames in os.walk(root):
    for f in filenames:
      if f.endswith(".gin"):
        found.append(os.path.relpath(os.path.join(dirpath, f), CONFIGS))
  return sorted(found)


def _names(subdir):
  return [os.path.basename(f)[: -len(".gin")] for f in _gin_files(subdir)]


def _required_macro_bindings(path):
  """Bindings for the file's `NAME = %gin.REQUIRED` macros (placeholders)."""
  with open(os.path.join(CONFIGS, path)) as f:
    names = re.findall(
      r"^([A-Z][A-Z0-9_]*)\s*=\s*%gin\.REQUIRED\s*$",
      f.read(),
      flags=re.MULTILINE,
    )
  return ["%s = '/unset/%s'" % (name, name) for name in names]


MODELS = _names("models")
LAYOUTS = _names("layouts")

# Sizes the original's gin configs give each model: (num_layers, d_model,
# d_ff, heads, d_kv, model_type).
MODEL_SIZES = {
  "aiayn_base": (6, 512, 2048, 8, 64, "bitransformer"),
  "aiayn_large": (6, 1024, 4096, 16, 64, "bitransformer"),
  "bi_base": (6, 1024, 4096, 8, 128, "bitransformer"),
  "bi_l12": (12, 1024, 4096, 8, 128, "bitransformer"),
  "bi_l12_w1": (12, 1024, 8192, 16, 128, "bitransformer"),
  "bi_l12_w2": (12, 1024, 16384, 32, 128, "bitransformer"),
  "bi_l12_w3": (12, 1024, 32768, 64, 128, "bitransformer"),
  "bi_w1": (6, 1024, 8192, 16, 128, "bitransformer"),
  "bi_moe": (3, 1024, 4096, 8, 128, "bitransformer"),
  "lm_base": (6, 1024, 4096, 8, 128, "lm"),
  "lm_w1": (6, 1024, 8192, 16, 128, "lm"),
  "lm_moe": (3, 1024, 4096, 8, 128, "lm"),
  "tiny": (2, 128, 512, 4, 32, "bitransformer"),
}

# Layouts whose "model" dim does not divide the model's heads.
EXPECTED_SPLIT_ERRORS = {
  ("bi_base", "8x8_mp"): "heads",
  ("tiny", "2x2_mp"): "heads",
  ("tiny", "8x8_mp"): "heads",
  ("tiny", "8x16_m8"): "heads",
  ("tiny", "16x16_m8"): "heads",
}


@pytest.fixture(autouse=True)
def _clean_gin():
  gin.clear_config()
  yield
  gin.clear_config()


def _parse(*files, bindings=()):
  paths = [DEFAULTS] + [os.path.join(CONFIGS, f) for f in files]
  gin.parse_config_files_and_bindings(paths, list(bindings))


def _query(selector):
  """A bound gin value; `@f()` references are called, `@f` ones returned."""
  value = gin.query_parameter(selector)
  if isinstance(value, gin.config.ConfigurableReference):
    fn = value.scoped_configurable_fn
    value = fn() if value.evaluate else fn
  return value


def _check_layout(graph, mesh_shape, layout_rules):
  """Raises ValueError (naming the dim) if any tensor cannot be laid out."""
  for op in graph.operations:
    for tensor in op.outputs:
      layout_rules.tensor_layout(tensor.shape, mesh_shape)
      for dim in tensor.shape.dims:
        mtf.tensor_dim_to_size_per_split(layout_rules, mesh_shape, dim)


def _batch_size(mesh_shape, layout_rules):
  size = 1
  for dim in mesh_shape.dims:
    if ("batch", dim.name) in layout_rules.pairs:
      size *= dim.size
  return size if size > 1 else 2


def _build_from_gin(length=512, outer_batch=None):
  """Builds the gin-configured model shape-only.

  Returns:
    (model, logits, store, graph, mesh_shape, layout_rules).
  """
  model_type = _query("utils.run.model_type")
  mesh_shape = mtf.convert_to_shape(_query("utils.run.mesh_shape"))
  layout_rules = mtf.convert_to_layout_rules(_query("utils.run.layout_rules"))
  with tf.Graph().as_default():
    store = mtf.VariableStore()
    with mtf.variable_store(store):
      graph = mtf.Graph()
      mesh = mtf.Mesh(graph, "mesh")
      model = utils.build_model(
        model_type, VOCAB, VOCAB, layout_rules, mesh_shape
      )
      shape = mtf.Shape(
        ([mtf.Dimension("outer_batch", outer_batch)] if outer_batch else [])
        + [
          mtf.Dimension("batch", _batch_size(mesh_shape, layout_rules)),
          mtf.Dimension("length", length),
        ]
      )
      ids = mtf.zeros(mesh, shape, tf.int32)
      variable_dtype = utils.get_variable_dtype()
      if model_type == "lm":
        inputs = transformer.autoregressive_inputs(ids)
      else:
        inputs = ids
      logits, loss = model.call_simple(
        inputs, ids, compute_loss=True, variable_dtype=variable_dtype
      )
      assert loss.shape == mtf.Shape([])
  return model, logits, store, graph, mesh_shape, layout_rules


# ----------------------------------------------------------------------------
# Parsing.


def test_the_expected_files_exist():
  assert set(MODELS) == set(MODEL_SIZES)
  assert set(LAYOUTS) == {
    "single",
    "2x2_dp",
    "2x2_dp_mp",
    "2x2_mp",
    "4x4_dp",
    "8x8_dp",
    "8x8_mp",
    "8x8_m4",
    "8x16_m2",
    "8x16_m8",
    "16x16_m8",
  }
  assert set(_names("learning_rate_schedules")) == {
    "constant",
    "slanted_triangular",
  }
  assert set(PROBLEMS) == set(PROBLEM_BINDINGS)


@pytest.mark.parametrize("path", _gin_files())
def test_every_file_parses_after_defaults(path):
  if path == "defaults.gin":
    gin.parse_config_file(DEFAULTS)
  else:
    _parse(path, bindings=_required_macro_bindings(path))
  assert _query("utils.run.layout_rules") is not None


def test_defaults_values():
  _parse()
  assert _query("utils.run.model_type") == "bitransformer"
  assert _query("utils.run.mesh_shape") == mtf.Shape(
    [mtf.Dimension("batch", 8)]
  )
  assert _query("utils.run.layout_rules") == (
    "ensemble:ensemble,batch:batch,d_ff:model,heads:model,vocab:model,"
    "experts:batch"
  )
  assert _query("utils.run.sequence_length") == {"inputs": 512, "targets": 512}
  assert utils.get_variable_dtype().activation_dtype == tf.bfloat16
  assert utils.get_variable_dtype().master_dtype == tf.bfloat16
  assert (
    utils.serialize_num_microbatches(
      mtf.Dimension("batch", 64), 512, "batch:8", "batch:batch"
    )
    == 2
  )
  optimizer = gin.query_parameter("utils.run.optimizer")
  assert optimizer.configurable.name == "AdafactorOptimizer"
  schedule = _query("utils.run.learning_rate_schedule")
  # Noam: rsqrt(max(step, warmup)), then the linear tail of the last 10%.
  np.testing.assert_allclose(
    float(schedule(5000, 100000)), 10000**-0.5, rtol=1e-6
  )
  np.testing.assert_allclose(
    float(schedule(95000, 100000)), 95000**-0.5 * 0.5, rtol=1e-6
  )


def test_layouts_single_uses_float32_activations():
  _parse("layouts/single.gin")
  assert mtf.convert_to_shape(_query("utils.run.mesh_shape")) == mtf.Shape([])
  assert utils.get_variable_dtype().activation_dtype == tf.float32


def test_learning_rate_schedule_files():
  _parse("learning_rate_schedules/constant.gin")
  assert float(_query("utils.run.learning_rate_schedule")(7, 100)) == 0.01
  gin.clear_config()
  _parse("learning_rate_schedules/slanted_triangular.gin")
  schedule = _query("utils.run.learning_rate_schedule")
  np.testing.assert_allclose(float(schedule(100, 1000)), 0.01, rtol=1e-6)
  np.testing.assert_allclose(float(schedule(0, 1000)), 0.01 / 32, rtol=1e-6)


def test_unknown_layer_class_is_named(tmp_path):
  bad = tmp_path / "bad.gin"
  bad.write_text(
    "encoder/make_layer_stack.layers = [@transformer_layers.NoSuchLayer]\n"
  )
  with pytest.raises(ValueError, match="NoSuchLayer"):
    gin.parse_config_files_and_bindings([DEFAULTS, str(bad)], [])


def test_missing_required_parameter_is_named():
  gin.parse_config(
    "import mesh_tensorflow.transformer.utils\n"
    "utils.run.mesh_shape = @utils.tpu_mesh_shape()\n"
    "utils.tpu_mesh_shape.model_parallelism = 1\n"
  )
  with pytest.raises(RuntimeError, match="tpu_topology"):
    _query("utils.run.mesh_shape")
  gin.clear_config()
  with pytest.raises(RuntimeError, match="layout_rules"):
    utils.run(None, None, None, None, "/tmp/model_dir", mesh_shape="batch:8")


def test_full_original_selectors_resolve():
  gin.parse_config(
    "import mesh_tensorflow.transformer.utils\n"
    "mesh_tensorflow.transformer.transformer_layers.SelfAttention"
    ".num_heads = 5\n"
    "mesh_tensorflow.transformer.transformer.make_layer_stack.num_layers"
    " = 3\n"
    "mesh_tensorflow.transformer.utils.run.mesh_shape = "
    "@mesh_tensorflow.transformer.utils.tpu_mesh_shape()\n"
    "mesh_tensorflow.transformer.utils.tpu_mesh_shape.tpu_topology = "
    "'v3-8'\n"
    "mesh_tensorflow.transformer.utils.tpu_mesh_shape.model_parallelism"
    " = 2\n"
    "mesh_tensorflow.transformer.moe.MoE1D.num_experts = 7\n"
  )
  assert transformer_layers.SelfAttention().num_heads == 5
  # Subclasses inherit the binding through SelfAttention.__init__.
  assert transformer_layers.EncDecAttention().num_heads == 5
  assert moe.MoE1D()._hparams.moe_num_experts == 7
  stack = transformer.make_layer_stack([transformer_layers.DenseReluDense])
  assert stack.num_layers == 3
  assert _query("run.mesh_shape") == mtf.convert_to_shape("batch:4;model:2")
  assert mtf_utils is utils


# ----------------------------------------------------------------------------
# Problems: data and vocabulary bindings, resolved without data or network.

PROBLEMS = _names("problems")

# problem -> (model_type, vocabulary function, dataset function, dataset_name,
# text2self, vocabulary file under T2T_DATA_DIR or None).
PROBLEM_BINDINGS = {
  "lm1b": (
    "lm",
    "get_tfds_vocabulary",
    "pretokenized_tfds_dataset",
    "lm1b/subwords32k",
    True,
    None,
  ),
  "lm1b_untok": (
    "lm",
    "get_t2t_vocabulary",
    "untokenized_tfds_dataset",
    "lm1b",
    True,
    "vocab.lm1b.en.32768",
  ),
  "t2t_ende": (
    "bitransformer",
    "get_t2t_vocabulary",
    "pretokenized_t2t_dataset",
    "translate_ende_wmt32k",
    False,
    "vocab.translate_ende_wmt32k.32768.subwords",
  ),
  "t2t_enfr": (
    "bitransformer",
    "get_t2t_vocabulary",
    "pretokenized_t2t_dataset",
    "translate_enfr_wmt32k",
    False,
    "vocab.translate_enfr_wmt32k.32768.subwords",
  ),
  "t2t_lm1b": (
    "lm",
    "get_t2t_vocabulary",
    "pretokenized_t2t_dataset",
    "languagemodel_lm1b32k",
    True,
    "vocab.lm1b.en.32768",
  ),
  "mtf_stdlib_docs_lm": (
    "lm",
    "get_subword_vocabulary",
    "untokenized_tfds_dataset",
    "mtf_stdlib_docs",
    True,
    None,
  ),
}


@pytest.fixture
def no_network(monkeypatch):
  """Fails the test on any socket connection or name lookup."""

  def refuse(*args, **kwargs):
    del kwargs
    raise AssertionError("network access while parsing gin: %r" % (args,))

  monkeypatch.setattr(socket.socket, "connect", refuse)
  monkeypatch.setattr(socket, "create_connection", refuse)
  monkeypatch.setattr(socket, "getaddrinfo", refuse)


def _t2t_modules():
  return sorted(m for m in sys.modules if m.split(".")[0] == "tensor2tensor")


@pytest.mark.parametrize("model", ["tiny", "lm_base", "bi_base"])
@pytest.mark.parametrize("problem", PROBLEMS)
def test_problem_parses_with_model_file(problem, model, no_network):
  model_type, vocab_fn, dataset_fn, dataset_name, text2self, vocab_file = (
    PROBLEM_BINDINGS[problem]
  )
  t2t_before = _t2t_modules()
  path = "problems/%s.gin" % problem
  _parse(
    "models/%s.gin" % model,
    path,
    bindings=["T2T_DATA_DIR = '/nonexistent/t2t'"] if vocab_file else [],
  )
  assert _query("utils.run.model_type") == model_type
  vocab_ref = gin.query_parameter("utils.run.vocabulary")
  assert vocab_ref.evaluate  # @fn(): called when utils.run is called
  assert vocab_ref.configurable.name == vocab_fn
  for key in ("train_dataset_fn", "eval_dataset_fn"):
    ref = gin.query_parameter("utils.run.%s" % key)
    assert ref.configurable.name == dataset_fn and not ref.evaluate
  assert gin.query_parameter("%s.dataset_name" % dataset_fn) == dataset_name
  assert gin.query_parameter("%s.text2self" % dataset_fn) is text2self
  length = _query("utils.run.sequence_length")
  assert set(length) == {"inputs", "targets"}
  if vocab_file:
    # Making the vocabulary reads nothing and imports no tensor2tensor.
    vocab = _query("utils.run.vocabulary")
    assert vocab.filepath == os.path.join("/nonexistent/t2t", vocab_file)
    if dataset_fn == "pretokenized_t2t_dataset":
      assert _query("%s.data_dir" % dataset_fn) == "/nonexistent/t2t"
  assert _t2t_modules() == t2t_before
  # The model still builds (shape-only) with the problem's bindings.
  _, logits, _, _, _, _ = _build_from_gin(length=16)
  assert logits.shape.dims[-1].name == "vocab"


@pytest.mark.parametrize(
  "problem", [p for p in PROBLEMS if PROBLEM_BINDINGS[p][-1] is not None]
)
def test_problem_without_t2t_data_dir_is_named(problem):
  with pytest.raises(ValueError, match="T2T_DATA_DIR"):
    _parse("models/tiny.gin", "problems/%s.gin" % problem)


def test_problem_files_are_found_in_the_config_dir(no_network):
  """As `transformer.main --gin_file=problems/lm1b.gin` finds them."""
  utils.parse_gin_defaults_and_flags(
    gin_files=["models/lm_base.gin", "problems/lm1b.gin"], gin_params=[]
  )
  assert _query("utils.run.model_type") == "lm"
  gin.clear_config()
  utils.parse_gin_defaults_and_flags(
    gin_files=["models/bi_base", "problems/t2t_ende"],
    gin_params=["T2T_DATA_DIR = '/nonexistent/t2t'"],
  )
  assert _query("utils.run.vocabulary").filepath == (
    "/nonexistent/t2t/vocab.translate_ende_wmt32k.32768.subwords"
  )


def test_problem_tfds_names_are_known_offline():
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top

  from transformer._src.data import offline as datasets  # pylint: disable=g-import-not-at-top

  assert "mtf_stdlib_docs" in datasets.OFFLINE_DATASETS
  # TFDS >= 4 keeps lm1b (plain text) in code; "lm1b/subwords32k" is read
  # from data an older TFDS prepared.
  assert tfds.builder_cls("lm1b").name == "lm1b"


# ----------------------------------------------------------------------------
# Models x layouts, shape-only.


def _combinations():
  combos = {(m, "single") for m in MODELS}
  combos |= {(m, "2x2_dp_mp") for m in MODELS}
  combos |= {(m, l) for m in ("bi_base", "tiny") for l in LAYOUTS}
  return sorted(combos)


def _check_variables(name, store):
  num_layers, d_model, d_ff, heads, d_kv, model_type = MODEL_SIZES[name]
  shapes = {k: v.shape.as_list() for k, v in store.masters.items()}
  assert {v.dtype for v in store.masters.values()} == {tf.bfloat16}
  tower = "encoder" if model_type == "bitransformer" else "transformer"
  embedding = (
    "shared/embedding"
    if model_type == "bitransformer"
    else "transformer/embedding"
  )
  assert shapes[embedding] == [VOCAB_PADDED, d_model]
  # Shared embedding and softmax: no separate logits kernel.
  assert not any(k.endswith("logits/kernel") for k in shapes)
  last = "%s/block_%03d/layer_000/SelfAttention/q" % (tower, num_layers - 1)
  assert shapes[last] == [d_model, heads * d_kv]
  assert (
    "%s/block_%03d/layer_000/SelfAttention/q" % (tower, num_layers)
    not in shapes
  )
  if name.endswith("_moe"):
    moe_vars = [k for k in shapes if "/MoE1D/" in k]
    assert moe_vars and all(
      shapes[k][0] == 32 for k in moe_vars if k.endswith("wi/kernel")
    )
  else:
    dense = [k for k in shapes if k.endswith("DenseReluDense/wi/kernel")]
    assert dense and all(shapes[k] == [d_model, d_ff] for k in dense)


@pytest.mark.parametrize("model,layout", _combinations())
def test_model_builds_and_lays_out(model, layout):
  _parse("models/%s.gin" % model, "layouts/%s.gin" % layout)
  built, logits, store, graph, mesh_shape, rules = _build_from_gin()
  batch = _batch_size(mesh_shape, rules)
  assert logits.shape == mtf.Shape(
    [
      mtf.Dimension("batch", batch),
      mtf.Dimension("length", 512),
      mtf.Dimension("vocab", VOCAB_PADDED),
    ]
  )
  assert type(built).__name__ == (
    "Bitransformer"
    if MODEL_SIZES[model][-1] == "bitransformer"
    else "Unitransformer"
  )
  _check_variables(model, store)
  expected_error = EXPECTED_SPLIT_ERRORS.get((model, layout))
  if expected_error:
    with pytest.raises(ValueError, match="'%s'" % expected_error):
      _check_layout(graph, mesh_shape, rules)
  else:
    _check_layout(graph, mesh_shape, rules)


def test_indivisible_d_model_is_named():
  _parse(
    "models/tiny.gin",
    bindings=[
      "d_model = 100",
      "utils.run.mesh_shape = 'batch:2;model:8'",
      "utils.run.layout_rules = 'batch:batch,d_model:model'",
    ],
  )
  _, _, _, graph, mesh_shape, rules = _build_from_gin(length=16)
  with pytest.raises(ValueError, match=r"'d_model' \(size 100\).*'model'"):
    _check_layout(graph, mesh_shape, rules)


def test_two_tensor_dims_on_one_mesh_dim_are_named():
  _parse(
    "models/tiny.gin",
    bindings=[
      "utils.run.mesh_shape = 'model:2'",
      "utils.run.layout_rules = 'd_model:model,d_ff:model'",
    ],
  )
  _, _, _, graph, mesh_shape, rules = _build_from_gin(length=16)
  with pytest.raises(
    ValueError, match="'d_model' and 'd_ff'|'d_ff' and 'd_model'"
  ):
    _check_layout(graph, mesh_shape, rules)


def test_transparent_attention_builds():
  _parse(
    "models/tiny.gin",
    "layouts/single.gin",
    "transparent_attention.gin",
    bindings=["num_layers = 6"],
  )
  _, logits, store, _, _, _ = _build_from_gin(length=16)
  assert logits.shape.dims[-1].size == VOCAB_PADDED
  assert store.masters[
    "decoder/block_000/layer_001/TransparentEncDecAttention/w"
  ].shape.as_list() == [7, 6]


def test_8x8_dp_r4_layout():
  _parse("models/bi_moe.gin", "8x8_dp_r4.gin")
  mesh_shape = mtf.convert_to_shape(_query("utils.run.mesh_shape"))
  rules = mtf.convert_to_layout_rules(_query("utils.run.layout_rules"))
  assert mesh_shape == mtf.convert_to_shape("outer:4;inner:32")
  assert (
    utils.compute_batch_size(
      512, mesh_shape, rules, ("sequences_per_replica", 2)
    )
    == 256
  )
  layout = rules.tensor_layout(
    "outer_batch:4;experts:32;expert_hidden:64", mesh_shape
  )
  assert layout.tensor_axis_to_mesh_axis == (0, 1, None)
  # The driver feeds [outer_batch, batch, length] with this layout.
  _, logits, _, graph, _, _ = _build_from_gin(length=64, outer_batch=4)
  assert logits.shape.dims[:2] == [
    mtf.Dimension("outer_batch", 4),
    mtf.Dimension("batch", 32),
  ]
  _check_layout(graph, mesh_shape, rules)


# ----------------------------------------------------------------------------
# utils functions.


@pytest.mark.parametrize(
  "args,expected",
  [
    (("2x2", 1), "batch:8"),
    (("4x4", 8), "batch:4;model:8"),
    (("v3-8", 8), "model:8"),
    (("v2-32", 1), "batch:32"),
    (("1x1", 2), "model:2"),
    (("8x8_twisted", 4), "batch:32;model:4"),
    (("v3-32", 4, 2), "ensemble:2;batch:4;model:4"),
    (("2x2", 4, 2), "ensemble:2;model:4"),
    (("4x4", [("batch", None), ("model", [2, 1, 2])]), "batch:8;model:4"),
  ],
)
def test_tpu_mesh_shape(args, expected):
  assert utils.tpu_mesh_shape(*args) == mtf.convert_to_shape(expected)


@pytest.mark.parametrize(
  "args,pattern",
  [
    (("2x2", 3), "model_parallelism 3"),
    (("2x2", 0), "model_parallelism"),
    (("2x", 1), "tpu_topology '2x'"),
    (("v3-32", 4, 3), "ensemble_parallelism 3"),
  ],
)
def test_tpu_mesh_shape_errors(args, pattern):
  with pytest.raises(ValueError, match=pattern):
    utils.tpu_mesh_shape(*args)


@pytest.mark.parametrize(
  "method,value,expected",
  [
    ("sequences_per_batch", 64, 64),
    ("tokens_per_batch", 65536, 128),
    ("sequences_per_replica", 16, 64),
    ("tokens_per_replica", 2048, 16),
  ],
)
def test_compute_batch_size(method, value, expected):
  length = {"inputs": 256, "targets": 512}
  assert (
    utils.compute_batch_size(
      length, "batch:4;model:2", "batch:batch,d_ff:model", (method, value)
    )
    == expected
  )
  # An int sequence length is the same as a dict with that maximum.
  assert (
    utils.compute_batch_size(
      512,
      mtf.convert_to_shape("batch:4;model:2"),
      "batch:batch",
      (method, value),
    )
    == expected
  )


def test_compute_batch_size_replicas_and_errors():
  # outer_batch and batch both make replicas; model does not.
  assert (
    utils.compute_batch_size(
      128,
      "outer:2;inner:4;model:2",
      "outer_batch:outer,batch:inner",
      ("sequences_per_replica", 3),
    )
    == 24
  )
  assert (
    utils.compute_batch_size(128, "", "", ("tokens_per_replica", 1024)) == 8
  )
  with pytest.raises(ValueError, match="'sequences_per_step'"):
    utils.compute_batch_size(128, "", "", ("sequences_per_step", 1))
  with pytest.raises(ValueError, match="batch size 0"):
    utils.compute_batch_size(512, "", "", ("tokens_per_batch", 100))


@pytest.mark.parametrize(
  "batch,tokens,expected",
  [
    (64, None, 1),
    (64, 2048, 2),
    (64, 3 * 512, 4),
    (64, 100, 8),
    (64, 10**6, 1),
    (24, 5 * 512, 1),
  ],
)
def test_serialize_num_microbatches(batch, tokens, expected):
  assert (
    utils.serialize_num_microbatches(
      mtf.Dimension("batch", batch),
      {"targets": 512},
      "batch:8;model:2",
      "batch:batch",
      tokens_per_microbatch_per_replica=tokens,
    )
    == expected
  )


def test_auto_train_steps():
  assert utils.auto_train_steps(128, 512) == 2**36 // (128 * 512)
  assert (
    utils.auto_train_steps(8, {"inputs": 4, "targets": 16}, train_tokens=1000)
    == 1000 // 128
  )


def test_get_variable_dtype():
  d = utils.get_variable_dtype()
  assert (d.master_dtype, d.slice_dtype, d.activation_dtype) == (
    tf.bfloat16,
    tf.float32,
    tf.float32,
  )
  d = utils.get_variable_dtype("float32", "bfloat16", tf.bfloat16)
  assert (d.master_dtype, d.slice_dtype, d.activation_dtype) == (
    tf.float32,
    tf.bfloat16,
    tf.bfloat16,
  )
  with pytest.raises(ValueError, match="activation_dtype"):
    utils.get_variable_dtype(activation_dtype="float99")


def _tiny_bindings():
  return [
    "d_model = 8",
    "d_ff = 12",
    "num_heads = 2",
    "d_kv = 4",
    "num_layers = 1",
    "transformer.Unitransformer.max_length = 8",
    "transformer.Unitransformer.vocab_divisor = 8",
  ]


@pytest.mark.parametrize(
  "model_type,cls,autoregressive",
  [
    ("bitransformer", "Bitransformer", None),
    ("bi_student_teacher", "StudentTeacher", None),
    ("lm", "Unitransformer", True),
    ("delimited_lm", "Unitransformer", True),
    ("aligned", "Unitransformer", False),
  ],
)
def test_build_model_types(model_type, cls, autoregressive):
  _parse(
    "layouts/single.gin",
    bindings=_tiny_bindings()
    + [
      "transformer.StudentTeacher.temperature = 2.0",
      "transformer.StudentTeacher.fraction_soft = 0.5",
    ],
  )
  with tf.Graph().as_default(), mtf.variable_store(mtf.VariableStore()):
    mesh = mtf.Mesh(mtf.Graph(), "mesh")
    model = utils.build_model(model_type, 30, 30, "batch:batch", "batch:1")
    assert type(model).__name__ == cls
    if autoregressive is not None:
      assert model.autoregressive is autoregressive
      assert model.name == "transformer"
      assert model.layout == "batch:batch" and model.mesh_shape == "batch:1"
    elif cls == "Bitransformer":
      assert (model.encoder.name, model.decoder.name) == ("encoder", "decoder")
      assert not model.encoder.autoregressive and model.decoder.autoregressive
      assert model.encoder.output_vocab_dim is None
    ids = mtf.zeros(mesh, "batch:2;length:8", tf.int32)
    logits, loss = model.call_simple(ids, ids, compute_loss=True)
    assert logits.shape == mtf.convert_to_shape("batch:2;length:8;vocab:32")
    assert loss.shape == mtf.Shape([])
    names = {v.name for v in mesh.graph.all_variables}
  prefix = {
    "bi_student_teacher": "student/encoder/",
    "bitransformer": "encoder/",
  }.get(model_type, "transformer/")
  assert any(
    n.startswith(prefix + "block_000/layer_000/SelfAttention/") for n in names
  ), sorted(names)


def test_build_model_errors():
  with pytest.raises(ValueError, match="'gpt'"):
    utils.build_model("gpt", 10, 10)
  with pytest.raises(ValueError, match="output_vocab_size"):
    utils.build_model("lm", 10)


def test_clean_decodes():
  ids = np.array([[5, 1, 7, 1, 8], [1, 2, 3, 0, 0], [4, 4, 4, 4, 4]])
  np.testing.assert_array_equal(
    utils.clean_decodes(ids).numpy(),
    [[5, 1, 0, 0, 0], [1, 0, 0, 0, 0], [4, 4, 4, 4, 4]],
  )
  np.testing.assert_array_equal(
    utils.clean_decodes(ids.T, length_axis=0).numpy(),
    np.array([[5, 1, 0, 0, 0], [1, 0, 0, 0, 0], [4, 4, 4, 4, 4]]).T,
  )
  np.testing.assert_array_equal(
    utils.clean_decodes(
      tf.constant([[3, 4, 9, 4]]), eos_id=4, pad_id=-1
    ).numpy(),
    [[3, 4, -1, -1]],
  )


def test_vocabulary_helpers():
  assert utils.inputs_vocabulary("v") == "v"
  assert utils.targets_vocabulary("v") == "v"
  assert utils.inputs_vocabulary(("a", "b")) == "a"
  assert utils.targets_vocabulary(("a", "b")) == "b"
  gin.parse_config(
    "import mesh_tensorflow.transformer.utils\n"
    "utils.separate_vocabularies.inputs = 'in'\n"
    "utils.separate_vocabularies.targets = 'out'\n"
  )
  assert utils.separate_vocabularies() == ("in", "out")


def test_checkpoint_helpers():
  assert (
    utils.get_step_from_checkpoint_path("gs://bucket/run/model.ckpt-1200.index")
    == 1200
  )
  assert utils.get_step_from_checkpoint_path("/tmp/model.ckpt-7") == 7
  with pytest.raises(ValueError, match="checkpoint-12"):
    utils.get_step_from_checkpoint_path("/tmp/checkpoint-12")
  small = mtf.Shape([mtf.Dimension("a", 10), mtf.Dimension("b", 10)])
  big = mtf.Shape([mtf.Dimension("a", 10**4), mtf.Dimension("b", 10**4)])

  class _Var:
    def __init__(self, shape):
      self.shape = shape

  assert utils.variable_filter_max_size(_Var(small))
  assert not utils.variable_filter_max_size(_Var(big))
  assert not utils.variable_filter_max_size(_Var(small), max_size=99)
  assert utils.variable_filter_max_size(tf.zeros([3, 3]), max_size=9)
  assert utils.should_load_variable("encoder/x")
  assert not utils.should_load_variable(
    "encoder/x", filter_fn=lambda n: n.startswith("decoder/")
  )
  assert utils.init_checkpoint_variable_mapping("a/b") == "a/b"
  assert (
    utils.init_checkpoint_variable_mapping(
      "a/b", mapping_fn=lambda n: re.sub("^a/", "c/", n)
    )
    == "c/b"
  )


RUN_PARAMS = [
  "tpu_job_name",
  "tpu",
  "gcp_project",
  "tpu_zone",
  "model_dir",
  "model_type",
  "vocabulary",
  "train_dataset_fn",
  "eval_dataset_fn",
  "dataset_split",
  "autostack",
  "eval_checkpoint_step",
  "export_checkpoint_step",
  "export_path",
  "mode",
  "iterations_per_loop",
  "save_checkpoints_steps",
  "keep_checkpoint_max",
  "eval_summary_dir",
  "batch_size",
  "train_steps",
  "total_run_steps",
  "sequence_length",
  "mesh_shape",
  "mesh_devices",
  "layout_rules",
  "learning_rate_schedule",
  "optimizer",
  "predict_fn",
  "variable_filter",
  "perplexity_eval_steps",
  "init_checkpoint",
  "ensemble_inputs",
  "train_model_fn",
  "skip_seen_data",
  "seen_data_init_step",
  "output_eval_examples",
  "checkpoint_input_pipeline",
  "eval_dir_suffix",
]


def test_run_signature_and_stub():
  params = inspect.signature(utils.run).parameters
  assert list(params)[:6] == [
    "tpu_job_name",
    "tpu",
    "gcp_project",
    "tpu_zone",
    "model_dir",
    "model_type",
  ]
  assert params["batch_size"].default == ("tokens_per_replica", 2048)
  assert params["train_steps"].default is utils.auto_train_steps
  assert params["train_model_fn"].default is utils.train_model
  assert params["mesh_shape"].default is gin.REQUIRED
  assert params["layout_rules"].default is gin.REQUIRED
  assert params["checkpoint_input_pipeline"].default is False
  # The original's parameters in its order; additions are keyword-only.
  assert list(params)[: len(RUN_PARAMS)] == RUN_PARAMS
  added = list(params.values())[len(RUN_PARAMS) :]
  assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in added)
  assert {"mesh_impl", "cluster", "cluster_timeout", "stall_timeout"} <= {
    p.name for p in added
  }
  _parse("models/tiny.gin", "layouts/single.gin")
  # The driver runs now; without a vocabulary it stops with a clear error.
  with pytest.raises(ValueError, match="run.vocabulary is required"):
    utils.run(None, None, None, None, "/tmp/model_dir")
