"""The replicated training loop of the TPU driver and the `train` it runs.

`ReplicatedTrainLoop` runs `iterations_per_loop` training steps per call of
one tf.function, every replica running the same Estimator step with its
host's input batch, and records the first non-finite step; `train` trains
an Estimator with such a loop. Steps 3 and 4 of the TPU driver (tpu.py
describes both).
"""

from __future__ import annotations

import inspect
import os
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence

from absl import logging
import gin
import tensorflow as tf

from mesh_tensorflow import simd_mesh_impl
from transformer._src.driver import mesh_impl_choice
from transformer._src.driver import phase_fns
from transformer._src.driver import step_graphs
from transformer._src.driver import train_progress
from transformer._src.driver.tpu_mesh import replica_host_devices

__all__ = [
  "ReplicatedTrainLoop",
  "train",
]


def _ordered_unique(items: Sequence[str]) -> List[str]:
  return list(dict.fromkeys(items))


class ReplicatedTrainLoop:
  """`iterations_per_loop` training steps of an Estimator per call.

  The Estimator's mesh_impl must be a SimdMeshImpl (TPU or collective
  backend). See the module docstring.

  Example (collective backend on 2 virtual CPUs, a tiny LM):
    >>> import tempfile
    >>> from transformer import transformer as tr
    >>> from transformer import transformer_layers as tl
    >>> from transformer._src.driver.estimator import Estimator
    >>> model = tr.Unitransformer(
    ...     layer_stack=tr.LayerStack([tl.DenseReluDense(hidden_size=8)]),
    ...     d_model=8, input_vocab_size=16, output_vocab_size=16,
    ...     autoregressive=True, max_length=4)
    >>> estimator = Estimator(
    ...     "lm", model, None, tempfile.mkdtemp(), "batch:2", "batch:batch",
    ...     4, 4, mesh_impl="simd", mesh_devices=["cpu:0", "cpu:1"])
    >>> estimator.initialize()  # restore the latest checkpoint, else init
    >>> loop = ReplicatedTrainLoop(estimator, iterations_per_loop=2)
    >>> def input_fn(*_):
    ...   batch = {"targets": tf.ones([4, 4], tf.int32)}
    ...   return tf.data.Dataset.from_tensors(batch).repeat()
    >>> out = loop.run(loop.make_iterators(input_fn))  # 2 steps in one call
    >>> int(out["step"]), bool(np.isfinite(out["loss"]))
    (2, True)

  Args:
    estimator: the driver.Estimator (model, variables, global step).
    iterations_per_loop: steps per call of `run`.
    replica_hosts: the host device feeding each physical replica (default:
      replica_host_devices(mesh_impl, job)).
    job: the TPU workers' job name.
  """

  def __init__(
    self,
    estimator,
    iterations_per_loop: int = 1,
    replica_hosts: Optional[Sequence[str]] = None,
    job: Optional[str] = None,
  ):
    mesh_impl = estimator.mesh_impl
    if not isinstance(mesh_impl, simd_mesh_impl.SimdMeshImpl):
      raise ValueError(
        "ReplicatedTrainLoop needs an Estimator whose mesh_impl is a "
        f"SimdMeshImpl, got {type(mesh_impl).__name__}"
      )
    if int(iterations_per_loop) < 1:
      raise ValueError(
        f"iterations_per_loop must be >= 1, got {iterations_per_loop!r}"
      )
    self.estimator = estimator
    self.mesh_impl = mesh_impl
    self.iterations_per_loop = int(iterations_per_loop)
    self.on_tpu = mesh_impl.device_assignment is not None
    if replica_hosts is None:
      replica_hosts = replica_host_devices(mesh_impl, job)
    self.replica_hosts = list(replica_hosts)
    if len(self.replica_hosts) != mesh_impl.size:
      raise ValueError(
        f"{len(self.replica_hosts)} replica hosts given for a mesh of "
        f"{mesh_impl.size} processors"
      )
    self.hosts = _ordered_unique(self.replica_hosts)
    # Masters (and the global step) live on the first host's CPU.
    self.master_device = self.hosts[0]
    self.laid_out_variables = None  # set by the first trace of a step
    self._run = tf.function(self._loop, autograph=False)
    self._copy_fns = {}

  def make_iterators(
    self, input_fn: Callable[..., tf.data.Dataset], skip: int = 0
  ) -> list:
    """One iterator per host over that host's own input pipeline.

    Args:
      input_fn: returns the dataset of global batches. Called once per host,
        on that host's CPU, with a tf.distribute.InputContext if it takes an
        argument; every host must produce the same batches (each replica
        takes its slice of the global batch, as with the original's
        broadcast input).
      skip: the number of batches to skip first (data seen before a
        restart).

    Returns:
      the iterators, in the order of `self.hosts`.
    """
    takes_context = _takes_an_argument(input_fn)
    iterators = []
    for h, host in enumerate(self.hosts):
      with tf.device(host):
        if takes_context:
          context = tf.distribute.InputContext(
            num_input_pipelines=len(self.hosts),
            input_pipeline_id=h,
            num_replicas_in_sync=self.mesh_impl.size,
          )
          dataset = input_fn(context)
        else:
          dataset = input_fn()
        if skip:
          dataset = dataset.skip(skip)
        if tf.executing_eagerly():
          iterators.append(iter(dataset))
        else:  # a legacy graph (building the program without running it)
          iterators.append(tf.compat.v1.data.make_one_shot_iterator(dataset))
    return iterators

  def run(self, iterators: list, iterations: Optional[int] = None):
    """Runs `iterations` (default iterations_per_loop) steps; one call.

    Args:
      iterators: from make_iterators.
      iterations: the number of steps (a Python int).

    Returns:
      {"loss", "learning_rate"} of the last step, the new "step", "finite"
      (whether every step's loss and variables were finite) and the
      "diverged_step" and "diverged_loss" of the first non-finite step (-1
      and 0 if none).
    """
    return self._run(iterators, iterations or self.iterations_per_loop)

  def trace(self, iterators: list, iterations: Optional[int] = None):
    """Builds the loop without running it: creates every variable.

    Eagerly, traces the tf.function; in a legacy graph (e.g. to inspect the
    TPU program on a machine without TPU), adds the loop to that graph.

    Args:
      iterators: from make_iterators.
      iterations: the number of steps (a Python int).

    Returns:
      the concrete function, or in a legacy graph the loop's outputs.
    """
    iterations = iterations or self.iterations_per_loop
    if not tf.executing_eagerly():
      return self._loop(iterators, iterations)
    return self._run.get_concrete_function(iterators, iterations)

  # ------------------------------------------------------------ one step
  def replica_step(self, features: Dict[str, tf.Tensor]) -> List[tf.Tensor]:
    """One replica's training step: [loss, learning_rate, finite].

    The same function runs under tpu.replicate and mesh_impl.replicate.
    `finite` says whether the loss and this replica's slices after the
    step's updates are free of inf and nan (the Estimator's guard).

    Args:
      features: the global batch, {feature name: int tensor}.

    Returns:
      [loss, learning_rate, finite]: float32, float32 and bool scalars.
    """
    lowering, loss, updates, learning_rate = self.estimator.lower_train_step(
      features
    )
    laid_out = list(lowering.variables.values())
    if self.laid_out_variables is None:
      self.laid_out_variables = laid_out
    with tf.control_dependencies(updates):
      # This replica's slices, read after the updates.
      slices = [
        tf.convert_to_tensor(v.laid_out_tensor.one_slice) for v in laid_out
      ]
      finite = phase_fns.all_finite([loss] + slices)
      return [tf.identity(loss), tf.identity(learning_rate), finite]

  def replicate_step(self, host_batches: Sequence[Dict]) -> list:
    """All replicas' step; each replica reads the batch of its own host.

    The replica program is traced once (see
    mesh_impl_choice.replicate_from_hosts): on TPU, replica r's input is the
    batch of the host owning its core; with the collective backend, each
    replica picks its host's batch by its pnum.

    Args:
      host_batches: the features of each host, in the order of `self.hosts`.

    Returns:
      [loss, learning_rate, finite] of each replica, in logical order.
    """
    return mesh_impl_choice.replicate_from_hosts(
      self.mesh_impl,
      self.replica_step,
      [[batch] for batch in host_batches],
      [self.hosts.index(h) for h in self.replica_hosts],
    )

  def _host_batches(self, iterators: list) -> List[Dict]:
    """Each host's next batch, read on that host (order of `self.hosts`)."""
    batches = []
    for host, iterator in zip(self.hosts, iterators):
      with tf.device(host):
        batches.append(step_graphs.model_features(iterator.get_next()))
    return batches

  def _one_step(self, iterators: list, state: "_LoopState") -> "_LoopState":
    """One step of every replica; the state after it."""
    outputs = self.replicate_step(self._host_batches(iterators))
    loss, learning_rate = outputs[0][0], outputs[0][1]
    finite = tf.reduce_all(tf.stack([replica[2] for replica in outputs]))
    deps = [t for replica in outputs for t in replica]
    with tf.control_dependencies(deps):
      step = self.estimator.global_step.assign_add(1)
    first_bad = state.finite & tf.logical_not(finite)
    return _LoopState(
      loss,
      learning_rate,
      step,
      state.finite & finite,
      tf.where(first_bad, step, state.diverged_step),
      tf.where(first_bad, loss, state.diverged_loss),
    )

  def _loop(self, iterators: list, iterations: int):
    step_dtype = self.estimator.global_step.dtype
    with tf.device(self.master_device):
      zero = tf.constant(0.0)
      state = _LoopState(
        zero,
        zero,
        tf.constant(0, step_dtype),
        tf.constant(True),
        tf.constant(-1, step_dtype),
        zero,
      )
      if not self.on_tpu or iterations == 1:
        # Unrolled: the collective backend cannot run in a while loop. A
        # non-finite step does not stop the loop's later steps (nothing of
        # them is saved: the host raises).
        for _ in range(iterations):
          state = self._one_step(iterators, state)
      else:
        # Stops after the first non-finite step.
        def body(i, *state):
          return (i + 1,) + tuple(self._one_step(iterators, _LoopState(*state)))

        state = _LoopState(
          *tf.while_loop(
            lambda i, *state: (i < iterations) & _LoopState(*state).finite,
            body,
            (tf.constant(0),) + tuple(state),
          )[1:]
        )
    return state._asdict()

  # ------------------------------------------------- masters <-> slices
  def copy(self, what: str) -> None:
    """Runs copy_master_to_slices or copy_slices_to_master of every variable.

    Args:
      what: "copy_master_to_slices" or "copy_slices_to_master".
    """
    with tf.device(self.master_device):
      phase_fns.copy_laid_out_variables(
        self.laid_out_variables, what, self._copy_fns
      )


