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

from captum_diffmask.evaluation.bootstrap import paired_bootstrap
from benchmarks.tasks.sst import SSTData

from benchmarks.suites.sst_erasure.settings import SCORE_KEYS


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
    :func:`~captum_diffmask.evaluation.erasure_agreement.summarize_agreement` (every score is a mean over sentences)."""
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


def mean_per_sentence(per_seed: Sequence[Mapping[str, Tensor]]) -> Dict[str, Tensor]:
    r"""Each sentence's scores averaged over the seeds' runs (what the paired
    bootstrap resamples: sentences, each with its mean over seeds)."""
    return {key: torch.stack([p[key].double() for p in per_seed]).mean(0) for key in SCORE_KEYS}


def miss_breakdown(per_seed: Sequence[Mapping[str, Tensor]]) -> Dict[str, float]:
    r"""
    Where a method's masks stand against the optimum, in percent of the
    sentences (means over the seeds' runs): ``optimal``; ``optimal_size_flips``
    (as many tokens as the optimum, but the class changes); ``smaller`` (fewer
    tokens than the optimum: the class changes, as the optimum is the
    smallest set that keeps it); ``larger_keeps`` and ``larger_flips`` (more
    tokens than the optimum); and ``extra_tokens``, the mean of kept minus
    optimal size.
    """
    rows = []
    for scores in per_seed:
        size, k = scores["kept_size"], scores["optimal_size"]
        keeps = scores["sufficiency"].bool()
        rows.append({
            "optimal": scores["optimality"].bool(), "optimal_size_flips": (size == k) & ~keeps, "smaller": size < k,
            "larger_keeps": (size > k) & keeps, "larger_flips": (size > k) & ~keeps,
        })
    out = {key: 100.0 * statistics.mean(float(r[key].float().mean()) for r in rows) for key in rows[0]}
    out["extra_tokens"] = statistics.mean(float((s["kept_size"] - s["optimal_size"]).float().mean()) for s in per_seed)
    return out


def compare_pairs(
    per_sentence: Mapping[str, Mapping[str, Tensor]], pairs: Sequence[Sequence[str]], resamples: int, seed: int
) -> List[Dict[str, Any]]:
    r"""
    Paired bootstrap intervals of the differences between two mask methods on
    the same sentences, for F1, optimality and L0 (percentage points).

    Args:

        per_sentence (Mapping): per method, its per-sentence scores (means over
                    the seeds, :func:`mean_per_sentence`).
        pairs (sequence): ``(first, second)`` method names; pairs with a method
                    that did not run are skipped.
        resamples (int): bootstrap draws.
        seed (int): seeds the draws.

    Returns:
        *list* of ``{"first", "second", "metrics": {key: paired_bootstrap's dict
        in percentage points}}``.
    """
    out = []
    for first, second in pairs:
        if first not in per_sentence or second not in per_sentence:
            continue
        metrics = {}
        for key in ("f1", "optimality", "l0"):
            result = paired_bootstrap(100.0 * per_sentence[first][key], 100.0 * per_sentence[second][key],
                                      resamples=resamples, seed=seed)
            metrics[key] = result
        out.append({"first": first, "second": second, "metrics": metrics})
    return out


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


def erasure_statistics(reference: Reference, cut: Mapping[str, Any], config: Mapping[str, Any]) -> Dict[str, Any]:
    r"""
    The results' ``erasure`` entry: the cut (how many sentences of the split
    have at most ``max_tokens`` tokens), how many were searched, solved and
    scored, the optimal sizes (every solved sentence's, the empty ones
    included) and sets, and the search's cost.

    Args:

        reference (Reference): from :func:`~.orchestration.erasure_reference`.
        cut (Mapping): the bench's ``model_info["cut"]``.
        config (Mapping): the suite's configuration.

    Returns:
        *dict*.
    """
    erasure, data, k = reference.erasure, reference.data, reference.k
    size, solved = erasure["size"], erasure["solved"]
    sizes_hist = {int(v): int((size[solved] == v).sum()) for v in size[solved].unique().tolist()}
    lengths = data.lengths.float()
    return {
        "unit": cut["unit"], "max_tokens": cut["max_tokens"], "split_sentences": cut["split_sentences"],
        "within_cut": cut["within"], "within_cut_share": 100.0 * cut["within"] / max(cut["split_sentences"], 1),
        "sentences": cut["searched"], "solved": int(solved.sum()),
        "not_solved": int((~solved).sum()), "incomplete": int((solved & ~erasure["complete"]).sum()),
        "empty_optimum": int(reference.empty.sum()), "scored": len(data), "size_histogram": sizes_hist,
        "mean_optimal_size": float(k.float().mean()), "median_optimal_size": float(k.float().median()),
        "optimal_share": 100.0 * float((k.float() / lengths).mean()),
        "mean_solutions": float(np.mean([len(m) for m in reference.optimal_sets])),
        "mean_tokens": float(lengths.mean()), "evaluations_mean": float(erasure["evaluations"].float().mean()),
        "evaluations_max": int(erasure["evaluations"].max()), "seconds": erasure["seconds"],
        "budget": int(dict(config.get("erasure", {})).get("budget", 20_000)),
    }


def checks(results: Mapping[str, Any], config: Mapping[str, Any]) -> List[Dict[str, Any]]:
    r"""The issue's targets, evaluated on this run's numbers."""
    out: List[Dict[str, Any]] = []
    accuracy = 100.0 * results["model"]["dev_accuracy"]
    out.append({"target": "GRU dev accuracy >= 44 % (about 45 %, the GRU level of the paper's time)",
                "value": f"{accuracy:.2f} %", "met": accuracy >= 44.0})
    for comparison in results.get("comparisons", []):
        for key in ("f1", "optimality"):
            ci = comparison["metrics"][key]
            out.append({"target": f"{comparison['first']} above {comparison['second']} on {key} (95 % CI above 0)",
                        "value": f"{ci['difference']:+.2f} [{ci['low']:+.2f}, {ci['high']:+.2f}]", "met": ci["low"] > 0})
    limit = 300.0 if config.get("quick") else 3600.0
    seconds = results.get("suite_seconds", math.nan)
    out.append({"target": f"{'quick' if config.get('quick') else 'full'} run <= {limit / 60:.0f} min",
                "value": f"{seconds / 60:.1f} min (suite run; torch threads: {torch.get_num_threads()})",
                "met": seconds <= limit})
    return out


def tuning_budget(lines: Sequence[Mapping[str, Any]], rows: Sequence[str]) -> Dict[str, Any]:
    r"""
    What each per-example row's tuning cost and found, from the tuning's lines
    (``python -m benchmarks study sst-erasure-tuning``): its trials, the steps of
    a trial, the train sentences scored and searched, the values tried, and its
    best train F1 at each shared value.

    Args:

        lines (sequence of dict): the tuning's JSON lines.
        rows (sequence of str): the rows compared.

    Returns:
        *dict* ``{"sentences", "searched", "rows": {row: {"trials", "steps",
        "tried": {option: [values]}, "best_f1": {shared (JSON): F1}}}}``.
    """
    budget: Dict[str, Any] = {"sentences": sorted({int(line["sentences"]) for line in lines}),
                              "searched": sorted({int(line["searched"]) for line in lines}), "rows": {}}
    for row in rows:
        mine = [line for line in lines if line["row"] == row]
        tried: Dict[str, set] = {}
        best: Dict[str, float] = {}
        for line in mine:
            for key, value in {**line["shared"], **line["per_row"]}.items():
                tried.setdefault(key, set()).add(value)
            shared = ", ".join(f"{k} {v:g}" for k, v in sorted(line["shared"].items()))
            best[shared] = max(best.get(shared, -math.inf), float(line["f1"]))
        budget["rows"][row] = {"trials": len(mine), "steps": sorted({int(line["options"]["steps"]) for line in mine}),
                               "tried": {k: sorted(v) for k, v in tried.items()}, "best_f1": best}
    return budget
