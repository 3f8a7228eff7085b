"""Tests for mesh_tensorflow._src.shapes (pure Python, no TensorFlow)."""

import importlib
import importlib.util
import pathlib
import re
import subprocess
import sys
import textwrap
import types

import pytest

_REPO = pathlib.Path(__file__).resolve().parents[1]


def _import_pure(module_name):
  """Imports a pure module of mesh_tensorflow._src, even without TensorFlow.

  mesh_tensorflow/__init__.py imports TensorFlow; when TensorFlow is missing,
  stub the packages so that only the pure modules run.
  """
  if (
    importlib.util.find_spec("tensorflow") is None
    and "mesh_tensorflow" not in sys.modules
  ):
    for name, path in (
      ("mesh_tensorflow", _REPO / "mesh_tensorflow"),
      ("mesh_tensorflow._src", _REPO / "mesh_tensorflow" / "_src"),
    ):
      package = types.ModuleType(name)
      package.__path__ = [str(path)]
      sys.modules[name] = package
  return importlib.import_module(f"mesh_tensorflow._src.{module_name}")


shapes = _import_pure("shapes")
Dimension = shapes.Dimension
Shape = shapes.Shape
# pylint: disable-next=protected-access
parse = shapes.parse_string_to_list_of_pairs


# Grammar.


@pytest.mark.parametrize(
  "s, expected",
  [
    ("", []),
    ("   ", []),
    ("batch:8;model:4", [("batch", "8"), ("model", "4")]),
    ("b1:2.b2:2", [("b1", "2"), ("b2", "2")]),
    ("batch:batch,d_ff:model", [("batch", "batch"), ("d_ff", "model")]),
    (" a:1 \n\tb:2 ,; c:3 ", [("a", "1"), ("b", "2"), ("c", "3")]),
    ("a:1,,b:2", [("a", "1"), ("b", "2")]),
  ],
)
def test_parse_string_to_list_of_pairs(s, expected):
  assert parse(s) == expected


def test_parse_seconds_to_int():
  assert parse("batch:8;model:4", seconds_to_int=True) == [
    ("batch", 8),
    ("model", 4),
  ]
  assert parse("", seconds_to_int=True) == []


@pytest.mark.parametrize(
  "s, token",
  [
    ("batch", "batch"),
    ("batch:8;model", "model"),
    ("a:b:c", "a:b:c"),
    (":8", ":8"),
    ("a:", "a:"),
  ],
)
def test_parse_bad_token_raises(s, token):
  with pytest.raises(ValueError, match=re.escape(f"'{token}' in '{s}'")):
    parse(s)


def test_parse_non_integer_value_raises_when_converting():
  assert parse("batch:x") == [("batch", "x")]
  with pytest.raises(ValueError, match="'batch:x'"):
    parse("batch:x", seconds_to_int=True)


# Dimension.


def test_dimension_is_hashable_namedtuple():
  d = Dimension("a", 2)
  assert d == ("a", 2)
  assert d.name == "a" and d.size == 2
  assert {d: 1}[Dimension("a", 2)] == 1
  assert Dimension("a", 2) != Dimension("a", 3)


@pytest.mark.parametrize(
  "d, expected",
  [
    (None, None),
    (Dimension("a", 2), Dimension("a", 2)),
    (("a", 2), Dimension("a", 2)),
    (["a", 2], Dimension("a", 2)),
  ],
)
def test_convert_to_dimension(d, expected):
  result = shapes.convert_to_dimension(d)
  assert result == expected
  if expected is not None:
    assert isinstance(result, Dimension)


def test_convert_to_dimension_normalizes_integral_sizes():
  class MyInt(int):
    pass

  result = shapes.convert_to_dimension(("a", MyInt(3)))
  assert result == Dimension("a", 3)
  assert result.size.__class__ is int


