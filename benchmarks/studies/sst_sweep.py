r"""
A sweep of amortised DiffMask settings on the sst suite's fine-tuned model.

Each run of the sweep fits DiffMask in one mode with some options changed from
the suite's (:data:`benchmarks.suites.sst.DEFAULTS`, its DiffMask settings those
the committed sweep files were written against: :data:`SWEEP_DIFFMASK`), for one
or more seeds, and
reports what the suite's targets are about: the share of tokens / states masked
and the macro-F1 of the masked model per layer, each class's F1 beside it (on all of dev, or on train
sentences the fit does not see with ``"score_on": "train"``), the spread of
the attributions across seeds, and the validation sparsity after every epoch
(does more training still help?). The fitting, the faithfulness and the
stability are the suite's own functions, so a sweep measures what the suite
measures; it only runs faster where the model sits on a GPU (``--device cuda``).

Usage::

    python -m benchmarks study sst-sweep SWEEP.json --out results.jsonl [--device cuda]

``SWEEP.json``::

    {"score_on": "dev",    # optional: "train" scores on train sentences set aside
                           # (see _splits): for choosing settings without dev
     "base": {...},        # optional: merged into the sweep's base (the
                           # committed sweeps pin the suite's recipe when they ran:
                           # fit's earlier optimisation, LEGACY_FIT, with the
                           # suite's lr, lr_lambda and epochs of then)
     "runs": [{"name": "hidden-16-epochs", "mode": "hidden", "seeds": [0, 1],
               "train_sentences": null,          # optional: a spread subset
               "readout": "threshold",           # optional: or "louizos" (the scores' gates)
               "diffmask": {"epochs": 16}}]}     # the mode's options changed

One JSON line per run is appended to ``--out``, and a summary line printed.

``--cache`` fits through the MiniLM suites' fit cache
(:mod:`benchmarks.common.minilm.fit_cache`: a stored fit is loaded, a stopped
one resumes), so that the seeds of a run can be fitted by processes side by
side (``--fit-only --seeds S``, one process a seed: on a GPU a fit step leaves
the device mostly idle) and then scored together by one invocation that reads
them all, e.g. the spread across five seeds::

    for s in 0 1 2 3 4; do python -m benchmarks study sst-sweep X.json --device cuda --cache --fit-only --seeds $s & done; wait
    python -m benchmarks study sst-sweep X.json --device cuda --cache --seeds 0 1 2 3 4 --out X.jsonl

(the first process that loads the model fine-tunes and caches it: let one
process load it before the others start).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

import torch

from benchmarks.common.minilm.fit_cache import cached_fit, fitted_where
from benchmarks.fit_presets import DAMPED_FIT
from benchmarks.records import to_jsonable
from benchmarks.report import fmt, table
from benchmarks.runner import limit_onednn_cache, merge
from benchmarks.suites import sst as suite
from benchmarks.tasks import sst_bert
from benchmarks.tasks.sst import read_sst
from captum_diffmask.diffmask.constrained.convergence import SETTLED
from captum_diffmask.diffmask.fit.history import last_rows
from captum_diffmask.model.forward import model_device

#: The question this study answers (``python -m benchmarks list``).
QUESTION = "DiffMask fits on SST with options changed per run, scored on held-out train sentences (or dev)"

#: The sst suite's DiffMask settings up to commit 1495ca3, a sweep's starting point:
#: every committed sweep file was written against them (fit's damped multiplier,
#: tied votes, 2 epochs, the sparsest epoch within eps_valid restored), so that each
#: reproduces with its command; the suite itself now runs fit's defaults.
SWEEP_DIFFMASK: Dict[str, Any] = {
    "batch_size": 32, "l0": "mean", "eps": 0.02, "eps_valid": 0.05, "agreement_valid": 0.8,
    "validation_sentences": 400, "validation_from": "train", "epochs": 2, "select_checkpoint": True,
    **DAMPED_FIT, "votes": "tied", "input": {}, "hidden": {"eps": 0.01},
}

#: Where a sweep's runs are scored (see :func:`_splits`) and the gates they are scored with.
SCORE_ON = ("dev", "train")
READOUTS = ("threshold", "louizos")


def sweep_config(base: Optional[Mapping[str, Any]], run: Mapping[str, Any]) -> Dict[str, Any]:
    r"""The suite's DEFAULTS with :data:`SWEEP_DIFFMASK` as their DiffMask
    settings and ``base`` merged in, then ``run["diffmask"]`` merged into the
    options of ``run["mode"]`` (they win over the shared ones)."""
    mode = run.get("mode")
    if mode not in ("input", "hidden"):
        raise ValueError(f"runs: mode must be 'input' or 'hidden', got {mode!r} (run {run.get('name')!r})")
    if run.get("readout", READOUTS[0]) not in READOUTS:
        raise ValueError(f"runs: readout must be one of {READOUTS}, got {run['readout']!r} (run {run.get('name')!r})")
    config = merge({**suite.DEFAULTS, "diffmask": SWEEP_DIFFMASK}, base)
    return merge(config, {"diffmask": {mode: dict(run.get("diffmask", {}))}})


def run_one(
    run: Mapping[str, Any],
    config: Mapping[str, Any],
    model: torch.nn.Module,
    train: sst_bert.EncodedSST,
    valid: sst_bert.EncodedSST,
    scored: sst_bert.EncodedSST,
    verbose: bool,
    cache: bool = False,
) -> Dict[str, Any]:
    r"""Fits and scores one run of the sweep for each of its seeds (through
    the fit cache with ``cache``: ``fitted`` says per seed where its fit ran).

    Returns:
        *dict* with ``name``, ``mode``, ``options`` (as fitted), ``stability``
        (mean std of the attributions across seeds, None for one seed) and
        ``seeds``: per seed the fit's seconds, selected epoch, steps per layer,
        ``mean_masked`` (%) and ``mean_f1`` over the layers, ``unmasked_f1``,
        ``per_layer`` rows and ``valid_by_epoch`` rows ``[epoch, mean valid
        kept share, lowest valid agreement, highest valid KL]``.
    """
    mode = run["mode"]
    seeds = [int(s) for s in run.get("seeds", [0])]
    if not seeds:
        raise ValueError(f"runs: seeds must name at least one seed (run {run.get('name')!r})")
    device = model_device(model)
    attributions, per_seed = [], []
    options: Dict[str, Any] = {}
    forward = _forward_seconds(model, train, int(config["diffmask"].get("batch_size", 64)), device)
    for seed in seeds:
        explainer, info = fit_seed(config, model, mode, train, valid, seed, verbose, cache)
        options = info["options"]
        scores = suite.faithfulness(explainer, scored, 128, verbose, rule=run.get("readout", "threshold"))
        divergence = explainer.evaluate(suite.OnDevice(scored.loader(128, shuffle=False, sort_by_length=True), device),
                                        rule=run.get("readout", "threshold"))
        history = info["history"]
        epochs = sorted({h["epoch"] for h in history})
        last = last_rows(history)
        per_layer = [{"layer": r["layer"], "masked": round(r["masked_share"], 2), "f1": round(r["macro_f1"], 2),
                      "class_f1": [round(f, 2) for f in r["class_f1"]],
                      "agreement": round(r["agreement"], 2), "changed": r["changed"],
                      "f1_change_interval": [round(v, 2) for v in r["f1_change_interval"]], "kl": divergence[r["layer"]]["kl"],
                      **_fit_state(explainer.convergence.get(r["layer"]), last.get(r["layer"]))}
                     for r in scores["per_layer"]]
        per_seed.append({
            "seed": seed, "fitted": fitted_where(info),
            "fit_seconds": round(info["seconds"], 1),
            "steps": info["steps"], "step_seconds": info["seconds"] / max(info["steps"], 1),
            "step_over_forward": info["seconds"] / max(info["steps"], 1) / forward,
            "peak_rss_gb": info["peak_rss_gb"],
            "selected_epoch": info["selected_epoch"],
            "feasible": info["feasible"],
            "steps_per_layer": sum(h["steps"] for h in history) / len(explainer.fitted_layers),
            "mean_masked": statistics.mean(r["masked"] for r in per_layer),
            "mean_f1": statistics.mean(r["f1"] for r in per_layer),
            "unmasked_f1": scores["unmasked"]["macro_f1"],
            "unmasked_class_f1": [round(f, 2) for f in scores["unmasked"]["class_f1"]],
            "unmasked_median_top2_gap": scores["unmasked"]["median_top2_gap"],
            "per_layer": per_layer,
            "valid_by_epoch": [
                [e, statistics.mean(h["valid_l0"] for h in history if h["epoch"] == e),
                 min(h["valid_agreement"] for h in history if h["epoch"] == e),
                 max(h["valid_kl"] for h in history if h["epoch"] == e)]
                for e in epochs if all("valid_l0" in h for h in history if h["epoch"] == e)
            ],
        })
        # the spread across seeds at layer 0 (attribute's default), or the first
        # fitted layer of a run that fits some layers only (``layers``)
        layer = 0 if 0 in explainer.fitted_layers else min(explainer.fitted_layers)
        attributions.append(suite.per_sentence(
            scored, 128, lambda ids, mask: explainer.attribute(ids, additional_forward_args=(mask,), layer=layer),
            device=device))
    spread = suite.stability(attributions)
    return {"name": run.get("name", mode), "mode": mode, "options": options, "readout": run.get("readout", "threshold"),
            "train_sentences": len(train), "stability": None if spread is None else spread["mean_std"],
            "seeds": per_seed}


def fit_seed(
    config: Mapping[str, Any], model: torch.nn.Module, mode: str, train: sst_bert.EncodedSST,
    valid: sst_bert.EncodedSST, seed: int, verbose: bool, cache: bool,
) -> Tuple[Any, Dict[str, Any]]:
    r"""One seed's fit of a run (the suite's ``fit_diffmask``), through the
    fit cache with ``cache``; ``(explainer, record)``."""
    if cache:
        return cached_fit(suite.fit_diffmask, model, mode, train, valid, {**config, "cache": True}, seed, verbose)
    return suite.fit_diffmask(model, mode, train, valid, config, seed, verbose)


def _fit_state(report: Optional[Mapping[str, Any]], last: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    r"""A layer's end of fit: its convergence status and steps, and the last
    epoch's training means of the sampled gates' KL and the deployed read-out's."""
    if report is None:
        return {"status": "not trained"}
    state = {"status": report["status"], "steps": report["steps"]}
    if last is not None:
        state.update({"train_kl": last["kl"], "train_kl_deployed": last.get("kl_deployed"), "lambda": last["lambda"]})
    return state


