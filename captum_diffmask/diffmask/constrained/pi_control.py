"""The ``"pi"`` multiplier rule: each layer's Lagrange multiplier set by a PI
controller on a smoothed estimate of its constraint.

Gradient ascent on a Lagrange multiplier integrates one batch's violation at a
time: the multiplier follows the mini-batch noise, overshoots, and the gates it
drives oscillate (Sohrabi et al., "On PI Controllers for Updating Lagrange
Multipliers in Constrained Optimization", ICML 2024). Here, per layer:

- the constraint is estimated by an exponential moving average of the step's
  divergences (GECO's smoothing, Rezende and Viola 2018), so the multiplier
  follows the trend, not one batch;
- the error is that estimate relative to eps, ``e = clamp(D / eps - 1, -1,
  max_error)``: the same gains whatever eps is in nats, and a sample that
  masks something the output needs (a KL a hundred times eps) pushes no
  harder than ``max_error``;
- the multiplier moves in log space, ``log lambda`` by Cooper's nuPI
  optimiser (``cooper-optim``; proportional and integral gains), so one rate
  serves multipliers of 0.1 (the toy task) and of 10 (SST), and a rise and a
  fall of the same error are the same factor: the controller settles where
  the smoothed divergence equals eps, with no bias at large lambda.
"""

from __future__ import annotations

import copy
import math
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

import torch
from cooper.optim import nuPI
from cooper.optim.torch_optimizers import nuPIInitType
from torch import nn

from captum_diffmask.diffmask.constrained.constraint import KLConstraint
from captum_diffmask.diffmask.constrained.multipliers import LagrangeMultipliers, multiplier_rates

#: The controller's step on log lambda when a fit gives no rate.
DEFAULT_PI_RATE = 0.01

class PIMultiplierControl:
    r"""
    Sets the multipliers of a :class:`LagrangeMultipliers` from the observed
    divergences, layer by layer.

    Args:

        multipliers (LagrangeMultipliers): the multipliers it sets.
        constraint (KLConstraint): the constraint they hold (its eps > 0).
        lr (float or sequence of float, optional): nuPI's step on ``log
                    lambda`` per unit of error; one for every layer or one per
                    layer. Default: 0.01
        kp (float, optional): the proportional gain (on the change of the
                    error): ``lr * kp`` is the immediate change of ``log
                    lambda`` per unit of error. Default: 50.0
        ki (float, optional): the integral gain. Default: 1.0
        smoothing (float, optional): the moving average's weight of the past,
                    in [0, 1): 0.9 averages about ten steps of a layer.
                    Default: 0.9
        max_error (float, optional): the largest error a step feeds the
                    controller (a KL of 4 eps). Default: 3.0
        floor (float, optional): the least multiplier (log space has no 0);
                    at it a multiplier is effectively 0. Default: 0.01
    """

    def __init__(
        self,
        multipliers: LagrangeMultipliers,
        constraint: KLConstraint,
        lr: Union[float, Sequence[float]] = DEFAULT_PI_RATE,
        kp: float = 50.0,
        ki: float = 1.0,
        smoothing: float = 0.9,
        max_error: float = 3.0,
        floor: float = 0.01,
    ) -> None:
        if not constraint.eps > 0:
            raise ValueError(f"eps must be > 0 for the 'pi' multiplier, got {constraint.eps!r}")
        if not 0 <= smoothing < 1:
            raise ValueError(f"smoothing must be in [0, 1), got {smoothing!r}")
        rates = multiplier_rates(lr, multipliers.values.numel())
        for name, value in (("lr", 0.0 if rates else lr), ("kp", kp), ("ki", ki), ("max_error", max_error), ("floor", floor)):
            if not value >= 0:
                raise ValueError(f"{name} must be >= 0, got {value!r}")
        self.multipliers = multipliers
        self.constraint, self.smoothing = constraint, float(smoothing)
        self.max_error, self.floor = float(max_error), float(floor)
        values = multipliers.values.detach()
        # One log-multiplier parameter per layer: a layer a step does not train
        # has no gradient, and nuPI leaves it and its error state alone.
        self.log_values = [nn.Parameter(torch.log(v.clamp(min=self.floor)).reshape(1)) for v in values.cpu()]
        per_layer = rates or [float(lr)] * len(self.log_values)  # type: ignore[arg-type]
        groups = [{"params": [p], "lr": rate} for p, rate in zip(self.log_values, per_layer)]
        # gains as 1-element tensors: nuPI takes several groups (one rate per layer) only so
        self.optimizer = nuPI(groups, lr=per_layer[0], Kp=torch.tensor([float(kp)]), Ki=torch.tensor([float(ki)]),
                              maximize=True)
        #: layer -> the smoothed divergence (None before its first step)
        self.estimates: List[Optional[float]] = [None] * len(self.log_values)

    def observe(self, layer: int, divergence: float) -> float:
        r"""Folds one step's divergence of ``layer`` into its estimate; returns
        the estimate."""
        before = self.estimates[layer]
        value = float(divergence)
        estimate = value if before is None else self.smoothing * before + (1 - self.smoothing) * value
        self.estimates[layer] = estimate
        return estimate

    def error(self, layer: int) -> float:
        r"""The controller's input for ``layer``: its estimate relative to eps, clamped."""
        estimate = self.estimates[layer]
        if estimate is None:
            raise ValueError(f"layer {layer} has no observed divergence yet")
        return min(max(self.constraint.relative_error(estimate), -1.0), self.max_error)

    def zero_grad(self) -> None:
        r"""Clears the gradient a step's backward left on the multipliers (the
        controller sets them from the constraint values, not from it)."""
        self.multipliers.zero_grad(set_to_none=True)

    def step(self, divergences: Mapping[int, float]) -> None:
        r"""
        One controller step for the layers of a training step.

        Args:

            divergences (Mapping[int, float]): layer -> the constraint's value
                        at that step (e.g. the mean KL of the masked batch), for
                        the layers the step trained.
        """
        for p in self.log_values:
            p.grad = None
        for layer, divergence in divergences.items():
            self.observe(layer, divergence)
            self.log_values[layer].grad = torch.tensor([self.error(layer)])
        self.optimizer.step()
        low, high = math.log(self.floor), math.log(max(self.multipliers.max_value, self.floor))
        with torch.no_grad():
            for layer in divergences:
                self.log_values[layer].clamp_(low, high)
                self.multipliers.values[layer] = self.log_values[layer].exp()[0].to(self.multipliers.values)
        self.multipliers.clamp_()

    def state_dict(self) -> Dict[str, Any]:
        r"""The controller's state (estimates, log-multipliers, nuPI's memory)."""
        # a copy: nuPI updates its error memory in place, and torch's
        # load_state_dict keeps tensors it need not cast
        optimizer = copy.deepcopy(self.optimizer.state_dict())
        for group in optimizer["param_groups"]:  # nuPI's enum as its name: a fit state holds plain values
            group["init_type"] = group["init_type"].name
        return {"estimates": list(self.estimates), "log_values": [float(p.detach()) for p in self.log_values],
                "optimizer": optimizer}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        r"""Restores a :meth:`state_dict`."""
        self.estimates = list(state["estimates"])
        with torch.no_grad():
            for p, value in zip(self.log_values, state["log_values"]):
                p.fill_(float(value))
        optimizer = copy.deepcopy(dict(state["optimizer"]))
        for group in optimizer["param_groups"]:
            group["init_type"] = nuPIInitType[group["init_type"]]
        self.optimizer.load_state_dict(optimizer)