@pytest.mark.parametrize(
  "d, bad",
  [
    (Dimension(3, 2), "3"),
    (Dimension("a", "2"), "'2'"),
    (Dimension("a", 2.0), "2.0"),
    (Dimension("a", True), "True"),
    (("a", None), "None"),
    ((1, 2), "1"),
    (("a", 2, 3), "'a', 2, 3"),
  ],
)
def test_convert_to_dimension_invalid(d, bad):
  with pytest.raises(ValueError, match=bad):
    shapes.convert_to_dimension(d)


@pytest.mark.parametrize("d", [5, 2.5, object()])
def test_convert_to_dimension_non_pair_raises_type_error(d):
  with pytest.raises(TypeError):
    shapes.convert_to_dimension(d)


# Shape.


def _abc():
  return Shape([Dimension("a", 2), ("b", 3), ["c", 4]])


def test_shape_properties():
  s = _abc()
  assert s.dims == [Dimension("a", 2), Dimension("b", 3), Dimension("c", 4)]
  assert all(isinstance(d, Dimension) for d in s.dims)
  assert s.ndims == 3
  assert s.to_integer_list == [2, 3, 4]
  assert s.size == 24
  assert s.to_string == "Shape[a=2, b=3, c=4]"
  assert repr(s) == str(s) == "Shape[a=2, b=3, c=4]"
  assert s.dimension_names == ["a", "b", "c"]
  assert s.cumprod == [1, 2, 6]


def test_scalar_shape():
  s = Shape([])
  assert s.ndims == 0 and len(s) == 0
  assert s.size == 1
  assert s.cumprod == []
  assert s.to_string == "Shape[]"
  assert s == Shape(()) == []


def test_dims_is_a_copy():
  s = _abc()
  s.dims.append(Dimension("d", 5))
  s.dims[0] = Dimension("z", 1)
  assert s == _abc()


def test_shape_is_unhashable():
  with pytest.raises(TypeError):
    hash(_abc())
  with pytest.raises(TypeError):
    {_abc()}  # pylint: disable=expression-not-assigned


@pytest.mark.parametrize(
  "dims, dup",
  [
    ([("batch", 2), ("batch", 2)], "batch"),
    ([("a", 1), ("b", 2), ("a", 1)], "a"),
  ],
)
def test_duplicate_dimension_raises(dims, dup):
  with pytest.raises(ValueError, match=f"duplicate dimension '{dup}'"):
    Shape(dims)


def test_duplicate_dimension_message():
  with pytest.raises(ValueError) as e:
    Shape([("batch", 2), ("d", 3), ("batch", 2)])
  assert str(e.value) == (
    "Shape has duplicate dimension 'batch': Shape[batch=2, d=3, batch=2]"
  )


def test_one_name_with_two_sizes_is_allowed():
  # As in the original: only a repeated Dimension (name and size) is an error.
  s = Shape([("d_model", 6), ("d_model", 2)])
  assert s.dims == [Dimension("d_model", 6), Dimension("d_model", 2)]
  assert s.dimension_names == ["d_model", "d_model"]
  assert s.get_dim_by_name("d_model") == Dimension("d_model", 6)
  assert s - [Dimension("d_model", 6)] == Shape([("d_model", 2)])


def test_shape_rejects_none_dimension():
  with pytest.raises(ValueError, match="None"):
    Shape([("a", 2), None])


@pytest.mark.parametrize(
  "sizes, value, expected",
  [
    ([2, 3, 4], 1, 0),
    ([2, 3, 4], 2, 1),
    ([2, 3, 4], 6, 2),
    ([2, 3, 4], 24, None),
    ([2, 3, 4], 5, None),
    ([1, 1, 3], 1, 2),  # Largest axis among ties.
    ([2, 1, 3], 2, 2),
  ],
)
def test_cumprod_to_tensor_axis(sizes, value, expected):
  s = Shape([(f"d{i}", n) for i, n in enumerate(sizes)])
  assert s.cumprod_to_tensor_axis(value) == expected


