"""`mesh_tensorflow.transformer[.X]` is `transformer[.X]`, reload included.

Each test runs in a fresh interpreter: which modules are already imported
matters, and reloading re-executes gin registrations. An audit hook counts
how often each module file's top-level code runs, so "the very same module"
is checked as "executed once", for every module in the tree (found by
walking the package, not from a list).
"""

import json
import os
import subprocess
import sys
import textwrap

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_PRELUDE = """
import collections, importlib, json, os, pkgutil, sys

EXECUTED = collections.Counter()


def _count_module_bodies(event, args):
  code = args[0] if event == "exec" and args else None
  if getattr(code, "co_name", None) == "<module>":
    EXECUTED[os.path.relpath(code.co_filename)] += 1


sys.addaudithook(_count_module_bodies)
"""


def _run(body: str) -> dict:
  """Runs the prelude + `body` (which prints one JSON line) in a subprocess."""
  env = dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="3")
  result = subprocess.run(
    [sys.executable, "-c", _PRELUDE + textwrap.dedent(body)],
    cwd=REPO,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
    check=False,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  return json.loads(result.stdout.strip().splitlines()[-1])


def test_every_submodule_is_the_same_object_executed_once():
  out = _run("""
    import mesh_tensorflow.transformer as alias
    import transformer
    assert alias is transformer
    checked, problems = [], []
    # walk_packages imports each subpackage by its alias name.
    for info in pkgutil.walk_packages(alias.__path__,
                                      "mesh_tensorflow.transformer."):
      alias_name = info.name
      real_name = alias_name[len("mesh_tensorflow."):]
      by_alias = importlib.import_module(alias_name)
      by_real = importlib.import_module(real_name)
      parent_name, _, leaf = alias_name.rpartition(".")
      parent = importlib.import_module(parent_name)
      exec("from %s import %s as by_from" % (parent_name, leaf))
      same = (by_alias is by_real is sys.modules[alias_name]
              is sys.modules[real_name] is getattr(parent, leaf) is by_from)
      if not same or by_alias.__spec__.name != real_name:
        problems.append(alias_name)
      checked.append(real_name)
    files = [f for f in EXECUTED if f.startswith("transformer" + os.sep)]
    print(json.dumps({
        "checked": checked, "problems": problems,
        "files": files,
        "not_once": {f: n for f, n in EXECUTED.items()
                     if f in files and n != 1}}))
  """)
  assert not out["problems"]
  assert not out["not_once"]
  # Public, research, nested private and data modules are all covered.
  for name in [
    "transformer.utils",
    "transformer.adaptive_softmax",
    "transformer.main",
    "transformer._src.data.offline.reverse",
    "transformer._src.driver.estimator",
  ]:
    assert name in out["checked"], name
  # Every module file in the tree was imported (and executed once).
  assert len(out["files"]) >= len(out["checked"])


def test_on_demand_module_imported_by_alias_is_shared():
  out = _run("""
    import mesh_tensorflow.transformer
    before = "transformer.funnel_transformer" in sys.modules
    import mesh_tensorflow.transformer.funnel_transformer as by_alias
    from transformer import funnel_transformer as by_real
    import transformer
    print(json.dumps({
        "before": before,
        "same": by_alias is by_real
                is mesh_tensorflow.transformer.funnel_transformer
                is transformer.funnel_transformer,
        "spec": by_alias.__spec__.name,
        "runs": EXECUTED[os.path.join("transformer",
                                      "funnel_transformer.py")]}))
  """)
  assert out == {
    "before": False,
    "same": True,
    "spec": "transformer.funnel_transformer",
    "runs": 1,
  }


def test_gin_binding_by_alias_selector_configures_the_one_function():
  out = _run("""
    import gin
    import mesh_tensorflow.transformer.learning_rate_schedules as alias_lrs
    import transformer.learning_rate_schedules as lrs
    gin.parse_config(
        "mesh_tensorflow.transformer.learning_rate_schedules."
        "product_learning_rate.factors = [0.25]")
    print(json.dumps({"same": alias_lrs is lrs,
                      "rate": float(lrs.product_learning_rate(1, 10))}))
  """)
  assert out == {"same": True, "rate": 0.25}


def test_reload_by_either_name_reexecutes_the_module():
  out = _run("""
    import gin
    import mesh_tensorflow.transformer.adaptive_softmax as by_alias
    import transformer.adaptive_softmax as by_real
    # Re-executing a module re-registers its gin configurables.
    gin.enter_interactive_mode()
    path = os.path.join("transformer", "adaptive_softmax.py")
    runs = [EXECUTED[path]]
    by_alias.AdaptiveSoftmaxVocabEmbedding = None
    reloaded = importlib.reload(by_alias)
    runs.append(EXECUTED[path])
    restored = [reloaded.AdaptiveSoftmaxVocabEmbedding is not None]
    by_real.AdaptiveSoftmaxVocabEmbedding = None
    real = sys.modules["transformer.adaptive_softmax"]
    reloaded_again = importlib.reload(real)
    runs.append(EXECUTED[path])
    restored.append(reloaded_again.AdaptiveSoftmaxVocabEmbedding is not None)
    # A nested private module, reloaded by its alias name.
    import mesh_tensorflow.transformer._src.driver.estimator as driver
    driver_path = os.path.join("transformer", "_src", "driver", "estimator.py")
    driver_runs = [EXECUTED[driver_path]]
    importlib.reload(driver)
    driver_runs.append(EXECUTED[driver_path])
    print(json.dumps({
        "runs": runs, "restored": restored, "driver_runs": driver_runs,
        "same": (reloaded is reloaded_again is by_alias is by_real is
                 sys.modules["mesh_tensorflow.transformer.adaptive_softmax"]),
        "spec": by_alias.__spec__.name}))
  """)
  assert out == {
    "runs": [1, 2, 3],
    "restored": [True, True],
    "driver_runs": [1, 2],
    "same": True,
    "spec": "transformer.adaptive_softmax",
  }


def test_unknown_submodule_is_not_found():
  out = _run("""
    import importlib.util
    import mesh_tensorflow.transformer
    try:
      import mesh_tensorflow.transformer.no_such_module
      error = None
    except ModuleNotFoundError as e:
      error = e.name
    print(json.dumps({
        "error": error,
        "spec": importlib.util.find_spec(
            "mesh_tensorflow.transformer.no_such_module")}))
  """)
  assert out == {
    "error": "mesh_tensorflow.transformer.no_such_module",
    "spec": None,
  }
