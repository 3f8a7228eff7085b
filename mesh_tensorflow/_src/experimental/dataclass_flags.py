"""absl flags mirroring the fields of a settings dataclass.

The experimental entry points keep the original's command-line flags while
their code takes a frozen dataclass of the same names and defaults: one flag
per field (bool, int, float or str, or an int defaulting to None), defined
only when an entry point asks for it. Such a dataclass derives from
`FlagSettings`, which reads an instance from parsed flags.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Type, TypeVar

from absl import flags

__all__ = ["FlagSettings", "define", "values_from"]

T = TypeVar("T")

_DEFINE_BY_TYPE = {
  "bool": flags.DEFINE_boolean,
  "int": flags.DEFINE_integer,
  "Optional[int]": flags.DEFINE_integer,
  "float": flags.DEFINE_float,
  "str": flags.DEFINE_string,
}


def define(cls: type, help_by_name: Dict[str, str], flag_values) -> None:
  """Defines a flag per field of dataclass cls, skipping defined names.

  Args:
    cls: a dataclass whose field types are bool, int, float, str or
      Optional[int] (annotations as strings).
    help_by_name: the help text of each field.
    flag_values: the absl FlagValues to define them in.
  """
  for field in dataclasses.fields(cls):
    if field.name not in flag_values:
      _DEFINE_BY_TYPE[field.type](
        field.name,
        field.default,
        help_by_name[field.name],
        flag_values=flag_values,
      )


def values_from(cls: Type[T], flag_values) -> T:
  """An instance of dataclass cls holding the parsed flags' values.

  Args:
    cls: the dataclass.
    flag_values: parsed absl FlagValues defining a flag per field of cls.

  Returns:
    cls(**{field: flag value}).
  """
  return cls(
    **{f.name: flag_values[f.name].value for f in dataclasses.fields(cls)}
  )


class FlagSettings:
  """Base of a settings dataclass whose fields absl flags of the same names set.

  The entry point defines the flags (`define`, with each field's help) and
  parses them; `from_flags` then reads the settings.
  """

  @classmethod
  def from_flags(cls: Type[T], flag_values=flags.FLAGS) -> T:
    """The settings that parsed flags give: one flag per field.

    Args:
      flag_values: parsed absl FlagValues holding a flag per field.

    Returns:
      an instance of this dataclass.
    """
    return values_from(cls, flag_values)
