"""The sst-erasure suite's run: the model and sentences, exact erasure as the
reference, every method scored against it (the per-example masks once per
seed), the figure, and the results."""

from __future__ import annotations

import math
import statistics
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch
from torch import Tensor

from captum_diffmask.model.attribution import method_trait
from captum_diffmask.methods import method_class
from captum_diffmask.evaluation.erasure_agreement import summarize_agreement, top_k_mask
from benchmarks.tasks.sst import SSTData, sst_sites

from benchmarks.methods import MethodContext
from benchmarks.progress import bar, error_text, log
from benchmarks.records import read_json_lines
from benchmarks.suites.sst_erasure.attributions import (
    MaskedPredictor, MaskRun, run_erasure, run_mask_method, run_scoring_method,
)
from benchmarks.suites.sst_erasure.figure import make_figure
from benchmarks.suites.sst_erasure.loading import Bench, load_bench
from benchmarks.suites.sst_erasure.prose import summary_notes
from benchmarks.suites.sst_erasure.scoring import (
    checks, compare_pairs, empty_optimum_scores, erasure_statistics, exact_erasure_record, mean_per_sentence,
    miss_breakdown, over_seeds, Reference, tuning_budget,
)
from benchmarks.suites.sst_erasure.settings import (
    BASELINE_KINDS, MASK_METHODS, METRICS, PAPER, PAPER_SOURCE, SCORE_KEYS,
)


def run(config: Mapping[str, Any], out_dir: Path, verbose: bool = True) -> Dict[str, Any]:
    r"""Runs the SST erasure suite with ``config`` (see :data:`DEFAULTS`); the
    figure goes to ``out_dir / "figures"``. Returns the results (see
    :func:`write_report`)."""
    run_start = time.perf_counter()
    # the first seed: the GRU's, and every method's; the per-example masks run once per seed
    seeds = [int(s) for s in config["seeds"]]
    split = config.get("split", "dev")
    bench = load_bench(config, seeds[0], verbose)
    reference = erasure_reference(config, bench, verbose)
    methods, kept_by_method, per_sentence = score_methods(config, bench, reference, seeds, verbose)
    bootstrap = dict(config.get("bootstrap", {}))
    comparisons = compare_pairs(per_sentence, config.get("comparisons", []), int(bootstrap.get("resamples", 10_000)),
                                int(bootstrap.get("seed", 0)))
    figures, notes = _figures(config, reference, kept_by_method, out_dir)
    unit = "word pieces" if bench.unit.name == "piece" else "words"
    results: Dict[str, Any] = {
        "title": f"SST erasure agreement ({split}, sentences of <= {config['max_tokens']} {unit})",
        "split": split,
        "metrics": METRICS,
        "methods": methods,
        "comparisons": comparisons,
        "paper": PAPER,
        "paper_source": PAPER_SOURCE,
        "model": bench.model_info,
        "erasure": erasure_statistics(reference, bench.model_info["cut"], config),
        "baseline": {"kind": BASELINE_KINDS.get(config.get("baseline", "mean"), config.get("baseline")),
                     "norm": float(bench.baseline.norm())},
        "figures": figures,
        "suite_seconds": time.perf_counter() - run_start,
    }
    results["tuning"] = _tuning(config)
    results["checks"] = checks(results, config)
    results["notes"] = summary_notes(results, config) + notes
    return results


def _tuning(config: Mapping[str, Any]) -> Optional[Dict[str, Any]]:
    r"""The per-example rows' tuning budgets (:func:`tuning_budget`) from the
    tuning's lines (``config["tuning_lines"]``, from the repository's root);
    None when there are none."""
    path = Path(__file__).resolve().parents[3] / str(config.get("tuning_lines") or "")
    if not config.get("tuning_lines") or not path.is_file():
        return None
    lines = read_json_lines(path)
    return tuning_budget(lines, [name for name in MASK_METHODS if any(line["row"] == name for line in lines)])


