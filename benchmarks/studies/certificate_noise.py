r"""
How far a settled probe moves when trained further: the noise floor of the
convergence certificate at the fit's rates, and what a cool-down leaves.

The probe is the sst suite's input-mode fit of seed 0 by the plateau rule alone
(the suite's settings without its cool-down, through the fit cache: every depth
settled and frozen). From that one state, on the suite's train batches, with its
drift measured on the suite's 400 held-out train sentences (no dev sentence):

- ``rates``: two continuations of :data:`STEPS` steps at the fit's own rates,
  nothing frozen (the certificate's continuation), seeds 1 and 2. Each one's
  drift from the state, and how far the two ends lie apart: when the two ends
  differ as much as either from its start, the drift is the optimiser's noise at
  those rates, not a trend the certificate could wait out;
- ``cooldown``: the fit's cool-down (``Convergence(cooldown=STEPS)``: every depth
  trained further at a tenth of the probe's and the multipliers' rates), then
  the certificate (:func:`captum_diffmask.certify`), which goes on at the rates
  the cool-down ended at.

Each drift is judged under the sst suite's certificate tolerances (fixed before
any of these measurements). The fit the cool-down starts from was stored before
the cool-down existed, so its optimiser's moments are not kept: the cool-down
starts them afresh (the suite's fits keep them).

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
QUESTION = "how far a settled SST probe moves when trained further, at the fit's rates and after a cool-down"
#: The steps of every continuation (the certificate's, the cool-down's).
STEPS = 500
#: The seeds of the two continuations at the fit's rates, the cool-down's and the certificate's.
SEEDS = {"rates": (1, 2), "cooldown": 3, "certificate": 4}
#: The suite fit's seed.
FIT_SEED = 0
#: What each choice was made on (the report scores no split: it measures on held-out train sentences).
CHOSEN_ON = {
    "probe": {"on": "train", "why": "the sst suite's input fit of seed 0 by the plateau rule, on train sentences"},
    "tolerances": {"on": "rule", "why": "the sst suite's certificate's, fixed before these measurements"},
    "cool-down": {"on": "train", "why": f"{STEPS} steps (the certificate's) at 0.1 x the rates, fixed before this "
                                        "run after one scratch continuation of the same probe at 0.1 x the probe's "
                                        "rate showed its noise shrink, on held-out train sentences"},
}


def plateau_config(data_dir: Optional[str]) -> Dict[str, Any]:
    r"""The sst suite's configuration with its fits' convergence left at fit's
    plateau rule (no cool-down): the fit the cool-down is measured from."""
    from benchmarks.suites.sst import DEFAULTS

    config = {**copy.deepcopy(DEFAULTS), "data_dir": data_dir}
    config["diffmask"].pop("convergence", None)
    return config


def drift_row(before: Mapping[str, Any], after: Mapping[str, Any], tolerances: Any, eps: float) -> Dict[str, Any]:
    r"""One depth's drift between two :func:`held_out_figures` and whether it
    is within ``tolerances`` (the certificate's rule, without its verdict)."""
    from captum_diffmask.diffmask.certificate import drift_reasons

    reasons = drift_reasons(before, after, tolerances, eps)
    return {"masked_change": after["masked"] - before["masked"],
            "keep_change": float((after["keep"] - before["keep"]).abs().mean()),
            "flipped": float(((after["keep"] - before["keep"]).abs() > 0.5).float().mean()),
            "kl_change": after["kl"] - before["kl"], "within": not reasons, "reasons": reasons}


def measure(data_dir: Optional[str], verbose: bool = True) -> Dict[str, Any]:
    r"""
    The two parts on the sst suite's stored plateau fit (fitted first when the
    cache has none).

    Returns:
        *dict* with ``drifts`` (name -> depth -> :func:`drift_row`), ``figures``
        (name -> depth -> masked share and KL), ``certificate`` (the cool-down's,
        :meth:`Certificate.to_dict`), the tolerances, rates and seconds.
    """
    import torch

    from benchmarks.common.minilm.fit_cache import cached_fit
    from benchmarks.common.minilm.fitting import continuation_arguments, fit_diffmask, OnDevice
    from benchmarks.common.minilm.loading import load_bench
    from captum_diffmask import CertificateTolerances, certify
    from captum_diffmask.diffmask import grouped_options
    from captum_diffmask.diffmask.certificate import continuation_options, held_out_figures
    from captum_diffmask.model.forward import model_device

    config = plateau_config(data_dir)
    bench = load_bench(config, verbose=verbose)
    explainer, info = cached_fit(fit_diffmask, bench.model, "input", bench.train, bench.valid, config, FIT_SEED, verbose)
    settings = {**config["diffmask"], **config["diffmask"]["input"]}
    tolerances = CertificateTolerances(**{**settings["certificate"], "steps": STEPS})
    eps = float(settings["eps"])
    options, batch_size = continuation_arguments(config, "input")
    device = model_device(bench.model)
    train = OnDevice(bench.train.loader(batch_size, shuffle=True, seed=None, sort_by_length=True), device)
    held_out = list(OnDevice(bench.valid.loader(128, shuffle=False, sort_by_length=True), device))
    layers = sorted(explainer.convergence)
    figures = {"fit": held_out_figures(explainer, held_out, layers)}
    start_probe = copy.deepcopy(explainer.probe.state_dict())
    start_lambdas = copy.deepcopy(explainer.lambdas.state_dict())
    seconds: Dict[str, float] = {}

    def go_on(name: str, seed: int, overrides: Mapping[str, Any]) -> None:
        began = time.perf_counter()
        chosen = continuation_options(explainer, tolerances, seed, verbose, {**grouped_options(options), **overrides})
        explainer.fit(train, layers=layers, **chosen)
        figures[name] = held_out_figures(explainer, held_out, layers)
        seconds[name] = time.perf_counter() - began

    for name, seed in zip(("rates 1", "rates 2"), SEEDS["rates"]):
        go_on(name, seed, {})
        explainer.probe.load_state_dict(start_probe)
        explainer.lambdas.load_state_dict(start_lambdas)
    record = copy.deepcopy(explainer.fit_record)
    go_on("cooldown", SEEDS["cooldown"], {"convergence": {"cooldown": STEPS}})
    rates = {k: v for k, v in explainer.fit_record["options"].items() if k in ("lr", "optimization")}
    began = time.perf_counter()
    certificate = certify(explainer, train, held_out, tolerances, seed=SEEDS["certificate"], verbose=verbose,
                          **grouped_options(options))
    seconds["certificate"] = time.perf_counter() - began
    pairs = {"fit -> rates 1": ("fit", "rates 1"), "fit -> rates 2": ("fit", "rates 2"),
             "rates 1 <-> rates 2": ("rates 1", "rates 2"), "fit -> cooldown": ("fit", "cooldown")}
    drifts = {label: {str(k): drift_row(figures[a][k], figures[b][k], tolerances, eps) for k in layers}
              for label, (a, b) in pairs.items()}
    return {
        "drifts": drifts, "certificate": certificate.to_dict(), "eps": eps, "steps": STEPS, "seeds": SEEDS,
        "tolerances": certificate.to_dict()["tolerances"], "fit_steps": info["steps"], "fit_rates": record["options"]["lr"],
        "cooled_rates": {"lr": rates["lr"], "lr_baseline": rates["optimization"]["lr_baseline"],
                         "lr_lambda": rates["optimization"]["lr_lambda"]},
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
        lines.append(f"- Depth {k} does not count: its masked share moved by {during:+.3f} in the cool-down and "
                     f"{after:+.3f} in the certificate, {how} (held-out KL {c['kl_before']:.4f} -> "
                     f"{c['kl_after']:.4f}, eps {cert['eps']:g}).")
    return lines


def markdown(result: Mapping[str, Any], command: str) -> str:
    r"""The report: the drifts' table, how many depths each keeps within the
    tolerances, the certificate after the cool-down."""
    tol, drifts, cert = result["tolerances"], result["drifts"], result["certificate"]
    within = {label: sum(r["within"] for r in rows.values()) for label, rows in drifts.items()}
    depths = len(cert["layers"])
    floor = drifts["rates 1 <-> rates 2"]
    lines = [
        "# How far a settled probe moves when trained further", "",
        f"Command: `{command}` ({result['threads']} threads; started {result['started_utc']}).", "",
        f"**After a {result['steps']}-step cool-down at {result['cooled_rates']['lr'] / result['fit_rates']:g} x "
        f"the rates the certificate counts {len(cert['counted'])} of {depths} depths; at the fit's rates two "
        f"continuations of one probe lie apart past its tolerances at {depths - within['rates 1 <-> rates 2']} of "
        f"{depths}**", "",
        f"The sst suite's input-mode probe of seed {FIT_SEED}, fitted by the plateau rule alone (fit's `Convergence` "
        f"without a cool-down; {result['fit_steps']} steps, each depth frozen once settled: "
        + ", ".join(f"{k} {v}" for k, v in sorted(result["verdicts"].items(), key=lambda kv: int(kv[0]))) + "). "
        f"From that one state, {result['steps']} further steps on the suite's train batches, nothing frozen; every "
        "figure is measured on the suite's 400 train sentences held out from the fit (no dev sentence). The "
        f"tolerances are the sst suite's certificate's, fixed before these runs: masked share {tol['masked_share']}, "
        f"mean keep change {tol['keep']}, KL {tol['tol_kl']} x eps (eps {result['eps']}).", "",
        "Each cell: change of the masked share / mean absolute change of the keep probabilities / change of the "
        "held-out KL; ✗ past a tolerance.", "",
        *_table(drifts), "",
        "Depths within the tolerances: " + "; ".join(f"{label} {n} of {depths}" for label, n in within.items()) + ".",
        "",
        "## What it says", "",
        f"- **At the fit's rates the drift is the optimiser's noise.** Two continuations from one state (seeds "
        f"{result['seeds']['rates'][0]} and {result['seeds']['rates'][1]}) end as far apart (up to "
        f"{max(abs(r['masked_change']) for r in floor.values()):.3f} in masked share, "
        f"{max(r['keep_change'] for r in floor.values()):.3f} in mean keep change; up to "
        f"{100 * max(r['flipped'] for r in floor.values()):.0f} % of the positions' keep probabilities move by more "
        "than 0.5) as either from where it started. The keep probabilities are near 0 or 1; a band of the marginal "
        "positions flips as the multiplier swings. A certificate at those rates judges the seed of its "
        "continuation, not the probe.",
        f"- **The cool-down** ({result['steps']} steps at every depth, the probe's rates {result['fit_rates']:g} -> "
        f"{result['cooled_rates']['lr']:g}, the baselines' and multipliers' rates likewise times "
        f"{result['cooled_rates']['lr'] / result['fit_rates']:g}) moves the probe once (row `fit -> cooldown`), then "
        f"the certificate, at the rates the cool-down ended at, counts **{len(cert['counted'])} of {depths}** depths "
        f"({', '.join(map(str, cert['counted'])) or 'none'}).",
        *_not_counted(drifts["fit -> cooldown"], cert),
        "",
        "## The certificate after the cool-down", "",
        "| depth | masked before -> after | keep change | KL before -> after | counted |", "|---|---|---|---|---|"]
    for k, c in sorted(cert["layers"].items(), key=lambda kv: int(kv[0])):
        lines.append(f"| {k} | {c['masked_before']:.3f} -> {c['masked_after']:.3f} | {c['keep_change']:.3f} | "
                     f"{c['kl_before']:.4f} -> {c['kl_after']:.4f} | "
                     + ("yes" if c["counted"] else "no: " + "; ".join(c["reasons"])) + " |")
    minutes = ", ".join(f"{name} {s / 60:.1f}" for name, s in result["seconds"].items())
    lines += ["", f"Minutes per continuation: {minutes}.", ""]
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
