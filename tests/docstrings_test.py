"""Every public function and method documents its arguments and return value.

Walks the public facades of a package (the package and its modules whose
dotted names have no `_` part), resolves each exported name to the function or
class that defines it (skipping objects defined elsewhere, such as `tf`, `np`
or names re-exported from another package), and checks Google-style
docstrings:

  * a function or method with parameters other than self/cls/*args/**kwargs
    has an `Args:` section naming every such parameter (a class may document
    its constructor's parameters in the class docstring or in `__init__`);
  * a function that returns or yields a value (`return <value>` or
    `yield <value>` in its own body, not in nested functions) has a `Returns:`
    (or `Yields:`) section;
  * a property has a docstring.

A method that overrides a method of a base class of the same package inherits
the base method's documentation for the parameters and return value they
share (as `inspect.getdoc` does), so `lower` and `gradient` of each operation
need not repeat `Operation`'s docstrings. A base's `unused_<name>` parameter
documents an override's `<name>` (`Operation.gradient(self, unused_grad_ys)`
and `gradient(self, grad_ys)` of each operation).

Run as a script to list the undocumented names:
  python tests/docstrings_test.py [PACKAGE_PREFIX]
"""

import ast
import importlib
import inspect
import pkgutil
import re
import sys
import textwrap
import types

import pytest

# Packages checked, and the subpackages that are not part of them (the
# mesh_tensorflow.transformer alias of the transformer package).
PACKAGES = {
  "mesh_tensorflow": ("mesh_tensorflow.transformer",),
  "transformer": (),
}

# Packages whose public objects are not documented yet: expected to fail.
NOT_YET_DOCUMENTED = ()

_SECTION_RE = re.compile(r"^(\s*)([A-Z][A-Za-z ]*):\s*$")
_ARG_RE = re.compile(r"^\s*\**([A-Za-z_][A-Za-z0-9_]*)\s*(\([^)]*\))?\s*:")


def _sections(doc):
  """Splits a docstring into {section title: list of body lines}."""
  sections = {}
  current = None
  indent = None
  for line in inspect.cleandoc(doc or "").splitlines():
    match = _SECTION_RE.match(line)
    if match:
      current = match.group(2)
      indent = len(match.group(1))
      sections[current] = []
      continue
    if current is None:
      continue
    if line.strip() and len(line) - len(line.lstrip()) <= indent:
      current = None
      continue
    sections[current].append(line)
  return sections


def _documented_args(doc):
  """Names listed in the docstring's `Args:` (or `Arguments:`) section."""
  sections = _sections(doc)
  # Dataclasses document their fields (the constructor's parameters) as
  # Attributes.
  lines = (
    sections.get("Args", [])
    + sections.get("Arguments", [])
    + sections.get("Attributes", [])
  )
  lines = [line for line in lines if line.strip()]
  if not lines:
    return set()
  indent = min(len(line) - len(line.lstrip()) for line in lines)
  names = set()
  for line in lines:
    if len(line) - len(line.lstrip()) != indent:
      continue
    match = _ARG_RE.match(line)
    if match:
      names.add(match.group(1))
  return names


def _has_returns(doc):
  sections = _sections(doc)
  return "Returns" in sections or "Yields" in sections


def _function_node(fn):
  try:
    source = textwrap.dedent(inspect.getsource(fn))
  except (OSError, TypeError):
    return None
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
      return node
  return None


def _own_nodes(function_node):
  """AST nodes of a function's body, not of the functions it defines."""
  nested = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
  stack = [node for node in function_node.body if not isinstance(node, nested)]
  while stack:
    node = stack.pop()
    yield node
    stack += [
      child
      for child in ast.iter_child_nodes(node)
      if not isinstance(child, nested)
    ]


def _returns_value(fn):
  """Whether `fn` has `return <value>` or `yield <value>` in its body."""
  node = _function_node(fn)
  if node is None:
    return False
  for child in _own_nodes(node):
    if isinstance(child, (ast.Return, ast.Yield, ast.YieldFrom)):
      value = child.value
      if value is not None and not (
        isinstance(value, ast.Constant) and value.value is None
      ):
        return True
  return False


def _parameters(fn):
  try:
    signature = inspect.signature(fn)
  except (TypeError, ValueError):
    return []
  return [
    name
    for name, param in signature.parameters.items()
    if name not in ("self", "cls")
    and param.kind not in (param.VAR_POSITIONAL, param.VAR_KEYWORD)
  ]


def _belongs(obj, prefix):
  module = getattr(obj, "__module__", None) or ""
  return module == prefix or module.startswith(prefix + ".")


def facade_modules(prefix):
  """Names of the package `prefix` and of its public modules (no `_` part)."""
  package = importlib.import_module(prefix)
  names = [prefix]
  for info in pkgutil.walk_packages(package.__path__, prefix + "."):
    if any(part.startswith("_") for part in info.name.split(".")):
      continue
    if any(
      info.name == excluded or info.name.startswith(excluded + ".")
      for excluded in PACKAGES[prefix]
    ):
      continue
    names.append(info.name)
  return names


def _exported(module):
  names = getattr(module, "__all__", None)
  if names is None:
    names = [name for name in vars(module) if not name.startswith("_")]
  return [
    (name, getattr(module, name)) for name in names if hasattr(module, name)
  ]


def _unwrap(obj):
  while True:
    if isinstance(obj, (staticmethod, classmethod)):
      obj = obj.__func__
    elif hasattr(obj, "__wrapped__") and callable(obj):
      obj = obj.__wrapped__
    else:
      return obj


