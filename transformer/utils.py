"""mesh_tensorflow.transformer.utils: model building and the training driver.

A facade. What the gin files configure around a model (variable dtypes, the
TPU-style mesh shape, batch sizes, microbatching, vocabulary selection,
checkpoint-loading filters) is in transformer/_src/driver/config.py;
`build_model` in transformer/_src/models/builders.py; the TF2 driver keeps
the original's entry points (`run`, `train_model`, `eval_model`,
`infer_model`, `decode_from_file`, `score_from_strings`, `export_model`) in
transformer/_src/driver/ (an `Estimator` replaces the TPUEstimator).

Importing this module needs no network and no dataset downloads.
"""
# pylint: disable=g-importing-member,useless-import-alias

# Private in the original but used by code written for it (its own tests
# call them through this module), so they keep these names here.
from transformer._src.data.delimited_lm import (
  dynamic_text2self as _dynamic_text2self,  # pylint: disable=unused-import
)
from transformer._src.driver.checkpoint_evaluation import (
  eval_model as eval_model,
)
from transformer._src.driver.checkpoint_evaluation import (
  evaluate_dataset as evaluate_dataset,
)
from transformer._src.driver.checkpoint_iterator import (
  get_checkpoint_iterator as get_checkpoint_iterator,
)
from transformer._src.driver.config import SequenceLength as SequenceLength
from transformer._src.driver.config import auto_train_steps as auto_train_steps
from transformer._src.driver.config import clean_decodes as clean_decodes
from transformer._src.driver.config import (
  compute_batch_size as compute_batch_size,
)
from transformer._src.driver.config import config_dir as config_dir
from transformer._src.driver.config import (
  flexible_ckpt_init_mapping as flexible_ckpt_init_mapping,
)
from transformer._src.driver.config import (
  get_step_from_checkpoint_path as get_step_from_checkpoint_path,
)
from transformer._src.driver.config import (
  get_variable_dtype as get_variable_dtype,
)
from transformer._src.driver.config import (
  init_checkpoint_variable_mapping as init_checkpoint_variable_mapping,
)
from transformer._src.driver.config import (
  inputs_vocabulary as inputs_vocabulary,
)
from transformer._src.driver.config import (
  maybe_add_pretokenized_features as _maybe_add_pretokenized_features,  # pylint: disable=unused-import
)
from transformer._src.driver.config import (
  parse_gin_defaults_and_flags as parse_gin_defaults_and_flags,
)
from transformer._src.driver.config import (
  separate_vocabularies as separate_vocabularies,
)
from transformer._src.driver.config import (
  serialize_num_microbatches as serialize_num_microbatches,
)
from transformer._src.driver.config import (
  should_load_variable as should_load_variable,
)
from transformer._src.driver.config import (
  targets_vocabulary as targets_vocabulary,
)
from transformer._src.driver.config import tpu_mesh_shape as tpu_mesh_shape
from transformer._src.driver.config import (
  variable_filter_max_size as variable_filter_max_size,
)
from transformer._src.driver.decode import decode as decode
from transformer._src.driver.decode import (
  decode_from_dataset as decode_from_dataset,
)
from transformer._src.driver.decode import decode_from_file as decode_from_file
from transformer._src.driver.decode import decode_strings as decode_strings
from transformer._src.driver.decode import infer_model as infer_model
from transformer._src.driver.decode_io import (
  encode_delimited_lm as encode_delimited_lm,
)
from transformer._src.driver.decode_io import encode_inputs as encode_inputs
from transformer._src.driver.decode_io import (
  get_inputs_from_file as get_inputs_from_file,
)
from transformer._src.driver.decode_io import (
  write_lines_to_file as write_lines_to_file,
)
from transformer._src.driver.estimator import Estimator as Estimator
from transformer._src.driver.export import export_model as export_model
from transformer._src.driver.model_fn import metric_max as metric_max
from transformer._src.driver.model_fn import metric_sum as metric_sum
from transformer._src.driver.model_fn import (
  tpu_estimator_model_fn as tpu_estimator_model_fn,
)
from transformer._src.driver.run import run as run
from transformer._src.driver.scoring import (
  compute_log_likelihoods as compute_log_likelihoods,
)
from transformer._src.driver.scoring import save_scores as save_scores
from transformer._src.driver.scoring import (
  save_scores_to_tfrecords as save_scores_to_tfrecords,
)
from transformer._src.driver.scoring import (
  score_from_dataset as score_from_dataset,
)
from transformer._src.driver.scoring import (
  score_from_strings as score_from_strings,
)
from transformer._src.driver.scoring import (
  score_with_estimator as score_with_estimator,
)
from transformer._src.driver.scoring import (
  score_with_estimator_lazy as score_with_estimator_lazy,
)
from transformer._src.driver.step_execution import (
  eager_in_legacy_mode as eager_in_legacy_mode,
)
from transformer._src.driver.train import get_estimator as get_estimator
from transformer._src.driver.train import train_model as train_model
from transformer._src.models.bitransformer import (
  make_bi_student_teacher as make_bi_student_teacher,
)
from transformer._src.models.bitransformer import (
  make_bitransformer as make_bitransformer,
)
from transformer._src.models.builders import MODEL_TYPES as MODEL_TYPES
from transformer._src.models.builders import build_model as build_model
from transformer._src.models.layer_stack import (
  make_layer_stack as make_layer_stack,
)
from transformer._src.models.unitransformer import (
  Unitransformer as Unitransformer,
)

__all__ = [
  "Estimator",
  "auto_train_steps",
  "build_model",
  "clean_decodes",
  "compute_batch_size",
  "compute_log_likelihoods",
  "config_dir",
  "decode",
  "decode_from_dataset",
  "decode_from_file",
  "decode_strings",
  "eager_in_legacy_mode",
  "encode_delimited_lm",
  "encode_inputs",
  "eval_model",
  "evaluate_dataset",
  "export_model",
  "flexible_ckpt_init_mapping",
  "get_checkpoint_iterator",
  "get_estimator",
  "get_inputs_from_file",
  "get_step_from_checkpoint_path",
  "get_variable_dtype",
  "infer_model",
  "init_checkpoint_variable_mapping",
  "inputs_vocabulary",
  "metric_max",
  "metric_sum",
  "parse_gin_defaults_and_flags",
  "run",
  "save_scores",
  "save_scores_to_tfrecords",
  "score_from_dataset",
  "score_from_strings",
  "score_with_estimator",
  "score_with_estimator_lazy",
  "separate_vocabularies",
  "serialize_num_microbatches",
  "should_load_variable",
  "targets_vocabulary",
  "tpu_estimator_model_fn",
  "tpu_mesh_shape",
  "train_model",
  "variable_filter_max_size",
  "write_lines_to_file",
]
