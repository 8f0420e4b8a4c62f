r"""
Choosing the per-example masks' settings for the sst-erasure suite on SST
*train* sentences, never on the split the suite reports.

The suite's GRU (from the cache, or trained as the suite would), its baseline
and exact erasure on ``--sentences`` train sentences of at most ``max_tokens``
tokens (spread evenly over them); then every combination of the grid for every
mask row, each scored against erasure as the suite scores it. One JSON line per
(row, combination) is appended to ``--out``; combinations already there are
skipped, so a stopped tuning resumes.

Usage::

    python -m benchmarks study sst-erasure-tuning GRID.json --out tuning.jsonl [--sentences 120] [--threads 1]
    python -m benchmarks study sst-erasure-tuning GRID.json --out tuning.jsonl --summary

``GRID.json``::

    {"base": {...},                     # optional: merged into the suite's DEFAULTS
     "rows": ["PerExampleDiffMask", "REINFORCE", "REINFORCE-corrected"],
     "shared": {"eps": [0.05, 0.1, 0.3], "select": ["last", "feasible"]},   # the same for every row
     "per_row": {"lr": [0.02, 0.05, 0.1]},                                  # each row picks its own
     "min_sufficiency": 95}                      # optional: lines keeping the class less often never win

The choice (``--summary``): the shared values that give the highest mean F1 over
the rows, each row at its best per-row values there (the same grid, so the same
tuning budget, for every row).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Dict, Iterator, Mapping, Sequence, Tuple

import torch

from benchmarks.records import read_json_lines, to_jsonable
from benchmarks.runner import merge
from benchmarks.suites import sst_erasure
from benchmarks.suites.sst_erasure import (
    erasure_reference, load_bench, mask_run_info, MaskedPredictor, miss_breakdown, run_mask_method,
)
from captum_diffmask.evaluation.erasure_agreement import summarize_agreement

#: The question this study answers (``python -m benchmarks list``).
QUESTION = "the per-example masks' settings for sst-erasure, chosen on train sentences"


def combinations(grid: Mapping[str, Sequence[Any]]) -> Iterator[Dict[str, Any]]:
    r"""Every combination of the grid's values, as option dicts (keys sorted)."""
    keys = sorted(grid)
    for values in itertools.product(*(grid[k] for k in keys)):
        yield dict(zip(keys, values))


def _key(row: str, options: Mapping[str, Any]) -> str:
    return json.dumps({"row": row, "options": dict(options)}, sort_keys=True)


def tune(spec: Mapping[str, Any], out: Path, sentences: int, seed: int, verbose: bool) -> None:
    r"""
    Runs the grid of ``spec`` on ``sentences`` train sentences and appends a
    line per new (row, combination) to ``out``.

    Args:

        spec (Mapping): the grid (see the module's docstring).
        out (Path): the JSON-lines file.
        sentences (int): train sentences searched.
        seed (int): the GRU's and the masks' seed.
        verbose (bool): progress lines.
    """
    config = merge(merge(sst_erasure.DEFAULTS, spec.get("base")), {"split": "train", "max_sentences": sentences,
                                                                  "include_empty_optimum": False})
    done = {_key(line["row"], line["options"]) for line in read_json_lines(out)}
    bench = load_bench(config, seed, verbose)
    reference = erasure_reference(config, bench, verbose)
    predictor = MaskedPredictor(bench.model, bench.baseline)
    data, sets = reference.data, reference.optimal_sets
    for shared in combinations(spec.get("shared", {})):
        for per_row in combinations(spec.get("per_row", {})):
            for row in spec["rows"]:
                options = merge(config["method_options"][row], {**shared, **per_row})
                if _key(row, options) in done:
                    continue
                start = time.perf_counter()
                run = run_mask_method(row, bench.model, data, bench.baseline, options, len(data), seed, False)
                per_sentence = predictor.per_sentence(data, run.kept, sets)
                line = {"row": row, "options": options, "shared": shared, "per_row": per_row,
                        **summarize_agreement(per_sentence), **mask_run_info([run], options),
                        "misses": miss_breakdown([per_sentence]), "seconds": time.perf_counter() - start,
                        "sentences": len(data), "searched": len(bench.short)}
                with open(out, "a", encoding="utf-8") as handle:
                    handle.write(json.dumps(to_jsonable(line)) + "\n")
                if verbose:
                    print(f"{row} {json.dumps(shared)} {json.dumps(per_row)}: F1 {line['f1']:.2f} optimality "
                          f"{line['optimality']:.2f} L0 {line['l0']:.2f} ({line['seconds']:.0f} s)", flush=True)


