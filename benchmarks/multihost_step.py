"""Benchmark: the demo's training step on a 2-task localhost cluster vs one process.

Starts two `python -m transformer.serve` workers (two CPU devices each) on
free localhost ports, then trains the demo config (configs/demo/reverse.gin:
a 2+2-layer Bitransformer, d_model 128, batch 64, length 16, on a 2x2 mesh)
for --steps steps twice with the same seed:

  one_process   python -m transformer.main --mesh_devices=4 (4 virtual CPUs)
  cluster       python -m transformer.main --cluster=<the two workers>: the
                mesh's 4 processors are the workers' CPUs, the masters, the
                input pipeline and the checkpoints stay in the trainer

and prints each run's final loss (they must agree: same seed, same
placement, same kernels), its steady-state step time (the trainer's progress
line after step --steps, which covers the steps since the previous report,
so tracing and the first steps are excluded when --steps > 100) and its
wall time including start-up and tracing. All processes share this
machine's cores; the cluster's cost is gRPC traffic between processes (the
activations, gradients and slices the 2x2 layout exchanges) instead of
in-process copies.

Usage: python benchmarks/multihost_step.py [--steps 200]
"""

import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRESS = re.compile(
  r"^step (\d+)/\d+  loss ([0-9.]+) .*?([0-9.]+) steps/s", re.M
)


def free_ports(n):
  sockets = [socket.socket() for _ in range(n)]
  for s in sockets:
    s.bind(("localhost", 0))
  ports = [s.getsockname()[1] for s in sockets]
  for s in sockets:
    s.close()
  return ports


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
  step, loss, steps_per_second = PROGRESS.findall(result.stdout)[-1]
  return {
    "name": name,
    "step": int(step),
    "loss": float(loss),
    "ms_per_step": 1000.0 / float(steps_per_second),
    "wall": wall,
  }


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=200)
  args = parser.parse_args()
  with tempfile.TemporaryDirectory() as tmp:
    tfds_dir = os.path.join(tmp, "tfds")
    addresses = ["localhost:%d" % p for p in free_ports(2)]
    workers = start_workers(addresses, tmp)
    try:
      rows = [
        train(
          "one_process",
          os.path.join(tmp, "local"),
          args.steps,
          tfds_dir,
          "--mesh_devices=4",
        ),
        train(
          "cluster",
          os.path.join(tmp, "cluster"),
          args.steps,
          tfds_dir,
          "--cluster=%s" % ",".join(addresses),
        ),
      ]
    finally:
      for process, log in workers:
        os.kill(process.pid, signal.SIGTERM)
        process.wait(timeout=30)
        log.close()
  print(
    "%-12s %6s %10s %12s %9s" % ("run", "step", "loss", "ms/step", "wall s")
  )
  for row in rows:
    print(
      "%-12s %6d %10.4f %12.1f %9.1f"
      % (row["name"], row["step"], row["loss"], row["ms_per_step"], row["wall"])
    )
  print(
    "cluster / one_process step time: %.2fx; losses %s"
    % (
      rows[1]["ms_per_step"] / rows[0]["ms_per_step"],
      "equal" if rows[0]["loss"] == rows[1]["loss"] else "DIFFER",
    )
  )


if __name__ == "__main__":
  main()
