"""Trains mtf variables with an mtf optimizer and with a numpy reference.

The "model" is fixed: variable w_i gets the gradient g = w_i - T_i + C_i,k,
where T_i is a fixed target and C_i,k is per-step data, so the trajectory
depends on the optimizer's own updates. `train` runs it on a
PlacementMeshImpl in eager, tf.function or tf.compat.v1 graph mode and returns
every master (weights and slots) after each step; `train_numpy` runs a numpy
optimizer on the same data.
"""

from typing import Callable, Dict, List, Sequence, Tuple

import numpy as np
import tensorflow as tf

import mesh_tensorflow as mtf
from tests import mesh_test_util as mtu

tf1 = tf.compat.v1

# A variable: (name, [(dim_name, size), ...]).
VarSpec = Tuple[str, List[Tuple[str, int]]]


class Problem:
  """Initial values, targets and per-step data for some variables."""

  def __init__(
    self,
    var_specs: Sequence[VarSpec],
    steps: int = 6,
    seed: int = 0,
    spike_step: int = 3,
    spike: float = 6.0,
  ):
    rng = np.random.default_rng(seed)
    self.var_specs = list(var_specs)
    self.steps = steps
    self.init = {}
    self.target = {}
    self.data = []  # data[k][name]
    for name, dims in self.var_specs:
      shape = [s for _, s in dims]
      self.init[name] = rng.standard_normal(shape).astype(np.float32)
      self.target[name] = rng.standard_normal(shape).astype(np.float32)
    for k in range(steps):
      scale = spike if k == spike_step else 0.5
      self.data.append(
        {
          name: (scale * rng.standard_normal([s for _, s in dims])).astype(
            np.float32
          )
          for name, dims in self.var_specs
        }
      )

  def shape(self, name: str) -> mtf.Shape:
    return mtf.Shape(
      [mtf.Dimension(n, s) for n, s in dict(self.var_specs)[name]]
    )


def _build(
  problem: Problem,
  mesh: mtf.Mesh,
  data: Dict[str, tf.Tensor],
  make_optimizer: Callable[[], mtf.optimize.Optimizer],
  grad_none=(),
) -> List[mtf.Operation]:
  variables, grads = [], []
  for name, _ in problem.var_specs:
    shape = problem.shape(name)
    w = mtf.get_variable(
      mesh, name, shape, initializer=tf.constant_initializer(problem.init[name])
    )
    target = mtf.import_tf_tensor(
      mesh, tf.constant(problem.target[name]), shape
    )
    c = mtf.import_tf_tensor(mesh, data[name], shape)
    variables.append(w.operation)
    grads.append(None if name in grad_none else w - target + c)
  return make_optimizer().apply_grads(grads, variables)


def _masters(store: mtf.VariableStore) -> Dict[str, np.ndarray]:
  return {name: np.array(v.numpy()) for name, v in store.masters.items()}


def train(
  problem: Problem,
  make_optimizer,
  mesh_shape: str = "",
  layout: str = "",
  mode: str = "function",
  grad_none=(),
) -> List[Dict[str, np.ndarray]]:
  """Runs problem.steps steps; returns all masters after each step."""
  mesh_impl = mtu.mesh_impl_for(mesh_shape, layout)
  names = [n for n, _ in problem.var_specs]
  history = []
  if mode in ("eager", "function"):
    mtf.optimize.get_or_create_global_step().assign(0)
    store = mtf.VariableStore()

    def step(*cs):
      graph = mtf.Graph()
      mesh = mtf.Mesh(graph, "mesh")
      with mtf.variable_store(store):
        _build(problem, mesh, dict(zip(names, cs)), make_optimizer, grad_none)
        lowering = mtf.Lowering(graph, {mesh: mesh_impl})
      lowering.copy_slices_to_masters()
      mtf.optimize.get_or_create_global_step().assign_add(1)

    if mode == "function":
      step = tf.function(step, autograph=False)
    for k in range(problem.steps):
      step(*[tf.constant(problem.data[k][n]) for n in names])
      history.append(_masters(store))
    return history
  if mode == "graph":
    with tf.Graph().as_default():
      store = mtf.VariableStore()
      placeholders = {
        n: tf1.placeholder(tf.float32, problem.init[n].shape) for n in names
      }
      graph = mtf.Graph()
      mesh = mtf.Mesh(graph, "mesh")
      with mtf.variable_store(store):
        update_ops = _build(
          problem, mesh, placeholders, make_optimizer, grad_none
        )
        lowering = mtf.Lowering(graph, {mesh: mesh_impl})
      train_op = tf.group(
        *[lowering.lowered_operation(op) for op in update_ops]
      )
      with tf.control_dependencies([train_op]):
        increment = mtf.optimize.get_or_create_global_step().assign_add(1)
      copy_back = lowering.copy_slices_to_masters()
      config = tf1.ConfigProto(device_count={"CPU": len(mtu.DEVICES)})
      with tf1.Session(config=config) as sess:
        sess.run(tf1.global_variables_initializer())
        sess.run(tf1.local_variables_initializer())
        sess.run(lowering.copy_masters_to_slices())
        for k in range(problem.steps):
          sess.run(
            increment, {placeholders[n]: problem.data[k][n] for n in names}
          )
          sess.run(copy_back)
          history.append(sess.run(dict(store.masters)))
    return history
  raise ValueError("unknown mode %r" % mode)


