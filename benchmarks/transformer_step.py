"""Benchmark: one training step of a decoder-only LM, mtf versus plain TF2.

The model is the library's language model, `transformer.Unitransformer` over
`make_layer_stack([SelfAttention, DenseReluDense])` (the non-legacy
LayerStack: pre-norm RMS norm, residuals, dropout 0): 6 layers, d_model 512,
d_ff 2048, 8 heads of d_kv 64, a learned positional embedding, vocabulary
8192, causal attention, length 256, batch 16, float32, cross-entropy plus the
default z-loss (1e-4), and a plain SGD update (w -= lr * grad). One training
step (forward, backward, update) is one compiled tf.function. Configurations:

  tf        the same math written by hand in plain TF2 (tf.Variable weights,
            matmul/einsum, GradientTape) in one tf.function
  mtf_1     mtf on a 1-processor mesh
  mtf_dp4   mesh "all:4", layout "batch:all"                 (data parallel)
  mtf_mp4   mesh "all:4", layout "heads:all;d_ff:all;vocab:all" (model par.)
  mtf_2x2   mesh "rows:2;cols:2",
            layout "batch:rows;heads:cols;d_ff:cols;vocab:cols"
  tf_onehot (only with --only) plain TF whose embedding lookup is a one-hot
            matmul, as the original's mtf.gather computes it (and this
            mtf.gather still does where the vocabulary is split)

all in one process on 4 virtual CPUs (PlacementMeshImpl). Every configuration
starts from the same weights: the mtf masters of a reference build, copied
into each mtf VariableStore and into the plain TF variables, so the first
(warm-up, tracing) step's losses must agree. Then the configurations run
round-robin for several rounds (the first round's first step is each model's
second step: the change of the loss over the first update must agree too,
which checks the gradients); each round also times a large float32 matmul,
the machine's matmul peak (the best round counts). The table gives each
configuration's median step time (wall and process CPU), tokens/s, ratio to
plain TF and the fraction of the matmul peak its step reaches, counting

  FLOPs/step = 6 * (matmul parameters) * tokens + attention FLOPs,

matmul parameters = per layer 4 * d_model * heads * d_kv + 2 * d_model * d_ff,
plus the d_model * vocab softmax kernel (the embedding tables are looked up,
not multiplied, so they are not counted); attention FLOPs (forward q.k and
weights.v, times 3 for the backward pass) = 12 * layers * batch * length^2 *
heads * d_kv, the full square: neither side skips the masked half.

Where the vocabulary is not split (mtf_1, mtf_dp4), mtf.gather looks the
embedding up with tf.gather and its gradient is a scatter-add, as in plain
TF. Where it is split (mtf_mp4, mtf_2x2), mtf.gather is the original's
one-hot einsum, so the lookup and its gradient are two [tokens, vocab] x
[vocab, d_model] matmuls, split over the vocabulary (+11% FLOPs at the
default size; tf_onehot shows that cost in plain TF). The virtual CPUs
share the machine's 2 cores, so a parallel layout does no less work than
one device; its four devices' ops can overlap, though, which may beat one
device whose smaller ops (softmax, norms, elementwise) do not keep both
cores busy. Timings on a machine shared with other jobs vary by 20% or more
between runs.

Usage: python benchmarks/transformer_step.py [--rounds 3] [--steps_per_round 1]
           [--only mtf_1,...] [--layers 6] [--batch 16] [--length 256]
       python benchmarks/transformer_step.py --smoke   # tiny, a few seconds
"""

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from absl import logging as absl_logging  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top
import tensorflow as tf  # pylint: disable=g-import-not-at-top

import mesh_tensorflow as mtf  # pylint: disable=g-import-not-at-top
from mesh_tensorflow import placement_mesh_impl  # pylint: disable=g-import-not-at-top

NUM_VIRTUAL_CPUS = 4
# Before the transformer imports: they may run TensorFlow ops.
DEVICES = mtf.utils.configure_virtual_cpus(NUM_VIRTUAL_CPUS)

from transformer import transformer  # pylint: disable=g-import-not-at-top
from transformer import transformer_layers  # pylint: disable=g-import-not-at-top

LEARNING_RATE = 0.1
Z_LOSS = 1e-4  # Unitransformer's default, applied in training.
NORM_EPSILON = 1e-6  # sublayer_rms_norm's default.