def test_rename_and_resize_dimension():
  s = _abc()
  assert s.rename_dimension("b", "x") == Shape([("a", 2), ("x", 3), ("c", 4)])
  assert s.resize_dimension("b", 7) == Shape([("a", 2), ("b", 7), ("c", 4)])
  assert s.rename_dimension("zz", "x") == s
  assert s.resize_dimension("zz", 7) == s
  assert s == _abc()  # Unchanged.
  with pytest.raises(ValueError, match="duplicate dimension 'a'"):
    Shape([("a", 2), ("b", 2)]).rename_dimension("b", "a")
  assert s.rename_dimension("b", "a").to_string == "Shape[a=2, a=3, c=4]"


def test_get_dim_by_name():
  s = _abc()
  assert s.get_dim_by_name("b") == Dimension("b", 3)
  with pytest.raises(ValueError, match=r"Shape\[a=2, b=3, c=4\].*'zz'"):
    s.get_dim_by_name("zz")


def test_equality():
  s = _abc()
  assert s == _abc()
  assert not s != _abc()  # pylint: disable=unneeded-not
  assert s == [("a", 2), ("b", 3), ("c", 4)]
  assert s == s.dims
  assert s != Shape([("a", 2), ("b", 3)])
  assert s != Shape([("a", 2), ("b", 3), ("c", 5)])
  assert s != Shape([("b", 3), ("a", 2), ("c", 4)])
  assert s != [1, 2, 3]
  assert s != None  # noqa: E711  pylint: disable=singleton-comparison
  assert s != "a:2,b:3,c:4"
  assert s != Dimension("a", 2)


def test_add():
  ab = Shape([("a", 2), ("b", 3)])
  c = Dimension("c", 4)
  assert ab + Shape([c]) == _abc()
  assert ab + [c] == _abc()
  assert ab + [("c", 4)] == _abc()
  assert ab + c == _abc()
  assert isinstance(ab + c, Shape)
  assert [("z", 1)] + ab == Shape([("z", 1), ("a", 2), ("b", 3)])
  assert isinstance([("z", 1)] + ab, Shape)
  assert c + ab == Shape([c, ("a", 2), ("b", 3)])
  assert ab + [] == ab
  with pytest.raises(ValueError, match="duplicate dimension 'a'"):
    ab + Dimension("a", 2)  # pylint: disable=expression-not-assigned
  assert (ab + Dimension("a", 5)).to_string == "Shape[a=2, b=3, a=5]"
  with pytest.raises(TypeError):
    ab + 3  # pylint: disable=expression-not-assigned


def test_sub():
  s = _abc()
  assert s - Dimension("b", 3) == Shape([("a", 2), ("c", 4)])
  assert s - [Dimension("a", 2), Dimension("zz", 1)] == Shape(
    [("b", 3), ("c", 4)]
  )
  assert s - [("a", 2)] == Shape([("b", 3), ("c", 4)])
  assert s - Shape([("c", 4), ("a", 2)]) == Shape([("b", 3)])
  assert s - Shape([("c", 5)]) == s  # Sizes must match too.
  assert s - None == s
  assert s - s == Shape([])
  with pytest.raises(ValueError, match=r"b.*5.*Shape\[a=2, b=3, c=4\]"):
    s - Dimension("b", 5)  # pylint: disable=expression-not-assigned
  with pytest.raises(TypeError):
    s - 3  # pylint: disable=expression-not-assigned


def test_indexing_iteration_contains():
  s = _abc()
  assert len(s) == 3
  assert s[0] == Dimension("a", 2)
  assert s[-1] == Dimension("c", 4)
  assert s[1:] == [Dimension("b", 3), Dimension("c", 4)]
  assert isinstance(s[1:], list)
  assert list(s) == s.dims
  assert [d.name for d in s] == ["a", "b", "c"]
  assert Dimension("b", 3) in s
  assert ("b", 3) in s
  assert Dimension("b", 4) not in s
  assert "b" not in s
  with pytest.raises(IndexError):
    s[3]  # pylint: disable=pointless-statement


