"""Driver configuration: gin files and flags, dtypes, mesh shapes, batch sizes.

What the gin files configure around a model for the driver: the variable
dtypes, the TPU-style mesh shape, batch size arithmetic, microbatching,
vocabulary selection and checkpoint-loading filters, registered with gin under
the original's `mesh_tensorflow.transformer.utils` names; and how gin files
are found and parsed (`config_dir`, `parse_gin_defaults_and_flags`, the
--gin_file / --gin_param / --gin_location_prefix flags).
"""

from __future__ import annotations

import os
import re
from typing import (
  Callable,
  Dict,
  List,
  Mapping,
  Optional,
  Sequence,
  Tuple,
  Union,
)

from absl import flags
from absl import logging
import gin
import numpy as np
import tensorflow as tf

import mesh_tensorflow as mtf
from transformer._src.data import vocabulary as vocabulary_lib
from transformer._src.driver import checkpoint_names

_GIN_MODULE = "mesh_tensorflow.transformer.utils"

SequenceLength = Union[int, Mapping[str, int]]
# A vocabulary, or an (inputs, targets) pair of them.
Vocabularies = Union[
  vocabulary_lib.Vocabulary,
  Tuple[vocabulary_lib.Vocabulary, vocabulary_lib.Vocabulary],
]


# ----------------------------------------------------------------------------
# Dtypes and mesh shapes.


@gin.configurable(module=_GIN_MODULE)
def get_variable_dtype(
  master_dtype=tf.bfloat16, slice_dtype=tf.float32, activation_dtype=tf.float32
) -> mtf.VariableDType:
  """The VariableDType the driver builds models with.

  Dtypes may be given as tf.DTypes or names ("bfloat16"), so gin files can set
  them without gin.tf. Note the default: masters (= checkpoints) are bfloat16.

  Example:
    >>> dtype = get_variable_dtype(activation_dtype="bfloat16")
    >>> dtype.master_dtype, dtype.slice_dtype, dtype.activation_dtype
    (tf.bfloat16, tf.float32, tf.bfloat16)

  Args:
    master_dtype: the dtype of the stored (checkpointed) variables.
    slice_dtype: the dtype of the per-device variable slices used in the
      computation.
    activation_dtype: the dtype of the activations.

  Returns:
    An mtf.VariableDType.

  Raises:
    ValueError: if a dtype name is not a TensorFlow dtype.
  """
  dtypes = {}
  for what, value in (
    ("master_dtype", master_dtype),
    ("slice_dtype", slice_dtype),
    ("activation_dtype", activation_dtype),
  ):
    try:
      dtypes[what] = tf.as_dtype(value)
    except TypeError as e:
      raise ValueError(
        "get_variable_dtype: %s=%r is not a TensorFlow dtype" % (what, value)
      ) from e
  return mtf.VariableDType(**dtypes)


def _num_cores(tpu_topology: str) -> int:
  """Cores of a TPU topology string.

  "vK-N" -> N; "AxB[xC]" -> A*B[*C] chips times --logical_cores_per_chip
  (default 2).
  """
  if not isinstance(tpu_topology, str):
    raise ValueError(
      "tpu_mesh_shape: tpu_topology must be a string like "
      "'2x2' or 'v3-8', got %r" % (tpu_topology,)
    )
  match = re.fullmatch(r"v\d+[a-z]*-(\d+)", tpu_topology)
  if match:
    num_cores = int(match.group(1))
  else:
    # "4x4_twisted" / "4x4_untwisted" describe wiring, not size.
    match = re.fullmatch(
      r"(\d+(?:x\d+)+)(?:_twisted|_untwisted)?", tpu_topology
    )
    if not match:
      raise ValueError(
        "tpu_mesh_shape: cannot parse tpu_topology %r; expected "
        "'AxB' or 'AxBxC' (chips) or 'v3-N' (N cores)" % tpu_topology
      )
    num_cores = flags.FLAGS["logical_cores_per_chip"].value * int(
      np.prod([int(size) for size in match.group(1).split("x")])
    )
  if num_cores <= 0:
    raise ValueError(
      "tpu_mesh_shape: tpu_topology %r has no cores" % tpu_topology
    )
  return num_cores


