"""WordPiece tokenization as BERT's: text -> word pieces -> vocabulary ids.

`FullTokenizer` runs `BasicTokenizer` (cleanup, optional lower-casing and
accent stripping, splitting on whitespace, punctuation and CJK characters)
then `WordpieceTokenizer` (greedy longest-match-first pieces, "##" marking
continuations). Output for a given vocabulary equals Google BERT's.
"""

from __future__ import annotations

import collections
import re
from typing import Iterable, List, Mapping, Optional
import unicodedata

from absl import flags
import tensorflow as tf

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

PRESERVE_UNUSED_TOKENS_FLAG = "preserve_unused_tokens"

_UNUSED_TOKEN = re.compile(r"^\[unused\d+\]$")

_UNCASED_MODELS = (
  "uncased_L-24_H-1024_A-16",
  "uncased_L-12_H-768_A-12",
  "multilingual_L-12_H-768_A-12",
  "chinese_L-12_H-768_A-12",
)
_CASED_MODELS = (
  "cased_L-12_H-768_A-12",
  "cased_L-24_H-1024_A-16",
  "multi_cased_L-12_H-768_A-12",
)

# The CJK Unified Ideographs blocks (not Hangul, Hiragana or Katakana, which
# separate words with spaces).
_CJK_RANGES = (
  (0x4E00, 0x9FFF),
  (0x3400, 0x4DBF),
  (0x20000, 0x2A6DF),
  (0x2A700, 0x2B73F),
  (0x2B740, 0x2B81F),
  (0x2B820, 0x2CEAF),
  (0xF900, 0xFAFF),
  (0x2F800, 0x2FA1F),
)


def _preserve_unused_tokens() -> bool:
  """The --preserve_unused_tokens flag (False when undefined or unparsed)."""
  if PRESERVE_UNUSED_TOKENS_FLAG not in flags.FLAGS:
    return False
  try:
    return bool(flags.FLAGS[PRESERVE_UNUSED_TOKENS_FLAG].value)
  except flags.UnparsedFlagAccessError:
    return False


def preserve_token(token: str, vocab: Mapping[str, int]) -> bool:
  """Whether `token` is kept whole: an "[unusedN]" vocabulary entry.

  Only with --preserve_unused_tokens (default False).

  Args:
    token: a token.
    vocab: the vocabulary ({token: id}).

  Returns:
    True to keep the token as it is.
  """
  if not _preserve_unused_tokens() or token not in vocab:
    return False
  return bool(_UNUSED_TOKEN.search(token))


def validate_case_matches_checkpoint(
  do_lower_case: bool, init_checkpoint: Optional[str]
) -> None:
  """Raises if do_lower_case contradicts a Google BERT checkpoint's name.

  Checkpoints not named like ".../<model>/bert_model.ckpt" of a known
  Google model pass.

  Args:
    do_lower_case: the tokenizer's lower-casing.
    init_checkpoint: the checkpoint path (or None).

  Raises:
    ValueError: for an uncased model with do_lower_case False or a cased one
      with True.
  """
  if not init_checkpoint:
    return
  match = re.match(r"^.*?([A-Za-z0-9_-]+)/bert_model.ckpt", init_checkpoint)
  if match is None:
    return
  model_name = match.group(1)
  if model_name in _UNCASED_MODELS and not do_lower_case:
    given, casing, wanted = "False", "lowercased", "True"
  elif model_name in _CASED_MODELS and do_lower_case:
    given, casing, wanted = "True", "cased", "False"
  else:
    return
  raise ValueError(
    "You passed in `--do_lower_case=%s` with `--init_checkpoint=%s`. "
    "However, `%s` seems to be a %s model, so you should pass in "
    "`--do_lower_case=%s` so that the fine-tuning matches how the model was "
    "pre-training. If this error is wrong, please just comment out this "
    "check." % (given, init_checkpoint, model_name, casing, wanted)
  )


