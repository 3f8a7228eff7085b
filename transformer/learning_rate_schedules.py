"""mesh_tensorflow.transformer.learning_rate_schedules: learning-rate schedules.

A facade over transformer/_src/driver/learning_rate_schedules.py.
"""
# pylint: disable=g-importing-member,useless-import-alias

from transformer._src.driver.learning_rate_schedules import Number as Number
from transformer._src.driver.learning_rate_schedules import Step as Step
from transformer._src.driver.learning_rate_schedules import constant as constant
from transformer._src.driver.learning_rate_schedules import (
  constant_learning_rate as constant_learning_rate,
)
from transformer._src.driver.learning_rate_schedules import (
  learning_rate_schedule_noam as learning_rate_schedule_noam,
)
from transformer._src.driver.learning_rate_schedules import (
  linear_decay as linear_decay,
)
from transformer._src.driver.learning_rate_schedules import (
  linear_decay_learning_rate as linear_decay_learning_rate,
)
from transformer._src.driver.learning_rate_schedules import (
  linear_warmup as linear_warmup,
)
from transformer._src.driver.learning_rate_schedules import (
  product_learning_rate as product_learning_rate,
)
from transformer._src.driver.learning_rate_schedules import (
  slanted_triangular as slanted_triangular,
)
from transformer._src.driver.learning_rate_schedules import (
  truncated_rsqrt as truncated_rsqrt,
)

__all__ = [
  "constant",
  "constant_learning_rate",
  "learning_rate_schedule_noam",
  "linear_decay",
  "linear_decay_learning_rate",
  "linear_warmup",
  "product_learning_rate",
  "slanted_triangular",
  "truncated_rsqrt",
]
