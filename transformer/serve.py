r"""Worker entry point: `python -m transformer.serve` runs one server task.

Starts a tf.distribute.Server task of a cluster (from --cluster and
--task_index, or from TF_CONFIG), publishes its TensorFlow version for the
trainer to check, prints one line naming the task, its address and its
devices, and serves until SIGTERM or Ctrl-C. A trainer
(`python -m transformer.main --cluster=...`) then lays its mesh over the
devices of the "worker" job's tasks; see docs/tpu_and_multihost.md.

Example, two workers with two CPU devices each on one machine:
  python -m transformer.serve --cluster=localhost:2222,localhost:2223 \\
      --task_index=0 --cpus=2 &
  python -m transformer.serve --cluster=localhost:2222,localhost:2223 \\
      --task_index=1 --cpus=2 &
"""

from __future__ import annotations

import os
import signal
import sys
import threading

from absl import app
from absl import flags
from absl import logging

from transformer._src import quiet

flags.DEFINE_string(
  "cluster",
  None,
  "the worker job's task addresses, host:port,host:port (or a JSON object "
  "{job: [addresses]}); default: TF_CONFIG",
  allow_override=True,  # transformer.main defines it too
)
flags.DEFINE_string(
  "job_name", None, "this task's job (default: TF_CONFIG's, else worker)"
)
flags.DEFINE_integer(
  "task_index", None, "this task's index in its job (default: TF_CONFIG's)"
)
flags.DEFINE_integer(
  "cpus",
  None,
  "CPU devices this task offers (virtual CPUs sharing the host's cores; "
  "default: one)",
)

FLAGS = flags.FLAGS


def main(_) -> None:
  """Starts the server and blocks until SIGTERM or SIGINT.

  Args:
    _: the command-line arguments left after absl parsed the flags (unused).
  """
  if not quiet.verbose_requested():
    logging.set_verbosity(logging.WARNING)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  from transformer._src.driver import cluster  # pylint: disable=g-import-not-at-top

  stop = threading.Event()
  for signum in (signal.SIGTERM, signal.SIGINT):
    signal.signal(signum, lambda *_: stop.set())
  try:
    server, job_name, task_index = cluster.start_server(
      FLAGS.cluster, FLAGS.job_name, FLAGS.task_index, FLAGS.cpus
    )
    cluster.publish_tf_version(server, job_name, task_index)
  except (ValueError, OSError, tf.errors.OpError) as e:
    sys.exit("transformer.serve: %s" % (getattr(e, "message", None) or e))
  print(
    "serving /job:%s/task:%d at %s with %d CPU device(s) (TensorFlow %s)"
    % (job_name, task_index, server.target, FLAGS.cpus or 1, tf.__version__),
    flush=True,
  )
  while not stop.wait(1.0):
    pass
  print("stopped /job:%s/task:%d" % (job_name, task_index), flush=True)
  # A tf.distribute.Server cannot be stopped; leave without its destructor.
  os._exit(0)  # pylint: disable=protected-access


if __name__ == "__main__":
  app.run(main)
