"""The import layering of mesh_tensorflow/_src and transformer/_src.

Read from the source with `ast` (nothing under test is imported), so a
violation is reported even where importing would fail. Checked per tree:
  - no import cycles between modules (function-level imports count too);
  - no `_src` module imports a public facade of its own package;
  - no private name is used across modules (`from m import _x`, `m._x`);
  - transformer/_src: driver -> models, data -> layers (never upwards);
  - mesh_tensorflow/bert/_src, a leaf package above both, uses only the public
    APIs of mesh_tensorflow and transformer (no other package's _src);
  - shapes.py and layout.py import no TensorFlow, not even indirectly.
Each failure names the importing module, the line number and the import.
The checker itself is tested on small synthetic trees.
"""

from __future__ import annotations

import ast
import dataclasses
import pathlib
import textwrap
from typing import Dict, Iterator, List, Optional, Sequence, Set, Tuple

import pytest

_REPO = pathlib.Path(__file__).resolve().parents[1]

# The layers of transformer/_src, as subpackage -> subpackages it must not
# import (driver -> models, data -> layers -> mesh_tensorflow).
TRANSFORMER_FORBIDDEN_IMPORTS = {
  "layers": ("models", "data", "driver"),
  "data": ("models", "driver"),
  "models": ("driver",),
}

# Pure layout math: these modules (and whatever they import) use no TF.
MODULES_WITHOUT_TENSORFLOW = (
  "mesh_tensorflow._src.shapes",
  "mesh_tensorflow._src.layout",
)


@dataclasses.dataclass(frozen=True)
class Import:
  """One imported module (or `module.name`) of one import statement."""

  importer: str  # dotted name of the importing module
  lineno: int
  target: str  # absolute dotted name of the imported module
  name: Optional[str]  # the name taken from it (`from target import name`)
  text: str  # the import statement's source line(s)
  binds: Optional[str] = None  # local name bound to the module `target`

  def describe(self) -> str:
    return "%s:%d: %s" % (self.importer, self.lineno, self.text)


@dataclasses.dataclass(frozen=True)
class Tree:
  """The modules of one `_src` directory."""

  root: pathlib.Path  # directory holding the top-level package
  src_package: str  # e.g. "mesh_tensorflow._src"
  modules: Dict[str, pathlib.Path]

  @property
  def package(self) -> str:
    return self.src_package.split(".")[0]

  @property
  def facade_package(self) -> str:
    """The package whose public modules are this tree's facades."""
    return self.src_package.rpartition("._src")[0]


def load_tree(root: pathlib.Path, src_package: str) -> Tree:
  """Every module of `src_package` (a directory under `root`)."""
  src_dir = root.joinpath(*src_package.split("."))
  modules = {}
  for path in sorted(src_dir.rglob("*.py")):
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
      parts.pop()
    modules[".".join(parts)] = path
  return Tree(root, src_package, modules)


def _is_package(tree: Tree, module: str) -> bool:
  return tree.modules[module].name == "__init__.py"


def _source_lines(node: ast.stmt, lines: Sequence[str]) -> str:
  end = getattr(node, "end_lineno", None) or node.lineno
  return " ".join(l.strip() for l in lines[node.lineno - 1 : end])


def module_imports(tree: Tree, module: str) -> List[Import]:
  """The imports of `module` at any depth (functions, classes, ifs)."""
  source = tree.modules[module].read_text()
  lines = source.splitlines()
  result = []
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      for alias in node.names:
        # `import a.b` binds `a` (to package a); `import a.b as c` binds c.
        target = alias.name if alias.asname else alias.name.split(".")[0]
        result.append(
          Import(
            module,
            node.lineno,
            alias.name,
            None,
            _source_lines(node, lines),
            binds=alias.asname or target,
          )
        )
        if not alias.asname and target != alias.name:
          result.append(
            Import(
              module,
              node.lineno,
              target,
              None,
              _source_lines(node, lines),
              binds=target,
            )
          )
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        package = module.split(".")
        if not _is_package(tree, module):
          package.pop()
        package = package[: len(package) - node.level + 1]
        base = ".".join(package + ([base] if base else []))
      for alias in node.names:
        submodule = base + "." + alias.name
        if submodule in tree.modules or _exists_outside(tree, submodule):
          result.append(
            Import(
              module,
              node.lineno,
              submodule,
              None,
              _source_lines(node, lines),
              binds=alias.asname or alias.name,
            )
          )
        else:
          result.append(
            Import(
              module, node.lineno, base, alias.name, _source_lines(node, lines)
            )
          )
  return result