def erasure_reference(config: Mapping[str, Any], bench: Bench, verbose: bool) -> Reference:
    r"""
    Exact erasure on the searched sentences, and which of them are scored.

    Args:

        config (Mapping): the suite's configuration (``erasure``,
                    ``include_empty_optimum``, ``score_empty_optimum``).
        bench (Bench): from :func:`~.loading.load_bench`.
        verbose (bool): progress bars and a line of counts.

    Returns:
        *Reference*: the scored sentences are the solved ones with a non-empty
        optimal set (any solved one with ``include_empty_optimum``).
    """
    include_empty = bool(config.get("include_empty_optimum", False))
    short = bench.short
    erasure = run_erasure(bench.model, short, bench.baseline, config.get("erasure", {}), verbose)
    size, solved = erasure["size"], erasure["solved"]
    empty = solved & (size == 0)
    scored_rows = torch.nonzero(solved & (size >= 0 if include_empty else size >= 1)).flatten()
    data = short.subset(scored_rows)
    optimal_sets = [erasure["all_masks"][i][:, : data.ids.shape[1]] for i in scored_rows.tolist()]
    log(verbose, f"[sst-erasure] erasure: {int(solved.sum())} solved, {int((~solved).sum())} not solved, "
                 f"{int(empty.sum())} with an empty optimum, {len(data)} scored ({erasure['seconds']:.1f} s)")
    if len(data) == 0:
        raise ValueError("no sentence to score: every sentence is unsolved or has an empty optimal set")
    empty_rows = torch.nonzero(empty).flatten() if not include_empty else empty[:0]
    score_empty = len(empty_rows) > 0 and bool(config.get("score_empty_optimum", True))
    empty_data = short.subset(empty_rows) if score_empty else None
    return Reference(erasure, empty, data, optimal_sets, size[scored_rows], empty_data)


@dataclass
class _Scoring:
    r"""What scoring one method needs: the bench, the reference, the seeds (the
    first is every method's; the per-example masks run once per seed), the
    sentences per attribute call, and where the mask rows' per-sentence scores
    (means over the seeds) are collected for the paired bootstrap."""

    bench: Bench
    reference: Reference
    predictor: MaskedPredictor
    ctx: MethodContext
    seeds: List[int]
    chunk: int
    verbose: bool
    per_sentence: Dict[str, Dict[str, Tensor]] = field(default_factory=dict)


def score_methods(
    config: Mapping[str, Any], bench: Bench, reference: Reference, seeds: List[int], verbose: bool
) -> Tuple[Dict[str, Dict[str, Any]], Dict[str, Tensor], Dict[str, Dict[str, Tensor]]]:
    r"""
    Every configured method against exact erasure, exact erasure's own record first.

    Args:

        config (Mapping): the suite's configuration.
        bench (Bench): the model and sentences.
        reference (Reference): from :func:`erasure_reference`.
        seeds (list of int): the run's seeds.
        verbose (bool): progress bars and a line per method.

    Returns:
        *tuple* ``(methods, kept_by_method, per_sentence)``: the record of every
        method, the (M, T) kept tokens of every method that ran (for the
        figure), and each mask row's per-sentence scores (means over the seeds).
    """
    model = bench.model
    ctx = MethodContext(
        model=model, sites=lambda: sst_sites(model), padding_mask_arg=0,
        train_loader=lambda batch_size, s: bench.train.loader(batch_size, shuffle=True, seed=s),
        layer=0, seed=seeds[0], verbose=verbose,
    )
    scoring = _Scoring(bench, reference, MaskedPredictor(model, bench.baseline), ctx, seeds,
                       int(config.get("chunk", 128)), verbose)
    all_options: Mapping[str, Any] = config.get("method_options", {})
    methods: Dict[str, Dict[str, Any]] = {
        "ExactErasure": exact_erasure_record(reference, len(bench.short), config.get("erasure", {})),
    }
    kept_by_method: Dict[str, Tensor] = {}
    for name in bar(list(config["methods"]), verbose, desc="methods"):
        methods[name], kept = _score_method(name, dict(all_options.get(name, {})), scoring)
        if kept is not None:
            kept_by_method[name] = kept
    return methods, kept_by_method, scoring.per_sentence