def _forward_seconds(model: torch.nn.Module, data: sst_bert.EncodedSST, batch_size: int, device: torch.device,
                     batches: int = 12) -> float:
    r"""The median seconds of one plain forward pass (float32, no gradients) of a
    fit batch: the unit of a fit step's cost."""
    times = []
    with torch.no_grad():
        for i, (ids, mask) in enumerate(data.batches(batch_size, shuffle=True, seed=0, sort_by_length=True)):
            if i > batches:
                break
            start = time.perf_counter()
            model(input_ids=ids.to(device), attention_mask=mask.to(device))
            if i > 0:  # the first call warms up
                times.append(time.perf_counter() - start)
    return statistics.median(times)


def _splits(
    spec: Mapping[str, Any], config: Mapping[str, Any], train: List[Any], dev: List[Any], tokenizer: Any, max_length: int
) -> Tuple[List[Any], sst_bert.EncodedSST, sst_bert.EncodedSST]:
    r"""The sentences a sweep fits on, validates on and scores on.

    ``score_on`` ``"dev"`` (the committed sweeps): every train sentence is fitted
    on; validation is ``validation_sentences`` of dev and the scores are on all of
    dev. ``"train"`` (for choosing the suite's settings without reading dev): the
    suite's validation sentences are set aside from train as the suite does
    (:func:`~benchmarks.suites.sst.validation_split`), then ``score_sentences``
    (default 1000) more train sentences, spread evenly, that the fit does not see
    and the scores are taken on.

    Returns:
        *tuple* of the fit's sentences (before a run's ``train_sentences`` limit),
        the encoded validation sentences and the encoded scored sentences.
    """
    score_on = spec.get("score_on", "dev")
    if score_on == "dev":
        encoded_dev = sst_bert.encode_sst(dev, tokenizer, max_length)
        rows = [dev.index(s) for s in suite.subset(dev, config["diffmask"].get("validation_sentences"))]
        return train, encoded_dev.subset(torch.as_tensor(rows)), encoded_dev
    if score_on not in SCORE_ON:
        raise ValueError(f"score_on must be one of {SCORE_ON}, got {score_on!r}")
    fit, valid = suite.validation_split({**config["diffmask"], "validation_from": "train"}, train, dev)
    fit, scored = suite.validation_split(
        {"validation_sentences": int(spec.get("score_sentences", 1000)), "validation_from": "train"}, fit, dev)
    encode = lambda sentences: sst_bert.encode_sst(sentences, tokenizer, max_length)  # noqa: E731
    return fit, encode(valid), encode(scored)