def train_numpy(problem: Problem, np_optimizer) -> List[Dict[str, np.ndarray]]:
  """The same run with np_optimizer.update(state, name, grad, step)."""
  state = {n: problem.init[n].astype(np.float64) for n, _ in problem.var_specs}
  history = []
  for k in range(problem.steps):
    for name, _ in problem.var_specs:
      grad = state[name] - problem.target[name] + problem.data[k][name]
      np_optimizer.update(state, name, grad, k)
    history.append({n: v.copy() for n, v in state.items()})
  return history


def assert_same_history(actual, expected, atol=1e-5, rtol=1e-5, msg=""):
  """Same master names, shapes and values at every step."""
  assert len(actual) == len(expected)
  for k, (a, e) in enumerate(zip(actual, expected)):
    assert sorted(a) == sorted(e), "%s step %d: masters %s, expected %s" % (
      msg,
      k,
      sorted(a),
      sorted(e),
    )
    for name in e:
      assert np.shape(a[name]) == np.shape(e[name]), (
        "%s step %d variable %s: shape %s, expected %s"
        % (msg, k, name, np.shape(a[name]), np.shape(e[name]))
      )
      np.testing.assert_allclose(
        a[name],
        e[name],
        atol=atol,
        rtol=rtol,
        err_msg="%s step %d variable %s" % (msg, k, name),
      )


# ---------------------------------------------------------------- numpy refs


def zeros_slot(state, name, shape):
  if name not in state:
    state[name] = np.zeros(shape, np.float64)
  return state[name]


class NpSgd:
  def __init__(self, lr):
    self.lr = lr

  def update(self, state, name, grad, step):
    del step
    state[name] = state[name] - self.lr * grad


class NpMomentum:
  def __init__(self, lr, momentum):
    self.lr, self.momentum = lr, momentum

  def update(self, state, name, grad, step):
    del step
    v = zeros_slot(state, name + "_momentum_v", grad.shape)
    v = self.momentum * v - self.lr * grad
    state[name + "_momentum_v"] = v
    state[name] = state[name] + v


class NpAdam:
  """Adam without bias correction; decoupled weight decay unless excluded."""

  def __init__(
    self,
    lr,
    weight_decay_rate=0.0,
    beta_1=0.9,
    beta_2=0.999,
    epsilon=1e-6,
    excluded=(),
    lr_of=None,
  ):
    self.lr, self.wd = lr, weight_decay_rate
    self.b1, self.b2, self.eps = beta_1, beta_2, epsilon
    self.excluded = set(excluded)
    self.lr_of = lr_of or {}

  def update(self, state, name, grad, step):
    m = zeros_slot(state, name + "/adam_m", grad.shape)
    v = zeros_slot(state, name + "/adam_v", grad.shape)
    m = self.b1 * m + (1 - self.b1) * grad
    v = self.b2 * v + (1 - self.b2) * grad * grad
    update = m / (np.sqrt(v) + self.eps)
    if self.wd and name not in self.excluded:
      update = update + self.wd * state[name]
    lr = self.lr_of[name](step) if name in self.lr_of else self.lr
    state[name] = state[name] - lr * update
    state[name + "/adam_m"], state[name + "/adam_v"] = m, v


