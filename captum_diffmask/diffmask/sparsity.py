"""The DiffMask objective: divergences, the L0 penalty and the Lagrange multipliers.

Everything here runs in float32: divergences from ``log_softmax`` (never from
probabilities, which underflow to 0 and give ``0 * log 0 = NaN``), the L0 penalty
from ``logsigmoid``, and the multipliers.
"""

from __future__ import annotations

import torch
from torch import Tensor

#: The sparsity terms :func:`l0_penalty` knows.
L0_KINDS = ("expected", "mean", "log")


def l0_penalty(log_prob_nonzero: Tensor, mask: Tensor, kind: str = "expected") -> Tensor:
    r"""
    The sparsity term of the objective, per example.

    Args:

        log_prob_nonzero (Tensor): (B, T) ``log P(z != 0)`` of each gate.
        mask (Tensor): (B, T) bool, True at real tokens; padding does not count.
        kind (str, optional): ``"expected"``: the paper's expected L0, the sum of
                    ``P(z != 0)`` over real tokens; ``"mean"``: the expected
                    *share* of kept tokens, that sum divided by the number of real
                    tokens (the same scale for every length, so one multiplier
                    fits short and long inputs); ``"log"``: the authors' code, the
                    mean of ``log P(z != 0)`` over real tokens.
                    Default: ``"expected"``

    Returns:
        *Tensor* (B,) in float32.
    """
    mask = mask.float()
    if kind == "expected":
        return (log_prob_nonzero.float().exp() * mask).sum(-1)
    if kind == "mean":
        return (log_prob_nonzero.float().exp() * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
    if kind == "log":
        return (log_prob_nonzero.float() * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
    raise ValueError(f"l0_penalty must be one of {L0_KINDS}, got {kind!r}")


def score_function_term(kl: Tensor, gates: Tensor, log_keep: Tensor, mask: Tensor) -> Tensor:
    r"""
    A term of value 0 whose gradient is the score-function (REINFORCE) estimate
    of the mean KL's gradient through each gate's open/closed event.

    The pathwise gradient (through the relaxed sample) is the KL's slope in the
    gate; where the output is a step function of a gate's value (flat from open
    down to a threshold, e.g. tracr's compiled MLPs) it is zero on both sides,
    and nothing keeps a needed gate open or reopens it. This estimate needs no
    slope: an example whose sampled gates cost more KL than the batch's mean
    makes its closed gates likelier to open and its open ones likelier to close.

    Args:

        kl (Tensor): (B,) each example's KL under the sampled gates.
        gates (Tensor): (B, N) the sampled gates (0 where closed).
        log_keep (Tensor): (B, N) ``log P(z != 0)`` of each gate, differentiable
                    in the probe (the plain one, not the L0 floor's).
        mask (Tensor): (B, N) bool, the gates that count (real positions).

    Returns:
        *Tensor* a scalar, 0 in value. With one example the baseline is the
        example itself and the gradient 0.
    """
    log_keep = log_keep.float().clamp(max=-1e-7)  # log P < 0, so log(1 - P) is finite
    log_closed = torch.log(-torch.expm1(log_keep))
    opened = (gates.detach() > 0).float()
    log_event = ((opened * log_keep + (1.0 - opened) * log_closed) * mask.float()).reshape(kl.shape[0], -1).sum(-1)
    advantage = (kl - kl.mean()).detach().float()
    return (advantage * (log_event - log_event.detach())).mean()


