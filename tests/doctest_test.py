"""The `>>>` examples in docstrings of mesh_tensorflow and transformer run.

Every module of both packages is searched (found by walking the packages, so
new modules and examples are picked up). Examples see their module's globals
plus what user code would have imported: `mtf` (with mtf.test_utils), `tf`
and `np`. `Example:` sections written as prose (no `>>>`) are not run.
"""

import doctest
import pkgutil

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
import mesh_tensorflow.test_utils  # noqa: F401  (mtf.test_utils in examples)
import transformer

# Fewest examples expected: a guard against examples silently not being found.
MIN_EXAMPLES = 53
OPTIONS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def _module_names():
  names = []
  for package in (mtf, transformer):
    names.append(package.__name__)
    names += [
      info.name
      for info in pkgutil.walk_packages(
        package.__path__, package.__name__ + "."
      )
    ]
  return sorted(names)


def _doctests(module_name):
  module = __import__(module_name, fromlist=["_"])
  finder = doctest.DocTestFinder(exclude_empty=True)
  extra = {"mtf": mtf, "tf": tf, "np": np}
  return [
    t for t in finder.find(module, module_name, extraglobs=extra) if t.examples
  ]


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
