"""mesh_tensorflow.transformer.dataset: input pipelines of token-id features.

A facade over transformer/_src/data/: packing.py (fixed-length examples:
padding, packing, EOS) and sources.py (TFDS, text line, TSV and TFRecord
loaders, encoding). Importing it also registers the offline TFDS builders
(transformer/_src/data/offline/: "mtf_reverse", "mtf_stdlib_docs") and their
`transformer.datasets.get_subword_vocabulary` gin configurable, so gin files
and `tfds.load(name, data_dir=...)` find them without a download.
"""
# pylint: disable=g-importing-member,useless-import-alias

# Registers the offline TFDS builders.
from transformer._src.data import offline  # pylint: disable=unused-import
from transformer._src.data.packing import EOS_ID as EOS_ID
from transformer._src.data.packing import Length as Length
from transformer._src.data.packing import (
  ensure_dataset_eos as ensure_dataset_eos,
)
from transformer._src.data.packing import pack_dataset as pack_dataset
from transformer._src.data.packing import pack_or_pad as pack_or_pad
from transformer._src.data.packing import (
  pad_dataset_with_zeroed_out_examples as pad_dataset_with_zeroed_out_examples,
)
from transformer._src.data.packing import (
  trim_and_pad_dataset as trim_and_pad_dataset,
)
from transformer._src.data.sources import EvalDataset as EvalDataset
from transformer._src.data.sources import (
  encode_all_features as encode_all_features,
)
from transformer._src.data.sources import encode_dataset as encode_dataset
from transformer._src.data.sources import (
  make_text_line_dataset as make_text_line_dataset,
)
from transformer._src.data.sources import (
  packed_parallel_tsv_dataset as packed_parallel_tsv_dataset,
)
from transformer._src.data.sources import (
  pretokenized_t2t_dataset as pretokenized_t2t_dataset,
)
from transformer._src.data.sources import (
  pretokenized_tfds_dataset as pretokenized_tfds_dataset,
)
from transformer._src.data.sources import (
  pretokenized_tfrecord_dataset as pretokenized_tfrecord_dataset,
)
from transformer._src.data.sources import (
  sample_from_text_line_datasets as sample_from_text_line_datasets,
)
from transformer._src.data.sources import (
  simple_text_line_dataset as simple_text_line_dataset,
)
from transformer._src.data.sources import (
  supervised_to_dict as supervised_to_dict,
)
from transformer._src.data.sources import (
  untokenized_tfds_dataset as untokenized_tfds_dataset,
)

__all__ = [
  "EvalDataset",
  "encode_all_features",
  "encode_dataset",
  "ensure_dataset_eos",
  "make_text_line_dataset",
  "pack_dataset",
  "pack_or_pad",
  "packed_parallel_tsv_dataset",
  "pad_dataset_with_zeroed_out_examples",
  "pretokenized_t2t_dataset",
  "pretokenized_tfds_dataset",
  "pretokenized_tfrecord_dataset",
  "sample_from_text_line_datasets",
  "simple_text_line_dataset",
  "supervised_to_dict",
  "trim_and_pad_dataset",
  "untokenized_tfds_dataset",
]
