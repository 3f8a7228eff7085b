"""setup.py installs configs/ as the package data of `transformer.gin`.

A copy of the repository (an in-tree build would write build/ and *.egg-info
into the checkout) is built into a wheel offline, with the venv's setuptools.
The wheel must hold every .gin file of configs/ under transformer/gin/ and no
`configs` package. Installed with `pip install --target`, it is imported by a
fresh interpreter that sees only that directory and the venv's third-party
packages (`python -S`: no .pth files, so the editable install of the checkout
cannot shadow it), where utils.config_dir() must be the installed
transformer/gin and gin files must be found there. An editable wheel of the
copy is checked the same way: config_dir() is then the copy's configs/.
"""

import json
import os
import shutil
import site
import subprocess
import sys
import zipfile

import pytest

REPO = os.path.abspath(
  os.path.join(os.path.dirname(__file__), os.pardir, os.pardir)
)
CONFIGS = os.path.join(REPO, "configs")

# Not part of the source tree a wheel is built from.
_SKIP = (
  ".git",
  ".venv",
  "build",
  "dist",
  "tmp",
  ".pytest_cache",
  ".hypothesis",
  "__pycache__",
  "*.egg-info",
  "*.pyc",
)

# Run in the fresh interpreter: where things were imported from, and whether
# the installed gin tree parses (argv[1]: a JSON list of gin files).
_PROBE = r"""
import importlib.util
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
if len(sys.argv) > 2:  # an editable install: process its .pth files
  import site
  # First on the path: the checkout's own editable finder module in the
  # venv has the same name as the one the .pth imports.
  sys.path.insert(0, sys.argv[2])
  site.addsitedir(sys.argv[2])
import gin
import transformer
import transformer.gin
from transformer import utils
from transformer._src.driver import config as driver_config

utils.parse_gin_defaults_and_flags(gin_files=json.loads(sys.argv[1]),
                                   gin_params=[])
print(json.dumps({
    "transformer": transformer.__file__,
    "transformer.gin": transformer.gin.__file__,
    "config_dir": driver_config.config_dir(),
    "model_type": gin.query_parameter("utils.run.model_type"),
    "d_model": gin.query_parameter("d_model/macro.value"),
    "configs_importable": importlib.util.find_spec("configs") is not None,
}))
"""

_GIN_FILES = ["models/tiny.gin", "layouts/single.gin"]


def _gin_files_under(root):
  found = set()
  for dirpath, _, filenames in os.walk(root):
    for name in filenames:
      if name.endswith(".gin"):
        found.add(
          os.path.relpath(os.path.join(dirpath, name), root).replace(
            os.sep, "/"
          )
        )
  return found


def _run(args, cwd, env=None):
  result = subprocess.run(
    args,
    cwd=cwd,
    env=env,
    capture_output=True,
    text=True,
    timeout=300,
    check=False,
  )
  assert result.returncode == 0, "%s failed (%d):\n%s\n%s" % (
    " ".join(args),
    result.returncode,
    result.stdout[-3000:],
    result.stderr[-3000:],
  )
  return result.stdout


def _pip(*args, cwd):
  env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
  return _run([sys.executable, "-m", "pip", *args], cwd=cwd, env=env)


def _probe(tmp_path, python_path, gin_files, site_dir=None):
  """Runs _PROBE with `python -S` in tmp_path; returns its JSON."""
  env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
  env["PYTHONPATH"] = os.pathsep.join(python_path)
  args = [sys.executable, "-S", "-c", _PROBE, json.dumps(gin_files)]
  if site_dir:
    args.append(site_dir)
  out = _run(args, cwd=str(tmp_path), env=env)
  return json.loads(out.strip().splitlines()[-1])


def _third_party_paths():
  """The venv's site-packages (tensorflow, gin, ...), without the checkout."""
  return [p for p in site.getsitepackages() if os.path.isdir(p)]


@pytest.fixture
def source_copy(tmp_path):
  """The checkout's files (each test builds in its own copy)."""
  src = tmp_path / "src"
  shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(*_SKIP))
  return src


