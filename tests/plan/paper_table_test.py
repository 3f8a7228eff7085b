"""benchmarks/paper_table.py: the paper's grid planned from configs/paper."""

import importlib.util
import math
import os
import sys

import pytest

_SCRIPT = os.path.join(
  os.path.dirname(__file__),
  os.pardir,
  os.pardir,
  "benchmarks",
  "paper_table.py",
)


@pytest.fixture(scope="module")
def paper_table():
  spec = importlib.util.spec_from_file_location("paper_table", _SCRIPT)
  module = importlib.util.module_from_spec(spec)
  # Its dataclasses look their module up in sys.modules.
  sys.modules[spec.name] = module
  spec.loader.exec_module(module)
  yield module
  del sys.modules[spec.name]


def test_every_row_has_a_gin_file(paper_table):
  configs = os.path.join(os.path.dirname(_SCRIPT), os.pardir, "configs")
  names = [m.name for m in paper_table.PAPER_MODELS]
  files = sorted(os.listdir(os.path.join(configs, "paper")))
  assert sorted(n + ".gin" for n in names) == files


def test_smallest_language_model_row(paper_table):
  model = paper_table.PAPER_MODELS[0]
  row = paper_table.plan_row(model, "tpu_v2")
  assert (row.d_ff, row.num_heads) == (4096, 4)
  assert round(row.num_parameters / 1e9, 2) == model.reported_billions
  plan = row.plan
  assert (plan.mesh_shape, plan.num_devices) == ("batch:32", 32)
  # Data parallel: every core holds every parameter as a float32 slice.
  assert plan.param_bytes == 4 * row.num_parameters
  assert plan.fits("tpu_v2")
  assert 0 < paper_table.utilisation(plan) < 1
  table = paper_table.markdown_table([row]).splitlines()
  assert len(table) == 3
  cells = [c.strip() for c in table[2].strip("|").split("|")]
  assert cells[:7] == [
    "[lm_m1](configs/paper/lm_m1.gin)",
    "0.14",
    "0.14",
    "4096",
    "4",
    "`batch:32`",
    "32",
  ]
  word_perplexity = math.exp(3.209 * paper_table.TOKENS_PER_WORD)
  assert cells[-1] == "3.209 (%.1f)" % word_perplexity