@gin.configurable(module=_GIN_MODULE)
def tpu_mesh_shape(
  tpu_topology=gin.REQUIRED,
  model_parallelism=gin.REQUIRED,
  ensemble_parallelism: Optional[int] = None,
) -> mtf.Shape:
  """A mesh shape for data, model and ensemble parallelism on a TPU.

  The cores are split into [ensemble, batch, model] with model size
  model_parallelism, ensemble size ensemble_parallelism and batch the rest;
  dims of size 1 are left out. A list model_parallelism is a
  HierarchicalTiling spec instead.

  Example:
    >>> tpu_mesh_shape("4x4", 8)  # 4x4 chips, 2 cores each: 32 cores
    Shape[batch=4, model=8]
    >>> tpu_mesh_shape("v3-8", 1)
    Shape[batch=8]
    >>> tpu_mesh_shape("2x2", [("batch", None), ("model", [2, 1, 2])])
    Shape[batch=2, model=4]
    >>> tpu_mesh_shape("2x2x4", 4)  # 3-d torus: 16 chips, 2 cores each
    Shape[batch=8, model=4]

  Args:
    tpu_topology: the TPU topology: a string such as "4x4", "2x2x4" (chips
      along each axis, of --logical_cores_per_chip cores each: 2 by
      default, as in the original) or "v3-8" (cores).
    model_parallelism: the size of the "model" mesh dim, or a HierarchicalTiling
      spec (a list of (name, tiling) pairs).
    ensemble_parallelism: the size of the "ensemble" mesh dim (None: no ensemble
      dim).

  Returns:
    An mtf.Shape with (some of) the dims "ensemble", "batch" and "model".

  Raises:
    ValueError: unparsable topology, or sizes that do not divide the cores.
  """
  for param, value in (
    ("tpu_topology", tpu_topology),
    ("model_parallelism", model_parallelism),
  ):
    if value is gin.REQUIRED:
      raise ValueError("tpu_mesh_shape: parameter %r is required" % param)
  num_cores = _num_cores(tpu_topology)
  if isinstance(model_parallelism, (list, tuple)):
    return mtf.simd_mesh_impl.HierarchicalTiling.spec_to_mesh_shape(
      model_parallelism, num_cores
    )
  ensemble = ensemble_parallelism or 1
  for param, value in (
    ("model_parallelism", model_parallelism),
    ("ensemble_parallelism", ensemble),
  ):
    if not isinstance(value, (int, np.integer)) or value < 1:
      raise ValueError(
        "tpu_mesh_shape: %s must be a positive int, got %r" % (param, value)
      )
  if num_cores % (model_parallelism * ensemble):
    raise ValueError(
      "tpu_mesh_shape: model_parallelism %d x ensemble_parallelism %d does "
      "not divide the %d cores of tpu_topology %r"
      % (model_parallelism, ensemble, num_cores, tpu_topology)
    )
  data_parallelism = num_cores // (model_parallelism * ensemble)
  dims = [
    mtf.Dimension(name, int(size))
    for name, size in (
      ("ensemble", ensemble),
      ("batch", data_parallelism),
      ("model", model_parallelism),
    )
    if size > 1
  ]
  return mtf.Shape(dims)


# ----------------------------------------------------------------------------
# Batch sizes and steps.


def _max_sequence_length(sequence_length: SequenceLength, what: str) -> int:
  if isinstance(sequence_length, Mapping):
    if not sequence_length:
      raise ValueError("%s: sequence_length is an empty dict" % what)
    return max(int(v) for v in sequence_length.values())
  return int(sequence_length)


def _batch_replicas(mesh_shape, layout_rules) -> int:
  """Data-parallel replicas: mesh dims that "batch" or "outer_batch" use."""
  mesh_shape = mtf.convert_to_shape(mesh_shape)
  layout_rules = mtf.convert_to_layout_rules(layout_rules)
  replicas = 1
  for mesh_dim in mesh_shape.dims:
    if ("batch", mesh_dim.name) in layout_rules.pairs or (
      "outer_batch",
      mesh_dim.name,
    ) in layout_rules.pairs:
      replicas *= mesh_dim.size
  return replicas


_BATCH_SIZE_METHODS = (
  "sequences_per_batch",
  "tokens_per_batch",
  "sequences_per_replica",
  "tokens_per_replica",
)


