"""The hyperparameters of the mixture-of-experts layers.

`HParams` is a small bag of named values (standing in for the
tf.contrib.training.HParams the original used), and
`set_default_moe_hparams` adds the MoE defaults to one. MoE1D and MoE2D
(moe_layers.py) fill an HParams from their arguments, and the MoE
computation (moe_dispatch.py) reads it.
"""

from __future__ import annotations

from typing import Any, Dict

__all__ = [
  "HParams",
  "set_default_moe_hparams",
]


class HParams:
  """A bag of hyperparameters (stand-in for tf.contrib.training.HParams).

  Example:
    >>> hparams = HParams(moe_num_experts=16)
    >>> hparams.add_hparam("moe_gating", "top_2")
    >>> hparams.moe_gating
    'top_2'
    >>> hparams.set_hparam("moe_num_experts", 8)
    >>> hparams.values()
    {'moe_num_experts': 8, 'moe_gating': 'top_2'}
  """

  def __init__(self, **kwargs: Any):
    for name, value in kwargs.items():
      self.add_hparam(name, value)

  def add_hparam(self, k: str, v: Any) -> None:
    """Adds hyperparameter `k` with value `v`, or overwrites it.

    Overwriting is allowed (as in the original) because callers override
    the MoE defaults of set_default_moe_hparams this way.

    Args:
      k: the new hyperparameter's name.
      v: its value.

    Raises:
      ValueError: if `k` is not a usable attribute name (empty, private or
        a method of HParams).
    """
    if (
      not isinstance(k, str)
      or not k
      or k.startswith("_")
      or hasattr(type(self), k)
    ):
      raise ValueError("HParams: invalid hyperparameter name %r" % (k,))
    setattr(self, k, v)

  def set_hparam(self, name: str, value: Any) -> None:
    """Changes an existing hyperparameter.

    Args:
      name: an existing hyperparameter's name.
      value: its new value.

    Raises:
      ValueError: if `name` was never added.
    """
    if name not in self.__dict__:
      raise ValueError(
        "HParams: unknown hyperparameter %r (known: %s)"
        % (name, sorted(self.values()))
      )
    setattr(self, name, value)

  def values(self) -> Dict[str, Any]:
    """The hyperparameters as a dict name -> value.

    Returns:
      A {name: value} dict of every hyperparameter.
    """
    return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}

  def get(self, name: str, default: Any = None) -> Any:
    """The value of a hyperparameter, like dict.get.

    Args:
      name: the hyperparameter's name.
      default: the value if it is not set.

    Returns:
      The value, or `default`.
    """
    return self.__dict__.get(name, default)

  def __contains__(self, name: str) -> bool:
    return name in self.__dict__

  def __repr__(self) -> str:
    return "HParams(%s)" % ", ".join(
      "%s=%r" % kv for kv in sorted(self.values().items())
    )


def set_default_moe_hparams(hparams: HParams) -> None:
  """Sets the mixture-of-experts hyperparameters to their defaults.

  moe_num_experts and moe_loss_coef are assigned (they may exist); the
  others are added, so they must not exist yet.

  Args:
    hparams: the HParams to add the MoE defaults to (in place).
  """
  hparams.moe_num_experts = 16
  hparams.moe_loss_coef = 1e-2
  hparams.add_hparam("moe_gating", "top_2")
  # Experts have a fixed capacity per group; the factors (>= 1) leave room
  # for imperfect balance.
  hparams.add_hparam("moe_capacity_factor_train", 1.25)
  hparams.add_hparam("moe_capacity_factor_eval", 2.0)
  hparams.add_hparam("moe_capacity_factor_second_level", 1.0)
  hparams.add_hparam("moe_hidden_size", 4096)
  # Gating works on groups of this many positions; every group sends the
  # same number of positions to each expert.
  hparams.add_hparam("moe_group_size", 1024)
  hparams.add_hparam("moe_use_second_place_loss", 0)
  # Second-place expert policy of top_2: "all", "none", "threshold",
  # "random" (see moe_gating.py).
  hparams.add_hparam("moe_second_policy_train", "random")
  hparams.add_hparam("moe_second_policy_eval", "random")
  hparams.add_hparam("moe_second_threshold_train", 0.2)
  hparams.add_hparam("moe_second_threshold_eval", 0.2)
