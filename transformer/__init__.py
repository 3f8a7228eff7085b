"""The Mesh TensorFlow Transformer library (also `mesh_tensorflow.transformer`).

As in the original, importing the package imports the model modules
(attention, dataset, learning_rate_schedules, moe, transformer,
transformer_layers, utils, vocabulary), so their gin configurables are
registered; the research modules (adaptive_softmax, vocab_embeddings,
funnel/universal/evolved transformers, fixup and memory layers,
heterogeneous_moe) are imported on demand.
"""

from transformer._src import quiet as _quiet

# `python -m transformer.main` and opted-in scripts import TensorFlow without
# its C++ start-up lines (a no-op for library users).
_quiet.import_tensorflow_for_entry_point()

from transformer import attention
from transformer import dataset
from transformer import learning_rate_schedules
from transformer import moe
from transformer import transformer
from transformer import transformer_layers
from transformer import utils
from transformer import vocabulary
