"""Benchmark: the demo's training step on a 2-task localhost cluster vs one process.

Starts two `python -m transformer.serve` workers (two CPU devices each) on
free localhost ports, then trains the demo config (configs/demo/reverse.gin:
a 2+2-layer Bitransformer, d_model 128, batch 64, length 16, on a 2x2 mesh)
for --steps steps twice with the same seed:

  one_process   python -m transformer.main --mesh_devices=4 (4 virtual CPUs)
                --same_rounding_as_cluster (so its losses can equal the
                cluster's to the bit)
  cluster       python -m transformer.main --cluster=<the two workers>: the
                mesh's 4 processors are the workers' CPUs, the masters, the
                input pipeline and the checkpoints stay in the trainer

and prints each run's loss at every progress report (every 100 steps and
the last), its steady-state step time (the trainer's progress
line after step --steps, which covers the steps since the previous report,
so tracing and the first steps are excluded when --steps > 100) and its
wall time including start-up and tracing. All processes share this
machine's cores; the cluster's cost is gRPC traffic between processes (the
activations, gradients and slices the 2x2 layout exchanges) instead of
in-process copies.

The two runs do the same arithmetic (docs/tpu_and_multihost.md), so their
losses are equal at every report.

Both runs use --mesh_impl (default placement; simd: SimdMeshImpl's
collective backend, TF collective ops across the two tasks).

Usage: python benchmarks/multihost_step.py [--steps 200] [--mesh_impl simd]
"""

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROGRESS = re.compile(
  r"^step (\d+)/\d+  loss ([0-9.]+) .*?([0-9.]+) steps/s", re.M
)


def environment():
  env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
  env["PYTHONPATH"] = REPO
  return env


def start_workers(addresses, log_dir):
  workers = []
  for index in range(len(addresses)):
    log = open(os.path.join(log_dir, "worker%d.log" % index), "w+")
    workers.append(
      (
        subprocess.Popen(
          [
            sys.executable,
            "-m",
            "transformer.serve",
            "--cluster=%s" % ",".join(addresses),
            "--task_index=%d" % index,
            "--cpus=2",
          ],
          stdout=log,
          stderr=subprocess.STDOUT,
          env=environment(),
        ),
        log,
      )
    )
  for process, log in workers:
    while True:
      log.seek(0)
      if "serving" in log.read():
        break
      if process.poll() is not None:
        raise RuntimeError("a worker exited; see %s" % log.name)
      time.sleep(0.2)
  return workers


def train(name, model_dir, steps, tfds_dir, *flags):
  start = time.perf_counter()
  result = subprocess.run(
    [
      sys.executable,
      "-m",
      "transformer.main",
      "--seed=1",
      "--model_dir=%s" % model_dir,
      "--gin_file=demo/reverse.gin",
      "--gin_param=utils.run.train_steps = %d" % steps,
      "--gin_param=dataset.untokenized_tfds_dataset.tfds_data_dir = '%s'"
      % tfds_dir,
    ]
    + list(flags),
    env=environment(),
    cwd=REPO,
    capture_output=True,
    text=True,
    check=False,
  )
  wall = time.perf_counter() - start
  if result.returncode:
    raise RuntimeError("%s failed:\n%s" % (name, result.stderr[-3000:]))
  reports = PROGRESS.findall(result.stdout)
  step, _, steps_per_second = reports[-1]
  return {
    "name": name,
    "step": int(step),
    "losses": {int(s): float(loss) for s, loss, _ in reports},
    "ms_per_step": 1000.0 / float(steps_per_second),
    "wall": wall,
  }


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=200)
  parser.add_argument(
    "--mesh_impl", choices=("placement", "simd"), default="placement"
  )
  args = parser.parse_args()
  sys.path.insert(0, REPO)
  from transformer._src.driver import cluster_spec  # pylint: disable=g-import-not-at-top

  with tempfile.TemporaryDirectory() as tmp:
    tfds_dir = os.path.join(tmp, "tfds")
    addresses = ["localhost:%d" % p for p in cluster_spec.free_local_ports(2)]
    workers = start_workers(addresses, tmp)
    try:
      rows = [
        train(
          "one_process",
          os.path.join(tmp, "local"),
          args.steps,
          tfds_dir,
          "--mesh_devices=4",
          "--same_rounding_as_cluster",
          "--mesh_impl=%s" % args.mesh_impl,
        ),
        train(
          "cluster",
          os.path.join(tmp, "cluster"),
          args.steps,
          tfds_dir,
          "--cluster=%s" % ",".join(addresses),
          "--mesh_impl=%s" % args.mesh_impl,
        ),
      ]
    finally:
      for process, log in workers:
        os.kill(process.pid, signal.SIGTERM)
        process.wait(timeout=30)
        log.close()
  steps = sorted(rows[0]["losses"])
  print(
    "%-12s %9s %9s  %s"
    % ("run", "ms/step", "wall s", "  ".join("loss@%d" % s for s in steps))
  )
  for row in rows:
    losses = ["%*.4f" % (len("loss@%d" % s), row["losses"][s]) for s in steps]
    print(
      "%-12s %9.1f %9.1f  %s"
      % (row["name"], row["ms_per_step"], row["wall"], "  ".join(losses))
    )
  print(
    "cluster / one_process step time: %.2fx"
    % (rows[1]["ms_per_step"] / rows[0]["ms_per_step"])
  )


if __name__ == "__main__":
  main()