def convergence_markdown(results: List[Mapping[str, Any]], command: str) -> str:
    r"""
    The sweep's runs as a report: per run, seed and layer the fit's verdict,
    the last epoch's training KL of the sampled and of the deployed gates, the
    deterministic read-out's KL on the scored sentences against ``eps x 1.25``,
    the masked share and the macro-F1 change; a summary of the verdicts and the
    cost (a step against one forward pass, peak resident memory).

    Args:

        results (list of dict): :func:`run_one`'s records, with the sweep's
                    ``seconds``, ``scored_on`` and ``scored_sentences``.
        command (str): the command that made them, for the header.

    Returns:
        *str*: markdown.
    """
    lines = ["# DiffMask's fit on SST, measured on held-out train sentences", "",
             f"Command: `{command}`. The sst suite's fine-tuned MiniLM; every number is on train sentences "
             "(the fit's, and held-out ones it does not see); no dev sentence is read.", ""]
    probes, settled, within = 0, 0, 0
    for result in results:
        eps = float(result["options"].get("eps", 0.1))
        lines += [f"## {result['name']} ({result['mode']} mode, eps {eps:g})", "",
                  f"Scored on {result.get('scored_sentences', '?')} held-out {result.get('scored_on', '?')} "
                  f"sentences. Options: `{ {k: v for k, v in result['options'].items() if k != 'convergence'} }`.", ""]
        for seed in result["seeds"]:
            rows = []
            for r in seed["per_layer"]:
                if r.get("status") == "not trained":
                    continue
                probes += 1
                ok = r["kl"] <= suite.HELD_OUT_MARGIN * eps
                if r["status"] in SETTLED:
                    settled += 1
                    within += int(ok)
                rows.append([r["layer"], f"**{r['status']}**", r.get("steps", ""), fmt(r.get("train_kl"), 4),
                             fmt(r.get("train_kl_deployed"), 4), f"{fmt(r['kl'], 4)} {'ok' if ok else 'over'}",
                             f"{r['masked']:.1f}", f"{r['f1'] - seed['unmasked_f1']:+.2f}{interval(r)}",
                             class_f1_change(r, seed), f"{r['agreement']:.1f}", changed_summary(r)])
            lines += [f"Seed {seed['seed']}: {seed['steps']} steps in {seed['fit_seconds'] / 60:.1f} min "
                      f"({seed['step_seconds']:.2f} s a step, {seed['step_over_forward']:.1f}x one forward pass of a "
                      f"batch), peak resident memory {seed['peak_rss_gb']:.2f} GB; unmasked macro-F1 "
                      f"{seed['unmasked_f1']:.2f}{gap_note(seed)}.", "",
                      table(["layer", "verdict", "steps", "train KL (sampled)", "train KL (deployed)",
                             f"held-out KL (<= {suite.HELD_OUT_MARGIN * eps:g})", "masked %", "macro-F1 change [95 % interval]",
                             "F1 change per class (-- / - / 0 / + / ++)", "same prediction %",
                             "changed: median top-2 gap, % toward a more predicted class"],
                            rows), ""]
    lines[4:4] = [f"**{settled} of {probes} probes** ended with a verdict (converged, or needed: every gate open "
                  f"because closing the least-needed positions breaks the constraint); {within} of those keep the "
                  "deterministic read-out's held-out KL within eps x 1.25.", ""]
    return "\n".join(lines)


