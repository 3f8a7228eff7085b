"""mesh_tensorflow.optimize: optimizers producing mtf assignments (facade).

Usage:
  opt = mtf.optimize.AdafactorOptimizer()
  update_ops = opt.apply_grads(grads, graph.trainable_variables)

The code lives in `mesh_tensorflow/_src/optimizers/`.
"""

from mesh_tensorflow._src.optimizers.adafactor import (
  AdafactorOptimizer as AdafactorOptimizer,
)
from mesh_tensorflow._src.optimizers.adafactor import (
  AdafactorWithMultiLRSchedule as AdafactorWithMultiLRSchedule,
)
from mesh_tensorflow._src.optimizers.adafactor import (
  adafactor_decay_rate_adam as adafactor_decay_rate_adam,
)
from mesh_tensorflow._src.optimizers.adafactor import (
  adafactor_decay_rate_pow as adafactor_decay_rate_pow,
)
from mesh_tensorflow._src.optimizers.adafactor import (
  adafactor_optimizer_from_hparams as adafactor_optimizer_from_hparams,
)
from mesh_tensorflow._src.optimizers.adafactor import (
  make_optimizer as make_optimizer,
)
from mesh_tensorflow._src.optimizers.adam import (
  AdamWeightDecayOptimizer as AdamWeightDecayOptimizer,
)
from mesh_tensorflow._src.optimizers.adam import (
  AdamWithMultiLRSchedule as AdamWithMultiLRSchedule,
)
from mesh_tensorflow._src.optimizers.base import Optimizer as Optimizer
from mesh_tensorflow._src.optimizers.base import (
  clip_by_global_norm as clip_by_global_norm,
)
from mesh_tensorflow._src.optimizers.base import reduce_rms as reduce_rms
from mesh_tensorflow._src.optimizers.global_step import (
  get_or_create_global_step as get_or_create_global_step,
)
from mesh_tensorflow._src.optimizers.schedules import (
  compute_lr_for_step as compute_lr_for_step,
)
from mesh_tensorflow._src.optimizers.schedules import (
  product_learning_rate as product_learning_rate,
)
from mesh_tensorflow._src.optimizers.sgd import (
  MomentumOptimizer as MomentumOptimizer,
)
from mesh_tensorflow._src.optimizers.sgd import SgdOptimizer as SgdOptimizer

__all__ = [
  # The original mtf.optimize API.
  "AdafactorOptimizer",
  "AdafactorWithMultiLRSchedule",
  "AdamWeightDecayOptimizer",
  "AdamWithMultiLRSchedule",
  "MomentumOptimizer",
  "Optimizer",
  "SgdOptimizer",
  "adafactor_decay_rate_adam",
  "adafactor_decay_rate_pow",
  "adafactor_optimizer_from_hparams",
  "compute_lr_for_step",
  "make_optimizer",
  "product_learning_rate",
  "reduce_rms",
  # Additions of the TF2 port.
  "clip_by_global_norm",
  "get_or_create_global_step",
]
