"""Mesh TensorFlow for TensorFlow 2."""

import setuptools

# The gin tree lives in configs/ in the repository and is installed as the
# package data of `transformer.gin` (transformer/gin/ in site-packages, where
# utils.config_dir() looks first), as the original shipped it. package_dir
# maps the package onto configs/ so the files exist once; `configs` itself is
# never a top-level package. Editable installs read the repository's configs/.
_GIN_PACKAGE = "transformer.gin"

setuptools.setup(
  name="mesh-tensorflow-tf2",
  version="0.2.0",
  description="Mesh TensorFlow (named-dimension distributed tensors) on TF 2",
  long_description=open("README.md", encoding="utf-8").read(),
  long_description_content_type="text/markdown",
  license="Apache 2.0",
  python_requires=">=3.9",
  packages=setuptools.find_packages(
    include=["mesh_tensorflow*", "transformer*"]
  )
  + [_GIN_PACKAGE],
  package_dir={_GIN_PACKAGE: "configs"},
  # "**" (setuptools >= 62.3) takes every subfolder: layouts/, models/,
  # problems/, demo/, ...
  package_data={_GIN_PACKAGE: ["*.gin", "**/*.gin"]},
  install_requires=[
    "absl-py",
    "gin-config",
    "numpy",
    "tensorflow-datasets",
  ],
  extras_require={
    # tensorflow-cpu on machines without accelerators; users with GPUs
    # install `tensorflow` themselves and skip this extra.
    "cpu": ["tensorflow-cpu>=2.16"],
    "tensorflow": ["tensorflow>=2.16"],
    # mesh_tensorflow.auto_mtf solves with CP-SAT (in a separate process)
    # when ortools is installed, else with its own exact search.
    "auto_mtf": ["ortools"],
    # ruff is pinned to a minor version: `make lint` checks formatting,
    # which may change between ruff's minor versions.
    "test": [
      "pytest",
      "pytest-xdist",
      "pytest-timeout",
      "hypothesis",
      "ruff>=0.17,<0.18",
    ],
  },
)
