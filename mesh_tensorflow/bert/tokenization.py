"""WordPiece tokenization (FullTokenizer), as Google BERT's.

Defines the flag --preserve_unused_tokens (keep "[unusedN]" vocabulary
entries whole), as the original module did. The code lives in
mesh_tensorflow/bert/_src/tokenization.py.
"""
# pylint: disable=g-importing-member,useless-import-alias

from absl import flags

from mesh_tensorflow.bert._src import flag_util
from mesh_tensorflow.bert._src.tokenization import PRESERVE_UNUSED_TOKENS_FLAG
from mesh_tensorflow.bert._src.tokenization import (
  BasicTokenizer as BasicTokenizer,
)
from mesh_tensorflow.bert._src.tokenization import (
  FullTokenizer as FullTokenizer,
)
from mesh_tensorflow.bert._src.tokenization import (
  WordpieceTokenizer as WordpieceTokenizer,
)
from mesh_tensorflow.bert._src.tokenization import (
  convert_by_vocab as convert_by_vocab,
)
from mesh_tensorflow.bert._src.tokenization import (
  convert_ids_to_tokens as convert_ids_to_tokens,
)
from mesh_tensorflow.bert._src.tokenization import (
  convert_to_unicode as convert_to_unicode,
)
from mesh_tensorflow.bert._src.tokenization import (
  convert_tokens_to_ids as convert_tokens_to_ids,
)
from mesh_tensorflow.bert._src.tokenization import load_vocab as load_vocab
from mesh_tensorflow.bert._src.tokenization import (
  preserve_token as preserve_token,
)
from mesh_tensorflow.bert._src.tokenization import (
  printable_text as printable_text,
)
from mesh_tensorflow.bert._src.tokenization import (
  validate_case_matches_checkpoint as validate_case_matches_checkpoint,
)
from mesh_tensorflow.bert._src.tokenization import (
  whitespace_tokenize as whitespace_tokenize,
)

FLAGS = flags.FLAGS

flag_util.define_flags(
  [
    (
      "bool",
      PRESERVE_UNUSED_TOKENS_FLAG,
      False,
      "If True, words that are [unusedN] entries of the vocabulary are kept "
      "whole instead of being split into word pieces.",
    )
  ],
  __name__,
)

__all__ = [
  "BasicTokenizer",
  "FullTokenizer",
  "WordpieceTokenizer",
  "convert_by_vocab",
  "convert_ids_to_tokens",
  "convert_to_unicode",
  "convert_tokens_to_ids",
  "load_vocab",
  "preserve_token",
  "printable_text",
  "validate_case_matches_checkpoint",
  "whitespace_tokenize",
]
