"""mesh_tensorflow.experimental.data_aug_lib: 3-D CT data augmentation."""
# pylint: disable=useless-import-alias

from mesh_tensorflow._src.experimental.data_aug_lib import (
  image_corruption as image_corruption,
)
from mesh_tensorflow._src.experimental.data_aug_lib import (
  intensity_shift as intensity_shift,
)
from mesh_tensorflow._src.experimental.data_aug_lib import (
  maybe_add_noise as maybe_add_noise,
)
from mesh_tensorflow._src.experimental.data_aug_lib import (
  maybe_flip as maybe_flip,
)
from mesh_tensorflow._src.experimental.data_aug_lib import (
  maybe_gen_fake_data_based_on_real_data as maybe_gen_fake_data_based_on_real_data,
)
from mesh_tensorflow._src.experimental.data_aug_lib import (
  maybe_rot180 as maybe_rot180,
)
from mesh_tensorflow._src.experimental.data_aug_lib import (
  projective_transform as projective_transform,
)

__all__ = [
  "image_corruption",
  "intensity_shift",
  "maybe_add_noise",
  "maybe_flip",
  "maybe_gen_fake_data_based_on_real_data",
  "maybe_rot180",
  "projective_transform",
]
