"""mesh_tensorflow.test_utils: helpers for testing mtf programs (facade)."""
# pylint: disable=g-importing-member,useless-import-alias

from mesh_tensorflow._src.numpy_converter import (
  NumpyConverter as NumpyConverter,
)

__all__ = ["NumpyConverter"]
