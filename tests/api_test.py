"""Pins the public mtf names and signatures that the original defined.

Legacy code calls these positionally and by keyword, so parameter names,
order and defaults must match the original exactly.
"""

import inspect

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import placement_mesh_impl

_EMPTY = inspect.Parameter.empty
_VAR = "*"  # marks *args / **kwargs entries

# name -> list of (parameter, default) in order; _EMPTY = required.
SIGNATURES = {
  "get_variable": [
    ("mesh", _EMPTY),
    ("name", _EMPTY),
    ("shape", _EMPTY),
    ("dtype", tf.float32),
    ("master_dtype", None),
    ("slice_dtype", None),
    ("activation_dtype", None),
    ("initializer", None),
    ("trainable", True),
    ("kwargs", _VAR),
  ],
  "einsum": [
    ("xs", _EMPTY),
    ("output_shape", None),
    ("reduced_dims", None),
    ("name", None),
  ],
  "matmul": [
    ("a", _EMPTY),
    ("b", _EMPTY),
    ("output_shape", None),
    ("reduced_dims", None),
    ("name", None),
  ],
  "reduce_sum": [
    ("x", _EMPTY),
    ("disable_positional_args", None),
    ("output_shape", None),
    ("reduced_dim", None),
    ("name", None),
  ],
  "reduce_logsumexp": [
    ("x", _EMPTY),
    ("reduced_dim", _EMPTY),
    ("extra_logit", None),
    ("name", None),
  ],
  "reshape": [("x", _EMPTY), ("new_shape", _EMPTY), ("name", "reshape")],
  "transpose": [("x", _EMPTY), ("new_shape", _EMPTY), ("name", "transpose")],
  "rename_dimension": [
    ("x", _EMPTY),
    ("old_name", _EMPTY),
    ("new_name", _EMPTY),
  ],
  "replace_dimensions": [
    ("tensor_or_shape", _EMPTY),
    ("old_dim_or_dims", _EMPTY),
    ("new_dim_or_dims", _EMPTY),
  ],
  "broadcast": [("x", _EMPTY), ("new_shape", _EMPTY)],
  "import_tf_tensor": [
    ("mesh", _EMPTY),
    ("tf_tensor", _EMPTY),
    ("shape", None),
    ("name", None),
  ],
  "import_fully_replicated": [
    ("mesh", _EMPTY),
    ("tf_tensor", _EMPTY),
    ("shape", _EMPTY),
    ("name", None),
  ],
  "import_laid_out_tensor": [
    ("mesh", _EMPTY),
    ("laid_out_tensor", _EMPTY),
    ("shape", _EMPTY),
    ("name", None),
  ],
  "slicewise": [
    ("tf_fn", _EMPTY),
    ("xs", _EMPTY),
    ("output_shape", None),
    ("output_dtype", None),
    ("splittable_dims", None),
    ("grad_function", None),
    ("name", None),
  ],
  "cwise": [
    ("tf_fn", _EMPTY),
    ("xs", _EMPTY),
    ("output_dtype", None),
    ("grad_function", None),
    ("name", None),
  ],
  "add": [
    ("x1", _EMPTY),
    ("x2", _EMPTY),
    ("output_shape", None),
    ("name", None),
  ],
  "multiply": [
    ("x1", _EMPTY),
    ("x2", _EMPTY),
    ("output_shape", None),
    ("name", None),
  ],
  "minimum": [
    ("x1", _EMPTY),
    ("x2", _EMPTY),
    ("output_shape", None),
    ("name", None),
  ],
  "less": [("x1", _EMPTY), ("x2", _EMPTY), ("output_shape", None)],
  "where": [
    ("condition", _EMPTY),
    ("if_true", _EMPTY),
    ("if_false", _EMPTY),
    ("output_shape", None),
  ],
  "identity": [("x", _EMPTY), ("name", "identity")],
  "leaky_relu": [("x", _EMPTY), ("alpha", 0.2), ("name", "leaky_relu")],
  "cast": [("x", _EMPTY), ("dtype", _EMPTY), ("name", "cast")],
  "constant": [
    ("mesh", _EMPTY),
    ("value", _EMPTY),
    ("shape", None),
    ("dtype", tf.float32),
  ],
  "zeros": [("mesh", _EMPTY), ("shape", _EMPTY), ("dtype", tf.float32)],
  "assign": [
    ("var", _EMPTY),
    ("new_val", _EMPTY),
    ("assign_fn", mtf.assign_slice),
    ("name", None),
  ],
  "assign_add": [("var", _EMPTY), ("new_val", _EMPTY)],
  "gradients": [
    ("ys", _EMPTY),
    ("xs", _EMPTY),
    ("grad_ys", None),
    ("operations", None),
  ],
  "Print": [
    ("x", _EMPTY),
    ("data", _EMPTY),
    ("message", _EMPTY),
    ("kwargs", _VAR),
  ],
  "scalar_summary": [("name", _EMPTY), ("x", _EMPTY)],
  "parallel": [
    ("devices", _EMPTY),
    ("fn", _EMPTY),
    ("args", _VAR),
    ("kwargs", _VAR),
  ],
  "Lowering": [
    ("graph", _EMPTY),
    ("mesh_to_impl", _EMPTY),
    ("autostack", True),
    ("log_file", None),
  ],
  "Mesh": [("graph", _EMPTY), ("name", _EMPTY), ("variable_placer", None)],
  "Tensor": [
    ("operation", _EMPTY),
    ("shape", _EMPTY),
    ("dtype", _EMPTY),
    ("name", None),
    ("index", 0),
  ],
  "Operation": [("inputs", _EMPTY), ("mesh", None), ("name", None)],
  "VariableDType": [
    ("master_dtype", tf.float32),
    ("slice_dtype", None),
    ("activation_dtype", None),
  ],
  "LazyAllreduceSum": [
    ("mesh_impl", _EMPTY),
    ("laid_out_input", _EMPTY),
    ("mesh_axes", _EMPTY),
    ("add_counter_fn", None),
  ],
  "SlicewiseOperation": [
    ("tf_fn", _EMPTY),
    ("inputs", _EMPTY),
    ("output_shapes", _EMPTY),
    ("output_dtypes", _EMPTY),
    ("splittable_dims", _EMPTY),
    ("grad_function", None),
    ("name", None),
  ],
}