def changed_summary(row: Mapping[str, Any]) -> str:
    r"""A layer's changed predictions: the median unmasked top-2 probability gap
    of those sentences and the share that moved to a class the model predicts
    more often; ``-`` when none changed or the record predates the measurement."""
    changed = row.get("changed")
    if not changed or not changed["count"]:
        return "-"
    return f"{changed['median_top2_gap']:.3f}, {changed['toward_more_predicted']:.0f} %"


def interval(row: Mapping[str, Any]) -> str:
    r"""`` [low, high]``: the macro-F1 change's bootstrap interval over the
    scored sentences, when recorded."""
    bounds = row.get("f1_change_interval")
    return "" if bounds is None else f" [{bounds[0]:+.1f}, {bounds[1]:+.1f}]"


def gap_note(seed: Mapping[str, Any]) -> str:
    r"""``, median top-2 gap G`` of the unmasked predictions, when recorded."""
    gap = seed.get("unmasked_median_top2_gap")
    return "" if gap is None else f", median top-2 probability gap {gap:.3f}"


def class_f1_change(row: Mapping[str, Any], seed: Mapping[str, Any]) -> str:
    r"""A layer's F1 change per class (SST's five, very negative first), or
    ``-`` for a record written before the classes were scored."""
    if "class_f1" not in row or "unmasked_class_f1" not in seed:
        return "-"
    return " / ".join(f"{f - u:+.1f}" for f, u in zip(row["class_f1"], seed["unmasked_class_f1"]))


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks study sst-sweep", description=__doc__.split("\n\n")[1])
    parser.add_argument("sweep", help="the sweep's JSON file (see the module docstring)")
    parser.add_argument("--out", default=None, help="JSON lines file the runs are appended to (required but with --fit-only)")
    parser.add_argument("--cache", action="store_true", help="fit through the fit cache (stored fits are loaded)")
    parser.add_argument("--fit-only", action="store_true",
                        help="fit each run's seeds into the fit cache and score nothing (implies --cache)")
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="every run's seeds instead of its own")
    parser.add_argument("--device", default="cpu", help="where the model and DiffMask run (default: cpu)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--data-dir", default=None, help="directory holding sst/ (default: as the suite)")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    parser.add_argument("--markdown", default=None, help="also write this invocation's runs as a markdown report here")
    args = parser.parse_args(argv)
    limit_onednn_cache()
    spec = json.loads(Path(args.sweep).read_text())
    runs = spec.get("runs") if isinstance(spec, dict) else None
    if not runs:
        parser.error(f"sweep: {args.sweep} has no 'runs' list")
    if spec.get("score_on", "dev") not in SCORE_ON:
        parser.error(f"sweep: score_on must be one of {SCORE_ON}, got {spec['score_on']!r}")
    if args.out is None and not args.fit_only:
        parser.error("--out is required unless --fit-only")
    if args.seeds is not None:
        runs = [{**run, "seeds": list(args.seeds)} for run in runs]
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    base = dict(spec.get("base") or {})
    if args.data_dir is not None:
        base["data_dir"] = args.data_dir
    configs = [sweep_config(base, run) for run in runs]  # every run checked before any is fitted
    shared = configs[0]
    train_all, dev_sentences = read_sst("train", shared.get("data_dir")), read_sst("dev", shared.get("data_dir"))
    # the model of the suite (same configuration, same cache entry), whatever
    # subset of train a run fits DiffMask on
    model, tokenizer, _ = suite.load_model(shared, suite.subset(train_all, shared.get("train_sentences")), dev_sentences,
                                           not args.quiet)
    model.to(args.device)
    max_length = int(shared["model"].get("max_length", 128))
    fit_sentences, valid, scored = _splits(spec, shared, train_all, dev_sentences, tokenizer, max_length)

    def train_of(run: Mapping[str, Any]) -> sst_bert.EncodedSST:
        limit = run.get("train_sentences", shared.get("train_sentences"))
        return sst_bert.encode_sst(suite.subset(fit_sentences, limit), tokenizer, max_length)

    if args.fit_only:
        for run, config in zip(runs, configs):
            train = train_of(run)
            for seed in run.get("seeds", [0]):
                start = time.perf_counter()
                explainer, info = fit_seed(config, model, run["mode"], train, valid, int(seed), not args.quiet, True)
                statuses = {k: r["status"] for k, r in explainer.convergence.items()}
                print(f"{run.get('name', run['mode'])}, seed {seed}: {statuses} ({fitted_where(info)}; "
                      f"{time.perf_counter() - start:.0f} s)", flush=True)
        return 0
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = []
    for run, config in zip(runs, configs):
        start = time.perf_counter()
        train = train_of(run)
        result = run_one(run, config, model, train, valid, scored, not args.quiet, args.cache)
        result.update({"seconds": time.perf_counter() - start, "device": str(args.device),
                       "scored_on": spec.get("score_on", "dev"), "scored_sentences": len(scored)})
        with out.open("a", encoding="utf-8") as f:
            f.write(json.dumps(to_jsonable(result)) + "\n")
        done.append(to_jsonable(result))
        if args.markdown:  # rewritten after every run: a long sweep's report grows as it goes
            command = "python -m benchmarks study sst-sweep " + " ".join(argv if argv is not None else sys.argv[1:])
            Path(args.markdown).write_text(convergence_markdown(done, command), encoding="utf-8")
        summary = ", ".join(f"seed {s['seed']}: {s['mean_masked']:.1f} % masked, F1 {s['mean_f1']:.2f} "
                            f"(unmasked {s['unmasked_f1']:.2f})" for s in result["seeds"])
        spread = "" if result["stability"] is None else f"; std across seeds {result['stability']:.4f}"
        print(f"{result['name']} ({result['mode']}): {summary}{spread}; {result['seconds']:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
