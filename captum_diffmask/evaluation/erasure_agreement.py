"""Agreement of a kept-token mask with exact erasure (De Cao et al. 2020, Section 5).

Exact erasure (:class:`captum_diffmask.methods.ExactErasure`) finds, for one
input, every smallest set of tokens that keeps the model's prediction when all
other tokens are replaced by a baseline: the *optimal sets*, all of the same
size k. A method proposes its own kept set M (a per-example mask, or its top-k
tokens). These pure functions on tensors score M against the optimum:

- token-level **precision**, **recall** and **F1** of M against the optimal set
  closest to it (:func:`closest_optimal_set`);
- **optimality**: M keeps the prediction with exactly k tokens;
- **L0**: the share of the real tokens that M keeps;
- **sufficiency**: M keeps the prediction (any size).

Every score is computed per example and then averaged over examples (so a mean
F1 can lie below both the mean precision and the mean recall, as in the paper's
table). Whether M keeps the prediction needs the model; :func:`keeps_prediction`
compares the logits the caller computed.

Conventions for empty sets (k = 0 happens when the prediction survives erasing
every token): both M and the optimum empty -> precision = recall = F1 = 1;
M empty, optimum not -> all 0; M not empty, optimum empty -> precision 0,
recall 1, F1 0.
"""

from __future__ import annotations

from typing import Dict, Mapping, Optional, Sequence, Tuple

import torch
from torch import Tensor

__all__ = [
    "top_k_mask",
    "set_scores",
    "closest_optimal_set",
    "agreement",
    "keeps_prediction",
    "optimality",
    "kept_share",
    "agreement_per_example",
    "summarize_agreement",
]


def _check_mask(name: str, value: Tensor, shape: Optional[Tuple[int, ...]] = None) -> Tensor:
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a Tensor, got {type(value).__name__}")
    if value.dim() != 2:
        raise ValueError(f"{name} must have shape (B, T), got {tuple(value.shape)}")
    if shape is not None and tuple(value.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(value.shape)}")
    return value.bool() if value.dtype == torch.bool else value != 0


def _real(mask: Optional[Tensor], shape: Tuple[int, ...], device: torch.device) -> Tensor:
    if mask is None:
        return torch.ones(shape, dtype=torch.bool, device=device)
    return _check_mask("mask", mask, shape)


def top_k_mask(scores: Tensor, k: Tensor, mask: Optional[Tensor] = None) -> Tensor:
    r"""
    The k highest-scoring real tokens of each example.

    Ties are broken by position (the earlier token first), so the result is
    deterministic.

    Args:

        scores (Tensor): (B, T) scores, higher = more important.
        k (Tensor or int): (B,) the number of tokens to keep per example (or one
                    int for all); clipped to [0, number of real tokens].
        mask (Tensor, optional): (B, T), True at real tokens; all real when None.

    Returns:
        *Tensor* (B, T) bool, True at the kept tokens (never at padding).
    """
    if not isinstance(scores, Tensor) or scores.dim() != 2:
        raise ValueError(f"scores must be a (B, T) Tensor, got {getattr(scores, 'shape', type(scores).__name__)}")
    batch, length = scores.shape
    real = _real(mask, (batch, length), scores.device)
    k = torch.as_tensor(k, device=scores.device).long()
    if k.dim() == 0:
        k = k.expand(batch)
    if k.shape != (batch,):
        raise ValueError(f"k must be an int or have shape ({batch},), got {tuple(k.shape)}")
    k = torch.minimum(k.clamp(min=0), real.sum(1))
    values = torch.where(real, scores.float(), torch.full_like(scores, -torch.inf, dtype=torch.float))
    values = torch.nan_to_num(values, nan=-torch.inf, posinf=torch.finfo(torch.float).max)
    order = torch.sort(values, dim=1, descending=True, stable=True).indices
    rank = torch.empty_like(order)
    rank.scatter_(1, order, torch.arange(length, device=scores.device).expand(batch, -1).contiguous())
    return (rank < k.unsqueeze(1)) & real


