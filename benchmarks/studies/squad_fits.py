r"""
The squad suite's two DiffMask fits (input and hidden mode) run side by side,
one process each, into the suite's fit cache; the suite then reads both from
the cache.

On a GPU the suite's fits are launch-bound: a step of batch 8 leaves the GPU
mostly idle, so two processes on one GPU take about the time of one. Each
process fits its mode in rising caps (``--first-cap``, then ``--cap-step`` more
at a time): a cap stores the fit and its state, and the next cap goes on from
that state (:func:`benchmarks.common.minilm.fit_cache.cached_fit`), so the
fit is the one an uninterrupted fit would give, and a process stops between
two caps when every layer has settled, at the suite's cap, or when the next
cap would end after ``--seconds``. A record of each cap (its seconds and the
layers' statuses) is written to ``OUT/cap-MODE.json``; its ``settings`` are the
mode's settings for the suite's run (the last cap), e.g.::

    python -m benchmarks study squad-fits fit input --set 'device="cuda"' --seconds 390 --out caps --ready caps/bench &
    python -m benchmarks study squad-fits fit hidden --set 'device="cuda"' --set 'diffmask={"hidden": {"stack_layers": "all"}}' \
        --seconds 390 --out caps --wait caps/bench &
    wait
    python -m benchmarks run squad --set 'device="cuda"' --set "diffmask=$(python -m benchmarks study squad-fits settings caps)"
    python -m benchmarks study squad-fits report "seed 0=caps" --markdown squad-fits.md --json squad-fits.json

(``--ready`` / ``--wait``: the first process fine-tunes and caches the model,
the second waits for it rather than fine-tune it too.) A second invocation
with the same ``--out`` goes on from the last cap. ``fit MODE --recipe`` fits
the suite's ``paper_recipe`` for the mode (its epochs, no caps) into the cache
likewise, so that four processes can fit everything the suite's run reads.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

import torch

from benchmarks.__main__ import parse_settings
from benchmarks.report import fmt_seconds, table
from benchmarks.runner import build_config, load_suite
from benchmarks.suites.squad import Bench, fit_mode, load_bench, paper_recipe_config
from captum_diffmask.diffmask.constrained.convergence import SETTLED

#: The question this study answers (``python -m benchmarks list``).
QUESTION = "the squad suite's two DiffMask fits side by side, in rising caps until every layer settles"

MODES = ("input", "hidden")


def fit_in_rising_caps(
    config: Dict[str, Any], bench: Bench, mode: str, deadline: float, first_cap: int, rise: int, out: Path,
) -> Dict[str, Any]:
    r"""
    ``mode``'s fit through the fit cache in rising caps until every layer has
    settled, the suite's cap, or ``deadline``; ``out / "cap-MODE.json"`` is
    rewritten after each cap and read to go on from its last cap.

    Args:

        config (dict): the squad suite's configuration (``config["diffmask"][mode]``
                    is set to each cap in turn).
        bench (Bench): the suite's model and windows.
        mode (str): ``"input"`` or ``"hidden"``.
        deadline (float): a ``time.time()`` after which no cap begins that
                    would end past it (at the last cap's seconds per step).
        first_cap (int): the first cap when there is no earlier record.
        rise (int): steps added per cap.
        out (Path): the folder of the record.

    Returns:
        *dict*: the record: ``settings`` (the mode's settings at the last cap),
        ``settled`` and ``laps`` (per cap: ``cap``, ``seconds``, ``statuses``).
    """
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"cap-{mode}.json"
    own = {k: v for k, v in config["diffmask"].get(mode, {}).items() if k != "max_steps"}
    final = int(config["diffmask"].get(mode, {}).get("max_steps", config["diffmask"]["max_steps"]))
    record: Dict[str, Any] = {"settings": {}, "settled": False, "laps": []}
    cap = min(first_cap, final)
    if path.exists():  # go on from the last cap: a smaller one would start the fit afresh
        record = json.loads(path.read_text(encoding="utf-8"))
        if record["settled"]:  # every layer settled: the stored fit is the suite's at this cap
            return record
        cap = min(final, record["laps"][-1]["cap"] + rise)
    while True:
        config["diffmask"][mode] = {**own, "max_steps": cap}
        begun = time.time()
        explainer, _ = fit_mode(config, bench, mode, int(config["seeds"][0]), True)
        seconds = time.time() - begun
        statuses = {int(k): report["status"] for k, report in explainer.convergence.items()}
        record["settled"] = all(status in SETTLED for status in statuses.values())
        previous = record["laps"][-1]["cap"] if record["laps"] else 0
        record["laps"].append({"cap": cap, "seconds": round(seconds, 1), "statuses": statuses})
        record["settings"] = {**own, "max_steps": cap}
        path.write_text(json.dumps(record, indent=1), encoding="utf-8")
        print(f"[{mode}] cap {cap}: {seconds:.0f} s, {statuses}", flush=True)
        per_step = seconds / max(1, cap - previous)
        if record["settled"] or cap >= final or time.time() + 1.15 * per_step * rise > deadline:
            return record
        cap = min(final, cap + rise)


def suite_settings(folder: Path) -> Dict[str, Any]:
    r"""The ``diffmask`` override of the suite's run that reads the fits of
    ``folder``'s records: per mode its settings at its last cap."""
    return {mode: json.loads((folder / f"cap-{mode}.json").read_text(encoding="utf-8"))["settings"] for mode in MODES}


def laps_markdown(runs: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> str:
    r"""
    The caps of each run as markdown: per run and mode, the statuses of the
    layers at each cap, the seconds of each cap, and the verdict.

    Args:

        runs (Mapping): ``{label: {mode: record}}``, records as
                    :func:`fit_in_rising_caps` writes them.

    Returns:
        *str*.
    """
    lines = []
    for label, modes in runs.items():
        for mode, record in modes.items():
            laps = record["laps"]
            layers = sorted({int(k) for lap in laps for k in lap["statuses"]})
            converged = sum(_status(laps[-1]["statuses"], k) == "converged" for k in layers)
            lines += [f"**{label}, {mode}**: {converged} of {len(layers)} layers converged at cap "
                      f"{laps[-1]['cap']} ({'every layer settled' if record['settled'] else 'not settled'}); "
                      f"{fmt_seconds(sum(lap['seconds'] for lap in laps))} of fitting over {len(laps)} caps.", ""]
            rows = [[lap["cap"], fmt_seconds(lap["seconds"]),
                     *[_shown(_status(lap["statuses"], k)) for k in layers]] for lap in laps]
            lines += [table(["cap", "seconds", *[f"layer {k}" for k in layers]], rows), ""]
    return "\n".join(lines)


def _status(statuses: Mapping[Any, str], layer: int) -> str:
    r"""A layer's status in a record read from JSON (string keys) or not."""
    return statuses.get(str(layer), statuses.get(layer, "?"))


def _shown(status: str) -> str:
    return f"**{status}**" if status == "converged" else status


def _fit(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    deadline = time.time() + args.seconds
    if args.wait:
        while not Path(args.wait).exists():
            if Path(args.wait + ".failed").exists() or time.time() > deadline:
                print(f"{args.wait} was not written: the other process did not load the model", file=sys.stderr)
                return 1
            time.sleep(1)
    config = build_config(load_suite("squad"), args.quick, None, None, parse_settings(args.set))
    try:
        bench = load_bench(config, verbose=False)
    except BaseException:
        if args.ready:
            Path(args.ready + ".failed").touch()
        raise
    if args.ready:
        Path(args.ready).touch()
    if args.recipe:
        fit_recipe(config, bench, args.mode, out)
    else:
        fit_in_rising_caps(config, bench, args.mode, deadline, args.first_cap, args.cap_step, out)
    return 0


def fit_recipe(config: Dict[str, Any], bench: Bench, mode: str, out: Path) -> Dict[str, Any]:
    r"""
    The suite's paper-recipe fit of ``mode`` (its epochs, no cap) into the fit
    cache, so that the suite's run reads it; ``out / "recipe-MODE.json"``
    records its seconds and statuses.

    Returns:
        *dict*: the record.
    """
    recipe_config, seed = paper_recipe_config(config, bench, mode)
    begun = time.time()
    explainer, _ = fit_mode(recipe_config, bench, mode, seed, True)
    record = {"epochs": recipe_config["diffmask"][mode]["epochs"], "seconds": round(time.time() - begun, 1),
              "statuses": {int(k): report["status"] for k, report in explainer.convergence.items()}}
    out.mkdir(parents=True, exist_ok=True)
    (out / f"recipe-{mode}.json").write_text(json.dumps(record, indent=1), encoding="utf-8")
    print(f"[{mode}] the paper's recipe: {record['seconds']:.0f} s, {record['statuses']}", flush=True)
    return record


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks study squad-fits", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    fit = commands.add_parser("fit", help="fit one mode into the fit cache in rising caps")
    fit.add_argument("mode", choices=MODES)
    fit.add_argument("--set", action="append", default=[], metavar="KEY=JSON", help="a setting of the squad suite")
    fit.add_argument("--quick", action="store_true", help="the suite's quick configuration")
    fit.add_argument("--seconds", type=float, required=True, help="no cap begins that would end after this")
    fit.add_argument("--out", required=True, help="the folder of cap-MODE.json")
    fit.add_argument("--first-cap", type=int, default=600)
    fit.add_argument("--cap-step", type=int, default=400)
    fit.add_argument("--threads", type=int, default=4)
    fit.add_argument("--ready", help="a file written once the model and windows are loaded")
    fit.add_argument("--wait", help="a file (another process's --ready) waited for before loading")
    fit.add_argument("--recipe", action="store_true",
                     help="fit the suite's paper_recipe for the mode instead (its epochs, no caps)")
    settings = commands.add_parser("settings", help="print the suite's diffmask override for a folder's fits")
    settings.add_argument("folder")
    report = commands.add_parser("report", help="the caps of one or more runs as markdown and JSON")
    report.add_argument("runs", nargs="+", metavar="LABEL=FOLDER | FILE.json",
                        help="a run's folder of cap records, or a JSON file this command wrote")
    report.add_argument("--markdown")
    report.add_argument("--json")
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "fit":
        return _fit(args)
    if args.command == "settings":
        print(json.dumps(suite_settings(Path(args.folder))))
        return 0
    runs: Dict[str, Dict[str, Any]] = {}
    for item in args.runs:
        label, sep, folder = item.partition("=")
        if not sep and item.endswith(".json"):
            runs.update(json.loads(Path(item).read_text(encoding="utf-8")))
            continue
        if not sep:
            raise SystemExit(f"runs: LABEL=FOLDER or FILE.json, got {item!r}")
        runs[label] = {mode: json.loads((Path(folder) / f"cap-{mode}.json").read_text(encoding="utf-8"))
                       for mode in MODES if (Path(folder) / f"cap-{mode}.json").exists()}
    text = "\n".join([
        "# The squad suite's DiffMask fits, cap by cap", "",
        "Each mode fitted in its own process (`python -m benchmarks study squad-fits fit`), into the suite's fit "
        "cache, in rising caps (`max_steps`): at each cap the fit stops, is stored with its state, and the next cap "
        "goes on from that state. Per cap: its wall seconds (the two modes' processes shared one device) and each "
        "layer's status (`DiffMask.convergence`) when it stopped; a converged layer is frozen. Rendered by "
        "`python -m benchmarks study squad-fits report` from the JSON beside this file.", "",
        laps_markdown(runs)])
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1), encoding="utf-8")
    if args.markdown:
        Path(args.markdown).write_text(text, encoding="utf-8")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