def _exists_outside(tree: Tree, dotted: str) -> bool:
  """True if `dotted` names a module or package file under tree.root."""
  path = tree.root.joinpath(*dotted.split("."))
  return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _owning_module(tree: Tree, dotted: str) -> Optional[str]:
  """The module of the tree that `dotted` is or is inside, if any."""
  while dotted:
    if dotted in tree.modules:
      return dotted
    dotted = dotted.rpartition(".")[0]
  return None


def import_graph(tree: Tree) -> Dict[str, List[Import]]:
  """module -> its imports of other modules of the tree."""
  graph = {}
  for module in tree.modules:
    edges = []
    for imp in module_imports(tree, module):
      target = _owning_module(tree, imp.target)
      if target is not None and target != module:
        edges.append(imp)
    graph[module] = edges
  return graph


def strongly_connected_components(
  graph: Dict[str, List[Import]],
) -> List[List[str]]:
  """Tarjan's algorithm (iterative); components of two or more modules."""
  index: Dict[str, int] = {}
  low: Dict[str, int] = {}
  on_stack: Set[str] = set()
  stack: List[str] = []
  components = []
  targets = {
    m: sorted({_edge_target(graph, e) for e in edges})
    for m, edges in graph.items()
  }
  for start in sorted(graph):
    if start in index:
      continue
    work: List[Tuple[str, Iterator[str]]] = [(start, iter(targets[start]))]
    index[start] = low[start] = len(index)
    stack.append(start)
    on_stack.add(start)
    while work:
      node, children = work[-1]
      child = next(children, None)
      if child is not None:
        if child not in index:
          index[child] = low[child] = len(index)
          stack.append(child)
          on_stack.add(child)
          work.append((child, iter(targets[child])))
        elif child in on_stack:
          low[node] = min(low[node], index[child])
        continue
      work.pop()
      if work:
        low[work[-1][0]] = min(low[work[-1][0]], low[node])
      if low[node] == index[node]:
        component = []
        while True:
          member = stack.pop()
          on_stack.discard(member)
          component.append(member)
          if member == node:
            break
        if len(component) > 1:
          components.append(sorted(component))
  return components


def _edge_target(graph: Dict[str, List[Import]], imp: Import) -> str:
  target = imp.target
  while target not in graph:
    target = target.rpartition(".")[0]
  return target


def cycle_violations(tree: Tree) -> List[str]:
  """One message per cycle, listing the imports that form it."""
  graph = import_graph(tree)
  messages = []
  for component in strongly_connected_components(graph):
    members = set(component)
    edges = [
      imp.describe()
      for m in component
      for imp in graph[m]
      if _edge_target(graph, imp) in members
    ]
    messages.append(
      "import cycle between %s:\n    %s"
      % (", ".join(component), "\n    ".join(edges))
    )
  return messages


def _forbidden_facades(tree: Tree) -> Tuple[str, ...]:
  """Packages whose non-_src modules are facades for this tree."""
  if tree.package == "transformer":
    # mesh_tensorflow.transformer aliases the transformer facades.
    return ("transformer", "mesh_tensorflow.transformer")
  return (tree.facade_package,)


def _within(dotted: str, package: str) -> bool:
  return dotted == package or dotted.startswith(package + ".")


