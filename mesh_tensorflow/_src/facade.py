"""Public facade modules whose functions can be patched as in the original.

The original defined each public module (e.g. `mesh_tensorflow.layers`) in one
file, so `mock.patch.object(mtf.layers, "get_dense_kernel_weights")` also
changed what `mtf.layers.dense` called. Here a facade re-exports names defined
in `_src` modules; `make_patchable` makes setting such an attribute on the
facade set it in the defining module too, so callers there see the patch.
"""

from __future__ import annotations

import sys
import types
from typing import Dict


class PatchableFacade(types.ModuleType):
  """A module type whose re-exported attributes write through to their home.

  `_facade_homes` maps each re-exported name to the `_src` module defining it.
  """

  _facade_homes: Dict[str, types.ModuleType]

  def __setattr__(self, name: str, value) -> None:
    super().__setattr__(name, value)
    home = self.__dict__.get("_facade_homes", {}).get(name)
    if home is not None:
      setattr(home, name, value)


def make_patchable(module_name: str) -> None:
  """Makes the facade `module_name` forward attribute writes (see module doc).

  Example:
    mesh_tensorflow/layers.py ends with `facade.make_patchable(__name__)`,
    so patching the facade patches the module that calls the function:

    >>> from unittest import mock
    >>> from mesh_tensorflow._src.layers import core
    >>> with mock.patch.object(mtf.layers, "get_dense_kernel_weights", "p"):
    ...   print(core.get_dense_kernel_weights)
    p
    >>> core.get_dense_kernel_weights is mtf.layers.get_dense_kernel_weights
    True

  Args:
    module_name: the name of an imported facade module; each public attribute
      that is a function or class defined (under the same name) in a
      `mesh_tensorflow._src` module is forwarded there.
  """
  module = sys.modules[module_name]
  homes = {}
  for name, value in vars(module).items():
    if name.startswith("_"):
      continue
    home = sys.modules.get(getattr(value, "__module__", None) or "")
    if (
      home is not None
      and home.__name__.startswith("mesh_tensorflow._src.")
      and getattr(home, name, None) is value
    ):
      homes[name] = home
  module.__class__ = PatchableFacade
  module._facade_homes = homes


__all__ = ["PatchableFacade", "make_patchable"]
