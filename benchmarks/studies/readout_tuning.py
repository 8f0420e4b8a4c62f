r"""
Choosing the Readout Bottleneck's learning rate and information weight (beta)
for a suite on SST *train* sentences, never on the split the suite reports.

The suite's model (``--suite sst-erasure``: the GRU; ``sst``: the fine-tuned
MiniLM of the sst and faithfulness suites; from the cache, or trained as the
suite would) and its train sentences, split by position: every ``--hold-out``-th sentence is held out, the
network is fitted on the others exactly as the suite fits it (its options and
step budget, :func:`benchmarks.methods.prepare`), once per (learning rate, beta),
and scored on the held-out sentences by :meth:`ReadoutBottleneck.evaluate` (the
training objective, task loss plus beta x capacity, and the share of sentences
whose noisy pass keeps the model's prediction). One JSON line per pair is
appended to ``--out``; pairs already there are skipped. ``--beta-mean`` gives
beta as IBA does, on the mean over the state's elements: beta = value / H.

The rule, fixed before the beta grid ran: among the networks that did not
collapse (at most 99 % of the held-out elements clamped shut, the fit's own
warning) and keep the model's prediction on at least :data:`AGREEMENT` of the
held-out sentences (what a bottleneck that lets through what the output uses
does), the largest beta (the most compression), and at that beta the lowest
held-out objective. A line without the agreement (the first grid, learning
rates at beta 10, which predates it) is not eligible.

Usage::

    python -m benchmarks study readout-tuning --out tuning.jsonl [--suite sst] [--lr 1e-4 3e-4 1e-3] [--beta-mean 10 1]
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
from captum_diffmask.methods.readout_bottleneck import COLLAPSED, ReadoutBottleneck

#: The question this study answers (``python -m benchmarks list``).
QUESTION = "the Readout Bottleneck's learning rate for a suite, chosen on held-out train sentences"

#: The learning rates tried by default: IBA's 1e-3 and two below it (above it
#: the toy task's networks already collapse).
LEARNING_RATES = (1e-4, 3e-4, 1e-3)
#: IBA's beta on the mean over elements, the library's default (beta = 10 / H).
BETA_MEAN = 10.0
#: The least share of held-out sentences whose prediction the noisy pass must keep.
AGREEMENT = 0.9


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


def tune(out: Path, rates: Sequence[float], hold_out: int, seed: int, verbose: bool, suite: str = "sst-erasure",
         betas: Sequence[float] = (BETA_MEAN,)) -> None:
    r"""Fits and scores one network per (learning rate, beta on the mean) not yet in ``out``."""
    lines = read_lines(out)
    if any(line.get("suite", "sst-erasure") != suite for line in lines):
        raise ValueError(f"--out: {out} holds another suite's lines; give {suite} a file of its own")
    done = {_key(line["lr"], line.get("beta_mean", BETA_MEAN), line["options"]) for line in lines}
    model, train, options, context, loading = SUITES[suite](seed, verbose)
    every = torch.arange(len(train))
    fitted, held = train.subset(every[every % hold_out != hold_out - 1]), train.subset(every[every % hold_out == hold_out - 1])
    batch_size = int(options.get("batch_size", 128))
    width = None
    for beta_mean in betas:
        for lr in rates:
            if _key(lr, beta_mean, options) in done:
                continue
            ctx = MethodContext(
                model=model, **context, layer=0, seed=seed, verbose=verbose,
                train_loader=lambda size, s: fitted.loader(size, shuffle=True, seed=s, **loading),
            )
            width = width or _input_width(ctx, fitted.loader(batch_size, shuffle=False, **loading))
            chosen = {**options, "lr": lr, **({} if beta_mean == BETA_MEAN else {"beta": beta_mean / width})}
            prepared = prepare("ReadoutBottleneck", ctx, chosen)
            start = time.perf_counter()
            scores = prepared.explainer.evaluate(held.loader(batch_size, shuffle=False, **loading), layer=0, seed=seed)
            line = {"suite": suite, "lr": lr, "beta_mean": beta_mean, "options": chosen, "fit_sentences": len(fitted),
                    "held_out_sentences": len(held), "fit_seconds": prepared.setup_seconds,
                    "evaluate_seconds": time.perf_counter() - start, "fit_last": prepared.info.get("fit_last", {}),
                    "held_out": scores}
            with open(out, "a") as handle:
                handle.write(json.dumps(to_jsonable(line)) + "\n")
            print(f"lr {lr:g}, beta {beta_mean:g} / H: held-out loss {scores['loss']:.3f} (task {scores['task']:.3f}, "
                  f"{scores['capacity']:.2f} bits, {100 * scores['shut']:.1f} % shut, agreement "
                  f"{scores['agreement']:.3f}), fit {prepared.setup_seconds:.0f} s", file=sys.stderr)


def _key(lr: float, beta_mean: float, options: Mapping[str, Any]) -> Tuple[float, float, str]:
    r"""What names a line: its learning rate, beta and what the network is trained to keep."""
    return lr, beta_mean, str(options.get("target", "sampled"))


def _input_width(ctx: MethodContext, loader: Any) -> int:
    r"""H, the width of the input site the bottleneck is put on (one capture pass)."""
    probe = ReadoutBottleneck(ctx.model, sites=ctx.sites(), padding_mask_arg=ctx.padding_mask_arg)
    call = probe.prepare_batch(next(iter(loader)), 0, "batch")
    states, _ = probe.capture(call, [call.site], stop_early=True)
    return int(states[call.site].shape[-1])


def read_lines(path: Path) -> List[Dict[str, Any]]:
    r"""The JSON lines of ``path`` (none when it does not exist)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def choose(lines: Sequence[Mapping[str, Any]]) -> Optional[Mapping[str, Any]]:
    r"""By the module's rule: among the networks not collapsed that keep the
    prediction on :data:`AGREEMENT` of the held-out sentences, the largest beta,
    and at it the lowest held-out objective; None when no network qualifies."""
    alive = [line for line in lines if line["held_out"]["shut"] <= COLLAPSED
             and line["held_out"].get("agreement", 0.0) >= AGREEMENT]
    if not alive:
        return None
    beta = max(line.get("beta_mean", BETA_MEAN) for line in alive)
    return min((line for line in alive if line.get("beta_mean", BETA_MEAN) == beta), key=lambda line: line["held_out"]["loss"])