def facade_violations(tree: Tree) -> List[str]:
  """Imports of a public module of the tree's own package."""
  messages = []
  for module in tree.modules:
    for imp in module_imports(tree, module):
      if _within(imp.target, tree.src_package):
        continue
      for facade_package in _forbidden_facades(tree):
        if _within(imp.target, facade_package):
          messages.append(
            "%s imports the public facade %s (import the _src "
            "module that defines the name): %s"
            % (module, imp.target, imp.describe())
          )
          break
  return messages


def _is_private(name: str) -> bool:
  return name.startswith("_") and not name.startswith("__")


def _is_project_module(tree: Tree, dotted: str) -> bool:
  return (
    _owning_module(tree, dotted) is not None
    or _within(dotted, tree.package)
    or _within(dotted, "mesh_tensorflow")
    or _within(dotted, "transformer")
  )


def private_name_violations(tree: Tree) -> List[str]:
  """`from m import _x` and `m._x` for project modules m."""
  messages = []
  for module, path in tree.modules.items():
    imports = module_imports(tree, module)
    module_aliases = {}
    for imp in imports:
      if not _is_project_module(tree, imp.target):
        continue
      if imp.name is not None:
        if _is_private(imp.name):
          messages.append(
            "%s imports the private name %s of %s: %s"
            % (module, imp.name, imp.target, imp.describe())
          )
        continue
      if imp.binds is not None:
        module_aliases[imp.binds] = imp.target
    source = path.read_text()
    lines = source.splitlines()
    for node in ast.walk(ast.parse(source)):
      if (
        isinstance(node, ast.Attribute)
        and _is_private(node.attr)
        and isinstance(node.value, ast.Name)
        and node.value.id in module_aliases
      ):
        messages.append(
          "%s uses the private name %s of module %s: %s:%d: %s"
          % (
            module,
            node.attr,
            module_aliases[node.value.id],
            module,
            node.lineno,
            lines[node.lineno - 1].strip(),
          )
        )
  return messages


def layer_violations(
  tree: Tree, forbidden: Dict[str, Sequence[str]]
) -> List[str]:
  """Imports from a subpackage of the tree into one it must not import."""
  messages = []
  prefix = tree.src_package + "."
  for module in tree.modules:
    if not module.startswith(prefix):
      continue
    layer = module[len(prefix) :].split(".")[0]
    for imp in module_imports(tree, module):
      if not imp.target.startswith(prefix):
        continue
      target_layer = imp.target[len(prefix) :].split(".")[0]
      if target_layer in forbidden.get(layer, ()):
        messages.append(
          "%s (layer %s) must not import layer %s: %s"
          % (module, layer, target_layer, imp.describe())
        )
  return messages


def tensorflow_violations(tree: Tree, pure_modules: Sequence[str]) -> List[str]:
  """Imports of TensorFlow by pure_modules or any module they import."""
  graph = import_graph(tree)
  messages = []
  for start in pure_modules:
    seen = {start}
    todo = [start]
    while todo:
      module = todo.pop()
      for imp in module_imports(tree, module):
        if _within(imp.target, "tensorflow"):
          via = "" if module == start else " (imported by %s)" % start
          messages.append(
            "%s imports TensorFlow%s: %s" % (module, via, imp.describe())
          )
      for imp in graph[module]:
        target = _edge_target(graph, imp)
        if target not in seen:
          seen.add(target)
          todo.append(target)
  return messages


def other_src_violations(tree: Tree) -> List[str]:
  """Imports of another package's _src modules (its private code)."""
  messages = []
  for module in tree.modules:
    for imp in module_imports(tree, module):
      parts = imp.target.split(".")
      if "_src" in parts and not _within(imp.target, tree.src_package):
        messages.append(
          "%s imports %s, private code of another package (use its public "
          "API): %s" % (module, imp.target, imp.describe())
        )
  return messages


# --------------------------------------------------------------------------
# The real trees.

