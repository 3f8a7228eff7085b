"""mesh_tensorflow.experimental.unet: a U-Net split spatially over the mesh."""
# pylint: disable=useless-import-alias

import mesh_tensorflow as mtf  # noqa: F401  (the original's module aliases)
from mesh_tensorflow._src.experimental.unet import (
  conv_with_spatial_partition as conv_with_spatial_partition,
)
from mesh_tensorflow._src.experimental.unet import (
  deconv_with_spatial_partition as deconv_with_spatial_partition,
)
from mesh_tensorflow._src.experimental.unet import (
  unet_with_spatial_partition as unet_with_spatial_partition,
)
from mesh_tensorflow._src.experimental.unet_data import (
  PostProcessor as PostProcessor,
)
from mesh_tensorflow._src.experimental.unet_data import (
  get_dataset_creator as get_dataset_creator,
)
from mesh_tensorflow._src.experimental.unet_data import (
  get_input_mtf_shapes as get_input_mtf_shapes,
)
from mesh_tensorflow._src.experimental.unet_hparams import Hparams as Hparams
from mesh_tensorflow._src.experimental.unet_hparams import (
  define_flags as define_flags,
)
from mesh_tensorflow._src.experimental.unet_hparams import (
  get_layout as get_layout,
)
from mesh_tensorflow._src.experimental.unet_hparams import hparams as hparams
from mesh_tensorflow._src.experimental.unet_hparams import (
  hparams_scope as hparams_scope,
)
from mesh_tensorflow.experimental import data_aug_lib  # noqa: F401

__all__ = [
  "Hparams",
  "PostProcessor",
  "conv_with_spatial_partition",
  "deconv_with_spatial_partition",
  "define_flags",
  "get_dataset_creator",
  "get_input_mtf_shapes",
  "get_layout",
  "hparams",
  "hparams_scope",
  "unet_with_spatial_partition",
]