def compute_batch_size(
  sequence_length: SequenceLength,
  mesh_shape,
  layout_rules,
  method_and_value: Tuple[str, int],
) -> int:
  """The global batch size (in sequences) from a (method, value) pair.

  Methods: "sequences_per_batch" (value), "tokens_per_batch"
  (value // max length), "sequences_per_replica" (value * replicas),
  "tokens_per_replica" (value * replicas // max length), where replicas is the
  product of the mesh dims "batch" and "outer_batch" are split over.

  Example:
    >>> compute_batch_size({"inputs": 512, "targets": 512}, "batch:8;model:4",
    ...                    "batch:batch;d_ff:model",
    ...                    ("tokens_per_replica", 2048))  # 2048 * 8 // 512
    32

  Args:
    sequence_length: an int, or a {"inputs": n, "targets": m} dict: the feature
      lengths in tokens.
    mesh_shape: an mtf.Shape or a string like "batch:8;model:4".
    layout_rules: an mtf.LayoutRules or a string like "batch:batch".
    method_and_value: a (method, value) pair, e.g. ("tokens_per_replica", 2048).

  Returns:
    The number of sequences per global batch (an int).

  Raises:
    ValueError: unknown method, or a batch size below 1.
  """
  try:
    method, value = method_and_value
  except (TypeError, ValueError) as e:
    raise ValueError(
      "compute_batch_size: method_and_value must be a (method, "
      "value) pair, got %r" % (method_and_value,)
    ) from e
  if method not in _BATCH_SIZE_METHODS:
    raise ValueError(
      "compute_batch_size: unknown method %r; expected one of %s"
      % (method, list(_BATCH_SIZE_METHODS))
    )
  length = _max_sequence_length(sequence_length, "compute_batch_size")
  replicas = _batch_replicas(mesh_shape, layout_rules)
  if method == "sequences_per_batch":
    batch_size = value
  elif method == "tokens_per_batch":
    batch_size = value // length
  elif method == "sequences_per_replica":
    batch_size = value * replicas
  else:
    batch_size = value * replicas // length
  batch_size = int(batch_size)
  if batch_size < 1:
    raise ValueError(
      "compute_batch_size: (%r, %r) gives batch size %d for sequence length "
      "%d and %d replicas" % (method, value, batch_size, length, replicas)
    )
  logging.info(
    "compute_batch_size: (%s, %s) -> %d sequences (sequence length "
    "%d, %d replicas)",
    method,
    value,
    batch_size,
    length,
    replicas,
  )
  return batch_size