class _LoopState(NamedTuple):
  """What the step loop carries from step to step and returns.

  Attributes:
    loss: the last step's loss.
    learning_rate: the last step's learning rate.
    step: the global step after the last step.
    finite: whether every step so far was finite (loss and every replica's
      variables).
    diverged_step: the global step of the first non-finite step (-1: none).
    diverged_loss: that step's loss.
  """

  loss: tf.Tensor
  learning_rate: tf.Tensor
  step: tf.Tensor
  finite: tf.Tensor
  diverged_step: tf.Tensor
  diverged_loss: tf.Tensor


def _takes_an_argument(fn: Callable) -> bool:
  try:
    params = inspect.signature(fn).parameters.values()
  except (TypeError, ValueError):
    return False
  return any(
    p.default is p.empty
    and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    for p in params
  )


def train(
  estimator,
  input_fn: Callable[..., tf.data.Dataset],
  max_steps: int,
  iterations_per_loop: int = 100,
  *,
  replica_hosts: Optional[Sequence[str]] = None,
  job: Optional[str] = None,
  skip_seen_data: bool = False,
  seen_data_init_step: int = 0,
) -> Dict[str, float]:
  """Trains `estimator` (SimdMeshImpl) to max_steps, iterations_per_loop
  steps per host call; resumes from model_dir and checkpoints like
  Estimator.train.

  Checkpoints are written when a loop crosses a multiple of
  save_checkpoints_steps (loops are not split for them, as with
  TPUEstimator) and at the end.

  Args:
    estimator: the driver.Estimator, its mesh_impl a SimdMeshImpl.
    input_fn: the dataset of global training batches (see
      ReplicatedTrainLoop.make_iterators).
    max_steps: the global step to stop at.
    iterations_per_loop: steps per host call (the last loop may be shorter).
    replica_hosts: see ReplicatedTrainLoop.
    job: the TPU workers' job name.
    skip_seen_data: skip the batches the steps since seen_data_init_step
      consumed, so a resumed run sees new data.
    seen_data_init_step: the step from which the consumed data is counted.

  Returns:
    {"loss", "learning_rate", "step"} of the last step.

  Raises:
    FloatingPointError: if a step's loss or updated variables are not finite
      (before any checkpoint of them is written).
  """
  tf.io.gfile.makedirs(estimator.model_dir)
  loop = ReplicatedTrainLoop(
    estimator, iterations_per_loop, replica_hosts=replica_hosts, job=job
  )
  iterators = loop.make_iterators(input_fn)
  loop.trace(iterators)
  with tf.io.gfile.GFile(
    os.path.join(estimator.model_dir, "operative_config.gin"), "w"
  ) as f:
    f.write(gin.operative_config_str())
  estimator.initialize()
  loop.copy("copy_master_to_slices")
  step = int(estimator.global_step.numpy())
  result = {"step": step}
  if step >= max_steps:
    logging.info("Global step %d >= train steps %d", step, max_steps)
    return result
  if skip_seen_data and step > seen_data_init_step:
    iterators = loop.make_iterators(input_fn, skip=step - seen_data_init_step)
  writer = tf.summary.create_file_writer(estimator.model_dir)
  save_every = estimator.save_checkpoints_steps
  while step < max_steps:
    out = loop.run(iterators, min(iterations_per_loop, max_steps - step))
    previous, step = step, int(out["step"].numpy())
    result = {
      "loss": float(out["loss"].numpy()),
      "learning_rate": float(out["learning_rate"].numpy()),
      "step": step,
    }
    if not out["finite"].numpy():
      # Named by their checkpoint names in the masters, which then refuse
      # to be saved (checkpoints.save), as in Estimator.train.
      loop.copy("copy_slices_to_master")
      raise estimator.non_finite_error(
        int(out["diverged_step"].numpy()),
        float(out["diverged_loss"].numpy()),
      )
    logging.info(
      "step %d/%d  loss %.4f  lr %.3g",
      step,
      max_steps,
      result["loss"],
      result["learning_rate"],
    )
    train_progress.write_scalars(
      writer,
      step,
      {"loss": result["loss"], "learning_rate": result["learning_rate"]},
    )
    crossed = save_every and step // save_every > previous // save_every
    if crossed or step >= max_steps:
      loop.copy("copy_slices_to_master")
      estimator.save()
  writer.close()
  return result
