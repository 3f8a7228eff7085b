"""mesh_tensorflow.auto_mtf.graph_interface: one view of tf and mtf graphs."""
# pylint: disable=g-importing-member,useless-import-alias

from mesh_tensorflow._src.auto_mtf.graph_interface import (
  GraphInterface as GraphInterface,
)

__all__ = ["GraphInterface"]
