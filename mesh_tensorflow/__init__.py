"""Mesh TensorFlow for TensorFlow 2: named-dimension distributed tensors.

Usage: `import mesh_tensorflow as mtf`. The transformer library is imported
separately (`import mesh_tensorflow.transformer`), as in the original.
"""
# pylint: disable=wildcard-import

from mesh_tensorflow import beam_search
from mesh_tensorflow import layers
from mesh_tensorflow import ops
from mesh_tensorflow import optimize
from mesh_tensorflow import placement_mesh_impl
from mesh_tensorflow import simd_mesh_impl
from mesh_tensorflow import tpu_variables
from mesh_tensorflow import utils
from mesh_tensorflow.ops_with_redefined_builtins import *  # noqa: F401,F403

__version__ = "0.2.0"
