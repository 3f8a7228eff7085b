"""Every public function and method of the packages carries type hints.

Walks the same public facades as tests/docstrings_test.py (the packages and
their modules whose dotted names have no `_` part), resolves each exported
name to the function that defines it in the project (unwrapping decorators
such as `gin.configurable`), and checks that the function annotates its return
value or at least one parameter. The public methods and properties that the
project's exported classes define (and `__init__` when it takes arguments)
are checked the same way. A function with no annotations at all is reported,
so the hints cannot silently go missing on new public functions.

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


def _project_methods(cls):
  """(name, function) of the public methods and properties cls defines."""
  for name, member in vars(cls).items():
    if name.startswith("_") and name != "__init__":
      continue
    fn = member.fget if isinstance(member, property) else member
    fn = inspect.unwrap(getattr(fn, "__func__", fn))
    if not isinstance(fn, types.FunctionType):
      continue
    if not fn.__module__.startswith(_PROJECT_PACKAGES):
      continue  # inherited from TF or another library
    takes_arguments = len(inspect.signature(fn).parameters) > 1
    if name == "__init__" and not takes_arguments:
      continue
    yield name, fn


_PROJECT_PACKAGES = ("mesh_tensorflow", "transformer")


def unannotated_methods(prefix):
  """Sorted qualified names of public methods of `prefix` without hints."""
  classes = {
    obj
    for obj in docstrings_test.public_objects(prefix).values()
    if isinstance(obj, type)
  }
  return sorted(
    "%s.%s.%s" % (fn.__module__, cls.__name__, name)
    for cls in classes
    for name, fn in _project_methods(cls)
    if not _has_hints(fn)
  )


@pytest.mark.parametrize("prefix", sorted(docstrings_test.PACKAGES))
def test_public_functions_have_type_hints(prefix):
  missing = unannotated(prefix)
  assert not missing, "functions without type hints:\n" + "\n".join(missing)


@pytest.mark.parametrize("prefix", sorted(docstrings_test.PACKAGES))
def test_public_methods_have_type_hints(prefix):
  missing = unannotated_methods(prefix)
  assert not missing, "methods without type hints:\n" + "\n".join(missing)


def test_method_walk_sees_properties_and_skips_inherited_methods():
  class Example(dict):
    def __init__(self, size: int):
      super().__init__()
      self.size = size

    @property
    def doubled(self):
      return 2 * self.size

    def bare(self, x):
      return x

    def _private(self, x):
      return x

  Example.__module__ = "mesh_tensorflow.example"
  for fn in (Example.__init__, Example.doubled.fget, Example.bare):
    fn.__module__ = "mesh_tensorflow.example"
  names = [name for name, _ in _project_methods(Example)]
  assert sorted(names) == ["__init__", "bare", "doubled"]
  bare = dict(_project_methods(Example))
  assert not _has_hints(bare["bare"]) and _has_hints(bare["__init__"])


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
    found = unannotated(package) + unannotated_methods(package)
    print("\n".join(found))
    print("%s: %d functions/methods without type hints" % (package, len(found)))