def convert_to_unicode(text) -> str:
  """str as is; bytes decoded as utf-8 (invalid bytes dropped).

  Args:
    text: a str or bytes.

  Returns:
    The str.

  Raises:
    ValueError: for another type.
  """
  if isinstance(text, str):
    return text
  if isinstance(text, bytes):
    return text.decode("utf-8", "ignore")
  raise ValueError("Unsupported string type: %s" % (type(text),))


def printable_text(text) -> str:
  """Text for printing or logging (the same as convert_to_unicode).

  Args:
    text: a str or bytes.

  Returns:
    The str.
  """
  return convert_to_unicode(text)


def load_vocab(vocab_file: str) -> "collections.OrderedDict[str, int]":
  """{token: line number} of a vocabulary file, one token per line.

  Args:
    vocab_file: the file's path.

  Returns:
    An OrderedDict; a repeated token keeps its first id.
  """
  vocab = collections.OrderedDict()
  with tf.io.gfile.GFile(vocab_file, "r") as f:
    for line in f:
      token = convert_to_unicode(line).strip()
      if token not in vocab:
        vocab[token] = len(vocab)
  return vocab


def convert_by_vocab(vocab: Mapping, items: Iterable) -> list:
  """[vocab[item] for item in items] (tokens -> ids or ids -> tokens).

  Args:
    vocab: the mapping.
    items: the keys.

  Returns:
    The list of values.
  """
  return [vocab[item] for item in items]


def convert_tokens_to_ids(vocab: Mapping[str, int], tokens) -> List[int]:
  """The ids of tokens.

  Args:
    vocab: {token: id}.
    tokens: the tokens.

  Returns:
    The ids.
  """
  return convert_by_vocab(vocab, tokens)


def convert_ids_to_tokens(inv_vocab: Mapping[int, str], ids) -> List[str]:
  """The tokens of ids.

  Args:
    inv_vocab: {id: token}.
    ids: the ids.

  Returns:
    The tokens.
  """
  return convert_by_vocab(inv_vocab, ids)


def whitespace_tokenize(text: str) -> List[str]:
  """text split on whitespace (no empty tokens).

  Args:
    text: a str.

  Returns:
    The tokens.
  """
  return text.split()


class FullTokenizer:
  """Basic then WordPiece tokenization over a vocabulary file.

  Args:
    vocab_file: the vocabulary, one token per line (line number = id).
    do_lower_case: lower-case and strip accents first.
  """

  def __init__(self, vocab_file: str, do_lower_case: bool = True):
    self.vocab = load_vocab(vocab_file)
    self.inv_vocab = {index: token for token, index in self.vocab.items()}
    self.basic_tokenizer = BasicTokenizer(
      do_lower_case=do_lower_case, vocab=self.vocab
    )
    self.wordpiece_tokenizer = WordpieceTokenizer(vocab=self.vocab)

  def tokenize(self, text) -> List[str]:
    """The word pieces of text.

    Args:
      text: a str or utf-8 bytes.

    Returns:
      The word-piece tokens.
    """
    pieces = []
    for token in self.basic_tokenizer.tokenize(text):
      if preserve_token(token, self.vocab):
        pieces.append(token)
      else:
        pieces.extend(self.wordpiece_tokenizer.tokenize(token))
    return pieces

  def convert_tokens_to_ids(self, tokens) -> List[int]:
    """The ids of tokens.

    Args:
      tokens: vocabulary tokens.

    Returns:
      Their ids.
    """
    return convert_by_vocab(self.vocab, tokens)

  def convert_ids_to_tokens(self, ids) -> List[str]:
    """The tokens of ids.

    Args:
      ids: vocabulary ids.

    Returns:
      Their tokens.
    """
    return convert_by_vocab(self.inv_vocab, ids)


