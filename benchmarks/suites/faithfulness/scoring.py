"""The suite's numbers: ERASER's metrics and plausibility of one set of
per-sentence scores, over length-sorted batches, and their summaries."""

from __future__ import annotations

import math
import statistics
from typing import Any, Dict, List, Mapping, Sequence

import torch
from torch import Tensor

from captum_diffmask.evaluation.faithfulness import eraser_scores, plausibility, TokenEraser
from benchmarks.tasks.sst_bert import EncodedSST

from benchmarks.progress import bar


def padded(scores: Sequence[Tensor], rows: Tensor, width: int) -> Tensor:
    r"""(len(rows), width) scores of ``rows`` (one 1-D tensor of real-token
    scores per sentence), zero past each sentence's end."""
    out = torch.zeros(len(rows), width)
    for i, row in enumerate(rows.tolist()):
        n = min(len(scores[row]), width)
        out[i, :n] = scores[row][:n]
    return out


def per_sentence_metrics(
    eraser: TokenEraser, data: EncodedSST, scores: Sequence[Tensor], candidates: Tensor,
    rationales: Mapping[str, Tensor], fractions: Sequence[float], batch_size: int, verbose: bool = False, desc: str = "",
) -> Dict[str, Tensor]:
    r"""
    ERASER's metrics and plausibility of ``scores``, one value per sentence.

    Args:

        eraser (TokenEraser): the model and how tokens are removed.
        data (EncodedSST): the evaluated sentences.
        scores (sequence of Tensor): per sentence, the (T_i,) scores of its real tokens.
        candidates (Tensor): (N, T) bool, the tokens that may be removed (words).
        rationales (Mapping): variant -> (N, T) bool rationale.
        fractions (sequence of float): ERASER's top-k fractions.
        batch_size (int): sentences per batch.
        verbose (bool, optional): a progress bar. Default: False
        desc (str, optional): its label. Default: ""

    Returns:
        *dict*: ``comprehensiveness`` and ``sufficiency`` (N, F), their
        ``aopc_*`` (N,), and per variant ``auprc/VARIANT`` and ``token_f1/VARIANT`` (N,).
    """
    lengths = data.attention_mask.sum(1)
    order = torch.argsort(lengths, stable=True)
    columns: Dict[str, List[Tensor]] = {}
    out_rows: List[Tensor] = []
    for start in bar(range(0, len(data), batch_size), verbose, desc=desc):
        rows = order[start : start + batch_size]
        longest = int(lengths[rows].max())
        ids, mask = data.input_ids[rows, :longest], data.attention_mask[rows, :longest]
        words, batch_scores = candidates[rows, :longest], padded(scores, rows, longest)
        result = eraser_scores(eraser, ids, batch_scores, (mask,), fractions, batch_size=None, candidates=words)
        values = {key: result[key] for key in ("comprehensiveness", "sufficiency", "aopc_comprehensiveness", "aopc_sufficiency")}
        for variant, rationale in rationales.items():
            agreement = plausibility(batch_scores, rationale[rows, :longest], mask.bool() & words)
            values[f"auprc/{variant}"], values[f"token_f1/{variant}"] = agreement["auprc"], agreement["token_f1"]
        for key, value in values.items():
            columns.setdefault(key, []).append(value.float().cpu())
        out_rows.append(rows)
    inverse = torch.argsort(torch.cat(out_rows))
    return {key: torch.cat(value)[inverse] for key, value in columns.items()}


def _nanmean(values: Tensor) -> float:
    finite = values[~torch.isnan(values)]
    return float(finite.mean()) if finite.numel() else math.nan


def summarize(metrics: Mapping[str, Tensor]) -> Dict[str, Any]:
    r"""Means over sentences: per fraction for comprehensiveness and sufficiency,
    scalars for the rest (plausibility over sentences with a non-empty rationale)."""
    summary: Dict[str, Any] = {}
    for key, value in metrics.items():
        summary[key] = [_nanmean(column) for column in value.T] if value.dim() == 2 else _nanmean(value)
    return summary


def across_seeds(summaries: Sequence[Mapping[str, Any]]) -> Dict[str, Any]:
    r"""Mean and std (sample; 0 for one seed) across seeds of every scalar of
    :func:`summarize`'s output, and the per-fraction means."""
    result: Dict[str, Any] = {"seeds": len(summaries)}
    for key, first in summaries[0].items():
        if isinstance(first, list):
            result[key] = [statistics.mean(s[key][i] for s in summaries) for i in range(len(first))]
            continue
        values = [float(s[key]) for s in summaries]
        result[key] = statistics.mean(values)
        result[f"{key}_std"] = statistics.stdev(values) if len(values) > 1 else 0.0
    return result