def set_scores(kept: Tensor, reference: Tensor) -> Dict[str, Tensor]:
    r"""
    Token-level precision, recall and F1 of kept sets against reference sets,
    per row, with the module's conventions for empty sets.

    Args:

        kept (Tensor): (N, T) bool (or 0/1) the proposed sets.
        reference (Tensor): (N, T) bool (or 0/1) the reference sets.

    Returns:
        *dict* of (N,) float tensors ``precision``, ``recall``, ``f1`` and the
        (N,) long ``overlap`` ``|kept & reference|``.
    """
    kept = _check_mask("kept", kept)
    reference = _check_mask("reference", reference, tuple(kept.shape))
    overlap = (kept & reference).sum(1)
    n_kept, n_ref = kept.sum(1), reference.sum(1)
    both_empty = (n_kept == 0) & (n_ref == 0)
    precision = torch.where(n_kept > 0, overlap.float() / n_kept.clamp(min=1).float(), 0.0)
    recall = torch.where(n_ref > 0, overlap.float() / n_ref.clamp(min=1).float(), (n_kept > 0).float())
    precision = torch.where(both_empty, 1.0, precision)
    recall = torch.where(both_empty, 1.0, recall)
    denominator = precision + recall
    f1 = torch.where(denominator > 0, 2 * precision * recall / denominator.clamp(min=1e-12), 0.0)
    return {"precision": precision, "recall": recall, "f1": f1, "overlap": overlap}


def closest_optimal_set(kept: Tensor, optimal_sets: Sequence[Tensor]) -> Tuple[Tensor, Tensor]:
    r"""
    For every example, the optimal set closest to the kept set: the one with the
    highest F1 against it (the first in the given order on ties). All optimal
    sets of one example have the same size, so this is also the one with the
    largest overlap, the highest precision and the highest recall.

    Args:

        kept (Tensor): (B, T) bool (or 0/1) the method's kept tokens.
        optimal_sets (sequence of Tensor): per example a (K_i, T) bool (or 0/1)
                    tensor of its optimal sets, K_i >= 1 (e.g.
                    ``ErasureResult.all_masks`` of the solved examples).

    Returns:
        *tuple* ``(closest, index)``: (B, T) bool the chosen set per example, and
        (B,) long its row in ``optimal_sets[i]``.

    Raises:
        ValueError: the number of examples differs, or an example has no optimal
                    set (leave unsolved examples out before scoring).
    """
    kept = _check_mask("kept", kept)
    batch, length = kept.shape
    if len(optimal_sets) != batch:
        raise ValueError(f"optimal_sets must hold one tensor per example ({batch}), got {len(optimal_sets)}")
    closest = torch.zeros_like(kept)
    index = torch.zeros(batch, dtype=torch.long, device=kept.device)
    for i, sets in enumerate(optimal_sets):
        sets = _check_mask(f"optimal_sets[{i}]", sets)
        if sets.shape[0] == 0:
            raise ValueError(f"optimal_sets[{i}] is empty: example {i} has no optimal set (unsolved); leave it out")
        if sets.shape[1] != length:
            raise ValueError(f"optimal_sets[{i}] must have {length} columns, got {sets.shape[1]}")
        sets = sets.to(kept.device)
        f1 = set_scores(kept[i].expand_as(sets), sets)["f1"]
        best = int(torch.argmax(f1))  # argmax returns the first maximum
        closest[i] = sets[best]
        index[i] = best
    return closest, index


def agreement(kept: Tensor, optimal_sets: Sequence[Tensor]) -> Dict[str, Tensor]:
    r"""
    Per-example precision, recall and F1 of the kept tokens against the closest
    optimal set (:func:`closest_optimal_set`).

    Args:

        kept (Tensor): (B, T) bool (or 0/1) kept tokens (0 at padding).
        optimal_sets (sequence of Tensor): per example its (K_i, T) optimal sets.

    Returns:
        *dict* of (B,) tensors: ``precision``, ``recall``, ``f1`` (float),
        ``overlap`` and ``optimal_size`` (long), and ``closest`` (B, T) bool.
    """
    closest, _ = closest_optimal_set(kept, optimal_sets)
    scores = set_scores(kept, closest)
    scores["optimal_size"] = closest.sum(1)
    scores["closest"] = closest
    return scores


def keeps_prediction(original_logits: Tensor, masked_logits: Tensor) -> Tensor:
    r"""
    Whether a masked input keeps the model's prediction.

    Args:

        original_logits (Tensor): (B, C) logits on the full input.
        masked_logits (Tensor): (B, C) logits with the erased tokens replaced.

    Returns:
        *Tensor* (B,) bool: the argmax is the same.
    """
    if original_logits.shape != masked_logits.shape or original_logits.dim() != 2:
        raise ValueError(
            "original_logits and masked_logits must both have shape (B, C), got "
            f"{tuple(original_logits.shape)} and {tuple(masked_logits.shape)}"
        )
    return original_logits.argmax(-1) == masked_logits.argmax(-1)


