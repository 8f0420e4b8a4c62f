"""The Lagrange multipliers, one per layer, and the gradient rules that move them.

The multipliers are float32 and clamped to ``[0, ceiling]``. A gradient rule
moves each by its gradient, the layer's violation ``D - eps`` (ascent, the
damped rule, the authors' RMSprop); the PI controller of
:mod:`~captum_diffmask.diffmask.constrained.pi_control` sets them instead, and
:mod:`~captum_diffmask.diffmask.constrained.multiplier_rules` builds the rule a
fit uses.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence, Union

import torch
from torch import nn, Tensor

from captum_diffmask.diffmask.constrained.lookahead import Lookahead

#: The multiplier updates :meth:`LagrangeMultipliers.optimizer` knows.
GRADIENT_RULES = ("damped", "ascent", "rmsprop")
#: The damped rule's largest log-decay of a multiplier a step.
DEFAULT_DECAY = 0.05


class LagrangeMultipliers(nn.Module):
    r"""
    One Lagrange multiplier per layer, lambda >= 0, trained by gradient *ascent*.

    The Lagrangian is ``L0 + lambda_k * (D - eps)``; the multiplier's gradient is
    the constraint violation ``D - eps``, so an optimiser built with
    :meth:`optimizer` (``maximize=True``) raises lambda while the constraint is
    violated and lowers it while it holds. :meth:`clamp_` keeps it in
    ``[0, max_value]`` after each step.

    Args:

        num_layers (int): how many multipliers.
        init (float, optional): initial value. Default: 1.0
        max_value (float, optional): upper clamp. Default: 200.0 (the authors')
    """

    def __init__(self, num_layers: int, init: float = 1.0, max_value: float = 200.0) -> None:
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}")
        self.values = nn.Parameter(torch.full((num_layers,), float(init), dtype=torch.float32))
        self.max_value = float(max_value)

    def forward(self, layer: Optional[int] = None) -> Tensor:
        r"""The multiplier of ``layer`` (a scalar), or all of them (num_layers,)."""
        return self.values if layer is None else self.values[layer]

    def optimizer(
        self,
        lr: Union[float, Sequence[float]] = 0.3,
        rule: str = "ascent",
        eps: float = 0.0,
        decay: float = DEFAULT_DECAY,
    ) -> torch.optim.Optimizer:
        r"""
        The multipliers' update, driven by their gradient: the constraint
        violation ``c = D - eps`` of the layer trained in the step (0 elsewhere).

        - ``"ascent"``: plain gradient ascent, ``lambda += lr * c``. Lambda rises
          fast on a large violation but falls by at most ``lr * eps`` a step, so
          after a spike it holds the gates open for hundreds of steps.
        - ``"damped"``: ``lambda += lr * c`` while the constraint is violated
          (c > 0); while it holds, ``lambda *= exp(decay * max(c / eps, -1))``:
          it falls in proportion to itself, at most by a factor ``exp(-decay)``
          a step, so a spike decays in tens of steps and no windup is left.
          (The authors' RMSprop on lambda takes steps of about ``lr`` whatever
          the violation and makes lambda jump between 0 and large values.)
          The rise is absolute and the fall relative, so they balance only near
          ``lambda = lr * eps / decay``; above it the KL settles above eps.
        - ``"rmsprop"``: the DiffMask authors' (their appendix tables): RMSprop
          ascent wrapped in Lookahead (k 6, alpha 0.5); it moves lambda by
          about ``lr`` a step whatever the violation. One rate only.

        Args:

            lr (float or sequence of float, optional): one learning rate for every
                        multiplier, or one per multiplier (``num_layers`` values):
                        e.g. a smaller one where a rare large violation (a sample
                        that masks the only state the output reads) would otherwise
                        hold the gates open for many steps. Default: 0.3
            rule (str, optional): ``"ascent"``, ``"damped"`` or ``"rmsprop"``
                        (see above).
                        Default: ``"ascent"``
            eps (float, optional): the constraint's margin, the scale of the
                        damped rule's decay. Default: 0.0
            decay (float, optional): the damped rule's largest log-decay a step.
                        Default: 0.05

        Returns:
            *torch.optim.Optimizer* over the multipliers (torch's SGD with
            ``maximize=True`` for ``"ascent"`` with one rate).
        """
        if rule not in GRADIENT_RULES:
            raise ValueError(f"multiplier must be one of {GRADIENT_RULES}, got {rule!r}")
        if not decay >= 0:
            raise ValueError(f"decay must be >= 0, got {decay!r}")
        rates = multiplier_rates(lr, self.values.numel())
        if rule == "rmsprop":
            if rates is not None:
                raise ValueError("lr_lambda must be one rate with multiplier='rmsprop'")
            return Lookahead(torch.optim.RMSprop([self.values], lr=float(lr), maximize=True))  # type: ignore[arg-type]
        if rule == "ascent" and rates is None:
            # torch's SGD for one rate: the same arithmetic as before per-layer
            # rates existed, so earlier fits reproduce bit for bit
            return torch.optim.SGD([self.values], lr=float(lr), maximize=True)  # type: ignore[arg-type]
        per_layer = [float(lr)] * self.values.numel() if rates is None else rates  # type: ignore[arg-type]
        rate = torch.tensor(per_layer, dtype=self.values.dtype, device=self.values.device)
        if rule == "ascent":
            return _ElementwiseAscent(self.values, rate)
        return _DampedAscent(self.values, rate, eps, decay)

    @torch.no_grad()
    def clamp_(self) -> None:
        r"""Projects every multiplier back to ``[0, max_value]``."""
        self.values.clamp_(0.0, self.max_value)


def multiplier_rates(lr: Union[float, Sequence[float]], num_layers: int) -> Optional[List[float]]:
    r"""
    Checks the multipliers' learning rate(s).

    Args:

        lr (float or sequence of float): one rate, or one per layer.
        num_layers (int): the number of multipliers (layers 0..L: L + 1).

    Returns:
        *None* for one rate, else the ``num_layers`` rates as floats.

    Raises:
        ValueError naming ``lr_lambda`` when the count is wrong or a rate is < 0.
    """
    if isinstance(lr, (int, float)) and not isinstance(lr, bool):
        return None
    rates = [float(r) for r in lr]
    if len(rates) != num_layers or not all(r >= 0 for r in rates):
        raise ValueError(f"lr_lambda must be a float or {num_layers} rates >= 0 (one per layer), got {rates!r}")
    return rates


class _DampedAscent(torch.optim.Optimizer):
    r"""The ``"damped"`` rule of :meth:`LagrangeMultipliers.optimizer`: a
    geometric decay (at most ``exp(-decay)`` a step) while the constraint holds,
    additive ascent while it is violated. Elements with a zero gradient (the
    layers not trained in the step) or a zero rate do not move."""

    def __init__(self, param: nn.Parameter, lr: Tensor, eps: float, decay: float) -> None:
        super().__init__([param], {"lr": lr})
        # eps = 0 leaves no slack to decay in: any c < 0 is impossible then
        self.scale = max(float(eps), 1e-12)
        self.decay = float(decay)

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Any]] = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                violation = p.grad
                relative = violation / self.scale
                rise = group["lr"] * violation
                fall = p * torch.exp(self.decay * relative.clamp(min=-1.0))
                new = torch.where(violation > 0, p + rise, fall)
                p.copy_(torch.where(group["lr"] > 0, new, p))  # rate 0: a fixed multiplier


class _ElementwiseAscent(torch.optim.Optimizer):
    r"""Gradient ascent with one learning rate per element of a single parameter
    (``p += lr * grad``, elementwise): per-layer rates for the multipliers, which
    share one parameter vector."""

    def __init__(self, param: nn.Parameter, lr: Tensor) -> None:
        super().__init__([param], {"lr": lr})

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], Any]] = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad * group["lr"])
