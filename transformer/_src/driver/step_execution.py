"""How the driver's compiled steps execute.

The driver is an eager program also in TF1 legacy mode
(`eager_in_legacy_mode`), calls its step functions with fewer Grappler
passes (`step_graph_rewrites`), and keeps its global step eager unless a
caller that runs its own graph asks for it there (`driver_global_step`).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from typing import Callable, Iterator

import tensorflow as tf
from tensorflow.core.protobuf import config_pb2
from tensorflow.core.protobuf import rewriter_config_pb2
from tensorflow.python.eager import context as eager_context  # pylint: disable=g-direct-tensorflow-import

import mesh_tensorflow as mtf

__all__ = [
  "driver_global_step",
  "eager_in_legacy_mode",
  "step_graph_rewrites",
]


def eager_in_legacy_mode(fn: Callable) -> Callable:
  """fn, run with eager execution also after TF2 behaviour was switched off.

  The driver is an eager program (it iterates datasets, compiles its steps
  with tf.function and reads results with .numpy()). A TF1 program that
  called `tf.compat.v1.disable_v2_behavior()` keeps its legacy switches (TF1
  shapes, control flow and variable kinds in its own graphs); only the
  driver's calls run eagerly, so they train, evaluate and decode exactly as
  under TF2 behaviour. Calls made while a function is being traced are left
  as they are. Public (transformer.utils) for other eager entry points built
  on the driver, such as the BERT scripts' mains.

  Args:
    fn: the function to wrap.

  Returns:
    fn wrapped, with fn's signature (which gin reads).
  """

  @functools.wraps(fn)
  def wrapper(*args, **kwargs):
    if tf.executing_eagerly() or tf.inside_function():
      return fn(*args, **kwargs)
    with eager_context.eager_mode():
      return fn(*args, **kwargs)

  # gin reads parameters with inspect.getfullargspec, which does not follow
  # __wrapped__: without the signature it would see (*args, **kwargs), accept
  # bindings of any name and no longer enforce gin.REQUIRED.
  wrapper.__signature__ = inspect.signature(fn)
  return wrapper


# Grappler passes the driver's steps run without. On the models measured
# (the tiny Bitransformer of the driver's tests, placement and SIMD; a
# 2-layer Adafactor LM on 8 and 64 devices) they rewrite nothing that
# changes a value: losses and variables after three training steps are bit
# for bit those with the passes on. With the replica program of
# SimdMeshImpl inlined once per device, they cost about a third of the
# first run of a step. Arithmetic optimisation, constant folding and the
# second round of the passes, which do change the last bits, stay as
# configured; so do model pruning and the dependency optimiser, which
# change no value either but remove nodes every later step would run (at 64
# devices later steps took about 5% more CPU time without them).
_PASSES_OFF = (
  "layout_optimizer",
  "remapping",
  "loop_optimization",
  "implementation_selector",
  "shape_optimization",
  "function_optimization",
  "debug_stripper",
  "pin_to_host_optimization",
)
_STEP_CALL_OPTIONS = {}


def _step_call_options(options):
  """The call options `options` without the passes step_graph_rewrites skips."""
  key = (options.config_proto_serialized, options.executor_type)
  derived = _STEP_CALL_OPTIONS.get(key)
  if derived is None:
    config = config_pb2.ConfigProto()
    config.ParseFromString(options.config_proto_serialized)
    rewrites = config.graph_options.rewrite_options
    for name in _PASSES_OFF:
      setattr(rewrites, name, rewriter_config_pb2.RewriterConfig.OFF)
    rewrites.memory_optimization = rewriter_config_pb2.RewriterConfig.NO_MEM_OPT
    rewrites.disable_tfg_optimizer = True
    derived = eager_context.FunctionCallOptions(
      executor_type=options.executor_type, config_proto=config
    )
    _STEP_CALL_OPTIONS[key] = derived
  return derived


@contextlib.contextmanager
def step_graph_rewrites() -> Iterator[None]:
  """Runs the tf.functions called in it with fewer Grappler passes.

  The first call of a step makes TensorFlow optimise the step's whole graph,
  where SimdMeshImpl's replica program is inlined once per device: at 64
  devices that is most of the first step's time. The passes of _PASSES_OFF,
  the memory optimiser and the TFG (MLIR) shape inference change no value
  in the driver's steps and are skipped for the calls made in this context
  only (the function call options of this thread); the process's settings
  (e.g. arithmetic optimisation turned off for a cluster) apply as before.

  Yields:
    Nothing.
  """
  ctx = eager_context.context()
  saved = ctx.function_call_options
  ctx.function_call_options = _step_call_options(saved)
  try:
    yield
  finally:
    ctx.function_call_options = saved


def driver_global_step(in_current_graph: bool) -> tf.Variable:
  """The Estimator's global step: eager, except where a graph is wanted.

  After `tf.compat.v1.disable_v2_behavior()` the driver still runs eagerly
  (see eager_in_legacy_mode), so an Estimator made while a TF1 program's
  graph is the default keeps an eager resource variable (a ref variable in
  that graph could not be trained by the driver's tf.functions). A caller
  that builds and runs its own graph (tpu_estimator_model_fn in a Session)
  asks for the current graph's global step; under TF2 behaviour a tf.Graph
  made by the caller is its choice and is honoured too. A global step this
  function creates in a legacy graph is a resource variable, as the
  original's TPUEstimator created it, so that a TPU program built in that
  graph can read it.
  """
  legacy = not tf.__internal__.tf2.enabled()
  if legacy and not in_current_graph and not tf.inside_function():
    with eager_context.eager_mode():
      return mtf.optimize.get_or_create_global_step()
  if legacy and not tf.executing_eagerly() and not tf.inside_function():
    graph = tf.compat.v1.get_default_graph()
    if tf.compat.v1.train.get_global_step(graph) is None:
      # A resource variable, as TPUEstimator made it (legacy mode's default is
      # a ref variable, which a TPU computation cannot read).
      scope = tf.compat.v1.VariableScope(reuse=None, name="", use_resource=True)
      with tf.compat.v1.variable_scope(scope, auxiliary_name_scope=False):
        tf.compat.v1.train.create_global_step(graph)
  return mtf.optimize.get_or_create_global_step()
