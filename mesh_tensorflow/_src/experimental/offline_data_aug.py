r"""Writes augmented CT volumes (synthetic lesions) to TFRecord files.

Reads GZIP TFRecords of tf.Examples holding float32 bytes features
"image/ct_image" (raw intensities) and "image/label" (0 background, 1 liver,
2 lesion), maps the intensities to [0, 1] (x / 1024 + 0.5, clipped), applies
data_aug_lib.maybe_gen_fake_data_based_on_real_data and writes each result
to a GZIP TFRecord file of its own, in the same format.

Command line (as in mesh_tensorflow 0.1.21):

  python -m mesh_tensorflow.experimental.offline_data_aug \
      --input_file_pattern='/data/lits/*.tfrecords' --output_folder=/tmp/aug \
      --ct_resolution=128 --num_data_aug=1000 --process_no=0
"""

from __future__ import annotations

import dataclasses
import os
from typing import List, Optional

from absl import flags
import numpy as np
import tensorflow as tf

from mesh_tensorflow._src.experimental import ct_records
from mesh_tensorflow._src.experimental import data_aug_lib
from mesh_tensorflow._src.experimental import dataclass_flags

__all__ = [
  "Options",
  "apply_data_aug",
  "augment",
  "define_flags",
  "main",
  "save_to_tfrecord",
]


@dataclasses.dataclass(frozen=True)
class Options(dataclass_flags.FlagSettings):
  """What apply_data_aug reads and writes: the original's flags.

  Attributes:
    input_file_pattern: the input GZIP TFRecord files (a glob).
    output_folder: the directory of the output files (created if needed).
    output_file_prefix: the output file names' prefix.
    ct_resolution: the size of each axis of the volumes.
    num_data_aug: the number of augmented volumes written.
    process_no: this process's number (in the file names).
    gen_fake_probability: the probability of synthesizing lesions.
    min_fake_lesion_ratio: the smallest fraction of synthetic lesion in the
      liver.
  """

  input_file_pattern: str = ""
  output_folder: str = ""
  output_file_prefix: str = "augmented"
  ct_resolution: int = 128
  num_data_aug: int = 1000
  process_no: Optional[int] = None
  gen_fake_probability: float = 0.50
  min_fake_lesion_ratio: float = 0.05


_FLAG_HELP = {
  "input_file_pattern": "Path to input CT scans.",
  "output_folder": "Path to output folder.",
  "output_file_prefix": "Filename prefix.",
  "ct_resolution": "Resolution of CT images along depth, height and width.",
  "num_data_aug": "The number of data augmentation output.",
  "process_no": "Which process number I am.",
  "gen_fake_probability": "Probability of synthesizing lesions.",
  "min_fake_lesion_ratio": "Minimum amount of synthetic lesion in liver.",
}


def define_flags(flag_values=flags.FLAGS) -> None:
  """Defines the command-line flags (skipping names already defined).

  Args:
    flag_values: the absl FlagValues to define them in.
  """
  dataclass_flags.define(Options, _FLAG_HELP, flag_values)


def _dataset(options: Options) -> tf.data.Dataset:
  """The unbatched dataset of augmented (image, label) volumes."""
  reso = options.ct_resolution

  def parse(serialized):
    image, label = ct_records.decode_example(serialized)
    image = tf.clip_by_value(image / 1024.0 + 0.5, 0, 1)
    image = tf.reshape(image, [reso] * 3)
    label = tf.reshape(label, [reso] * 3)
    return data_aug_lib.maybe_gen_fake_data_based_on_real_data(
      image,
      label,
      reso,
      options.min_fake_lesion_ratio,
      options.gen_fake_probability,
    )

  files = tf.data.Dataset.list_files(options.input_file_pattern, shuffle=True)
  dataset = files.repeat().interleave(
    lambda name: tf.data.TFRecordDataset(name, compression_type="GZIP"),
    cycle_length=1,
  )
  return dataset.shuffle(2).map(parse, num_parallel_calls=2)


def save_to_tfrecord(
  image: np.ndarray,
  label: np.ndarray,
  process_no,
  idx: int,
  output_path: str,
  output_file_prefix: str,
) -> None:
  """Writes one (image, label) pair to <prefix>-<process_no>-<idx>.tfrecords.

  Args:
    image: a float32 numpy array.
    label: a float32 numpy array.
    process_no: the process number (part of the file name).
    idx: the index of the pair (part of the file name).
    output_path: the directory of the file.
    output_file_prefix: the file name's prefix.
  """
  path = _record_path(output_path, output_file_prefix, process_no, idx)
  with tf.io.TFRecordWriter(path, options="GZIP") as writer:
    writer.write(ct_records.encode_example(image, label))


def _record_path(output_path, output_file_prefix, process_no, idx) -> str:
  return os.path.join(
    output_path,
    "{}-{}-{}.tfrecords".format(output_file_prefix, process_no, idx),
  )


def augment(options: Options) -> List[str]:
  """Writes options.num_data_aug augmented volumes (see the module doc).

  Args:
    options: the input, output and augmentation settings.

  Returns:
    the paths of the files written.
  """
  tf.io.gfile.makedirs(options.output_folder)
  paths = []
  dataset = _dataset(options).take(options.num_data_aug)
  for idx, (image, label) in enumerate(dataset.as_numpy_iterator()):
    save_to_tfrecord(
      image,
      label,
      options.process_no,
      idx,
      options.output_folder,
      options.output_file_prefix,
    )
    paths.append(
      _record_path(
        options.output_folder,
        options.output_file_prefix,
        options.process_no,
        idx,
      )
    )
  return paths


def apply_data_aug() -> None:
  """Applies data augmentation and saves the results, as the flags say."""
  augment(Options.from_flags(flags.FLAGS))


def main(argv) -> None:
  """The entry point (absl.app.run(main) after define_flags()).

  Args:
    argv: the command line left after flag parsing (unused).
  """
  del argv
  apply_data_aug()
