"""Scores of attributions against a ground truth.

Attributions and ground truths are turned into distributions over the real
(unpadded) positions of each sequence, then compared with the paper's conventions:
``D[p || q]`` where p is the ground truth and q the attribution (its footnote).
"""

from __future__ import annotations

import math
from typing import Dict, Optional

import torch
from torch import Tensor


def normalize_attributions(attributions: Tensor, mask: Optional[Tensor] = None) -> Tensor:
    r"""
    Attributions as a distribution over the real positions of each row.

    Negative scores (e.g. signed gradients) are clipped to 0 first; a row with no
    positive mass becomes uniform over its real positions, so it stays a
    distribution.

    Args:

        attributions (Tensor): (B, T) scores, higher = more important.
        mask (Tensor, optional): (B, T) bool, True at real tokens; all real when None.

    Returns:
        *Tensor* (B, T) float32, rows summing to 1 over real positions, 0 at padding.
    """
    scores = attributions.float().clamp(min=0.0)
    real = torch.ones_like(scores, dtype=torch.bool) if mask is None else mask.bool()
    scores = torch.where(real, scores, torch.zeros_like(scores))
    total = scores.sum(-1, keepdim=True)
    uniform = real.float() / real.float().sum(-1, keepdim=True).clamp(min=1.0)
    return torch.where(total > 0, scores / total.clamp(min=1e-30), uniform)


def _kl_rows(p: Tensor, q: Tensor) -> Tensor:
    r"""KL(p || q) per row from distributions; inf where q = 0 < p."""
    log_ratio = torch.log(p) - torch.log(q)
    terms = torch.where(p > 0, p * log_ratio, torch.zeros_like(p))
    return terms.sum(-1)


def kl_to_ground_truth(attributions: Tensor, ground_truth: Tensor, mask: Optional[Tensor] = None) -> Tensor:
    r"""
    KL(ground truth || attribution) per example, in nats.

    Args:

        attributions (Tensor): (B, T) scores.
        ground_truth (Tensor): (B, T) non-negative ground-truth weights.
        mask (Tensor, optional): (B, T) bool, True at real tokens.

    Returns:
        *Tensor* (B,): ``inf`` where the attribution gives zero mass to a position
        the ground truth needs (the supports differ), NaN for rows whose ground
        truth is empty (exclude them; see :func:`has_ground_truth`).
    """
    p = normalize_attributions(ground_truth, mask)
    q = normalize_attributions(attributions, mask)
    kl = _kl_rows(p, q)
    return torch.where(has_ground_truth(ground_truth, mask), kl, torch.full_like(kl, math.nan))


def js_to_ground_truth(attributions: Tensor, ground_truth: Tensor, mask: Optional[Tensor] = None) -> Tensor:
    r"""
    Jensen-Shannon divergence between ground truth and attribution, per example.

    Returns:
        *Tensor* (B,) in nats, in ``[0, log 2]``; NaN for rows whose ground truth
        is empty.
    """
    p = normalize_attributions(ground_truth, mask)
    q = normalize_attributions(attributions, mask)
    m = 0.5 * (p + q)
    js = 0.5 * (_kl_rows(p, m) + _kl_rows(q, m))
    return torch.where(has_ground_truth(ground_truth, mask), js, torch.full_like(js, math.nan))


def has_ground_truth(ground_truth: Tensor, mask: Optional[Tensor] = None) -> Tensor:
    r"""(B,) bool: rows whose ground truth has positive mass on a real position."""
    weights = ground_truth.float().clamp(min=0.0)
    if mask is not None:
        weights = weights * mask.float()
    return weights.sum(-1) > 0


def summarize(values: Tensor) -> Dict[str, float]:
    r"""
    Mean and spread of per-example divergences, the way the paper reports them.

    NaN entries (examples with an empty ground truth) are left out. An ``inf``
    entry (an attribution that gives zero mass where the ground truth has some)
    makes the mean ``inf``, as in the paper's table; ``finite_mean`` is the mean
    over the finite entries, so that the rest is still visible.

    Args:

        values (Tensor): (N,) per-example divergences, e.g. from
                    :func:`js_to_ground_truth`.

    Returns:
        *dict* with ``mean``, ``std`` (population std over examples, as the
        authors' notebook; ``inf`` when some entry is), ``finite_mean``,
        ``inf_share`` (share of scored examples that are ``inf``) and ``count``
        (the number of scored examples); ``mean`` and ``std`` are NaN when
        nothing is scored.
    """
    values = values.detach().double().flatten()
    values = values[~torch.isnan(values)]
    count = int(values.numel())
    if count == 0:
        return {"mean": math.nan, "std": math.nan, "finite_mean": math.nan, "inf_share": math.nan, "count": 0}
    infinite = torch.isinf(values)
    finite = values[~infinite]
    finite_mean = float(finite.mean()) if finite.numel() else math.nan
    if bool(infinite.any()):
        mean = std = math.inf
    else:
        mean = float(values.mean())
        std = float(values.std(unbiased=False)) if count > 1 else 0.0
    return {
        "mean": mean,
        "std": std,
        "finite_mean": finite_mean,
        "inf_share": float(infinite.double().mean()),
        "count": count,
    }
