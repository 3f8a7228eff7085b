"""The Mesh-TensorFlow paper's Transformer grid, planned on TPU v2.

Shazeer et al. 2018 ("Mesh-TensorFlow: Deep Learning for Supercomputers")
trained Transformer language models on LM1B from 0.14B parameters on 32 TPU
v2 cores to 4.9B on 512 (and translation models on WMT14 En-Fr), all with
the layout "batch:batch;vocab:model;d_ff:model;heads:model". Each row is a
gin file of configs/paper (sizes, mesh, batch and sequence length of
tensor2tensor's mtf_transformer_paper_lm / _tr hparams sets, which the
paper's models were trained with). For each, mesh_tensorflow.plan plans one
training step (forward, backward, Adafactor update) shape-only, so the 4.9B
row takes seconds on a laptop, and the table gives per core:

  params    trainable variable slices (float32 slices of bfloat16 masters)
  slots     Adafactor's slot variables
  act       estimated peak of live activations
  total     their sum, against TPU v2's 8 GiB per core
  TFLOPs    floating point operations of one step on one core
  comm      bytes one core sends in collectives per step
  step      estimated step time on the tpu_v2 profile (no overlap of
            compute and communication)
  util      matmul FLOPs / (step time * bfloat16 peak): the estimated MXU
            utilisation

and what the paper's authors report for the row: parameters (billions) and
LM1B log-perplexity per subword token after 10 epochs, with the word-level
perplexity it implies (x1.1078 tokens per word), as the hparams set's
docstring gives them. The translation rows have no per-row figures there.

Usage: python benchmarks/paper_table.py [--rows lm,tr] [--hardware tpu_v2]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import time
from typing import List, Optional, Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import gin  # pylint: disable=g-import-not-at-top

from mesh_tensorflow import plan as plan_lib  # pylint: disable=g-import-not-at-top

# The lm1b and WMT14 En-Fr subword vocabularies (~32k), padded to a multiple
# of 128 as the models pad them.
VOCAB_SIZE = 32768
# Subword tokens per word on LM1B (the hparams docstring's factor).
TOKENS_PER_WORD = 1.1078
LAYOUT = "batch:batch;vocab:model;d_ff:model;heads:model"


@dataclasses.dataclass(frozen=True)
class PaperModel:
  """One row of the paper's grid and the figures reported for it.

  Attributes:
    name: the gin file's name under configs/paper, e.g. "lm_5".
    reported_billions: parameters (billions) as reported, or None.
    reported_log_ppl: LM1B log-perplexity per subword token, or None.
  """

  name: str
  reported_billions: Optional[float] = None
  reported_log_ppl: Optional[float] = None


PAPER_MODELS = (
  PaperModel("lm_m1", 0.14, 3.209),
  PaperModel("lm_0", 0.22, 3.119),
  PaperModel("lm_1", 0.37, 3.037),
  PaperModel("lm_2", 0.67, 2.969),
  PaperModel("lm_3", 1.28, 2.912),
  PaperModel("lm_4", 2.48, 2.874),
  PaperModel("lm_5", 4.90, 2.871),
  PaperModel("tr_m1"),
  PaperModel("tr_0"),
  PaperModel("tr_1"),
  PaperModel("tr_2"),
  PaperModel("tr_3"),
  PaperModel("tr_4"),
)


@dataclasses.dataclass(frozen=True)
class PaperRow:
  """A planned row: the model's sizes and its plan."""

  model: PaperModel
  d_ff: int
  num_heads: int
  num_parameters: int
  plan: plan_lib.Plan
  seconds: float  # how long planning took on this machine


