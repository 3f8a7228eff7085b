"""Alias: `mesh_tensorflow.transformer[.X]` is the top-level `transformer[.X]`.

The very same module objects are returned (not copies), so gin registrations
and module state exist once whichever path user code imports. This file
replaces itself in `sys.modules` with the `transformer` package, so attribute
access (`mesh_tensorflow.transformer.utils`) needs nothing more. Imports of
submodules by the alias name (`import mesh_tensorflow.transformer.moe`, also
nested and on-demand ones) go through a meta-path finder that imports the
real module by its own name and hands that object back with its own
`__spec__`, so `importlib.reload` re-executes the file under either name.
"""

import importlib
import importlib.abc
import importlib.util
import sys

_ALIAS = __name__
_TARGET = "transformer"


def _target_name(alias_name):
  return _TARGET + alias_name[len(_ALIAS) :]


class _AliasFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
  """Resolves `mesh_tensorflow.transformer.<sub>` to `transformer.<sub>`."""

  def find_spec(self, fullname, path=None, target=None):
    del path, target
    if not fullname.startswith(_ALIAS + "."):
      return None
    if importlib.util.find_spec(_target_name(fullname)) is None:
      return None
    return importlib.util.spec_from_loader(fullname, self)

  def create_module(self, spec):
    module = importlib.import_module(_target_name(spec.name))
    spec.loader_state = module.__spec__
    return module

  def exec_module(self, module):
    # The import system has just set `module.__spec__` to the alias spec;
    # restore the module's own, which `importlib.reload` uses to find and
    # re-execute the file.
    module.__spec__ = module.__spec__.loader_state


if not any(type(f).__name__ == _AliasFinder.__name__ for f in sys.meta_path):
  sys.meta_path.insert(0, _AliasFinder())

sys.modules[_ALIAS] = importlib.import_module(_TARGET)