# Op families defined in other modules; checked when present.
OPTIONAL_SIGNATURES = {
  "one_hot": [
    ("indices", _EMPTY),
    ("output_dim", _EMPTY),
    ("on_value", 1.0),
    ("off_value", 0.0),
    ("dtype", tf.float32),
    ("name", None),
  ],
  "gather": [
    ("weights", _EMPTY),
    ("indices", _EMPTY),
    ("dim", _EMPTY),
    ("output_shape", None),
  ],
  "shift": [
    ("x", _EMPTY),
    ("offset", _EMPTY),
    ("dim", _EMPTY),
    ("wrap", _EMPTY),
    ("name", None),
  ],
  "concat": [("xs", _EMPTY), ("concat_dim_name", _EMPTY), ("name", None)],
  "split": [
    ("x", _EMPTY),
    ("split_dim", _EMPTY),
    ("num_or_size_splits", _EMPTY),
    ("name", None),
  ],
  "stack": [("xs", _EMPTY), ("dim_name", _EMPTY), ("axis", 0), ("name", None)],
  "unstack": [("x", _EMPTY), ("dim", _EMPTY), ("name", None)],
  "mtf_slice": [
    ("x", _EMPTY),
    ("begin", _EMPTY),
    ("size", _EMPTY),
    ("slice_dim_name", _EMPTY),
    ("name", None),
  ],
  "pad": [
    ("x", _EMPTY),
    ("paddings", _EMPTY),
    ("dim_name", _EMPTY),
    ("name", None),
  ],
  "mtf_range": [
    ("mesh", _EMPTY),
    ("dim", _EMPTY),
    ("dtype", _EMPTY),
    ("name", None),
  ],
  "random_uniform": [("mesh", _EMPTY), ("shape", _EMPTY), ("kwargs", _VAR)],
  "random_normal": [("mesh", _EMPTY), ("shape", _EMPTY), ("kwargs", _VAR)],
  # is_training defaults to True: 0.1.18's dropout (no is_training) dropped.
  "dropout": [
    ("x", _EMPTY),
    ("is_training", True),
    ("keep_prob", None),
    ("rate", None),
    ("noise_shape", None),
    ("name", None),
  ],
  "while_loop": [
    ("cond_fn", _EMPTY),
    ("body_fn", _EMPTY),
    ("inputs", _EMPTY),
    ("num_loop_vars", None),
    ("has_accumulators", False),
    ("kwargs", _VAR),
  ],
  "custom_gradient": [
    ("fn", _EMPTY),
    ("grad_fn", _EMPTY),
    ("explicit_inputs", _EMPTY),
  ],
  "recompute_grad": [
    ("fn", _EMPTY),
    ("explicit_inputs", _EMPTY),
    ("control_dependencies", True),
  ],
  "depend": [("x", _EMPTY), ("dependencies", _EMPTY)],
}