def _inside(path, directory):
  return os.path.commonpath(
    [os.path.realpath(path), os.path.realpath(directory)]
  ) == os.path.realpath(directory)


def test_checkout_uses_the_repository_configs():
  from transformer._src.driver import config as driver_config  # pylint: disable=g-import-not-at-top

  assert os.path.realpath(driver_config.config_dir()) == os.path.realpath(
    CONFIGS
  )


@pytest.mark.slow  # ~9 s alone: pip, and TensorFlow in a subprocess
def test_wheel_ships_configs_as_transformer_gin(source_copy, tmp_path):
  wheel_dir = tmp_path / "wheels"
  _pip(
    "wheel",
    "--no-deps",
    "--no-build-isolation",
    "--no-index",
    "-w",
    str(wheel_dir),
    str(source_copy),
    cwd=str(tmp_path),
  )
  wheels = sorted(wheel_dir.glob("*.whl"))
  assert len(wheels) == 1, wheels
  with zipfile.ZipFile(wheels[0]) as zf:
    names = set(zf.namelist())
    top_level = [n for n in names if n.endswith(".dist-info/top_level.txt")]
    assert len(top_level) == 1
    assert set(zf.read(top_level[0]).decode().split()) == {
      "mesh_tensorflow",
      "transformer",
    }

  expected = _gin_files_under(CONFIGS)
  for must in (
    "defaults.gin",
    "layouts/single.gin",
    "models/tiny.gin",
    "problems/lm1b.gin",
    "problems/t2t_ende.gin",
    "learning_rate_schedules/constant.gin",
    "demo/reverse.gin",
  ):
    assert must in expected
  shipped = {
    n[len("transformer/gin/") :]
    for n in names
    if n.startswith("transformer/gin/") and n.endswith(".gin")
  }
  assert shipped == expected
  assert "transformer/gin/__init__.py" in names
  # Each gin file exists once, and there is no `configs` package.
  assert sum(n.endswith(".gin") for n in names) == len(expected)
  assert not [n for n in names if n.split("/")[0] == "configs"]

  target = tmp_path / "site"
  _pip(
    "install",
    "--no-deps",
    "--no-index",
    "--target",
    str(target),
    str(wheels[0]),
    cwd=str(tmp_path),
  )
  assert (target / "transformer" / "gin" / "problems" / "lm1b.gin").is_file()
  result = _probe(
    tmp_path,
    [str(target)] + _third_party_paths(),
    _GIN_FILES + ["problems/lm1b.gin"],
  )
  installed_gin = str(target / "transformer" / "gin")
  assert _inside(result["transformer"], str(target)), result
  assert os.path.realpath(result["config_dir"]) == os.path.realpath(
    installed_gin
  )
  assert _inside(result["transformer.gin"], installed_gin)
  assert result["model_type"] == "lm"  # problems/lm1b.gin, parsed last
  assert result["d_model"] == 128  # models/tiny.gin
  assert not result["configs_importable"]


@pytest.mark.slow  # ~7 s alone
def test_editable_wheel_reads_the_checkout_configs(source_copy, tmp_path):
  """What `pip install -e .` installs: config_dir() is the copy's configs/."""
  wheel_dir = tmp_path / "wheels"
  wheel_dir.mkdir()
  build = (
    "import sys\nfrom setuptools import build_meta\n"
    "print(build_meta.build_editable(sys.argv[1]))\n"
  )
  env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
  name = (
    _run(
      [sys.executable, "-c", build, str(wheel_dir)],
      cwd=str(source_copy),
      env=env,
    )
    .strip()
    .splitlines()[-1]
  )
  target = tmp_path / "site"
  _pip(
    "install",
    "--no-deps",
    "--no-index",
    "--target",
    str(target),
    str(wheel_dir / name),
    cwd=str(tmp_path),
  )
  result = _probe(
    tmp_path, _third_party_paths(), _GIN_FILES, site_dir=str(target)
  )
  assert _inside(result["transformer"], str(source_copy)), result
  assert os.path.realpath(result["config_dir"]) == os.path.realpath(
    str(source_copy / "configs")
  )
  assert result["model_type"] == "bitransformer"
  assert not result["configs_importable"]
