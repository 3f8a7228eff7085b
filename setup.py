"""Mesh TensorFlow for TensorFlow 2."""

import setuptools

setuptools.setup(
    name="mesh-tensorflow-tf2",
    version="0.2.0",
    description="Mesh TensorFlow (named-dimension distributed tensors) on TF 2",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache 2.0",
    python_requires=">=3.9",
    packages=setuptools.find_packages(include=["mesh_tensorflow*", "transformer*"]),
    package_data={"": ["*.gin"]},
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
        "test": ["pytest", "pytest-xdist", "hypothesis"],
    },
)
