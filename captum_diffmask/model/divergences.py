"""The DiffMask objective: divergences, the L0 penalty and the Lagrange multipliers.

Everything here runs in float32: divergences from ``log_softmax`` (never from
probabilities, which underflow to 0 and give ``0 * log 0 = NaN``), the L0 penalty
from ``logsigmoid``, and the multipliers.
"""

from __future__ import annotations


import torch
import torch.nn.functional as F
from torch import Tensor



def log_probs(logits: Tensor) -> Tensor:
    r"""
    Log-probabilities of the model's output distribution.

    Args:

        logits (Tensor): (B, C) class logits, (B, K, C) for K distributions per
                    example, or (B,) / (B, 1) for one binary logit (a Bernoulli,
                    turned into two classes).

    Returns:
        *Tensor* (B, C) or (B, K, C) of log-probabilities in float32 (C = 2 for
        binary logits).
    """
    logits = logits.float()
    if logits.dim() == 1 or (logits.dim() == 2 and logits.shape[-1] == 1):
        logit = logits.reshape(logits.shape[0])
        return torch.stack([F.logsigmoid(-logit), F.logsigmoid(logit)], dim=-1)
    return F.log_softmax(logits, dim=-1)


def kl_divergence(log_p: Tensor, log_q: Tensor) -> Tensor:
    r"""
    KL(p || q) over the last dimension, from log-probabilities.

    Terms with ``p = 0`` (``log_p = -inf``, e.g. padded positions) count 0, so
    padding gives no NaN.

    Args:

        log_p (Tensor): (..., C) log-probabilities of the reference p (the original
                    output in DiffMask's constraint).
        log_q (Tensor): (..., C) log-probabilities of q.

    Returns:
        *Tensor* (...) of divergences in nats, >= 0.
    """
    p = log_p.exp()
    terms = p * (log_p - log_q)
    kl = torch.where(p > 0, terms, torch.zeros_like(terms)).sum(-1)
    return kl.clamp(min=0.0)  # rounding can give -1e-8 for identical distributions


def example_kl(log_p: Tensor, log_q: Tensor) -> Tensor:
    r"""
    KL(p || q) per example: over the classes, summed over an example's
    distributions when it has several ((B, K, C) log-probabilities).

    Returns:
        *Tensor* (B,) in nats.
    """
    kl = kl_divergence(log_p, log_q)
    return kl.reshape(kl.shape[0], -1).sum(-1)


def same_prediction(log_p: Tensor, log_q: Tensor) -> Tensor:
    r"""(B,) bool: every distribution of the example has the same argmax in p and q."""
    same = log_p.argmax(-1) == log_q.argmax(-1)
    return same.reshape(same.shape[0], -1).all(-1)


def js_divergence(log_p: Tensor, log_q: Tensor) -> Tensor:
    r"""
    Jensen-Shannon divergence ``(KL(p || m) + KL(q || m)) / 2`` with ``m = (p + q) / 2``.

    Args:

        log_p (Tensor): (..., C) log-probabilities.
        log_q (Tensor): (..., C) log-probabilities.

    Returns:
        *Tensor* (...) in nats, in ``[0, log 2]``.
    """
    log_m = torch.logaddexp(log_p, log_q) - torch.log(torch.tensor(2.0))
    return 0.5 * (kl_divergence(log_p, log_m) + kl_divergence(log_q, log_m))