_MTF = load_tree(_REPO, "mesh_tensorflow._src")
_TRANSFORMER = load_tree(_REPO, "transformer._src")
_BERT = load_tree(_REPO, "mesh_tensorflow.bert._src")

_TREES = [
  pytest.param(_MTF, id="mesh_tensorflow"),
  pytest.param(_TRANSFORMER, id="transformer"),
  pytest.param(_BERT, id="bert"),
]


def _report(messages: List[str]) -> str:
  return "%d violation(s):\n  %s" % (len(messages), "\n  ".join(messages))


def test_trees_are_found():
  assert "mesh_tensorflow._src.graph" in _MTF.modules
  assert "mesh_tensorflow._src.ops.binary" in _MTF.modules
  assert len(_TRANSFORMER.modules) > 5


@pytest.mark.parametrize("tree", _TREES)
def test_no_import_cycles(tree):
  messages = cycle_violations(tree)
  assert not messages, _report(messages)


@pytest.mark.parametrize("tree", _TREES)
def test_src_imports_no_public_facade(tree):
  messages = facade_violations(tree)
  assert not messages, _report(messages)


@pytest.mark.parametrize("tree", _TREES)
def test_no_private_names_across_modules(tree):
  messages = private_name_violations(tree)
  assert not messages, _report(messages)


@pytest.mark.parametrize("tree", [pytest.param(_TRANSFORMER, id="transformer")])
def test_transformer_layers(tree):
  for layer in TRANSFORMER_FORBIDDEN_IMPORTS:
    assert any(
      m.startswith("transformer._src.%s." % layer) for m in tree.modules
    ), "no subpackage transformer/_src/" + layer
  messages = layer_violations(tree, TRANSFORMER_FORBIDDEN_IMPORTS)
  assert not messages, _report(messages)


def test_bert_uses_only_public_apis_of_other_packages():
  assert "mesh_tensorflow.bert._src.model" in _BERT.modules
  messages = other_src_violations(_BERT)
  assert not messages, _report(messages)


def test_layout_math_imports_no_tensorflow():
  for module in MODULES_WITHOUT_TENSORFLOW:
    assert module in _MTF.modules
  messages = tensorflow_violations(_MTF, MODULES_WITHOUT_TENSORFLOW)
  assert not messages, _report(messages)


# --------------------------------------------------------------------------
# The checker on synthetic trees: each violation is found and named.


def _write_tree(root: pathlib.Path, files: Dict[str, str]) -> None:
  for relative, source in files.items():
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source))


@pytest.fixture
def fake_tree(tmp_path):
  """Package `pkg` with a facade and a _src tree full of violations."""
  _write_tree(
    tmp_path,
    {
      "pkg/__init__.py": "from pkg import api\n",
      "pkg/api.py": "from pkg._src.a import f as f\n",
      "pkg/_src/__init__.py": "",
      "pkg/_src/a.py": """\
          from pkg._src import b

          def f():
            return b.g()
          """,
      "pkg/_src/b.py": """\
          def g():
            from pkg._src import a  # a function-level import still counts
            return a
          """,
      "pkg/_src/c.py": """\
          import pkg.api as api
          from pkg import api as api2
          from pkg._src.d import _helper
          from pkg._src import d
          import tensorflow as tf

          def h():
            return d._other() + _helper() + api.f() + api2.f()
          """,
      "pkg/_src/d.py": """\
          from . import e
          import numpy as np

          def _helper():
            return np.zeros(1)._private_of_numpy_is_not_ours

          def _other():
            return 1
          """,
      "pkg/_src/e.py": "import os\n",
      "pkg/_src/sub/__init__.py": "",
      "pkg/_src/sub/f.py": "from .. import c\nfrom ..sub import g\n",
      "pkg/_src/sub/g.py": "",
    },
  )
  return load_tree(tmp_path, "pkg._src")


def test_checker_resolves_relative_imports(fake_tree):
  graph = import_graph(fake_tree)
  assert [i.target for i in graph["pkg._src.d"]] == ["pkg._src.e"]
  assert sorted(i.target for i in graph["pkg._src.sub.f"]) == [
    "pkg._src.c",
    "pkg._src.sub.g",
  ]


