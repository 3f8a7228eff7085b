"""mesh_tensorflow.layers: user-level layers built on mtf ops (facade).

Dense and embedding layers, normalization, losses, attention, convolution and
pooling. The code lives in `mesh_tensorflow/_src/layers/`.
"""
# pylint: disable=wildcard-import,unused-wildcard-import

from mesh_tensorflow._src import facade as _facade
from mesh_tensorflow._src.layers.attention import *
from mesh_tensorflow._src.layers.attention_masks import *
from mesh_tensorflow._src.layers.blocked_conv import *
from mesh_tensorflow._src.layers.conv import *
from mesh_tensorflow._src.layers.core import *
from mesh_tensorflow._src.layers.local_attention import *
from mesh_tensorflow._src.layers.losses import *
from mesh_tensorflow._src.layers.memory_compressed_attention import *
from mesh_tensorflow._src.layers.norms import *
from mesh_tensorflow._src.layers.training_layers import *

_facade.make_patchable(__name__)
del _facade
