"""Tests for mesh_tensorflow._src.graph: Graph, Mesh, Tensor, Operation."""

import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import mesh_tensorflow as mtf

tf1 = tf.compat.v1

A = mtf.Dimension("a", 4)
B = mtf.Dimension("b", 8)


def _new_mesh(name="mesh"):
  graph = mtf.Graph()
  return graph, mtf.Mesh(graph, name)


# Graph.unique_name.


def test_unique_name_counts_up():
  graph = mtf.Graph()
  assert graph.unique_name("a") == "a"
  assert graph.unique_name("a") == "a_1"
  assert graph.unique_name("a") == "a_2"
  assert graph.unique_name("b") == "b"


def test_unique_name_of_an_already_suffixed_name():
  graph = mtf.Graph()
  assert [graph.unique_name("a") for _ in range(3)] == ["a", "a_1", "a_2"]
  assert graph.unique_name("a_1") == "a_1_1"
  assert graph.unique_name("a_1") == "a_1_2"
  assert graph.unique_name("a") == "a_3"


def test_unique_name_skips_taken_suffixes():
  graph = mtf.Graph()
  assert graph.unique_name("a_1") == "a_1"
  assert graph.unique_name("a") == "a"
  assert graph.unique_name("a") == "a_2"  # a_1 is taken


def test_unique_name_is_case_insensitive():
  graph = mtf.Graph()
  assert graph.unique_name("a") == "a"
  assert graph.unique_name("A") == "A_1"
  assert graph.unique_name("a") == "a_2"
  graph = mtf.Graph()
  assert graph.unique_name("Foo") == "Foo"
  assert graph.unique_name("foo") == "foo_1"


def test_unique_name_without_marking():
  graph = mtf.Graph()
  assert graph.unique_name("b", mark_as_used=False) == "b"
  assert graph.unique_name("b", mark_as_used=False) == "b"
  assert graph.unique_name("b") == "b"
  assert graph.unique_name("b", mark_as_used=False) == "b_1"
  assert graph.unique_name("b") == "b_1"


def test_unique_name_under_variable_scope():
  graph = mtf.Graph()
  with tf1.variable_scope("scope"):
    assert graph.unique_name("a") == "scope/a"
    assert graph.unique_name("a") == "scope/a_1"
    with tf1.variable_scope("inner"):
      assert graph.unique_name("a") == "scope/inner/a"
  assert graph.unique_name("a") == "a"
  with tf1.variable_scope("scope"):
    assert graph.unique_name("a") == "scope/a_2"


def test_operation_names_are_unique():
  graph, mesh = _new_mesh()
  x = mtf.zeros(mesh, [A])
  y1 = mtf.exp(x)
  y2 = mtf.exp(x)
  assert y1.operation.name == "exp"
  assert y2.operation.name == "exp_1"
  with tf1.variable_scope("block"):
    y3 = mtf.exp(x, name="Exp")
  assert y3.operation.name == "block/Exp"
  assert len({op.name for op in graph.operations}) == len(graph.operations)


# Graph bookkeeping.


def test_graph_operations_in_creation_order():
  graph, mesh = _new_mesh()
  assert graph.operations == []
  x = mtf.zeros(mesh, [A])
  y = mtf.exp(x)
  z = y + x
  assert graph.operations == [x.operation, y.operation, z.operation]
  assert graph.to_string.splitlines() == [
    op.to_string for op in graph.operations
  ]
  assert repr(graph) == graph.to_string
  assert graph.trainable_variables == [] and graph.all_variables == []
  assert graph.name_to_variable == {}


def test_captured_variable_scope():
  with tf1.variable_scope("outer"):
    graph = mtf.Graph()
  assert graph.captured_variable_scope.name == "outer"


def test_capture_operations():
  graph, mesh = _new_mesh()
  x = mtf.zeros(mesh, [A])

  def fn():
    return mtf.exp(x) * 2.0

  out, ops = graph.capture_operations(fn)
  assert ops == graph.operations[1:]
  assert out.operation is ops[-1]
  assert len(ops) == 2


def test_mesh_properties():
  graph, mesh = _new_mesh("my_mesh")
  assert mesh.graph is graph
  assert mesh.name == "my_mesh"
  assert mesh.variable_placer_fn == "cpu:0"
  assert "my_mesh" in repr(mesh)

  class Placer:
    def device_function(self, op):
      del op
      return "cpu:1"

  placed = mtf.Mesh(graph, "placed", variable_placer=Placer())
  assert placed.variable_placer_fn(None) == "cpu:1"


# Tensor.


