"""Model building: the model a gin-configured driver trains (`build_model`)."""

from __future__ import annotations

import gin

from transformer._src.models.bitransformer import make_bi_student_teacher
from transformer._src.models.bitransformer import make_bitransformer
from transformer._src.models.layer_stack import make_layer_stack
from transformer._src.models.unitransformer import Unitransformer

MODEL_TYPES = (
  "bitransformer",
  "bi_student_teacher",
  "lm",
  "delimited_lm",
  "aligned",
)


def build_model(
  model_type: str = "bitransformer",
  input_vocab_size=gin.REQUIRED,
  output_vocab_size=gin.REQUIRED,
  layout_rules=None,
  mesh_shape=None,
):
  """The model of model_type, configured by gin.

  "bitransformer" -> make_bitransformer (gin scopes "encoder"/"decoder");
  "bi_student_teacher" -> make_bi_student_teacher ("student"/"teacher");
  "lm", "delimited_lm" (autoregressive) and "aligned" (not autoregressive)
  -> Unitransformer(layer_stack=make_layer_stack()).

  Example:
    >>> _ = gin.parse_config(["make_layer_stack.layers = [@SelfAttention]",
    ...                       "Unitransformer.max_length = 4"])
    >>> model = build_model("lm", input_vocab_size=16, output_vocab_size=16,
    ...                     layout_rules="batch:batch", mesh_shape="batch:8")
    >>> gin.clear_config()
    >>> type(model).__name__, model.autoregressive
    ('Unitransformer', True)
    >>> model.input_vocab_dim, model.output_vocab_dim  # vocab_divisor=128
    (Dimension(name='vocab', size=128), Dimension(name='vocab', size=128))
    >>> len(model.layer_stack.layers)  # make_layer_stack.num_layers=6
    6

  Args:
    model_type: "bitransformer", "bi_student_teacher", "lm", "delimited_lm" or
      "aligned".
    input_vocab_size: the input vocabulary size (padded up to a multiple of
      vocab_divisor).
    output_vocab_size: the output vocabulary size (likewise).
    layout_rules: the layout rules (string or mtf.LayoutRules).
    mesh_shape: the mesh shape (string or mtf.Shape).

  Returns:
    A Bitransformer, StudentTeacher or Unitransformer.

  Raises:
    ValueError: unknown model_type or a missing vocabulary size.
  """
  if model_type not in MODEL_TYPES:
    raise ValueError(
      "build_model: unknown model_type %r; expected one of %s"
      % (model_type, list(MODEL_TYPES))
    )
  for param, value in (
    ("input_vocab_size", input_vocab_size),
    ("output_vocab_size", output_vocab_size),
  ):
    if value is gin.REQUIRED:
      raise ValueError("build_model: parameter %r is required" % param)
  if model_type == "bitransformer":
    return make_bitransformer(
      input_vocab_size=input_vocab_size,
      output_vocab_size=output_vocab_size,
      mesh_shape=mesh_shape,
      layout=layout_rules,
    )
  if model_type == "bi_student_teacher":
    return make_bi_student_teacher(
      input_vocab_size=input_vocab_size,
      output_vocab_size=output_vocab_size,
      mesh_shape=mesh_shape,
      layout=layout_rules,
    )
  return Unitransformer(
    layer_stack=make_layer_stack(),
    input_vocab_size=input_vocab_size,
    output_vocab_size=output_vocab_size,
    autoregressive=model_type in ("lm", "delimited_lm"),
    mesh_shape=mesh_shape,
    layout=layout_rules,
  )