def _params(obj):
  target = obj.__init__ if inspect.isclass(obj) else obj
  params = list(inspect.signature(target).parameters.values())
  if inspect.isclass(obj):
    params = params[1:]  # self
  out = []
  for p in params:
    if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
      out.append((p.name, _VAR))
    elif p.kind == p.KEYWORD_ONLY:
      continue  # Our additions are keyword-only; legacy calls never use them.
    else:
      out.append((p.name, p.default))
  return out


@pytest.mark.parametrize(
  "name", sorted(SIGNATURES) + sorted(OPTIONAL_SIGNATURES)
)
def test_signature_matches_original(name):
  expected = SIGNATURES.get(name) or OPTIONAL_SIGNATURES[name]
  assert hasattr(mtf, name), "mtf.%s is missing" % name
  assert _params(getattr(mtf, name)) == expected


def test_placement_mesh_impl_signature():
  assert _params(placement_mesh_impl.PlacementMeshImpl) == [
    ("shape", _EMPTY),
    ("layout", _EMPTY),
    ("devices", _EMPTY),
  ]


def test_builtin_shadowing_aliases():
  assert mtf.abs is mtf.mtf_abs
  assert mtf.pow is mtf.mtf_pow
  assert mtf.range is mtf.mtf_range
  assert mtf.slice is mtf.mtf_slice


def test_module_paths_of_the_original():
  import mesh_tensorflow.ops as ops  # pylint: disable=g-import-not-at-top
  import mesh_tensorflow.ops_with_redefined_builtins as owrb  # pylint: disable=g-import-not-at-top

  assert ops.einsum is mtf.einsum
  assert owrb.abs is mtf.abs
  assert mtf.tf is tf.compat.v1
  assert callable(mtf.utils.outside_all_rewrites)


def test_submodules_imported_by_the_package():
  # The original's __init__ imported these, so `mtf.layers.dense` etc. work
  # after a bare `import mesh_tensorflow as mtf`.
  for name in [
    "beam_search",
    "layers",
    "optimize",
    "placement_mesh_impl",
    "tpu_variables",
    "utils",
  ]:
    assert inspect.ismodule(getattr(mtf, name, None)), name
  import mesh_tensorflow.test_utils as test_utils  # pylint: disable=g-import-not-at-top

  assert inspect.isclass(test_utils.NumpyConverter)
  assert callable(mtf.layers.dense) and callable(
    mtf.optimize.AdafactorOptimizer
  )
  assert mtf.beam_search.EOS_ID == 1
  # Names the original leaked through `from ops import *`.
  assert mtf.np is np and mtf.xrange is range


def test_transformer_alias_is_the_same_module():
  import mesh_tensorflow.transformer as alias  # pylint: disable=g-import-not-at-top
  import transformer  # pylint: disable=g-import-not-at-top

  assert alias is transformer


def test_public_classes_exist():
  for name in [
    "AddOperation",
    "Assign",
    "BinaryOpWithBroadcasting",
    "BroadcastOperation",
    "ConcatOperation",
    "Constant",
    "CustomGradientOperation",
    "Depend",
    "EinsumOperation",
    "GenericGradOperation",
    "ImportLaidOutTensorOperation",
    "ImportOperation",
    "MinMaxOperation",
    "OneHotOperation",
    "PadOperation",
    "PrintOperation",
    "RandomOperation",
    "RangeOperation",
    "ReadVariable",
    "ReduceOperation",
    "ReshapeOperation",
    "ScalarAddOperation",
    "ScalarMultiplyOperation",
    "ScalarSummaryOperation",
    "ShiftOperation",
    "SliceOperation",
    "SlicewiseOperation",
    "SplitOperation",
    "StackOperation",
    "StackedVariable",
    "StopGradient",
    "UnstackOperation",
    "Variable",
    "WhileLoopOperation",
    "MtfCheckpointSaverListener",
    "MtfRestoreHook",
    "Dimension",
    "Shape",
    "LayoutRules",
    "TensorLayout",
    "Graph",
    "Mesh",
    "Tensor",
    "Operation",
    "Lowering",
    "MeshImpl",
    "LazyAllreduceSum",
    "LazyLaidOutTensor",
    "VariableDType",
    "Conv2dOperation",
    "Conv3dOperation",
    "Conv2dTransposeOperation",
    "Conv3dTransposeOperation",
    "Conv2or3dBackpropInputOperation",
    "Conv2or3dBackpropFilterOperation",
    "PoolOperation",
    "PoolBackPropOperation",
    "TopKOperation",
  ]:
    assert inspect.isclass(getattr(mtf, name, None)), name


def test_tests_run_on_eight_virtual_cpus():
  # Guards tests/conftest.py: without this, "multi-device" tests silently
  # place every processor on one CPU.
  assert len(tf.config.list_logical_devices("CPU")) >= 8
