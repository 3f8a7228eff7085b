"""mesh_tensorflow.tpu_variables: ReplicatedVariable (facade)."""
# pylint: disable=g-importing-member,useless-import-alias

from mesh_tensorflow._src.tpu_variables import TF_23 as TF_23
from mesh_tensorflow._src.tpu_variables import (
  ReplicatedVariable as ReplicatedVariable,
)

__all__ = ["ReplicatedVariable", "TF_23"]