CONFIGS = [  # name, mesh shape, layout
  ("mtf_1", "", ""),
  ("mtf_dp4", "all:4", "batch:all"),
  ("mtf_mp4", "all:4", "heads:all;d_ff:all;vocab:all"),
  ("mtf_2x2", "rows:2;cols:2", "batch:rows;heads:cols;d_ff:cols;vocab:cols"),
]
# Run only when named in --only.
EXTRA_CONFIGS = ["tf_onehot"]

FULL_SIZE = dict(
  layers=6,
  d_model=512,
  d_ff=2048,
  heads=8,
  d_kv=64,
  vocab=8192,
  length=256,
  batch=16,
)
SMOKE_SIZE = dict(
  layers=2, d_model=32, d_ff=64, heads=4, d_kv=8, vocab=256, length=16, batch=8
)


class Sizes:
  """The model and batch sizes of one run."""

  def __init__(self, layers, d_model, d_ff, heads, d_kv, vocab, length, batch):
    self.layers, self.d_model, self.d_ff = layers, d_model, d_ff
    self.heads, self.d_kv, self.vocab = heads, d_kv, vocab
    self.length, self.batch = length, batch

  @property
  def tokens(self):
    return self.batch * self.length

  @property
  def matmul_params(self):
    per_layer = (
      4 * self.d_model * self.heads * self.d_kv + 2 * self.d_model * self.d_ff
    )
    return self.layers * per_layer + self.d_model * self.vocab

  @property
  def flops_per_step(self):
    attention = (
      12 * self.layers * self.batch * self.length**2 * self.heads * self.d_kv
    )
    return 6 * self.matmul_params * self.tokens + attention


# ----------------------------------------------------------------------------
# mtf.


def make_lm(sizes, mesh_shape="", layout=""):
  """The Unitransformer LM under test."""
  stack = transformer.make_layer_stack(
    [
      (
        transformer_layers.SelfAttention,
        {"num_heads": sizes.heads, "key_value_size": sizes.d_kv},
      ),
      (transformer_layers.DenseReluDense, {"hidden_size": sizes.d_ff}),
    ],
    num_layers=sizes.layers,
  )
  return transformer.Unitransformer(
    stack,
    d_model=sizes.d_model,
    input_vocab_size=sizes.vocab,
    output_vocab_size=sizes.vocab,
    autoregressive=True,
    max_length=sizes.length,
    z_loss=Z_LOSS,
    layout=layout or None,
    mesh_shape=mesh_shape or None,
  )


class MtfLM:
  """The LM's training step in mtf; the graph is built and lowered in the
  tf.function, the masters live in this configuration's VariableStore.
  """

  def __init__(self, sizes, mesh_shape, layout, initial_values):
    n = mtf.convert_to_shape(mesh_shape).size
    self.sizes = sizes
    self.mesh_impl = placement_mesh_impl.PlacementMeshImpl(
      mesh_shape, layout, DEVICES[:n]
    )
    self.model = make_lm(sizes, mesh_shape, layout)
    self.store = mtf.VariableStore()
    # Create the masters (eagerly, by building the graph once without
    # lowering it) and give them the reference values before the first trace
    # makes the slices from them.
    dummy = tf.zeros([sizes.batch, sizes.length], tf.int32)
    self._build(dummy, dummy)
    for name, var in self.store.masters.items():
      var.assign(initial_values[name])
    self.step = tf.function(self._step, autograph=False)

  def _build(self, inputs, targets):
    """(mtf graph, mesh, loss) of one training step."""
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    batch = mtf.Dimension("batch", self.sizes.batch)
    length = mtf.Dimension("length", self.sizes.length)
    with mtf.variable_store(self.store):
      ids = mtf.import_tf_tensor(mesh, inputs, [batch, length])
      labels = mtf.import_tf_tensor(mesh, targets, [batch, length])
      _, loss = self.model.call_simple(
        ids, labels, compute_loss=True, mode="train"
      )
      variables = graph.trainable_variables
      grads = mtf.gradients([loss], [v.outputs[0] for v in variables])
      mtf.optimize.SgdOptimizer(LEARNING_RATE).apply_grads(grads, variables)
    return graph, mesh, loss

  def _step(self, inputs, targets):
    graph, mesh, loss = self._build(inputs, targets)
    lowering = mtf.Lowering(graph, {mesh: self.mesh_impl})
    return lowering.export_to_tf_tensor(loss)


def reference_values(sizes):
  """{master name: numpy value} of a freshly initialised LM."""
  store = mtf.VariableStore()
  model = make_lm(sizes)
  graph = mtf.Graph()
  mesh = mtf.Mesh(graph, "mesh")
  batch = mtf.Dimension("batch", sizes.batch)
  length = mtf.Dimension("length", sizes.length)
  ids = mtf.import_tf_tensor(
    mesh, tf.zeros([sizes.batch, sizes.length], tf.int32), [batch, length]
  )
  with mtf.variable_store(store):
    model.call_simple(ids, ids, compute_loss=True, mode="train")
  return {name: var.numpy() for name, var in store.masters.items()}