def choose(
    lines: Sequence[Mapping[str, Any]], rows: Sequence[str], min_sufficiency: float = 0.0
) -> Tuple[Dict[str, Any], Dict[str, Dict[str, Any]]]:
    r"""
    The tuning's choice: the shared values with the highest mean F1 over
    ``rows`` (each row at its best per-row values there), and each row's line
    at that choice. Shared values that not every row has run are skipped, and
    so are lines whose masks keep the predicted class on fewer than
    ``min_sufficiency`` percent of the sentences.

    Returns:
        *tuple* ``(shared, best_line_per_row)``.
    """
    by_shared: Dict[str, Dict[str, Mapping[str, Any]]] = {}
    for line in lines:
        best = by_shared.setdefault(json.dumps(line["shared"], sort_keys=True), {})
        if line["sufficiency"] < min_sufficiency:
            continue
        if line["row"] in rows and (line["row"] not in best or line["f1"] > best[line["row"]]["f1"]):
            best[line["row"]] = line
    complete = {k: v for k, v in by_shared.items() if all(r in v for r in rows)}
    if not complete:
        raise ValueError("no shared setting has been run for every row yet")
    chosen = max(complete, key=lambda k: statistics.mean(complete[k][r]["f1"] for r in rows))
    return json.loads(chosen), {r: dict(complete[chosen][r]) for r in rows}


def summary(lines: Sequence[Mapping[str, Any]], rows: Sequence[str], min_sufficiency: float = 0.0) -> str:
    r"""A markdown table of every line (scores in percent, seconds of the run),
    and the choice."""
    count = {(line["sentences"], line["searched"]) for line in lines}
    out = [f"Scored train sentences / searched: {', '.join(f'{a} / {b}' for a, b in sorted(count))}.", "",
           "| row | shared | per row | F1 | optimality | L0 | sufficiency | own constraint met | s |", "|" + "---|" * 9]
    for line in sorted(lines, key=lambda x: (json.dumps(x["shared"], sort_keys=True), x["row"], json.dumps(x["per_row"]))):
        out.append(f"| {line['row']} | {json.dumps(line['shared'])} | {json.dumps(line['per_row'])} | {line['f1']:.2f} | "
                   f"{line['optimality']:.2f} | {line['l0']:.2f} | {line['sufficiency']:.2f} | "
                   f"{line['constraint_met']:.1f} | {line['seconds']:.0f} |")
    shared, best = choose(lines, rows, min_sufficiency)
    out.append("")
    if min_sufficiency:
        out.append(f"Only lines whose masks keep the class on >= {min_sufficiency:g}% of the sentences compete.")
    out.append(f"Chosen shared settings: {json.dumps(shared)}; per row: "
               + "; ".join(f"{r} {json.dumps(best[r]['per_row'])} (F1 {best[r]['f1']:.2f})" for r in rows))
    return "\n".join(out)


def main(argv: Sequence[str] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks study sst-erasure-tuning", description=__doc__.split("\n\n")[1])
    parser.add_argument("grid", help="the grid, a JSON file")
    parser.add_argument("--out", required=True, help="JSON-lines file (appended; done combinations skipped)")
    parser.add_argument("--sentences", type=int, default=120, help="train sentences searched (default 120)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=None, help="torch threads")
    parser.add_argument("--summary", action="store_true", help="print the table and the choice, run nothing")
    args = parser.parse_args(argv)
    spec = json.loads(Path(args.grid).read_text(encoding="utf-8"))
    out = Path(args.out)
    if args.summary:
        print(summary(read_json_lines(out), spec["rows"], float(spec.get("min_sufficiency", 0.0))))
        return 0
    if args.threads:
        torch.set_num_threads(args.threads)
    tune(spec, out, args.sentences, args.seed, verbose=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
