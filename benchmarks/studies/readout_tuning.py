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
import math
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import torch

from benchmarks.common.minilm import loading as sst_loading
from benchmarks.methods import MethodContext, prepare
from benchmarks.records import read_json_lines, to_jsonable
from benchmarks.suites import sst, sst_erasure
from benchmarks.tasks.sst.classifier import sst_sites
from captum_diffmask.methods.bottleneck import capacity_nats, noisy_state
from captum_diffmask.methods.readout_bottleneck import COLLAPSED, ReadoutBottleneck
from captum_diffmask.model.divergences import log_probs

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
    lines = read_json_lines(out)
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


#: The uniform shares of every element let through by :func:`information_cost`.
UNIFORM_LAMBDAS = (1.0, 0.9, 0.5, 0.1, 0.0)


@torch.no_grad()
def information_cost(suite: str, hold_out: int, seed: int) -> List[Dict[str, Any]]:
    r"""
    What the bottleneck's objective pays for information at the input, and what
    it gets: every element of every real token let through at one share
    ``lambda`` (:data:`UNIFORM_LAMBDAS`), on the held-out train sentences: the
    task's negative log-likelihood (of a class drawn from the model, and of its
    prediction), the share of predictions kept, and the capacity per token
    (nats) with beta x capacity at IBA's beta (10 / H).
    """
    model, train, options, context, loading = SUITES[suite](seed, False)
    every = torch.arange(len(train))
    fitted, held = train.subset(every[every % hold_out != hold_out - 1]), train.subset(every[every % hold_out == hold_out - 1])
    probe = ReadoutBottleneck(model, sites=context["sites"](), padding_mask_arg=context["padding_mask_arg"])
    batch_size = int(options.get("batch_size", 128))
    probe.estimate_statistics(fitted.loader(batch_size, shuffle=True, seed=seed, **loading), 0, ["input"], 0.01, 40)
    rows = []
    for lam in UNIFORM_LAMBDAS:
        sums, generator = {"sampled": 0.0, "predicted": 0.0, "agreement": 0.0, "capacity": 0.0}, torch.Generator().manual_seed(seed)
        count, width = 0, 1
        for batch in held.loader(batch_size, shuffle=False, **loading):
            call = probe.prepare_batch(batch, 0, "batch")
            states, original = probe.capture(call, ["input"])
            state, log_p = states["input"], log_probs(original)
            mean, std = probe.noise_statistics("input", state)
            share = torch.where(call.mask.unsqueeze(-1), torch.full_like(state[..., :1], lam), torch.ones_like(state[..., :1]))
            log_q = log_probs(probe.replaced_logits(call, {"input": noisy_state(state, share, mean, std)}))
            drawn = torch.multinomial(log_p.exp(), 1, generator=generator)
            alpha = torch.full(state.shape[:-1], math.log(lam / (1 - lam)) if 0 < lam < 1 else (30.0 if lam == 1 else -30.0))
            real = call.mask.float()
            sums["sampled"] += float(-log_q.gather(-1, drawn).sum())
            sums["predicted"] += float(-log_q.gather(-1, log_p.argmax(-1, keepdim=True)).sum())
            sums["agreement"] += float((log_q.argmax(-1) == log_p.argmax(-1)).sum())
            sums["capacity"] += float(((capacity_nats(alpha, state, mean, std).sum(-1) * real).sum(-1) / real.sum(-1)).sum())
            count, width = count + len(drawn), state.shape[-1]
        rows.append({"lambda": lam, **{k: v / count for k, v in sums.items()},
                     "beta_capacity": 10.0 / width * sums["capacity"] / count, "sentences": count})
    return rows


def information_table(rows: Sequence[Mapping[str, Any]]) -> str:
    r""":func:`information_cost`'s rows as a markdown table."""
    lines = ["| lambda (every element) | task NLL, drawn class | task NLL, predicted class | prediction kept | "
             "capacity per token (nats) | 10 / H x capacity |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['lambda']:g} | {r['sampled']:.3f} | {r['predicted']:.3f} | {r['agreement']:.3f} | "
                     f"{r['capacity']:.1f} | {r['beta_capacity']:.3f} |")
    return "\n".join(lines)


