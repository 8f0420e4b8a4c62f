"""DiffMask's constraint: the masked model's output within eps of the original.

``KL(original || masked) <= eps`` on the batch mean, one per trained layer. The
:class:`KLConstraint` is the one owner of eps: the step's Lagrangian takes its
violation from it, the multiplier rule its error, the convergence criterion its
verdict, and the checkpoint selection its default bound. It also says which KL
the multipliers hold: that of the sampled gates the probe is trained with, that
of the deterministic gates ``attribute`` deploys, or the larger of the two.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from torch import Tensor

#: What the multipliers hold within eps (:attr:`KLConstraint.measure`).
MEASURES = ("sampled", "deployed", "deterministic")


@dataclass(frozen=True)
class KLConstraint:
    r"""
    ``KL(original || masked) <= eps`` on the batch mean, per layer.

    Args:

        eps (float): the margin, in nats (>= 0).
        measure (str, optional): what the multipliers hold within eps:
                    ``"sampled"``, the mean KL under the sampled gates the
                    probe is trained with (the paper); ``"deployed"``, the
                    larger of that and the KL under the deterministic gates
                    that ``attribute`` and ``masked_forward`` return (one more
                    masked pass per layer and step, without gradients), so
                    that what is deployed meets the bound; or
                    ``"deterministic"``, the deterministic gates' KL alone.
                    Default: ``"deployed"``

    Raises:
        ValueError naming ``eps`` or ``constraint`` (the fit's name of ``measure``).
    """

    eps: float
    measure: str = "deployed"

    def __post_init__(self) -> None:
        if isinstance(self.eps, bool) or not isinstance(self.eps, (int, float)) or not self.eps >= 0:
            raise ValueError(f"eps must be a number >= 0, got {self.eps!r}")
        if self.measure not in MEASURES:
            raise ValueError(f"constraint must be one of {MEASURES}, got {self.measure!r}")
        object.__setattr__(self, "eps", float(self.eps))

    @property
    def needs_deployed_kl(self) -> bool:
        r"""Whether a step measures the deterministic gates' KL (a pass more)."""
        return self.measure != "sampled"

    def violation(self, kl: Tensor) -> Tensor:
        r"""``kl - eps``: the term the multiplier weighs in the Lagrangian
        (differentiable in ``kl``, a scalar mean KL)."""
        return kl - self.eps

    def value(self, sampled: float, deployed: Optional[float] = None) -> float:
        r"""The step's constraint value, the KL the multiplier holds within eps,
        from the sampled gates' mean KL and (unless ``measure="sampled"``) the
        deterministic gates'."""
        if self.measure == "sampled":
            return sampled
        if deployed is None:
            raise ValueError(f"constraint {self.measure!r} needs the deterministic gates' KL")
        return deployed if self.measure == "deterministic" else max(sampled, deployed)

    def excess(self, value: float) -> float:
        r"""``value - eps``: the violation a gradient rule moves a multiplier by."""
        return value - self.eps

    def relative_error(self, value: float) -> float:
        r"""``value / eps - 1``: the violation in units of eps (a controller's
        error, the same whatever eps is in nats)."""
        return value / self.eps - 1.0

    def exceeds(self, value: float, tolerance: float = 0.0) -> bool:
        r"""Whether ``value`` is above ``eps * (1 + tolerance)``."""
        return value > self.eps * (1 + tolerance)

    def is_slack(self, value: float, tolerance: float = 0.0) -> bool:
        r"""Whether ``value`` is below ``eps * (1 - tolerance)``: the constraint
        does not bind."""
        return value < self.eps * (1 - tolerance)
