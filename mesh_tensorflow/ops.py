"""mesh_tensorflow.ops: the core mtf language (facade over mesh_tensorflow._src).

Every public name of the original `ops` module is re-exported here; the code
lives in small modules under `_src/`, one concept each.
"""
# pylint: disable=g-importing-member,useless-import-alias,unused-import

import numpy as np  # The original leaked `mtf.np`; legacy code uses it.
import tensorflow.compat.v1 as tf  # The original exposed `mtf.tf`.

from mesh_tensorflow import utils as utils
from mesh_tensorflow._src.graph import Graph as Graph
from mesh_tensorflow._src.graph import Mesh as Mesh
from mesh_tensorflow._src.graph import Operation as Operation
from mesh_tensorflow._src.graph import Tensor as Tensor
from mesh_tensorflow._src.hooks import (
  MtfCheckpointSaverListener as MtfCheckpointSaverListener,
)
from mesh_tensorflow._src.hooks import MtfRestoreHook as MtfRestoreHook
from mesh_tensorflow._src.laid_out import LazyAllreduceSum as LazyAllreduceSum
from mesh_tensorflow._src.laid_out import LazyLaidOutTensor as LazyLaidOutTensor
from mesh_tensorflow._src.laid_out import (
  compatible_lazy_allreduce_sums as compatible_lazy_allreduce_sums,
)
from mesh_tensorflow._src.laid_out import (
  convert_args_to_laid_out_tensors as convert_args_to_laid_out_tensors,
)
from mesh_tensorflow._src.layout import LayoutRules as LayoutRules
from mesh_tensorflow._src.layout import TensorLayout as TensorLayout
from mesh_tensorflow._src.layout import (
  convert_to_layout_rules as convert_to_layout_rules,
)
from mesh_tensorflow._src.layout import pnum_to_group as pnum_to_group
from mesh_tensorflow._src.layout import (
  pnum_to_processor_coordinates as pnum_to_processor_coordinates,
)
from mesh_tensorflow._src.layout import (
  pnum_to_processor_coordinates_nd as pnum_to_processor_coordinates_nd,
)
from mesh_tensorflow._src.layout import (
  processor_coordinates_to_pnum as processor_coordinates_to_pnum,
)
from mesh_tensorflow._src.layout import (
  processor_coordinates_to_pnum_map_nd as processor_coordinates_to_pnum_map_nd,
)
from mesh_tensorflow._src.layout import processor_groups as processor_groups
from mesh_tensorflow._src.layout import (
  tensor_dim_to_mesh_dim_size as tensor_dim_to_mesh_dim_size,
)
from mesh_tensorflow._src.layout import (
  tensor_dim_to_size_per_split as tensor_dim_to_size_per_split,
)
from mesh_tensorflow._src.lowering import Lowering as Lowering
from mesh_tensorflow._src.lowering import (
  log_variable_sizes as log_variable_sizes,
)
from mesh_tensorflow._src.lowering import (
  pretty_print_counters as pretty_print_counters,
)
from mesh_tensorflow._src.mesh_impl import MeshImpl as MeshImpl
from mesh_tensorflow._src.mesh_impls.collectives import (
  binary_reduction_fn as binary_reduction_fn,
)
from mesh_tensorflow._src.ops.binary import *  # pylint: disable=wildcard-import
from mesh_tensorflow._src.ops.broadcast_binary import *  # pylint: disable=wildcard-import
from mesh_tensorflow._src.ops.broadcast_binary import (
  infer_binary_broadcast_shape as _infer_binary_broadcast_shape,  # pylint: disable=unused-import
)
from mesh_tensorflow._src.ops.control import *  # pylint: disable=wildcard-import
from mesh_tensorflow._src.ops.conv import *  # pylint: disable=wildcard-import
from mesh_tensorflow._src.ops.custom_gradient import *  # pylint: disable=wildcard-import
from mesh_tensorflow._src.ops.einsum import *  # pylint: disable=wildcard-import
from mesh_tensorflow._src.ops.elementwise import *  # pylint: disable=wildcard-import
from mesh_tensorflow._src.ops.gather import *  # pylint: disable=wildcard-import
from mesh_tensorflow._src.ops.gradients import *  # pylint: disable=wildcard-import
from mesh_tensorflow._src.ops.halo import *  # pylint: disable=wildcard-import
from mesh_tensorflow._src.ops.io import *  # pylint: disable=wildcard-import
from mesh_tensorflow._src.ops.microbatch import *  # pylint: disable=wildcard-import
from mesh_tensorflow._src.ops.pool import *  # pylint: disable=wildcard-import
from mesh_tensorflow._src.ops.random import *  # pylint: disable=wildcard-import
from mesh_tensorflow._src.ops.reduce import *  # pylint: disable=wildcard-import
from mesh_tensorflow._src.ops.reduce import reduction_fn as reduction_fn
from mesh_tensorflow._src.ops.reshape import *  # pylint: disable=wildcard-import
from mesh_tensorflow._src.ops.sequence import *  # pylint: disable=wildcard-import
from mesh_tensorflow._src.ops.shift import *  # pylint: disable=wildcard-import
from mesh_tensorflow._src.ops.slicewise import *  # pylint: disable=wildcard-import
from mesh_tensorflow._src.ops.softmax import *  # pylint: disable=wildcard-import
from mesh_tensorflow._src.ops.summary import *  # pylint: disable=wildcard-import
from mesh_tensorflow._src.ops.tensor_ops import *  # pylint: disable=wildcard-import
from mesh_tensorflow._src.ops.topk import *  # pylint: disable=wildcard-import
from mesh_tensorflow._src.parallel import parallel as parallel
from mesh_tensorflow._src.parallel import (
  transpose_list_of_lists as transpose_list_of_lists,
)
from mesh_tensorflow._src.shapes import Dimension as Dimension
from mesh_tensorflow._src.shapes import Shape as Shape
from mesh_tensorflow._src.shapes import anonymous_shape as anonymous_shape
from mesh_tensorflow._src.shapes import combined_dimension as combined_dimension
from mesh_tensorflow._src.shapes import (
  convert_to_dimension as convert_to_dimension,
)
from mesh_tensorflow._src.shapes import convert_to_shape as convert_to_shape
from mesh_tensorflow._src.shapes import is_subsequence as is_subsequence
from mesh_tensorflow._src.shapes import list_product as list_product
from mesh_tensorflow._src.shapes import (
  parse_string_to_list_of_pairs as _parse_string_to_list_of_pairs,  # pylint: disable=unused-import
)
from mesh_tensorflow._src.shapes import verify_no_new_dims as verify_no_new_dims
from mesh_tensorflow._src.stacking import StackedVariable as StackedVariable
from mesh_tensorflow._src.variables import *  # pylint: disable=wildcard-import

xrange = range  # The original's six.moves alias, kept for legacy callers.


def _public_names():
  return sorted(
    n
    for n, v in globals().items()
    if not n.startswith("_") and n not in ("tf", "np")
  )


__all__ = _public_names() + ["tf", "np"]