@gin.configurable(module=_GIN_MODULE)
def serialize_num_microbatches(
  batch_dim: mtf.Dimension,
  sequence_length: SequenceLength,
  mesh_shape,
  layout_rules,
  tokens_per_microbatch_per_replica=None,
) -> int:
  """How many microbatches to split a training batch into.

  Each replica processes at most tokens_per_microbatch_per_replica tokens at
  a time: the microbatch holds the largest divisor of the per-replica batch
  not above that many sequences (at least one). None/0 -> 1 microbatch.

  Example:
    >>> # 8 sequences of 512 tokens per replica, 4 of them per microbatch:
    >>> serialize_num_microbatches(mtf.Dimension("batch", 64), 512, "batch:8",
    ...                            "batch:batch", 2048)
    2

  Args:
    batch_dim: the mtf batch Dimension of a training batch.
    sequence_length: an int, or a {"inputs": n, "targets": m} dict: the feature
      lengths in tokens.
    mesh_shape: an mtf.Shape or a string like "batch:8".
    layout_rules: an mtf.LayoutRules or a string like "batch:batch".
    tokens_per_microbatch_per_replica: the most tokens a replica processes at a
      time (None or 0: no splitting).

  Returns:
    The number of microbatches (an int >= 1 dividing the batch).
  """
  if not tokens_per_microbatch_per_replica:
    return 1
  batch_per_replica = mtf.tensor_dim_to_size_per_split(
    layout_rules, mesh_shape, batch_dim
  )
  length = _max_sequence_length(sequence_length, "serialize_num_microbatches")
  microbatch_size = max(1, tokens_per_microbatch_per_replica // length)
  microbatch_size = min(microbatch_size, batch_per_replica)
  while batch_per_replica % microbatch_size:
    microbatch_size -= 1
  num_microbatches = batch_per_replica // microbatch_size
  logging.info(
    "serialize_num_microbatches: %d tokens per microbatch per "
    "replica, %d sequences per replica -> %d microbatches",
    tokens_per_microbatch_per_replica,
    batch_per_replica,
    num_microbatches,
  )
  return num_microbatches


@gin.configurable(module=_GIN_MODULE)
def auto_train_steps(
  batch_size: int, sequence_length: SequenceLength, train_tokens: int = 2**36
) -> int:
  """Training steps to see train_tokens tokens.

  Example:
    >>> auto_train_steps(128, 512)  # 2**36 tokens // (128 * 512) tokens/step
    1048576

  Args:
    batch_size: the number of sequences per batch.
    sequence_length: an int, or a {"inputs": n, "targets": m} dict: the feature
      lengths in tokens. The longest counts.
    train_tokens: the number of tokens to train on.

  Returns:
    The number of training steps (an int): train_tokens // (batch_size * longest
    sequence length).
  """
  length = _max_sequence_length(sequence_length, "auto_train_steps")
  return int(train_tokens) // (int(batch_size) * length)


# ----------------------------------------------------------------------------
# Decodes and vocabularies.


@gin.configurable(module=_GIN_MODULE)
def clean_decodes(
  ids, eos_id: int = 1, pad_id: int = 0, length_axis: int = -1
) -> tf.Tensor:
  """ids with every position after the first EOS replaced by pad_id.

  Example:
    >>> clean_decodes([[5, 1, 7, 1, 8]]).numpy()
    array([[5, 1, 0, 0, 0]], dtype=int32)

  Args:
    ids: an int tensor of decoded ids, e.g. [batch, length].
    eos_id: the EOS id.
    pad_id: the id that replaces the positions after the first EOS.
    length_axis: the axis of the sequence positions.

  Returns:
    A tensor of the shape and dtype of `ids`.
  """
  ids = tf.convert_to_tensor(ids)
  eos_before = tf.cumsum(
    tf.cast(tf.equal(ids, eos_id), tf.int32), axis=length_axis, exclusive=True
  )
  return tf.where(tf.equal(eos_before, 0), ids, tf.cast(pad_id, ids.dtype))


def inputs_vocabulary(vocabulary: Vocabularies) -> vocabulary_lib.Vocabulary:
  """The inputs vocabulary of `vocabulary` (the first of a pair).

  Args:
    vocabulary: a Vocabulary, or an (inputs, targets) pair of them.

  Returns:
    The Vocabulary of the "inputs" feature.
  """
  if isinstance(vocabulary, tuple):
    return vocabulary[0]
  return vocabulary


def targets_vocabulary(vocabulary: Vocabularies) -> vocabulary_lib.Vocabulary:
  """The targets vocabulary of `vocabulary` (the second of a pair).

  Args:
    vocabulary: a Vocabulary, or an (inputs, targets) pair of them.

  Returns:
    The Vocabulary of the "targets" feature.
  """
  if isinstance(vocabulary, tuple):
    return vocabulary[1]
  return vocabulary


def maybe_add_pretokenized_features(
  examples: List[Dict[str, np.ndarray]], vocabulary: Vocabularies
) -> List[Dict[str, np.ndarray]]:
  """Adds decoded text of "inputs" and "targets" to examples that lack it.

  For each example (a dict of numpy int arrays) with "inputs" or "targets"
  but no "<name>_pretokenized", sets "<name>_pretokenized" to the decoded
  positive ids and, if there are negative ids, "<name>_neg_pretokenized" to
  the decoded absolute values of those. Zeros (padding) are dropped.

  Example:
    >>> vocab = vocabulary_lib.ByteVocabulary()
    >>> examples = [{"targets": np.array(vocab.encode("hi") + [1, 0])}]
    >>> maybe_add_pretokenized_features(examples, vocab)[0]["targets"]
    array([107, 108,   1,   0])
    >>> examples[0]["targets_pretokenized"]
    'hi'

  Args:
    examples: a list of feature dicts (modified in place).
    vocabulary: a vocabulary or an (inputs, targets) pair of them.

  Returns:
    examples.
  """
  vocabularies = {
    "inputs": inputs_vocabulary(vocabulary),
    "targets": targets_vocabulary(vocabulary),
  }
  warned = set()
  for example in examples:
    for name, vocab in vocabularies.items():
      text_name = name + "_pretokenized"
      if name not in example or text_name in example:
        continue
      ids = example[name].tolist()
      example[text_name] = vocab.decode([i for i in ids if i > 0])
      negative_ids = [-i for i in ids if i < 0]
      if negative_ids:
        example[name + "_neg_pretokenized"] = vocab.decode(negative_ids)
      if name not in warned:
        warned.add(name)
        logging.warning(
          "Feature %r is approximated by decoding the tokenized feature %r.",
          text_name,
          name,
        )
  return examples


@gin.configurable(module=_GIN_MODULE)
def separate_vocabularies(
  inputs: vocabulary_lib.Vocabulary = gin.REQUIRED,
  targets: vocabulary_lib.Vocabulary = gin.REQUIRED,
) -> Tuple[vocabulary_lib.Vocabulary, vocabulary_lib.Vocabulary]:
  """A (inputs, targets) vocabulary pair, for `run.vocabulary` in gin.

  In gin: `run.vocabulary = @separate_vocabularies()` and, e.g.,
  `separate_vocabularies.inputs = @inputs/get_tfds_vocabulary()`.

  Example (gin):
    >>> _ = gin.parse_config('''
    ... separate_vocabularies.inputs = @inputs/vocabulary.ByteVocabulary()
    ... separate_vocabularies.targets = @targets/vocabulary.ByteVocabulary()
    ... ''')
    >>> inputs_vocabulary, targets_vocabulary = separate_vocabularies()
    >>> gin.clear_config()
    >>> type(targets_vocabulary).__name__
    'ByteVocabulary'
    >>> inputs_vocabulary is targets_vocabulary  # one object per scope
    False

  Args:
    inputs: the Vocabulary of the "inputs" feature.
    targets: the Vocabulary of the "targets" feature.

  Returns:
    The (inputs, targets) tuple.

  Raises:
    ValueError: if `inputs` or `targets` is not given.
  """
  for param, value in (("inputs", inputs), ("targets", targets)):
    if value is gin.REQUIRED:
      raise ValueError(
        "separate_vocabularies: parameter %r is required" % param
      )
  return (inputs, targets)


# ----------------------------------------------------------------------------
# Checkpoints.


def get_step_from_checkpoint_path(checkpoint_path: str) -> int:
  """The global step in a `.../model.ckpt-<step>[...]` path.

  Args:
    checkpoint_path: a path such as "/m/model.ckpt-1000" (a suffix like ".index"
      is allowed).

  Returns:
    The step (an int).

  Raises:
    ValueError: if the path names no step.
  """
  match = re.match(r".*model\.ckpt-(\d+)", str(checkpoint_path))
  if match is None:
    raise ValueError(
      "get_step_from_checkpoint_path: %r does not contain "
      "'model.ckpt-<step>'" % (checkpoint_path,)
    )
  return int(match.group(1))


@gin.configurable(module=_GIN_MODULE)
def variable_filter_max_size(v, max_size: float = 1e7) -> bool:
  """Whether variable v (an mtf.Variable or anything with a shape) has at
  most max_size elements; a `variable_filter` for small-variable training.

  Args:
    v: an mtf.Variable or anything with a shape.
    max_size: the largest number of elements allowed.

  Returns:
    True if the variable has at most max_size elements.
  """
  shape = v.shape
  size = (
    shape.size
    if isinstance(shape, mtf.Shape)
    else int(np.prod(tf.TensorShape(shape).as_list()))
  )
  return size <= max_size


@gin.configurable(module=_GIN_MODULE)
def should_load_variable(
  name: str, filter_fn: Optional[Callable[[str], bool]] = None
) -> bool:
  """Whether init_checkpoint should load variable `name` (default: yes).

  Args:
    name: the variable's name.
    filter_fn: a predicate on variable names (None: load every variable).

  Returns:
    True if the variable is to be loaded.
  """
  return True if filter_fn is None else bool(filter_fn(name))


@gin.configurable(module=_GIN_MODULE)
def init_checkpoint_variable_mapping(
  name: str, mapping_fn: Optional[Callable[[str], str]] = None
) -> str:
  """The checkpoint name to load model variable `name` from (default: same).

  Args:
    name: the model variable's name.
    mapping_fn: a function from model variable name to checkpoint variable name
      (None: identity).

  Returns:
    The variable's name in the checkpoint.
  """
  return name if mapping_fn is None else mapping_fn(name)


# The checkpoint-name remapping lives with the checkpoint code; gin knows it
# under the original's utils name.
flexible_ckpt_init_mapping = gin.external_configurable(
  checkpoint_names.flexible_ckpt_init_mapping,
  name="flexible_ckpt_init_mapping",
  module=_GIN_MODULE,
)


# ----------------------------------------------------------------------------
# Gin files and flags.

if "gin_file" not in flags.FLAGS:
  flags.DEFINE_multi_string(
    "gin_file",
    None,
    "gin files (searched under --gin_location_prefix and "
    "the package's configs/); configs/defaults.gin is always parsed first",
  )
  flags.DEFINE_multi_string(
    "gin_param", None, "gin bindings, e.g. 'utils.run.train_steps = 100'"
  )
  flags.DEFINE_list(
    "gin_location_prefix", [], "directories to search gin files in"
  )

try:  # the demo's vocabulary in gin files: @vocabulary.ByteVocabulary()
  gin.external_configurable(
    vocabulary_lib.ByteVocabulary,
    module="mesh_tensorflow.transformer.vocabulary",
  )
except ValueError:  # already registered
  pass


def config_dir() -> str:
  """The directory holding defaults.gin and the gin tree.

  Returns:
    The absolute path of the gin config directory.

  Raises:
    FileNotFoundError: if no defaults.gin is found near the package.
  """
  package_dir = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  )
  for candidate in (
    os.path.join(package_dir, "gin"),
    os.path.join(package_dir, "configs"),
    os.path.join(os.path.dirname(package_dir), "configs"),
  ):
    if os.path.exists(os.path.join(candidate, "defaults.gin")):
      return candidate
  raise FileNotFoundError("cannot find defaults.gin near %s" % package_dir)


