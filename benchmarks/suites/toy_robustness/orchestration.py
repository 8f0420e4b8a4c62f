"""The toy-robustness suite's run and report: per data set and fit seed, DiffMask
fitted with fit's defaults and scored by JS to the ground truth."""

from __future__ import annotations

import statistics
import time
import warnings
from pathlib import Path
from typing import Any, Dict, List, Mapping, Union

import torch

from benchmarks.fit_presets import PAPER_L0_CHOSEN_ON
from benchmarks.progress import log_to_stderr
from benchmarks.report import chosen_on_section, fmt, table
from benchmarks.suites.toy import load_toy_model, MODEL_EPOCH_CHOSEN_ON, score
from benchmarks.workers import check_workers, Job, run_jobs
from captum_diffmask import DiffMask, seed_std
from captum_diffmask.diffmask import grouped_options
from captum_diffmask.diffmask.constrained.convergence import DiffMaskConvergenceWarning
from captum_diffmask.evaluation.toy_task import generate_toy_data, toy_sites, ToyData, ToyModel

DESCRIPTION = (
    "toy robustness: DiffMask with fit's defaults on unseen toy data sets x fit seeds x two "
    "task shapes; JS to the ground truth per cell, convergence status, wall time"
)

DEFAULTS: Dict[str, Any] = {
    # data seeds used nowhere else in the project (the toy suite uses 0-2, the
    # robustness test 301-302; fit's defaults were chosen on 10-15 and 101-105)
    "data_seeds": [201, 202, 203, 204, 205],
    "seeds": [0, 1, 2],  # fit seeds
    # a shape set to None (by an override) is skipped
    "shapes": {"paper": {"vocab_size": 10, "max_length": 10}, "large": {"vocab_size": 20, "max_length": 20}},
    # (and 1000 more examples each model stops on: the held-out set is scored)
    "data": {"num_examples": 10_000, "holdout": 0.1, "stopping_examples": 1000},
    "model": {"epochs": 40, "batch_size": 128, "lr": 5e-3, "target_accuracy": 0.995,
              "embedding_dim": 64, "hidden_size": 64},
    # eps is the task's (the paper's toy setting); every other option is fit's default
    "fit": {"eps": 0.05},
    # input mode's own (they win over "fit"): the ground truth's mask costs a KL of
    # ~0.07 under the learned baseline (data seeds 101-105, never reported), so at
    # 0.05 a multiplier that holds the KL at eps cannot reach it; fit's earlier
    # damped rule did by settling above eps
    "input_fit": {"eps": 0.1},
    # the constructor's sparsity term: the paper's expected L0, as the toy suite's
    "l0": "expected",
    "batch_size": 128,
    "modes": ["hidden", "input"],
    # the fit seeds input mode runs with (None: all); input fits take ~5x the
    # steps of hidden ones on the toy task (docs/diffmask.md, "Convergence")
    "input_seeds": [0],
    "target_js": 0.02,
    "threads": 1,
    # data sets fitted side by side, one process of one thread each
    "workers": 2,
    "cache": True,
}

QUICK: Dict[str, Any] = {"data_seeds": [201, 202], "seeds": [0]}

#: What each choice of :data:`DEFAULTS` was made on (never the held-out sets the
#: suite scores): see benchmarks.report.CHOSEN_ON_KINDS.
CHOSEN_ON: Dict[str, Dict[str, str]] = {
    "model epoch": MODEL_EPOCH_CHOSEN_ON,
    "data seeds": {"on": "rule", "why": "201-205, used nowhere else in the project"},
    "eps": {"on": "rule", "why": "0.05 in hidden mode, the authors' toy notebook's"},
    "input mode's eps": {"on": "development", "why": "0.1: the ground truth's mask costs a KL of about 0.07 under "
                                                    "the learned baseline on data seeds 101-105, never reported"},
    "fit's options": {"on": "development", "why": "fit's defaults, chosen on toy data seeds 10-15 and 101-105"},
    "input mode's fit seeds": {"on": "rule", "why": "seed 0 alone, for the CPU budget"},
    "DiffMask's L0": PAPER_L0_CHOSEN_ON,
}