def _base_methods(cls, name, prefix):
  for base in cls.__mro__[1:]:
    if name in vars(base) and _belongs(base, prefix):
      yield _unwrap(vars(base)[name])


def _function_problems(qualname, fn, extra_docs=(), base_fns=()):
  """Problems of one function: missing Args entries or Returns section."""
  docs = [fn.__doc__] + list(extra_docs) + [b.__doc__ for b in base_fns]
  documented = set()
  for doc in docs:
    documented |= _documented_args(doc)
  # A base method names the parameters it ignores `unused_<name>`; its
  # overrides use them as `<name>`.
  for base_fn in base_fns:
    documented |= {
      name[len("unused_") :]
      for name in _documented_args(base_fn.__doc__)
      if name.startswith("unused_")
    }
  missing = [name for name in _parameters(fn) if name not in documented]
  problems = []
  if missing:
    problems.append("%s: Args missing %s" % (qualname, ", ".join(missing)))
  if _returns_value(fn) and not any(_has_returns(doc) for doc in docs):
    problems.append("%s: no Returns section" % qualname)
  return problems


def _class_problems(qualname, cls, prefix):
  problems = []
  for name, member in vars(cls).items():
    if name.startswith("_") and name != "__init__":
      continue
    member_qualname = "%s.%s" % (qualname, name)
    if isinstance(member, property):
      docs = [member.fget and member.fget.__doc__]
      docs += [
        getattr(base, "__doc__", None)
        for base in _base_methods(cls, name, prefix)
      ]
      if member.fget is not None and not any((d or "").strip() for d in docs):
        problems.append("%s: property without docstring" % member_qualname)
      continue
    fn = _unwrap(member)
    if not isinstance(fn, types.FunctionType):
      continue
    extra_docs = [cls.__doc__] if name == "__init__" else []
    problems += _function_problems(
      member_qualname, fn, extra_docs, list(_base_methods(cls, name, prefix))
    )
  return problems


def public_objects(prefix):
  """{qualified name: function or class} reachable from the facades."""
  found = {}
  for module_name in facade_modules(prefix):
    module = importlib.import_module(module_name)
    for _, obj in _exported(module):
      obj = _unwrap(obj)
      if not (inspect.isclass(obj) or isinstance(obj, types.FunctionType)):
        continue
      if not _belongs(obj, prefix):
        continue
      found["%s.%s" % (obj.__module__, obj.__qualname__)] = obj
  # Public base classes of the public classes (their methods are inherited).
  for obj in list(found.values()):
    if inspect.isclass(obj):
      for base in obj.__mro__[1:]:
        if _belongs(base, prefix) and not base.__name__.startswith("_"):
          found.setdefault("%s.%s" % (base.__module__, base.__qualname__), base)
  return found


def undocumented(prefix):
  """Sorted list of documentation problems of the package `prefix`."""
  problems = []
  for qualname, obj in sorted(public_objects(prefix).items()):
    if inspect.isclass(obj):
      problems += _class_problems(qualname, obj, prefix)
    else:
      problems += _function_problems(qualname, obj)
  return sorted(problems)


@pytest.mark.parametrize(
  "prefix",
  [
    pytest.param(
      prefix, marks=pytest.mark.xfail(reason="not documented yet", strict=False)
    )
    if prefix in NOT_YET_DOCUMENTED
    else prefix
    for prefix in PACKAGES
  ],
)
def test_public_objects_are_documented(prefix):
  problems = undocumented(prefix)
  assert not problems, "\n".join(problems)


def test_checker_finds_missing_args_and_returns():
  def documented(x, y=1):
    """Adds.

    Args:
      x: an int.
      y: an int.

    Returns:
      their sum.
    """
    return x + y

  def undocumented_fn(x, *args, **kwargs):
    """Adds."""
    del args, kwargs
    return x

  def returns_none(x):
    """Nothing.

    Args:
      x: ignored.
    """
    del x
    return None

  def returns_only_in_nested_function(x):
    """Registers a callback.

    Args:
      x: an int.
    """

    def callback():
      return x

    del callback

  class Base:
    def lower(self, lowering):
      """Lowers.

      Args:
        lowering: the lowering.

      Returns:
        the lowered value.
      """
      return lowering

    def gradient(self, unused_grad_ys):
      """Gradients.

      Args:
        unused_grad_ys: the output gradients, ignored here.
      """
      del unused_grad_ys

  class Override(Base):
    def lower(self, lowering):
      """Lowers differently."""
      return [lowering]

    def gradient(self, grad_ys):
      del grad_ys

  assert not _function_problems(
    "returns_only_in_nested_function", returns_only_in_nested_function
  )
  assert not _function_problems(
    "Override.lower", Override.lower, base_fns=[Base.lower]
  )
  assert not _function_problems(
    "Override.gradient", Override.gradient, base_fns=[Base.gradient]
  )
  assert _function_problems("Override.lower", Override.lower) == [
    "Override.lower: Args missing lowering",
    "Override.lower: no Returns section",
  ]
  assert not _function_problems("documented", documented)
  assert not _function_problems("returns_none", returns_none)
  assert _function_problems("undocumented", undocumented_fn) == [
    "undocumented: Args missing x",
    "undocumented: no Returns section",
  ]


if __name__ == "__main__":
  for package in sys.argv[1:] or ["mesh_tensorflow"]:
    found = undocumented(package)
    print("\n".join(found))
    print(
      "%s: %d problems in %d public objects"
      % (package, len(found), len(public_objects(package)))
    )