def summary(lines: Sequence[Mapping[str, Any]]) -> str:
    r"""A markdown table of every (beta, learning rate) and the choice."""
    rows = ["| beta x H | lr | fit: task | fit: bits | fit: shut | held out: objective | task | bits | shut | agreement | fit (s) |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for line in sorted(lines, key=lambda line: (-line.get("beta_mean", BETA_MEAN), line["lr"])):
        fit, held = line["fit_last"], line["held_out"]
        agreement = f"{held['agreement']:.3f}" if "agreement" in held else "not measured"
        rows.append(f"| {line.get('beta_mean', BETA_MEAN):g} | {line['lr']:g} | {fit.get('task', float('nan')):.3f} | "
                    f"{fit.get('capacity', float('nan')):.2f} | {100 * fit.get('shut', float('nan')):.1f} % | "
                    f"{held['loss']:.3f} | {held['task']:.3f} | {held['capacity']:.2f} | {100 * held['shut']:.1f} % | "
                    f"{agreement} | {line['fit_seconds']:.0f} |")
    chosen = choose(lines)
    rows.append("")
    rows.append(f"Chosen: lr {chosen['lr']:g}, beta {chosen.get('beta_mean', BETA_MEAN):g} / H." if chosen else
                f"Chosen: none (no network that did not collapse keeps the prediction on {AGREEMENT:.0%} of the "
                "held-out sentences).")
    return "\n".join(rows)


def main(argv: Sequence[str] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks study readout-tuning",
                                     description=__doc__.split("\n\n")[1])
    parser.add_argument("--out", required=True, help="JSON-lines file (appended; rates already there skipped)")
    parser.add_argument("--suite", choices=sorted(SUITES), default="sst-erasure", help="whose model and settings")
    parser.add_argument("--lr", type=float, nargs="+", default=list(LEARNING_RATES), help="learning rates tried")
    parser.add_argument("--beta-mean", type=float, nargs="+", default=[BETA_MEAN],
                        help=f"beta on the mean over the state's elements (beta = value / H; default {BETA_MEAN:g}, IBA's)")
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
        tune(Path(args.out), args.lr, args.hold_out, args.seed, args.verbose, args.suite, args.beta_mean)
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
