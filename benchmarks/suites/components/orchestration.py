"""The components suite's run: the tracr programs and the SST MiniLM as jobs side by side, then the figures."""

from __future__ import annotations

import traceback
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

from benchmarks.common.minilm.loading import load_bench
from benchmarks.progress import log_to_stderr
from benchmarks.suites.components.figures import sst_figure, tracr_figures
from benchmarks.suites.components.sst_heads import MASKS, merge_sst, run_sst, sst_config
from benchmarks.suites.components.tracr import KINDS, score_program
from benchmarks.workers import check_workers, Job, run_jobs
from captum_diffmask.diffmask.constrained.convergence import SETTLED

#: The issue's target for amortised DiffMask's mean ROC AUC on every program.
TARGET_AUC = 0.95
#: The issue's targets for the whole run on 2 cores, minutes: full, and ``--quick``.
TARGET_MINUTES = {"full": 30.0, "quick": 3.0}
#: The verdicts under which a fit's AUC counts toward the target: settled
#: (:data:`~captum_diffmask.diffmask.constrained.convergence.SETTLED`), or every gate of the block
#: closed with the constraint kept (the right answer for a block whose
#: components the program does not use). A violated, collapsed, unsettled or
#: open block leaves the mask's scores without a verdict.
COUNTED_VERDICTS = SETTLED + ("closed",)


def run(config: Mapping[str, Any], out_dir: Path, verbose: bool = True) -> Dict[str, Any]:
    r"""
    Runs both parts: every method at the first of ``config["seeds"]``, and the
    variants of amortised DiffMask (``tracr.variants``) at every seed; the fits
    as jobs in ``config["workers"]`` processes side by side.

    Args:

        config (Mapping): :data:`DEFAULTS` with the run's changes.
        out_dir (Path): where ``figures/`` goes.
        verbose (bool, optional): a line per program and fit. Default: True

    Returns:
        *dict*: ``tracr`` (lines, skipped), ``sst`` (or the reason it was
        skipped), ``figures``, ``checks``.
    """
    seeds = [int(seed) for seed in config["seeds"]]
    results: Dict[str, Any] = {"title": "Component masks: tracr's ground truth and the SST MiniLM's heads"}
    figures: List[Dict[str, str]] = []
    tracr, sst = config.get("tracr"), config.get("sst")
    tracr_jobs = _tracr_jobs(tracr, seeds) if tracr and tracr.get("programs") else []
    sst_jobs, skipped = _sst_jobs(sst, seeds[0], verbose) if sst else ([], None)
    # the longest first, so that the workers end together: the SST fits, then the programs
    done = run_jobs(sst_jobs + tracr_jobs, check_workers(config.get("workers", 1)), verbose, "[components] ")
    if sst:
        results["sst"] = skipped or merge_sst(done[: len(sst_jobs)])
        if "figure" in results["sst"] and results["sst"]["figure"]["tokens"]:
            name = sst_figure(results["sst"].pop("figure"), out_dir / "figures")
            figures.append({"file": f"figures/{name}", "caption": "SST dev sentences: P(kept) of every head "
                            "(columns) of every block (rows), amortised DiffMask (per sentence) and the per-task "
                            "mask (the same for every sentence)."})
    if tracr_jobs:
        results["tracr"] = _tracr_results(tracr_jobs, done[len(sst_jobs):], tracr, out_dir, figures, verbose)
    results["figures"] = figures
    results["checks"] = checks(results)
    return results


def _sst_jobs(config: Mapping[str, Any], seed: int, verbose: bool) -> Tuple[List[Job], Optional[Dict[str, str]]]:
    r"""A job per mask of the SST part, or none and the reason it is skipped. The
    model is loaded here first, so that a model not yet cached is fine-tuned once,
    not by each worker."""
    try:
        load_bench(sst_config(config), verbose)
    except (FileNotFoundError, ImportError) as error:  # SSTDataError is a FileNotFoundError
        log_to_stderr(verbose, f"[components] sst skipped: {error}")
        return [], {"skipped": f"{type(error).__name__}: {error}"}
    return [Job(f"sst {name}", run_sst, (dict(config), seed, verbose, [(name, per_task)]))
            for name, per_task in MASKS], None


def _tracr_jobs(config: Mapping[str, Any], seeds: List[int]) -> List[Job]:
    r"""A job per program and kind at the first seed (every method), then per
    further seed (the variants alone, when there are variants)."""
    jobs = [Job(f"{name} {kind}, seed {seeds[0]}", tracr_job, (name, seeds[0], dict(config), kind, True))
            for name in config["programs"] for kind in KINDS]
    if config.get("variants"):
        jobs += [Job(f"{name} {kind}, seed {seed}, variants", tracr_job, (name, seed, dict(config), kind, False))
                 for seed in seeds[1:] for name in config["programs"] for kind in KINDS]
    return jobs


