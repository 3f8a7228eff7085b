"""Command-line flags shared by several entry points in one process.

The BERT scripts define the original's flags when imported, as the original
did. Several of them (and transformer.main) use the same names, and absl
refuses a second definition, so importing two of them in one process failed
in the original. Here a flag is defined by the first module that needs it
and shared afterwards, and may be redefined by a module imported later
(transformer.main defines --gcp_project and --tpu_zone, for example), so
the modules import in any order; each script records its own defaults and
restores them in its main() for flags not given on the command line, so a
script behaves the same whichever modules were imported before it.

`bind_flags` gives a script the original's public functions, whose
signatures lack the parameters they read from flags.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

from absl import app
from absl import flags

__all__ = ["bind_flags", "define_flags", "use_defaults"]

_DEFINERS = {
  "bool": flags.DEFINE_bool,
  "float": flags.DEFINE_float,
  "integer": flags.DEFINE_integer,
  "string": flags.DEFINE_string,
}

# id(Flag) -> the value use_defaults last gave it (a script's default, which
# the next script may replace by its own).
_applied: Dict[int, Any] = {}

# (kind, name, default, help): kind is one of _DEFINERS' keys.
FlagSpec = Tuple[str, str, Any, str]


def define_flags(
  specs: Sequence[FlagSpec],
  module_name: str,
  flag_values: Optional[flags.FlagValues] = None,
) -> Dict[str, Any]:
  """Defines each flag of specs that flag_values does not have yet.

  The definitions allow a later module to define the same names again.

  Args:
    specs: (kind, name, default, help) tuples; kind is "bool", "float",
      "integer" or "string".
    module_name: the module the flags belong to (for --helpfull).
    flag_values: the FlagValues (default absl's FLAGS).

  Returns:
    {name: default} of all specs (for use_defaults).

  Raises:
    ValueError: for an unknown kind.
  """
  flag_values = flags.FLAGS if flag_values is None else flag_values
  defaults = {}
  for kind, name, default, help_text in specs:
    if kind not in _DEFINERS:
      raise ValueError(
        "flag %r: unknown kind %r (known: %s)"
        % (name, kind, ", ".join(sorted(_DEFINERS)))
      )
    if name not in flag_values:
      _DEFINERS[kind](
        name,
        default,
        help_text,
        flag_values=flag_values,
        module_name=module_name,
        allow_override=True,
      )
    defaults[name] = default
  return defaults


def use_defaults(
  defaults: Dict[str, Any], flag_values: Optional[flags.FlagValues] = None
) -> None:
  """Sets each flag left at a default to defaults[name].

  A flag at the default of its definition, or at the value an earlier
  use_defaults gave it, takes this script's default; one given on the
  command line, or set otherwise by the program, keeps its value.

  Args:
    defaults: {flag name: default}, as define_flags returned.
    flag_values: the parsed FlagValues (default absl's FLAGS).
  """
  flag_values = flags.FLAGS if flag_values is None else flag_values
  for name, default in defaults.items():
    flag = flag_values[name]
    if flag.present:
      continue
    if flag.value == flag.default or flag.value == _applied.get(id(flag)):
      flag.value = default
      _applied[id(flag)] = default


def require_flags(
  names: Sequence[str], flag_values: Optional[flags.FlagValues] = None
) -> None:
  """Raises absl's UsageError naming the first flag of `names` left empty.

  Args:
    names: the flags a script cannot run without.
    flag_values: the parsed FlagValues (default absl's FLAGS).

  Raises:
    app.UsageError: "--<name> is required" for the first unset flag.
  """
  flag_values = flags.FLAGS if flag_values is None else flag_values
  for name in names:
    if not flag_values[name].value:
      raise app.UsageError("--%s is required" % name)


def bind_flags(
  fn: Callable,
  names: Sequence[str],
  flag_values: Optional[flags.FlagValues] = None,
) -> Callable:
  """fn, with its parameters `names` set to the flags of the same names.

  The original's scripts read some settings from flags inside their public
  functions (run_squad.write_predictions reads --verbose_logging, ...); the
  library functions take them as parameters. The result has fn's signature
  without those parameters and reads the flags' values at each call.

  Args:
    fn: a function with a parameter per flag name.
    names: the parameters set from flags.
    flag_values: the parsed FlagValues (default absl's FLAGS).

  Returns:
    The function, with fn's name and documentation.
  """
  flag_values = flags.FLAGS if flag_values is None else flag_values
  signature = inspect.signature(fn)

  @functools.wraps(fn)
  def with_flags(*args, **kwargs):
    return fn(
      *args, **kwargs, **{name: flag_values[name].value for name in names}
    )

  with_flags.__signature__ = signature.replace(
    parameters=[p for p in signature.parameters.values() if p.name not in names]
  )
  with_flags.__doc__ = "%s\n\nHere the flags of the same names set %s." % (
    inspect.cleandoc(fn.__doc__ or ""),
    ", ".join(names),
  )
  return with_flags
