"""The Mesh TensorFlow Transformer library (also `mesh_tensorflow.transformer`).

As in the original, importing the package imports the model modules
(attention, dataset, learning_rate_schedules, moe, transformer,
transformer_layers, utils, vocabulary), so their gin configurables are
registered; the research modules (adaptive_softmax, vocab_embeddings,
funnel/universal/evolved transformers, fixup and memory layers) are imported
on demand.
"""

from transformer import attention
from transformer import dataset
from transformer import learning_rate_schedules
from transformer import moe
from transformer import transformer
from transformer import transformer_layers
from transformer import utils
from transformer import vocabulary