def _score_method(name: str, options: Dict[str, Any], scoring: _Scoring) -> Tuple[Dict[str, Any], Optional[Tensor]]:
    r"""One method's record and kept tokens (None when it failed: the record says why)."""
    record: Dict[str, Any] = {"options": dict(options)}
    kept = None
    try:
        kept = _attribute_and_score(name, options, record, scoring)
        log(scoring.verbose, f"[sst-erasure] {name}: F1 {record['f1']:.2f}, optimality {record['optimality']:.2f}, "
                             f"sufficiency {record['sufficiency']:.2f}, L0 {record['l0']:.2f} "
                             f"({record['seconds_per_example'] * 1e3:.2f} ms/sentence)")
    except ImportError as error:
        record.update({"status": "unavailable", "error": str(error)})
    except Exception as error:  # noqa: BLE001 - a failing method is a result, not a crash
        record.update({"status": "failed", "error": error_text(error), "traceback": traceback.format_exc(limit=8)})
        log(scoring.verbose, f"[sst-erasure] {name}: FAILED {error_text(error)}")
    if record.get("status") != "ok":
        for key in SCORE_KEYS + ("seconds_per_example",):
            record.setdefault(key, math.nan)
    return record, kept


def _attribute_and_score(name: str, options: Dict[str, Any], record: Dict[str, Any], scoring: _Scoring) -> Tensor:
    r"""Runs one method and fills its ``record`` in; returns its (M, T) kept tokens
    (a mask row's: the first seed's)."""
    data, k, sets = scoring.reference.data, scoring.reference.k, scoring.reference.optimal_sets
    kept_runs, scores, seconds, setup = _attribute(name, options, record, scoring)
    per_seed = [scoring.predictor.per_sentence(data, kept, sets) for kept in kept_runs]
    summary = summarize_agreement(per_seed[0])
    if len(per_seed) > 1:  # the scores are the means over the seeds' runs
        summary, spread = over_seeds([summarize_agreement(p) for p in per_seed], scoring.seeds)
        record.update(spread)
    record.update({key: summary[key] for key in SCORE_KEYS})
    record["optimal_l0"] = summary["optimal_l0"]
    if name in MASK_METHODS:
        scoring.per_sentence[name] = mean_per_sentence(per_seed)
        record["misses"] = miss_breakdown(per_seed)
        # the same method's ranking, cut at the optimal size
        top = summarize_agreement(scoring.predictor.per_sentence(data, top_k_mask(scores, k, data.mask), sets))
        record.update({f"topk_{key}": top[key] for key in ("precision", "recall", "f1", "sufficiency")})
    elif scores_are_probabilities(name):
        # its own output: the tokens it keeps with probability > 0.5, no size given
        own = summarize_agreement(scoring.predictor.per_sentence(data, (scores > 0.5) & data.mask.bool(), sets))
        record["own"] = {key: own[key] for key in SCORE_KEYS}
    empty_data = scoring.reference.empty_data
    if empty_data is not None:  # scored apart, then all solved sentences together
        record.update(_score_empty_optimum(name, options, summary, empty_data, scoring))
    record.update({"status": "ok", "seconds_per_example": seconds / len(data), "setup_seconds": setup,
                   "attribute_seconds": seconds, "count": summary["count"]})
    return kept_runs[0]


