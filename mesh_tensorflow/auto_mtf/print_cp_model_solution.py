"""mesh_tensorflow.auto_mtf.print_cp_model_solution: prints a solution."""
# pylint: disable=g-importing-member,useless-import-alias

from mesh_tensorflow._src.auto_mtf.print_cp_model_solution import (
  print_solution as print_solution,
)

__all__ = ["print_solution"]
