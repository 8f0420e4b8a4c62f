"""The sst-erasure suite's numbers: what the methods are scored against (exact
erasure's optimal sets), and the pure functions that turn agreement summaries
and erasure results into the results' scores, statistics and targets."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor

from benchmarks.tasks.sst import SSTData

from .settings import PAPER, SCORE_KEYS


@dataclass
class Reference:
    r"""Exact erasure on the searched sentences, and what it makes of them.

    Attributes:
        erasure (dict): :func:`~.attributions.run_erasure`'s result (per
                    searched sentence: ``size``, ``solved``, ``complete``,
                    ``evaluations``, ``all_masks``; and ``seconds``).
        empty (Tensor): (N,) bool, solved with an empty optimal set.
        data (SSTData): the scored sentences.
        optimal_sets (list of Tensor): per scored sentence, its (S, T) optimal sets.
        k (Tensor): (M,) the optimal size of each scored sentence.
        empty_data (SSTData or None): the sentences with an empty optimum, scored
                    apart; None when there are none or they are not scored.
    """

    erasure: Dict[str, Any]
    empty: Tensor
    data: SSTData
    optimal_sets: List[Tensor]
    k: Tensor
    empty_data: Optional[SSTData]


def combine_summaries(summaries: Sequence[Mapping[str, float]]) -> Dict[str, float]:
    r"""The scores of the union of disjoint sets of sentences, from each set's
    :func:`summarize_agreement` (every score is a mean over sentences)."""
    total = sum(int(x["count"]) for x in summaries)
    out: Dict[str, float] = {"count": total}
    for key in SCORE_KEYS:
        out[key] = sum(float(x[key]) * int(x["count"]) for x in summaries) / max(total, 1)
    return out


def over_seeds(summaries: Sequence[Mapping[str, Any]], seeds: Sequence[int]) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    r"""
    The scores of a method run once per seed: the means over the seeds' runs.

    Args:

        summaries (sequence of Mapping): each seed's agreement summary, in the
                    order of ``seeds``.
        seeds (sequence of int): the seeds.

    Returns:
        *tuple* ``(summary, spread)``: the first seed's summary with the means
        over the seeds as its scores, and the record's ``per_seed`` (each
        seed's scores) and ``std_over_seeds``.
    """
    spread = {
        "per_seed": [{"seed": s, **{key: p[key] for key in SCORE_KEYS}} for s, p in zip(seeds, summaries)],
        "std_over_seeds": {key: statistics.stdev(p[key] for p in summaries) for key in SCORE_KEYS},
    }
    summary = {**summaries[0], **{key: statistics.mean(p[key] for p in summaries) for key in SCORE_KEYS}}
    return summary, spread


def empty_optimum_scores(
    empty_summary: Mapping[str, Any], empty_kept: Tensor, summary: Mapping[str, Any]
) -> Dict[str, Any]:
    r"""A method's record entries for the sentences with an empty optimum
    (``empty_optimum``, with the share of them where it keeps no word) and for
    all solved sentences together (``all_solved``), from its summaries over the
    empty-optimum sentences and over the scored ones."""
    empty_optimum = {key: empty_summary[key] for key in SCORE_KEYS + ("count",)}
    empty_optimum["keeps_nothing"] = 100.0 * float((empty_kept.sum(1) == 0).float().mean())
    return {"empty_optimum": empty_optimum, "all_solved": combine_summaries([summary, empty_summary])}


def exact_erasure_record(reference: Reference, searched: int, options: Mapping[str, Any]) -> Dict[str, Any]:
    r"""Exact erasure's own record: every agreement score 100 by definition,
    the optimum's L0, and its time per searched sentence."""
    return {
        "status": "ok", "selection": "exact", **{key: 100.0 for key in ("precision", "recall", "f1", "optimality", "sufficiency")},
        "l0": 100.0 * float((reference.k.float() / reference.data.lengths.float()).mean()),
        "seconds_per_example": reference.erasure["seconds"] / max(searched, 1), "setup_seconds": 0.0,
        "options": dict(options),
    }


def erasure_statistics(
    reference: Reference, searched: int, split_sentences: int, config: Mapping[str, Any]
) -> Dict[str, Any]:
    r"""The results' ``erasure`` entry: how many sentences were searched,
    solved and scored, the optimal sizes and sets, and the search's cost."""
    erasure, data, k = reference.erasure, reference.data, reference.k
    size, solved = erasure["size"], erasure["solved"]
    sizes_hist = {int(v): int((size[solved] == v).sum()) for v in size[solved].unique().tolist()}
    return {
        "sentences": searched, "split_sentences": split_sentences, "solved": int(solved.sum()),
        "not_solved": int((~solved).sum()), "incomplete": int((solved & ~erasure["complete"]).sum()),
        "empty_optimum": int(reference.empty.sum()), "scored": len(data), "size_histogram": sizes_hist,
        "mean_optimal_size": float(k.float().mean()),
        "mean_solutions": float(np.mean([len(m) for m in reference.optimal_sets])),
        "mean_words": float(data.lengths.float().mean()), "evaluations_mean": float(erasure["evaluations"].float().mean()),
        "evaluations_max": int(erasure["evaluations"].max()), "seconds": erasure["seconds"],
        "budget": int(dict(config.get("erasure", {})).get("budget", 20_000)),
    }


def checks(results: Mapping[str, Any], config: Mapping[str, Any]) -> List[Dict[str, Any]]:
    r"""The issue's targets, evaluated on this run's numbers."""
    methods = results["methods"]
    out: List[Dict[str, Any]] = []
    dm, rf = methods.get("PerExampleDiffMask", {}), methods.get("REINFORCE", {})
    if dm.get("status") == "ok":
        paper = PAPER["PerExampleDiffMask"]
        for key in ("f1", "optimality"):
            out.append({"target": f"per-example DiffMask {key} >= {paper[key]} (paper)", "value": f"{dm[key]:.2f}",
                        "met": dm[key] >= paper[key]})
        if rf.get("status") == "ok":
            for key in ("precision", "recall", "f1", "optimality"):
                out.append({"target": f"per-example DiffMask beats REINFORCE on {key}",
                            "value": f"{dm[key]:.2f} vs {rf[key]:.2f}", "met": dm[key] > rf[key]})
    limit = 180.0 if config.get("quick") else 2700.0
    seconds = results.get("suite_seconds", math.nan)
    out.append({"target": f"{'quick' if config.get('quick') else 'full'} run <= {limit / 60:.0f} min",
                "value": f"{seconds / 60:.1f} min (suite run; the machine's threads: {torch.get_num_threads()})",
                "met": seconds <= limit})
    return out
