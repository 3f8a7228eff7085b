r"""Command line entry point: `python -m transformer.main --gin_file=... `.

Parses configs/defaults.gin, the --gin_file files and --gin_param bindings,
writes the command line and (after the run) operative_config.gin into
--model_dir, and calls utils.run with the flags' values.

A run on 4 virtual CPUs, training the demo model for 100 steps:

  python -m transformer.main --mesh_devices=4 --model_dir=/tmp/demo \\
      --gin_file=demo/reverse.gin --gin_param="utils.run.train_steps = 100"

Example (the flags that command line sets, parsed into a copy of FLAGS):
  >>> import copy
  >>> flag_values = copy.deepcopy(FLAGS)
  >>> _ = flag_values(["transformer.main", "--mesh_devices=4",
  ...                  "--model_dir=/tmp/demo", "--gin_file=demo/reverse.gin",
  ...                  "--gin_param=utils.run.train_steps = 100"])
  >>> flag_values.mesh_devices, flag_values.model_dir
  (4, '/tmp/demo')
  >>> flag_values.gin_file, flag_values.gin_param
  (['demo/reverse.gin'], ['utils.run.train_steps = 100'])
"""

from __future__ import annotations

import importlib
import os
import sys

from absl import app
from absl import flags

from transformer._src import quiet

flags.DEFINE_string(
  "tpu_job_name", None, "job name of the Cloud TPU workers (default: worker)"
)
flags.DEFINE_string(
  "model_dir",
  "/tmp/transformer_standalone",
  "directory for checkpoints, summaries and configs",
)
flags.DEFINE_string(
  "tpu",
  None,
  "run on this Cloud TPU: its name, local (a TPU VM's own chips) or a "
  "grpc:// address (the export modes write a CPU SavedModel without it)",
)
flags.DEFINE_string("gcp_project", None, "GCP project of the TPU")
flags.DEFINE_string("tpu_zone", None, "GCE zone of the TPU")
flags.DEFINE_multi_string(
  "module_import",
  None,
  "modules to import first (e.g. dataset builders or gin configurables)",
)
flags.DEFINE_integer(
  "mesh_devices",
  None,
  "create this many virtual CPU devices (for a mesh on "
  "one machine); must be set before TensorFlow starts",
  lower_bound=1,
)
flags.DEFINE_enum(
  "mesh_impl",
  None,
  ["auto", "placement", "simd"],
  "the mesh implementation (overrides utils.run.mesh_impl): placement, "
  "simd (one program per device, collectives; NCCL on GPUs) or auto "
  "(simd on TPU hosts, else placement)",
)

flags.DEFINE_string(
  "cluster",
  None,
  "run the mesh on a cluster's worker tasks (python -m transformer.serve): "
  "their addresses host:port,host:port in task order, or a JSON object "
  "{job: [addresses]}; default: TF_CONFIG if set, else local devices",
  allow_override=True,  # transformer.serve defines it too
)
flags.DEFINE_float(
  "cluster_timeout",
  60.0,
  "seconds to wait for the cluster's tasks to answer",
)
flags.DEFINE_float(
  "stall_timeout",
  None,
  "seconds a cluster task may go without answering the trainer's health "
  "checks mid-run (a stopped or hung process) before the run stops naming "
  "it, the latest checkpoint intact (default: --cluster_timeout; 0: never)",
)

flags.DEFINE_bool(
  "same_rounding_as_cluster",
  False,
  "turn off Grappler's arithmetic optimizer, as --cluster runs do, so this "
  "one-process run computes a cluster run's very values (with it on, the "
  "default, bfloat16 results are the original package's)",
)

flags.DEFINE_integer(
  "seed",
  None,
  "TensorFlow's global random seed (tf.random.set_seed): runs with the same "
  "seed start from the same weights and see the same data order",
)

FLAGS = flags.FLAGS


def _create_virtual_cpus(n: int) -> None:
  import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top

  try:
    mtf.utils.configure_virtual_cpus(n)
  except RuntimeError as e:
    raise RuntimeError(
      "--mesh_devices=%d: TensorFlow was initialised before "
      "the virtual CPUs could be created (%s)" % (n, e)
    ) from e


def _write_command_line(model_dir: str) -> None:
  """model_dir/command, or command.N if earlier runs wrote one."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  tf.io.gfile.makedirs(model_dir)
  path = os.path.join(model_dir, "command")
  n = 0
  while tf.io.gfile.exists(path):
    n += 1
    path = os.path.join(model_dir, "command.%d" % n)
  with tf.io.gfile.GFile(path, "w") as f:
    f.write(" ".join(sys.argv) + "\n")


def main(_) -> None:
  """Runs the driver (absl app entry point; the argv argument is unused).

  Args:
    _: the command-line arguments left after absl parsed the flags (unused).
  """
  # Only the run's progress and results unless -v/--verbosity or MTF_VERBOSE.
  quiet.quiet_libraries(verbose=quiet.verbose_requested())
  if FLAGS.mesh_devices:
    _create_virtual_cpus(FLAGS.mesh_devices)
  import gin  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  # Register every configurable before gin locks the config (the dataset
  # modules register some lazily otherwise).
  from transformer import dataset  # pylint: disable=g-import-not-at-top,unused-import
  from transformer import utils  # pylint: disable=g-import-not-at-top
  from transformer._src.driver import cluster  # pylint: disable=g-import-not-at-top
  from transformer._src.driver import cluster_spec  # pylint: disable=g-import-not-at-top

  for module in FLAGS.module_import or []:
    importlib.import_module(module)
  utils.parse_gin_defaults_and_flags()
  if FLAGS.seed is not None:
    tf.random.set_seed(FLAGS.seed)
  if FLAGS.same_rounding_as_cluster:
    cluster.disable_placement_dependent_rewrites()
  _write_command_line(FLAGS.model_dir)
  # Passed only when given, so gin bindings of utils.run still apply.
  run_kwargs = {}
  if FLAGS.mesh_impl:
    run_kwargs["mesh_impl"] = FLAGS.mesh_impl
  if FLAGS.cluster:
    run_kwargs["cluster"] = FLAGS.cluster
  if FLAGS["cluster_timeout"].present:
    run_kwargs["cluster_timeout"] = FLAGS.cluster_timeout
  if FLAGS.stall_timeout is not None:
    run_kwargs["stall_timeout"] = FLAGS.stall_timeout
  try:
    utils.run(
      tpu_job_name=FLAGS.tpu_job_name,
      tpu=FLAGS.tpu,
      gcp_project=FLAGS.gcp_project,
      tpu_zone=FLAGS.tpu_zone,
      model_dir=FLAGS.model_dir,
      **run_kwargs,
    )
  except cluster_spec.TaskUnavailableError as e:
    # Says which task is gone and which checkpoint a new run resumes from.
    # (gin appends a line naming the configurable: left out.)
    sys.exit("transformer.main: %s" % str(e).splitlines()[0])
  finally:
    with tf.io.gfile.GFile(
      os.path.join(FLAGS.model_dir, "operative_config.gin"), "w"
    ) as f:
      f.write(gin.operative_config_str())


def console_entry_point() -> None:
  """Runs main() with absl's flag parsing (the console script's target)."""
  # Import utils before parsing so its --gin_file/--gin_param flags exist.
  from transformer import utils  # pylint: disable=g-import-not-at-top,unused-import

  app.run(main)


if __name__ == "__main__":
  console_entry_point()
