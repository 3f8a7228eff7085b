"""Position-wise feed-forward layers: DenseReluDense and ParallelLayer.

DenseReluDense is the transformer's feed-forward block: x -> act(x W_i) W_o,
with the hidden dimension named "d_ff" (layouts split it over the model
axis). A list of activations gives a gated unit: the hidden activation is
the product of one projection per activation (["gelu", "linear"] is the
gated GELU of T5.1.1). ParallelLayer runs several layers on one input and
sums their outputs.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence, Union

import gin
import tensorflow as tf

import mesh_tensorflow as mtf
from mesh_tensorflow import ops_with_redefined_builtins as mtf_ops
from transformer._src.layers.context import Context
from transformer._src.layers.context import TransformerLayer
from transformer._src.layers.self_attention import SelfAttention

__all__ = ["DenseReluDense", "ParallelLayer"]

_GIN_MODULE = "mesh_tensorflow.transformer.transformer_layers"

# Names accepted besides the mtf function names (e.g. "relu", "gelu",
# "swish", "sigmoid", "tanh", "elu", "selu", "softplus", "leaky_relu",
# "square", "exp") that mtf.layers.dense_product resolves itself.
_ACTIVATION_ALIASES = {"silu": "swish", "identity": "linear"}


def resolve_activation(activation, layer_name: str) -> Optional[Callable]:
  """The activation function of a layer: None (linear) or a callable.

  Names resolve to mtf functions (as mtf.layers does); "silu" is an alias of
  "swish", "linear" and "identity" mean no activation.

  Args:
    activation: None, a name or a callable.
    layer_name: the layer, named in errors.

  Returns:
    None for no activation, else a function of one mtf.Tensor.

  Raises:
    ValueError: an unknown name, or neither a string nor a callable.
  """
  if activation is None:
    return None
  if isinstance(activation, str):
    name = _ACTIVATION_ALIASES.get(activation, activation)
    if name == "linear":
      return None
    fn = getattr(mtf_ops, name, None)
    if (
      fn is None
      or name.startswith("_")
      or isinstance(fn, type)
      or not callable(fn)
    ):
      raise ValueError(
        "%s: unknown activation %r; expected the name of an mtf function "
        "such as 'relu', 'gelu', 'swish', 'silu', 'sigmoid', 'tanh' or "
        "'linear'" % (layer_name, activation)
      )
    return fn
  if callable(activation):
    return activation
  raise ValueError(
    "%s: activation must be a string, a callable or a list of "
    "them, got %r" % (layer_name, activation)
  )


def _ensemble_dims(context: Context):
  dims = getattr(context.model, "ensemble_dims", None)
  return list(dims) if dims else []


@gin.configurable(module=_GIN_MODULE)
class DenseReluDense(TransformerLayer):
  """Feed-forward block: act(x wi) wo, hidden dimension "d_ff".

  Variables (relative to the layer's scope): `wi/kernel` [d_model, d_ff]
  (`wi_0/kernel`, `wi_1/kernel`, ... when `activation` is a list: the
  hidden activation is the product of the factors), `wo/kernel`
  [d_ff, d_model], plus `wi/bias` [d_ff] and `wo/bias` [d_model] with
  use_bias. Ensemble dims of the model lead every variable shape.

  Example (a gated GELU layer in a one-layer language model):
    >>> from transformer import transformer
    >>> stack = transformer.make_layer_stack(
    ...     [(DenseReluDense, {"hidden_size": 16,
    ...                        "activation": ["gelu", "linear"]})],
    ...     num_layers=1)
    >>> lm = transformer.Unitransformer(
    ...     stack, d_model=8, input_vocab_size=16, output_vocab_size=16,
    ...     autoregressive=True, max_length=4, vocab_divisor=1)
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> ids = converter.convert_np_array_to_mtf_tensor(
    ...     [[3, 5, 7, 1]], ["batch", "length"])
    >>> logits, _ = lm.call_simple(ids, ids, compute_loss=False)
    >>> converter.convert_mtf_tensor_to_np_array(logits).shape
    (1, 4, 16)
    >>> prefix = "transformer/block_000/layer_000/DenseReluDense/"
    >>> for v in converter.graph.all_variables:  # the layer's variables
    ...   if v.name.startswith(prefix):
    ...     print(v.name[len(prefix):], v.shape)
    wi_0/kernel Shape[d_model=8, d_ff=16]
    wi_1/kernel Shape[d_model=8, d_ff=16]
    wo/kernel Shape[d_ff=16, d_model=8]
  """

  def __init__(
    self,
    hidden_size: int = 4096,
    dropout_rate: float = 0.0,
    activation: Union[str, Sequence[str]] = "relu",
    use_bias: bool = False,
  ):
    """Creates the layer.

    Args:
      hidden_size: size of the hidden dimension "d_ff".
      dropout_rate: dropout on the hidden activations in training (the mask
        is shared along the length dimension).
      activation: an mtf function name ("relu", "gelu", "swish"/"silu",
        "sigmoid", "tanh", "linear", ...) or a callable, or a list of them
        for a gated unit (product of the activated projections).
      use_bias: add biases to both projections.
    """
    self.hidden_size = hidden_size
    self.dropout_rate = dropout_rate
    self.activation = activation
    self.use_bias = use_bias

  # Kernel initializers of wi and wo (None: mtf.layers' defaults);
  # subclasses may override them.
  def _wi_initializer(self):
    return None

  def _wo_initializer(self):
    return None

  def call(self, context: Context, x: mtf.Tensor, losses=None) -> mtf.Tensor:
    """x [batch..., (length,) d_model] -> same shape.

    Raises:
      ValueError: if hidden_size is not a positive int, dropout_rate is not in
        [0, 1), or activation is an empty list.
    """
    del losses
    name = type(self).__name__
    if not isinstance(self.hidden_size, int) or self.hidden_size < 1:
      raise ValueError(
        "%s: hidden_size must be a positive int, got %r"
        % (name, self.hidden_size)
      )
    if not 0.0 <= self.dropout_rate < 1.0:
      raise ValueError(
        "%s: dropout_rate must be in [0, 1), got %r" % (name, self.dropout_rate)
      )
    if isinstance(self.activation, (list, tuple)):
      if not self.activation:
        raise ValueError("%s: activation is an empty list" % name)
      activations = [resolve_activation(a, name) for a in self.activation]
    else:
      activations = resolve_activation(self.activation, name)
    io_dim = x.shape.dims[-1]
    hidden_dim = mtf.Dimension("d_ff", self.hidden_size)
    expert_dims = _ensemble_dims(context)
    h = mtf.layers.dense_product(
      x,
      reduced_dims=[io_dim],
      new_dims=[hidden_dim],
      activation_functions=activations,
      name="wi",
      use_bias=self.use_bias,
      variable_dtype=context.variable_dtype,
      expert_dims=expert_dims,
      kernel_initializer=self._wi_initializer(),
    )
    if context.train and self.dropout_rate != 0.0:
      h = mtf.dropout(
        h,
        context.train,
        keep_prob=1.0 - self.dropout_rate,
        noise_shape=h.shape - [context.length_dim],
      )
    return mtf.layers.dense(
      h,
      [io_dim],
      reduced_dims=[hidden_dim],
      use_bias=self.use_bias,
      activation=None,
      variable_dtype=context.variable_dtype,
      name="wo",
      expert_dims=expert_dims,
      kernel_initializer=self._wo_initializer(),
    )


@gin.configurable(module=_GIN_MODULE)
class ParallelLayer(TransformerLayer):
  """Several layers applied to the same input; their outputs are summed and
  divided by sqrt(number of layers), as the original does.

  Each entry of layer_classes is a TransformerLayer class (instantiated
  with no arguments, so gin configures it) or an instance. With use_scope,
  layer i creates its variables under `parallel_layer_<i>/`.

  Example (DenseReluDense(x) + SelfAttention(x) in a one-layer model):
    >>> from transformer import transformer
    >>> stack = transformer.make_layer_stack(
    ...     [(ParallelLayer,
    ...       {"layer_classes": (DenseReluDense, SelfAttention)})],
    ...     num_layers=1)
    >>> lm = transformer.Unitransformer(
    ...     stack, d_model=8, input_vocab_size=16, output_vocab_size=16,
    ...     autoregressive=True, max_length=4, vocab_divisor=1)
    >>> converter = mtf.test_utils.NumpyConverter()
    >>> ids = converter.convert_np_array_to_mtf_tensor(
    ...     [[3, 5, 7, 1]], ["batch", "length"])
    >>> logits, _ = lm.call_simple(ids, ids, compute_loss=False)
    >>> converter.convert_mtf_tensor_to_np_array(logits).shape
    (1, 4, 16)
    >>> prefix = "transformer/block_000/layer_000/ParallelLayer/"
    >>> for v in converter.graph.all_variables:  # the layer's variables
    ...   if v.name.startswith(prefix):
    ...     print(v.name[len(prefix):], v.shape)
    parallel_layer_0/wi/kernel Shape[d_model=8, d_ff=4096]
    parallel_layer_0/wo/kernel Shape[d_ff=4096, d_model=8]
    parallel_layer_1/q Shape[d_model=8, heads=1024]
    parallel_layer_1/k Shape[d_model=8, heads=1024]
    parallel_layer_1/v Shape[d_model=8, heads=1024]
    parallel_layer_1/o Shape[heads=1024, d_model=8]

  Args:
    layer_classes: the TransformerLayer classes (or instances) whose outputs are
      summed.
    use_scope: create each layer's variables under its own scope
      ("parallel_layer_<i>").

  Raises:
    ValueError: if layer_classes is empty or holds something other than
      TransformerLayer classes or instances.
  """

  def __init__(
    self, layer_classes=(DenseReluDense, SelfAttention), use_scope: bool = True
  ):
    if not layer_classes:
      raise ValueError("ParallelLayer: layer_classes is empty")
    layers = []
    for entry in layer_classes:
      if isinstance(entry, TransformerLayer):
        layers.append(entry)
      elif isinstance(entry, type) and issubclass(entry, TransformerLayer):
        layers.append(entry())
      else:
        raise ValueError(
          "ParallelLayer: layer_classes entries must be "
          "TransformerLayer classes or instances, got %r" % (entry,)
        )
    self.layer_classes = layers
    self.use_scope = use_scope

  def call(self, context: Context, x: mtf.Tensor, losses=None) -> mtf.Tensor:
    """sum_i layer_i(x) / sqrt(len(layer_classes)).

    Args:
      context: the Context of the call.
      x: the input.
      losses: passed on to each layer.

    Returns:
      the scaled sum of the layers' outputs.
    """
    outputs = []
    for i, layer in enumerate(self.layer_classes):
      if self.use_scope:
        with tf.compat.v1.variable_scope("parallel_layer_%d" % i):
          outputs.append(layer.call(context, x, losses=losses))
      else:
        outputs.append(layer.call(context, x, losses=losses))
    return mtf.add_n(outputs) * (len(outputs) ** -0.5)
