"""Every public function of the packages carries type hints.

Walks the same public facades as tests/docstrings_test.py (the packages and
their modules whose dotted names have no `_` part), resolves each exported
name to the function that defines it in the project (unwrapping decorators
such as `gin.configurable`), and checks that the function annotates its return
value or at least one parameter. A function with no annotations at all is
reported, so the hints cannot silently go missing on new public functions.

Run as a script to list the functions without hints:
  python -m tests.type_hints_test [PACKAGE_PREFIX]
"""

import inspect
import sys
import types

import pytest

from tests import docstrings_test


def _has_hints(fn):
  """Whether `fn` annotates its return value or any of its parameters."""
  return bool(getattr(fn, "__annotations__", None))


def unannotated(prefix):
  """Sorted qualified names of public functions of `prefix` without hints."""
  return sorted(
    qualname
    for qualname, obj in docstrings_test.public_objects(prefix).items()
    if isinstance(obj, types.FunctionType) and not _has_hints(obj)
  )


@pytest.mark.parametrize("prefix", sorted(docstrings_test.PACKAGES))
def test_public_functions_have_type_hints(prefix):
  missing = unannotated(prefix)
  assert not missing, "functions without type hints:\n" + "\n".join(missing)


def test_checker_tells_annotated_from_bare_functions():
  def bare(x, y=1):
    return x + y

  def returns_annotated(x, y=1) -> int:
    return x + y

  def parameter_annotated(x: int, y=1):
    return x + y

  assert not _has_hints(bare)
  assert _has_hints(returns_annotated)
  assert _has_hints(parameter_annotated)
  # The check sees through decorators that keep `__wrapped__`, as
  # docstrings_test's walk does.
  assert inspect.unwrap(returns_annotated) is returns_annotated


if __name__ == "__main__":
  for package in sys.argv[1:] or sorted(docstrings_test.PACKAGES):
    found = unannotated(package)
    print("\n".join(found))
    print("%s: %d functions without type hints" % (package, len(found)))
