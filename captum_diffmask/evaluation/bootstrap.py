"""Paired bootstrap confidence intervals: is one method's per-example score
better than another's on the same examples, beyond the sampling of the examples?"""

from __future__ import annotations

from typing import Dict, Sequence, Union

import torch
from torch import Tensor

Scores = Union[Tensor, Sequence[float]]


def paired_bootstrap(
    first: Scores, second: Scores, resamples: int = 10_000, confidence: float = 0.95, seed: int = 0
) -> Dict[str, float]:
    r"""
    The mean of ``first - second`` over paired examples, with a percentile
    bootstrap confidence interval: the examples are drawn with replacement
    ``resamples`` times (the same draw for both scores, which keeps the pairing),
    and the interval holds the central ``confidence`` share of the resampled
    mean differences. The caller's RNG is not touched (a private generator
    seeded by ``seed``).

    Args:

        first (Tensor or sequence of float): (N,) one score per example, e.g.
                    DiffMask's F1 per sentence.
        second (Tensor or sequence of float): (N,) the other method's scores on
                    the same examples, in the same order.
        resamples (int, optional): bootstrap draws. Default: 10000
        confidence (float, optional): the interval's coverage, in (0, 1).
                    Default: 0.95
        seed (int, optional): seeds the draws. Default: 0

    Returns:
        *dict* with ``difference`` (the observed mean of first - second),
        ``low`` and ``high`` (the interval), ``examples`` (N) and ``resamples``.

    Raises:
        ValueError naming the argument: scores of different lengths or with
        non-finite values, no example, ``resamples`` < 1, ``confidence``
        outside (0, 1).
    """
    a = torch.as_tensor(first, dtype=torch.float64).flatten()
    b = torch.as_tensor(second, dtype=torch.float64).flatten()
    if a.shape != b.shape:
        raise ValueError(f"first and second must score the same examples, got {a.numel()} and {b.numel()} scores")
    if a.numel() == 0:
        raise ValueError("first: no example to compare")
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        raise ValueError("first and second must be finite (drop the examples a method could not score)")
    if isinstance(resamples, bool) or not isinstance(resamples, int) or resamples < 1:
        raise ValueError(f"resamples must be an int >= 1, got {resamples!r}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    differences = a - b
    generator = torch.Generator().manual_seed(int(seed))
    means = torch.empty(resamples, dtype=torch.float64)
    chunk = max(1, 2_000_000 // differences.numel())  # draws per block: a bounded index tensor
    for start in range(0, resamples, chunk):
        count = min(chunk, resamples - start)
        rows = torch.randint(differences.numel(), (count, differences.numel()), generator=generator)
        means[start:start + count] = differences[rows].mean(1)
    tail = (1 - confidence) / 2
    low, high = torch.quantile(means, torch.tensor([tail, 1 - tail], dtype=torch.float64)).tolist()
    return {"difference": float(differences.mean()), "low": low, "high": high, "examples": differences.numel(),
            "resamples": resamples}