def tracr_job(name: str, seed: int, config: Mapping[str, Any], kind: str, everything: bool) -> Dict[str, Any]:
    r"""One program's kind (:func:`~.tracr.score_program`), in a worker: ``lines``
    and ``figure``, or ``skipped`` (tracr is not installed) or ``error``."""
    try:
        lines, figure = score_program(name, seed, config, (kind,), everything)
    except ImportError as error:
        return {"skipped": f"ImportError: {error}"}
    except Exception as error:  # one program's failure is recorded, the others run
        return {"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()}
    return {"lines": lines, "figure": figure}


def _tracr_results(jobs: List[Job], done: List[Dict[str, Any]], config: Mapping[str, Any], out_dir: Path,
                   figures: List[Dict[str, str]], verbose: bool) -> Dict[str, Any]:
    r"""The jobs' lines in order (a program's failure as one line), and the
    figures of the jobs with every method (the first seed's)."""
    skipped = next((result["skipped"] for result in done if "skipped" in result), None)
    if skipped:
        log_to_stderr(verbose, f"[components] tracr skipped: {skipped}")
        return {"lines": [], "skipped": skipped}
    lines: List[Dict[str, Any]] = []
    shown: Dict[str, Dict[str, Any]] = {}
    failed = set()
    for job, result in zip(jobs, done):
        name, everything = job.arguments[0], job.arguments[4]
        if "error" in result:
            if name not in failed:
                lines.append({"program": name, "error": result["error"], "traceback": result["traceback"]})
            failed.add(name)
            continue
        lines += result["lines"]
        if everything:
            figure = shown.setdefault(name, {**result["figure"], "kinds": {}})
            figure["kinds"].update(result["figure"]["kinds"])
            log_to_stderr(verbose, f"[components] {name}: " + ", ".join(
                f"{line['kind']} {line['method']} AUC {line['auc']:.3f}" for line in result["lines"]))
    if config.get("figure_inputs"):
        for file in tracr_figures(list(shown.values()), out_dir / "figures"):
            figures.append({"file": f"figures/{file}", "caption": f"`{file[11:-4]}`: per held-out input (columns), "
                            "blocks x components as each method scores them; the first column: the components the "
                            "program uses."})
    return {"lines": lines}


def diffmask_fits(lines: List[Mapping[str, Any]]) -> Dict[Tuple[str, str, str], List[Mapping[str, Any]]]:
    r"""Amortised DiffMask's scored lines by ``(program, kind, method)``, one per
    seed it was fitted at, in the lines' order."""
    groups: Dict[Tuple[str, str, str], List[Mapping[str, Any]]] = {}
    for line in lines:
        if "auc" in line and str(line.get("method", "")).startswith("DiffMask"):
            groups.setdefault((line["program"], line["kind"], line["method"]), []).append(line)
    return groups


def uncounted_verdicts(line: Mapping[str, Any]) -> set:
    r"""The verdicts of a fit's blocks that are not :data:`COUNTED_VERDICTS`
    (empty: the fit's scores count toward the target)."""
    return {str(v) for v in line.get("verdicts", {}).values()} - set(COUNTED_VERDICTS)


def checks(results: Mapping[str, Any]) -> List[Dict[str, Any]]:
    r"""The issue's target: amortised DiffMask's mean ROC AUC >= 0.95 on every
    program and kind, with fit's defaults and with each variant's options; over
    the seeds a method was fitted at, the mean, met only where every seed's
    every block ended with one of :data:`COUNTED_VERDICTS`."""
    out = []
    for (program, kind, method), lines in diffmask_fits(results.get("tracr", {}).get("lines", [])).items():
        auc = sum(line["auc"] for line in lines) / len(lines)
        uncounted = sorted(set().union(*(uncounted_verdicts(line) for line in lines)))
        value = f"{auc:.3f}"
        if len(lines) > 1:
            value += f" (mean of {len(lines)} seeds, lowest {min(line['auc'] for line in lines):.3f})"
        value += f" (not counted: {', '.join(uncounted)})" if uncounted else ""
        out.append({"target": f"amortised {method}: ROC AUC >= {TARGET_AUC} ({program}, {kind})",
                    "value": value, "met": bool(auc >= TARGET_AUC and not uncounted)})
    return out + _time_check(results)


def _time_check(results: Mapping[str, Any]) -> List[Dict[str, Any]]:
    r"""The whole run against :data:`TARGET_MINUTES` (once the runner has timed it)."""
    wall, mode = results.get("wall_seconds"), results.get("mode")
    if wall is None or mode not in TARGET_MINUTES:
        return []
    cores = results.get("environment", {}).get("cpu_count", "?")
    limit = TARGET_MINUTES[mode]
    return [{"target": f"the whole {mode} run <= {limit:g} min on 2 cores (this machine: {cores})",
             "value": f"{wall / 60:.1f} min", "met": bool(wall <= 60 * limit)}]