class NpAdafactor:
  """Adafactor written from the paper's algorithm, with mtf's conventions.

  dims[name] is the variable's [(dim_name, size)]; factored axes are the two
  largest non-stacked ones (stable order on ties) when the second is >=
  min_dim; RMS statistics are per stacked slice.
  """

  def __init__(
    self,
    dims,
    multiply_by_parameter_scale=True,
    learning_rate=None,
    decay_rate=None,
    beta1=0.0,
    clipping_threshold=1.0,
    factored=True,
    epsilon1=1e-30,
    epsilon2=1e-3,
    min_dim=128,
    stacked=(),
    no_scale=(),
    lr_of=None,
  ):
    self.dims = dims
    self.scale = multiply_by_parameter_scale
    self.lr, self.decay = learning_rate, decay_rate
    self.beta1, self.threshold = beta1, clipping_threshold
    self.factored, self.min_dim = factored, min_dim
    self.eps1, self.eps2 = epsilon1, epsilon2
    self.stacked, self.no_scale = set(stacked), set(no_scale)
    self.lr_of = lr_of or {}
    self.clip_events = 0

  def factored_axes(self, name):
    dims = self.dims[name]
    axes = [i for i, (n, _) in enumerate(dims) if n not in self.stacked]
    if not self.factored or len(axes) < 2:
      return None
    axes = sorted(axes, key=lambda i: -dims[i][1])
    if dims[axes[1]][1] < self.min_dim:
      return None
    return axes[0], axes[1]

  def update(self, state, name, grad, step):
    w = state[name]
    dims = self.dims[name]
    rms_axes = tuple(
      i for i, (n, _) in enumerate(dims) if n not in self.stacked
    )
    decay = 1.0 - (step + 1.0) ** -0.8 if self.decay is None else self.decay
    if name in self.lr_of:
      lr = self.lr_of[name](step)
    elif self.lr is None:
      lr = min((step + 1.0) ** -0.5, 0.01) * (1.0 if self.scale else 0.05)
    else:
      lr = self.lr
    g2 = grad * grad + self.eps1
    fac = self.factored_axes(name)
    if fac:
      a0, a1 = fac
      vr = zeros_slot(state, name + "_slot_vr", np.delete(w.shape, a0))
      vc = zeros_slot(state, name + "_slot_vc", np.delete(w.shape, a1))
      vr = decay * vr + (1 - decay) * g2.mean(axis=a0)
      vc = decay * vc + (1 - decay) * g2.mean(axis=a1)
      state[name + "_slot_vr"], state[name + "_slot_vc"] = vr, vc
      a1_in_vr = a1 - 1 if a1 > a0 else a1
      r = vr / vr.mean(axis=a1_in_vr, keepdims=True)
      x = (
        grad / np.sqrt(np.expand_dims(r, a0)) / np.sqrt(np.expand_dims(vc, a1))
      )
    else:
      v = zeros_slot(state, name + "_slot_v", w.shape)
      v = decay * v + (1 - decay) * g2
      state[name + "_slot_v"] = v
      x = grad / np.sqrt(v)
    if self.threshold is not None:
      rms = np.sqrt(np.mean(x * x, axis=rms_axes, keepdims=True))
      denom = np.maximum(1.0, rms / self.threshold)
      self.clip_events += int(np.any(denom > 1.0 + 1e-3))
      x = x / denom
    if self.scale and name not in self.no_scale:
      scale = lr * np.maximum(
        np.sqrt(np.mean(w * w, axis=rms_axes, keepdims=True)), self.eps2
      )
    else:
      scale = lr
    sub = x * scale
    if self.beta1:
      m = zeros_slot(state, name + "_slot_m", w.shape)
      m = self.beta1 * m + (1 - self.beta1) * sub
      state[name + "_slot_m"] = m
      sub = m
    state[name] = w - sub
