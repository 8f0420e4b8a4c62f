"""Stability across seeds: the paper's figure for how much an explainer's
attributions depend on the randomness of its own fit."""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

import torch
from torch import nn, Tensor

from captum_diffmask.model.forward import Batch, format_additional_args, frozen


def seed_std(per_seed: Sequence[Tensor], mask: Optional[Tensor] = None) -> Dict[str, Any]:
    r"""
    The std across seeds of every attribution, summarised per layer and overall.

    Args:

        per_seed (sequence of Tensor): one attribution tensor per seed (at least
                    two), all of one shape: (B, T) for one layer, or (B, T, K) for
                    K layers (e.g. ``DiffMask.attribute(..., layer=None)``).
        mask (Tensor, optional): (B, T) bool, True at real tokens; padding is left
                    out. All real when None. Default: None

    Returns:
        *dict* with ``mean_std`` and ``p95_std`` (the mean and 95th percentile of
        the per-(example, token, layer) std, unbiased, over the real positions),
        ``max_std``, ``seeds``, and ``per_layer``: a list with one dict
        ``{"layer", "mean_std", "p95_std"}`` per layer (one entry, layer None,
        for (B, T) input).
    """
    if len(per_seed) < 2:
        raise ValueError(f"per_seed: the std across seeds needs at least two seeds, got {len(per_seed)}")
    shapes = {tuple(t.shape) for t in per_seed}
    if len(shapes) != 1 or len(next(iter(shapes))) not in (2, 3):
        raise ValueError(f"per_seed: every seed's tensor must have one shape, (B, T) or (B, T, K); got {sorted(shapes)}")
    stacked = torch.stack([t.detach().float().cpu() for t in per_seed])  # (S, B, T[, K])
    std = stacked.std(0, unbiased=True)
    if std.dim() == 2:
        std = std.unsqueeze(-1)
    real = torch.ones(std.shape[:2], dtype=torch.bool) if mask is None else mask.bool().cpu()
    if real.shape != std.shape[:2]:
        raise ValueError(f"mask: expected shape {tuple(std.shape[:2])}, got {tuple(real.shape)}")
    values = std[real]  # (positions, K)
    if values.numel() == 0:
        raise ValueError("mask: no real position to compare")
    layers = [None] if len(next(iter(shapes))) == 2 else list(range(values.shape[-1]))
    per_layer = [{"layer": k, "mean_std": float(values[:, i].mean()), "p95_std": float(values[:, i].quantile(0.95))}
                 for i, k in enumerate(layers)]
    flat = values.flatten()
    return {"mean_std": float(flat.mean()), "p95_std": float(flat.quantile(0.95)), "max_std": float(flat.max()),
            "seeds": len(per_seed), "per_layer": per_layer}


def fit_stability(
    model: nn.Module,
    dataloader: Iterable[Batch],
    inputs: Tensor,
    additional_forward_args: Any = None,
    seeds: Sequence[int] = (0, 1, 2),
    layer: Optional[int] = None,
    explainer_options: Optional[Mapping[str, Any]] = None,
    fit_options: Optional[Mapping[str, Any]] = None,
) -> Dict[str, Any]:
    r"""
    Fits one :class:`DiffMask` per seed on ``dataloader`` and measures how much
    its attributions of ``inputs`` differ across the seeds (:func:`seed_std`).
    The caller's global RNG is left as it was.

    Args:

        model (nn.Module): the analysed model.
        dataloader (iterable): training batches, as :meth:`DiffMask.fit` takes
                    them; iterated once per epoch of each fit.
        inputs (Tensor): (B, T) token ids to attribute.
        additional_forward_args (Any, optional): the model's other arguments for
                    ``inputs`` (e.g. the attention mask). Default: None
        seeds (sequence of int, optional): the fit seeds, at least two.
                    Default: (0, 1, 2)
        layer (int, optional): the layer to compare; every layer when None.
                    Default: None
        explainer_options (Mapping, optional): :class:`DiffMask` constructor
                    options (``mode``, ``sites``, ...). Default: None
        fit_options (Mapping, optional): :meth:`DiffMask.fit` options (``eps``,
                    ``layers``, ...); ``seed`` and ``verbose`` are set here.
                    Default: None

    Returns:
        *dict*: :func:`seed_std`'s figures, plus ``attributions`` (S, B, T) or
        (S, B, T, L + 1) and ``convergence``, each fit's
        :attr:`DiffMask.convergence` report, in the order of ``seeds``.
    """
    from captum_diffmask.diffmask.explainer import DiffMask

    seeds = [int(s) for s in seeds]
    if len(seeds) < 2 or len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds: at least two different seeds are needed, got {seeds}")
    fit_kwargs = {"verbose": False, **dict(fit_options or {})}
    fit_kwargs.pop("seed", None)
    extra = format_additional_args(additional_forward_args)
    attributions: List[Tensor] = []
    reports = []
    with torch.random.fork_rng(devices=[]):
        for seed in seeds:
            explainer = DiffMask(model, **dict(explainer_options or {}))
            explainer.fit(dataloader, seed=seed, **fit_kwargs)
            with torch.no_grad():
                attributions.append(explainer.attribute(inputs, additional_forward_args=extra, layer=layer))
            reports.append(explainer.convergence)
    mask = explainer.model_forward.padding_mask(inputs, extra)
    result = seed_std(attributions, mask)
    result.update({"attributions": torch.stack(attributions), "convergence": reports})
    return result


