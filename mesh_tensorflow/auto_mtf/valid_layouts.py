"""mesh_tensorflow.auto_mtf.valid_layouts: which layouts are allowed."""
# pylint: disable=g-importing-member,useless-import-alias

from mesh_tensorflow._src.auto_mtf.valid_layouts import (
  LayoutValidator as LayoutValidator,
)

__all__ = ["LayoutValidator"]
