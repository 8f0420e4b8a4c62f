"""A fingerprint of a model's weights: what ties a probe, a saved probe or a fit's
state to the model it was fitted on."""

from __future__ import annotations

import hashlib

from torch import nn


def weights_fingerprint(model: nn.Module) -> str:
    r"""A fingerprint of a model's parameter values: per parameter the sum and the
    sum of squares in float64, rounded to 6 significant digits (the same weights on
    another device or in another order of summation give the same text)."""
    parts = []
    for name, p in model.named_parameters():
        values = p.detach().double()
        parts.append(f"{name}:{float(values.sum()):.6g}:{float(values.pow(2).sum()):.6g}")
    return hashlib.sha1("|".join(parts).encode()).hexdigest()
