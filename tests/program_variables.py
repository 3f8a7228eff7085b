"""Fixed variable values for the programs run against both packages.

The bert and unet programs (tests/bert/bert_programs.py,
tests/experimental/unet_programs.py) build a tf.compat.v1 graph with this
package or the original 0.1.21 and give the trained variables the same
random values on both sides, drawn from one numpy RandomState in the order
of the variables' names. Only TensorFlow and numpy are imported here, so the
programs stay independent of the package under test.
"""

from typing import Dict, Sequence, Tuple

import numpy as np
import tensorflow as tf

tf1 = tf.compat.v1


def set_master_values(
  names: Sequence[str], assigned: Sequence[str], rng: np.random.RandomState
) -> Tuple[Dict[str, tf.Variable], tf.Operation]:
  """The masters of the graph's mtf variables and an op that fixes some.

  Args:
    names: the names of the mtf variables whose masters are returned.
    assigned: those (in this order) that get the values N(0, 0.5^2), drawn
      from rng one variable after the other.
    rng: the RandomState the values are drawn from.

  Returns:
    ({name: master tf.Variable} for names, the op assigning the values).
  """
  masters = {v.op.name: v for v in tf1.global_variables()}
  masters = {n: masters[n] for n in names}
  set_values = tf.group(
    [
      masters[n].assign(
        rng.normal(size=masters[n].shape.as_list()).astype(np.float32) * 0.5
      )
      for n in assigned
    ]
  )
  return masters, set_values