def test_tensor_properties_and_repr():
  graph, mesh = _new_mesh()
  x = mtf.zeros(mesh, [A, B], dtype=tf.int32)
  assert x.shape == mtf.Shape([A, B])
  assert x.size == 32
  assert x.mesh is mesh
  assert x.graph is graph
  assert x.dtype == tf.int32
  assert x.name == "%s:0" % x.operation.name
  assert x.to_string == "Tensor[%s, Shape[a=4, b=8], int32]" % x.name
  assert repr(x) == x.to_string
  assert x.usable
  t = mtf.Tensor(x.operation, [A], "float32", name="custom")
  assert t.name == "custom"
  assert t.dtype == tf.float32
  assert t.shape == mtf.Shape([A])
  t2 = mtf.Tensor(x.operation, "a:4;b:8", tf.bfloat16, index=3)
  assert t2.name == "%s:3" % x.operation.name
  assert t2.shape == mtf.Shape([A, B])


def test_tensor_operators_and_hashing():
  _, mesh = _new_mesh()
  x = mtf.ones(mesh, [A])
  y = mtf.ones(mesh, [A])
  for result in (
    x + y,
    x - y,
    x * y,
    x / y,
    x // y,
    x % y,
    -x,
    1.0 + x,
    1.0 - x,
    2.0 * x,
    2.0 / x,
    3.0 // x,
    3.0 % x,
  ):
    assert isinstance(result, mtf.Tensor)
  # Identity hashing and equality: usable as dict keys.
  assert x != y
  assert x == x  # pylint: disable=comparison-with-itself
  assert {x: 1, y: 2}[y] == 2
  with pytest.raises(TypeError):
    _ = x**2
  with pytest.raises(TypeError):
    _ = x < y


def test_operators_and_graph_rewrites_are_registered_by_their_modules():
  # mesh_tensorflow/__init__ imports everything; stub the packages so that
  # graph.py is imported alone, then the modules that register.
  package_dir = pathlib.Path(__file__).resolve().parents[1] / "mesh_tensorflow"
  script = textwrap.dedent(f"""
      import importlib, sys, types
      for name, path in (("mesh_tensorflow", {str(package_dir)!r}),
                         ("mesh_tensorflow._src",
                          {str(package_dir / "_src")!r})):
        package = types.ModuleType(name)
        package.__path__ = [path]
        sys.modules[name] = package
      graph_lib = importlib.import_module("mesh_tensorflow._src.graph")
      graph = graph_lib.Graph()
      mesh = graph_lib.Mesh(graph, "mesh")
      x = graph_lib.Tensor(graph_lib.Operation([], mesh), [("a", 2)],
                           "float32")
      try:
        x + 1
        raise AssertionError("an operator worked before registration")
      except NotImplementedError as e:
        assert "mesh_tensorflow._src.ops.binary" in str(e), e
      try:
        graph.combine_assignments([])
        raise AssertionError("combine_assignments worked unregistered")
      except NotImplementedError as e:
        assert "mesh_tensorflow._src.variables" in str(e), e
      try:
        graph_lib.register_tensor_operators({{"power": pow}})
        raise AssertionError("an unknown operator name was accepted")
      except ValueError as e:
        assert "'power'" in str(e), e
      importlib.import_module("mesh_tensorflow._src.ops.binary")
      importlib.import_module("mesh_tensorflow._src.lowering")
      for y, op_type in ((x + 1, "ScalarAddOperation"),
                         (1 - x, "ScalarAddOperation"),
                         (x * x, "EinsumOperation"),
                         (1 / x, "EinsumOperation"),
                         (x / 2, "ScalarMultiplyOperation"),
                         (x // 2, "BinaryOpWithBroadcasting"),
                         (3 % x, "BinaryOpWithBroadcasting"),
                         (-x, "SlicewiseOperation")):
        assert type(y.operation).__name__ == op_type, (y, op_type)
      assert graph.combine_assignments([]) == []
      graph.rewrite_stack_variables()
      assert graph.stacked_variables_rewritten
      print("ok")
      """)
  result = subprocess.run(
    [sys.executable, "-c", script], capture_output=True, text=True, check=False
  )
  assert result.returncode == 0, result.stderr
  assert result.stdout.strip().endswith("ok")


def test_clone_operations_shares_variables():
  graph, mesh = _new_mesh()
  v = mtf.get_variable(mesh, "v", [A])
  n = len(graph.operations)
  y = v * 2.0 + 1.0
  forward = [v.operation] + graph.operations[n:]
  new_ops, mapping = graph.clone_operations(forward, {})
  assert v.operation.shared_by_clones
  assert v.operation not in new_ops and v not in mapping
  assert len(new_ops) == len(forward) - 1
  assert mapping[y] is not y and mapping[y].operation in graph.operations
  assert mapping[y].operation.inputs[0].operation in new_ops