# ----------------------------------------------------------------------------
# Plain TF2.


class PlainTFLM:
  """The same LM written by hand: tf.Variables, matmul/einsum, GradientTape.

  Activations are kept as [batch * length, d_model] so that every projection
  is one 2-D matmul; attention reshapes to [batch, length, heads, d_kv].
  """

  def __init__(self, sizes, values, prefix="transformer", one_hot=False):
    self.sizes = sizes
    self.one_hot = one_hot
    s = sizes

    def var(name):
      return tf.Variable(values[prefix + "/" + name], name=name)

    self.embedding = var("embedding")
    self.positional_embedding = var("positional_embedding")
    self.layers = []
    for i in range(s.layers):
      att = "block_%03d/layer_000/" % i
      ffn = "block_%03d/layer_001/" % i
      self.layers.append(
        dict(
          att_scale=var(att + "rms_norm/scale"),
          q=var(att + "SelfAttention/q"),
          k=var(att + "SelfAttention/k"),
          v=var(att + "SelfAttention/v"),
          o=var(att + "SelfAttention/o"),
          ffn_scale=var(ffn + "rms_norm/scale"),
          wi=var(ffn + "DenseReluDense/wi/kernel"),
          wo=var(ffn + "DenseReluDense/wo/kernel"),
        )
      )
    self.final_scale = var("rms_norm/scale")
    self.logits_kernel = var("logits/kernel")
    self.variables = [
      self.embedding,
      self.positional_embedding,
      self.final_scale,
      self.logits_kernel,
    ] + [v for layer in self.layers for v in layer.values()]
    if len(self.variables) != len(values):
      raise ValueError(
        "plain TF model has %d variables, mtf %d: %s"
        % (len(self.variables), len(values), sorted(values))
      )
    position = np.arange(s.length)
    self.causal_bias = tf.constant(
      np.where(position[:, None] >= position[None, :], 0.0, -1e9), tf.float32
    )  # [query, memory]
    self.step = tf.function(self._step, autograph=False)

  @staticmethod
  def _rms_norm(x, scale):
    variance = tf.reduce_mean(tf.square(x), axis=-1, keepdims=True)
    return x * tf.math.rsqrt(variance + NORM_EPSILON) * scale

  def _attention(self, x, layer):
    s = self.sizes
    shape = [s.batch, s.length, s.heads, s.d_kv]
    q = tf.reshape(tf.matmul(x, layer["q"]), shape)
    k = tf.reshape(tf.matmul(x, layer["k"]), shape)
    v = tf.reshape(tf.matmul(x, layer["v"]), shape)
    # No 1/sqrt(d_kv): the scaling is folded into q's initializer.
    logits = tf.einsum("bqhd,bmhd->bhqm", q, k) + self.causal_bias
    weights = tf.nn.softmax(logits, axis=-1)
    o = tf.einsum("bhqm,bmhd->bqhd", weights, v)
    return tf.matmul(tf.reshape(o, [s.tokens, s.heads * s.d_kv]), layer["o"])

  def loss(self, inputs, targets):
    s = self.sizes
    ids = tf.reshape(inputs, [s.tokens])
    if self.one_hot:  # As mtf.gather: a [tokens, vocab] one-hot matmul.
      x = tf.matmul(tf.one_hot(ids, self.embedding.shape[0]), self.embedding)
    else:
      x = tf.gather(self.embedding, ids)
    x = tf.reshape(x, [s.batch, s.length, s.d_model])
    x = tf.reshape(
      x + self.positional_embedding[: s.length], [s.tokens, s.d_model]
    )
    for layer in self.layers:
      x += self._attention(self._rms_norm(x, layer["att_scale"]), layer)
      h = tf.nn.relu(
        tf.matmul(self._rms_norm(x, layer["ffn_scale"]), layer["wi"])
      )
      x += tf.matmul(h, layer["wo"])
    x = self._rms_norm(x, self.final_scale)
    logits = tf.matmul(x, self.logits_kernel)  # [tokens, vocab]
    log_z = tf.reduce_logsumexp(logits, axis=-1)
    labels = tf.reshape(targets, [s.tokens])
    target_logit = tf.gather(logits, labels, axis=1, batch_dims=1)
    per_token = log_z - target_logit + Z_LOSS * tf.square(log_z)
    weights = tf.cast(labels > 0, tf.float32)
    return tf.reduce_sum(per_token * weights) / float(s.tokens)

  def _step(self, inputs, targets):
    with tf.GradientTape() as tape:
      loss = self.loss(inputs, targets)
    grads = tape.gradient(loss, self.variables)
    for v, g in zip(self.variables, grads):
      if isinstance(g, tf.IndexedSlices):  # The embedding's gather.
        v.scatter_sub(
          tf.IndexedSlices(g.values * LEARNING_RATE, g.indices, g.dense_shape)
        )
      else:
        v.assign_sub(LEARNING_RATE * g)
    return loss