class BasicTokenizer:
  """Cleanup, optional lower-casing, and splitting on punctuation and CJK.

  Args:
    do_lower_case: lower-case and strip accents.
    vocab: tokens kept whole under --preserve_unused_tokens.
  """

  def __init__(self, do_lower_case: bool = True, vocab=tuple()):
    self.do_lower_case = do_lower_case
    self.vocab = vocab

  def tokenize(self, text) -> List[str]:
    """The basic tokens of text.

    Args:
      text: a str or utf-8 bytes.

    Returns:
      The tokens.
    """
    text = _space_out_cjk(_clean_text(convert_to_unicode(text)))
    tokens = []
    for token in whitespace_tokenize(text):
      if preserve_token(token, self.vocab):
        tokens.append(token)
        continue
      if self.do_lower_case:
        token = _strip_accents(token.lower())
      tokens.extend(_split_on_punctuation(token))
    return whitespace_tokenize(" ".join(tokens))


class WordpieceTokenizer:
  """Greedy longest-match-first word pieces of each whitespace token.

  "unaffable" becomes ["un", "##aff", "##able"] when those are in the
  vocabulary; a word that cannot be covered, or longer than
  max_input_chars_per_word, becomes unk_token.

  Args:
    vocab: the vocabulary (a container of tokens).
    unk_token: the token for words that cannot be split.
    max_input_chars_per_word: longer words become unk_token.
  """

  def __init__(
    self,
    vocab,
    unk_token: str = "[UNK]",
    max_input_chars_per_word: int = 200,
  ):
    self.vocab = vocab
    self.unk_token = unk_token
    self.max_input_chars_per_word = max_input_chars_per_word

  def tokenize(self, text) -> List[str]:
    """The word pieces of each whitespace-separated token of text.

    Args:
      text: basic tokens (BasicTokenizer's output joined by spaces).

    Returns:
      The word pieces.
    """
    output = []
    for word in whitespace_tokenize(convert_to_unicode(text)):
      pieces = self._pieces(word)
      if pieces is None:
        output.append(self.unk_token)
      else:
        output.extend(pieces)
    return output

  def _pieces(self, word: str) -> Optional[List[str]]:
    if len(word) > self.max_input_chars_per_word:
      return None
    pieces = []
    start = 0
    while start < len(word):
      for end in range(len(word), start, -1):
        piece = word[start:end] if start == 0 else "##" + word[start:end]
        if piece in self.vocab:
          break
      else:
        return None
      pieces.append(piece)
      start = end
    return pieces


def _clean_text(text: str) -> str:
  """Drops NUL, U+FFFD and control characters; whitespace becomes " "."""
  output = []
  for char in text:
    if char in ("\0", "\ufffd") or _is_control(char):
      continue
    output.append(" " if _is_whitespace(char) else char)
  return "".join(output)


def _space_out_cjk(text: str) -> str:
  """Surrounds each CJK ideograph with spaces (each is a token)."""
  output = []
  for char in text:
    code = ord(char)
    if any(low <= code <= high for low, high in _CJK_RANGES):
      output.extend((" ", char, " "))
    else:
      output.append(char)
  return "".join(output)


def _strip_accents(text: str) -> str:
  """text without combining marks (after NFD decomposition)."""
  return "".join(
    char
    for char in unicodedata.normalize("NFD", text)
    if unicodedata.category(char) != "Mn"
  )


def _split_on_punctuation(text: str) -> List[str]:
  """Each punctuation character becomes its own token."""
  tokens = []
  new_word = True
  for char in text:
    if _is_punctuation(char):
      tokens.append(char)
      new_word = True
    else:
      if new_word:
        tokens.append("")
      tokens[-1] += char
      new_word = False
  return tokens


def _is_whitespace(char: str) -> bool:
  return char in " \t\n\r" or unicodedata.category(char) == "Zs"


def _is_control(char: str) -> bool:
  if char in "\t\n\r":
    return False
  return unicodedata.category(char) in ("Cc", "Cf")


def _is_punctuation(char: str) -> bool:
  """Unicode punctuation, and every ASCII non-letter, non-digit symbol."""
  code = ord(char)
  if 33 <= code <= 47 or 58 <= code <= 64 or 91 <= code <= 96:
    return True
  if 123 <= code <= 126:
    return True
  return unicodedata.category(char).startswith("P")