def _information_reading(rows: Sequence[Mapping[str, Any]]) -> str:
    r"""What the information table says, in one sentence from its rows."""
    by = {r["lambda"]: r for r in rows}
    if 0.9 not in by or 0.0 not in by:
        return ""
    gain = by[0.0]["predicted"] - by[0.9]["predicted"]
    return (f"Letting every element through at 0.9 keeps {by[0.9]['agreement']:.0%} of the predictions and lowers the "
            f"task's loss by {gain:.2f} nats against letting nothing through, and costs {by[0.9]['beta_capacity']:.1f} "
            "nats at IBA's beta: at that beta the objective's optimum lets almost nothing through, and what a network "
            "keeps is no evidence of what the model uses.")


def choose(lines: Sequence[Mapping[str, Any]], target: Optional[str] = None) -> Optional[Mapping[str, Any]]:
    r"""By the module's rule: among the networks trained to keep ``target``
    (any when None; objectives of two targets do not compare) that did not
    collapse and keep the prediction on :data:`AGREEMENT` of the held-out
    sentences, the largest beta, and at it the lowest held-out objective; None
    when no network qualifies."""
    alive = [line for line in lines if line["held_out"]["shut"] <= COLLAPSED
             and line["held_out"].get("agreement", 0.0) >= AGREEMENT
             and (target is None or line["options"].get("target", "sampled") == target)]
    if not alive:
        return None
    beta = max(line.get("beta_mean", BETA_MEAN) for line in alive)
    return min((line for line in alive if line.get("beta_mean", BETA_MEAN) == beta), key=lambda line: line["held_out"]["loss"])


def suite_target(suite: str) -> str:
    r"""What the suite's Readout Bottleneck is trained to keep (its ``target`` option)."""
    config = sst.DEFAULTS if suite == "sst" else sst_erasure.DEFAULTS
    return str(config["method_options"].get("ReadoutBottleneck", {}).get("target", "sampled"))


def summary(lines: Sequence[Mapping[str, Any]], target: Optional[str] = None) -> str:
    r"""A markdown table of every (target, beta, learning rate) and the choice
    among the networks trained to keep ``target`` (:func:`choose`)."""
    rows = ["| target | beta x H | lr | fit: task | fit: bits | fit: shut | held out: objective | task | bits | shut | "
            "agreement | fit (s) |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for line in sorted(lines, key=lambda line: (line["options"].get("target", "sampled"), -line.get("beta_mean", BETA_MEAN),
                                                line["lr"])):
        fit, held = line["fit_last"], line["held_out"]
        agreement = f"{held['agreement']:.3f}" if "agreement" in held else "not measured"
        rows.append(f"| {line['options'].get('target', 'sampled')} | {line.get('beta_mean', BETA_MEAN):g} | {line['lr']:g} | {fit.get('task', float('nan')):.3f} | "
                    f"{fit.get('capacity', float('nan')):.2f} | {100 * fit.get('shut', float('nan')):.1f} % | "
                    f"{held['loss']:.3f} | {held['task']:.3f} | {held['capacity']:.2f} | {100 * held['shut']:.1f} % | "
                    f"{agreement} | {line['fit_seconds']:.0f} |")
    chosen = choose(lines, target)
    rows.append("")
    rows.append(f"Chosen: lr {chosen['lr']:g}, beta {chosen.get('beta_mean', BETA_MEAN):g} / H, target "
                f"{chosen['options'].get('target', 'sampled')}." if chosen else
                f"Chosen: none (no network that did not collapse keeps the prediction on {AGREEMENT:.0%} of the "
                "held-out sentences).")
    return "\n".join(rows)


