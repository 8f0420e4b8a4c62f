"""The rule that moves the multipliers after each step, one object that owns its
state: the PI controller (:class:`~captum_diffmask.diffmask.constrained.pi_control.PIMultiplierControl`,
the default) or a gradient rule (:class:`GradientRule`). Both take the step's
constraint values, layer by layer, and leave the multipliers in ``[0, ceiling]``;
:func:`multiplier_rule` builds the one a fit asks for."""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Sequence, Union

import torch

from captum_diffmask.diffmask.constrained.constraint import KLConstraint
from captum_diffmask.diffmask.constrained.multipliers import GRADIENT_RULES, LagrangeMultipliers
from captum_diffmask.diffmask.constrained.pi_control import DEFAULT_PI_RATE, PIMultiplierControl

#: Every multiplier rule of a fit: ``"pi"`` and the gradient rules.
MULTIPLIER_RULES = ("pi",) + GRADIENT_RULES
#: What :func:`multiplier_rule` returns.
MultiplierRule = Union[PIMultiplierControl, "GradientRule"]


class GradientRule:
    r"""
    A gradient rule (``"ascent"``, ``"damped"``, ``"balanced"``, ``"rmsprop"``:
    :meth:`LagrangeMultipliers.optimizer`) on each multiplier's gradient, the
    violation ``D - eps``. Where the constraint holds the sampled gates' KL, that
    gradient is the one the step's backward left on the multipliers; otherwise
    it is set from the step's constraint values.

    Args:

        multipliers (LagrangeMultipliers): the multipliers it moves.
        constraint (KLConstraint): the constraint they hold.
        rule (str, optional): one of :data:`GRADIENT_RULES`. Default: ``"ascent"``
        rate (float or sequence of float, optional): one rate, or one per
                    layer. Default: 1.0
    """

    def __init__(self, multipliers: LagrangeMultipliers, constraint: KLConstraint, rule: str = "ascent",
                 rate: Union[float, Sequence[float]] = 1.0) -> None:
        self.multipliers, self.constraint = multipliers, constraint
        self.optimizer = multipliers.optimizer(rate, rule=rule, eps=constraint.eps)

    def zero_grad(self) -> None:
        self.multipliers.zero_grad(set_to_none=True)

    def step(self, values: Mapping[int, float]) -> None:
        r"""One update from ``values``: layer -> the step's constraint value."""
        if self.constraint.needs_deployed_kl:
            grad = torch.zeros_like(self.multipliers.values)
            for k, value in values.items():
                grad[k] = self.constraint.excess(value)
            self.multipliers.values.grad = grad
        self.optimizer.step()
        self.multipliers.clamp_()

    def state_dict(self) -> Dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])


def multiplier_rule(
    multipliers: LagrangeMultipliers,
    constraint: KLConstraint,
    rule: str = "pi",
    rate: Union[None, float, Sequence[float]] = None,
    ceiling: float = 200.0,
    controller: Optional[Mapping[str, float]] = None,
) -> MultiplierRule:
    r"""
    The rule a fit moves its multipliers by.

    Args:

        multipliers (LagrangeMultipliers): the multipliers; their ceiling is set
                    to ``ceiling``.
        constraint (KLConstraint): the constraint they hold.
        rule (str, optional): one of :data:`MULTIPLIER_RULES`. Default: ``"pi"``
        rate (float or sequence of float, optional): the rule's rate, one or one
                    per layer; None: the rule's own (``"pi"``: 0.01 on log
                    lambda; the gradient rules: 1.0). Default: None
        ceiling (float, optional): the multipliers' largest value. Default: 200.0
        controller (dict, optional): the PI controller's settings
                    (:class:`PIMultiplierControl`). Default: None

    Returns:
        *PIMultiplierControl* or *GradientRule*.
    """
    multipliers.max_value = float(ceiling)
    chosen = default_rate(rule) if rate is None else rate
    if rule == "pi":
        return PIMultiplierControl(multipliers, constraint, lr=chosen, **(controller or {}))
    return GradientRule(multipliers, constraint, rule, chosen)


def default_rate(rule: str) -> float:
    r"""The rate of ``rule`` when none is given: ``"pi"``'s on log lambda, 1.0
    for the gradient rules."""
    return DEFAULT_PI_RATE if rule == "pi" else 1.0
