"""All of mesh_tensorflow.ops plus builtin-shadowing aliases abs/pow/range/slice."""
# pylint: disable=wildcard-import,redefined-builtin,unused-wildcard-import

from mesh_tensorflow import ops as _ops
from mesh_tensorflow.ops import *  # noqa: F401,F403

abs = _ops.mtf_abs
pow = _ops.mtf_pow
range = _ops.mtf_range  # pylint: disable=invalid-name
slice = _ops.mtf_slice  # pylint: disable=invalid-name

__all__ = list(_ops.__all__) + ["abs", "pow", "range", "slice"]
