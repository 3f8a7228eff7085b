"""The `>>>` examples in docstrings of mesh_tensorflow and transformer run.

Every module of both packages is searched (found by walking the packages, so
new modules and examples are picked up; `mesh_tensorflow.transformer.*`, an
alias of the `transformer` modules, is searched once, as `transformer.*`).
Examples see their module's globals plus what user code would have imported:
`mtf` (with mtf.test_utils), `tf` and `np`.

In the packages of PACKAGES_WITH_RUNNABLE_EXAMPLES every `Example:` or
`Examples:` section of a docstring holds a `>>>` example, so documentation
cannot drift from the code. Every docstring with a `>>>` example, in either
package, is one that the doctest run finds (not, say, a nested function's).
"""

import ast
import doctest
import inspect
import pkgutil
import re

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
import mesh_tensorflow.test_utils  # noqa: F401  (mtf.test_utils in examples)
import transformer

# Packages whose `Example:` sections must all be runnable (hold `>>>` lines).
PACKAGES_WITH_RUNNABLE_EXAMPLES = (mtf, transformer)
# Fewest examples expected: a guard against examples silently not being found.
MIN_EXAMPLES = 998
OPTIONS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
# A section title: "Example:", "Examples:" or "Example (what):", alone or
# followed by text.
_EXAMPLE_SECTION_RE = re.compile(r"^(\s*)Examples?( \([^)]*\))?:")
_DOCUMENTED_NODES = (
  ast.Module,
  ast.ClassDef,
  ast.FunctionDef,
  ast.AsyncFunctionDef,
)


def _import(module_name):
  return __import__(module_name, fromlist=["_"])


def _package_module_names(package):
  """The modules of package, without aliases of another package's modules."""
  names = [package.__name__] + [
    info.name
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + ".")
  ]
  return [name for name in names if _import(name).__name__ == name]


def _module_names():
  return sorted(
    name
    for package in (mtf, transformer)
    for name in _package_module_names(package)
  )


def _doctests(module_name):
  module = _import(module_name)
  finder = doctest.DocTestFinder(exclude_empty=True)
  extra = {"mtf": mtf, "tf": tf, "np": np}
  return [
    t for t in finder.find(module, module_name, extraglobs=extra) if t.examples
  ]


def _source_docstrings(module_name):
  """(where, docstring) of the module and each class and function it defines."""
  module = _import(module_name)
  with open(module.__file__, encoding="utf-8") as source:
    tree = ast.parse(source.read())
  for node in ast.walk(tree):
    if isinstance(node, _DOCUMENTED_NODES):
      docstring = ast.get_docstring(node, clean=False)
      if docstring:
        where = "%s:%d (%s)" % (
          module.__file__,
          getattr(node, "lineno", 1),
          getattr(node, "name", module_name),
        )
        yield where, docstring


def _example_sections(docstring):
  """The lines of each Example(s) section: its title line and indented body."""
  lines = docstring.splitlines()
  for i, line in enumerate(lines):
    match = _EXAMPLE_SECTION_RE.match(line)
    if not match:
      continue
    indent = len(match.group(1))
    section = [line]
    for body_line in lines[i + 1 :]:
      body_indent = len(body_line) - len(body_line.lstrip())
      if body_line.strip() and body_indent <= indent:
        break
      section.append(body_line)
    yield section


MODULES = _module_names()


@pytest.mark.parametrize("module_name", MODULES)
def test_docstring_examples_run(module_name):
  runner = doctest.DocTestRunner(optionflags=OPTIONS)
  for test in _doctests(module_name):
    runner.run(test)
  result = runner.summarize(verbose=False)
  assert result.failed == 0, "%d of %d examples failed in %s" % (
    result.failed,
    result.attempted,
    module_name,
  )


def test_examples_are_found():
  count = sum(len(t.examples) for name in MODULES for t in _doctests(name))
  assert count >= MIN_EXAMPLES


@pytest.mark.parametrize(
  "package", PACKAGES_WITH_RUNNABLE_EXAMPLES, ids=lambda p: p.__name__
)
def test_example_sections_are_runnable(package):
  prose_sections = []
  for module_name in _package_module_names(package):
    for where, docstring in _source_docstrings(module_name):
      for section in _example_sections(docstring):
        if not any(line.lstrip().startswith(">>>") for line in section):
          prose_sections.append("%s: %s" % (where, section[0].strip()))
  assert not prose_sections, (
    "Example sections without a `>>>` example (write them as doctests):\n"
    + "\n".join(prose_sections)
  )


@pytest.mark.parametrize("module_name", MODULES)
def test_docstring_examples_are_collected(module_name):
  collected = {inspect.cleandoc(t.docstring) for t in _doctests(module_name)}
  not_run = [
    where
    for where, docstring in _source_docstrings(module_name)
    if ">>>" in docstring and inspect.cleandoc(docstring) not in collected
  ]
  assert not not_run, "docstring examples the doctest run misses: %s" % (
    not_run,
  )