def test_checker_finds_cycle_with_function_level_import(fake_tree):
  messages = cycle_violations(fake_tree)
  assert len(messages) == 1
  assert "pkg._src.a, pkg._src.b" in messages[0]
  assert "pkg._src.a:1: from pkg._src import b" in messages[0]
  assert "pkg._src.b:2: from pkg._src import a" in messages[0]


def test_checker_finds_facade_imports(fake_tree):
  messages = facade_violations(fake_tree)
  assert len(messages) == 2, messages
  assert "pkg._src.c:1: import pkg.api as api" in messages[0]
  assert "pkg._src.c:2: from pkg import api as api2" in messages[1]


def test_checker_finds_private_names(fake_tree):
  messages = private_name_violations(fake_tree)
  assert len(messages) == 2, messages
  assert (
    "pkg._src.c imports the private name _helper of pkg._src.d: "
    "pkg._src.c:3: from pkg._src.d import _helper"
  ) in messages
  assert (
    "pkg._src.c uses the private name _other of module pkg._src.d: "
    "pkg._src.c:8:"
  ) in messages[1]


def test_checker_finds_tensorflow_imports_also_indirect(fake_tree):
  assert tensorflow_violations(fake_tree, ["pkg._src.d"]) == []
  messages = tensorflow_violations(fake_tree, ["pkg._src.sub.f"])
  assert messages == [
    "pkg._src.c imports TensorFlow (imported by pkg._src.sub.f): "
    "pkg._src.c:5: import tensorflow as tf"
  ]


def test_checker_finds_layer_violations(tmp_path):
  _write_tree(
    tmp_path,
    {
      "tr/_src/__init__.py": "",
      "tr/_src/layers/__init__.py": "",
      "tr/_src/layers/dense.py": "from tr._src.models import model\n",
      "tr/_src/models/__init__.py": "",
      "tr/_src/models/model.py": "from tr._src.layers import dense\n",
      "tr/_src/driver/__init__.py": "",
      "tr/_src/driver/run.py": "from tr._src.models import model\n",
    },
  )
  tree = load_tree(tmp_path, "tr._src")
  messages = layer_violations(tree, TRANSFORMER_FORBIDDEN_IMPORTS)
  assert messages == [
    "tr._src.layers.dense (layer layers) must not import layer models: "
    "tr._src.layers.dense:1: from tr._src.models import model"
  ]


def test_checker_accepts_a_clean_tree(tmp_path):
  _write_tree(
    tmp_path,
    {
      "pkg/__init__.py": "from pkg._src.low import f\n",
      "pkg/_src/__init__.py": "",
      "pkg/_src/low.py": "def f():\n  return 1\n",
      "pkg/_src/high.py": "from pkg._src import low\nimport other_pkg\n"
      "x = low.f()\ny = other_pkg._private\n",
    },
  )
  tree = load_tree(tmp_path, "pkg._src")
  assert cycle_violations(tree) == []
  assert facade_violations(tree) == []
  assert private_name_violations(tree) == []
  assert tensorflow_violations(tree, ["pkg._src.high"]) == []


def test_checker_finds_imports_of_another_packages_src(tmp_path):
  _write_tree(
    tmp_path,
    {
      "top/__init__.py": "",
      "top/leaf/__init__.py": "",
      "top/leaf/_src/__init__.py": "",
      "top/leaf/_src/a.py": "import top\nfrom top.leaf._src import b\n",
      "top/leaf/_src/b.py": "from top._src.core import f\n",
    },
  )
  tree = load_tree(tmp_path, "top.leaf._src")
  assert tree.facade_package == "top.leaf"
  assert other_src_violations(tree) == [
    "top.leaf._src.b imports top._src.core, private code of another package "
    "(use its public API): top.leaf._src.b:1: from top._src.core import f"
  ]
