r"""
The masked share against the macro-F1 change over eps: where DiffMask stands on
SST when eps moves, from sweeps that fit the same probe at several eps.

The sst suite's target asks for the paper's masked share (46.3 % input, 67.6 %
hidden) at a macro-F1 within one point of the model's; one eps gives one point
of the trade-off. This study reads sweep results (:mod:`benchmarks.studies.sst_sweep`,
scored on train sentences the fits do not see) and writes, per mode, each
probe's eps, verdict, held-out KL, masked share and macro-F1 change, and per
mode the sparsest probe that counts (settled by the fit's verdict, its
deterministic read-out's KL within eps x 1.25 on the scored sentences) and keeps
the macro-F1 within one point.

Usage::

    python -m benchmarks study sst-sweep benchmarks/sweeps/sst-eps-frontier-input-train.json --out F.jsonl --threads 1
    python -m benchmarks study sst-sweep benchmarks/sweeps/sst-eps-frontier-hidden-train.json --out F.jsonl --threads 1
    python -m benchmarks study sst-frontier F.jsonl --markdown docs/results/sst-eps-frontier.md
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

from benchmarks.report import fmt, table
from benchmarks.suites import sst as suite
from captum_diffmask.diffmask.constrained.convergence import SETTLED

#: The question this study answers (``python -m benchmarks list``).
QUESTION = "the masked share against the macro-F1 change over eps, per mode, on held-out train sentences"

#: The macro-F1 change the target allows (points).
F1_ALLOWANCE = 1.0


def frontier_points(results: List[Mapping[str, Any]]) -> Dict[str, List[Dict[str, Any]]]:
    r"""
    Per mode, every trained probe of the sweep's runs as a point of the frontier.

    Args:

        results (list of dict): sweep records (:func:`benchmarks.studies.sst_sweep.run_one`'s).

    Returns:
        *dict* ``mode -> points`` sorted by eps, layer and seed; each point has
        ``eps``, ``layer``, ``seed``, ``status``, ``kl`` (the deterministic
        read-out's on the scored sentences), ``masked``, ``f1_change``,
        ``agreement`` and ``counts`` (settled and within eps x 1.25).
    """
    points: Dict[str, List[Dict[str, Any]]] = {}
    for result in results:
        eps = float(result["options"].get("eps", 0.1))
        for seed in result["seeds"]:
            for row in seed["per_layer"]:
                if row.get("status") == "not trained":
                    continue
                within = row["kl"] <= suite.HELD_OUT_MARGIN * eps
                points.setdefault(result["mode"], []).append({
                    "eps": eps, "layer": row["layer"], "seed": seed["seed"], "status": row["status"],
                    "kl": row["kl"], "masked": row["masked"], "f1_change": row["f1"] - seed["unmasked_f1"],
                    "agreement": row["agreement"], "counts": row["status"] in SETTLED and within,
                })
    for mode in points:
        points[mode].sort(key=lambda p: (p["eps"], p["layer"], p["seed"]))
    return points


def sparsest_within(points: List[Mapping[str, Any]]) -> Optional[Mapping[str, Any]]:
    r"""The counted point with the largest masked share whose macro-F1 change is
    at least ``-F1_ALLOWANCE``; None when no counted point keeps it."""
    kept = [p for p in points if p["counts"] and p["f1_change"] >= -F1_ALLOWANCE]
    return max(kept, key=lambda p: p["masked"]) if kept else None


def frontier_markdown(results: List[Mapping[str, Any]], command: str) -> str:
    r"""The frontier as a report: per mode a table of its points and the line
    that says where it stands against the paper's masked share."""
    points = frontier_points(results)
    scored = {r.get("scored_sentences", "?") for r in results}
    lines = ["# SST: the masked share against the macro-F1 change over eps", "",
             f"Command: `{command}`. The sst suite's fine-tuned MiniLM and DiffMask settings, fitted at the layers "
             f"the sweep names and scored on {', '.join(str(s) for s in sorted(scored, key=str))} held-out train "
             "sentences (no dev sentence is read). A probe counts when its fit's verdict is `converged` or "
             f"`needed` and its deterministic read-out's KL there is at most eps x {suite.HELD_OUT_MARGIN:g}.", ""]
    for mode, rows in points.items():
        paper = suite.PAPER[f"{mode}_masked"]
        paper_change = suite.PAPER[f"{mode}_f1"] - suite.PAPER["unmasked_f1"]
        lines += [f"## {mode}", "",
                  table(["eps", "layer", "seed", "verdict", f"held-out KL (<= eps x {suite.HELD_OUT_MARGIN:g})",
                         "masked %", "macro-F1 change", "same prediction %", "counts"],
                        [[f"{p['eps']:g}", p["layer"], p["seed"], p["status"], fmt(p["kl"], 4), f"{p['masked']:.1f}",
                          f"{p['f1_change']:+.2f}", f"{p['agreement']:.1f}", "yes" if p["counts"] else "no"]
                         for p in rows]), ""]
        best = sparsest_within(rows)
        stand = ("no probe that counts keeps the macro-F1 within one point" if best is None else
                 f"the sparsest probe that counts within one point of macro-F1 masks {best['masked']:.1f} % "
                 f"(eps {best['eps']:g}, layer {best['layer']}, change {best['f1_change']:+.2f})")
        lines += [f"Where it stands: {stand}; the paper's {mode} mode masks {paper} % at a macro-F1 change of "
                  f"{paper_change:+.1f} (BERT-base, all of its layers averaged, dev).", ""]
    return "\n".join(lines)


def read_results(paths: List[str]) -> List[Dict[str, Any]]:
    r"""Every sweep record of the JSON-lines files ``paths``, in order."""
    results = []
    for path in paths:
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            if line.strip():
                results.append(json.loads(line))
    return results


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks study sst-frontier",
                                     description=__doc__.split("\n\n")[1])
    parser.add_argument("results", nargs="+", help="sweep JSON-lines files (sst_sweep --out)")
    parser.add_argument("--markdown", required=True, help="where the report is written")
    args = parser.parse_args(argv)
    results = read_results(args.results)
    if not results:
        parser.error(f"results: no sweep records in {args.results}")
    command = "python -m benchmarks study sst-frontier " + " ".join(argv if argv is not None else sys.argv[1:])
    Path(args.markdown).write_text(frontier_markdown(results, command), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