# ----------------------------------------------------------------------------
# Timing.


class MatmulPeak:
  """A large float32 matmul in a tf.function: the machine's FLOP/s ceiling."""

  def __init__(self, n):
    rng = np.random.default_rng(1)
    self.a = tf.constant(rng.standard_normal((n, n)).astype(np.float32))
    self.b = tf.constant(rng.standard_normal((n, n)).astype(np.float32))
    self.flops = 2.0 * n**3
    self.fn = tf.function(lambda a, b: tf.reduce_sum(tf.matmul(a, b)))
    self.fn(self.a, self.b).numpy()

  def measure(self, repeats):
    """FLOP/s of `repeats` back-to-back matmuls."""
    start = time.perf_counter()
    for _ in range(repeats):
      out = self.fn(self.a, self.b)
    out.numpy()
    return repeats * self.flops / (time.perf_counter() - start)


def time_steps(step, inputs, targets, n):
  """(wall seconds, process CPU seconds) per step, averaged over n steps, and
  the first step's loss.
  """
  start, start_cpu = time.perf_counter(), time.process_time()
  first_loss = None
  for _ in range(n):
    loss = step(inputs, targets)
    if first_loss is None:
      first_loss = loss
  loss.numpy()  # Waits for the last step.
  return (
    (time.perf_counter() - start) / n,
    (time.process_time() - start_cpu) / n,
    float(first_loss),
  )


def make_batch(sizes, seed=0):
  """Random LM targets in [2, vocab) and their shifted-right inputs."""
  rng = np.random.default_rng(seed)
  targets = rng.integers(2, sizes.vocab, (sizes.batch, sizes.length))
  inputs = np.zeros_like(targets)
  inputs[:, 1:] = targets[:, :-1]
  return tf.constant(inputs, tf.int32), tf.constant(targets, tf.int32)


def parse_args(argv):
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument(
    "--rounds",
    type=int,
    default=None,
    help="timed rounds (default 3; 1 with --smoke)",
  )
  parser.add_argument("--steps_per_round", type=int, default=1)
  parser.add_argument(
    "--only", default="", help="comma-separated config names (tf always runs)"
  )
  parser.add_argument(
    "--smoke",
    action="store_true",
    help="tiny dims, 2 layers, 1 round: checks it runs",
  )
  for name in (
    "layers",
    "batch",
    "length",
    "d_model",
    "d_ff",
    "heads",
    "d_kv",
    "vocab",
  ):
    parser.add_argument(
      "--" + name,
      type=int,
      default=None,
      help="default %d (smoke %d)" % (FULL_SIZE[name], SMOKE_SIZE[name]),
    )
  parser.add_argument(
    "--matmul_size",
    type=int,
    default=None,
    help="n of the n x n peak matmul (default 2048, smoke 256)",
  )
  parser.add_argument(
    "--intra_op_threads", type=int, default=0, help="0: TensorFlow's default"
  )
  parser.add_argument(
    "--inter_op_threads", type=int, default=0, help="0: TensorFlow's default"
  )
  args = parser.parse_args(argv)
  defaults = SMOKE_SIZE if args.smoke else FULL_SIZE
  sizes = Sizes(**{k: getattr(args, k) or v for k, v in defaults.items()})
  if args.rounds is None:
    args.rounds = 1 if args.smoke else 3
  if args.matmul_size is None:
    args.matmul_size = 256 if args.smoke else 2048
  return args, sizes