def _attribute(
    name: str, options: Dict[str, Any], record: Dict[str, Any], scoring: _Scoring
) -> Tuple[List[Tensor], Tensor, float, float]:
    r"""One method on the scored sentences: its kept tokens (a mask row's own
    masks, one per seed; else its top-k tokens), its scores (the first seed's),
    seconds to attribute (a mean over the seeds) and setup seconds; its info and
    selection go to ``record``."""
    bench, data = scoring.bench, scoring.reference.data
    if name in MASK_METHODS:
        # one run per seed: the masks are stochastic (noise, sampled gates)
        runs = [run_mask_method(name, bench.model, data, bench.baseline, options, scoring.chunk, seed, scoring.verbose)
                for seed in scoring.seeds]
        record.update(mask_run_info(runs, options))
        record["selection"] = "mask"
        return [r.kept for r in runs], runs[0].keep, statistics.mean(r.seconds for r in runs), 0.0
    scores, seconds, setup, info = run_scoring_method(name, scoring.ctx, bench.model, bench.train, data, bench.baseline,
                                                      options, scoring.chunk, scoring.seeds[0], scoring.verbose)
    record.update(info)
    record["selection"] = "top-k"
    return [top_k_mask(scores, scoring.reference.k, data.mask)], scores, seconds, setup


def scores_are_probabilities(name: str) -> bool:
    r"""Whether the library method ``name`` scores tokens by the probability
    that they are kept (a mask of its own: those above 0.5)."""
    try:
        cls = method_class(name)
    except ValueError:  # the suite's own rows
        return False
    return bool(method_trait(cls, "scores_are_probabilities"))


def mask_run_info(runs: List[MaskRun], options: Mapping[str, Any]) -> Dict[str, Any]:
    r"""What a mask row's runs say beside their scores (means over the seeds):
    the share of sentences whose selected mask meets the method's own
    constraint KL <= eps, the mean KL and step of the selected masks, and the
    multipliers (their mean, and the share at the 200 clamp)."""
    eps = float(options.get("eps", 0.1))

    def mean(values: List[float]) -> float:
        return statistics.mean(values)

    return {
        "constraint_met": 100.0 * mean([float((r.kl <= eps).float().mean()) for r in runs]),
        "kl_mean": mean([float(r.kl.mean()) for r in runs]),
        "step_mean": mean([float(r.step.float().mean()) for r in runs]),
        "lambda_mean": mean([float(r.lambdas.mean()) for r in runs]),
        "lambda_at_max": mean([float((r.lambdas >= 200).float().mean()) for r in runs]),
    }


def _score_empty_optimum(
    name: str, options: Dict[str, Any], summary: Mapping[str, Any], empty_data: SSTData, scoring: _Scoring
) -> Dict[str, Any]:
    r"""The method on the sentences whose optimum is empty (``empty_data``): a
    mask row's mask (first seed), the top-0 tokens for the others."""
    if name in MASK_METHODS:
        bench = scoring.bench
        empty_kept = run_mask_method(name, bench.model, empty_data, bench.baseline, options, scoring.chunk,
                                     scoring.seeds[0], False).kept
    else:
        empty_kept = torch.zeros_like(empty_data.mask)  # top-0
    empty_sets = [torch.zeros(1, empty_data.ids.shape[1])] * len(empty_data)
    empty_summary = summarize_agreement(scoring.predictor.per_sentence(empty_data, empty_kept, empty_sets))
    return empty_optimum_scores(empty_summary, empty_kept, summary)


def _figures(
    config: Mapping[str, Any], reference: Reference, kept_by_method: Mapping[str, Tensor], out_dir: Path
) -> Tuple[List[Dict[str, str]], List[str]]:
    r"""The kept-words figure, or a note saying why it failed."""
    figures: List[Dict[str, str]] = []
    notes: List[str] = []
    if config.get("figures", True) and kept_by_method:
        try:
            figures.append(make_figure(reference.data, reference.optimal_sets, kept_by_method,
                                       int(config.get("figure_sentences", 4)), out_dir))
        except Exception as error:  # noqa: BLE001
            notes.append(f"Figure failed: {error_text(error)}")
    return figures, notes