def plan_row(model: PaperModel, hardware: str = "tpu_v2") -> PaperRow:
  """Plans one row of the grid from its gin file.

  Args:
    model: the row.
    hardware: the hardware profile of the step-time estimate.

  Returns:
    A PaperRow.
  """
  start = time.perf_counter()
  step = plan_lib.build_gin_step(
    ["paper/%s.gin" % model.name], vocab_size=VOCAB_SIZE
  )
  plan = step.plan(hardware)
  return PaperRow(
    model=model,
    # The row's gin config stays parsed after build_gin_step.
    d_ff=gin.query_parameter("d_ff/macro.value"),
    num_heads=gin.query_parameter("num_heads/macro.value"),
    num_parameters=sum(v.shape.size for v in step.graph.trainable_variables),
    plan=plan,
    seconds=time.perf_counter() - start,
  )


def _gib(num_bytes: float) -> str:
  return "%.2f" % (num_bytes / 2**30)


def utilisation(plan: plan_lib.Plan) -> float:
  """Matmul FLOPs over (estimated step time x the hardware's matmul peak).

  Args:
    plan: a Plan made with a hardware profile.

  Returns:
    A fraction between 0 and 1.
  """
  peak = plan.hardware.peak_flops(plan.dtype)
  return plan.matmul_flops / (plan.estimated_step_time.total * peak)


def markdown_table(rows: Sequence[PaperRow]) -> str:
  """The planned rows as a Markdown table (rows link to their gin files).

  Args:
    rows: planned rows.

  Returns:
    The table, one line per row under a header.
  """
  header = (
    "| row | params (B) | reported | d_ff | heads | mesh | cores "
    "| params / core (GiB) | slots (MiB) | act (GiB) | total (GiB) "
    "| TFLOPs / core "
    "| comm / core (MiB) | step (s) | util | reported log-ppl (word ppl) |"
  )
  lines = [header, "|" + "---|" * (header.count("|") - 1)]
  for row in rows:
    p = row.plan
    fits = "fits" if p.fits(p.hardware) else "**over**"
    if row.model.reported_log_ppl is None:
      quality = ""
    else:
      quality = "%.3f (%.1f)" % (
        row.model.reported_log_ppl,
        math.exp(row.model.reported_log_ppl * TOKENS_PER_WORD),
      )
    reported = row.model.reported_billions
    lines.append(
      "| [%s](configs/paper/%s.gin) | %.2f | %s | %d | %d | `%s` | %d "
      "| %s | %s | %s | %s %s "
      "| %.1f | %.0f | %.3f | %.0f%% | %s |"
      % (
        row.model.name,
        row.model.name,
        row.num_parameters / 1e9,
        "" if reported is None else "%.2f" % reported,
        row.d_ff,
        row.num_heads,
        p.mesh_shape,
        p.num_devices,
        _gib(p.param_bytes),
        "%.1f" % (p.slot_bytes / 2**20),
        _gib(p.activation_bytes),
        _gib(p.memory_bytes),
        fits,
        p.flops / 1e12,
        p.communication_bytes / 2**20,
        p.estimated_step_time.total,
        100 * utilisation(p),
        quality,
      )
    )
  return "\n".join(lines)


def plan_rows(
  names: Sequence[str] = ("lm", "tr"), hardware: str = "tpu_v2"
) -> List[PaperRow]:
  """Plans the rows whose names start with one of `names`.

  Args:
    names: row name prefixes ("lm", "tr") or full names ("lm_5").
    hardware: the hardware profile of the step-time estimate.

  Returns:
    The planned rows, in the grid's order.
  """
  return [
    plan_row(m, hardware)
    for m in PAPER_MODELS
    if any(m.name == n or m.name.startswith(n + "_") for n in names)
  ]


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument(
    "--rows", default="lm,tr", help="row names or prefixes (lm, tr, lm_5)"
  )
  parser.add_argument("--hardware", default="tpu_v2")
  args = parser.parse_args(argv)
  start = time.perf_counter()
  rows = plan_rows(args.rows.split(","), args.hardware)
  print("layout %s, hardware %s" % (LAYOUT, args.hardware))
  print(markdown_table(rows))
  print(
    "planned %d rows in %.0f s (slowest %.1f s)"
    % (
      len(rows),
      time.perf_counter() - start,
      max(r.seconds for r in rows),
    )
  )


if __name__ == "__main__":
  main()