# Conversions and helpers.


@pytest.mark.parametrize(
  "x, expected",
  [
    ("batch:8;model:4", [("batch", 8), ("model", 4)]),
    ("b1:2.b2:2", [("b1", 2), ("b2", 2)]),
    ("", []),
    ([], []),
    ([("a", 2), Dimension("b", 3)], [("a", 2), ("b", 3)]),
    ((("a", 2),), [("a", 2)]),
  ],
)
def test_convert_to_shape(x, expected):
  result = shapes.convert_to_shape(x)
  assert isinstance(result, Shape)
  assert result.dims == [Dimension(*d) for d in expected]


def test_convert_to_shape_identity_and_none():
  s = _abc()
  assert shapes.convert_to_shape(s) is s
  assert shapes.convert_to_shape(None) is None
  with pytest.raises(ValueError, match="'batch:x'"):
    shapes.convert_to_shape("batch:x")
  with pytest.raises(ValueError, match="duplicate dimension 'a'"):
    shapes.convert_to_shape("a:2,a:2")


def test_combined_dimension():
  dims = [Dimension("a", 2), Dimension("b", 3)]
  assert shapes.combined_dimension(dims) == Dimension("a", 6)
  assert shapes.combined_dimension(dims, name="ab") == Dimension("ab", 6)
  assert shapes.combined_dimension(_abc()) == Dimension("a", 24)
  assert shapes.combined_dimension([], name="e") == Dimension("e", 1)
  with pytest.raises(ValueError):
    shapes.combined_dimension([])


def test_anonymous_shape():
  assert shapes.anonymous_shape(_abc()) == Shape(
    [("_anonymous_0", 2), ("_anonymous_1", 3), ("_anonymous_2", 4)]
  )
  assert shapes.anonymous_shape("x:5") == Shape([("_anonymous_0", 5)])
  assert shapes.anonymous_shape([]) == Shape([])


@pytest.mark.parametrize(
  "short, long, expected",
  [
    ([], [], True),
    ([], [1, 2], True),
    ([1, 3], [1, 2, 3], True),
    ([1, 2, 3], [1, 2, 3], True),
    ([3, 1], [1, 2, 3], False),
    ([1, 1], [1, 2], False),
    ([1, 1], [1, 2, 1], True),
    ([4], [1, 2, 3], False),
    ([1], [], False),
    ("ac", "abc", True),
  ],
)
def test_is_subsequence(short, long, expected):
  assert shapes.is_subsequence(short, long) is expected


@pytest.mark.parametrize(
  "l, expected", [([], 1), ([5], 5), ([2, 3, 4], 24), ((x for x in [2, 2]), 4)]
)
def test_list_product(l, expected):
  assert shapes.list_product(l) == expected


def test_shapes_module_does_not_import_tensorflow():
  script = textwrap.dedent(f"""
      import importlib, sys, types

      class _BlockTensorFlow:
        def find_spec(self, name, path=None, target=None):
          if name == "tensorflow" or name.startswith("tensorflow."):
            raise ImportError("tensorflow import attempted: " + name)
          return None

      sys.meta_path.insert(0, _BlockTensorFlow())
      package_dir = {str(_REPO / "mesh_tensorflow")!r}
      for name, path in (("mesh_tensorflow", package_dir),
                         ("mesh_tensorflow._src", package_dir + "/_src")):
        package = types.ModuleType(name)
        package.__path__ = [path]
        sys.modules[name] = package
      shapes = importlib.import_module("mesh_tensorflow._src.shapes")
      assert shapes.convert_to_shape("a:2").size == 2
      assert "tensorflow" not in sys.modules, sorted(sys.modules)
      print("ok")
      """)
  result = subprocess.run(
    [sys.executable, "-c", script], capture_output=True, text=True, check=False
  )
  assert result.returncode == 0, result.stderr
  assert result.stdout.strip() == "ok"
