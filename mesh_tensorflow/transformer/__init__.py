"""Alias: `mesh_tensorflow.transformer[.X]` is the top-level `transformer[.X]`.

The very same module objects are returned (not copies), so gin registrations
and module state exist once whichever path user code imports.
"""

import importlib
import importlib.abc
import importlib.util
import sys

_ALIAS = __name__
_TARGET = "transformer"


class _AliasImporter(importlib.abc.MetaPathFinder, importlib.abc.Loader):
  """Resolves mesh_tensorflow.transformer.<sub> to transformer.<sub>."""

  def find_spec(self, fullname, path=None, target=None):
    del path, target
    if fullname.startswith(_ALIAS + "."):
      return importlib.util.spec_from_loader(fullname, self)
    return None

  def create_module(self, spec):
    return importlib.import_module(_TARGET + spec.name[len(_ALIAS):])

  def exec_module(self, module):
    pass


if not any(isinstance(f, _AliasImporter) for f in sys.meta_path):
  sys.meta_path.insert(0, _AliasImporter())

sys.modules[_ALIAS] = importlib.import_module(_TARGET)
