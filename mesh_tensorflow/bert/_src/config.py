"""BertConfig: the hyperparameters of a BertModel, read from json."""

from __future__ import annotations

import copy
import json
from typing import Any, Callable, Dict, Optional, Union

import tensorflow as tf

__all__ = ["BertConfig"]

# Names of the fields of Google's BERT json configs that BertConfig calls
# otherwise.
_CONFIG_NAME_ALIASES = {
  "hidden_size": "d_model",
  "num_hidden_layers": "num_blocks",
  "num_attention_heads": "attention_num_heads",
  "intermediate_size": "feedforward_intermediate_size",
  "hidden_act": "feedforward_intermediate_act",
  "hidden_dropout_prob": "layer_output_dropout_prob",
}


class BertConfig:
  """The hyperparameters of a `BertModel`.

  residual_structure "original" normalizes each layer's output after the
  residual sum (post-norm, as the BERT paper); "direct" normalizes each
  layer's input and the final output instead (pre-norm).

  Args:
    vocab_size: size of the word-piece vocabulary of `input_ids`.
    d_model: channels of the input and output of each layer.
    position_signal: "embedding" (learned absolute position embeddings) or
      "relative_attention_bias" (a learned bias per relative-position bucket
      and head).
    max_position_embeddings: the longest sequence the position embeddings
      cover.
    num_blocks: number of blocks in the encoder.
    block_layers: comma-separated layer types of each block, from
      "attention", "feedforward" and "moe".
    layer_output_dropout_prob: dropout rate of each layer's output.
    residual_structure: "original" or "direct" (see above).
    use_bias: whether dense layers and layer norms have biases (and layer norms
      subtract the mean).
    attention_num_heads: number of attention heads.
    attention_head_size: channels per head (default d_model /
      attention_num_heads).
    attention_num_key_heads: number of key heads (for the key_heads_dims
      property).
    attention_key_head_size: channels per key head.
    attention_num_value_heads: number of value heads.
    attention_value_head_size: channels per value head.
    attention_probs_dropout_prob: dropout rate of the attention
      probabilities, kept for compatibility: like the original's, the model
      applies no dropout to them.
    feedforward_intermediate_size: hidden channels of the feed-forward layers.
    feedforward_intermediate_act: activation (name or function) of the
      feed-forward hidden layer, the masked-LM transform and the pooler.
    feedforward_intermediate_dropout_prob: dropout rate of the feed-forward
      hidden layer (kept for compatibility; unused as in the original).
    moe_num_experts: number of experts of a "moe" layer.
    moe_intermediate_size: hidden channels of each expert.
    type_vocab_size: number of token types (segments).
    initializer_range: stddev of the truncated-normal weight initializer; 0 or
      None uses variance scaling instead.

  Raises:
    ValueError: for an unknown position_signal or residual_structure.
  """

  def __init__(
    self,
    vocab_size: Optional[int],
    d_model: int = 768,
    position_signal: str = "embedding",
    max_position_embeddings: int = 512,
    num_blocks: int = 12,
    block_layers: str = "attention,feedforward",
    layer_output_dropout_prob: float = 0.1,
    residual_structure: str = "original",
    use_bias: bool = True,
    attention_num_heads: int = 12,
    attention_head_size: Optional[int] = None,
    attention_num_key_heads: Optional[int] = None,
    attention_key_head_size: Optional[int] = None,
    attention_num_value_heads: Optional[int] = None,
    attention_value_head_size: Optional[int] = None,
    attention_probs_dropout_prob: float = 0.1,
    feedforward_intermediate_size: int = 3072,
    feedforward_intermediate_act: Union[str, Callable] = "gelu",
    feedforward_intermediate_dropout_prob: float = 0.0,
    moe_num_experts: int = 32,
    moe_intermediate_size: int = 6144,
    type_vocab_size: int = 16,
    initializer_range: float = 0.02,
  ):
    if position_signal not in ("embedding", "relative_attention_bias"):
      raise ValueError(
        "unknown position_signal %r: use 'embedding' or "
        "'relative_attention_bias'" % (position_signal,)
      )
    if residual_structure not in ("original", "direct"):
      raise ValueError(
        "unknown residual_structure %r: use 'original' or 'direct'"
        % (residual_structure,)
      )
    self.vocab_size = vocab_size
    self.d_model = d_model
    self.position_signal = position_signal
    self.max_position_embeddings = max_position_embeddings
    self.num_blocks = num_blocks
    self.block_layers = block_layers.split(",")
    self.layer_output_dropout_prob = layer_output_dropout_prob
    self.residual_structure = residual_structure
    self.use_bias = use_bias
    self.attention_probs_dropout_prob = attention_probs_dropout_prob
    self.attention_num_heads = attention_num_heads
    self.attention_head_size = attention_head_size
    self.attention_num_key_heads = attention_num_key_heads
    self.attention_key_head_size = attention_key_head_size
    self.attention_num_value_heads = attention_num_value_heads
    self.attention_value_head_size = attention_value_head_size
    self.feedforward_intermediate_size = feedforward_intermediate_size
    self.feedforward_intermediate_act = feedforward_intermediate_act
    self.feedforward_intermediate_dropout_prob = (
      feedforward_intermediate_dropout_prob
    )
    self.moe_num_experts = moe_num_experts
    self.moe_intermediate_size = moe_intermediate_size
    self.type_vocab_size = type_vocab_size
    self.initializer_range = initializer_range

  @classmethod
  def from_dict(cls, json_object: Dict[str, Any]) -> "BertConfig":
    """A BertConfig from a dict of fields (also Google BERT's field names).

    Args:
      json_object: {field name: value}; "hidden_size", "num_hidden_layers",
        "num_attention_heads", "intermediate_size", "hidden_act" and
        "hidden_dropout_prob" are read as their BertConfig counterparts.

    Returns:
      A BertConfig with the defaults overridden by json_object.
    """
    config = BertConfig(vocab_size=None)
    for key, value in json_object.items():
      setattr(config, _CONFIG_NAME_ALIASES.get(key, key), value)
    if isinstance(config.block_layers, str):
      config.block_layers = config.block_layers.split(",")
    return config

  @classmethod
  def from_json_file(cls, json_file: str) -> "BertConfig":
    """A BertConfig read from a json file (see from_dict).

    Args:
      json_file: path of the json file.

    Returns:
      The BertConfig.
    """
    with tf.io.gfile.GFile(json_file, "r") as f:
      return cls.from_dict(json.loads(f.read()))

  def to_dict(self) -> Dict[str, Any]:
    """The fields as a dict (a deep copy).

    Returns:
      {field name: value}.
    """
    return copy.deepcopy(self.__dict__)

  def to_json_string(self) -> str:
    """The fields as indented json with sorted keys, ending in a newline.

    Returns:
      The json text.
    """
    return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"