def _information_path(out: Path) -> Path:
    return out.with_name(out.stem + "-information.json")


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
    parser.add_argument("--information", action="store_true",
                        help="also measure what information costs the objective (every element let through at one "
                             "share), into OUT's stem + '-information.json'")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    if args.hold_out < 2:
        parser.error(f"--hold-out must be at least 2, got {args.hold_out}")
    if not args.summary:
        if args.threads:
            torch.set_num_threads(args.threads)
        tune(Path(args.out), args.lr, args.hold_out, args.seed, args.verbose, args.suite, args.beta_mean)
        if args.information:
            _information_path(Path(args.out)).write_text(json.dumps(information_cost(args.suite, args.hold_out, args.seed)))
    lines = read_json_lines(Path(args.out))
    print(summary(lines, suite_target(args.suite)))
    if args.markdown:
        Path(args.markdown).write_text(report(lines, Path(args.out), Path(args.markdown)))
    return 0


def report(lines: Sequence[Mapping[str, Any]], lines_path: Path, markdown: Path) -> str:
    r"""The markdown report: how the networks were scored, the command, the
    table, the choice and, when measured, what information costs the objective."""
    suite = lines[0].get("suite", "sst-erasure") if lines else "sst-erasure"
    options = {k: v for k, v in (lines[0]["options"] if lines else {}).items() if k not in ("lr", "beta", "target")}
    rates = " ".join(f"{v:g}" for v in sorted({line["lr"] for line in lines}))
    betas = " ".join(f"{v:g}" for v in sorted({line.get("beta_mean", BETA_MEAN) for line in lines}, reverse=True))
    information = _information_path(lines_path)
    text = [
        f"# The Readout Bottleneck's learning rate and beta for {suite}, chosen on train sentences",
        "",
        f"The {suite} suite's model and its train sentences: every 10th held out, the network fitted on the "
        f"others as the suite fits it ({json.dumps(options)}; per element), once per (learning rate, beta, what "
        "it is trained to keep: a class drawn from the model with the class read by the network, `sampled`, or "
        "the model's prediction, `predicted`), and scored on the held-out sentences by "
        "`ReadoutBottleneck.evaluate`: the training objective (the task's negative log-likelihood plus beta "
        "times the capacity) and the share of sentences whose noisy pass keeps the model's prediction. "
        f"The rule, among the networks trained as the suite trains its own (target "
        f"`{suite_target(suite)}`): the networks that did not collapse and keep the prediction on at least "
        f"{AGREEMENT:g} of the held-out sentences, the largest beta, and at it the lowest held-out objective"
        + (" (the first grid, learning rates at beta 10, predates the agreement and chose by the objective "
           "alone)" if any("agreement" not in line["held_out"] for line in lines) else "")
        + ". The dev split the suite reports was not read.",
        "",
        f"Command: `python -m benchmarks study readout-tuning --suite {suite} --out {lines_path} --lr {rates} "
        f"--beta-mean {betas} --information --markdown {markdown}` (one JSON line per network in "
        f"`{lines_path.name}`; fit seconds are wall time, on 2 cores shared with other jobs)."
        + (" The lines before the `target` column's `predicted` were fitted on the model of the best dev epoch, "
           "the others on the suite's model of the last epoch."
           if any(line["options"].get("target", "sampled") == "sampled" for line in lines) else ""),
        "",
        "\"fit\": the last epoch's means while training; \"held out\": the held-out sentences. Bits: the "
        "capacity per real token; shut: the share of elements at alpha = -5, where the clamp passes no gradient.",
        "",
        summary(lines, suite_target(suite)),
        "",
    ]
    if information.exists():
        text += ["## What information costs the objective", "",
                 "Every element of every real input token let through at one share lambda, on the same held-out "
                 "sentences: the task's negative log-likelihood of a class drawn from the model and of its "
                 "prediction, the share of predictions kept, and the capacity (nats per token) with IBA's "
                 "weight on it. A network pays the capacity where it lets information through and gains the "
                 "task's drop.", "", information_table(json.loads(information.read_text())), "",
                 _information_reading(json.loads(information.read_text())), ""]
    return "\n".join(text)


if __name__ == "__main__":
    raise SystemExit(main())
