# `make demo` trains a small model on a virtual-CPU mesh; `make test` runs the
# test suite; `make lint` checks style with ruff (ruff.toml). All create .venv
# and install the package on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat setup.py | cksum | cut -d' ' -f1)
PYTEST_WORKERS ?= 2
# The legacy TF1 pass (tf.compat.v1.disable_v2_behavior() before any test).
# t5_model_test is left out for time: it traces whole T5 models and their
# gradients once per layout, which costs about as much in both modes, and the
# TF2 pass runs it. decode_padding_test is left out as its sampled-decode test
# needs eager random draws (a v1 graph seeds unseeded ops by op count).
# Also left out for time though they pass: tests/plan (the planner counts
# the ops of graphs it builds, whatever the mode), the BERT and U-Net
# programs against the original's numbers (bert_original_test and
# unet_original_test, about 6 min of test time together on a loaded machine),
# and the other transformer driver, gin configuration and data tests (they
# build whole models; driver_model_fn_test, the v1 Session flow, is in;
# driver_tpu_test passes in v1 but takes over 15 min there on a loaded
# machine). The BERT scripts' run tests call their mains as a script that
# called disable_v2_behavior() does. Legacy-mode programs of the transformer
# driver run in subprocesses in the TF2 pass (driver_fidelity_test,
# legacy_gin_run_test).
V1_TESTS := tests/ops tests/layers tests/optimizers tests/beam_search_test.py \
	tests/variables_test.py tests/fidelity_test.py tests/mesh_impls \
	tests/lowering_test.py tests/graph_test.py tests/layout_test.py \
	tests/stacking_test.py tests/shapes_test.py tests/tpu_variables_test.py \
	tests/graph_constants_test.py tests/tf_einsum_test.py tests/utils_test.py \
	tests/auto_mtf tests/experimental/input_reader_test.py \
	tests/bert/model_test.py tests/bert/optimization_test.py \
	tests/bert/squad_test.py tests/bert/classifier_test.py \
	tests/bert/run_test.py tests/bert/run_squad_test.py \
	tests/transformer/checkpoints_test.py tests/transformer/vocabulary_test.py \
	tests/transformer/driver_model_fn_test.py \
	tests/transformer/layer_stack_test.py tests/transformer/unitransformer_test.py \
	tests/transformer/bitransformer_test.py tests/transformer/attention_layers_test.py \
	tests/transformer/dense_layers_test.py tests/transformer/moe_test.py \
	tests/transformer/moe_gating_original_test.py tests/transformer/heterogeneous_moe_test.py \
	tests/transformer/adaptive_softmax_test.py tests/transformer/attention_core_test.py \
	tests/transformer/attention_variants_test.py tests/transformer/embeddings_test.py \
	tests/transformer/evolved_transformer_test.py \
	tests/transformer/experts_attention_test.py tests/transformer/fixup_layers_test.py \
	tests/transformer/funnel_transformer_test.py tests/transformer/memory_layers_test.py \
	tests/transformer/transformer_conv_layers_test.py \
	tests/transformer/universal_transformer_test.py \
	tests/transformer/vocab_embeddings_test.py \
	tests/transformer/learning_rate_schedules_test.py \
	tests/transformer/original_numbers_test.py tests/downstream \
	tests/transformer/original_checkpoint_test.py

.PHONY: demo test test-fast lint bench clean

$(STAMP): setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[cpu,test]"
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/transformer_demo.py

test: $(STAMP)
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --durations=15 tests
	MTF_TEST_MESH_IMPL=simd $(PY) -m pytest -q -n $(PYTEST_WORKERS) tests/ops tests/conformance tests/layers
	MTF_TEST_TF_MODE=v1 $(PY) -m pytest -q -n $(PYTEST_WORKERS) $(V1_TESTS)

test-fast: $(STAMP)
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) -m "not slow" tests

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

bench: $(STAMP)
	$(PY) benchmarks/mlp_step.py

clean:
	rm -rf $(VENV) build *.egg-info
