r"""
Choosing the Readout Bottleneck's learning rate for a suite on SST *train*
sentences, never on the split the suite reports.

The suite's model (``--suite sst-erasure``: the GRU; ``sst``: the fine-tuned
MiniLM of the sst and faithfulness suites; from the cache, or trained as the
suite would) and its train sentences, split by position: every ``--hold-out``-th sentence is held out, the
network is fitted on the others exactly as the suite fits it (its options and
step budget, :func:`benchmarks.methods.prepare`), once per learning rate, and
scored on the held-out sentences by :meth:`ReadoutBottleneck.evaluate` (the
training objective: task loss plus beta x capacity). One JSON line per learning
rate is appended to ``--out``; rates already there are skipped.

The rule, fixed before the grid ran: among the networks that did not collapse
(at most 99 % of the held-out elements clamped shut, the fit's own warning), the
learning rate with the lowest held-out objective.

Usage::

    python -m benchmarks study readout-tuning --out tuning.jsonl [--suite sst] [--lr 1e-4 3e-4 1e-3] [--threads 1]
    python -m benchmarks study readout-tuning --out tuning.jsonl --summary [--markdown report.md]
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import torch

from benchmarks.common.minilm import loading as sst_loading
from benchmarks.methods import MethodContext, prepare
from benchmarks.records import to_jsonable
from benchmarks.suites import sst, sst_erasure
from benchmarks.tasks.sst.classifier import sst_sites
from captum_diffmask.methods.readout_bottleneck import COLLAPSED

#: The question this study answers (``python -m benchmarks list``).
QUESTION = "the Readout Bottleneck's learning rate for a suite, chosen on held-out train sentences"

#: The learning rates tried by default: IBA's 1e-3 and two below it (above it
#: the toy task's networks already collapse).
LEARNING_RATES = (1e-4, 3e-4, 1e-3)


#: What a suite gives the tuning: its model, train sentences, the Readout
#: Bottleneck's options, the context's sites and padding argument, and the
#: loader's keywords, as the suite itself sets the method up.
SuiteSetup = Tuple[Any, Any, Dict[str, Any], Dict[str, Any], Dict[str, Any]]


def _sst_erasure(seed: int, verbose: bool) -> SuiteSetup:
    config = copy.deepcopy(sst_erasure.DEFAULTS)
    bench = sst_erasure.load_bench(config, seed, verbose)
    context = {"sites": lambda: sst_sites(bench.model), "padding_mask_arg": 0}
    return bench.model, bench.train, dict(config["method_options"]["ReadoutBottleneck"]), context, {}


def _sst(seed: int, verbose: bool) -> SuiteSetup:
    config = copy.deepcopy(sst.DEFAULTS)
    bench = sst_loading.load_bench(config, verbose)
    context = {"sites": lambda: None, "padding_mask_arg": "auto"}
    options = dict(config["method_options"].get("ReadoutBottleneck", {}))
    return bench.model, bench.train, options, context, {"sort_by_length": True}


SUITES: Dict[str, Callable[[int, bool], SuiteSetup]] = {"sst-erasure": _sst_erasure, "sst": _sst}


def tune(out: Path, rates: Sequence[float], hold_out: int, seed: int, verbose: bool, suite: str = "sst-erasure") -> None:
    r"""Fits and scores one network per learning rate not yet in ``out``."""
    lines = read_lines(out)
    if any(line.get("suite", "sst-erasure") != suite for line in lines):
        raise ValueError(f"--out: {out} holds another suite's lines; give {suite} a file of its own")
    done = {line["lr"] for line in lines}
    model, train, options, context, loading = SUITES[suite](seed, verbose)
    every = torch.arange(len(train))
    fitted, held = train.subset(every[every % hold_out != hold_out - 1]), train.subset(every[every % hold_out == hold_out - 1])
    batch_size = int(options.get("batch_size", 128))
    for lr in rates:
        if lr in done:
            continue
        ctx = MethodContext(
            model=model, **context, layer=0, seed=seed, verbose=verbose,
            train_loader=lambda size, s: fitted.loader(size, shuffle=True, seed=s, **loading),
        )
        prepared = prepare("ReadoutBottleneck", ctx, {**options, "lr": lr})
        start = time.perf_counter()
        scores = prepared.explainer.evaluate(held.loader(batch_size, shuffle=False, **loading), layer=0, seed=seed)
        line = {"suite": suite, "lr": lr, "options": {**options, "lr": lr}, "fit_sentences": len(fitted), "held_out_sentences": len(held),
                "fit_seconds": prepared.setup_seconds, "evaluate_seconds": time.perf_counter() - start,
                "fit_last": prepared.info.get("fit_last", {}), "held_out": scores}
        with open(out, "a") as handle:
            handle.write(json.dumps(to_jsonable(line)) + "\n")
        print(f"lr {lr:g}: held-out loss {scores['loss']:.3f} (task {scores['task']:.3f}, "
              f"{scores['capacity']:.2f} bits, {100 * scores['shut']:.1f} % shut), fit {prepared.setup_seconds:.0f} s",
              file=sys.stderr)


def read_lines(path: Path) -> List[Dict[str, Any]]:
    r"""The JSON lines of ``path`` (none when it does not exist)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def choose(lines: Sequence[Mapping[str, Any]]) -> Optional[Mapping[str, Any]]:
    r"""The line with the lowest held-out objective among those not collapsed."""
    alive = [line for line in lines if line["held_out"]["shut"] <= COLLAPSED]
    return min(alive, key=lambda line: line["held_out"]["loss"]) if alive else None


