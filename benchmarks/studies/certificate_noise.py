r"""
How far a settled probe moves when trained further: with fresh optimiser
states, going on from the fit's own state, and after a cool-down.

The probe is the sst suite's input-mode fit of seed 0 by the plateau rule alone
(the suite's settings without its cool-down, through the fit cache: every depth
settled and frozen, the fit's state kept). On the suite's train batches, with
the drift measured on the suite's 400 held-out train sentences (no dev
sentence), :data:`STEPS` further steps at the fit's rates with nothing frozen:

- ``fresh``: two continuations (seeds 1 and 2) that start fresh optimiser states
  (Adam's moments, the multipliers' controller): each one's drift from the fit,
  and how far the two ends lie apart;
- ``going on``: the certificate (:func:`captum_diffmask.certify`) going on from
  the fit's state file (its optimiser states, data order and RNG), as the fit
  would have gone on: what is left of the drift without the restart;
- ``cooldown``: the sst suite's own fit of the same seed, which is this fit
  followed by its cool-down (``Convergence(cooldown=STEPS)``: every depth
  trained further at a tenth of the probe's and the multipliers' rates), and
  the suite's certificate of it, going on from its state at the cooled rates.

Each drift is judged under the sst suite's certificate tolerances (fixed before
any of these measurements).

Usage::

    python -m benchmarks study certificate-noise --markdown docs/results/certificate-noise.md [--threads 2]
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence

#: The question this study answers (``python -m benchmarks list``).
QUESTION = ("how far a settled SST probe moves when trained further: with fresh optimiser states, going on from "
            "its fit's state, and after a cool-down")
#: The steps of every continuation (the certificate's, the cool-down's).
STEPS = 500
#: The seeds of the two continuations with fresh optimiser states.
SEEDS = {"fresh": (1, 2)}
#: The suite fit's seed.
FIT_SEED = 0
#: What each choice was made on (the report scores no split: it measures on held-out train sentences).
CHOSEN_ON = {
    "probe": {"on": "train", "why": "the sst suite's input fit of seed 0 by the plateau rule, on train sentences"},
    "tolerances": {"on": "rule", "why": "the sst suite's certificate's, fixed before these measurements"},
    "cool-down": {"on": "train", "why": f"{STEPS} steps (the certificate's) at 0.1 x the rates, fixed after one "
                                        "scratch continuation of the same probe at 0.1 x the probe's rate showed its "
                                        "noise shrink, on held-out train sentences"},
}


def plateau_config(data_dir: Optional[str]) -> Dict[str, Any]:
    r"""The sst suite's configuration with its fits' convergence left at fit's
    plateau rule (no cool-down): the fit the continuations start from."""
    config = suite_config(data_dir)
    config["diffmask"].pop("convergence", None)
    return config


def suite_config(data_dir: Optional[str]) -> Dict[str, Any]:
    r"""The sst suite's configuration (its fits' cool-down included)."""
    from benchmarks.suites.sst import DEFAULTS

    return {**copy.deepcopy(DEFAULTS), "data_dir": data_dir}


def drift_row(before: Mapping[str, Any], after: Mapping[str, Any], tolerances: Any, eps: float) -> Dict[str, Any]:
    r"""One depth's drift between two :func:`held_out_figures` and whether it
    is within ``tolerances`` (the certificate's rule, without its verdict)."""
    from captum_diffmask.diffmask.certificate import drift_reasons

    reasons = drift_reasons(before, after, tolerances, eps)
    return {"masked_change": after["masked"] - before["masked"],
            "keep_change": float((after["keep"] - before["keep"]).abs().mean()),
            "flipped": float(((after["keep"] - before["keep"]).abs() > 0.5).float().mean()),
            "kl_change": after["kl"] - before["kl"], "within": not reasons, "reasons": reasons}


def certificate_rows(certificate: Mapping[str, Any]) -> Dict[str, Dict[str, Any]]:
    r"""A certificate's (:meth:`Certificate.to_dict`) layers as drift rows
    (:func:`drift_row`'s keys but ``flipped``; ``within``: counted)."""
    return {k: {"masked_change": c["masked_after"] - c["masked_before"], "keep_change": c["keep_change"],
                "kl_change": c["kl_after"] - c["kl_before"], "within": c["counted"], "reasons": c["reasons"]}
            for k, c in certificate["layers"].items()}


def measure(data_dir: Optional[str], verbose: bool = True) -> Dict[str, Any]:
    r"""
    The three parts on the sst suite's stored fits of seed :data:`FIT_SEED`
    (fitted first when the cache has none): the plateau fit with its
    certificate, and the suite's fit with its cool-down and certificate.

    Returns:
        *dict* with ``drifts`` (name -> depth -> :func:`drift_row`; the going-on
        row from the plateau fit's certificate), ``figures`` (name -> depth ->
        masked share and KL), ``going_on`` and ``certificate`` (the plateau
        fit's and the cooled fit's certificates, :meth:`Certificate.to_dict`),
        the tolerances, rates and seconds.
    """
    import torch

    from benchmarks.common.minilm.fit_cache import certified_fit
    from benchmarks.common.minilm.fitting import certify_fit, continuation_arguments, fit_diffmask, OnDevice
    from benchmarks.common.minilm.loading import load_bench
    from captum_diffmask import CertificateTolerances
    from captum_diffmask.diffmask import grouped_options
    from captum_diffmask.diffmask.certificate import continuation_options, held_out_figures, recorded_cooldown_factor
    from captum_diffmask.model.forward import model_device

    config = plateau_config(data_dir)
    bench = load_bench(config, verbose=verbose)
    explainer, info = certified_fit(fit_diffmask, certify_fit, bench.model, "input", bench.train, bench.valid, config,
                                    FIT_SEED, verbose)
    settings = {**config["diffmask"], **config["diffmask"]["input"]}
    tolerances = CertificateTolerances(**{**settings["certificate"], "steps": STEPS})
    eps = float(settings["eps"])
    options, batch_size = continuation_arguments(config, "input")
    device = model_device(bench.model)
    train = OnDevice(bench.train.loader(batch_size, shuffle=True, seed=None, sort_by_length=True), device)
    held_out = list(OnDevice(bench.valid.loader(128, shuffle=False, sort_by_length=True), device))
    layers = sorted(explainer.convergence)
    figures = {"fit": held_out_figures(explainer, held_out, layers)}
    start = {"probe": copy.deepcopy(explainer.probe.state_dict()), "lambdas": copy.deepcopy(explainer.lambdas.state_dict())}
    record = copy.deepcopy(explainer.fit_record)
    seconds: Dict[str, float] = {}
    for name, seed in zip(("fresh 1", "fresh 2"), SEEDS["fresh"]):
        began = time.perf_counter()
        chosen = continuation_options(explainer, tolerances, seed, verbose, grouped_options(options))
        explainer.fit(train, layers=layers, **chosen)
        figures[name] = held_out_figures(explainer, held_out, layers)
        seconds[name] = time.perf_counter() - began
        explainer.probe.load_state_dict(start["probe"])
        explainer.lambdas.load_state_dict(start["lambdas"])
    cooled, cooled_info = certified_fit(fit_diffmask, certify_fit, bench.model, "input", bench.train, bench.valid,
                                        suite_config(data_dir), FIT_SEED, verbose)
    figures["cooldown"] = held_out_figures(cooled, held_out, layers)
    pairs = {"fit -> fresh 1": ("fit", "fresh 1"), "fit -> fresh 2": ("fit", "fresh 2"),
             "fresh 1 <-> fresh 2": ("fresh 1", "fresh 2"), "fit -> cooldown": ("fit", "cooldown")}
    drifts = {label: {str(k): drift_row(figures[a][k], figures[b][k], tolerances, eps) for k in layers}
              for label, (a, b) in pairs.items()}
    drifts["fit -> going on"] = certificate_rows(info["certificate"])
    return {
        "drifts": drifts, "going_on": info["certificate"], "certificate": cooled_info["certificate"], "eps": eps,
        "steps": STEPS, "seeds": SEEDS, "tolerances": info["certificate"]["tolerances"], "fit_steps": info["steps"],
        "cooled_steps": cooled_info["steps"], "fit_rates": record["options"]["lr"],
        "cooldown_factor": recorded_cooldown_factor(cooled.fit_record["options"]),
        "figures": {name: {str(k): {"masked": f[k]["masked"], "kl": f[k]["kl"]} for k in layers}
                    for name, f in figures.items()},
        "verdicts": {str(k): r["status"] for k, r in info["convergence"].items()},
        "seconds": seconds, "threads": torch.get_num_threads(),
    }


def _table(rows: Mapping[str, Mapping[str, Any]]) -> List[str]:
    depths = sorted(next(iter(rows.values())), key=int)
    lines = ["| | " + " | ".join(f"depth {k}" for k in depths) + " |", "|---|" + "---|" * len(depths)]
    for label, row in rows.items():
        cells = [f"{row[k]['masked_change']:+.3f} / {row[k]['keep_change']:.3f} / {row[k]['kl_change']:+.4f}"
                 + ("" if row[k]["within"] else " ✗") for k in depths]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def _not_counted(cooldown: Mapping[str, Any], cert: Mapping[str, Any]) -> List[str]:
    r"""A line per depth the certificate does not count after the cool-down:
    whether its masked share moved the same way in the cool-down and in the
    certificate (a trend at rates where noise moves little) or not."""
    lines = []
    for k, c in sorted(cert["layers"].items(), key=lambda kv: int(kv[0])):
        if c["counted"]:
            continue
        during, after = cooldown[k]["masked_change"], c["masked_after"] - c["masked_before"]
        how = ("the same way in both: a trend the plateau rule did not wait out" if during * after > 0
               else "one way, then the other")
        lines.append(f"- Depth {k} does not count after the cool-down: its masked share moved by {during:+.3f} in "
                     f"the cool-down and {after:+.3f} in the certificate, {how} (held-out KL {c['kl_before']:.4f} -> "
                     f"{c['kl_after']:.4f}, eps {cert['eps']:g}).")
    return lines


def _certificate_table(cert: Mapping[str, Any]) -> List[str]:
    lines = ["| depth | masked before -> after | keep change | KL before -> after | counted |", "|---|---|---|---|---|"]
    for k, c in sorted(cert["layers"].items(), key=lambda kv: int(kv[0])):
        lines.append(f"| {k} | {c['masked_before']:.3f} -> {c['masked_after']:.3f} | {c['keep_change']:.3f} | "
                     f"{c['kl_before']:.4f} -> {c['kl_after']:.4f} | "
                     + ("yes" if c["counted"] else "no: " + "; ".join(c["reasons"])) + " |")
    return lines


def _listed(depths: Sequence[Any]) -> str:
    return ", ".join(map(str, depths)) or "none"


def _findings(result: Mapping[str, Any], within: Mapping[str, int], depths: int) -> List[str]:
    r"""What the numbers say, a bullet each: the fresh continuations' spread,
    what going on from the state leaves of it, the cool-down's certificate."""
    drifts, going_on, cert = result["drifts"], result["going_on"], result["certificate"]
    floor, fresh = drifts["fresh 1 <-> fresh 2"], max(within["fit -> fresh 1"], within["fit -> fresh 2"])
    seeds, factor = result["seeds"]["fresh"], result["cooldown_factor"]
    if len(going_on["counted"]) > fresh:
        restart = ("More depths stay put going on than after either restart: part of the fresh continuations' drift "
                   "is the restart itself (a fresh Adam normalises its first steps, so they move every parameter by "
                   "about the learning rate, a kick the fit never gives).")
    else:
        restart = ("No more depths stay put going on than after a restart: at the fit's rates the drift is the "
                   "optimiser's own, not the restart's.")
    return [
        f"- **Fresh optimiser states.** The two continuations (seeds {seeds[0]} and {seeds[1]}) end up to "
        f"{max(abs(r['masked_change']) for r in floor.values()):.3f} apart in masked share and "
        f"{max(r['keep_change'] for r in floor.values()):.3f} in mean keep change (up to "
        f"{100 * max(r['flipped'] for r in floor.values()):.0f} % of the positions' keep probabilities move by more "
        f"than 0.5): within the tolerances of each other at {within['fresh 1 <-> fresh 2']} of {depths} depths, and "
        f"of the fit at {within['fit -> fresh 1']} and {within['fit -> fresh 2']}.",
        f"- **Going on from the fit's state** at the same rates and steps, the certificate counts "
        f"**{len(going_on['counted'])} of {depths}** depths ({_listed(going_on['counted'])}). {restart}",
        f"- **The cool-down** ({result['steps']} steps at every depth at {factor:g} x the probe's, the baselines' and "
        f"the multipliers' rates, the probe's {result['fit_rates']:g} -> {factor * result['fit_rates']:g}) moves the "
        f"probe once (row `fit -> cooldown`); the certificate going on from its end counts "
        f"**{len(cert['counted'])} of {depths}** depths ({_listed(cert['counted'])}).",
        *_not_counted(drifts["fit -> cooldown"], cert),
    ]


def markdown(result: Mapping[str, Any], command: str) -> str:
    r"""The report: the drifts' table, how many depths each keeps within the
    tolerances, what it says, both certificates."""
    tol, drifts, cert, going_on = result["tolerances"], result["drifts"], result["certificate"], result["going_on"]
    within = {label: sum(r["within"] for r in rows.values()) for label, rows in drifts.items()}
    depths = len(cert["layers"])
    factor = result["cooldown_factor"]
    lines = [
        "# How far a settled probe moves when trained further", "",
        f"Command: `{command}` ({result['threads']} threads; started {result['started_utc']}).", "",
        f"**Going on from its fit's state at the fit's rates the certificate counts {len(going_on['counted'])} of "
        f"{depths} depths; with fresh optimiser states {within['fit -> fresh 1']} and {within['fit -> fresh 2']} of "
        f"{depths} stay within its tolerances; after a {result['steps']}-step cool-down at {factor:g} x the rates "
        f"{len(cert['counted'])} of {depths} count**", "",
        f"The sst suite's input-mode probe of seed {FIT_SEED}, fitted by the plateau rule alone (fit's `Convergence` "
        f"without a cool-down; {result['fit_steps']} steps, each depth frozen once settled: "
        + ", ".join(f"{k} {v}" for k, v in sorted(result["verdicts"].items(), key=lambda kv: int(kv[0]))) + "). "
        f"From that one state, {result['steps']} further steps on the suite's train batches at the fit's rates, "
        "nothing frozen: twice with fresh optimiser states (Adam's moments and the multipliers' controller started "
        "anew, as `certify` without a `state` does), and once going on from the fit's state file (its optimiser "
        "states, data order and RNG, as the fit would have gone on: `certify(..., state=)`). The cool-down is the "
        f"suite's own fit of the same seed: this fit, then {result['steps']} steps at every depth at {factor:g} x the "
        f"rates ({result['cooled_steps']} steps in all), and its certificate going on from its state. Every figure is "
        "measured on the suite's 400 train sentences held out from the fits (no dev sentence). The tolerances are the "
        f"sst suite's certificate's, fixed before these runs: masked share {tol['masked_share']}, mean keep change "
        f"{tol['keep']}, KL {tol['tol_kl']} x eps (eps {result['eps']}).", "",
        "Each cell: change of the masked share / mean absolute change of the keep probabilities / change of the "
        "held-out KL; ✗ past a tolerance (row `fit -> going on`: not counted by the certificate).", "",
        *_table(drifts), "",
        "Depths within the tolerances: " + "; ".join(f"{label} {n} of {depths}" for label, n in within.items()) + ".",
        "",
        "## What it says", "",
        *_findings(result, within, depths), "",
        "## The certificate going on at the fit's rates", "",
        *_certificate_table(going_on), "",
        "## The certificate after the cool-down", "",
        *_certificate_table(cert)]
    minutes = ", ".join(f"{name} {s / 60:.1f}" for name, s in result["seconds"].items())
    lines += ["", f"Minutes per continuation with fresh states: {minutes} (the certificates were measured when their "
              "fits were stored).", ""]
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    import torch

    from benchmarks.records import environment

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--markdown", required=True, help="write the report here (its JSON beside it)")
    parser.add_argument("--data-dir", help="the SST files (default: $CAPTUM_DIFFMASK_DATA, else ../shared/data)")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    result = {**measure(args.data_dir), "started_utc": started, "environment": environment(),
              "chosen_on": CHOSEN_ON}
    command = "python -m benchmarks study certificate-noise --markdown " + args.markdown + \
        (f" --threads {args.threads}" if args.threads else "")
    out = Path(args.markdown)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1, default=str), encoding="utf-8")
    out.write_text(markdown(result, command), encoding="utf-8")
    print(out.read_text())
    return 0