def main(argv=None):
  args, sizes = parse_args(argv)
  if args.intra_op_threads:
    tf.config.threading.set_intra_op_parallelism_threads(args.intra_op_threads)
  if args.inter_op_threads:
    tf.config.threading.set_inter_op_parallelism_threads(args.inter_op_threads)
  absl_logging.set_verbosity(absl_logging.ERROR)
  known = ["tf"] + [name for name, _, _ in CONFIGS] + EXTRA_CONFIGS
  names = known[: -len(EXTRA_CONFIGS)]
  if args.only:
    wanted = set(args.only.split(","))
    unknown = wanted - set(known)
    if unknown:
      raise ValueError(
        "--only: unknown config(s) %s; known: %s"
        % (sorted(unknown), ", ".join(known))
      )
    names = [n for n in known if n in wanted or n == "tf"]

  print(
    "LM: %d layers, d_model %d, d_ff %d, %d heads x d_kv %d, vocab %d, "
    "length %d, batch %d (%d tokens/step), float32, SGD"
    % (
      sizes.layers,
      sizes.d_model,
      sizes.d_ff,
      sizes.heads,
      sizes.d_kv,
      sizes.vocab,
      sizes.length,
      sizes.batch,
      sizes.tokens,
    )
  )
  print(
    "matmul parameters %.3gM, %.3g GFLOP per step"
    % (sizes.matmul_params / 1e6, sizes.flops_per_step / 1e9)
  )
  start = time.perf_counter()
  tf.random.set_seed(0)  # The same initial weights every run.
  values = reference_values(sizes)
  models = {"tf": PlainTFLM(sizes, values)}
  if "tf_onehot" in names:
    models["tf_onehot"] = PlainTFLM(sizes, values, one_hot=True)
  for name, mesh_shape, layout in CONFIGS:
    if name in names:
      models[name] = MtfLM(sizes, mesh_shape, layout, values)
  peak = MatmulPeak(args.matmul_size)
  print("setup %.1f s" % (time.perf_counter() - start))
  inputs, targets = make_batch(sizes)

  # Warm-up (tracing) step from identical weights: the losses must agree.
  first, second = {}, {}
  for name, model in models.items():
    start = time.perf_counter()
    first[name] = float(model.step(inputs, targets))
    print(
      "%-9s first step (trace + run) %6.1f s, loss %.6f"
      % (name, time.perf_counter() - start, first[name])
    )

  # Timed rounds; round 0's first step is every model's second step, whose
  # loss (after one update) checks the gradients.
  times = {name: [] for name in models}
  cpu_times = {name: [] for name in models}
  peaks = []
  for r in range(args.rounds):
    peaks.append(peak.measure(3))
    for name, model in models.items():
      seconds, cpu_seconds, loss = time_steps(
        model.step, inputs, targets, args.steps_per_round
      )
      times[name].append(seconds)
      cpu_times[name].append(cpu_seconds)
      if r == 0:
        second[name] = loss
  ref, ref_delta = first["tf"], second["tf"] - first["tf"]
  max_rel = max(abs(v - ref) / abs(ref) for v in first.values())
  max_rel_delta = max(
    abs((second[k] - first[k]) - ref_delta) / abs(ref_delta) for k in models
  )
  print("loss change over the first update: tf %.6f" % ref_delta)
  print(
    "max relative difference vs tf: first-step loss %.2e, loss change "
    "over the first update %.2e" % (max_rel, max_rel_delta)
  )
  peak_flops = max(peaks)

  print()
  print(
    "matmul peak (%d x %d float32): best %.1f GFLOP/s (median %.1f) "
    "over %d rounds"
    % (
      args.matmul_size,
      args.matmul_size,
      peak_flops / 1e9,
      statistics.median(peaks) / 1e9,
      len(peaks),
    )
  )
  print(
    "%-9s %14s %10s %8s %9s %10s %13s %8s"
    % (
      "config",
      "median step ms",
      "tokens/s",
      "vs tf",
      "GFLOP/s",
      "% of peak",
      "median cpu ms",
      "vs tf",
    )
  )
  base = statistics.median(times["tf"])
  base_cpu = statistics.median(cpu_times["tf"])
  worst = 0.0
  for name in models:
    median = statistics.median(times[name])
    median_cpu = statistics.median(cpu_times[name])
    if name.startswith("mtf"):
      worst = max(worst, median / base)
    print(
      "%-9s %14.1f %10.0f %8.3f %9.1f %9.1f%% %13.1f %8.3f"
      % (
        name,
        1e3 * median,
        sizes.tokens / median,
        median / base,
        sizes.flops_per_step / median / 1e9,
        100.0 * sizes.flops_per_step / median / peak_flops,
        1e3 * median_cpu,
        median_cpu / base_cpu,
      )
    )
  print(
    "worst mtf ratio: %.3f (rounds=%d, steps per round=%d)"
    % (worst, args.rounds, args.steps_per_round)
  )
  if max_rel > 1e-4 or max_rel_delta > 1e-2:
    print("ERROR: losses disagree")
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