def fit_cell(model: ToyModel, train: ToyData, valid: ToyData, mode: str, seed: int, config: Mapping[str, Any]) -> Dict[str, Any]:
    r"""One DiffMask fit at layer 1 with fit's defaults (and the configured eps),
    scored on ``valid``; its convergence report and time."""
    # input mode reads the states alone: the 64-d embedding would drown the 2-d
    # state (docs/diffmask.md, toy task)
    # (the votes tied across depths, as the committed report fitted them)
    options = {"probe_reads_input": False, "votes": "tied"} if mode == "input" else {}
    if "l0" in config:
        options["l0"] = config["l0"]
    explainer = DiffMask(model, mode=mode, sites=toy_sites(model), padding_mask_arg=1, **options)
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DiffMaskConvergenceWarning)
        options = {**config["fit"], **(config.get("input_fit", {}) if mode == "input" else {})}
        history = explainer.fit(train.loader(int(config["batch_size"]), shuffle=True, seed=seed),
                                layers=[1], seed=seed, verbose=False, **grouped_options(options))
    seconds = time.perf_counter() - start
    with torch.no_grad():
        scores = explainer.attribute(valid.ids, additional_forward_args=(valid.query, valid.mask), layer=1)
    report = explainer.convergence[1]
    return {
        "mode": mode, "seed": seed, "js": score(scores, valid)["js"], "fit_seconds": seconds, "scores": scores,
        "status": report["status"], "steps": report["steps"], "epochs": history[-1]["epoch"],
        "final": {k: history[-1][k] for k in ("kl", "l0", "lambda")},
        "warned": any(issubclass(w.category, DiffMaskConvergenceWarning) for w in caught),
    }


def _modes_for(seed: int, config: Mapping[str, Any]) -> List[str]:
    input_seeds = config.get("input_seeds")
    return [m for m in config["modes"] if m != "input" or input_seeds is None or seed in input_seeds]


def data_set_cells(shape: str, dims: Mapping[str, int], data_seed: int, config: Mapping[str, Any],
                   verbose: bool) -> Dict[str, Any]:
    r"""One data set of the grid: its toy model (trained or from the cache), every
    fit seed x mode cell on it, and the std across its fit seeds per mode; the
    job a worker process runs."""
    data = generate_toy_data(config["data"]["num_examples"], dims["vocab_size"], dims["max_length"], seed=data_seed)
    train, valid = data.split(config["data"]["holdout"], seed=data_seed)
    model_config = {"model": config["model"], "cache": config.get("cache", True),
                    "data": {**config["data"], **dims}}
    model, info = load_toy_model(model_config, data_seed, train, valid, verbose)
    log_to_stderr(verbose, f"[toy-robustness] {shape} data {data_seed}: model held-out accuracy {info['accuracy']:.4f}")
    cells: List[Dict[str, Any]] = []
    scores: Dict[str, List[torch.Tensor]] = {mode: [] for mode in config["modes"]}
    for seed in config["seeds"]:
        for mode in _modes_for(seed, config):
            cell = {"shape": shape, "data_seed": data_seed, **fit_cell(model, train, valid, mode, seed, config)}
            scores[mode].append(cell.pop("scores"))
            cells.append(cell)
            log_to_stderr(verbose, f"[toy-robustness] {shape} data {data_seed} seed {seed} {mode}: JS {cell['js']:.4f}, "
                                   f"{cell['status']} after {cell['steps']} steps ({cell['fit_seconds']:.1f} s)")
    stability = []
    for mode, per_seed in scores.items():
        if len(per_seed) > 1:
            figures = seed_std(per_seed, valid.mask)
            stability.append({"shape": shape, "data_seed": data_seed, "mode": mode,
                              "mean_std": figures["mean_std"], "p95_std": figures["p95_std"]})
    return {"model": {"shape": shape, "data_seed": data_seed, **info}, "cells": cells, "stability": stability}


def run(config: Mapping[str, Any], out_dir: Path, verbose: bool = True) -> Dict[str, Any]:
    r"""Every (shape, data set, fit seed, mode) cell, a data set per job in
    ``config["workers"]`` processes side by side; see the module docstring."""
    jobs = [Job(f"{shape} data {data_seed}", data_set_cells, (shape, dims, data_seed, config, verbose))
            for shape, dims in config["shapes"].items() if dims is not None  # None: switched off by an override
            for data_seed in config["data_seeds"]]
    done = run_jobs(jobs, check_workers(config.get("workers", 1)), verbose, prefix="[toy-robustness] ")
    cells = [cell for data_set in done for cell in data_set["cells"]]
    return {"title": "Toy robustness: DiffMask's fit with its defaults on unseen data sets",
            "cells": cells, "models": [data_set["model"] for data_set in done],
            "stability": [row for data_set in done for row in data_set["stability"]],
            "summary": summarize_cells(cells, float(config["target_js"]))}


