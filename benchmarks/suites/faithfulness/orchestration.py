"""The faithfulness suite's run: the sst suite's model and DiffMask fits, every
method's input-token scores on the evaluated sentences, their ERASER metrics
and plausibility, speed, the figure and the export."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Tuple

import torch
from torch import Tensor

from captum_diffmask.evaluation.faithfulness import TokenEraser

from benchmarks.methods import MethodContext, prepare
from benchmarks.progress import log_to_stderr
from benchmarks.common.minilm.attributions import attribute_at, per_sentence
from benchmarks.common.minilm.fit_cache import certified_fit
from benchmarks.common.minilm.fitting import certify_fit, fit_diffmask
from benchmarks.common.minilm.loading import Bench, load_bench
from benchmarks.suites.faithfulness.export import write_jsonl
from benchmarks.suites.faithfulness.figure import curves_figure
from benchmarks.suites.faithfulness.rationales import rationale_masks, word_tokens
from benchmarks.suites.faithfulness.scoring import across_seeds, per_sentence_metrics, summarize
from benchmarks.suites.faithfulness.settings import METHODS

#: name -> per seed, per sentence the (T_i,) scores; and the seconds per sentence of each.
ScoreSets = Dict[str, List[List[Tensor]]]
#: The metrics' key of DiffMask's depths scored with their own learned baselines.
OWN_BASELINE = "own baseline"


def run(config: Mapping[str, Any], out_dir: Path, verbose: bool = True) -> Dict[str, Any]:
    r"""Runs the faithfulness suite with ``config`` (see :data:`DEFAULTS`); the
    figure goes to ``out_dir / "figures"``, the JSONL export to ``out_dir``."""
    seeds = _check_config(config)
    (out_dir / "figures").mkdir(parents=True, exist_ok=True)
    bench = load_bench(config, verbose)
    data = bench.evaluated
    sets, seconds, fits, own_baselines = diffmask_scores(config, bench, seeds, verbose)
    method_sets, method_seconds, failures = method_scores(config, bench, seeds, verbose)
    sets.update(method_sets)
    seconds.update(method_seconds)
    seconds["forward"] = _forward_seconds(bench)
    metrics = score_all(config, bench, sets, verbose)
    if config.get("own_baseline", False):
        metrics[OWN_BASELINE] = score_own_baselines(config, bench, sets, own_baselines, verbose)
    figure = curves_figure(metrics, config["fractions"], config["all_seeds_removal"],
                           out_dir / "figures" / "faithfulness_curves.png")
    export = write_jsonl(out_dir, data, {n: s[0] for n, s in sets.items()},
                         rationale_masks(data)["non-neutral"], config.get("export_sentences"))
    return {
        "title": f"Faithfulness and plausibility on SST-5 with {bench.model_info['source']}",
        "split": config.get("split", "dev"), "model": bench.model_info, "seeds": seeds,
        "fractions": list(config["fractions"]), "removals": list(config["removals"]),
        "all_seeds_removal": config["all_seeds_removal"], "own_baseline": bool(config.get("own_baseline", False)),
        "metrics": metrics, "seconds_per_sentence": seconds,
        "diffmask_fits": fits, "failures": failures, "figures": {"curves": figure}, "export": export,
        "notes": [],
    }


def _check_config(config: Mapping[str, Any]) -> List[int]:
    seeds = [int(s) for s in config["seeds"]]
    if not seeds:
        raise ValueError("seeds must name at least one seed")
    unknown = [m for m in config["methods"] if m not in METHODS]
    if unknown:
        raise ValueError(f"methods: unknown {unknown}; the faithfulness suite runs {', '.join(METHODS)}")
    if config["all_seeds_removal"] not in config["removals"]:
        raise ValueError(f"all_seeds_removal must be one of removals {config['removals']}, got {config['all_seeds_removal']!r}")
    return seeds


def _timed(data: Any, fn: Callable[[Tensor, Tensor], Tensor], verbose: bool, desc: str) -> Tuple[List[Tensor], float]:
    start = time.perf_counter()
    scores = per_sentence(data, 32, fn, verbose, desc)
    return scores, (time.perf_counter() - start) / max(len(data), 1)


def _forward_seconds(bench: Bench) -> float:
    with torch.no_grad():
        _, seconds = _timed(bench.evaluated, lambda ids, mask: bench.model(ids, attention_mask=mask).logits, False, "")
    return seconds


def diffmask_scores(
    config: Mapping[str, Any], bench: Bench, seeds: List[int], verbose: bool
) -> Tuple[ScoreSets, Dict[str, float], List[Dict[str, Any]], Dict[str, List[Tensor]]]:
    r"""DiffMask in input mode fitted per seed as the sst suite fits it; its
    scores at every layer (``DiffMask layer k``) and their mean over layers
    (``DiffMask mean``), per seed; seconds per sentence of one attribution pass;
    each fit's convergence record; per ``DiffMask layer k``, each seed's learned
    baseline of depth k, (H,)."""
    sets: ScoreSets = {}
    seconds: List[float] = []
    fits = []
    baselines: Dict[str, List[Tensor]] = {}
    for seed in seeds:
        log_to_stderr(verbose, f"[faithfulness] DiffMask input, seed {seed}")
        explainer, info = certified_fit(fit_diffmask, certify_fit, bench.model, "input", bench.train, bench.valid, config,
                                        seed, verbose)
        scores, per = _timed(bench.evaluated, lambda ids, mask: explainer.attribute(
            ids, additional_forward_args=(mask,), layer=None), verbose, "attribute DiffMask")
        seconds.append(per)
        fits.append({"seed": seed, "seconds": info["seconds"], "selected_epoch": info["selected_epoch"],
                     "convergence": {str(k): v.get("status") for k, v in info["convergence"].items()},
                     "heldout": info.get("heldout"), "eps": info.get("options", {}).get("eps"),
                     "stored": info.get("stored"), "certificate": info.get("certificate")})
        for k in range(scores[0].shape[-1]):
            sets.setdefault(f"DiffMask layer {k}", []).append([s[:, k] for s in scores])
            baselines.setdefault(f"DiffMask layer {k}", []).append(explainer.learned_baseline(k))
        sets.setdefault("DiffMask mean", []).append([s.mean(-1) for s in scores])
    return sets, {"DiffMask": min(seconds)}, fits, baselines


def _method(name: str, options: Mapping[str, Any], ctx: MethodContext) -> Callable[[Tensor, Tensor], Tensor]:
    method = prepare(name, ctx, options)
    if method.explainer.attributes_every_layer():  # token scores at every block (attention): their mean
        return lambda ids, mask: method.attribute(ids, (mask,), None).mean(-1)
    return lambda ids, mask: attribute_at(method, ids, mask, 0)


def method_scores(
    config: Mapping[str, Any], bench: Bench, seeds: List[int], verbose: bool
) -> Tuple[ScoreSets, Dict[str, float], Dict[str, str]]:
    r"""Every comparison method's input-token scores (``layer=0``), per seed
    for the ``seeded_methods`` and with the first seed for the others; the
    seconds per sentence (setup excluded); a failure is recorded, not raised."""
    sets: ScoreSets = {}
    seconds: Dict[str, float] = {}
    failures: Dict[str, str] = {}
    for name in config["methods"]:
        options = dict(config.get("method_options", {}).get(name, {}))
        for seed in seeds if name in config.get("seeded_methods", []) else seeds[:1]:
            ctx = MethodContext(
                model=bench.model, sites=lambda: None, padding_mask_arg="auto", layer=0, seed=seed, verbose=False,
                train_loader=lambda batch_size, s: bench.train.loader(batch_size, shuffle=True, seed=s, sort_by_length=True),
            )
            try:
                scores, per = _timed(bench.evaluated, _method(name, options, ctx), verbose, f"{name} seed {seed}")
            except Exception as error:  # noqa: BLE001 - one failing method must not sink the suite
                failures[name] = f"{type(error).__name__}: {error}"
                log_to_stderr(verbose, f"[faithfulness] {name} failed: {failures[name]}")
                break
            sets.setdefault(name, []).append(scores)
            seconds[name] = min(seconds.get(name, per), per)
    return sets, seconds, failures


def score_own_baselines(
    config: Mapping[str, Any], bench: Bench, sets: ScoreSets, baselines: Mapping[str, List[Tensor]], verbose: bool,
) -> Dict[str, Any]:
    r"""Per ``DiffMask layer k``: the summary across seeds with each seed's scores
    read with the removed tokens' input embeddings replaced by that fit's learned
    baseline of depth k (what DiffMask's own gates put in their place), not [MASK]'s."""
    data = bench.evaluated
    candidates, rationales = word_tokens(data), rationale_masks(data)
    metrics: Dict[str, Any] = {}
    for name, per_baseline in baselines.items():
        summaries = []
        for scores, baseline in zip(sets[name], per_baseline):
            eraser = TokenEraser(bench.model, removal="baseline", baseline=baseline)
            summaries.append(summarize(per_sentence_metrics(
                eraser, data, scores, candidates, rationales, config["fractions"], int(config["batch_size"]),
                verbose, f"own baseline: {name}")))
        metrics[name] = across_seeds(summaries)
    return metrics


def score_all(config: Mapping[str, Any], bench: Bench, sets: ScoreSets, verbose: bool) -> Dict[str, Dict[str, Any]]:
    r"""Per removal and score set: the summary across seeds (every seed for
    ``all_seeds_removal``, the first seed for the other removals)."""
    data = bench.evaluated
    candidates, rationales = word_tokens(data), rationale_masks(data)
    baseline = bench.tokenizer.mask_token_id
    metrics: Dict[str, Dict[str, Any]] = {}
    for removal in config["removals"]:
        eraser = TokenEraser(bench.model, removal=removal, baseline=baseline if removal == "baseline" else None)
        metrics[removal] = {}
        for name, per_seed in sets.items():
            used = per_seed if removal == config["all_seeds_removal"] else per_seed[:1]
            summaries = [summarize(per_sentence_metrics(
                eraser, data, scores, candidates, rationales, config["fractions"], int(config["batch_size"]),
                verbose, f"{removal}: {name}")) for scores in used]
            metrics[removal][name] = across_seeds(summaries)
    return metrics