def test_shape_with_duplicate_dimensions_raises():
  with pytest.raises(ValueError, match="'a'"):
    mtf.Shape([A, mtf.Dimension("a", A.size)])
  with pytest.raises(ValueError, match="'a'"):
    mtf.convert_to_shape("a:2;a:2")
  # One name with two sizes is two dimensions, as in the original.
  assert mtf.convert_to_shape("a:2;a:3").to_integer_list == [2, 3]
  _, mesh = _new_mesh()
  with pytest.raises(ValueError, match="'a'"):
    mtf.zeros(mesh, [A, A])


# Operation.


class _TwoOutputs(mtf.Operation):
  def __init__(self, x, name=None):
    super().__init__([x], name=name or "two_outputs")
    self._outputs = [
      mtf.Tensor(self, x.shape, x.dtype),
      mtf.Tensor(self, [B], tf.int32, index=1),
    ]


def test_operation_properties():
  graph, mesh = _new_mesh()
  x = mtf.zeros(mesh, [A])
  op = _TwoOutputs(x)
  assert op.graph is graph
  assert op.mesh is mesh
  assert op.name == "two_outputs"
  assert op.inputs == [x]
  assert [t.name for t in op.outputs] == ["two_outputs:0", "two_outputs:1"]
  assert op.to_string == (
    "_TwoOutputs[Inputs=(%s) Outputs=(%s, %s)]"
    % (x.to_string, op.outputs[0].to_string, op.outputs[1].to_string)
  )
  assert repr(op) == op.to_string
  # inputs / outputs are copies.
  op.inputs.append(x)
  op.outputs.pop()
  assert len(op.inputs) == 1 and len(op.outputs) == 2
  assert op.has_gradient
  with pytest.raises(NotImplementedError):
    op.gradient([None, None])
  with pytest.raises(NotImplementedError):
    op.lower(None)


def test_has_gradient_needs_float_input_and_output():
  _, mesh = _new_mesh()
  f = mtf.zeros(mesh, [A])
  i = mtf.zeros(mesh, [A], dtype=tf.int32)
  assert mtf.exp(f).operation.has_gradient
  assert not mtf.to_int32(f).operation.has_gradient
  assert not mtf.to_float(i).operation.has_gradient
  assert not mtf.cast(i, tf.int64).operation.has_gradient
  assert not f.operation.has_gradient  # no inputs


def test_splittable_dims_bookkeeping():
  _, mesh = _new_mesh()
  x = mtf.zeros(mesh, [A, B])
  op = _TwoOutputs(x)
  # Default: every dim of every input and output is splittable.
  assert op.splittable_dims == frozenset(["a", "b"])
  assert op.unsplittable_dims == frozenset()
  s, u = op._initialize_splittable_and_unsplittable_dims(  # pylint: disable=protected-access
    "unsplittable", ["b"]
  )
  assert (s, u) == (frozenset(["b"]), frozenset(["a"]))
  assert op.splittable_dims == frozenset(["b"])
  assert op.unsplittable_dims == frozenset(["a"])
  s, u = op._initialize_splittable_and_unsplittable_dims(  # pylint: disable=protected-access
    "splittable", ["a"]
  )
  assert (s, u) == (frozenset(["b"]), frozenset(["a"]))
  s, u = op._initialize_all_dimensions_as_splittable()  # pylint: disable=protected-access
  assert (s, u) == (frozenset(["a", "b"]), frozenset())
  with pytest.raises(ValueError, match="sometimes"):
    op._initialize_splittable_and_unsplittable_dims("sometimes")  # pylint: disable=protected-access


def test_splittable_dims_of_library_ops():
  _, mesh = _new_mesh()
  x = mtf.zeros(mesh, [A, B])
  assert mtf.einsum([x, x], output_shape=[A]).operation.splittable_dims == (
    frozenset(["a", "b"])
  )
  assert mtf.reshape(
    x, [mtf.Dimension("ab", 32)]
  ).operation.splittable_dims == (frozenset(["a", "b", "ab"]))
  sw = mtf.slicewise(tf.identity, [x], splittable_dims=[A])
  assert sw.operation.unsplittable_dims == frozenset(["b"])


def test_operation_input_errors():
  graph, mesh = _new_mesh()
  x = mtf.zeros(mesh, [A])
  with pytest.raises(TypeError, match="mtf Tensors"):
    mtf.Operation([x, np.zeros(4)])
  with pytest.raises(ValueError, match="mesh"):
    mtf.Operation([])
  other_mesh = mtf.Mesh(graph, "other")
  y = mtf.zeros(other_mesh, [A])
  with pytest.raises(ValueError, match="mixes meshes"):
    _ = x + y
  hidden = mtf.exp(x)
  hidden.usable = False
  with pytest.raises(ValueError, match=hidden.name):
    mtf.exp(hidden)