def summarize_cells(cells: List[Dict[str, Any]], target: float) -> Dict[str, Any]:
    r"""Per mode: median and worst JS, cells within ``target``, converged fits,
    median and largest steps and fit time."""
    out: Dict[str, Any] = {}
    for mode in sorted({c["mode"] for c in cells}):
        rows = [c for c in cells if c["mode"] == mode]
        js = [c["js"] for c in rows]
        worst = max(rows, key=lambda c: c["js"])
        out[mode] = {
            "cells": len(rows), "median_js": statistics.median(js), "worst_js": worst["js"],
            "worst_cell": f"{worst['shape']} data {worst['data_seed']} seed {worst['seed']}",
            "within_target": sum(j <= target for j in js), "target_js": target,
            "converged": sum(c["status"] == "converged" for c in rows),
            "median_steps": statistics.median(c["steps"] for c in rows), "max_steps": max(c["steps"] for c in rows),
            "median_fit_seconds": statistics.median(c["fit_seconds"] for c in rows),
            "total_fit_seconds": sum(c["fit_seconds"] for c in rows),
        }
    return out


def write_report(results: Mapping[str, Any], path: Union[str, Path], json_name: str = "results.json") -> str:
    r"""The markdown report: summary per mode, every cell, the models."""
    config, summary = results["config"], results["summary"]
    shapes = ", ".join(f"{k} (V={v['vocab_size']}, T<={v['max_length']})" for k, v in config["shapes"].items() if v is not None)
    lines = [f"# {results['title']}", "",
             f"Suite `toy-robustness`, **{results.get('mode', '?')}** run, {fmt(results.get('wall_seconds'), 1)} s wall "
             f"time ({config.get('workers', 1)} data set(s) side by side), started {results.get('started_utc', '?')}. Data seeds {config['data_seeds']}, fit seeds "
             f"{config['seeds']} (input mode: {config.get('input_seeds') or 'all'}), shapes {shapes}. "
             f"Fit options beyond the defaults: `{config['fit']}`, input mode's own `{config.get('input_fit', {})}`; layer 1 (the FFNN output). Every number below "
             "was produced by this run.", "", "## Summary", ""]
    rows = [[mode, s["cells"], fmt(s["median_js"], 4), f"{fmt(s['worst_js'], 4)} ({s['worst_cell']})",
             f"{s['within_target']}/{s['cells']}", f"{s['converged']}/{s['cells']}",
             f"{s['median_steps']:.0f} / {s['max_steps']}", f"{s['median_fit_seconds']:.1f}"]
            for mode, s in summary.items()]
    lines += [table(["mode", "cells", "median JS", "worst JS (cell)", f"JS <= {config['target_js']}", "converged",
                     "steps (median / max)", "fit s (median)"], rows), ""]
    if results.get("stability"):
        rows = [[r["shape"], r["data_seed"], r["mode"], fmt(r["mean_std"], 4), fmt(r["p95_std"], 4)]
                for r in results["stability"]]
        lines += ["## Stability across fit seeds", "",
                  "The std of the held-out attributions across the fit seeds of one data set (`seed_std`: per "
                  "real position, then its mean and 95th percentile); the paper reports 0.05 (input) and 0.03 "
                  "(hidden) on SST.", "",
                  table(["shape", "data seed", "mode", "mean std", "p95 std"], rows), ""]
    lines += ["## Every cell", ""]
    rows = [[c["shape"], c["data_seed"], c["seed"], c["mode"], fmt(c["js"], 4), c["status"], c["steps"],
             fmt(c["final"]["kl"], 3), fmt(c["final"]["l0"], 3), fmt(c["final"]["lambda"], 3), f"{c['fit_seconds']:.1f}"]
            for c in results["cells"]]
    lines += [table(["shape", "data", "seed", "mode", "JS", "status", "steps", "KL (last epoch)", "kept share",
                     "lambda", "fit s"], rows), ""]
    rows = [[m["shape"], m["data_seed"], fmt(m["accuracy"], 4), "cached" if m["cached"] else f"{m['train_seconds']:.1f} s"]
            for m in results["models"]]
    lines += ["## Models", "", table(["shape", "data seed", "held-out accuracy", "trained"], rows), ""]
    lines += chosen_on_section(results)
    lines += ["## Reproduce", "", "```bash", results.get("command", "python -m benchmarks run toy-robustness --out DIR"),
              "```", "", f"All numbers are also in `{json_name}`.", ""]
    text = "\n".join(lines)
    Path(path).write_text(text, encoding="utf-8")
    return text


def headline(results: Mapping[str, Any]) -> str:
    r"""One line of a run's numbers for the results' index: per mode, the cells
    within the JS target and the converged fits."""
    parts = []
    for mode, summary in (results.get("summary") or {}).items():
        parts.append(f"{mode}: {summary['within_target']} of {summary['cells']} cells JS <= {summary['target_js']} "
                     f"(median {summary['median_js']:.4f}), {summary['converged']} converged")
    return "; ".join(parts)