def parse_gin_defaults_and_flags(
  skip_unknown=False,
  finalize_config=True,
  *,
  gin_files: Optional[Sequence[str]] = None,
  gin_params: Optional[Sequence[str]] = None,
  gin_location_prefix=None,
) -> None:
  """Parses configs/defaults.gin, then --gin_file files, then --gin_param.

  Files are looked up as given, then under each gin_location_prefix and the
  package's config directory, then on gin's own search path (directories
  that a launcher registered with `gin.add_config_file_search_path`, as the
  original let gin resolve every --gin_file). Missing files and unknown
  bindings raise with the culprit named (gin's own errors, which name file
  and binding).

  Args:
    skip_unknown: ignore bindings of unknown configurables (True, or a list of
      names to ignore).
    finalize_config: lock the gin config after parsing.
    gin_files: the gin files to parse (default: the --gin_file flag's values).
    gin_params: the gin bindings to parse after the files (default: the
      --gin_param flag's values).
    gin_location_prefix: directories to look up relative gin file names in
      (default: the --gin_location_prefix flag's values).

  Raises:
    OSError: a gin file that exists nowhere on the search path.
  """
  if gin_files is None:
    gin_files = flags.FLAGS.gin_file if flags.FLAGS.is_parsed() else None
  if gin_params is None:
    gin_params = flags.FLAGS.gin_param if flags.FLAGS.is_parsed() else None
  if gin_location_prefix is None and flags.FLAGS.is_parsed():
    gin_location_prefix = flags.FLAGS.gin_location_prefix
  prefixes = list(gin_location_prefix or []) + [config_dir()]
  for prefix in prefixes:
    gin.add_config_file_search_path(prefix)
  files = [os.path.join(config_dir(), "defaults.gin")]
  for name in gin_files or []:
    files.append(_find_gin_file(name, prefixes))
  gin.parse_config_files_and_bindings(
    files,
    list(gin_params or []),
    skip_unknown=skip_unknown,
    finalize_config=finalize_config,
  )


def _find_gin_file(name: str, prefixes: Sequence[str]) -> str:
  """The path of gin file `name` under `prefixes`, else `name` for gin.

  A name found nowhere here is handed to gin unchanged: gin looks it up on
  its search path and raises an OSError listing the paths it searched.
  """
  candidates = [name] + [os.path.join(p, name) for p in prefixes]
  if not name.endswith(".gin"):
    candidates += [c + ".gin" for c in candidates]
  for c in candidates:
    if tf.io.gfile.exists(c):
      return c
  return name
