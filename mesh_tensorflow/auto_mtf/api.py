"""mesh_tensorflow.auto_mtf.api: layout() and layout_and_mesh_shape()."""
# pylint: disable=g-importing-member,useless-import-alias

from mesh_tensorflow._src.auto_mtf.api import layout as layout
from mesh_tensorflow._src.auto_mtf.api import (
  layout_and_mesh_shape as layout_and_mesh_shape,
)
from mesh_tensorflow._src.auto_mtf.api import (
  mesh_shape_iterator as _mesh_shape_iterator,  # noqa: F401
)

__all__ = ["layout", "layout_and_mesh_shape"]
