r"""
The components suite's per-task SST heads mask (one mask over the 72 heads of
the sst suite's MiniLM for every sentence) fitted with options changed per run,
measured on **train** sentences only: where does it stand when the fit stops?

Each run fits the mask as the components suite's SST part does (its train
sentences, batch size, eps, cap, precision and fit options, the per-task lr),
with the run's options merged over fit's, then reports the fit's verdict and
steps, the last epoch's KL of the sampled and of the deterministic gates and
the multiplier, how many heads sit at which keep probability, and the
deterministic mask's heads kept, agreement and KL on the sst suite's 400
held-out train sentences (no dev sentence is read).

Usage::

    python -m benchmarks study components-sst-per-task RUNS.json --out runs.jsonl [--markdown report.md] [--threads 1]
    python -m benchmarks study components-sst-per-task --out runs.jsonl --markdown report.md

``RUNS.json``: a list of ``{"name": ..., "fit": {fit option: value}}``; each run's
record is appended to ``--out`` as it ends, and ``--markdown`` renders every
record in ``--out`` (runs of several invocations side by side).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

import torch

from benchmarks.common.minilm.loading import load_bench
from benchmarks.records import read_json_lines, to_jsonable
from benchmarks.report import fmt, table
from benchmarks.runner import limit_onednn_cache, merge
from benchmarks.suites.components import DEFAULTS, fit_arguments, quiet_warnings, score_heads, spread, sst_config
from captum_diffmask import DiffMask
from captum_diffmask.diffmask import grouped_options

#: The question this study answers (``python -m benchmarks list``).
QUESTION = "the components suite's per-task SST heads mask fitted with options changed per run, on train sentences"

#: The keep probabilities' bins a run's heads are counted in (upper bounds).
BINS = ((0.05, "< 0.05"), (0.5, "0.05-0.5"), (0.95, "0.5-0.95"), (1.0, "> 0.95"))


def run(spec: Mapping[str, Any], bench: Any, config: Mapping[str, Any], seed: int = 0) -> Dict[str, Any]:
    r"""
    One run: the per-task mask fitted with ``spec["fit"]`` over the part's options.

    Args:

        spec (Mapping): ``name`` and ``fit`` (options merged over the part's).
        bench (Bench): the sst suite's model and splits.
        config (Mapping): the components suite's ``sst`` settings.
        seed (int, optional): the fit's seed. Default: 0

    Returns:
        *dict*: the run's ``name``, ``options``, ``seconds``, ``verdict``,
        ``steps``, ``last_epoch`` (KL sampled / deployed, multiplier), ``heads``
        (count per keep-probability bin) and ``held_out`` (heads kept,
        agreement, KL of the deterministic mask).
    """
    eps = config.get("eps")
    eps = float(0.02 if eps is None else eps)
    changed = dict(spec.get("fit", {}))
    init, options = fit_arguments({**config, "fit": {**config.get("fit", {}), **changed}}, eps, seed, True)
    if "lr" in changed:  # a run's lr wins over the per-task mask's
        options["lr"] = changed["lr"]
    train = bench.train.subset(spread(len(bench.train), config.get("train_sentences")))
    explainer = DiffMask(bench.model, mode="heads", per_task=True, **init)
    start = time.perf_counter()
    with quiet_warnings():
        history = explainer.fit(train.loader(int(config.get("batch_size", 16)), shuffle=True, seed=seed,
                                             sort_by_length=True), **grouped_options(options))
    seconds = time.perf_counter() - start
    last_epoch = max(h["epoch"] for h in history)
    last = next(h for h in history if h["epoch"] == last_epoch)
    ids, mask = bench.valid.input_ids[:1], bench.valid.attention_mask[:1]
    keep = explainer.attribute(ids, additional_forward_args=(mask,), layer=None)[0].flatten()
    bins = torch.bucketize(keep, torch.tensor([upper for upper, _ in BINS[:-1]]))  # bin i: (upper_{i-1}, upper_i]
    heads = {label: int(count) for (_, label), count in zip(BINS, torch.bincount(bins, minlength=len(BINS)))}
    scores = score_heads(explainer, bench.valid, int(config.get("batch_size", 16)))
    report = explainer.convergence[0]
    return {"name": spec.get("name", json.dumps(spec.get("fit", {}))), "options": {**init, **options},
            "seconds": seconds, "verdict": report["status"], "steps": report["steps"], "eps": eps,
            "last_epoch": {"kl": last["kl"], "kl_deployed": last.get("kl_deployed"), "lambda": last["lambda"]},
            "heads": heads, "held_out": {"heads_kept": sum(b["heads_kept"] for b in scores["blocks"].values()),
                                         "agreement": 100.0 * scores["every_block_agreement"],
                                         "kl": scores["every_block_kl"], "sentences": len(bench.valid)}}


def markdown(records: List[Mapping[str, Any]], command: str) -> str:
    r"""The runs as a report: a row per run."""
    rows = [[r["name"], f"**{r['verdict']}**", r["steps"], f"{r['seconds'] / 60:.1f}", fmt(r["last_epoch"]["kl"], 4),
             fmt(r["last_epoch"]["kl_deployed"], 4), fmt(r["last_epoch"]["lambda"], 1),
             " / ".join(str(r["heads"][label]) for _, label in BINS), f"{r['held_out']['heads_kept']:.0f}",
             f"{r['held_out']['agreement']:.1f}",
             f"{fmt(r['held_out']['kl'], 4)} {'ok' if r['held_out']['kl'] <= 1.25 * r['eps'] else 'over'}"]
            for r in records]
    eps = records[0]["eps"] if records else 0.02
    return "\n".join([
        "# The per-task SST heads mask, fitted with options changed per run (train sentences)", "",
        f"Command: `{command}`. The components suite's SST part's per-task mask (one mask over the sst suite's "
        f"MiniLM's 72 heads for every sentence, joint over the blocks, eps {eps:g}), its train sentences and options "
        "with each run's merged over them; scored on the sst suite's held-out train sentences (no dev sentence is "
        "read). Keep probabilities: how many of the 72 heads sit in each bin when the fit stops.", "",
        table(["run", "verdict", "steps", "fit min", "KL sampled (last epoch)", "KL deployed (last epoch)", "lambda",
               "heads by keep probability (" + " / ".join(label for _, label in BINS) + ")", "heads kept (held out)",
               "same prediction % (held out)", f"KL held out (<= {1.25 * eps:g})"], rows), ""])


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks study components-sst-per-task",
                                     description=__doc__.split("\n\n")[1])
    parser.add_argument("runs", nargs="?", default=None,
                        help="the runs' JSON file (see the module docstring); without it, only --markdown is rendered")
    parser.add_argument("--out", required=True, help="JSON lines file each run's record is appended to")
    parser.add_argument("--markdown", default=None, help="render every record in --out as a report here")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--set", dest="overrides", default="{}", help="JSON merged into the components suite's sst settings")
    args = parser.parse_args(argv)
    if args.runs is None and args.markdown is None:
        parser.error("give the runs' file, --markdown, or both")
    runs = [] if args.runs is None else json.loads(Path(args.runs).read_text())
    if not isinstance(runs, list) or not all(isinstance(r, dict) and isinstance(r.get("fit", {}), dict) for r in runs):
        parser.error(f"runs: {args.runs} must hold a list of {{'name': ..., 'fit': {{...}}}}")
    limit_onednn_cache()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    config = merge(DEFAULTS["sst"], json.loads(args.overrides))
    bench = load_bench(sst_config(config), False) if runs else None
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for spec in runs:
        record = run(spec, bench, config)
        with out.open("a", encoding="utf-8") as f:
            f.write(json.dumps(to_jsonable(record)) + "\n")
        print(f"{record['name']}: {record['verdict']} after {record['steps']} steps, held-out KL "
              f"{record['held_out']['kl']:.4f} with {record['held_out']['heads_kept']:.0f} heads", flush=True)
    if args.markdown:
        records = read_json_lines(out)
        command = "python -m benchmarks study components-sst-per-task " + " ".join(
            argv if argv is not None else sys.argv[1:])
        Path(args.markdown).write_text(markdown(records, command), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
