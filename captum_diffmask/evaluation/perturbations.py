"""Perturbations of token ids for Captum's own metrics, so that
``captum.metrics.infidelity`` and ``captum.metrics.sensitivity_max`` run on a
text model in one call each (their default perturbations add Gaussian noise,
which token ids cannot take)::

    from captum.metrics import infidelity, sensitivity_max

    forward = lambda ids, mask: model(input_ids=ids, attention_mask=mask).logits
    infidelity(forward, token_removal(tokenizer.mask_token_id, tokenizer.pad_token_id),
               ids, scores, additional_forward_args=(mask,), target=classes)
    sensitivity_max(method.attribute, ids, token_substitution(len(tokenizer), tokenizer.pad_token_id),
                    additional_forward_args=(mask,))

Real tokens are told from padding by ``pad_id`` (Captum hands a perturbation the
ids alone); padding is never perturbed.
:func:`~captum_diffmask.evaluation.faithfulness.token_infidelity` and
:func:`~captum_diffmask.evaluation.faithfulness.token_sensitivity` wrap the same
metrics for the library's methods, removal there replacing a token's embedding.
"""

from __future__ import annotations

from typing import Callable, Optional, Tuple

import torch
from torch import Tensor


def _real(ids: Tensor, pad_id: Optional[int]) -> Tensor:
    r"""(B, T) bool: True where ``ids`` is not ``pad_id`` (everywhere for None)."""
    return torch.ones_like(ids, dtype=torch.bool) if pad_id is None else ids != pad_id


def _check_share(share: float, argument: str) -> None:
    if not 0.0 < float(share) <= 1.0:
        raise ValueError(f"{argument} must be in (0, 1], the share of real tokens perturbed, got {share}")


def token_removal(replacement_id: int, pad_id: Optional[int] = None, share: float = 0.2,
                  seed: int = 0) -> Callable[[Tensor], Tuple[Tensor, Tensor]]:
    r"""
    ``perturb_func`` for ``captum.metrics.infidelity`` on token ids: each real
    token is replaced by ``replacement_id`` (e.g. ``[MASK]``) with probability
    ``share``; the perturbation is 1 where a token was replaced, so that
    infidelity compares the replaced tokens' summed scores with the output's drop.

    Args:

        replacement_id (int): the id a removed token becomes.
        pad_id (int, optional): the padding id, never replaced. Default: None
        share (float, optional): each real token's chance to be removed, in
                    (0, 1]. Default: 0.2
        seed (int, optional): seeds a private generator (the global RNG is not
                    drawn). Default: 0

    Returns:
        *Callable* ``perturb(ids) -> (removed, perturbed_ids)``: (B, T) float
        0/1 and (B, T) ids.
    """
    _check_share(share, "share")
    generator = torch.Generator().manual_seed(int(seed))

    def perturb(ids: Tensor) -> Tuple[Tensor, Tensor]:
        removed = (torch.rand(ids.shape, generator=generator) < share).to(ids.device) & _real(ids, pad_id)
        return removed.float(), ids.masked_fill(removed, int(replacement_id))

    return perturb


def token_substitution(vocabulary_size: int, pad_id: Optional[int] = None, substitutions: Optional[int] = None,
                       seed: int = 0, real: Optional[Tensor] = None) -> Callable[[Tensor, float], Tensor]:
    r"""
    ``perturb_func`` for ``captum.metrics.sensitivity_max`` on token ids: real
    tokens are replaced by random ids, each with probability
    ``perturb_radius`` (Captum's argument), or exactly ``substitutions`` of
    them per row when given.

    Args:

        vocabulary_size (int): new ids are drawn from ``0 .. vocabulary_size - 1``.
        pad_id (int, optional): the padding id, never replaced. Default: None
        substitutions (int, optional): tokens replaced per row, whatever the
                    radius. Default: None
        seed (int, optional): seeds a private generator. Default: 0
        real (Tensor, optional): (B, T) bool, True at real tokens, in place of
                    ``pad_id`` (repeated to Captum's expanded batch). Default: None

    Returns:
        *Callable* ``perturb(ids, perturb_radius=0.02) -> perturbed_ids``.
    """
    if vocabulary_size < 1:
        raise ValueError(f"vocabulary_size must be >= 1, got {vocabulary_size}")
    generator = torch.Generator().manual_seed(int(seed))

    def perturb(ids: Tensor, perturb_radius: float = 0.02) -> Tensor:
        rows = _real(ids, pad_id) if real is None else real.bool().repeat_interleave(ids.shape[0] // real.shape[0], 0)
        rows = rows.cpu()
        noise = torch.rand(rows.shape, generator=generator)
        if substitutions is None:
            _check_share(perturb_radius, "perturb_radius")
            values = torch.randint(0, vocabulary_size, ids.shape, generator=generator).to(ids)
            return torch.where(((noise < perturb_radius) & rows).to(ids.device), values, ids)
        chosen = noise.masked_fill(~rows, 2.0).argsort(-1)[:, :substitutions]  # real tokens first
        values = torch.randint(0, vocabulary_size, chosen.shape, generator=generator).to(ids)
        replaced = ids.clone().scatter_(1, chosen.to(ids.device), values)
        return torch.where(rows.to(ids.device), replaced, ids)  # a row shorter than substitutions: its padding stays

    return perturb