def summary(lines: Sequence[Mapping[str, Any]]) -> str:
    r"""A markdown table of every learning rate and the choice."""
    rows = ["| lr | fit: task | fit: bits | fit: shut | held out: objective | task | bits | shut | fit (s) |",
            "|---|---|---|---|---|---|---|---|---|"]
    for line in sorted(lines, key=lambda line: line["lr"]):
        fit, held = line["fit_last"], line["held_out"]
        rows.append(f"| {line['lr']:g} | {fit.get('task', float('nan')):.3f} | {fit.get('capacity', float('nan')):.2f} | "
                    f"{100 * fit.get('shut', float('nan')):.1f} % | {held['loss']:.3f} | {held['task']:.3f} | "
                    f"{held['capacity']:.2f} | {100 * held['shut']:.1f} % | {line['fit_seconds']:.0f} |")
    chosen = choose(lines)
    rows.append("")
    rows.append(f"Chosen: lr {chosen['lr']:g}." if chosen else "Chosen: none (every network collapsed).")
    return "\n".join(rows)


def main(argv: Sequence[str] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks study readout-tuning",
                                     description=__doc__.split("\n\n")[1])
    parser.add_argument("--out", required=True, help="JSON-lines file (appended; rates already there skipped)")
    parser.add_argument("--suite", choices=sorted(SUITES), default="sst-erasure", help="whose model and settings")
    parser.add_argument("--lr", type=float, nargs="+", default=list(LEARNING_RATES), help="learning rates tried")
    parser.add_argument("--hold-out", type=int, default=10, help="every N-th train sentence is held out (default 10)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    parser.add_argument("--summary", action="store_true", help="print the table and the choice, run nothing")
    parser.add_argument("--markdown", default=None, help="also write the table as a report to this file")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    if args.hold_out < 2:
        parser.error(f"--hold-out must be at least 2, got {args.hold_out}")
    if not args.summary:
        if args.threads:
            torch.set_num_threads(args.threads)
        tune(Path(args.out), args.lr, args.hold_out, args.seed, args.verbose, args.suite)
    lines = read_lines(Path(args.out))
    print(summary(lines))
    if args.markdown:
        Path(args.markdown).write_text(report(lines, Path(args.out), Path(args.markdown)))
    return 0


def report(lines: Sequence[Mapping[str, Any]], lines_path: Path, markdown: Path) -> str:
    r"""The markdown report: how the rates were scored, the command, the table."""
    suite = lines[0].get("suite", "sst-erasure") if lines else "sst-erasure"
    options = {k: v for k, v in (lines[0]["options"] if lines else {}).items() if k != "lr"}
    rates = " ".join(f"{line['lr']:g}" for line in sorted(lines, key=lambda line: line["lr"]))
    return "\n".join([
        f"# The Readout Bottleneck's learning rate for {suite}, chosen on train sentences",
        "",
        f"The {suite} suite's model and its train sentences: every 10th held out, the network fitted on the "
        f"others as the suite fits it ({json.dumps(options)}; beta 10 / H, per element), once per learning "
        "rate, and scored on the held-out sentences by `ReadoutBottleneck.evaluate` (the training objective: "
        "the task's negative log-likelihood of a target drawn from the model, plus beta times the capacity). "
        "The rule, fixed before the grid ran: the lowest held-out objective among the networks that did not "
        "collapse (at most 99 % of the elements clamped shut). The dev split the suite reports was not read.",
        "",
        f"Command: `python -m benchmarks study readout-tuning --suite {suite} --out {lines_path} --lr {rates} "
        f"--markdown {markdown}` (one JSON line per rate in `{lines_path.name}`; fit seconds are wall time, "
        "on 2 cores shared with other jobs).",
        "",
        "\"fit\": the last epoch's means while training; \"held out\": the held-out sentences. Bits: the "
        "capacity per real token; shut: the share of elements at alpha = -5, where the clamp passes no gradient.",
        "",
        summary(lines),
        "",
    ])


if __name__ == "__main__":
    raise SystemExit(main())