def optimality(kept: Tensor, kept_prediction: Tensor, optimal_size: Tensor) -> Tensor:
    r"""
    Per example: the kept set keeps the prediction with exactly the optimal
    number of tokens (then it is itself an optimal set).

    Args:

        kept (Tensor): (B, T) bool (or 0/1) kept tokens (0 at padding).
        kept_prediction (Tensor): (B,) bool, the kept set keeps the prediction
                    (:func:`keeps_prediction`).
        optimal_size (Tensor): (B,) long, the size k of the optimal sets.

    Returns:
        *Tensor* (B,) bool.
    """
    kept = _check_mask("kept", kept)
    if kept_prediction.shape != kept.shape[:1] or optimal_size.shape != kept.shape[:1]:
        raise ValueError(
            f"kept_prediction and optimal_size must have shape ({kept.shape[0]},), got "
            f"{tuple(kept_prediction.shape)} and {tuple(optimal_size.shape)}"
        )
    return kept_prediction.bool() & (kept.sum(1) == optimal_size.to(kept.device).long())


def kept_share(kept: Tensor, mask: Optional[Tensor] = None) -> Tensor:
    r"""
    L0 per example: the share of its real tokens that are kept.

    Args:

        kept (Tensor): (B, T) bool (or 0/1) kept tokens.
        mask (Tensor, optional): (B, T), True at real tokens; all real when None.

    Returns:
        *Tensor* (B,) float in [0, 1] (0 for an example with no real token).
    """
    kept = _check_mask("kept", kept)
    real = _real(mask, tuple(kept.shape), kept.device)
    return (kept & real).sum(1).float() / real.sum(1).clamp(min=1).float()


#: The scores :func:`summarize_agreement` averages (in percent).
SUMMARY_KEYS = ("precision", "recall", "f1", "optimality", "sufficiency", "l0", "optimal_l0")


def agreement_per_example(
    kept: Tensor,
    optimal_sets: Sequence[Tensor],
    kept_prediction: Tensor,
    mask: Optional[Tensor] = None,
) -> Dict[str, Tensor]:
    r"""
    The erasure-agreement scores of one method, per example (what
    :func:`summarize_agreement` averages; e.g. for a paired bootstrap of two
    methods on the same examples).

    Args:

        kept (Tensor): (B, T) bool (or 0/1) the method's kept tokens.
        optimal_sets (sequence of Tensor): per example its (K_i, T) optimal sets
                    (solved examples only).
        kept_prediction (Tensor): (B,) bool, the kept set keeps the prediction.
        mask (Tensor, optional): (B, T), True at real tokens. Default: None

    Returns:
        *dict* of (B,) float tensors in [0, 1]: ``precision``, ``recall``, ``f1``
        (against the closest optimal set), ``optimality`` and ``sufficiency``
        (0 or 1), ``l0`` and ``optimal_l0`` (shares of real tokens kept); and
        the (B,) long ``kept_size`` and ``optimal_size``.
    """
    kept = _check_mask("kept", kept)
    real = _real(mask, tuple(kept.shape), kept.device)
    if kept.shape[0] == 0:
        raise ValueError("kept must hold at least one example")
    kept = kept & real
    scores = agreement(kept, optimal_sets)
    kept_prediction = kept_prediction.to(kept.device).bool()
    return {
        "precision": scores["precision"],
        "recall": scores["recall"],
        "f1": scores["f1"],
        "optimality": optimality(kept, kept_prediction, scores["optimal_size"]).float(),
        "sufficiency": kept_prediction.float(),
        "l0": kept_share(kept, real),
        "optimal_l0": kept_share(scores["closest"], real),
        "kept_size": kept.sum(1),
        "optimal_size": scores["optimal_size"],
    }


def summarize_agreement(per_example: Mapping[str, Tensor]) -> Dict[str, float]:
    r"""
    The erasure-agreement scores of one method over a set of examples, each the
    mean of the per-example values, as percentages.

    Args:

        per_example (Mapping[str, Tensor]): what :func:`agreement_per_example`
                    returns: (B,) scores per key, B >= 1.

    Returns:
        *dict* with ``precision``, ``recall``, ``f1`` (against the closest optimal
        set), ``optimality`` (share keeping the prediction with exactly the
        optimal number of tokens), ``sufficiency`` (share keeping the
        prediction), ``l0`` (mean share of real tokens kept), ``optimal_l0`` (the
        same for the optimal sets), all in percent (0..100), and ``count``.
    """
    missing = [key for key in SUMMARY_KEYS if key not in per_example]
    if missing:
        raise ValueError(f"per_example lacks {missing}: pass what agreement_per_example returns")
    summary: Dict[str, float] = {key: 100.0 * float(per_example[key].float().mean()) for key in SUMMARY_KEYS}
    summary["count"] = int(per_example["f1"].numel())
    return summary
