"""The BERT scripts' flags: defined at import, shared, each script's defaults.

The original's run_* scripts (and transformer.main) define flags of the same
names, so importing two of them in one process failed; here the first
definition is shared and each script's main() restores its own defaults.
"""

import inspect
import subprocess
import sys
import textwrap

from absl import app
from absl import flags
import pytest

from mesh_tensorflow.bert._src import flag_util

_REPO = __file__.rsplit("/tests/", 1)[0]


def test_define_flags_defines_missing_flags_only():
  flag_values = flags.FlagValues()
  first = flag_util.define_flags(
    [("integer", "batch", 8, "b"), ("string", "name", None, "n")],
    "first_module",
    flag_values,
  )
  second = flag_util.define_flags(
    [("integer", "batch", 32, "b"), ("bool", "fast", True, "f")],
    "second_module",
    flag_values,
  )
  assert first == {"batch": 8, "name": None}
  assert second == {"batch": 32, "fast": True}
  flag_values(["prog"])
  assert flag_values.batch == 8  # the first definition's default
  assert flag_values.find_module_defining_flag("fast") == "second_module"
  flag_util.use_defaults(second, flag_values)
  assert flag_values.batch == 32
  flag_util.use_defaults(first, flag_values)
  assert flag_values.batch == 8


def test_use_defaults_keeps_values_given_on_the_command_line():
  flag_values = flags.FlagValues()
  first = flag_util.define_flags(
    [("integer", "batch", 8, "b")], "a", flag_values
  )
  second = flag_util.define_flags(
    [("integer", "batch", 32, "b")], "b", flag_values
  )
  flag_values(["prog", "--batch=3"])
  flag_util.use_defaults(second, flag_values)
  assert flag_values.batch == 3
  flag_util.use_defaults(first, flag_values)
  assert flag_values.batch == 3


def test_require_flags_names_the_first_unset_flag():
  flag_values = flags.FlagValues()
  flag_util.define_flags(
    [("string", "vocab_file", None, "v"), ("string", "output_dir", None, "o")],
    "m",
    flag_values,
  )
  flag_values(["prog", "--vocab_file=v.txt"])
  with pytest.raises(app.UsageError, match="--output_dir is required"):
    flag_util.require_flags(("vocab_file", "output_dir"), flag_values)
  flag_values.output_dir = "/tmp/out"
  flag_util.require_flags(("vocab_file", "output_dir"), flag_values)


def test_unknown_kind():
  with pytest.raises(ValueError, match="unknown kind 'enum'"):
    flag_util.define_flags([("enum", "x", "a", "")], "m", flags.FlagValues())


def test_bind_flags_reads_the_flags_at_each_call():
  flag_values = flags.FlagValues()
  flag_util.define_flags([("integer", "scale", 2, "s")], "m", flag_values)
  flag_values(["prog"])

  def multiply(x, scale=1):
    """Multiplies.

    Args:
      x: a number.
      scale: its factor.

    Returns:
      x * scale.
    """
    return x * scale

  bound = flag_util.bind_flags(multiply, ["scale"], flag_values)
  assert list(inspect.signature(bound).parameters) == ["x"]
  assert bound.__name__ == "multiply"
  assert "Here the flags of the same names set scale." in bound.__doc__
  assert bound(3) == 6
  flag_values.scale = 5
  assert bound(x=3) == 15


@pytest.mark.parametrize("transformer_main_first", [True, False])
def test_all_scripts_and_transformer_main_import_in_one_process(
  transformer_main_first,
):
  imports = [
    "import transformer.main",
    "from mesh_tensorflow.bert import run_classifier, run_pretraining\n"
    "from mesh_tensorflow.bert import run_squad, tokenization",
  ]
  if not transformer_main_first:
    imports.reverse()
  program = "\n".join(imports) + textwrap.dedent(
    """
    from absl import flags
    from mesh_tensorflow.bert._src import flag_util
    FLAGS = flags.FLAGS
    FLAGS(["prog", "--mesh_shape=batch:2", "--tpu_zone=z"])
    values = []
    for module in (run_pretraining, run_classifier, run_squad):
      flag_util.use_defaults(module.FLAG_DEFAULTS)
      values.append((FLAGS.eval_batch_size if "eval_batch_size" in FLAGS
                     else None, FLAGS.max_seq_length, FLAGS.mesh_shape))
    print(values, FLAGS.tpu_zone, FLAGS.preserve_unused_tokens,
          FLAGS.find_module_defining_flag("model_dir"))
    """
  )
  output = subprocess.run(
    [sys.executable, "-c", program],
    cwd=_REPO,
    env={"PYTHONPATH": _REPO, "TF_CPP_MIN_LOG_LEVEL": "3"},
    capture_output=True,
    text=True,
    timeout=300,
    check=True,
  ).stdout.strip()
  assert output.splitlines()[-1] == (
    "[(8, 128, 'batch:2'), (32, 128, 'batch:2'), (32, 384, 'batch:2')] z "
    "False transformer.main"
  )
