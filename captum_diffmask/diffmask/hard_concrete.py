"""The Hard Concrete distribution: a stretched and rectified Binary Concrete.

A Hard Concrete variable ``z`` lives on ``[0, 1]`` with a point mass at exactly 0
(and, when the stretch reaches past 1, at exactly 1). DiffMask uses it for its
gates: ``z = 0`` replaces a token by the baseline, any ``z > 0`` leaks some of the
token. Sampling is reparameterised, so gradients reach the logits, and the
probability of a non-zero gate has a closed form, which is both the L0 penalty and
the attribution.

With the authors' settings (temperature 0.2, stretch ``(-0.2, 1.0)``) the upper end
of the stretch is 1, so there is no mass at 1 and samples lie in ``[0, 1)``.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

#: The authors' code: temperature and stretch ``(l, r)``.
DIFFMASK_DEFAULTS: Tuple[float, float, float] = (0.2, -0.2, 1.0)
#: Louizos, Welling and Kingma (2018): temperature 2/3, stretch ``(-0.1, 1.1)``.
LOUIZOS_DEFAULTS: Tuple[float, float, float] = (2.0 / 3.0, -0.1, 1.1)


class HardConcrete:
    r"""
    Stretched and rectified Binary Concrete over logits (the "location" log alpha).

    Sampling follows Louizos et al. (2018)::

        u ~ U(eps, 1 - eps)
        s = sigmoid((logits + log u - log(1 - u)) / temperature)
        z = clamp(s * (r - l) + l, 0, 1)

    computed straight from the logits (not through torch's ``RelaxedBernoulli``,
    which clamps probabilities and so saturates logits beyond about +-16).

    Args:

        logits (Tensor): location parameters, any shape; one gate per element.
        temperature (float, optional): concentration of the Binary Concrete; smaller
                    is closer to binary. Default: 0.2 (the authors' code).
        stretch (tuple[float, float], optional): ``(l, r)`` with ``l < 0 < 1 <= r``.
                    Default: ``(-0.2, 1.0)`` (the authors' code).
        eps (float, optional): clamp of the uniform noise, keeping ``log u`` finite.
                    Default: 1e-6
    """

    def __init__(
        self,
        logits: Tensor,
        temperature: float = DIFFMASK_DEFAULTS[0],
        stretch: Tuple[float, float] = DIFFMASK_DEFAULTS[1:],
        eps: float = 1e-6,
    ) -> None:
        if not isinstance(logits, Tensor):
            raise TypeError(f"logits must be a Tensor, got {type(logits).__name__}")
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        low, high = stretch
        if not (low < 0.0 and high >= 1.0):
            raise ValueError(f"stretch must satisfy l < 0 and r >= 1, got {stretch}")
        self.logits = logits
        self.temperature = float(temperature)
        self.low = float(low)
        self.high = float(high)
        self.eps = float(eps)

    @classmethod
    def with_prob_nonzero(
        cls, log_prob_nonzero: Tensor, temperature: float = DIFFMASK_DEFAULTS[0],
        stretch: Tuple[float, float] = DIFFMASK_DEFAULTS[1:],
    ) -> "HardConcrete":
        r"""
        The Hard Concrete whose ``P(z != 0)`` is ``exp(log_prob_nonzero)``: e.g.
        one gate with the probability that several independent gates are all
        non-zero (the sum of their :meth:`log_prob_nonzero`).

        Args:

            log_prob_nonzero (Tensor): ``log P(z != 0)``, any shape, <= 0.
            temperature, stretch: as in the constructor.

        Returns:
            *HardConcrete* with ``logits = log(p / (1 - p)) - offset``,
            differentiable with respect to ``log_prob_nonzero``.
        """
        # p within float32's reach of 1 (a logit of ~16): log(1 - p) stays finite
        log_p = log_prob_nonzero.float().clamp(max=-1e-7)
        odds = log_p - torch.log(-torch.expm1(log_p))
        offset = -float(temperature) * math.log(-float(stretch[0]) / float(stretch[1]))
        return cls(odds - offset, temperature, stretch)

    @property
    def offset(self) -> float:
        r"""``-temperature * log(-l / r)``: logits + offset is the logit of P(z != 0)."""
        return -self.temperature * math.log(-self.low / self.high)

    def rsample(self, sample_shape: torch.Size = torch.Size(), uniform: Optional[Tensor] = None) -> Tensor:
        r"""
        Draws reparameterised samples.

        Args:

            sample_shape (torch.Size, optional): leading sample dimensions.
                        Default: ``torch.Size()``
            uniform (Tensor, optional): the uniform noise to use, of the samples'
                        shape, instead of drawing it (a distributed fit draws the
                        global batch's noise on every process). Default: None

        Returns:
            *Tensor* of shape ``sample_shape + logits.shape``, values in ``[0, 1]``
            (``[0, 1)`` when ``r = 1``),
            differentiable with respect to ``logits``. The noise and the sigmoid are
            computed in float32 whatever the dtype of the logits.
        """
        shape = torch.Size(sample_shape) + self.logits.shape
        logits = self.logits.float()
        if uniform is not None and tuple(uniform.shape) != tuple(shape):
            raise ValueError(f"uniform must have shape {tuple(shape)}, got {tuple(uniform.shape)}")
        u = torch.rand(shape, device=logits.device) if uniform is None else uniform.to(logits.device).float()
        u = u.clamp(self.eps, 1.0 - self.eps)
        s = torch.sigmoid((logits + torch.log(u) - torch.log1p(-u)) / self.temperature)
        # With r = 1 the support is [0, 1): a sigmoid that rounds to exactly 1.0 in
        # float32 must not create a point mass at 1, so cap at the float32 below 1.
        upper = 1.0 if self.high > 1.0 else 1.0 - 2.0**-24
        return (s * (self.high - self.low) + self.low).clamp(0.0, upper)

    def log_prob_nonzero(self) -> Tensor:
        r"""
        Closed form of ``log P(z != 0)``.

        Returns:
            *Tensor* shaped like ``logits``:
            ``logsigmoid(logits - temperature * log(-l / r))`` in float32.
        """
        return F.logsigmoid(self.logits.float() + self.offset)

    def log_prob_nonzero_floored(self, floor: float) -> Tensor:
        r"""
        :meth:`log_prob_nonzero` with the same value, but a gradient that does not
        vanish as an open gate saturates: the expected L0's gradient in a logit,
        ``P (1 - P)``, is at least ``floor`` wherever ``P(z != 0) > 0.5``.

        A gate the probe has driven to a large logit (on some inputs) gets no push
        from the L0 otherwise, and stays open however little the output needs it;
        the KL's own gradient, which holds a needed gate open, vanishes there too,
        so a needed gate settles where the two balance, still open.

        Args:

            floor (float): the least L0 gradient of an open gate; 0 = the plain one.

        Returns:
            *Tensor* shaped like ``logits``, float32.
        """
        log_keep = self.log_prob_nonzero()
        if floor <= 0.0:
            return log_keep
        p = log_keep.detach().exp()
        # d P / d logit = P * d log P / d logit: the extra slope is (floor - P (1 - P)) / P
        extra = torch.where(p > 0.5, (floor - p * (1.0 - p)).clamp(min=0.0) / p, torch.zeros_like(p))
        logits = self.logits.float()
        return log_keep + (logits - logits.detach()) * extra

    def prob_nonzero(self) -> Tensor:
        r"""
        Returns:
            *Tensor* shaped like ``logits``: ``P(z != 0)``, the expected L0 of a gate.
        """
        return torch.sigmoid(self.logits.float() + self.offset)

    def deterministic_gate(self, rule: str = "threshold") -> Tensor:
        r"""
        A gate without noise, for evaluation (actual erasure).

        Args:

            rule (str, optional): ``"threshold"``: 1 where ``P(z != 0) > 0.5``, else 0
                        (a binary mask); ``"louizos"``: ``clamp(sigmoid(logits) * (r - l)
                        + l, 0, 1)``, the test-time estimator of Louizos et al.
                        Default: ``"threshold"``

        Returns:
            *Tensor* shaped like ``logits`` with values in ``[0, 1]``.
        """
        if rule == "threshold":
            return (self.prob_nonzero() > 0.5).float()
        if rule == "louizos":
            s = torch.sigmoid(self.logits.float())
            return (s * (self.high - self.low) + self.low).clamp(0.0, 1.0)
        raise ValueError(f"rule must be 'threshold' or 'louizos', got {rule!r}")
