"""mtf_stdlib_docs: docstring paragraphs of the Python standard library."""

from __future__ import annotations

import ast
import functools
import glob
import os
import sysconfig
from typing import Optional, Tuple
import zlib

import tensorflow_datasets as tfds

from transformer._src.data.offline.builder import OfflineBuilder

__all__ = ["MtfStdlibDocs", "stdlib_paragraphs"]

MIN_CHARS = 40
VALIDATION_PERCENT = 5
_DOC_NODES = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


@functools.lru_cache(maxsize=4)
def stdlib_paragraphs(stdlib_dir: Optional[str] = None) -> Tuple[str, ...]:
  """Distinct docstring paragraphs (>= 40 chars, whitespace collapsed) of the
  top-level modules of the standard library, in file then source order.

  Parsing takes a few seconds, so the result is cached per process.

  Raises:
    ValueError: the standard library sources are not found.
  """
  stdlib_dir = stdlib_dir or sysconfig.get_paths()["stdlib"]
  files = sorted(glob.glob(os.path.join(stdlib_dir, "*.py")))
  if not files:
    raise ValueError("mtf_stdlib_docs: no Python sources in %r" % stdlib_dir)
  seen = set()
  out = []
  for path in files:
    try:
      with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
    except (SyntaxError, UnicodeDecodeError, ValueError):
      continue
    for node in ast.walk(tree):
      if not isinstance(node, _DOC_NODES):
        continue
      doc = ast.get_docstring(node)
      for paragraph in (doc or "").split("\n\n"):
        text = " ".join(paragraph.split())
        if len(text) >= MIN_CHARS and text not in seen:
          seen.add(text)
          out.append(text)
  return tuple(out)


def split_of(text: str) -> str:
  """The split of a paragraph: "validation" for a stable ~5% (by CRC32)."""
  if zlib.crc32(text.encode("utf-8")) % 100 < VALIDATION_PERCENT:
    return "validation"
  return "train"


class MtfStdlibDocs(OfflineBuilder):
  """Language-modelling text: the standard library's docstrings."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release."}

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
      builder=self,
      description=(
        "Docstring paragraphs of the top-level modules of the Python "
        "standard library of the interpreter that generated the data "
        "(present with every Python install; no download). About %d%% "
        "of the paragraphs, chosen by CRC32, form the validation split."
        % VALIDATION_PERCENT
      ),
      features=tfds.features.FeaturesDict({"text": tfds.features.Text()}),
      supervised_keys=("text", "text"),
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # nothing to download
    paragraphs = stdlib_paragraphs()
    return {
      split: self._generate_examples(paragraphs, split)
      for split in ("train", "validation")
    }

  def _generate_examples(self, paragraphs, split):
    for i, text in enumerate(paragraphs):
      if split_of(text) == split:
        yield i, {"text": text}