@torch.no_grad()
def swap_test(
    explainers: Sequence[Any], dataloader: Iterable[Batch], layers: Optional[Sequence[int]] = None,
) -> Dict[str, Any]:
    r"""
    Do seeds differ because the objective cannot tell their masks apart, or
    because the optimiser stops short? Each fit's deterministic mask is scored
    under the same objective on the same sentences (its masked share, the L0
    side, and its mean KL, the constraint side), and every two fits' masks are
    compared position by position. Masks that differ while their objective
    values agree support the objective's indifference; values that differ say
    the optimiser, not the objective, sets the spread.

    Args:

        explainers (sequence of DiffMask): fitted explainers of one model (one
                    per seed, at least two), each fitted at ``layers``.
        dataloader (iterable): batches as :meth:`DiffMask.fit` takes them;
                    iterated once per explainer and once more.
        layers (sequence of int, optional): the layers compared; the first
                    explainer's fitted ones when None. Default: None

    Returns:
        *dict* with ``fits``: per explainer and layer ``{"masked", "kl"}`` (the
        share of real positions closed and the mean KL, nats); and ``pairs``:
        per pair ``(i, j)`` and layer ``{"disagreement"`` (the share of real
        positions where the two binary masks differ), ``"masked_gap"``,
        ``"kl_gap"}`` (absolute differences of the objective's two sides).
    """
    if len(explainers) < 2:
        raise ValueError(f"explainers: the swap test compares at least two fits, got {len(explainers)}")
    chosen = list(explainers[0].fitted_layers if layers is None else layers)
    fits = []
    for explainer in explainers:
        scores = explainer.evaluate(dataloader, chosen)
        fits.append({k: {"masked": 1.0 - scores[k]["l0"], "kl": scores[k]["kl"]} for k in chosen})
    differ = {(i, j): {k: 0.0 for k in chosen} for i in range(len(explainers)) for j in range(i + 1, len(explainers))}
    positions = 0.0
    for batch in dataloader:
        masks = [_deterministic_masks(explainer, batch, chosen) for explainer in explainers]
        real = masks[0][1]
        positions += float(real.sum())
        for (i, j), per_layer in differ.items():
            for k in chosen:
                per_layer[k] += float(((masks[i][0][k] != masks[j][0][k]) & real).sum())
    pairs = [{"fits": [i, j], "layer": k, "disagreement": per_layer[k] / max(positions, 1.0),
              "masked_gap": abs(fits[i][k]["masked"] - fits[j][k]["masked"]), "kl_gap": abs(fits[i][k]["kl"] - fits[j][k]["kl"])}
             for (i, j), per_layer in differ.items() for k in chosen]
    return {"layers": chosen, "fits": [{str(k): v for k, v in fit.items()} for fit in fits], "pairs": pairs}


def _deterministic_masks(explainer: Any, batch: Batch, layers: Sequence[int]) -> Any:
    r"""Per layer the (B, T) binary deterministic mask (kept = True) of one
    batch, and the batch's real positions."""
    call = explainer.prepare_batch(batch, None, "dataloader batch")
    with frozen(explainer.model):
        states, _ = explainer.capture(call, explainer.locator.names)
    real = call.mask.bool()
    return {k: explainer.gates.deterministic(states, k, "threshold", call.mask) > 0 for k in layers}, real
